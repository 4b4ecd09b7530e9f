/**
 * The group-less changelog consumer: the client for metadata, its own connections and decoder for fetches. Each
 * pull sends one `Fetch` per partition leader for the assigned, unpaused partitions at the positions kept here, and
 * hands out the records a chunk at a time, partitions taking turns. Seek, pause and unassign bump a partition's
 * generation so that records fetched before them are dropped; an out-of-range position fails with
 * `OffsetOutOfRange` and is never reset.
 *
 * @internal
 */
import { Log, Models, Retry } from "@strata/core"
import { type Broker, ConnectionPool, Consumer, FetchIsolationLevels, type fetchV17 } from "@platformatic/kafka"
import { Deferred, Effect, Exit, Schedule, type Scope, Stream } from "effect"
import { noAnswer, toLogError } from "./errors.js"
import {
  FETCH_API_KEY,
  type FetchResponse,
  fetchRequests,
  MAX_FETCH_VERSION,
  MIN_FETCH_VERSION,
  parseFetchResponse,
  RecordBatchReader
} from "./fetchProtocol.js"
import * as KafkaAdmin from "./kafkaAdmin.js"
import * as KafkaCluster from "./kafkaCluster.js"

/** Kafka error codes a fetch handles itself: offset out of range, and the ones that mean stale metadata. */
const OFFSET_OUT_OF_RANGE = 1
/** Unknown topic or partition, leader not available, not leader or follower, unknown topic id. */
const STALE_METADATA = new Set([3, 5, 6, 100])

/** What every consumer of the log fetches with. */
export interface ConsumerSettings {
  readonly admin: KafkaAdmin.TopicAdmin
  /** How long a fetch waits at the broker for new records. */
  readonly maxWait: number
  readonly fetchMaxBytes: number
  readonly fetchPartitionMaxBytes: number
}

