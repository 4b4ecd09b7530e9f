/**
 * Damaged store directories, on real LevelDB and RocksDB files (the companion of `Crash.test.ts`, which kills
 * writers; here the files are damaged by hand). The rule on both backends: a damaged database is reported as
 * `StoreCorrupted` naming the path — at open or at the read that meets the damage — and is never served as wrong
 * data or as a fresh empty database, and nothing in it is wiped. A write-ahead log cut or garbled at its very end
 * (what a crash mid-write leaves) is not damage: the store opens at the batches before it, as after a crash.
 */
import { Store } from "@strata/core"
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, truncateSync, writeSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as LevelStore from "@strata/store-adapters/level"
import * as RocksDbStore from "@strata/store-adapters/rocksdb"
import { Effect, Option, type Scope, Stream } from "effect"
import { afterAll } from "vitest"
import { filesEnding, snapshot } from "./fixtures/files.js"

const root = mkdtempSync(join(tmpdir(), "strata-store-corruption-"))
afterAll(() => rmSync(root, { recursive: true, force: true }))
let n = 0
const freshDir = () => join(root, `db-${++n}`)

const enc = new TextEncoder()
const dec = new TextDecoder()
const STORE_ID = { table: "damaged", partition: 0 }
const TOPIC = "damaged-changelog"
const tp = { topic: TOPIC, partition: 0 }
const BATCHES = 10
const KEYS = 100
const keyOf = (batch: number, i: number) => `key-${batch}-${String(i).padStart(3, "0")}`
const valueBytesOf = (batch: number, i: number) => `value-${batch}-${i}-`.padEnd(200, "x")

interface Backend {
  readonly name: "level" | "rocksdb"
  readonly label: string
  /** The suffix of its table files. */
  readonly table: string
  readonly make: (directory: string) => Effect.Effect<Store.Shape, Store.StoreError, Scope.Scope>
}
const backends: ReadonlyArray<Backend> = [
  { name: "level", label: "level", table: ".ldb", make: (directory) => LevelStore.make({ directory }) },
  { name: "rocksdb", label: "rocksdb", table: ".sst", make: (directory) => RocksDbStore.make({ directory }) },
  {
    name: "rocksdb",
    label: "rocksdb, reading asynchronously",
    table: ".sst",
    make: (directory) => RocksDbStore.make({ directory, syncReads: false })
  }
]

/**
 * Writes batches 0..9 (100 new keys each, persisting offset n with batch n) and closes; with `tables`, opens once
 * more, which turns the write-ahead log into a table file.
 */
const populate = (b: Backend, directory: string, tables: boolean) =>
  Effect.gen(function* () {
    yield* Effect.scoped(
      Effect.gen(function* () {
        const st = yield* (yield* b.make(directory)).open(STORE_ID)
        for (let batch = 0; batch < BATCHES; batch++) {
          const ops = Array.from({ length: KEYS }, (_, i) =>
            Store.put(enc.encode(keyOf(batch, i)), enc.encode(valueBytesOf(batch, i)))
          )
          yield* st.write(ops, { offsets: [{ ...tp, offset: batch }] })
        }
      })
    )
    if (tables) yield* Effect.scoped(b.make(directory))
    assert.isNotEmpty(filesEnding(directory, tables ? b.table : ".log"))
  })

/** Every entry as `key=value`, sorted, of batches 0..last. */
const replay = (last: number): Array<string> => {
  const out: Array<string> = []
  for (let batch = 0; batch <= last; batch++)
    for (let i = 0; i < KEYS; i++) out.push(`${keyOf(batch, i)}=${valueBytesOf(batch, i)}`)
  return out.sort()
}

/** Opens the directory and reads everything: one key, the persisted offset, a full scan. */
const readAll = (b: Backend, directory: string) =>
  Effect.scoped(
    Effect.gen(function* () {
      const st = yield* (yield* b.make(directory)).open(STORE_ID)
      const value = Option.map(yield* st.get(enc.encode(keyOf(3, 7))), (v) => dec.decode(v))
      const offset = Option.getOrUndefined(yield* st.persistedOffset(tp))
      const entries = (yield* Stream.runCollect(st.scan())).map(([k, v]) => `${dec.decode(k)}=${dec.decode(v)}`)
      return { value, offset, entries: entries.sort() }
    })
  )

