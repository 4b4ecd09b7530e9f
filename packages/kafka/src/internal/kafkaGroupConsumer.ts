/**
 * The group consumer: the client joins the group (and heartbeats in the background); records are fetched by an
 * inner group-less consumer whose assignment follows the group's (core's `GroupFollower`: `Revoked` before
 * `Assigned`, gained partitions from their committed offsets). A transaction
 * finds a member's client, generation and ownership through `memberOf`.
 *
 * @internal
 */
import { Consumer, type GroupAssignment } from "@platformatic/kafka"
import { GroupFollower, Log, Models } from "@strata/core"
import { Effect, Queue, type Scope } from "effect"
import * as KafkaAdmin from "./kafkaAdmin.js"
import * as KafkaCluster from "./kafkaCluster.js"
import * as KafkaConsumer from "./kafkaConsumer.js"

/** How often a group member compares its assignment with the client's, besides the client's events. */
const ASSIGNMENT_CHECK_MS = 250
/** A group member's session and rebalance timeouts. */
const SESSION_TIMEOUT_MS = 10_000
const REBALANCE_TIMEOUT_MS = 10_000
/**
 * How long a group member's requests may wait at least: the coordinator holds a JoinGroup until the rebalance
 * completes (up to the rebalance timeout), so the member waits that long and 5 s more, as Kafka's Java client does.
 */
const GROUP_REQUEST_TIMEOUT_MS = REBALANCE_TIMEOUT_MS + 5000

/** A join the group member followed: its generation and the assignment made in it. */
interface Joined {
  readonly generationId: number
  readonly assignments: ReadonlyArray<GroupAssignment> | null
}

/** A group member as a transaction sees it: its client and the assignment it last followed. */
export interface GroupMember {
  readonly client: Consumer
  /**
   * The generation of the assignment the member follows. The client's own generation moves on at a rejoin before
   * the member has let go of what it lost; offsets committed with this one are refused once the group moved on.
   */
  readonly generation: () => number
  /** Whether the member holds the partition in the assignment it follows. */
  readonly owns: (tp: Models.TopicPartition) => boolean
}

/** A running group member. */
interface Member {
  readonly options: Log.GroupConsumerOptions
  readonly admin: KafkaAdmin.TopicAdmin
  /** The inner consumer, the events and the partitions held. */
  readonly follower: GroupFollower.GroupFollower
  /** What to follow: a join's generation with its assignment, or (undefined) the client's current assignment. */
  readonly changes: Queue.Queue<Joined | undefined>
  readonly client: Consumer
  readonly groupTimeout: number
  /**
   * The generation of the last join followed: a transaction commits offsets with it, so once the group moves on
   * (a generation this member has not followed yet) the coordinator refuses them.
   */
  generation: number
}

/** The client behind each group consumer, with what it last followed (a transaction commits source offsets with it). */
const groupMembers = new WeakMap<Log.GroupConsumer, GroupMember>()

/** The client behind a group consumer of a Kafka log, if it is one. */
export const memberOf = (group: Log.GroupConsumer): GroupMember | undefined => groupMembers.get(group)

/** Opens a group member in the scope (`Log.groupConsumer`), joined and following its group's assignment. */
export const make = (
  settings: KafkaConsumer.ConsumerSettings,
  options: Log.GroupConsumerOptions
): Effect.Effect<Log.GroupConsumer, Log.LogError, Scope.Scope> =>
  Effect.gen(function* () {
    if (typeof options.groupId !== "string" || options.groupId.length === 0) {
      return yield* Effect.fail(Log.logError(new Log.InvalidRequest({ detail: "groupId must be a non-empty string" })))
    }
    const admin = settings.admin
    for (const topic of options.topics) yield* KafkaAdmin.partitionCount(admin, topic)
    const groupTimeout = Math.max(admin.cluster.base.requestTimeout, GROUP_REQUEST_TIMEOUT_MS)
    const inner = yield* KafkaConsumer.make(settings, {
      ...(options.maxBatchRecords === undefined ? {} : { maxBatchRecords: options.maxBatchRecords }),
      ...(options.isolation === undefined ? {} : { isolation: options.isolation })
    })
    const follower = yield* GroupFollower.make(inner, `group member of ${options.groupId}`)
    const changes = yield* Queue.unbounded<Joined | undefined>()
    const client = yield* openClient(admin.cluster, options, groupTimeout, changes)
    const m: Member = {
      options,
      admin,
      follower,
      changes,
      client,
      groupTimeout,
      generation: -1
    }
    yield* start(m)
    const group = GroupFollower.groupConsumer(follower, {
      commit: (offsets) => commit(m, offsets),
      committed: (tps) =>
        Effect.gen(function* () {
          for (const tp of tps) yield* KafkaAdmin.checkTp(m.admin, tp)
          return yield* committedOf(m, tps)
        }),
      membership: membership(m)
    })
    groupMembers.set(group, {
      client,
      generation: () => m.generation,
      owns: (tp) => GroupFollower.holds(follower, tp)
    })
    return group
  })

/**
 * The member's client, in the scope: it tracks the topics and offers each assignment change to `changes`. Closing
 * leaves the group, then closes the client.
 */
const openClient = (
  cluster: KafkaCluster.Cluster,
  options: Log.GroupConsumerOptions,
  groupTimeout: number,
  changes: Queue.Queue<Joined | undefined>
): Effect.Effect<Consumer, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const c = new Consumer({
        ...cluster.base,
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
          cluster.base.requestTimeout
        ),
        KafkaCluster.closeWithin(cluster.base.requestTimeout, () => c.close(true))
      )
  )

