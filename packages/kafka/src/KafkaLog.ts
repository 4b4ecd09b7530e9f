/**
 * The `Log` protocol on a Kafka cluster, through `@platformatic/kafka`.
 *
 * Changelog consumers use no consumer group: each pull sends one `Fetch` per
 * partition leader for the assigned, unpaused partitions at the positions the
 * adapter keeps, so assignment, seek and pause are instant and a slow caller
 * simply stops the fetching. An out-of-range position fails with
 * `OffsetOutOfRange`; it is never reset.
 *
 * Why not kafkajs: it has no manual assignment (only the group protocol, with a
 * rejoin per change), it silently resets an out-of-range position, and it
 * produces ~1.5× slower here. See the package README.
 *
 * @since 0.1.0
 */
import {
  Admin,
  type Broker,
  ConfigResourceTypes,
  ConnectionPool,
  Consumer,
  FetchIsolationLevels,
  type GroupAssignment,
  ListOffsetTimestamps,
  type fetchV17,
  type ProduceAcks as PlatformaticAcks,
  Producer
} from "@platformatic/kafka"
import {
  type Acks,
  BrokerUnreachable,
  OptionSchemas,
  InvalidRequest,
  LogClosed,
  type LogConsumer,
  LogIoError,
  type LogError,
  type LogShape,
  Log,
  type LogBatch,
  type GroupConsumer,
  type GroupConsumerOptions,
  type GroupEvent,
  HostPort,
  type TopicPartitionOffset,
  logError,
  NotAssigned,
  OffsetOutOfRange,
  type PartitionOffsets,
  type LogProducer,
  type ConsumerOptions,
  type OffsetsOptions,
  type ProducerOptions,
  type ProducerRecord,
  type TransactionalProducerOptions,
  RecordTooLarge,
  type TopicPartition,
  type TopicSpec,
  tpKey,
  UnknownPartition,
  UnknownTopic
} from "@strata/core"
import {
  type Cause,
  Clock,
  Config,
  Context,
  Deferred,
  Effect,
  Exit,
  Layer,
  Queue,
  Schedule,
  Schema,
  type Scope,
  Semaphore,
  Stream
} from "effect"
import * as BrokerProbe from "./internal/brokerProbe.js"
import { apiIds, isTooLarge, mismatch, noAnswer, toLogError } from "./internal/errors.js"
import * as RecordSize from "./internal/recordSize.js"
import * as SendQueue from "./internal/sendQueue.js"
import * as TransactionalProducer from "./internal/transactionalProducer.js"
import {
  FETCH_API_KEY,
  type FetchResponse,
  fetchRequests,
  MAX_FETCH_VERSION,
  MIN_FETCH_VERSION,
  parseFetchResponse,
  RecordBatchReader
} from "./internal/fetchProtocol.js"

const { PositiveInt } = OptionSchemas

/**
 * A broker address: `host:port` as core's `HostPort` reads it (a host name, an IPv4 or [IPv6] address, a port from 1
 * to 65535).
 */
export const BrokerAddress = Schema.String.check(
  Schema.makeFilter((address: string) =>
    HostPort.invalid(address) === undefined
      ? undefined
      : `expected host:port (a host name, an IPv4 or [IPv6] address, and a port from 1 to 65535), got ${JSON.stringify(address)}`
  )
)

/** Options of the Kafka log, validated when it starts. */
export const KafkaLogOptions = Schema.Struct({
  /** Bootstrap brokers, `host:port` (see `BrokerAddress`). */
  brokers: Schema.NonEmptyArray(BrokerAddress),
  /** Client id sent to the brokers (default "strata"). */
  clientId: Schema.optional(Schema.NonEmptyString),
  /**
   * Request timeout in milliseconds (default 10000): how long any request waits for the brokers' answer, connecting
   * included, before it fails with `BrokerUnreachable`. It bounds each of the log's operations (a fetch waits
   * `maxWaitMs` longer; joining a group, which the coordinator holds for a rebalance, waits at least 15 s).
   */
  requestTimeoutMs: Schema.optional(PositiveInt),
  /** How long a fetch waits at the broker for new records, in milliseconds (default 250). */
  maxWaitMs: Schema.optional(PositiveInt),
  /**
   * Most bytes one fetch brings back from a broker, all partitions together (default 8 MiB). The bytes are held
   * until their records are handed out; records are built a chunk at a time, as they are handed out.
   */
  fetchMaxBytes: Schema.optional(PositiveInt),
  /**
   * Most bytes one fetch brings back per partition (default 1 MiB, as Kafka's Java consumer). A record batch larger
   * than this still comes back whole, alone, so a partition always makes progress.
   */
  fetchPartitionMaxBytes: Schema.optional(PositiveInt),
  /**
   * Attempts to reach the brokers at start, with exponential backoff, before `BrokerUnreachable` (default 5). An
   * address that answers but is not a Kafka broker fails at once (`InvalidRequest`).
   */
  connectAttempts: Schema.optional(PositiveInt),
  /**
   * Largest record accepted (key + value + headers), in bytes (default 1000000). A record must also fit its topic's
   * `max.message.bytes` as a record batch of its own (read from the brokers).
   */
  maxRecordBytes: Schema.optional(PositiveInt),
  /**
   * How long `produce` waits for more records before sending, in milliseconds (default 0). Calls made while a
   * send is in flight are always sent together in the next request, lingering or not.
   */
  lingerMs: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))),
  /** Records queued for sending at most; `produce` and `send` wait for room beyond it (default 100000). */
  bufferRecords: Schema.optional(PositiveInt),
  /** Most records `produce` puts in one request (default 1000). */
  maxBatchRecords: Schema.optional(PositiveInt)
})
/** @see KafkaLogOptions */
export type KafkaLogOptions = typeof KafkaLogOptions.Type

/** The Kafka log's own service key; its layer provides `Log` too. */
export class KafkaLog extends Context.Service<KafkaLog, LogShape & { readonly brokers: ReadonlyArray<string> }>()(
  "@strata/kafka/KafkaLog"
) {}

const TOPIC = /^[a-zA-Z0-9._-]{1,249}$/
/** Kafka error codes a fetch handles itself: offset out of range, and the ones that mean stale metadata. */
const OFFSET_OUT_OF_RANGE = 1
/** Unknown topic or partition, leader not available, not leader or follower, unknown topic id. */
const STALE_METADATA = new Set([3, 5, 6, 100])
/**
 * Fetch sizes. A broker cuts a partition's answer at the size asked, mid-batch, and the cut batch is fetched again
 * next time: with 256 KiB per partition and ~130 KB changelog batches, half the bytes fetched were thrown away. At
 * 1 MiB per partition a restore of 1M records took 8–12% less CPU per record (3 same-day A/B runs) for ~60 MB more
 * memory. (Decoding a whole fetch at once made larger fetches slower; records are now built a chunk at a time.)
 */
const DEFAULT_FETCH_MAX_BYTES = 8 * 1024 * 1024
const DEFAULT_FETCH_PARTITION_MAX_BYTES = 1024 * 1024
/** How often `ensureTopic` asks for a new topic's metadata while it waits for the brokers to know it. */
const TOPIC_POLL_MS = 50
/** How often a group member compares its assignment with the client's, besides the client's events. */
const ASSIGNMENT_CHECK_MS = 250
/** Kafka stores timestamp deltas in 32 bits; the client mis-encodes larger spans, so such sends are split. */
const MAX_TIMESTAMP_SPAN = 2 ** 31 - 1
/** A group member's session and rebalance timeouts. */
const SESSION_TIMEOUT_MS = 10_000
const REBALANCE_TIMEOUT_MS = 10_000
/**
 * How long a group member's requests may wait at least: the coordinator holds a JoinGroup until the rebalance
 * completes (up to the rebalance timeout), so the member waits that long and 5 s more, as Kafka's Java client does.
 */
