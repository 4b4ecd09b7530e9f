import { Effect } from "effect"
import type { LogShape } from "../Log.js"

/** Options of the in-memory log. */
export interface MemoryLogOptions {
  /** Largest record (key + value + headers) accepted, in bytes (default 1 MiB, like Kafka). */
  readonly maxRecordBytes?: number
}

/** Builds an in-memory log. */
export const make = (_options?: MemoryLogOptions): Effect.Effect<LogShape> => Effect.die("memory log: not yet built")
