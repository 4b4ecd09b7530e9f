import { Log, MemoryLog, MemoryStore, Models } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Exit, Fiber, Layer, Logger, Metric, Option, Schema, Scope } from "effect"
import * as Table from "../src/Table.js"
import * as Tables from "../src/Tables.js"
import * as Worker from "../src/Worker.js"
import { countWords, expected, PARTITIONS, produceWords, SOURCE, until } from "./fixtures/words.js"

const counts = Table.make({ name: "counts", key: Schema.String, value: Schema.Int, partitions: PARTITIONS })
const _enc = new TextEncoder()
const _dec = new TextDecoder()

/**
 * A worker counting words into `counts`, with its own table manager on its own memory store (closed with the scope);
 * `tablesOptions` are added to the manager's options.
 */
const countingWorker = (
  options: Partial<Worker.WorkerOptions> = {},
  tablesOptions: Omit<Tables.TablesOptions, "app"> = {}
) =>
  Effect.gen(function* () {
    const store = yield* Layer.build(MemoryStore.layer())
    const tables = yield* Tables.make({ app: "wc", settleDelay: 0, ...tablesOptions }).pipe(
      Effect.provideContext(store)
    )
    const table = yield* tables.register(counts)
    const worker = yield* Worker.make({ groupId: "wc", commitInterval: 100, ...options }, [countWords(table)]).pipe(
      Effect.provideService(Tables.Tables, tables)
    )
    return { tables, table, worker }
  })

/** Every count the table holds, read through the tables (all partitions must be open here). */
const readCounts = (table: Tables.TableHandle<string, number>) =>
  Effect.gen(function* () {
    const out = new Map<string, number>()
    for (let p = 0; p < PARTITIONS; p++) for (const [k, v] of yield* table.entries(p)) out.set(k, v)
    return out
  })

const caughtUp = (worker: Worker.WorkerShape, records: number) =>
  Effect.map(
    worker.metrics,
    (m) => m.recordsProcessed >= records && m.lag.length === PARTITIONS && m.lag.every((l) => l.offset === 0)
  )

const quiet = Logger.layer([])

/** Like `countingWorker`, but every record waits for `gate` before it is counted. */
const gatedWorker = (gate: Deferred.Deferred<void>) =>
  Effect.gen(function* () {
    const store = yield* Layer.build(MemoryStore.layer())
    const tables = yield* Tables.make({ app: "wc", settleDelay: 0 }).pipe(Effect.provideContext(store))
    const table = yield* tables.register(counts)
    const count = countWords(table)
    const gated = Worker.agent({
      name: "gated",
      topics: [SOURCE],
      process: (record: Log.Record) => Effect.andThen(Deferred.await(gate), count.process!(record))
    })
    const worker = yield* Worker.make({ groupId: "wc", commitInterval: 100 }, [gated]).pipe(
      Effect.provideService(Tables.Tables, tables)
    )
    return { tables, table, worker }
  })

/** The lag series in the metric registry in context, by `topic/partition`. */
const lagSeries = Effect.map(Metric.snapshot, (all) => {
  const out = new Map<string, number>()
  for (const m of all) {
    if (m.id !== "strata_worker_lag_records" || m.type !== "Gauge") continue
    out.set(`${m.attributes?.topic}/${m.attributes?.partition}`, Number(m.state.value))
  }
  return out
})

const keysOf = (tps: ReadonlyArray<Models.TopicPartition>) => tps.map((tp) => `${tp.topic}/${tp.partition}`).sort()

/**
 * A worker counts `first` records, the changelog refuses one record, `more` follow: the worker rewinds, catches up,
 * and every count is exact.
 */
const refusedRecordScenario = (options: Partial<Worker.WorkerOptions>, first: number, more: number, seed: number) =>
  Effect.gen(function* () {
    const log = yield* Log.Log
    const faults = yield* Log.Faults
    yield* log.ensureTopic({ topic: SOURCE, partitions: PARTITIONS })
    yield* produceWords(log, 0, first, seed)
    const a = yield* countingWorker(options)
    yield* until("the worker caught up", caughtUp(a.worker, first))
    yield* faults.failAppends("wc-counts-changelog", 1)
    yield* produceWords(log, first, more, seed)
    yield* Effect.raceFirst(
      until(
        "the worker rewound and caught up",
        Effect.map(
          a.worker.metrics,
          (m) => m.rewinds >= 1 && m.lag.length === PARTITIONS && m.lag.every((l) => l.offset === 0)
        )
      ),
      a.worker.join
    )
    yield* a.worker.commit
    assert.deepStrictEqual(yield* readCounts(a.table), expected(first + more, seed))
  }).pipe(Effect.scoped, Effect.provide(Layer.merge(MemoryLog.layer(), quiet)))

