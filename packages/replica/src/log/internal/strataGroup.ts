/**
 * The Strata log's consumer groups, kept in the cluster's coordination (`<ns>/groups/<group>`):
 *
 * - each member is an ephemeral sequential node under `members/`; every member computes the same assignment from
 *   the sorted member list (the group's partitions dealt round-robin; the members of a group subscribe to the same
 *   topics);
 * - a partition is owned through an ephemeral node under `owners/`: a member releases what it lost (announcing
 *   `Revoked`) before the next owner can create the node, and announces `Assigned` only once it owns it, so two
 *   members never hold one partition at once (a dead member's nodes go with its session);
 * - committed offsets are persistent nodes under `offsets/`, written only by the partition's owner (a check on its
 *   owner node in the same transaction).
 *
 * @internal
 */
import { Coordination, CoordinationPaths, GroupFollower, Log, type Models, Retry } from "@strata/core"
import { Duration, Effect, Option, Schedule, type Scope } from "effect"
import { makeConsumer } from "./strataConsumer.js"
import { checkPartition, partitionsOf, type Shared } from "./strataShared.js"

const encoder = new TextEncoder()
const decoder = new TextDecoder()
/** A partition's name in the group's paths. */
const keyOf = (tp: Models.TopicPartition) => `${tp.topic}:${tp.partition}`
const fromKey = (key: string): Models.TopicPartition => {
  const at = key.lastIndexOf(":")
  return { topic: key.slice(0, at), partition: Number(key.slice(at + 1)) }
}

const ioError = (operation: string) => (e: Coordination.CoordinationError) =>
  new Log.LogError({ reason: new Log.IoError({ operation, detail: e.message, retryable: true }) })

/** What each of `members` (sorted) is dealt of `partitions` (sorted). */
export const deal = (partitions: ReadonlyArray<string>, members: ReadonlyArray<string>): Map<string, Array<string>> => {
  const out = new Map<string, Array<string>>(members.map((m) => [m, []]))
  partitions.forEach((p, i) => {
    out.get(members[i % members.length]!)!.push(p)
  })
  return out
}

/** A running member: its session, its node's id, the group's partitions and paths, and what it follows. */
interface Member {
  readonly shared: Shared
  readonly options: Log.GroupConsumerOptions
  readonly session: Coordination.Session
  readonly memberId: string
  /** Every partition of the group's topics, by `keyOf`, sorted. */
  readonly all: ReadonlyArray<string>
  readonly paths: GroupPaths
  readonly follower: GroupFollower.GroupFollower
  /** The member list of the last round, sorted. */
  members: ReadonlyArray<string>
}

/** Where a group keeps its members, its partitions' owners and its committed offsets. */
interface GroupPaths {
  readonly members: string
  readonly owner: (k: string) => string
  readonly offset: (k: string) => string
}

const pathsOf = (namespace: string, groupId: string): GroupPaths => {
  const base = CoordinationPaths.join(CoordinationPaths.join(namespace, "groups"), encodeURIComponent(groupId))
  return {
    members: CoordinationPaths.join(base, "members"),
    owner: (k) => CoordinationPaths.join(CoordinationPaths.join(base, "owners"), encodeURIComponent(k)),
    offset: (k) => CoordinationPaths.join(CoordinationPaths.join(base, "offsets"), encodeURIComponent(k))
  }
}

/** A member of `options.groupId`, leaving the group when the scope closes. */
export const makeGroupConsumer = (
  shared: Shared,
  coordination: Coordination.Shape,
  namespace: string,
  options: Log.GroupConsumerOptions
): Effect.Effect<Log.GroupConsumer, Log.LogError, Scope.Scope> =>
  Effect.gen(function* () {
    if (options.groupId.length === 0 || options.topics.length === 0) {
      return yield* new Log.LogError({
        reason: new Log.InvalidRequest({ detail: "a group needs a groupId and at least one topic" })
      })
    }
    const all: Array<string> = []
    for (const topic of [...new Set(options.topics)].sort()) {
      const n = yield* partitionsOf(shared, topic)
      for (let p = 0; p < n; p++) all.push(keyOf({ topic, partition: p }))
    }
    all.sort()
    const inner = yield* makeConsumer(shared, options)
    const paths = pathsOf(namespace, options.groupId)
    const session = yield* coordination.session().pipe(Effect.mapError(ioError("joining the group")))
    const created = yield* session
      .create(CoordinationPaths.join(paths.members, "m-"), encoder.encode(JSON.stringify({ topics: options.topics })), {
        mode: "ephemeral-sequential",
        createParents: true
      })
      .pipe(Effect.mapError(ioError("joining the group")))
    const memberId = created.slice(created.lastIndexOf("/") + 1)
    const follower = yield* GroupFollower.make(inner, "the group member")
    const m: Member = { shared, options, session, memberId, all, paths, follower, members: [memberId] }
    // A coordination failure (a lost connection, an expired session's watch) is waited out, never given up on.
    yield* Effect.forkScoped(
      follow(m).pipe(Retry.retry({ schedule: Schedule.spaced(Duration.millis(100)) }), Effect.ignore)
    )
    return GroupFollower.groupConsumer(follower, {
      commit: (offsets) => commit(m, offsets),
      committed: (tps) => committed(m, tps),
      membership: Effect.sync(() => membership(m))
    })
  })

