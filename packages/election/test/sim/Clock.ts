/**
 * The simulation's virtual time: the shared virtual clock and trace (`scripts/test-support/sim/Clock.ts`), the
 * driver's step, and the actions scheduled for later steps.
 */
import type { Coordination } from "@strata/core"
import type { Effect } from "effect"
import type { TestClock } from "effect/testing"
import * as VirtualClock from "../../../../scripts/test-support/sim/Clock.js"

export { log, now, stepsFor, tick } from "../../../../scripts/test-support/sim/Clock.js"

/** An action the driver runs at the start of a step. */
interface Scheduled {
  readonly step: number
  readonly action: Effect.Effect<void, Coordination.CoordinationError>
}

/** The run's clock and trace, with the driver's step and its schedule. */
export interface Clock extends VirtualClock.VirtualClock {
  /** The driver's step, for faults a process draws between steps. */
  step: number
  readonly scheduled: Array<Scheduled>
}

/** A clock at step 0 with an empty schedule and trace. */
export const make = (test: TestClock.TestClock, stepMs: number): Clock => ({
  ...VirtualClock.make(test, stepMs),
  step: 0,
  scheduled: []
})

/** Schedules `action` for the start of `step`. */
export const later = (c: Clock, step: number, action: Effect.Effect<void, Coordination.CoordinationError>): void => {
  c.scheduled.push({ step, action })
}

/** The actions scheduled for `step`, in the order they were scheduled. */
export const due = (c: Clock, step: number): ReadonlyArray<Effect.Effect<void, Coordination.CoordinationError>> =>
  c.scheduled.filter((s) => s.step === step).map((s) => s.action)
