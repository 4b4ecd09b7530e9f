/**
 * A won leadership: how it ends (the session ends, a newer epoch fences it, its scope closes), its local deadline
 * (the last time the session was proven alive, plus the session timeout, minus a safety margin), the guard side
 * effects run before acting, and the fenced writes.
 *
 * @internal
 */
import { Coordination, Election, Errors, Retry } from "@strata/core"
import {
  Clock,
  Deferred,
  Duration,
  Effect,
  Option,
  Result,
  Schedule,
  type Scope,
  Stream,
  SubscriptionRef
} from "effect"
import { type Context, parseEpoch, see, type Won } from "./campaign.js"

/** What a leadership needs besides its campaign. */
export interface Deps {
  readonly ctx: Context
  readonly won: Won
  readonly electionDurationMs: number | undefined
  /** Taken off the session timeout for the deadline (clock drift, scheduling). */
  readonly marginMs: number
  /** Bounds a fenced write whose outcome is unknown. */
  readonly requestTimeout: Duration.Duration
  /** The current epoch through the observer (`None` when it cannot be read). */
  readonly currentEpoch: Effect.Effect<Option.Option<number>>
  /** Counts a fenced write rejected. */
  readonly rejectedWrite: Effect.Effect<void>
}

/** Wraps a coordination failure. */
export const failed = (cause: Coordination.CoordinationError): Election.ElectionError =>
  new Election.ElectionError({ reason: new Election.CoordinationFailed({ cause }) })

/** Whether an error says the session ended (expired or closed), not a passing connection loss. */
export const sessionGone = (e: Coordination.CoordinationError): boolean =>
  e.reason._tag === "SessionExpired" || e.reason._tag === "SessionClosed"

/** Completes `lost` when the session ends or a newer epoch is written; the scope closing resigns. */
const watchEnd = (deps: Deps, lost: Deferred.Deferred<Election.LeadershipEnd>) =>
  Effect.gen(function* () {
    const { session, paths, epochs } = deps.ctx
    const { won } = deps
    yield* session.changes.pipe(
      Stream.runForEach((state) =>
        state === "expired" || state === "closed" ? Deferred.succeed(lost, { _tag: "SessionLost" }) : Effect.void
      ),
      Effect.andThen(Deferred.succeed(lost, { _tag: "SessionLost" })),
      Effect.forkScoped
    )
    yield* Effect.gen(function* () {
      while (true) {
        // A lost connection is not a lost session: read again until it settles (the session's end is seen above).
        const watch = yield* session
          .watchNode(paths.epoch)
          .pipe(Retry.retry({ while: (e) => e.retryable, schedule: Schedule.spaced("100 millis") }))
        if (Option.isNone(watch.value)) return yield* Deferred.succeed(lost, { _tag: "Fenced", epoch: won.epoch })
        const node = watch.value.value
        // Unreadable data, a higher number or any rewrite under the same number: the token no longer holds.
        const current = Result.getOrElse(parseEpoch(paths.epoch, node.data), () => won.epoch)
        see(epochs, current)
        if (current > won.epoch || node.stat.version !== won.version) {
          return yield* Deferred.succeed(lost, { _tag: "Fenced", epoch: Math.max(current, won.epoch) })
        }
        yield* watch.changed
      }
    }).pipe(
      Effect.catch(() => Deferred.succeed(lost, { _tag: "SessionLost" })),
      Effect.forkScoped
    )
    yield* Effect.addFinalizer(() => Deferred.succeed(lost, { _tag: "Resigned" }))
  })

/**
 * Proves the session alive about four times per session timeout (`provenAt` moves to each answered ping's send
 * time) and publishes in `proven` whether the deadline holds.
 */
const watchDeadline = (
  deps: Deps,
  lost: Deferred.Deferred<Election.LeadershipEnd>,
  provenAt: SubscriptionRef.SubscriptionRef<number>,
  proven: SubscriptionRef.SubscriptionRef<boolean>,
  lifeMs: number
) =>
  Effect.gen(function* () {
    const { session } = deps.ctx
    const pingEvery = Duration.millis(Math.max(1, Math.floor(Duration.toMillis(session.timeout) / 4)))
    yield* Effect.gen(function* () {
      while (!Deferred.isDoneUnsafe(lost)) {
        yield* Effect.sleep(pingEvery)
        const sentAt = yield* Clock.currentTimeMillis
        const answered = yield* session.ping.pipe(Effect.timeoutOption(session.timeout), Effect.option)
        if (Option.isSome(answered) && Option.isSome(answered.value)) {
          yield* SubscriptionRef.update(provenAt, (at) => Math.max(at, sentAt))
          const now = yield* Clock.currentTimeMillis
          if (now < (yield* SubscriptionRef.get(provenAt)) + lifeMs) yield* SubscriptionRef.set(proven, true)
        }
      }
    }).pipe(Effect.forkScoped)
    yield* Effect.gen(function* () {
      while (!Deferred.isDoneUnsafe(lost)) {
        const now = yield* Clock.currentTimeMillis
        const deadline = (yield* SubscriptionRef.get(provenAt)) + lifeMs
        if (now < deadline) {
          yield* Effect.sleep(Duration.millis(deadline - now))
          continue
        }
        yield* SubscriptionRef.set(proven, false)
        // Until a ping proves the session alive again.
        yield* SubscriptionRef.changes(provenAt).pipe(
          Stream.filter((at) => at + lifeMs > now),
          Stream.runHead
        )
      }
    }).pipe(Effect.forkScoped)
  })

