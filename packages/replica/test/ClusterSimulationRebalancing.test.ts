/**
 * The cluster simulation's rebalance family on the first half of the seed range (`STRATA_SIM_REBALANCING_SEEDS`;
 * `ClusterSimulation.test.ts` says how to replay and widen it, and `./dev soak:sim` runs 5000 seeds): every seed runs the rebalance service (`sim/Rebalances.ts`) under the faults; rebalances end completed,
 * cancelled or resumed to an end, within their limits and gated, with nothing lost.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Sim from "./sim/ClusterSim.js"
import * as Seeds from "./sim/Seeds.js"

const variant = Seeds.selectedVariant()

describe("deterministic simulation of a replicated cluster, rebalancing", () => {
  it.effect(
    `rebalances under faults end completed, cancelled or resumed to an end, within the limits, gated, nothing lost (${Seeds.replaySeed === undefined ? `${Seeds.rebalancingSeeds.length} seeds` : Seeds.title}) [rebalancing]`,
    () =>
      Effect.gen(function* () {
        // A replay of another variant's seed is not this file's to run.
        if (variant !== Sim.correct && variant !== Sim.rebalancing) return
        const faults: Record<string, number> = {}
        const among = Seeds.rebalancingSeeds
        const failures = yield* Seeds.runAll(
          Sim.rebalancing,
          (result) => {
            for (const [k, n] of Object.entries(result.stats.faults))
              if (k.startsWith("rebalance")) faults[k] = (faults[k] ?? 0) + n
          },
          among
        )
        console.log(`rebalancing: ${among.length} seeds, ${failures.length} failed; ${JSON.stringify(faults)}`)
        // The runs exercise the executor: rebalances end, moves are made, gates fail and batches roll back.
        if (Seeds.replaySeed === undefined) {
          assert.isAbove(faults["rebalance-moves-done"] ?? 0, among.length / 4)
          assert.isAbove(faults["rebalance-rollbacks"] ?? 0, among.length / 100)
        }
        Seeds.assertNoFailures(failures, among)
      }),
    900_000
  )
})
