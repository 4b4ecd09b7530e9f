/**
 * The rebalance service: the `Trigger` and the `Executor` run by the controller's leader (a leader-only service of
 * the coordinator), through a `ClusterControl` (the controller's view and requests) and a `RebalanceStore`.
 *
 * The shell decides nothing: every `checkInterval`, and whenever `checks` emits (a server joined or was tagged), it
 * feeds the trigger a `Check` with the cluster model; on the trigger's `Start` (or an operator's `start`) it plans
 * with the `Planner` and starts an executor; every `observeInterval` while a rebalance is not ended it feeds the
 * executor an `Observe`; it runs the executor's commands (each answer fed back), stores the state on `Persist`, and
 * tells the trigger when the rebalance ends or pauses. Inputs are taken one at a time. A controller taking over loads
 * the stored rebalance and goes on with it (`Executor.recovered`), and the trigger's cooldown from its end.
 *
 * @since 0.1.0
 */
import { Coordination, type Election, Models, type Rebalancer } from "@strata/core"
import {
  Clock,
  Context,
  Duration,
  Effect,
  Metric,
  Option,
  Random,
  Schedule,
  Schema,
  type Scope,
  Semaphore,
  Stream
} from "effect"
import type * as ClusterModel from "./ClusterModel.js"
import * as Executor from "./Executor.js"
import * as Planner from "./Planner.js"
import type { RebalanceConfig } from "./RebalanceConfig.js"
import * as RebalanceStore from "./RebalanceStore.js"
import * as Trigger from "./Trigger.js"

/**
 * The executor's step in context: production's `Executor.step` unless provided (a simulator provides mutants of it,
 * planted bugs it must catch).
 *
 * @since 0.1.0
 */
export const Machine = Context.Reference<Executor.StepFunction>("@strata/rebalance/RebalanceService/Machine", {
  defaultValue: () => Executor.step
})

/**
 * What the service needs of the controller. An error of `model` or `observe` is logged and the step is tried again
 * at the next tick; a request's failure is an `Answer` (`Failed`).
 *
 * @since 0.1.0
 */
export interface ClusterControl {
  /** The cluster as the planner sees it. */
  readonly model: Effect.Effect<ClusterModel.ClusterModel, ControlUnavailable>
  /** The tablets now and the servers' health. */
  readonly observe: Effect.Effect<Executor.Observation, ControlUnavailable>
  readonly reassign: (
    tablet: Models.TabletId,
    target: ReadonlyArray<Models.ServerId>,
    throttleBytesPerSec: number
  ) => Effect.Effect<Executor.Answer>
  readonly cancelReassign: (tablet: Models.TabletId) => Effect.Effect<Executor.Answer>
  readonly electPreferred: (tablet: Models.TabletId) => Effect.Effect<Executor.Answer>
}

/**
 * The controller could not be read (it stopped, or a server did not answer in time).
 *
 * @since 0.1.0
 */
export class ControlUnavailable extends Schema.TaggedError<ControlUnavailable>()("ControlUnavailable", {
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `the controller cannot be read: ${this.detail}`
  }
}

/**
 * Why an operator's command was refused.
 *
 * @since 0.1.0
 */
export const CommandRefusal = Schema.Union([
  Schema.TaggedStruct("NoRebalance", {}),
  Schema.TaggedStruct("InProgress", { id: Schema.String, phase: Schema.String }),
  Schema.TaggedStruct("NotPaused", { id: Schema.String, phase: Schema.String }),
  Schema.TaggedStruct("PlanFailed", { detail: Schema.String }),
  Schema.TaggedStruct("Unavailable", { detail: Schema.String })
])

/** @see CommandRefusal */
export type CommandRefusal = typeof CommandRefusal.Type

/**
 * An operator's command (`start`, `pause`, `resume`, `cancel`) refused: `reason` says why.
 *
 * @since 0.1.0
 */
export class RebalanceCommandError extends Schema.TaggedError<RebalanceCommandError>()("RebalanceCommandError", {
  reason: CommandRefusal
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return describeRefusal(this.reason)
  }
}

/**
 * A refusal as one line.
 *
 * @since 0.1.0
 */
