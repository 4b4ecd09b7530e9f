import { Store } from "@strata/core"
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as LevelStore from "@strata/store-adapters/level"
import * as MemoryStore from "@strata/store-adapters/memory"
import * as RocksDbStore from "@strata/store-adapters/rocksdb"
import { ConfigProvider, Context, Effect, Exit, Layer, Option, Scope, Stream } from "effect"
import { afterAll } from "vitest"
import { openInChild } from "./fixtures/openInChild.js"

const root = mkdtempSync(join(tmpdir(), "strata-store-backends-"))
afterAll(() => rmSync(root, { recursive: true, force: true }))
let n = 0
const freshDir = () => join(root, `db-${++n}`)

const enc = new TextEncoder()
const dec = new TextDecoder()

const backends: ReadonlyArray<{
  name: string
  layer: (directory: string) => Layer.Layer<Store.Store, Store.StoreError>
}> = [
  { name: "level", layer: (directory) => LevelStore.layer({ directory }) },
  { name: "rocksdb", layer: (directory) => RocksDbStore.layer({ directory }) }
]

const failure = <A, R>(effect: Effect.Effect<A, Store.StoreError, R>) =>
  Effect.flip(effect).pipe(Effect.map((e) => ({ tag: e.reason._tag, message: e.message })))

/** Reads every file below a directory, to prove a failed open changed nothing. */
const snapshot = (dir: string): Record<string, string> =>
  Object.fromEntries(
    readdirSync(dir, { recursive: true, withFileTypes: true })
      // The engines' info logs (LOG, LOG.old…) are rewritten by every open attempt; data files must not change.
      .filter((d) => d.isFile() && !/^LOG(\.old.*)?$/.test(d.name))
      .map((d) => {
        const path = join(d.parentPath, d.name)
        return [path, readFileSync(path).toString("base64")]
      })
  )

