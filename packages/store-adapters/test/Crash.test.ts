/**
 * Crash consistency of the LevelDB and RocksDB stores under `kill -9` (docs/ARCHITECTURE.md, "Real-process tests": after
 * any crash and restart the store equals a replay of its changelog up to the persisted offset).
 *
 * Method. A child process (`crash/child.ts`) writes deterministic batches to one partition store, forever: batch n
 * is a function of (seed, n) only and is written atomically with persisted offset n. Each round spawns the child on
 * the same directory, kills it with SIGKILL after a seeded random delay (mostly 0–150 ms after it reported `ready`,
 * sometimes counted from the spawn so that kills also land while it loads or opens the database), waits for it to
 * exit, then opens the directory in this process and checks:
 *   - the full scan equals, entry by entry, an in-memory replay of batches 0..p, where p is the persisted offset the
 *     store reports (empty when none): a torn batch, or an offset ahead of or behind its data, shows up as a diff;
 *   - p never goes backwards between rounds, p is at least the last batch the child acknowledged (the adapters
 *     promise that a process crash loses nothing), and at most one batch beyond it (one write in flight);
 *   - the child restarted at the batch after the last verified one.
 * The replay is incremental across rounds (p only grows), so a round costs one spawn, one open and one scan.
 * Progress is checked too (enough batches written, kills after `ready` and during the open) so the test cannot pass
 * vacuously, and a self-test runs the same checker against deliberately torn writers (`--torn=offset-first` and
 * `--torn=data-first`: offset and data in two separate batches) and requires it to report a mismatch.
 *
 * Damaged files rather than killed writers (`CURRENT` removed, bytes overwritten in a table or a log, a log cut
 * short) are `Corruption.test.ts`'s, on the same two backends; the check LevelDB's store runs at open must let every
 * directory a kill leaves here open, and it does (a torn last log record is a crash, not damage).
 *
 * Speed: the child is bundled once with esbuild so that it starts in ~0.1 s instead of
 * ~0.5 s under the tsx loader; STRATA_CRASH_RUNNER=tsx forces the tsx loader (also the fallback).
 * Knobs: STRATA_CRASH_SEED (workload and kill schedule), STRATA_CRASH_ROUNDS (kills per backend, default 150),
 * STRATA_CRASH_BUDGET_MS (wall-time cap per backend, default 150000; the test fails when it is reached before
 * min(100, rounds) kills). Kill timing is real time, so a seed fixes the workload and the schedule, not the exact
 * instants the kills land.
 */
import type { Store } from "@strata/core"
import { childHarness, envInt, rerunCommand } from "../../../scripts/test-support/childRun.js"
import { BACKENDS, type BackendName, childArgv, openPartition } from "../../../scripts/test-support/crashChild.js"
import { mix32, prng } from "../../../scripts/test-support/prng.js"
import {
  type KillSummary,
  killRounds,
  killTests,
  RoundViolation,
  tempDirectory
} from "../../../scripts/test-support/killRounds.js"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { assert, describe } from "@effect/vitest"
import { Effect, Option, Stream } from "effect"
import { batch, CHANGELOG, describeValue, loadAdapter, STORE_ID, TORN_MODES, type TornMode } from "./crash/child.js"

// ---------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------

const SEED = envInt("STRATA_CRASH_SEED", 20_261_129)
const ROUNDS = envInt("STRATA_CRASH_ROUNDS", 150)
/** Fewer kills than this within the budget fails the test. */
const MIN_KILLS = Math.min(100, ROUNDS)
const BUDGET_MS = envInt("STRATA_CRASH_BUDGET_MS", 150_000)
/** Rounds the torn-writer self-test may take to be caught. */
const TORN_ROUNDS = 60
/** The final persisted offset must reach at least this. */
const MIN_FINAL_OFFSET = 200
/** The kinds of kills: 10% from the spawn, 15% from `opening`, 10% at `ready`, the rest 0–150 ms after `ready`. */
const MIX = { spawn: 0.1, opening: 0.25, ready: 0.35, maxRunMs: 150 }

const rerun = (seed: number) =>
  rerunCommand({
    seedVar: "STRATA_CRASH_SEED",
    seed,
    project: "unit",
    file: "packages/store-adapters/test/Crash.test.ts"
  })

// ---------------------------------------------------------------------------
// The child program: bundled once (fast start) or run under the tsx loader
// ---------------------------------------------------------------------------

