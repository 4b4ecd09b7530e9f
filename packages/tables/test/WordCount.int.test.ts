/**
 * Exactly-once word counting on Kafka + LevelDB under `kill -9` (docs/ARCHITECTURE.md, "Real-process tests": after any
 * crash and restart each table equals a replay of its changelog up to the persisted offset).
 *
 * Method. The test writes a seeded input (lines of 1–5 words from a small vocabulary) to a fresh source topic with
 * two partitions, then runs the worker (`fixtures/wordcount-worker.ts`: `Tables` on `KafkaLog` + `LevelStore`,
 * table `counts`, one `process` per line, `onCommit` per fetched batch) again and again on the same data directory,
 * killing it with SIGKILL at seeded random points: while it loads, while recovery restores the changelog, and while
 * it processes (mostly mid-batch, with changelog records produced but not committed). After each kill, before the
 * restart, the test opens the data directory itself and checks, per table partition p:
 *   - replay: the store's entries equal, byte for byte, the changelog records from the log start up to and including
 *     the persisted changelog offset, replayed (last value per key); the persisted offset is below the highwater and
 *     never goes backwards;
 *   - exactly once: the store's persisted source offset s equals one past the last source offset named by the
 *     replayed records' `strata-source` headers, and the counts equal the word counts of source lines [0, s);
 *     the whole changelog (committed or not) replays to the counts of lines [0, t), t one past its last source record;
 *   - durability: s is at least the last offset the worker reported as committed before the kill;
 *   - resume: the next run reports `resumeOffset` = t for every partition.
 * The changelog is read incrementally across rounds (the persisted offset only grows and the log is append-only),
 * which is the same as re-reading it from the log start each time. At the end the worker runs to completion without
 * a kill; the table it reports and the store read after its clean stop must equal the input's counts exactly.
 *
 * The worker is bundled once with esbuild (it loads in a fraction of the time tsx takes); the Kafka client and the
 * LevelDB driver stay external. STRATA_WORDCOUNT_RUNNER=tsx forces the tsx loader (also the fallback).
 * Knobs: STRATA_WORDCOUNT_SEED (input and kill schedule), STRATA_WORDCOUNT_KILLS (default 40),
 * STRATA_WORDCOUNT_BUDGET_MS (wall time of the kill phase, default 70000), STRATA_WORDCOUNT_LINES (lines per source
 * partition, default 25000), STRATA_WORDCOUNT_BATCH (source records per commit, default 100),
 * STRATA_WORDCOUNT_RUN_MS (longest kill delay after `ready`, default 500; raise it with the batch size for longer
 * uncommitted tails, i.e. recoveries that apply several buffers). Fewer than min(20, kills) kills — the budget ran
 * out, or the worker finished the input first — fails the test. Kill timing is real time: a seed fixes the input
 * and the schedule, not the instants the kills land.
 */
import { Log, type Models, type Store } from "@strata/core"
import { below, prng } from "../../../scripts/test-support/prng.js"
import { childHarness, envInt, parseJsonLine, rerunCommand, runChild } from "../../../scripts/test-support/childRun.js"
import type { NodeRunner } from "../../../scripts/test-support/nodeRunner.js"
import { mkdtemp } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { KafkaLog } from "@strata/kafka"
import * as LevelStore from "@strata/store-adapters/level"
import { Cause, Data, Duration, Effect, Option, Stream } from "effect"
import { inject } from "vitest"
import { countPrefix, makeInput, PLANTED, type Planted, type WorkerEvent, wordsOf } from "./fixtures/wordcount.js"

// ---------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------

