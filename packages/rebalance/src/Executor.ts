/**
 * The rebalance executor as a pure state machine: `step(state, input)` returns the next state and the commands for
 * the controller's shell, which asks the controller to move tablets, watches the cluster, and stores the state.
 * No I/O, no clock: time comes in on the inputs.
 *
 * A rebalance runs in phases:
 *
 * - `measuring`: for one `gateWindow` before the first batch it records the servers' append latency and the rate of
 *   ISR shrinks: the baseline the stability gate compares with.
 * - `running`: the moves of the current batch start as the limits allow (at most `maxConcurrentMigrations` moves
 *   touching a server — adding a replica to it or removing one from it — and `maxClusterMigrations` in all), each a
 *   `Reassign` to its target with the move's throttle. A move is done when the tablet's replicas are its target and
 *   it no longer moves; a leadership move (last batch) is done when the tablet is led by its target's first replica
 *   (`ElectPreferred` asks for that once its replicas are in that order). While a batch runs the cluster must stay
 *   healthy (see {@link unhealthy}): a failure rolls the batch back.
 * - `gating`: the batch's moves ended; the next batch starts once a whole `gateWindow` has passed healthy with the
 *   ISR shrinks in it back to the baseline rate (one more is allowed). An unhealthy cluster here pauses.
 *
 * The gate fails at once when a server that was up for the baseline is down, a tablet is offline or under
 * `minInsyncReplicas` (see {@link unhealthy}), and when a server's append latency stays above its bound for a whole
 * `gateWindow` (see {@link slowServer}).
 * - `rolling-back`: the failed batch's moves under way are cancelled (`CancelReassign`: back on their original
 *   replicas) and its finished ones moved back; then the rebalance is `paused` with the failure as its reason.
 *   Earlier batches stay.
 * - `paused` (by an operator, after the batch in flight ends, or by a failed gate): `Resume` goes on with the
 *   batch it stopped in, measuring the baseline again; `cancelling`: the moves under way are cancelled, then
 *   `cancelled`. `completed` once every batch ended.
 *
 * A move stuck past `moveTimeout` is cancelled and tried again after a backoff (1 s, doubled each time, at most 30 s),
 * up to {@link maxAttempts} times; then it stays cancelled. A refused move is tried again the same way when the
 * refusal can pass (a server down, an election under way) and given up at once when it cannot (the tablet gone, or
 * moving somewhere the plan did not send it). So no tablet is left in an intermediate replica set by the executor:
 * every move ends done, cancelled (back on its original replicas) or skipped (never started).
 *
 * The state is plain data (see {@link State} and its `Schema`): the shell stores it on every `Persist` command, and a
 * controller taking over feeds it back through {@link recovered} and goes on from there.
 *
 * @since 0.1.0
 */
import { Models } from "@strata/core"
import { Duration, Schema } from "effect"
import * as Batches from "./Batches.js"
import type { Change } from "./Planner.js"
import type { RebalanceConfig } from "./RebalanceConfig.js"

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

/**
 * Where a move stands.
 *
 * - `pending`: not started (or to start again at `retryAtMs`);
 * - `requested`: the `Reassign` is out, no answer yet;
 * - `moving`: the controller moves it;
 * - `electing`: a leadership move waiting for its preferred leader;
 * - `cancelling`: a `CancelReassign` is out or the tablet returns to its original replicas (`after` says what next);
 * - `done`, `cancelled` (given up, on its original replicas), `skipped` (never started, or the tablet changed
 *   outside the plan).
 *
 * @since 0.1.0
 */
export const MoveStatus = Schema.Literals([
  "pending",
  "requested",
  "moving",
  "electing",
  "cancelling",
  "done",
  "cancelled",
  "skipped"
])

/** @see MoveStatus */
export type MoveStatus = typeof MoveStatus.Type

/**
 * One move of the plan, as the executor tracks it.
 *
 * @since 0.1.0
 */
export const Move = Schema.Struct({
  /** Its batch (0-based). */
  batch: Schema.Int,
  kind: Schema.Literals(["replicas", "leadership"]),
  tablet: Models.TabletId,
  /** The replicas it had when the plan was made. */
  from: Schema.Array(Models.ServerId),
  /** The replicas it moves to, the planned leader first. */
  to: Schema.Array(Models.ServerId),
  status: MoveStatus,
  /**
   * What follows: after a cancel, `retry` (pending again), `give-up` (cancelled) or `rollback` (pending, its batch
   * rolled back); on a move taking a finished one back (`from` and `to` swapped), `rollback` (once there, pending in
   * its own direction), or `keep` when that could not be done (it stays done at its target).
   */
  after: Schema.optional(Schema.Literals(["retry", "give-up", "rollback", "keep"])),
  /** Times it was started. */
  attempts: Schema.Int,
  /** The number of the last request about it (an answer to an earlier one is stale and ignored). */
  asked: Schema.Int,
  /** When it was first asked for (a move refused for a passing reason is asked again until `moveTimeout` from here). */
  firstAskedMs: Schema.optional(Schema.Number),
  /** Times the controller refused it for a reason that can pass (a server down, an election under way). */
  refusals: Schema.optional(Schema.Int),
  /** When its current step began (its timeout runs from here). */
  sinceMs: Schema.optional(Schema.Number),
  /** When a pending move may start again. */
  retryAtMs: Schema.optional(Schema.Number),
  /** The tablet's size in bytes, when the plan knew it. */
  bytes: Schema.optional(Schema.Number),
  /** Why it was skipped, cancelled or retried. */
  detail: Schema.optional(Schema.String)
})

/** @see Move */
export type Move = typeof Move.Type

/**
 * The executor's settings in milliseconds and counts (from `RebalanceConfig`, see {@link settingsOf}).
 *
 * @since 0.1.0
 */
export const Settings = Schema.Struct({
  maxConcurrentMigrations: Schema.Int,
  maxClusterMigrations: Schema.Int,
  throttleBytesPerSec: Schema.Int,
  moveTimeoutMs: Schema.Number,
  gateWindowMs: Schema.Number,
  gateLatencyFactor: Schema.Number
})

/** @see Settings */
export type Settings = typeof Settings.Type

/**
 * The executor's settings from the rebalance settings.
 *
 * @since 0.1.0
 */
