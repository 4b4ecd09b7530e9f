/**
 * Recovery through the table manager — the fixture cases — run on the memory log (`Recovery.test.ts`) and on
 * Kafka (`Recovery.int.test.ts`): an empty partition, a log start above 0, a store that persisted everything, a store
 * ahead of its changelog (failing, or wiped and restored), a rebalance in the middle of a restore, standby replicas
 * and their promotion, a worker with no tables. Each worker has its own memory store unless a case restarts one on
 * the same store.
 */
import { assert, describe, it } from "@effect/vitest"
import { Log, type RecoveryEvent, Store } from "@strata/core"
import { Effect, Exit, Fiber, Layer, Logger, Option, Schema, Scope, Stream } from "effect"
import * as Table from "../src/Table.js"
import * as Tables from "../src/Tables.js"

const counts = Table.make({ name: "counts", key: Schema.String, value: Schema.Int, partitions: 2 })
const quiet = Logger.layer([])

/** A fresh app id per case, so every case has its own changelog topic (on a real broker too). */
const freshApp = () => `rec-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`

/** A worker: a table manager on its own memory store (optionally slow to write) and the shared log. */
const worker = (
  app: string,
  options: {
    readonly slowWritesMs?: number
    readonly recoveryBufferSize?: number
    readonly onInconsistency?: "fail" | "wipe"
  } = {}
) =>
  Effect.gen(function* () {
    const store = yield* Store
    const slow = options.slowWritesMs
    const tables = yield* Tables.make({
      app,
      settleDelay: 0,
      recovery: {
        recoveryBufferSize: options.recoveryBufferSize ?? 1000,
        ...(options.onInconsistency === undefined ? {} : { onInconsistency: options.onInconsistency })
      }
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
  })

/** A worker on its own, fresh memory store. */
const isolated = (app: string, options?: Parameters<typeof worker>[1]) =>
  worker(app, options).pipe(Effect.provide(Store.layerMemory()))

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

/** Runs the recovery fixture cases on the log `logLayer` builds. */
export const recoverySuite = (name: string, logLayer: () => Layer.Layer<Log, unknown>) =>
  describe(`recovery through the tables (${name})`, () => {
    const run = <A, E>(body: (app: string) => Effect.Effect<A, E, Log | Scope.Scope>) =>
      Effect.suspend(() => body(freshApp())).pipe(Effect.scoped, Effect.provide(Layer.merge(logLayer(), quiet)))

    it.live("an empty partition is ready at once, nothing applied", () =>
      run((app) =>
        Effect.gen(function* () {
          const b = yield* isolated(app)
          const recovery = yield* recoveryOf(b)
          yield* b.tables.assign({ active: [{ topic: "words", partition: 0 }] })
          yield* b.tables.manager.waitUntilRecoveryCompleted
          yield* b.tables.waitUntilReady([{ topic: "words", partition: 0 }])
          assert.strictEqual((yield* recovery.stats).remaining, 0)
          assert.deepStrictEqual(yield* b.table.entries(0), [])
        })
      )
    )

    it.live("a partition that caught up is ready while another still restores", () =>
      run((app) =>
        Effect.gen(function* () {
          const a = yield* isolated(app)
          yield* a.tables.assign({ active: [0, 1].map((partition) => ({ topic: "words", partition })) })
          yield* writeThrough(a, 0, 0, 3)
          yield* writeThrough(a, 1, 0, 2000)
          const b = yield* isolated(app, { slowWritesMs: 20, recoveryBufferSize: 50 })
          const recovery = yield* recoveryOf(b)
          yield* b.tables.assign({ active: [0, 1].map((partition) => ({ topic: "words", partition })) })
          yield* b.tables.waitUntilReady([{ topic: "words", partition: 0 }])
          const stats = yield* recovery.stats
          const p1 = stats.partitions.find((p) => p.partition === 1 && !p.standby)
          assert.isAbove(p1?.remaining ?? 0, 0, "partition 1 is still restoring")
          assert.deepStrictEqual(yield* b.table.entries(0), yield* a.table.entries(0))
          yield* b.tables.manager.waitUntilRecoveryCompleted
          assert.deepStrictEqual(yield* b.table.entries(1), yield* a.table.entries(1))
        })
      )
    )

    it.live("a log start above 0: restored from the log start, keys below it gone", () =>
      run((app) =>
        Effect.gen(function* () {
          const a = yield* isolated(app)
          yield* a.tables.assign({ active: [{ topic: "words", partition: 0 }] })
          for (let i = 0; i < 10; i++) {
            yield* a.tables.process({ topic: "words", partition: 0, offset: i }, a.table.set(`u${i}`, i))
          }
          // The commit waits for the changelog acks: all 10 records are in the log before its start moves.
          yield* a.tables.manager.onCommit([{ topic: "words", partition: 0, offset: 10 }])
          const log = yield* Log
          yield* log.deleteRecords({ topic: `${app}-counts-changelog`, partition: 0 }, 6)
          const b = yield* isolated(app)
          yield* b.tables.assign({ active: [{ topic: "words", partition: 0 }] })
          yield* b.tables.manager.waitUntilRecoveryCompleted
          assert.deepStrictEqual(yield* b.table.entries(0), [
            ["u6", 6],
            ["u7", 7],
            ["u8", 8],
            ["u9", 9]
          ])
        })
      )
    )

    it.live("a store that persisted its whole changelog replays nothing; one ahead of it fails or is wiped", () =>
      run((app) =>
        Effect.gen(function* () {
          const tp = { topic: `${app}-counts-changelog`, partition: 0 }
          const restart = (options?: Parameters<typeof worker>[1]) =>
            Effect.gen(function* () {
              const scope = yield* Scope.make()
              const w = yield* worker(app, options).pipe(Scope.provide(scope))
              let applied = 0
              const recovery = yield* recoveryOf(w)
              const watcher = yield* Effect.forkChild(
                recovery.events.pipe(
                  Stream.runForEach((e: RecoveryEvent) =>
                    Effect.sync(() => {
                      if (e._tag === "BatchApplied") applied += e.records
                    })
                  )
                )
              )
              yield* Effect.yieldNow
              yield* w.tables.assign({ active: [{ topic: "words", partition: 0 }] })
              const exit = yield* Effect.exit(w.tables.manager.waitUntilRecoveryCompleted)
              const entries = yield* Effect.exit(w.table.entries(0))
              yield* Fiber.interrupt(watcher)
              yield* Scope.close(scope, Exit.void)
              return { exit, entries, applied }
            })
          const store = yield* Store
          // A worker writes and commits everything, then stops; the next one on the same store replays nothing.
          const first = yield* Scope.make()
          const a = yield* worker(app).pipe(Scope.provide(first))
          yield* a.tables.assign({ active: [{ topic: "words", partition: 0 }] })
          yield* writeThrough(a, 0, 0, 30)
          const expected = yield* a.table.entries(0)
          yield* Scope.close(first, Exit.void)
          const again = yield* restart()
          assert.isTrue(Exit.isSuccess(again.exit))
          assert.strictEqual(again.applied, 0)
          assert.deepStrictEqual(again.entries, Exit.succeed(expected))

          // The store claims offset 100 of a changelog whose highwater is 30.
          yield* store.open({ table: "counts", partition: 0 }).pipe(
            Effect.flatMap((s) => s.setPersistedOffset(tp, 100)),
            Effect.scoped
          )
          const failed = yield* restart()
          assert.isTrue(Exit.isFailure(failed.exit))
          if (Exit.isFailure(failed.exit)) {
            assert.include(
              String(failed.exit.cause),
              `${tp.topic}/0: persisted offset 100 is beyond the changelog highwater 30`
            )
          }
          const wiped = yield* restart({ onInconsistency: "wipe" })
          assert.isTrue(Exit.isSuccess(wiped.exit))
          assert.strictEqual(wiped.applied, 30, "restored from the start of the changelog")
          assert.deepStrictEqual(wiped.entries, Exit.succeed(expected))
        }).pipe(Effect.provide(Store.layerMemory()))
      )
    )

    it.live("a rebalance in the middle of a restore: finished work is not redone, the rest continues", () =>
      run((app) =>
        Effect.gen(function* () {
          const a = yield* isolated(app)
          yield* a.tables.assign({ active: [0, 1].map((partition) => ({ topic: "words", partition })) })
          yield* a.tables.manager.waitUntilRecoveryCompleted
          yield* writeThrough(a, 0, 0, 2000)
          yield* writeThrough(a, 1, 0, 300)

          const b = yield* isolated(app, { slowWritesMs: 5, recoveryBufferSize: 100 })
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
        })
      )
    )

    it.live("a standby tails the changelog, is not writable, and on promotion replays only its lag", () =>
      run((app) =>
        Effect.gen(function* () {
          const topic = `${app}-counts-changelog`
          const a = yield* isolated(app)
          yield* a.tables.assign({ active: [{ topic: "words", partition: 0 }] })
          yield* a.tables.manager.waitUntilRecoveryCompleted
          yield* writeThrough(a, 0, 0, 500)

          const b = yield* isolated(app, { recoveryBufferSize: 100 })
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
        })
      )
    )

    it.live("a worker without tables is ready at once", () =>
      run((app) =>
        Effect.gen(function* () {
          const tables = yield* Tables.make({ app, settleDelay: 0 }).pipe(Effect.provide(Store.layerMemory()))
          yield* tables.start
          yield* tables.assign({ active: [{ topic: "words", partition: 0 }] })
          yield* tables.manager.waitUntilRecoveryCompleted
          yield* tables.waitUntilReady([{ topic: "words", partition: 0 }])
        })
      )
    )
  })
