/**
 * What each backend does with the directory it is given, before the engine sees it: a nonexistent or empty
 * directory becomes a new database, its own database opens, and anything else — the other engine's database, files
 * no engine writes, both engines' files at once — is refused with `ForeignStoreDirectory` naming the path and what
 * it holds, with nothing written to it. A directory the process may not write is `StoreAccessDenied`, not
 * `StoreLocked`.
 */
import { Store } from "@strata/core"
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as LevelStore from "@strata/store-adapters/level"
import * as RocksDbStore from "@strata/store-adapters/rocksdb"
import { Effect, Option, type Scope } from "effect"
import { afterAll } from "vitest"
import { snapshot } from "./fixtures/files.js"
import { openInChild } from "./fixtures/openInChild.js"

const root = mkdtempSync(join(tmpdir(), "strata-store-directories-"))
// Readable by every user: the access test opens a directory in here as another user.
chmodSync(root, 0o755)
afterAll(() => {
  for (const entry of readdirSync(root)) chmodSync(join(root, entry), 0o755)
  rmSync(root, { recursive: true, force: true })
})
let n = 0
const freshDir = () => join(root, `db-${++n}`)

const enc = new TextEncoder()
const dec = new TextDecoder()
const tp = { topic: "dir-changelog", partition: 0 }

interface Backend {
  readonly name: "level" | "rocksdb"
  readonly engine: string
  readonly make: (directory: string) => Effect.Effect<Store.Shape, Store.StoreError, Scope.Scope>
}
const level: Backend = { name: "level", engine: "LevelDB", make: (directory) => LevelStore.make({ directory }) }
const rocksdb: Backend = { name: "rocksdb", engine: "RocksDB", make: (directory) => RocksDbStore.make({ directory }) }
const backends = [level, rocksdb] as const
const otherOf = (b: Backend): Backend => (b === level ? rocksdb : level)

/** Writes a key with an offset and closes; with `tables`, opens once more so the write-ahead log becomes a table. */
const populate = (b: Backend, directory: string, tables = true) =>
  Effect.gen(function* () {
    yield* Effect.scoped(
      Effect.gen(function* () {
        const st = yield* (yield* b.make(directory)).open({ table: "t", partition: 0 })
        yield* st.write([Store.put(enc.encode("k"), enc.encode("v"))], { offsets: [{ ...tp, offset: 3 }] })
      })
    )
    if (tables) yield* Effect.scoped(b.make(directory))
  })

/** Opens the directory and reads back what `populate` wrote. */
const readBack = (b: Backend, directory: string) =>
  Effect.scoped(
    Effect.gen(function* () {
      const st = yield* (yield* b.make(directory)).open({ table: "t", partition: 0 })
      return {
        value: Option.map(yield* st.get(enc.encode("k")), (v) => dec.decode(v)),
        offset: yield* st.persistedOffset(tp)
      }
    })
  )

/** The failure of opening the directory in this process. */
const refusal = (b: Backend, directory: string) =>
  Effect.flip(Effect.scoped(b.make(directory))).pipe(Effect.map((e) => e.reason))

