/**
 * `Log` in memory: a Kafka-like log for the embedded demo, users' tests and simulation, with `LogFaults` to compact
 * it and make its appends fail.
 *
 * @since 0.1.0
 */
import type * as Log from "./Log.js"
import type { Layer } from "effect"
import * as internal from "./internal/memoryLog.js"

/**
 * Options of the in-memory log.
 *
 * @since 0.1.0
 */
export type MemoryLogOptions = internal.MemoryLogOptions

/**
 * An in-memory log providing `Log` and `LogFaults`.
 *
 * @since 0.1.0
 */
export const layer = (options?: MemoryLogOptions): Layer.Layer<Log.Log | Log.Faults> => internal.layer(options)