/** Asserts that the store holds exactly batches 0..last and reports `last` as its persisted offset. */
const assertHolds = (b: Backend, directory: string, last: number) =>
  Effect.gen(function* () {
    const got = yield* readAll(b, directory)
    assert.strictEqual(got.offset, last)
    assert.deepStrictEqual(got.value, last >= 3 ? Option.some(valueBytesOf(3, 7)) : Option.none())
    assert.strictEqual(got.entries.length, (last + 1) * KEYS)
    assert.deepStrictEqual(got.entries, replay(last))
  })

/** Asserts that opening and reading fails with StoreCorrupted naming the directory (never returns data). */
const assertCorrupted = (b: Backend, directory: string) =>
  Effect.gen(function* () {
    const result = yield* Effect.result(readAll(b, directory))
    if (result._tag === "Success") {
      const { entries, ...rest } = result.success
      assert.fail(
        `the damaged store was read without an error: ${JSON.stringify({ ...rest, entries: entries.length })}`
      )
    } else {
      assert.strictEqual(result.failure.reason._tag, "StoreCorrupted", result.failure.message)
      assert.include(result.failure.message, directory)
    }
  })

/** Overwrites bytes of a file in place; returns what was there. */
const overwrite = (path: string, at: number, bytes: Buffer): Buffer => {
  const old = Buffer.from(readFileSync(path).subarray(at, at + bytes.length))
  const fd = openSync(path, "r+")
  try {
    writeSync(fd, bytes, 0, bytes.length, at)
  } finally {
    closeSync(fd)
  }
  return old
}

/** The only file of `directory` ending with `suffix`. */
const onlyFile = (directory: string, suffix: string): string => {
  const files = filesEnding(directory, suffix)
  assert.strictEqual(files.length, 1, `${suffix} files: ${files.join(", ")}`)
  return join(directory, files[0]!)
}