const SEED = envInt("STRATA_WORDCOUNT_SEED", 20_261_130)
const KILLS = envInt("STRATA_WORDCOUNT_KILLS", 40)
/** Fewer kills than this within the budget fails the test. */
const MIN_KILLS = Math.min(20, KILLS)
const BUDGET_MS = envInt("STRATA_WORDCOUNT_BUDGET_MS", 70_000)
const LINES = Math.max(1, envInt("STRATA_WORDCOUNT_LINES", 25_000))
const PARTITIONS = 2
/** Source records per fetched batch, hence per commit. */
const MAX_BATCH = Math.max(1, envInt("STRATA_WORDCOUNT_BATCH", 100))
/** Kills of each self-test run (a planted bug must be caught within them). */
const SELF_TEST_KILLS = 8
/** Kills counted from `ready`: 0 to this many ms (a worker goes through a few thousand lines in that time). */
const MAX_RUN_MS = envInt("STRATA_WORDCOUNT_RUN_MS", 500)
const READY_TIMEOUT_MS = 30_000
const EXIT_TIMEOUT_MS = 10_000
/** The final, unkilled run must finish the input within this. */
const FINISH_TIMEOUT_MS = 60_000

const rerun = (seed: number) =>
  rerunCommand({
    seedVar: "STRATA_WORDCOUNT_SEED",
    seed,
    project: "integration",
    file: "packages/tables/test/WordCount.int.test.ts"
  })

// ---------------------------------------------------------------------------
// The worker program: bundled once (fast start) or run under the tsx loader
// ---------------------------------------------------------------------------

const here = dirname(fileURLToPath(import.meta.url))
const workerSource = join(here, "fixtures", "wordcount-worker.ts")

const harness = childHarness({
  label: "word count",
  source: workerSource,
  external: ["classic-level", "@platformatic/kafka"],
  preferTsx: process.env.STRATA_WORDCOUNT_RUNNER === "tsx"
})

// ---------------------------------------------------------------------------
// One run of the worker: spawn, follow its events, kill -9 it (or let it finish)
// ---------------------------------------------------------------------------

/**
 * Which property broke: `replay` (store ≠ changelog replayed to the persisted offset), `offsets` (a persisted offset
 * ahead of the log, going back, or not matching the replayed records), `exactly-once` (a line counted twice or
 * not at all), `durability` (a commit that returned was lost), `resume` (wrong `resumeOffset` or input end).
 */
type ViolationKind = "replay" | "offsets" | "exactly-once" | "durability" | "resume"

/** A property of the tables was broken. */
class Violation extends Data.TaggedError("Violation")<{
  readonly kind: ViolationKind
  readonly round: number
  readonly detail: string
}> {
  override get message() {
    return `round ${this.round}: ${this.kind}: ${this.detail}`
  }
}

/** When to send SIGKILL: `delayMs` after the spawn, after `recovering` or after `ready`; `finish`: never. */
type Plan = { readonly from: "spawn" | "recovering" | "ready"; readonly delayMs: number } | { readonly from: "finish" }

interface RunOutcome {
  readonly recovering: boolean
  readonly ready: Extract<WorkerEvent, { ev: "ready" }> | undefined
  /** The last commit the worker reported (next offsets per partition). */
  readonly committed: ReadonlyArray<number> | undefined
  readonly commits: number
  readonly done: Extract<WorkerEvent, { ev: "done" }> | undefined
  readonly spawnToRecoveringMs: number | undefined
  readonly recoveringToReadyMs: number | undefined
}

