/**
 * `Store` in memory: data outlives a partition store's close for as long as the layer lives. For the embedded demo,
 * users' tests and simulation.
 *
 * @since 0.1.0
 */
import * as Store from "./Store.js"
import { Effect, Layer } from "effect"
import * as internal from "./internal/memoryStore.js"
import { decodeOptions, LimitsOptions } from "./StoreValidation.js"

/**
 * An in-memory store. Options, when given, are validated: a wrong or unknown one fails the layer with
 * `InvalidStoreOptions` naming it.
 *
 * @since 0.1.0
 */
export function layer(): Layer.Layer<Store.Store>
export function layer(options: LimitsOptions): Layer.Layer<Store.Store, Store.StoreError>
export function layer(options?: LimitsOptions): Layer.Layer<Store.Store, Store.StoreError> {
  return options === undefined
    ? Layer.effect(Store.Store, internal.make())
    : Layer.effect(Store.Store, Effect.flatMap(decodeOptions("memory", LimitsOptions)(options), internal.make))
}