for (const b of backends) {
  describe(`${b.label}: damaged directories`, () => {
    it.live(
      "CURRENT removed beside the table files: StoreCorrupted, never a fresh empty store; nothing is touched",
      () =>
        Effect.gen(function* () {
          const directory = freshDir()
          yield* populate(b, directory, true)
          const current = readFileSync(join(directory, "CURRENT"))
          rmSync(join(directory, "CURRENT"))
          const before = snapshot(directory)
          const e = yield* Effect.flip(Effect.scoped(b.make(directory)))
          assert.strictEqual(e.reason._tag, "StoreCorrupted", e.message)
          assert.include(e.message, directory)
          assert.include(e.message, "CURRENT")
          // Not a file was created, renamed, rewritten or deleted (the engines used to start over and delete tables).
          assert.deepStrictEqual(snapshot(directory), before)
          // Put back, the database is whole.
          const fd = openSync(join(directory, "CURRENT"), "w")
          writeSync(fd, current)
          closeSync(fd)
          yield* assertHolds(b, directory, BATCHES - 1)
        })
    )

    const places: ReadonlyArray<{ readonly what: string; readonly at: (table: Buffer) => number }> = [
      { what: "inside a value", at: (t) => t.indexOf(valueBytesOf(3, 7)) + 2 },
      { what: "inside the persisted offset's key", at: (t) => t.indexOf(TOPIC) + 1 },
      { what: "in the table's index, just before its footer", at: (t) => t.length - 64 }
    ]
    for (const place of places) {
      it.live(`two bytes overwritten in a table file, ${place.what}: StoreCorrupted, never wrong data`, () =>
        Effect.gen(function* () {
          const directory = freshDir()
          yield* populate(b, directory, true)
          const table = onlyFile(directory, b.table)
          const at = place.at(readFileSync(table))
          assert.isAtLeast(at, 2)
          const old = overwrite(table, at, Buffer.from("ZZ"))
          assert.notDeepEqual(old, Buffer.from("ZZ"))
          const damaged = readFileSync(table)
          yield* assertCorrupted(b, directory)
          // Nothing was wiped: the damaged table is still there, byte for byte, and repaired it serves everything.
          assert.deepStrictEqual(readFileSync(table), damaged)
          overwrite(table, at, old)
          yield* assertHolds(b, directory, BATCHES - 1)
        })
      )
    }

    it.live(
      b.name === "level"
        ? "two bytes overwritten in a record in the middle of the write-ahead log: StoreCorrupted (LevelDB would skip it)"
        : "two bytes overwritten in a record in the middle of the write-ahead log: RocksDB recovers the batches before it",
      () =>
        Effect.gen(function* () {
          const directory = freshDir()
          yield* populate(b, directory, false)
          const log = onlyFile(directory, ".log")
          overwrite(log, readFileSync(log).indexOf(valueBytesOf(3, 7)) + 2, Buffer.from("ZZ"))
          if (b.name === "level") {
            // LevelDB drops the damaged 32 KiB block and replays the rest: batches after the hole would come back
            // without the ones in it. The store refuses instead.
            const damaged = readFileSync(log)
            yield* assertCorrupted(b, directory)
            assert.deepStrictEqual(readFileSync(log), damaged)
          } else {
            // RocksDB's point-in-time recovery stops at the damaged record: a consistent prefix, and the persisted
            // offset says where it ends (the changelog replays the rest).
            const got = yield* readAll(b, directory)
            assert.isDefined(got.offset)
            assert.isBelow(got.offset!, 3)
            assert.deepStrictEqual(got.entries, replay(got.offset!))
          }
        })
    )

    it.live("a write-ahead log cut inside its last record (a crash mid-write) opens at the batches before it", () =>
      Effect.gen(function* () {
        const directory = freshDir()
        yield* populate(b, directory, false)
        const log = onlyFile(directory, ".log")
        truncateSync(log, readFileSync(log).length - 50)
        yield* assertHolds(b, directory, BATCHES - 2)
      })
    )

    it.live(
      "a write-ahead log whose last record is garbled (an OS crash mid-write) opens at the batches before it",
      () =>
        Effect.gen(function* () {
          const directory = freshDir()
          yield* populate(b, directory, false)
          const log = onlyFile(directory, ".log")
          overwrite(log, readFileSync(log).lastIndexOf(valueBytesOf(BATCHES - 1, KEYS - 1)) + 2, Buffer.from("ZZ"))
          yield* assertHolds(b, directory, BATCHES - 2)
        })
    )
  })
}

describe("level, compressed tables: damaged directories", () => {
  const compressed: Backend = {
    name: "level",
    label: "level, compressed tables",
    table: ".ldb",
    make: (directory) => LevelStore.make({ directory, compression: true })
  }
  it.live("the open check reads Snappy-compressed index blocks: a whole database opens, a damaged one does not", () =>
    Effect.gen(function* () {
      const directory = freshDir()
      yield* populate(compressed, directory, true)
      const table = onlyFile(directory, ".ldb")
      const bytes = readFileSync(table)
      // The index block ends just before the 48-byte footer; its trailer (type byte, then CRC) takes the last 5
      // bytes, and type 1 is Snappy.
      assert.strictEqual(bytes[bytes.length - 48 - 5], 1, "the index block is not compressed: the test proves nothing")
      yield* assertHolds(compressed, directory, BATCHES - 1)
      for (const at of [Math.floor(bytes.length / 3), Math.floor(bytes.length / 2), bytes.length - 60]) {
        const old = overwrite(table, at, Buffer.from([bytes[at]! ^ 0x5a, bytes[at + 1]! ^ 0xa5]))
        yield* assertCorrupted(compressed, directory)
        overwrite(table, at, old)
      }
      yield* assertHolds(compressed, directory, BATCHES - 1)
    })
  )
})