export const settingsOf = (config: RebalanceConfig): Settings => ({
  maxConcurrentMigrations: config.maxConcurrentMigrations,
  maxClusterMigrations: config.maxClusterMigrations,
  throttleBytesPerSec: config.throttleBytesPerSec,
  moveTimeoutMs: Duration.toMillis(config.moveTimeout),
  gateWindowMs: Duration.toMillis(config.gateWindow),
  gateLatencyFactor: config.gateLatencyFactor
})

/**
 * The rebalance's phase (see the module's description).
 *
 * @since 0.1.0
 */
export const Phase = Schema.Literals([
  "measuring",
  "running",
  "gating",
  "rolling-back",
  "paused",
  "cancelling",
  "completed",
  "cancelled"
])

/** @see Phase */
export type Phase = typeof Phase.Type

/**
 * What the gate compares with: each server's append latency p99 (ms), the cluster's ISR shrinks per second and the
 * servers up, measured in the window before the first batch (again after a resume).
 *
 * @since 0.1.0
 */
export const Baseline = Schema.Struct({
  appendLatencyP99Ms: Schema.Array(Schema.Tuple([Models.ServerId, Schema.Number])),
  shrinksPerSec: Schema.Number,
  /** The servers up when it was measured: one of them down fails the gate. */
  live: Schema.Array(Models.ServerId)
})

/** @see Baseline */
export type Baseline = typeof Baseline.Type

/**
 * The executor's state, stored by the shell on every `Persist`.
 *
 * @since 0.1.0
 */
export const State = Schema.Struct({
  id: Schema.String,
  /** Why it started: `manual`, `imbalance` or `empty-server`. */
  reason: Schema.String,
  settings: Settings,
  startedAtMs: Schema.Number,
  phase: Phase,
  /** When the phase began. */
  phaseSinceMs: Schema.Number,
  /** The batch in flight, gated or paused in (0-based; `batches` once completed). */
  batch: Schema.Int,
  batches: Schema.Int,
  moves: Schema.Array(Move),
  baseline: Schema.optional(Baseline),
  /** The cluster's ISR shrinks when the current measuring or gate window began. */
  shrinksAtWindow: Schema.optional(Schema.Number),
  /** Since when a server's append latency has been above its bound (see {@link slowServer}). */
  slowSinceMs: Schema.optional(Schema.Number),
  /** The largest append latency p99 each server showed while measuring. */
  measured: Schema.optional(Schema.Array(Schema.Tuple([Models.ServerId, Schema.Number]))),
  /** An operator asked to pause: the rebalance pauses once the batch in flight ends. */
  pauseRequested: Schema.Boolean,
  /** Why it is paused, cancelled or rolling back. */
  detail: Schema.optional(Schema.String),
  gateFailures: Schema.Int,
  rollbacks: Schema.Int,
  /** Bytes the finished replica moves copied (their tablets' sizes times the replicas each added). */
  bytesMoved: Schema.Number,
  imbalanceBefore: Schema.Number,
  /** The imbalance the plan ends with. */
  imbalancePlanned: Schema.Number,
  endedAtMs: Schema.optional(Schema.Number)
})

/** @see State */
export type State = typeof State.Type

/**
 * The most times a move is started before it is given up.
 *
 * @since 0.1.0
 */
export const maxAttempts = 3

/** The backoff before attempt `attempts + 1`: 1 s, doubled each time, at most 30 s. */
const backoffMs = (attempts: number): number => Math.min(30_000, 1000 * 2 ** Math.max(0, attempts - 1))

/** How often a cancel the tablet has not yet followed is asked again. */
const cancelResendMs = 1000

/** The latency bound's floor: a server fails the gate only above both factor × baseline and baseline + this. */
const latencySlackMs = 20

/**
 * What a rebalance starts from.
 *
 * @since 0.1.0
 */
export interface Start {
  readonly id: string
  readonly reason: string
  readonly nowMs: number
  readonly changes: ReadonlyArray<Change>
  readonly config: RebalanceConfig
  /** The tablets' sizes in bytes, by `Models.tabletKey` (breaks batch ties towards fewer bytes; bytes moved). */
  readonly sizes?: ReadonlyMap<string, number>
  readonly imbalanceBefore: number
  readonly imbalancePlanned: number
}

/**
 * A new rebalance: the plan's changes cut into batches (see `Batches`; a replica move that also changes the leader
 * gets a leadership move in the last batch), measuring its baseline first. A plan with nothing to move is
 * `completed` at once.
 *
 * @since 0.1.0
 */
export const start = (input: Start): State => {
  const settings = settingsOf(input.config)
  const sizeOf = (c: Change) => input.sizes?.get(Models.tabletKey(c.tablet)) ?? 0
  const cut = Batches.batches(input.changes, input.config, sizeOf)
  const moves: Array<Move> = []
  const leadership: Array<Change> = []
  cut.forEach((b, batch) => {
    if (b.kind === "leadership") return
    for (const wave of Batches.waves(b.changes, input.config, sizeOf))
      for (const c of wave) {
        moves.push(moveOf(c, batch, "replicas", input.sizes))
        if (c.leaderFrom !== c.leaderTo) leadership.push(c)
      }
  })
  const replicaBatches = cut.filter((b) => b.kind === "replicas").length
  const leadershipOnly = cut.find((b) => b.kind === "leadership")?.changes ?? []
  for (const c of [...leadershipOnly, ...leadership]) moves.push(moveOf(c, replicaBatches, "leadership", input.sizes))
  const batches = replicaBatches + (leadershipOnly.length + leadership.length > 0 ? 1 : 0)
  const empty = moves.length === 0
  return {
    id: input.id,
    reason: input.reason,
    settings,
    startedAtMs: input.nowMs,
    phase: empty ? "completed" : "measuring",
    phaseSinceMs: input.nowMs,
    batch: empty ? batches : 0,
    batches,
    moves,
    pauseRequested: false,
    gateFailures: 0,
    rollbacks: 0,
    bytesMoved: 0,
    imbalanceBefore: input.imbalanceBefore,
    imbalancePlanned: input.imbalancePlanned,
    ...(empty ? { endedAtMs: input.nowMs, detail: "nothing to move" } : {})
  }
}

const moveOf = (c: Change, batch: number, kind: Move["kind"], sizes: ReadonlyMap<string, number> | undefined): Move => {
  const bytes = sizes?.get(Models.tabletKey(c.tablet))
  return {
    batch,
    kind,
    tablet: c.tablet,
    from: c.from,
    to: c.to,
    status: "pending",
    attempts: 0,
    asked: 0,
    ...(bytes === undefined ? {} : { bytes })
  }
}

