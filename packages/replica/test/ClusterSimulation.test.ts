/**
 * Deterministic simulation of a whole replicated cluster (`sim/ClusterSim.ts`; its checkers in `sim/Checkers.ts`).
 * About a third of the others run the rebalance service (`sim/Rebalances.ts`: its trigger and executor under the
 * faults, started, paused, resumed and cancelled at random; the per-server and cluster limits, the gate and a paused
 * rebalance's tablets checked after every step, every rebalance resumed and ended once the faults stop).
 * About half the seeds also move replica sets (`sim/Reassignments.ts`: moves, bad requests that must be refused,
 * cancels, and faults aimed at a move's controller, leader, leaving and adding replicas); the moves are checked too
 * (each completed or cancelled, none left once the faults stop, a moving tablet's ISR never below its size at the
 * move's start while no fault is in force, every replica where coordination assigns it once settled), and their
 * counts are among the faults the run prints (`reassign*`, `cancel*`, `move-*`). About a third of the seeds also
 * delete records (`deleteRecords`) while producing: what a delete may have taken is not counted lost, but an
 * acknowledged delete must hold (the final leader's and ISR's logs start at or past it); counted as `delete-*`.
 *
 * - Replay one seed (prints its trace): `STRATA_SIM_SEED=N ./dev exec vitest run --project unit packages/replica/test/ClusterSimulation.test.ts`
 * - A planted bug: add `STRATA_SIM_VARIANT=truncate-to-hw` (or `hw-under-min-isr`, `isr-to-dead-server`,
 *   `prefer-outside-isr`, `demoted-long-poll`, `stale-isr-answer`, `random-producer-id`, `unfenced-log-end`,
 *   `fenced-refusal-rejects`, `remove-before-isr`: a move that finishes before its new replicas are in the ISR, the
 *   leaving ones deleted; every seed of that variant moves replica sets, while `demoted-long-poll` and
 *   `fenced-refusal-rejects` move none; `delete-unwaited`: a delete answered before the followers' starts reached
 *   it, `delete-alone`: a delete answered by a leader alone in its ISR, and `start-not-raised`: a leader that never
 *   takes its followers' later log starts, every seed of the three deleting and none of the others).
 *   The rebalance family's planted bugs: `gate-ignored` (the executor never sees the cluster unhealthy) and
 *   `rollback-skipped` (a failed gate pauses with the batch's moves left running); every seed of those runs it.
 * - Which seeds run the rebalance family: `STRATA_SIM_REBALANCES=none|some|every` (some: a third of those that do
 *   not move replica sets by hand).
 * - More seeds: `STRATA_SIM_SEEDS=N` (count), `STRATA_SIM_FIRST_SEED=M` (where the range starts); `./dev soak:sim`
 *   runs 5000 of the correct variant and the rebalance family (opt-in: hours on a 2-core machine).
 * - The rebalance family's seeds (the first 500 of the range) run in `ClusterSimulationRebalancing.test.ts`, the planted bugs in
 *   `ClusterSimulationPlanted.test.ts` (split by variant so the test runner's workers run them side by side).
 * - The processes' info and warning lines in a replayed trace: `STRATA_SIM_LOG=info`.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Sim from "./sim/ClusterSim.js"
import * as Seeds from "./sim/Seeds.js"

const variant = Seeds.selectedVariant()

describe("deterministic simulation of a replicated cluster", () => {
  it.effect(
    `nothing acknowledged lost, one leader per epoch, replicas agree, the cluster settles (${Seeds.title}) [${variant.name}]`,
    () =>
      Effect.gen(function* () {
        const totals = { acked: 0, failed: 0, unknown: 0, reads: 0, leaderChanges: 0, coordinatorEpochs: 0 }
        const faults: Record<string, number> = {}
        const failures = yield* Seeds.runAll(variant, (result) => {
          totals.acked += result.stats.acked
          totals.failed += result.stats.failed
          totals.unknown += result.stats.unknown
          totals.reads += result.stats.reads
          totals.leaderChanges += result.stats.leaderChanges
          totals.coordinatorEpochs += result.stats.coordinatorEpochs
          for (const [k, n] of Object.entries(result.stats.faults)) faults[k] = (faults[k] ?? 0) + n
        })
        console.log(
          `${variant.name}: ${Seeds.seeds.length} seeds, ${failures.length} failed; ${JSON.stringify(totals)}; faults ${JSON.stringify(faults)}`
        )
        Seeds.assertNoFailures(failures)
      }),
    600_000
  )

  it.effect("the same seed gives the same history", () =>
    Effect.gen(function* () {
      const first = Seeds.firstSeed
      for (const seed of [first, first + 1]) {
        const a = yield* Sim.run(seed)
        const b = yield* Sim.run(seed)
        assert.deepStrictEqual(b.trace, a.trace, `seed=${seed}`)
        assert.deepStrictEqual(b.stats, a.stats, `seed=${seed}`)
      }
      assert.notDeepEqual((yield* Sim.run(first + 2)).trace, (yield* Sim.run(first)).trace)
      // The rebalance service too (its ids drawn from the seed).
      const r1 = yield* Sim.run(first, Sim.rebalancing)
      const r2 = yield* Sim.run(first, Sim.rebalancing)
      assert.deepStrictEqual(r2.trace, r1.trace)
      assert.deepStrictEqual(r2.stats, r1.stats)
    })
  )
})
