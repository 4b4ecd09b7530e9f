/**
 * The election recipe's implementation. `CoordinationElection.make` runs it
 * with every safety check on; the simulation tests also run deliberately broken
 * variants (`Unsafe`) to prove their checkers catch what the checks prevent.
 *
 * @internal
 */
import {
  type Candidate,
  Coordination,
  CoordinationPaths,
  type CoordinationError,
  coordinationError,
  ElectionCoordinationFailed,
  ElectionError,
  type ElectionShape,
  FencedEpoch,
  InvalidElectionOptions,
  LeaderInfo,
  type Leadership,
  type LeadershipEnd,
  type Node,
  type Op,
  type OpResult,
  op,
  type Session,
  SessionClosed,
  ConnectionLoss,
  OptionSchemas
} from "@strata/core"
import {
  Clock,
  Deferred,
  Duration,
  Effect,
  Exit,
  Metric,
  Option,
  Schedule,
  Schema,
  Scope,
  Semaphore,
  Stream
} from "effect"

const { DurationInput, decodeOptions, summary } = OptionSchemas

/** Why a namespace cannot be one, if it cannot. */
const invalidNamespace = (namespace: string): string | undefined => {
  const ns = namespace.replace(/^\/+|\/+$/g, "")
  if (ns === "") return "must name a namespace, got an empty one"
  const reason = CoordinationPaths.invalidPath(`/${ns}`)
  return reason === undefined ? undefined : `expected a path such as "strata" or "/apps/strata" (${reason.detail})`
}

/** Options of the election (re-exported by `CoordinationElection`), validated by `make`. */
export const Options = Schema.Struct({
  /** The namespace: nodes live under `/<namespace>/coordinators`. */
  namespace: Schema.String.check(Schema.makeFilter(invalidNamespace)),
  /** Timeout of every session the election opens, above zero (default: the backend's). */
  sessionTimeout: Schema.optional(DurationInput("positive")),
  /**
   * How long a replica may lag before it leaves the ISR, above zero (default 30 seconds).
   * The session timeout (the coordinator's liveness timeout) must be shorter,
   * so a dead coordinator is replaced before replicas are judged by a stale one.
   */
  replicaLagTimeMax: Schema.optional(DurationInput("positive"))
})
/** @see Options */
export type Options = typeof Options.Type

/** Safety checks a broken variant may switch off (tests only). */
export interface Unsafe {
  /** Write with `fenced` without checking the epoch node's version. */
  readonly skipFenceCheck?: boolean
  /** Become leader without bumping the epoch (reuse the current one). */
  readonly skipEpochBump?: boolean
}

/** The election's metrics, labelled by namespace. */
export const metrics = {
  /** Elections won. */
  electionsTotal: Metric.counter("strata_coordinator_elections_total", {
    description: "Coordinator elections won",
    incremental: true
  }),
  /** Vacancy before each won election, in milliseconds. */
  failoverDurationMs: Metric.histogram("strata_coordinator_failover_duration_ms", {
    description: "How long the coordinator leadership was vacant before an election was won (ms)",
    boundaries: [10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000]
  }),
  /** Fenced writes rejected because a newer epoch exists. */
  fencedWritesRejected: Metric.counter("strata_coordinator_fenced_writes_rejected_total", {
    description: "Coordinator writes rejected with FencedEpoch",
    incremental: true
  }),
  /** Predecessor-watch notifications received by waiting candidates. */
  candidateWakeups: Metric.counter("strata_coordinator_candidate_wakeups_total", {
    description: "Waiting candidates woken by their predecessor's watch",
    incremental: true
  })
} as const

const encoder = new TextEncoder()
const decoder = new TextDecoder()
const bytes = (s: string): Uint8Array => encoder.encode(s)
const text = (b: Uint8Array): string => decoder.decode(b)

const decodeLeader = Schema.decodeUnknownOption(LeaderInfo)

/** Parses a leader node's data, `None` when absent or malformed. */
const parseLeader = (node: Option.Option<Node>): Option.Option<LeaderInfo> =>
  Option.flatMap(node, (n) => {
    try {
      return decodeLeader(JSON.parse(text(n.data)))
    } catch {
      return Option.none()
    }
  })

