/**
 * The automatic rebalance trigger as a pure state machine: `step(state, input)` returns the next state and the
 * commands for the controller's shell. No I/O, no clock: time comes in on the inputs. The shell feeds a `Check`
 * every `rebalance.checkInterval` and when a server joins or is tagged (it decides when to check; the machine decides
 * whether to start), and tells it when a rebalance, automatic or manual, begins and ends.
 *
 * The rule: a `Check` starts a rebalance when
 * - the imbalance (see {@link imbalance}) is above `triggerThreshold`, or a server that may take replicas holds none
 *   while the planner's balanced count for it is at least one (see {@link measure}); and
 * - the trigger is `enabled`, no rebalance is running or paused, the cooldown since the last one ended is over, and
 *   the trigger is armed.
 *
 * Starting a rebalance (or being told one started) disarms the trigger. A `Check` re-arms it when the imbalance is
 * below half the threshold with no empty server (hysteresis: a cluster the planner cannot balance further, e.g. for
 * its racks, does not start rebalance after rebalance), or when the eligible servers are no longer those it
 * disarmed with (a server joined, left or was tagged: what a plan can do has changed). At most one rebalance runs;
 * a paused one blocks the trigger until it is resumed (`Started`) or cancelled (`Ended`).
 *
 * @since 0.1.0
 */
import type { Models } from "@strata/core"
import { Duration } from "effect"
import * as ClusterModel from "./ClusterModel.js"
import type * as RebalanceConfig from "./RebalanceConfig.js"

// ---------------------------------------------------------------------------
// Measuring
// ---------------------------------------------------------------------------

/**
 * What the trigger reads from a cluster model.
 *
 * @since 0.1.0
 */
export interface Measure {
  /** The servers that may take replicas (neither `draining` nor `excluded`), ascending. */
  readonly eligible: ReadonlyArray<Models.ServerId>
  /** The replicas each eligible server holds, in the order of `eligible`. */
  readonly counts: ReadonlyArray<number>
  /** The coefficient of variation of `counts` (see {@link imbalance}). */
  readonly imbalance: number
  /** Every replica of every tablet, wherever it is. */
  readonly replicas: number
  /**
   * The eligible servers holding no replica, when there are at least as many replicas as servers that may keep
   * them (those not `draining`): the planner's balanced count ⌊replicas / servers⌋ is then at least 1, so a
   * balanced plan gives each of them a replica (racks permitting). Otherwise empty: a cluster with fewer replicas
   * than servers always leaves some server with none.
   */
  readonly emptyServers: ReadonlyArray<Models.ServerId>
}

/**
 * Measures a cluster model for the trigger.
 *
 * @since 0.1.0
 */
export const measure = (model: ClusterModel.ClusterModel): Measure => {
  const eligible = model.servers
    .filter((s) => !ClusterModel.hasTag(s, "draining") && !ClusterModel.hasTag(s, "excluded"))
    .map((s) => s.id)
    .sort((a, b) => a - b)
  const held = new Map<number, number>()
  let replicas = 0
  for (const t of model.tablets) {
    for (const r of t.replicas) held.set(r, (held.get(r) ?? 0) + 1)
    replicas += t.replicas.length
  }
  const counts = eligible.map((id) => held.get(id) ?? 0)
  const keeping = model.servers.filter((s) => !ClusterModel.hasTag(s, "draining")).length
  const emptyServers = replicas >= keeping ? eligible.filter((_, i) => counts[i] === 0) : []
  return { eligible, counts, imbalance: coefficientOfVariation(counts), replicas, emptyServers }
}

/**
 * The coefficient of variation of `counts`: the POPULATION standard deviation (divided by n, not n − 1) over the
 * mean; 0 for fewer than 2 counts or a zero mean.
 *
 * @since 0.1.0
 */
export const coefficientOfVariation = (counts: ReadonlyArray<number>): number => {
  if (counts.length < 2) return 0
  const mean = counts.reduce((a, b) => a + b, 0) / counts.length
  if (mean === 0) return 0
  const variance = counts.reduce((a, c) => a + (c - mean) ** 2, 0) / counts.length
  return Math.sqrt(variance) / mean
}

/**
 * A cluster's imbalance: the coefficient of variation (POPULATION standard deviation / mean) of the replica counts
 * of its eligible servers (neither `draining` nor `excluded`); 0 when they hold no replica or there are fewer than
 * two of them. Counts 12, 12, 0 give √32 / 8 ≈ 0.707; equal counts give 0.
 *
 * @since 0.1.0
 */
export const imbalance = (model: ClusterModel.ClusterModel): number => measure(model).imbalance

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

/**
 * The settings the trigger reads (a whole `RebalanceConfig` will do).
 *
 * @since 0.1.0
 */
