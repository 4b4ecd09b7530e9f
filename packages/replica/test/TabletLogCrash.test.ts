/**
 * Crash consistency of `TabletLog` under `kill -9`, on real LevelDB and RocksDB directories: its module promises
 * that "after a crash it reopens to a prefix of what was appended (every change is one atomic store write), never a
 * torn batch".
 *
 * Method. A child process (`crash/tabletLogChild.ts`) runs deterministic operations on one tablet's log, forever:
 * operation n is a function of (seed, n) and the log's start and end only — mostly appends of 1–20 records (keys
 * null or bytes, values of 0–2 KB, 0–2 headers) under an epoch that grows every 37 operations, and sometimes a
 * high-watermark checkpoint, a truncation a few records back, a retention cut (`deleteBefore`) or a reset. It
 * prints `w <n>` once operation n completed. Each round spawns the child on the same directory at the operation
 * after the last verified one, kills it with SIGKILL after a seeded random delay (mostly 0–250 ms after it reported
 * `ready`, sometimes counted from the spawn or from `opening` so that kills also land while it loads or opens the
 * database), waits for it to exit, then reopens the directory in this process, opens the log and checks it against
 * an in-memory model of the log replayed through operation p (the child's `step`):
 *   - p is the last operation the child acknowledged or the one after it (one write in flight; the adapters promise
 *     that a process crash loses nothing acknowledged), so p never goes back between rounds;
 *   - the log's start, end, high watermark, epoch cache and `endOffsetForEpoch` answers equal the model's, and the
 *     epoch cache agrees with the epochs of the batches it covers;
 *   - `read(start, everything)` returns the model's batches, record by record byte-identical (keys, values, headers,
 *     timestamps), with their base offsets and epochs;
 *   - the stored batches (a raw scan of the batch keys, decoded) are exactly the model's: none torn, cut short or
 *     left behind past the end by a write that only half happened;
 *   - the child, restarted, opens the log to the same start, end and high watermark.
 * The model is advanced incrementally across rounds, so a round costs one spawn, one open and one read of a log
 * retention keeps to a few hundred records. Progress is checked too (enough operations, of every kind, verified;
 * most kills landing while the child operates) so the test cannot pass vacuously, and a self-test runs the same
 * checker against deliberately torn children (`--torn=batches-first` and `--torn=fields-first`: every write of the
 * log split in two, batch keys apart from its fields and epoch entries, with a short pause between the halves; they
 * are killed only while they write) and requires it to report a mismatch.
 *
 * The same rounds run on the segment log (`SegmentLog`, in segments of `SEGMENT_BYTES` so that it rolls and retention
 * deletes whole segments): its module promises that a process killed at any point reopens to the log before or
 * after the change in flight, with a torn tail cut off. There the stored batches are the frames of its segment files
 * (the segment holding the log start keeps batches below it: those are not compared), and there is no torn self-test
 * (the checker is the same).
 *
 * Crash consistency of the stores themselves is `store-adapters/test/Crash.test.ts`'s; this test is about the log
 * putting each of its changes in one write. The child is bundled once with esbuild (STRATA_TABLETLOG_CRASH_RUNNER=tsx
 * runs it under the tsx loader instead).
 * Knobs: STRATA_TABLETLOG_CRASH_SEED (workload and kill schedule), STRATA_TABLETLOG_CRASH_ROUNDS (kills per backend,
 * default 25). Kill timing is real time, so a seed fixes the workload and the schedule, not the exact instants the
 * kills land.
 */
