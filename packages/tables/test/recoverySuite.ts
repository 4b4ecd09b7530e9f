/**
 * Recovery through the table manager — the fixture cases — run on the memory log (`Recovery.test.ts`) and on
 * Kafka (`Recovery.int.test.ts`): an empty partition, a log start above 0, a store that persisted everything, a store
 * ahead of its changelog (failing, or wiped and restored), a rebalance in the middle of a restore, standby replicas
 * and their promotion, a worker with no tables. Each worker has its own memory store unless a case restarts one on
 * the same store.
 */
import { Log, MemoryStore, type Recovery, Store } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
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
    readonly badRecords?: "fail" | "dead-letter"
  } = {}
) =>
  Effect.gen(function* () {
    const store = yield* Store.Store
    const slow = options.slowWritesMs
    const tables = yield* Tables.make({
      app,
      settleDelay: 0,
      ...(options.badRecords === undefined ? {} : { badRecords: options.badRecords }),
      recovery: {
        recoveryBufferSize: options.recoveryBufferSize ?? 1000,
        ...(options.onInconsistency === undefined ? {} : { onInconsistency: options.onInconsistency })
      }
    }).pipe(
      Effect.provideService(
        Store.Store,
        slow === undefined
          ? store
          : Store.Store.of({
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
  worker(app, options).pipe(Effect.provide(MemoryStore.layer()))

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
export const recoverySuite = (name: string, logLayer: () => Layer.Layer<Log.Log, unknown>) =>
  describe(`recovery through the tables (${name})`, () => {
    const run = <A, E>(body: (app: string) => Effect.Effect<A, E, Log.Log | Scope.Scope>) =>
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
          const log = yield* Log.Log
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
                  Stream.runForEach((e: Recovery.Event) =>
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
          const store = yield* Store.Store
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
        }).pipe(Effect.provide(MemoryStore.layer()))
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
              Stream.runForEach((e: Recovery.Event) =>
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
          const log = yield* Log.Log
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
              Stream.runForEach((e: Recovery.Event) =>
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

    it.live("a partition whose restore failed is neither read nor written until it restores; the others go on", () =>
      run((app) =>
        Effect.gen(function* () {
          const words = [0, 1].map((partition) => ({ topic: "words", partition }))
          const changelog0 = { topic: `${app}-counts-changelog`, partition: 0 }
          const store = yield* Store.Store
          const first = yield* Scope.make()
          const a = yield* worker(app).pipe(Scope.provide(first))
          yield* a.tables.assign({ active: words })
          yield* writeThrough(a, 0, 0, 10)
          yield* writeThrough(a, 1, 0, 10)
          const kept1 = yield* a.table.entries(1)
          yield* Scope.close(first, Exit.void)
          // Partition 0's store claims more than its changelog holds.
          const persisted = () =>
            store.open({ table: "counts", partition: 0 }).pipe(
              Effect.flatMap((s) => s.persistedOffset(changelog0)),
              Effect.scoped
            )
          yield* store.open({ table: "counts", partition: 0 }).pipe(
            Effect.flatMap((s) => s.setPersistedOffset(changelog0, 100)),
            Effect.scoped
          )
          const scope = yield* Scope.make()
          const b = yield* worker(app).pipe(Scope.provide(scope))
          yield* b.tables.assign({ active: words })
          const failed = yield* Effect.flip(b.tables.manager.waitUntilRecoveryCompleted)
          assert.strictEqual(failed.reason._tag, "TableRecoveryFailed")
          if (failed.reason._tag === "TableRecoveryFailed") {
            assert.strictEqual(failed.reason.reason._tag, "ConsistencyError")
          }
          // Partition 1 restored; partition 0 refuses reads and writes with the reason.
          yield* b.tables.waitUntilReady([words[1]!])
          assert.deepStrictEqual(yield* b.table.entries(1), kept1)
          const refusedRead = yield* Effect.flip(b.table.get("k3", { partition: 0 }))
          assert.strictEqual(refusedRead.reason._tag, "PartitionRestoreFailed")
          assert.include(refusedRead.message, "persisted offset 100 is beyond the changelog highwater 10")
          const refusedWrite = yield* Effect.flip(
            b.tables.process({ topic: "words", partition: 0, offset: 10 }, b.table.set("new", 99))
          )
          assert.strictEqual(refusedWrite.reason._tag, "PartitionRestoreFailed")
          yield* b.tables.manager.onCommit([{ topic: "words", partition: 0, offset: 11 }])
          yield* Scope.close(scope, Exit.void)
          assert.deepStrictEqual(yield* persisted(), Option.some(100), "the persisted offset did not go backwards")
          // Wiped, it restores from its changelog and is usable again.
          const wiped = yield* Scope.make()
          const c = yield* worker(app, { onInconsistency: "wipe" }).pipe(Scope.provide(wiped))
          yield* c.tables.assign({ active: words })
          yield* c.tables.manager.waitUntilRecoveryCompleted
          assert.strictEqual((yield* c.table.entries(0)).length, 10)
          yield* Scope.close(wiped, Exit.void)
        }).pipe(Effect.provide(MemoryStore.layer()))
      )
    )

    it.live(
      "a changelog record that cannot be restored fails its partition naming the offset, or is dead-lettered",
      () =>
        run((app) =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const changelog = `${app}-counts-changelog`
            yield* log.ensureTopic({ topic: changelog, partitions: 2, compacted: true })
            const bytes = (text: string) => new TextEncoder().encode(text)
            const json = (v: unknown) => bytes(JSON.stringify(v))
            const entries: ReadonlyArray<readonly [Uint8Array, Uint8Array]> = [
              [json("a"), json(1)],
              [json("b"), bytes("{not json")],
              [json("c"), json(2)],
              [new Uint8Array([0x22, 0xc3, 0x28, 0x22]), json(3)], // not UTF-8
              [json("x".repeat(70 * 1024)), json(4)], // beyond the store's 64 KiB key limit
              [json("d"), json("five")], // not an Int
              [json("e"), json(6)]
            ]
            yield* log.produceBatch(
              entries.map(([key, value]) => ({ topic: changelog, partition: 0, key, value, headers: [] }))
            )
            const p0 = [{ topic: "words", partition: 0 }]

            const failing = yield* isolated(app)
            yield* failing.tables.assign({ active: p0 })
            const failed = yield* Effect.flip(failing.tables.manager.waitUntilRecoveryCompleted)
            assert.strictEqual(failed.reason._tag, "TableRecoveryFailed")
            if (failed.reason._tag === "TableRecoveryFailed") {
              const reason = failed.reason.reason
              assert.strictEqual(reason._tag, "BadChangelogRecord")
              if (reason._tag === "BadChangelogRecord") {
                assert.deepStrictEqual([reason.topic, reason.partition, reason.offset], [changelog, 0, 1])
                assert.include(reason.message, "not JSON")
              }
            }
            const refused = yield* Effect.flip(failing.table.entries(0))
            assert.strictEqual(refused.reason._tag, "PartitionRestoreFailed")

            const lenient = yield* isolated(app, { badRecords: "dead-letter" })
            const recovery = yield* recoveryOf(lenient)
            const skipped: Array<number> = []
            yield* Effect.forkChild(
              recovery.events.pipe(
                Stream.runForEach((e: Recovery.Event) =>
                  Effect.sync(() => {
                    if (e._tag === "RecordSkipped") skipped.push(e.offset)
                  })
                )
              )
            )
            yield* Effect.yieldNow
            yield* lenient.tables.assign({ active: p0 })
            yield* lenient.tables.manager.waitUntilRecoveryCompleted
            assert.deepStrictEqual(yield* lenient.table.entries(0), [
              ["a", 1],
              ["c", 2],
              ["e", 6]
            ])
            assert.deepStrictEqual(skipped, [1, 3, 4, 5])
            // Each record set aside is in the dead-letter topic, with where it came from and why.
            const reader = yield* log.consumer()
            yield* reader.assign([{ topic: `${app}-dead-letters`, partition: 0 }])
            const dead = yield* reader.batches.pipe(
              Stream.flatMap((batch) => Stream.fromIterable(batch.records)),
              Stream.take(4),
              Stream.runCollect
            )
            const header = (r: (typeof dead)[number], key: string) =>
              new TextDecoder().decode(r.headers.find((h) => h.key === key)?.value ?? new Uint8Array())
            assert.deepStrictEqual(
              dead.map((r) => JSON.parse(header(r, "strata-dead-letter-from"))),
              [1, 3, 4, 5].map((offset) => [changelog, 0, offset])
            )
            assert.include(header(dead[0]!, "strata-dead-letter-reason"), "not JSON")
            assert.include(header(dead[2]!, "strata-dead-letter-reason"), "exceeds the limit of 65536")
          })
        )
    )

    it.live("a write beyond the store's limits is refused before it is produced", () =>
      run((app) =>
        Effect.gen(function* () {
          const a = yield* isolated(app)
          yield* a.tables.assign({ active: [{ topic: "words", partition: 0 }] })
          const refused = yield* Effect.flip(
            a.tables.process({ topic: "words", partition: 0, offset: 0 }, a.table.set("x".repeat(70 * 1024), 2))
          )
          assert.strictEqual(refused.reason._tag, "TableStoreFailed")
          assert.include(refused.message, "exceeds the limit of 65536")
          // Good writes still commit, and nothing of the refused one reached the changelog.
          yield* writeThrough(a, 0, 1, 3)
          const log = yield* Log.Log
          const [changelog] = yield* log.offsets([{ topic: `${app}-counts-changelog`, partition: 0 }])
          assert.strictEqual(changelog!.highwater, 3)
          const b = yield* isolated(app)
          yield* b.tables.assign({ active: [{ topic: "words", partition: 0 }] })
          yield* b.tables.manager.waitUntilRecoveryCompleted
          assert.deepStrictEqual(yield* b.table.entries(0), yield* a.table.entries(0))
        })
      )
    )

    it.live("a worker without tables is ready at once", () =>
      run((app) =>
        Effect.gen(function* () {
          const tables = yield* Tables.make({ app, settleDelay: 0 }).pipe(Effect.provide(MemoryStore.layer()))
          yield* tables.start
          yield* tables.assign({ active: [{ topic: "words", partition: 0 }] })
          yield* tables.manager.waitUntilRecoveryCompleted
          yield* tables.waitUntilReady([{ topic: "words", partition: 0 }])
        })
      )
    )
  })