export type Settings = Pick<RebalanceConfig.RebalanceConfig, "enabled" | "triggerThreshold" | "cooldown">

/**
 * The trigger's state.
 *
 * @since 0.1.0
 */
export interface State {
  readonly settings: Settings
  /** Whether a `Check` may start a rebalance (false from a start until a re-arming `Check`). */
  readonly armed: boolean
  /** The rebalance in progress, automatic or manual: none, running, or paused (waiting for resume or cancel). */
  readonly rebalance: "idle" | "running" | "paused"
  /** When the last rebalance ended: the cooldown runs from here. */
  readonly endedAtMs: number | undefined
  /** The imbalance the last `Check` measured. */
  readonly lastImbalance: number | undefined
  /** The eligible servers the last `Check` saw. */
  readonly eligible: ReadonlyArray<Models.ServerId> | undefined
  /**
   * While disarmed, the eligible servers it disarmed with (a `Check` seeing others re-arms); undefined when armed,
   * or when it disarmed before any `Check` (the next `Check` then records them).
   */
  readonly disarmedWith: ReadonlyArray<Models.ServerId> | undefined
}

/**
 * A new trigger: armed, nothing running, no cooldown. A controller taking over can restore a cooldown by feeding
 * `Ended` with the recorded end time, and a running rebalance by feeding `Started`.
 *
 * @since 0.1.0
 */
export const initial = (settings: Settings): State => ({
  settings,
  armed: true,
  rebalance: "idle",
  endedAtMs: undefined,
  lastImbalance: undefined,
  eligible: undefined,
  disarmedWith: undefined
})

/**
 * When the cooldown ends (undefined when no rebalance has ended yet).
 *
 * @since 0.1.0
 */
export const cooldownUntilMs = (state: State): number | undefined =>
  state.endedAtMs === undefined ? undefined : state.endedAtMs + Duration.toMillis(state.settings.cooldown)

// ---------------------------------------------------------------------------
// Inputs and commands
// ---------------------------------------------------------------------------

/**
 * How a rebalance ended. `paused` keeps it in progress (the trigger waits for `Started` on resume or `Ended` on
 * cancel); the others end it and start the cooldown.
 *
 * @since 0.1.0
 */
export type Outcome = "completed" | "cancelled" | "paused" | "failed"

/**
 * The inputs: `Check` (the cluster as it is now), `Started` (a rebalance began or resumed that this machine did not
 * start: a manual one, one resumed after a pause or a controller failover; feeding it after a `Start` command is
 * harmless), `Ended` (the rebalance in progress ended; after a `Start` the shell feeds it also when the rebalance
 * could not begin, with `failed`, or had nothing to move, with `completed`), `Configure` (new settings).
 *
 * @since 0.1.0
 */
export type Input =
  | { readonly _tag: "Check"; readonly nowMs: number; readonly model: ClusterModel.ClusterModel }
  | { readonly _tag: "Started"; readonly nowMs: number }
  | { readonly _tag: "Ended"; readonly nowMs: number; readonly outcome: Outcome }
  | { readonly _tag: "Configure"; readonly settings: Settings }

/**
 * Why a rebalance starts: an eligible server holds nothing it could hold, or the imbalance is above the threshold.
 *
 * @since 0.1.0
 */
export type Reason = "imbalance" | "empty-server"

/**
 * The log levels of the trigger's lines: `Debug` when nothing needs doing, `Info` for a start, a re-arm, or a start
 * held back (and why), `Warning` for an input that does not fit the state.
 *
 * @since 0.1.0
 */
export type LogLevel = "Debug" | "Info" | "Warning"

/**
 * The commands, executed in order: `Start` plans and starts a rebalance (the machine counts it running from here),
 * `Log` writes one line, prefixed `rebalance trigger:` for grepping.
 *
 * @since 0.1.0
 */
export type Command =
  | {
      readonly _tag: "Start"
      readonly reason: Reason
      readonly imbalance: number
      readonly emptyServers: ReadonlyArray<Models.ServerId>
    }
  | { readonly _tag: "Log"; readonly level: LogLevel; readonly message: string }

const log = (level: LogLevel, message: string): Command => ({
  _tag: "Log",
  level,
  message: `rebalance trigger: ${message}`
})

/** A figure for a log line: at most 4 decimals. */
const fmt = (x: number): string => String(Number(x.toFixed(4)))
const ids = (list: ReadonlyArray<number>): string => (list.length === 0 ? "none" : list.join(", "))
const sameIds = (a: ReadonlyArray<number>, b: ReadonlyArray<number>): boolean =>
  a.length === b.length && a.every((x, i) => x === b[i])

// ---------------------------------------------------------------------------
// Step
// ---------------------------------------------------------------------------

