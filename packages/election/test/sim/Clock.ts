/**
 * The simulation's virtual time: the `TestClock`, the driver's steps and the
 * actions scheduled for later steps, and the trace, each line stamped with the
 * virtual time.
 */
import type { CoordinationError } from "@strata/core"
import { Duration, type Effect } from "effect"
import type { TestClock } from "effect/testing"

/** An action the driver runs at the start of a step. */
interface Scheduled {
  readonly step: number
  readonly action: Effect.Effect<void, CoordinationError>
}

/** The run's clock and trace. */
export interface Clock {
  readonly test: TestClock.TestClock
  readonly stepMs: number
  /** The driver's step, for faults a process draws between steps. */
  step: number
  readonly scheduled: Array<Scheduled>
  readonly trace: Array<string>
  /** Set once the run is judged: what the shutdown does is not part of the history. */
  finished: boolean
}

/** A clock at step 0 with an empty schedule and trace. */
export const make = (test: TestClock.TestClock, stepMs: number): Clock => ({
  test,
  stepMs,
  step: 0,
  scheduled: [],
  trace: [],
  finished: false
})

/** The virtual time in milliseconds. */
export const now = (c: Clock): number => c.test.currentTimeMillisUnsafe()

/** Adds a line to the trace, stamped with the virtual time (until the run is judged). */
export const log = (c: Clock, line: string): void => {
  if (!c.finished) c.trace.push(`t=${now(c)} ${line}`)
}

/** Schedules `action` for the start of `step`. */
export const later = (c: Clock, step: number, action: Effect.Effect<void, CoordinationError>): void => {
  c.scheduled.push({ step, action })
}

/** The whole steps (at least one) that `ms` spans. */
export const stepsFor = (c: Clock, ms: number): number => Math.max(1, Math.ceil(ms / c.stepMs))

/** The actions scheduled for `step`, in the order they were scheduled. */
export const due = (c: Clock, step: number): ReadonlyArray<Effect.Effect<void, CoordinationError>> =>
  c.scheduled.filter((s) => s.step === step).map((s) => s.action)

/** Advances the virtual time by one step, running whatever falls due meanwhile. */
export const tick = (c: Clock): Effect.Effect<void> => c.test.adjust(Duration.millis(c.stepMs))
