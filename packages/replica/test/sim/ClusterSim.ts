/**
 * Deterministic simulation of a whole replicated cluster (TigerBeetle's VOPR: one seed draws everything). The
 * simulator runs the real parts — `TabletServer` (with `ReplicaState`, `LeaderState`, `FollowerState`, `TabletLog`
 * on a memory store each), coordinators running the election with the real `Controller` as their leader service —
 * on one memory coordination service and an in-memory network, on `TestClock`. It has no copy of their logic.
 *
 * A seed draws: 3–7 tablet servers, 1–3 coordinators, 1–3 tablets with their replication factor and minimum ISR,
 * the session timeout, how often each server flushes its writes, the controller's election rule (first in the ISR
 * or largest log end), 1–3 idempotent acks=all producers, and the
 * faults: crash (kill -9: the sessions are left to expire) and restart on the same store, power loss (a crash whose
 * store, `LossyStore`, loses every write since its last flush; with a minimum ISR of 2, the other servers having
 * just flushed, so that an acknowledged record always keeps one copy), clean stop, pause past the session timeout, session expiry, isolating a
 * process, cutting one link, and per call: delay (so reordering), loss before or after the target ran it, and
 * duplication. Half the seeds draw only a few fault kinds (swarm testing), and half of those send some records
 * acks=1; half the seeds also transfer a leadership under lag (a follower behind, another deaf to the controllers,
 * the leader shut down), half draw storage and clock faults (a slow disk, a disk failing some writes, a wall
 * clock jump, power lost on two servers at once with a minimum ISR of 3), half churn an ISR (the leader's ISR
 * answers each held until its next proposal, a follower whose sessions expire again and again and that stalls,
 * loses power, or is added just as its leader is partitioned from the controllers with the clients), and half move
 * replica sets (`Reassignments.ts`: the controller in charge is asked to move a tablet to as many servers, one more
 * or one fewer, off its leader or in another order; bad requests — a server twice, an unknown server, one that is
 * down — must be refused naming it; moves under way are cancelled, asked for another target, or struck: the
 * controller's coordinator crashed, paused, cut off from coordination or isolated, the leader, a leaving or an adding
 * replica crashed or losing power); a third give their tablets a retention of a few hundred bytes, applied every
 * few hundred virtual ms (log starts moving under the faults). Then the faults stop, everything heals, and the run
 * must settle; a seed that
 * moves replica sets then makes a move or two in the quiet cluster, each settled in turn.
 *
 * Checked (`Checkers.ts`): no acknowledged write lost, no record twice; the prefix property across replicas, and
 * after every step across a tablet's committed ISR (each member holds its leader's log below the HW); at
 * most one leader per tablet and leader epoch; a leader's HW never decreases and never passes its log end; a tablet
 * server never applies a LeaderAndIsr below the highest coordinator epoch it has applied; an ISR never gains a
 * server that is not registered; of the moves, seen in every tablet write a controller commits: each begins from the
 * replicas the tablet has and ends on its target (completed) or its original (cancelled), a moving tablet's ISR never
 * has fewer members than as the move began (or than its target, when smaller) while no fault or its aftermath is in
 * force, and a bad request is refused as what is wrong with it; and liveness: every tablet has a leader with its full
 * ISR and takes an acks=all append within a bound once the faults stop, no tablet is left moving, every replica a
 * move took out is deleted, and every server hosts exactly the tablets coordination assigns it. A planted bug of the
 * controller, `remove-before-isr` (a move finished before its new replicas are in the ISR), is caught by them.
 *
 * This module is the driver: it sets the run up, steps the clock injecting faults, settles, probes and judges. The
 * parts beside it: `Config.ts` (the run's shapes and the cluster a seed draws), `World.ts` (the shared state record),
 * `Network.ts`, `ProcessCoordination.ts`, `Process.ts`, `Peers.ts`, `Audit.ts` (what is sampled for the checkers),
 * the fault families `Faults.ts`, `LeaderTransfer.ts`, `IsrChurn.ts`, `DiskAndClock.ts` and `Reassignments.ts`,
 * `Workload.ts`, `Settle.ts`, `Judge.ts` and `Checkers.ts`; the virtual clock and the fault pick are shared with the
 * election simulator (`scripts/test-support/sim/`).
 */
