/**
 * A coordinator server: the Effect shell around the pure
 * `CoordinatorLifecycle` machine (docs/ARCHITECTURE.md, "Election and failover").
 *
 * The shell feeds the machine inputs and executes exactly the commands it
 * returns; it decides no transition itself (the machine's module comment has
 * the table). An `IllegalStateTransition` from the machine, or any other
 * failure of the shell, kills it with that defect (see `join`) — and releases
 * everything it held first: the leader services, the campaign's session with
 * its registration, candidate and leader nodes, so a dead shell never leaves a
 * zombie leader behind.
 *
 * Inputs: `Start` once and `Close` when the scope closes; `Campaign` from the
 * shell's timer (`ScheduleCampaign`: at once after `Start`, after
 * `rejoinBackoff` otherwise); `Elected` / `CampaignFailed` from
 * `election.campaign`; `SessionLost` / `Fenced` / `Resign` from
 * `Leadership.lost` (and `Resign` from `resign`); `Lapsed` when
 * `Leadership.proven` turns false (the deadline passed);
 * `ConnectionSuspended` / `ConnectionRestored` from `Leadership.connection`;
 * `LeaderServicesReady` / `LeaderServicesFailed` from the leader services'
 * acquisition. Inputs of a campaign already closed, or of a cancelled timer,
 * are stale and dropped, never fed to the machine.
 *
 * Log lines: the machine's (`standby start`, `Became coordinator leader with
 * epoch N`, `leader services started`, …), and the recipe's own `candidate node
 * created <path>` when the node is made.
 *
 * @since 0.1.0
 */
import { Election, Errors, Models, OptionSchemas } from "@strata/core"
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
  readonly acquire: (leadership: Election.Leadership) => Effect.Effect<unknown, unknown, R>
}

/**
 * Builds a {@link LeaderService}.
 *
 * @since 0.1.0
 */
export const service = <R = Scope.Scope>(
  name: string,
  acquire: (leadership: Election.Leadership) => Effect.Effect<unknown, unknown, R>
): LeaderService<R> => ({ name, acquire })

/**
 * The parts of the options that configuration can hold (see {@link layerConfig}).
 *
 * @since 0.1.0
 */
export interface ServerOptions {
  /** This coordinator's server id. */
  readonly serverId: Models.ServerId
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
  serverId: Models.ServerId,
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
  readonly serverId: Models.ServerId
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
  readonly serverId: Models.ServerId
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
  readonly leadership: Effect.Effect<Option.Option<Election.Leadership>>
  /**
   * Whether this coordinator leads, its leader services have all started and its leadership holds here and now
   * (not lost, its deadline not passed): check it right before a side effect.
   */
  readonly isLeader: Effect.Effect<boolean>
  /**
   * Waits until this coordinator leads with all leader services started and
   * returns the leadership. Fails with `CoordinatorClosed` if it closes first.
   */
  readonly awaitLeader: Effect.Effect<Election.Leadership, CoordinatorClosed>
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
  /** The campaign's scope: its session, registration, candidate node and leadership. Closing it resigns. */
  readonly scope: Scope.Closeable
  leadership: Election.Leadership | undefined
  campaign: Fiber.Fiber<void> | undefined
  /** The leader services' scope (a child of the shell's root), closed before `scope`. */
  services: Scope.Closeable | undefined
  acquiring: Fiber.Fiber<void> | undefined
}

/** A scheduled `Campaign`. */
interface Timer {
  fiber: Fiber.Fiber<void> | undefined
}

/** Where an input comes from; inputs of a closed campaign or a cancelled timer are stale and dropped. */
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
  readonly leadership: Option.Option<Election.Leadership>
}

