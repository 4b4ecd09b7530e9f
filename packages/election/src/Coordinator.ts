/**
 * A coordinator server: the Effect shell around the pure
 * `CoordinatorLifecycle` machine (docs/ARCHITECTURE.md, "Election and failover").
 *
 * The shell feeds the machine inputs from the `Election` in context (elected,
 * leadership lost) and from the leader-only services (all started, one failed),
 * and executes the commands the machine returns. It never decides a transition
 * itself; an `IllegalStateTransition` from the machine kills the shell with
 * that defect (see `join`).
 *
 * - `Start` → "standby start", then the coordinator campaigns (`election.campaign`).
 * - Elected → the leader services are acquired in order inside one scope for that
 *   leadership; all started → "leader services started".
 * - Leadership lost (session expired, fenced) → that scope closes (services are
 *   released in reverse order), the leadership is given up, and the coordinator
 *   campaigns again after `rejoinBackoff`.
 * - A service failing to start → what was built is released in reverse order, the
 *   failure is logged and the coordinator campaigns again after `rejoinBackoff`.
 * - Closing the coordinator's scope → the services are released, the leadership is
 *   given up, the state becomes `Down`.
 *
 * Inputs the shell feeds: `Start` once; `Campaign` whenever the machine leaves it
 * in a started `Standby` with no campaign running (at once after `Start`, after
 * `rejoinBackoff` otherwise, and for every `RejoinElection` command), so a
 * coordinator rejoins after any lost leadership (`Resign` included, for which the
 * machine emits no `RejoinElection`); `Elected` / `SessionLost` /
 * `Fenced` / `Resign` from `election.campaign` and `Leadership.lost` (a campaign
 * that fails counts as a lost session); `LeaderServicesReady` / `LeaderServicesFailed`
 * from the services' acquisition; `Close` when the scope closes. Inputs from a
 * campaign already torn down (a "ready" queued behind the session loss, say) are
 * dropped, never fed to the machine.
 *
 * Log lines: "standby start" and "leader services started" come from the
 * machine; "candidate node created …" and "Became coordinator leader with epoch N"
 * are logged by the election recipe at the moment they happen, so the shell does
 * not repeat the machine's copies of those two.
 *
 * Connection blips: while leading, the shell feeds `ConnectionSuspended` /
 * `ConnectionRestored` from `Leadership.connection`; the machine keeps the
 * leadership and logs them. A blip shorter than the session timeout changes
 * nothing else; an expiry arrives as `Leadership.lost` = `SessionLost`.
 *
 * `RegisterStandby`: the election recipe registers `/<ns>/coordinators/ids/<serverId>`
 * in every campaign's session, so the shell has nothing more to do for it.
 *
 * @since 0.1.0
 */
import type { Leadership, LeadershipEnd } from "@strata/core"
import { Election, ServerId, OptionSchemas } from "@strata/core"
import {
  Cause,
  Config,
  Context,
  Data,
  Deferred,
  Duration,
  Effect,
  Exit,
  Fiber,
  Layer,
  Option,
  Queue,
  Result,
  Schema,
  Scope,
  Stream,
  SubscriptionRef
} from "effect"
import * as Lifecycle from "./CoordinatorLifecycle.js"

const { DurationInput, decodeOptions, summary } = OptionSchemas

// ---------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------

/**
 * A leader-only service (event processor, channel manager, RPC client, …):
 * acquired when this coordinator becomes leader, inside the leadership's scope,
 * and released when that scope closes. `acquire` receives the leadership so the
 * service can make fenced writes with its epoch. `R` holds what it needs from
 * the coordinator's context besides the `Scope`, which the coordinator provides.
 *
 * @since 0.1.0
 */
export interface LeaderService<R = Scope.Scope> {
  /** A name for logs and failure messages. */
  readonly name: string
  /** Starts the service; register its shutdown with `Effect.acquireRelease` / `Effect.addFinalizer`. */
  readonly acquire: (leadership: Leadership) => Effect.Effect<unknown, unknown, R>
}

/**
 * Builds a {@link LeaderService}.
 *
 * @since 0.1.0
 */
export const service = <R = Scope.Scope>(
  name: string,
  acquire: (leadership: Leadership) => Effect.Effect<unknown, unknown, R>
): LeaderService<R> => ({ name, acquire })

/**
 * The parts of the options that configuration can hold (see {@link layerConfig}).
 *
 * @since 0.1.0
 */
export interface ServerOptions {
  /** This coordinator's server id. */
  readonly serverId: ServerId
  /** The address clients and tablet servers reach this coordinator at. */
  readonly address: string
}