/**
 * One transition: the next state and the commands for the shell.
 *
 * @since 0.1.0
 */
export const step = (state: State, input: Input): readonly [State, ReadonlyArray<Command>] => {
  switch (input._tag) {
    case "Check":
      return check(state, input.nowMs, input.model)
    case "Started":
      if (state.rebalance === "running") return [state, [log("Debug", "a rebalance started (already counted)")]]
      return [
        disarm({ ...state, rebalance: "running" }),
        [log("Info", `a rebalance ${state.rebalance === "paused" ? "resumed" : "started"}; the trigger is disarmed`)]
      ]
    case "Ended": {
      if (input.outcome === "paused") {
        if (state.rebalance === "idle")
          return [state, [log("Warning", "a rebalance paused while none was in progress; ignored")]]
        return [
          { ...state, rebalance: "paused" },
          [log("Info", "the rebalance paused; no automatic start until it is resumed or cancelled")]
        ]
      }
      const next: State = { ...state, rebalance: "idle", endedAtMs: input.nowMs }
      const until = cooldownUntilMs(next)!
      const cooling = `cooling down for ${Duration.format(state.settings.cooldown)} (until t=${until} ms)`
      return [
        next,
        [
          state.rebalance === "idle"
            ? log("Debug", `a rebalance ended (${input.outcome}) while none was counted in progress; ${cooling}`)
            : log("Info", `the rebalance ended (${input.outcome}); ${cooling}`)
        ]
      ]
    }
    case "Configure": {
      const s = input.settings
      return [
        { ...state, settings: s },
        [
          log(
            "Info",
            `settings: enabled ${s.enabled}, threshold ${fmt(s.triggerThreshold)}, cooldown ${Duration.format(s.cooldown)}`
          )
        ]
      ]
    }
  }
}

const disarm = (state: State): State => ({ ...state, armed: false, disarmedWith: state.eligible })

const check = (state: State, nowMs: number, model: ClusterModel.ClusterModel): readonly [State, Array<Command>] => {
  const m = measure(model)
  const threshold = state.settings.triggerThreshold
  const commands: Array<Command> = []
  let s: State = { ...state, lastImbalance: m.imbalance, eligible: m.eligible }

  // Re-arming: the cluster went back below half the threshold with no empty server, or its eligible servers changed.
  if (!s.armed) {
    if (s.disarmedWith === undefined) s = { ...s, disarmedWith: m.eligible }
    else if (!sameIds(s.disarmedWith, m.eligible)) {
      commands.push(log("Info", `re-armed: the eligible servers changed (${ids(s.disarmedWith)} → ${ids(m.eligible)})`))
      s = { ...s, armed: true, disarmedWith: undefined }
    }
    if (!s.armed && m.imbalance < threshold / 2 && m.emptyServers.length === 0) {
      commands.push(
        log(
          "Info",
          `re-armed: imbalance ${fmt(m.imbalance)} < ${fmt(threshold / 2)} (half the threshold), no empty server`
        )
      )
      s = { ...s, armed: true, disarmedWith: undefined }
    }
  }

  const empty = m.emptyServers.length > 0
  const over = m.imbalance > threshold
  if (!empty && !over) {
    commands.push(log("Debug", `balanced: imbalance ${fmt(m.imbalance)} ≤ threshold ${fmt(threshold)}`))
    return [s, commands]
  }
  const why = empty
    ? `server(s) ${ids(m.emptyServers)} hold no replica (${m.replicas} replicas; imbalance ${fmt(m.imbalance)})`
    : `imbalance ${fmt(m.imbalance)} > threshold ${fmt(threshold)}`
  const until = cooldownUntilMs(s)
  const held =
    s.rebalance === "running"
      ? "a rebalance is already running"
      : s.rebalance === "paused"
        ? "a paused rebalance waits for resume or cancel"
        : !s.settings.enabled
          ? "the automatic trigger is disabled (rebalance.enabled = false)"
          : until !== undefined && nowMs < until
            ? `cooling down for another ${Duration.format(Duration.millis(until - nowMs))} (until t=${until} ms)`
            : !s.armed
              ? `disarmed since the last rebalance: it re-arms once the imbalance is below ${fmt(threshold / 2)} with no empty server, or when the eligible servers change`
              : undefined
  if (held !== undefined) {
    commands.push(log("Info", `not starting (${why}): ${held}`))
    return [s, commands]
  }
  commands.push(log("Info", `starting a rebalance: ${why}`))
  commands.push({
    _tag: "Start",
    reason: empty ? "empty-server" : "imbalance",
    imbalance: m.imbalance,
    emptyServers: m.emptyServers
  })
  return [disarm({ ...s, rebalance: "running" }), commands]
}
