/**
 * One replica as its tablet server holds it: the replica machine's state (`Replica`) and the resources the shell
 * runs its commands on — the open log, the fetch loop, the store's retry, the appends waiting for the high watermark
 * and the fetches waiting for the log to move. Every change happens under the replica's lock.
 *
 * @internal
 */
import type { Models } from "@strata/core"
import type * as ReplicaManager from "../../protocol/ReplicaManager.js"
import { Deferred, Effect, type Fiber, type Scope, Semaphore } from "effect"
import * as Replica from "../../machines/Replica.js"
import type { TabletLog } from "../TabletLog.js"

/** A hosted replica. */
export interface Hosted {
  readonly tablet: Models.TabletId
  readonly key: string
  readonly lock: Semaphore.Semaphore
  /** The replica machine. */
  state: Replica.State
  log: TabletLog | undefined
  logScope: Scope.Closeable | undefined
  fetcher: Fiber.Fiber<unknown, unknown> | undefined
  /** While its storage has failed: the fiber that reports it and tries the store again. */
  resuming: Fiber.Fiber<unknown, unknown> | undefined
  /**
   * When its store last came back, and the pause before the try that worked: a store failing again soon after
   * (a disk that fills again) resumes from that pause, doubled, not from the first.
   */
  storageBack: { readonly at: number; readonly delay: number } | undefined
  /** Its table's retention, as its last instruction named it (`undefined`: keep everything). */
  retention: ReplicaManager.Retention | undefined
  /** Completed (and replaced) whenever the log end or the high watermark moves: waiting fetches wake up. */
  changed: Deferred.Deferred<void>
  /** The waiting appends, by the machine's ticket: completed with the high watermark that passed them. */
  readonly tickets: Map<number, Deferred.Deferred<number, ReplicaManager.ReplicaError>>
}

/** A replica of `tablet` just assigned to `self`, its log not yet open. */
export const make = (tablet: Models.TabletId, self: Models.ServerId, config: Replica.Config): Hosted => {
  const state = Replica.make(tablet, self, config)
  return {
    tablet,
    key: state.key,
    lock: Semaphore.makeUnsafe(1),
    state,
    log: undefined,
    logScope: undefined,
    fetcher: undefined,
    resuming: undefined,
    storageBack: undefined,
    retention: undefined,
    changed: Deferred.makeUnsafe<void>(),
    tickets: new Map()
  }
}

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