for (const backend of backends) {
  describe(`${backend.name} store`, () => {
    it.live("data and offsets survive closing and reopening the database", () =>
      Effect.gen(function* () {
        const directory = freshDir()
        const tp = { topic: "t-changelog", partition: 2 }
        const write = Effect.gen(function* () {
          const st = yield* (yield* Store.Store).open({ table: "t", partition: 2 })
          yield* st.write([Store.put(enc.encode("k"), enc.encode("v"))], { offsets: [{ ...tp, offset: 7 }] })
        })
        yield* Effect.scoped(write).pipe(Effect.provide(backend.layer(directory)))
        const read = Effect.gen(function* () {
          const st = yield* (yield* Store.Store).open({ table: "t", partition: 2 })
          return {
            value: Option.map(yield* st.get(enc.encode("k")), (v) => dec.decode(v)),
            offset: yield* st.persistedOffset(tp),
            entries: (yield* Stream.runCollect(st.scan())).length
          }
        })
        const got = yield* Effect.scoped(read).pipe(Effect.provide(backend.layer(directory)))
        assert.deepStrictEqual(got, { value: Option.some("v"), offset: Option.some(7), entries: 1 })
      })
    )

    it.live("many batches written at once each land whole, with their offsets (native batches are reused)", () =>
      Effect.gen(function* () {
        const directory = freshDir()
        const partitions = 8
        const writesEach = 6
        const keysEach = 40
        const program = Effect.gen(function* () {
          const store = yield* Store.Store
          const stores = yield* Effect.forEach(
            Array.from({ length: partitions }, (_, p) => p),
            (partition) => store.open({ table: "many", partition })
          )
          // Every write of every partition at once: on LevelDB they are in flight together.
          yield* Effect.forEach(
            stores.flatMap((st, p) => Array.from({ length: writesEach }, (_, w) => ({ st, p, w }))),
            ({ st, p, w }) =>
              st.write(
                Array.from({ length: keysEach }, (_, k) =>
                  Store.put(enc.encode(`w${w}-k${k}`), enc.encode(`${p}/${w}/${k}`))
                ),
                { offsets: [{ topic: `many-${w}`, partition: p, offset: 100 * p + w }] }
              ),
            { concurrency: "unbounded", discard: true }
          )
          // A write refused (an empty key) changes nothing, and the next one lands.
          const bad = yield* Effect.flip(stores[0]!.write([Store.put(new Uint8Array(0), enc.encode("x"))]))
          assert.strictEqual(bad.reason._tag, "InvalidKey")
          yield* stores[0]!.write([Store.put(enc.encode("after"), enc.encode("ok"))])
          // Keys of 100 different lengths in one write: more lengths than the store keeps key buffers for.
          yield* stores[1]!.write(
            Array.from({ length: 100 }, (_, i) => Store.put(enc.encode("z".repeat(i + 1)), enc.encode(`${i}`)))
          )
          return yield* Effect.forEach(stores, (st) =>
            Effect.all({ entries: Stream.runCollect(st.scan()), offsets: st.persistedOffsets })
          )
        })
        const scans = yield* Effect.scoped(program).pipe(Effect.provide(backend.layer(directory)))
        scans.forEach(({ entries, offsets }, p) => {
          const got = [...entries].map(([k, v]) => `${dec.decode(k)}=${dec.decode(v)}`).sort()
          const expected: Array<string> =
            p === 0 ? ["after=ok"] : p === 1 ? Array.from({ length: 100 }, (_, i) => `${"z".repeat(i + 1)}=${i}`) : []
          for (let w = 0; w < writesEach; w++)
            for (let k = 0; k < keysEach; k++) expected.push(`w${w}-k${k}=${p}/${w}/${k}`)
          assert.deepStrictEqual(got, expected.sort())
          assert.deepStrictEqual(
            [...offsets].map((o) => `${o.topic}/${o.partition}@${o.offset}`).sort(),
            Array.from({ length: writesEach }, (_, w) => `many-${w}/${p}@${100 * p + w}`)
          )
        })
      })
    )

    it.live("a partition store used after its database closed fails with a StoreError, and nothing crashes", () =>
      Effect.gen(function* () {
        const directory = freshDir()
        const outer = yield* Scope.make()
        const inner = yield* Scope.make()
        // The database lives in `inner`; the partition store is opened in `outer`, which outlives it.
        const context = yield* Layer.buildWithScope(backend.layer(directory), inner)
        const st = yield* (Context.get(context, Store.Store) as Store.Shape)
          .open({ table: "late", partition: 0 })
          .pipe(Scope.provide(outer))
        yield* st.put(enc.encode("k"), enc.encode("v"))
        yield* Scope.close(inner, Exit.void)
        const late = yield* Effect.flip(st.put(enc.encode("k2"), enc.encode("v2")))
        assert.isTrue(["StoreIoError", "StoreClosed"].includes(late.reason._tag), late.message)
        const read = yield* Effect.flip(st.get(enc.encode("k")))
        assert.isTrue(["StoreIoError", "StoreClosed"].includes(read.reason._tag), read.message)
        yield* Scope.close(outer, Exit.void)
        // What was written before the close is there when the directory opens again.
        const again = yield* Effect.scoped(
          Effect.gen(function* () {
            const reopened = yield* (yield* Store.Store).open({ table: "late", partition: 0 })
            return Option.map(yield* reopened.get(enc.encode("k")), (v) => dec.decode(v))
          }).pipe(Effect.provide(backend.layer(directory)))
        )
        assert.deepStrictEqual(again, Option.some("v"))
      })
    )

    it.live("a directory open in this process cannot be opened again: StoreLocked names the path", () =>
      Effect.gen(function* () {
        const directory = freshDir()
        yield* Effect.scoped(
          Effect.gen(function* () {
            yield* Layer.build(backend.layer(directory))
            const e = yield* failure(Effect.scoped(Layer.build(backend.layer(directory))))
            assert.strictEqual(e.tag, "StoreLocked")
            assert.include(e.message, directory)
          })
        )
        // Once closed, it opens again.
        yield* Effect.scoped(Layer.build(backend.layer(directory)))
      })
    )

    it.live(
      "another process gets StoreLocked while this one owns the directory",
      () =>
        Effect.gen(function* () {
          const directory = freshDir()
          const printed = yield* Effect.scoped(
            Effect.gen(function* () {
              yield* Layer.build(backend.layer(directory))
              return yield* openInChild(backend.name, directory)
            })
          )
          assert.include(printed, "StoreLocked")
          assert.include(printed, directory)
          assert.include(yield* openInChild(backend.name, directory), "opened")
        }),
      120_000
    )

    it.live("a corrupted directory gives StoreCorrupted naming the path and is left as it was", () =>
      Effect.gen(function* () {
        const directory = freshDir()
        yield* Effect.scoped(
          Effect.gen(function* () {
            const st = yield* (yield* Store.Store).open({ table: "t", partition: 0 })
            yield* st.put(enc.encode("k"), enc.encode("v"))
          })
        ).pipe(Effect.provide(backend.layer(directory)))
        // Point CURRENT at a manifest full of garbage.
        const manifest = readFileSync(join(directory, "CURRENT"), "utf8").trim()
        writeFileSync(join(directory, manifest), Buffer.alloc(4096, 0x5a))
        const before = snapshot(directory)
        const e = yield* failure(Effect.scoped(Layer.build(backend.layer(directory))))
        assert.strictEqual(e.tag, "StoreCorrupted")
        assert.include(e.message, directory)
        assert.deepStrictEqual(snapshot(directory), before)
      })
    )

    it.live("a path that is not a directory gives a typed error naming it", () =>
      Effect.gen(function* () {
        const file = join(root, `not-a-dir-${++n}`)
        writeFileSync(file, "plain file")
        const e = yield* failure(Effect.scoped(Layer.build(backend.layer(file))))
        assert.oneOf(e.tag, ["StoreIoError", "StoreCorrupted"])
        assert.include(e.message, file)
        assert.strictEqual(readFileSync(file, "utf8"), "plain file")
      })
    )

    it.live("invalid options are rejected before anything is opened, naming the field", () =>
      Effect.gen(function* () {
        const directory = freshDir()
        mkdirSync(directory)
        const bad: Layer.Layer<Store.Store, Store.StoreError> =
          backend.name === "level"
            ? LevelStore.layer({ directory, cacheSize: -1 })
            : RocksDbStore.layer({ directory, cacheSize: -1 })
        const e = yield* failure(Effect.scoped(Layer.build(bad)))
        assert.strictEqual(e.tag, "InvalidStoreOptions")
        assert.include(e.message, "cacheSize")
        assert.deepStrictEqual(readdirSync(directory), [])
        const empty = yield* failure(Effect.scoped(Layer.build(backend.layer(""))))
        assert.strictEqual(empty.tag, "InvalidStoreOptions")
        assert.include(empty.message, "directory")
      })
    )
  })
}

