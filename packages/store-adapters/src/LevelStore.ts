/**
 * `Store` on LevelDB through classic-level.
 *
 * One LevelDB database per directory holds every partition store opened from
 * it, so all partitions share one block cache and one write-ahead log, and a
 * write batch lands atomically with the offsets it persists.
 *
 * @since 0.1.0
 */
import { type Store, type StoreError, type StoreShape, StoreValidation } from "@strata/core"
import { ClassicLevel } from "classic-level"
import { type Config, Context, Effect, type Layer, Schema, type Scope } from "effect"
import { type DriverDb, make as makeShared } from "./internal/levelDb.js"
import { backendLayers, commonFields, decodeOptions, PositiveInt } from "./internal/options.js"

/** Options of the LevelDB store, validated when the store opens. */
export const LevelStoreOptions = Schema.Struct({
  ...commonFields,
  /** The block cache shared by every partition, in bytes (default 8 MiB). */
  cacheSize: Schema.optional(PositiveInt),
  /** Memtable size before it is written to a table file, in bytes (default 64 MiB, one memtable per directory). */
  writeBufferSize: Schema.optional(PositiveInt),
  /** Approximate size of a table block, in bytes (default 4 KiB). */
  blockSize: Schema.optional(PositiveInt),
  /** Table files kept open (default 1000). */
  maxOpenFiles: Schema.optional(PositiveInt),
  /** Snappy compression of table blocks (default false: the changelog is the durable copy; on, restores run ~8% slower). */
  compression: Schema.optional(Schema.Boolean)
})
/** @see LevelStoreOptions */
export type LevelStoreOptions = typeof LevelStoreOptions.Type

/** The LevelDB store's own service key; its layer provides `Store` too. */
export class LevelStore extends Context.Service<LevelStore, StoreShape & { readonly directory: string }>()(
  "@strata/store-adapters/LevelStore"
) {}

const decode = decodeOptions("level", LevelStoreOptions)

/**
 * 64 MiB: persisted offsets are rewritten in every batch and sort after the data, so every flushed table overlaps
 * the earlier ones; a larger memtable keeps level 0 small (LevelDB's 4 MiB default stalls writes at ~1M records).
 */
const DEFAULT_WRITE_BUFFER = 64 * 1024 * 1024
/** Bytes per iterator page. */
const SCAN_PAGE_BYTES = 256 * 1024

/** Opens the database at `options.directory` for the life of the scope. */
export const make = (options: LevelStoreOptions): Effect.Effect<LevelStore["Service"], StoreError, Scope.Scope> =>
  Effect.gen(function* () {
    const o = yield* decode(options)
    const store = yield* makeShared({
      name: "level",
      directory: o.directory,
      sync: o.sync ?? false,
      limits: {
        maxKeyBytes: o.maxKeyBytes ?? StoreValidation.defaultLimits.maxKeyBytes,
        maxValueBytes: o.maxValueBytes ?? StoreValidation.defaultLimits.maxValueBytes
      },
      open: async () => {
        const db = new ClassicLevel<Buffer, Buffer>(o.directory, { keyEncoding: "buffer", valueEncoding: "buffer" })
        await db.open({
          createIfMissing: true,
          ...(o.cacheSize === undefined ? {} : { cacheSize: o.cacheSize }),
          writeBufferSize: o.writeBufferSize ?? DEFAULT_WRITE_BUFFER,
          ...(o.blockSize === undefined ? {} : { blockSize: o.blockSize }),
          ...(o.maxOpenFiles === undefined ? {} : { maxOpenFiles: o.maxOpenFiles }),
          compression: o.compression ?? false
        })
        return {
          // A chained batch skips abstract-level's per-op option cloning of the array form (~30% faster).
          batch: (ops, opts) => {
            const batch = db.batch()
            for (const op of ops) {
              if (op.type === "put") batch.put(op.key, op.value as Buffer)
              else batch.del(op.key)
            }
            return batch.write(opts)
          },
          get: (key) => db.get(key),
          getMany: (keys) => db.getMany(keys),
          // classic-level caps a nextv page at 16 KiB by default: bigger pages make scans ~1.7× faster.
          iterator: (range) => db.iterator({ ...range, highWaterMarkBytes: SCAN_PAGE_BYTES }),
          close: () => db.close()
        } satisfies DriverDb
      }
    })
    return { ...store, directory: o.directory }
  })

const layers = backendLayers(LevelStore, make)

/** A layer providing both `LevelStore` and `Store`. */
export const layer: (options: LevelStoreOptions) => Layer.Layer<LevelStore | Store, StoreError> = layers.layer

/** Like `layer`, with the options read from configuration. */
export const layerConfig: (
  config: Config.Wrap<LevelStoreOptions>
) => Layer.Layer<LevelStore | Store, StoreError | Config.ConfigError> = layers.layerConfig