import { readdir, readFile } from "node:fs/promises"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Stream } from "effect"
import { childHarness, envInt, rerunCommand } from "../../../scripts/test-support/childRun.js"
import { BACKENDS, type BackendName, childArgv, openPartition } from "../../../scripts/test-support/crashChild.js"
import {
  type KillSummary,
  killRounds,
  killTests,
  RoundViolation,
  showSummary,
  tempDirectory
} from "../../../scripts/test-support/killRounds.js"
import { prng } from "../../../scripts/test-support/prng.js"
import * as Codec from "../src/wire/internal/batchCodec.js"
import * as LeaderEpochCache from "../src/machines/LeaderEpochCache.js"
import * as Format from "../src/server/internal/segmentFormat.js"
import * as TabletLog from "../src/server/TabletLog.js"
import {
  epochOf,
  initial,
  loadAdapter,
  OPERATION_KINDS,
  type Operation,
  openSegmentLog,
  type State,
  STORE_ID,
  step,
  TABLET,
  TORN_MODES,
  type TornMode
} from "./crash/tabletLogChild.js"

// ---------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------

const SEED = envInt("STRATA_TABLETLOG_CRASH_SEED", 20_260_311)
const ROUNDS = envInt("STRATA_TABLETLOG_CRASH_ROUNDS", 25)
/** Rounds the torn-writer self-test may take to be caught. */
const TORN_ROUNDS = 40
/** The last verified operation must reach at least this. */
const MIN_FINAL_OP = ROUNDS * 15
/** The kinds of kills: 8% from the spawn, 8% from `opening`, 8% at `ready`, the rest 0–250 ms after `ready`. */
const MIX = { spawn: 0.08, opening: 0.16, ready: 0.24, maxRunMs: 250 }
/** The differences a failure message shows. */
const SHOWN = 6

const FILE = "packages/replica/test/TabletLogCrash.test.ts"
const rerun = (seed: number) =>
  rerunCommand({ seedVar: "STRATA_TABLETLOG_CRASH_SEED", seed, project: "unit", file: FILE })

// ---------------------------------------------------------------------------
// The child program: bundled once (fast start) or run under the tsx loader
// ---------------------------------------------------------------------------

const harness = childHarness({
  label: "tablet log crash test",
  source: join(dirname(fileURLToPath(import.meta.url)), "crash", "tabletLogChild.ts"),
  external: ["classic-level", "@nxtedition/rocksdb"],
  preferTsx: process.env.STRATA_TABLETLOG_CRASH_RUNNER === "tsx"
})

// ---------------------------------------------------------------------------
// The checker: the log after a crash against the model
// ---------------------------------------------------------------------------

type ViolationKind = "unreadable" | "wrong-reopen" | "acked-lost" | "mismatch"

/** The log broke a crash-consistency property. */
class CrashViolation extends RoundViolation<ViolationKind>() {}

/** What this process finds in the directory through the log, and in its batch keys directly. */
interface Observed {
  readonly start: number
  readonly end: number
  readonly hw: number
  readonly epochs: LeaderEpochCache.LeaderEpochCache
  /** `endOffsetForEpoch(e)` for e = 0 … `epochs`' latest + 1, and every epoch the child may have written. */
  readonly endOffsets: ReadonlyArray<{ readonly epoch: number; readonly endOffset: number } | undefined>
  /** `read(start, everything)`. */
  readonly read: ReadonlyArray<TabletLog.Batch>
  /** Every stored batch, decoded (or why it cannot be). */
  readonly stored: ReadonlyArray<TabletLog.Batch | string>
}

/** Where a crash test's log lives: a backend's store, or segment files. */
type Storage = BackendName | "segments"
const STORAGES: ReadonlyArray<Storage> = [...BACKENDS, "segments"]

/** Every batch a segment log's files hold, decoded (or why the bytes at some position are not one), in order. */
const segmentFrames = (directory: string) =>
  Effect.promise(async () => {
    const out: Array<TabletLog.Batch | string> = []
    for (const file of (await readdir(directory)).filter((f) => f.endsWith(".log")).sort()) {
      const bytes = new Uint8Array(await readFile(join(directory, file)))
      for (let at = 0; at < bytes.length; ) {
        const parsed = Format.parseFrame(bytes, at)
        if (parsed._tag !== "Frame") {
          out.push(`${file} at byte ${at}: ${parsed._tag === "Bad" ? parsed.detail : "a frame cut short"}`)
          break
        }
        out.push(Codec.decodeBatch(parsed.frame.baseOffset, parsed.frame.encoded))
        at += parsed.frame.frameBytes
      }
    }
    return out
  })

