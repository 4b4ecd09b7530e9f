/**
 * Deterministic simulation of the fenced election (docs/ARCHITECTURE.md, "Election simulation"; the
 * simulator is `sim/Simulator.ts`, the checkers `sim/Checkers.ts`).
 *
 * Every run checks 1000 seeds (seeds 1..1000) of 3–5 coordinator processes (each a real `Coordinator`) with
 * crashes, stops, session expiry, pauses longer than the session, short pauses
 * and delayed messages (also between the operations of a campaign or a write):
 * at most one leader per epoch, no request or fenced write accepted with a
 * stale epoch, no request sent after the sender's session expired on the
 * server (its deadline must stop it first), and a live leader once the faults
 * are over. Planted bugs must be caught over the same seeds, proving the
 * checkers can fail. Each seed also draws how the backend treats a write from an
 * already-expired session (`Simulator.Backend`): rejected (ZooKeeper-like), or
 * applied unless a compare in the transaction stops it (etcd-like).
 *
 * A failing seed prints `seed=N` with its violations and the end of its trace.
 * - Replay one seed (prints its whole trace):
 *   `STRATA_SIM_SEED=N ./dev exec vitest run --project unit packages/election/test/Simulation.test.ts`
 * - Run the first test with a broken variant: add `STRATA_SIM_VARIANT=receiver-skips-epoch-check`
 *   (or `skip-epoch-bump`, `skip-fence-check`, `skip-deadline`).
 * - More seeds: `STRATA_SIM_SEEDS=10000` (count), `STRATA_SIM_FIRST_SEED=M` (where the range starts).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Simulator from "./sim/Simulator.js"

const receiverSkipsEpochCheck: Simulator.Variant = {
  name: "receiver-skips-epoch-check",
  receiverSkipsEpochCheck: true
}
const skipEpochBump: Simulator.Variant = { name: "skip-epoch-bump", unsafe: { skipEpochBump: true } }
const skipFenceCheck: Simulator.Variant = { name: "skip-fence-check", unsafe: { skipFenceCheck: true } }
const skipDeadline: Simulator.Variant = { name: "skip-deadline", unsafe: { skipDeadline: true } }
const variants: ReadonlyArray<Simulator.Variant> = [
  Simulator.correct,
  receiverSkipsEpochCheck,
  skipEpochBump,
  skipFenceCheck,
  skipDeadline
]

const envInt = (name: string, fallback: number): number => {
  const raw = process.env[name]
  if (raw === undefined || raw === "") return fallback
  const n = Number(raw)
  if (!Number.isSafeInteger(n)) throw new Error(`${name} must be an integer, got ${JSON.stringify(raw)}`)
  return n
}

const firstSeed = envInt("STRATA_SIM_FIRST_SEED", 1)
const seedCount = envInt("STRATA_SIM_SEEDS", 1000)
/** The seed range every check runs over. */
const range: ReadonlyArray<number> = Array.from({ length: seedCount }, (_, i) => firstSeed + i)
const replaySeed = process.env.STRATA_SIM_SEED === undefined ? undefined : envInt("STRATA_SIM_SEED", 0)
const replayVariantName = process.env.STRATA_SIM_VARIANT ?? Simulator.correct.name
const replayVariant = variants.find((v) => v.name === replayVariantName)
if (replayVariant === undefined) {
  throw new Error(`STRATA_SIM_VARIANT must be one of ${variants.map((v) => v.name).join(", ")}`)
}

/** About 10 ms a seed on this machine; allow ten times that. */
const timeoutFor = (seeds: number) => Math.max(30_000, seeds * 100)

/** Runs the seeds in order and returns the first result `caught` accepts, if any. */
const firstCaught = (variant: Simulator.Variant, caught: (violation: string) => boolean) =>
  Effect.gen(function* () {
    for (const seed of range) {
      const result = yield* Simulator.run(seed, variant)
      if (result.violations.some(caught)) return result
    }
    return undefined
  })

