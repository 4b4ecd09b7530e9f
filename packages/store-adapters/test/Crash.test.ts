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
import { below, prng } from "../../../scripts/test-support/prng.js"
import { childHarness, envInt, rerunCommand, runChild } from "../../../scripts/test-support/childRun.js"
import type { NodeRunner } from "../../../scripts/test-support/nodeRunner.js"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import type { Entry, StoreError, StoreShape } from "@strata/core"
import * as LevelStore from "@strata/store-adapters/level"
import * as RocksDbStore from "@strata/store-adapters/rocksdb"
import { Data, Effect, Option, type Scope, Stream } from "effect"
import {
  BACKENDS,
  type BackendName,
  batch,
  CHANGELOG,
  describeValue,
  mix32,
  STORE_ID,
  TORN_MODES,
  type TornMode
} from "./crash/child.js"

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
const READY_TIMEOUT_MS = 20_000
const EXIT_TIMEOUT_MS = 10_000
/** Kills counted from `ready`: 0 to this many ms. */
const MAX_RUN_MS = 150

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
// One round: spawn, (maybe wait for ready), kill -9, wait for exit
// ---------------------------------------------------------------------------

/** When to send SIGKILL: `delayMs` after the spawn, after the child printed `opening`, or after `ready`. */
interface KillPlan {
  readonly from: "spawn" | "opening" | "ready"
  readonly delayMs: number
}

interface RoundOutcome {
  /** The child printed `opening`: it had loaded and was opening the database. */
  readonly opening: boolean
  /** From `opening` to `ready`: how long the database took to open. */
  readonly openMs: number | undefined
  /** The first batch of this run, from `ready <n>`. */
  readonly readyFrom: number | undefined
  readonly spawnToReadyMs: number | undefined
  /** The last batch the child acknowledged in this run. */
  readonly lastAcked: number | undefined
}

const crashRound = (args: ReadonlyArray<string>, plan: KillPlan) => {
  let opening = false
  let openingAt = 0
  let openMs: number | undefined
  let readyFrom: number | undefined
  let spawnToReadyMs: number | undefined
  let lastAcked: number | undefined
  return runChild<RoundOutcome>({
    label: "child",
    harness,
    args,
    exitTimeoutMs: EXIT_TIMEOUT_MS,
    encoding: "latin1",
    onStart: (control) => {
      if (plan.from === "spawn") control.killAfter(plan.delayMs)
      control.after(READY_TIMEOUT_MS, () => {
        if (readyFrom === undefined && !control.killed()) {
          control.fail(`the child printed no "ready" within ${READY_TIMEOUT_MS} ms`)
        }
      })
    },
    onLine: (line, control) => {
      if (line.startsWith("w ")) {
        lastAcked = Number(line.slice(2))
      } else if (line === "opening") {
        opening = true
        openingAt = performance.now()
        if (plan.from === "opening") control.killAfter(plan.delayMs)
      } else if (line.startsWith("ready ")) {
        readyFrom = Number(line.slice(6))
        spawnToReadyMs = control.elapsed()
        openMs = performance.now() - openingAt
        if (plan.from === "ready") control.killAfter(plan.delayMs)
      }
    },
    onExit: ({ code, signal, killed }) =>
      killed
        ? { outcome: { opening, openMs, readyFrom, spawnToReadyMs, lastAcked } }
        : { failure: `the child exited by itself (code ${code}, signal ${signal}) before it was killed` }
  })
}

// ---------------------------------------------------------------------------
// The checker: the store after a crash against the replay
// ---------------------------------------------------------------------------

interface Adapter {
  readonly make: (options: { readonly directory: string }) => Effect.Effect<StoreShape, StoreError, Scope.Scope>
}
const adapters: Record<BackendName, Adapter> = { level: LevelStore, rocksdb: RocksDbStore }

type ViolationKind = "unreadable" | "wrong-start" | "offset-regressed" | "acked-lost" | "offset-ahead" | "mismatch"

/** The store broke a crash-consistency property. */
class CrashViolation extends Data.TaggedError("CrashViolation")<{
  readonly kind: ViolationKind
  readonly round: number
  readonly detail: string
}> {
  override get message() {
    return `round ${this.round}: ${this.kind}: ${this.detail}`
  }
}