const GROUP_REQUEST_TIMEOUT_MS = REBALANCE_TIMEOUT_MS + 5000

const acksOf = (acks: Acks | undefined): (typeof PlatformaticAcks)[keyof typeof PlatformaticAcks] =>
  acks === 0 ? 0 : acks === 1 ? 1 : -1

/** `u` as a Buffer, without a new view when it is one already. */
const asBuffer = (u: Uint8Array): Buffer => (Buffer.isBuffer(u) ? u : Buffer.from(u.buffer, u.byteOffset, u.byteLength))

/** A lone header's key repeats on every record (a changelog's `strata-source`): its bytes are made once. */
const headerKeys = new Map<string, Buffer>()
const headerKey = (key: string): Buffer => {
  let bytes = headerKeys.get(key)
  if (bytes === undefined) {
    bytes = Buffer.from(key, "utf8")
    // A bounded memo: keys beyond the first thousand are encoded each time.
    if (headerKeys.size < 1000) headerKeys.set(key, bytes)
  }
  return bytes
}

/**
 * Probes every bootstrap broker (`BrokerProbe`): fails at once when one answers but is not Kafka, with
 * `BrokerUnreachable` when none answers; else gives the brokers, those that answered first.
 */
const reachBrokers = (
  brokers: ReadonlyArray<string>,
  clientId: string,
  timeoutMs: number
): Effect.Effect<Array<string>, LogError> =>
  Effect.gen(function* () {
    const probed = yield* Effect.forEach(brokers, (b) => Effect.result(BrokerProbe.probe(b, clientId, timeoutMs)), {
      concurrency: "unbounded"
    })
    const failures = probed.flatMap((r) => (r._tag === "Failure" ? [r.failure] : []))
    const notKafka = failures.filter((f) => f._tag === "NotKafka")
    if (notKafka.length > 0) {
      return yield* Effect.fail(
        logError(new InvalidRequest({ detail: `brokers: ${notKafka.map((f) => f.detail).join("; ")}` }))
      )
    }
    const answered = brokers.filter((_, i) => probed[i]!._tag === "Success")
    if (answered.length === 0) {
      return yield* Effect.fail(
        logError(new BrokerUnreachable({ brokers: [...brokers], detail: failures.map((f) => f.detail).join("; ") }))
      )
    }
    return [...answered, ...brokers.filter((b) => !answered.includes(b))]
  })

/** Closes a client, giving up after `ms` (a hung broker must not hold the scope's closing). */
const closeWithin = (ms: number, close: () => Promise<unknown>): Effect.Effect<void> =>
  Effect.promise(() => close().catch(() => undefined)).pipe(Effect.timeoutOption(ms), Effect.asVoid)