describe("deterministic simulation of the fenced election", () => {
  it.effect(
    `at most one leader per epoch and no write accepted with a stale epoch (${replaySeed === undefined ? `${range.length} seeds from ${firstSeed}` : `seed=${replaySeed}`})${replayVariant.name === Simulator.correct.name ? "" : ` [${replayVariant.name}]`}`,
    () =>
      Effect.gen(function* () {
        const seeds = replaySeed === undefined ? range : [replaySeed]
        const variant = replayVariant
        const failures: Array<Simulator.Result> = []
        const totals = { wins: 0, accepted: 0, rejected: 0, fencedApplied: 0, fencedRejected: 0 }
        const leaderless: Array<number> = []
        const faults = Simulator.noFaults()
        for (const seed of seeds) {
          const result = yield* Simulator.run(seed, variant)
          if (replaySeed !== undefined) {
            console.log(`${result.trace.join("\n")}\nstats: ${JSON.stringify(result.stats)}`)
          }
          if (result.violations.length > 0) failures.push(result)
          if (result.stats.leaderless) leaderless.push(seed)
          totals.wins += result.stats.wins
          totals.accepted += result.stats.accepted
          totals.rejected += result.stats.rejected
          totals.fencedApplied += result.stats.fencedApplied
          totals.fencedRejected += result.stats.fencedRejected
          for (const kind of Object.keys(faults) as Array<Simulator.FaultKind>)
            faults[kind] += result.stats.faults[kind]
        }
        console.log(
          `${variant.name}: ${seeds.length} seeds, ${failures.length} failed, leaderless at the end: ${leaderless.length} (${leaderless.slice(0, 10).join(", ")}); ${JSON.stringify(totals)}; faults ${JSON.stringify(faults)}`
        )
        const first = failures[0]
        if (first !== undefined) {
          assert.fail(
            `${failures.length} of ${seeds.length} seeds failed (seeds ${failures
              .slice(0, 20)
              .map((f) => f.seed)
              .join(", ")}${failures.length > 20 ? ", ..." : ""})\n${Simulator.describeFailure(first)}`
          )
        }
        if (replaySeed === undefined && seeds.length >= 1000) {
          // The faults really exercised the fencing: failovers happened, stale requests arrived and were refused.
          assert.isAbove(totals.wins, seeds.length, JSON.stringify(totals))
          assert.isAbove(totals.rejected, 0, "no stale request ever reached the receiver")
          assert.isAbove(totals.fencedRejected, 0, "no fenced write was ever refused")
          for (const [kind, n] of Object.entries(faults)) assert.isAbove(n, 0, `no ${kind} fault was injected`)
        }
      }),
    timeoutFor(replaySeed === undefined ? range.length : 1)
  )

  it.effect("the same seed gives the same history", () =>
    Effect.gen(function* () {
      for (const seed of [firstSeed, firstSeed + 1]) {
        const a = yield* Simulator.run(seed)
        const b = yield* Simulator.run(seed)
        assert.deepStrictEqual(b.trace, a.trace, `seed=${seed}`)
        assert.deepStrictEqual(b.stats, a.stats, `seed=${seed}`)
      }
      const other = yield* Simulator.run(firstSeed + 2)
      assert.notDeepEqual(other.trace, (yield* Simulator.run(firstSeed)).trace)
    })
  )

  it.effect(
    "a receiver that skips its epoch check is caught accepting a stale request",
    () =>
      Effect.gen(function* () {
        const caught = yield* firstCaught(receiverSkipsEpochCheck, (v) =>
          v.startsWith("receiver accepted a stale epoch")
        )
        assert.isDefined(caught, `not caught over seeds ${firstSeed}..${firstSeed + range.length - 1}`)
        if (caught === undefined) return
        console.log(`${receiverSkipsEpochCheck.name} caught at seed=${caught.seed}: ${caught.violations[0]}`)
        // The same seed passes with the check on: the planted bug is what the checker saw.
        assert.deepStrictEqual((yield* Simulator.run(caught.seed)).violations, [])
      }),
    timeoutFor(range.length)
  )

  it.effect(
    "an election that skips the epoch bump is caught with two leaders in one epoch",
    () =>
      Effect.gen(function* () {
        const caught = yield* firstCaught(skipEpochBump, (v) => v.startsWith("two leaders in epoch"))
        assert.isDefined(caught, `not caught over seeds ${firstSeed}..${firstSeed + range.length - 1}`)
        if (caught === undefined) return
        console.log(`${skipEpochBump.name} caught at seed=${caught.seed}: ${caught.violations[0]}`)
        assert.deepStrictEqual((yield* Simulator.run(caught.seed)).violations, [])
      }),
    timeoutFor(range.length)
  )

  // Without the fence check a stale leader's write is stopped only if the backend ties every write to the
  // session. A ZooKeeper-like backend does (the write fails with SessionExpired), which masks the missing check;
  // an etcd-like backend applies a lease-free write from a client that has not yet noticed its lease is gone,
  // and then only the compare in the transaction stops it.
  it.effect(
    "an election that skips the fence check is caught on an etcd-like backend (a ZooKeeper-like one masks it)",
    () =>
      Effect.gen(function* () {
        const caught = yield* firstCaught(skipFenceCheck, (v) => v.includes("while the epoch node held"))
        assert.isDefined(caught, `not caught over seeds ${firstSeed}..${firstSeed + range.length - 1}`)
        if (caught === undefined) return
        console.log(`${skipFenceCheck.name} caught at seed=${caught.seed}: ${caught.violations[0]}`)
        assert.strictEqual(caught.backend, "etcd-like")
        assert.deepStrictEqual((yield* Simulator.run(caught.seed)).violations, [])
      }),
    timeoutFor(range.length)
  )

  // Without the deadline a leader that resumes from a pause longer than its session sends with its old epoch before
  // it learns the session expired (the receiver's epoch check may still refuse it; the deadline checker does not
  // depend on that).
  it.effect(
    "a leadership that ignores its deadline is caught acting after its session expired",
    () =>
      Effect.gen(function* () {
        const caught = yield* firstCaught(skipDeadline, (v) => v.includes("after its session"))
        assert.isDefined(caught, `not caught over seeds ${firstSeed}..${firstSeed + range.length - 1}`)
        if (caught === undefined) return
        console.log(`${skipDeadline.name} caught at seed=${caught.seed}: ${caught.violations[0]}`)
        assert.deepStrictEqual((yield* Simulator.run(caught.seed)).violations, [])
      }),
    timeoutFor(range.length)
  )
})