const parseEpoch = (data: Uint8Array): number => {
  const n = Number(text(data))
  return Number.isSafeInteger(n) && n >= 0 ? n : 0
}

const failed = (cause: CoordinationError): ElectionError =>
  new ElectionError({ reason: new ElectionCoordinationFailed({ cause }) })

const sessionGone = (e: CoordinationError): boolean =>
  e.reason._tag === "SessionExpired" || e.reason._tag === "SessionClosed"

/** The paths of a namespace. */
export const pathsOf = (namespace: string) => {
  const ns = namespace.replace(/^\/+|\/+$/g, "")
  const base = `/${ns}/coordinators`
  return {
    base,
    ids: `${base}/ids`,
    election: `${base}/election`,
    epoch: `${base}/epoch`,
    leader: `${base}/leader`
  } as const
}

const DEFAULT_REPLICA_LAG_TIME_MAX = Duration.seconds(30)

/**
 * Builds the election. Opens one long-lived observer session in the scope (for
 * `leader`, `changes` and epoch reads), reopened when it expires; every
 * campaign opens its own session.
 */
export const make = (
  options: Options,
  unsafe: Unsafe = {}
): Effect.Effect<ElectionShape, ElectionError, Coordination | Scope.Scope> =>
  Effect.gen(function* () {
    const invalid = (option: string, detail: string) =>
      new ElectionError({ reason: new InvalidElectionOptions({ option, detail }) })
    const o = yield* decodeOptions(Options)(options).pipe(
      Effect.mapError((bad) => {
        const first = summary(bad)
        return invalid(first.option, `${first.value}: ${first.detail}`)
      })
    )
    const coordination = yield* Coordination
    const paths = pathsOf(o.namespace)
    const attributes = { namespace: paths.base.slice(1, -"/coordinators".length) }
    const electionsTotal = Metric.withAttributes(metrics.electionsTotal, attributes)
    const failoverDurationMs = Metric.withAttributes(metrics.failoverDurationMs, attributes)
    const fencedWritesRejected = Metric.withAttributes(metrics.fencedWritesRejected, attributes)
    const candidateWakeups = Metric.withAttributes(metrics.candidateWakeups, attributes)
    const sessionOptions = o.sessionTimeout === undefined ? {} : { timeout: o.sessionTimeout }
    const replicaLagTimeMax =
      o.replicaLagTimeMax === undefined ? DEFAULT_REPLICA_LAG_TIME_MAX : Duration.fromInputUnsafe(o.replicaLagTimeMax)

    // The observer session: replaced (under a lock) when it ends, each in a child scope of the election's.
    const scope = yield* Effect.scope
    const openObserver = Effect.gen(function* () {
      const child = yield* Scope.fork(scope, "sequential")
      const session = yield* coordination.session(sessionOptions).pipe(
        Scope.provide(child),
        Effect.onError((cause) => Scope.close(child, Exit.failCause(cause)))
      )
      return { session, scope: child }
    })
    let observer = yield* openObserver.pipe(Effect.mapError(failed))
    // The negotiated session timeout is the coordinator's liveness timeout: validate it now, at layer build.
    if (Duration.isGreaterThanOrEqualTo(observer.session.timeout, replicaLagTimeMax)) {
      return yield* Effect.fail(
        invalid(
          "sessionTimeout",
          `the session (liveness) timeout ${Duration.format(observer.session.timeout)} must be shorter than replicaLagTimeMax ${Duration.format(replicaLagTimeMax)}`
        )
      )
    }
    const observerLock = Semaphore.makeUnsafe(1)
    /** Reopens the observer if `stale` is still the current one. */
    const reopen = (stale: Session) =>
      Semaphore.withPermit(
        observerLock,
        Effect.suspend(() => {
          if (observer.session !== stale) return Effect.void
          const old = observer
          return openObserver.pipe(
            Effect.tap((fresh) => {
              observer = fresh
              return Scope.close(old.scope, Exit.void)
            }),
            Effect.asVoid
          )
        })
      )
    // A lost connection settles within about a session timeout: reconnected, or the session expired.
    const connectionRetries = Math.ceil((Duration.toMillis(observer.session.timeout) * 1.5) / 100)
    /**
     * Runs `f` on the observer; when the observer's session ended, reopens it and runs `f` once more. A lost
     * connection is retried until it settles (after a pause the client first reports a lost connection, then
     * the expiry).
     */
    const withObserver = <A>(f: (session: Session) => Effect.Effect<A, CoordinationError>) =>
      Effect.suspend(() => {
        const session = observer.session
        return f(session).pipe(
          Effect.catchTag("CoordinationError", (e) =>
            Effect.gen(function* () {
              // A lost connection on a session the client already knows ended is an ended session: reopen now.
              const state = e.reason._tag === "ConnectionLoss" ? yield* session.state : "connected"
              if (sessionGone(e) || state === "expired" || state === "closed") {
                yield* reopen(session)
                return yield* f(observer.session)
              }
              return yield* Effect.fail(e)
            })
          )
        )
      }).pipe(
        Effect.retry({
          while: (e: CoordinationError) => e.reason._tag === "ConnectionLoss",
          times: connectionRetries,
          schedule: Schedule.spaced("100 millis")
        })
      )

    const readLeader = withObserver((s) =>
      s.exists(paths.leader).pipe(
        Effect.flatMap((stat) =>
          Option.isNone(stat) ? Effect.succeed(Option.none<Node>()) : Effect.map(s.get(paths.leader), Option.some)
        ),
        Effect.catchTag("CoordinationError", (e) =>
          e.reason._tag === "NoNode" ? Effect.succeed(Option.none<Node>()) : Effect.fail(e)
        )
      )
    )
    const leader: ElectionShape["leader"] = readLeader.pipe(Effect.map(parseLeader), Effect.mapError(failed))

    const changes: ElectionShape["changes"] = Stream.unwrap(
      Effect.sync(() => {
        let pending: Effect.Effect<unknown, CoordinationError> | undefined
        return Stream.fromEffectRepeat(
          Effect.gen(function* () {
            // A watch ending with its session is not a change: re-read through the reopened observer.
            if (pending !== undefined) {
              yield* pending.pipe(
                Effect.catchTag("CoordinationError", (e) => (sessionGone(e) ? Effect.void : Effect.fail(e)))
              )
            }
            const watch = yield* withObserver((s) => s.watchNode(paths.leader))
            pending = watch.changed
            return parseLeader(watch.value)
          }).pipe(Effect.mapError(failed))
        ).pipe(
          Stream.changesWith(
            Option.makeEquivalence(
              (a: LeaderInfo, b: LeaderInfo) =>
                a.serverId === b.serverId && a.epoch === b.epoch && a.address === b.address
            )
          )
        )
      })
    )

    /** The current epoch, read through the observer (`None` when unknown). */
    const currentEpoch = withObserver((s) => s.get(paths.epoch)).pipe(
      Effect.map((n) => Option.some(parseEpoch(n.data))),
      // Bounded: a write's error path never waits on a connection that does not settle.
      Effect.timeoutOption(Duration.times(observer.session.timeout, 2)),
      Effect.map(Option.flatten),
      Effect.orElseSucceed(() => Option.none<number>())
    )

    const campaign = (candidate: Candidate): Effect.Effect<Leadership, ElectionError, Scope.Scope> =>
      Effect.gen(function* () {
        const session = yield* coordination.session(sessionOptions)
        yield* session
          .create(`${paths.ids}/${candidate.serverId}`, bytes(JSON.stringify(candidate)), {
            mode: "ephemeral",
            createParents: true
          })
          .pipe(
            Effect.catchTag("CoordinationError", (e) => (e.reason._tag === "NodeExists" ? Effect.void : Effect.fail(e)))
          )

        const createCandidate = (attempt: number): Effect.Effect<string, CoordinationError> =>
          session
            .create(`${paths.election}/candidate_`, bytes(String(candidate.serverId)), {
              mode: "ephemeral-sequential",
              createParents: true
            })
            .pipe(
              // Curator bug 724: the parent may vanish between creating it and the node; recreate and retry.
              Effect.catchTag("CoordinationError", (e) =>
                e.reason._tag === "NoNode" && attempt < 5 ? createCandidate(attempt + 1) : Effect.fail(e)
              ),
              Effect.tap((path) => Effect.logInfo(`candidate node created ${path}`))
            )

        let ours = yield* createCandidate(0)
        const nameOf = (p: string) => p.slice(p.lastIndexOf("/") + 1)
        /** When this candidate last saw a leader go (its predecessor's watch firing, or no leader at the start). */
        let vacantSince: number | undefined

        /** Bumps the epoch and registers the leader; `undefined` when another candidate got there first. */
        const fence = Effect.gen(function* () {
          const epochNode = yield* session.get(paths.epoch).pipe(
            Effect.catchTag("CoordinationError", (e) =>
              e.reason._tag === "NoNode"
                ? session.create(paths.epoch, bytes("0"), { createParents: true }).pipe(
                    Effect.catchTag("CoordinationError", (e2) =>
                      e2.reason._tag === "NodeExists" ? Effect.void : Effect.fail(e2)
                    ),
                    Effect.andThen(session.get(paths.epoch))
                  )
                : Effect.fail(e)
            )
          )
          const previous = parseEpoch(epochNode.data)
          const epoch = unsafe.skipEpochBump === true ? Math.max(previous, 1) : previous + 1
          const written =
            unsafe.skipEpochBump === true
              ? Option.some(epochNode.stat)
              : yield* session.set(paths.epoch, bytes(String(epoch)), epochNode.stat.version).pipe(
                  Effect.map(Option.some),
                  Effect.catchTag("CoordinationError", (e) =>
                    e.reason._tag === "BadVersion" ? Effect.succeed(Option.none()) : Effect.fail(e)
                  )
                )
          if (Option.isNone(written)) return undefined
          const version = written.value.version
          const info: LeaderInfo = { serverId: candidate.serverId, epoch, address: candidate.address }
          while (true) {
            const registered = yield* session
              .multi([
                op.check(paths.epoch, version),
                op.create(paths.leader, bytes(JSON.stringify(info)), "ephemeral")
              ])
              .pipe(
                Effect.as("ok" as const),
                Effect.catchTag("CoordinationError", (e) =>
                  e.opIndex === 0
                    ? Effect.succeed("fenced" as const)
                    : e.opIndex === 1 && e.reason._tag === "NodeExists"
                      ? Effect.succeed("stale" as const)
                      : Effect.fail(e)
                )
              )
            if (registered === "ok") return { epoch, version, info, previous }
            if (registered === "fenced") return undefined
            // A stale leader node of a dying session: wait for it to go, then retry.
            const watch = yield* session.watchNode(paths.leader)
            if (Option.isSome(watch.value)) {
              if (watch.value.value.stat.ephemeralOwner === session.id) {
                yield* session.delete(paths.leader).pipe(Effect.ignore)
              } else {
                yield* watch.changed
                vacantSince = yield* Clock.currentTimeMillis
              }
            }
          }
        })

        const won = yield* Effect.gen(function* () {
          while (true) {
            const names = (yield* session.children(paths.election)).filter((n) => n.startsWith("candidate_")).sort()
            const index = names.indexOf(nameOf(ours))
            if (index < 0) {
              const state = yield* session.state
              if (state === "expired" || state === "closed") {
                return yield* Effect.fail(coordinationError(new SessionClosed({ session: session.id })))
              }
              ours = yield* createCandidate(0)
              continue
            }
            if (index === 0) {
              // Curator bug 696: verify the lowest node is really ours before acting.
              const stat = yield* session.exists(`${paths.election}/${names[0]}`)
              if (Option.isNone(stat)) continue
              if (stat.value.ephemeralOwner !== session.id) {
                yield* session.delete(ours).pipe(Effect.ignore)
                ours = yield* createCandidate(0)
                continue
              }
              if (vacantSince === undefined) vacantSince = yield* Clock.currentTimeMillis
              const result = yield* fence
              if (result !== undefined) return result
              yield* Effect.sleep("20 millis")
              continue
            }
            const watch = yield* session.watchNode(`${paths.election}/${names[index - 1]}`)
            if (Option.isSome(watch.value)) {
              yield* watch.changed
              yield* Metric.update(candidateWakeups, 1)
              vacantSince = yield* Clock.currentTimeMillis
            }
          }
        })

        // A vacancy is measured only when a previous leader existed (epoch 0 means none ever did).
        const wonAt = yield* Clock.currentTimeMillis
        const failoverMs = won.previous > 0 && vacantSince !== undefined ? Math.max(0, wonAt - vacantSince) : undefined
        yield* Metric.update(electionsTotal, 1)
        if (failoverMs !== undefined) yield* Metric.update(failoverDurationMs, failoverMs)
        yield* Effect.logInfo(`Became coordinator leader with epoch ${won.epoch}`)

        const lost = yield* Deferred.make<LeadershipEnd>()
        // The session ending (other than by resigning) loses the leadership.
        yield* session.changes.pipe(
          Stream.runForEach((state) =>
            state === "expired" || state === "closed" ? Deferred.succeed(lost, { _tag: "SessionLost" }) : Effect.void
          ),
          Effect.andThen(Deferred.succeed(lost, { _tag: "SessionLost" })),
          Effect.forkScoped
        )
        // A higher epoch fences this leadership.
        yield* Effect.gen(function* () {
          while (true) {
            const watch = yield* session.watchNode(paths.epoch)
            if (Option.isSome(watch.value)) {
              const current = parseEpoch(watch.value.value.data)
              if (current > won.epoch || watch.value.value.stat.version !== won.version) {
                return yield* Deferred.succeed(lost, { _tag: "Fenced", epoch: Math.max(current, won.epoch) })
              }
            } else {
              return yield* Deferred.succeed(lost, { _tag: "Fenced", epoch: won.epoch })
            }
            yield* watch.changed
          }
        }).pipe(
          Effect.catch(() => Deferred.succeed(lost, { _tag: "SessionLost" })),
          Effect.forkScoped
        )
        // Closing the scope resigns: runs before the watchers stop and the session closes.
        yield* Effect.addFinalizer(() => Deferred.succeed(lost, { _tag: "Resigned" }))

        const rejected = (current: number) =>
          Metric.update(fencedWritesRejected, 1).pipe(
            Effect.andThen(
              Effect.fail(
                new ElectionError({
                  reason: new FencedEpoch({ resource: "coordinator", current, attempted: won.epoch })
                })
              )
            )
          )

        const fenced = (ops: ReadonlyArray<Op>): Effect.Effect<ReadonlyArray<OpResult>, ElectionError> =>
          (unsafe.skipFenceCheck === true
            ? session.multi(ops)
            : session
                .multi([op.check(paths.epoch, won.version), ...ops])
                .pipe(Effect.map((results) => results.slice(1)))
          ).pipe(
            // A leader's write is bounded by its session timeout: past it, the outcome is unknown (as a lost
            // connection) and the epoch decides whether this leadership is fenced.
            Effect.timeoutOrElse({
              duration: session.timeout,
              orElse: () =>
                Effect.fail(
                  coordinationError(
                    new ConnectionLoss({
                      detail: `no reply within the session timeout ${Duration.format(session.timeout)}`
                    })
                  )
                )
            }),
            Effect.catchTag("CoordinationError", (e) =>
              Effect.gen(function* () {
                const checked = unsafe.skipFenceCheck !== true
                const isFence =
                  checked && e.opIndex === 0 && (e.reason._tag === "BadVersion" || e.reason._tag === "NoNode")
                // The session ended, or the connection broke mid-write (after a pause, say): if a newer epoch
                // exists, the write cannot be applied any more and this leadership is over — FencedEpoch. (A
                // write whose reply was lost may have been applied earlier, under its then-current epoch.)
                const ambiguous = sessionGone(e) || e.reason._tag === "ConnectionLoss"
                if (isFence || ambiguous) {
                  const current = yield* currentEpoch
                  if (isFence) return yield* rejected(Option.getOrElse(current, () => won.epoch))
                  if (Option.isSome(current) && current.value > won.epoch) return yield* rejected(current.value)
                }
                const shift = checked ? 1 : 0
                return yield* Effect.fail(
                  failed(
                    e.opIndex !== undefined && e.opIndex >= shift ? coordinationError(e.reason, e.opIndex - shift) : e
                  )
                )
              })
            )
          )

        return {
          epoch: won.epoch,
          info: won.info,
          failoverDurationMs: failoverMs,
          connection: session.changes,
          lost: Deferred.await(lost),
          fenced
        } satisfies Leadership
      }).pipe(Effect.catchTag("CoordinationError", (e) => Effect.fail(failed(e))))

    return { leader, changes, campaign } satisfies ElectionShape
  })