export const describeRefusal = (r: CommandRefusal): string => {
  switch (r._tag) {
    case "NoRebalance":
      return "no rebalance is in progress"
    case "InProgress":
      return `rebalance ${r.id} is ${r.phase}: pause, resume or cancel it first`
    case "NotPaused":
      return `rebalance ${r.id} is ${r.phase}, not paused`
    case "PlanFailed":
      return `no plan: ${r.detail}`
    case "Unavailable":
      return `the cluster cannot be read: ${r.detail}`
  }
}

const refused = (reason: CommandRefusal) => new RebalanceCommandError({ reason })

/**
 * The trigger's state as `status` shows it (`cooldownUntilMs` when a cooldown runs, on the clock).
 *
 * @since 0.1.0
 */
export const TriggerStatus = Schema.Struct({
  enabled: Schema.Boolean,
  threshold: Schema.Number,
  armed: Schema.Boolean,
  lastImbalance: Schema.optional(Schema.Number),
  cooldownUntilMs: Schema.optional(Schema.Number),
  checkIntervalMs: Schema.Number
})

/** @see TriggerStatus */
export type TriggerStatus = typeof TriggerStatus.Type

/**
 * The service's status: the trigger, and the current (or last) rebalance with the imbalance measured after it
 * (`imbalanceAfter`: a read of the cluster just after the rebalance ends, so a status may show it ended a moment
 * before it shows the imbalance after).
 *
 * @since 0.1.0
 */
export const Status = Schema.Struct({
  nowMs: Schema.Number,
  trigger: TriggerStatus,
  rebalance: Schema.optional(Executor.Progress),
  imbalanceAfter: Schema.optional(Schema.Number)
})

/** @see Status */
export type Status = typeof Status.Type

/**
 * The service an operator drives.
 *
 * @since 0.1.0
 */
export interface RebalanceServiceShape {
  /** Plans and starts a rebalance now (for `goals`, every goal by default). */
  readonly start: (options?: {
    readonly goals?: ReadonlyArray<Planner.Goal>
  }) => Effect.Effect<Executor.Progress, RebalanceCommandError>
  readonly status: Effect.Effect<Status>
  /** Pauses once the moves under way end. */
  readonly pause: Effect.Effect<Executor.Progress, RebalanceCommandError>
  readonly resume: Effect.Effect<Executor.Progress, RebalanceCommandError>
  /** Cancels: moves under way go back, finished batches stay. */
  readonly cancel: Effect.Effect<Executor.Progress, RebalanceCommandError>
}

/**
 * The service's options.
 *
 * @since 0.1.0
 */
export interface Options {
  readonly control: ClusterControl
  /** Where the rebalance is stored (`<namespace>/rebalance`). */
  readonly root: string
  readonly config: RebalanceConfig
  /** How often a rebalance under way observes the cluster (1 second). */
  readonly observeInterval?: Duration.Input
  /** Emits when the trigger should check now (a server joined or was tagged). */
  readonly checks?: Stream.Stream<unknown>
  /** The most bytes one stored chunk of moves holds (see `RebalanceStore`). */
  readonly chunkBytes?: number
}

/**
 * The rebalance metrics.
 *
 * @since 0.1.0
 */
export const metrics = {
  active: Metric.gauge("strata_rebalance_active", {
    description: "1 while a rebalance runs (measuring, running, gating or rolling back), else 0"
  }),
  paused: Metric.gauge("strata_rebalance_paused", { description: "1 while a rebalance is paused, else 0" }),
  movesDone: Metric.gauge("strata_rebalance_moves_done", {
    description: "Moves of the current or last rebalance done"
  }),
  movesTotal: Metric.gauge("strata_rebalance_moves_total", { description: "Moves of the current or last rebalance" }),
  movesActive: Metric.gauge("strata_rebalance_moves_active", { description: "Moves under way now" }),
  batch: Metric.gauge("strata_rebalance_batch", { description: "The batch in flight (1-based)" }),
  batches: Metric.gauge("strata_rebalance_batches", { description: "The batches of the current or last rebalance" }),
  bytesMoved: Metric.gauge("strata_rebalance_bytes_moved", {
    description: "Bytes the finished replica moves of the current or last rebalance copied"
  }),
  gateFailures: Metric.gauge("strata_rebalance_gate_failures", {
    description: "Stability gate failures in the current or last rebalance"
  }),
  rollbacks: Metric.gauge("strata_rebalance_rollbacks", {
    description: "Batches rolled back in the current or last rebalance"
  }),
  imbalance: Metric.gauge("strata_rebalance_imbalance", {
    description:
      "The imbalance (coefficient of variation of replica counts): when=now (last check), before, planned, after"
  })
} as const

