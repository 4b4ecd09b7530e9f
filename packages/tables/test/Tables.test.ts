import { Log, MemoryLog, MemoryStore, type Models, Store, type TableManager } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import {
  ConfigProvider,
  Deferred,
  Duration,
  Effect,
  Exit,
  Fiber,
  Layer,
  Logger,
  Option,
  Schema,
  Scope,
  Stream
} from "effect"
import { TestClock } from "effect/testing"
import * as LevelStore from "@strata/store-adapters/level"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Table from "../src/Table.js"
import * as Tables from "../src/Tables.js"

const counts = Table.make({ name: "counts", key: Schema.String, value: Schema.Int, partitions: 4 })
const topic = "app-counts-changelog"

/** Memory store and log, logs kept off the output. */
const env = <A, E>(effect: Effect.Effect<A, E, Store.Store | Log.Log | Log.Faults | Scope.Scope>) =>
  effect.pipe(Effect.scoped, Effect.provide(Layer.mergeAll(MemoryStore.layer(), MemoryLog.layer(), Logger.layer([]))))

/** A LevelDB store in a fresh directory (removed afterwards) and the memory log, logs kept off the output. */
const onLevelDb = <A, E>(effect: Effect.Effect<A, E, Store.Store | Log.Log | Log.Faults | Scope.Scope>) =>
  Effect.acquireUseRelease(
    Effect.sync(() => mkdtempSync(join(tmpdir(), "strata-tables-level-"))),
    (directory) =>
      effect.pipe(
        Effect.scoped,
        Effect.provide(Layer.mergeAll(LevelStore.layer({ directory }), MemoryLog.layer(), Logger.layer([])))
      ),
    (directory) => Effect.sync(() => rmSync(directory, { recursive: true, force: true }))
  )

const manager = (options: Partial<Tables.TablesOptions> = {}) => Tables.make({ app: "app", settleDelay: 0, ...options })

/** A started manager with the counts table registered and source partition `partition` assigned. */
const countsOn = (partition: number) =>
  Effect.gen(function* () {
    const tables = yield* manager()
    const table = yield* tables.register(counts)
    yield* tables.start
    yield* tables.manager.onPartitionsAssigned([{ topic: "words", partition }])
    return { tables, table }
  })

/** The Store in context, keeping each partition store it opens so a test can read what was persisted. */
const spiedStore = Effect.gen(function* () {
  const store = yield* Store.Store
  const opened = new Map<string, Store.PartitionStore>()
  const spy = Store.Store.of({
    ...store,
    open: (id) => Effect.tap(store.open(id), (s) => Effect.sync(() => opened.set(`${id.table}|${id.partition}`, s)))
  })
  const persisted = (table: string, partition: number, tp: Models.TopicPartition) =>
    Effect.suspend(() => opened.get(`${table}|${partition}`)!.persistedOffset(tp))
  return { spy, persisted }
})

/** Every record of a changelog partition. */
const changelog = (partition: number) =>
  Effect.gen(function* () {
    const log = yield* Log.Log
    const [offsets] = yield* log.offsets([{ topic, partition }])
    if (offsets === undefined || offsets.highwater === 0) return [] as Array<Log.Record>
    const consumer = yield* log.consumer()
    yield* consumer.assign([{ topic, partition }])
    yield* consumer.seek({ topic, partition }, 0)
    const records: Array<Log.Record> = []
    let seen = 0
    yield* consumer.batches.pipe(
      Stream.takeUntil((b) => {
        seen += b.records.length
        return seen >= offsets.highwater
      }),
      Stream.runForEach((b) => Effect.sync(() => records.push(...b.records)))
    )
    return records
  }).pipe(Effect.scoped)

const decodeKey = (b: Uint8Array | null) => (b === null ? null : JSON.parse(new TextDecoder().decode(b)))

