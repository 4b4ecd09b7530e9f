/**
 * How the Strata log's consumer reads its tablets, on a client whose reads are counted: what a read returned is
 * handed out over the next pulls (never read again), every assigned partition is read at once and ahead of the
 * pulls but only while the caller pulls, a caught-up partition's read waits on its leader (a long-poll) and is asked
 * again no more than each `pollInterval` of a leader that does not wait, a seek voids a read in flight (ending its
 * wait), a pause forgets what was read, and a failed read comes after the records read before it. Core's conformance suite
 * (StrataLog.test.ts) checks the `Log.Consumer` contract on a real cluster.
 */
import { assert, describe, it } from "@effect/vitest"
import { Errors, type Log } from "@strata/core"
import { Clock, Duration, Effect, Fiber, Stream } from "effect"
import * as TabletClient from "../src/client/TabletClient.js"
import { makeConsumer } from "../src/log/internal/strataConsumer.js"
import { type Shared, TOMBSTONE_HEADER } from "../src/log/internal/strataShared.js"
import * as ReplicaManager from "../src/protocol/ReplicaManager.js"

const TOPIC = "t"
/** Records per batch on the fake tablets: a read starts with the whole batch holding its offset. */
const BATCH = 10

/** One fake tablet: its records from `start`, in batches of `BATCH` by offset. */
interface FakeTablet {
  records: Array<ReplicaManager.TabletRecord>
  start: number
}

/** What the fake leaders were asked: every read of records (not the 1-byte offsets questions). */
interface Reads {
  readonly offsets: Array<{ readonly partition: number; readonly offset: number }>
  /** Records returned, over all reads. */
  served: number
  inFlight: number
  maxInFlight: number
  /** The `maxWaitMs` of each read of records that asked to wait. */
  readonly waits: Array<number>
  /** Reads interrupted while they waited. */
  interrupted: number
}

/**
 * A log of `partitions` fake tablets whose leaders answer a read after `latency` with whole batches from the one
 * holding the offset, up to about `maxBytes` (at least one batch), as a tablet server does; a read at the end that
 * asks to wait (`maxWaitMs`) waits for a record up to that long, unless `waits` is false (a leader that answers at
 * once).
 */
const fakeLog = (partitions: number, latency: Duration.Input = Duration.millis(2), waits = true) => {
  const tablets: Array<FakeTablet> = Array.from({ length: partitions }, () => ({ records: [], start: 0 }))
  const reads: Reads = { offsets: [], served: 0, inFlight: 0, maxInFlight: 0, waits: [], interrupted: 0 }
  const read: TabletClient.TabletClientShape["read"] = (tablet, offset, maxBytes = 1_048_576, options) =>
    Effect.gen(function* () {
      const t = tablets[tablet.bucket]!
      const counted = maxBytes > 1
      const maxWaitMs = options?.maxWaitMs ?? 0
      if (counted) {
        reads.offsets.push({ partition: tablet.bucket, offset })
        if (maxWaitMs > 0) reads.waits.push(maxWaitMs)
        reads.inFlight++
        reads.maxInFlight = Math.max(reads.maxInFlight, reads.inFlight)
      }
      const waited = Effect.gen(function* () {
        yield* Effect.sleep(latency)
        if (!waits || offset < t.start + t.records.length) return
        for (let left = maxWaitMs; left > 0 && offset >= t.start + t.records.length; left--) yield* Effect.sleep(1)
      })
      yield* waited.pipe(
        Effect.onInterrupt(() =>
          Effect.sync(() => {
            reads.interrupted++
          })
        ),
        Effect.ensuring(
          Effect.sync(() => {
            if (counted) reads.inFlight--
          })
        )
      )
      const end = t.start + t.records.length
      const bounds = { highWatermark: end, logStartOffset: t.start, logEndOffset: end }
      if (offset < t.start || offset > end) {
        return yield* new TabletClient.TabletClientError({
          reason: new ReplicaManager.ReplicaError({
            reason: new Errors.OffsetOutOfRange({
              topic: tablet.table,
              partition: tablet.bucket,
              offset,
              logStart: t.start,
              highwater: end
            })
          })
        })
      }
      const batches: Array<ReplicaManager.TabletBatch> = []
      let bytes = 0
      for (let base = Math.max(t.start, offset - (offset % BATCH)); base < end && (bytes === 0 || bytes < maxBytes); ) {
        const records = t.records.slice(base - t.start, Math.min(end, base + BATCH - (base % BATCH)) - t.start)
        for (const r of records) bytes += r.value.length
        batches.push({ baseOffset: base, epoch: 0, records })
        if (counted) reads.served += records.length
        base += records.length
      }
      return { batches, ...bounds }
    })
  const client = { read } as TabletClient.TabletClientShape
  const shared: Shared = {
    client,
    partitions: new Map([[TOPIC, partitions]]),
    pollInterval: Duration.millis(20),
    ends: new Map()
  }
  const append = (partition: number, count: number, valueBytes: number) => {
    const value = new Uint8Array(valueBytes)
    for (let i = 0; i < count; i++) {
      tablets[partition]!.records.push({ key: null, value, headers: [], timestamp: 0 })
    }
  }
  return { tablets, reads, shared, append }
}