// ---------------------------------------------------------------------------
// Inputs and commands
// ---------------------------------------------------------------------------

/**
 * A tablet as the controller holds it now: its replicas (in order), the target of its move under way, its leader
 * and ISR, and whether it is online.
 *
 * @since 0.1.0
 */
export interface TabletView {
  readonly tablet: Models.TabletId
  readonly replicas: ReadonlyArray<Models.ServerId>
  readonly moving: ReadonlyArray<Models.ServerId> | undefined
  readonly leader: Models.ServerId | null
  readonly isr: ReadonlyArray<Models.ServerId>
  readonly online: boolean
}

/**
 * A server's figures the gate reads: its leaders' append latency p99 over a recent window (absent: no appends),
 * and the ISR shrinks its leaders asked for since it started.
 *
 * @since 0.1.0
 */
export interface ServerHealth {
  readonly appendLatencyP99Ms?: number | undefined
  readonly isrShrinks: number
}

/**
 * The cluster as the shell sees it at `nowMs`: every tablet (a tablet not listed no longer exists), the servers
 * registered, the `minInsyncReplicas` setting, and each live server's health (a server that did not answer is absent).
 *
 * @since 0.1.0
 */
export interface Observation {
  readonly tablets: ReadonlyArray<TabletView>
  /** The servers registered now. */
  readonly live: ReadonlySet<Models.ServerId>
  readonly minInsyncReplicas: number
  readonly health: ReadonlyMap<Models.ServerId, ServerHealth>
}

/**
 * How the controller answered a `Reassign`, `CancelReassign` or `ElectPreferred`: accepted, refused (`refusal` names
 * the reason, as `ReassignRefused` does), or not answered (the controller failed over, the request timed out).
 *
 * @since 0.1.0
 */
export type Answer =
  | { readonly _tag: "Accepted" }
  | { readonly _tag: "Refused"; readonly refusal: string; readonly detail: string }
  | { readonly _tag: "Failed"; readonly detail: string }

/**
 * The inputs: `Observe` (the cluster now: the shell feeds it on a timer), `Answered` (the answer to a command about
 * the move at `index`), `Pause` (after the batch in flight), `Resume`, `Cancel`.
 *
 * @since 0.1.0
 */
export type Input =
  | { readonly _tag: "Observe"; readonly nowMs: number; readonly cluster: Observation }
  | {
      readonly _tag: "Answered"
      readonly nowMs: number
      readonly index: number
      /** The command's `ask`: an answer to a request older than the move's last is ignored. */
      readonly ask: number
      readonly command: "Reassign" | "CancelReassign" | "ElectPreferred"
      readonly answer: Answer
    }
  | { readonly _tag: "Pause"; readonly nowMs: number }
  | { readonly _tag: "Resume"; readonly nowMs: number }
  | { readonly _tag: "Cancel"; readonly nowMs: number }

/**
 * The log levels of the executor's lines.
 *
 * @since 0.1.0
 */
export type LogLevel = "Debug" | "Info" | "Warning"

/**
 * The commands, executed in order: ask the controller to move a tablet (`Reassign`, with the throttle for its
 * adding replicas; 0: none), to cancel its move, or to elect its preferred replica (`ElectPreferred`); each answer
 * is fed back as `Answered` for the move at `index` with the command's `ask`. `Persist` stores the state (it changed); `Ended` says the
 * rebalance ended (completed or cancelled) or paused; `Log` writes one line, prefixed `rebalance <id>:`.
 *
 * @since 0.1.0
 */
export type Command =
  | {
      readonly _tag: "Reassign"
      readonly index: number
      readonly ask: number
      readonly tablet: Models.TabletId
      readonly target: ReadonlyArray<Models.ServerId>
      readonly throttleBytesPerSec: number
    }
  | { readonly _tag: "CancelReassign"; readonly index: number; readonly ask: number; readonly tablet: Models.TabletId }
  | { readonly _tag: "ElectPreferred"; readonly index: number; readonly ask: number; readonly tablet: Models.TabletId }
  | { readonly _tag: "Persist"; readonly state: State }
  | { readonly _tag: "Ended"; readonly outcome: "completed" | "cancelled" | "paused" }
  | { readonly _tag: "Log"; readonly level: LogLevel; readonly message: string }

// ---------------------------------------------------------------------------
// Step
// ---------------------------------------------------------------------------

/** A step under way: the state as it changes and the commands so far. */
interface Stepping {
  state: State
  moves: Array<Move>
  readonly commands: Array<Command>
  readonly nowMs: number
}

const log = (s: Stepping, level: LogLevel, message: string) =>
  s.commands.push({ _tag: "Log", level, message: `rebalance ${s.state.id}: ${message}` })

const setMove = (s: Stepping, index: number, move: Move) => {
  s.moves[index] = move
}

/** Sends a request about the move at `index` (its state already set): numbered, so a stale answer is known. */
const ask = (
  s: Stepping,
  index: number,
  request:
    | {
        readonly _tag: "Reassign"
        readonly target: ReadonlyArray<Models.ServerId>
        readonly throttleBytesPerSec: number
      }
    | { readonly _tag: "CancelReassign" }
    | { readonly _tag: "ElectPreferred" }
) => {
  const m = s.moves[index]!
  const n = m.asked + 1
  s.moves[index] = { ...m, asked: n }
  s.commands.push({ ...request, index, ask: n, tablet: m.tablet })
}

const enter = (s: Stepping, phase: Phase, extra: Partial<State> = {}) => {
  s.state = { ...s.state, ...extra, phase, phaseSinceMs: s.nowMs }
}

/**
 * A step function of the executor's shape (`step`, or a simulator's mutant of it).
 *
 * @since 0.1.0
 */
export type StepFunction = (state: State, input: Input) => readonly [State, ReadonlyArray<Command>]

/**
 * One transition: the next state and the commands for the shell (a `Persist` last whenever the state changed).
 *
 * @since 0.1.0
 */
export const step: StepFunction = (state, input) => {
  const s: Stepping = { state, moves: [...state.moves], commands: [], nowMs: input.nowMs }
  switch (input._tag) {
    case "Observe":
      observe(s, input.cluster)
      break
    case "Answered":
      answered(s, input)
      break
    case "Pause":
      pause(s)
      break
    case "Resume":
      resume(s)
      break
    case "Cancel":
      cancel(s)
      break
  }
  const moved = s.moves.some((m, i) => m !== state.moves[i])
  const next: State = moved ? { ...s.state, moves: s.moves } : s.state
  if (next === state) return [state, s.commands]
  return [next, [...s.commands, { _tag: "Persist", state: next }]]
}