describe("Tables: registration", () => {
  it.effect("a duplicate name is refused with TableAlreadyExists", () =>
    env(
      Effect.gen(function* () {
        const tables = yield* manager()
        yield* tables.register(counts)
        const error = yield* Effect.flip(tables.register(counts))
        assert.strictEqual(error.reason._tag, "TableAlreadyExists")
        assert.match(error.message, /counts is already registered/)
      })
    )
  )

  it.effect("no table can be added once the manager started: TablesFinalized, too late", () =>
    env(
      Effect.gen(function* () {
        const tables = yield* manager()
        yield* tables.register(counts)
        yield* tables.start
        const error = yield* Effect.flip(
          tables.register(Table.make({ name: "late", key: Schema.String, value: Schema.Int, partitions: 1 }))
        )
        assert.strictEqual(error.reason._tag, "TablesFinalized")
        assert.match(error.message, /too late to add table late/)
        const viaProtocol = yield* Effect.flip(
          tables.manager.add({ name: "late2", kind: "table", partitions: 1, changelogTopic: "late2-changelog" })
        )
        assert.strictEqual(viaProtocol.reason._tag, "TablesFinalized")
      })
    )
  )

  it.effect("keeps changelog topic → table and lists tables in registration order", () =>
    env(
      Effect.gen(function* () {
        const tables = yield* manager()
        yield* tables.register(counts)
        yield* tables.register(
          Table.global({
            name: "config",
            key: Schema.String,
            value: Schema.String,
            partitions: 1,
            changelogTopic: "cfg"
          })
        )
        const info = yield* tables.manager.tableOfChangelog("cfg")
        assert.deepStrictEqual(info, { name: "config", kind: "global", partitions: 1, changelogTopic: "cfg" })
        assert.deepStrictEqual(
          (yield* tables.manager.tables).map((t) => [t.name, t.changelogTopic]),
          [
            ["counts", topic],
            ["config", "cfg"]
          ]
        )
        assert.deepStrictEqual([...(yield* tables.changelogTopics)].sort(), [topic, "cfg"].sort())
        const unknown = yield* Effect.flip(tables.manager.tableOfChangelog("nope"))
        assert.strictEqual(unknown.reason._tag, "UnknownTable")
      })
    )
  )

  it.effect("invalid definitions and options are refused with errors naming what is wrong", () =>
    env(
      Effect.gen(function* () {
        const tables = yield* manager()
        const bad = yield* Effect.flip(
          tables.register(Table.make({ name: "has space", key: Schema.String, value: Schema.Int, partitions: 1 }))
        )
        assert.strictEqual(bad.reason._tag, "InvalidTable")
        assert.match(bad.message, /has space/)
        const zero = yield* Effect.flip(
          tables.register(Table.make({ name: "z", key: Schema.String, value: Schema.Int, partitions: 0 }))
        )
        assert.match(zero.message, /partitions must be a positive integer, got 0/)
        const options: TableManager.TableManagerError = yield* Effect.flip(manager({ streamBufferMaxsize: 0 }))
        assert.strictEqual(options.reason._tag, "InvalidTableManagerOptions")
        assert.match(options.message, /streamBufferMaxsize/)
        // Every option goes through the one schema: a mode, a duration, a policy, a nested option, a typo.
        const refused = (bad: Record<string, unknown>) =>
          Effect.map(Effect.flip(manager(bad as Partial<Tables.TablesOptions>)), (e) => e.message)
        assert.match(yield* refused({ mode: "bogus" }), /mode/)
        assert.match(yield* refused({ settleDelay: "soon" }), /settleDelay/)
        assert.match(yield* refused({ badRecords: "ignore" }), /badRecords/)
        assert.match(yield* refused({ cacheEntries: -1 }), /cacheEntries/)
        assert.match(yield* refused({ recovery: { recoveryBufferSize: 0.5 } }), /recoveryBufferSize/)
        assert.match(yield* refused({ acks: 2 }), /acks/)
        assert.match(yield* refused({ setleDelay: 0 }), /setleDelay/)
      })
    )
  )
})

describe("Tables: start and stop", () => {
  it.effect("the changelog queue all tables share has the configured size", () =>
    env(
      Effect.gen(function* () {
        const tables = yield* manager({ streamBufferMaxsize: 123 })
        assert.deepStrictEqual(yield* tables.changelogQueue, { capacity: 123, size: 0 })
        const defaults = yield* manager()
        assert.strictEqual((yield* defaults.changelogQueue).capacity, 4096)
      })
    )
  )

  it.effect("start waits the settle delay, then builds the channel, pauses the changelogs and starts recovery", () =>
    env(
      Effect.gen(function* () {
        const tables = yield* manager({ settleDelay: "1 second" })
        yield* tables.register(counts)
        const starting = yield* Effect.forkChild(tables.start)
        yield* TestClock.adjust("999 millis")
        assert.isTrue(Option.isNone(yield* tables.recovery), "nothing built before the settle delay")
        yield* TestClock.adjust("1 millis")
        yield* Fiber.join(starting)
        assert.isTrue(Option.isSome(yield* tables.recovery))
        yield* tables.manager.waitUntilTablesRegistered
        // The changelog topic exists with the table's partitions.
        const log = yield* Log.Log
        const offsets = yield* log.offsets([0, 1, 2, 3].map((partition) => ({ topic, partition })))
        assert.strictEqual(offsets.length, 4)
      })
    )
  )

  it.effect("once stopping, start builds no channel and starts no recovery", () =>
    env(
      Effect.gen(function* () {
        const tables = yield* manager()
        yield* tables.register(counts)
        yield* tables.stop
        yield* tables.start
        assert.isTrue(Option.isNone(yield* tables.recovery))
        const log = yield* Log.Log
        const missing = yield* Effect.flip(log.offsets([{ topic, partition: 0 }]))
        assert.strictEqual(missing._tag, "LogError", "no changelog topic was created")
      })
    )
  )

  it.effect("stop runs in order: changelog fetcher, recovery, then the tables' stores", () =>
    Effect.gen(function* () {
      const events: Array<string> = []
      const store = yield* Store.Store
      const log = yield* Log.Log
      const recordingStore = Store.Store.of({
        ...store,
        open: (id) =>
          Effect.tap(store.open(id), () =>
            Effect.addFinalizer(() => Effect.sync(() => events.push(`store ${id.table}/${id.partition} closed`)))
          )
      })
      const recordingLog = Log.Log.of({
        ...log,
        consumer: (options) =>
          Effect.map(log.consumer(options), (c) => ({
            ...c,
            batches: c.batches.pipe(Stream.ensuring(Effect.sync(() => events.push("fetcher stopped"))))
          })).pipe(Effect.tap(() => Effect.addFinalizer(() => Effect.sync(() => events.push("channel closed")))))
      })
      const tables = yield* manager().pipe(
        Effect.provideService(Store.Store, recordingStore),
        Effect.provideService(Log.Log, recordingLog)
      )
      yield* tables.register(counts)
      yield* tables.start
      yield* tables.manager.onPartitionsAssigned([{ topic: "words", partition: 1 }])
      yield* tables.manager.waitUntilRecoveryCompleted
      yield* tables.stop
      assert.deepStrictEqual(events, ["fetcher stopped", "channel closed", "store counts/1 closed"])
      yield* tables.stop
      assert.strictEqual(events.length, 3, "stop is idempotent")
    }).pipe(env)
  )

  it.effect("producer-only and client-only modes wait for nothing", () =>
    env(
      Effect.gen(function* () {
        for (const mode of ["producer-only", "client-only"] as const) {
          const tables = yield* manager({ mode })
          yield* tables.register(counts)
          yield* tables.manager.waitUntilTablesRegistered
          yield* tables.manager.waitUntilRecoveryCompleted
        }
      })
    )
  )
})