const tp = (partition: number) => ({ topic: TOPIC, partition })
const tps = (n: number) => Array.from({ length: n }, (_, p) => tp(p))

/** The batches' records until they hold at least `n` together. */
const records = (c: Log.Consumer, n: number) =>
  Effect.gen(function* () {
    const out: Array<Log.Record> = []
    yield* c.batches.pipe(
      Stream.takeUntil((b) => {
        out.push(...b.records)
        return out.length >= n
      }),
      Stream.runDrain,
      Effect.timeout("5 seconds")
    )
    return out
  })

/** Each partition's offsets, as delivered. */
const offsetsByPartition = (rs: ReadonlyArray<Log.Record>) => {
  const out = new Map<number, Array<number>>()
  for (const r of rs) out.set(r.partition, [...(out.get(r.partition) ?? []), r.offset])
  return out
}

const range = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => from + i)

describe("StrataLog consumer", () => {
  it.live("what a read returned is handed out over the next pulls, each record read once", () =>
    Effect.gen(function* () {
      const log = fakeLog(3)
      // 10 KiB records: about 100 to a read of 1 MiB, 7 to a batch handed out.
      for (let p = 0; p < 3; p++) log.append(p, 500, 10_240)
      const c = yield* makeConsumer(log.shared, { maxBatchRecords: 7 })
      yield* c.assign(tps(3))
      const rs = yield* records(c, 1500)
      const got = offsetsByPartition(rs)
      for (let p = 0; p < 3; p++) assert.deepStrictEqual(got.get(p), range(0, 500), `partition ${p}`)
      for (const r of rs) assert.isAtMost(r.offset, 499)
      // About 5 reads a partition (not one per batch handed out: 72), and a record served twice only where a read
      // started inside a batch (at most a batch a read); the reads at the end found nothing.
      const reads = log.reads.offsets.filter((r) => r.offset < 500).length
      assert.isAtMost(reads, 3 * 6, `${reads} reads`)
      assert.isAtMost(log.reads.served, 1500 + BATCH * reads)
    }).pipe(Effect.scoped)
  )

  it.live("every partition is read at once and ahead of the pulls, and only while the caller pulls", () =>
    Effect.gen(function* () {
      const log = fakeLog(4, Duration.millis(30))
      for (let p = 0; p < 4; p++) log.append(p, 1000, 10_240)
      const c = yield* makeConsumer(log.shared, { maxBatchRecords: 10 })
      yield* c.assign(tps(4))
      const first = yield* records(c, 1)
      assert.strictEqual(first.length, 10)
      assert.strictEqual(log.reads.maxInFlight, 4, "the four partitions' reads overlapped")
      // Nobody pulls: the reads in flight land, and no more start (at most two reads a partition, each in turn).
      yield* Effect.sleep("200 millis")
      assert.isAtMost(log.reads.offsets.length, 8)
      const before = log.reads.offsets.length
      yield* Effect.sleep("100 millis")
      assert.strictEqual(log.reads.offsets.length, before, "no read without a pull")
      // What was read ahead is handed out without another read of it.
      const rest = yield* records(c, 3 * 10)
      assert.deepStrictEqual(
        [...offsetsByPartition([...first, ...rest]).values()].map((os) => os.slice(0, 10)),
        [range(0, 10), range(0, 10), range(0, 10), range(0, 10)]
      )
      assert.strictEqual(
        new Set(log.reads.offsets.map((r) => `${r.partition}:${r.offset}`)).size,
        log.reads.offsets.length
      )
    }).pipe(Effect.scoped)
  )

  it.live("no more than 32 reads are buffered or in flight over all partitions, and every partition is read", () =>
    Effect.gen(function* () {
      const log = fakeLog(40, Duration.millis(20))
      for (let p = 0; p < 40; p++) log.append(p, 150, 10_240)
      const c = yield* makeConsumer(log.shared, { maxBatchRecords: 50 })
      yield* c.assign(tps(40))
      const first = yield* records(c, 1)
      yield* Effect.sleep("200 millis")
      assert.isAtMost(log.reads.maxInFlight, 32)
      assert.isAtMost(log.reads.offsets.length, 32, "32 reads' worth buffered at most")
      const got = offsetsByPartition([...first, ...(yield* records(c, 40 * 150 - first.length))])
      for (let p = 0; p < 40; p++) assert.deepStrictEqual(got.get(p), range(0, 150), `partition ${p}`)
    }).pipe(Effect.scoped)
  )

  it.live("a caught-up partition's read waits on its leader, and its next record arrives as soon as it is there", () =>
    Effect.gen(function* () {
      const log = fakeLog(1)
      log.append(0, 3, 10)
      const c = yield* makeConsumer(log.shared, {})
      yield* c.assign([tp(0)])
      const fiber = yield* Effect.forkChild(records(c, 4))
      yield* Effect.sleep("300 millis")
      // The read of the first records, the one that found nothing new, then one long-poll (not one each 20 ms).
      assert.isAtMost(log.reads.offsets.length, 4, `${log.reads.offsets.length} reads`)
      assert.deepStrictEqual(log.reads.waits, [500], "only a caught-up partition's read waits")
      const appended = yield* Clock.currentTimeMillis
      log.append(0, 1, 10)
      const rs = yield* Fiber.join(fiber)
      assert.isBelow((yield* Clock.currentTimeMillis) - appended, 100, "not at the end of the wait")
      assert.deepStrictEqual(
        rs.map((r) => r.offset),
        [0, 1, 2, 3]
      )
    }).pipe(Effect.scoped)
  )

  it.live("a leader that answers a waiting read at once is asked again each pollInterval, not in a busy loop", () =>
    Effect.gen(function* () {
      const log = fakeLog(1, Duration.millis(2), false)
      log.append(0, 3, 10)
      const c = yield* makeConsumer(log.shared, {})
      yield* c.assign([tp(0)])
      const fiber = yield* Effect.forkChild(records(c, 4))
      yield* Effect.sleep("300 millis")
      // 20 ms apart: about 15 in 300 ms (a busy loop would be thousands).
      assert.isAtMost(log.reads.offsets.length, 25, `${log.reads.offsets.length} reads`)
      log.append(0, 1, 10)
      const rs = yield* Fiber.join(fiber)
      assert.deepStrictEqual(
        rs.map((r) => r.offset),
        [0, 1, 2, 3]
      )
    }).pipe(Effect.scoped)
  )

  it.live("a seek ends a caught-up partition's waiting read, and reads from the sought offset at once", () =>
    Effect.gen(function* () {
      const log = fakeLog(1)
      log.append(0, 30, 10)
      const c = yield* makeConsumer(log.shared, { maxBatchRecords: 30 })
      yield* c.assign([tp(0)])
      yield* records(c, 30)
      const fiber = yield* Effect.forkChild(records(c, 5))
      yield* Effect.sleep("100 millis")
      assert.strictEqual(log.reads.inFlight, 1, "the long-poll waits")
      yield* c.seek(tp(0), 20)
      const rs = yield* Fiber.join(fiber)
      assert.deepStrictEqual(rs.map((r) => r.offset).slice(0, 5), range(20, 25))
      assert.strictEqual(log.reads.interrupted, 1, "the long-poll was ended")
    }).pipe(Effect.scoped)
  )

  it.live("a seek voids the read in flight: nothing before the sought offset arrives", () =>
    Effect.gen(function* () {
      const log = fakeLog(1, Duration.millis(100))
      log.append(0, 400, 10)
      const c = yield* makeConsumer(log.shared, { maxBatchRecords: 50 })
      yield* c.assign([tp(0)])
      const fiber = yield* Effect.forkChild(records(c, 100))
      yield* Effect.sleep("30 millis")
      assert.deepStrictEqual(log.reads.offsets, [{ partition: 0, offset: 0 }], "the read from 0 is in flight")
      yield* c.seek(tp(0), 255)
      const rs = yield* Fiber.join(fiber)
      assert.deepStrictEqual(
        rs.map((r) => r.offset),
        range(255, 355)
      )
      assert.strictEqual(yield* c.position(tp(0)), 355)
    }).pipe(Effect.scoped)
  )

  it.live("a failed read is handed out after the records read before it, from the position it failed at", () =>
    Effect.gen(function* () {
      const log = fakeLog(1)
      // Two reads' worth at most buffered: the first of 100 records, a second read ahead of it.
      log.append(0, 600, 10_240)
      const c = yield* makeConsumer(log.shared, { maxBatchRecords: 50 })
      yield* c.assign([tp(0)])
      const first = yield* records(c, 50)
      // Retention takes everything below 550: what was read is still handed out, then the read past it fails.
      yield* Effect.sleep("50 millis")
      log.tablets[0]!.records.splice(0, 550)
      log.tablets[0]!.start = 550
      const delivered: Array<Log.Record> = [...first]
      const error = yield* c.batches.pipe(
        Stream.runForEach((b) => Effect.sync(() => delivered.push(...b.records))),
        Effect.flip,
        Effect.timeout("5 seconds")
      )
      assert.strictEqual(error.reason._tag, "OffsetOutOfRange")
      const position = yield* c.position(tp(0))
      assert.deepStrictEqual(
        delivered.map((r) => r.offset),
        range(0, position)
      )
      assert.isAtLeast(position, 100, "the records read before the failure were handed out")
      assert.isBelow(position, 550)
      if (error.reason._tag === "OffsetOutOfRange") assert.strictEqual(error.reason.offset, position)
    }).pipe(Effect.scoped)
  )

  it.live("a pause forgets what was read: after resume the partition is read again from its position", () =>
    Effect.gen(function* () {
      const log = fakeLog(2)
      log.append(0, 40, 10)
      log.append(1, 35, 10)
      const c = yield* makeConsumer(log.shared, { maxBatchRecords: 5 })
      yield* c.assign(tps(2))
      const first = yield* records(c, 5)
      const paused = first[0]!.partition
      yield* c.pause([tp(paused)])
      const other = yield* records(c, 35)
      assert.isTrue(
        other.every((r) => r.partition !== paused),
        "nothing of the paused partition"
      )
      yield* c.resume([tp(paused)])
      const rest = yield* records(c, 35)
      assert.deepStrictEqual(offsetsByPartition([...first, ...rest]).get(paused), range(0, 40))
      // Only a read after the resume starts at 5: the pause dropped the records read from 0.
      assert.isTrue(
        log.reads.offsets.some((r) => r.partition === paused && r.offset === 5),
        "read again from its position"
      )
    }).pipe(Effect.scoped)
  )

  it.live("records are the tablet's own bytes; a tombstone's value is null and its marking header gone", () =>
    Effect.gen(function* () {
      const log = fakeLog(1)
      const value = new Uint8Array([1, 2, 3])
      const header = { key: "h", value: new Uint8Array([4]) }
      log.tablets[0]!.records.push(
        { key: null, value, headers: [header], timestamp: 5 },
        {
          key: value,
          value: new Uint8Array(0),
          headers: [header, { key: TOMBSTONE_HEADER, value: new Uint8Array(0) }],
          timestamp: 6
        }
      )
      const c = yield* makeConsumer(log.shared, {})
      yield* c.assign([tp(0)])
      const [live, tombstone] = yield* records(c, 2)
      assert.strictEqual(live!.value, value, "not a copy")
      assert.strictEqual(live!.headers[0], header)
      assert.deepStrictEqual([live!.offset, live!.timestamp, live!.key], [0, 5, null])
      assert.strictEqual(tombstone!.value, null)
      assert.deepStrictEqual(tombstone!.headers, [header])
      assert.deepStrictEqual([tombstone!.offset, tombstone!.timestamp, tombstone!.key], [1, 6, value])
    }).pipe(Effect.scoped)
  )
})