/**
 * A stored rebalance taken over by a new controller: requests whose answers are lost are asked again on the next
 * `Observe` (a move under way is answered as accepted; one that finished is seen done).
 *
 * @since 0.1.0
 */
export const recovered = (state: State): State => ({
  ...state,
  moves: state.moves.map((m) => (m.status === "requested" ? { ...m, status: "pending", retryAtMs: undefined } : m))
})

/** Whether the rebalance has ended (completed or cancelled). */
export const ended = (state: State): boolean => state.phase === "completed" || state.phase === "cancelled"

const terminal = (m: Move): boolean => m.status === "done" || m.status === "cancelled" || m.status === "skipped"
const active = (m: Move): boolean =>
  m.status === "requested" || m.status === "moving" || m.status === "electing" || m.status === "cancelling"

const sameSet = (a: ReadonlyArray<number>, b: ReadonlyArray<number>): boolean =>
  a.length === b.length && a.every((x) => b.includes(x))
const sameOrder = (a: ReadonlyArray<number>, b: ReadonlyArray<number>): boolean =>
  a.length === b.length && a.every((x, i) => b[i] === x)

/** The servers a move touches: those it adds a replica to and removes one from; a leadership move's new leader. */
export const touches = (m: Move): ReadonlyArray<Models.ServerId> =>
  m.kind === "leadership"
    ? [m.to[0]!]
    : [...m.to.filter((x) => !m.from.includes(x)), ...m.from.filter((x) => !m.to.includes(x))]

// --- Observe ---------------------------------------------------------------

const observe = (s: Stepping, cluster: Observation) => {
  const views = new Map(cluster.tablets.map((t) => [Models.tabletKey(t.tablet), t]))
  s.moves.forEach((m, i) => {
    track(s, i, m, views.get(Models.tabletKey(m.tablet)))
  })
  const shrinks = totalShrinks(cluster)
  switch (s.state.phase) {
    case "measuring":
      return measure(s, cluster, shrinks)
    case "running": {
      const sick = gateFailure(s, cluster)
      if (sick !== undefined) return failGate(s, sick)
      return advance(s, shrinks)
    }
    case "gating":
      return gate(s, cluster, shrinks)
    case "rolling-back":
      return rollBack(s)
    case "cancelling":
      if (s.moves.some(active)) return
      finish(s, "cancelled")
      return
    case "paused":
    case "completed":
    case "cancelled":
      return
  }
}

const totalShrinks = (cluster: Observation): number => {
  let n = 0
  for (const h of cluster.health.values()) n += h.isrShrinks
  return n
}

const batchMoves = (s: Stepping): ReadonlyArray<Move> => s.moves.filter((m) => m.batch === s.state.batch)

/** What a move's tablet shows: a move seen done, under way, back where it began, or changed outside the plan. */
const track = (s: Stepping, i: number, m: Move, view: TabletView | undefined) => {
  if (terminal(m) || (m.status === "pending" && m.batch > s.state.batch)) return
  const key = Models.tabletKey(m.tablet)
  if (view === undefined) {
    setMove(s, i, { ...m, status: "skipped", detail: "the tablet no longer exists" })
    log(s, "Info", `${key}: skipped, the tablet no longer exists`)
    return
  }
  if (m.status === "cancelling") {
    if (view.moving === undefined) return cancelEnded(s, i, m, sameSet(view.replicas, m.from))
    // Asked again each second until the controller takes it (a lost or failed cancel).
    if (s.nowMs - (m.sinceMs ?? s.nowMs) < cancelResendMs) return
    setMove(s, i, { ...m, sinceMs: s.nowMs })
    ask(s, i, { _tag: "CancelReassign" })
    return
  }
  if (m.kind === "leadership") return trackLeadership(s, i, m, view)
  const atTarget = view.moving === undefined && sameSet(view.replicas, m.to)
  const towardsTarget = view.moving !== undefined && sameSet(view.moving, m.to)
  const atOrigin = view.moving === undefined && sameSet(view.replicas, m.from)
  if (atTarget && m.after === "rollback") {
    // A finished move taken back: pending again with its own direction.
    setMove(s, i, { ...m, status: "pending", after: undefined, from: m.to, to: m.from, sinceMs: undefined })
    log(s, "Info", `${key}: moved back to [${m.to.join(",")}]`)
    return
  }
  if (atTarget) {
    setMove(s, i, { ...m, status: "done", sinceMs: s.nowMs, detail: undefined })
    s.state = { ...s.state, bytesMoved: s.state.bytesMoved + addedBytes(m) }
    log(s, "Debug", `${key}: moved to [${m.to.join(",")}]`)
    return
  }
  if (towardsTarget) {
    if (m.status === "pending" || m.status === "requested")
      setMove(s, i, { ...m, status: "moving", sinceMs: m.sinceMs ?? s.nowMs, attempts: Math.max(1, m.attempts) })
    return timeout(s, i, s.moves[i]!)
  }
  if (atOrigin) {
    if (m.status === "moving") {
      // The move ended without reaching its target: cancelled outside the executor, or lost in a failover.
      return retryOrGiveUp(s, i, m, "the move ended back on its original replicas")
    }
    if (m.status === "requested" && !reaskDue(s, i, m)) return timeout(s, i, m)
    return
  }
  setMove(s, i, {
    ...m,
    status: "skipped",
    detail: `the tablet changed outside the plan (replicas [${view.replicas.join(",")}]${
      view.moving === undefined ? "" : `, moving to [${view.moving.join(",")}]`
    })`
  })
  log(s, "Warning", `${key}: skipped, ${s.moves[i]!.detail}`)
}

const addedBytes = (m: Move): number => (m.bytes ?? 0) * m.to.filter((x) => !m.from.includes(x)).length