/** The running service's parts (each function below takes it: no closure to scroll through). */
interface Running {
  readonly options: Options
  readonly machine: Executor.StepFunction
  /** The Random the service was made with: every id it draws comes from it, whoever asks for a start. */
  readonly random: Random.Random
  readonly store: RebalanceStore.RebalanceStore
  readonly lock: Semaphore.Semaphore
  trigger: Trigger.State
  executor: Executor.State | undefined
  imbalanceAfter: number | undefined
}

const now = Clock.currentTimeMillis

/**
 * Starts the service under `leadership` (stopping with the scope): loads the stored rebalance (one that cannot be
 * read is logged and left behind), goes on with it, and runs the trigger's checks and the executor's observations.
 *
 * @since 0.1.0
 */
export const make = (
  leadership: Pick<Election.Leadership, "fenced">,
  options: Options
): Effect.Effect<RebalanceServiceShape, Coordination.CoordinationError, Coordination.Coordination | Scope.Scope> =>
  Effect.gen(function* () {
    const coordination = yield* Coordination.Coordination
    const session = yield* coordination.session()
    const store = RebalanceStore.make({
      root: options.root,
      session,
      leadership,
      ...(options.chunkBytes === undefined ? {} : { chunkBytes: options.chunkBytes })
    })
    const r: Running = {
      options,
      machine: yield* Machine,
      random: yield* Random.Random,
      store,
      lock: Semaphore.makeUnsafe(1),
      trigger: Trigger.initial(options.config),
      executor: undefined,
      imbalanceAfter: undefined
    }
    // A stored rebalance that cannot be read is reported and left behind (the next one overwrites it): it must not
    // keep every controller from starting.
    const stored = yield* store.load.pipe(
      // Coordination failing may pass; data that cannot be read will not.
      Effect.retry({ while: (e) => e._tag === "CoordinationError", schedule: Schedule.spaced("1 second"), times: 4 }),
      Effect.catch((e) =>
        Effect.as(
          Effect.logError(`rebalance: the stored rebalance cannot be read, starting without it: ${e.message}`),
          Option.none()
        )
      )
    )
    yield* resumeStored(r, stored)
    const scope = yield* Effect.scope
    const observeEvery = Schedule.spaced(options.observeInterval ?? "1 second")
    yield* Effect.forkIn(Effect.repeat(observeOnce(r), observeEvery), scope)
    yield* Effect.forkIn(Effect.repeat(checkOnce(r), Schedule.spaced(options.config.checkInterval)), scope)
    if (options.checks !== undefined)
      yield* Effect.forkIn(
        Stream.runForEach(options.checks, () => checkOnce(r)),
        scope
      )
    yield* Effect.addFinalizer(() => setMetrics(undefined))
    return shapeOf(r)
  })

/**
 * A stored rebalance taken over: one not ended goes on (the trigger counts it), an ended one starts the cooldown and
 * has its imbalance after measured.
 */
const resumeStored = (r: Running, stored: Option.Option<Executor.State>) =>
  Effect.gen(function* () {
    if (Option.isNone(stored)) return
    const state = stored.value
    if (Executor.ended(state)) {
      r.executor = state
      r.trigger = Trigger.step(r.trigger, {
        _tag: "Ended",
        nowMs: state.endedAtMs ?? state.phaseSinceMs,
        outcome: state.phase === "completed" ? "completed" : "cancelled"
      })[0]
      yield* setMetrics(state)
      // Its imbalance after was measured by the coordinator it ended under: measured again here, as of now.
      yield* measureAfter(r)
      return
    }
    r.executor = Executor.recovered(state)
    const at = yield* now
    r.trigger = Trigger.step(r.trigger, { _tag: "Started", nowMs: at })[0]
    if (state.phase === "paused")
      r.trigger = Trigger.step(r.trigger, { _tag: "Ended", nowMs: at, outcome: "paused" })[0]
    yield* Effect.logInfo(
      `rebalance ${state.id}: taken over ${state.phase} in batch ${Math.min(state.batch + 1, state.batches)} of ${state.batches}`
    )
    yield* setMetrics(r.executor)
  })

