import { Log } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { LogConformance } from "@strata/core/testing"
import { Admin, compressionsAlgorithms, Producer } from "@platformatic/kafka"
import { KafkaLog } from "@strata/kafka"
import { Effect, Exit, Schedule, Schema, Scope, Stream } from "effect"
import { inject } from "vitest"
import { httpServer, kafkaProxy, silentServer } from "./fakeBrokers.js"

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

  // A port out of range (or 0) used to pass validation and reach the client.
  it.live(
    "a broker address with a bad port or no host fails make with InvalidRequest naming the option and value",
    () =>
      Effect.gen(function* () {
        for (const bad of [
          "127.0.0.1:99999",
          "127.0.0.1:0",
          "127.0.0.1:65536",
          "127.0.0.1:port",
          ":9092",
          "127.0.0.1",
          "a b:9092"
        ]) {
          const e = yield* Effect.flip(Effect.scoped(KafkaLog.make({ brokers: [bad], connectAttempts: 1 }))).pipe(
            Effect.timeoutOrElse({ duration: "5 seconds", orElse: () => Effect.die(`${bad}: make did not fail`) })
          )
          assert.strictEqual(e.reason._tag, "InvalidRequest", bad)
          assert.include(e.message, "brokers", bad)
          assert.include(e.message, JSON.stringify(bad), bad)
        }
        const valid = Schema.decodeUnknownExit(KafkaLog.KafkaLogOptions)
        for (const good of ["127.0.0.1:9092", "kafka-1.example.com:65535", "broker_2:1", "[::1]:9092"]) {
          assert.isTrue(Exit.isSuccess(valid({ brokers: [good] })), good)
        }
      })
  )
})

/** Runs `effect`, failing the test (instead of hanging) when it takes longer than `ms`; gives how long it took. */
const within = <A, E>(ms: number, what: string, effect: Effect.Effect<A, E>) =>
  Effect.gen(function* () {
    const start = Date.now()
    const value = yield* effect.pipe(
      Effect.timeoutOrElse({ duration: ms, orElse: () => Effect.die(`${what}: still waiting after ${ms} ms`) })
    )
    return [value, Date.now() - start] as const
  })

