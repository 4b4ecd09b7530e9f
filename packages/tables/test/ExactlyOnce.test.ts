import { Log, MemoryLog, MemoryStore } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer, Logger, Option, Schema, Scope } from "effect"
import * as Table from "../src/Table.js"
import * as Tables from "../src/Tables.js"
import * as Worker from "../src/Worker.js"
import { countWords, expected, PARTITIONS, produceWords, SOURCE, until } from "./fixtures/words.js"

const CHANGELOG = "eos-counts-changelog"
const counts = Table.make({ name: "counts", key: Schema.String, value: Schema.Int, partitions: PARTITIONS })
const _enc = new TextEncoder()
const dec = new TextDecoder()
const quiet = Logger.layer([])

/** The changelog replayed as a restore would: the last value per key. */
const replayChangelog = Effect.gen(function* () {
  const faults = yield* Log.Faults
  const out = new Map<string, number>()
  for (let partition = 0; partition < PARTITIONS; partition++) {
    for (const r of yield* faults.records({ topic: CHANGELOG, partition })) {
      out.set(JSON.parse(dec.decode(r.key!)) as string, JSON.parse(dec.decode(r.value!)) as number)
    }
  }
  return out
})

const eosTables = Effect.gen(function* () {
  const store = yield* Layer.build(MemoryStore.layer())
  return yield* Tables.make({ app: "eos", settleDelay: 0, processingGuarantee: "exactly_once" }).pipe(
    Effect.provideContext(store)
  )
})

describe("exactly_once", () => {
  it.live("a source record writing two table partitions reaches the changelogs all together or not at all", () =>
    Effect.gen(function* () {
      const log = yield* Log.Log
      const faults = yield* Log.Faults
      yield* log.ensureTopic({ topic: SOURCE, partitions: 1 })
      const tables = yield* eosTables
      const table = yield* tables.register(counts)
      yield* tables.start
      const group = yield* log.groupConsumer({ groupId: "eos", topics: [SOURCE] })
      yield* until(
        "the member holds the source partition",
        Effect.map(group.assignment, (a) => a.length === 1)
      )
      yield* tables.assign({
        active: Array.from({ length: PARTITIONS }, (_, partition) => ({ topic: SOURCE, partition }))
      })
      yield* tables.waitUntilReady([{ topic: SOURCE, partition: 0 }])
      const both = (source: number) =>
        tables.process(
          { topic: SOURCE, partition: 0, offset: source },
          Effect.andThen(table.set("left", source, { partition: 0 }), table.set("right", source, { partition: 1 }))
        )
      // The transaction's commit is refused by the changelog of partition 1's write: neither write is visible.
      yield* both(0)
      yield* faults.failAppends(CHANGELOG, 1)
      const failed = yield* Effect.flip(tables.commit(group, [{ topic: SOURCE, partition: 0, offset: 1 }]))
      assert.strictEqual(failed.reason._tag, "CommitFailed")
      assert.deepStrictEqual(yield* faults.records({ topic: CHANGELOG, partition: 0 }), [])
      assert.deepStrictEqual(yield* faults.records({ topic: CHANGELOG, partition: 1 }), [])
      assert.deepStrictEqual(yield* group.committed([{ topic: SOURCE, partition: 0 }]), [])

      // After the rewind the record is processed again and both writes commit together, with the source offset.
      yield* tables.rewind
      yield* tables.waitUntilReady([{ topic: SOURCE, partition: 0 }])
      assert.isTrue(Option.isNone(yield* table.get("left", { partition: 0 })), "the rewind forgot the aborted write")
      yield* both(0)
      yield* tables.commit(group, [{ topic: SOURCE, partition: 0, offset: 1 }])
      assert.strictEqual((yield* faults.records({ topic: CHANGELOG, partition: 0 })).length, 1)
      assert.strictEqual((yield* faults.records({ topic: CHANGELOG, partition: 1 })).length, 1)
      assert.deepStrictEqual(yield* group.committed([{ topic: SOURCE, partition: 0 }]), [
        { topic: SOURCE, partition: 0, offset: 1 }
      ])
      assert.deepStrictEqual(yield* table.get("right", { partition: 1 }), Option.some(0))
    }).pipe(Effect.scoped, Effect.provide(Layer.merge(MemoryLog.layer(), quiet)))
  )

  it.live("a worker whose transaction is refused rewinds; the counts and the changelog stay exact", () =>
    Effect.gen(function* () {
      const log = yield* Log.Log
      const faults = yield* Log.Faults
      yield* log.ensureTopic({ topic: SOURCE, partitions: PARTITIONS })
      yield* produceWords(log, 0, 2000, 31)
      const count = (tables: Tables.TablesShape, table: Tables.TableHandle<string, number>, options = {}) =>
        Worker.make({ groupId: "eos", commitInterval: 50, standbyReplicas: 0, ...options }, [countWords(table)]).pipe(
          Effect.provideService(Tables.Tables, tables)
        )
      const caughtUp = (worker: Worker.WorkerShape) =>
        Effect.map(worker.metrics, (m) => m.lag.length === PARTITIONS && m.lag.every((l) => l.offset === 0))

      const first = yield* Scope.make()
      const tables = yield* eosTables.pipe(Scope.provide(first))
      const table = yield* tables.register(counts)
      const worker = yield* count(tables, table).pipe(Scope.provide(first))
      yield* until("the worker caught up", caughtUp(worker))
      yield* faults.failAppends(CHANGELOG, 1)
      yield* produceWords(log, 2000, 2000, 31)
      yield* Effect.raceFirst(
        until(
          "the worker rewound and caught up",
          Effect.map(
            worker.metrics,
            (m) => m.rewinds >= 1 && m.lag.length === PARTITIONS && m.lag.every((l) => l.offset === 0)
          )
        ),
        worker.join
      )
      yield* worker.commit
      // Every aborted transaction left nothing behind: the changelog replayed holds the exact counts.
      assert.deepStrictEqual(yield* replayChangelog, expected(4000, 31))
      yield* Scope.close(first, Exit.void)

      // Another worker on a fresh store restores the counts and adds only what is new.
      yield* produceWords(log, 4000, 1000, 31)
      const tables2 = yield* eosTables
      const table2 = yield* tables2.register(counts)
      const worker2 = yield* count(tables2, table2)
      yield* until(
        "the second worker caught up",
        Effect.map(
          worker2.metrics,
          (m) => m.recordsProcessed >= 1000 && m.lag.length === PARTITIONS && m.lag.every((l) => l.offset === 0)
        )
      )
      yield* worker2.commit
      assert.deepStrictEqual(yield* replayChangelog, expected(5000, 31))
      const held = new Map<string, number>()
      for (let p = 0; p < PARTITIONS; p++) for (const [k, v] of yield* table2.entries(p)) held.set(k, v)
      assert.deepStrictEqual(held, expected(5000, 31))
    }).pipe(Effect.scoped, Effect.provide(Layer.merge(MemoryLog.layer(), quiet)))
  )
})