const here = dirname(fileURLToPath(import.meta.url))
const childSource = join(here, "crash", "child.ts")

const harness = childHarness({
  label: "crash test",
  source: childSource,
  external: ["classic-level", "@nxtedition/rocksdb"],
  preferTsx: process.env.STRATA_CRASH_RUNNER === "tsx"
})

// ---------------------------------------------------------------------------
// The checker: the store after a crash against the replay
// ---------------------------------------------------------------------------

type ViolationKind = "unreadable" | "wrong-start" | "offset-regressed" | "acked-lost" | "offset-ahead" | "mismatch"

/** The store broke a crash-consistency property. */
class CrashViolation extends RoundViolation<ViolationKind>() {}

/** Opens the directory in this process and reads the persisted offset and every entry; closes it again. */
const inspect = (backend: BackendName, directory: string) =>
  Effect.scoped(
    Effect.gen(function* () {
      const partition = yield* openPartition(() => loadAdapter(backend), directory, STORE_ID)
      const persisted = yield* partition.persistedOffset(CHANGELOG)
      const entries = yield* Stream.runCollect(partition.scan())
      return { persisted: Option.getOrUndefined(persisted), entries }
    })
  )

const latin1 = (bytes: Uint8Array) => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("latin1")
const sameBytes = (a: Uint8Array, b: Uint8Array) => Buffer.compare(a, b) === 0

/** The in-memory replay of batches 0..last; advanced incrementally. */
class Replay {
  last = -1
  readonly data = new Map<string, Uint8Array>()
  constructor(readonly seed: number) {}
  advanceTo(p: number) {
    for (let n = this.last + 1; n <= p; n++) {
      for (const op of batch(this.seed, n)) {
        if (op._tag === "put") this.data.set(latin1(op.key), op.value)
        else this.data.delete(latin1(op.key))
      }
    }
    this.last = Math.max(this.last, p)
  }
}

/** Differences between the replay and a scan (which must be in ascending key order); the first few, described. */
const compare = (expected: Map<string, Uint8Array>, actual: ReadonlyArray<Store.Entry>) => {
  const shown: Array<string> = []
  let count = 0
  const note = (text: string) => {
    count++
    if (shown.length < 6) shown.push(text)
  }
  const keys = Array.from(expected.keys()).sort()
  for (let j = 1; j < actual.length; j++) {
    if (Buffer.compare(actual[j - 1]![0], actual[j]![0]) >= 0) {
      note(`scan out of order at ${j}: ${latin1(actual[j - 1]![0])} then ${latin1(actual[j]![0])}`)
    }
  }
  let i = 0
  let j = 0
  while (i < keys.length || j < actual.length) {
    const ek = keys[i]
    const entry = actual[j]
    const ak = entry === undefined ? undefined : latin1(entry[0])
    if (ak === undefined || (ek !== undefined && ek < ak)) {
      note(`missing ${ek}: expected ${describeValue(expected.get(ek!)!)}`)
      i++
    } else if (ek === undefined || ak < ek) {
      note(`unexpected ${ak}: ${describeValue(entry![1])}`)
      j++
    } else {
      const ev = expected.get(ek)!
      if (!sameBytes(ev, entry![1])) note(`${ek}: expected ${describeValue(ev)}, found ${describeValue(entry![1])}`)
      i++
      j++
    }
  }
  return { count, shown }
}

interface Summary extends KillSummary<CrashViolation> {
  /** Mid-run kills that landed after a batch was committed but before the child acknowledged it. */
  readonly committedNotAcked: number
  /** Mid-run kills that landed before the run had acknowledged any batch. */
  readonly midRunBeforeFirstAck: number
  readonly finalOffset: number
  readonly entries: number
  readonly meanInspectMs: number
}

/**
 * Runs kill rounds on a fresh directory until `rounds` are done, the budget is spent, or a violation is found.
 * Harness problems fail the effect; violations are returned in the summary.
 */
