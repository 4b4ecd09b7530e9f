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
import {
  type CoordinationError,
  type CoordinationShape,
  CoordinationPaths,
  Fenced,
  type GroupConsumer,
  type GroupConsumerOptions,
  type GroupEvent,
  InvalidRequest,
  LogClosed,
  LogError,
  LogIoError,
  op,
  type Session,
  type TopicPartition,
  Retry
} from "@strata/core"
import { Duration, Effect, Option, Queue, Schedule, type Scope, Stream } from "effect"
import { makeConsumer } from "./strataConsumer.js"
import { checkPartition, partitionsOf, type Shared } from "./strataShared.js"

const encoder = new TextEncoder()
const decoder = new TextDecoder()
const keyOf = (tp: TopicPartition) => `${tp.topic}:${tp.partition}`
const fromKey = (key: string): TopicPartition => {
  const at = key.lastIndexOf(":")
  return { topic: key.slice(0, at), partition: Number(key.slice(at + 1)) }
}

const ioError = (operation: string) => (e: CoordinationError) =>
  new LogError({ reason: new LogIoError({ operation, detail: e.message, retryable: true }) })

/** What each of `members` (sorted) is dealt of `partitions` (sorted). */
export const deal = (partitions: ReadonlyArray<string>, members: ReadonlyArray<string>): Map<string, Array<string>> => {
  const out = new Map<string, Array<string>>(members.map((m) => [m, []]))
  partitions.forEach((p, i) => {
    out.get(members[i % members.length]!)!.push(p)
  })
  return out
}