const runWorker = (args: ReadonlyArray<string>, plan: Plan) => {
  let recovering = false
  let recoveringAt = 0
  let spawnToRecoveringMs: number | undefined
  let recoveringToReadyMs: number | undefined
  let ready: RunOutcome["ready"]
  let committed: ReadonlyArray<number> | undefined
  let commits = 0
  let done: RunOutcome["done"]
  return runChild<RunOutcome>({
    label: "worker",
    harness,
    args,
    exitTimeoutMs: EXIT_TIMEOUT_MS,
    onStart: (control) => {
      if (plan.from === "spawn") control.killAfter(plan.delayMs)
      const limit = plan.from === "finish" ? FINISH_TIMEOUT_MS : READY_TIMEOUT_MS
      control.after(limit, () => {
        if (!control.killed() && (plan.from === "finish" || ready === undefined)) {
          control.fail(`the worker printed no "${plan.from === "finish" ? "done" : "ready"}" within ${limit} ms`)
        }
      })
    },
    onLine: (line, control) => {
      const event = parseJsonLine<WorkerEvent>(line)
      if (event === undefined) return
      switch (event.ev) {
        case "loaded":
          break
        case "recovering":
          recovering = true
          recoveringAt = control.elapsed()
          spawnToRecoveringMs = recoveringAt
          if (plan.from === "recovering") control.killAfter(plan.delayMs)
          break
        case "ready":
          ready = event
          recoveringToReadyMs = control.elapsed() - recoveringAt
          if (plan.from === "ready") control.killAfter(plan.delayMs)
          break
        case "commit":
          committed = event.next
          commits++
          break
        case "done":
          done = event
          break
      }
    },
    // A worker that finished the input before its kill ends the kill phase early (the kill count then tells).
    onExit: ({ code, signal, killed }) =>
      killed || (code === 0 && done !== undefined)
        ? {
            outcome: { recovering, ready, committed, commits, done, spawnToRecoveringMs, recoveringToReadyMs }
          }
        : {
            failure:
              plan.from === "finish"
                ? `the worker exited with code ${code} (signal ${signal}) ${done === undefined ? "without" : "after"} "done"`
                : `the worker exited by itself (code ${code}, signal ${signal}) before it was killed`
          }
  })
}

// ---------------------------------------------------------------------------
// The checker: the store after a kill against the changelog and the input
// ---------------------------------------------------------------------------

const SOURCE_HEADER = "strata-source"
const decoder = new TextDecoder()
const b64 = (bytes: Uint8Array) => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("base64")
const text = (bytes: Uint8Array | null) => (bytes === null ? "null" : decoder.decode(bytes))

/** The source record a changelog record came from (its `strata-source` header). */
const sourceOf = (record: Log.Record): { topic: string; partition: number; offset: number } | undefined => {
  const header = record.headers.find((h) => h.key === SOURCE_HEADER)
  if (header === undefined) return undefined
  const parsed: unknown = JSON.parse(decoder.decode(header.value))
  if (!Array.isArray(parsed) || parsed.length !== 3) return undefined
  const [topic, partition, offset] = parsed as [unknown, unknown, unknown]
  return typeof topic === "string" && typeof partition === "number" && typeof offset === "number"
    ? { topic, partition, offset }
    : undefined
}

/** One table partition as found in the store after a kill. */
interface StoreSnapshot {
  /** Persisted changelog offset, -1 when none. */
  readonly changelogOffset: number
  /** Persisted source offset (next to read), -1 when none. */
  readonly sourceOffset: number
  readonly entries: ReadonlyArray<Store.Entry>
}

/** Opens the data directory in this process (the dead worker's lock is gone) and reads every table partition. */
const readStore = (directory: string, changelog: string, source: string) =>
  Effect.scoped(
    Effect.gen(function* () {
      const store = yield* LevelStore.make({ directory })
      const out: Array<StoreSnapshot> = []
      for (let partition = 0; partition < PARTITIONS; partition++) {
        const ps = yield* store.open({ table: "counts", partition })
        const changelogOffset = yield* ps.persistedOffset({ topic: changelog, partition })
        const sourceOffset = yield* ps.persistedOffset({ topic: source, partition })
        const entries = yield* Stream.runCollect(ps.scan())
        out.push({
          changelogOffset: Option.getOrElse(changelogOffset, () => -1),
          sourceOffset: Option.getOrElse(sourceOffset, () => -1),
          entries
        })
      }
      return out
    })
  )

/** The records of `tp` in `[from, to)`, read with a group-less consumer. */
const readLog = (log: Log.Shape, tp: Models.TopicPartition, from: number, to: number) =>
  Effect.gen(function* () {
    const out: Array<Log.Record> = []
    if (from >= to) return out
    const consumer = yield* log.consumer({ maxBatchRecords: 5000 })
    yield* consumer.assign([tp])
    yield* consumer.seek(tp, from)
    let next = from
    yield* Stream.runForEachWhile(consumer.batches, (batch) =>
      Effect.sync(() => {
        for (const r of batch.records) {
          if (r.offset >= to) break
          out.push(r)
          next = r.offset + 1
        }
        return next < to
      })
    )
    return out
  }).pipe(Effect.scoped, Effect.timeout(Duration.seconds(30)))