/** Feeds the executor an observation of the cluster, while a rebalance has not ended. */
const observeOnce = (r: Running) =>
  r.lock.withPermits(1)(
    Effect.gen(function* () {
      if (r.executor === undefined || Executor.ended(r.executor)) return
      const id = r.executor.id
      const cluster = yield* r.options.control.observe.pipe(
        Effect.map(Option.some),
        Effect.catch((e) =>
          Effect.as(Effect.logWarning(`rebalance ${id}: ${e.message}; observing again`), Option.none())
        )
      )
      if (Option.isNone(cluster)) return
      yield* stepExecutor(r, { _tag: "Observe", nowMs: yield* now, cluster: cluster.value })
    })
  )

/** Feeds the trigger a check of the cluster, and starts what it says to. */
const checkOnce = (r: Running) =>
  r.lock.withPermits(1)(
    Effect.gen(function* () {
      const read = yield* r.options.control.model.pipe(
        Effect.map(Option.some),
        Effect.catch((e) =>
          Effect.as(Effect.logWarning(`rebalance trigger: ${e.message}; checking again later`), Option.none())
        )
      )
      if (Option.isNone(read)) return
      const model = read.value
      const [next, commands] = Trigger.step(r.trigger, { _tag: "Check", nowMs: yield* now, model })
      r.trigger = next
      yield* Metric.update(Metric.withAttributes(metrics.imbalance, { when: "now" }), Trigger.imbalance(model))
      for (const c of commands) {
        if (c._tag === "Log") yield* logAt(c.level, c.message)
        else
          yield* begin(r, model, c.reason, undefined).pipe(
            Effect.catch((e) =>
              Effect.gen(function* () {
                yield* Effect.logWarning(`rebalance trigger: could not start: ${e.message}`)
                r.trigger = Trigger.step(r.trigger, { _tag: "Ended", nowMs: yield* now, outcome: "failed" })[0]
              })
            )
          )
      }
    })
  )

/** Plans `model` and starts its rebalance (the lock held). */
const begin = (
  r: Running,
  model: ClusterModel.ClusterModel,
  reason: string,
  goals: ReadonlyArray<Planner.Goal> | undefined
): Effect.Effect<Executor.State, RebalanceCommandError> =>
  Effect.gen(function* () {
    const plan = yield* Planner.plan(model, goals === undefined ? {} : { goals }).pipe(
      Effect.mapError((e: Rebalancer.RebalanceError) => refused({ _tag: "PlanFailed", detail: e.message }))
    )
    const at = yield* now
    const draw = Random.nextIntBetween(0, 1 << 30).pipe(Effect.provideService(Random.Random, r.random))
    const id = `rb-${at}-${(yield* draw).toString(36)}`
    const state = Executor.start({
      id,
      reason,
      nowMs: at,
      changes: plan.changes,
      config: r.options.config,
      sizes: new Map(
        model.tablets.flatMap((t) => (t.sizeBytes === undefined ? [] : [[Models.tabletKey(t.tablet), t.sizeBytes]]))
      ),
      imbalanceBefore: Trigger.imbalance(model),
      imbalancePlanned: imbalanceOf(model, plan)
    })
    r.executor = state
    r.imbalanceAfter = undefined
    yield* Effect.logInfo(
      `rebalance ${id}: started (${reason}): ${state.moves.length} moves in ${state.batches} batches, imbalance ${fmt(state.imbalanceBefore)} → ${fmt(state.imbalancePlanned)} planned`
    )
    yield* persist(r, state)
    yield* setMetrics(state)
    if (Executor.ended(state)) {
      r.trigger = Trigger.step(r.trigger, { _tag: "Ended", nowMs: at, outcome: "completed" })[0]
    } else r.trigger = Trigger.step(r.trigger, { _tag: "Started", nowMs: at })[0]
    return state
  })