/** Builds the leadership of a won campaign in the campaign's scope. */
export const make = (deps: Deps): Effect.Effect<Election.Leadership, never, Scope.Scope> =>
  Effect.gen(function* () {
    const { session, paths, epochs, unsafe } = deps.ctx
    const { won } = deps
    const lost = yield* Deferred.make<Election.LeadershipEnd>()
    yield* watchEnd(deps, lost)
    const lifeMs = Math.max(0, Duration.toMillis(session.timeout) - deps.marginMs)
    const provenAt = yield* SubscriptionRef.make(won.registeredAt)
    const proven = yield* SubscriptionRef.make(true)
    // The broken variant without a deadline never lapses: neither its guard nor its `proven` stream.
    if (unsafe.skipDeadline !== true) yield* watchDeadline(deps, lost, provenAt, proven, lifeMs)

    const deadline = Effect.map(SubscriptionRef.get(provenAt), (at) => at + lifeMs)
    const lapsed = (now: number, d: number) => unsafe.skipDeadline !== true && now >= d

    const rejected = (current: number) =>
      Effect.andThen(
        deps.rejectedWrite,
        Effect.fail(
          new Election.ElectionError({
            reason: new Errors.FencedEpoch({ resource: "coordinator", current, attempted: won.epoch })
          })
        )
      )
    /** The epoch that replaced this leadership, as far as known here. */
    const successor = () => Math.max(epochs.highest, won.epoch)

    const guard: Effect.Effect<void, Election.ElectionError> = Effect.gen(function* () {
      if (Deferred.isDoneUnsafe(lost)) return yield* rejected(successor())
      const now = yield* Clock.currentTimeMillis
      const d = yield* deadline
      if (lapsed(now, d)) {
        return yield* Effect.fail(
          new Election.ElectionError({ reason: new Election.LeadershipLapsed({ epoch: won.epoch, deadline: d }) })
        )
      }
    })

    const isLeader = Effect.gen(function* () {
      if (Deferred.isDoneUnsafe(lost)) return false
      return !lapsed(yield* Clock.currentTimeMillis, yield* deadline)
    })

    /** After a write failed: FencedEpoch when a newer epoch exists (or the check itself failed), else the error. */
    const judge = (e: Coordination.CoordinationError) =>
      Effect.gen(function* () {
        const checked = unsafe.skipFenceCheck !== true
        const isFence = checked && e.opIndex === 0 && (e.reason._tag === "BadVersion" || e.reason._tag === "NoNode")
        // The session ended, or the connection broke mid-write: if a newer epoch exists, the write cannot be
        // applied any more (a write whose reply was lost may have been applied earlier, under its epoch).
        if (isFence || sessionGone(e) || e.reason._tag === "ConnectionLoss") {
          const current = yield* deps.currentEpoch
          if (Option.isSome(current)) see(epochs, current.value)
          if (isFence) return yield* rejected(Option.getOrElse(current, successor))
          if (Option.isSome(current) && current.value > won.epoch) return yield* rejected(current.value)
        }
        const shift = checked ? 1 : 0
        return yield* Effect.fail(
          failed(
            e.opIndex !== undefined && e.opIndex >= shift
              ? Coordination.coordinationError(e.reason, e.opIndex - shift)
              : e
          )
        )
      })

    const fenced = (
      ops: ReadonlyArray<Coordination.Op>
    ): Effect.Effect<ReadonlyArray<Coordination.OpResult>, Election.ElectionError> =>
      Effect.suspend(() => {
        // Known lost: refused at once, no round trip.
        if (Deferred.isDoneUnsafe(lost)) return rejected(successor())
        const write =
          unsafe.skipFenceCheck === true
            ? session.multi(ops)
            : Effect.map(session.multi([Coordination.op.check(paths.epoch, won.version), ...ops]), (results) =>
                results.slice(1)
              )
        return write.pipe(
          Effect.catchTag("CoordinationError", judge),
          // An outcome still unknown after the request timeout is reported as a lost connection.
          Effect.timeoutOrElse({
            duration: deps.requestTimeout,
            orElse: () =>
              Effect.fail(
                failed(
                  Coordination.coordinationError(
                    new Coordination.ConnectionLoss({
                      detail: `no outcome within the request timeout ${Duration.format(deps.requestTimeout)}`
                    })
                  )
                )
              )
          })
        )
      })

    return {
      epoch: won.epoch,
      info: won.info,
      electionDurationMs: deps.electionDurationMs,
      connection: session.changes,
      lost: Deferred.await(lost),
      deadline,
      isLeader,
      guard,
      proven: SubscriptionRef.changes(proven).pipe(Stream.changes, Stream.interruptWhen(Deferred.await(lost))),
      fenced
    } satisfies Election.Leadership
  })
