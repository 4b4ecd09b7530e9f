/**
 * Deterministic simulation of the fenced election (docs/ARCHITECTURE.md, "Election
 * simulation"). One seed drives one run: 3–5 coordinator processes share one
 * memory coordination service, each running a `Coordinator` (the real lifecycle
 * machine and shell) on its own election; the leader's service sends
 * epoch-tagged requests to a receiver (a tablet server) over a network with
 * random delays and writes through `Leadership.fenced`. After the faults stop
 * and the system settles, a live process must lead (liveness).
 *
 * Time is only the `TestClock` (a fresh one per run), randomness only the
 * seeded `Prng`, so the same seed gives the same history. Faults drawn from the
 * seed: crash (`kill -9`: the sessions are left to expire), stop (clean
 * shutdown), session expiry, pause longer than the session timeout (the process
 * stops, its sessions expire, then it resumes with its timers overdue and only
 * learns of the expiry once its client has reconnected, a moment later), a short
 * pause (a blip the session survives) and message delay. A client whose
 * connection is cut hears nothing from the server: its operations fail with a
 * lost connection and it learns of an expiry only after reconnecting. A leader
 * checks `Leadership.guard` before each request to the receiver. Faults
 * also strike between a process's coordination operations (its session expires,
 * or it pauses, just before a campaign step or a write), and random yields there
 * interleave the fibers. Each seed also draws the backend's semantics for a write
 * from an expired session (`Backend`). After the run the checkers in
 * `Checkers.ts` judge what was recorded.
 *
 * This module is the driver: it draws the run's shape, starts the processes
 * and steps the clock, injecting faults, then judges. The parts beside it:
 * `World.ts` (the shared state record and the run's shapes), `Clock.ts`,
 * `Network.ts`, `Process.ts` (with `ProcessCoordination.ts`, what a process
 * sees of the coordination), `Workload.ts` (the leader's requests and fenced
 * writes), `Faults.ts` and `Checkers.ts`.
 */
import { Coordination, MemoryCoordination } from "@strata/core"
import { Effect, References, type Scope } from "effect"
import { TestClock } from "effect/testing"
import * as Checkers from "./Checkers.js"
import * as Clock from "./Clock.js"
import * as Faults from "./Faults.js"
import * as Network from "./Network.js"
import * as Prng from "./Prng.js"
import * as Process from "./Process.js"
import * as Workload from "./Workload.js"
import { type Config, correct, defaultConfig, noFaults, paths, type Result, type Variant, type World } from "./World.js"

export {
  type Backend,
  type Config,
  correct,
  defaultConfig,
  type FaultKind,
  noFaults,
  type Result,
  type Stats,
  type Variant
} from "./World.js"

/**
 * Draws the run's shape from the seed (backend, session timeout, write interval, 3–5 processes) and sets up its
 * parts; the auditor's session is the run's first.
 */
const setUp = (
  seed: number,
  variant: Variant,
  config: Config
): Effect.Effect<
  World,
  Coordination.CoordinationError,
  Coordination.Coordination | Coordination.Faults | Scope.Scope
> =>
  Effect.gen(function* () {
    const rng = Prng.make(seed)
    const backend = rng.pick(config.backends)
    const sessionTimeoutMs =
      config.stepMs *
      rng.int(
        Math.ceil(config.sessionTimeoutMs[0] / config.stepMs),
        Math.floor(config.sessionTimeoutMs[1] / config.stepMs)
      )
    const writeEveryMs = rng.int(config.writeEveryMs[0], config.writeEveryMs[1])
    const scope = yield* Effect.scope
    const coordination = yield* Coordination.Coordination
    const faults = yield* Coordination.Faults
    const clock = Clock.make(yield* TestClock.testClockWith(Effect.succeed), config.stepMs)
    const network = Network.make({
      clock,
      rng,
      scope,
      maxDelayMs: config.maxDelayMs,
      receiverSkipsEpochCheck: variant.receiverSkipsEpochCheck === true,
      faults
    })
    const auditor: Coordination.Session = yield* coordination.session({ timeout: "1 hour" })
    yield* auditor.create(Workload.logPath, new Uint8Array(0), { createParents: true })
    return {
      seed,
      variant,
      config,
      rng,
      backend,
      sessionTimeoutMs,
      writeEveryMs,
      scope,
      coordination,
      faults,
      clock,
      network,
      auditor,
      procs: Process.makeProcs(rng.int(3, 5)),
      faultsOn: true,
      wins: [],
      epochWrites: [],
      faultCounts: noFaults(),
      fencedApplied: 0,
      fencedRejected: 0,
      terms: 0
    }
  })

/**
 * Judges a settled run: liveness (a live process leads, every fault being over) and every checker over what was
 * recorded. What happens after this (the shutdown) is not part of the history.
 */
