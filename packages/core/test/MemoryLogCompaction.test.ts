import { Log, MemoryLog } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import type { Scope } from "effect"
import { Effect, Option, Stream } from "effect"

const enc = new TextEncoder()
const dec = new TextDecoder()
const tp = { topic: "c", partition: 0 }

/** A record of partition 0 of `c`; `null` value = tombstone, `null` key = no key. */
const rec = (key: string | null, value: string | null): Log.ProducerRecord => ({
  ...tp,
  key: key === null ? null : enc.encode(key),
  value: value === null ? null : enc.encode(value)
})

const show = (records: ReadonlyArray<Log.Record>): Array<string> =>
  records.map(
    (r) => `${r.offset}:${r.key === null ? "-" : dec.decode(r.key)}=${r.value === null ? "∅" : dec.decode(r.value)}`
  )

/** A memory log with topic `c` (compacted, one partition) holding `records`. */
const withLog = <A, E>(
  records: ReadonlyArray<Log.ProducerRecord>,
  f: (log: Log.Shape, faults: Log.FaultsShape) => Effect.Effect<A, E, Scope.Scope>
): Effect.Effect<A, unknown, Scope.Scope> =>
  Effect.gen(function* () {
    const log = yield* Log.Log
    yield* log.ensureTopic({ topic: "c", partitions: 1, compacted: true })
    if (records.length > 0) yield* log.produceBatch(records)
    return yield* f(log, yield* Log.Faults)
  }).pipe(Effect.provide(MemoryLog.layer()))

/** The next batch of a consumer. */
const nextBatch = (c: Log.Consumer): Effect.Effect<Log.Batch, unknown> =>
  Effect.map(Stream.runHead(c.batches), Option.getOrThrow)

// a b a c b a → latest a=5, b=4, c=3
const history = [rec("a", "1"), rec("b", "1"), rec("a", "2"), rec("c", "1"), rec("b", "2"), rec("a", "3")]

describe("memory log compaction (LogFaults)", () => {
  it.effect("keeps the latest record per key at its offset; log start and highwater do not move", () =>
    withLog(history, (log, faults) =>
      Effect.gen(function* () {
        const removed = yield* faults.compact(tp)
        assert.deepStrictEqual(removed, [0, 1, 2])
        assert.deepStrictEqual(show(yield* faults.records(tp)), ["3:c=1", "4:b=2", "5:a=3"])
        const [offsets] = yield* log.offsets([tp])
        assert.deepStrictEqual([offsets!.logStart, offsets!.highwater], [0, 6])
        // Compacting again changes nothing.
        assert.deepStrictEqual(yield* faults.compact(tp), [])
        // New records get the next offsets.
        assert.strictEqual(yield* log.produce(rec("c", "2")), 6)
      })
    )
  )

  it.effect("a consumer at a removed offset gets the next remaining record; its position reaches the highwater", () =>
    withLog(history, (log, faults) =>
      Effect.gen(function* () {
        yield* faults.compact(tp)
        const c = yield* log.consumer({ maxBatchRecords: 2 })
        yield* c.assign([tp])
        // Assigned at the log start (0, removed): the first records delivered are 3 and 4.
        const first = yield* nextBatch(c)
        assert.deepStrictEqual(show(first.records), ["3:c=1", "4:b=2"])
        assert.strictEqual(first.highwater, 6)
        assert.strictEqual(yield* c.position(tp), 5)
        const second = yield* nextBatch(c)
        assert.deepStrictEqual(show(second.records), ["5:a=3"])
        assert.strictEqual(yield* c.position(tp), 6)
        // Seeking into the gap is allowed (it is within [log start, highwater]).
        yield* c.seek(tp, 1)
        assert.deepStrictEqual(show((yield* nextBatch(c)).records), ["3:c=1", "4:b=2"])
      })
    )
  )

  it.effect("tombstones are kept unless removeTombstones; the partition's last record is never removed", () =>
    withLog([rec("a", "1"), rec("a", null), rec("b", "1"), rec("b", null)], (_log, faults) =>
      Effect.gen(function* () {
        assert.deepStrictEqual(yield* faults.compact(tp), [0, 2])
        assert.deepStrictEqual(show(yield* faults.records(tp)), ["1:a=∅", "3:b=∅"])
        assert.deepStrictEqual(yield* faults.compact(tp, { removeTombstones: true }), [1])
        assert.deepStrictEqual(show(yield* faults.records(tp)), ["3:b=∅"])
      })
    )
  )

  it.effect("until cleans only the records below it; records without a key are kept", () =>
    withLog([...history, rec(null, "x"), rec(null, "y")], (_log, faults) =>
      Effect.gen(function* () {
        // Below 3: a@0 is superseded by a@2; b@1's later record (4) is past until, so b@1 stays.
        assert.deepStrictEqual(yield* faults.compact(tp, { until: 3 }), [0])
        assert.deepStrictEqual(yield* faults.compact(tp), [1, 2])
        assert.deepStrictEqual(show(yield* faults.records(tp)), ["3:c=1", "4:b=2", "5:a=3", "6:-=x", "7:-=y"])
      })
    )
  )

  it.effect("deleteRecords into a gap moves the log start there; a consumer reads on from the next record", () =>
    withLog(history, (log, faults) =>
      Effect.gen(function* () {
        yield* faults.compact(tp)
        yield* log.deleteRecords(tp, 2)
        const [offsets] = yield* log.offsets([tp])
        assert.deepStrictEqual([offsets!.logStart, offsets!.highwater], [2, 6])
        yield* log.deleteRecords(tp, 4)
        assert.deepStrictEqual(show(yield* faults.records(tp)), ["4:b=2", "5:a=3"])
        const c = yield* log.consumer()
        yield* c.assign([tp])
        assert.deepStrictEqual(show((yield* nextBatch(c)).records), ["4:b=2", "5:a=3"])
        const below = yield* Effect.flip(c.seek(tp, 3))
        assert.strictEqual(below.reason._tag, "OffsetOutOfRange")
      })
    )
  )

  it.effect("a topic that is not compacted, or does not exist, cannot be compacted", () =>
    withLog([], (log, faults) =>
      Effect.gen(function* () {
        yield* log.ensureTopic({ topic: "plain", partitions: 1 })
        const plain = yield* Effect.flip(faults.compact({ topic: "plain", partition: 0 }))
        assert.strictEqual(plain.reason._tag, "InvalidRequest")
        assert.match(plain.message, /plain is not compacted/)
        const unknown = yield* Effect.flip(faults.compact({ topic: "nope", partition: 0 }))
        assert.strictEqual(unknown.reason._tag, "UnknownTopic")
        const bad = yield* Effect.flip(faults.compact(tp, { until: 1.5 }))
        assert.strictEqual(bad.reason._tag, "InvalidRequest")
      })
    )
  )
})
