/**
 * The election's observer: one long-lived session for `leader`, `changes` and
 * epoch reads, reopened (under a lock) when it ends, each in a child scope of
 * the election's.
 *
 * @internal
 */
import { type Coordination, Retry } from "@strata/core"
import { Duration, Effect, Exit, Schedule, Scope, Semaphore } from "effect"
import * as Won from "./leadership.js"

/** One observer session and the child scope it lives in. */
interface Opened {
  readonly session: Coordination.Session
  readonly scope: Scope.Closeable
}

/** The observer: its current session, replaced when that one ends. */
export interface Observer {
  readonly coordination: Coordination.Shape
  readonly sessionOptions: Coordination.SessionOptions
  /** The election's scope: each observer session lives in a child of it. */
  readonly scope: Scope.Scope
  /** Held while the session is replaced. */
  readonly lock: Semaphore.Semaphore
  current: Opened
  /** How often a lost connection is retried, 100 ms apart: about one and a half of the first session's timeout. */
  readonly connectionRetries: number
}

/** Opens an observer session in a fresh child of `scope`; the child closes again when the session cannot open. */
const open = (
  coordination: Coordination.Shape,
  sessionOptions: Coordination.SessionOptions,
  scope: Scope.Scope
): Effect.Effect<Opened, Coordination.CoordinationError> =>
  Effect.gen(function* () {
    const child = yield* Scope.fork(scope, "sequential")
    const session = yield* coordination.session(sessionOptions).pipe(
      Scope.provide(child),
      Effect.onError((cause) => Scope.close(child, Exit.failCause(cause)))
    )
    return { session, scope: child }
  })

/** Opens the first observer session in the scope. */
export const make = (
  coordination: Coordination.Shape,
  sessionOptions: Coordination.SessionOptions
): Effect.Effect<Observer, Coordination.CoordinationError, Scope.Scope> =>
  Effect.gen(function* () {
    const scope = yield* Effect.scope
    const current = yield* open(coordination, sessionOptions, scope)
    // A lost connection settles within about a session timeout: reconnected, or the session expired.
    const connectionRetries = Math.ceil((Duration.toMillis(current.session.timeout) * 1.5) / 100)
    return { coordination, sessionOptions, scope, lock: Semaphore.makeUnsafe(1), current, connectionRetries }
  })

/** Reopens the observer if `stale` is still its current session. */
const reopen = (o: Observer, stale: Coordination.Session): Effect.Effect<void, Coordination.CoordinationError> =>
  Semaphore.withPermit(
    o.lock,
    Effect.suspend(() => {
      if (o.current.session !== stale) return Effect.void
      const old = o.current
      return open(o.coordination, o.sessionOptions, o.scope).pipe(
        Effect.tap((fresh) => {
          o.current = fresh
          return Scope.close(old.scope, Exit.void)
        }),
        Effect.asVoid
      )
    })
  )

/**
 * Runs `f` on the observer; when the observer's session ended, reopens it and runs `f` once more. A lost
 * connection is retried until it settles (after a pause the client first reports a lost connection, then
 * the expiry).
 */
export const withObserver = <A>(
  o: Observer,
  f: (session: Coordination.Session) => Effect.Effect<A, Coordination.CoordinationError>
): Effect.Effect<A, Coordination.CoordinationError> =>
  Effect.suspend(() => {
    const session = o.current.session
    return f(session).pipe(
      Effect.catchTag("CoordinationError", (e) =>
        Effect.gen(function* () {
          // A lost connection on a session the client already knows ended is an ended session: reopen now.
          const state = e.reason._tag === "ConnectionLoss" ? yield* session.state : "connected"
          if (Won.sessionGone(e) || state === "expired" || state === "closed") {
            yield* reopen(o, session)
            return yield* f(o.current.session)
          }
          return yield* Effect.fail(e)
        })
      )
    )
  }).pipe(
    Retry.retry({
      while: (e: Coordination.CoordinationError) => e.reason._tag === "ConnectionLoss",
      times: o.connectionRetries,
      schedule: Schedule.spaced("100 millis")
    })
  )