/** Takes a partition's owner node; false while another member still holds it. */
const acquire = (m: Member, k: string) =>
  m.session.create(m.paths.owner(k), encoder.encode(m.memberId), { mode: "ephemeral", createParents: true }).pipe(
    Effect.as(true),
    Effect.catchIf(
      (e) => e.reason._tag === "NodeExists",
      () =>
        Effect.map(
          Effect.option(m.session.get(m.paths.owner(k))),
          (node) => Option.isSome(node) && decoder.decode(node.value.data) === m.memberId
        )
    )
  )

/**
 * The group's committed offset of a partition, if any. Only a missing node is "none": a failed read fails (a member
 * taking the partition then tries again), never starting it over from the log start.
 */
const committedOf = (m: Member, k: string) =>
  m.session.get(m.paths.offset(k)).pipe(
    Effect.map((node): number | undefined => Number(decoder.decode(node.data))),
    Effect.catchIf(
      (e) => e.reason._tag === "NoNode",
      () => Effect.succeed(undefined)
    )
  )

/**
 * One round: give back what the member list no longer deals this member, take what it deals and is free. Returns
 * whether a dealt partition is still held by its last owner.
 */
const rebalance = (m: Member, sorted: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    m.members = sorted
    const mine = new Set(deal(m.all, sorted).get(m.memberId) ?? [])
    const held = new Set([...m.follower.held.values()].map(keyOf))
    const revoked = [...held].filter((k) => !mine.has(k))
    // Fetching stops and `Revoked` is announced before the owner nodes go, so the next owner starts after it.
    yield* GroupFollower.revoke(m.follower, revoked.map(fromKey))
    for (const k of revoked) yield* Effect.ignore(m.session.delete(m.paths.owner(k)))
    const gained: Array<GroupFollower.Gained> = []
    let waiting = false
    for (const k of [...mine].filter((k) => !held.has(k))) {
      if (!(yield* acquire(m, k))) {
        waiting = true
        continue
      }
      gained.push({ tp: fromKey(k), offset: yield* committedOf(m, k) })
    }
    // A member's events start with an assignment, even one that deals it nothing.
    yield* GroupFollower.assign(m.follower, gained, true)
    return waiting
  })

/** Follows the member list for the life of the member. */
const follow = (m: Member): Effect.Effect<never, unknown> =>
  Effect.gen(function* () {
    while (true) {
      const watch = yield* m.session.watchChildren(m.paths.members)
      const waiting = yield* rebalance(m, [...watch.value].sort())
      // A partition its last owner has not given back yet is asked for again shortly.
      yield* waiting ? Effect.raceFirst(watch.changed, Effect.sleep(Duration.millis(50))) : watch.changed
    }
  })

/** Commits offsets of partitions this member owns, each checked against its owner node in the same transaction. */
const commit = (m: Member, offsets: ReadonlyArray<Models.TopicPartitionOffset>) =>
  Effect.gen(function* () {
    for (const o of offsets) {
      const k = keyOf(o)
      if (!GroupFollower.holds(m.follower, o)) {
        return yield* new Log.LogError({
          reason: new Log.Fenced({ detail: `${k} is not held by this member of ${m.options.groupId}` })
        })
      }
      const owner = yield* m.session.exists(m.paths.owner(k)).pipe(Effect.mapError(ioError("committing")))
      if (Option.isNone(owner) || owner.value.ephemeralOwner !== m.session.id) {
        return yield* new Log.LogError({ reason: new Log.Fenced({ detail: `${k} has another owner now` }) })
      }
      const data = encoder.encode(String(o.offset))
      const exists = yield* m.session.exists(m.paths.offset(k)).pipe(Effect.mapError(ioError("committing")))
      const write: Effect.Effect<unknown, Coordination.CoordinationError> = Option.isSome(exists)
        ? m.session.multi([
            Coordination.op.check(m.paths.owner(k), owner.value.version),
            Coordination.op.set(m.paths.offset(k), data)
          ])
        : m.session.create(m.paths.offset(k), data, { createParents: true }).pipe(
            Effect.catchIf(
              (e) => e.reason._tag === "NodeExists",
              () => m.session.set(m.paths.offset(k), data)
            )
          )
      yield* Effect.mapError(write, ioError("committing"))
    }
  })

/** The group's committed offsets of these partitions (those that have one). */
const committed = (m: Member, tps: ReadonlyArray<Models.TopicPartition>) =>
  Effect.gen(function* () {
    const out: Array<Models.TopicPartitionOffset> = []
    for (const tp of tps) {
      yield* checkPartition(m.shared, tp)
      const offset = yield* committedOf(m, keyOf(tp)).pipe(Effect.mapError(ioError("reading the committed offsets")))
      if (offset !== undefined) out.push({ topic: tp.topic, partition: tp.partition, offset })
    }
    return out
  })

/** The members of the last round and what each is dealt. */
const membership = (m: Member): Log.GroupMembership => {
  const dealt = deal(m.all, m.members)
  return {
    memberId: m.memberId,
    members: m.members.map((id) => ({ memberId: id, partitions: (dealt.get(id) ?? []).map(fromKey) }))
  }
}