const crashLoop = (options: {
  readonly backend: BackendName
  readonly seed: number
  readonly rounds: number
  readonly budgetMs: number
  readonly torn: TornMode | undefined
}) =>
  Effect.gen(function* () {
    const { backend, seed } = options
    const directory = yield* tempDirectory(`strata-crash-${backend}-`)
    const replay = new Replay(seed)
    const childArgs = childArgv({ backend, directory, seed, torn: options.torn })
    let verified = -1
    let committedNotAcked = 0
    let midRunBeforeFirstAck = 0
    let inspectMsTotal = 0
    let entries = 0

    const result = yield* killRounds({
      harness,
      rounds: options.rounds,
      budgetMs: options.budgetMs,
      schedule: prng(mix32(seed ^ mix32(BACKENDS.indexOf(backend) + 1))),
      mix: MIX,
      args: () => childArgs,
      // `ready <n>`: the first batch of this run.
      parseReady: Number,
      Violation: CrashViolation,
      check: ({ outcome, violation }) =>
        Effect.gen(function* () {
          if (outcome.ready !== undefined && outcome.ready !== verified + 1) {
            return violation(
              "wrong-start",
              `the child started at batch ${outcome.ready}, but batch ${verified} was the last verified`
            )
          }

          const inspectStarted = performance.now()
          const snapshot = yield* Effect.result(inspect(backend, directory))
          inspectMsTotal += performance.now() - inspectStarted
          if (snapshot._tag === "Failure") {
            return violation("unreadable", `opening the store after the kill failed: ${snapshot.failure.message}`)
          }
          const p = snapshot.success.persisted ?? -1
          const acked = outcome.lastAcked
          if (outcome.ready !== undefined) {
            if (acked === undefined) midRunBeforeFirstAck++
            if (p === (acked ?? verified) + 1) committedNotAcked++
          }
          if (p < verified) {
            return violation(
              "offset-regressed",
              `persisted offset ${p} is behind ${verified}, verified before this kill`
            )
          }
          if (acked !== undefined && p < acked) {
            return violation(
              "acked-lost",
              `persisted offset ${p}, but the child had acknowledged batch ${acked} before the kill`
            )
          }
          if (p > (acked ?? verified) + 1) {
            return violation(
              "offset-ahead",
              `persisted offset ${p}, but the child could have written at most ${(acked ?? verified) + 1}`
            )
          }
          replay.advanceTo(p)
          const diff = compare(replay.data, snapshot.success.entries)
          if (diff.count > 0) {
            return violation(
              "mismatch",
              `the store (persisted offset ${p === -1 ? "none" : p}, ${snapshot.success.entries.length} entries) differs ` +
                `from the replay of batches 0..${p} (${replay.data.size} entries) in ${diff.count} place(s):\n  ` +
                diff.shown.join("\n  ")
            )
          }
          verified = p
          entries = snapshot.success.entries.length
          return undefined
        })
    })

    const summary: Summary = {
      backend,
      runner: harness.runner.kind,
      seed,
      rounds: result.rounds,
      ...result.kills,
      committedNotAcked,
      midRunBeforeFirstAck,
      finalOffset: verified,
      entries,
      ...result.timing,
      meanInspectMs: Math.round(inspectMsTotal / Math.max(1, result.rounds)),
      violation: result.violation
    }
    return summary
  }).pipe(Effect.scoped)

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

describe("crash consistency under kill -9", () => {
  killTests({
    name: "crash",
    harness,
    tornModes: TORN_MODES,
    rounds: ROUNDS,
    tornRounds: TORN_ROUNDS,
    timeoutMs: () => BUDGET_MS + 60_000,
    rerun: rerun(SEED),
    title: (backend) => `${backend}: after every kill the store equals the replay up to its persisted offset`,
    tornTitle: (backend, torn) =>
      `${backend}: the checker catches a writer that persists the offset apart from the data (${torn})`,
    tornChild: "writer",
    loop: (backend, rounds, torn) => crashLoop({ backend, seed: SEED, rounds, budgetMs: BUDGET_MS, torn }),
    progress: (s, context) => {
      assert.isTrue(
        s.rounds >= MIN_KILLS,
        `only ${s.rounds} kills (at least ${MIN_KILLS} needed) fit in the ${BUDGET_MS} ms budget: ` +
          `the machine or the harness is too slow (${context})`
      )
      assert.isTrue(
        s.finalOffset >= MIN_FINAL_OFFSET,
        `too little progress: final offset ${s.finalOffset} (${context})`
      )
      assert.isTrue(s.killsMidRun >= s.rounds / 3, `too few kills landed while writing (${context})`)
      assert.isTrue(s.killsDuringOpen >= 1, `no kill landed while the database was opening (${context})`)
    }
  })
})
