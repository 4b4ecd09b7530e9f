/**
 * The log's admin client and what it knows of topics: partition counts and `max.message.bytes` limits (cached),
 * topic and partition checks, `ensureTopic` (which waits until the brokers' metadata shows the topic), the log start
 * and highwater offsets, and `deleteRecords`.
 *
 * @internal
 */
import { Errors, Log, Models, Retry } from "@strata/core"
import { Admin, ConfigResourceTypes, FetchIsolationLevels, ListOffsetTimestamps } from "@platformatic/kafka"
import { Data, Deferred, Effect, Schedule, type Scope } from "effect"
import { apiIds, mismatch, toLogError } from "./errors.js"
import * as KafkaCluster from "./kafkaCluster.js"
import * as RecordSize from "./recordSize.js"

const TOPIC = /^[a-zA-Z0-9._-]{1,249}$/
/** How often `ensureTopic` asks for a new topic's metadata while it waits for the brokers to know it. */
const TOPIC_POLL_MS = 50

/** The admin client with what it learned of the topics. */
export interface TopicAdmin {
  readonly cluster: KafkaCluster.Cluster
  readonly client: Admin
  /** The log's scope: `describeConfigs` lookups run in it, apart from the caller that started them. */
  readonly scope: Scope.Scope
  /** Partition counts of known topics (a topic never loses partitions). */
  readonly partitionCounts: Map<string, number>
  /**
   * Each topic's `max.message.bytes` (DescribeConfigs; the broker's `message.max.bytes` unless the topic sets one):
   * the most bytes one record batch, one partition's part of a produce request, may take.
   */
  readonly messageLimits: Map<string, number>
  /** Lookups under way: concurrent sends to a topic not seen yet share one DescribeConfigs. */
  readonly describing: Map<string, Deferred.Deferred<number, Log.LogError>>
}

/** Opens the admin client in the scope (closed with it, within the request timeout). */
export const open = (cluster: KafkaCluster.Cluster): Effect.Effect<TopicAdmin, never, Scope.Scope> =>
  Effect.gen(function* () {
    const client = yield* Effect.acquireRelease(
      Effect.sync(() => new Admin(cluster.base)),
      (a) => KafkaCluster.closeWithin(cluster.timeout, () => a.close())
    )
    return {
      cluster,
      client,
      scope: yield* Effect.scope,
      partitionCounts: new Map(),
      messageLimits: new Map(),
      describing: new Map()
    }
  })

/**
 * Fails fast, with the brokers named, when nothing answers a metadata request (retried with backoff), and at once
 * with `AuthenticationFailed` when the brokers refuse the credentials.
 */
export const checkConnected = (a: TopicAdmin): Effect.Effect<void, Log.LogError> =>
  KafkaCluster.call(a.cluster, "connect", () => a.client.metadata({ topics: [] })).pipe(
    Retry.retry({
      times: a.cluster.connectAttempts - 1,
      schedule: Schedule.exponential("200 millis"),
      while: (e) => e.reason._tag !== "AuthenticationFailed"
    }),
    Effect.mapError((e) =>
      e.reason._tag === "BrokerUnreachable" || e.reason._tag === "AuthenticationFailed"
        ? e
        : Log.logError(new Log.BrokerUnreachable({ brokers: [...a.cluster.brokers], detail: e.message }))
    ),
    Effect.asVoid
  )

/** A topic's partition count: known, or read from the metadata (`UnknownTopic` when it has none). */
export const partitionCount = (a: TopicAdmin, topic: string): Effect.Effect<number, Log.LogError> =>
  Effect.suspend(() => {
    const known = a.partitionCounts.get(topic)
    if (known !== undefined) return Effect.succeed(known)
    return KafkaCluster.call(a.cluster, "metadata", () => a.client.metadata({ topics: [topic] }), topic).pipe(
      Effect.flatMap((md) => {
        const count = md.topics.get(topic)?.partitionsCount
        if (count === undefined || count === 0) return Effect.fail(Log.logError(new Log.UnknownTopic({ topic })))
        a.partitionCounts.set(topic, count)
        return Effect.succeed(count)
      })
    )
  })

/** A topic's `max.message.bytes`: known, or looked up (one lookup at a time per topic, shared by its callers). */
export const messageLimit = (a: TopicAdmin, topic: string): Effect.Effect<number, Log.LogError> =>
  Effect.suspend(() => {
    const known = a.messageLimits.get(topic)
    if (known !== undefined) return Effect.succeed(known)
    const pending = a.describing.get(topic)
    if (pending !== undefined) return Deferred.await(pending)
    const done = Deferred.makeUnsafe<number, Log.LogError>()
    a.describing.set(topic, done)
    const lookup = describeLimit(a, topic).pipe(
      Effect.onExit((exit) =>
        Effect.sync(() => {
          a.describing.delete(topic)
          Deferred.doneUnsafe(done, exit)
        })
      )
    )
    return Effect.andThen(Effect.forkIn(lookup, a.scope), Deferred.await(done))
  })