/** A member of `options.groupId`, leaving the group when the scope closes. */
export const makeGroupConsumer = (
  shared: Shared,
  coordination: CoordinationShape,
  namespace: string,
  options: GroupConsumerOptions
): Effect.Effect<GroupConsumer, LogError, Scope.Scope> =>
  Effect.gen(function* () {
    if (options.groupId.length === 0 || options.topics.length === 0) {
      return yield* new LogError({
        reason: new InvalidRequest({ detail: "a group needs a groupId and at least one topic" })
      })
    }
    const all: Array<string> = []
    for (const topic of [...new Set(options.topics)].sort()) {
      const n = yield* partitionsOf(shared, topic)
      for (let p = 0; p < n; p++) all.push(keyOf({ topic, partition: p }))
    }
    all.sort()
    const inner = yield* makeConsumer(shared, options)
    const base = CoordinationPaths.join(
      CoordinationPaths.join(namespace, "groups"),
      encodeURIComponent(options.groupId)
    )
    const paths = {
      members: CoordinationPaths.join(base, "members"),
      owner: (k: string) => CoordinationPaths.join(CoordinationPaths.join(base, "owners"), encodeURIComponent(k)),
      offset: (k: string) => CoordinationPaths.join(CoordinationPaths.join(base, "offsets"), encodeURIComponent(k))
    }
    const session: Session = yield* coordination.session().pipe(Effect.mapError(ioError("joining the group")))
    const created = yield* session
      .create(CoordinationPaths.join(paths.members, "m-"), encoder.encode(JSON.stringify({ topics: options.topics })), {
        mode: "ephemeral-sequential",
        createParents: true
      })
      .pipe(Effect.mapError(ioError("joining the group")))
    const memberId = created.slice(created.lastIndexOf("/") + 1)
    const events = yield* Queue.unbounded<GroupEvent>()
    const held = new Set<string>()
    let members: ReadonlyArray<string> = [memberId]
    let closed = false
    let announced = false
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        closed = true
      })
    )
    const closedError = new LogError({ reason: new LogClosed({ what: "the group member" }) })
    const open = Effect.suspend(() => (closed ? Effect.fail(closedError) : Effect.void))

    /** Takes a partition's owner node; false while another member still holds it. */
    const acquire = (k: string) =>
      session.create(paths.owner(k), encoder.encode(memberId), { mode: "ephemeral", createParents: true }).pipe(
        Effect.as(true),
        Effect.catchIf(
          (e) => e.reason._tag === "NodeExists",
          () =>
            Effect.map(
              Effect.option(session.get(paths.owner(k))),
              (node) => Option.isSome(node) && decoder.decode(node.value.data) === memberId
            )
        )
      )
    const committedOf = (k: string) =>
      Effect.map(Effect.option(session.get(paths.offset(k))), (node) =>
        Option.isSome(node) ? Number(decoder.decode(node.value.data)) : undefined
      )

    /** One round: give back what the member list no longer deals this member, take what it deals and is free. */
    const rebalance = (sorted: ReadonlyArray<string>) =>
      Effect.gen(function* () {
        members = sorted
        const mine = new Set(deal(all, sorted).get(memberId) ?? [])
        const revoked = [...held].filter((k) => !mine.has(k))
        if (revoked.length > 0) {
          yield* inner.unassign(revoked.map(fromKey))
          for (const k of revoked) {
            held.delete(k)
            yield* Effect.ignore(session.delete(paths.owner(k)))
          }
          yield* Queue.offer(events, { _tag: "Revoked", partitions: revoked.map(fromKey) })
        }
        const gained: Array<string> = []
        let waiting = false
        for (const k of [...mine].filter((k) => !held.has(k))) {
          if (!(yield* acquire(k))) {
            waiting = true
            continue
          }
          const tp = fromKey(k)
          yield* inner.assign([tp])
          const committed = yield* committedOf(k)
          if (committed !== undefined) yield* Effect.ignore(inner.seek(tp, committed))
          held.add(k)
          gained.push(k)
        }
        // The first round is announced even when it deals nothing: a member's events start with an assignment.
        if (gained.length > 0 || !announced) {
          announced = true
          yield* Queue.offer(events, { _tag: "Assigned", partitions: gained.map(fromKey) })
        }
        return waiting
      })

    const loop: Effect.Effect<never, unknown> = Effect.gen(function* () {
      while (true) {
        const watch = yield* session.watchChildren(paths.members)
        const waiting = yield* rebalance([...watch.value].sort())
        // A partition its last owner has not given back yet is asked for again shortly.
        yield* waiting ? Effect.raceFirst(watch.changed, Effect.sleep(Duration.millis(50))) : watch.changed
      }
    })
    // A coordination failure (a lost connection, an expired session's watch) is waited out, never given up on.
    yield* Effect.forkScoped(loop.pipe(Retry.retry({ schedule: Schedule.spaced(Duration.millis(100)) }), Effect.ignore))

    return {
      events: Stream.fromQueue(events),
      assignment: Effect.sync(() => [...held].sort().map(fromKey)),
      batches: inner.batches,
      pause: inner.pause,
      resume: inner.resume,
      seek: inner.seek,
      position: inner.position,
      commit: (offsets) =>
        Effect.gen(function* () {
          yield* open
          for (const o of offsets) {
            const k = keyOf(o)
            if (!held.has(k)) {
              return yield* new LogError({
                reason: new Fenced({ detail: `${k} is not held by this member of ${options.groupId}` })
              })
            }
            const owner = yield* session.exists(paths.owner(k)).pipe(Effect.mapError(ioError("committing")))
            if (Option.isNone(owner) || owner.value.ephemeralOwner !== session.id) {
              return yield* new LogError({ reason: new Fenced({ detail: `${k} has another owner now` }) })
            }
            const data = encoder.encode(String(o.offset))
            const exists = yield* session.exists(paths.offset(k)).pipe(Effect.mapError(ioError("committing")))
            const write: Effect.Effect<unknown, CoordinationError> = Option.isSome(exists)
              ? session.multi([op.check(paths.owner(k), owner.value.version), op.set(paths.offset(k), data)])
              : session.create(paths.offset(k), data, { createParents: true }).pipe(
                  Effect.catchIf(
                    (e) => e.reason._tag === "NodeExists",
                    () => session.set(paths.offset(k), data)
                  )
                )
            yield* Effect.mapError(write, ioError("committing"))
          }
        }),
      committed: (tps) =>
        Effect.gen(function* () {
          yield* open
          const out: Array<{ readonly topic: string; readonly partition: number; readonly offset: number }> = []
          for (const tp of tps) {
            yield* checkPartition(shared, tp)
            const offset = yield* committedOf(keyOf(tp))
            if (offset !== undefined) out.push({ topic: tp.topic, partition: tp.partition, offset })
          }
          return out
        }),
      membership: Effect.gen(function* () {
        yield* open
        const dealt = deal(all, members)
        return {
          memberId,
          members: members.map((m) => ({ memberId: m, partitions: (dealt.get(m) ?? []).map(fromKey) }))
        }
      })
    }
  })
