import { assert, describe, it } from "@effect/vitest"
import { LogConformance } from "@strata/core/testing"
import { Admin, compressionsAlgorithms, Producer } from "@platformatic/kafka"
import { KafkaLog } from "@strata/kafka"
import { Effect, Schedule, Stream } from "effect"
import { Log } from "@strata/core"
import { inject } from "vitest"

LogConformance.suite("kafka", KafkaLog.layer({ brokers: [inject("kafka")] }))

describe("KafkaLog start-up", () => {
  it.live("unreachable brokers give BrokerUnreachable naming them, after the configured attempts", () =>
    Effect.gen(function* () {
      const e = yield* Effect.flip(Effect.scoped(KafkaLog.make({ brokers: ["127.0.0.1:1"], connectAttempts: 2 })))
      assert.strictEqual(e.reason._tag, "BrokerUnreachable")
      assert.include(e.message, "127.0.0.1:1")
      assert.isTrue(e.retryable)
    })
  )

  it.live("invalid options are rejected before connecting, naming the field", () =>
    Effect.gen(function* () {
      const e = yield* Effect.flip(Effect.scoped(KafkaLog.make({ brokers: ["no-port"] })))
      assert.strictEqual(e.reason._tag, "InvalidRequest")
      assert.include(e.message, "brokers")
      const fetch = yield* Effect.flip(
        Effect.scoped(KafkaLog.make({ brokers: ["127.0.0.1:9092"], fetchPartitionMaxBytes: 0 }))
      )
      assert.strictEqual(fetch.reason._tag, "InvalidRequest")
      assert.include(fetch.message, "fetchPartitionMaxBytes")
    })
  )
})

describe("KafkaLog topics", () => {
  // Right after a broker start, a produce following CreateTopics failed with "unknown topic" for 8 of 40 new
  // topics: the controller answers before the brokers know the topic. ensureTopic now waits until they do.
  it.live("ensureTopic returns once every partition of a new topic has a leader and takes writes", () =>
    Effect.gen(function* () {
      const log = yield* Log
      const stamp = Date.now().toString(36)
      const topics = Array.from({ length: 4 }, (_, i) => `ready-${stamp}-${i}`)
      yield* Effect.forEach(topics, (topic) => log.ensureTopic({ topic, partitions: 24 }), {
        concurrency: "unbounded",
        discard: true
      })
      const admin = yield* Effect.acquireRelease(
        Effect.sync(() => new Admin({ clientId: "strata-test-ready", bootstrapBrokers: [inject("kafka")] })),
        (a) => Effect.promise(() => a.close())
      )
      const md = yield* Effect.promise(() => admin.metadata({ topics, forceUpdate: true }))
      for (const topic of topics) {
        const t = md.topics.get(topic)
        assert.strictEqual(t?.partitionsCount, 24, topic)
        assert.deepStrictEqual(
          t!.partitions.flatMap((p, i) => (p.leader < 0 ? [i] : [])),
          [],
          `${topic}: partitions without a leader`
        )
      }
      const enc = new TextEncoder()
      const offsets = yield* log.produceBatch(
        topics.flatMap((topic) =>
          Array.from({ length: 24 }, (_, partition) => ({ topic, partition, key: null, value: enc.encode("x") }))
        ),
        { acks: "all" }
      )
      assert.deepStrictEqual(new Set(offsets), new Set([0]), "every partition's first record is at offset 0")
      // An existing topic is found again; another partition count is a mismatch naming both.
      yield* log.ensureTopic({ topic: topics[0]!, partitions: 24 })
      const e = yield* Effect.flip(log.ensureTopic({ topic: topics[0]!, partitions: 12 }))
      assert.strictEqual(e.reason._tag, "TopicMismatch")
    }).pipe(Effect.scoped, Effect.provide(KafkaLog.layer({ brokers: [inject("kafka")] })))
  )
})