interface Assigned {
  readonly tp: Models.TopicPartition
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

/** A partition as one fetch asked for it: where it was and in which generation. */
interface Asked {
  readonly a: Assigned
  readonly generation: number
  readonly position: number
}

/** Whether the consumer is closed, and what a pull with nothing to fetch waits on (completed by `wake`). */
interface Wake {
  closed: boolean
  signal: Deferred.Deferred<void>
}

/** A running changelog consumer. */
interface ChangelogConsumer {
  readonly settings: ConsumerSettings
  readonly base: KafkaCluster.ClientBase
  readonly maxBatchRecords: number
  /** Fetch at `read_committed`: records of open and aborted transactions are never delivered. */
  readonly readCommitted: boolean
  readonly fetcher: Consumer
  readonly pool: ConnectionPool
  readonly wake: Wake
  readonly assigned: Map<string, Assigned>
  readonly paused: Set<string>
  readonly pending: Array<Pending>
  /** Topic ids, partition leaders and broker addresses, refreshed when a fetch names a topic not yet seen. */
  readonly topicIds: Map<string, string>
  readonly topicNames: Map<string, string>
  readonly leaders: Map<string, number>
  readonly nodes: Map<number, Broker>
  /** The Fetch version agreed with the brokers, once asked. */
  fetchVersion: number | undefined
}

let consumerCount = 0

/** Checks the consumer's options: `InvalidRequest` names the first bad one. */
const checkOptions = (options: Log.ConsumerOptions | undefined): Log.LogError | undefined => {
  const max = options?.maxBatchRecords
  const isolation = options?.isolation ?? "read_uncommitted"
  if (isolation !== "read_uncommitted" && isolation !== "read_committed") {
    return Log.logError(
      new Log.InvalidRequest({ detail: `isolation must be read_uncommitted or read_committed, got ${isolation}` })
    )
  }
  if (max !== undefined && (!Number.isInteger(max) || max < 1)) {
    return Log.logError(new Log.InvalidRequest({ detail: `maxBatchRecords must be a positive integer, got ${max}` }))
  }
  return undefined
}

/** Opens a group-less changelog consumer in the scope (`Log.consumer`). */
export const make = (
  settings: ConsumerSettings,
  options?: Log.ConsumerOptions
): Effect.Effect<Log.Consumer, Log.LogError, Scope.Scope> => {
  const invalid = checkOptions(options)
  if (invalid !== undefined) return Effect.fail(invalid)
  return Effect.gen(function* () {
    const base = settings.admin.cluster.base
    const fetcher = yield* Effect.acquireRelease(
      Effect.sync(
        () =>
          new Consumer({
            ...base,
            // Required by the client's constructor; no group is ever joined.
            groupId: `strata-changelog-${process.pid}-${++consumerCount}`,
            maxWaitTime: settings.maxWait,
            isolationLevel: FetchIsolationLevels.READ_UNCOMMITTED
          })
      ),
      (c) => KafkaCluster.closeWithin(base.requestTimeout, () => c.close(true))
    )
    const wake: Wake = { closed: false, signal: Deferred.makeUnsafe<void>() }
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        wake.closed = true
        wakeUp(wake)
      })
    )
    // Fetches go through a connection pool of the consumer's own, with the Fetch version the brokers support
    // (13–17: the topic-id versions), and are decoded by `fetchProtocol`.
    const pool = yield* Effect.acquireRelease(
      Effect.sync(
        () =>
          new ConnectionPool(base.clientId, {
            connectTimeout: base.timeout,
            requestTimeout: base.timeout + settings.maxWait,
            ...(base.tls === undefined ? {} : { tls: base.tls }),
            ...(base.sasl === undefined ? {} : { sasl: base.sasl })
          })
      ),
      (p) => Effect.promise(() => p.close().catch(() => undefined))
    )
    return shapeOf({
      settings,
      base,
      maxBatchRecords: options?.maxBatchRecords ?? 1000,
      readCommitted: (options?.isolation ?? "read_uncommitted") === "read_committed",
      fetcher,
      pool,
      wake,
      assigned: new Map(),
      paused: new Set(),
      pending: [],
      topicIds: new Map(),
      topicNames: new Map(),
      leaders: new Map(),
      nodes: new Map(),
      fetchVersion: undefined
    })
  })
}

/** Completes the signal a waiting pull awaits, and sets a new one. */
const wakeUp = (w: Wake): void => {
  const s = w.signal
  w.signal = Deferred.makeUnsafe<void>()
  Deferred.doneUnsafe(s, Exit.void)
}

const closedError = () => Log.logError(new Log.Closed({ what: "Kafka changelog consumer" }))

/** A record batch the decoder cannot read (it names the topic, partition and offset). */
const undecodable = (cause: unknown) =>
  Log.logError(
    new Log.IoError({
      operation: "fetch",
      detail: String((cause as Error).message ?? cause),
      retryable: false
    })
  )

/** Runs `f` unless the consumer is closed (then fails with `LogClosed`). */
const guard = <A>(s: ChangelogConsumer, f: () => Effect.Effect<A, Log.LogError>): Effect.Effect<A, Log.LogError> =>
  Effect.suspend(() => (s.wake.closed ? Effect.fail(closedError()) : f()))

/** The partition's assignment, or `NotAssigned`. */
const entry = (s: ChangelogConsumer, tp: Models.TopicPartition): Effect.Effect<Assigned, Log.LogError> => {
  const a = s.assigned.get(Models.tpKey(tp))
  return a === undefined
    ? Effect.fail(Log.logError(new Log.NotAssigned({ topic: tp.topic, partition: tp.partition })))
    : Effect.succeed(a)
}

