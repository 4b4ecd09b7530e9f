/**
 * The election recipe's implementation. `CoordinationElection.make` runs it
 * with every safety check on; the simulation tests also run deliberately broken
 * variants (`Unsafe`) to prove their checkers catch what the checks prevent.
 *
 * @internal
 */
import { Coordination, CoordinationPaths, Election, Models, OptionSchemas } from "@strata/core"
import { Clock, Duration, Effect, Exit, Metric, Option, Result, Schema, Scope, Stream } from "effect"
import * as Campaign from "./campaign.js"
import * as Won from "./leadership.js"
import * as Observer from "./observer.js"

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
  replicaLagTimeMax: Schema.optional(DurationInput("positive")),
  /**
   * How long a leader's fenced write may take before its outcome is reported unknown (a lost connection), above
   * zero (default: the session timeout).
   */
  requestTimeout: Schema.optional(DurationInput("positive")),
  /**
   * Taken off the session timeout for a leadership's local deadline, covering clock drift and scheduling delay
   * (default: a tenth of the session timeout); it must be shorter than the session timeout.
   */
  leadershipMargin: Schema.optional(DurationInput("nonNegative"))
})
/** @see Options */
export type Options = typeof Options.Type

/** Safety checks a broken variant may switch off (tests only). */
export type Unsafe = Campaign.Unsafe