/** Starts the clients, checks the brokers answer (with backoff), and serves `Log` until the scope closes. */
export const make = (options: KafkaLogOptions): Effect.Effect<KafkaLog["Service"], LogError, Scope.Scope> =>
  Effect.gen(function* () {
    const o = yield* Schema.decodeUnknownEffect(KafkaLogOptions)(options, { errors: "all" }).pipe(
      Effect.mapError((issue) => logError(new InvalidRequest({ detail: `Kafka log options: ${issue.message}` })))
    )
    const brokers = [...o.brokers]
    const clientId = o.clientId ?? "strata"
    const timeout = o.requestTimeoutMs ?? 10_000
    const connectAttempts = o.connectAttempts ?? 5
    // An address that is not Kafka fails here, before any client talks to it; one that does not answer is retried.
    const bootstrap = yield* reachBrokers(brokers, clientId, timeout).pipe(
      Effect.retry({
        times: connectAttempts - 1,
        schedule: Schedule.exponential("200 millis"),
        while: (e) => e.reason._tag === "BrokerUnreachable"
      })
    )
    // `timeout` is what the broker may take (produce, create topics); `requestTimeout` and `connectTimeout` bound
    // the client's own wait for each request (its default was 30 s, whatever `timeout` said).
    const base = {
      clientId,
      bootstrapBrokers: bootstrap,
      timeout,
      connectTimeout: timeout,
      requestTimeout: timeout,
      retries: 3,
      retryDelay: 250
    }
    const maxWait = o.maxWaitMs ?? 250
    const maxRecordBytes = o.maxRecordBytes ?? 1_000_000
    /**
     * Fails with `BrokerUnreachable` ("no answer …") when `effect` has not completed in `ms`. The client retries a
     * request that timed out, 4 times and (its metadata around its ApiVersions) up to 16; the caller does not wait.
     */
    const bounded = <A, E>(
      operation: string,
      effect: Effect.Effect<A, E>,
      ms = timeout
    ): Effect.Effect<A, E | LogError> =>
      Effect.timeoutOrElse(effect, { duration: ms, orElse: () => Effect.fail(noAnswer(operation, brokers, ms)) })
    /** A client call, bounded by the request timeout (or `ms`). */
    const call = <A>(
      operation: string,
      f: () => Promise<A>,
      topic?: string,
      ms = timeout
    ): Effect.Effect<A, LogError> =>
      bounded(
        operation,
        Effect.tryPromise({ try: f, catch: (cause) => toLogError(operation, brokers, cause, topic) }),
        ms
      )

    const admin = yield* Effect.acquireRelease(
      Effect.sync(() => new Admin(base)),
      (a) => closeWithin(timeout, () => a.close())
    )
    // acks=all goes through an idempotent producer: a retried request (e.g. while a new topic's leaders are
    // elected) is deduplicated by the broker instead of appending the records twice. Kafka cannot make acks 0/1
    // idempotent, so those use a plain producer and may duplicate on retry, as in Kafka.
    const idempotent = yield* Effect.acquireRelease(
      Effect.sync(() => new Producer({ ...base, idempotent: true, acks: -1 })),
      (p) => closeWithin(timeout, () => p.close())
    )
    const plain = yield* Effect.acquireRelease(
      Effect.sync(() => new Producer({ ...base, acks: 1 })),
      (p) => closeWithin(timeout, () => p.close())
    )

    // Fail fast, with the brokers named, when nothing answers.
    yield* call("connect", () => admin.metadata({ topics: [] })).pipe(
      Effect.retry({ times: connectAttempts - 1, schedule: Schedule.exponential("200 millis") }),
      Effect.mapError((e) =>
        e.reason._tag === "BrokerUnreachable" ? e : logError(new BrokerUnreachable({ brokers, detail: e.message }))
      )
    )

    /** Partition counts of known topics (a topic never loses partitions). */
    const partitionCounts = new Map<string, number>()
    const partitionCount = (topic: string): Effect.Effect<number, LogError> =>
      Effect.suspend(() => {
        const known = partitionCounts.get(topic)
        if (known !== undefined) return Effect.succeed(known)
        return call("metadata", () => admin.metadata({ topics: [topic] }), topic).pipe(
          Effect.flatMap((md) => {
            const count = md.topics.get(topic)?.partitionsCount
            if (count === undefined || count === 0) return Effect.fail(logError(new UnknownTopic({ topic })))
            partitionCounts.set(topic, count)
            return Effect.succeed(count)
          })
        )
      })

    /**
     * Each topic's `max.message.bytes` (DescribeConfigs; the broker's `message.max.bytes` unless the topic sets one):
     * the most bytes one record batch, one partition's part of a produce request, may take.
     */
    const messageLimits = new Map<string, number>()
    /** Lookups under way: concurrent sends to a topic not seen yet share one DescribeConfigs. */
    const describing = new Map<string, Deferred.Deferred<number, LogError>>()
    const logScope = yield* Effect.scope
    const messageLimit = (topic: string): Effect.Effect<number, LogError> =>
      Effect.suspend(() => {
        const known = messageLimits.get(topic)
        if (known !== undefined) return Effect.succeed(known)
        const pending = describing.get(topic)
        if (pending !== undefined) return Deferred.await(pending)
        const done = Deferred.makeUnsafe<number, LogError>()
        describing.set(topic, done)
        const lookup = describeLimit(topic).pipe(
          Effect.onExit((exit) =>
            Effect.sync(() => {
              describing.delete(topic)
              Deferred.doneUnsafe(done, exit)
            })
          )
        )
        return Effect.andThen(Effect.forkIn(lookup, logScope), Deferred.await(done))
      })
    const describeLimit = (topic: string): Effect.Effect<number, LogError> =>
      Effect.tryPromise({
        try: () =>
          admin.describeConfigs({
            resources: [
              {
                resourceType: ConfigResourceTypes.TOPIC,
                resourceName: topic,
                configurationKeys: ["max.message.bytes"]
              }
            ]
          }),
        catch: (cause) => cause
      }).pipe(
        Effect.map((described) => {
          const value = Number(described[0]?.configs.find((c) => c.name === "max.message.bytes")?.value)
          return Number.isSafeInteger(value) && value > 0 ? value : RecordSize.DEFAULT_MESSAGE_MAX_BYTES
        }),
        // Without the right to describe the topic, Kafka's default.
        Effect.catch((cause) =>
          [...apiIds(cause)].some((id) => id.endsWith("AUTHORIZATION_FAILED"))
            ? Effect.succeed(RecordSize.DEFAULT_MESSAGE_MAX_BYTES)
            : Effect.fail(toLogError("describeConfigs", brokers, cause, topic))
        ),
        (effect) => bounded("describeConfigs", effect),
        Effect.tap((limit) => Effect.sync(() => messageLimits.set(topic, limit)))
      )
    /** The limit of a topic already validated (so known); Kafka's default for any other. */
    const limitOf = (topic: string): number => messageLimits.get(topic) ?? RecordSize.DEFAULT_MESSAGE_MAX_BYTES

    /** Why a record of a validated topic is too large, if it is: over `maxRecordBytes`, or alone over its topic's limit. */
    const tooLarge = (r: ProducerRecord, limit: number): LogError | undefined => {
      const size = RecordSize.payloadBytes(r)
      if (size > maxRecordBytes) return logError(new RecordTooLarge({ topic: r.topic, size, max: maxRecordBytes }))
      // The exact batch size only when the bound says it may not fit.
      if (RecordSize.BATCH_OVERHEAD + size + RecordSize.varintsBound(r) <= limit) return undefined
      const batch = RecordSize.loneBatchBytes(r)
      return batch > limit
        ? logError(new RecordTooLarge({ topic: r.topic, partition: r.partition, size: batch, max: limit }))
        : undefined
    }

    const checkTp = (tp: TopicPartition): Effect.Effect<void, LogError> =>
      Effect.suspend(() => {
        if (typeof tp.topic !== "string" || !TOPIC.test(tp.topic)) {
          return Effect.fail(logError(new InvalidRequest({ detail: `invalid topic name ${JSON.stringify(tp.topic)}` })))
        }
        return Effect.flatMap(partitionCount(tp.topic), (count) =>
          Number.isInteger(tp.partition) && tp.partition >= 0 && tp.partition < count
            ? Effect.void
            : Effect.fail(
                logError(new UnknownPartition({ topic: tp.topic, partition: tp.partition, partitions: count }))
              )
        )
      })

    const ensureTopic = (spec: TopicSpec) =>
      Effect.gen(function* () {
        if (typeof spec.topic !== "string" || !TOPIC.test(spec.topic)) {
          return yield* Effect.fail(
            logError(new InvalidRequest({ detail: `invalid topic name ${JSON.stringify(spec.topic)}` }))
          )
        }
        if (!Number.isInteger(spec.partitions) || spec.partitions < 1) {
          return yield* Effect.fail(
            logError(
              new InvalidRequest({
                detail: `${spec.topic}: partitions must be a positive integer, got ${spec.partitions}`
              })
            )
          )
        }
        // Compacted changelogs keep "delete" too (with infinite retention) so that DeleteRecords stays allowed.
        const configs = [
          ...(spec.compacted
            ? [
                { name: "cleanup.policy", value: "compact,delete" },
                { name: "retention.ms", value: "-1" },
                { name: "retention.bytes", value: "-1" }
              ]
            : []),
          ...Object.entries(spec.config ?? {}).map(([name, value]) => ({ name, value }))
        ]
        const created = yield* Effect.tryPromise({
          try: () =>
            admin.createTopics({
              topics: [spec.topic],
              partitions: spec.partitions,
              replicas: spec.replicationFactor ?? 1,
              configs
            }),
          catch: (cause) => cause
        }).pipe(
          Effect.as(true),
          Effect.catch((cause) =>
            apiIds(cause).has("TOPIC_ALREADY_EXISTS")
              ? Effect.succeed(false)
              : Effect.fail(toLogError("ensureTopic", brokers, cause, spec.topic))
          ),
          (effect) => bounded("ensureTopic", effect)
        )
        // The controller answers before the brokers know the topic: a produce right away could fail with "unknown
        // topic" (seen right after a broker start). Like Kafka Streams, wait until the metadata shows it, and for a
        // topic created here until every partition has a leader.
        partitionCounts.delete(spec.topic)
        messageLimits.delete(spec.topic)
        const actual = yield* awaitTopic(spec.topic, created)
        if (actual !== spec.partitions) return yield* Effect.fail(mismatch(spec.topic, spec.partitions, actual))
        partitionCounts.set(spec.topic, actual)
      })

    /**
     * The topic's partition count once the brokers' metadata lists it (with a leader for every partition when
     * `led`), asked again every `TOPIC_POLL_MS` for up to the request timeout.
     */
    const awaitTopic = (topic: string, led: boolean): Effect.Effect<number, LogError> =>
      Effect.gen(function* () {
        const deadline = (yield* Clock.currentTimeMillis) + base.timeout
        for (;;) {
          const md = yield* call(
            "ensureTopic",
            () => admin.metadata({ topics: [topic], forceUpdate: true }),
            topic
          ).pipe(
            Effect.catchIf(
              (e) => e.reason._tag === "UnknownTopic",
              () => Effect.succeed(undefined)
            )
          )
          const t = md?.topics.get(topic)
          const leaderless = t?.partitions.filter((p) => p.leader < 0).length ?? 0
          if (t !== undefined && t.partitionsCount > 0 && (!led || leaderless === 0)) return t.partitionsCount
          if ((yield* Clock.currentTimeMillis) >= deadline) {
            return yield* Effect.fail(
              logError(
                new LogIoError({
                  operation: "ensureTopic",
                  detail:
                    t === undefined
                      ? `${topic} is not in the brokers' metadata ${base.timeout} ms after it was created or found`
                      : `${topic} has ${leaderless} of ${t.partitionsCount} partitions without a leader ${base.timeout} ms after it was created`,
                  retryable: true
                })
              )
            )
          }
          yield* Effect.sleep(TOPIC_POLL_MS)
        }
      })

    const inFlight = new Set<Promise<unknown>>()

    const validTopic = (topic: string) =>
      typeof topic === "string" && TOPIC.test(topic)
        ? partitionCount(topic)
        : Effect.fail(logError(new InvalidRequest({ detail: `invalid topic name ${JSON.stringify(topic)}` })))

    /** The client duplicated records with several idempotent sends in flight, so sends go one at a time. */
    const sendLock = Semaphore.makeUnsafe(1)

    /**
     * Checks every record (topic, partition, size against `maxRecordBytes` and its topic's limit) before it is
     * queued, so one caller's bad record fails only it.
     */
    const validate = (records: ReadonlyArray<ProducerRecord>) =>
      Effect.gen(function* () {
        // Topics are checked once each; partitions and sizes per record, without an Effect per record.
        const topics = [...new Set(records.map((r) => r.topic))]
        const counts = new Map<string, number>()
        const limits = new Map<string, number>()
        for (const topic of topics) {
          counts.set(topic, yield* validTopic(topic))
          limits.set(topic, yield* messageLimit(topic))
        }
        for (const r of records) {
          const count = counts.get(r.topic)!
          if (!Number.isInteger(r.partition) || r.partition < 0 || r.partition >= count) {
            return yield* Effect.fail(
              logError(new UnknownPartition({ topic: r.topic, partition: r.partition, partitions: count }))
            )
          }
          const error = tooLarge(r, limits.get(r.topic)!)
          if (error !== undefined) return yield* Effect.fail(error)
        }
      })

    /**
     * The broker refused a request's record batch as too large (its topic's limit changed since it was read): the
     * largest batch and the limit known, which is read again for the next sends.
     */
    const refusedAsTooLarge = (records: ReadonlyArray<ProducerRecord>): LogError => {
      const largest = RecordSize.largestBatch(records)
      const max = limitOf(largest.topic)
      for (const r of records) messageLimits.delete(r.topic)
      return logError(
        new RecordTooLarge({ topic: largest.topic, partition: largest.partition, size: largest.bytes, max })
      )
    }

    /**
     * Sends validated records through `dispatch` as one request (one per record when timestamps span too far);
     * offsets in order. Each request is bounded by the request timeout; one given up on still holds `turn` (its
     * client) until the client is done with it, so that one client never has two sends in flight.
     */
    const sendVia = (
      records: ReadonlyArray<ProducerRecord>,
      acks: -1 | 0 | 1,
      dispatch: TransactionalProducer.Dispatch,
      turn: TransactionalProducer.ClientTurn
    ) =>
      Effect.gen(function* () {
        if (records.length === 0) return []
        // Headers and timestamps are passed only when given (the client stamps the rest at send time).
        let minStamp = Number.POSITIVE_INFINITY
        let maxStamp = Number.NEGATIVE_INFINITY
        const messages = records.map((r) => {
          const m: TransactionalProducer.OutMessage = { topic: r.topic, partition: r.partition }
          if (r.key !== null) m.key = asBuffer(r.key)
          if (r.value !== null) m.value = asBuffer(r.value)
          if (r.headers !== undefined && r.headers.length > 0) {
            // The client takes headers as a Map keyed by Buffer: one record's repeated keys need Buffers of their own.
            const only = r.headers.length === 1 ? r.headers[0]! : undefined
            m.headers =
              only !== undefined
                ? new Map([[headerKey(only.key), asBuffer(only.value)] as const])
                : new Map(r.headers.map((h) => [Buffer.from(h.key, "utf8"), asBuffer(h.value)] as const))
          }
          if (r.timestamp !== undefined) {
            m.timestamp = BigInt(r.timestamp)
            if (r.timestamp < minStamp) minStamp = r.timestamp
            if (r.timestamp > maxStamp) maxStamp = r.timestamp
          }
          return m
        })
        if (minStamp !== Number.POSITIVE_INFINITY) {
          // Unstamped records get the clock's time, so that one request's deltas stay within 32 bits.
          const now = yield* Clock.currentTimeMillis
          for (const m of messages) {
            if (m.timestamp === undefined) m.timestamp = BigInt(now)
          }
          minStamp = Math.min(minStamp, now)
          maxStamp = Math.max(maxStamp, now)
        }
        // Send as one request unless timestamps span more than a 32-bit delta (then one request per record).
        const groups = maxStamp - minStamp > MAX_TIMESTAMP_SPAN ? messages.map((m) => [m]) : [messages]
        const offsets: Array<number> = []
        for (const [g, group] of groups.entries()) {
          const result = yield* bounded(
            "produce",
            Effect.gen(function* () {
              const previous = turn.last
              if (previous !== undefined) yield* Effect.promise(() => previous)
              const send = dispatch(group)
              const settled = send.then(
                () => undefined,
                () => undefined
              )
              turn.last = settled
              void settled.then(() => {
                if (turn.last === settled) turn.last = undefined
              })
              inFlight.add(send)
              return yield* Effect.tryPromise({
                try: () => send,
                catch: (cause) =>
                  isTooLarge(cause)
                    ? refusedAsTooLarge(groups.length === 1 ? records : [records[g]!])
                    : toLogError("produce", brokers, cause, group[0]!.topic)
              }).pipe(Effect.ensuring(Effect.sync(() => inFlight.delete(send))))
            })
          )
          // Per topic and partition, the offset of the group's next record there.
          const nextOffset = new Map<string, Map<number, number>>()
          for (const x of result.offsets ?? []) {
            let partitions = nextOffset.get(x.topic)
            if (partitions === undefined) {
              partitions = new Map()
              nextOffset.set(x.topic, partitions)
            }
            partitions.set(x.partition, Number(x.offset))
          }
          for (const m of group) {
            const partitions = nextOffset.get(m.topic)
            const at = partitions?.get(m.partition)
            if (acks === 0 || at === undefined) {
              offsets.push(-1)
              continue
            }
            offsets.push(at)
            partitions!.set(m.partition, at + 1)
          }
        }
        return offsets
      })

    const idempotentTurn: TransactionalProducer.ClientTurn = { last: undefined }
    const plainTurn: TransactionalProducer.ClientTurn = { last: undefined }
    /** Sends through the shared clients: acks=all idempotent, acks 0 and 1 plain; one request at a time. */
    const send = (records: ReadonlyArray<ProducerRecord>, options?: { readonly acks?: Acks }) => {
      const acks = acksOf(options?.acks)
      return Semaphore.withPermit(
        sendLock,
        acks === -1
          ? sendVia(records, acks, (messages) => idempotent.send({ messages }), idempotentTurn)
          : sendVia(records, acks, (messages) => plain.send({ acks, messages }), plainTurn)
      )
    }

    // `produce`, `produceBatch` and producers share one send queue (internal/sendQueue.ts); its requests are split
    // to fit each topic's limit.
    const queue = yield* SendQueue.make<ProducerRecord>({
      lingerMs: o.lingerMs ?? 0,
      maxBatchRecords: o.maxBatchRecords ?? 1000,
      bufferRecords: o.bufferRecords ?? 100_000,
      size: () => RecordSize.requestSize(limitOf),
      send: (records, acks) => send(records, { acks })
    })
    const enqueue = (records: ReadonlyArray<ProducerRecord>, options?: { readonly acks?: Acks }) =>
      Effect.flatMap(queue.enqueue(records, options?.acks ?? "all"), Deferred.await)
    const produce = (record: ProducerRecord, options?: { readonly acks?: Acks }) =>
      Effect.gen(function* () {
        yield* checkTp(record)
        const error = tooLarge(record, messageLimits.get(record.topic) ?? (yield* messageLimit(record.topic)))
        if (error !== undefined) return yield* Effect.fail(error)
        const [offset] = yield* enqueue([record], options)
        return offset ?? -1
      })
    const produceBatch = (records: ReadonlyArray<ProducerRecord>, options?: { readonly acks?: Acks }) =>
      Effect.gen(function* () {
        if (records.length === 0) return []
        yield* validate(records)
        return yield* enqueue(records, options)
      })

    /** A pipelined producer on the shared queue; its first failed request stops it (see `Log.producer`). */
    const producer = (producerOptions?: ProducerOptions) =>
      Effect.gen(function* () {
        const acks = producerOptions?.acks ?? "all"
        if (acks !== 0 && acks !== 1 && acks !== "all") {
          return yield* Effect.fail(
            logError(new InvalidRequest({ detail: `acks must be 0, 1 or "all", got ${String(acks)}` }))
          )
        }
        const owner: SendQueue.Owner = { failure: undefined }
        let closed = false
        /** Calls of one owner complete in the order queued: waiting for the last waits for all. */
        let last: SendQueue.Done | undefined
        yield* Effect.addFinalizer(() =>
          Effect.suspend(() => {
            closed = true
            return last === undefined ? Effect.void : Effect.ignore(Deferred.await(last))
          })
        )
        const shape: LogProducer = {
          send: (records) =>
            Effect.gen(function* () {
              if (closed) return yield* Effect.fail(logError(new LogClosed({ what: "Kafka producer" })))
              if (owner.failure !== undefined) return yield* Effect.fail(owner.failure)
              if (records.length === 0) return Effect.succeed([])
              yield* validate(records)
              const done = yield* queue.enqueue(records, acks, owner)
              last = done
              return Deferred.await(done)
            }),
          flush: Effect.suspend(() =>
            Effect.andThen(last === undefined ? Effect.void : Effect.ignore(Deferred.await(last)), () =>
              owner.failure === undefined ? Effect.void : Effect.fail(owner.failure)
            )
          ),
          failure: Effect.sync(() => owner.failure)
        }
        return shape
      })

    const offsets = (tps: ReadonlyArray<TopicPartition>, offsetsOptions?: OffsetsOptions) =>
      Effect.gen(function* () {
        for (const tp of tps) yield* checkTp(tp)
        // At read_committed the latest offset is the last stable offset: below the first open transaction.
        const isolationLevel =
          offsetsOptions?.isolation === "read_committed"
            ? FetchIsolationLevels.READ_COMMITTED
            : FetchIsolationLevels.READ_UNCOMMITTED
        if (tps.length === 0) return []
        const byTopic = new Map<string, Array<number>>()
        for (const tp of tps) byTopic.set(tp.topic, [...(byTopic.get(tp.topic) ?? []), tp.partition])
        const request = (timestamp: bigint) => ({
          topics: [...byTopic].map(([name, ps]) => ({
            name,
            partitions: ps.map((partitionIndex) => ({ partitionIndex, timestamp }))
          }))
        })
        const [earliest, latest] = yield* Effect.all(
          [
            call("offsets", () => admin.listOffsets(request(ListOffsetTimestamps.EARLIEST))),
            call("offsets", () => admin.listOffsets({ ...request(ListOffsetTimestamps.LATEST), isolationLevel }))
          ],
          { concurrency: 2 }
        )
        const index = (listed: typeof earliest) =>
          new Map<string, number>(
            listed.flatMap((t) => t.partitions.map((p) => [`${t.name}/${p.partitionIndex}`, Number(p.offset)] as const))
          )
        const starts = index(earliest)
        const ends = index(latest)
        return tps.map(
          (tp): PartitionOffsets => ({
            topic: tp.topic,
            partition: tp.partition,
            logStart: starts.get(tpKey(tp)) ?? 0,
            highwater: ends.get(tpKey(tp)) ?? 0
          })
        )
      })

    const outOfRange = (tp: TopicPartition, offset: number) =>
      Effect.flatMap(offsets([tp]), ([o]) =>
        Effect.fail(
          logError(
            new OffsetOutOfRange({
              topic: tp.topic,
              partition: tp.partition,
              offset,
              logStart: o!.logStart,
              highwater: o!.highwater
            })
          )
        )
      )

    const deleteRecords = (tp: TopicPartition, offset: number) =>
      Effect.gen(function* () {
        yield* checkTp(tp)
        yield* Effect.tryPromise({
          try: () =>
            admin.deleteRecords({
              topics: [{ name: tp.topic, partitions: [{ partition: tp.partition, offset: BigInt(offset) }] }]
            }),
          catch: (cause) => cause
        }).pipe(
          Effect.catch((cause) =>
            apiIds(cause).has("OFFSET_OUT_OF_RANGE")
              ? outOfRange(tp, offset)
              : Effect.fail(toLogError("deleteRecords", brokers, cause, tp.topic))
          ),
          (effect) => bounded("deleteRecords", effect)
        )
      })

    const consumer = (consumerOptions?: ConsumerOptions) => {
      const max = consumerOptions?.maxBatchRecords
      const isolation = consumerOptions?.isolation ?? "read_uncommitted"
      if (isolation !== "read_uncommitted" && isolation !== "read_committed") {
        return Effect.fail(
          logError(
            new InvalidRequest({ detail: `isolation must be read_uncommitted or read_committed, got ${isolation}` })
          )
        )
      }
      if (max !== undefined && (!Number.isInteger(max) || max < 1)) {
        return Effect.fail(
          logError(new InvalidRequest({ detail: `maxBatchRecords must be a positive integer, got ${max}` }))
        )
      }
      return makeConsumer({
        base,
        maxWait,
        fetchMaxBytes: o.fetchMaxBytes ?? DEFAULT_FETCH_MAX_BYTES,
        fetchPartitionMaxBytes: o.fetchPartitionMaxBytes ?? DEFAULT_FETCH_PARTITION_MAX_BYTES,
        maxBatchRecords: consumerOptions?.maxBatchRecords ?? 1000,
        readCommitted: isolation === "read_committed",
        checkTp,
        offsets,
        outOfRange,
        call
      })
    }

    const log: LogShape = {
      backend: "kafka",
      ensureTopic,
      produce,
      produceBatch,
      flush: Effect.andThen(
        queue.flush,
        Effect.promise(() => Promise.allSettled([...inFlight]))
      ),
      producer,
      transactionalProducer: (transactionOptions: TransactionalProducerOptions) =>
        TransactionalProducer.make(transactionOptions, {
          base,
          call,
          validate,
          checkTp,
          sendVia,
          size: () => RecordSize.requestSize(limitOf),
          memberOf: (group) => groupMembers.get(group),
          lingerMs: o.lingerMs ?? 0,
          maxBatchRecords: o.maxBatchRecords ?? 1000,
          bufferRecords: o.bufferRecords ?? 100_000
        }),
      offsets,
      deleteRecords,
      consumer,
      groupConsumer: (groupOptions) =>
        makeGroupConsumer(groupOptions, {
          base,
          consumer,
          offsets,
          checkTp,
          partitionCount,
          call,
          admin
        })
    }
    return { ...log, brokers }
  })

