/**
 * Deterministic simulation of a whole replicated cluster (`sim/ClusterSim.ts`; its checkers in `sim/Checkers.ts`).
 * About a third of the others run the rebalance service (`sim/Rebalances.ts`: its trigger and executor under the
 * faults, started, paused, resumed and cancelled at random; the per-server and cluster limits, the gate and a paused
 * rebalance's tablets checked after every step, every rebalance resumed and ended once the faults stop).
 * About half the seeds also move replica sets (`sim/Reassignments.ts`: moves, bad requests that must be refused,
 * cancels, and faults aimed at a move's controller, leader, leaving and adding replicas); the moves are checked too
 * (each completed or cancelled, none left once the faults stop, a moving tablet's ISR never below its size at the
 * move's start while no fault is in force, every replica where coordination assigns it once settled), and their
 * counts are among the faults the run prints (`reassign*`, `cancel*`, `move-*`).
 *
 * - Replay one seed (prints its trace): `STRATA_SIM_SEED=N ./dev exec vitest run --project unit packages/replica/test/ClusterSimulation.test.ts`
 * - A planted bug: add `STRATA_SIM_VARIANT=truncate-to-hw` (or `hw-under-min-isr`, `isr-to-dead-server`,
 *   `prefer-outside-isr`, `demoted-long-poll`, `stale-isr-answer`, `random-producer-id`, `unfenced-log-end`,
 *   `fenced-refusal-rejects`, `remove-before-isr`: a move that finishes before its new replicas are in the ISR, the
 *   leaving ones deleted; every seed of that variant moves replica sets, while `demoted-long-poll` and
 *   `fenced-refusal-rejects` move none).
 *   The rebalance family's planted bugs: `gate-ignored` (the executor never sees the cluster unhealthy) and
 *   `rollback-skipped` (a failed gate pauses with the batch's moves left running); every seed of those runs it.
 * - Which seeds run the rebalance family: `STRATA_SIM_REBALANCES=none|some|every` (some: a third of those that do
 *   not move replica sets by hand).
 * - More seeds: `STRATA_SIM_SEEDS=N` (count), `STRATA_SIM_FIRST_SEED=M` (where the range starts).
 * - The processes' info and warning lines in a replayed trace: `STRATA_SIM_LOG=info`.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { envInt } from "../../../scripts/test-support/childRun.js"
import * as Sim from "./sim/ClusterSim.js"

const firstSeed = envInt("STRATA_SIM_FIRST_SEED", 1)
const seedCount = envInt("STRATA_SIM_SEEDS", 1000)
/**
 * Seeds beyond the range that once failed the correct system, run with it (2027: a fenced ISR answer cleared a
 * committed expansion; 1657: a leader whose session ended went on acknowledging after a recovery election asked its
 * log end).
 */
const regressions = [1657, 2027]
const range = [
  ...Array.from({ length: seedCount }, (_, i) => firstSeed + i),
  ...regressions.filter((s) => s < firstSeed || s >= firstSeed + seedCount)
]
const replaySeed = process.env.STRATA_SIM_SEED === undefined ? undefined : envInt("STRATA_SIM_SEED", 0)
const variants = [Sim.correct, Sim.rebalancing, ...Sim.planted]
const variant = variants.find((v) => v.name === (process.env.STRATA_SIM_VARIANT ?? Sim.correct.name))
if (variant === undefined)
  throw new Error(`STRATA_SIM_VARIANT must be one of ${variants.map((v) => v.name).join(", ")}`)