/** The imbalance the model has once `plan`'s changes are applied. */
const imbalanceOf = (model: ClusterModel.ClusterModel, plan: Planner.Plan): number => {
  const after = new Map(plan.changes.map((c) => [Models.tabletKey(c.tablet), c.to]))
  return Trigger.imbalance({
    ...model,
    tablets: model.tablets.map((t) => ({ ...t, replicas: after.get(Models.tabletKey(t.tablet)) ?? t.replicas }))
  })
}

const fmt = (x: number) => String(Number(x.toFixed(4)))

const logAt = (level: Executor.LogLevel | Trigger.LogLevel, message: string) =>
  level === "Warning"
    ? Effect.logWarning(message)
    : level === "Info"
      ? Effect.logInfo(message)
      : Effect.logDebug(message)

/** Steps the executor (the lock held) and runs its commands, each answer stepped in turn. */
const stepExecutor = (r: Running, input: Executor.Input): Effect.Effect<void> =>
  Effect.gen(function* () {
    if (r.executor === undefined) return
    const [next, commands] = r.machine(r.executor, input)
    r.executor = next
    for (const c of commands) yield* runCommand(r, c)
    yield* setMetrics(r.executor)
  })

const runCommand = (r: Running, c: Executor.Command): Effect.Effect<void> =>
  Effect.gen(function* () {
    const { control } = r.options
    const answered =
      (command: "Reassign" | "CancelReassign" | "ElectPreferred", index: number, ask: number) =>
      (answer: Executor.Answer) =>
        Effect.flatMap(now, (nowMs) => stepExecutor(r, { _tag: "Answered", nowMs, index, ask, command, answer }))
    switch (c._tag) {
      case "Reassign":
        return yield* Effect.flatMap(
          control.reassign(c.tablet, c.target, c.throttleBytesPerSec),
          answered("Reassign", c.index, c.ask)
        )
      case "CancelReassign":
        return yield* Effect.flatMap(control.cancelReassign(c.tablet), answered("CancelReassign", c.index, c.ask))
      case "ElectPreferred":
        return yield* Effect.flatMap(control.electPreferred(c.tablet), answered("ElectPreferred", c.index, c.ask))
      case "Persist":
        return yield* persist(r, c.state)
      case "Ended":
        return yield* ended(r, c.outcome)
      case "Log":
        return yield* logAt(c.level, c.message)
    }
  })

/** Stores the state; a failed save is logged (a deposed controller's save fails, and its service stops). */
const persist = (r: Running, state: Executor.State) =>
  r.store
    .save(state)
    .pipe(Effect.catch((e) => Effect.logWarning(`rebalance ${state.id}: could not store its state: ${e.message}`)))

/** The rebalance ended or paused: the trigger told; after an end, the imbalance measured. */
const ended = (r: Running, outcome: "completed" | "cancelled" | "paused") =>
  Effect.gen(function* () {
    r.trigger = Trigger.step(r.trigger, { _tag: "Ended", nowMs: yield* now, outcome })[0]
    if (outcome === "paused") return
    yield* measureAfter(r)
  })

/**
 * The imbalance after the rebalance that ended, measured now; a failed read of the cluster (a controller that just
 * took over, a server slow to answer) is tried again, up to `MEASURE_ATTEMPTS` times a second apart, and after that
 * it is left unmeasured (logged).
 */
const measureAfter = (r: Running) =>
  Effect.gen(function* () {
    const model = yield* r.options.control.model.pipe(
      Effect.retry({ schedule: Schedule.spaced("1 second"), times: MEASURE_ATTEMPTS - 1 }),
      Effect.tapError((e) => Effect.logWarning(`the imbalance after the rebalance is left unmeasured: ${e.message}`)),
      Effect.option
    )
    if (Option.isSome(model)) {
      r.imbalanceAfter = Trigger.imbalance(model.value)
      yield* Metric.update(Metric.withAttributes(metrics.imbalance, { when: "after" }), r.imbalanceAfter)
    }
  })