/** The log in `directory`, and its stored batches read beneath it (those reaching past `start`). */
const openObserved = (storage: Storage, directory: string) =>
  Effect.gen(function* () {
    if (storage === "segments") {
      const log = yield* openSegmentLog(directory)
      const stored = (start: number) =>
        Effect.map(segmentFrames(directory), (all) =>
          all.filter((b) => typeof b === "string" || b.baseOffset + b.records.length > start)
        )
      return { log, stored }
    }
    const partition = yield* openPartition(() => loadAdapter(storage), directory, STORE_ID)
    const log = yield* TabletLog.make(partition, TABLET)
    const stored = (_start: number) =>
      Effect.map(Stream.runCollect(partition.scan(Codec.BATCHES)), (entries) =>
        entries.map(([k, v]) => Codec.decodeBatch(Codec.offsetOfBatchKey(k), v))
      )
    return { log, stored }
  })

/** Opens the directory in this process, reads the log every way, closes it again. */
const observe = (storage: Storage, directory: string, maxEpoch: number) =>
  Effect.scoped(
    Effect.gen(function* () {
      const { log, stored: storedFrom } = yield* openObserved(storage, directory)
      const start = yield* log.logStartOffset
      const endOffsets: Array<{ readonly epoch: number; readonly endOffset: number } | undefined> = []
      for (let e = 0; e <= maxEpoch; e++) endOffsets.push(yield* log.endOffsetForEpoch(e))
      const stored = yield* storedFrom(start)
      const observed: Observed = {
        start,
        end: yield* log.logEndOffset,
        hw: yield* log.highWatermark,
        epochs: yield* log.epochs,
        endOffsets,
        read: yield* log.read(start, Number.MAX_SAFE_INTEGER),
        stored
      }
      return observed
    })
  )

const sameBytes = (a: Uint8Array, b: Uint8Array) => Buffer.compare(a, b) === 0

/** How a record differs from the one expected, or `undefined` when it is byte-identical. */
const recordDiff = (e: TabletLog.TabletRecord, a: TabletLog.TabletRecord): string | undefined => {
  if (e.timestamp !== a.timestamp) return `timestamp ${a.timestamp}, expected ${e.timestamp}`
  if ((e.key === null) !== (a.key === null) || (e.key !== null && a.key !== null && !sameBytes(e.key, a.key))) {
    return `key of ${a.key?.length ?? "no"} bytes, expected ${e.key?.length ?? "no"} bytes (or other bytes)`
  }
  if (!sameBytes(e.value, a.value))
    return `value of ${a.value.length} bytes, expected ${e.value.length} (or other bytes)`
  if (e.headers.length !== a.headers.length) return `${a.headers.length} headers, expected ${e.headers.length}`
  for (let h = 0; h < e.headers.length; h++) {
    if (e.headers[h]!.key !== a.headers[h]!.key || !sameBytes(e.headers[h]!.value, a.headers[h]!.value)) {
      return `header ${h} differs`
    }
  }
  return undefined
}