/** Joins the group, follows the first assignment, and keeps following the group's changes in the scope. */
const start = (m: Member): Effect.Effect<void, Log.LogError, Scope.Scope> =>
  Effect.gen(function* () {
    yield* KafkaCluster.call(m.admin.cluster, "joinGroup", () => m.client.joinGroup({}), undefined, m.groupTimeout)
    yield* sync(
      m,
      m.client.assignments === null
        ? undefined
        : { generationId: m.client.generationId, assignments: m.client.assignments }
    )
    // A failure while following the group ends the member's event stream with that error.
    yield* Effect.forkScoped(
      Effect.forever(Effect.flatMap(Queue.take(m.changes), (joined) => sync(m, joined))).pipe(
        Effect.catch((e) => GroupFollower.fail(m.follower, e))
      )
    )
    // A change the client made without an event is still followed: a member must never keep fetching a partition the
    // group gave to another (two members would process it at once).
    yield* Effect.forkScoped(
      Effect.forever(
        Effect.andThen(
          Effect.sleep(ASSIGNMENT_CHECK_MS),
          Effect.sync(() => Queue.offerUnsafe(m.changes, undefined))
        )
      )
    )
  })

/** The group's committed offsets of the partitions that have one. */
const committedOf = (
  m: Member,
  tps: ReadonlyArray<Models.TopicPartition>
): Effect.Effect<Array<Models.TopicPartitionOffset>, Log.LogError> =>
  Effect.gen(function* () {
    if (tps.length === 0) return []
    const byTopic = new Map<string, Array<number>>()
    for (const tp of tps) byTopic.set(tp.topic, [...(byTopic.get(tp.topic) ?? []), tp.partition])
    const listed = yield* KafkaCluster.call(m.admin.cluster, "committed", () =>
      m.client.listCommittedOffsets({ topics: [...byTopic].map(([topic, partitions]) => ({ topic, partitions })) })
    )
    const out: Array<Models.TopicPartitionOffset> = []
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
const sync = (m: Member, joined: Joined | undefined): Effect.Effect<void, Log.LogError> =>
  Effect.gen(function* () {
    if (joined !== undefined && joined.generationId < m.generation) return
    const next = new Map<string, Models.TopicPartition>()
    for (const a of (joined === undefined ? m.client.assignments : joined.assignments) ?? []) {
      for (const partition of a.partitions) next.set(`${a.topic}/${partition}`, { topic: a.topic, partition })
    }
    const held = m.follower.held
    yield* GroupFollower.revoke(
      m.follower,
      [...held].filter(([k]) => !next.has(k)).map(([, tp]) => tp)
    )
    const gained = [...next].filter(([k]) => !held.has(k)).map(([, tp]) => tp)
    if (gained.length > 0) {
      const committed = new Map((yield* committedOf(m, gained)).map((c) => [Models.tpKey(c), c.offset] as const))
      const bounds = yield* KafkaAdmin.offsets(m.admin, gained)
      yield* GroupFollower.assign(
        m.follower,
        bounds.map((b) => {
          const c = committed.get(Models.tpKey(b))
          return {
            tp: { topic: b.topic, partition: b.partition },
            offset: c === undefined ? undefined : Math.min(Math.max(c, b.logStart), b.highwater)
          }
        })
      )
    }
    if (joined !== undefined) m.generation = joined.generationId
  })

/** Commits the offsets for the group (not within a transaction). */
const commit = (m: Member, offsets: ReadonlyArray<Models.TopicPartitionOffset>): Effect.Effect<void, Log.LogError> =>
  Effect.gen(function* () {
    for (const o of offsets) yield* KafkaAdmin.checkTp(m.admin, o)
    if (offsets.length === 0) return
    yield* KafkaCluster.call(m.admin.cluster, "commit", () =>
      m.client.commit({
        offsets: offsets.map((o) => ({
          topic: o.topic,
          partition: o.partition,
          offset: BigInt(o.offset),
          leaderEpoch: -1
        }))
      })
    )
  })

/** The member's id and every member's assignment, as the coordinator describes the group; members by id. */
const membership = (m: Member) =>
  Effect.gen(function* () {
    // The id the coordinator gave this member at its last join (none while it rejoins).
    const memberId = m.client.memberId
    if (memberId === null) {
      return yield* Effect.fail(
        Log.logError(
          new Log.IoError({
            operation: "membership",
            detail: `group member of ${m.options.groupId} is rejoining its group`,
            retryable: true
          })
        )
      )
    }
    const described = yield* KafkaCluster.call(m.admin.cluster, "describeGroups", () =>
      m.admin.client.describeGroups({ groups: [m.options.groupId] })
    )
    const members: Array<{ readonly memberId: string; readonly partitions: ReadonlyArray<Models.TopicPartition> }> = []
    for (const d of described.get(m.options.groupId)?.members.values() ?? []) {
      // The coordinator's copy of the assignment it handed the member at the last SyncGroup, decoded by the
      // client (absent while a rebalance has not assigned it yet).
      const partitions: Array<Models.TopicPartition> = []
      for (const a of d.assignments?.values() ?? []) {
        for (const partition of a.partitions) partitions.push({ topic: a.topic, partition })
      }
      partitions.sort((x, y) => (x.topic < y.topic ? -1 : x.topic > y.topic ? 1 : x.partition - y.partition))
      members.push({ memberId: d.id, partitions })
    }
    // Plain code-unit order: every member sorts the ids the same way.
    members.sort((x, y) => (x.memberId < y.memberId ? -1 : x.memberId > y.memberId ? 1 : 0))
    return { memberId, members }
  })