describe("layerConfig", () => {
  it.live("reads the options from configuration", () =>
    Effect.gen(function* () {
      const directory = freshDir()
      const provider = ConfigProvider.fromUnknown({ STORE_DIR: directory, STORE_SYNC: "true" })
      const { Config } = yield* Effect.promise(() => import("effect"))
      const layer = LevelStore.layerConfig({
        directory: Config.String("STORE_DIR"),
        sync: Config.Boolean("STORE_SYNC")
      })
      const backendName = yield* Effect.scoped(
        Effect.gen(function* () {
          const store = yield* Store.Store
          const level = yield* LevelStore.LevelStore
          assert.strictEqual(level.directory, directory)
          const st = yield* store.open({ table: "cfg", partition: 0 })
          yield* st.put(enc.encode("k"), enc.encode("v"))
          return store.backend
        }).pipe(Effect.provide(layer))
      ).pipe(Effect.provide(ConfigProvider.layer(provider)))
      assert.strictEqual(backendName, "level")
    })
  )
})

const liveness = (name: string, layer: (directory: string) => Layer.Layer<Store.Store, Store.StoreError>) =>
  it.live(`${name}: timers keep firing while thousands of batches are written back to back`, () =>
    Effect.gen(function* () {
      const store = yield* Store.Store
      const partition = yield* store.open({ table: "t", partition: 0 })
      let ticks = 0
      const timer = setInterval(() => {
        ticks++
      }, 1)
      yield* Effect.addFinalizer(() => Effect.sync(() => clearInterval(timer)))
      const value = new Uint8Array(100)
      for (let b = 0; b < 1500; b++) {
        const ops = Array.from({ length: 80 }, (_, i) => Store.put(new TextEncoder().encode(`k${b}-${i}`), value))
        yield* partition.write(ops, { offsets: [{ topic: "c", partition: 0, offset: b }] })
      }
      // A driver that blocks the event loop for the whole stream lets no timer fire at all.
      assert.isAbove(ticks, 0)
    }).pipe(
      Effect.scoped,
      Effect.provide(
        Layer.unwrap(
          Effect.acquireRelease(
            Effect.sync(() => mkdtempSync(join(tmpdir(), `strata-liveness-${name}-`))),
            (directory) => Effect.sync(() => rmSync(directory, { recursive: true, force: true }))
          ).pipe(Effect.map(layer))
        )
      ),
      Effect.scoped
    )
  )

