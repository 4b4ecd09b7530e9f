import { InvalidStoreOptions, Store, type StoreError, type StoreShape, storeError } from "@strata/core"
import { Config, Context, Effect, Layer, Schema, type Scope } from "effect"

/** A positive safe integer option (bytes, counts). */
export const PositiveInt = Schema.Int.check(Schema.isGreaterThan(0))

/** Options every backend accepts. */
export const commonFields = {
  /** The database directory (created if missing). One process owns it at a time. */
  directory: Schema.NonEmptyString,
  /** fsync the write-ahead log on every batch (default false: a process crash loses nothing, an OS crash may). */
  sync: Schema.optional(Schema.Boolean),
  /** Largest key accepted, in bytes (default 64 KiB). */
  maxKeyBytes: Schema.optional(PositiveInt),
  /** Largest value accepted, in bytes (default 16 MiB). */
  maxValueBytes: Schema.optional(PositiveInt)
}

/** Validates a backend's options; a failure names each wrong field. */
export const decodeOptions =
  <S extends Schema.Codec<unknown, unknown>>(store: string, schema: S) =>
  (input: unknown): Effect.Effect<S["Type"], StoreError> =>
    Schema.decodeUnknownEffect(schema)(input, { errors: "all" }).pipe(
      Effect.mapError((issue) => storeError(new InvalidStoreOptions({ store, detail: issue.message })))
    ) as Effect.Effect<S["Type"], StoreError>

/**
 * `layer` and `layerConfig` of a store backend: each provides the backend's own
 * key and the `Store` protocol key from the same instance.
 */
export const backendLayers = <I, S extends StoreShape, O>(
  key: Context.Key<I, S>,
  make: (options: O) => Effect.Effect<S, StoreError, Scope.Scope>
) => {
  const layer = (options: O): Layer.Layer<I | Store, StoreError> =>
    Layer.effectContext(Effect.map(make(options), (store) => Context.make(key, store).pipe(Context.add(Store, store))))
  const layerConfig = (config: Config.Wrap<O>): Layer.Layer<I | Store, StoreError | Config.ConfigError> =>
    Layer.unwrap(Effect.map(Config.unwrap(config), layer))
  return { layer, layerConfig }
}
