import { Store, StoreValidation } from "@strata/core"
import { Config, Context, Effect, Layer, Schema, type Scope } from "effect"

/** A positive safe integer option (bytes, counts). */
export const PositiveInt = StoreValidation.PositiveInt

/** A positive size or count the bindings read as an unsigned 32-bit integer: larger values would wrap around. */
export const Uint32Size = PositiveInt.check(Schema.isLessThan(2 ** 32))

/** Options every backend accepts. */
export const commonFields = {
  /** The database directory (created if missing). One process owns it at a time. */
  directory: Schema.NonEmptyString,
  /** fsync the write-ahead log on every batch (default false: a process crash loses nothing, an OS crash may). */
  sync: Schema.optional(Schema.Boolean),
  ...StoreValidation.limitsFields
}

/** Validates a backend's options with its Schema; a wrong or unknown field fails with `InvalidStoreOptions` naming it. */
export const decodeOptions = StoreValidation.decodeOptions

/**
 * `layer` and `layerConfig` of a store backend: each provides the backend's own
 * key and the `Store` protocol key from the same instance.
 */
export const backendLayers = <I, S extends Store.Shape, O>(
  key: Context.Key<I, S>,
  make: (options: O) => Effect.Effect<S, Store.StoreError, Scope.Scope>
) => {
  const layer = (options: O): Layer.Layer<I | Store.Store, Store.StoreError> =>
    Layer.effectContext(
      Effect.map(make(options), (store) => Context.make(key, store).pipe(Context.add(Store.Store, store)))
    )
  const layerConfig = (config: Config.Wrap<O>): Layer.Layer<I | Store.Store, Store.StoreError | Config.ConfigError> =>
    Layer.unwrap(Effect.map(Config.unwrap(config), layer))
  return { layer, layerConfig }
}
