import { Log, MemoryLog } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { LogConformance } from "@strata/core/testing"
import type { Scope } from "effect"
import { Effect, Exit, Fiber, Option, Scope as S, Stream } from "effect"
import { TestClock } from "effect/testing"

LogConformance.suite("memory", MemoryLog.layer(), { faults: true })

const enc = new TextEncoder()
const b = (s: string): Uint8Array => enc.encode(s)
const rec = (topic: string, partition: number, value: string): Log.ProducerRecord => ({
  topic,
  partition,
  key: null,
  value: b(value)
})
const reasonTag = <A, R>(effect: Effect.Effect<A, Log.LogError, R>): Effect.Effect<string, never, R> =>
  Effect.match(effect, { onFailure: (e) => e.reason._tag, onSuccess: () => "succeeded" })

const withLog = <A, E>(
  f: (log: Log.Shape) => Effect.Effect<A, E, Scope.Scope>,
  options?: Parameters<typeof MemoryLog.layer>[0]
): Effect.Effect<A, E, Scope.Scope> =>
  Effect.gen(function* () {
    return yield* f(yield* Log.Log)
  }).pipe(Effect.provide(MemoryLog.layer(options)))

/** Records a member's events in the background. */
const recordEvents = (m: Log.GroupConsumer): Effect.Effect<Array<Log.GroupEvent>, never, Scope.Scope> =>
  Effect.gen(function* () {
    const events: Array<Log.GroupEvent> = []
    yield* m.events.pipe(
      Stream.runForEach((e) => Effect.sync(() => events.push(e))),
      Effect.ignore,
      Effect.forkScoped
    )
    return events
  })

const show = (events: ReadonlyArray<Log.GroupEvent>): Array<string> =>
  events.map((e) => `${e._tag} ${e.partitions.map((tp) => `${tp.topic}/${tp.partition}`).join(",")}`)