const trackLeadership = (s: Stepping, i: number, m: Move, view: TabletView) => {
  const key = Models.tabletKey(m.tablet)
  const leader = m.to[0]!
  if (view.moving === undefined && view.leader === leader && sameSet(view.replicas, m.to)) {
    setMove(s, i, { ...m, status: "done", sinceMs: s.nowMs })
    return
  }
  // The reorder its request started is under way (the controller waits for the new first replica to be in the ISR):
  // it holds its place among the moves running, and past the move timeout it is cancelled as any move is.
  if (
    (m.status === "requested" || m.status === "electing") &&
    view.moving !== undefined &&
    sameOrder(view.moving, m.to)
  )
    return timeout(s, i, m)
  if (m.status === "pending") {
    if (!sameSet(view.replicas, m.to) || view.moving !== undefined) {
      setMove(s, i, { ...m, status: "skipped", detail: "its replicas are not those planned" })
      log(s, "Info", `${key}: leadership move skipped, its replicas are not those planned`)
    }
    return
  }
  if ((m.status === "requested" || m.status === "electing") && reaskDue(s, i, m)) return
  if (m.status === "requested" && view.moving === undefined && sameOrder(view.replicas, m.to)) {
    setMove(s, i, { ...m, status: "electing", sinceMs: s.nowMs })
    ask(s, i, { _tag: "ElectPreferred" })
    return
  }
  if (m.sinceMs !== undefined && s.nowMs - m.sinceMs > s.state.settings.moveTimeoutMs) {
    if (m.attempts < maxAttempts) {
      setMove(s, i, { ...m, status: "pending", retryAtMs: s.nowMs + backoffMs(m.attempts), detail: "timed out" })
    } else {
      setMove(s, i, { ...m, status: "skipped", detail: `led by ${view.leader ?? "none"} after ${m.attempts} tries` })
      log(s, "Warning", `${key}: leadership move given up: ${s.moves[i]!.detail}`)
    }
  }
}

/** Asks again, once its backoff has passed, for a request whose answer failed (`retryAtMs` set on a requested move). */
const reaskDue = (s: Stepping, i: number, m: Move): boolean => {
  if (m.retryAtMs === undefined || s.nowMs < m.retryAtMs) return false
  setMove(s, i, { ...m, retryAtMs: undefined })
  if (m.status === "electing") ask(s, i, { _tag: "ElectPreferred" })
  else
    ask(s, i, {
      _tag: "Reassign",
      target: m.to,
      throttleBytesPerSec: m.kind === "replicas" && m.after !== "rollback" ? s.state.settings.throttleBytesPerSec : 0
    })
  return true
}

/** A move under way past `moveTimeout`: cancelled, to be tried again or given up. */
const timeout = (s: Stepping, i: number, m: Move) => {
  if (m.sinceMs === undefined || s.nowMs - m.sinceMs <= s.state.settings.moveTimeoutMs) return
  const after = m.after === "rollback" ? "keep" : m.attempts < maxAttempts ? "retry" : "give-up"
  setMove(s, i, { ...m, status: "cancelling", after, sinceMs: s.nowMs, detail: `stuck past the move timeout` })
  log(
    s,
    "Warning",
    `${Models.tabletKey(m.tablet)}: stuck for ${s.nowMs - m.sinceMs} ms (attempt ${m.attempts} of ${maxAttempts}); cancelling${after === "retry" ? " to try again" : ""}`
  )
  ask(s, i, { _tag: "CancelReassign" })
}

const retryOrGiveUp = (s: Stepping, i: number, m: Move, why: string) => {
  const key = Models.tabletKey(m.tablet)
  if (m.attempts < maxAttempts) {
    const at = s.nowMs + backoffMs(m.attempts)
    setMove(s, i, { ...m, status: "pending", after: undefined, retryAtMs: at, sinceMs: undefined, detail: why })
    log(s, "Info", `${key}: ${why}; trying again at t=${at} ms`)
  } else {
    setMove(s, i, { ...m, status: "cancelled", after: undefined, sinceMs: undefined, detail: why })
    log(s, "Warning", `${key}: given up after ${m.attempts} attempts: ${why}`)
  }
}

/** A cancel ended (the tablet no longer moves): back on its original replicas, or at its target after all. */
const cancelEnded = (s: Stepping, i: number, m: Move, atOrigin: boolean) => {
  const key = Models.tabletKey(m.tablet)
  if (m.after === "keep") {
    // A move taking a finished one back: at its target it is rolled back, else it stays done where it was.
    const back = !atOrigin
    setMove(s, i, {
      ...m,
      status: back ? "pending" : "done",
      after: undefined,
      from: m.to,
      to: m.from,
      sinceMs: undefined,
      detail: back ? "rolled back" : "kept at its target: it could not be moved back"
    })
    log(s, back ? "Info" : "Warning", `${key}: ${s.moves[i]!.detail}`)
    return
  }
  if (!atOrigin) {
    setMove(s, i, { ...m, status: "done", after: undefined, sinceMs: s.nowMs, detail: "finished before its cancel" })
    s.state = { ...s.state, bytesMoved: s.state.bytesMoved + addedBytes(m) }
    log(s, "Info", `${key}: the move finished before its cancel`)
    return
  }
  switch (m.after) {
    case "rollback":
      setMove(s, i, { ...m, status: "pending", after: undefined, sinceMs: undefined, detail: "rolled back" })
      log(s, "Info", `${key}: rolled back to [${m.from.join(",")}]`)
      return
    case "give-up":
      setMove(s, i, { ...m, status: "cancelled", after: undefined, sinceMs: undefined })
      log(s, "Warning", `${key}: cancelled, back on [${m.from.join(",")}] (${m.detail ?? ""})`)
      return
    default:
      return retryOrGiveUp(s, i, m, m.detail ?? "cancelled")
  }
}

/**
 * Starts the moves at `candidates` (in plan order: each batch's moves are stored wave by wave) that the limits let
 * start now. A move that cannot start yet keeps its servers from the moves after it, so none overtakes it on a
 * server: with moves of equal length this runs the planned waves.
 */
const startWithin = (s: Stepping, candidates: ReadonlyArray<number>) => {
  const busy = new Map<Models.ServerId, number>()
  let running = 0
  for (const m of s.moves)
    if (active(m)) {
      running++
      for (const x of touches(m)) busy.set(x, (busy.get(x) ?? 0) + 1)
    }
  const { maxConcurrentMigrations: perServer, maxClusterMigrations: cap, throttleBytesPerSec } = s.state.settings
  const reserved = new Set<Models.ServerId>()
  for (const i of candidates) {
    if (running >= cap) break
    const m = s.moves[i]!
    const servers = touches(m)
    if (servers.some((x) => (busy.get(x) ?? 0) >= perServer || reserved.has(x))) {
      for (const x of servers) reserved.add(x)
      continue
    }
    running++
    for (const x of servers) busy.set(x, (busy.get(x) ?? 0) + 1)
    const back = m.after === "rollback"
    setMove(s, i, {
      ...m,
      status: "requested",
      attempts: back ? m.attempts : m.attempts + 1,
      firstAskedMs: m.firstAskedMs ?? s.nowMs,
      sinceMs: s.nowMs,
      retryAtMs: undefined
    })
    ask(s, i, {
      _tag: "Reassign",
      target: m.to,
      throttleBytesPerSec: m.kind === "replicas" && !back ? throttleBytesPerSec : 0
    })
  }
}