/** One changelog partition, read incrementally, and its replay up to the last verified persisted offset. */
class ChangelogReplay {
  /** Every record read so far, from the log start. */
  readonly records: Array<Log.Record> = []
  /** Next offset to read from Kafka. */
  readTo = -1
  /** How many of `records` are applied to `data`. */
  applied = 0
  /** The persisted changelog offset verified last, -1 when none. */
  verified = -1
  /** Last value per key (base64) of the applied records; `null` = deleted. */
  readonly data = new Map<string, { readonly key: Uint8Array; readonly value: Uint8Array | null }>()
  /** One past the highest source offset named by the applied records, -1 when none. */
  appliedSource = -1
  constructor(readonly tp: Models.TopicPartition) {}
}

/** Differences between a replay and a scan, the first few described. */
const diffEntries = (replay: ChangelogReplay, entries: ReadonlyArray<Store.Entry>) => {
  const shown: Array<string> = []
  let count = 0
  const note = (line: string) => {
    count++
    if (shown.length < 6) shown.push(line)
  }
  const seen = new Set<string>()
  for (const [key, value] of entries) {
    const id = b64(key)
    seen.add(id)
    const expected = replay.data.get(id)
    if (expected === undefined || expected.value === null) note(`unexpected ${text(key)} = ${text(value)}`)
    else if (Buffer.compare(expected.value, value) !== 0) {
      note(`${text(key)}: store ${text(value)}, changelog ${text(expected.value)}`)
    }
  }
  for (const [id, expected] of replay.data) {
    if (expected.value !== null && !seen.has(id)) note(`missing ${text(expected.key)} = ${text(expected.value)}`)
  }
  return { count, shown }
}

/** Decoded counts of raw entries (keys and values are the JSON of the Schema encoding). */
const decodeCounts = (entries: Iterable<readonly [Uint8Array, Uint8Array | null]>): Map<string, number> => {
  const out = new Map<string, number>()
  for (const [k, v] of entries) if (v !== null) out.set(JSON.parse(text(k)) as string, JSON.parse(text(v)) as number)
  return out
}

/** Differences between two count maps, the first few described. */
const diffCounts = (actual: ReadonlyMap<string, number>, expected: ReadonlyMap<string, number>) => {
  const out: Array<string> = []
  for (const [w, n] of expected) if (actual.get(w) !== n) out.push(`${w}: ${actual.get(w) ?? "absent"}, expected ${n}`)
  for (const [w, n] of actual) if (!expected.has(w)) out.push(`${w}: ${n}, expected absent`)
  return out
}

// ---------------------------------------------------------------------------
// The kill loop
// ---------------------------------------------------------------------------

interface Summary {
  readonly seed: number
  readonly runner: NodeRunner["kind"]
  readonly lines: number
  readonly words: number
  readonly kills: number
  /** Killed before `recovering`: loading, opening the store, connecting, starting the manager. */
  readonly killsWhileLoading: number
  /** Killed after `recovering`, before `ready`. */
  readonly killsDuringRecovery: number
  /** ... of which with uncommitted changelog records to replay. */
  readonly killsDuringReplay: number
  /** Killed after `ready`. */
  readonly killsRunning: number
  /** Killed with changelog records produced but not committed (mid-batch). */
  readonly killsMidBatch: number
  /** Restarts that replayed uncommitted changelog records, and how many records in all. */
  readonly replayingRestarts: number
  readonly replayedRecords: number
  readonly commitsDuringKills: number
  /** Source offsets reached when the kill phase ended. */
  readonly offsetsAfterKills: ReadonlyArray<number>
  /** The worker finished the input during the kill phase (so it ended early). */
  readonly inputExhausted: boolean
  readonly killPhaseMs: number
  readonly finishMs: number
  readonly meanSpawnToReadyMs: number
  /** From `recovering` to `ready` in each run that got there, sorted. */
  readonly recoveryMs: ReadonlyArray<number>
  readonly meanInspectMs: number
  readonly wallMs: number
}

