import { Effect } from "effect"
import type { StoreLimits, StoreShape } from "../Store.js"

/** Builds an in-memory store. */
export const make = (_options?: Partial<StoreLimits>): Effect.Effect<StoreShape> => Effect.die("memory store: not yet built")