import { Coordination, MemoryCoordination } from "@strata/core"
import { Effect, References, type Scope } from "effect"
import { TestClock } from "effect/testing"
import { seeded } from "../../../../scripts/test-support/prng.js"
import * as Clock from "../../../../scripts/test-support/sim/Clock.js"
import * as Audit from "./Audit.js"
import * as Checkers from "./Checkers.js"
import {
  type Config,
  correct,
  defaultConfig,
  describeCluster,
  drawCluster,
  type Result,
  type Variant
} from "./Config.js"
import * as DiskAndClock from "./DiskAndClock.js"
import * as Faults from "./Faults.js"
import * as IsrChurn from "./IsrChurn.js"
import * as Judge from "./Judge.js"
import * as LeaderTransfer from "./LeaderTransfer.js"
import * as Network from "./Network.js"
import * as Peers from "./Peers.js"
import * as Process from "./Process.js"
import * as Reassignments from "./Reassignments.js"
import * as Rebalances from "./Rebalances.js"
import * as Settle from "./Settle.js"
import * as Workload from "./Workload.js"
import { log, makeProc, type World } from "./World.js"

export {
  type Config,
  correct,
  defaultConfig,
  type FaultKind,
  type Planned,
  planted,
  type Result,
  rebalancing,
  type Shape,
  type Stats,
  type Target,
  type Variant
} from "./Config.js"

/** `STRATA_SIM_REBALANCES=none|some|every`: which seeds run the rebalance family (a third of those eligible). */
const rebalancesKnob = (): Variant["rebalances"] => {
  const v = process.env.STRATA_SIM_REBALANCES
  return v === "none" || v === "every" ? v : "some"
}

/** Draws the cluster from the seed, logs it, and builds the run's world around the auditor's session. */
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
    const rng = seeded(seed)
    const root = yield* Effect.scope
    const base = yield* Coordination.Coordination
    const faults = yield* Coordination.Faults
    const clock = Clock.make(yield* TestClock.testClockWith(Effect.succeed), config.stepMs)
    const cluster = drawCluster(
      seed,
      rng,
      config,
      variant.reassignments,
      variant.rebalances ?? rebalancesKnob(),
      variant.faults,
      variant.deletes,
      variant.retention
    )
    Clock.log(clock, describeCluster(seed, cluster))
    const auditor = yield* base.session({ timeout: "1 hour" })
    const servers = Array.from({ length: cluster.serverCount }, (_, i) => makeProc("server", i + 1))
    const coordinators = Array.from({ length: cluster.coordinatorCount }, (_, i) => makeProc("coordinator", 101 + i))
    const procs = [...servers, ...coordinators]
    const w: World = {
      seed,
      variant,
      config,
      rng,
      root,
      base,
      faults,
      clock,
      cluster,
      record: Checkers.recorder(cluster.minIsr),
      auditor,
      procs,
      servers,
      coordinators,
      byName: new Map(procs.map((p) => [p.name, p])),
      clientProc: { ...makeProc("server", 0), name: "client" },
      stores: new Map(),
      closing: new Map(),
      network: Network.make(),
      wiring: { peers: (p) => Peers.peersOf(w, p), servers: (c) => Peers.serversFor(w, c) },
      faultsOn: true,
      churns: new Map(),
      timed: [],
      faultCounts: {},
      lostWrites: 0,
      calmFromMs: 0,
      reassigning: new Set(),
      registered: new Set(),
      rebalances: Rebalances.makeWatch()
    }
    return w
  })

/**
 * The faulty steps: each injects the scripted or random faults due and those of the families the seed runs, ends
 * the faults due, lets each server flush by chance, advances the clock and samples the cluster. Returns the longest
 * run of steps in which some created tablet had no leader in coordination.
 */
