import { Effect, Layer } from "effect"
import type { Coordination, CoordinationFaults } from "../Coordination.js"

/** Options of the in-memory coordination service. */
export interface MemoryCoordinationOptions {
  /** Session timeout used when a session asks for none (default 10 seconds). */
  readonly defaultSessionTimeout?: import("effect").Duration.Input
}

/** Builds the in-memory coordination layer. */
export const layer = (_options?: MemoryCoordinationOptions): Layer.Layer<Coordination | CoordinationFaults> =>
  Layer.effectContext(Effect.die("memory coordination: not yet built"))