describe("KafkaLog produce batching", () => {
  it.live("concurrent produceBatch calls share requests, each call's records stay together and in order", () =>
    Effect.gen(function* () {
      const log = yield* Log
      const topic = `batching-${Date.now().toString(36)}`
      yield* log.ensureTopic({ topic, partitions: 2 })
      const enc = new TextEncoder()
      const calls = Array.from({ length: 40 }, (_, call) =>
        Array.from({ length: 3 }, (_, i) => ({
          topic,
          partition: call % 2,
          key: null,
          value: enc.encode(`${call}:${i}`)
        }))
      )
      const results = yield* Effect.forEach(calls, (records) => log.produceBatch(records, { acks: "all" }), {
        concurrency: "unbounded"
      })
      const seen = new Set<string>()
      for (const [call, offsets] of results.entries()) {
        assert.strictEqual(offsets.length, 3)
        // A call's records are consecutive in their partition: never interleaved with another call's.
        assert.deepStrictEqual(offsets, [offsets[0]!, offsets[0]! + 1, offsets[0]! + 2], `call ${call}`)
        for (const o of offsets) seen.add(`${call % 2}/${o}`)
      }
      assert.strictEqual(seen.size, 120, "every record has its own offset")
      // A bad record fails only its own call.
      const [bad, good] = yield* Effect.all(
        [
          Effect.flip(log.produceBatch([{ topic, partition: 9, key: null, value: enc.encode("x") }])),
          log.produceBatch([{ topic, partition: 0, key: null, value: enc.encode("y") }])
        ],
        { concurrency: "unbounded" }
      )
      assert.strictEqual(bad.reason._tag, "UnknownPartition")
      assert.strictEqual(good.length, 1)
    }).pipe(Effect.scoped, Effect.provide(KafkaLog.layer({ brokers: [inject("kafka")] })))
  )
})

describe("KafkaLog consumer decoding", () => {
  it.live("reads record batches written in every codec, with null keys and values, headers and timestamps", () =>
    Effect.gen(function* () {
      const log = yield* Log
      const topic = `codecs-${Date.now().toString(36)}`
      yield* log.ensureTopic({ topic, partitions: 1 })
      const codecs = (["none", "gzip", "snappy", "lz4", "zstd"] as const).filter(
        (c) => compressionsAlgorithms[c].available
      )
      // One batch per codec, written by the client itself (the adapter's producer does not compress).
      const producer = new Producer({ clientId: "codecs-test", bootstrapBrokers: [inject("kafka")] })
      yield* Effect.addFinalizer(() => Effect.promise(() => producer.close().catch(() => undefined)))
      const expected: Array<string> = []
      for (const [c, compression] of codecs.entries()) {
        const messages = Array.from({ length: 50 }, (_, i) => ({
          topic,
          partition: 0,
          ...(i % 7 === 0 ? {} : { key: Buffer.from(`${compression}-${i}`) }),
          value: (i % 11 === 0 ? null : Buffer.from(`value ${i} `.repeat(i))) as Buffer,
          headers: new Map([[Buffer.from("codec"), Buffer.from(compression)]]),
          timestamp: BigInt(1_700_000_000_000 + c * 1000 + i)
        }))
        yield* Effect.promise(() => producer.send({ messages, compression, acks: -1 }))
        for (const [i, m] of messages.entries()) {
          expected.push(
            [
              c * 50 + i,
              m.key?.toString() ?? "null",
              m.value === null ? "null" : m.value.toString(),
              `codec=${compression}`,
              Number(m.timestamp)
            ].join("|")
          )
        }
      }
      const consumer = yield* log.consumer()
      yield* consumer.assign([{ topic, partition: 0 }])
      yield* consumer.seek({ topic, partition: 0 }, 0)
      const dec = new TextDecoder()
      const seen: Array<string> = []
      let received = 0
      yield* consumer.batches.pipe(
        Stream.takeUntil((b) => {
          received += b.records.length
          return received >= expected.length
        }),
        Stream.runForEach((b) =>
          Effect.sync(() => {
            for (const r of b.records) {
              seen.push(
                [
                  r.offset,
                  r.key === null ? "null" : dec.decode(r.key),
                  r.value === null ? "null" : dec.decode(r.value),
                  r.headers.map((h) => `${h.key}=${dec.decode(h.value)}`).join(","),
                  r.timestamp
                ].join("|")
              )
            }
          })
        )
      )
      assert.deepStrictEqual(seen, expected)
    }).pipe(Effect.scoped, Effect.provide(KafkaLog.layer({ brokers: [inject("kafka")] })))
  )
  it.live("partitions of one fetch take turns, a chunk of at most maxBatchRecords each, each in offset order", () =>
    Effect.gen(function* () {
      const log = yield* Log
      const topic = `turns-${Date.now().toString(36)}`
      yield* log.ensureTopic({ topic, partitions: 2 })
      const enc = new TextEncoder()
      for (const partition of [0, 1]) {
        const records = Array.from({ length: 300 }, (_, i) => ({
          topic,
          partition,
          key: enc.encode(`k${i}`),
          value: enc.encode(`${partition}:${i}`)
        }))
        yield* log.produceBatch(records, { acks: "all" })
      }
      const consumer = yield* log.consumer({ maxBatchRecords: 40 })
      const tps = [0, 1].map((partition) => ({ topic, partition }))
      yield* consumer.assign(tps)
      for (const tp of tps) yield* consumer.seek(tp, 0)
      let received = 0
      const batches = yield* consumer.batches.pipe(
        Stream.takeUntil((b) => {
          received += b.records.length
          return received >= 600
        }),
        Stream.runCollect
      )
      const list = [...batches]
      assert.isTrue(list.every((b) => b.records.length > 0 && b.records.length <= 40))
      // Both partitions' records came in the first fetch: neither waits for the other to be drained.
      const first = list.slice(0, 6).map((b) => b.partition)
      assert.deepStrictEqual(first, [first[0], 1 - first[0]!, first[0], 1 - first[0]!, first[0], 1 - first[0]!])
      for (const partition of [0, 1]) {
        const offsets = list.filter((b) => b.partition === partition).flatMap((b) => b.records.map((r) => r.offset))
        assert.deepStrictEqual(
          offsets,
          Array.from({ length: 300 }, (_, i) => i)
        )
      }
    }).pipe(Effect.scoped, Effect.provide(KafkaLog.layer({ brokers: [inject("kafka")] })))
  )
})