const judge = (w: World): Effect.Effect<Result, Coordination.CoordinationError> =>
  Effect.gen(function* () {
    const { config, network } = w
    const leaderNode = yield* w.auditor.exists(paths.leader)
    const live = w.procs
      .filter((p) => p.fiber !== undefined && !p.paused)
      .map((p): Checkers.LiveProcess => ({ id: p.id, leads: p.leading !== undefined }))
    const leaderRegistered = leaderNode._tag === "Some"
    // Every fault ended at least a session timeout ago: a live process must lead.
    const leaderless = Checkers.isLeaderless(live, leaderRegistered)
    w.clock.finished = true
    const violations = Checkers.checkProcesses(w.procs.map((p) => ({ process: p.id, exit: p.fiber?.pollUnsafe() })))
    const entries = yield* Workload.readFencedLog(w.auditor)
    violations.push(
      ...Checkers.checkLiveness(live, leaderRegistered, config.maxDelayMs + config.stepMs),
      ...Checkers.checkLeaders(w.wins),
      ...Checkers.checkReceiver(network.deliveries),
      ...Checkers.checkDeadlines(network.sent, network.expiries),
      ...Checkers.checkFencedLog(entries, w.epochWrites)
    )
    return {
      seed: w.seed,
      variant: w.variant.name,
      backend: w.backend,
      violations,
      trace: w.clock.trace,
      stats: {
        processes: w.procs.length,
        wins: w.wins.length,
        faults: w.faultCounts,
        accepted: network.deliveries.filter((d) => d.accepted).length,
        rejected: network.deliveries.filter((d) => !d.accepted).length,
        fencedApplied: w.fencedApplied,
        fencedRejected: w.fencedRejected,
        leaderless
      }
    } satisfies Result
  })

/** The run itself; needs a fresh memory coordination and `TestClock`. */
const simulate = (
  seed: number,
  variant: Variant,
  config: Config
): Effect.Effect<
  Result,
  Coordination.CoordinationError,
  Coordination.Coordination | Coordination.Faults | Scope.Scope
> =>
  Effect.gen(function* () {
    const w = yield* setUp(seed, variant, config)
    Clock.log(
      w.clock,
      `seed=${seed} variant=${variant.name} backend=${w.backend} processes=${w.procs.length} session=${w.sessionTimeoutMs}ms write-every=${w.writeEveryMs}ms`
    )
    for (const proc of w.procs) yield* Process.start(w, proc)
    for (let step = 0; step < config.steps; step++) {
      w.clock.step = step
      for (const action of Clock.due(w.clock, step)) yield* action
      if (w.rng.chance(config.faultChance)) yield* Faults.inject(w, step)
      yield* Clock.tick(w.clock)
    }
    // No more faults: let the delayed requests arrive and the election settle.
    w.faultsOn = false
    // In steps, so that what each wakes (a campaign's next move, a coordinator's next input) runs in between.
    for (let settled = 0; settled < config.maxDelayMs + config.stepMs; settled += config.stepMs) {
      yield* Clock.tick(w.clock)
    }
    return yield* judge(w)
  })

/**
 * Runs one seed on a fresh memory coordination and a fresh `TestClock` (time
 * starts at 0), with the recipe's info logs silenced.
 */
export const run = (seed: number, variant: Variant = correct, config: Config = defaultConfig): Effect.Effect<Result> =>
  Effect.scoped(simulate(seed, variant, config)).pipe(
    Effect.provide(MemoryCoordination.layer()),
    Effect.provide(TestClock.layer()),
    Effect.provideService(References.MinimumLogLevel, "Warn"),
    Effect.orDie
  )

/** Trace lines that tell the story of a run: faults, elections, losses, resumptions. */
const keyEvent = /FAULT|registers|leads|learns|resumes|starts|expired session|campaign ended|seed=/

/**
 * A failed seed as the test prints it: the seed to replay, the violations, the
 * key events of the trace (at most `keyLines`) and its last `tailLines` lines.
 */
export const describeFailure = (result: Result, keyLines = 40, tailLines = 15): string => {
  const tail = result.trace.slice(-tailLines)
  const key = result.trace.slice(0, result.trace.length - tail.length).filter((l) => keyEvent.test(l))
  return [
    `seed=${result.seed} variant=${result.variant} backend=${result.backend}: ${result.violations.length} violation(s)`,
    ...result.violations.slice(0, 10).map((v) => `  ${v}`),
    ...(result.violations.length > 10 ? [`  ... ${result.violations.length - 10} more`] : []),
    `key events (${Math.min(keyLines, key.length)} of ${key.length}), then the last ${tail.length} of ${result.trace.length} trace lines:`,
    ...key.slice(0, keyLines).map((l) => `  ${l}`),
    "  ...",
    ...tail.map((l) => `  ${l}`),
    `replay: STRATA_SIM_SEED=${result.seed}${result.variant === correct.name ? "" : ` STRATA_SIM_VARIANT=${result.variant}`} ./dev exec vitest run --project unit packages/election/test/Simulation.test.ts`
  ].join("\n")
}