/** What one word-count run does: how many kills within what time, and which bug the worker plants (if any). */
interface RunOptions {
  readonly kills: number
  readonly budgetMs: number
  readonly planted?: Planted
}

const wordCount = Effect.fn("wordCount")(function* (seed: number, options: RunOptions) {
  const started = performance.now()
  const log = yield* Log.Log
  const brokers = inject("kafka")
  const id = `${Date.now().toString(36)}${Math.floor(Math.random() * 36 ** 4).toString(36)}`
  const app = `wc-${id}`
  const source = `${app}-words`
  const changelog = `${app}-counts-changelog`
  const directory = yield* Effect.promise(() => mkdtemp(join(tmpdir(), "strata-wordcount-")))
  harness.tempDirs.push(directory)
  const args = [
    brokers,
    app,
    source,
    String(PARTITIONS),
    directory,
    String(MAX_BATCH),
    ...(options.planted === undefined ? [] : [`--planted=${options.planted}`])
  ]

  // The input, and its counts.
  const input = makeInput(seed, PARTITIONS, LINES)
  const encoder = new TextEncoder()
  yield* log.ensureTopic({ topic: source, partitions: PARTITIONS })
  for (const [partition, lines] of input.entries()) {
    for (let i = 0; i < lines.length; i += 1000) {
      yield* log.produceBatch(
        lines.slice(i, i + 1000).map((line) => ({ topic: source, partition, key: null, value: encoder.encode(line) }))
      )
    }
  }
  const words = input.reduce((n, lines) => n + lines.reduce((m, line) => m + wordsOf(line).length, 0), 0)

  const replays = Array.from(
    { length: PARTITIONS },
    (_, partition) => new ChangelogReplay({ topic: changelog, partition })
  )
  /** What the next run must report as its resume offsets (one past the changelog's last source record). */
  let expectedResume: ReadonlyArray<number> = new Array<number>(PARTITIONS).fill(0)
  let verifiedSource: ReadonlyArray<number> = new Array<number>(PARTITIONS).fill(-1)
  let round = 0
  let inspectMsTotal = 0
  let inspections = 0

  /** Checks the store against the changelog and the input; returns the tail (uncommitted records) per partition. */
  const inspect = (outcome: RunOutcome) =>
    Effect.gen(function* () {
      const t0 = performance.now()
      const fail = (kind: ViolationKind, detail: string) => Effect.fail(new Violation({ kind, round, detail }))
      const stores = yield* readStore(directory, changelog, source)
      // Only after the store: the worker is dead, the changelog no longer grows. A worker killed before it created
      // the changelog topic leaves none: every partition is then empty.
      const offsets = yield* log.offsets(replays.map((r) => r.tp)).pipe(
        Effect.catchIf(
          (e) => e.reason._tag === "UnknownTopic",
          () => Effect.succeed(replays.map((r) => ({ ...r.tp, logStart: 0, highwater: 0 })))
        )
      )
      const tails: Array<number> = []
      const resume: Array<number> = []
      for (const replay of replays) {
        const p = replay.tp.partition
        const store = stores[p]!
        const o = offsets.find((x) => x.partition === p)!
        if (replay.readTo < 0) replay.readTo = o.logStart
        replay.records.push(...(yield* readLog(log, replay.tp, replay.readTo, o.highwater)))
        replay.readTo = o.highwater
        const cp = store.changelogOffset
        if (cp >= o.highwater) {
          return yield* fail("offsets", `partition ${p}: persisted changelog offset ${cp} ≥ highwater ${o.highwater}`)
        }
        if (cp < replay.verified) {
          return yield* fail(
            "offsets",
            `partition ${p}: persisted changelog offset went back from ${replay.verified} to ${cp}`
          )
        }
        // Replay up to and including the persisted offset.
        while (replay.applied < replay.records.length && replay.records[replay.applied]!.offset <= cp) {
          const r = replay.records[replay.applied]!
          if (r.key !== null) replay.data.set(b64(r.key), { key: r.key, value: r.value })
          const from = sourceOf(r)
          if (from === undefined || from.topic !== source || from.partition !== p) {
            return yield* fail(
              "offsets",
              `partition ${p}: changelog record ${r.offset} names source ${JSON.stringify(from)}`
            )
          }
          replay.appliedSource = Math.max(replay.appliedSource, from.offset + 1)
          replay.applied++
        }
        const diff = diffEntries(replay, store.entries)
        if (diff.count > 0) {
          return yield* fail(
            "replay",
            `partition ${p}: the store (persisted changelog offset ${cp}, ${store.entries.length} entries) differs ` +
              `from the changelog replayed up to it in ${diff.count} place(s):\n  ${diff.shown.join("\n  ")}`
          )
        }
        const s = store.sourceOffset
        if (s !== replay.appliedSource) {
          return yield* fail(
            "offsets",
            `partition ${p}: persisted source offset ${s}, but the replayed changelog reaches source offset ` +
              `${replay.appliedSource}`
          )
        }
        if (s < verifiedSource[p]!) {
          return yield* fail(
            "offsets",
            `partition ${p}: persisted source offset went back from ${verifiedSource[p]} to ${s}`
          )
        }
        const acked = outcome.committed?.[p]
        // (-1, nothing persisted, is the same as 0 here: the worker reports 0 for a partition it has not committed.)
        if (acked !== undefined && Math.max(0, s) < acked) {
          return yield* fail(
            "durability",
            `partition ${p}: the worker's commit up to ${acked} returned, but the store is at ${s}`
          )
        }
        const counted = diffCounts(decodeCounts(store.entries), countPrefix(input[p]!, Math.max(0, s)))
        if (counted.length > 0) {
          return yield* fail(
            "exactly-once",
            `partition ${p}: the store (source offset ${s}) is not the count of lines [0, ${s}) exactly once: ` +
              counted.slice(0, 6).join("; ")
          )
        }
        // The uncommitted tail: the whole changelog must still count each line once; the next run resumes after it.
        const full = new Map(replay.data)
        let t = Math.max(0, s)
        for (let i = replay.applied; i < replay.records.length; i++) {
          const r = replay.records[i]!
          if (r.key !== null) full.set(b64(r.key), { key: r.key, value: r.value })
          const from = sourceOf(r)
          if (from === undefined || from.topic !== source || from.partition !== p || from.offset < s) {
            return yield* fail(
              "exactly-once",
              `partition ${p}: uncommitted changelog record ${r.offset} names source ${JSON.stringify(from)} ` +
                `(committed up to ${s})`
            )
          }
          t = Math.max(t, from.offset + 1)
        }
        const whole = diffCounts(
          decodeCounts([...full.values()].map((c) => [c.key, c.value] as const)),
          countPrefix(input[p]!, t)
        )
        if (whole.length > 0) {
          return yield* fail(
            "exactly-once",
            `partition ${p}: the whole changelog (to ${o.highwater}) is not the count of lines [0, ${t}) exactly ` +
              `once: ${whole.slice(0, 6).join("; ")}`
          )
        }
        replay.verified = cp
        tails.push(replay.records.length - replay.applied)
        resume.push(t)
      }
      verifiedSource = stores.map((s) => s.sourceOffset)
      expectedResume = resume
      inspectMsTotal += performance.now() - t0
      inspections++
      return tails
    })

  /** The run's `ready` must resume exactly after the changelog's last source record, and end at the input's end. */
  const checkReady = (outcome: RunOutcome) =>
    Effect.suspend(() => {
      const ready = outcome.ready
      if (ready === undefined) return Effect.void
      const same = (a: ReadonlyArray<number>, b: ReadonlyArray<number>) =>
        a.length === b.length && a.every((x, i) => x === b[i])
      if (!same(ready.resume, expectedResume)) {
        return Effect.fail(
          new Violation({
            kind: "resume",
            round,
            detail: `resumeOffset ${JSON.stringify(ready.resume)}, expected ${JSON.stringify(expectedResume)}`
          })
        )
      }
      if (
        !same(
          ready.end,
          input.map((l) => l.length)
        )
      ) {
        return Effect.fail(
          new Violation({ kind: "resume", round, detail: `the worker saw the input end at ${ready.end}` })
        )
      }
      return Effect.void
    })

  // --- the kill phase ---
  const schedule = prng(seed)
  const killStarted = performance.now()
  let killsWhileLoading = 0
  let killsDuringRecovery = 0
  let killsDuringReplay = 0
  let killsRunning = 0
  let killsMidBatch = 0
  let replayingRestarts = 0
  let replayedRecords = 0
  let commitsDuringKills = 0
  let loadMsTotal = 0
  let recoveryMsTotal = 0
  let readyCount = 0
  const recoveryMs: Array<number> = []
  let pendingTail = 0
  let inputExhausted = false
  let kills = 0
  while (kills < options.kills && performance.now() - killStarted < options.budgetMs) {
    round++
    // Windows follow the measured start-up and recovery times, so each kind keeps happening on any machine.
    const meanToRecovering = readyCount === 0 ? 500 : loadMsTotal / readyCount
    const meanRecovery = readyCount === 0 ? 100 : recoveryMsTotal / readyCount
    const r = schedule()
    const plan: Plan =
      r < 0.15
        ? { from: "spawn", delayMs: below(schedule, Math.max(10, Math.round(meanToRecovering))) }
        : r < 0.4
          ? { from: "recovering", delayMs: below(schedule, Math.max(2, Math.round(meanRecovery * 0.6))) }
          : { from: "ready", delayMs: below(schedule, MAX_RUN_MS + 1) }
    const outcome = yield* runWorker(args, plan)
    if (outcome.done !== undefined) {
      // It finished the input before the kill: no kill this round; the final run below restarts it once more.
      inputExhausted = true
      yield* checkReady(outcome)
      yield* inspect(outcome)
      break
    }
    if (outcome.spawnToRecoveringMs !== undefined && outcome.recoveringToReadyMs !== undefined) {
      loadMsTotal += outcome.spawnToRecoveringMs
      recoveryMsTotal += outcome.recoveringToReadyMs
      recoveryMs.push(Math.round(outcome.recoveringToReadyMs))
      readyCount++
    }
    if (outcome.ready !== undefined && pendingTail > 0) {
      replayingRestarts++
      replayedRecords += pendingTail
    }
    kills++
    yield* checkReady(outcome)
    if (!outcome.recovering) killsWhileLoading++
    else if (outcome.ready === undefined) {
      killsDuringRecovery++
      if (pendingTail > 0) killsDuringReplay++
    } else killsRunning++
    commitsDuringKills += outcome.commits
    const tails = yield* inspect(outcome)
    pendingTail = tails.reduce((a, b) => a + b, 0)
    if (outcome.ready !== undefined && pendingTail > 0) killsMidBatch++
  }
  const killPhaseMs = performance.now() - killStarted
  const offsetsAfterKills = verifiedSource

  // --- the final run: no kill, to the end of the input ---
  const finishStarted = performance.now()
  round++
  const last = yield* runWorker(args, { from: "finish" })
  yield* checkReady(last)
  yield* inspect(last)
  const finishMs = performance.now() - finishStarted
  const expected = input.map((lines) => countPrefix(lines, lines.length))
  for (let p = 0; p < PARTITIONS; p++) {
    if (verifiedSource[p] !== LINES) {
      return yield* new Violation({
        kind: "exactly-once",
        round,
        detail: `partition ${p}: finished at source offset ${verifiedSource[p]}`
      })
    }
    const reported = diffCounts(new Map(Object.entries(last.done?.counts[p] ?? {})), expected[p]!)
    if (reported.length > 0) {
      return yield* new Violation({
        kind: "exactly-once",
        round,
        detail: `partition ${p}: the worker's final table is wrong: ${reported.slice(0, 6).join("; ")}`
      })
    }
  }

  const summary: Summary = {
    seed,
    runner: harness.runner.kind,
    lines: LINES * PARTITIONS,
    words,
    kills,
    killsWhileLoading,
    killsDuringRecovery,
    killsDuringReplay,
    killsRunning,
    killsMidBatch,
    replayingRestarts,
    replayedRecords,
    commitsDuringKills,
    offsetsAfterKills,
    inputExhausted,
    killPhaseMs: Math.round(killPhaseMs),
    finishMs: Math.round(finishMs),
    meanSpawnToReadyMs: Math.round((loadMsTotal + recoveryMsTotal) / Math.max(1, readyCount)),
    recoveryMs: recoveryMs.sort((a, b) => a - b),
    meanInspectMs: Math.round(inspectMsTotal / Math.max(1, inspections)),
    wallMs: Math.round(performance.now() - started)
  }
  return summary
})

