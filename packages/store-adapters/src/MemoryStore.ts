/**
 * `Store` in memory: the reference implementation from `@strata/core`, here so
 * that every backend is one subpath of this package. Data lives as long as the
 * layer; use it for the embedded demo, for tests and for simulation.
 *
 * @since 0.1.0
 */
import { Store, type StoreLimits } from "@strata/core"
import type { Layer } from "effect"

/** Options of the memory store. */
export interface MemoryStoreOptions extends Partial<StoreLimits> {}

/** A layer providing an in-memory `Store`. */
export const layer = (options?: MemoryStoreOptions): Layer.Layer<Store> => Store.layerMemory(options)