describe("memory log", () => {
  it.effect("maxRecordBytes counts key, value and header bytes", () =>
    withLog(
      (log) =>
        Effect.gen(function* () {
          yield* log.ensureTopic({ topic: "t", partitions: 1 })
          // 10 + 80 + ("hdr" = 3) + 7 = 100 bytes: exactly at the limit.
          const at = {
            topic: "t",
            partition: 0,
            key: new Uint8Array(10),
            value: new Uint8Array(80),
            headers: [{ key: "hdr", value: new Uint8Array(7) }]
          }
          assert.strictEqual(yield* log.produce(at), 0)
          const over = { ...at, headers: [{ key: "hdr", value: new Uint8Array(8) }] }
          const error = yield* Effect.flip(log.produce(over))
          assert.strictEqual(error.reason._tag, "RecordTooLarge")
          if (error.reason._tag === "RecordTooLarge") {
            assert.strictEqual(error.reason.size, 101)
            assert.strictEqual(error.reason.max, 100)
          }
          // A batch with one oversized record appends nothing.
          assert.strictEqual(yield* reasonTag(log.produceBatch([rec("t", 0, "ok"), over])), "RecordTooLarge")
          assert.strictEqual((yield* log.offsets([{ topic: "t", partition: 0 }]))[0]!.highwater, 1)
        }),
      { maxRecordBytes: 100 }
    )
  )

  it.effect("timestamps come from Effect's Clock", () =>
    withLog((log) =>
      Effect.gen(function* () {
        yield* TestClock.setTime(1_234_567)
        yield* log.ensureTopic({ topic: "t", partitions: 1 })
        yield* log.produce(rec("t", 0, "a"))
        const c = yield* log.consumer()
        yield* c.assign([{ topic: "t", partition: 0 }])
        const batch = yield* Stream.runHead(c.batches)
        assert.strictEqual(Option.getOrThrow(batch).records[0]!.timestamp, 1_234_567)
      })
    )
  )

  it.live(
    "appending 200,000 records stays linear and reads back completely",
    () =>
      withLog((log) =>
        Effect.gen(function* () {
          const n = 100_000
          yield* log.ensureTopic({ topic: "big", partitions: 2 })
          const value = new Uint8Array(16)
          for (let i = 0; i < n; i++) yield* log.produce({ topic: "big", partition: 0, key: null, value })
          const batch: Array<Log.ProducerRecord> = []
          for (let i = 0; i < n; i++) batch.push({ topic: "big", partition: 1, key: null, value })
          const offsets = yield* log.produceBatch(batch)
          assert.strictEqual(offsets[n - 1], n - 1)
          const tp0 = { topic: "big", partition: 0 }
          const tp1 = { topic: "big", partition: 1 }
          yield* log.deleteRecords(tp1, n / 2)
          assert.deepStrictEqual(
            (yield* log.offsets([tp0, tp1])).map((o) => [o.logStart, o.highwater]),
            [
              [0, n],
              [n / 2, n]
            ]
          )
          const c = yield* log.consumer({ maxBatchRecords: 5000 })
          yield* c.assign([tp0, tp1])
          let count = 0
          const next = [0, n / 2]
          yield* c.batches.pipe(
            Stream.takeUntil((batch) => {
              count += batch.records.length
              return count >= n + n / 2
            }),
            Stream.runForEach((batch) =>
              Effect.sync(() => {
                for (const r of batch.records) {
                  assert.strictEqual(r.offset, next[r.partition])
                  next[r.partition]!++
                }
              })
            )
          )
          assert.deepStrictEqual(next, [n, n])
        })
      ),
    60_000
  )

  it.effect("batches rotate across ready partitions", () =>
    withLog((log) =>
      Effect.gen(function* () {
        yield* log.ensureTopic({ topic: "t", partitions: 3 })
        const records: Array<Log.ProducerRecord> = []
        for (let p = 0; p < 3; p++) for (let i = 0; i < 20; i++) records.push(rec("t", p, `${p}-${i}`))
        yield* log.produceBatch(records)
        const c = yield* log.consumer({ maxBatchRecords: 5 })
        yield* c.assign([0, 1, 2].map((partition) => ({ topic: "t", partition })))
        const batches = yield* c.batches.pipe(Stream.take(12), Stream.runCollect)
        assert.deepStrictEqual(
          batches.map((x) => x.partition),
          [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]
        )
        assert.isTrue(batches.every((x) => x.records.length === 5))
      })
    )
  )

  it.effect("produced bytes are copied", () =>
    withLog((log) =>
      Effect.gen(function* () {
        yield* log.ensureTopic({ topic: "t", partitions: 1 })
        const value = b("abc")
        yield* log.produce({ topic: "t", partition: 0, key: null, value })
        value[0] = 0
        const c = yield* log.consumer()
        yield* c.assign([{ topic: "t", partition: 0 }])
        const batch = Option.getOrThrow(yield* Stream.runHead(c.batches))
        assert.strictEqual(new TextDecoder().decode(batch.records[0]!.value!), "abc")
      })
    )
  )

  it.live("an interrupted fetch loses nothing", () =>
    withLog((log) =>
      Effect.gen(function* () {
        yield* log.ensureTopic({ topic: "t", partitions: 1 })
        const c = yield* log.consumer()
        yield* c.assign([{ topic: "t", partition: 0 }])
        const pull = yield* Stream.toPull(c.batches)
        assert.isTrue(Option.isNone(yield* Effect.timeoutOption(pull, "50 millis")))
        yield* log.produce(rec("t", 0, "a"))
        const batch = yield* pull
        assert.deepStrictEqual(
          batch.flatMap((x) => x.records.map((r) => r.offset)),
          [0]
        )
      })
    )
  )

  it.live("closing a consumer fails its waiting fetch with LogClosed", () =>
    withLog((log) =>
      Effect.gen(function* () {
        yield* log.ensureTopic({ topic: "t", partitions: 1 })
        const scope = yield* S.make()
        const c = yield* log.consumer().pipe(S.provide(scope))
        yield* c.assign([{ topic: "t", partition: 0 }])
        const fiber = yield* Effect.forkChild(Stream.runHead(c.batches))
        yield* Effect.sleep("20 millis")
        yield* S.close(scope, Exit.void)
        const exit = yield* Fiber.await(fiber)
        assert.isTrue(Exit.isFailure(exit))
        if (Exit.isFailure(exit)) {
          const error = yield* Effect.flip(Effect.failCause(exit.cause))
          assert.strictEqual(error.reason._tag, "LogClosed")
        }
      })
    )
  )

  it.live("group assignment is round-robin over sorted partitions and members in join order", () =>
    withLog((log) =>
      Effect.gen(function* () {
        yield* log.ensureTopic({ topic: "t", partitions: 4 })
        const m1 = yield* log.groupConsumer({ groupId: "g", topics: ["t"] })
        const e1 = yield* recordEvents(m1)
        const scope = yield* S.make()
        const m2 = yield* log.groupConsumer({ groupId: "g", topics: ["t"] }).pipe(S.provide(scope))
        const e2 = yield* recordEvents(m2).pipe(S.provide(scope))
        assert.deepStrictEqual(
          (yield* m1.assignment).map((tp) => tp.partition),
          [0, 2]
        )
        assert.deepStrictEqual(
          (yield* m2.assignment).map((tp) => tp.partition),
          [1, 3]
        )
        yield* Effect.sleep("10 millis")
        assert.deepStrictEqual(show(e1), ["Assigned t/0,t/1,t/2,t/3", "Revoked t/1,t/3"])
        assert.deepStrictEqual(show(e2), ["Assigned t/1,t/3"])
        yield* S.close(scope, Exit.void)
        yield* Effect.sleep("10 millis")
        assert.deepStrictEqual(show(e1), ["Assigned t/0,t/1,t/2,t/3", "Revoked t/1,t/3", "Assigned t/1,t/3"])
        assert.deepStrictEqual(
          (yield* m1.assignment).map((tp) => tp.partition),
          [0, 1, 2, 3]
        )
      })
    )
  )

  it.live("members subscribed to different topics only get partitions of their topics", () =>
    withLog((log) =>
      Effect.gen(function* () {
        yield* log.ensureTopic({ topic: "a", partitions: 2 })
        yield* log.ensureTopic({ topic: "b", partitions: 2 })
        const m1 = yield* log.groupConsumer({ groupId: "g", topics: ["a", "b"] })
        const m2 = yield* log.groupConsumer({ groupId: "g", topics: ["b"] })
        const key = (tps: ReadonlyArray<{ topic: string; partition: number }>) =>
          tps.map((tp) => `${tp.topic}/${tp.partition}`)
        const a1 = key(yield* m1.assignment)
        const a2 = key(yield* m2.assignment)
        assert.includeMembers(a1, ["a/0", "a/1"])
        assert.isTrue(a2.every((k) => k.startsWith("b/")))
        assert.deepStrictEqual([...a1, ...a2].sort(), ["a/0", "a/1", "b/0", "b/1"])
      })
    )
  )

  it.effect("invalid requests fail with typed errors", () =>
    withLog((log) =>
      Effect.gen(function* () {
        yield* log.ensureTopic({ topic: "t", partitions: 1 })
        assert.strictEqual(yield* reasonTag(log.groupConsumer({ groupId: "g", topics: ["nope"] })), "UnknownTopic")
        assert.strictEqual(yield* reasonTag(log.groupConsumer({ groupId: "g", topics: [] })), "InvalidRequest")
        assert.strictEqual(yield* reasonTag(log.groupConsumer({ groupId: "", topics: ["t"] })), "InvalidRequest")
        assert.strictEqual(yield* reasonTag(log.consumer({ maxBatchRecords: 1.5 })), "InvalidRequest")
        const c = yield* log.consumer()
        yield* c.assign([{ topic: "t", partition: 0 }])
        assert.strictEqual(yield* reasonTag(c.seek({ topic: "t", partition: 0 }, 0.5)), "InvalidRequest")
        assert.strictEqual(yield* reasonTag(log.deleteRecords({ topic: "t", partition: 0 }, -1)), "OffsetOutOfRange")
        assert.strictEqual(yield* reasonTag(log.produce(rec("t", 0.5, "x"))), "InvalidRequest")
        assert.strictEqual(yield* reasonTag(log.ensureTopic({ topic: "..", partitions: 1 })), "InvalidRequest")
      })
    )
  )

  it.live("a committed offset below the log start starts a new assignment at the log start", () =>
    withLog((log) =>
      Effect.gen(function* () {
        yield* log.ensureTopic({ topic: "t", partitions: 1 })
        yield* log.produceBatch([0, 1, 2, 3, 4].map((i) => rec("t", 0, `v${i}`)))
        yield* Effect.scoped(
          Effect.flatMap(log.groupConsumer({ groupId: "g", topics: ["t"] }), (m) =>
            m.commit([{ topic: "t", partition: 0, offset: 1 }])
          )
        )
        yield* log.deleteRecords({ topic: "t", partition: 0 }, 3)
        const m = yield* log.groupConsumer({ groupId: "g", topics: ["t"] })
        const batch = Option.getOrThrow(yield* Stream.runHead(m.batches))
        assert.deepStrictEqual(
          batch.records.map((r) => r.offset),
          [3, 4]
        )
      })
    )
  )
})