describe("KafkaLog producer", () => {
  // A real broker failure: the topic is deleted under a producer that already knows it, so the broker refuses
  // the next request after the client's retries. Everything sent after it must fail unsent, never be appended.
  it.live(
    "a failed request stops the producer: later sends fail and nothing after the gap is appended",
    () =>
      Effect.gen(function* () {
        const log = yield* Log
        const topic = `sticky-${Date.now().toString(36)}`
        const healthy = `${topic}-healthy`
        yield* log.ensureTopic({ topic, partitions: 1 })
        yield* log.ensureTopic({ topic: healthy, partitions: 1 })
        const producer = yield* log.producer()
        const value = new TextEncoder().encode("v")
        yield* Effect.flatten(producer.send([{ topic, partition: 0, key: null, value }]))
        const admin = yield* Effect.acquireRelease(
          Effect.sync(() => new Admin({ clientId: "strata-test-sticky", bootstrapBrokers: [inject("kafka")] })),
          (a) => Effect.promise(() => a.close())
        )
        yield* Effect.promise(() => admin.deleteTopics({ topics: [topic] }))
        // The broker applies a deletion after answering: wait until its metadata no longer lists the topic.
        yield* Effect.repeat(
          Effect.promise(() =>
            admin.metadata({ topics: [topic], forceUpdate: true }).then(
              (md) => md.topics.has(topic),
              () => false
            )
          ),
          { while: (listed) => listed, schedule: Schedule.spaced("50 millis"), times: 200 }
        )
        const first = yield* producer.send([{ topic, partition: 0, key: null, value }])
        // Let the sender put the first call in a request of its own (one request covering both topics could append the
        // healthy topic's record: a produce request is not atomic across partitions).
        yield* Effect.yieldNow
        // Queued behind the failing request, to a topic that takes writes: it must fail unsent.
        const second = yield* Effect.exit(
          Effect.flatten(producer.send([{ topic: healthy, partition: 0, key: null, value }]))
        )
        const failed = yield* Effect.flip(first)
        assert.isTrue(second._tag === "Failure", "a send queued behind the failed one fails too")
        assert.strictEqual((yield* producer.failure)?.message, failed.message)
        assert.strictEqual((yield* Effect.flip(producer.flush)).message, failed.message)
        assert.strictEqual(
          (yield* Effect.flip(producer.send([{ topic: healthy, partition: 0, key: null, value }]))).message,
          failed.message
        )
        assert.strictEqual((yield* log.offsets([{ topic: healthy, partition: 0 }]))[0]!.highwater, 0)
        // A new producer writes again.
        const fresh = yield* log.producer()
        assert.deepStrictEqual(
          yield* Effect.flatten(fresh.send([{ topic: healthy, partition: 0, key: null, value }])),
          [0]
        )
      }).pipe(Effect.scoped, Effect.provide(KafkaLog.layer({ brokers: [inject("kafka")] }))),
    60_000
  )
})