const endToInput = (end: Election.LeadershipEnd): Lifecycle.Input => {
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

/** The shell's mutable parts and what its commands need. */
interface Shell<R> {
  readonly election: Election.Shape
  readonly candidate: Election.Candidate
  readonly services: ReadonlyArray<LeaderService<R>>
  readonly backoff: Duration.Duration
  /** Every campaign and leader-service scope is a child of it: closing it releases everything. */
  readonly root: Scope.Closeable
  readonly inbox: Queue.Queue<Envelope>
  attempt: Attempt | undefined
  pending: Timer | undefined
}

const offer = <R>(shell: Shell<R>, input: Lifecycle.Input, source: Source) =>
  Queue.offer(shell.inbox, { input, source })

const isLive = <R>(shell: Shell<R>, source: Source, state: Lifecycle.State): boolean => {
  switch (source._tag) {
    case "Attempt":
      return source.attempt === shell.attempt
    case "Timer":
      return source.timer === shell.pending
    case "Resign":
      return state._tag === "Leader"
    case "Owner":
      return true
  }
}

/** Reports a won leadership's events as inputs: its session's blips, its deadline lapsing, its end. */
const followLeadership = <R>(shell: Shell<R>, current: Attempt, leadership: Election.Leadership) =>
  Effect.gen(function* () {
    const source: Source = { _tag: "Attempt", attempt: current }
    let suspended = false
    yield* leadership.connection.pipe(
      Stream.runForEach((state) => {
        if (state === "suspended" && !suspended) {
          suspended = true
          return offer(shell, Lifecycle.Input.ConnectionSuspended, source)
        }
        if (state === "connected" && suspended) {
          suspended = false
          return offer(shell, Lifecycle.Input.ConnectionRestored, source)
        }
        return Effect.void
      }),
      Effect.forkIn(current.scope)
    )
    yield* leadership.proven.pipe(
      Stream.filter((proven) => !proven),
      Stream.runHead,
      Effect.flatMap((lapsed) => (Option.isSome(lapsed) ? offer(shell, Lifecycle.Input.Lapsed, source) : Effect.void)),
      Effect.forkIn(current.scope)
    )
    yield* offer(shell, endToInput(yield* leadership.lost), source)
  })

/** Whether a campaign's failure is the coordination refusing this process's identity (`NotAuthorized`). */
const refusedIdentity = (error: unknown): boolean =>
  Errors.causes(error).some((e) => (e as { readonly _tag?: unknown })._tag === "NotAuthorized")

/** `CreateCandidate`: campaign, then report the election, the leadership's events and its end as inputs. */
const createCandidate = <R>(shell: Shell<R>) =>
  Effect.gen(function* () {
    const current: Attempt = {
      scope: yield* Scope.fork(shell.root, "sequential"),
      leadership: undefined,
      campaign: undefined,
      services: undefined,
      acquiring: undefined
    }
    shell.attempt = current
    const source: Source = { _tag: "Attempt", attempt: current }
    current.campaign = yield* shell.election.campaign(shell.candidate).pipe(
      Scope.provide(current.scope),
      Effect.matchEffect({
        onFailure: (error) =>
          offer(
            shell,
            refusedIdentity(error)
              ? Lifecycle.Input.CampaignRefused(error.message)
              : Lifecycle.Input.CampaignFailed(error.message),
            source
          ),
        onSuccess: (leadership) =>
          Effect.gen(function* () {
            current.leadership = leadership
            yield* offer(shell, Lifecycle.Input.Elected(leadership.epoch), source)
            yield* followLeadership(shell, current, leadership)
          })
      }),
      Effect.asVoid,
      Effect.forkIn(shell.root)
    )
  })

/** `AcquireLeaderResources`: every leader service in order in one scope, then the outcome as an input. */
const acquireServices = <R>(shell: Shell<R>, epoch: number) =>
  Effect.gen(function* () {
    const current = shell.attempt
    const leadership = current?.leadership
    if (current === undefined || leadership === undefined || leadership.epoch !== epoch) {
      return yield* Effect.die(
        new Error(
          `AcquireLeaderResources(${epoch}) without a leadership of that epoch (the campaign has ${leadership?.epoch ?? "none"})`
        )
      )
    }
    const servicesScope = yield* Scope.fork(shell.root, "sequential")
    current.services = servicesScope
    const source: Source = { _tag: "Attempt", attempt: current }
    current.acquiring = yield* Effect.forEach(
      shell.services,
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
        onFailure: (cause) => offer(shell, Lifecycle.Input.LeaderServicesFailed(cause), source),
        onSuccess: () => offer(shell, Lifecycle.Input.LeaderServicesReady, source)
      }),
      Effect.asVoid,
      Effect.forkIn(shell.root)
    )
  })

/** `ReleaseLeaderResources`: stop acquiring, release the services in reverse order. */
const releaseServices = <R>(shell: Shell<R>) =>
  Effect.gen(function* () {
    const current = shell.attempt
    if (current === undefined) return
    if (current.acquiring !== undefined) yield* Fiber.interrupt(current.acquiring)
    current.acquiring = undefined
    if (current.services !== undefined) yield* Scope.close(current.services, Exit.void)
    current.services = undefined
  })

/** `CloseCampaign`: stop the campaign and close its scope (its session, registration and nodes go with it). */
const closeCampaign = <R>(shell: Shell<R>) =>
  Effect.gen(function* () {
    const current = shell.attempt
    if (current === undefined) return
    shell.attempt = undefined
    if (current.campaign !== undefined) yield* Fiber.interrupt(current.campaign)
    yield* Scope.close(current.scope, Exit.void)
  })

/** `CancelCampaign`: drop a scheduled `Campaign`. */
const cancelCampaign = <R>(shell: Shell<R>) =>
  Effect.gen(function* () {
    const timer = shell.pending
    shell.pending = undefined
    if (timer?.fiber !== undefined) yield* Fiber.interrupt(timer.fiber)
  })

/** `ScheduleCampaign`: feed `Campaign` after `delay` (replacing one already scheduled). */
const scheduleCampaign = <R>(shell: Shell<R>, delay: Duration.Duration) =>
  Effect.gen(function* () {
    yield* cancelCampaign(shell)
    const timer: Timer = { fiber: undefined }
    shell.pending = timer
    const feed = offer(shell, Lifecycle.Input.Campaign, { _tag: "Timer", timer })
    timer.fiber = yield* (Duration.isZero(delay) ? feed : Effect.andThen(Effect.sleep(delay), feed)).pipe(
      Effect.asVoid,
      Effect.forkIn(shell.root)
    )
  })