/** Reads a topic's `max.message.bytes` with DescribeConfigs and remembers it. */
const describeLimit = (a: TopicAdmin, topic: string): Effect.Effect<number, Log.LogError> =>
  Effect.tryPromise({
    try: () =>
      a.client.describeConfigs({
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
        : Effect.fail(toLogError("describeConfigs", a.cluster.brokers, cause, topic))
    ),
    (effect) => KafkaCluster.bounded(a.cluster, "describeConfigs", effect),
    Effect.tap((limit) => Effect.sync(() => a.messageLimits.set(topic, limit)))
  )

/** The limit of a topic already validated (so known); Kafka's default for any other. */
export const limitOf = (a: TopicAdmin, topic: string): number =>
  a.messageLimits.get(topic) ?? RecordSize.DEFAULT_MESSAGE_MAX_BYTES

const invalidTopic = (topic: string) =>
  Log.logError(new Log.InvalidRequest({ detail: `invalid topic name ${JSON.stringify(topic)}` }))

/** A valid topic name's partition count; `InvalidRequest` for an invalid name. */
export const validTopic = (a: TopicAdmin, topic: string): Effect.Effect<number, Log.LogError> =>
  typeof topic === "string" && TOPIC.test(topic) ? partitionCount(a, topic) : Effect.fail(invalidTopic(topic))

/** Checks that a partition exists: a valid topic name, a known topic, a partition number within its count. */
export const checkTp = (a: TopicAdmin, tp: Models.TopicPartition): Effect.Effect<void, Log.LogError> =>
  Effect.suspend(() => {
    if (typeof tp.topic !== "string" || !TOPIC.test(tp.topic)) return Effect.fail(invalidTopic(tp.topic))
    return Effect.flatMap(partitionCount(a, tp.topic), (count) =>
      Number.isInteger(tp.partition) && tp.partition >= 0 && tp.partition < count
        ? Effect.void
        : Effect.fail(
            Log.logError(new Log.UnknownPartition({ topic: tp.topic, partition: tp.partition, partitions: count }))
          )
    )
  })

/** The topic configs `ensureTopic` creates a topic with. */
const topicConfigs = (spec: Log.TopicSpec) => [
  // Compacted changelogs keep "delete" too (with infinite retention) so that DeleteRecords stays allowed.
  ...(spec.compacted
    ? [
        { name: "cleanup.policy", value: "compact,delete" },
        { name: "retention.ms", value: "-1" },
        { name: "retention.bytes", value: "-1" }
      ]
    : []),
  ...Object.entries(spec.config ?? {}).map(([name, value]) => ({ name, value }))
]

/**
 * Creates the topic unless it exists, then waits until the brokers know it; fails with `TopicMismatch` when it
 * exists with another partition count.
 */
export const ensureTopic = (a: TopicAdmin, spec: Log.TopicSpec): Effect.Effect<void, Log.LogError> =>
  Effect.gen(function* () {
    if (typeof spec.topic !== "string" || !TOPIC.test(spec.topic)) {
      return yield* Effect.fail(invalidTopic(spec.topic))
    }
    if (!Number.isInteger(spec.partitions) || spec.partitions < 1) {
      return yield* Effect.fail(
        Log.logError(
          new Log.InvalidRequest({
            detail: `${spec.topic}: partitions must be a positive integer, got ${spec.partitions}`
          })
        )
      )
    }
    const configs = topicConfigs(spec)
    const created = yield* Effect.tryPromise({
      try: () =>
        a.client.createTopics({
          topics: [spec.topic],
          partitions: spec.partitions,
          // Unnamed: the brokers' `default.replication.factor` (KIP-464), as Kafka's own clients leave it.
          ...(spec.replicationFactor === undefined ? {} : { replicas: spec.replicationFactor }),
          configs
        }),
      catch: (cause) => cause
    }).pipe(
      Effect.as(true),
      Effect.catch((cause) =>
        apiIds(cause).has("TOPIC_ALREADY_EXISTS")
          ? Effect.succeed(false)
          : Effect.fail(toLogError("ensureTopic", a.cluster.brokers, cause, spec.topic))
      ),
      (effect) => KafkaCluster.bounded(a.cluster, "ensureTopic", effect)
    )
    // The controller answers before the brokers know the topic: a produce right away could fail with "unknown
    // topic" (seen right after a broker start). Like Kafka Streams, wait until the metadata shows it, and for a
    // topic created here until every partition has a leader.
    a.partitionCounts.delete(spec.topic)
    a.messageLimits.delete(spec.topic)
    const actual = yield* awaitTopic(a, spec.topic, created)
    if (actual !== spec.partitions) return yield* Effect.fail(mismatch(spec.topic, spec.partitions, actual))
    a.partitionCounts.set(spec.topic, actual)
  })

/** The topic is not listed yet, or not led everywhere yet: asked again until the deadline. */
class TopicNotSettled extends Data.TaggedError("TopicNotSettled")<{ readonly detail: string }> {}

/**
 * The topic's partition count once the brokers' metadata lists it (with a leader for every partition when
 * `led`), asked again every `TOPIC_POLL_MS` for up to the request timeout.
 */
const awaitTopic = (a: TopicAdmin, topic: string, led: boolean): Effect.Effect<number, Log.LogError> => {
  const timeout = a.cluster.base.timeout
  const ask = Effect.gen(function* () {
    const md = yield* KafkaCluster.call(
      a.cluster,
      "ensureTopic",
      () => a.client.metadata({ topics: [topic], forceUpdate: true }),
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
    return yield* Effect.fail(
      new TopicNotSettled({
        detail:
          t === undefined
            ? `${topic} is not in the brokers' metadata ${timeout} ms after it was created or found`
            : `${topic} has ${leaderless} of ${t.partitionsCount} partitions without a leader ${timeout} ms after it was created`
      })
    )
  })
  return ask.pipe(
    Retry.retry({
      schedule: Schedule.spaced(TOPIC_POLL_MS),
      deadline: timeout,
      while: (e) => e instanceof TopicNotSettled
    }),
    Effect.catchTag("TopicNotSettled", (e) =>
      Effect.fail(Log.logError(new Log.IoError({ operation: "ensureTopic", detail: e.detail, retryable: true })))
    )
  )
}

/** Each partition's log start and highwater (at `read_committed`, the last stable offset), in the order given. */
export const offsets = (
  a: TopicAdmin,
  tps: ReadonlyArray<Models.TopicPartition>,
  offsetsOptions?: Log.OffsetsOptions
): Effect.Effect<Array<Log.PartitionOffsets>, Log.LogError> =>
  Effect.gen(function* () {
    for (const tp of tps) yield* checkTp(a, tp)
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
        KafkaCluster.call(a.cluster, "offsets", () => a.client.listOffsets(request(ListOffsetTimestamps.EARLIEST))),
        KafkaCluster.call(a.cluster, "offsets", () =>
          a.client.listOffsets({ ...request(ListOffsetTimestamps.LATEST), isolationLevel })
        )
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
      (tp): Log.PartitionOffsets => ({
        topic: tp.topic,
        partition: tp.partition,
        logStart: starts.get(Models.tpKey(tp)) ?? 0,
        highwater: ends.get(Models.tpKey(tp)) ?? 0
      })
    )
  })

/** Fails with `OffsetOutOfRange` for `offset`, naming the partition's current log start and highwater. */
export const outOfRange = (
  a: TopicAdmin,
  tp: Models.TopicPartition,
  offset: number
): Effect.Effect<never, Log.LogError> =>
  Effect.flatMap(offsets(a, [tp]), ([o]) =>
    Effect.fail(
      Log.logError(
        new Errors.OffsetOutOfRange({
          topic: tp.topic,
          partition: tp.partition,
          offset,
          logStart: o!.logStart,
          highwater: o!.highwater
        })
      )
    )
  )

/** Deletes a partition's records below `offset` (DeleteRecords); `OffsetOutOfRange` beyond its highwater. */
export const deleteRecords = (
  a: TopicAdmin,
  tp: Models.TopicPartition,
  offset: number
): Effect.Effect<void, Log.LogError> =>
  Effect.gen(function* () {
    yield* checkTp(a, tp)
    yield* Effect.tryPromise({
      try: () =>
        a.client.deleteRecords({
          topics: [{ name: tp.topic, partitions: [{ partition: tp.partition, offset: BigInt(offset) }] }]
        }),
      catch: (cause) => cause
    }).pipe(
      Effect.catch((cause) =>
        apiIds(cause).has("OFFSET_OUT_OF_RANGE")
          ? outOfRange(a, tp, offset)
          : Effect.fail(toLogError("deleteRecords", a.cluster.brokers, cause, tp.topic))
      ),
      (effect) => KafkaCluster.bounded(a.cluster, "deleteRecords", effect)
    )
  })
