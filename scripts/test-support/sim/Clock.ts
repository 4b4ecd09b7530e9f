/**
 * A simulation's virtual time and trace, shared by the election and cluster simulators: the `TestClock` the driver
 * steps, the length of a step, and the trace, each line stamped with the virtual time until the run is judged.
 */
import { Duration, type Effect } from "effect"
import type { TestClock } from "effect/testing"

/** The run's virtual clock and its trace. */
export interface VirtualClock {
  readonly test: TestClock.TestClock
  readonly stepMs: number
  readonly trace: Array<string>
  /** Set once the run is judged: what the shutdown does is not part of the history. */
  finished: boolean
}

/** A clock with an empty trace, stepping `stepMs` at a time. */
export const make = (test: TestClock.TestClock, stepMs: number): VirtualClock => ({
  test,
  stepMs,
  trace: [],
  finished: false
})

/** The virtual time in milliseconds. */
export const now = (c: VirtualClock): number => c.test.currentTimeMillisUnsafe()

/** Adds a line to the trace, stamped with the virtual time (until the run is judged). */
export const log = (c: VirtualClock, line: string): void => {
  if (!c.finished) c.trace.push(`t=${now(c)} ${line}`)
}

/** The whole steps (at least one) that `ms` spans. */
export const stepsFor = (c: VirtualClock, ms: number): number => Math.max(1, Math.ceil(ms / c.stepMs))

/** Advances the virtual time by one step, running whatever falls due meanwhile. */
export const tick = (c: VirtualClock): Effect.Effect<void> => c.test.adjust(Duration.millis(c.stepMs))