describe("KafkaLog on a port that is not Kafka", () => {
  // Each used to wait for minutes (the client's own 30 s request timeout, retried 4 × 4 times) whatever
  // requestTimeout said; a garbage answer gave no hint that the address was wrong.
  const T = 500
  /** A program on the log's layer asking for offsets: the failure, and how long it took to come. */
  const offsetsVia = (broker: string) =>
    within(
      15_000,
      broker,
      Effect.flip(
        Effect.gen(function* () {
          const log = yield* Log.Log
          return yield* log.offsets([{ topic: "t", partition: 0 }])
        }).pipe(Effect.provide(KafkaLog.layer({ brokers: [broker], connectAttempts: 1, requestTimeout: T })))
      )
    )
  const assertNoAnswer = (e: Log.LogError, ms: number, address: string) => {
    assert.strictEqual(e.reason._tag, "BrokerUnreachable", e.message)
    assert.include(e.message, `no answer from ${address} in ${T} ms`)
    assert.isBelow(ms, T + 1500, "fails within the request timeout")
  }
  const assertNotKafka = (e: Log.LogError, ms: number, address: string) => {
    assert.strictEqual(e.reason._tag, "InvalidRequest", e.message)
    assert.include(e.message, `${address} is not a Kafka broker`)
    assert.isBelow(ms, T + 1500)
  }

  it.live("etcd's port (HTTP/2, it never answers a Kafka request) fails within the request timeout, naming it", () =>
    Effect.gen(function* () {
      const [e, ms] = yield* offsetsVia(inject("etcd"))
      assertNoAnswer(e, ms, inject("etcd"))
    })
  )

  it.live("a server that accepts and never answers fails with 'no answer from … in N ms'", () =>
    Effect.gen(function* () {
      const server = yield* silentServer
      const [e, ms] = yield* offsetsVia(server.address)
      assertNoAnswer(e, ms, server.address)
    }).pipe(Effect.scoped)
  )

  it.live("a server that answers garbage (and closes, or not) is 'not a Kafka broker', without retries", () =>
    Effect.gen(function* () {
      for (const close of [true, false]) {
        const server = yield* httpServer({ close })
        const [e, ms] = yield* offsetsVia(server.address)
        assertNotKafka(e, ms, server.address)
        const retried = yield* within(
          15_000,
          "connectAttempts: 5",
          Effect.flip(Effect.scoped(KafkaLog.make({ brokers: [server.address], requestTimeout: `${T} millis` })))
        )
        assertNotKafka(retried[0], retried[1], server.address)
      }
    }).pipe(Effect.scoped)
  )

  it.live("a broker that answers the handshake and then nothing fails start-up within the request timeout", () =>
    Effect.gen(function* () {
      const proxy = yield* kafkaProxy(inject("kafka"), { only: [18] })
      const [e, ms] = yield* offsetsVia(proxy.address)
      assert.strictEqual(e.reason._tag, "BrokerUnreachable", e.message)
      assert.include(e.message, proxy.address)
      assert.include(e.message, `in ${T} ms`)
      assert.isBelow(ms, 2 * T + 1500)
    }).pipe(Effect.scoped)
  )

  it.live(
    "a broker that stops answering: every operation fails within its timeout naming the address; closing is bounded",
    () =>
      Effect.gen(function* () {
        const timeout = 1000
        const proxy = yield* kafkaProxy(inject("kafka"))
        const scope = yield* Scope.make()
        const log = yield* KafkaLog.make({ brokers: [proxy.address], requestTimeout: timeout }).pipe(
          Scope.provide(scope)
        )
        const stamp = Date.now().toString(36)
        const topic = `hung-${stamp}`
        const tp = { topic, partition: 0 }
        const value = new TextEncoder().encode("v")
        yield* log.ensureTopic({ topic, partitions: 1 })
        assert.deepStrictEqual(yield* log.produceBatch([{ ...tp, key: null, value }]), [0])
        const consumer = yield* log.consumer().pipe(Scope.provide(scope))
        yield* consumer.assign([tp])
        const group = yield* log.groupConsumer({ groupId: `hung-${stamp}`, topics: [topic] }).pipe(Scope.provide(scope))
        const txn = yield* log.transactionalProducer({ transactionalId: `hung-${stamp}` }).pipe(Scope.provide(scope))
        const producer = yield* log.producer().pipe(Scope.provide(scope))

        proxy.freeze()
        const fails = <A>(what: string, effect: Effect.Effect<A, Log.LogError>, bound = timeout + 1500) =>
          Effect.gen(function* () {
            const [e, ms] = yield* within(4 * timeout + 5000, what, Effect.flip(effect))
            assert.strictEqual(e.reason._tag, "BrokerUnreachable", `${what}: ${e.message}`)
            assert.include(e.message, proxy.address, what)
            assert.isBelow(ms, bound, `${what} took ${ms} ms`)
          })
        yield* fails("offsets", log.offsets([tp]))
        yield* fails("produce", log.produce({ ...tp, key: null, value }))
        yield* fails("produceBatch", log.produceBatch([{ ...tp, key: null, value }]))
        yield* fails("producer.send", Effect.flatten(producer.send([{ ...tp, key: null, value }])))
        yield* fails("ensureTopic", log.ensureTopic({ topic: `${topic}-new`, partitions: 1 }))
        yield* fails("deleteRecords", log.deleteRecords(tp, 1))
        yield* fails("consumer fetch", Stream.runHead(consumer.batches), timeout + 250 + 1500)
        yield* fails("committed", group.committed([tp]))
        yield* fails("commit", group.commit([{ ...tp, offset: 1 }]))
        yield* fails("transactional send", Effect.flatten(txn.send([{ ...tp, key: null, value }])))
        // Opening fails within the timeout; closing its client gives up after another.
        yield* fails(
          "transactionalProducer",
          Effect.scoped(log.transactionalProducer({ transactionalId: `hung-${stamp}-2` })),
          2 * timeout + 1500
        )
        // Leaving the group, aborting the transaction and closing the clients do not wait for the hung broker.
        const [, closing] = yield* within(20_000, "closing the log", Scope.close(scope, Exit.void))
        assert.isBelow(closing, 3 * timeout + 1500, `closing took ${closing} ms`)
      }).pipe(Effect.scoped),
    90_000
  )
})