describe("Tables: writes and persist-offset-on-commit", () => {
  it.live("set writes the changelog (key = table key, partition = source partition) and reads see it at once", () =>
    env(
      Effect.gen(function* () {
        const { tables, table } = yield* countsOn(2)
        yield* tables.process(
          { topic: "words", partition: 2, offset: 7 },
          Effect.gen(function* () {
            yield* table.update("hello", (n) => Option.getOrElse(n, () => 0) + 1)
            // Read-your-writes inside the same source record.
            yield* table.update("hello", (n) => Option.getOrElse(n, () => 0) + 1)
          })
        )
        assert.deepStrictEqual(yield* table.get("hello", { partition: 2 }), Option.some(2))
        const records = yield* changelog(2)
        assert.deepStrictEqual(
          records.map((r) => [decodeKey(r.key), decodeKey(r.value)]),
          [
            ["hello", 1],
            ["hello", 2]
          ]
        )
        // Both records of the source record carry it.
        assert.deepStrictEqual(
          records.map((r) => new TextDecoder().decode(r.headers.find((h) => h.key === "strata-source")?.value)),
          ['["words",2,7]', '["words",2,7]']
        )
      })
    )
  )

  it.live("a partition active here is not demoted by a later standby assignment of it", () =>
    env(
      Effect.gen(function* () {
        const { tables, table } = yield* countsOn(2)
        yield* tables.waitUntilReady([{ topic: "words", partition: 2 }])
        yield* tables.assign({ active: [], standby: [{ topic: "words", partition: 2 }] })
        // Still writable: a standby would refuse the write with PartitionNotAvailable.
        yield* tables.process({ topic: "words", partition: 2, offset: 0 }, table.set("kept", 1))
        assert.deepStrictEqual(yield* table.get("kept", { partition: 2 }), Option.some(1))
      })
    )
  )

  it.live("with a cache smaller than the keys (LevelDB), reads of evicted keys go to the store and stay right", () =>
    onLevelDb(
      Effect.gen(function* () {
        const tables = yield* manager({ cacheEntries: 4 })
        const table = yield* tables.register(counts)
        yield* tables.start
        yield* tables.manager.onPartitionsAssigned([{ topic: "words", partition: 1 }])
        yield* tables.waitUntilReady([{ topic: "words", partition: 1 }])
        const expected = new Map<string, number>()
        let offset = 0
        // 7 keys through a cache of 4, a commit every 3 records: reads miss the cache and meet the store, and hit
        // entries the commits updated.
        for (let round = 0; round < 20; round++) {
          for (let i = 0; i < 3; i++) {
            const key = `k${(offset * 3) % 7}`
            expected.set(key, (expected.get(key) ?? 0) + 1)
            yield* tables.process(
              { topic: "words", partition: 1, offset },
              table.update(key, (n) => Option.getOrElse(n, () => 0) + 1)
            )
            offset++
          }
          yield* tables.manager.onCommit([{ topic: "words", partition: 1, offset }])
        }
        for (const [key, n] of expected) assert.deepStrictEqual(yield* table.get(key, { partition: 1 }), Option.some(n))
        assert.deepStrictEqual(new Map(yield* table.entries(1)), expected, "a scan agrees with the reads")
      })
    )
  )

  it.effect("nothing reaches the store before the commit; the commit writes data and offsets in one batch", () =>
    env(
      Effect.gen(function* () {
        const store = yield* Store.Store
        const { tables, table } = yield* countsOn(0)
        for (let i = 0; i < 3; i++) {
          yield* tables.process({ topic: "words", partition: 0, offset: i }, table.set(`k${i}`, i))
        }
        const raw = yield* store.open({ table: "counts", partition: 0 }).pipe(
          Effect.flatMap((s) => Effect.all([Stream.runCollect(s.scan()), s.persistedOffsets])),
          Effect.scoped,
          Effect.flip,
          Effect.map((e) => e.reason._tag)
        )
        // The manager holds the partition store open: a second opener is refused (one opener at a time).
        assert.strictEqual(raw, "StoreLocked")
        assert.deepStrictEqual(yield* table.get("k2", { partition: 0 }), Option.some(2))
        yield* tables.manager.onCommit([{ topic: "words", partition: 0, offset: 3 }])
        yield* tables.stop
        const after = yield* store.open({ table: "counts", partition: 0 }).pipe(
          Effect.flatMap((s) => Effect.all([Stream.runCollect(s.scan()), s.persistedOffsets])),
          Effect.scoped
        )
        assert.strictEqual(after[0].length, 3)
        assert.deepStrictEqual(
          [...after[1]].sort((a, b) => a.topic.localeCompare(b.topic)),
          [
            { topic, partition: 0, offset: 2 },
            { topic: "words", partition: 0, offset: 3 }
          ]
        )
      })
    )
  )

  it.effect("committing a source partition flushes the changelog partitions it wrote to, even other ones", () =>
    env(
      Effect.gen(function* () {
        const store = yield* Store.Store
        const tables = yield* manager()
        const table = yield* tables.register(counts)
        yield* tables.start
        yield* tables.manager.onPartitionsAssigned([0, 1, 2, 3].map((partition) => ({ topic: "words", partition })))
        // Source partition 0 writes to changelog partition 3 (Faust would never persist this offset).
        yield* tables.process({ topic: "words", partition: 0, offset: 41 }, table.set("x", 1, { partition: 3 }))
        yield* tables.manager.onCommit([{ topic: "words", partition: 0, offset: 42 }])
        yield* tables.stop
        const persisted = yield* store.open({ table: "counts", partition: 3 }).pipe(
          Effect.flatMap((s) => s.persistedOffset({ topic, partition: 3 })),
          Effect.scoped
        )
        assert.deepStrictEqual(persisted, Option.some(0))
      })
    )
  )

  it.effect("writes are visible at once and never wait for their ack; the commit waits for every ack", () =>
    Effect.gen(function* () {
      const log = yield* Log.Log
      const { spy, persisted } = yield* spiedStore
      // Acks are held back until the test lets them go.
      const release = yield* Deferred.make<void>()
      const heldAcks = Log.Log.of({
        ...log,
        producer: (options) =>
          Effect.map(log.producer(options), (p) => ({
            ...p,
            send: (records) => Effect.map(p.send(records), (ack) => Effect.andThen(Deferred.await(release), ack))
          }))
      })
      const tables = yield* manager().pipe(
        Effect.provideService(Log.Log, heldAcks),
        Effect.provideService(Store.Store, spy)
      )
      const table = yield* tables.register(counts)
      yield* tables.start
      yield* tables.manager.onPartitionsAssigned([{ topic: "words", partition: 0 }])
      yield* tables.manager.waitUntilRecoveryCompleted
      for (let offset = 0; offset < 100; offset++) {
        yield* tables.process(
          { topic: "words", partition: 0, offset },
          table.update("k", (n) => Option.getOrElse(n, () => 0) + 1)
        )
      }
      // Every record read the one before it, with no ack in.
      assert.deepStrictEqual(yield* table.get("k", { partition: 0 }), Option.some(100))
      const commit = yield* Effect.forkChild(tables.manager.onCommit([{ topic: "words", partition: 0, offset: 100 }]))
      yield* Effect.yieldNow
      assert.isUndefined(commit.pollUnsafe(), "the commit waits for the acks")
      yield* Deferred.succeed(release, undefined)
      yield* Fiber.join(commit)
      assert.deepStrictEqual(yield* persisted("counts", 0, { topic, partition: 0 }), Option.some(99))
    }).pipe(env)
  )

  it.effect(
    "64 records of one key in flight at once: every increment counts (records of a partition run in order)",
    () =>
      env(
        Effect.gen(function* () {
          const { tables, table } = yield* countsOn(0)
          yield* tables.manager.waitUntilRecoveryCompleted
          const order: Array<number> = []
          yield* Effect.forEach(
            Array.from({ length: 640 }, (_, offset) => offset),
            (offset) =>
              tables.process(
                { topic: "words", partition: 0, offset },
                Effect.gen(function* () {
                  const n = yield* table.get("k")
                  // A store read that yields, as a durable store's does: a racing record would read the same value.
                  yield* Effect.yieldNow
                  yield* table.set("k", Option.getOrElse(n, () => 0) + 1)
                  order.push(offset)
                })
              ),
            { concurrency: 64, discard: true }
          )
          assert.deepStrictEqual(yield* table.get("k", { partition: 0 }), Option.some(640))
          assert.deepStrictEqual(
            order,
            Array.from({ length: 640 }, (_, i) => i),
            "in the order process was called"
          )
          const replay = (yield* changelog(0)).map((r) => Number(new TextDecoder().decode(r.value!)))
          assert.deepStrictEqual(
            replay,
            Array.from({ length: 640 }, (_, i) => i + 1)
          )
        })
      )
  )

  it.effect(
    "a refused changelog record fails the commit, persists nothing of it; rewind restores and the counts stay exact",
    () =>
      Effect.gen(function* () {
        const faults = yield* Log.Faults
        const { spy, persisted: persistedOf } = yield* spiedStore
        const tables = yield* manager().pipe(Effect.provideService(Store.Store, spy))
        const table = yield* tables.register(counts)
        yield* tables.start
        const source = { topic: "words", partition: 0 }
        yield* tables.manager.onPartitionsAssigned([source])
        yield* tables.manager.waitUntilRecoveryCompleted
        const words = Array.from({ length: 30 }, (_, i) => `w${i % 7}`)
        const count = (offset: number) =>
          tables.process(
            { ...source, offset },
            table.update(words[offset]!, (n) => Option.getOrElse(n, () => 0) + 1)
          )
        for (let offset = 0; offset < 10; offset++) yield* count(offset)
        yield* tables.manager.onCommit([{ ...source, offset: 10 }])
        for (let offset = 10; offset < 15; offset++) yield* count(offset)
        yield* faults.failAppends(topic, 1)
        // The send is queued; its ack fails. Later writes fail at once; the commit fails naming the partition.
        yield* count(15)
        const later = yield* Effect.flip(count(16))
        assert.strictEqual(later.reason._tag, "ChangelogFailed")
        const failed = yield* Effect.flip(tables.manager.onCommit([{ ...source, offset: 16 }]))
        assert.strictEqual(failed.reason._tag, "CommitFailed")
        assert.match(failed.message, /counts partition 0/)
        const persisted = () => persistedOf("counts", 0, source)
        assert.deepStrictEqual(yield* persisted(), Option.some(10), "nothing of the failed commit was persisted")
        // Rewind: restore from store + changelog, resume where the tables say, process the rest, commit.
        yield* tables.rewind
        yield* tables.waitUntilReady([source])
        const resume = Option.getOrThrow(yield* tables.resumeOffset(source))
        assert.strictEqual(resume, 15, "the records acknowledged before the refused one are kept")
        for (let offset = resume; offset < words.length; offset++) yield* count(offset)
        yield* tables.manager.onCommit([{ ...source, offset: words.length }])
        for (let w = 0; w < 7; w++) {
          const expected = words.filter((x) => x === `w${w}`).length
          assert.deepStrictEqual(yield* table.get(`w${w}`, { partition: 0 }), Option.some(expected), `w${w}`)
        }
        assert.deepStrictEqual(yield* persisted(), Option.some(words.length))
      }).pipe(env)
  )

  it.effect("a write finishing while a commit writes the store is kept, and committed next time", () =>
    Effect.gen(function* () {
      const store = yield* Store.Store
      // Every store batch takes a second: the commit below is still writing when the next record is processed.
      const slowStore = Store.Store.of({
        ...store,
        open: (id) =>
          Effect.map(store.open(id), (s) => ({
            ...s,
            write: (ops, options) => Effect.andThen(Effect.sleep("1 second"), s.write(ops, options))
          }))
      })
      const tables = yield* manager().pipe(Effect.provideService(Store.Store, slowStore))
      const table = yield* tables.register(counts)
      yield* tables.start
      yield* tables.manager.onPartitionsAssigned([{ topic: "words", partition: 0 }])
      yield* tables.manager.waitUntilRecoveryCompleted
      yield* tables.process({ topic: "words", partition: 0, offset: 0 }, table.set("a", 1))
      const commit = yield* Effect.forkChild(tables.manager.onCommit([{ topic: "words", partition: 0, offset: 1 }]))
      yield* Effect.yieldNow
      const write = yield* Effect.forkChild(
        tables.process({ topic: "words", partition: 0, offset: 1 }, table.set("b", 2))
      )
      yield* TestClock.adjust("1 second")
      yield* Fiber.join(commit)
      yield* Fiber.join(write)
      assert.deepStrictEqual(yield* table.get("b", { partition: 0 }), Option.some(2))
      const second = yield* Effect.forkChild(tables.manager.onCommit([{ topic: "words", partition: 0, offset: 2 }]))
      yield* TestClock.adjust("1 second")
      yield* Fiber.join(second)
      yield* tables.stop
      const stored = yield* store.open({ table: "counts", partition: 0 }).pipe(
        Effect.flatMap((s) => Effect.all([Stream.runCollect(s.scan()), s.persistedOffset({ topic, partition: 0 })])),
        Effect.scoped
      )
      assert.strictEqual(stored[0].length, 2, "both writes reached the store")
      assert.deepStrictEqual(stored[1], Option.some(1))
    }).pipe(env)
  )

  for (const read of ["entries", "scan"] as const) {
    it.effect(`${read} sees every value when a commit moves the buffer into the store during its store scan`, () =>
      Effect.gen(function* () {
        const store = yield* Store.Store
        const scanned = yield* Deferred.make<void>()
        const gate = yield* Deferred.make<void>()
        let holdScans = false
        // A store whose scans, once `holdScans` is on, take their snapshot, say so, then wait for the gate.
        const heldScans = Store.Store.of({
          ...store,
          open: (id) =>
            Effect.map(store.open(id), (s) => ({
              ...s,
              scan: (range) =>
                Stream.unwrap(
                  Effect.gen(function* () {
                    if (!holdScans) return s.scan(range)
                    const snapshot = yield* Stream.runCollect(s.scan(range))
                    yield* Deferred.succeed(scanned, undefined)
                    yield* Deferred.await(gate)
                    return Stream.fromIterable(snapshot)
                  })
                )
            }))
        })
        const tables = yield* manager().pipe(Effect.provideService(Store.Store, heldScans))
        const table = yield* tables.register(counts)
        yield* tables.start
        const source = { topic: "words", partition: 0 }
        yield* tables.manager.onPartitionsAssigned([source])
        yield* tables.manager.waitUntilRecoveryCompleted
        // "a" is in the store, "b" and "c" only in the write buffer.
        yield* tables.process({ ...source, offset: 0 }, table.set("a", 1))
        yield* tables.manager.onCommit([{ ...source, offset: 1 }])
        yield* tables.process({ ...source, offset: 1 }, table.set("b", 2))
        yield* tables.process({ ...source, offset: 2 }, table.set("c", 3))
        holdScans = true
        const reading = yield* Effect.forkChild(
          read === "entries" ? table.entries(0) : Stream.runCollect(table.scan(0))
        )
        // The read's store snapshot holds "a" only.
        yield* Deferred.await(scanned)
        holdScans = false
        // A commit while the read is between its store scan and its buffer read: it runs as far as it can.
        const commit = yield* Effect.forkChild(tables.manager.onCommit([{ ...source, offset: 3 }]))
        for (let i = 0; i < 100 && commit.pollUnsafe() === undefined; i++) yield* Effect.yieldNow
        yield* Deferred.succeed(gate, undefined)
        assert.deepStrictEqual(
          [...(yield* Fiber.join(reading))],
          [
            ["a", 1],
            ["b", 2],
            ["c", 3]
          ]
        )
        yield* Fiber.join(commit)
        assert.deepStrictEqual(
          yield* table.entries(0),
          [
            ["a", 1],
            ["b", 2],
            ["c", 3]
          ],
          "the commit moved the buffer into the store"
        )
      }).pipe(env)
    )
  }

  it.effect("writes made outside any source record are persisted by the next commit", () =>
    env(
      Effect.gen(function* () {
        const store = yield* Store.Store
        const { tables, table } = yield* countsOn(1)
        yield* table.set("loose", 7, { partition: 1 })
        yield* tables.manager.onCommit([])
        yield* tables.stop
        const stored = yield* store.open({ table: "counts", partition: 1 }).pipe(
          Effect.flatMap((s) => Effect.all([Stream.runCollect(s.scan()), s.persistedOffset({ topic, partition: 1 })])),
          Effect.scoped
        )
        assert.strictEqual(stored[0].length, 1)
        assert.deepStrictEqual(stored[1], Option.some(0))
      })
    )
  )

  it.effect("a value that does not fit its schema is refused naming the table; nothing is produced", () =>
    env(
      Effect.gen(function* () {
        const { table } = yield* countsOn(0)
        const error = yield* Effect.flip(table.set("k", 1.5, { partition: 0 }))
        assert.strictEqual(error.reason._tag, "CodecFailed")
        assert.match(error.message, /table counts: cannot encode the value/)
        assert.deepStrictEqual(yield* changelog(0), [])
        const missing = yield* Effect.flip(table.set("k", 1, { partition: 1 }))
        assert.strictEqual(missing.reason._tag, "PartitionNotAvailable")
        const outside = yield* Effect.flip(table.get("k", { partition: 9 }))
        assert.strictEqual(outside.reason._tag, "InvalidPartition")
      })
    )
  )
})

