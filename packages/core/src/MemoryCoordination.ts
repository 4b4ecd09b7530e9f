/**
 * `Coordination` in memory: sessions that expire on Effect's Clock, with `CoordinationFaults` to suspend and expire
 * them, for the embedded demo, users' tests and simulation.
 *
 * @since 0.1.0
 */
import type * as Coordination from "./Coordination.js"
import type { Layer } from "effect"
import * as internal from "./internal/memoryCoordination.js"

/**
 * Options of the in-memory coordination service.
 *
 * @since 0.1.0
 */
export type MemoryCoordinationOptions = internal.MemoryCoordinationOptions

/**
 * In-memory coordination providing `Coordination` and `CoordinationFaults`.
 *
 * @since 0.1.0
 */
export const layer = (
  options?: MemoryCoordinationOptions
): Layer.Layer<Coordination.Coordination | Coordination.Faults> => internal.layer(options)