const runSteps = (w: World) =>
  Effect.gen(function* () {
    const { config, cluster } = w
    let runLeaderless = 0
    let lastRegistered = ""
    let longestLeaderless = 0
    for (let step = 0; step < config.steps; step++) {
      for (const planned of config.script ?? []) {
        if (planned.step !== step) continue
        for (const p of yield* Faults.targets(w, planned.target))
          yield* Faults.inject(w, planned.fault, p, step, planned.until)
      }
      if (config.script === undefined && step > 5 && w.rng.chance(config.faultChance))
        yield* Faults.randomFault(w, step)
      if (cluster.transfers !== undefined && step > 5 && cluster.transfers.chance(0.04))
        yield* LeaderTransfer.transfer(w, step, cluster.transfers)
      if (cluster.extras !== undefined && step > 5 && cluster.extras.chance(0.06))
        yield* DiskAndClock.extraFault(w, step, cluster.extras)
      if (cluster.churning !== undefined && step > 5 && cluster.churning.chance(0.05))
        yield* IsrChurn.churnFault(w, cluster.churning)
      if (cluster.moves !== undefined && step > 5 && cluster.moves.chance(0.1))
        yield* Reassignments.reassignFault(w, cluster.moves)
      if (cluster.rebalancing !== undefined && step > 5 && cluster.rebalancing.chance(0.08))
        yield* Rebalances.rebalanceFault(w, cluster.rebalancing)
      yield* Faults.heal(w, step, false)
      // Each server's writes become durable at a time of its own.
      for (const p of w.servers) if (w.rng.chance(cluster.flushChance)) w.stores.get(p.id)?.flush()
      yield* Clock.tick(w.clock)
      yield* Audit.sample(w)
      yield* Reassignments.sample(w)
      yield* Rebalances.sample(w)
      let leaderless = false
      for (const tablet of cluster.tablets) {
        const meta = yield* Audit.readTablet(w, tablet)
        if (meta !== undefined && meta.leaderAndIsr.leader === null) leaderless = true
      }
      w.registered = yield* Audit.registeredServers(w)
      const registered = [...w.registered].sort().join(",")
      if (registered !== lastRegistered) log(w, `registered servers: ${registered}`)
      lastRegistered = registered
      runLeaderless = leaderless ? runLeaderless + 1 : 0
      longestLeaderless = Math.max(longestLeaderless, runLeaderless)
    }
    return longestLeaderless
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
    for (const p of w.procs) yield* Process.start(w, p)
    const workload = Workload.make(w)
    yield* Workload.start(workload)
    const longestLeaderless = yield* runSteps(w)
    yield* Settle.stopFaults(w, workload)
    let settledAt = yield* Settle.settle(w, workload)
    if (settledAt !== undefined) settledAt = yield* Settle.quietMoves(w, workload)
    // A rebalance paused by the faults is resumed in the quiet cluster and must end; the cluster settles again.
    if (settledAt !== undefined && w.cluster.rebalanceSettings !== undefined && (yield* Rebalances.finish(w)))
      settledAt = yield* Settle.settle(w, workload)
    const probes: ReadonlyArray<string> = settledAt === undefined ? [] : yield* Workload.probe(workload)
    // Leadership may move meanwhile (back to a preferred replica): a new leader's high watermark reaches what the
    // old one acknowledged once its followers fetch again, so the replicas are judged once settled again.
    if (settledAt !== undefined) settledAt = yield* Settle.settle(w, workload)
    return yield* Judge.judge(w, settledAt, probes, longestLeaderless)
  })

/** Runs one seed on a fresh memory coordination and `TestClock`, logs below warnings silenced. */
export const run = (seed: number, variant: Variant = correct, config: Config = defaultConfig): Effect.Effect<Result> =>
  Effect.scoped(simulate(seed, variant, config)).pipe(
    Effect.provide(MemoryCoordination.layer()),
    Effect.provide(TestClock.layer()),
    Effect.provideService(
      References.MinimumLogLevel,
      config.logLevel ?? (process.env.STRATA_SIM_LOG === "info" ? "Info" : "Error")
    ),
    Effect.orDie
  )

/** A failed seed as the test prints it: the violations, the key events, and the command that replays it. */
export const describeFailure = (result: Result, lines = 60): string =>
  [
    `seed=${result.seed} variant=${result.variant}: ${result.violations.length} violation(s)`,
    ...result.violations.slice(0, 10).map((v) => `  ${v}`),
    `trace (last ${Math.min(lines, result.trace.length)} of ${result.trace.length} lines):`,
    ...result.trace.slice(-lines).map((l) => `  ${l}`),
    `replay: STRATA_SIM_SEED=${result.seed}${result.variant === correct.name ? "" : ` STRATA_SIM_VARIANT=${result.variant}`} ./dev exec vitest run --project unit packages/replica/test/ClusterSimulation.test.ts`
  ].join("\n")