/** Reads the topics' ids and partition leaders, and the brokers' addresses. */
const refreshMetadata = (s: ChangelogConsumer, topics: ReadonlyArray<string>): Effect.Effect<void, Log.LogError> =>
  Effect.map(
    KafkaCluster.call(s.settings.admin.cluster, "metadata", () =>
      s.fetcher.metadata({ topics: [...topics], forceUpdate: true })
    ),
    (md) => {
      for (const [id, b] of md.brokers) s.nodes.set(id, { host: b.host, port: b.port })
      for (const t of topics) {
        const info = md.topics.get(t)
        if (info === undefined) continue
        s.topicIds.set(t, info.id)
        s.topicNames.set(info.id, t)
        info.partitions.forEach((p, i) => {
          s.leaders.set(`${t}/${i}`, p.leader)
        })
      }
    }
  )

/** The Fetch version to use: the highest both sides support, asked once; `InvalidRequest` below v13. */
const negotiate = (s: ChangelogConsumer): Effect.Effect<number, Log.LogError> =>
  Effect.suspend(() => {
    if (s.fetchVersion !== undefined) return Effect.succeed(s.fetchVersion)
    return Effect.flatMap(
      KafkaCluster.call(s.settings.admin.cluster, "apiVersions", () => s.fetcher.listApis()),
      (apis) => {
        const max = apis.find((a) => a.apiKey === FETCH_API_KEY)?.maxVersion ?? -1
        if (max < MIN_FETCH_VERSION) {
          return Effect.fail(
            Log.logError(
              new Log.InvalidRequest({
                detail: `the brokers support Fetch up to v${max}; the changelog consumer needs v${MIN_FETCH_VERSION} (Kafka 3.1 or later)`
              })
            )
          )
        }
        const version = Math.min(max, MAX_FETCH_VERSION)
        s.fetchVersion = version
        return Effect.succeed(version)
      }
    )
  })

