/**
 * `Store` on RocksDB through `@nxtedition/rocksdb` (maintained, N-API prebuilds
 * for Node 24; the older `rocksdb` package is discontinued and does not install
 * on Node 24 without a toolchain and network access to node headers).
 *
 * One RocksDB database per directory holds every partition store opened from
 * it: one block cache (a HyperClockCache of `cacheSize` bytes), one memtable
 * budget and one write-ahead log for all partitions, and a write batch lands
 * atomically with the offsets it persists. Batches are written on a worker thread sharing the open database
 * (`writerThread`); reads go straight to it from the calling thread.
 *
 * @since 0.1.0
 */
import { type Store, StoreValidation } from "@strata/core"
import { createRequire } from "node:module"
import { RocksLevel } from "@nxtedition/rocksdb"
import { type Config, Context, Effect, type Layer, Schema, type Scope } from "effect"
import { type DriverDb, make as makeShared } from "./internal/levelDb.js"
import { type RocksWriter, startRocksWriter } from "./internal/rocksWriter.js"
import { backendLayers, commonFields, decodeOptions, PositiveInt, Uint32Size } from "./internal/options.js"

/** Options of the RocksDB store, validated when the store opens. */
export const RocksDbStoreOptions = Schema.Struct({
  ...commonFields,
  /** The block cache shared by every partition, in bytes (default 8 MiB, at most 4 GiB − 1). */
  cacheSize: Schema.optional(Uint32Size),
  /**
   * Memory for memtables, in bytes. Unset (the default), RocksDB's own settings apply: two memtables of 64 MiB.
   * Set, it switches to level-style compaction tuned to the budget (four memtables of a quarter each, level 1 the
   * size of the budget); that tuning of the binding ZSTD-compresses levels 2 and below whatever `compression` says.
   */
  memtableMemoryBudget: Schema.optional(PositiveInt),
  /** Approximate size of a table block, in bytes (default 4 KiB, at most 4 GiB − 1: RocksDB's limit). */
  blockSize: Schema.optional(Uint32Size),
  /** ZSTD compression of table blocks (default false). */
  compression: Schema.optional(Schema.Boolean),
  /**
   * ZSTD compression of the write-ahead log (default false). It shrinks the log but runs on the thread that writes:
   * with it on, a restore of 1M records spent most of its time compressing.
   */
  walCompression: Schema.optional(Schema.Boolean),
  /**
   * Write batches on a worker thread (default true). The binding writes synchronously on the thread that calls it
   * (~0.5 µs per record); with the worker, the JavaScript thread only copies a batch's keys and values into one
   * buffer: a restore of 1M records ran ~10% faster, with a third less CPU on the JavaScript thread. A lone stream
   * of awaited writes pays a thread round trip per batch instead. Writes that arrive while the worker writes go to
   * it together as one batch when it is free (a group commit; each stays atomic). Reads never leave the calling
   * thread. False writes on the calling thread.
   */
  writerThread: Schema.optional(Schema.Boolean),
  /**
   * Read keys (`get`, `getMany`, `persistedOffset`) with the binding's synchronous multi-get on the calling thread
   * (default true). A read served from the memtable or block cache takes microseconds, less than the thread hop of
   * an asynchronous get; a read that goes to disk blocks the JavaScript thread meanwhile, as Kafka Streams' RocksDB
   * reads block their stream thread. False reads each key through an asynchronous iterator instead: the binding's
   * asynchronous get throws a read error (a checksum mismatch) from its completion callback, an uncaught exception
   * that never settles the read; an iterator reports it. A point read by iterator skips the bloom filters, so a
   * missing key costs more.
   */
  syncReads: Schema.optional(Schema.Boolean),
  /** Background threads for flushes and compactions (default: RocksDB's; at most 1024). */
  parallelism: Schema.optional(PositiveInt.check(Schema.isLessThanOrEqualTo(1024))),
  /** Level of RocksDB's own LOG file (default "warn"). */
  infoLogLevel: Schema.optional(Schema.Literals(["debug", "info", "warn", "error", "fatal", "header"]))
})
/** @see RocksDbStoreOptions */
export type RocksDbStoreOptions = typeof RocksDbStoreOptions.Type

/** The RocksDB store's own service key; its layer provides `Store` too. */
export class RocksDbStore extends Context.Service<RocksDbStore, Store.Shape & { readonly directory: string }>()(
  "@strata/store-adapters/RocksDbStore"
) {}

const decode = decodeOptions("rocksdb", RocksDbStoreOptions)

/**
 * Writes on the calling thread (`writerThread: false`): one native batch serves every write, filled through the
 * implementer methods, written and cleared in one turn. After each write a macrotask is yielded, so timers
 * (heartbeats, timeouts, stall checks) still run during a long stream of writes such as a restore.
 */
const writeHere = (db: RocksLevel): DriverDb["batch"] => {
  const batch = db._chainedBatch()
  return async (fill, opts) => {
    try {
      batch._clear()
      fill(batch)
      batch._writeSync(opts)
    } finally {
      batch._clear()
    }
    await new Promise<void>((resolve) => setImmediate(resolve))
  }
}

