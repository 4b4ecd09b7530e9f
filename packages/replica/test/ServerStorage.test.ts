/**
 * A tablet server's storage: its logs on segment files in a data directory (and on a store), its registration
 * counter, a deleted log's directory, bad options.
 */
import { MemoryStore } from "@strata/core"
import { spawnSync } from "node:child_process"
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer, Scope } from "effect"
import { afterAll } from "vitest"
import * as ServerStorage from "../src/server/ServerStorage.js"

const root = mkdtempSync(join(tmpdir(), "strata-server-storage-"))
afterAll(() => rmSync(root, { recursive: true, force: true }))
let fresh = 0
const directoryFor = () => join(root, `server-${++fresh}`)
const record = (text: string) => ({
  key: new TextEncoder().encode(text),
  value: new TextEncoder().encode(text),
  headers: [],
  timestamp: 1_700_000_000_000
})
const orders = { table: "orders", bucket: 2 }

/** Appends `text` to the tablet's log and closes it; the log end after. */
const write = (storage: ServerStorage.ServerStorageShape, tablet: typeof orders, text: string) =>
  Effect.scoped(
    Effect.gen(function* () {
      const log = yield* storage.open(tablet)
      yield* log.append(0, [record(text)])
      return yield* log.logEndOffset
    })
  )

describe("ServerStorage on segment files", () => {
  it.effect("each tablet's log in its own directory, kept across opens of the storage", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      const storage = yield* ServerStorage.makeSegments({ directory, segmentBytes: 1024 })
      assert.strictEqual(yield* write(storage, orders, "a"), 1)
      assert.strictEqual(yield* write(storage, { table: "orders", bucket: 3 }, "b"), 1)
      assert.deepStrictEqual(readdirSync(join(directory, "tablets")).sort(), ["orders-2", "orders-3"])
      const again = yield* ServerStorage.makeSegments({ directory })
      assert.strictEqual(yield* write(again, orders, "c"), 2)
    })
  )

  it.effect("a table name is kept to file name characters; a long one is cut and hashed, two stay apart", () =>
    Effect.sync(() => {
      assert.strictEqual(ServerStorage.directoryNameOf({ table: "a/../b c", bucket: 0 }), "a%2F%2E%2E%2Fb%20c-0")
      assert.strictEqual(ServerStorage.directoryNameOf({ table: "é", bucket: 1 }), "%C3%A9-1")
      const long = (end: string) => ServerStorage.directoryNameOf({ table: `${"t".repeat(300)}${end}`, bucket: 7 })
      assert.isAtMost(long("x").length, 200)
      assert.notStrictEqual(long("x"), long("y"))
    })
  )

  it.effect("a log open is not opened twice nor deleted; a closed one is deleted, and opens again empty", () =>
    Effect.gen(function* () {
      const storage = yield* ServerStorage.makeSegments({ directory: directoryFor() })
      assert.strictEqual(yield* write(storage, orders, "a"), 1)
      const scope = yield* Scope.make()
      yield* Scope.provide(storage.open(orders), scope)
      const twice = yield* Effect.flip(Effect.scoped(storage.open(orders)))
      assert.include(twice.message, "locked")
      const dropped = yield* Effect.flip(storage.drop(orders))
      assert.include(dropped.message, "locked")
      yield* Scope.close(scope, Exit.void)
      yield* storage.drop(orders)
      yield* storage.drop(orders)
      assert.strictEqual(yield* write(storage, orders, "b"), 1)
    })
  )

  it.effect("a deletion a crash left half-way is finished when the storage next opens", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      const aside = join(directory, "tablets", "orders-9.deleted")
      mkdirSync(aside, { recursive: true })
      writeFileSync(join(aside, "00000000000000000000.log"), "torn")
      yield* ServerStorage.makeSegments({ directory })
      assert.isFalse(existsSync(aside))
    })
  )

  it.effect("the registration counter goes up by one each start, from 0, on either backend", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      const first = yield* ServerStorage.makeSegments({ directory })
      assert.strictEqual(yield* first.nextRegistrationEpoch, 0)
      assert.strictEqual(yield* first.nextRegistrationEpoch, 1)
      assert.strictEqual(yield* (yield* ServerStorage.makeSegments({ directory })).nextRegistrationEpoch, 2)
      writeFileSync(join(directory, "server.state"), "garbage")
      const bad = yield* Effect.flip((yield* ServerStorage.makeSegments({ directory })).nextRegistrationEpoch)
      assert.include(bad.message, "server.state")

      const store = yield* Effect.scoped(
        Effect.gen(function* () {
          const context = yield* Layer.build(MemoryStore.layer())
          const storage = yield* ServerStorage.makeStore.pipe(Effect.provide(context))
          return [
            yield* storage.nextRegistrationEpoch,
            yield* storage.nextRegistrationEpoch,
            yield* write(storage, orders, "a")
          ]
        })
      )
      assert.deepStrictEqual(store, [0, 1, 1])
    })
  )

  it.effect(
    "the directory is held: a live process's lock refuses it, naming the process; a dead one's is taken over",
    () =>
      Effect.gen(function* () {
        const directory = directoryFor()
        mkdirSync(directory, { recursive: true })
        // Process 1 (init) is alive: another server holds the directory.
        writeFileSync(join(directory, "server.lock"), "1\n")
        const held = yield* Effect.flip(ServerStorage.makeSegments({ directory }))
        assert.strictEqual(held.reason._tag, "StoreLocked")
        assert.include(held.message, "server.lock names process 1, which runs")
        // A process that has exited left it behind.
        const gone = spawnSync(process.execPath, ["-e", "0"]).pid
        writeFileSync(join(directory, "server.lock"), `${gone}\n`)
        yield* Effect.scoped(
          Effect.gen(function* () {
            yield* ServerStorage.makeSegments({ directory })
            assert.strictEqual(readFileSync(join(directory, "server.lock"), "utf8").trim(), String(process.pid))
          })
        )
        // Released with the scope.
        assert.isFalse(existsSync(join(directory, "server.lock")))
      })
  )

  it.effect("a directory a store's database is in is refused, nothing written to it", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      mkdirSync(directory, { recursive: true })
      for (const name of ["CURRENT", "MANIFEST-000005", "000007.sst"]) writeFileSync(join(directory, name), "")
      const refused = yield* Effect.flip(ServerStorage.makeSegments({ directory }))
      assert.strictEqual(refused.reason._tag, "ForeignStoreDirectory")
      assert.include(refused.message, "a LevelDB or RocksDB database (000007.sst, CURRENT, MANIFEST-000005)")
      assert.deepStrictEqual(readdirSync(directory).sort(), ["000007.sst", "CURRENT", "MANIFEST-000005"])
    })
  )

  it.effect("bad options are a typed error naming the option", () =>
    Effect.gen(function* () {
      const bad = yield* Effect.flip(ServerStorage.makeSegments({ directory: directoryFor(), segmentBytes: -1 }))
      assert.strictEqual(bad._tag, "StoreError")
      assert.include(bad.message, "segmentBytes")
    })
  )
})
