/**
 * The seeds the cluster simulation files run (`STRATA_SIM_SEEDS`, `STRATA_SIM_FIRST_SEED`, `STRATA_SIM_SEED`), and
 * the loop each runs them with. The simulation is split over files by variant so that the test runner's workers run
 * them side by side.
 */
import { assert } from "@effect/vitest"
import { Effect } from "effect"
import { envInt } from "../../../../scripts/test-support/childRun.js"
import * as Sim from "./ClusterSim.js"

/** Where the seed range starts. */
export const firstSeed = envInt("STRATA_SIM_FIRST_SEED", 1)
/** How many seeds a correct variant runs. */
export const seedCount = envInt("STRATA_SIM_SEEDS", 1000)
/**
 * Seeds beyond the range that once failed the correct system, run with it (2027: a fenced ISR answer cleared a
 * committed expansion; 1657: a leader whose session ended went on acknowledging after a recovery election asked its
 * log end).
 */
const regressions = [1657, 2027]
/** The range, and the regression seeds outside it. */
export const range: ReadonlyArray<number> = [
  ...Array.from({ length: seedCount }, (_, i) => firstSeed + i),
  ...regressions.filter((s) => s < firstSeed || s >= firstSeed + seedCount)
]
/**
 * How many seeds of the range the rebalance family's file runs (`STRATA_SIM_REBALANCING_SEEDS`; half the range by
 * default: the family also runs on a third of the correct variant's seeds, and its seeds are the slowest).
 */
export const rebalancingCount = envInt("STRATA_SIM_REBALANCING_SEEDS", Math.ceil(seedCount / 2))
/** The one seed to replay, printing its trace. */
export const replaySeed = process.env.STRATA_SIM_SEED === undefined ? undefined : envInt("STRATA_SIM_SEED", 0)
/** The seeds a correct variant runs: the replayed one, or the range. */
export const seeds: ReadonlyArray<number> = replaySeed === undefined ? range : [replaySeed]
/** The seeds the rebalance family's file runs: the replayed one, or the first `rebalancingCount` of the range. */
export const rebalancingSeeds: ReadonlyArray<number> =
  replaySeed === undefined ? range.slice(0, rebalancingCount) : [replaySeed]
/** How the seeds are named in a test's title. */
export const title = replaySeed === undefined ? `${range.length} seeds` : `seed=${replaySeed}`

/** The variant `STRATA_SIM_VARIANT` names (the correct system by default). */
export const selectedVariant = (): Sim.Variant => {
  const variants = [Sim.correct, Sim.rebalancing, ...Sim.planted]
  const variant = variants.find((v) => v.name === (process.env.STRATA_SIM_VARIANT ?? Sim.correct.name))
  if (variant === undefined)
    throw new Error(`STRATA_SIM_VARIANT must be one of ${variants.map((v) => v.name).join(", ")}`)
  return variant
}

/**
 * Runs `variant` on every seed of `among` (`seeds` unless given), handing each result to `each` (a replayed seed's trace printed first);
 * the failed seeds' results.
 */
export const runAll = (
  variant: Sim.Variant,
  each: (result: Sim.Result) => void = () => {},
  among: ReadonlyArray<number> = seeds
): Effect.Effect<ReadonlyArray<Sim.Result>> =>
  Effect.gen(function* () {
    const failures: Array<Sim.Result> = []
    for (const seed of among) {
      const result = yield* Sim.run(seed, variant)
      if (replaySeed !== undefined) console.log(`${result.trace.join("\n")}\nstats: ${JSON.stringify(result.stats)}`)
      if (result.violations.length > 0) failures.push(result)
      each(result)
    }
    return failures
  })

/** Fails with the first failed seed described and the command that replays it. */
export const assertNoFailures = (failures: ReadonlyArray<Sim.Result>, among: ReadonlyArray<number> = seeds): void => {
  const first = failures[0]
  if (first !== undefined)
    assert.fail(
      `${failures.length} of ${among.length} seeds failed (${failures
        .slice(0, 20)
        .map((f) => f.seed)
        .join(", ")})\n${Sim.describeFailure(first)}`
    )
}
