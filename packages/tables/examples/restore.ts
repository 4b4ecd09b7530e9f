/**
 * The recovery README's example: a worker counts words and commits, then a second worker on an empty store restores
 * partition 0 as active and partition 1 as a standby replica, watching recovery's events and progress table.
 * Run it with `./dev exec tsx --conditions=@strata/source packages/tables/examples/restore.ts`.
 */
import { MemoryLog, MemoryStore, type Models, type Recovery } from "@strata/core"
import { ChangelogRecovery } from "@strata/recovery"
import { Table, Tables } from "@strata/tables"
import { Console, Effect, Fiber, Option, Schedule, Schema, Stream } from "effect"

const counts = Table.make({ name: "counts", key: Schema.String, value: Schema.Int, partitions: 2 })
const p0: Models.TopicPartition = { topic: "words", partition: 0 }
const p1: Models.TopicPartition = { topic: "words", partition: 1 }
const options = { app: "restore-example", settleDelay: 0, recovery: { recoveryBufferSize: 500 } } as const

/** The first worker: `n` source records per partition, each counting one of 100 words, then a commit. */
const firstWorker = (n: number) =>
  Effect.gen(function* () {
    const tables = yield* Tables.make(options)
    const table = yield* tables.register(counts)
    yield* tables.start
    yield* tables.assign({ active: [p0, p1] })
    yield* tables.manager.waitUntilRecoveryCompleted
    for (let offset = 0; offset < n; offset++) {
      for (const tp of [p0, p1]) {
        const word = `word-${(offset * 7 + tp.partition) % 100}`
        yield* tables.process(
          { ...tp, offset },
          table.update(word, (c) => Option.getOrElse(c, () => 0) + 1)
        )
      }
    }
    yield* tables.manager.onCommit([
      { ...p0, offset: n },
      { ...p1, offset: n }
    ])
  }).pipe(Effect.scoped, Effect.provide(MemoryStore.layer()))

/** The second worker, on an empty store of its own: everything comes back from the changelog. */
const secondWorker = Effect.gen(function* () {
  const tables = yield* Tables.make(options)
  const table = yield* tables.register(counts)
  yield* tables.start
  const recovery = Option.getOrThrow(yield* tables.recovery)
  const seen: Array<Recovery.Event["_tag"]> = []
  const watcher = yield* Effect.forkChild(
    recovery.events.pipe(
      Stream.runForEach((event) =>
        Effect.sync(() => {
          if (seen[seen.length - 1] !== event._tag) seen.push(event._tag)
        })
      )
    )
  )
  yield* Effect.yieldNow
  // Partition 0 is processed here; partition 1 is a standby: restored and kept tailing, not writable.
  yield* tables.assign({ active: [p0], standby: [p1] })
  yield* tables.waitUntilReady([p0])
  yield* tables.manager.waitUntilRecoveryCompleted
  // Actives first, then the standby catches up and keeps tailing: wait until it holds the whole changelog.
  const caughtUp = (s: Recovery.Stats) => s.partitions.every((p) => p.offset >= p.highwater)
  const stats = yield* recovery.stats.pipe(Effect.repeat({ until: caughtUp, schedule: Schedule.spaced("10 millis") }))
  yield* Console.log(ChangelogRecovery.formatStats(stats))
  yield* Fiber.interrupt(watcher)
  return {
    events: seen,
    active: yield* table.entries(0),
    standby: yield* table.entries(1),
    resume: yield* tables.resumeOffset(p0)
  }
}).pipe(Effect.scoped, Effect.provide(MemoryStore.layer()))

/** Both workers on one log (the changelog outlives the first worker), each with its own store. */
export const program = Effect.gen(function* () {
  yield* firstWorker(1000)
  return yield* secondWorker
}).pipe(Effect.provide(MemoryLog.layer()))

if (import.meta.url === `file://${process.argv[1]}`) {
  Effect.runPromise(program).then(({ events, active, standby, resume }) =>
    console.log({ events, active: active.length, standby: standby.length, resume })
  )
}