interface ConsumerDeps {
  readonly base: TransactionalProducer.TransactionalDeps["base"]
  readonly maxWait: number
  readonly fetchMaxBytes: number
  readonly fetchPartitionMaxBytes: number
  readonly maxBatchRecords: number
  /** Fetch at `read_committed`: records of open and aborted transactions are never delivered. */
  readonly readCommitted: boolean
  readonly checkTp: (tp: TopicPartition) => Effect.Effect<void, LogError>
  readonly offsets: (tps: ReadonlyArray<TopicPartition>) => Effect.Effect<ReadonlyArray<PartitionOffsets>, LogError>
  readonly outOfRange: (tp: TopicPartition, offset: number) => Effect.Effect<never, LogError>
  readonly call: TransactionalProducer.TransactionalDeps["call"]
}

interface Assigned {
  readonly tp: TopicPartition
  position: number
  /** Bumped by seek, pause and unassign: fetched records of an older generation are dropped. */
  generation: number
}

/** A partition's part of a fetch response, decoded a chunk at a time as the consumer hands them out. */
interface Pending {
  readonly key: string
  readonly generation: number
  readonly topic: string
  readonly partition: number
  readonly highwater: number
  readonly reader: RecordBatchReader
}

let consumerCount = 0

/** A join the group member followed: its generation and the assignment made in it. */
interface Joined {
  readonly generationId: number
  readonly assignments: ReadonlyArray<GroupAssignment> | null
}