/** The differences between two lists of batches (`what` names them in messages). */
const batchDiffs = (
  what: string,
  expected: ReadonlyArray<TabletLog.Batch>,
  actual: ReadonlyArray<TabletLog.Batch | string>,
  note: (text: string) => void
) => {
  const shape = (b: TabletLog.Batch | string | undefined) =>
    b === undefined ? "none" : typeof b === "string" ? `undecodable (${b})` : `${b.records.length}@${b.baseOffset}`
  if (expected.length !== actual.length) note(`${what}: ${actual.length} batches, expected ${expected.length}`)
  for (let i = 0; i < Math.max(expected.length, actual.length); i++) {
    const e = expected[i]
    const a = actual[i]
    if (e === undefined || a === undefined || typeof a === "string") {
      note(`${what}: batch ${i} is ${shape(a)}, expected ${shape(e)}`)
      continue
    }
    if (e.baseOffset !== a.baseOffset || e.records.length !== a.records.length || e.epoch !== a.epoch) {
      note(`${what}: batch ${i} is ${shape(a)} of epoch ${a.epoch}, expected ${shape(e)} of epoch ${e.epoch}`)
      continue
    }
    for (let r = 0; r < e.records.length; r++) {
      const d = recordDiff(e.records[r]!, a.records[r]!)
      if (d !== undefined) note(`${what}: record ${e.baseOffset + r}: ${d}`)
    }
  }
}

/** What `read(start, everything)` returns for the model's log: its batches, the first one read from the start. */
const readView = (s: State): Array<TabletLog.Batch> =>
  s.batches.flatMap((b) => {
    const skip = Math.max(0, s.start - b.baseOffset)
    const last = Math.min(b.records.length, s.end - b.baseOffset)
    return skip >= last
      ? []
      : [{ baseOffset: b.baseOffset + skip, epoch: b.epoch, records: b.records.slice(skip, last) }]
  })

/** Whether the log's fields and epochs are the model's (the cheap part of `diffs`). */
const sameFields = (s: State, o: Observed) =>
  s.start === o.start && s.end === o.end && s.hw === o.hw && JSON.stringify(s.epochs) === JSON.stringify(o.epochs)

/** Every way the observed log differs from the model's state (the first `SHOWN` described), and how many. */
const diffs = (s: State, o: Observed, storage: Storage) => {
  const shown: Array<string> = []
  let count = 0
  const note = (text: string) => {
    count++
    if (shown.length < SHOWN) shown.push(text)
  }
  for (const field of ["start", "end", "hw"] as const) {
    if (s[field] !== o[field]) note(`${field} ${o[field]}, expected ${s[field]}`)
  }
  if (JSON.stringify(s.epochs) !== JSON.stringify(o.epochs)) {
    note(`epochs ${JSON.stringify(o.epochs)}, expected ${JSON.stringify(s.epochs)}`.slice(0, 600))
  }
  o.endOffsets.forEach((answer, e) => {
    const expected = LeaderEpochCache.endOffsetFor(s.epochs, e, s.end)
    if (JSON.stringify(answer) !== JSON.stringify(expected)) {
      note(`endOffsetForEpoch(${e}) ${JSON.stringify(answer)}, expected ${JSON.stringify(expected)}`)
    }
  })
  // The cache must agree with the batches it covers: the entry at or below each offset is its batch's epoch.
  for (const b of o.read) {
    for (let at = b.baseOffset; at < b.baseOffset + b.records.length; at++) {
      const entry = o.epochs.findLast((x) => x.startOffset <= at)
      if (entry?.epoch !== b.epoch) {
        note(`the epoch cache gives offset ${at} epoch ${entry?.epoch}, its batch has epoch ${b.epoch}`)
        break
      }
    }
  }
  batchDiffs("read", readView(s), o.read, note)
  // Segment files: the batches reaching past the start only (the segment holding it keeps the ones before).
  const stored = storage === "segments" ? s.batches.filter((b) => b.baseOffset + b.records.length > s.start) : s.batches
  batchDiffs("stored", stored, o.stored, note)
  return { count, shown }
}

interface Summary extends Omit<KillSummary<CrashViolation>, "backend"> {
  readonly backend: Storage
  /** Mid-run kills that landed after an operation was committed but before the child acknowledged it. */
  readonly committedNotAcked: number
  /** The last operation verified (-1: none). */
  readonly finalOp: number
  /** The operations verified, by kind. */
  readonly ops: Record<Operation["_tag"], number>
  readonly finalLog: { readonly start: number; readonly end: number; readonly batches: number }
  readonly meanObserveMs: number
}