describe("deterministic simulation of a replicated cluster", () => {
  it.effect(
    `nothing acknowledged lost, one leader per epoch, replicas agree, the cluster settles (${replaySeed === undefined ? `${range.length} seeds` : `seed=${replaySeed}`}) [${variant.name}]`,
    () =>
      Effect.gen(function* () {
        const seeds = replaySeed === undefined ? range : [replaySeed]
        const failures: Array<Sim.Result> = []
        const totals = { acked: 0, failed: 0, unknown: 0, reads: 0, leaderChanges: 0, coordinatorEpochs: 0 }
        const faults: Record<string, number> = {}
        for (const seed of seeds) {
          const result = yield* Sim.run(seed, variant)
          if (replaySeed !== undefined)
            console.log(`${result.trace.join("\n")}\nstats: ${JSON.stringify(result.stats)}`)
          if (result.violations.length > 0) failures.push(result)
          totals.acked += result.stats.acked
          totals.failed += result.stats.failed
          totals.unknown += result.stats.unknown
          totals.reads += result.stats.reads
          totals.leaderChanges += result.stats.leaderChanges
          totals.coordinatorEpochs += result.stats.coordinatorEpochs
          for (const [k, n] of Object.entries(result.stats.faults)) faults[k] = (faults[k] ?? 0) + n
        }
        console.log(
          `${variant.name}: ${seeds.length} seeds, ${failures.length} failed; ${JSON.stringify(totals)}; faults ${JSON.stringify(faults)}`
        )
        const first = failures[0]
        if (first !== undefined) {
          assert.fail(
            `${failures.length} of ${seeds.length} seeds failed (${failures
              .slice(0, 20)
              .map((f) => f.seed)
              .join(", ")})\n${Sim.describeFailure(first)}`
          )
        }
      }),
    600_000
  )

  it.effect(
    `rebalances under faults end completed, cancelled or resumed to an end, within the limits, gated, nothing lost (${replaySeed === undefined ? `${range.length} seeds` : `seed=${replaySeed}`}) [rebalancing]`,
    () =>
      Effect.gen(function* () {
        if (variant !== Sim.correct && variant !== Sim.rebalancing) return
        const seeds = replaySeed === undefined ? range : [replaySeed]
        const failures: Array<Sim.Result> = []
        const faults: Record<string, number> = {}
        for (const seed of seeds) {
          const result = yield* Sim.run(seed, Sim.rebalancing)
          if (replaySeed !== undefined && variant === Sim.rebalancing)
            console.log(`${result.trace.join("\n")}\nstats: ${JSON.stringify(result.stats)}`)
          if (result.violations.length > 0) failures.push(result)
          for (const [k, n] of Object.entries(result.stats.faults))
            if (k.startsWith("rebalance")) faults[k] = (faults[k] ?? 0) + n
        }
        console.log(`rebalancing: ${seeds.length} seeds, ${failures.length} failed; ${JSON.stringify(faults)}`)
        // The runs exercise the executor: rebalances end, moves are made, gates fail and batches roll back.
        if (replaySeed === undefined) {
          assert.isAbove(faults["rebalance-moves-done"] ?? 0, seeds.length / 4)
          assert.isAbove(faults["rebalance-rollbacks"] ?? 0, 10)
        }
        const first = failures[0]
        if (first !== undefined)
          assert.fail(
            `${failures.length} of ${seeds.length} seeds failed (${failures
              .slice(0, 20)
              .map((f) => f.seed)
              .join(", ")})\n${Sim.describeFailure(first)}`
          )
      }),
    600_000
  )

  it.effect("the same seed gives the same history", () =>
    Effect.gen(function* () {
      for (const seed of [firstSeed, firstSeed + 1]) {
        const a = yield* Sim.run(seed)
        const b = yield* Sim.run(seed)
        assert.deepStrictEqual(b.trace, a.trace, `seed=${seed}`)
        assert.deepStrictEqual(b.stats, a.stats, `seed=${seed}`)
      }
      assert.notDeepEqual((yield* Sim.run(firstSeed + 2)).trace, (yield* Sim.run(firstSeed)).trace)
      // The rebalance service too (its ids drawn from the seed).
      const r1 = yield* Sim.run(firstSeed, Sim.rebalancing)
      const r2 = yield* Sim.run(firstSeed, Sim.rebalancing)
      assert.deepStrictEqual(r2.trace, r1.trace)
      assert.deepStrictEqual(r2.stats, r1.stats)
    })
  )

  /**
   * What each planted bug must be caught as: a loss, a divergence or a liveness failure (or, for the HW rule, the
   * HW held by fewer than the minimum ISR), never a checker that re-implements the check the bug removes.
   */
  const lossDivergenceOrLiveness = [
    "is lost",
    "differ at offset",
    "has no record at offset",
    "a consumer read",
    "not settled",
    "was not acknowledged"
  ]
  const caughtAs: Record<string, ReadonlyArray<string>> = {
    "truncate-to-hw": lossDivergenceOrLiveness,
    "hw-under-min-isr": ["fewer than"],
    "isr-to-dead-server": lossDivergenceOrLiveness,
    "prefer-outside-isr": lossDivergenceOrLiveness,
    "demoted-long-poll": lossDivergenceOrLiveness,
    "stale-isr-answer": lossDivergenceOrLiveness,
    "random-producer-id": lossDivergenceOrLiveness,
    "unfenced-log-end": lossDivergenceOrLiveness,
    "fenced-refusal-rejects": lossDivergenceOrLiveness,
    "remove-before-isr": lossDivergenceOrLiveness,
    // The rebalance's gate is no safety rule of the data: its bugs are caught by the family's own checks (a
    // rebalance that ran on past an unhealthy cluster; one paused with its batch still moving).
    "gate-ignored": ["went on running batch"],
    "rollback-skipped": ["still moving"]
  }
  // A planted bug is looked for until its first catch, over at least 3000 seeds: some show only on rare histories.
  const plantedRange = Array.from({ length: Math.max(seedCount, 3000) }, (_, i) => firstSeed + i)
  for (const planted of Sim.planted) {
    it.effect(
      `the planted bug ${planted.name} is caught on some seed`,
      () =>
        Effect.gen(function* () {
          for (const seed of plantedRange) {
            const result = yield* Sim.run(seed, planted)
            const hit = result.violations.find((v) => caughtAs[planted.name]!.some((c) => v.includes(c)))
            if (hit !== undefined) {
              console.log(`${planted.name}: caught at seed ${seed}: ${hit}`)
              return
            }
          }
          assert.fail(`${planted.name} was not caught in ${plantedRange.length} seeds`)
        }),
      1_200_000
    )
  }
})