/** The election's metrics, labelled by namespace. */
export const metrics = {
  /** Elections won. */
  electionsTotal: Metric.counter("strata_coordinator_elections_total", {
    description: "Coordinator elections won",
    incremental: true
  }),
  /**
   * How long each won election took, in seconds: from the winner seeing its predecessor go to its leader
   * registration (not the wait for a dead leader's session to expire before that).
   */
  electionDuration: Metric.histogram("strata_coordinator_election_duration_seconds", {
    description: "Seconds from the winning candidate seeing its predecessor go to its leader registration",
    boundaries: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
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

const decoder = new TextDecoder()
const decodeLeader = Schema.decodeUnknownOption(Models.LeaderInfo)

/** Parses a leader node's data, `None` when absent or malformed. */
const parseLeader = (node: Option.Option<Coordination.Node>): Option.Option<Models.LeaderInfo> =>
  Option.flatMap(node, (n) => {
    try {
      return decodeLeader(JSON.parse(decoder.decode(n.data)))
    } catch {
      return Option.none()
    }
  })

/** The paths of a namespace. */
export const pathsOf = (namespace: string): Campaign.Paths => {
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

/** The election's metrics with its namespace's attributes. */
const labelled = (attributes: Record<string, string>) => ({
  electionsTotal: Metric.withAttributes(metrics.electionsTotal, attributes),
  electionDuration: Metric.withAttributes(metrics.electionDuration, attributes),
  fencedWritesRejected: Metric.withAttributes(metrics.fencedWritesRejected, attributes),
  candidateWakeups: Metric.withAttributes(metrics.candidateWakeups, attributes)
})

/** An election: what its functions share. */
interface Campaigner {
  readonly coordination: Coordination.Shape
  readonly paths: Campaign.Paths
  readonly unsafe: Unsafe
  readonly sessionOptions: Coordination.SessionOptions
  readonly metrics: ReturnType<typeof labelled>
  readonly observer: Observer.Observer
  /** Every epoch any read of this election saw: a campaign's bump goes past all of them. */
  readonly epochs: Campaign.EpochsSeen
  readonly requestTimeout: Duration.Duration
  /** Taken off the session timeout for a leadership's local deadline. */
  readonly margin: Duration.Duration
  /** A spell of lost connections is waited out for up to two session timeouts; an ended session is not. */
  readonly reconnectBudget: Duration.Duration
}

/** The election error for an option `make` refuses. */
const invalid = (option: string, detail: string) =>
  new Election.ElectionError({ reason: new Election.InvalidOptions({ option, detail }) })

/** The leader node through the observer, `None` when there is none. */
const readLeader = (e: Campaigner): Effect.Effect<Option.Option<Coordination.Node>, Coordination.CoordinationError> =>
  Observer.withObserver(e.observer, (s) =>
    s.exists(e.paths.leader).pipe(
      Effect.flatMap((stat) =>
        Option.isNone(stat)
          ? Effect.succeed(Option.none<Coordination.Node>())
          : Effect.map(s.get(e.paths.leader), Option.some)
      ),
      Effect.catchTag("CoordinationError", (err) =>
        err.reason._tag === "NoNode" ? Effect.succeed(Option.none<Coordination.Node>()) : Effect.fail(err)
      )
    )
  )

/** The current leader, as `ElectionShape.leader`. */
const leader = (e: Campaigner): Election.Shape["leader"] =>
  readLeader(e).pipe(Effect.map(parseLeader), Effect.mapError(Won.failed))

/** Each new leader (or its absence), as `ElectionShape.changes`: the leader node watched through the observer. */
const changes = (e: Campaigner): Election.Shape["changes"] =>
  Stream.unwrap(
    Effect.sync(() => {
      let pending: Effect.Effect<unknown, Coordination.CoordinationError> | undefined
      return Stream.fromEffectRepeat(
        Effect.gen(function* () {
          // A watch ending with its session is not a change: re-read through the reopened observer.
          if (pending !== undefined) {
            yield* pending.pipe(
              Effect.catchTag("CoordinationError", (err) => (Won.sessionGone(err) ? Effect.void : Effect.fail(err)))
            )
          }
          const watch = yield* Observer.withObserver(e.observer, (s) => s.watchNode(e.paths.leader))
          pending = watch.changed
          return parseLeader(watch.value)
        }).pipe(Effect.mapError(Won.failed))
      ).pipe(
        Stream.changesWith(
          Option.makeEquivalence(
            (a: Models.LeaderInfo, b: Models.LeaderInfo) =>
              a.serverId === b.serverId && a.epoch === b.epoch && a.address === b.address
          )
        )
      )
    })
  )

/** The current epoch, read through the observer (`None` when unknown or unreadable). */
const currentEpoch = (e: Campaigner): Effect.Effect<Option.Option<number>> =>
  Observer.withObserver(e.observer, (s) => s.get(e.paths.epoch)).pipe(
    Effect.map((n) => Result.getSuccess(Campaign.parseEpoch(e.paths.epoch, n.data))),
    Effect.tap((epoch) => Effect.sync(() => Option.map(epoch, (ep) => Campaign.see(e.epochs, ep)))),
    Effect.orElseSucceed(() => Option.none<number>())
  )

/** Registers, waits to be the lowest candidate, fences; then the leadership, in `scope`. */
const campaignIn = (e: Campaigner, candidate: Election.Candidate, session: Coordination.Session) =>
  Effect.gen(function* () {
    const ctx: Campaign.Context = {
      session,
      paths: e.paths,
      candidate,
      epochs: e.epochs,
      unsafe: e.unsafe,
      wakeup: Metric.update(e.metrics.candidateWakeups, 1)
    }
    const state = { ours: undefined as string | undefined, vacantSince: undefined as number | undefined }
    yield* Campaign.retryLostConnections(Campaign.register(ctx), e.reconnectBudget)
    const won = yield* Campaign.retryLostConnections(Campaign.elect(ctx, state), e.reconnectBudget)
    // An election is measured only when a previous leader existed (epoch 0 means none ever did).
    const wonAt = yield* Clock.currentTimeMillis
    const took =
      won.previous > 0 && state.vacantSince !== undefined ? Math.max(0, wonAt - state.vacantSince) : undefined
    yield* Metric.update(e.metrics.electionsTotal, 1)
    if (took !== undefined) yield* Metric.update(e.metrics.electionDuration, took / 1000)
    yield* Effect.logDebug(`won the coordinator election with epoch ${won.epoch}`)
    return yield* Won.make({
      ctx,
      won,
      electionDurationMs: took,
      marginMs: Duration.toMillis(e.margin),
      requestTimeout: e.requestTimeout,
      currentEpoch: currentEpoch(e),
      rejectedWrite: Metric.update(e.metrics.fencedWritesRejected, 1)
    })
  }).pipe(Effect.catchTag("CoordinationError", (err) => Effect.fail(Won.failed(err))))

/**
 * A campaign opens its own session in a child of the caller's scope: a campaign that fails (or is interrupted)
 * closes it, so its registration and candidate node go with it and a retry starts clean.
 */
const campaign = (
  e: Campaigner,
  candidate: Election.Candidate
): Effect.Effect<Election.Leadership, Election.ElectionError, Scope.Scope> =>
  Effect.gen(function* () {
    const child = yield* Scope.fork(yield* Effect.scope, "sequential")
    return yield* Effect.gen(function* () {
      const session = yield* e.coordination.session(e.sessionOptions).pipe(Effect.mapError(Won.failed))
      return yield* campaignIn(e, candidate, session)
    }).pipe(
      Scope.provide(child),
      Effect.onError((cause) => Scope.close(child, Exit.failCause(cause))),
      Effect.withSpan("strata.election.campaign", { attributes: { "strata.server": candidate.serverId } })
    )
  })

/**
 * Builds the election. Opens one long-lived observer session in the scope (for
 * `leader`, `changes` and epoch reads), reopened when it expires; every
 * campaign opens its own session.
 */
export const make = (
  options: Options,
  unsafe: Unsafe = {}
): Effect.Effect<Election.Shape, Election.ElectionError, Coordination.Coordination | Scope.Scope> =>
  Effect.gen(function* () {
    const o = yield* decodeOptions(Options, { exact: true })(options).pipe(
      Effect.mapError((bad) => {
        const first = summary(bad)
        return invalid(first.option, `${first.value}: ${first.detail}`)
      })
    )
    const coordination = yield* Coordination.Coordination
    const paths = pathsOf(o.namespace)
    const sessionOptions = o.sessionTimeout === undefined ? {} : { timeout: o.sessionTimeout }
    const replicaLagTimeMax =
      o.replicaLagTimeMax === undefined ? DEFAULT_REPLICA_LAG_TIME_MAX : Duration.fromInputUnsafe(o.replicaLagTimeMax)
    const observer = yield* Observer.make(coordination, sessionOptions).pipe(Effect.mapError(Won.failed))
    // The negotiated session timeout is the coordinator's liveness timeout: validate it now, at layer build.
    const sessionTimeout = observer.current.session.timeout
    if (Duration.isGreaterThanOrEqualTo(sessionTimeout, replicaLagTimeMax)) {
      return yield* Effect.fail(
        invalid(
          "sessionTimeout",
          `the session (liveness) timeout ${Duration.format(sessionTimeout)} must be shorter than replicaLagTimeMax ${Duration.format(replicaLagTimeMax)}`
        )
      )
    }
    const margin =
      o.leadershipMargin === undefined
        ? Duration.times(sessionTimeout, 0.1)
        : Duration.fromInputUnsafe(o.leadershipMargin)
    if (Duration.isGreaterThanOrEqualTo(margin, sessionTimeout)) {
      return yield* Effect.fail(
        invalid(
          "leadershipMargin",
          `${Duration.format(margin)} must be shorter than the session timeout ${Duration.format(sessionTimeout)}`
        )
      )
    }
    const e: Campaigner = {
      coordination,
      paths,
      unsafe,
      sessionOptions,
      metrics: labelled({ namespace: paths.base.slice(1, -"/coordinators".length) }),
      observer,
      epochs: { highest: 0 },
      requestTimeout: o.requestTimeout === undefined ? sessionTimeout : Duration.fromInputUnsafe(o.requestTimeout),
      margin,
      reconnectBudget: Duration.times(sessionTimeout, 2)
    }
    return {
      leader: leader(e),
      changes: changes(e),
      campaign: (candidate) => campaign(e, candidate)
    } satisfies Election.Shape
  })