/** The client behind each group consumer, with what it last followed (a transaction commits source offsets with it). */
const groupMembers = new WeakMap<GroupConsumer, TransactionalProducer.GroupMember>()

/** A group-less changelog consumer: the client for metadata, its own connections and decoder for fetches. */
const makeConsumer = (deps: ConsumerDeps): Effect.Effect<LogConsumer, LogError, Scope.Scope> =>
  Effect.gen(function* () {
    const fetcher = yield* Effect.acquireRelease(
      Effect.sync(
        () =>
          new Consumer({
            ...deps.base,
            // Required by the client's constructor; no group is ever joined.
            groupId: `strata-changelog-${process.pid}-${++consumerCount}`,
            maxWaitTime: deps.maxWait,
            isolationLevel: FetchIsolationLevels.READ_UNCOMMITTED
          })
      ),
      (c) => closeWithin(deps.base.requestTimeout, () => c.close(true))
    )
    const assigned = new Map<string, Assigned>()
    const paused = new Set<string>()
    const pending: Array<Pending> = []
    let closed = false
    let signal = Deferred.makeUnsafe<void>()
    const wake = () => {
      const s = signal
      signal = Deferred.makeUnsafe<void>()
      Deferred.doneUnsafe(s, Exit.void)
    }
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        closed = true
        wake()
      })
    )
    const closedError = () => logError(new LogClosed({ what: "Kafka changelog consumer" }))
    /** A record batch the decoder cannot read (it names the topic, partition and offset). */
    const undecodable = (cause: unknown) =>
      logError(
        new LogIoError({
          operation: "fetch",
          detail: String((cause as Error).message ?? cause),
          retryable: false
        })
      )
    const guard = <A>(f: () => Effect.Effect<A, LogError>) =>
      Effect.suspend(() => (closed ? Effect.fail(closedError()) : f()))
    const entry = (tp: TopicPartition) => {
      const a = assigned.get(tpKey(tp))
      return a === undefined
        ? Effect.fail(logError(new NotAssigned({ topic: tp.topic, partition: tp.partition })))
        : Effect.succeed(a)
    }

    /** Topic ids, partition leaders and broker addresses, refreshed when a fetch names a topic not yet seen. */
    const topicIds = new Map<string, string>()
    const topicNames = new Map<string, string>()
    const leaders = new Map<string, number>()
    const nodes = new Map<number, Broker>()
    const refreshMetadata = (topics: ReadonlyArray<string>) =>
      Effect.map(
        deps.call("metadata", () => fetcher.metadata({ topics: [...topics], forceUpdate: true })),
        (md) => {
          for (const [id, b] of md.brokers) nodes.set(id, { host: b.host, port: b.port })
          for (const t of topics) {
            const info = md.topics.get(t)
            if (info === undefined) continue
            topicIds.set(t, info.id)
            topicNames.set(info.id, t)
            info.partitions.forEach((p, i) => {
              leaders.set(`${t}/${i}`, p.leader)
            })
          }
        }
      )

    // Fetches go through a connection pool of the consumer's own, with the Fetch version the brokers support
    // (13–17: the topic-id versions), and are decoded by `fetchProtocol`.
    const pool = yield* Effect.acquireRelease(
      Effect.sync(
        () =>
          new ConnectionPool(deps.base.clientId, {
            connectTimeout: deps.base.timeout,
            requestTimeout: deps.base.timeout + deps.maxWait
          })
      ),
      (p) => Effect.promise(() => p.close().catch(() => undefined))
    )
    let fetchVersion: number | undefined
    const negotiate = Effect.suspend(() => {
      if (fetchVersion !== undefined) return Effect.succeed(fetchVersion)
      return Effect.flatMap(
        deps.call("apiVersions", () => fetcher.listApis()),
        (apis) => {
          const max = apis.find((a) => a.apiKey === FETCH_API_KEY)?.maxVersion ?? -1
          if (max < MIN_FETCH_VERSION) {
            return Effect.fail(
              logError(
                new InvalidRequest({
                  detail: `the brokers support Fetch up to v${max}; the changelog consumer needs v${MIN_FETCH_VERSION} (Kafka 3.1 or later)`
                })
              )
            )
          }
          fetchVersion = Math.min(max, MAX_FETCH_VERSION)
          return Effect.succeed(fetchVersion)
        }
      )
    })
    const send = (node: number, version: number, topics: Parameters<typeof fetchV17.createRequest>[6]) =>
      Effect.callback<FetchResponse, unknown>((resume) => {
        const broker = nodes.get(node)
        if (broker === undefined) {
          resume(Effect.fail(new Error(`no address known for broker ${node}`)))
          return
        }
        pool.get(broker, (error, connection) => {
          if (error || connection === undefined) {
            resume(Effect.fail(error ?? new Error(`no connection to broker ${node}`)))
            return
          }
          connection.send(
            FETCH_API_KEY,
            version,
            // No fetch session (epoch -1): every request names its partitions and offsets.
            () =>
              fetchRequests[version]!(
                deps.maxWait,
                1,
                deps.fetchMaxBytes,
                deps.readCommitted ? FetchIsolationLevels.READ_COMMITTED : FetchIsolationLevels.READ_UNCOMMITTED,
                0,
                -1,
                topics,
                [],
                ""
              ),
            parseFetchResponse,
            true,
            true,
            (e, response) => resume(e || response === undefined ? Effect.fail(e) : Effect.succeed(response))
          )
        })
      })

    const fetchOnce = (active: ReadonlyArray<Assigned>) =>
      Effect.gen(function* () {
        const missing = [...new Set(active.map((a) => a.tp.topic))].filter((t) => !topicIds.has(t))
        if (missing.length > 0) yield* refreshMetadata(missing)
        const version = yield* negotiate
        const byNode = new Map<number, Array<Assigned>>()
        for (const a of active) {
          const node = leaders.get(tpKey(a.tp)) ?? -1
          byNode.set(node, [...(byNode.get(node) ?? []), a])
        }
        const requests = [...byNode].map(([node, parts]) => {
          const snapshot = parts.map((a) => ({ a, generation: a.generation, position: a.position }))
          const byTopic = new Map<string, typeof snapshot>()
          for (const s of snapshot) byTopic.set(s.a.tp.topic, [...(byTopic.get(s.a.tp.topic) ?? []), s])
          const topics = [...byTopic].map(([topic, ss]) => ({
            topicId: topicIds.get(topic)!,
            partitions: ss.map((s) => ({
              partition: s.a.tp.partition,
              fetchOffset: BigInt(s.position),
              currentLeaderEpoch: -1,
              lastFetchedEpoch: -1,
              partitionMaxBytes: deps.fetchPartitionMaxBytes
            }))
          }))
          const leader = nodes.get(node)
          // The broker holds a fetch up to maxWait before answering.
          const deadline = deps.base.requestTimeout + deps.maxWait
          return send(node, version, topics).pipe(
            Effect.retry({ times: deps.base.retries, schedule: Schedule.spaced(deps.base.retryDelay) }),
            Effect.mapError((cause) => toLogError("fetch", deps.base.bootstrapBrokers, cause)),
            Effect.timeoutOrElse({
              duration: deadline,
              orElse: () =>
                Effect.fail(
                  noAnswer(
                    "fetch",
                    leader === undefined ? deps.base.bootstrapBrokers : [`${leader.host}:${leader.port}`],
                    deadline
                  )
                )
            }),
            Effect.flatMap((response) =>
              response.errorCode === 0
                ? collect(response, snapshot)
                : Effect.fail(
                    logError(
                      new LogIoError({
                        operation: "fetch",
                        detail: `the broker answered error code ${response.errorCode}`,
                        retryable: true
                      })
                    )
                  )
            ),
            // An unreachable leader may have moved: the next fetch asks for the leaders first (asking now would keep
            // this one's caller waiting on a broker that may not answer).
            Effect.tapError(() =>
              Effect.sync(() => {
                for (const topic of byTopic.keys()) topicIds.delete(topic)
              })
            )
          )
        })
        yield* Effect.all(requests, { concurrency: "unbounded", discard: true })
      })

    const collect = (
      response: FetchResponse,
      snapshot: ReadonlyArray<{ a: Assigned; generation: number; position: number }>
    ) =>
      Effect.gen(function* () {
        const asked = new Map(snapshot.map((s) => [tpKey(s.a.tp), s]))
        for (const topicResponse of response.responses) {
          const topic = topicNames.get(topicResponse.topicId) ?? ""
          for (const p of topicResponse.partitions) {
            const key = `${topic}/${p.partitionIndex}`
            const s = asked.get(key)
            if (s === undefined) continue
            const current = assigned.get(key)
            const stale = current === undefined || current.generation !== s.generation || paused.has(key)
            if (p.errorCode === OFFSET_OUT_OF_RANGE) {
              if (!stale) return yield* deps.outOfRange(s.a.tp, s.position)
              continue
            }
            if (p.errorCode !== 0) {
              if (STALE_METADATA.has(p.errorCode)) yield* refreshMetadata([topic])
              continue
            }
            if (stale || p.records === undefined) continue
            const target = {
              topic,
              partition: p.partitionIndex,
              from: s.position,
              chunkSize: deps.maxBatchRecords,
              aborted: p.aborted
            }
            const reader = yield* Effect.try({
              try: () => new RecordBatchReader(p.records!, target),
              catch: undecodable
            })
            if (!reader.hasRecords) {
              // Only transaction markers or compacted gaps: move past them.
              if (reader.end > current.position) current.position = reader.end
              continue
            }
            pending.push({
              key,
              generation: s.generation,
              topic,
              partition: p.partitionIndex,
              highwater: p.highWatermark,
              reader
            })
          }
        }
      })

    /**
     * The next deliverable batch, decoded now: drops what pause, seek or unassign made stale since its fetch.
     * Partitions take turns, a chunk each, so a busy one cannot starve the others.
     */
    const nextPending = (): LogBatch | undefined => {
      while (pending.length > 0) {
        const p = pending.shift()!
        const a = assigned.get(p.key)
        if (a === undefined || a.generation !== p.generation || paused.has(p.key)) continue
        const all = p.reader.next()
        if (all === undefined) {
          // Every whole batch read: move past trailing markers and compacted gaps too.
          if (p.reader.end > a.position) a.position = p.reader.end
          continue
        }
        pending.push(p)
        if (all[all.length - 1]!.offset < a.position) continue
        // Copy only when the position is in the middle of the chunk.
        const records = all[0]!.offset >= a.position ? all : all.filter((r) => r.offset >= a.position)
        a.position = all[all.length - 1]!.offset + 1
        return { topic: p.topic, partition: p.partition, records, highwater: p.highwater }
      }
      return undefined
    }

    const pull: Effect.Effect<LogBatch, LogError> = Effect.gen(function* () {
      for (;;) {
        if (closed) return yield* Effect.fail(closedError())
        const ready = yield* Effect.try({ try: nextPending, catch: undecodable })
        if (ready !== undefined) return ready
        const active = [...assigned.values()].filter((a) => !paused.has(tpKey(a.tp)))
        if (active.length === 0) {
          yield* Deferred.await(signal)
          continue
        }
        yield* fetchOnce(active)
      }
    })

    const consumer: LogConsumer = {
      assign: (tps) =>
        guard(() =>
          Effect.gen(function* () {
            for (const tp of tps) yield* deps.checkTp(tp)
            const fresh = tps.filter((tp) => !assigned.has(tpKey(tp)))
            const starts = yield* deps.offsets(fresh)
            for (const o of starts) {
              assigned.set(tpKey(o), {
                tp: { topic: o.topic, partition: o.partition },
                position: o.logStart,
                generation: 0
              })
            }
            wake()
          })
        ),
      unassign: (tps) =>
        guard(() =>
          Effect.sync(() => {
            for (const tp of tps) {
              const a = assigned.get(tpKey(tp))
              if (a !== undefined) a.generation++
              assigned.delete(tpKey(tp))
              paused.delete(tpKey(tp))
            }
          })
        ),
      assignment: Effect.sync(() => [...assigned.values()].map((a) => a.tp)),
      seek: (tp, offset) =>
        guard(() =>
          Effect.gen(function* () {
            const a = yield* entry(tp)
            const [o] = yield* deps.offsets([tp])
            if (!Number.isInteger(offset) || offset < o!.logStart || offset > o!.highwater) {
              return yield* deps.outOfRange(tp, offset)
            }
            a.position = offset
            a.generation++
            wake()
          })
        ),
      position: (tp) => guard(() => Effect.map(entry(tp), (a) => a.position)),
      pause: (tps) =>
        Effect.sync(() => {
          for (const tp of tps) {
            const a = assigned.get(tpKey(tp))
            if (a === undefined) continue
            paused.add(tpKey(tp))
            a.generation++
          }
        }),
      resume: (tps) =>
        Effect.sync(() => {
          for (const tp of tps) paused.delete(tpKey(tp))
          wake()
        }),
      paused: Effect.sync(() => [...paused].map((k) => assigned.get(k)!.tp)),
      batches: Stream.fromEffectRepeat(pull)
    }
    return consumer
  })