/** Starts what the current batch may start now, and moves on when it has ended. */
const advance = (s: Stepping, shrinks: number) => {
  const batch = s.state.batch
  if (!s.state.pauseRequested)
    startWithin(
      s,
      s.moves.flatMap((m, i) =>
        m.batch === batch && m.status === "pending" && (m.retryAtMs === undefined || s.nowMs >= m.retryAtMs) ? [i] : []
      )
    )
  const mine = batchMoves(s)
  if (mine.some(active)) return
  if (s.state.pauseRequested) {
    enter(s, "paused", { pauseRequested: false, detail: "paused by an operator" })
    log(s, "Info", `paused in batch ${batch + 1} of ${s.state.batches} by an operator`)
    s.commands.push({ _tag: "Ended", outcome: "paused" })
    return
  }
  if (!mine.every(terminal)) return
  const done = mine.filter((m) => m.status === "done").length
  log(s, "Info", `batch ${batch + 1} of ${s.state.batches} ended: ${done} of ${mine.length} moves done`)
  if (batch + 1 >= s.state.batches) return finish(s, "completed")
  enter(s, "gating", { shrinksAtWindow: shrinks })
}

const finish = (s: Stepping, outcome: "completed" | "cancelled") => {
  const done = s.moves.filter((m) => m.status === "done").length
  enter(s, outcome, { endedAtMs: s.nowMs, batch: outcome === "completed" ? s.state.batches : s.state.batch })
  log(s, "Info", `${outcome}: ${done} of ${s.moves.length} moves done, ${s.state.bytesMoved} bytes moved`)
  s.commands.push({ _tag: "Ended", outcome })
}

// --- The gate --------------------------------------------------------------

/**
 * Why the cluster is not healthy enough for a rebalance to go on, if it is not: a server that was up when the
 * baseline was measured is down, a tablet is offline, or a tablet's ISR is below `minInsyncReplicas`.
 *
 * @since 0.1.0
 */
export const unhealthy = (state: State, cluster: Observation): string | undefined => {
  for (const server of state.baseline?.live ?? [])
    if (!cluster.live.has(server)) return `server ${server} is down (it was up when the baseline was measured)`
  for (const t of cluster.tablets) {
    const key = Models.tabletKey(t.tablet)
    if (!t.online) return `${key} is offline`
    if (t.isr.length < cluster.minInsyncReplicas)
      return `${key} has ${t.isr.length} in-sync replicas, under minInsyncReplicas ${cluster.minInsyncReplicas}`
  }
  return undefined
}

/**
 * The first server whose append latency p99 is above both `gateLatencyFactor` × its baseline and its baseline +
 * 20 ms (a server without a baseline is held to the largest any server had), as a line; the gate fails when one
 * stays above for a whole `gateWindow`.
 *
 * @since 0.1.0
 */
export const slowServer = (state: State, cluster: Observation): string | undefined => {
  const baseline = new Map(state.baseline?.appendLatencyP99Ms ?? [])
  const fallback = Math.max(0, ...baseline.values())
  for (const [server, h] of [...cluster.health].sort((a, b) => a[0] - b[0])) {
    if (h.appendLatencyP99Ms === undefined) continue
    const base = baseline.get(server) ?? fallback
    const bound = Math.max(state.settings.gateLatencyFactor * base, base + latencySlackMs)
    if (h.appendLatencyP99Ms > bound)
      return `server ${server}'s append latency p99 ${h.appendLatencyP99Ms.toFixed(1)} ms is above ${bound.toFixed(1)} ms (baseline ${base.toFixed(1)} ms)`
  }
  return undefined
}

/**
 * What fails the gate now: the cluster unhealthy, or a server slow for a whole `gateWindow` (the time it was first
 * seen slow is kept in the state; a spike shorter than the window passes).
 */
const gateFailure = (s: Stepping, cluster: Observation): string | undefined => {
  const sick = unhealthy(s.state, cluster)
  if (sick !== undefined) return sick
  const slow = slowServer(s.state, cluster)
  if (slow === undefined) {
    if (s.state.slowSinceMs !== undefined) s.state = { ...s.state, slowSinceMs: undefined }
    return undefined
  }
  const since = s.state.slowSinceMs ?? s.nowMs
  if (s.state.slowSinceMs === undefined) s.state = { ...s.state, slowSinceMs: since }
  return s.nowMs - since >= s.state.settings.gateWindowMs ? `${slow}, for ${s.nowMs - since} ms` : undefined
}

/** The baseline window: the largest p99 each server shows, and the shrinks over the window. */
const measure = (s: Stepping, cluster: Observation, shrinks: number) => {
  const measured = new Map(s.state.measured ?? [])
  for (const [server, h] of cluster.health)
    if (h.appendLatencyP99Ms !== undefined)
      measured.set(server, Math.max(measured.get(server) ?? 0, h.appendLatencyP99Ms))
  const atWindow = s.state.shrinksAtWindow ?? shrinks
  const sorted = [...measured].sort((a, b) => a[0] - b[0])
  s.state = { ...s.state, measured: sorted, shrinksAtWindow: atWindow }
  const elapsed = s.nowMs - s.state.phaseSinceMs
  if (elapsed < s.state.settings.gateWindowMs) return
  const baseline: Baseline = {
    appendLatencyP99Ms: sorted,
    shrinksPerSec: Math.max(0, shrinks - atWindow) / (elapsed / 1000),
    live: [...cluster.live].sort((a, b) => a - b)
  }
  enter(s, "running", { baseline, measured: undefined, shrinksAtWindow: undefined, slowSinceMs: undefined })
  log(
    s,
    "Info",
    `baseline: ISR shrinks ${baseline.shrinksPerSec.toFixed(3)}/s, append p99 ${
      sorted.map(([id, ms]) => `${id}:${ms.toFixed(1)}ms`).join(" ") || "none (no appends)"
    }; starting batch ${s.state.batch + 1} of ${s.state.batches}`
  )
  advance(s, shrinks)
}

