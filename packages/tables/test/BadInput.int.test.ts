/**
 * Bad input through the tables on the real parts (LevelDB directory, Kafka on loopback): a changelog topic deleted
 * under a table's store, before a restart and while the worker runs. The store keeps what it had, the partition is
 * refused with the reason until it restores, and a persisted changelog offset never goes backwards.
 */
import { Log, Store } from "@strata/core"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { KafkaLog } from "@strata/kafka"
import * as LevelStore from "@strata/store-adapters/level"
import { Effect, Exit, Layer, Logger, Option, Schedule, Schema, Scope } from "effect"
import { Kafka, logLevel } from "kafkajs"
import { inject } from "vitest"
import * as Table from "../src/Table.js"
import * as Tables from "../src/Tables.js"

const counts = Table.make({ name: "counts", key: Schema.String, value: Schema.Int, partitions: 1 })
const source = { topic: "words", partition: 0 }

/** A table manager on the store, its one partition assigned and restored (or failed). */
const worker = (app: string) =>
  Effect.gen(function* () {
    const tables = yield* Tables.make({ app, settleDelay: 0 })
    const table = yield* tables.register(counts)
    yield* tables.start
    yield* tables.assign({ active: [source] })
    return { tables, table, recovered: yield* Effect.exit(tables.manager.waitUntilRecoveryCompleted) }
  })

/** Deletes a topic and waits until the broker no longer lists it. */
const deleteTopic = (topic: string) =>
  Effect.gen(function* () {
    const admin = yield* Effect.acquireRelease(
      Effect.promise(async () => {
        const a = new Kafka({ brokers: [inject("kafka")], logLevel: logLevel.NOTHING }).admin()
        await a.connect()
        return a
      }),
      (a) => Effect.promise(() => a.disconnect())
    )
    yield* Effect.promise(() => admin.deleteTopics({ topics: [topic] }))
    yield* Effect.repeat(
      Effect.promise(() => admin.listTopics().then((topics) => topics.includes(topic))),
      { while: (listed) => listed, schedule: Schedule.spaced("200 millis") }
    )
  }).pipe(Effect.scoped)

/** The changelog offset the partition's store persisted (opened here: no worker may hold it). */
const persistedChangelog = (app: string) =>
  Effect.gen(function* () {
    const store = yield* Store.Store
    const partition = yield* store.open({ table: "counts", partition: 0 })
    return yield* partition.persistedOffset({ topic: `${app}-counts-changelog`, partition: 0 })
  }).pipe(Effect.scoped)

const writeTen = (w: Effect.Success<ReturnType<typeof worker>>) =>
  Effect.gen(function* () {
    for (let i = 0; i < 10; i++) yield* w.tables.process({ ...source, offset: i }, w.table.set(`k${i}`, i))
    yield* w.tables.manager.onCommit([{ ...source, offset: 10 }])
  })

const run = <A, E>(body: (app: string) => Effect.Effect<A, E, Log.Log | Store.Store | Scope.Scope>) =>
  Effect.suspend(() => {
    const directory = mkdtempSync(join(tmpdir(), "strata-bad-input-"))
    const app = `bad-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`
    return body(app).pipe(
      Effect.scoped,
      Effect.provide(
        Layer.mergeAll(
          KafkaLog.layer({ brokers: [inject("kafka")] }),
          LevelStore.layer({ directory }),
          Logger.layer([])
        )
      ),
      Effect.ensuring(Effect.sync(() => rmSync(directory, { recursive: true, force: true })))
    )
  })

describe("bad input through the tables (LevelDB + Kafka)", () => {
  it.live(
    "the changelog deleted before a restart: the partition is refused with the ConsistencyError, nothing is lost",
    () =>
      run((app) =>
        Effect.gen(function* () {
          const first = yield* Scope.make()
          yield* Effect.flatMap(worker(app), writeTen).pipe(Scope.provide(first))
          yield* Scope.close(first, Exit.void)
          assert.deepStrictEqual(yield* persistedChangelog(app), Option.some(9))
          yield* deleteTopic(`${app}-counts-changelog`)

          const second = yield* Scope.make()
          const w = yield* worker(app).pipe(Scope.provide(second))
          assert.isTrue(Exit.isFailure(w.recovered))
          const failure = Exit.isFailure(w.recovered)
            ? Option.getOrUndefined(Exit.findErrorOption(w.recovered))
            : undefined
          assert.strictEqual(failure?.reason._tag, "TableRecoveryFailed")
          if (failure?.reason._tag === "TableRecoveryFailed") {
            assert.strictEqual(failure.reason.reason._tag, "ConsistencyError")
          }
          const read = yield* Effect.flip(w.table.get("k3"))
          assert.strictEqual(read.reason._tag, "PartitionRestoreFailed")
          const write = yield* Effect.flip(w.tables.process({ ...source, offset: 10 }, w.table.set("new", 99)))
          assert.strictEqual(write.reason._tag, "PartitionRestoreFailed")
          yield* w.tables.manager.onCommit([{ ...source, offset: 11 }])
          yield* Scope.close(second, Exit.void)
          assert.deepStrictEqual(yield* persistedChangelog(app), Option.some(9), "the persisted offset stayed")

          // A restart reports the same, not "completed" over a store its changelog no longer backs.
          const third = yield* Scope.make()
          const again = yield* worker(app).pipe(Scope.provide(third))
          assert.isTrue(Exit.isFailure(again.recovered))
          yield* Scope.close(third, Exit.void)
        })
      ),
    60_000
  )

  it.live(
    "the changelog deleted and made again while the worker runs: the commit fails, the offset does not go back",
    () =>
      run((app) =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const scope = yield* Scope.make()
          const w = yield* worker(app).pipe(Scope.provide(scope))
          assert.isTrue(Exit.isSuccess(w.recovered))
          yield* writeTen(w)
          const changelog = `${app}-counts-changelog`
          yield* deleteTopic(changelog)
          yield* log.ensureTopic({ topic: changelog, partitions: 1, compacted: true })
          // The new changelog's first offsets are below what the store persisted.
          const sent = yield* Effect.exit(w.tables.process({ ...source, offset: 10 }, w.table.set("new", 99)))
          const committed = yield* Effect.exit(w.tables.manager.onCommit([{ ...source, offset: 11 }]))
          assert.isTrue(Exit.isFailure(sent) || Exit.isFailure(committed), "the write or its commit was refused")
          yield* Scope.close(scope, Exit.void)
          assert.deepStrictEqual(yield* persistedChangelog(app), Option.some(9), "the persisted offset did not go back")
        })
      ),
    60_000
  )
})