describe("KafkaLog topics", () => {
  // Right after a broker start, a produce following CreateTopics failed with "unknown topic" for 8 of 40 new
  // topics: the controller answers before the brokers know the topic. ensureTopic now waits until they do.
  it.live("ensureTopic returns once every partition of a new topic has a leader and takes writes", () =>
    Effect.gen(function* () {
      const log = yield* Log.Log
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
      const log = yield* Log.Log
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
      const log = yield* Log.Log
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
      const log = yield* Log.Log
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

describe("KafkaLog request sizes", () => {
  const bytes = (n: number, fill: number) => new Uint8Array(n).fill(fill)

  // Concurrent calls were merged into one request of 2.4 MB: the broker refused it, every call failed with
  // "a record of -1 bytes ... the limit of -1 bytes" and nothing was written.
  it.live("four concurrent 600 KB produce calls are all written: requests are split at the broker's limit", () =>
    Effect.gen(function* () {
      const log = yield* Log.Log
      const topic = `sizes-${Date.now().toString(36)}`
      yield* log.ensureTopic({ topic, partitions: 2 })
      const [offsets] = yield* within(
        30_000,
        "produce",
        Effect.forEach([0, 1, 2, 3], (i) => log.produce({ topic, partition: 0, key: null, value: bytes(600_000, i) }), {
          concurrency: "unbounded"
        })
      )
      assert.deepStrictEqual([...offsets].sort(), [0, 1, 2, 3])
      // One producer send larger than the limit goes in several requests, in order.
      const producer = yield* log.producer()
      const sent = yield* Effect.flatten(
        producer.send([0, 1, 2].map((i) => ({ topic, partition: 1, key: null, value: bytes(400_000, i) })))
      )
      assert.deepStrictEqual(sent, [0, 1, 2])
      const consumer = yield* log.consumer()
      yield* consumer.assign([{ topic, partition: 1 }])
      const values: Array<number> = []
      yield* consumer.batches.pipe(
        Stream.takeUntil((b) => {
          values.push(...b.records.map((r) => r.value![0]!))
          return values.length >= 3
        }),
        Stream.runDrain
      )
      assert.deepStrictEqual(values, [0, 1, 2])
    }).pipe(Effect.scoped, Effect.provide(KafkaLog.layer({ brokers: [inject("kafka")] })))
  )

  it.live(
    "a record over the topic's max.message.bytes fails alone with its size and the limit; the others are written",
    () =>
      Effect.gen(function* () {
        const log = yield* Log.Log
        const topic = `small-${Date.now().toString(36)}`
        yield* log.ensureTopic({ topic, partitions: 1, config: { "max.message.bytes": "100000" } })
        const record = (n: number, fill: number) => ({ topic, partition: 0, key: null, value: bytes(n, fill) })
        const [results] = yield* within(
          30_000,
          "produce",
          Effect.all(
            [150_000, 40_000, 40_000, 40_000, 40_000].map((n, i) => Effect.result(log.produce(record(n, i)))),
            { concurrency: "unbounded" }
          )
        )
        const [big, ...small] = results
        assert.isTrue(big!._tag === "Failure")
        const e = big!._tag === "Failure" ? big!.failure : undefined
        assert.strictEqual(e?.reason._tag, "RecordTooLarge")
        if (e?.reason._tag === "RecordTooLarge") {
          assert.strictEqual(e.reason.max, 100_000)
          assert.isAbove(e.reason.size, 150_000)
          assert.isBelow(e.reason.size, 150_100)
          assert.strictEqual(e.reason.partition, 0)
        }
        assert.include(e?.message, `${topic}/0`)
        assert.deepStrictEqual(
          small.map((r) => (r._tag === "Success" ? r.success : r.failure.message)).sort(),
          [0, 1, 2, 3],
          "the valid records sent at the same time are written"
        )
        // In a batch or a producer, the record fails the call before anything of it is sent.
        const batch = yield* Effect.flip(log.produceBatch([record(10, 9), record(150_000, 9)]))
        assert.strictEqual(batch.reason._tag, "RecordTooLarge")
        const producer = yield* log.producer()
        assert.strictEqual((yield* Effect.flip(producer.send([record(150_000, 9)]))).reason._tag, "RecordTooLarge")
        assert.strictEqual((yield* log.offsets([{ topic, partition: 0 }]))[0]!.highwater, 4)
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
        const log = yield* Log.Log
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