describe("Tables: rebalance and recovery", () => {
  it.effect("an assigned partition is restored from its changelog; resumeOffset is past the last source record", () =>
    env(
      Effect.gen(function* () {
        // A first worker writes and commits only part of its work, then goes away.
        const first = yield* Scope.make()
        const a = yield* manager().pipe(Scope.provide(first))
        const ta = yield* a.register(counts)
        yield* a.start
        yield* a.manager.onPartitionsAssigned([{ topic: "words", partition: 1 }])
        for (let i = 0; i < 5; i++) {
          yield* a.process({ topic: "words", partition: 1, offset: i }, ta.set(`w${i % 2}`, i))
        }
        yield* a.manager.onCommit([{ topic: "words", partition: 1, offset: 2 }])
        yield* Scope.close(first, Exit.void)

        // The next worker restores the partition: the table equals the changelog, not just the committed part.
        const b = yield* manager()
        const tb = yield* b.register(counts)
        yield* b.start
        yield* b.manager.onPartitionsAssigned([{ topic: "words", partition: 1 }])
        yield* b.manager.waitUntilRecoveryCompleted
        assert.deepStrictEqual(yield* tb.entries(1), [
          ["w0", 4],
          ["w1", 3]
        ])
        assert.deepStrictEqual(yield* Stream.runCollect(tb.scan(1)), [
          ["w0", 4],
          ["w1", 3]
        ])
        // Source records 0..4 are all in the table: resume at 5, not at the committed 2.
        assert.deepStrictEqual(yield* b.resumeOffset({ topic: "words", partition: 1 }), Option.some(5))
      })
    )
  )

  it.effect("resumeOffset is read from every source header shape a changelog may carry", () =>
    env(
      Effect.gen(function* () {
        // The changelog of partition 1 written directly: source topics with digits, dots and dashes, long offsets,
        // offsets out of order, and headers naming no valid source (ignored, not a reason to fail the restore).
        const log = yield* Log.Log
        const tables = yield* manager()
        const table = yield* tables.register(counts)
        yield* tables.start
        const enc = new TextEncoder()
        const sources: ReadonlyArray<string> = [
          '["words",1,7]',
          '["words",1,12]',
          '["orders.v2-3",3,9]',
          '["a,b",3,9]',
          '["words",1,3]',
          '["words",2,123456789012]',
          '["orders.v2-3",3,8]',
          "not json",
          '["words",1,x]',
          '["words",1,99999999999999999]'
        ]
        yield* log.produceBatch(
          sources.map((source, i) => ({
            topic,
            partition: 1,
            key: enc.encode(JSON.stringify(`k${i}`)),
            value: enc.encode(String(i)),
            headers: [{ key: "strata-source", value: enc.encode(source) }]
          }))
        )
        yield* tables.manager.onPartitionsAssigned([{ topic: "words", partition: 1 }])
        yield* tables.manager.waitUntilRecoveryCompleted
        assert.deepStrictEqual(yield* tables.resumeOffset({ topic: "words", partition: 1 }), Option.some(13))
        assert.deepStrictEqual(yield* tables.resumeOffset({ topic: "words", partition: 2 }), Option.some(123456789013))
        assert.deepStrictEqual(yield* tables.resumeOffset({ topic: "orders.v2-3", partition: 3 }), Option.some(10))
        // No topic has that name: asking for it is refused, the header was ignored.
        const invalid = yield* Effect.flip(tables.resumeOffset({ topic: "a,b", partition: 3 }))
        assert.include(invalid.message, "a,b/3: invalid topic name")
        assert.strictEqual((yield* Stream.runCollect(table.scan(1))).length, sources.length)
      })
    )
  )

  /**
   * Registers `counts`, writes `records` changelog records to each of `partitions` partitions, restores them all and
   * returns the store batches recovery wrote ("partition:records") and the entries each partition then holds.
   */
  const restoreBatches = (options: Partial<Tables.TablesOptions>, partitions: number, records: number) =>
    Effect.gen(function* () {
      const tables = yield* manager(options)
      const table = yield* tables.register(counts)
      yield* tables.start
      const log = yield* Log.Log
      const enc = new TextEncoder()
      const all = Array.from({ length: partitions }, (_, partition) => partition)
      for (const partition of all) {
        yield* log.produceBatch(
          Array.from({ length: records }, (_, i) => ({
            topic,
            partition,
            key: enc.encode(JSON.stringify(`k${i}`)),
            value: enc.encode(String(i))
          }))
        )
      }
      const recovery = Option.getOrThrow(yield* tables.recovery)
      const writes: Array<string> = []
      yield* Effect.forkChild(
        recovery.events.pipe(
          Stream.runForEach((e) =>
            Effect.sync(() => {
              if (e._tag === "BatchApplied") writes.push(`${e.partition}:${e.records}`)
            })
          )
        )
      )
      yield* Effect.yieldNow
      yield* tables.manager.onPartitionsAssigned(all.map((partition) => ({ topic: "words", partition })))
      yield* tables.manager.waitUntilRecoveryCompleted
      const entries = yield* Effect.forEach(all, (partition) => Effect.map(table.entries(partition), (e) => e.length))
      return { writes: [...writes].sort(), entries }
    })

  it.effect("a restore writes each fetched chunk whole: no chunk is split into a large and a small store batch", () =>
    env(
      Effect.gen(function* () {
        // 700 records in each of the 4 changelog partitions: each comes as one chunk, and two never fit one
        // recoveryBufferSize (1000) together. Splitting the second one to fill the buffer made writes of 700, 300,
        // 400, 600, ...; whole chunks make four writes of 700.
        const { writes, entries } = yield* restoreBatches({ recovery: { recoveryBufferSize: 1000 } }, 4, 700)
        assert.deepStrictEqual(writes, ["0:700", "1:700", "2:700", "3:700"])
        assert.deepStrictEqual(entries, [700, 700, 700, 700])
      })
    )
  )

  it.effect("recoveryBufferSize sets the store batch size beyond the consumer's default chunk of 1000 records", () =>
    env(
      Effect.gen(function* () {
        const { writes, entries } = yield* restoreBatches({ recovery: { recoveryBufferSize: 2500 } }, 2, 2500)
        // One write per partition (the consumer's chunks of 1000 made writes of 1000, 1000 and 500).
        assert.deepStrictEqual(writes, ["0:2500", "1:2500"])
        assert.deepStrictEqual(entries, [2500, 2500])
        const bad: TableManager.TableManagerError = yield* Effect.flip(manager({ recovery: { standbyBufferSize: 0 } }))
        assert.match(bad.message, /recovery\.standbyBufferSize\b.*greater than 0/)
      })
    )
  )

  it.effect("the read cache never keeps a value a store write overtook", () =>
    Effect.gen(function* () {
      const store = yield* Store.Store
      const gate = yield* Deferred.make<void>()
      let holdReads = false
      // A store that is not the memory store (so the tables cache its values) whose reads can be held after they
      // read: the value returned is the one from before the hold.
      const slowReads = Store.Store.of({
        ...store,
        backend: "held-reads",
        open: (id) =>
          Effect.map(store.open(id), (s) => ({
            ...s,
            get: (key) => Effect.tap(s.get(key), () => (holdReads ? Deferred.await(gate) : Effect.void))
          }))
      })
      const tables = yield* manager().pipe(Effect.provideService(Store.Store, slowReads))
      const table = yield* tables.register(counts)
      yield* tables.start
      const source = { topic: "words", partition: 0 }
      yield* tables.manager.onPartitionsAssigned([source])
      yield* tables.manager.waitUntilRecoveryCompleted
      holdReads = true
      // This read saw "no value" in the store and is held.
      const early = yield* Effect.forkChild(table.get("k", { partition: 0 }))
      yield* Effect.yieldNow
      holdReads = false
      yield* tables.process({ ...source, offset: 0 }, table.set("k", 5))
      yield* tables.manager.onCommit([{ ...source, offset: 1 }])
      yield* Deferred.succeed(gate, undefined)
      assert.deepStrictEqual(yield* Fiber.join(early), Option.none())
      assert.deepStrictEqual(yield* table.get("k", { partition: 0 }), Option.some(5))
    }).pipe(env)
  )

  it.effect("a revocation waits for the record in flight, then persists it and closes the partition", () =>
    Effect.gen(function* () {
      const tables = yield* manager()
      const table = yield* tables.register(counts)
      yield* tables.start
      const source = { topic: "words", partition: 2 }
      yield* tables.manager.onPartitionsAssigned([source])
      yield* tables.manager.waitUntilRecoveryCompleted
      const inside = yield* Deferred.make<void>()
      const proceed = yield* Deferred.make<void>()
      const record = yield* Effect.forkChild(
        tables.process(
          { ...source, offset: 0 },
          Effect.gen(function* () {
            yield* table.set("a", 1)
            yield* Deferred.succeed(inside, undefined)
            yield* Deferred.await(proceed)
            yield* table.set("b", 2)
          })
        )
      )
      yield* Deferred.await(inside)
      const revoke = yield* Effect.forkChild(tables.manager.onPartitionsRevoked([source]))
      yield* Effect.yieldNow
      assert.isUndefined(revoke.pollUnsafe(), "the revocation waits for the record")
      yield* Deferred.succeed(proceed, undefined)
      yield* Fiber.join(record)
      yield* Fiber.join(revoke)
      const error = yield* Effect.flip(table.get("a", { partition: 2 }))
      assert.strictEqual(error.reason._tag, "PartitionNotAvailable")
      // Both writes of the record were persisted with the changelog offset they reach (the store is closed: reopen).
      const store = yield* Store.Store
      const stored = yield* store.open({ table: "counts", partition: 2 }).pipe(
        Effect.flatMap((s) => Effect.all([Stream.runCollect(s.scan()), s.persistedOffset({ topic, partition: 2 })])),
        Effect.scoped
      )
      assert.strictEqual(stored[0].length, 2)
      assert.deepStrictEqual(stored[1], Option.some(1))
    }).pipe(env)
  )

  it.effect("a revoked partition is flushed and closed; reads of it are refused", () =>
    env(
      Effect.gen(function* () {
        const { tables, table } = yield* countsOn(2)
        yield* tables.process({ topic: "words", partition: 2, offset: 0 }, table.set("a", 1))
        yield* tables.manager.onPartitionsRevoked([{ topic: "words", partition: 2 }])
        const error = yield* Effect.flip(table.get("a", { partition: 2 }))
        assert.strictEqual(error.reason._tag, "PartitionNotAvailable")
        // Assigned again: the flushed store already holds the write, nothing to replay.
        yield* tables.manager.onPartitionsAssigned([{ topic: "words", partition: 2 }])
        yield* tables.manager.waitUntilRecoveryCompleted
        assert.deepStrictEqual(yield* table.get("a", { partition: 2 }), Option.some(1))
      })
    )
  )

  it.effect("a global table is held in full and restored at start", () =>
    env(
      Effect.gen(function* () {
        const settings = Table.global({ name: "settings", key: Schema.String, value: Schema.String, partitions: 2 })
        const first = yield* Scope.make()
        const a = yield* manager().pipe(Scope.provide(first))
        const ta = yield* a.register(settings)
        yield* a.start
        yield* ta.set("colour", "blue")
        yield* ta.set("size", "L")
        yield* Scope.close(first, Exit.void)

        const b = yield* manager()
        const tb = yield* b.register(settings)
        yield* b.start
        yield* b.manager.waitUntilRecoveryCompleted
        assert.deepStrictEqual(yield* tb.get("colour"), Option.some("blue"))
        assert.deepStrictEqual(yield* tb.get("size"), Option.some("L"))
      })
    )
  )

  // On the real clock: a store ahead of the highwater is judged only after re-reading it for a second.
  it.live(
    "a store ahead of its changelog fails with ConsistencyError naming both offsets, or is wiped and restored",
    () =>
      env(
        Effect.gen(function* () {
          const first = yield* Scope.make()
          const a = yield* manager().pipe(Scope.provide(first))
          const ta = yield* a.register(counts)
          yield* a.start
          yield* a.manager.onPartitionsAssigned([{ topic: "words", partition: 0 }])
          for (let i = 0; i < 3; i++) yield* a.process({ topic: "words", partition: 0, offset: i }, ta.set(`k${i}`, i))
          yield* a.manager.onCommit([{ topic: "words", partition: 0, offset: 3 }])
          yield* Scope.close(first, Exit.void)

          // The changelog topic was lost (a new, empty log), the store kept its data: persisted 2 > highwater 0.
          const restart = (onInconsistency: "fail" | "wipe") =>
            Effect.gen(function* () {
              const b = yield* manager({ recovery: { onInconsistency } })
              const tb = yield* b.register(counts)
              yield* b.start
              yield* b.manager.onPartitionsAssigned([{ topic: "words", partition: 0 }])
              const exit = yield* Effect.exit(b.manager.waitUntilRecoveryCompleted)
              return { exit, entries: yield* Effect.exit(tb.entries(0)) }
            }).pipe(Effect.scoped, Effect.provide(MemoryLog.layer()))

          const failed = yield* restart("fail")
          assert.isTrue(Exit.isFailure(failed.exit))
          if (Exit.isFailure(failed.exit)) {
            const message = String(failed.exit.cause)
            assert.match(message, /app-counts-changelog\/0: persisted offset 2 is beyond the changelog highwater 0/)
          }
          const wiped = yield* restart("wipe")
          assert.isTrue(Exit.isSuccess(wiped.exit))
          assert.deepStrictEqual(wiped.entries, Exit.succeed([]))
        })
      )
  )
})

