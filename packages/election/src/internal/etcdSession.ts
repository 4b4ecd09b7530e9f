/**
 * An etcd session: a lease, the session's state and the keep-alive watch that
 * moves it, and the guard every call of the session passes.
 *
 * @internal
 */
import { Coordination } from "@strata/core"
import { Duration, Effect, Option, PubSub, type Scope } from "effect"
import type { Lease } from "etcd3"
import { call, type EtcdStore, isFinal } from "./etcdStore.js"
import type { SessionCtx } from "./etcdTransaction.js"

/** A session: its lease and its state. */
export interface EtcdSession {
  readonly store: EtcdStore
  /** The lease id, which is the session id. */
  readonly id: string
  readonly lease: Lease
  /** The timeout the session asked for, at least 2 000 ms. */
  readonly timeoutMs: number
  readonly states: PubSub.PubSub<Coordination.SessionState>
  state: Coordination.SessionState
  /** What each pending watch does when the session ends. */
  readonly watches: Set<(error: Coordination.CoordinationError) => void>
  /** The owner and lease of the session's ephemeral nodes. */
  readonly ctx: SessionCtx
}

/** What an operation or watch of the session meets once it ended. */
export const endedError = (s: EtcdSession, final: "expired" | "closed"): Coordination.CoordinationError =>
  Coordination.coordinationError(
    final === "expired"
      ? new Coordination.SessionExpired({ session: s.id })
      : new Coordination.SessionClosed({ session: s.id })
  )

/** Ends the session (once): publishes its final state, fails its watches and forgets it. */
export const end = (s: EtcdSession, final: "expired" | "closed"): void => {
  if (isFinal(s.state)) return
  s.state = final
  PubSub.publishUnsafe(s.states, final)
  const error = endedError(s, final)
  for (const w of [...s.watches]) w(error)
  s.watches.clear()
  s.store.sessions.delete(s.id)
}

/** Moves between connected and suspended (a final state stays). */
const setLive = (s: EtcdSession, next: "connected" | "suspended"): void => {
  if (isFinal(s.state) || s.state === next) return
  s.state = next
  PubSub.publishUnsafe(s.states, next)
}

/** One keep-alive within `ms`: the lease's remaining TTL, 0 when gone, `undefined` without an answer. */
const keepalive = (s: EtcdSession, ms: number) =>
  Effect.tryPromise({
    try: () => s.lease.keepaliveOnce(),
    catch: (e) => (e instanceof Error ? e.message : String(e))
  }).pipe(
    Effect.map((res) => Number(res.TTL)),
    Effect.catch((detail) => (/lease not found/i.test(detail) ? Effect.succeed(0) : Effect.succeed(undefined))),
    Effect.timeoutOption(Duration.millis(ms)),
    Effect.map(Option.getOrUndefined)
  )

/**
 * The connection watch: a keep-alive every sixth of the lease; one unanswered for a third of it suspends the
 * session (operations then fail at once with a lost connection), the next answered one restores it, and an
 * answer that the lease is gone expires it. A silent connection is so noticed within half the lease.
 */
const watchConnection = (s: EtcdSession): Effect.Effect<void> =>
  Effect.gen(function* () {
    while (!isFinal(s.state)) {
      yield* Effect.sleep(Duration.millis(Math.max(1, Math.floor(s.timeoutMs / 6))))
      if (isFinal(s.state)) return
      const ttl = yield* keepalive(s, Math.max(1, Math.floor(s.timeoutMs / 3)))
      if (ttl === undefined) setLive(s, "suspended")
      else if (ttl > 0) setLive(s, "connected")
      else end(s, "expired")
    }
  })

/**
 * Grants the session's lease (kept alive by the client) and watches its connection for the life of the scope;
 * closing the scope revokes the lease (or, when the session is not connected, only stops keeping it alive).
 */
export const open = (
  store: EtcdStore,
  sessionOptions?: Coordination.SessionOptions
): Effect.Effect<EtcdSession, Coordination.CoordinationError, Scope.Scope> =>
  Effect.gen(function* () {
    const timeoutMs = Math.max(
      2000,
      sessionOptions?.timeout === undefined
        ? store.defaultTimeout
        : Duration.toMillis(Duration.fromInputUnsafe(sessionOptions.timeout))
    )
    const lease = store.client.lease(Math.ceil(timeoutMs / 1000), { autoKeepAlive: true })
    const id = yield* call(() => lease.grant())
    const states = yield* PubSub.unbounded<Coordination.SessionState>({ replay: 1 })
    const s: EtcdSession = {
      store,
      id,
      lease,
      timeoutMs,
      states,
      state: "connected",
      watches: new Set(),
      ctx: { id, lease: id }
    }
    PubSub.publishUnsafe(states, "connected")
    lease.on("lost", () => end(s, "expired"))
    yield* Effect.forkScoped(watchConnection(s))
    store.sessions.set(id, { lease: id, end: (final) => end(s, final), state: () => s.state })
    yield* Effect.addFinalizer(() =>
      Effect.gen(function* () {
        const wasConnected = s.state === "connected"
        end(s, "closed")
        if (wasConnected) yield* Effect.promise(() => lease.revoke().catch(() => undefined))
        else yield* Effect.sync(() => lease.release())
      })
    )
    return s
  })

/** Runs `self` while the session is connected; fails at once when it ended or its connection is down. */
export const guard = <A>(
  s: EtcdSession,
  self: Effect.Effect<A, Coordination.CoordinationError>
): Effect.Effect<A, Coordination.CoordinationError> =>
  Effect.suspend(() =>
    s.state === "expired" || s.state === "closed"
      ? Effect.fail(endedError(s, s.state))
      : s.state === "suspended"
        ? Effect.fail(
            Coordination.coordinationError(
              new Coordination.ConnectionLoss({ detail: `session ${s.id} is disconnected` })
            )
          )
        : self
  )

/** A keep-alive of the lease: the server renews it from when it receives the request, or says it is gone. */
export const ping = (s: EtcdSession): Effect.Effect<void, Coordination.CoordinationError> =>
  guard(
    s,
    Effect.flatMap(
      Effect.tryPromise({
        try: () => s.lease.keepaliveOnce(),
        catch: (e) => (e instanceof Error ? e.message : String(e))
      }).pipe(
        Effect.map((res) => Number(res.TTL) > 0),
        Effect.catch((detail) =>
          /lease not found/i.test(detail)
            ? Effect.succeed(false)
            : Effect.fail(Coordination.coordinationError(new Coordination.ConnectionLoss({ detail })))
        )
      ),
      (alive) => {
        if (alive) return Effect.void
        end(s, "expired")
        return Effect.fail(Coordination.coordinationError(new Coordination.SessionExpired({ session: s.id })))
      }
    )
  )