/** Runs one command of the machine. */
const execute = <R>(shell: Shell<R>, command: Lifecycle.Command) => {
  switch (command._tag) {
    case "ScheduleCampaign":
      return scheduleCampaign(shell, command.after === "now" ? Duration.zero : shell.backoff)
    case "CancelCampaign":
      return cancelCampaign(shell)
    case "CreateCandidate":
      return createCandidate(shell)
    case "AcquireLeaderResources":
      return acquireServices(shell, command.epoch)
    case "ReleaseLeaderResources":
      return releaseServices(shell)
    case "CloseCampaign":
      return closeCampaign(shell)
    case "Log":
      return Effect.logInfo(command.message)
  }
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
): Effect.Effect<CoordinatorShape, InvalidCoordinatorOptions, Election.Election | Scope.Scope | R> =>
  Effect.gen(function* () {
    const o = yield* decodeOptions(CoordinatorOptions, { exact: true })(options).pipe(
      Effect.mapError((bad) => new InvalidCoordinatorOptions(summary(bad)))
    )
    const scope = yield* Effect.scope
    const shell: Shell<R> = {
      election: yield* Election.Election,
      candidate: { serverId: o.serverId, address: o.address },
      // The decoded services are the same objects, typed loosely: the typed ones are the caller's.
      services: options.services ?? [],
      backoff: Duration.fromInputUnsafe(o.rejoinBackoff ?? "1 second"),
      root: yield* Scope.fork(scope, "sequential"),
      inbox: yield* Queue.unbounded<Envelope>(),
      attempt: undefined,
      pending: undefined
    }
    const snapshot = yield* SubscriptionRef.make<Snapshot>({
      state: Lifecycle.initial(o.serverId),
      leadership: Option.none()
    })
    const terminated = yield* Deferred.make<void>()

    /** One input: step the machine, run exactly its commands, publish the new state. */
    const handle = (envelope: Envelope) =>
      Effect.gen(function* () {
        const { state } = yield* SubscriptionRef.get(snapshot)
        if (!isLive(shell, envelope.source, state)) return
        if (envelope.source._tag === "Timer") shell.pending = undefined
        const result = Lifecycle.step(state, envelope.input)
        if (Result.isFailure(result)) return yield* Effect.die(result.failure)
        const [next, commands] = result.success
        for (const command of commands) yield* execute(shell, command)
        const leadership =
          next._tag === "Leader" && shell.attempt?.leadership !== undefined
            ? Option.some(shell.attempt.leadership)
            : Option.none()
        yield* SubscriptionRef.set(snapshot, { state: next, leadership })
      })

    const driver = Effect.gen(function* () {
      yield* offer(shell, Lifecycle.Input.Start, { _tag: "Owner" })
      while (true) {
        yield* handle(yield* Queue.take(shell.inbox))
        if ((yield* SubscriptionRef.get(snapshot)).state._tag === "Down") return
      }
    }).pipe(
      Effect.tapCause((cause) =>
        Cause.hasInterruptsOnly(cause) ? Effect.void : Effect.logError("coordinator shell died", cause)
      ),
      // However the shell ends, nothing it held outlives it: services, campaign session, registration, nodes.
      Effect.onExit((exit) =>
        Effect.gen(function* () {
          yield* Scope.close(shell.root, Exit.void)
          shell.attempt = undefined
          shell.pending = undefined
          yield* SubscriptionRef.set(snapshot, {
            state: { _tag: "Down", serverId: o.serverId },
            leadership: Option.none()
          })
          yield* Deferred.done(terminated, exit)
        })
      ),
      Effect.annotateLogs({ coordinator: o.serverId })
    )
    yield* Effect.forkIn(driver, scope)
    yield* Effect.addFinalizer(() =>
      Effect.gen(function* () {
        if (yield* Deferred.isDone(terminated)) return
        yield* offer(shell, Lifecycle.Input.Close, { _tag: "Owner" })
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
      isLeader: Effect.flatMap(SubscriptionRef.get(snapshot), (s) =>
        isReady(s) ? Option.getOrThrow(s.leadership).isLeader : Effect.succeed(false)
      ),
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
      resign: Effect.asVoid(offer(shell, Lifecycle.Input.Resign, { _tag: "Resign" })),
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
): Layer.Layer<Coordinator, InvalidCoordinatorOptions, Election.Election | Exclude<R, Scope.Scope>> =>
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
): Layer.Layer<
  Coordinator,
  InvalidCoordinatorOptions | Config.ConfigError,
  Election.Election | Exclude<R, Scope.Scope>
> => Layer.unwrap(Effect.map(Config.unwrap(config), (server) => layer<R>({ ...options, ...server })))