// ---------------------------------------------------------------------------
// Test
// ---------------------------------------------------------------------------

describe("word count on Kafka + LevelDB under kill -9", () => {
  it.live(
    "after every kill the table equals its changelog replayed to the persisted offset; each line counts once",
    () =>
      Effect.gen(function* () {
        console.log(`wordcount: ${KILLS} kills, runner ${harness.runner.kind}, ${rerun(SEED)}`)
        const s = yield* wordCount(SEED, { kills: KILLS, budgetMs: BUDGET_MS })
        console.log(`wordcount ${JSON.stringify(s)}`)
        const context = `${rerun(SEED)}\n${JSON.stringify(s)}`
        assert.isTrue(
          s.kills >= MIN_KILLS,
          s.inputExhausted
            ? `the worker finished the input after only ${s.kills} kills (at least ${MIN_KILLS} needed): ` +
                `give it more lines (${context})`
            : `only ${s.kills} kills (at least ${MIN_KILLS} needed) fit in the ${BUDGET_MS} ms budget (${context})`
        )
        assert.isTrue(s.killsDuringRecovery >= 1, `no kill landed during recovery (${context})`)
        assert.isTrue(s.killsMidBatch >= 1, `no kill landed mid-batch (${context})`)
        assert.isTrue(s.commitsDuringKills >= 1, `no commit happened before the final run (${context})`)
      }).pipe(
        Effect.provide(KafkaLog.layer({ brokers: [inject("kafka")], clientId: "wordcount-test" })),
        Effect.mapError((e) => new Error(`${e.message}\n${rerun(SEED)}`))
      ),
    BUDGET_MS + 90_000
  )

  for (const planted of PLANTED) {
    it.live(
      `the checker catches a worker with a planted bug (${planted})`,
      () =>
        Effect.gen(function* () {
          const outcome = yield* Effect.exit(wordCount(SEED, { kills: SELF_TEST_KILLS, budgetMs: BUDGET_MS, planted }))
          const failure = outcome._tag === "Failure" ? Cause.findErrorOption(outcome.cause) : Option.none()
          const message = Option.match(failure, { onNone: () => "no failure", onSome: (e) => e.message })
          console.log(`wordcount --planted=${planted}: ${message.split("\n")[0]}`)
          const kind = Option.isSome(failure) && failure.value._tag === "Violation" ? failure.value.kind : undefined
          assert.strictEqual(
            kind,
            planted === "resume-early" ? "exactly-once" : "replay",
            `a worker with the planted bug ${planted} was not caught as expected: ${message} (${rerun(SEED)})`
          )
        }).pipe(Effect.provide(KafkaLog.layer({ brokers: [inject("kafka")], clientId: "wordcount-test" }))),
      BUDGET_MS + 90_000
    )
  }
})