/** How many times the imbalance after a rebalance is read before it is left unmeasured. */
const MEASURE_ATTEMPTS = 10

/** Sets the rebalance gauges from `state` (all 0 when there is none). */
const setMetrics = (state: Executor.State | undefined): Effect.Effect<void> => {
  const p = state === undefined ? undefined : Executor.progress(state)
  const running = p !== undefined && !["paused", "completed", "cancelled"].includes(p.phase)
  const set = (m: Metric.Metric<number, unknown>, value: number) => Metric.update(m, value)
  return Effect.all(
    [
      set(metrics.active, running ? 1 : 0),
      set(metrics.paused, p?.phase === "paused" ? 1 : 0),
      set(metrics.movesDone, p?.movesDone ?? 0),
      set(metrics.movesTotal, p?.movesTotal ?? 0),
      set(metrics.movesActive, p?.movesActive ?? 0),
      set(metrics.batch, p?.batch ?? 0),
      set(metrics.batches, p?.batches ?? 0),
      set(metrics.bytesMoved, p?.bytesMoved ?? 0),
      set(metrics.gateFailures, p?.gateFailures ?? 0),
      set(metrics.rollbacks, p?.rollbacks ?? 0),
      ...(p === undefined
        ? []
        : [
            set(Metric.withAttributes(metrics.imbalance, { when: "before" }), p.imbalanceBefore),
            set(Metric.withAttributes(metrics.imbalance, { when: "planned" }), p.imbalancePlanned)
          ])
    ],
    { discard: true }
  )
}

/** The operator's commands and the status. */
const shapeOf = (r: Running): RebalanceServiceShape => {
  const current = Effect.suspend(() =>
    r.executor === undefined || Executor.ended(r.executor)
      ? Effect.fail(refused({ _tag: "NoRebalance" }))
      : Effect.succeed(r.executor)
  )
  const operate = (tag: "Pause" | "Resume" | "Cancel") =>
    r.lock.withPermits(1)(
      Effect.gen(function* () {
        const state = yield* current
        if (tag === "Resume" && state.phase !== "paused" && !state.pauseRequested)
          return yield* refused({ _tag: "NotPaused", id: state.id, phase: state.phase })
        yield* stepExecutor(r, { _tag: tag, nowMs: yield* now })
        if (tag === "Resume" && r.executor !== undefined)
          r.trigger = Trigger.step(r.trigger, { _tag: "Started", nowMs: yield* now })[0]
        return Executor.progress(r.executor!)
      })
    )
  return {
    start: (options) =>
      r.lock.withPermits(1)(
        Effect.gen(function* () {
          if (r.executor !== undefined && !Executor.ended(r.executor))
            return yield* refused({ _tag: "InProgress", id: r.executor.id, phase: r.executor.phase })
          const model = yield* r.options.control.model.pipe(
            Effect.mapError((e) => refused({ _tag: "Unavailable", detail: e.detail }))
          )
          return Executor.progress(yield* begin(r, model, "manual", options?.goals))
        })
      ),
    status: Effect.gen(function* () {
      const nowMs = yield* now
      const t = r.trigger
      const cooldownUntil = Trigger.cooldownUntilMs(t)
      return {
        nowMs,
        trigger: {
          enabled: t.settings.enabled,
          threshold: t.settings.triggerThreshold,
          armed: t.armed,
          ...(t.lastImbalance === undefined ? {} : { lastImbalance: t.lastImbalance }),
          ...(cooldownUntil !== undefined && cooldownUntil > nowMs ? { cooldownUntilMs: cooldownUntil } : {}),
          checkIntervalMs: Duration.toMillis(r.options.config.checkInterval)
        },
        ...(r.executor === undefined ? {} : { rebalance: Executor.progress(r.executor) }),
        ...(r.imbalanceAfter === undefined ? {} : { imbalanceAfter: r.imbalanceAfter })
      }
    }),
    pause: operate("Pause"),
    resume: operate("Resume"),
    cancel: operate("Cancel")
  }
}
