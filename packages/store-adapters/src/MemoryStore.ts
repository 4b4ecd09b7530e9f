/**
 * `Store` in memory: the reference implementation from `@strata/core`, here so
 * that every backend is one subpath of this package. Data lives as long as the
 * layer; use it for the embedded demo, for tests and for simulation.
 *
 * @since 0.1.0
 */
import { MemoryStore, Store, StoreValidation } from "@strata/core"
import { Config, Context, Effect, Layer, Schema, type Scope } from "effect"
import { decodeOptions } from "./internal/options.js"

/** Options of the memory store (its size limits), validated when the store is made. */
export const MemoryStoreOptions = Schema.Struct(StoreValidation.limitsFields)
/** @see MemoryStoreOptions */
export type MemoryStoreOptions = typeof MemoryStoreOptions.Type

const decode = decodeOptions("memory", MemoryStoreOptions)

/** Makes an in-memory store; a wrong or unknown option fails with `InvalidStoreOptions` naming it. */
export const make = (options: MemoryStoreOptions = {}): Effect.Effect<Store.Shape, Store.StoreError, Scope.Scope> =>
  Effect.flatMap(decode(options), (o) => Effect.map(Layer.build(MemoryStore.layer(o)), Context.get(Store.Store)))

/** A layer providing an in-memory `Store`. */
export const layer = (options: MemoryStoreOptions = {}): Layer.Layer<Store.Store, Store.StoreError> =>
  Layer.effect(Store.Store, make(options))

/** Like `layer`, with the options read from configuration. */
export const layerConfig = (
  config: Config.Wrap<MemoryStoreOptions>
): Layer.Layer<Store.Store, Store.StoreError | Config.ConfigError> =>
  Layer.unwrap(Effect.map(Config.unwrap(config), (options) => layer(options)))