/** `ready <from> <start> <end> <hw>`: where the child started, and the log it opened. */
const parseReady = (fields: string) => {
  const [from, start, end, hw] = fields.split(" ").map(Number) as [number, number, number, number]
  return { from, start, end, hw }
}

/**
 * Runs kill rounds on a fresh directory until `rounds` are done or a violation is found. Harness problems fail the
 * effect; violations are returned in the summary.
 */
const crashLoop = (options: {
  readonly storage: Storage
  readonly seed: number
  readonly rounds: number
  readonly torn: TornMode | undefined
}) =>
  Effect.gen(function* () {
    const { storage, seed, torn } = options
    const directory = yield* tempDirectory(`strata-tablet-crash-${storage}-`)
    /** The last operation verified, the model's state after it, and the operations so far by kind. */
    let verified = -1
    let state = initial
    const ops = Object.fromEntries(OPERATION_KINDS.map((k) => [k, 0])) as Record<Operation["_tag"], number>
    let committedNotAcked = 0
    let observeMsTotal = 0

    const result = yield* killRounds({
      harness,
      rounds: options.rounds,
      schedule: prng(seed ^ (0x3c6ef372 + STORAGES.indexOf(storage) * 0x9e3779b9)),
      mix: MIX,
      // A torn child is killed while it writes: the self-test is about the checker, not about when kills land.
      fromReadyOnly: torn !== undefined,
      // The segment log's child takes no store: its backend argument is a placeholder.
      args: () =>
        childArgv({
          backend: storage === "segments" ? "level" : storage,
          directory,
          seed,
          numbers: [verified + 1, storage === "segments" ? 1 : 0],
          torn
        }),
      parseReady,
      Violation: CrashViolation,
      check: ({ outcome, violation }) =>
        Effect.gen(function* () {
          const ready = outcome.ready
          if (
            ready !== undefined &&
            (ready.start !== state.start || ready.end !== state.end || ready.hw !== state.hw)
          ) {
            return violation(
              "wrong-reopen",
              `the child opened the log as start ${ready.start}, end ${ready.end}, hw ${ready.hw}; verified after ` +
                `operation ${verified} as start ${state.start}, end ${state.end}, hw ${state.hw}`
            )
          }

          // The model after each operation the child may have finished: verified + 1 … acked + 1.
          const acked = outcome.lastAcked ?? verified
          const states: Array<{ readonly op: Operation; readonly state: State }> = []
          for (let n = verified + 1, s = state; n <= acked + 1; n++) {
            const next = step(seed, n, s)
            states.push(next)
            s = next.state
          }
          const stateAfter = (n: number) => (n === verified ? state : states[n - verified - 1]!.state)

          const observeStarted = performance.now()
          const observed = yield* Effect.result(observe(storage, directory, epochOf(acked + 1) + 1))
          observeMsTotal += performance.now() - observeStarted
          if (observed._tag === "Failure") {
            return violation(
              "unreadable",
              `opening or reading the log after the kill failed: ${observed.failure.message}`
            )
          }
          const o = observed.success
          // p is acked + 1 (committed, not yet acknowledged) or acked; a state equal to both is the later.
          const p = [acked + 1, acked].find((n) => n >= verified && diffs(stateAfter(n), o, storage).count === 0)
          if (p === undefined) {
            let behind: number | undefined
            for (let n = acked - 1; n >= verified && behind === undefined; n--) {
              if (sameFields(stateAfter(n), o) && diffs(stateAfter(n), o, storage).count === 0) behind = n
            }
            if (behind !== undefined) {
              return violation(
                "acked-lost",
                `the log is the model after operation ${behind}, but the child had finished ${acked}`
              )
            }
            const describe = (n: number) => {
              const d = diffs(stateAfter(n), o, storage)
              const op = n === verified ? "(verified)" : states[n - verified - 1]!.op._tag
              return `after operation ${n} ${op} (start ${stateAfter(n).start}, end ${stateAfter(n).end}): ${d.count} difference(s):\n    ${d.shown.join("\n    ")}`
            }
            return violation(
              "mismatch",
              `the log (start ${o.start}, end ${o.end}, hw ${o.hw}, ${o.stored.length} stored batches) is not the ` +
                `model after the last acknowledged operation ${acked} nor after the one in flight:\n  ` +
                [acked + 1, acked]
                  .filter((n) => n >= verified)
                  .map(describe)
                  .join("\n  ")
            )
          }
          if (ready !== undefined && p === acked + 1 && diffs(stateAfter(acked), o, storage).count > 0)
            committedNotAcked++
          for (let n = verified + 1; n <= p; n++) ops[states[n - verified - 1]!.op._tag]++
          state = stateAfter(p)
          verified = p
          return undefined
        })
    })

    const summary: Summary = {
      backend: storage,
      runner: harness.runner.kind,
      seed,
      rounds: result.rounds,
      ...result.kills,
      committedNotAcked,
      finalOp: verified,
      ops,
      finalLog: { start: state.start, end: state.end, batches: state.batches.length },
      ...result.timing,
      meanObserveMs: Math.round(observeMsTotal / Math.max(1, result.rounds)),
      violation: result.violation
    }
    return summary
  }).pipe(Effect.scoped)

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

