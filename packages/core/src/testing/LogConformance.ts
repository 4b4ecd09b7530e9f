/**
 * The `Log` conformance suite: what every log backend (memory, Kafka) must do.
 * An adapter's test file runs it in one line:
 *
 * ```ts
 * LogConformance.suite("kafka", KafkaLog.layer({ brokers }))
 * ```
 *
 * Tests run on the real clock, every wait is bounded, and every test creates
 * its own topics and groups (unique names), so one broker can serve many runs.
 *
 * @since 0.1.0
 */
import * as Log from "../Log.js"
import * as Models from "../Models.js"
import { assert, describe, layer } from "@effect/vitest"
import type { Layer, Scope } from "effect"
import { Cause, Clock, Duration, Effect, Exit, Option, Queue, Random, Result, Stream } from "effect"

/** Tuning of the suite for slower backends. */
export interface SuiteOptions {
  /** Upper bound of every wait for something that must happen (default 10 seconds). */
  readonly timeout?: Duration.Input
  /** Upper bound of a wait for a group rebalance to settle (default 30 seconds). */
  readonly rebalanceTimeout?: Duration.Input
  /** How long a "nothing arrives" check watches (default 300 millis). */
  readonly quietPeriod?: Duration.Input
  /** The backend's record size limit; a record twice as large must fail (default 1 MiB). */
  readonly maxRecordBytes?: number
  /** Timeout of building the layer (default 60 seconds). */
  readonly layerTimeout?: Duration.Input
  /**
   * The layer also provides `LogFaults` (the memory log does): the tests that inject faults run. A backend without
   * fault injection declares `false` and proves those behaviours in tests of its own.
   */
  readonly faults?: boolean
  /**
   * What the backend offers of the protocol (each `true` unless declared `false`, as a backend's own
   * `capabilities` say). The tests of an operation not offered do not run; one test checks that each fails with
   * `Unsupported` instead.
   */
  readonly capabilities?: {
    readonly deleteRecords?: boolean
    readonly transactions?: boolean
    readonly groups?: boolean
  }
}