for (const b of backends) {
  const other = otherOf(b)
  describe(`${b.name} store directories`, () => {
    it.live("a nonexistent or empty directory becomes a new database, and its own database opens again", () =>
      Effect.gen(function* () {
        const missing = freshDir()
        yield* populate(b, missing)
        assert.deepStrictEqual(yield* readBack(b, missing), { value: Option.some("v"), offset: Option.some(3) })
        const empty = freshDir()
        mkdirSync(empty)
        yield* populate(b, empty, false)
        assert.deepStrictEqual(yield* readBack(b, empty), { value: Option.some("v"), offset: Option.some(3) })
      })
    )

    it.live("a directory left by a creation that never finished (a lock file and an info log only) is new", () =>
      Effect.gen(function* () {
        const directory = freshDir()
        mkdirSync(directory)
        writeFileSync(join(directory, "LOCK"), "")
        writeFileSync(join(directory, "LOG"), "")
        yield* populate(b, directory, false)
        assert.deepStrictEqual(yield* readBack(b, directory), { value: Option.some("v"), offset: Option.some(3) })
      })
    )

    for (const tables of [true, false]) {
      it.live(
        `a ${other.engine} database (${tables ? "with table files" : "write-ahead log only"}) is refused in a ` +
          "separate process, with ForeignStoreDirectory naming the path, and nothing in it changes",
        () =>
          Effect.gen(function* () {
            const directory = freshDir()
            yield* populate(other, directory, tables)
            const before = snapshot(directory)
            // In a child: RocksDB used to abort the whole process on a LevelDB directory with table files.
            const printed = yield* openInChild(b.name, directory)
            assert.include(printed, "ForeignStoreDirectory", printed)
            assert.include(printed, directory)
            assert.include(printed, `a ${other.engine} database`)
            assert.deepStrictEqual(snapshot(directory), before)
            const reason = yield* refusal(b, directory)
            assert.strictEqual(reason._tag, "ForeignStoreDirectory")
            assert.deepStrictEqual(snapshot(directory), before)
            // The rightful backend still opens it, data and all.
            assert.deepStrictEqual(yield* readBack(other, directory), {
              value: Option.some("v"),
              offset: Option.some(3)
            })
          }),
        120_000
      )
    }

    it.live("a directory of unrelated files is refused, naming them, and nothing in it changes", () =>
      Effect.gen(function* () {
        const directory = freshDir()
        mkdirSync(join(directory, "photos"), { recursive: true })
        writeFileSync(join(directory, "notes.txt"), "not a database")
        const before = snapshot(directory)
        const reason = yield* refusal(b, directory)
        assert.strictEqual(reason._tag, "ForeignStoreDirectory")
        assert.include(reason.message, directory)
        assert.include(reason.message, "notes.txt")
        assert.include(reason.message, "photos")
        assert.deepStrictEqual(snapshot(directory), before)
      })
    )

    it.live("its own database with an unrelated file beside it is refused, naming the file", () =>
      Effect.gen(function* () {
        const directory = freshDir()
        yield* populate(b, directory)
        writeFileSync(join(directory, "backup.tar"), "tar")
        const before = snapshot(directory)
        const reason = yield* refusal(b, directory)
        assert.strictEqual(reason._tag, "ForeignStoreDirectory")
        assert.include(reason.message, "backup.tar")
        assert.deepStrictEqual(snapshot(directory), before)
      })
    )

    it.live(
      "a directory holding files of both engines is refused",
      () =>
        Effect.gen(function* () {
          // What RocksDB left in a LevelDB directory before it aborted: its IDENTITY and OPTIONS beside LevelDB's tables.
          const directory = freshDir()
          yield* populate(level, directory)
          writeFileSync(join(directory, "IDENTITY"), "3ab4f1c2-0000-4000-8000-000000000000")
          writeFileSync(join(directory, "OPTIONS-000007"), "[Version]\n")
          const before = snapshot(directory)
          // In a child first: RocksDB used to abort on this directory.
          const printed = yield* openInChild(b.name, directory)
          assert.include(printed, "ForeignStoreDirectory", printed)
          assert.include(printed, "both")
          const reason = yield* refusal(b, directory)
          assert.strictEqual(reason._tag, "ForeignStoreDirectory")
          assert.deepStrictEqual(snapshot(directory), before)
        }),
      120_000
    )

    it.live(
      "a directory the process may not write gives StoreAccessDenied naming the path, not StoreLocked",
      () =>
        Effect.gen(function* () {
          const directory = freshDir()
          yield* populate(b, directory)
          chmodSync(directory, 0o555)
          const before = snapshot(directory)
          // Root is never refused by file modes: as root the open runs in a child process under another user id
          // (nobody), which the modes do refuse.
          const asRoot = process.getuid?.() === 0
          const outcome = asRoot
            ? yield* openInChild(b.name, directory, { uid: 65534, gid: 65534 })
            : yield* Effect.map(refusal(b, directory), (reason) => `${reason._tag}: ${reason.message}`)
          chmodSync(directory, 0o755)
          assert.match(outcome, /^StoreAccessDenied: /, outcome)
          assert.include(outcome, directory)
          assert.notInclude(outcome, "StoreLocked")
          assert.deepStrictEqual(snapshot(directory), before)
        }),
      120_000
    )
  })
}