describe("liveness during long write streams", () => {
  liveness("level", (directory) => LevelStore.layer({ directory }))
  liveness("rocksdb", (directory) => RocksDbStore.layer({ directory }))
})

/** Settings RocksDB recorded in the newest OPTIONS file of `directory`. */
const recordedOptions = (directory: string) => {
  const file = readdirSync(directory)
    .filter((f) => f.startsWith("OPTIONS-"))
    .sort((a, b) => Number(a.slice(8)) - Number(b.slice(8)))
    .at(-1)
  const text = readFileSync(join(directory, file ?? "OPTIONS-missing"), "utf8")
  return (name: string) => new RegExp(`^\\s*${name}=(.+)$`, "m").exec(text)?.[1]?.trim()
}

/** Opens a RocksDB store with `options`, writes a key, closes it; returns what its OPTIONS file records. */
const openedRocksDb = (options: Omit<RocksDbStore.RocksDbStoreOptions, "directory">) =>
  Effect.gen(function* () {
    const directory = freshDir()
    yield* Effect.scoped(
      Effect.gen(function* () {
        const st = yield* (yield* Store.Store).open({ table: "c", partition: 0 })
        yield* st.put(enc.encode("k"), enc.encode("v"))
      }).pipe(Effect.provide(RocksDbStore.layer({ directory, ...options })))
    )
    return recordedOptions(directory)
  })

describe("rocksdb compression", () => {
  const opened = (options: Omit<RocksDbStore.RocksDbStoreOptions, "directory">) =>
    Effect.map(openedRocksDb(options), (setting) => ({
      tables: setting("compression"),
      wal: setting("wal_compression")
    }))

  it.live("is off for tables and the write-ahead log unless asked for (the binding's own default is ZSTD)", () =>
    Effect.gen(function* () {
      assert.deepStrictEqual(yield* opened({}), { tables: "kNoCompression", wal: "kNoCompression" })
      assert.deepStrictEqual(yield* opened({ compression: true, walCompression: true }), {
        tables: "kZSTD",
        wal: "kZSTD"
      })
    })
  )
})

describe("rocksdb memtable budget", () => {
  it.live("sizes the memtables when set, and leaves RocksDB's own sizes when not", () =>
    Effect.gen(function* () {
      const unset = yield* openedRocksDb({})
      assert.strictEqual(unset("write_buffer_size"), String(64 * 2 ** 20))
      assert.strictEqual(unset("max_write_buffer_number"), "2")
      const budget = 32 * 2 ** 20
      const set = yield* openedRocksDb({ memtableMemoryBudget: budget })
      assert.strictEqual(set("write_buffer_size"), String(budget / 4))
      assert.strictEqual(set("max_write_buffer_number"), "6")
      assert.strictEqual(set("max_bytes_for_level_base"), String(budget))
      assert.strictEqual(set("compaction_style"), "kCompactionStyleLevel")
    })
  )
})

describe("level compression", () => {
  /** Bytes of LevelDB table files after 1 MB of zeros was written and the log replayed into a table on reopen. */
  const tableBytes = (options: Omit<LevelStore.LevelStoreOptions, "directory">) =>
    Effect.gen(function* () {
      const directory = freshDir()
      const session = (work: (store: Store.Store["Service"]) => Effect.Effect<void, Store.StoreError, Scope.Scope>) =>
        Effect.scoped(
          Effect.flatMap(Store.Store, work).pipe(Effect.provide(LevelStore.layer({ directory, ...options })))
        )
      yield* session((store) =>
        Effect.flatMap(store.open({ table: "z", partition: 0 }), (st) =>
          st.write(Array.from({ length: 1000 }, (_, i) => Store.put(enc.encode(`k${i}`), new Uint8Array(1024))))
        )
      )
      // Reopening replays the write-ahead log into a table file.
      yield* session(() => Effect.void)
      return readdirSync(directory)
        .filter((f) => f.endsWith(".ldb"))
        .reduce((n, f) => n + readFileSync(join(directory, f)).length, 0)
    })

  it.live("is off unless asked for", () =>
    Effect.gen(function* () {
      assert.isAbove(yield* tableBytes({}), 1000 * 1024)
      assert.isBelow(yield* tableBytes({ compression: true }), 200 * 1024)
    })
  )
})