/**
 * Between batches: the next starts once a whole window has passed healthy with at most the baseline's ISR shrinks
 * (plus one); more shrinks start the window again; an unhealthy cluster pauses the rebalance.
 */
const gate = (s: Stepping, cluster: Observation, shrinks: number) => {
  const sick = gateFailure(s, cluster)
  if (sick !== undefined) {
    enter(s, "paused", { gateFailures: s.state.gateFailures + 1, detail: `stability gate failed: ${sick}` })
    log(s, "Warning", `stability gate after batch ${s.state.batch + 1} failed: ${sick}; paused`)
    s.commands.push({ _tag: "Ended", outcome: "paused" })
    return
  }
  if (s.state.pauseRequested) {
    enter(s, "paused", { pauseRequested: false, batch: s.state.batch + 1, detail: "paused by an operator" })
    log(s, "Info", `paused before batch ${s.state.batch + 1} of ${s.state.batches} by an operator`)
    s.commands.push({ _tag: "Ended", outcome: "paused" })
    return
  }
  const windowMs = s.state.settings.gateWindowMs
  const elapsed = s.nowMs - s.state.phaseSinceMs
  const seen = shrinks - (s.state.shrinksAtWindow ?? shrinks)
  const allowed = Math.floor((s.state.baseline?.shrinksPerSec ?? 0) * (elapsed / 1000)) + 1
  if (seen > allowed) {
    s.state = { ...s.state, phaseSinceMs: s.nowMs, shrinksAtWindow: shrinks }
    log(s, "Info", `stability gate: ${seen} ISR shrinks in ${elapsed} ms (at most ${allowed}); waiting a new window`)
    return
  }
  if (elapsed < windowMs) return
  // The batch's moves start on the next Observe, once it has looked at their tablets.
  enter(s, "running", { batch: s.state.batch + 1, shrinksAtWindow: undefined })
  log(s, "Info", `stability gate passed; starting batch ${s.state.batch + 1} of ${s.state.batches}`)
}

/** The cluster went unhealthy while a batch ran: cancel its moves under way, move its finished ones back. */
const failGate = (s: Stepping, why: string) => {
  const batch = s.state.batch
  enter(s, "rolling-back", { gateFailures: s.state.gateFailures + 1, detail: `stability gate failed: ${why}` })
  log(s, "Warning", `stability gate failed in batch ${batch + 1}: ${why}; rolling the batch back`)
  s.moves.forEach((m, i) => {
    if (m.batch !== batch) return
    if (m.status === "requested" || m.status === "moving") {
      setMove(s, i, { ...m, status: "cancelling", after: "rollback", sinceMs: s.nowMs })
      ask(s, i, { _tag: "CancelReassign" })
    } else if (m.status === "cancelling") {
      setMove(s, i, { ...m, after: "rollback" })
    } else if (m.status === "electing") {
      setMove(s, i, { ...m, status: "pending", sinceMs: undefined })
    } else if (m.status === "done" && m.kind === "replicas") {
      // Back to where it began: a move of its own from its target to its original replicas, marked `rollback`
      // so that once there it turns pending in its own direction again; started within the limits.
      setMove(s, i, { ...m, status: "pending", after: "rollback", from: m.to, to: m.from, detail: "rolling back" })
    }
  })
  rollBack(s)
}

/** Rolling back: moves back what finished, within the limits; paused once nothing of the batch is in between. */
const rollBack = (s: Stepping) => {
  const back = (m: Move) => m.batch === s.state.batch && m.status === "pending" && m.after === "rollback"
  startWithin(
    s,
    s.moves.flatMap((m, i) => (back(m) ? [i] : []))
  )
  if (batchMoves(s).some((m) => active(m) || back(m))) return
  enter(s, "paused", { rollbacks: s.state.rollbacks + 1 })
  log(s, "Warning", `paused after rolling batch ${s.state.batch + 1} back: ${s.state.detail ?? ""}`)
  s.commands.push({ _tag: "Ended", outcome: "paused" })
}

// --- Answers and the operator ---------------------------------------------

const permanentRefusals = new Set([
  "UnknownTablet",
  "TabletDeleting",
  "EmptyTarget",
  "DuplicateServer",
  "UnknownServer",
  "ReplicationFactor",
  "AlreadyMoving"
])

const answered = (s: Stepping, input: Extract<Input, { readonly _tag: "Answered" }>) => {
  const { index, command: request, answer } = input
  const m = s.moves[index]
  if (m === undefined || input.ask !== m.asked) return
  const key = Models.tabletKey(m.tablet)
  if (answer._tag === "Accepted") {
    if (request === "Reassign" && m.status === "requested" && m.kind === "replicas")
      setMove(s, index, { ...m, status: "moving" })
    return
  }
  const why = `${request} ${answer._tag === "Refused" ? `refused (${answer.refusal})` : "failed"}: ${answer.detail}`
  if (request === "CancelReassign") {
    if (m.status !== "cancelling") return
    if (answer._tag === "Refused" && answer.refusal === "NotMoving") return // the next Observe sees where it is
    if (answer._tag === "Refused") {
      // It cannot be cancelled (no original replica in sync to lead): it finishes instead.
      setMove(s, index, { ...m, status: "moving", after: undefined, sinceMs: s.nowMs, detail: why })
      log(s, "Warning", `${key}: ${why}; letting it finish`)
      return
    }
    return // asked again by the next Observe while the tablet still moves
  }
  if (m.status !== "requested" && m.status !== "electing") return
  if (answer._tag === "Failed") {
    // Its outcome is unknown: Observe shows where the tablet is, and asks again after the backoff if nothing moved.
    setMove(s, index, { ...m, retryAtMs: s.nowMs + backoffMs(m.attempts), detail: why })
    log(s, "Info", `${key}: ${why}; asking again if nothing changes`)
    return
  }
  if (m.after === "rollback") {
    // Taking a finished move back was refused or failed: it stays done at its target (not in between).
    setMove(s, index, {
      ...m,
      status: "done",
      after: undefined,
      from: m.to,
      to: m.from,
      sinceMs: undefined,
      detail: `kept at its target: ${why}`
    })
    log(s, "Warning", `${key}: kept at its target, ${why}`)
    return
  }
  if (answer._tag === "Refused" && permanentRefusals.has(answer.refusal) && m.status === "requested") {
    setMove(s, index, { ...m, status: "skipped", sinceMs: undefined, detail: why })
    log(s, "Warning", `${key}: skipped, ${why}`)
    return
  }
  if (answer._tag === "Refused" && m.status === "requested") {
    // Refused for a reason that can pass: it did not start, so it is asked again after a backoff (its attempts
    // untouched) until `moveTimeout` has passed since it was first asked for; then given up.
    const first = m.firstAskedMs ?? s.nowMs
    if (s.nowMs - first > s.state.settings.moveTimeoutMs) {
      setMove(s, index, { ...m, status: "cancelled", sinceMs: undefined, detail: why })
      log(s, "Warning", `${key}: given up after ${s.nowMs - first} ms of refusals: ${why}`)
      return
    }
    const refusals = (m.refusals ?? 0) + 1
    const at = s.nowMs + backoffMs(refusals)
    setMove(s, index, {
      ...m,
      status: "pending",
      attempts: Math.max(0, m.attempts - 1),
      refusals,
      retryAtMs: at,
      sinceMs: undefined,
      detail: why
    })
    log(s, "Info", `${key}: ${why}; asking again at t=${at} ms`)
    return
  }
  retryOrGiveUp(s, index, m, why)
}

