/**
 * The in-memory log's group consumers: joining and leaving a group, the
 * rebalance that runs at once on either (revocations announced before
 * assignments), committed offsets and the group's membership.
 */
import type * as Log from "../Log.js"
import * as Models from "../Models.js"
import type { Cause, Scope } from "effect"
import { Effect, Queue, Stream } from "effect"
import type { Broker, Group, Member } from "./memoryLogBroker.js"
import { lookup, lookupTopic } from "./memoryLogBroker.js"
import { position, seek } from "./memoryLogConsumer.js"
import {
  addAssigned,
  assignmentOf,
  checkMaxBatch,
  closeFetcher,
  fetchBatch,
  ifOpen,
  makeFetcher,
  removeAssigned,
  setPaused,
  sortTps
} from "./memoryLogFetcher.js"
import type { PartitionLog } from "./memoryLogPartition.js"
import { checkOffset, invalid, wakeAll } from "./memoryLogPartition.js"

/** Members by id, which is join order. */
const byMemberId = (a: Member, b: Member): number => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)

/** Round-robin over sorted partitions and sorted members, skipping members not subscribed to a topic. */
const computeAssignment = (s: Broker, group: Group): Map<Member, Array<Models.TopicPartition>> => {
  const result = new Map<Member, Array<Models.TopicPartition>>()
  const members = [...group.members].sort(byMemberId)
  for (const m of members) result.set(m, [])
  if (members.length === 0) return result
  const topicNames = new Set<string>()
  for (const m of members) for (const t of m.topics) topicNames.add(t)
  const tps: Array<Models.TopicPartition> = []
  for (const name of topicNames) {
    const t = s.topics.get(name)
    if (t !== undefined) for (const p of t.partitions) tps.push({ topic: name, partition: p.partition })
  }
  tps.sort(Models.tpCompare)
  let k = 0
  for (const tp of tps) {
    for (let tries = 0; tries < members.length; tries++) {
      const m = members[k % members.length]!
      k++
      if (m.topics.has(tp.topic)) {
        result.get(m)!.push(tp)
        break
      }
    }
  }
  return result
}

/** Where a newly assigned partition starts: its committed offset clamped to `[logStart, highwater]`. */
const startOffset = (group: Group, log: PartitionLog): number => {
  const c = group.committed.get(Models.tpKey(log))
  if (c === undefined) return log.logStart
  return Math.min(Math.max(c, log.logStart), log.highwater)
}

/** Recomputes the group's assignment; revocations are applied and announced before assignments. */
const rebalance = (s: Broker, group: Group): void => {
  const target = computeAssignment(s, group)
  const added: Array<[Member, Array<Models.TopicPartition>]> = []
  for (const [m, tps] of target) {
    const keys = new Set(tps.map(Models.tpKey))
    const revoked = m.fetcher.order.filter((e) => !keys.has(e.key)).map((e) => e.tp)
    if (revoked.length > 0) {
      removeAssigned(m.fetcher, new Set(revoked.map(Models.tpKey)))
      Queue.offerUnsafe(m.events, { _tag: "Revoked", partitions: sortTps(revoked) })
    }
    added.push([m, tps.filter((tp) => !m.fetcher.assigned.has(Models.tpKey(tp)))])
  }
  for (const [m, tps] of added) {
    if (tps.length === 0) continue
    for (const tp of tps) {
      const log = s.topics.get(tp.topic)!.partitions[tp.partition]!
      addAssigned(m.fetcher, { tp, key: Models.tpKey(tp), log, position: startOffset(group, log), paused: false })
    }
    Queue.offerUnsafe(m.events, { _tag: "Assigned", partitions: sortTps(tps) })
    wakeAll(m.fetcher.wakers)
  }
}

/** Adds a member to its group (creating the group) and rebalances. */
const join = (
  s: Broker,
  options: Log.GroupConsumerOptions,
  maxBatchRecords: number,
  events: Queue.Queue<Log.GroupEvent, Log.LogError | Cause.Done>
): Member => {
  let group = s.groups.get(options.groupId)
  if (group === undefined) {
    group = { id: options.groupId, members: [], committed: new Map() }
    s.groups.set(options.groupId, group)
  }
  s.memberSeq++
  const member: Member = {
    id: `${options.groupId}-${String(s.memberSeq).padStart(10, "0")}`,
    topics: new Set(options.topics),
    fetcher: makeFetcher(`group consumer of ${options.groupId}`, maxBatchRecords),
    events
  }
  group.members.push(member)
  rebalance(s, group)
  return member
}

