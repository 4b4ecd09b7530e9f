import { type Log, Models, type Recovery } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Fiber, Logger, Option, Queue, Schema, Stream, Tracer } from "effect"
import { TestClock } from "effect/testing"
import { ChangelogRecovery } from "../src/index.js"

const topic = "app-t-changelog"
const tp0: Models.TopicPartition = { topic, partition: 0 }

interface FakeLog {
  /** Records of each partition by offset (gaps allowed). */
  readonly records: Map<string, Array<Log.Record>>
  readonly highwater: Map<string, number>
  readonly logStart: Map<string, number>
  /** Where the consumer will fetch next. */
  readonly position: Map<string, number>
  readonly paused: Set<string>
  /** When false, the fake fetches nothing (a broken fetcher). */
  fetchWorks: boolean
}

const record = (partition: number, offset: number, key: string, value: string | null): Log.Record => ({
  topic,
  partition,
  offset,
  key: new TextEncoder().encode(key),
  value: value === null ? null : new TextEncoder().encode(value),
  headers: [],
  timestamp: 0
})

/** A changelog source over in-memory records: `take` delivers records of resumed partitions from their positions. */
const fakeSource = (log: FakeLog) =>
  Effect.gen(function* () {
    const queue = yield* Queue.unbounded<Log.Record>()
    const fill = Effect.gen(function* () {
      if (!log.fetchWorks) return
      for (const [key, position] of log.position) {
        if (log.paused.has(key)) continue
        const all = log.records.get(key) ?? []
        const next = all.filter((r) => r.offset >= position)
        // The consumer moves past gaps and markers up to the highwater.
        log.position.set(key, log.highwater.get(key) ?? position)
        yield* Queue.offerAll(queue, next)
      }
    })
    const source: Recovery.ChangelogSource = {
      offsets: (tps) =>
        Effect.succeed(
          tps.map((tp) => ({
            ...tp,
            logStart: log.logStart.get(Models.tpKey(tp)) ?? 0,
            highwater: log.highwater.get(Models.tpKey(tp)) ?? 0
          }))
        ),
      seek: (tp, offset) => Effect.sync(() => log.position.set(Models.tpKey(tp), offset)),
      resume: (tps) =>
        Effect.andThen(
          Effect.sync(() => {
            for (const tp of tps) log.paused.delete(Models.tpKey(tp))
          }),
          Queue.clear(queue)
        ),
      pause: (tps) =>
        Effect.sync(() => {
          for (const tp of tps) log.paused.add(Models.tpKey(tp))
        }),
      take: (max) => Effect.andThen(fill, Queue.takeBetween(queue, 1, max)),
      position: (tp) => Effect.sync(() => log.position.get(Models.tpKey(tp)) ?? 0),
      fetching: (tp) => Effect.sync(() => !log.paused.has(Models.tpKey(tp)))
    }
    return source
  })

/** A restore target keeping each partition's state and persisted offset in maps. */
const fakeTarget = () => {
  const state = new Map<string, Map<string, string>>()
  const persisted = new Map<string, number>()
  const applied: Array<{ tp: string; offsets: ReadonlyArray<number> }> = []
  const target: Recovery.RestoreTarget = {
    persistedOffset: (tp) => Effect.sync(() => Option.fromNullishOr(persisted.get(Models.tpKey(tp)))),
    apply: (tp, records) =>
      Effect.sync(() => {
        const table = state.get(Models.tpKey(tp)) ?? new Map<string, string>()
        state.set(Models.tpKey(tp), table)
        for (const r of records) {
          const key = new TextDecoder().decode(r.key ?? new Uint8Array())
          if (r.value === null) table.delete(key)
          else table.set(key, new TextDecoder().decode(r.value))
        }
        persisted.set(Models.tpKey(tp), records[records.length - 1]!.offset)
        applied.push({ tp: Models.tpKey(tp), offsets: records.map((r) => r.offset) })
        return { skipped: [] }
      }),
    wipe: (tp) =>
      Effect.sync(() => {
        state.delete(Models.tpKey(tp))
        persisted.delete(Models.tpKey(tp))
      }),
    flush: Effect.void,
    failed: () => Effect.void
  }
  return { target, state, persisted, applied }
}

const logOf = (partitions: Record<number, { records: Array<Log.Record>; highwater: number; logStart?: number }>) => {
  const log: FakeLog = {
    records: new Map(),
    highwater: new Map(),
    logStart: new Map(),
    position: new Map(),
    paused: new Set(),
    fetchWorks: true
  }
  for (const [p, spec] of Object.entries(partitions)) {
    const key = Models.tpKey({ topic, partition: Number(p) })
    log.records.set(key, spec.records)
    log.highwater.set(key, spec.highwater)
    log.logStart.set(key, spec.logStart ?? 0)
    log.paused.add(key)
  }
  return log
}