/** Sends one Fetch request to broker `node` through the consumer's connection pool. */
const sendFetch = (
  s: ChangelogConsumer,
  node: number,
  version: number,
  topics: Parameters<typeof fetchV17.createRequest>[6]
): Effect.Effect<FetchResponse, unknown> =>
  Effect.callback<FetchResponse, unknown>((resume) => {
    const broker = s.nodes.get(node)
    if (broker === undefined) {
      resume(Effect.fail(new Error(`no address known for broker ${node}`)))
      return
    }
    s.pool.get(broker, (error, connection) => {
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
            s.settings.maxWait,
            1,
            s.settings.fetchMaxBytes,
            s.readCommitted ? FetchIsolationLevels.READ_COMMITTED : FetchIsolationLevels.READ_UNCOMMITTED,
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

/** One Fetch for the active partitions, one request per partition leader, all at once. */
const fetchOnce = (s: ChangelogConsumer, active: ReadonlyArray<Assigned>): Effect.Effect<void, Log.LogError> =>
  Effect.gen(function* () {
    const missing = [...new Set(active.map((a) => a.tp.topic))].filter((t) => !s.topicIds.has(t))
    if (missing.length > 0) yield* refreshMetadata(s, missing)
    const version = yield* negotiate(s)
    const byNode = new Map<number, Array<Assigned>>()
    for (const a of active) {
      const node = s.leaders.get(Models.tpKey(a.tp)) ?? -1
      byNode.set(node, [...(byNode.get(node) ?? []), a])
    }
    const requests = [...byNode].map(([node, parts]) => fetchFrom(s, version, node, parts))
    yield* Effect.all(requests, { concurrency: "unbounded", discard: true })
  })

/**
 * Fetches the partitions `node` leads, at their positions now, bounded by the request timeout and the fetch's
 * wait, and queues what came back.
 */
const fetchFrom = (
  s: ChangelogConsumer,
  version: number,
  node: number,
  parts: ReadonlyArray<Assigned>
): Effect.Effect<void, Log.LogError> => {
  const snapshot: Array<Asked> = parts.map((a) => ({ a, generation: a.generation, position: a.position }))
  const byTopic = new Map<string, Array<Asked>>()
  for (const x of snapshot) byTopic.set(x.a.tp.topic, [...(byTopic.get(x.a.tp.topic) ?? []), x])
  const topics = [...byTopic].map(([topic, xs]) => ({
    topicId: s.topicIds.get(topic)!,
    partitions: xs.map((x) => ({
      partition: x.a.tp.partition,
      fetchOffset: BigInt(x.position),
      currentLeaderEpoch: -1,
      lastFetchedEpoch: -1,
      partitionMaxBytes: s.settings.fetchPartitionMaxBytes
    }))
  }))
  const leader = s.nodes.get(node)
  // The broker holds a fetch up to maxWait before answering.
  const deadline = s.base.requestTimeout + s.settings.maxWait
  return sendFetch(s, node, version, topics).pipe(
    Retry.retry({ times: s.base.retries, schedule: Schedule.spaced(s.base.retryDelay) }),
    Effect.mapError((cause) => toLogError("fetch", s.base.bootstrapBrokers, cause)),
    Effect.timeoutOrElse({
      duration: deadline,
      orElse: () =>
        Effect.fail(
          noAnswer(
            "fetch",
            leader === undefined ? s.base.bootstrapBrokers : [`${leader.host}:${leader.port}`],
            deadline
          )
        )
    }),
    Effect.flatMap((response) =>
      response.errorCode === 0
        ? collect(s, response, snapshot)
        : Effect.fail(
            Log.logError(
              new Log.IoError({
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
        for (const topic of byTopic.keys()) s.topicIds.delete(topic)
      })
    )
  )
}

/**
 * Queues each asked partition's records for delivery, unless pause, seek or unassign made them stale; fails with
 * `OffsetOutOfRange` for a current position the broker does not hold.
 */
const collect = (
  s: ChangelogConsumer,
  response: FetchResponse,
  snapshot: ReadonlyArray<Asked>
): Effect.Effect<void, Log.LogError> =>
  Effect.gen(function* () {
    const asked = new Map(snapshot.map((x) => [Models.tpKey(x.a.tp), x]))
    for (const topicResponse of response.responses) {
      const topic = s.topicNames.get(topicResponse.topicId) ?? ""
      for (const p of topicResponse.partitions) {
        const key = `${topic}/${p.partitionIndex}`
        const x = asked.get(key)
        if (x === undefined) continue
        const current = s.assigned.get(key)
        const stale = current === undefined || current.generation !== x.generation || s.paused.has(key)
        if (p.errorCode === OFFSET_OUT_OF_RANGE) {
          if (!stale) return yield* KafkaAdmin.outOfRange(s.settings.admin, x.a.tp, x.position)
          continue
        }
        if (p.errorCode !== 0) {
          if (STALE_METADATA.has(p.errorCode)) yield* refreshMetadata(s, [topic])
          continue
        }
        if (stale || p.records === undefined) continue
        const target = {
          topic,
          partition: p.partitionIndex,
          from: x.position,
          chunkSize: s.maxBatchRecords,
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
        s.pending.push({
          key,
          generation: x.generation,
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
const nextPending = (s: ChangelogConsumer): Log.Batch | undefined => {
  while (s.pending.length > 0) {
    const p = s.pending.shift()!
    const a = s.assigned.get(p.key)
    if (a === undefined || a.generation !== p.generation || s.paused.has(p.key)) continue
    const all = p.reader.next()
    if (all === undefined) {
      // Every whole batch read: move past trailing markers and compacted gaps too.
      if (p.reader.end > a.position) a.position = p.reader.end
      continue
    }
    s.pending.push(p)
    if (all[all.length - 1]!.offset < a.position) continue
    // Copy only when the position is in the middle of the chunk.
    const records = all[0]!.offset >= a.position ? all : all.filter((r) => r.offset >= a.position)
    a.position = all[all.length - 1]!.offset + 1
    return { topic: p.topic, partition: p.partition, records, highwater: p.highwater }
  }
  return undefined
}

/** The next batch: one already fetched, else fetched now (waiting while no partition is active). */
const pull = (s: ChangelogConsumer): Effect.Effect<Log.Batch, Log.LogError> =>
  Effect.gen(function* () {
    for (;;) {
      if (s.wake.closed) return yield* Effect.fail(closedError())
      const ready = yield* Effect.try({ try: () => nextPending(s), catch: undecodable })
      if (ready !== undefined) return ready
      const active = [...s.assigned.values()].filter((a) => !s.paused.has(Models.tpKey(a.tp)))
      if (active.length === 0) {
        yield* Deferred.await(s.wake.signal)
        continue
      }
      yield* fetchOnce(s, active)
    }
  })

/** Assigns the partitions not assigned yet, each at its log start. */
const assign = (s: ChangelogConsumer, tps: ReadonlyArray<Models.TopicPartition>): Effect.Effect<void, Log.LogError> =>
  guard(s, () =>
    Effect.gen(function* () {
      for (const tp of tps) yield* KafkaAdmin.checkTp(s.settings.admin, tp)
      const fresh = tps.filter((tp) => !s.assigned.has(Models.tpKey(tp)))
      const starts = yield* KafkaAdmin.offsets(s.settings.admin, fresh)
      for (const o of starts) {
        s.assigned.set(Models.tpKey(o), {
          tp: { topic: o.topic, partition: o.partition },
          position: o.logStart,
          generation: 0
        })
      }
      wakeUp(s.wake)
    })
  )

/** Drops the partitions (and their pause), and the records fetched for them. */
const unassign = (s: ChangelogConsumer, tps: ReadonlyArray<Models.TopicPartition>): Effect.Effect<void, Log.LogError> =>
  guard(s, () =>
    Effect.sync(() => {
      for (const tp of tps) {
        const a = s.assigned.get(Models.tpKey(tp))
        if (a !== undefined) a.generation++
        s.assigned.delete(Models.tpKey(tp))
        s.paused.delete(Models.tpKey(tp))
      }
    })
  )

/** Moves an assigned partition to `offset`, which must be within its log start and highwater. */
const seek = (s: ChangelogConsumer, tp: Models.TopicPartition, offset: number): Effect.Effect<void, Log.LogError> =>
  guard(s, () =>
    Effect.gen(function* () {
      const a = yield* entry(s, tp)
      const [o] = yield* KafkaAdmin.offsets(s.settings.admin, [tp])
      if (!Number.isInteger(offset) || offset < o!.logStart || offset > o!.highwater) {
        return yield* KafkaAdmin.outOfRange(s.settings.admin, tp, offset)
      }
      a.position = offset
      a.generation++
      wakeUp(s.wake)
    })
  )

/** Stops delivering the assigned partitions among `tps` (what was fetched for them is dropped). */
const pause = (s: ChangelogConsumer, tps: ReadonlyArray<Models.TopicPartition>): Effect.Effect<void> =>
  Effect.sync(() => {
    for (const tp of tps) {
      const a = s.assigned.get(Models.tpKey(tp))
      if (a === undefined) continue
      s.paused.add(Models.tpKey(tp))
      a.generation++
    }
  })

/** Delivers the partitions again. */
const resume = (s: ChangelogConsumer, tps: ReadonlyArray<Models.TopicPartition>): Effect.Effect<void> =>
  Effect.sync(() => {
    for (const tp of tps) s.paused.delete(Models.tpKey(tp))
    wakeUp(s.wake)
  })

/** The running consumer as its users see it. */
const shapeOf = (s: ChangelogConsumer): Log.Consumer => ({
  assign: (tps) => assign(s, tps),
  unassign: (tps) => unassign(s, tps),
  assignment: Effect.sync(() => [...s.assigned.values()].map((a) => a.tp)),
  seek: (tp, offset) => seek(s, tp, offset),
  position: (tp) => guard(s, () => Effect.map(entry(s, tp), (a) => a.position)),
  pause: (tps) => pause(s, tps),
  resume: (tps) => resume(s, tps),
  paused: Effect.sync(() => [...s.paused].map((k) => s.assigned.get(k)!.tp)),
  batches: Stream.fromEffectRepeat(pull(s))
})