/**
 * Options of a coordinator.
 *
 * @since 0.1.0
 */
export interface Options<R = Scope.Scope> extends ServerOptions {
  /** The leader-only services, acquired in this order and released in reverse. */
  readonly services?: ReadonlyArray<LeaderService<R>>
  /**
   * How long to wait before campaigning again after a leadership ended or the
   * services failed to start (default 1 second). The first campaign starts at once.
   */
  readonly rejoinBackoff?: Duration.Input
}

/**
 * The schema `make` validates a coordinator's options with: a server id ≥ 0,
 * a non-empty address, named services, a finite `rejoinBackoff` ≥ 0.
 *
 * @since 0.1.0
 */
export const CoordinatorOptions = Schema.Struct({
  serverId: ServerId,
  address: Schema.String.check(Schema.makeFilter((a: string) => (a.trim() === "" ? "expected an address" : undefined))),
  services: Schema.optional(
    Schema.Array(
      Schema.Struct({
        name: Schema.String.check(
          Schema.makeFilter((n: string) => (n.trim() === "" ? "expected a service name" : undefined))
        ),
        acquire: Schema.declare((u: unknown): u is unknown => typeof u === "function", { expected: "a function" })
      })
    )
  ),
  rejoinBackoff: Schema.optional(DurationInput("nonNegative"))
})

/**
 * The coordinator's options failed `CoordinatorOptions`; nothing was started.
 * `option` names the first bad one (e.g. `rejoinBackoff`, `services[0].name`).
 *
 * @since 0.1.0
 */
export class InvalidCoordinatorOptions extends Schema.TaggedError<InvalidCoordinatorOptions>()(
  "InvalidCoordinatorOptions",
  {
    option: Schema.String,
    /** The bad value, JSON-formatted. */
    value: Schema.String,
    /** What is wrong with it (and with any other bad option). */
    detail: Schema.String
  }
) {
  /** @since 0.1.0 */
  override get message(): string {
    return `coordinator: invalid option ${this.option} = ${this.value}: ${this.detail}`
  }
}

// ---------------------------------------------------------------------------
// Service
// ---------------------------------------------------------------------------

/**
 * `awaitLeader` / `awaitState` gave up: the coordinator closed first.
 *
 * @since 0.1.0
 */
export class CoordinatorClosed extends Data.TaggedError("CoordinatorClosed")<{
  readonly serverId: ServerId
}> {
  /** @since 0.1.0 */
  override get message(): string {
    return `coordinator ${this.serverId} is closed`
  }
}

/**
 * A running coordinator.
 *
 * @since 0.1.0
 */
export interface CoordinatorShape {
  /** This coordinator's server id. */
  readonly serverId: ServerId
  /** This coordinator's address. */
  readonly address: string
  /** The lifecycle state now. */
  readonly state: Effect.Effect<Lifecycle.State>
  /** The state now, then every state the coordinator moves to; ends after `Down`. */
  readonly changes: Stream.Stream<Lifecycle.State>
  /**
   * The leadership while this coordinator leads (`Leader`, initialising or
   * ready): use its `fenced` for writes that must be rejected once a newer
   * coordinator epoch exists.
   */
  readonly leadership: Effect.Effect<Option.Option<Leadership>>
  /** Whether this coordinator leads and its leader services have all started. */
  readonly isLeader: Effect.Effect<boolean>
  /**
   * Waits until this coordinator leads with all leader services started and
   * returns the leadership. Fails with `CoordinatorClosed` if it closes first.
   */
  readonly awaitLeader: Effect.Effect<Leadership, CoordinatorClosed>
  /**
   * Waits for the first state (the current one included) satisfying `predicate`.
   * Fails with `CoordinatorClosed` if the coordinator closes first (unless `Down` satisfies it).
   */
  readonly awaitState: (
    predicate: (state: Lifecycle.State) => boolean
  ) => Effect.Effect<Lifecycle.State, CoordinatorClosed>
  /**
   * Steps down if leading (the leader services are released in reverse order),
   * then campaigns again after `rejoinBackoff`, behind the candidates already
   * waiting. Does nothing when not leading.
   */
  readonly resign: Effect.Effect<void>
  /**
   * Waits until the coordinator is `Down`. Dies with the shell's defect (an
   * `IllegalStateTransition`) if the shell died.
   */
  readonly join: Effect.Effect<void>
}

/**
 * The `Coordinator` service key.
 *
 * @since 0.1.0
 */
export class Coordinator extends Context.Service<Coordinator, CoordinatorShape>()("@strata/election/Coordinator") {}

// ---------------------------------------------------------------------------
// The shell
// ---------------------------------------------------------------------------

