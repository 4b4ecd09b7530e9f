/**
 * A store whose disk fills, on a real filesystem: a tmpfs of a few MiB (mounting it needs root, as CI runs the
 * tests), filled by a file of the test's. LevelDB and RocksDB keep a failed write-ahead-log append as an error
 * that refuses every later write until the database is opened again; the store opens it again once space is freed.
 */
import { Store } from "@strata/core"
import { rmSync } from "node:fs"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as LevelStore from "@strata/store-adapters/level"
import * as RocksDbStore from "@strata/store-adapters/rocksdb"
import { Effect, Exit, type Layer, Option } from "effect"
import { fill, smallFilesystem } from "../../../scripts/test-support/smallFilesystem.js"

const backends: ReadonlyArray<{
  name: string
  layer: (directory: string) => Layer.Layer<Store.Store, Store.StoreError>
}> = [
  { name: "level", layer: (directory) => LevelStore.layer({ directory }) },
  { name: "rocksdb", layer: (directory) => RocksDbStore.layer({ directory }) },
  {
    name: "rocksdb writing on the calling thread",
    layer: (directory) => RocksDbStore.layer({ directory, writerThread: false })
  }
]

const enc = new TextEncoder()
const key = (p: number, i: number) => enc.encode(`p${p}-${String(i).padStart(6, "0")}`)
const value = new Uint8Array(1_000).fill(3)
const tp = (partition: number) => ({ topic: "full-changelog", partition })

/** The first write of `st` that fails, trying at most `attempts`; how many succeeded before it, and its error. */
const writeUntilRefused = (st: Effect.Success<ReturnType<Store.Shape["open"]>>, from: number, attempts: number) =>
  Effect.gen(function* () {
    for (let i = from; i < from + attempts; i++) {
      const exit = yield* Effect.exit(st.write([Store.put(key(0, i), value)], { offsets: [{ ...tp(0), offset: i }] }))
      if (Exit.isFailure(exit))
        return { acknowledged: i - from, error: yield* Effect.flip(Effect.failCause(exit.cause)) }
    }
    return assert.fail(`${attempts} writes of 1 KB were all taken by a full disk`)
  })

for (const backend of backends) {
  describe(`${backend.name} store on a disk that fills`, () => {
    it.live(
      "writes fail with an I/O error naming the full disk while it is full, and succeed again once space is freed; nothing acknowledged is lost",
      () =>
        Effect.gen(function* () {
          const mount = mkdtempSync(join(tmpdir(), "strata-full-disk-"))
          yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(mount, { recursive: true, force: true })))
          yield* smallFilesystem(mount, 16)
          const directory = join(mount, "db")
          const filler = join(mount, "filler")
          const written = yield* Effect.scoped(
            Effect.gen(function* () {
              const store = yield* Store.Store
              const [first, second] = [
                yield* store.open({ table: "full", partition: 0 }),
                yield* store.open({ table: "full", partition: 1 })
              ]
              // 500 acknowledged records, then the disk fills.
              for (let i = 0; i < 500; i++)
                yield* first.write([Store.put(key(0, i), value)], { offsets: [{ ...tp(0), offset: i }] })
              yield* second.write([Store.put(key(1, 0), value)], { offsets: [{ ...tp(1), offset: 0 }] })
              fill(filler)
              const refused = yield* writeUntilRefused(first, 500, 20_000)
              assert.strictEqual(refused.error.reason._tag, "StoreIoError")
              assert.match(refused.error.message, /No space left on device/)
              // Still full: a write is refused or, where opening the database again gave back space it had set
              // aside (RocksDB preallocates its write-ahead log), taken; it never hangs.
              let acked = 500 + refused.acknowledged
              for (let i = 0; i < 3; i++) {
                const again = yield* Effect.exit(
                  first.write([Store.put(key(0, acked), value)], { offsets: [{ ...tp(0), offset: acked }] })
                )
                if (Exit.isSuccess(again)) acked++
                else assert.match(String(again.cause), /No space left on device|StoreIoError/)
              }
              rmSync(filler)
              // Space is back: both partitions write again, and read everything acknowledged.
              yield* first.write([Store.put(key(0, acked), value)], { offsets: [{ ...tp(0), offset: acked }] })
              yield* second.write([Store.put(key(1, 1), value)], { offsets: [{ ...tp(1), offset: 1 }] })
              const read = yield* first.getMany(Array.from({ length: acked + 1 }, (_, i) => key(0, i)))
              assert.strictEqual(read.filter(Option.isSome).length, acked + 1)
              assert.deepStrictEqual(yield* first.persistedOffset(tp(0)), Option.some(acked))
              return acked + 1
            }).pipe(Effect.provide(backend.layer(directory)))
          )
          // Opened afresh, the database holds every write that succeeded.
          yield* Effect.scoped(
            Effect.gen(function* () {
              const store = yield* Store.Store
              const first = yield* store.open({ table: "full", partition: 0 })
              const second = yield* store.open({ table: "full", partition: 1 })
              const read = yield* first.getMany(Array.from({ length: written }, (_, i) => key(0, i)))
              assert.strictEqual(read.filter(Option.isSome).length, written)
              assert.deepStrictEqual(yield* first.persistedOffset(tp(0)), Option.some(written - 1))
              assert.deepStrictEqual(yield* second.persistedOffset(tp(1)), Option.some(1))
            }).pipe(Effect.provide(backend.layer(directory)))
          )
        }).pipe(Effect.scoped),
      60_000
    )
  })
}