const pause = (s: Stepping) => {
  const phase = s.state.phase
  if (phase === "measuring") {
    enter(s, "paused", { detail: "paused by an operator", measured: undefined, shrinksAtWindow: undefined })
    log(s, "Info", "paused by an operator before its first batch")
    s.commands.push({ _tag: "Ended", outcome: "paused" })
    return
  }
  if (phase === "running" || phase === "gating") {
    if (s.state.pauseRequested) return
    s.state = { ...s.state, pauseRequested: true }
    log(s, "Info", `pausing once batch ${s.state.batch + 1} ends`)
    return
  }
  log(s, "Info", `pause ignored: the rebalance is ${phase}`)
}

const resume = (s: Stepping) => {
  if (s.state.phase !== "paused") {
    if (s.state.pauseRequested) {
      s.state = { ...s.state, pauseRequested: false }
      log(s, "Info", "resumed: the pause asked for is withdrawn")
    } else log(s, "Info", `resume ignored: the rebalance is ${s.state.phase}`)
    return
  }
  const retried = s.moves.map((m) =>
    m.batch < s.state.batch
      ? m
      : m.status === "cancelled"
        ? { ...m, status: "pending" as const, attempts: 0, refusals: 0, firstAskedMs: undefined }
        : m.status === "pending"
          ? { ...m, refusals: 0, firstAskedMs: undefined, retryAtMs: undefined }
          : m
  )
  s.moves.splice(0, s.moves.length, ...retried)
  enter(s, "measuring", { detail: undefined, pauseRequested: false })
  log(s, "Info", `resumed in batch ${s.state.batch + 1} of ${s.state.batches}; measuring the baseline again`)
}

const cancel = (s: Stepping) => {
  if (ended(s.state) || s.state.phase === "cancelling") {
    log(s, "Info", `cancel ignored: the rebalance is ${s.state.phase}`)
    return
  }
  enter(s, "cancelling", { detail: "cancelled by an operator", pauseRequested: false })
  s.moves.forEach((m, i) => {
    if (m.status === "requested" || m.status === "moving") {
      setMove(s, i, { ...m, status: "cancelling", after: "give-up", sinceMs: s.nowMs, detail: "cancelled" })
      ask(s, i, { _tag: "CancelReassign" })
    } else if (m.status === "cancelling") setMove(s, i, { ...m, after: "give-up" })
    else if (m.status === "pending" && m.after === "rollback")
      setMove(s, i, { ...m, status: "done", after: undefined, from: m.to, to: m.from, detail: "kept at its target" })
    else if (m.status === "pending" || m.status === "electing")
      setMove(s, i, { ...m, status: "skipped", detail: "the rebalance was cancelled" })
  })
  log(s, "Info", "cancelling: moves under way go back to their original replicas; finished batches stay")
  if (!s.moves.some(active)) finish(s, "cancelled")
}

// ---------------------------------------------------------------------------
// Progress
// ---------------------------------------------------------------------------

/**
 * Where a rebalance stands, for `status`, `GET /rebalance` and the metrics (`batch` is 1-based, `batches` once
 * completed; `active` lists the moves under way).
 *
 * @since 0.1.0
 */
export const Progress = Schema.Struct({
  id: Schema.String,
  reason: Schema.String,
  phase: Phase,
  batch: Schema.Int,
  batches: Schema.Int,
  movesDone: Schema.Int,
  movesTotal: Schema.Int,
  movesActive: Schema.Int,
  movesCancelled: Schema.Int,
  movesSkipped: Schema.Int,
  bytesMoved: Schema.Number,
  gateFailures: Schema.Int,
  rollbacks: Schema.Int,
  imbalanceBefore: Schema.Number,
  imbalancePlanned: Schema.Number,
  startedAtMs: Schema.Number,
  endedAtMs: Schema.optional(Schema.Number),
  detail: Schema.optional(Schema.String),
  active: Schema.Array(
    Schema.Struct({
      tablet: Schema.String,
      to: Schema.Array(Models.ServerId),
      status: MoveStatus,
      attempts: Schema.Int,
      sinceMs: Schema.optional(Schema.Number)
    })
  )
})

/** @see Progress */
export type Progress = typeof Progress.Type

/**
 * A rebalance's progress.
 *
 * @since 0.1.0
 */
export const progress = (state: State): Progress => {
  const count = (status: MoveStatus) => state.moves.filter((m) => m.status === status).length
  return {
    id: state.id,
    reason: state.reason,
    phase: state.phase,
    batch: Math.min(state.batch + 1, state.batches),
    batches: state.batches,
    movesDone: count("done"),
    movesTotal: state.moves.length,
    movesActive: state.moves.filter(active).length,
    movesCancelled: count("cancelled"),
    movesSkipped: count("skipped"),
    bytesMoved: state.bytesMoved,
    gateFailures: state.gateFailures,
    rollbacks: state.rollbacks,
    imbalanceBefore: state.imbalanceBefore,
    imbalancePlanned: state.imbalancePlanned,
    startedAtMs: state.startedAtMs,
    ...(state.endedAtMs === undefined ? {} : { endedAtMs: state.endedAtMs }),
    ...(state.detail === undefined ? {} : { detail: state.detail }),
    active: state.moves.filter(active).map((m) => ({
      tablet: Models.tabletKey(m.tablet),
      to: m.to,
      status: m.status,
      attempts: m.attempts,
      ...(m.sinceMs === undefined ? {} : { sinceMs: m.sinceMs })
    }))
  }
}