describe("Worker", () => {
  it.live("counts every record once, commits, and a restarted worker resumes from its tables", () =>
    Effect.gen(function* () {
      const log = yield* Log.Log
      yield* log.ensureTopic({ topic: SOURCE, partitions: PARTITIONS })
      yield* produceWords(log, 0, 3000, 97)
      const first = yield* Scope.make()
      const a = yield* countingWorker().pipe(Scope.provide(first))
      yield* until("the first worker caught up", caughtUp(a.worker, 3000))
      assert.deepStrictEqual(yield* readCounts(a.table), expected(3000, 97))
      // The group offsets follow the commits.
      yield* until(
        "the offsets are committed",
        Effect.map(a.worker.metrics, (m) => m.commits > 0)
      )
      yield* Scope.close(first, Exit.void)

      // A new worker on a fresh store restores the table from the changelog and counts only the new records.
      yield* produceWords(log, 3000, 1000, 97)
      const b = yield* countingWorker()
      yield* until("the second worker caught up", caughtUp(b.worker, 1000))
      assert.deepStrictEqual(yield* readCounts(b.table), expected(4000, 97))
    }).pipe(Effect.scoped, Effect.provide(Layer.merge(MemoryLog.layer(), quiet)))
  )

  it.live("a refused changelog record fails a commit; the worker rewinds and every count stays exact", () =>
    refusedRecordScenario({ commitInterval: 50 }, 2000, 2000, 31)
  )

  // Small batches and a one-batch buffer per partition: a stopped partition's buffer is full at once.
  it.live("a partition stopped by a refused record never blocks the others' batches; the rewind restarts it", () =>
    refusedRecordScenario({ commitInterval: 300, maxBatchRecords: 5, partitionBuffer: 1 }, 200, 4000, 17)
  )

  it.live("a second member takes half the partitions: revocation commits, and every record counts once", () =>
    Effect.gen(function* () {
      const log = yield* Log.Log
      yield* log.ensureTopic({ topic: SOURCE, partitions: PARTITIONS })
      yield* produceWords(log, 0, 2000, 53)
      const a = yield* countingWorker()
      yield* until("the first worker caught up", caughtUp(a.worker, 2000))
      const b = yield* countingWorker()
      yield* until(
        "the partitions are split",
        Effect.map(
          Effect.all([a.worker.processing, b.worker.processing]),
          ([x, y]) => x.length + y.length === PARTITIONS && x.length > 0 && y.length > 0
        )
      )
      yield* produceWords(log, 2000, 2000, 53)
      const total = expected(4000, 53)
      yield* until(
        "both caught up",
        Effect.map(
          Effect.all([a.worker.metrics, b.worker.metrics]),
          (ms) =>
            ms.reduce((n, m) => n + m.lag.length, 0) === PARTITIONS &&
            ms.every((m) => m.lag.every((l) => l.offset === 0))
        )
      )
      const merged = new Map<string, number>()
      for (const w of [a, b]) {
        for (const tp of yield* w.worker.processing) {
          for (const [k, v] of yield* w.table.entries(tp.partition)) merged.set(k, v)
        }
      }
      assert.deepStrictEqual(merged, total)
    }).pipe(Effect.scoped, Effect.provide(Layer.merge(MemoryLog.layer(), quiet)))
  )

  it.live("two members hold standbys of each other's partitions; the survivor takes over and counts stay exact", () =>
    Effect.gen(function* () {
      const log = yield* Log.Log
      yield* log.ensureTopic({ topic: SOURCE, partitions: PARTITIONS })
      yield* produceWords(log, 0, 2000, 53)
      const first = yield* Scope.make()
      const a = yield* countingWorker({ standbyReplicas: 1 }).pipe(Scope.provide(first))
      yield* until("the first worker caught up", caughtUp(a.worker, 2000))
      const b = yield* countingWorker({ standbyReplicas: 1 })
      const keys = (tps: ReadonlyArray<Models.TopicPartition>) => tps.map(Models.tpKey).sort()
      const layout = Effect.gen(function* () {
        const [pa, pb] = yield* Effect.all([a.worker.processing, b.worker.processing])
        const [ma, mb] = yield* Effect.all([a.worker.metrics, b.worker.metrics])
        return { pa: keys(pa), pb: keys(pb), sa: keys(ma.standbys), sb: keys(mb.standbys) }
      })
      yield* until(
        "each worker holds standbys of exactly the other's partitions",
        Effect.map(
          layout,
          ({ pa, pb, sa, sb }) =>
            pa.length > 0 &&
            pb.length > 0 &&
            pa.length + pb.length === PARTITIONS &&
            sa.join() === pb.join() &&
            sb.join() === pa.join()
        )
      )
      const settled = yield* layout
      assert.deepStrictEqual(
        [...settled.pa, ...settled.pb].sort(),
        keys(Array.from({ length: PARTITIONS }, (_, partition) => ({ topic: SOURCE, partition }))),
        "the partitions are split"
      )
      assert.deepStrictEqual(settled.sa, settled.pb, "a stands by for b's partitions")
      assert.deepStrictEqual(settled.sb, settled.pa, "b stands by for a's partitions")

      // b's standbys tail the changelog a writes while it processes.
      yield* produceWords(log, 2000, 2000, 53)
      const changelog = Array.from({ length: PARTITIONS }, (_, partition) => ({
        topic: "wc-counts-changelog",
        partition
      }))
      yield* until(
        "b's standbys reached the changelog's highwater",
        Effect.gen(function* () {
          const recovery = yield* b.tables.recovery
          if (Option.isNone(recovery)) return false
          const stats = yield* recovery.value.stats
          const highwaters = new Map((yield* log.offsets(changelog)).map((o) => [o.partition, o.highwater]))
          const tailed = stats.partitions.filter((p) => p.standby)
          return (
            tailed.length === settled.pa.length &&
            tailed.every((p) => p.highwater > 0 && p.offset === highwaters.get(p.partition))
          )
        })
      )

      // a leaves: b is promoted on every partition and counts the rest once.
      yield* Scope.close(first, Exit.void)
      yield* produceWords(log, 4000, 1000, 53)
      yield* until(
        "b processes every partition, caught up, with no standbys left",
        Effect.gen(function* () {
          const m = yield* b.worker.metrics
          const processing = yield* b.worker.processing
          return (
            processing.length === PARTITIONS &&
            m.standbys.length === 0 &&
            m.lag.length === PARTITIONS &&
            m.lag.every((l) => l.offset === 0)
          )
        })
      )
      assert.deepStrictEqual(yield* readCounts(b.table), expected(5000, 53))
    }).pipe(Effect.scoped, Effect.provide(Layer.merge(MemoryLog.layer(), quiet)))
  )

  it.live("the lag gauge shows each partition's records behind, 0 once caught up, and only the partitions held", () =>
    Effect.gen(function* () {
      const log = yield* Log.Log
      const sources = Array.from({ length: PARTITIONS }, (_, partition) => ({ topic: SOURCE, partition }))
      yield* log.ensureTopic({ topic: SOURCE, partitions: PARTITIONS })
      yield* produceWords(log, 0, 2000, 97)
      const highwaters = new Map((yield* log.offsets(sources)).map((o) => [`${o.topic}/${o.partition}`, o.highwater]))
      assert.isTrue(
        [...highwaters.values()].every((h) => h > 0),
        "every partition has records"
      )

      // Every partition starts, and no record is processed until the gate opens: each lag is all its records.
      const gate = yield* Deferred.make<void>()
      const first = yield* Scope.make()
      const a = yield* gatedWorker(gate).pipe(Scope.provide(first))
      yield* until(
        "every partition's lag is set",
        Effect.map(lagSeries, (series) => series.size === PARTITIONS)
      )
      assert.deepStrictEqual(yield* lagSeries, highwaters)
      const p0 = yield* Metric.value(Metric.withAttributes(Worker.metrics.lag, { topic: SOURCE, partition: "0" }))
      assert.strictEqual(p0.value, highwaters.get(`${SOURCE}/0`))

      yield* Deferred.succeed(gate, undefined)
      yield* until(
        "every partition's lag is 0",
        Effect.map(lagSeries, (series) => series.size === PARTITIONS && [...series.values()].every((v) => v === 0))
      )
      assert.strictEqual((yield* a.worker.metrics).recordsProcessed, 2000)

      // A second member (its own registry) takes some partitions: the first worker's series are its partitions only.
      const registry: Metric.MetricRegistry = new Map()
      const b = yield* gatedWorker(gate).pipe(Effect.provideService(Metric.MetricRegistry, registry))
      yield* until(
        "the partitions are split and each worker's series are the partitions it holds",
        Effect.gen(function* () {
          const [pa, pb] = yield* Effect.all([a.worker.processing, b.worker.processing])
          const seriesA = yield* lagSeries
          const seriesB = yield* lagSeries.pipe(Effect.provideService(Metric.MetricRegistry, registry))
          return (
            pa.length > 0 &&
            pb.length > 0 &&
            pa.length + pb.length === PARTITIONS &&
            [...seriesA.keys()].sort().join() === keysOf(pa).join() &&
            [...seriesB.keys()].sort().join() === keysOf(pb).join()
          )
        })
      )

      // The stopped worker shows no partition.
      yield* Scope.close(first, Exit.void)
      assert.deepStrictEqual(yield* lagSeries, new Map())
    }).pipe(
      Effect.scoped,
      Effect.provide(Layer.merge(MemoryLog.layer(), quiet)),
      Effect.provideService(Metric.MetricRegistry, new Map())
    )
  )

  it.live("every commit's duration is observed in seconds", () =>
    Effect.gen(function* () {
      const log = yield* Log.Log
      yield* log.ensureTopic({ topic: SOURCE, partitions: PARTITIONS })
      yield* produceWords(log, 0, 500, 13)
      // Each commit waits 100 ms first: observed in seconds that is above 0.05 (a timer may fire a little early), and
      // well below 50 (in milliseconds it would be above).
      const store = yield* Layer.build(MemoryStore.layer())
      const tables = yield* Tables.make({ app: "wc", settleDelay: 0 }).pipe(Effect.provideContext(store))
      const table = yield* tables.register(counts)
      const slow: Tables.TablesShape = {
        ...tables,
        commit: (group, offsets) => Effect.andThen(Effect.sleep("100 millis"), tables.commit(group, offsets))
      }
      const worker = yield* Worker.make({ groupId: "wc", commitInterval: 60_000 }, [countWords(table)]).pipe(
        Effect.provideService(Tables.Tables, slow)
      )
      yield* until("the worker caught up", caughtUp(worker, 500))
      yield* worker.commit
      yield* worker.commit
      const m = yield* worker.metrics
      const histogram = yield* Metric.value(Worker.metrics.commitDuration)
      assert.isAtLeast(m.commits, 2)
      assert.strictEqual(histogram.count, m.commits, "one observation per commit")
      assert.isAtLeast(histogram.min, 0.05)
      assert.isBelow(histogram.max, 50)
    }).pipe(
      Effect.scoped,
      Effect.provide(Layer.merge(MemoryLog.layer(), quiet)),
      Effect.provideService(Metric.MetricRegistry, new Map())
    )
  )

  it.live("standbyReplicas 0 places no standbys", () =>
    Effect.gen(function* () {
      const log = yield* Log.Log
      yield* log.ensureTopic({ topic: SOURCE, partitions: PARTITIONS })
      yield* produceWords(log, 0, 500, 13)
      const a = yield* countingWorker({ standbyReplicas: 0 })
      const b = yield* countingWorker({ standbyReplicas: 0 })
      yield* until(
        "both process and caught up",
        Effect.map(
          Effect.all([a.worker.metrics, b.worker.metrics]),
          (ms) =>
            ms.reduce((n, m) => n + m.lag.length, 0) === PARTITIONS &&
            ms.every((m) => m.lag.length > 0 && m.lag.every((l) => l.offset === 0))
        )
      )
      // Several ticks of the commit timer go by (commits are counted): still no standby anywhere.
      const commitsNow = (yield* b.worker.metrics).commits
      yield* until(
        "a few more commits",
        Effect.map(b.worker.metrics, (m) => m.commits >= commitsNow + 3)
      )
      for (const w of [a, b]) {
        assert.deepStrictEqual((yield* w.worker.metrics).standbys, [])
        const recovery = yield* w.tables.recovery
        if (Option.isSome(recovery)) {
          assert.deepStrictEqual(
            (yield* recovery.value.stats).partitions.filter((p) => p.standby),
            []
          )
        }
      }
    }).pipe(Effect.scoped, Effect.provide(Layer.merge(MemoryLog.layer(), quiet)))
  )

  it.live("closing the worker finishes the records taken and commits them", () =>
    Effect.gen(function* () {
      const log = yield* Log.Log
      yield* log.ensureTopic({ topic: SOURCE, partitions: PARTITIONS })
      yield* produceWords(log, 0, 1000, 11)
      const scope = yield* Scope.make()
      const a = yield* countingWorker({ commitInterval: 60_000 }).pipe(Scope.provide(scope))
      yield* until("the worker caught up", caughtUp(a.worker, 1000))
      yield* Scope.close(scope, Exit.void)
      // Closed: a later commit is refused, not run on a stopped worker.
      assert.strictEqual((yield* Effect.flip(a.worker.commit))._tag, "WorkerClosed")
      const committed = yield* Effect.scoped(
        Effect.flatMap(log.groupConsumer({ groupId: "wc", topics: [SOURCE] }), (m) =>
          m.committed(Array.from({ length: PARTITIONS }, (_, partition) => ({ topic: SOURCE, partition })))
        )
      )
      const highwaters = yield* log.offsets(
        Array.from({ length: PARTITIONS }, (_, partition) => ({ topic: SOURCE, partition }))
      )
      assert.deepStrictEqual(
        committed.map((c) => c.offset),
        highwaters.map((h) => h.highwater)
      )
    }).pipe(Effect.scoped, Effect.provide(Layer.merge(MemoryLog.layer(), quiet)))
  )

  for (const processingGuarantee of ["at_least_once", "exactly_once"] as const) {
    it.live(
      `a worker closed while a commit runs finishes that commit, then commits once more; nothing is lost or counted twice (${processingGuarantee})`,
      () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const sources = Array.from({ length: PARTITIONS }, (_, partition) => ({ topic: SOURCE, partition }))
          yield* log.ensureTopic({ topic: SOURCE, partitions: PARTITIONS })
          yield* produceWords(log, 0, 3000, 41)

          // On the memory log a commit runs through without a pause, so the close could never land inside one: the
          // first worker's log holds the commit it is armed for until `release` (the group's commit, or with
          // exactly_once the transaction's; the group consumer itself stays the log's, which knows its members by it).
          const hold = { armed: false, entered: yield* Deferred.make<void>(), release: yield* Deferred.make<void>() }
          const held = <E>(commit: Effect.Effect<void, E>) =>
            Effect.suspend(() => {
              if (!hold.armed) return commit
              hold.armed = false
              return Deferred.succeed(hold.entered, undefined).pipe(
                Effect.andThen(Deferred.await(hold.release)),
                Effect.andThen(commit)
              )
            })
          const holding: Log.Shape =
            processingGuarantee === "exactly_once"
              ? {
                  ...log,
                  transactionalProducer: (options) =>
                    Effect.map(log.transactionalProducer(options), (p) => ({
                      ...p,
                      commit: (offsets) => held(p.commit(offsets))
                    }))
                }
              : {
                  ...log,
                  groupConsumer: (options) =>
                    Effect.map(log.groupConsumer(options), (g) => ({
                      ...g,
                      commit: (offsets) => held(g.commit(offsets))
                    }))
                }

          const scope = yield* Scope.make()
          // Only explicit commits run (the timer's first tick is a minute away).
          const a = yield* countingWorker({ commitInterval: 60_000 }, { processingGuarantee }).pipe(
            Effect.provideService(Log.Log, holding),
            Scope.provide(scope)
          )
          yield* until("the worker caught up", caughtUp(a.worker, 3000))
          yield* produceWords(log, 3000, 2000, 41)
          yield* until(
            "the worker processed every record",
            Effect.map(a.worker.metrics, (m) => m.recordsProcessed >= 5000)
          )
          const before = yield* a.worker.metrics

          // The commit takes the worker's turn and stops in the log; the close starts meanwhile, its finalizer
          // waiting for the turn. Then the commit goes on, and the finalizer drains and commits once more.
          hold.armed = true
          const committing = yield* Effect.forkChild(a.worker.commit, { startImmediately: true })
          yield* Deferred.await(hold.entered)
          const closing = yield* Effect.forkChild(Scope.close(scope, Exit.void), { startImmediately: true })
          yield* Effect.sleep("20 millis")
          assert.isUndefined(closing.pollUnsafe(), "the close waits for the commit in flight")
          assert.isUndefined(committing.pollUnsafe(), "the commit is still in flight")
          yield* Deferred.succeed(hold.release, undefined)
          const exit = yield* Fiber.await(committing)
          assert.isTrue(Exit.isSuccess(exit), `the commit in flight succeeds: ${String(exit)}`)
          yield* Fiber.join(closing)
          const after = yield* a.worker.metrics
          assert.strictEqual(after.recordsProcessed, 5000, "every record was processed once")
          assert.strictEqual(after.commits, before.commits + 2, "the commit in flight, then the finalizer's")

          // The group holds every source record as committed.
          const committed = yield* Effect.scoped(
            Effect.flatMap(log.groupConsumer({ groupId: "wc", topics: [SOURCE] }), (m) => m.committed(sources))
          )
          const highwaters = yield* log.offsets(sources)
          assert.deepStrictEqual(
            committed.map((c) => c.offset),
            highwaters.map((h) => h.highwater)
          )

          // A new worker on a fresh store restores the counts exactly, processes nothing again, then only new records.
          const second = yield* Scope.make()
          const b = yield* countingWorker({}, { processingGuarantee }).pipe(Scope.provide(second))
          yield* until("the second worker restored every partition", caughtUp(b.worker, 0))
          assert.strictEqual((yield* b.worker.metrics).recordsProcessed, 0, "nothing was processed again")
          assert.deepStrictEqual(yield* readCounts(b.table), expected(5000, 41))
          yield* produceWords(log, 5000, 500, 41)
          yield* until("the second worker caught up", caughtUp(b.worker, 500))
          assert.strictEqual((yield* b.worker.metrics).recordsProcessed, 500)
          assert.deepStrictEqual(yield* readCounts(b.table), expected(5500, 41))
          yield* Scope.close(second, Exit.void)
        }).pipe(Effect.scoped, Effect.provide(Layer.merge(MemoryLog.layer(), quiet)))
    )
  }

  it.effect("invalid options and agents are refused, naming what is wrong", () =>
    Effect.gen(function* () {
      const tables = yield* Tables.make({ app: "wc", settleDelay: 0 })
      const bad = yield* Effect.flip(
        Worker.make({ groupId: "", commitInterval: 0 }, [
          Worker.agent({ name: "a", topics: [SOURCE], process: () => Effect.void })
        ]).pipe(Effect.provideService(Tables.Tables, tables))
      )
      assert.strictEqual(bad._tag, "InvalidWorkerOptions")
      assert.match(bad.message, /groupId/)
      assert.match(bad.message, /commitInterval/)
      const twoWays = yield* Effect.flip(
        Worker.make({ groupId: "g" }, [
          Worker.agent({ name: "both", topics: [SOURCE], process: () => Effect.void, processBatch: () => Effect.void })
        ]).pipe(Effect.provideService(Tables.Tables, tables))
      )
      assert.match(twoWays.message, /agent both needs exactly one of process and processBatch/)
      // An option it does not know (the old name of commitInterval) is refused, not ignored.
      const typo = yield* Effect.flip(
        Worker.make({ groupId: "g", commitIntervalMs: 1000 } as unknown as Worker.WorkerOptions, [
          Worker.agent({ name: "a", topics: [SOURCE], process: () => Effect.void })
        ]).pipe(Effect.provideService(Tables.Tables, tables))
      )
      assert.strictEqual(typo._tag, "InvalidWorkerOptions")
      assert.match(typo.message, /commitIntervalMs = 1000/)
    }).pipe(Effect.scoped, Effect.provide(Layer.mergeAll(MemoryLog.layer(), MemoryStore.layer(), quiet)))
  )

  it.effect(
    "commitInterval takes any Duration.Input (a number is milliseconds); one that is none is refused by name",
    () =>
      Effect.gen(function* () {
        const decode = Schema.decodeUnknownSync(Worker.WorkerOptions)
        assert.strictEqual(
          Duration.toMillis(decode({ groupId: "g", commitInterval: "2 seconds" }).commitInterval),
          2000
        )
        assert.strictEqual(Duration.toMillis(decode({ groupId: "g", commitInterval: 250 }).commitInterval), 250)
        assert.strictEqual(Duration.toMillis(decode({ groupId: "g" }).commitInterval), 1000)
        const tables = yield* Tables.make({ app: "wc", settleDelay: 0 })
        for (const commitInterval of ["soon" as Duration.Input, -1, Number.POSITIVE_INFINITY]) {
          const bad = yield* Effect.flip(
            Worker.make({ groupId: "g", commitInterval }, [
              Worker.agent({ name: "a", topics: [SOURCE], process: () => Effect.void })
            ]).pipe(Effect.provideService(Tables.Tables, tables))
          )
          assert.strictEqual(bad._tag, "InvalidWorkerOptions")
          assert.match(bad.message, /commitInterval/)
        }
      }).pipe(Effect.scoped, Effect.provide(Layer.mergeAll(MemoryLog.layer(), MemoryStore.layer(), quiet)))
  )
})