/** Checks that the rounds did enough that the test cannot pass vacuously. */
const progress = (s: Summary, context: string) => {
  assert.strictEqual(s.rounds, ROUNDS, context)
  assert.isTrue(s.finalOp >= MIN_FINAL_OP, `too little progress: final operation ${s.finalOp} (${context})`)
  assert.isTrue(s.killsMidRun >= s.rounds / 2, `too few kills landed while the log was written (${context})`)
  if (ROUNDS >= 20) {
    for (const kind of OPERATION_KINDS) {
      assert.isTrue(s.ops[kind] > 0, `no ${kind} operation was verified (${context})`)
    }
  }
}

/** A summary of rounds on a backend's store. */
type StoreSummary = Summary & { readonly backend: BackendName }

describe("TabletLog crash consistency under kill -9", () => {
  killTests<TornMode, StoreSummary>({
    name: "tablet log crash",
    harness,
    tornModes: TORN_MODES,
    rounds: ROUNDS,
    tornRounds: TORN_ROUNDS,
    timeoutMs: (rounds) => 60_000 + rounds * 3_000,
    rerun: rerun(SEED),
    title: (backend) =>
      `${backend}: after every kill the log is the model up to the last operation acknowledged or the one after`,
    tornTitle: (backend, torn) =>
      `${backend}: the checker catches a log that writes its batches apart from its fields (${torn})`,
    tornChild: "log",
    loop: (backend, rounds, torn) =>
      crashLoop({ storage: backend, seed: SEED, rounds, torn }).pipe(Effect.map((s) => ({ ...s, backend }))),
    progress
  })

  it.live(
    "segment log: after every kill the log is the model up to the last operation acknowledged or the one after",
    () =>
      Effect.gen(function* () {
        console.log(`tablet log crash segments: ${ROUNDS} kills, runner ${harness.runner.kind}, ${rerun(SEED)}`)
        const s = yield* crashLoop({ storage: "segments", seed: SEED, rounds: ROUNDS, torn: undefined })
        console.log(`tablet log crash ${showSummary(s)}`)
        const context = `segments, ${rerun(SEED)}\n${showSummary(s)}`
        if (s.violation !== undefined) assert.fail(`${s.violation.message}\n${context}`)
        progress(s, context)
      }).pipe(Effect.mapError((e) => new Error(`${e.message}\nsegments, ${rerun(SEED)}`))),
    60_000 + ROUNDS * 3_000
  )
})