/** Where the binding resolves from here: the writer thread loads the same module. */
const bindingPath = (): string => createRequire(import.meta.url).resolve("@nxtedition/rocksdb")

/**
 * Reads keys synchronously. The binding answers an aborted or timed-out read with null (no deadline is set, so
 * neither happens); anything but a value or undefined is refused rather than served.
 */
const readSync = (db: RocksLevel, keys: Array<Buffer>): Array<Buffer | undefined> => {
  if (db.status !== "open") throw new Error(`the database is ${db.status}`)
  const values = db._getManySync(keys)
  for (const v of values) if (v === null) throw new Error("the read was aborted")
  return values as Array<Buffer | undefined>
}

/**
 * Reads one key through an iterator. The binding's asynchronous get (`db_get_many`) throws a read error such as a
 * checksum mismatch from its completion callback: an uncaught exception, and the read never settles. Its iterators
 * report errors as rejections.
 */
const readByIterator = async (driver: DriverDb, key: Buffer): Promise<Buffer | undefined> => {
  const it = driver.iterator({ gte: key, lte: key })
  try {
    const [entry] = await it.nextv(1)
    return entry?.[1]
  } finally {
    await it.close()
  }
}

/**
 * Opens the database at `options.directory` for the life of the scope.
 *
 * Before the binding sees the directory, the store decides what it holds (`internal/storeDirectory.ts`): a LevelDB
 * database (on which RocksDB aborts the process or converts it), unrelated files or a database without `CURRENT`
 * are refused, with nothing written. RocksDB checks its own files: `paranoid_checks` and checksum verification on
 * every read are its defaults, which the binding keeps, so a damaged block fails the read that meets it with
 * `StoreCorrupted`.
 */
export const make = (
  options: RocksDbStoreOptions
): Effect.Effect<RocksDbStore["Service"], Store.StoreError, Scope.Scope> =>
  Effect.gen(function* () {
    const o = yield* decode(options)
    const store = yield* makeShared({
      name: "rocksdb",
      directory: o.directory,
      sync: o.sync ?? false,
      limits: {
        maxKeyBytes: o.maxKeyBytes ?? StoreValidation.defaultLimits.maxKeyBytes,
        maxValueBytes: o.maxValueBytes ?? StoreValidation.defaultLimits.maxValueBytes
      },
      open: async (mode) => {
        const db = new RocksLevel(o.directory, { keyEncoding: "buffer", valueEncoding: "buffer" })
        await db.open({
          // An existing database is never created over: without CURRENT, RocksDB would start a new one beside the
          // old files.
          createIfMissing: mode.create,
          errorIfExists: mode.create,
          infoLogLevel: o.infoLogLevel ?? "warn",
          ...(o.cacheSize === undefined ? {} : { cacheSize: o.cacheSize }),
          // The binding reads the budget only together with a compaction style: alone it was silently ignored.
          ...(o.memtableMemoryBudget === undefined
            ? {}
            : { compaction: "level", memtableMemoryBudget: o.memtableMemoryBudget }),
          ...(o.blockSize === undefined ? {} : { blockSize: o.blockSize }),
          compression: o.compression ?? false,
          walCompression: o.walCompression ?? false,
          ...(o.parallelism === undefined ? {} : { parallelism: o.parallelism })
        })
        const driver = db as unknown as DriverDb
        let writer: RocksWriter | undefined
        if (o.writerThread ?? true) {
          try {
            writer = await startRocksWriter(db.handle, bindingPath())
          } catch (e) {
            await db.close()
            throw e
          }
        }
        const write = writer?.write ?? writeHere(db)
        return {
          batch: (fill, opts) => {
            // The implementer methods skip abstract-level's checks: on a closed database they would crash the process.
            if (db.status !== "open") return Promise.reject(new Error(`the database is ${db.status}`))
            return write(fill, opts)
          },
          get: (key) => readByIterator(driver, key),
          getMany: (keys) => Promise.all(keys.map((key) => readByIterator(driver, key))),
          ...((o.syncReads ?? true)
            ? {
                getSync: (key: Buffer) => readSync(db, [key])[0],
                getManySync: (keys: Array<Buffer>) => readSync(db, keys)
              }
            : {}),
          iterator: (r) => driver.iterator(r),
          // The writer stops first (after the writes already posted): the database outlives every use of it.
          close: async () => {
            await writer?.close()
            await driver.close()
          }
        } satisfies DriverDb
      }
    })
    return { ...store, directory: o.directory }
  })

const layers = backendLayers(RocksDbStore, make)

/** A layer providing both `RocksDbStore` and `Store`. */
export const layer: (options: RocksDbStoreOptions) => Layer.Layer<RocksDbStore | Store.Store, Store.StoreError> =
  layers.layer

/** Like `layer`, with the options read from configuration. */
export const layerConfig: (
  config: Config.Wrap<RocksDbStoreOptions>
) => Layer.Layer<RocksDbStore | Store.Store, Store.StoreError | Config.ConfigError> = layers.layerConfig