interface Config {
  readonly timeout: Duration.Duration
  readonly rebalanceTimeout: Duration.Duration
  readonly quietPeriod: Duration.Duration
  readonly maxRecordBytes: number
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const enc = new TextEncoder()
const dec = new TextDecoder()
const b = (s: string): Uint8Array => enc.encode(s)
const str = (u: Uint8Array | null): string | null => (u === null ? null : dec.decode(u))

let topicCounter = 0

/** A unique name: a run-specific prefix, the clock, randomness and a counter. */
const uniqueName = (prefix: string): Effect.Effect<string> =>
  Effect.gen(function* () {
    topicCounter++
    const now = yield* Clock.currentTimeMillis
    const r = yield* Random.nextIntBetween(0, 1_000_000_000)
    return `strata-conf-${prefix}-${now.toString(36)}-${r.toString(36)}-${topicCounter}`
  })

/** Creates a fresh topic and returns its name. */
const freshTopic = (partitions: number): Effect.Effect<string, Log.LogError, Log.Log> =>
  Effect.gen(function* () {
    const log = yield* Log.Log
    const topic = yield* uniqueName("t")
    yield* log.ensureTopic({ topic, partitions })
    return topic
  })

const tps = (topic: string, partitions: number): Array<Models.TopicPartition> =>
  Array.from({ length: partitions }, (_, partition) => ({ topic, partition }))

const rec = (topic: string, partition: number, value: string, key: string | null = null): Log.ProducerRecord => ({
  topic,
  partition,
  key: key === null ? null : b(key),
  value: b(value)
})

/** The failing reason's tag, or `"succeeded"`. */
const reasonTag = <A, R>(effect: Effect.Effect<A, Log.LogError, R>): Effect.Effect<string, never, R> =>
  Effect.match(effect, { onFailure: (e) => e.reason._tag, onSuccess: () => "succeeded" })

const sortTps = (list: Iterable<Models.TopicPartition>): Array<Models.TopicPartition> =>
  Array.from(list, (tp) => ({ topic: tp.topic, partition: tp.partition })).sort(Models.tpCompare)

const keysOf = (list: Iterable<Models.TopicPartition>): Array<string> => sortTps(list).map(Models.tpKey)

const sameTps = (a: Iterable<Models.TopicPartition>, c: Iterable<Models.TopicPartition>): boolean =>
  keysOf(a).join(",") === keysOf(c).join(",")

/** Checks what every batch must satisfy. Throws (a defect) when it does not. */
const checkBatch = (batch: Log.Batch, maxBatchRecords: number): void => {
  const where = `batch of ${batch.topic}/${batch.partition}`
  assert.isAtLeast(batch.records.length, 1, `${where}: a batch carries at least one record`)
  assert.isAtMost(batch.records.length, maxBatchRecords, `${where}: more records than maxBatchRecords`)
  let previous = -1
  for (const r of batch.records) {
    assert.strictEqual(r.topic, batch.topic, `${where}: record of another topic`)
    assert.strictEqual(r.partition, batch.partition, `${where}: record of another partition`)
    if (previous >= 0) assert.strictEqual(r.offset, previous + 1, `${where}: offsets are not dense`)
    previous = r.offset
  }
  assert.isAbove(batch.highwater, previous, `${where}: highwater ${batch.highwater} ≤ last offset ${previous}`)
}

/** Consumes a `batches` stream in the background, checking every batch. */
interface Collector {
  /** Waits until `n` more records arrived (bounded by the timeout) and returns them, with their batches. */
  readonly records: (n: number) => Effect.Effect<ReadonlyArray<Log.Record>, Log.LogError>
  /** The batches that arrived so far. */
  readonly batches: ReadonlyArray<Log.Batch>
  /** Watches for the quiet period and returns the records that arrived meanwhile. */
  readonly quiet: Effect.Effect<ReadonlyArray<Log.Record>, Log.LogError>
  /** Waits for the stream to fail and returns its error (bounded by the timeout). */
  readonly failure: Effect.Effect<Log.LogError>
}

const collect = (
  stream: Stream.Stream<Log.Batch, Log.LogError>,
  cfg: Config,
  maxBatchRecords = 1000
): Effect.Effect<Collector, never, Scope.Scope> =>
  Effect.gen(function* () {
    const queue = yield* Queue.unbounded<Log.Batch, Log.LogError>()
    const seen: Array<Log.Batch> = []
    yield* stream.pipe(
      Stream.runForEach((batch) =>
        Effect.sync(() => {
          checkBatch(batch, maxBatchRecords)
          seen.push(batch)
        }).pipe(Effect.andThen(Queue.offer(queue, batch)))
      ),
      Effect.andThen(Effect.sync(() => assert.fail("the batches stream ended on its own"))),
      Effect.catchCause((cause) => Queue.failCause(queue, cause)),
      Effect.forkScoped
    )
    const records = (n: number): Effect.Effect<ReadonlyArray<Log.Record>, Log.LogError> =>
      Effect.gen(function* () {
        const out: Array<Log.Record> = []
        const done = yield* Effect.gen(function* () {
          while (out.length < n) out.push(...(yield* Queue.take(queue)).records)
        }).pipe(Effect.timeoutOption(cfg.timeout))
        if (Option.isNone(done)) {
          return assert.fail(`expected ${n} records within ${Duration.format(cfg.timeout)}, got ${out.length}`)
        }
        return out
      })
    const quiet = Effect.gen(function* () {
      const out: Array<Log.Record> = []
      yield* Effect.gen(function* () {
        while (true) out.push(...(yield* Queue.take(queue)).records)
      }).pipe(Effect.timeoutOption(cfg.quietPeriod))
      return out
    })
    const failure = Effect.gen(function* () {
      const result = yield* Effect.gen(function* () {
        while (true) yield* Queue.take(queue)
      }).pipe(Effect.flip, Effect.timeoutOption(cfg.timeout))
      if (Option.isNone(result)) return assert.fail("expected the batches stream to fail")
      return result.value
    })
    return { records, quiet, failure, batches: seen }
  })

/** Polls `cond` every 20 ms until it holds, failing after `timeout`. */
const eventually = <E, R>(
  cond: Effect.Effect<boolean, E, R>,
  timeout: Duration.Duration,
  what: string
): Effect.Effect<void, E, R> =>
  Effect.gen(function* () {
    const deadline = (yield* Clock.currentTimeMillis) + Duration.toMillis(timeout)
    while (true) {
      if (yield* cond) return
      if ((yield* Clock.currentTimeMillis) > deadline) return assert.fail(`timed out waiting until ${what}`)
      yield* Effect.sleep("20 millis")
    }
  })

/** A group member's events, replayed as they arrive. */
interface EventLog {
  readonly events: Array<Log.GroupEvent>
  /** The partitions held according to the events replayed in order. */
  readonly held: Map<string, Models.TopicPartition>
  /** Events that do not replay (revoking a partition not held, assigning one already held). */
  readonly problems: Array<string>
}

const recordEvents = (member: Log.GroupConsumer): Effect.Effect<EventLog, never, Scope.Scope> =>
  Effect.gen(function* () {
    const state: EventLog = { events: [], held: new Map(), problems: [] }
    yield* member.events.pipe(
      Stream.runForEach((event) =>
        Effect.sync(() => {
          state.events.push(event)
          for (const tp of event.partitions) {
            const k = Models.tpKey(tp)
            if (event._tag === "Assigned") {
              if (state.held.has(k)) state.problems.push(`${k} assigned while already held`)
              state.held.set(k, tp)
            } else {
              if (!state.held.has(k)) state.problems.push(`${k} revoked while not held`)
              state.held.delete(k)
            }
          }
        })
      ),
      Effect.ignore,
      Effect.forkScoped
    )
    return state
  })

/** Seeking out of range fails at once, or the next fetch fails; either way with OffsetOutOfRange. */
const expectOutOfRange = (
  consumer: Log.Consumer,
  tp: Models.TopicPartition,
  offset: number,
  cfg: Config
): Effect.Effect<void> =>
  Effect.gen(function* () {
    const sought = yield* Effect.result(consumer.seek(tp, offset))
    let error: Log.LogError
    if (Result.isFailure(sought)) {
      error = sought.failure
    } else {
      const fetched = yield* consumer.batches.pipe(Stream.runHead, Effect.flip, Effect.timeoutOption(cfg.timeout))
      if (Option.isNone(fetched)) return assert.fail(`seek to ${offset} neither failed nor made the fetch fail`)
      error = fetched.value
    }
    assert.strictEqual(error.reason._tag, "OffsetOutOfRange")
    if (error.reason._tag === "OffsetOutOfRange") assert.strictEqual(error.reason.offset, offset)
  }).pipe(Effect.orDie)

const byPartition = (records: ReadonlyArray<Log.Record>): Map<number, Array<Log.Record>> => {
  const out = new Map<number, Array<Log.Record>>()
  for (const r of records) {
    const list = out.get(r.partition) ?? []
    list.push(r)
    out.set(r.partition, list)
  }
  return out
}

const offsetsOf = (records: ReadonlyArray<Log.Record>): Array<number> => records.map((r) => r.offset)
const valuesOf = (records: ReadonlyArray<Log.Record>): Array<string | null> => records.map((r) => str(r.value))

// ---------------------------------------------------------------------------
// The suite
// ---------------------------------------------------------------------------

/** Runs the conformance suite against a `Log` layer. */
export const suite = (name: string, logLayer: Layer.Layer<Log.Log, unknown>, options?: SuiteOptions): void => {
  const cfg: Config = {
    timeout: Duration.fromInputUnsafe(options?.timeout ?? "10 seconds"),
    rebalanceTimeout: Duration.fromInputUnsafe(options?.rebalanceTimeout ?? "30 seconds"),
    quietPeriod: Duration.fromInputUnsafe(options?.quietPeriod ?? "300 millis"),
    maxRecordBytes: options?.maxRecordBytes ?? 1024 * 1024
  }
  const caps = {
    deleteRecords: options?.capabilities?.deleteRecords ?? true,
    transactions: options?.capabilities?.transactions ?? true,
    groups: options?.capabilities?.groups ?? true
  }

  describe(`Log conformance: ${name}`, () => {
    layer(logLayer, { excludeTestServices: true, timeout: options?.layerTimeout ?? "60 seconds" })((it) => {
      // --- topics --------------------------------------------------------------

      it.effect("ensureTopic is idempotent and rejects a different partition count", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* uniqueName("ensure")
          yield* log.ensureTopic({ topic, partitions: 3 })
          yield* log.ensureTopic({ topic, partitions: 3 })
          assert.strictEqual(yield* reasonTag(log.ensureTopic({ topic, partitions: 4 })), "TopicMismatch")
          assert.strictEqual(yield* reasonTag(log.ensureTopic({ topic, partitions: 1 })), "TopicMismatch")
          const offsets = yield* log.offsets(tps(topic, 3))
          assert.deepStrictEqual(
            offsets.map((o) => o.partition),
            [0, 1, 2]
          )
          assert.strictEqual(yield* reasonTag(log.offsets([{ topic, partition: 3 }])), "UnknownPartition")
        })
      )

      it.effect("ensureTopic rejects invalid names and partition counts", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* uniqueName("invalid")
          assert.strictEqual(yield* reasonTag(log.ensureTopic({ topic: "", partitions: 1 })), "InvalidRequest")
          assert.strictEqual(yield* reasonTag(log.ensureTopic({ topic: "has space", partitions: 1 })), "InvalidRequest")
          assert.strictEqual(
            yield* reasonTag(log.ensureTopic({ topic: "x".repeat(250), partitions: 1 })),
            "InvalidRequest"
          )
          assert.strictEqual(yield* reasonTag(log.ensureTopic({ topic, partitions: 0 })), "InvalidRequest")
          assert.strictEqual(yield* reasonTag(log.ensureTopic({ topic, partitions: -2 })), "InvalidRequest")
          // The rejected spec created nothing.
          assert.strictEqual(yield* reasonTag(log.produce(rec(topic, 0, "v"))), "UnknownTopic")
        })
      )

      it.effect("produce to an unknown topic or partition fails", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const missing = yield* uniqueName("missing")
          assert.strictEqual(yield* reasonTag(log.produce(rec(missing, 0, "v"))), "UnknownTopic")
          const topic = yield* freshTopic(2)
          assert.strictEqual(yield* reasonTag(log.produce(rec(topic, 2, "v"))), "UnknownPartition")
          assert.strictEqual(yield* reasonTag(log.produce(rec(topic, -1, "v"))), "UnknownPartition")
          assert.strictEqual(yield* reasonTag(log.offsets([{ topic: missing, partition: 0 }])), "UnknownTopic")
          const offsets = yield* log.offsets(tps(topic, 2))
          assert.deepStrictEqual(
            offsets.map((o) => o.highwater),
            [0, 0]
          )
        })
      )

      it.effect("a record over the size limit fails with RecordTooLarge", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(1)
          const big = new Uint8Array(cfg.maxRecordBytes * 2)
          const tooLarge = { topic, partition: 0, key: null, value: big }
          assert.strictEqual(yield* reasonTag(log.produce(tooLarge)), "RecordTooLarge")
          const fits = { topic, partition: 0, key: null, value: new Uint8Array(Math.floor(cfg.maxRecordBytes / 2)) }
          assert.strictEqual(yield* log.produce(fits), 0)
        })
      )

      // --- producing and offsets ----------------------------------------------

      it.effect("produce returns dense offsets per partition", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(3)
          const got: Array<[number, number]> = []
          for (const p of [0, 1, 0, 2, 0, 1]) got.push([p, yield* log.produce(rec(topic, p, `v${got.length}`))])
          assert.deepStrictEqual(got, [
            [0, 0],
            [1, 0],
            [0, 1],
            [2, 0],
            [0, 2],
            [1, 1]
          ])
          assert.strictEqual(yield* log.produce(rec(topic, 2, "x"), { acks: 1 }), 1)
          assert.strictEqual(yield* log.produce(rec(topic, 2, "y"), { acks: "all" }), 2)
        })
      )

      it.effect("offsets of an empty partition are 0/0 and the highwater follows produce", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(2)
          assert.deepStrictEqual(yield* log.offsets(tps(topic, 2)), [
            { topic, partition: 0, logStart: 0, highwater: 0 },
            { topic, partition: 1, logStart: 0, highwater: 0 }
          ])
          for (let i = 0; i < 5; i++) yield* log.produce(rec(topic, 1, `v${i}`))
          yield* log.flush
          assert.deepStrictEqual(
            yield* log.offsets([
              { topic, partition: 1 },
              { topic, partition: 0 }
            ]),
            [
              { topic, partition: 1, logStart: 0, highwater: 5 },
              { topic, partition: 0, logStart: 0, highwater: 0 }
            ]
          )
          assert.deepStrictEqual(yield* log.offsets([]), [])
        })
      )

      it.effect("produceBatch appends in the order given and returns offsets in that order", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(2)
          const batch = [0, 1, 1, 0, 0, 1, 0].map((p, i) => rec(topic, p, `v${i}`))
          const offsets = yield* log.produceBatch(batch)
          assert.deepStrictEqual(offsets, [0, 0, 1, 1, 2, 2, 3])
          assert.deepStrictEqual(yield* log.produceBatch([]), [])
          const c = yield* log.consumer()
          yield* c.assign(tps(topic, 2))
          const records = byPartition(yield* (yield* collect(c.batches, cfg)).records(7))
          assert.deepStrictEqual(valuesOf(records.get(0)!), ["v0", "v3", "v4", "v6"])
          assert.deepStrictEqual(valuesOf(records.get(1)!), ["v1", "v2", "v5"])
        })
      )

      it.effect("concurrent produce calls get dense, distinct offsets", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(3)
          const calls = Array.from({ length: 300 }, (_, i) => rec(topic, i % 3, `v${i}`))
          const offsets = yield* Effect.forEach(calls, (r) => log.produce(r), { concurrency: "unbounded" })
          yield* log.flush
          for (let p = 0; p < 3; p++) {
            const mine = offsets.filter((_, i) => i % 3 === p).sort((a, b) => a - b)
            assert.deepStrictEqual(
              mine,
              Array.from({ length: 100 }, (_, i) => i),
              `partition ${p}`
            )
          }
          const hw = yield* log.offsets(tps(topic, 3))
          assert.deepStrictEqual(
            hw.map((o) => o.highwater),
            [100, 100, 100]
          )
        })
      )

      it.effect("acks 0 returns -1 and still appends", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(1)
          assert.strictEqual(yield* log.produce(rec(topic, 0, "a"), { acks: 0 }), -1)
          assert.deepStrictEqual(
            yield* log.produceBatch([rec(topic, 0, "b"), rec(topic, 0, "c")], { acks: 0 }),
            [-1, -1]
          )
          yield* log.flush
          const tp = { topic, partition: 0 }
          yield* eventually(
            Effect.map(log.offsets([tp]), (o) => o[0]!.highwater === 3),
            cfg.timeout,
            "acks-0 records are appended"
          )
          const c = yield* log.consumer()
          yield* c.assign([tp])
          assert.deepStrictEqual(valuesOf(yield* (yield* collect(c.batches, cfg)).records(3)), ["a", "b", "c"])
        })
      )

      // --- producers -------------------------------------------------------------

      it.effect("a producer's sends are appended in the order sent, offsets known once acknowledged", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(2)
          const producer = yield* log.producer()
          // 40 sends of 5 records, alternating partitions, none awaited before the next is sent.
          const acks: Array<Effect.Effect<ReadonlyArray<number>, Log.LogError>> = []
          for (let i = 0; i < 40; i++) {
            const p = i % 2
            acks.push(yield* producer.send(Array.from({ length: 5 }, (_, j) => rec(topic, p, `${i}.${j}`))))
          }
          const offsets = yield* Effect.all(acks)
          for (const p of [0, 1]) {
            const mine = offsets.filter((_, i) => i % 2 === p).flat()
            assert.deepStrictEqual(
              mine,
              Array.from({ length: 100 }, (_, k) => k),
              `partition ${p}: dense offsets in send order`
            )
          }
          yield* producer.flush
          const c = yield* log.consumer()
          yield* c.assign([{ topic, partition: 1 }])
          const values = valuesOf(yield* (yield* collect(c.batches, cfg)).records(100))
          assert.deepStrictEqual(values.slice(0, 6), ["1.0", "1.1", "1.2", "1.3", "1.4", "3.0"])
          assert.strictEqual(values[99], "39.4")
        })
      )

      it.effect("a producer's invalid send fails at once, appends nothing, and the producer goes on", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(1)
          const producer = yield* log.producer()
          const bad = yield* reasonTag(producer.send([rec(topic, 0, "ok"), rec(topic, 5, "bad partition")]))
          assert.strictEqual(bad, "UnknownPartition")
          const tooLarge = { ...rec(topic, 0, ""), value: new Uint8Array(cfg.maxRecordBytes * 2) }
          assert.strictEqual(yield* reasonTag(producer.send([tooLarge])), "RecordTooLarge")
          assert.deepStrictEqual(yield* Effect.flatten(producer.send([rec(topic, 0, "next")])), [0])
          yield* producer.flush
          assert.strictEqual(yield* producer.failure, undefined)
          assert.strictEqual((yield* log.offsets([{ topic, partition: 0 }]))[0]!.highwater, 1)
        })
      )

      it.effect("flush waits for every send; closing the producer waits too", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(3)
          yield* Effect.scoped(
            Effect.gen(function* () {
              const producer = yield* log.producer()
              for (let i = 0; i < 30; i++) yield* producer.send([rec(topic, i % 3, `a${i}`)])
              yield* producer.flush
              assert.deepStrictEqual(
                (yield* log.offsets(tps(topic, 3))).map((o) => o.highwater),
                [10, 10, 10]
              )
              for (let i = 0; i < 30; i++) yield* producer.send([rec(topic, i % 3, `b${i}`)])
            })
          )
          assert.deepStrictEqual(
            (yield* log.offsets(tps(topic, 3))).map((o) => o.highwater),
            [20, 20, 20]
          )
        })
      )

      if (options?.faults === true) {
        it.effect("after a failed append a producer appends nothing more; a new producer starts again", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const found = yield* Effect.serviceOption(Log.Faults)
            assert.isTrue(Option.isSome(found), "the suite was told the layer provides LogFaults")
            if (Option.isNone(found)) return
            const faults = found.value
            const topic = yield* freshTopic(1)
            const producer = yield* log.producer()
            yield* Effect.flatten(producer.send([rec(topic, 0, "before")]))
            yield* faults.failAppends(topic, 1)
            const failed = yield* producer.send([rec(topic, 0, "refused")])
            // Sent after the failure, before anyone looked at it: refused too, never appended after a gap.
            const after = yield* Effect.exit(Effect.flatten(producer.send([rec(topic, 0, "after")])))
            assert.strictEqual(yield* reasonTag(failed), "LogIoError")
            assert.isTrue(Exit.isFailure(after))
            assert.strictEqual((yield* producer.failure)?.reason._tag, "LogIoError")
            assert.strictEqual(yield* reasonTag(producer.flush), "LogIoError")
            const fresh = yield* log.producer()
            assert.deepStrictEqual(yield* Effect.flatten(fresh.send([rec(topic, 0, "again")])), [1])
            const c = yield* log.consumer()
            yield* c.assign([{ topic, partition: 0 }])
            assert.deepStrictEqual(valuesOf(yield* (yield* collect(c.batches, cfg)).records(2)), ["before", "again"])
          })
        )
      }

      it.effect("keys, values, headers, timestamps and null values round-trip", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(1)
          const binary = new Uint8Array([0, 255, 1, 128, 10, 13])
          const before = yield* Clock.currentTimeMillis
          yield* log.produceBatch([
            { topic, partition: 0, key: b("k1"), value: b("v1"), headers: [{ key: "h", value: b("hv") }] },
            { topic, partition: 0, key: b("k1"), value: null },
            { topic, partition: 0, key: null, value: binary, timestamp: 1_600_000_000_000 },
            { topic, partition: 0, key: binary, value: new Uint8Array(0) },
            {
              topic,
              partition: 0,
              key: b("k2"),
              value: b("v2"),
              headers: [
                { key: "a", value: b("1") },
                { key: "a", value: b("2") },
                { key: "b", value: new Uint8Array(0) }
              ]
            }
          ])
          const c = yield* log.consumer()
          yield* c.assign([{ topic, partition: 0 }])
          const rs = yield* (yield* collect(c.batches, cfg)).records(5)
          const after = yield* Clock.currentTimeMillis
          assert.deepStrictEqual(offsetsOf(rs), [0, 1, 2, 3, 4])
          assert.strictEqual(str(rs[0]!.key), "k1")
          assert.strictEqual(str(rs[0]!.value), "v1")
          assert.deepStrictEqual(
            rs[0]!.headers.map((h) => [h.key, str(h.value)]),
            [["h", "hv"]]
          )
          assert.strictEqual(str(rs[1]!.key), "k1")
          assert.isNull(rs[1]!.value, "a tombstone keeps its null value")
          assert.isNull(rs[2]!.key)
          assert.deepStrictEqual(Array.from(rs[2]!.value!), Array.from(binary))
          assert.strictEqual(rs[2]!.timestamp, 1_600_000_000_000)
          assert.deepStrictEqual(Array.from(rs[3]!.key!), Array.from(binary))
          assert.isNotNull(rs[3]!.value, "an empty value is not a tombstone")
          assert.strictEqual(rs[3]!.value!.byteLength, 0)
          assert.deepStrictEqual(
            rs[4]!.headers.map((h) => [h.key, str(h.value)]),
            [
              ["a", "1"],
              ["a", "2"],
              ["b", ""]
            ]
          )
          for (const r of [rs[0]!, rs[1]!, rs[3]!, rs[4]!]) {
            assert.isTrue(r.timestamp >= before - 1000 && r.timestamp <= after + 1000, `timestamp ${r.timestamp}`)
          }
          for (const r of rs) assert.deepStrictEqual([r.topic, r.partition], [topic, 0])
        })
      )

      // --- consumers ----------------------------------------------------------

      it.effect("a consumer reads everything in order from log start", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(1)
          const tp = { topic, partition: 0 }
          yield* log.produceBatch(Array.from({ length: 50 }, (_, i) => rec(topic, 0, `v${i}`, `k${i}`)))
          const c = yield* log.consumer()
          assert.deepStrictEqual(yield* c.assignment, [])
          yield* c.assign([tp])
          assert.deepStrictEqual(sortTps(yield* c.assignment), [tp])
          assert.strictEqual(yield* c.position(tp), 0)
          const collector = yield* collect(c.batches, cfg)
          const rs = yield* collector.records(50)
          assert.deepStrictEqual(
            offsetsOf(rs),
            Array.from({ length: 50 }, (_, i) => i)
          )
          assert.deepStrictEqual(
            valuesOf(rs),
            Array.from({ length: 50 }, (_, i) => `v${i}`)
          )
          assert.deepStrictEqual(
            rs.map((r) => str(r.key)),
            Array.from({ length: 50 }, (_, i) => `k${i}`)
          )
          assert.deepStrictEqual(yield* collector.quiet, [], "the stream waits at the end, it delivers nothing more")
          assert.strictEqual(yield* c.position(tp), 50)
          // The stream did not end: new records still arrive.
          yield* log.produce(rec(topic, 0, "late"))
          assert.deepStrictEqual(valuesOf(yield* collector.records(1)), ["late"])
        })
      )

      it.effect("seek to the middle reads from there", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(2)
          const tp = { topic, partition: 1 }
          yield* log.produceBatch(Array.from({ length: 10 }, (_, i) => rec(topic, 1, `v${i}`)))
          const c = yield* log.consumer()
          yield* c.assign([tp])
          yield* c.seek(tp, 6)
          assert.strictEqual(yield* c.position(tp), 6)
          const collector = yield* collect(c.batches, cfg)
          assert.deepStrictEqual(offsetsOf(yield* collector.records(4)), [6, 7, 8, 9])
          // Seeking back re-reads.
          yield* c.seek(tp, 2)
          assert.deepStrictEqual(offsetsOf(yield* collector.records(8)), [2, 3, 4, 5, 6, 7, 8, 9])
        })
      )

      it.effect("seek to the highwater waits for the next record", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(1)
          const tp = { topic, partition: 0 }
          yield* log.produceBatch([rec(topic, 0, "a"), rec(topic, 0, "b"), rec(topic, 0, "c")])
          const c = yield* log.consumer()
          yield* c.assign([tp])
          yield* c.seek(tp, 3)
          assert.strictEqual(yield* c.position(tp), 3)
          const collector = yield* collect(c.batches, cfg)
          assert.deepStrictEqual(yield* collector.quiet, [])
          assert.strictEqual(yield* log.produce(rec(topic, 0, "d")), 3)
          const rs = yield* collector.records(1)
          assert.deepStrictEqual(offsetsOf(rs), [3])
          assert.deepStrictEqual(valuesOf(rs), ["d"])
        })
      )

      it.effect("seek past the highwater fails with OffsetOutOfRange", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(1)
          const tp = { topic, partition: 0 }
          yield* log.produceBatch([rec(topic, 0, "a"), rec(topic, 0, "b")])
          const c = yield* log.consumer()
          yield* c.assign([tp])
          yield* expectOutOfRange(c, tp, 3, cfg)
          const c2 = yield* log.consumer()
          yield* c2.assign([tp])
          yield* expectOutOfRange(c2, tp, 1000, cfg)
        })
      )

      it.effect("seek and position of a partition not assigned fail with NotAssigned", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(2)
          const c = yield* log.consumer()
          yield* c.assign([{ topic, partition: 0 }])
          assert.strictEqual(yield* reasonTag(c.position({ topic, partition: 1 })), "NotAssigned")
          assert.strictEqual(yield* reasonTag(c.seek({ topic, partition: 1 }, 0)), "NotAssigned")
          const missing = yield* uniqueName("missing")
          assert.strictEqual(yield* reasonTag(c.assign([{ topic: missing, partition: 0 }])), "UnknownTopic")
          assert.strictEqual(yield* reasonTag(c.assign([{ topic, partition: 7 }])), "UnknownPartition")
        })
      )

      if (caps.deleteRecords) {
        it.effect("deleteRecords moves the log start; consumers start there and cannot seek below it", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const topic = yield* freshTopic(1)
            const tp = { topic, partition: 0 }
            yield* log.produceBatch(Array.from({ length: 10 }, (_, i) => rec(topic, 0, `v${i}`)))
            yield* log.deleteRecords(tp, 4)
            assert.deepStrictEqual(yield* log.offsets([tp]), [{ topic, partition: 0, logStart: 4, highwater: 10 }])
            // Deleting below the log start changes nothing; beyond the highwater is out of range.
            yield* log.deleteRecords(tp, 2)
            assert.deepStrictEqual(yield* log.offsets([tp]), [{ topic, partition: 0, logStart: 4, highwater: 10 }])
            assert.strictEqual(yield* reasonTag(log.deleteRecords(tp, 11)), "OffsetOutOfRange")
            assert.strictEqual(yield* reasonTag(log.deleteRecords({ topic, partition: 1 }, 0)), "UnknownPartition")

            const c = yield* log.consumer()
            yield* c.assign([tp])
            assert.strictEqual(yield* c.position(tp), 4)
            const collector = yield* collect(c.batches, cfg)
            const rs = yield* collector.records(6)
            assert.deepStrictEqual(offsetsOf(rs), [4, 5, 6, 7, 8, 9])
            assert.deepStrictEqual(valuesOf(rs), ["v4", "v5", "v6", "v7", "v8", "v9"])

            const c2 = yield* log.consumer()
            yield* c2.assign([tp])
            yield* expectOutOfRange(c2, tp, 3, cfg)
            const c3 = yield* log.consumer()
            yield* c3.assign([tp])
            yield* c3.seek(tp, 4)

            // Deleting up to the highwater empties the partition; offsets keep counting.
            yield* log.deleteRecords(tp, 10)
            assert.deepStrictEqual(yield* log.offsets([tp]), [{ topic, partition: 0, logStart: 10, highwater: 10 }])
            assert.strictEqual(yield* log.produce(rec(topic, 0, "v10")), 10)
            assert.deepStrictEqual(offsetsOf(yield* collector.records(1)), [10])
          })
        )

        it.effect("a consumer whose position fell below the log start fails with OffsetOutOfRange", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const topic = yield* freshTopic(1)
            const tp = { topic, partition: 0 }
            yield* log.produceBatch(Array.from({ length: 6 }, (_, i) => rec(topic, 0, `v${i}`)))
            const c = yield* log.consumer()
            yield* c.assign([tp])
            yield* c.pause([tp])
            yield* log.deleteRecords(tp, 3)
            yield* c.resume([tp])
            const collector = yield* collect(c.batches, cfg)
            const error = yield* collector.failure
            assert.strictEqual(error.reason._tag, "OffsetOutOfRange", "never a silent reset")
            assert.deepStrictEqual(collector.batches, [])
          })
        )
      }

      it.effect("pause stops delivery of a partition until resume", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(2)
          const [p0, p1] = [
            { topic, partition: 0 },
            { topic, partition: 1 }
          ]
          const c = yield* log.consumer()
          yield* c.assign([p0, p1])
          yield* c.pause([p0])
          assert.deepStrictEqual(sortTps(yield* c.paused), [p0])
          yield* log.produceBatch([rec(topic, 0, "a0"), rec(topic, 1, "b0"), rec(topic, 0, "a1")])
          const collector = yield* collect(c.batches, cfg)
          const first = yield* collector.records(1)
          assert.deepStrictEqual(valuesOf(first), ["b0"])
          assert.deepStrictEqual(yield* collector.quiet, [], "nothing of the paused partition arrives")
          assert.strictEqual(yield* c.position(p0), 0)
          yield* c.resume([p0])
          assert.deepStrictEqual(yield* c.paused, [])
          const rs = yield* collector.records(2)
          assert.deepStrictEqual(
            rs.map((r) => [r.partition, r.offset, str(r.value)]),
            [
              [0, 0, "a0"],
              [0, 1, "a1"]
            ]
          )
        })
      )

      it.effect("pause applies to a pull that is already waiting", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(1)
          const tp = { topic, partition: 0 }
          const c = yield* log.consumer()
          yield* c.assign([tp])
          const collector = yield* collect(c.batches, cfg)
          assert.deepStrictEqual(yield* collector.quiet, [])
          yield* c.pause([tp])
          yield* log.produce(rec(topic, 0, "while-paused"))
          assert.deepStrictEqual(yield* collector.quiet, [], "the waiting pull delivers nothing after pause")
          yield* c.resume([tp])
          assert.deepStrictEqual(valuesOf(yield* collector.records(1)), ["while-paused"])
        })
      )

      it.effect("unassign stops delivery and forgets the position", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(2)
          const [p0, p1] = [
            { topic, partition: 0 },
            { topic, partition: 1 }
          ]
          yield* log.produceBatch([rec(topic, 0, "a0"), rec(topic, 1, "b0")])
          const c = yield* log.consumer()
          yield* c.assign([p0, p1])
          const collector = yield* collect(c.batches, cfg)
          assert.strictEqual((yield* collector.records(2)).length, 2)
          yield* c.unassign([p0])
          assert.deepStrictEqual(sortTps(yield* c.assignment), [p1])
          assert.strictEqual(yield* reasonTag(c.position(p0)), "NotAssigned")
          yield* log.produceBatch([rec(topic, 0, "a1"), rec(topic, 1, "b1")])
          const rs = yield* collector.records(1)
          assert.deepStrictEqual(
            rs.map((r) => [r.partition, str(r.value)]),
            [[1, "b1"]]
          )
          assert.deepStrictEqual(yield* collector.quiet, [], "nothing of the unassigned partition arrives")
          // Assigned again, the partition starts over at its log start.
          yield* c.assign([p0])
          const again = yield* collector.records(2)
          assert.deepStrictEqual(
            again.map((r) => [r.partition, r.offset, str(r.value)]),
            [
              [0, 0, "a0"],
              [0, 1, "a1"]
            ]
          )
        })
      )

      it.effect("every one of 24 partitions is read completely", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const partitions = 24
          const perPartition = 15
          const topic = yield* freshTopic(partitions)
          const records: Array<Log.ProducerRecord> = []
          for (let i = 0; i < perPartition; i++) {
            for (let p = 0; p < partitions; p++) records.push(rec(topic, p, `p${p}-${i}`))
          }
          yield* log.produceBatch(records)
          const c = yield* log.consumer({ maxBatchRecords: 4 })
          yield* c.assign(tps(topic, partitions))
          const collector = yield* collect(c.batches, cfg, 4)
          const got = byPartition(yield* collector.records(partitions * perPartition))
          for (let p = 0; p < partitions; p++) {
            const rs = got.get(p) ?? []
            assert.deepStrictEqual(
              offsetsOf(rs),
              Array.from({ length: perPartition }, (_, i) => i),
              `partition ${p}`
            )
            assert.deepStrictEqual(
              valuesOf(rs),
              Array.from({ length: perPartition }, (_, i) => `p${p}-${i}`)
            )
          }
          assert.deepStrictEqual(yield* collector.quiet, [])
          const offsets = yield* log.offsets(tps(topic, partitions))
          for (const o of offsets) assert.strictEqual(o.highwater, perPartition)
        })
      )

      it.effect("batches respect maxBatchRecords and carry one partition each", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(2)
          yield* log.produceBatch(Array.from({ length: 60 }, (_, i) => rec(topic, i % 2, `v${i}`)))
          const c = yield* log.consumer({ maxBatchRecords: 7 })
          yield* c.assign(tps(topic, 2))
          const collector = yield* collect(c.batches, cfg, 7)
          const got = byPartition(yield* collector.records(60))
          assert.deepStrictEqual(
            offsetsOf(got.get(0)!),
            Array.from({ length: 30 }, (_, i) => i)
          )
          assert.deepStrictEqual(
            offsetsOf(got.get(1)!),
            Array.from({ length: 30 }, (_, i) => i)
          )
          assert.isAtLeast(collector.batches.length, 10, "30 records per partition need ≥ 5 batches each")
          for (const batch of collector.batches) assert.isAtMost(batch.records.length, 7)
          assert.strictEqual(yield* reasonTag(log.consumer({ maxBatchRecords: 0 })), "InvalidRequest")
        })
      )

      it.effect("a busy partition does not starve another", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(2)
          yield* log.produceBatch(Array.from({ length: 300 }, (_, i) => rec(topic, 0, `v${i}`)))
          yield* log.produce(rec(topic, 1, "lonely"))
          const c = yield* log.consumer({ maxBatchRecords: 10 })
          yield* c.assign(tps(topic, 2))
          const collector = yield* collect(c.batches, cfg, 10)
          const rs = yield* collector.records(301)
          const index = rs.findIndex((r) => r.partition === 1)
          assert.isAtLeast(index, 0)
          assert.isBelow(index, 300, "partition 1 waited until partition 0 was drained")
        })
      )

      it.effect("LogBatch.highwater is the partition's highwater at fetch time", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(1)
          const tp = { topic, partition: 0 }
          yield* log.produceBatch(Array.from({ length: 5 }, (_, i) => rec(topic, 0, `v${i}`)))
          const c = yield* log.consumer({ maxBatchRecords: 2 })
          yield* c.assign([tp])
          const collector = yield* collect(c.batches, cfg, 2)
          yield* collector.records(5)
          assert.isAtLeast(collector.batches.length, 3)
          for (const batch of collector.batches) assert.strictEqual(batch.highwater, 5)
          const seen = collector.batches.length
          yield* log.produceBatch([rec(topic, 0, "v5"), rec(topic, 0, "v6")])
          yield* collector.records(2)
          const later = collector.batches.slice(seen)
          assert.isAtLeast(later.length, 1)
          for (const batch of later) assert.strictEqual(batch.highwater, 7)
        })
      )

      it.effect("a consumer used after its scope closed fails with LogClosed", () =>
        Effect.gen(function* () {
          const log = yield* Log.Log
          const topic = yield* freshTopic(1)
          const tp = { topic, partition: 0 }
          const c = yield* Effect.scoped(
            Effect.gen(function* () {
              const c = yield* log.consumer()
              yield* c.assign([tp])
              return c
            })
          )
          assert.strictEqual(yield* reasonTag(c.assign([tp])), "LogClosed")
          assert.strictEqual(yield* reasonTag(c.seek(tp, 0)), "LogClosed")
          assert.strictEqual(yield* reasonTag(c.position(tp)), "LogClosed")
          const head = yield* c.batches.pipe(Stream.runHead, Effect.flip, Effect.timeoutOption(cfg.timeout))
          assert.isTrue(Option.isSome(head), "fetching from a closed consumer fails")
          if (Option.isSome(head)) assert.strictEqual(head.value.reason._tag, "LogClosed")
        })
      )

      if (caps.transactions && caps.groups) {
        // --- transactions ----------------------------------------------------------

        /** A lone member of a fresh group over a fresh source topic, once it holds the topic's partitions. */
        const soleMember = (partitions: number) =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const source = yield* freshTopic(partitions)
            const groupId = yield* uniqueName("g")
            const member = yield* log.groupConsumer({ groupId, topics: [source] })
            yield* eventually(
              Effect.map(member.assignment, (a) => sameTps(a, tps(source, partitions))),
              cfg.rebalanceTimeout,
              "the member holds the source partitions"
            )
            return { source, member, groupId }
          })

        it.effect("a transaction's records and source offsets become visible together at commit", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const out = yield* freshTopic(2)
            const { member, source } = yield* soleMember(1)
            const producer = yield* log.transactionalProducer({ transactionalId: yield* uniqueName("tx") })
            const reader = yield* log.consumer({ isolation: "read_committed" })
            yield* reader.assign(tps(out, 2))
            const collector = yield* collect(reader.batches, cfg)
            const acked = yield* producer.send([rec(out, 0, "a"), rec(out, 1, "b"), rec(out, 0, "c")])
            // Open: a read_committed reader sees none of it and the last stable offset has not moved.
            assert.deepStrictEqual(yield* collector.quiet, [])
            assert.deepStrictEqual(
              (yield* log.offsets(tps(out, 2), { isolation: "read_committed" })).map((o) => o.highwater),
              [0, 0]
            )
            assert.deepStrictEqual(yield* member.committed([{ topic: source, partition: 0 }]), [])
            yield* producer.commit({ group: member, offsets: [{ topic: source, partition: 0, offset: 7 }] })
            assert.deepStrictEqual(yield* acked, [0, 0, 1])
            const got = yield* collector.records(3)
            assert.deepStrictEqual(valuesOf(got).sort(), ["a", "b", "c"])
            assert.deepStrictEqual(yield* member.committed([{ topic: source, partition: 0 }]), [
              { topic: source, partition: 0, offset: 7 }
            ])
            const stable = yield* log.offsets(tps(out, 2), { isolation: "read_committed" })
            // Every committed record is below the last stable offset (Kafka's commit markers take offsets too).
            assert.isAtLeast(stable[0]!.highwater, 2)
            assert.isAtLeast(stable[1]!.highwater, 1)
          })
        )

        it.effect("an aborted transaction is never read at read_committed; the producer goes on after it", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const out = yield* freshTopic(1)
            const { member, source } = yield* soleMember(1)
            const producer = yield* log.transactionalProducer({ transactionalId: yield* uniqueName("tx") })
            const aborted = yield* producer.send([rec(out, 0, "dropped-1"), rec(out, 0, "dropped-2")])
            yield* producer.abort
            yield* Effect.ignore(aborted)
            yield* producer.send([rec(out, 0, "kept")])
            yield* producer.commit({ group: member, offsets: [{ topic: source, partition: 0, offset: 1 }] })
            const committed = yield* log.consumer({ isolation: "read_committed" })
            yield* committed.assign(tps(out, 1))
            const collector = yield* collect(committed.batches, cfg)
            assert.deepStrictEqual(valuesOf(yield* collector.records(1)), ["kept"])
            assert.deepStrictEqual(valuesOf(yield* collector.quiet), [])
          })
        )

        it.effect("a newer producer with the same transactional id fences the older one", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const out = yield* freshTopic(1)
            const { member, source } = yield* soleMember(1)
            const transactionalId = yield* uniqueName("tx")
            const older = yield* log.transactionalProducer({ transactionalId })
            yield* older.send([rec(out, 0, "zombie")])
            const newer = yield* log.transactionalProducer({ transactionalId })
            const refused = yield* reasonTag(
              older.commit({ group: member, offsets: [{ topic: source, partition: 0, offset: 1 }] })
            )
            assert.notStrictEqual(refused, "succeeded")
            yield* newer.send([rec(out, 0, "fresh")])
            yield* newer.commit({ group: member, offsets: [{ topic: source, partition: 0, offset: 2 }] })
            const c = yield* log.consumer({ isolation: "read_committed" })
            yield* c.assign(tps(out, 1))
            const collector = yield* collect(c.batches, cfg)
            assert.deepStrictEqual(valuesOf(yield* collector.records(1)), ["fresh"])
            assert.deepStrictEqual(valuesOf(yield* collector.quiet), [])
            assert.deepStrictEqual(yield* member.committed([{ topic: source, partition: 0 }]), [
              { topic: source, partition: 0, offset: 2 }
            ])
          })
        )

        it.effect("a transaction committing offsets for a member that left its group is refused", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const out = yield* freshTopic(1)
            const producer = yield* log.transactionalProducer({ transactionalId: yield* uniqueName("tx") })
            const left = yield* Effect.scoped(Effect.map(soleMember(1), ({ member, source }) => ({ member, source })))
            yield* producer.send([rec(out, 0, "late")])
            const refused = yield* reasonTag(
              producer.commit({ group: left.member, offsets: [{ topic: left.source, partition: 0, offset: 1 }] })
            )
            assert.notStrictEqual(refused, "succeeded")
            yield* producer.abort
            const c = yield* log.consumer({ isolation: "read_committed" })
            yield* c.assign(tps(out, 1))
            const collector = yield* collect(c.batches, cfg)
            assert.deepStrictEqual(valuesOf(yield* collector.quiet), [])
          })
        )

        it.effect("a transaction cannot commit offsets of a partition the group gave to another member", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const out = yield* freshTopic(1)
            const { member, source, groupId } = yield* soleMember(2)
            const producer = yield* log.transactionalProducer({ transactionalId: yield* uniqueName("tx") })
            yield* producer.send([rec(out, 0, "written-before-the-rebalance")])
            // A second member joins: the group takes one of the first member's partitions away and gives it over.
            const second = yield* log.groupConsumer({ groupId, topics: [source] })
            yield* eventually(
              Effect.zipWith(member.assignment, second.assignment, (a, b) => a.length === 1 && b.length === 1),
              cfg.rebalanceTimeout,
              "each member holds one partition"
            )
            const [given] = yield* second.assignment
            const refused = yield* reasonTag(
              producer.commit({
                group: member,
                offsets: [
                  { topic: source, partition: 0, offset: 5 },
                  { topic: source, partition: 1, offset: 5 }
                ]
              })
            )
            assert.notStrictEqual(refused, "succeeded", "the old owner committed offsets of a partition it lost")
            yield* producer.abort
            assert.deepStrictEqual(yield* second.committed([given!]), [])
            const c = yield* log.consumer({ isolation: "read_committed" })
            yield* c.assign(tps(out, 1))
            const collector = yield* collect(c.batches, cfg)
            assert.deepStrictEqual(valuesOf(yield* collector.quiet), [])
          })
        )
      }

      if (caps.groups) {
        // --- groups ---------------------------------------------------------------

        it.effect("a lone group member gets every partition and reads from log start", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const topic = yield* freshTopic(3)
            const groupId = yield* uniqueName("g")
            yield* log.produceBatch(Array.from({ length: 12 }, (_, i) => rec(topic, i % 3, `v${i}`)))
            const m = yield* log.groupConsumer({ groupId, topics: [topic] })
            const events = yield* recordEvents(m)
            const collector = yield* collect(m.batches, cfg)
            const all = tps(topic, 3)
            yield* eventually(
              Effect.map(m.assignment, (a) => sameTps(a, all) && sameTps(events.held.values(), all)),
              cfg.rebalanceTimeout,
              "the member holds every partition"
            )
            assert.deepStrictEqual(events.problems, [])
            assert.strictEqual(events.events[0]?._tag, "Assigned")
            const got = byPartition(yield* collector.records(12))
            for (let p = 0; p < 3; p++) assert.deepStrictEqual(offsetsOf(got.get(p)!), [0, 1, 2, 3])
            assert.deepStrictEqual(valuesOf(got.get(1)!), ["v1", "v4", "v7", "v10"])
            yield* log.produce(rec(topic, 2, "new"))
            assert.deepStrictEqual(valuesOf(yield* collector.records(1)), ["new"])
          })
        )

        it.effect("a group member seeks an assigned partition back and reads again from there", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const topic = yield* freshTopic(1)
            const groupId = yield* uniqueName("g")
            const tp = { topic, partition: 0 }
            yield* log.produceBatch(Array.from({ length: 8 }, (_, i) => rec(topic, 0, `v${i}`)))
            const m = yield* log.groupConsumer({ groupId, topics: [topic] })
            yield* eventually(
              Effect.map(m.assignment, (a) => sameTps(a, [tp])),
              cfg.rebalanceTimeout,
              "the member holds the partition"
            )
            const collector = yield* collect(m.batches, cfg)
            assert.deepStrictEqual(offsetsOf(yield* collector.records(8)), [0, 1, 2, 3, 4, 5, 6, 7])
            assert.strictEqual(yield* m.position(tp), 8)
            yield* m.seek(tp, 3)
            assert.deepStrictEqual(valuesOf(yield* collector.records(5)), ["v3", "v4", "v5", "v6", "v7"])
            assert.strictEqual(yield* m.position(tp), 8)
          })
        )

        it.effect("a second member splits the partitions disjointly; events replay to each assignment", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const partitions = 6
            const topic = yield* freshTopic(partitions)
            const groupId = yield* uniqueName("g")
            const all = tps(topic, partitions)
            const m1 = yield* log.groupConsumer({ groupId, topics: [topic] })
            const e1 = yield* recordEvents(m1)
            const c1 = yield* collect(m1.batches, cfg)
            yield* eventually(
              Effect.map(m1.assignment, (a) => sameTps(a, all)),
              cfg.rebalanceTimeout,
              "m1 holds all"
            )
            const m2 = yield* log.groupConsumer({ groupId, topics: [topic] })
            const e2 = yield* recordEvents(m2)
            const c2 = yield* collect(m2.batches, cfg)
            yield* eventually(
              Effect.gen(function* () {
                const a1 = yield* m1.assignment
                const a2 = yield* m2.assignment
                const k1 = new Set(keysOf(a1))
                return (
                  a1.length > 0 &&
                  a2.length > 0 &&
                  a2.every((tp) => !k1.has(Models.tpKey(tp))) &&
                  sameTps([...a1, ...a2], all) &&
                  sameTps(e1.held.values(), a1) &&
                  sameTps(e2.held.values(), a2)
                )
              }),
              cfg.rebalanceTimeout,
              "the two members split the partitions and their events replay to their assignments"
            )
            assert.deepStrictEqual(e1.problems, [], "m1's events replay in order")
            assert.deepStrictEqual(e2.problems, [], "m2's events replay in order")
            assert.strictEqual(e1.events[0]?._tag, "Assigned")
            const firstRevoke = e1.events.findIndex((e) => e._tag === "Revoked" && e.partitions.length > 0)
            assert.isAbove(firstRevoke, 0, "m1 was told which partitions it lost")

            // Each member now receives exactly the records of its own partitions.
            const a1 = yield* m1.assignment
            const a2 = yield* m2.assignment
            yield* log.produceBatch(all.map((tp) => rec(topic, tp.partition, `p${tp.partition}`)))
            const r1 = yield* c1.records(a1.length)
            const r2 = yield* c2.records(a2.length)
            assert.deepStrictEqual(r1.map((r) => r.partition).sort(), a1.map((tp) => tp.partition).sort())
            assert.deepStrictEqual(r2.map((r) => r.partition).sort(), a2.map((tp) => tp.partition).sort())
            assert.deepStrictEqual(yield* c1.quiet, [])
          })
        )

        it.effect("commit and committed round-trip per group", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const topic = yield* freshTopic(3)
            yield* log.produceBatch(Array.from({ length: 30 }, (_, i) => rec(topic, i % 3, `v${i}`)))
            const groupId = yield* uniqueName("g")
            const otherGroup = yield* uniqueName("g")
            const m = yield* log.groupConsumer({ groupId, topics: [topic] })
            yield* eventually(
              Effect.map(m.assignment, (a) => a.length === 3),
              cfg.rebalanceTimeout,
              "m holds all"
            )
            assert.deepStrictEqual(yield* m.committed(tps(topic, 3)), [])
            yield* m.commit([
              { topic, partition: 0, offset: 5 },
              { topic, partition: 1, offset: 7 }
            ])
            const got = yield* m.committed(tps(topic, 3))
            assert.deepStrictEqual(sortTps(got).map(Models.tpKey), [
              Models.tpKey({ topic, partition: 0 }),
              Models.tpKey({ topic, partition: 1 })
            ])
            assert.deepStrictEqual(
              [...got].sort(Models.tpCompare).map((o) => [o.partition, o.offset]),
              [
                [0, 5],
                [1, 7]
              ]
            )
            // One partition asked alone, and partitions asked out of order, get their own offsets.
            assert.deepStrictEqual(
              (yield* m.committed([{ topic, partition: 1 }])).map((o) => [o.partition, o.offset]),
              [[1, 7]]
            )
            assert.deepStrictEqual(
              [
                ...(yield* m.committed([
                  { topic, partition: 2 },
                  { topic, partition: 1 },
                  { topic, partition: 0 }
                ]))
              ]
                .sort(Models.tpCompare)
                .map((o) => [o.partition, o.offset]),
              [
                [0, 5],
                [1, 7]
              ]
            )
            yield* m.commit([{ topic, partition: 0, offset: 9 }])
            const again = yield* m.committed([{ topic, partition: 0 }])
            assert.deepStrictEqual(
              again.map((o) => [o.topic, o.partition, o.offset]),
              [[topic, 0, 9]]
            )
            const other = yield* log.groupConsumer({ groupId: otherGroup, topics: [topic] })
            assert.deepStrictEqual(yield* other.committed(tps(topic, 3)), [], "another group has its own offsets")
            const missing = yield* uniqueName("missing")
            assert.strictEqual(yield* reasonTag(m.committed([{ topic: missing, partition: 0 }])), "UnknownTopic")
          })
        )

        it.effect("a newly assigned partition starts at the group's committed offset, else at log start", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const topic = yield* freshTopic(2)
            const groupId = yield* uniqueName("g")
            yield* log.produceBatch(Array.from({ length: 10 }, (_, i) => rec(topic, i % 2, `v${i}`)))
            yield* Effect.scoped(
              Effect.gen(function* () {
                const first = yield* log.groupConsumer({ groupId, topics: [topic] })
                yield* eventually(
                  Effect.map(first.assignment, (a) => a.length === 2),
                  cfg.rebalanceTimeout,
                  "joined"
                )
                yield* first.commit([{ topic, partition: 0, offset: 3 }])
              })
            )
            const m = yield* log.groupConsumer({ groupId, topics: [topic] })
            const collector = yield* collect(m.batches, cfg)
            const got = byPartition(yield* collector.records(2 + 5))
            assert.deepStrictEqual(offsetsOf(got.get(0)!), [3, 4])
            assert.deepStrictEqual(offsetsOf(got.get(1)!), [0, 1, 2, 3, 4])
            assert.deepStrictEqual(yield* collector.quiet, [])
          })
        )

        it.effect("a member leaving gives its partitions back", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const partitions = 4
            const topic = yield* freshTopic(partitions)
            const groupId = yield* uniqueName("g")
            const all = tps(topic, partitions)
            const m1 = yield* log.groupConsumer({ groupId, topics: [topic] })
            const e1 = yield* recordEvents(m1)
            const c1 = yield* collect(m1.batches, cfg)
            yield* Effect.scoped(
              Effect.gen(function* () {
                const m2 = yield* log.groupConsumer({ groupId, topics: [topic] })
                yield* recordEvents(m2)
                yield* collect(m2.batches, cfg)
                yield* eventually(
                  Effect.gen(function* () {
                    const a1 = yield* m1.assignment
                    const a2 = yield* m2.assignment
                    return a1.length > 0 && a2.length > 0 && sameTps([...a1, ...a2], all)
                  }),
                  cfg.rebalanceTimeout,
                  "the two members split the partitions"
                )
              })
            )
            yield* eventually(
              Effect.map(m1.assignment, (a) => sameTps(a, all) && sameTps(e1.held.values(), all)),
              cfg.rebalanceTimeout,
              "m1 holds every partition again"
            )
            assert.deepStrictEqual(e1.problems, [])
            yield* log.produceBatch(all.map((tp) => rec(topic, tp.partition, `p${tp.partition}`)))
            const rs = yield* c1.records(partitions)
            assert.deepStrictEqual(rs.map((r) => r.partition).sort(), [0, 1, 2, 3])
          })
        )

        it.effect(
          "membership names every member, itself included, with the partitions it holds; a leaver drops out",
          () =>
            Effect.gen(function* () {
              const log = yield* Log.Log
              const partitions = 4
              const topic = yield* freshTopic(partitions)
              const groupId = yield* uniqueName("g")
              const all = tps(topic, partitions)
              const m1 = yield* log.groupConsumer({ groupId, topics: [topic] })
              const e1 = yield* recordEvents(m1)
              yield* Effect.scoped(
                Effect.gen(function* () {
                  const m2 = yield* log.groupConsumer({ groupId, topics: [topic] })
                  const e2 = yield* recordEvents(m2)
                  yield* eventually(
                    Effect.gen(function* () {
                      const a1 = yield* m1.assignment
                      const a2 = yield* m2.assignment
                      return (
                        a1.length > 0 &&
                        a2.length > 0 &&
                        sameTps([...a1, ...a2], all) &&
                        sameTps(e1.held.values(), a1) &&
                        sameTps(e2.held.values(), a2)
                      )
                    }),
                    cfg.rebalanceTimeout,
                    "the two members split the partitions and their events replay to their assignments"
                  )
                  // The group's view settles with the members' own (a coordinator may still be finishing the round).
                  let seen:
                    | {
                        v1: Log.GroupMembership
                        v2: Log.GroupMembership
                        a1: ReadonlyArray<Models.TopicPartition>
                        a2: ReadonlyArray<Models.TopicPartition>
                      }
                    | undefined
                  yield* eventually(
                    Effect.gen(function* () {
                      const v1 = yield* m1.membership
                      const v2 = yield* m2.membership
                      const a1 = yield* m1.assignment
                      const a2 = yield* m2.assignment
                      seen = { v1, v2, a1, a2 }
                      const agrees = (v: Log.GroupMembership) =>
                        v.members.length === 2 &&
                        sameTps(v.members.find((m) => m.memberId === v1.memberId)?.partitions ?? [], a1) &&
                        sameTps(v.members.find((m) => m.memberId === v2.memberId)?.partitions ?? [], a2)
                      return agrees(v1) && agrees(v2)
                    }),
                    cfg.rebalanceTimeout,
                    "both members' membership shows both members with their own assignments"
                  )
                  const { a1, a2, v1, v2 } = seen!
                  assert.notStrictEqual(v1.memberId, v2.memberId, "each member has its own id")
                  const ids = [v1.memberId, v2.memberId].sort()
                  for (const v of [v1, v2]) {
                    assert.deepStrictEqual(
                      v.members.map((m) => m.memberId),
                      ids,
                      "every member is named, sorted by id"
                    )
                    const held = v.members.flatMap((m) => m.partitions)
                    assert.strictEqual(held.length, partitions, "every partition is held once")
                    assert.isTrue(sameTps(held, all), "the members hold every partition")
                  }
                  assert.deepStrictEqual(
                    keysOf(v1.members.find((m) => m.memberId === v1.memberId)!.partitions),
                    keysOf(a1),
                    "m1's entry is its own assignment"
                  )
                  assert.deepStrictEqual(
                    keysOf(v2.members.find((m) => m.memberId === v2.memberId)!.partitions),
                    keysOf(a2),
                    "m2's entry is its own assignment"
                  )
                  assert.deepStrictEqual(v1.members, v2.members, "both members see the same group")
                })
              )
              // m2 left: m1 eventually is the group's only member, holding every partition.
              yield* eventually(
                Effect.gen(function* () {
                  const v = yield* m1.membership
                  return (
                    v.members.length === 1 &&
                    v.members[0]!.memberId === v.memberId &&
                    sameTps(v.members[0]!.partitions, all)
                  )
                }),
                cfg.rebalanceTimeout,
                "m1's membership shows only itself, with every partition"
              )
            })
        )

        it.effect("a group member's pause stops delivery until resume", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const topic = yield* freshTopic(2)
            const groupId = yield* uniqueName("g")
            const m = yield* log.groupConsumer({ groupId, topics: [topic] })
            yield* eventually(
              Effect.map(m.assignment, (a) => a.length === 2),
              cfg.rebalanceTimeout,
              "m holds both"
            )
            const collector = yield* collect(m.batches, cfg)
            yield* m.pause([{ topic, partition: 0 }])
            yield* log.produceBatch([rec(topic, 0, "a"), rec(topic, 1, "b")])
            assert.deepStrictEqual(valuesOf(yield* collector.records(1)), ["b"])
            assert.deepStrictEqual(yield* collector.quiet, [])
            yield* m.resume([{ topic, partition: 0 }])
            assert.deepStrictEqual(valuesOf(yield* collector.records(1)), ["a"])
          })
        )

        it.effect("a group member used after its scope closed fails with LogClosed", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const topic = yield* freshTopic(1)
            const groupId = yield* uniqueName("g")
            const m = yield* Effect.scoped(log.groupConsumer({ groupId, topics: [topic] }))
            assert.strictEqual(yield* reasonTag(m.commit([{ topic, partition: 0, offset: 0 }])), "LogClosed")
            assert.strictEqual(yield* reasonTag(m.membership), "LogClosed")
            const head = yield* m.batches.pipe(Stream.runHead, Effect.exit, Effect.timeoutOption(cfg.timeout))
            assert.isTrue(Option.isSome(head), "fetching from a closed member does not hang")
            if (Option.isSome(head)) {
              const exit = head.value
              assert.isTrue(Exit.isFailure(exit), "fetching from a closed member fails")
              if (Exit.isFailure(exit)) {
                const error = Cause.findErrorOption(exit.cause)
                assert.isTrue(Option.isSome(error) && error.value.reason._tag === "LogClosed")
              }
            }
          })
        )
      }

      // --- what the backend does not offer ------------------------------------------

      if (!caps.deleteRecords || !caps.transactions || !caps.groups) {
        it.effect("an operation the backend declares it does not offer fails with Unsupported naming it", () =>
          Effect.gen(function* () {
            const log = yield* Log.Log
            const topic = yield* freshTopic(1)
            if (!caps.deleteRecords) {
              assert.strictEqual(yield* reasonTag(log.deleteRecords({ topic, partition: 0 }, 0)), "Unsupported")
            }
            if (!caps.transactions) {
              const tx = log.transactionalProducer({ transactionalId: yield* uniqueName("tx") })
              assert.strictEqual(yield* reasonTag(Effect.scoped(tx)), "Unsupported")
            }
            if (!caps.groups) {
              const member = log.groupConsumer({ groupId: yield* uniqueName("g"), topics: [topic] })
              assert.strictEqual(yield* reasonTag(Effect.scoped(member)), "Unsupported")
            }
            // The log goes on: nothing was refused but what it does not offer.
            assert.strictEqual(yield* log.produce(rec(topic, 0, "v")), 0)
          })
        )
      }
    })
  })
}