const quiet = Logger.layer([])

describe("ChangelogRecovery", () => {
  it.effect("an empty partition is ready at once; no tables at all completes at once", () =>
    Effect.gen(function* () {
      const log = logOf({ 0: { records: [], highwater: 0 } })
      const { target } = fakeTarget()
      const recovery = yield* ChangelogRecovery.make(yield* fakeSource(log), target)
      yield* recovery.waitUntilCompleted
      yield* recovery.assign({ active: [tp0], standby: [] })
      yield* recovery.waitUntilCompleted
      yield* recovery.waitUntilReady([tp0])
      assert.strictEqual((yield* recovery.stats).remaining, 0)
    }).pipe(Effect.scoped, Effect.provide(quiet))
  )

  it.effect("restores from the log start, in batches, to the last value per key", () =>
    Effect.gen(function* () {
      const records = [
        record(0, 3, "a", "1"),
        record(0, 4, "b", "1"),
        record(0, 5, "a", "2"),
        record(0, 6, "b", null),
        record(0, 7, "c", "3")
      ]
      const log = logOf({ 0: { records, highwater: 8, logStart: 3 } })
      const { target, state, applied } = fakeTarget()
      const recovery = yield* ChangelogRecovery.make(yield* fakeSource(log), target, { recoveryBufferSize: 2 })
      yield* recovery.assign({ active: [tp0], standby: [] })
      yield* recovery.waitUntilCompleted
      assert.deepStrictEqual([...(state.get(Models.tpKey(tp0)) ?? [])].sort(), [
        ["a", "2"],
        ["c", "3"]
      ])
      assert.deepStrictEqual(
        applied.map((a) => a.offsets),
        [[3, 4], [5, 6], [7]]
      )
    }).pipe(Effect.scoped, Effect.provide(quiet))
  )

  it.effect("the restore of the active partitions runs in a span naming how much it restores", () => {
    const spans: Array<{ readonly name: string; readonly attributes: ReadonlyMap<string, unknown> }> = []
    const recording = Tracer.make({
      span(options) {
        const span = Tracer.nativeTracer.span(options)
        spans.push({ name: options.name, attributes: span.attributes })
        return span
      }
    })
    return Effect.gen(function* () {
      const records = [record(0, 0, "a", "1"), record(0, 1, "b", "2"), record(0, 2, "a", "3")]
      const log = logOf({ 0: { records, highwater: 3, logStart: 0 } })
      const { target } = fakeTarget()
      const recovery = yield* ChangelogRecovery.make(yield* fakeSource(log), target, {})
      yield* recovery.assign({ active: [tp0], standby: [] })
      yield* recovery.waitUntilCompleted
      const restore = spans.find((s) => s.name === "strata.recovery.restore")
      assert.isDefined(restore)
      assert.strictEqual(restore?.attributes.get("strata.partitions"), 1)
      assert.strictEqual(restore?.attributes.get("strata.records"), 3)
    }).pipe(Effect.scoped, Effect.provide(quiet), Effect.provideService(Tracer.Tracer, recording))
  })

  it.live("a slow store: the next batch is written while one is, at most two at once, each partition in order", () =>
    Effect.gen(function* () {
      // Partition 0 has three times the records of 1 and 2, so its batches also come back to back at the end.
      const sizes = [90, 30, 30]
      const bufferSize = 5
      const spec: Record<number, { records: Array<Log.Record>; highwater: number }> = {}
      sizes.forEach((n, p) => {
        spec[p] = { records: Array.from({ length: n }, (_, i) => record(p, i, `k${i % 7}`, `${p}:${i}`)), highwater: n }
      })
      const log = logOf(spec)
      // Chunks of `bufferSize` records, partitions taking turns (as the Kafka consumer hands them out).
      const chunks: Array<Array<Log.Record>> = []
      for (let i = 0; chunks.length * bufferSize < 150; i += bufferSize)
        for (const p of [0, 1, 2]) if (i < sizes[p]!) chunks.push(spec[p]!.records.slice(i, i + bufferSize))
      const base = yield* fakeSource(log)
      const source: Recovery.ChangelogSource = {
        ...base,
        take: () => (chunks.length > 0 ? Effect.sync(() => chunks.shift()!) : Effect.never)
      }
      const fake = fakeTarget()
      let writing = 0
      let mostWriting = 0
      let batches = 0
      const busy = new Set<string>()
      const next = new Map<string, number>()
      const violations: Array<string> = []
      // A batch takes 4 or 1 ms to land, alternately, like a store writing off the main thread: without the
      // per-partition order, a partition's later batch would land before its earlier one.
      const target: Recovery.RestoreTarget = {
        ...fake.target,
        apply: (tp, records) =>
          Effect.gen(function* () {
            const key = Models.tpKey(tp)
            if (busy.has(key))
              violations.push(`${key}@${records[0]!.offset} began while its previous batch was written`)
            busy.add(key)
            writing += records.length
            mostWriting = Math.max(mostWriting, writing)
            yield* Effect.sleep(batches++ % 2 === 0 ? "4 millis" : "1 millis")
            writing -= records.length
            busy.delete(key)
            if (records[0]!.offset !== (next.get(key) ?? 0))
              violations.push(`${key}@${records[0]!.offset} out of order`)
            next.set(key, records[records.length - 1]!.offset + 1)
            return yield* fake.target.apply(tp, records)
          })
      }
      const recovery = yield* ChangelogRecovery.make(source, target, { recoveryBufferSize: bufferSize })
      yield* recovery.assign({ active: [0, 1, 2].map((partition) => ({ topic, partition })), standby: [] })
      yield* recovery.waitUntilCompleted
      assert.deepStrictEqual(violations, [])
      sizes.forEach((n, p) => {
        const expected = new Map<string, string>()
        for (let i = 0; i < n; i++) expected.set(`k${i % 7}`, `${p}:${i}`)
        assert.deepStrictEqual(fake.state.get(Models.tpKey({ topic, partition: p })), expected)
      })
      // Two batches were written at once, never more: memory stays bounded by the buffers.
      assert.strictEqual(mostWriting, 2 * bufferSize)
    }).pipe(Effect.scoped, Effect.provide(quiet))
  )

  it.effect("options are checked by one schema: a bad or unknown option is InvalidRecoveryOptions naming it", () =>
    Effect.gen(function* () {
      const source = yield* fakeSource(logOf({}))
      const refused = (options: Record<string, unknown>) =>
        Effect.map(
          Effect.flip(
            ChangelogRecovery.make(source, fakeTarget().target, options as ChangelogRecovery.ChangelogRecoveryOptions)
          ),
          (e) => e.message
        )
      assert.match(yield* refused({ recoveryBufferSize: 0 }), /recoveryBufferSize/)
      assert.match(yield* refused({ onInconsistency: "ignore" }), /onInconsistency/)
      assert.match(yield* refused({ statsInterval: "often" }), /statsInterval/)
      assert.match(yield* refused({ recoveryBufer: 10 }), /recoveryBufer/)
    }).pipe(Effect.scoped, Effect.provide(quiet))
  )

  it.effect(
    "durations take any Duration.Input (a number is milliseconds); negative or infinite ones are refused by name",
    () =>
      Effect.gen(function* () {
        const decode = Schema.decodeUnknownSync(ChangelogRecovery.ChangelogRecoveryOptionsSchema)
        const given = decode({ recoveryDelay: "2 seconds", eventTimeout: 1500 })
        assert.strictEqual(Duration.toMillis(given.recoveryDelay), 2000)
        assert.strictEqual(Duration.toMillis(given.eventTimeout), 1500)
        const defaults = decode({})
        assert.deepStrictEqual(
          [defaults.recoveryDelay, defaults.statsInterval, defaults.eventTimeout, defaults.flushTimeout].map(
            Duration.toMillis
          ),
          [0, 5_000, 30_000, 120_000]
        )
        const source = yield* fakeSource(logOf({}))
        const refused = (options: ChangelogRecovery.ChangelogRecoveryOptions) =>
          Effect.map(Effect.flip(ChangelogRecovery.make(source, fakeTarget().target, options)), (e) => e.message)
        assert.match(yield* refused({ recoveryDelay: -1 }), /recoveryDelay = -1/)
        assert.match(yield* refused({ recoveryDelay: "soon" as Duration.Input }), /recoveryDelay = "soon"/)
        assert.match(yield* refused({ eventTimeout: Number.POSITIVE_INFINITY }), /eventTimeout = Infinity/)
        assert.match(yield* refused({ flushTimeout: 0 }), /flushTimeout = 0/)
      }).pipe(Effect.scoped, Effect.provide(quiet))
  )

  it.effect("a partition whose last offsets hold no record (markers, compaction) still completes", () =>
    Effect.gen(function* () {
      // Records up to offset 4; offsets 5..9 are transaction markers or compacted away; the highwater is 10.
      const records = [record(0, 2, "a", "1"), record(0, 4, "b", "2")]
      const log = logOf({ 0: { records, highwater: 10 } })
      const { target, state } = fakeTarget()
      const recovery = yield* ChangelogRecovery.make(yield* fakeSource(log), target)
      yield* recovery.assign({ active: [tp0], standby: [] })
      const waiting = yield* Effect.forkChild(recovery.waitUntilCompleted)
      yield* TestClock.adjust("5 seconds")
      yield* Fiber.join(waiting)
      assert.strictEqual(state.get(Models.tpKey(tp0))?.size, 2)
    }).pipe(Effect.scoped, Effect.provide(quiet))
  )

  // On the real clock: a store ahead of the highwater is judged only after re-reading it for a second.
  it.live("persisted offset = last offset: nothing replayed; persisted beyond the highwater: ConsistencyError", () =>
    Effect.gen(function* () {
      const log = logOf({ 0: { records: [record(0, 0, "a", "1"), record(0, 1, "a", "2")], highwater: 2 } })
      const fake = fakeTarget()
      fake.persisted.set(Models.tpKey(tp0), 1)
      const recovery = yield* ChangelogRecovery.make(yield* fakeSource(log), fake.target)
      yield* recovery.assign({ active: [tp0], standby: [] })
      yield* recovery.waitUntilCompleted
      assert.deepStrictEqual(fake.applied, [])

      fake.persisted.set(Models.tpKey(tp0), 5)
      const again = yield* ChangelogRecovery.make(yield* fakeSource(log), fake.target)
      yield* again.assign({ active: [tp0], standby: [] })
      const error = yield* Effect.flip(again.waitUntilCompleted)
      assert.strictEqual(error.reason._tag, "ConsistencyError")
      assert.strictEqual(error.message, `${topic}/0: persisted offset 5 is beyond the changelog highwater 2`)
    }).pipe(Effect.scoped, Effect.provide(quiet))
  )

  it.effect("progress: events per batch, a stats table with an ETA after the first batch", () =>
    Effect.gen(function* () {
      const records = Array.from({ length: 50 }, (_, i) => record(0, i, `k${i % 7}`, String(i)))
      const log = logOf({ 0: { records, highwater: 50 } })
      const { target } = fakeTarget()
      const recovery = yield* ChangelogRecovery.make(yield* fakeSource(log), target, { recoveryBufferSize: 10 })
      const seen = yield* Effect.forkChild(
        recovery.events.pipe(
          Stream.takeUntil((e) => e._tag === "Completed"),
          Stream.runCollect
        )
      )
      yield* Effect.yieldNow
      yield* recovery.assign({ active: [tp0], standby: [] })
      yield* recovery.waitUntilCompleted
      const events = (yield* Fiber.join(seen)) as ReadonlyArray<Recovery.Event>
      const tags = events.map((e) => e._tag)
      assert.strictEqual(tags[0], "Started")
      assert.strictEqual(tags.filter((t) => t === "BatchApplied").length, 5)
      assert.isTrue(tags.includes("PartitionReady"))
      assert.strictEqual(tags[tags.length - 1], "Completed")
      const table = ChangelogRecovery.formatStats({
        partitions: [{ topic, partition: 0, highwater: 50, offset: 20, remaining: 30, standby: false }],
        remaining: 30,
        etaMs: 1500
      })
      assert.match(table, /topic\s+partition\s+highwater\s+offset\s+remaining/)
      assert.match(table, /app-t-changelog\s+0\s+50\s+20\s+30/)
      assert.match(table, /remaining 30 records, ETA 2 s/)
      assert.match(
        ChangelogRecovery.formatStats({ partitions: [], remaining: 0, etaMs: undefined }),
        /unknown until the first batch/
      )
    }).pipe(Effect.scoped, Effect.provide(quiet))
  )

  it.effect("stalls are reported and classified: no fetch, partition paused", () =>
    Effect.gen(function* () {
      const log = logOf({ 0: { records: [record(0, 0, "a", "1")], highwater: 1 } })
      log.fetchWorks = false
      const { target } = fakeTarget()
      const recovery = yield* ChangelogRecovery.make(yield* fakeSource(log), target, {
        eventTimeout: "30 seconds",
        statsInterval: "5 seconds"
      })
      const stalls = yield* Effect.forkChild(
        recovery.events.pipe(
          Stream.filter((e) => e._tag === "Stalled"),
          Stream.take(2),
          Stream.runCollect
        )
      )
      yield* Effect.yieldNow
      yield* recovery.assign({ active: [tp0], standby: [] })
      // Nothing arrives: after the event timeout the stall is reported as a fetch that does not happen.
      yield* TestClock.adjust("35 seconds")
      // Then someone pauses the partition behind recovery's back: reported as such at the next check.
      log.paused.add(Models.tpKey(tp0))
      yield* TestClock.adjust("5 seconds")
      const kinds: Array<string> = []
      for (const e of yield* Fiber.join(stalls)) if (e._tag === "Stalled") kinds.push(e.kind)
      assert.deepStrictEqual(kinds, ["no-fetch", "paused"])
    }).pipe(Effect.scoped, Effect.provide(quiet))
  )
})