/** Closes a member (its fetcher and events) and rebalances the rest of its group. */
const leave = (s: Broker, groupId: string, member: Member): void => {
  const group = s.groups.get(groupId)
  closeFetcher(member.fetcher)
  Queue.endUnsafe(member.events)
  if (group === undefined) return
  group.members = group.members.filter((m) => m !== member)
  rebalance(s, group)
}

/** `GroupConsumer.commit`: checks every offset, then commits them all. */
const commit = (
  s: Broker,
  group: Group,
  m: Member,
  entries: ReadonlyArray<Models.TopicPartitionOffset>
): Effect.Effect<void, Log.LogError> =>
  ifOpen(m.fetcher, () => {
    for (const e of entries) {
      const log = lookup(s, e.topic, e.partition)
      if ("_tag" in log) return Effect.fail(log)
      const bad = checkOffset(e.offset)
      if (bad !== undefined) return Effect.fail(bad)
      if (e.offset < 0) return Effect.fail(invalid(`a committed offset must be ≥ 0, got ${e.offset}`))
    }
    for (const e of entries) group.committed.set(Models.tpKey(e), e.offset)
    return Effect.void
  })

/** `GroupConsumer.committed`: the group's committed offsets of these partitions (absent when none). */
const committed = (
  s: Broker,
  group: Group,
  m: Member,
  tps: ReadonlyArray<Models.TopicPartition>
): Effect.Effect<ReadonlyArray<Models.TopicPartitionOffset>, Log.LogError> =>
  ifOpen(m.fetcher, () => {
    const out: Array<Models.TopicPartitionOffset> = []
    for (const tp of tps) {
      const log = lookup(s, tp.topic, tp.partition)
      if ("_tag" in log) return Effect.fail(log)
      const offset = group.committed.get(Models.tpKey(tp))
      if (offset !== undefined) out.push({ topic: log.topic, partition: log.partition, offset })
    }
    return Effect.succeed(out)
  })

/** `GroupConsumer.membership`: rebalances run at once here, so every member's fetcher holds its current share. */
const membership = (group: Group, m: Member): Effect.Effect<Log.GroupMembership, Log.LogError> =>
  ifOpen(m.fetcher, () =>
    Effect.succeed({
      memberId: m.id,
      members: [...group.members]
        .sort(byMemberId)
        .map((other) => ({ memberId: other.id, partitions: assignmentOf(other.fetcher) }))
    })
  )

/** The `GroupConsumer` of a member; `seek` and `position` work as a plain consumer's on its fetcher. */
const makeGroupConsumer = (s: Broker, group: Group, m: Member): Log.GroupConsumer => {
  const f = m.fetcher
  return {
    events: Stream.fromQueue(m.events),
    assignment: Effect.sync(() => assignmentOf(f)),
    batches: Stream.fromEffectRepeat(fetchBatch(f)),
    pause: (tps) => Effect.sync(() => setPaused(f, tps, true)),
    resume: (tps) => Effect.sync(() => setPaused(f, tps, false)),
    seek: (tp, offset) => seek(s, f, tp, offset),
    position: (tp) => position(s, f, tp),
    commit: (entries) => commit(s, group, m, entries),
    committed: (tps) => committed(s, group, m, tps),
    membership: membership(group, m)
  }
}

/** Why a group consumer cannot be made with these options, if it cannot; else its `maxBatchRecords`. */
const checkGroupOptions = (s: Broker, options: Log.GroupConsumerOptions): number | Log.LogError => {
  const max = checkMaxBatch(options)
  if (typeof max === "object") return max
  if (typeof options.groupId !== "string" || options.groupId.length === 0) {
    return invalid("groupId must be a non-empty string")
  }
  if (options.topics.length === 0) return invalid("a group consumer needs at least one topic")
  for (const t of options.topics) {
    const topic = lookupTopic(s, t)
    if ("_tag" in topic) return topic
  }
  return max
}

/** `Log.groupConsumer`: joins the group now and leaves it when the scope closes. */
export const groupConsumer = (
  s: Broker,
  options: Log.GroupConsumerOptions
): Effect.Effect<Log.GroupConsumer, Log.LogError, Scope.Scope> =>
  Effect.suspend(() => {
    const max = checkGroupOptions(s, options)
    if (typeof max === "object") return Effect.fail(max)
    return Effect.acquireRelease(
      Effect.flatMap(Queue.unbounded<Log.GroupEvent, Log.LogError | Cause.Done>(), (events) =>
        Effect.sync(() => join(s, options, max, events))
      ),
      (m) => Effect.sync(() => leave(s, options.groupId, m))
    ).pipe(
      Effect.map((member) => {
        const group = s.groups.get(options.groupId)!
        const consumer = makeGroupConsumer(s, group, member)
        s.members.set(consumer, { group, member })
        return consumer
      })
    )
  })
