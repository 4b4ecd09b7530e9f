/**
 * Recovery through the table manager, on the memory log, each worker with its own memory store: a rebalance in the
 * middle of a restore, standby replicas and their promotion, a worker with no tables.
 */
import { assert, describe, it } from "@effect/vitest"
import { Log, type RecoveryEvent, Store } from "@strata/core"
import { Effect, Fiber, Layer, Logger, Option, Schema, Stream } from "effect"
import * as Table from "../src/Table.js"
import * as Tables from "../src/Tables.js"

const counts = Table.make({ name: "counts", key: Schema.String, value: Schema.Int, partitions: 2 })
const topic = "app-counts-changelog"
const quiet = Logger.layer([])

/** A worker: a table manager on its own memory store (optionally slow to write) and the shared log. */
const worker = (options: { readonly slowWritesMs?: number; readonly recoveryBufferSize?: number } = {}) =>
  Effect.gen(function* () {
    const store = yield* Store
    const slow = options.slowWritesMs
    const tables = yield* Tables.make({
      app: "app",
      settleDelay: 0,
      recovery: { recoveryBufferSize: options.recoveryBufferSize ?? 1000 }
    }).pipe(
      Effect.provideService(
        Store,
        slow === undefined
          ? store
          : Store.of({
              ...store,
              open: (id) =>
                Effect.map(store.open(id), (s) => ({
                  ...s,
                  write: (ops, o) => Effect.andThen(Effect.sleep(`${slow} millis`), s.write(ops, o))
                }))
            })
      )
    )
    const table = yield* tables.register(counts)
    yield* tables.start
    const w: Worker = { tables, table }
    return w
  }).pipe(Effect.provide(Store.layerMemory()))

interface Worker {
  readonly tables: Tables.TablesShape
  readonly table: Tables.TableHandle<string, number>
}

/** Writes `n` records to source partition `partition` through a worker (committing them). */
const writeThrough = (w: Worker, partition: number, from: number, n: number) =>
  Effect.gen(function* () {
    for (let i = from; i < from + n; i++) {
      yield* w.tables.process({ topic: "words", partition, offset: i }, w.table.set(`k${i % 40}`, i))
    }
    yield* w.tables.manager.onCommit([{ topic: "words", partition, offset: from + n }])
  })

const recoveryOf = (w: Worker) => Effect.map(w.tables.recovery, (r) => Option.getOrThrow(r))

describe("recovery through the tables", () => {
  it.live("a rebalance in the middle of a restore: finished work is not redone, the rest continues", () =>
    Effect.gen(function* () {
      const a = yield* worker()
      yield* a.tables.assign({ active: [0, 1].map((partition) => ({ topic: "words", partition })) })
      yield* a.tables.manager.waitUntilRecoveryCompleted
      yield* writeThrough(a, 0, 0, 2000)
      yield* writeThrough(a, 1, 0, 300)

      const b = yield* worker({ slowWritesMs: 5, recoveryBufferSize: 100 })
      const recovery = yield* recoveryOf(b)
      const applied = new Map<number, number>()
      const starts: Array<number> = []
      const watcher = yield* Effect.forkChild(
        recovery.events.pipe(
          Stream.runForEach((e: RecoveryEvent) =>
            Effect.gen(function* () {
              if (e._tag === "BatchApplied") {
                applied.set(e.partition, (applied.get(e.partition) ?? 0) + e.records)
                // The first batch of partition 0 is in: partition 1 arrives, a rebalance mid-restore.
                if (e.partition === 0 && starts.length === 1) {
                  yield* b.tables.assign({ active: [{ topic: "words", partition: 1 }] })
                }
              }
              if (e._tag === "Started") starts.push(e.active.length)
            })
          )
        )
      )
      yield* Effect.yieldNow
      yield* b.tables.assign({ active: [{ topic: "words", partition: 0 }] })
      yield* Effect.sleep("50 millis")
      yield* b.tables.manager.waitUntilRecoveryCompleted
      yield* Fiber.interrupt(watcher)
      assert.deepStrictEqual(starts, [1, 2], "the second assignment restarted recovery with both partitions")
      // Every changelog record was applied exactly once across both runs.
      assert.strictEqual(applied.get(0), 2000)
      assert.strictEqual(applied.get(1), 300)
      assert.deepStrictEqual(yield* b.table.entries(0), yield* a.table.entries(0))
      assert.deepStrictEqual(yield* b.table.entries(1), yield* a.table.entries(1))
    }).pipe(Effect.scoped, Effect.provide(Layer.merge(Log.layerMemory(), quiet)))
  )

  it.live("a standby tails the changelog, is not writable, and on promotion replays only its lag", () =>
    Effect.gen(function* () {
      const a = yield* worker()
      yield* a.tables.assign({ active: [{ topic: "words", partition: 0 }] })
      yield* a.tables.manager.waitUntilRecoveryCompleted
      yield* writeThrough(a, 0, 0, 500)

      const b = yield* worker({ recoveryBufferSize: 100 })
      const recovery = yield* recoveryOf(b)
      yield* b.tables.assign({ active: [], standby: [{ topic: "words", partition: 0 }] })
      yield* b.tables.manager.waitUntilRecoveryCompleted
      // The standby keeps tailing: more writes on the active worker reach it.
      yield* writeThrough(a, 0, 500, 100)
      const log = yield* Log
      const [hw] = yield* log.offsets([{ topic, partition: 0 }])
      while (true) {
        const stats = yield* recovery.stats
        const standby = stats.partitions.find((p) => p.partition === 0 && p.standby)
        if (standby !== undefined && standby.offset >= (hw?.highwater ?? 0)) break
        yield* Effect.sleep("10 millis")
      }
      const refused = yield* Effect.flip(b.table.set("x", 1, { partition: 0 }))
      assert.strictEqual(refused.reason._tag, "PartitionNotAvailable")
      assert.match(refused.message, /standby/)

      // A final burst the standby may not have seen yet, then A goes away and B is promoted.
      yield* writeThrough(a, 0, 600, 7)
      let replayed = 0
      const watcher = yield* Effect.forkChild(
        recovery.events.pipe(
          Stream.runForEach((e: RecoveryEvent) =>
            Effect.sync(() => {
              if (e._tag === "BatchApplied" && !e.standby) replayed += e.records
            })
          )
        )
      )
      yield* Effect.yieldNow
      yield* b.tables.assign({ active: [{ topic: "words", partition: 0 }] })
      yield* b.tables.manager.waitUntilRecoveryCompleted
      yield* Fiber.interrupt(watcher)
      assert.isAtMost(replayed, 7, "promotion replays only what the standby had not applied")
      assert.deepStrictEqual(yield* b.table.entries(0), yield* a.table.entries(0))
      yield* b.table.set("x", 1, { partition: 0 })
    }).pipe(Effect.scoped, Effect.provide(Layer.merge(Log.layerMemory(), quiet)))
  )

  it.live("a worker without tables is ready at once", () =>
    Effect.gen(function* () {
      const tables = yield* Tables.make({ app: "app", settleDelay: 0 }).pipe(Effect.provide(Store.layerMemory()))
      yield* tables.start
      yield* tables.assign({ active: [{ topic: "words", partition: 0 }] })
      yield* tables.manager.waitUntilRecoveryCompleted
      yield* tables.waitUntilReady([{ topic: "words", partition: 0 }])
    }).pipe(Effect.scoped, Effect.provide(Layer.merge(Log.layerMemory(), quiet)))
  )
})