describe("Tables: configuration", () => {
  const fromEnv = (env: Record<string, string>) => ConfigProvider.layer(ConfigProvider.fromEnv({ env }))

  it.effect("layerConfig reads the options; queue size and mode come through", () =>
    Effect.gen(function* () {
      const tables = yield* Tables.Tables
      assert.deepStrictEqual(yield* tables.changelogQueue, { capacity: 64, size: 0 })
      yield* tables.manager.waitUntilRecoveryCompleted
    }).pipe(
      Effect.provide(
        Tables.layerConfig().pipe(
          Layer.provide(fromEnv({ tables_app: "cfg", tables_streamBufferMaxsize: "64", tables_mode: "client-only" }))
        )
      ),
      env
    )
  )

  it.effect("a bad value fails with a ConfigError naming its key", () =>
    Effect.gen(function* () {
      const bad = (env: Record<string, string>) =>
        Layer.build(Tables.layerConfig().pipe(Layer.provide(fromEnv(env)))).pipe(Effect.scoped, Effect.flip)
      const size = yield* bad({ tables_app: "cfg", tables_streamBufferMaxsize: "lots" })
      assert.match(String(size), /streamBufferMaxsize/)
      const mode = yield* bad({ tables_app: "cfg", tables_mode: "sometimes" })
      assert.match(String(mode), /mode/)
      const missing = yield* bad({ tables_mode: "worker" })
      assert.match(String(missing), /\["tables"\]\["app"\]/)
      const nothing = yield* bad({})
      assert.match(String(nothing), /\["tables"\]/)
    }).pipe(env)
  )

  it.effect("a duration is read as milliseconds or as a duration; the settle delay read takes effect", () =>
    Effect.gen(function* () {
      const read = (env: Record<string, string>) =>
        Effect.gen(function* () {
          return yield* Tables.config()
        }).pipe(Effect.provide(fromEnv(env)))
      const o = yield* read({ tables_app: "cfg", tables_settleDelay: "2 seconds", tables_recoveryDelay: "250" })
      assert.strictEqual(Duration.toMillis(Duration.fromInputUnsafe(o.settleDelay ?? 0)), 2000)
      assert.strictEqual(Duration.toMillis(Duration.fromInputUnsafe(o.recovery?.recoveryDelay ?? 0)), 250)
      const tables = yield* Tables.make(o)
      yield* tables.register(counts)
      const starting = yield* Effect.forkChild(tables.start)
      yield* TestClock.adjust("1999 millis")
      assert.isTrue(Option.isNone(yield* tables.recovery), "nothing built before the settle delay")
      yield* TestClock.adjust("1 millis")
      yield* Fiber.join(starting)
      assert.isTrue(Option.isSome(yield* tables.recovery))
      // A duration that is none, or negative, fails with a ConfigError naming its key.
      const soon = yield* Effect.flip(read({ tables_app: "cfg", tables_settleDelay: "soon" }))
      assert.match(String(soon), /settleDelay/)
      const negative = yield* Effect.flip(read({ tables_app: "cfg", tables_recoveryDelay: "-5" }))
      assert.match(String(negative), /recoveryDelay/)
    }).pipe(env)
  )
})
