/**
 * One replica as its tablet server holds it: the replica machine's state, the open log, the leader's state while it
 * leads, the appends waiting for the high watermark, and the role generation that makes the answers of an ended role
 * stale. Every change happens under the replica's lock.
 *
 * @internal
 */
import {
  NotEnoughReplicasAfterAppend,
  NotLeader,
  ReplicaError,
  type ServerId,
  type TabletId,
  type TabletInstruction,
  tabletKey
} from "@strata/core"
import { Deferred, Effect, type Fiber, Schedule, type Scope, Semaphore } from "effect"
import type * as LeaderState from "../../machines/LeaderState.js"
import * as ReplicaState from "../../machines/ReplicaState.js"
import type { TabletLog } from "../TabletLog.js"

/** An acks=all append waiting for the high watermark to pass `lastOffset`. */
export interface Waiter {
  readonly lastOffset: number
  readonly done: Deferred.Deferred<number, ReplicaError>
}

/** A hosted replica. */
export interface Hosted {
  readonly tablet: TabletId
  readonly key: string
  readonly lock: Semaphore.Semaphore
  replicas: ReadonlyArray<ServerId>
  machine: ReplicaState.State
  /** The tablet version (the coordinator's compare-and-set version) last applied here. */
  version: number
  log: TabletLog | undefined
  logScope: Scope.Closeable | undefined
  leader: LeaderState.State | undefined
  waiters: Array<Waiter>
  /** Bumped on every role change: the results of an older role's requests are dropped. */
  role: number
  fetcher: Fiber.Fiber<unknown, unknown> | undefined
  /** While its storage has failed: the fiber that reports it and tries the store again. */
  resuming: Fiber.Fiber<unknown, unknown> | undefined
  /**
   * When its store last came back, and the pause before the try that worked: a store failing again soon after
   * (a disk that fills again) resumes from that pause, doubled, not from the first.
   */
  storageBack: { readonly at: number; readonly delay: number } | undefined
  /** Completed (and replaced) whenever the log end or the high watermark moves: waiting fetches wake up. */
  changed: Deferred.Deferred<void>
}

/** A replica just assigned here, its log not yet open. */
export const make = (tablet: TabletId): Hosted => ({
  tablet,
  key: tabletKey(tablet),
  lock: Semaphore.makeUnsafe(1),
  replicas: [],
  machine: ReplicaState.initial,
  version: -1,
  log: undefined,
  logScope: undefined,
  leader: undefined,
  waiters: [],
  role: 0,
  fetcher: undefined,
  resuming: undefined,
  storageBack: undefined,
  changed: Deferred.makeUnsafe<void>()
})

/**
 * Runs `self` holding the replica's lock, uninterruptibly: a handler interrupted as its caller times out or goes away
 * (Effect RPC interrupts it) waits for the lock interruptibly, but once it holds it, it changes the replica whole or
 * not at all (no log left open with its store locked, no role half taken).
 */
export const locked = <A, E, R>(h: Hosted, self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Semaphore.withPermit(h.lock, Effect.uninterruptible(self))

/** Wakes the fetches waiting on the replica. */
export const signal = (h: Hosted): Effect.Effect<void> =>
  Effect.suspend(() => {
    const changed = h.changed
    h.changed = Deferred.makeUnsafe<void>()
    return Deferred.succeed(changed, undefined)
  })

/** Completes the waiters the high watermark `hw` has passed. */
export const release = (h: Hosted, hw: number): Effect.Effect<void> =>
  Effect.suspend(() => {
    const done = h.waiters.filter((w) => w.lastOffset < hw)
    if (done.length === 0) return Effect.void
    h.waiters = h.waiters.filter((w) => w.lastOffset >= hw)
    return Effect.forEach(done, (w) => Deferred.succeed(w.done, hw), { discard: true })
  })

/** Fails every waiter with `error`. */
export const failWaiters = (h: Hosted, error: ReplicaError): Effect.Effect<void> =>
  Effect.suspend(() => {
    const all = h.waiters
    h.waiters = []
    return Effect.forEach(all, (w) => Deferred.fail(w.done, error), { discard: true })
  })

/** The waiters' error once the ISR is below the minimum: written, but not replicated as asked. */
export const tooFewAfterAppend = (h: Hosted, isr: number, minIsr: number): ReplicaError =>
  new ReplicaError({ reason: new NotEnoughReplicasAfterAppend({ tablet: h.key, isr, minIsr }) })

/** The error of a request this replica cannot serve as leader. */
export const notLeader = (h: Hosted): ReplicaError =>
  new ReplicaError({
    reason: new NotLeader({
      resource: h.key,
      leader: h.machine._tag === "FollowerReplica" ? h.machine.leader : null
    })
  })

/**
 * What a LeaderAndIsr instruction is to a replica in this state.
 *
 * - `Step`: a higher leader epoch (or the first): the replica machine takes it.
 * - `IsrUpdate`: this replica leads the instruction's epoch and the tablet version is newer: the controller changed
 *   the ISR (a member died or is stopping).
 * - `Fence`: the tablet is offline (no leader) under a newer epoch: any role under an older one ends.
 * - `Stale`: nothing new (a repeat, an older epoch or version).
 */
export const classify = (
  h: Hosted,
  self: ServerId,
  instruction: TabletInstruction
): "Step" | "IsrUpdate" | "Fence" | "Stale" => {
  const last = ReplicaState.lastLeaderEpoch(h.machine)
  const lai = instruction.leaderAndIsr
  // Offline under a newer epoch: any role under an older one ends.
  if (lai.leader === null) return last === null || lai.leaderEpoch > last ? "Fence" : "Stale"
  if (last === null || lai.leaderEpoch > last) return "Step"
  // No role (its store failed and works again): it follows again under the epoch it had seen.
  if (lai.leaderEpoch === last && lai.leader !== self && h.machine._tag === "OnlineReplica") return "Step"
  if (lai.leaderEpoch === last && lai.leader === self && lai.version > h.version) return "IsrUpdate"
  return "Stale"
}

/**
 * Retries `request` every `backoffMs` while `go()` holds, saying why it failed (`what()`: what was asked, built only then) on the first failure and every 50th
 * after it (a request that cannot get through is seen in the log, not a line each backoff).
 */
export const retryTelling = <A, E extends { readonly message: string }>(
  request: Effect.Effect<A, E>,
  backoffMs: number,
  what: () => string,
  go: () => boolean = () => true
): Effect.Effect<A, E> => {
  let failures = 0
  return request.pipe(
    Effect.tapError((e) =>
      ++failures === 1 || failures % 50 === 0
        ? Effect.logWarning(`${what()} failed (${failures} ${failures === 1 ? "try" : "tries"}): ${e.message}`)
        : Effect.void
    ),
    Effect.retry({ schedule: Schedule.spaced(backoffMs), while: go })
  )
}