describe("options", () => {
  type Case = { readonly layer: Layer.Layer<Store.Store, Store.StoreError>; readonly field: string }
  /** Each wrong option alone; the directory each would open is never created. */
  const cases = (directory: string): ReadonlyArray<Case> => {
    const wrong = <O>(options: O) => options as never
    return [
      { layer: MemoryStore.layer({ maxValueBytes: -1 }), field: "maxValueBytes" },
      { layer: MemoryStore.layer(wrong({ cacheSize: "8MB" })), field: "cacheSize" },
      { layer: MemoryStore.layer({ maxKeyBytes: 1.5 }), field: "maxKeyBytes" },
      { layer: MemoryStore.layer({ maxValueBytes: 0 }), field: "maxValueBytes" },
      { layer: MemoryStore.layer(wrong({ maxValueBytes: "16MB" })), field: "maxValueBytes" },
      { layer: LevelStore.layer(wrong({ directory, cacheSize: "8MB" })), field: "cacheSize" },
      // classic-level reads these as unsigned 32-bit integers: 2^32 would become 0.
      { layer: LevelStore.layer({ directory, cacheSize: 2 ** 32 }), field: "cacheSize" },
      { layer: LevelStore.layer({ directory, writeBufferSize: 1.5 }), field: "writeBufferSize" },
      { layer: LevelStore.layer({ directory, maxValueBytes: Number.NaN }), field: "maxValueBytes" },
      { layer: LevelStore.layer(wrong({ directory, writerThread: false })), field: "writerThread" },
      { layer: LevelStore.layer(wrong({ directory, verifyOnOpen: "yes" })), field: "verifyOnOpen" },
      { layer: RocksDbStore.layer({ directory, blockSize: 2 ** 32 }), field: "blockSize" },
      { layer: RocksDbStore.layer({ directory, parallelism: 2 ** 31 }), field: "parallelism" },
      { layer: RocksDbStore.layer(wrong({ directory, infoLogLevel: "loud" })), field: "infoLogLevel" },
      { layer: RocksDbStore.layer(wrong({ directory, maxOpenFiles: 10 })), field: "maxOpenFiles" },
      { layer: RocksDbStore.layer(wrong({ directory: 42 })), field: "directory" }
    ]
  }

  it.live("a wrong or unknown option fails with InvalidStoreOptions naming it, on every backend, opening nothing", () =>
    Effect.gen(function* () {
      const directory = freshDir()
      for (const { layer, field } of cases(directory)) {
        const e = yield* failure(Effect.scoped(Layer.build(layer)))
        assert.strictEqual(e.tag, "InvalidStoreOptions", `${field}: ${e.message}`)
        assert.include(e.message, field)
      }
      assert.isFalse(existsSync(directory))
    })
  )

  it.live("layerConfig validates what configuration provides the same way", () =>
    Effect.gen(function* () {
      const { Config } = yield* Effect.promise(() => import("effect"))
      const provider = ConfigProvider.fromUnknown({ MAX_VALUE: "-1" })
      const e = yield* failure(
        Effect.scoped(Layer.build(MemoryStore.layerConfig({ maxValueBytes: Config.Number("MAX_VALUE") }))).pipe(
          Effect.catchTag("ConfigError", (c) => Effect.die(c))
        )
      ).pipe(Effect.provide(ConfigProvider.layer(provider)))
      assert.strictEqual(e.tag, "InvalidStoreOptions")
      assert.include(e.message, "maxValueBytes")
      // Valid options still open a working store.
      const backend = yield* Effect.scoped(
        Effect.map(Layer.build(MemoryStore.layer({ maxKeyBytes: 16, maxValueBytes: 32 })), (c) => {
          const store = Context.get(c, Store.Store)
          return `${store.backend} ${store.limits.maxKeyBytes} ${store.limits.maxValueBytes}`
        })
      )
      assert.strictEqual(backend, "memory 16 32")
    })
  )
})