/** One campaign and, once won, its leadership and leader services. */
interface Attempt {
  /** The campaign's scope: its session, candidate node and leadership. Closing it resigns. */
  readonly scope: Scope.Closeable
  leadership: Leadership | undefined
  campaign: Fiber.Fiber<void> | undefined
  /** The leader services' scope (a child of the shell's root), closed before `scope`. */
  services: Scope.Closeable | undefined
  acquiring: Fiber.Fiber<void> | undefined
}

/** A scheduled `Campaign`. */
interface Timer {
  fiber: Fiber.Fiber<void> | undefined
}

/** Where an input comes from; inputs of a torn-down attempt or a cancelled timer are stale and dropped. */
type Source =
  | { readonly _tag: "Attempt"; readonly attempt: Attempt }
  | { readonly _tag: "Timer"; readonly timer: Timer }
  | { readonly _tag: "Resign" }
  | { readonly _tag: "Owner" }

interface Envelope {
  readonly input: Lifecycle.Input
  readonly source: Source
}

interface Snapshot {
  readonly state: Lifecycle.State
  readonly leadership: Option.Option<Leadership>
}

/** Machine log lines the election recipe already logs when they happen (with details). */
const loggedByRecipe = (message: string): boolean =>
  message === "candidate node created" || message.startsWith("Became coordinator leader with epoch ")

const endToInput = (end: LeadershipEnd): Lifecycle.Input => {
  switch (end._tag) {
    case "SessionLost":
      return Lifecycle.Input.SessionLost
    case "Fenced":
      return Lifecycle.Input.Fenced(end.epoch)
    case "Resigned":
      return Lifecycle.Input.Resign
  }
}

const describeFailure = (name: string, cause: Cause.Cause<unknown>): string => {
  const error = Cause.squash(cause)
  const detail = error instanceof Error ? error.message : String(error)
  return `${name}: ${detail}`
}

/**
 * Starts a coordinator in the scope, on the `Election` in context. It
 * registers, campaigns and leads as described in the module comment; closing
 * the scope releases the leader services, gives up the leadership and ends in
 * `Down`. Options that fail `CoordinatorOptions` fail with
 * `InvalidCoordinatorOptions`, before anything starts.
 *
 * @since 0.1.0
 */
