/**
 * What every log adapter's group consumer shares, whatever decides its assignment (Kafka's group coordinator, a
 * coordination service): an inner group-less consumer fetches the member's partitions, and the adapter tells the
 * follower what the member lost and gained. The follower moves the inner consumer's assignment, seeks gained
 * partitions to their committed offsets, announces `Revoked` before `Assigned`, and gives the `GroupConsumer` its
 * users see; the adapter supplies committing, the committed offsets and the membership.
 *
 * @since 0.1.0
 */
import type { Cause, Scope } from "effect"
import { Effect, Queue, Stream } from "effect"
import * as Log from "./Log.js"
import * as Models from "./Models.js"

/** A group member's follower: its inner consumer, its events and the partitions it holds. */
export interface GroupFollower {
  /** The group-less consumer fetching the member's partitions. */
  readonly inner: Log.Consumer
  readonly events: Queue.Queue<Log.GroupEvent, Log.LogError | Cause.Done>
  /** The partitions the member holds, by `tpKey`. */
  readonly held: Map<string, Models.TopicPartition>
  /** The member as errors name it, e.g. `group member of orders`. */
  readonly what: string
  closed: boolean
  /** Whether an `Assigned` was announced yet. */
  announced: boolean
}

/** A partition the member gained, with the offset to start at (none: where the inner consumer starts it). */
export interface Gained {
  readonly tp: Models.TopicPartition
  readonly offset: Models.Offset | undefined
}

/** What the adapter supplies: the calls that depend on where the group keeps its state. */
export interface GroupCalls {
  readonly commit: (offsets: ReadonlyArray<Models.TopicPartitionOffset>) => Effect.Effect<void, Log.LogError>
  readonly committed: (
    tps: ReadonlyArray<Models.TopicPartition>
  ) => Effect.Effect<ReadonlyArray<Models.TopicPartitionOffset>, Log.LogError>
  readonly membership: Effect.Effect<Log.GroupMembership, Log.LogError>
}

/** A follower over `inner`; closing the scope ends its events and refuses its calls. */
export const make = (inner: Log.Consumer, what: string): Effect.Effect<GroupFollower, never, Scope.Scope> =>
  Effect.gen(function* () {
    const events = yield* Queue.unbounded<Log.GroupEvent, Log.LogError | Cause.Done>()
    const f: GroupFollower = { inner, events, held: new Map(), what, closed: false, announced: false }
    yield* Effect.addFinalizer(() =>
      Effect.andThen(
        Effect.sync(() => {
          f.closed = true
        }),
        Queue.end(events)
      )
    )
    return f
  })

/** Whether the member holds the partition. */
export const holds = (f: GroupFollower, tp: Models.TopicPartition): boolean => f.held.has(Models.tpKey(tp))

/** Stops fetching the lost partitions and announces them `Revoked` (nothing when none were lost). */
export const revoke = (
  f: GroupFollower,
  lost: ReadonlyArray<Models.TopicPartition>
): Effect.Effect<void, Log.LogError> =>
  Effect.gen(function* () {
    if (lost.length === 0) return
    yield* f.inner.unassign(lost)
    for (const tp of lost) f.held.delete(Models.tpKey(tp))
    yield* Queue.offer(f.events, { _tag: "Revoked", partitions: lost })
  })

/**
 * Fetches the gained partitions, each from its offset (one outside the log is left where the inner consumer
 * starts it), and announces them `Assigned`. Nothing is announced for nothing gained unless `announceEmpty` and no
 * assignment was announced yet (a member whose events must start with one).
 */
export const assign = (
  f: GroupFollower,
  gained: ReadonlyArray<Gained>,
  announceEmpty = false
): Effect.Effect<void, Log.LogError> =>
  Effect.gen(function* () {
    if (gained.length === 0 && (f.announced || !announceEmpty)) return
    const tps = gained.map((g) => g.tp)
    if (tps.length > 0) yield* f.inner.assign(tps)
    for (const g of gained) {
      if (g.offset === undefined) continue
      yield* f.inner.seek(g.tp, g.offset).pipe(
        Effect.catchIf(
          (e) => e.reason._tag === "OffsetOutOfRange",
          () => Effect.void
        )
      )
    }
    for (const tp of tps) f.held.set(Models.tpKey(tp), tp)
    f.announced = true
    yield* Queue.offer(f.events, { _tag: "Assigned", partitions: tps })
  })

/** Ends the member's events with a failure of following its group. */
export const fail = (f: GroupFollower, error: Log.LogError): Effect.Effect<void> =>
  Effect.asVoid(Queue.fail(f.events, error))

/** Runs `effect` unless the member is closed (then fails with `Closed`). */
export const guard = <A>(f: GroupFollower, effect: Effect.Effect<A, Log.LogError>): Effect.Effect<A, Log.LogError> =>
  Effect.suspend(() => (f.closed ? Effect.fail(Log.logError(new Log.Closed({ what: f.what }))) : effect))

/** The member as its users see it: fetching through the inner consumer, the group calls guarded by closing. */
export const groupConsumer = (f: GroupFollower, calls: GroupCalls): Log.GroupConsumer => ({
  events: Stream.fromQueue(f.events),
  assignment: Effect.sync(() => [...f.held.values()].sort(Models.tpCompare)),
  batches: f.inner.batches,
  pause: f.inner.pause,
  resume: f.inner.resume,
  seek: f.inner.seek,
  position: f.inner.position,
  commit: (offsets) => guard(f, calls.commit(offsets)),
  committed: (tps) => guard(f, calls.committed(tps)),
  membership: guard(f, calls.membership)
})