/** Opens the directory in this process and reads the persisted offset and every entry; closes it again. */
const inspect = (adapter: Adapter, directory: string) =>
  Effect.scoped(
    Effect.gen(function* () {
      const store = yield* adapter.make({ directory })
      const partition = yield* store.open(STORE_ID)
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
const compare = (expected: Map<string, Uint8Array>, actual: ReadonlyArray<Entry>) => {
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

interface Summary {
  readonly backend: BackendName
  readonly runner: NodeRunner["kind"]
  readonly seed: number
  readonly rounds: number
  /** Killed before the child started opening the database (while Node loaded the program). */
  readonly killsWhileLoading: number
  /** Killed while the database was opening (recovery, compaction of the log on open). */
  readonly killsDuringOpen: number
  /** Killed after `ready`, while the write loop ran. */
  readonly killsMidRun: number
  /** Mid-run kills that landed after a batch was committed but before the child acknowledged it. */
  readonly committedNotAcked: number
  /** Mid-run kills that landed before the run had acknowledged any batch. */
  readonly midRunBeforeFirstAck: number
  readonly finalOffset: number
  readonly entries: number
  readonly wallMs: number
  readonly meanRoundMs: number
  readonly meanSpawnToReadyMs: number
  /** In the child, from `opening` to `ready`. */
  readonly meanOpenMs: number
  readonly meanInspectMs: number
  readonly violation?: CrashViolation
}

/**
 * Runs kill rounds on a fresh directory until `rounds` are done, the budget is spent, or (with `stopAtViolation`) a
 * violation is found. Harness problems fail the effect; violations are returned in the summary.
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
    const directory = yield* Effect.acquireRelease(
      Effect.promise(() => mkdtemp(join(tmpdir(), `strata-crash-${backend}-`))),
      (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true }))
    )
    const adapter = adapters[backend]
    const schedule = prng(mix32(seed ^ mix32(BACKENDS.indexOf(backend) + 1)))
    const replay = new Replay(seed)
    const childArgs = [
      backend,
      directory,
      String(seed),
      ...(options.torn === undefined ? [] : [`--torn=${options.torn}`])
    ]
    const started = performance.now()
    let verified = -1
    let rounds = 0
    let killsWhileLoading = 0
    let killsDuringOpen = 0
    let killsMidRun = 0
    let committedNotAcked = 0
    let midRunBeforeFirstAck = 0
    let readyMsTotal = 0
    let readyCount = 0
    let openMsTotal = 0
    let inspectMsTotal = 0
    let entries = 0
    let violation: CrashViolation | undefined

    while (rounds < options.rounds && violation === undefined) {
      if (performance.now() - started > options.budgetMs) break
      const round = rounds
      rounds++
      // A few kills are counted from the spawn (most land while Node loads the program), some from `opening` (most
      // land while the database opens: log recovery, flushes), the rest from `ready` (the write loop). The windows
      // follow the measured start-up and open times, so each kind keeps happening on a slower or faster machine.
      const meanReady = readyCount === 0 ? 200 : readyMsTotal / readyCount
      const meanOpen = readyCount === 0 ? 20 : openMsTotal / readyCount
      const r = schedule()
      const plan: KillPlan =
        r < 0.1
          ? { from: "spawn", delayMs: below(schedule, Math.max(10, Math.round(meanReady - meanOpen))) }
          : r < 0.25
            ? { from: "opening", delayMs: below(schedule, Math.max(2, Math.round(meanOpen * 1.5))) }
            : r < 0.35
              ? { from: "ready", delayMs: 0 }
              : { from: "ready", delayMs: below(schedule, MAX_RUN_MS + 1) }
      const outcome = yield* crashRound(childArgs, plan)
      if (outcome.spawnToReadyMs !== undefined && outcome.openMs !== undefined) {
        readyMsTotal += outcome.spawnToReadyMs
        openMsTotal += outcome.openMs
        readyCount++
      }

      const fail = (kind: ViolationKind, detail: string) => {
        violation = new CrashViolation({ kind, round, detail: `${detail} [plan ${JSON.stringify(plan)}]` })
      }
      if (outcome.readyFrom !== undefined && outcome.readyFrom !== verified + 1) {
        fail(
          "wrong-start",
          `the child started at batch ${outcome.readyFrom}, but batch ${verified} was the last verified`
        )
        break
      }

      const inspectStarted = performance.now()
      const snapshot = yield* Effect.result(inspect(adapter, directory))
      inspectMsTotal += performance.now() - inspectStarted
      if (snapshot._tag === "Failure") {
        fail("unreadable", `opening the store after the kill failed: ${snapshot.failure.message}`)
        break
      }
      const p = snapshot.success.persisted ?? -1
      const acked = outcome.lastAcked
      if (outcome.readyFrom === undefined) {
        if (outcome.opening) killsDuringOpen++
        else killsWhileLoading++
      } else {
        killsMidRun++
        if (acked === undefined) midRunBeforeFirstAck++
        if (p === (acked ?? verified) + 1) committedNotAcked++
      }
      if (p < verified) {
        fail("offset-regressed", `persisted offset ${p} is behind ${verified}, verified before this kill`)
        break
      }
      if (acked !== undefined && p < acked) {
        fail("acked-lost", `persisted offset ${p}, but the child had acknowledged batch ${acked} before the kill`)
        break
      }
      if (p > (acked ?? verified) + 1) {
        fail(
          "offset-ahead",
          `persisted offset ${p}, but the child could have written at most ${(acked ?? verified) + 1}`
        )
        break
      }
      replay.advanceTo(p)
      const diff = compare(replay.data, snapshot.success.entries)
      if (diff.count > 0) {
        fail(
          "mismatch",
          `the store (persisted offset ${p === -1 ? "none" : p}, ${snapshot.success.entries.length} entries) differs ` +
            `from the replay of batches 0..${p} (${replay.data.size} entries) in ${diff.count} place(s):\n  ` +
            diff.shown.join("\n  ")
        )
        break
      }
      verified = p
      entries = snapshot.success.entries.length
    }

    const wallMs = performance.now() - started
    const summary: Summary = {
      backend,
      runner: harness.runner.kind,
      seed,
      rounds,
      killsWhileLoading,
      killsDuringOpen,
      killsMidRun,
      committedNotAcked,
      midRunBeforeFirstAck,
      finalOffset: verified,
      entries,
      wallMs: Math.round(wallMs),
      meanRoundMs: Math.round(wallMs / Math.max(1, rounds)),
      meanSpawnToReadyMs: Math.round(readyMsTotal / Math.max(1, readyCount)),
      meanOpenMs: Math.round(openMsTotal / Math.max(1, readyCount)),
      meanInspectMs: Math.round(inspectMsTotal / Math.max(1, rounds)),
      ...(violation === undefined ? {} : { violation })
    }
    return summary
  }).pipe(Effect.scoped)

const show = (s: Summary) => {
  const { violation, ...rest } = s
  return JSON.stringify(violation === undefined ? rest : { ...rest, violation: violation.message })
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

describe("crash consistency under kill -9", () => {
  for (const backend of BACKENDS) {
    it.live(
      `${backend}: after every kill the store equals the replay up to its persisted offset`,
      () =>
        Effect.gen(function* () {
          console.log(`crash ${backend}: ${ROUNDS} kills, runner ${harness.runner.kind}, ${rerun(SEED)}`)
          const s = yield* crashLoop({ backend, seed: SEED, rounds: ROUNDS, budgetMs: BUDGET_MS, torn: undefined })
          console.log(`crash ${show(s)}`)
          const context = `${backend}, ${rerun(SEED)}\n${show(s)}`
          if (s.violation !== undefined) assert.fail(`${s.violation.message}\n${context}`)
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
        }).pipe(Effect.mapError((e) => new Error(`${e.message}\n${backend}, ${rerun(SEED)}`))),
      BUDGET_MS + 60_000
    )
  }

  for (const backend of BACKENDS) {
    for (const torn of TORN_MODES) {
      it.live(
        `${backend}: the checker catches a writer that persists the offset apart from the data (${torn})`,
        () =>
          Effect.gen(function* () {
            const s = yield* crashLoop({ backend, seed: SEED, rounds: TORN_ROUNDS, budgetMs: BUDGET_MS, torn })
            console.log(`crash --torn=${torn} ${show(s)}`)
            assert.isDefined(s.violation, `a torn writer survived ${s.rounds} kills undetected (${rerun(SEED)})`)
            assert.strictEqual(s.violation?.kind, "mismatch", `${s.violation?.message} (${rerun(SEED)})`)
          }).pipe(Effect.mapError((e) => new Error(`${e.message}\n${backend}, ${rerun(SEED)}`))),
        BUDGET_MS + 60_000
      )
    }
  }
})