export const make = <R = Scope.Scope>(
  options: Options<R>
): Effect.Effect<CoordinatorShape, InvalidCoordinatorOptions, Election | Scope.Scope | R> =>
  Effect.gen(function* () {
    const o = yield* decodeOptions(CoordinatorOptions)(options).pipe(
      Effect.mapError((bad) => new InvalidCoordinatorOptions(summary(bad)))
    )
    const election = yield* Election
    const scope = yield* Effect.scope
    // The decoded services are the same objects, typed loosely: the typed ones are the caller's.
    const services = options.services ?? []
    const backoff = Duration.fromInputUnsafe(o.rejoinBackoff ?? "1 second")
    const candidate = { serverId: o.serverId, address: o.address }

    // Order matters on close: the Close finalizer (added last) runs first, then
    // the driver is interrupted, then `root` closes whatever is left.
    const root = yield* Scope.fork(scope, "sequential")
    const inbox = yield* Queue.unbounded<Envelope>()
    const snapshot = yield* SubscriptionRef.make<Snapshot>({
      state: Lifecycle.initial(o.serverId),
      leadership: Option.none()
    })
    const terminated = yield* Deferred.make<void>()

    let attempt: Attempt | undefined
    let pending: Timer | undefined

    const offer = (input: Lifecycle.Input, source: Source) => Queue.offer(inbox, { input, source })

    const isLive = (source: Source, state: Lifecycle.State): boolean => {
      switch (source._tag) {
        case "Attempt":
          return source.attempt === attempt
        case "Timer":
          return source.timer === pending
        case "Resign":
          return state._tag === "Leader"
        case "Owner":
          return true
      }
    }

    /** Campaign, then report the election and the end of the leadership as inputs. */
    const createCandidate = Effect.gen(function* () {
      const current: Attempt = {
        scope: yield* Scope.fork(root, "sequential"),
        leadership: undefined,
        campaign: undefined,
        services: undefined,
        acquiring: undefined
      }
      attempt = current
      const source: Source = { _tag: "Attempt", attempt: current }
      current.campaign = yield* election.campaign(candidate).pipe(
        Scope.provide(current.scope),
        Effect.matchEffect({
          // The campaign could not go on (its session ended, the backend failed): as a lost session.
          onFailure: (error) =>
            Effect.logWarning(`campaign failed: ${error.message}`).pipe(
              Effect.andThen(offer(Lifecycle.Input.SessionLost, source))
            ),
          onSuccess: (leadership) =>
            Effect.gen(function* () {
              current.leadership = leadership
              yield* offer(Lifecycle.Input.Elected(leadership.epoch), source)
              // Connection blips of the leadership's session, as inputs (the machine keeps the leadership).
              let suspended = false
              yield* leadership.connection.pipe(
                Stream.runForEach((state) => {
                  if (state === "suspended" && !suspended) {
                    suspended = true
                    return offer(Lifecycle.Input.ConnectionSuspended, source)
                  }
                  if (state === "connected" && suspended) {
                    suspended = false
                    return offer(Lifecycle.Input.ConnectionRestored, source)
                  }
                  return Effect.void
                }),
                Effect.forkIn(current.scope)
              )
              const end = yield* leadership.lost
              yield* offer(endToInput(end), source)
            })
        }),
        Effect.asVoid,
        Effect.forkIn(root)
      )
    })

    /** Acquire every leader service in order in one scope, then report the outcome as an input. */
    const acquireServices = Effect.gen(function* () {
      const current = attempt
      const leadership = current?.leadership
      if (current === undefined || leadership === undefined) {
        return yield* Effect.die(new Error("AcquireLeaderResources without a won campaign"))
      }
      const servicesScope = yield* Scope.fork(root, "sequential")
      current.services = servicesScope
      const source: Source = { _tag: "Attempt", attempt: current }
      current.acquiring = yield* Effect.forEach(
        services,
        (s) =>
          s.acquire(leadership).pipe(
            Scope.provide(servicesScope),
            Effect.tap(() => Effect.logDebug(`leader service ${s.name} started`)),
            Effect.catchCause((cause) =>
              Cause.hasInterruptsOnly(cause) ? Effect.interrupt : Effect.fail(describeFailure(s.name, cause))
            )
          ),
        { discard: true }
      ).pipe(
        Effect.matchEffect({
          onFailure: (cause) => offer(Lifecycle.Input.LeaderServicesFailed(cause), source),
          onSuccess: () => offer(Lifecycle.Input.LeaderServicesReady, source)
        }),
        Effect.asVoid,
        Effect.forkIn(root)
      )
    })

    /** Stop acquiring, release the services (reverse order), then give up the leadership. */
    const teardown = Effect.gen(function* () {
      const current = attempt
      if (current === undefined) return
      attempt = undefined
      if (current.acquiring !== undefined) yield* Fiber.interrupt(current.acquiring)
      if (current.campaign !== undefined) yield* Fiber.interrupt(current.campaign)
      if (current.services !== undefined) yield* Scope.close(current.services, Exit.void)
      yield* Scope.close(current.scope, Exit.void)
    })

    const cancelCampaign = Effect.gen(function* () {
      const timer = pending
      pending = undefined
      if (timer?.fiber !== undefined) yield* Fiber.interrupt(timer.fiber)
    })

    /** Feed `Campaign` after `delay`, unless a campaign is already scheduled. */
    const scheduleCampaign = (delay: Duration.Duration) =>
      Effect.gen(function* () {
        if (pending !== undefined) return
        const timer: Timer = { fiber: undefined }
        pending = timer
        const feed = offer(Lifecycle.Input.Campaign, { _tag: "Timer", timer })
        timer.fiber = yield* (Duration.isZero(delay) ? feed : Effect.andThen(Effect.sleep(delay), feed)).pipe(
          Effect.asVoid,
          Effect.forkIn(root)
        )
      })

    const execute = (command: Lifecycle.Command) => {
      switch (command._tag) {
        case "RegisterStandby":
          // The recipe registers /ids/<serverId> in each campaign's session.
          return Effect.void
        case "CreateCandidate":
          return createCandidate
        case "AcquireLeaderResources":
          return acquireServices
        case "ReleaseLeaderResources":
          return teardown
        case "RejoinElection":
          return scheduleCampaign(backoff)
        case "Log":
          return loggedByRecipe(command.message) ? Effect.void : Effect.logInfo(command.message)
      }
    }

    /** One input: step the machine, run its commands, publish the new state. */
    const handle = (envelope: Envelope) =>
      Effect.gen(function* () {
        const { state } = yield* SubscriptionRef.get(snapshot)
        if (!isLive(envelope.source, state)) return
        if (envelope.source._tag === "Timer") pending = undefined
        const result = Lifecycle.step(state, envelope.input)
        if (Result.isFailure(result)) return yield* Effect.die(result.failure)
        const [next, commands] = result.success
        for (const command of commands) yield* execute(command)
        // A campaign lives only while Electing or Leader.
        if (next._tag !== "Electing" && next._tag !== "Leader") yield* teardown
        // A started standby always campaigns (again): at once after Start, after the backoff otherwise.
        if (next._tag === "Standby" && next.started && attempt === undefined) {
          yield* scheduleCampaign(envelope.input._tag === "Start" ? Duration.zero : backoff)
        }
        if (next._tag === "Down") yield* cancelCampaign
        const leadership =
          next._tag === "Leader" && attempt?.leadership !== undefined ? Option.some(attempt.leadership) : Option.none()
        yield* SubscriptionRef.set(snapshot, { state: next, leadership })
      })

    const driver = Effect.gen(function* () {
      yield* offer(Lifecycle.Input.Start, { _tag: "Owner" })
      while (true) {
        const envelope = yield* Queue.take(inbox)
        yield* handle(envelope)
        if ((yield* SubscriptionRef.get(snapshot)).state._tag === "Down") return
      }
    }).pipe(
      Effect.tapCause((cause) =>
        Cause.hasInterruptsOnly(cause) ? Effect.void : Effect.logError("coordinator shell died", cause)
      ),
      Effect.onExit((exit) => Deferred.done(terminated, exit)),
      Effect.annotateLogs({ coordinator: o.serverId })
    )
    yield* Effect.forkIn(driver, scope)
    yield* Effect.addFinalizer(() =>
      Effect.gen(function* () {
        if (yield* Deferred.isDone(terminated)) return
        yield* offer(Lifecycle.Input.Close, { _tag: "Owner" })
        yield* Deferred.await(terminated).pipe(Effect.exit)
      })
    )

    const state = Effect.map(SubscriptionRef.get(snapshot), (s) => s.state)
    const changes = SubscriptionRef.changes(snapshot).pipe(
      Stream.map((s) => s.state),
      Stream.changes,
      Stream.takeUntil((s) => s._tag === "Down")
    )
    /** Dies with the shell's defect, never succeeds: raced against waits so they never hang on a dead shell. */
    const shellDeath = Effect.andThen(Deferred.await(terminated), Effect.never)

    const awaitSnapshot = (predicate: (s: Snapshot) => boolean): Effect.Effect<Snapshot, CoordinatorClosed> =>
      SubscriptionRef.changes(snapshot).pipe(
        Stream.filter((s) => predicate(s) || s.state._tag === "Down"),
        Stream.runHead,
        Effect.flatMap((found) =>
          Option.isSome(found) && predicate(found.value)
            ? Effect.succeed(found.value)
            : Effect.fail(new CoordinatorClosed({ serverId: o.serverId }))
        ),
        Effect.raceFirst(shellDeath)
      )

    const isReady = (s: Snapshot) =>
      s.state._tag === "Leader" && s.state.phase === "Ready" && Option.isSome(s.leadership)

    return {
      serverId: o.serverId,
      address: o.address,
      state,
      changes,
      leadership: Effect.map(SubscriptionRef.get(snapshot), (s) => s.leadership),
      isLeader: Effect.map(SubscriptionRef.get(snapshot), isReady),
      awaitLeader: awaitSnapshot(isReady).pipe(
        Effect.flatMap((s) =>
          Option.isSome(s.leadership) ? Effect.succeed(s.leadership.value) : Effect.die(new Error("no leadership"))
        )
      ),
      awaitState: (predicate) =>
        Effect.map(
          awaitSnapshot((s) => predicate(s.state)),
          (s) => s.state
        ),
      resign: Effect.asVoid(offer(Lifecycle.Input.Resign, { _tag: "Resign" })),
      join: Deferred.await(terminated)
    } satisfies CoordinatorShape
  })

/**
 * A coordinator as a layer (on the `Election` in context); it closes with the layer.
 *
 * @since 0.1.0
 */
export const layer = <R = Scope.Scope>(
  options: Options<R>
): Layer.Layer<Coordinator, InvalidCoordinatorOptions, Election | Exclude<R, Scope.Scope>> =>
  Layer.effect(Coordinator, make(options))

/**
 * Like {@link layer}, with the server id and address read from configuration
 * (validated by the same `CoordinatorOptions`).
 *
 * @since 0.1.0
 */
export const layerConfig = <R = Scope.Scope>(
  config: Config.Wrap<ServerOptions>,
  options: Omit<Options<R>, keyof ServerOptions> = {}
): Layer.Layer<Coordinator, InvalidCoordinatorOptions | Config.ConfigError, Election | Exclude<R, Scope.Scope>> =>
  Layer.unwrap(Effect.map(Config.unwrap(config), (server) => layer<R>({ ...options, ...server })))