interface GroupDeps {
  readonly base: ConsumerDeps["base"]
  readonly consumer: (options?: ConsumerOptions) => Effect.Effect<LogConsumer, LogError, Scope.Scope>
  readonly offsets: ConsumerDeps["offsets"]
  readonly checkTp: ConsumerDeps["checkTp"]
  readonly partitionCount: (topic: string) => Effect.Effect<number, LogError>
  readonly call: ConsumerDeps["call"]
  /** The log's admin client: `membership` describes the group with it. */
  readonly admin: Admin
}

/**
 * A group member: the client joins the group (and heartbeats in the background); records are fetched by an
 * inner group-less consumer whose assignment follows the group's. Every change is announced as `Revoked`
 * (lost partitions) before `Assigned` (gained ones), and gained partitions start at the committed offset.
 */
const makeGroupConsumer = (
  options: GroupConsumerOptions,
  deps: GroupDeps
): Effect.Effect<GroupConsumer, LogError, Scope.Scope> =>
  Effect.gen(function* () {
    if (typeof options.groupId !== "string" || options.groupId.length === 0) {
      return yield* Effect.fail(logError(new InvalidRequest({ detail: "groupId must be a non-empty string" })))
    }
    for (const topic of options.topics) yield* deps.partitionCount(topic)
    const groupTimeout = Math.max(deps.base.requestTimeout, GROUP_REQUEST_TIMEOUT_MS)
    const inner = yield* deps.consumer({
      ...(options.maxBatchRecords === undefined ? {} : { maxBatchRecords: options.maxBatchRecords }),
      ...(options.isolation === undefined ? {} : { isolation: options.isolation })
    })
    const events = yield* Queue.unbounded<GroupEvent, LogError | Cause.Done>()
    /** What to follow: a join's generation with its assignment, or (undefined) the client's current assignment. */
    const changes = yield* Queue.unbounded<Joined | undefined>()
    const member = yield* Effect.acquireRelease(
      Effect.sync(() => {
        const c = new Consumer({
          ...deps.base,
          // The coordinator holds a JoinGroup for up to the rebalance timeout.
          requestTimeout: groupTimeout,
          groupId: options.groupId,
          autocommit: false,
          sessionTimeout: SESSION_TIMEOUT_MS,
          heartbeatInterval: 500,
          rebalanceTimeout: REBALANCE_TIMEOUT_MS
        })
        for (const topic of options.topics) c.topics.track(topic)
        // The assignment changes on a join and on a rebalance round; both are followed. A join's event carries the
        // generation with the assignment made in it (the client's own fields change apart: the generation at the
        // JoinGroup response, the assignment at the SyncGroup response).
        c.on("consumer:group:join", (joined: Joined) =>
          Queue.offerUnsafe(changes, { generationId: joined.generationId, assignments: joined.assignments })
        )
        c.on("consumer:group:rebalance", () => Queue.offerUnsafe(changes, undefined))
        return c
      }),
      // Each step gives up after the request timeout: a hung coordinator must not hold the scope's closing.
      (c) =>
        Effect.andThen(
          Effect.timeoutOption(
            Effect.callback<void>((resume) => c.leaveGroup(false, () => resume(Effect.void))),
            deps.base.requestTimeout
          ),
          closeWithin(deps.base.requestTimeout, () => c.close(true))
        )
    )
    let closed = false
    yield* Effect.addFinalizer(() =>
      Effect.andThen(
        Effect.sync(() => {
          closed = true
        }),
        Queue.end(events)
      )
    )
    const guard = <A>(f: () => Effect.Effect<A, LogError>) =>
      Effect.suspend(() =>
        closed ? Effect.fail(logError(new LogClosed({ what: `group member of ${options.groupId}` }))) : f()
      )

    const current = new Map<string, TopicPartition>()
    /**
     * The generation of the last join followed: a transaction commits offsets with it, so once the group moves on
     * (a generation this member has not followed yet) the coordinator refuses them.
     */
    let generation = -1
    const committedOf = (tps: ReadonlyArray<TopicPartition>) =>
      Effect.gen(function* () {
        if (tps.length === 0) return []
        const byTopic = new Map<string, Array<number>>()
        for (const tp of tps) byTopic.set(tp.topic, [...(byTopic.get(tp.topic) ?? []), tp.partition])
        const listed = yield* deps.call("committed", () =>
          member.listCommittedOffsets({ topics: [...byTopic].map(([topic, partitions]) => ({ topic, partitions })) })
        )
        const out: Array<TopicPartitionOffset> = []
        for (const [topic, partitions] of byTopic) {
          const values = listed.get(topic) ?? []
          // The client indexes a topic's committed offsets by partition number, not by the order asked.
          for (const partition of partitions) {
            const v = values[partition]
            if (v !== undefined && v >= 0n) out.push({ topic, partition, offset: Number(v) })
          }
        }
        return out
      })

    /**
     * Follows the group's assignment (a join's, or else the client's current one): revoke what was lost, then assign
     * what was gained at its committed offset. A join older than one followed already is skipped.
     */
    const sync = (joined: Joined | undefined) =>
      Effect.gen(function* () {
        if (joined !== undefined && joined.generationId < generation) return
        const next = new Map<string, TopicPartition>()
        for (const a of (joined === undefined ? member.assignments : joined.assignments) ?? []) {
          for (const partition of a.partitions) next.set(`${a.topic}/${partition}`, { topic: a.topic, partition })
        }
        const lost = [...current].filter(([k]) => !next.has(k)).map(([, tp]) => tp)
        const gained = [...next].filter(([k]) => !current.has(k)).map(([, tp]) => tp)
        if (lost.length > 0) {
          yield* inner.unassign(lost)
          for (const tp of lost) current.delete(tpKey(tp))
          yield* Queue.offer(events, { _tag: "Revoked", partitions: lost })
        }
        if (gained.length > 0) {
          yield* inner.assign(gained)
          const committed = yield* committedOf(gained)
          const bounds = new Map((yield* deps.offsets(gained)).map((o) => [tpKey(o), o] as const))
          for (const c of committed) {
            const b = bounds.get(tpKey(c))!
            yield* inner.seek(c, Math.min(Math.max(c.offset, b.logStart), b.highwater))
          }
          for (const tp of gained) current.set(tpKey(tp), tp)
          yield* Queue.offer(events, { _tag: "Assigned", partitions: gained })
        }
        if (joined !== undefined) generation = joined.generationId
      })

    yield* deps.call("joinGroup", () => member.joinGroup({}), undefined, groupTimeout)
    yield* sync(
      member.assignments === null ? undefined : { generationId: member.generationId, assignments: member.assignments }
    )
    // A failure while following the group ends the member's event stream with that error.
    yield* Effect.forkScoped(
      Effect.forever(Effect.flatMap(Queue.take(changes), sync)).pipe(Effect.catch((e) => Queue.fail(events, e)))
    )
    // A change the client made without an event is still followed: a member must never keep fetching a partition the
    // group gave to another (two members would process it at once).
    yield* Effect.forkScoped(
      Effect.forever(
        Effect.andThen(
          Effect.sleep(ASSIGNMENT_CHECK_MS),
          Effect.sync(() => Queue.offerUnsafe(changes, undefined))
        )
      )
    )

    const group: GroupConsumer = {
      events: Stream.fromQueue(events),
      assignment: inner.assignment,
      batches: inner.batches,
      pause: inner.pause,
      resume: inner.resume,
      seek: inner.seek,
      position: inner.position,
      commit: (offsets) =>
        guard(() =>
          Effect.gen(function* () {
            for (const o of offsets) yield* deps.checkTp(o)
            if (offsets.length === 0) return
            yield* deps.call("commit", () =>
              member.commit({
                offsets: offsets.map((o) => ({
                  topic: o.topic,
                  partition: o.partition,
                  offset: BigInt(o.offset),
                  leaderEpoch: -1
                }))
              })
            )
          })
        ),
      committed: (tps) =>
        guard(() =>
          Effect.gen(function* () {
            for (const tp of tps) yield* deps.checkTp(tp)
            return yield* committedOf(tps)
          })
        ),
      membership: guard(() =>
        Effect.gen(function* () {
          // The id the coordinator gave this member at its last join (none while it rejoins).
          const memberId = member.memberId
          if (memberId === null) {
            return yield* Effect.fail(
              logError(
                new LogIoError({
                  operation: "membership",
                  detail: `group member of ${options.groupId} is rejoining its group`,
                  retryable: true
                })
              )
            )
          }
          const described = yield* deps.call("describeGroups", () =>
            deps.admin.describeGroups({ groups: [options.groupId] })
          )
          const members: Array<{ readonly memberId: string; readonly partitions: ReadonlyArray<TopicPartition> }> = []
          for (const m of described.get(options.groupId)?.members.values() ?? []) {
            // The coordinator's copy of the assignment it handed the member at the last SyncGroup, decoded by the
            // client (absent while a rebalance has not assigned it yet).
            const partitions: Array<TopicPartition> = []
            for (const a of m.assignments?.values() ?? []) {
              for (const partition of a.partitions) partitions.push({ topic: a.topic, partition })
            }
            partitions.sort((x, y) => (x.topic < y.topic ? -1 : x.topic > y.topic ? 1 : x.partition - y.partition))
            members.push({ memberId: m.id, partitions })
          }
          // Plain code-unit order: every member sorts the ids the same way.
          members.sort((x, y) => (x.memberId < y.memberId ? -1 : x.memberId > y.memberId ? 1 : 0))
          return { memberId, members }
        })
      )
    }
    groupMembers.set(group, {
      client: member,
      generation: () => generation,
      owns: (tp) => current.has(tpKey(tp))
    })
    return group
  })

/** A layer providing both `KafkaLog` and `Log`. */
export const layer = (options: KafkaLogOptions): Layer.Layer<KafkaLog | Log, LogError> =>
  Layer.effectContext(Effect.map(make(options), (log) => Context.make(KafkaLog, log).pipe(Context.add(Log, log))))

/** Like `layer`, with the options read from configuration. */
export const layerConfig = (
  config: Config.Wrap<KafkaLogOptions>
): Layer.Layer<KafkaLog | Log, LogError | Config.ConfigError> => Layer.unwrap(Effect.map(Config.unwrap(config), layer))
