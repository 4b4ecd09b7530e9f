/**
 * `Store` on LevelDB through classic-level.
 *
 * One LevelDB database per directory holds every partition store opened from
 * it, so all partitions share one block cache and one write-ahead log, and a
 * write batch lands atomically with the offsets it persists.
 *
 * Before classic-level sees the directory, the store decides what it holds
 * (`internal/storeDirectory.ts`: a RocksDB database, unrelated files or a
 * database without `CURRENT` are refused, nothing written) and, for an existing
 * database, checks the checksums of every table and log LevelDB will read
 * (`internal/levelFiles.ts`): classic-level exposes neither `paranoid_checks`
 * nor `verify_checksums`, and LevelDB without them serves damaged blocks as data.
 *
 * @since 0.1.0
 */
import { type Store, StoreValidation } from "@strata/core"
import { ClassicLevel } from "classic-level"
import { type Config, Context, Effect, type Layer, Schema, type Scope } from "effect"
import { check } from "./internal/levelFiles.js"
import { type DriverDb, make as makeShared, type NativeBatch } from "./internal/levelDb.js"
import { backendLayers, commonFields, decodeOptions, Uint32Size } from "./internal/options.js"

/** Options of the LevelDB store, validated when the store opens. */
export const LevelStoreOptions = Schema.Struct({
  ...commonFields,
  /** The block cache shared by every partition, in bytes (default 8 MiB, at most 4 GiB − 1). */
  cacheSize: Schema.optional(Uint32Size),
  /**
   * Memtable size before it is written to a table file, in bytes (default 64 MiB, one memtable per directory, at
   * most 4 GiB − 1).
   */
  writeBufferSize: Schema.optional(Uint32Size),
  /** Approximate size of a table block, in bytes (default 4 KiB, at most 4 GiB − 1). */
  blockSize: Schema.optional(Uint32Size),
  /** Table files kept open (default 1000). */
  maxOpenFiles: Schema.optional(Uint32Size),
  /** Snappy compression of table blocks (default false: the changelog is the durable copy; on, restores run ~8% slower). */
  compression: Schema.optional(Schema.Boolean),
  /**
   * Check the checksums of every live table and write-ahead log when an existing database opens (default true).
   * LevelDB, as classic-level opens it, checks none itself: a damaged block would be served as data. The check reads
   * the whole database once per open (sequential reads and CRC-32C in JavaScript); turn it off only for a database
   * too large to read at every start, accepting that damage then goes unnoticed.
   */
  verifyOnOpen: Schema.optional(Schema.Boolean)
})
/** @see LevelStoreOptions */
export type LevelStoreOptions = typeof LevelStoreOptions.Type

/** The LevelDB store's own service key; its layer provides `Store` too. */
export class LevelStore extends Context.Service<LevelStore, Store.Shape & { readonly directory: string }>()(
  "@strata/store-adapters/LevelStore"
) {}

const decode = decodeOptions("level", LevelStoreOptions)

/**
 * 64 MiB: persisted offsets are rewritten in every batch and sort after the data, so every flushed table overlaps
 * the earlier ones; a larger memtable keeps level 0 small (LevelDB's 4 MiB default stalls writes at ~1M records).
 */
const DEFAULT_WRITE_BUFFER = 64 * 1024 * 1024
/** classic-level's chained batch: the implementer methods, its asynchronous `_write` and the public `close`. */
interface LevelBatch extends NativeBatch {
  _write(options: { sync: boolean }): Promise<void>
  close(): Promise<void>
}

/** Native batches kept for reuse: enough for every batch in flight at once in a restore (one per partition). */
const MAX_IDLE_BATCHES = 32

/** Bytes per iterator page. */
const SCAN_PAGE_BYTES = 256 * 1024

/** Opens the database at `options.directory` for the life of the scope. */
export const make = (options: LevelStoreOptions): Effect.Effect<LevelStore["Service"], Store.StoreError, Scope.Scope> =>
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
      ...((o.verifyOnOpen ?? true) ? { check: (names: ReadonlyArray<string>) => check(o.directory, names) } : {}),
      open: async (mode) => {
        const db = new ClassicLevel<Buffer, Buffer>(o.directory, { keyEncoding: "buffer", valueEncoding: "buffer" })
        const idle: Array<LevelBatch> = []
        await db.open({
          // An existing database is never created over: without CURRENT, LevelDB would start an empty one and
          // delete the tables it no longer references.
          createIfMissing: mode.create,
          errorIfExists: mode.create,
          ...(o.cacheSize === undefined ? {} : { cacheSize: o.cacheSize }),
          writeBufferSize: o.writeBufferSize ?? DEFAULT_WRITE_BUFFER,
          ...(o.blockSize === undefined ? {} : { blockSize: o.blockSize }),
          ...(o.maxOpenFiles === undefined ? {} : { maxOpenFiles: o.maxOpenFiles }),
          compression: o.compression ?? false
        })
        return {
          // Native batches are reused: filled through the implementer methods, written, cleared and put back. A
          // batch per write kept its native buffer until the collector got to it, and abstract-level tracks every
          // batch it opens until it is closed.
          batch: async (fill, opts) => {
            // The implementer methods skip abstract-level's checks: on a closed database they would crash the process.
            if (db.status !== "open") throw new Error(`the database is ${db.status}`)
            const batch = idle.pop() ?? (db as unknown as { _chainedBatch(): LevelBatch })._chainedBatch()
            try {
              batch._clear()
              fill(batch)
              await batch._write(opts)
            } finally {
              batch._clear()
              if (idle.length < MAX_IDLE_BATCHES) idle.push(batch)
              else await batch.close()
            }
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
export const layer: (options: LevelStoreOptions) => Layer.Layer<LevelStore | Store.Store, Store.StoreError> =
  layers.layer

/** Like `layer`, with the options read from configuration. */
export const layerConfig: (
  config: Config.Wrap<LevelStoreOptions>
) => Layer.Layer<LevelStore | Store.Store, Store.StoreError | Config.ConfigError> = layers.layerConfig
