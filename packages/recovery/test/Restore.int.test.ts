/**
 * A large restore on Kafka + RocksDB, killed with SIGKILL midway and restarted (docs/ARCHITECTURE.md, "Real-process tests":
 * after any crash and restart each table equals a replay of its changelog up to the persisted offset).
 *
 * Method. The test produces `STRATA_RESTORE_RECORDS` (default 1,000,000) records to a fresh changelog topic
 * `<app>-kv-changelog` (12 partitions, keys and values encoded by `Table.codecs`, seeded: about four writes per
 * key, half of them to a hot twentieth of the keys, 5 % tombstones), checking that their offsets are dense. It then
 * runs the worker (`fixtures/restore-worker.ts`: `Tables` on `KafkaLog` + `RocksDbStore`, table `kv`, every
 * partition assigned, wait for recovery) on one data directory and kills it with SIGKILL `STRATA_RESTORE_KILLS`
 * times (default 3, at least 2) at seeded points — the first early, the last late: kill i lands once the worker
 * reports that the store holds a seeded fraction of the changelog, drawn from the i-th of equal slices of
 * [5 %, 90 %]. After each kill the test opens the data directory itself and checks, per partition p:
 *   - durability: the persisted changelog offset is at least the last one the worker reported as written, never
 *     goes back, and is below the highwater;
 *   - replay: the store equals the workload replayed up to and including the persisted offset (every key's last
 *     value byte for byte, deleted and unwritten keys absent);
 *   - resume: the next run starts restoring right after it (its recovery reads exactly that persisted offset).
 * Finally the worker runs to completion unkilled: it must apply exactly the remainder, report every partition at its
 * highwater and read back the expected entry counts, and the store the test opens after the worker exits must
 * equal the whole changelog replayed (last value per key; tombstoned keys absent).
 *
 * Self-test: the test then plants a wrong value, a lost key and a resurrected tombstone in the finished store and
 * requires the checker to report all three.
 *
 * The replay is computed from the seed (the produced offsets are checked to be dense from 0, so record order is
 * changelog order). The worker is bundled once with esbuild; the Kafka client and RocksDB stay external.
 * Knobs: STRATA_RESTORE_RECORDS, STRATA_RESTORE_KILLS, STRATA_RESTORE_SEED, STRATA_RESTORE_RUNNER=tsx (the tsx loader
 * instead of the bundle), STRATA_RESTORE_TRACE=1 (print the worker's events with their times). Kill timing is real
 * time: a seed fixes the data and the kill fractions, not the instants.
 */
import { Log, Store } from "@strata/core"
import {
  childHarness,
  envInt,
  HarnessError,
  parseJsonLine,
  rerunCommand,
  runChild
} from "../../../scripts/test-support/childRun.js"
import { mkdtemp } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { KafkaLog } from "@strata/kafka"
import * as RocksDbStore from "@strata/store-adapters/rocksdb"
import { Data, Effect, Option, Result, Stream } from "effect"
import { inject } from "vitest"
import * as Table from "../../tables/src/Table.js"
import { prng } from "../../../scripts/test-support/prng.js"
import {
  DELETED,
  keyCountOf,
  keyIndex,
  keyName,
  kvTable,
  PARTITIONS,
  partitionOfKey,
  type RestoreEvent,
  replay,
  valueOfRecord,
  workload
} from "./fixtures/restore.js"

// ---------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------

const SEED = envInt("STRATA_RESTORE_SEED", 20_261_130)
const RECORDS = Math.max(1000, envInt("STRATA_RESTORE_RECORDS", 1_000_000))
const KILLS = Math.max(2, envInt("STRATA_RESTORE_KILLS", 3))
/** Kill fractions are drawn from equal slices of this range (of the changelog held by the store). */
const KILL_FROM = 0.05
const KILL_TO = 0.9
/** Records per `produceBatch` call (one request). */
const PRODUCE_CHUNK = 20_000
/** A worker whose store stops growing (no new progress) this long has hung. */
const STALL_MS = 30_000
const EXIT_TIMEOUT_MS = 15_000
const TEST_TIMEOUT_MS = 300_000
const TRACE = !["", "0", "false"].includes(process.env.STRATA_RESTORE_TRACE ?? "")

const rerun = rerunCommand({
  seedVar: "STRATA_RESTORE_SEED",
  seed: SEED,
  project: "integration",
  file: "packages/recovery/test/Restore.int.test.ts"
})

// ---------------------------------------------------------------------------
// The worker program, bundled once
// ---------------------------------------------------------------------------

const here = dirname(fileURLToPath(import.meta.url))
const workerSource = join(here, "fixtures", "restore-worker.ts")

const harness = childHarness({
  label: "restore",
  source: workerSource,
  external: ["@nxtedition/rocksdb", "@platformatic/kafka"],
  preferTsx: process.env.STRATA_RESTORE_RUNNER === "tsx"
})

// ---------------------------------------------------------------------------
// One run of the worker
// ---------------------------------------------------------------------------

/** Which property broke: `durability`, `replay` or `resume` (see the file comment). */
type ViolationKind = "durability" | "replay" | "resume"

/** A property of the restore was broken. */
class Violation extends Data.TaggedError("Violation")<{
  readonly kind: ViolationKind
  readonly round: number
  readonly detail: string
}> {
  override get message() {
    return `round ${this.round}: ${this.kind}: ${this.detail}`
  }
}

/** Records the store holds according to per-partition persisted offsets (-1: none). */
const held = (persisted: ReadonlyArray<number>) => persisted.reduce((n, o) => n + o + 1, 0)

type Progress = Extract<RestoreEvent, { ev: "progress" }>
type Ready = Extract<RestoreEvent, { ev: "ready" }>

interface RunOutcome {
  /** The persisted offset recovery read per partition (-1: none; undefined: not reported). */
  readonly from: ReadonlyArray<number | undefined>
  /** The last progress the worker reported (before the kill, or before `ready`). */
  readonly progress: Progress | undefined
  readonly ready: Ready | undefined
  /** From spawn to `recovering`. */
  readonly startMs: number
  /** From `recovering` to the kill or to `ready`. */
  readonly restoreMs: number
}

/** Kills the worker once its store holds `killAt` records, or (`undefined`) lets it finish and exit 0. */
const runWorker = (args: ReadonlyArray<string>, killAt: number | undefined) => {
  const from = new Array<number | undefined>(PARTITIONS).fill(undefined)
  let progress: Progress | undefined
  let ready: Ready | undefined
  let recoveringAt: number | undefined
  let endAt: number | undefined
  let lastGrowth = performance.now()
  return runChild<RunOutcome>({
    label: "worker",
    harness,
    args,
    exitTimeoutMs: EXIT_TIMEOUT_MS,
    onStart: (control) => {
      // A restore whose store stops growing has hung: kill it and fail.
      control.every(1000, () => {
        if (!control.killed() && ready === undefined && performance.now() - lastGrowth > STALL_MS) {
          control.fail(`the worker's store did not grow for ${STALL_MS} ms (last progress ${JSON.stringify(progress)})`)
        }
      })
    },
    onLine: (line, control) => {
      const event = parseJsonLine<RestoreEvent>(line)
      if (event === undefined) return
      if (TRACE) console.log(`restore trace ${Math.round(control.elapsed())} ms: ${line.slice(0, 200)}`)
      const kill = () => {
        endAt = control.elapsed()
        control.kill()
      }
      switch (event.ev) {
        case "loaded":
          break
        case "recovering":
          recoveringAt = control.elapsed()
          break
        case "from":
          from[event.partition] = event.persisted
          break
        case "progress":
          if (progress === undefined || event.applied > progress.applied) lastGrowth = performance.now()
          progress = event
          if (killAt !== undefined && from.every((f) => f !== undefined) && held(event.persisted) >= killAt) kill()
          break
        case "ready":
          ready = event
          endAt = control.elapsed()
          if (killAt !== undefined && !control.killed()) {
            control.fail(`the worker completed the restore before its kill at ${killAt} records`)
          }
          break
      }
    },
    onExit: ({ code, signal, killed }) => {
      if (!killed && !(code === 0 && ready !== undefined)) {
        return {
          failure: `the worker exited by itself (code ${code}, signal ${signal}) ${ready === undefined ? "before" : "after"} "ready"`
        }
      }
      const end = endAt ?? recoveringAt ?? 0
      return {
        outcome: {
          from,
          progress,
          ready,
          startMs: Math.round(recoveringAt ?? end),
          restoreMs: Math.round(end - (recoveringAt ?? end))
        }
      }
    }
  })
}

// ---------------------------------------------------------------------------
// The checker: the store against the workload replayed to its persisted offsets
// ---------------------------------------------------------------------------

const codecs = Table.codecs(kvTable)
const decoder = new TextDecoder()

interface StoreCheck {
  readonly persisted: ReadonlyArray<number>
  readonly entries: number
}

/**
 * Opens the data directory in this process (the worker is gone, its lock with it), reads each partition's persisted
 * changelog offset and compares every entry with the replay up to it; fails with `replay` on the first differences.
 */
const checkStore = (directory: string, changelog: string, round: number) =>
  Effect.scoped(
    Effect.gen(function* () {
      const store = yield* RocksDbStore.make({ directory })
      const persisted: Array<number> = []
      const parts: Array<Store.PartitionStore> = []
      for (let partition = 0; partition < PARTITIONS; partition++) {
        const ps = yield* store.open({ table: kvTable.name, partition })
        persisted.push(Option.getOrElse(yield* ps.persistedOffset({ topic: changelog, partition }), () => -1))
        parts.push(ps)
      }
      const expected = replay(SEED, RECORDS, persisted)
      const live = new Array<number>(PARTITIONS).fill(0)
      for (let key = 0; key < expected.length; key++) if (expected[key]! >= 0) live[partitionOfKey(key)]!++
      const problems: Array<string> = []
      const seen = new Uint8Array(expected.length)
      let count = 0
      for (const [partition, ps] of parts.entries()) {
        let found = 0
        yield* Stream.runForEach(ps.scan(), ([k, v]) =>
          Effect.sync(() => {
            found++
            const decoded = codecs.decodeKey(k)
            const key = Result.isSuccess(decoded) ? keyIndex(decoded.success) : -1
            const seq = key >= 0 && key < expected.length ? expected[key]! : DELETED
            if (key < 0 || partitionOfKey(key) !== partition || seq < 0) {
              problems.push(`partition ${partition}: unexpected ${decoder.decode(k)} = ${decoder.decode(v)}`)
              return
            }
            seen[key] = 1
            const want = Result.getOrThrow(codecs.encodeValue(valueOfRecord(seq)))
            if (Buffer.compare(want, v) !== 0) {
              problems.push(
                `partition ${partition}: ${decoder.decode(k)} = ${decoder.decode(v)}, expected ${decoder.decode(want)}`
              )
            }
          })
        )
        if (found !== live[partition]) {
          problems.push(`partition ${partition}: ${found} entries, expected ${live[partition]} live keys`)
        }
        for (let key = partition; key < expected.length; key += PARTITIONS) {
          if (expected[key]! >= 0 && seen[key] === 0) {
            const want = decoder.decode(Result.getOrThrow(codecs.encodeValue(valueOfRecord(expected[key]!))))
            problems.push(`partition ${partition}: missing "${keyName(key)}" = ${want}`)
          }
        }
        count += found
      }
      if (problems.length > 0) {
        return yield* new Violation({
          kind: "replay",
          round,
          detail:
            `the store (persisted offsets ${JSON.stringify(persisted)}) differs from the changelog replayed up to ` +
            `them in ${problems.length} place(s):\n  ${problems.slice(0, 8).join("\n  ")}`
        })
      }
      return { persisted, entries: count } satisfies StoreCheck
    })
  )

/**
 * The checker's self-test: plants a wrong value, a lost key and a resurrected tombstone in a finished store (one
 * of each in partition 0) and requires `checkStore` to report each of them.
 */
const plantAndCheck = (directory: string, changelog: string, round: number) =>
  Effect.gen(function* () {
    const final = replay(SEED, RECORDS, new Array<number>(PARTITIONS).fill(Number.MAX_SAFE_INTEGER))
    const inPartition0 = (want: (seq: number) => boolean) => {
      for (let key = 0; key < final.length; key += PARTITIONS) if (want(final[key]!)) return key
      return -1
    }
    const stale = inPartition0((seq) => seq >= 0)
    const lost = final.findIndex((seq, key) => key > stale && partitionOfKey(key) === 0 && seq >= 0)
    const resurrected = inPartition0((seq) => seq === DELETED)
    if (stale < 0 || lost < 0 || resurrected < 0) {
      return yield* new HarnessError({ detail: "the workload has no live and deleted keys to plant bugs on" })
    }
    const bytes = (key: number) => Result.getOrThrow(codecs.encodeKey(keyName(key)))
    yield* Effect.scoped(
      Effect.gen(function* () {
        const store = yield* RocksDbStore.make({ directory })
        const ps = yield* store.open({ table: kvTable.name, partition: 0 })
        yield* ps.write([
          Store.put(bytes(stale), Result.getOrThrow(codecs.encodeValue(valueOfRecord(final[stale]! + 1)))),
          Store.del(bytes(lost)),
          Store.put(bytes(resurrected), Result.getOrThrow(codecs.encodeValue(valueOfRecord(0))))
        ])
      })
    )
    const outcome = yield* Effect.result(checkStore(directory, changelog, round))
    const detail =
      Result.isFailure(outcome) && outcome.failure._tag === "Violation" && outcome.failure.kind === "replay"
        ? outcome.failure.detail
        : `no replay violation: ${Result.isFailure(outcome) ? outcome.failure.message : "the check passed"}`
    const caught = [stale, lost, resurrected].filter((key) => detail.includes(`"${keyName(key)}"`))
    if (caught.length < 3) {
      return yield* new HarnessError({
        detail: `the checker named only ${caught.length} of 3 planted bugs (keys ${stale}, ${lost}, ${resurrected}): ${detail}`
      })
    }
    return detail.split("\n")[0]!
  })

// ---------------------------------------------------------------------------
// The scenario
// ---------------------------------------------------------------------------

/** What one run did, for the summary. */
interface RunSummary {
  readonly round: number
  readonly killed: boolean
  /** Records the store held when the run started, and when it was killed or completed. */
  readonly fromRecords: number
  readonly toRecords: number
  readonly startMs: number
  readonly restoreMs: number
  /** Records per second restored by this run (store growth over `restoreMs`). */
  readonly rate: number
  readonly checkMs: number
}

const restore = Effect.fn("restore")(function* () {
  const started = performance.now()
  const log = yield* Log.Log
  const brokers = inject("kafka")
  const id = `${Date.now().toString(36)}${Math.floor(Math.random() * 36 ** 4).toString(36)}`
  const app = `restore-${id}`
  const changelog = Table.changelogTopicOf(app, kvTable)
  const directory = yield* Effect.promise(() => mkdtemp(join(tmpdir(), "strata-restore-")))
  harness.tempDirs.push(directory)
  const args = [brokers, app, directory]

  // --- the changelog ---
  yield* log.ensureTopic({ topic: changelog, partitions: PARTITIONS, compacted: true })
  const keyBytes = Array.from({ length: keyCountOf(RECORDS) }, (_, i) =>
    Result.getOrThrow(codecs.encodeKey(keyName(i)))
  )
  const next = new Array<number>(PARTITIONS).fill(0)
  /** Produces one chunk and checks its offsets are dense (so record order is changelog order). */
  const produce = (records: ReadonlyArray<Log.ProducerRecord>) =>
    Effect.gen(function* () {
      const offsets = yield* log.produceBatch(records, { acks: 1 })
      for (const [i, r] of records.entries()) {
        const want = next[r.partition]!
        if (offsets[i] !== want) {
          return yield* new HarnessError({
            detail: `a produced record went to ${r.partition}@${offsets[i]}, expected offset ${want} (not dense)`
          })
        }
        next[r.partition] = want + 1
      }
    })
  let chunk: Array<Log.ProducerRecord> = []
  for (const { seq, key, tombstone } of workload(SEED, RECORDS)) {
    chunk.push({
      topic: changelog,
      partition: partitionOfKey(key),
      key: keyBytes[key]!,
      value: tombstone ? null : Result.getOrThrow(codecs.encodeValue(valueOfRecord(seq)))
    })
    if (chunk.length === PRODUCE_CHUNK) {
      yield* produce(chunk)
      chunk = []
    }
  }
  if (chunk.length > 0) yield* produce(chunk)
  const produceMs = performance.now() - started
  const highwater = (yield* log.offsets(next.map((_, partition) => ({ topic: changelog, partition })))).map(
    (o) => o.highwater
  )
  if (highwater.some((h, p) => h !== next[p])) {
    return yield* new HarnessError({ detail: `highwaters ${highwater}, produced ${next}` })
  }
  const last = highwater.map((h) => h - 1)
  const expectedLive = (() => {
    const final = replay(SEED, RECORDS, last)
    let n = 0
    for (const seq of final) if (seq >= 0) n++
    return n
  })()

  // --- the kills ---
  const schedule = prng(SEED)
  const slice = (KILL_TO - KILL_FROM) / KILLS
  const targets = Array.from({ length: KILLS }, (_, i) =>
    Math.floor((KILL_FROM + slice * (i + 0.1 + 0.8 * schedule())) * RECORDS)
  )
  let persisted: ReadonlyArray<number> = new Array<number>(PARTITIONS).fill(-1)
  const runs: Array<RunSummary> = []
  const checkResume = (round: number, outcome: RunOutcome) =>
    outcome.from.every((f, p) => f === persisted[p])
      ? Effect.void
      : Effect.fail(
          new Violation({
            kind: "resume",
            round,
            detail: `recovery read persisted offsets ${JSON.stringify(outcome.from)}, the store had ${JSON.stringify(persisted)}`
          })
        )
  for (const [i, target] of targets.entries()) {
    const round = i + 1
    const outcome = yield* runWorker(args, target)
    yield* checkResume(round, outcome)
    const t0 = performance.now()
    const check = yield* checkStore(directory, changelog, round)
    for (let p = 0; p < PARTITIONS; p++) {
      const now = check.persisted[p]!
      const reported = outcome.progress?.persisted[p] ?? -1
      if (now < reported || now < persisted[p]! || now >= highwater[p]!) {
        return yield* new Violation({
          kind: "durability",
          round,
          detail:
            `partition ${p}: persisted offset ${now} after the kill; the worker reported ${reported}, the store ` +
            `had ${persisted[p]} before, the highwater is ${highwater[p]}`
        })
      }
    }
    runs.push({
      round,
      killed: true,
      fromRecords: held(persisted),
      toRecords: held(check.persisted),
      startMs: outcome.startMs,
      restoreMs: outcome.restoreMs,
      rate: Math.round(((held(check.persisted) - held(persisted)) * 1000) / Math.max(1, outcome.restoreMs)),
      checkMs: Math.round(performance.now() - t0)
    })
    persisted = check.persisted
  }

  // --- the last run: to completion ---
  const round = KILLS + 1
  const outcome = yield* runWorker(args, undefined)
  yield* checkResume(round, outcome)
  const ready = outcome.ready!
  const remainder = RECORDS - held(persisted)
  if (ready.applied !== remainder || ready.persisted.some((o, p) => o !== last[p])) {
    return yield* new Violation({
      kind: "resume",
      round,
      detail:
        `the last run applied ${ready.applied} records up to ${JSON.stringify(ready.persisted)}; expected the ` +
        `remainder ${remainder} up to ${JSON.stringify(last)}`
    })
  }
  const t0 = performance.now()
  const check = yield* checkStore(directory, changelog, round)
  if (check.persisted.some((o, p) => o !== last[p]) || check.entries !== expectedLive) {
    return yield* new Violation({
      kind: "replay",
      round,
      detail: `after completion the store is at ${JSON.stringify(check.persisted)} with ${check.entries} entries, expected ${JSON.stringify(last)} with ${expectedLive}`
    })
  }
  const readBack = ready.entries.reduce((a, b) => a + b, 0)
  if (readBack !== expectedLive) {
    return yield* new Violation({
      kind: "replay",
      round,
      detail: `the worker read back ${readBack} entries through the table (${JSON.stringify(ready.entries)}), expected ${expectedLive}`
    })
  }
  runs.push({
    round,
    killed: false,
    fromRecords: held(persisted),
    toRecords: RECORDS,
    startMs: outcome.startMs,
    restoreMs: ready.restoreMs,
    rate: Math.round((remainder * 1000) / Math.max(1, ready.restoreMs)),
    checkMs: Math.round(performance.now() - t0)
  })
  const planted = yield* plantAndCheck(directory, changelog, round + 1)
  return {
    seed: SEED,
    runner: harness.runner.kind,
    records: RECORDS,
    keys: keyCountOf(RECORDS),
    liveKeys: expectedLive,
    kills: KILLS,
    killTargets: targets,
    produceMs: Math.round(produceMs),
    runs,
    planted,
    wallMs: Math.round(performance.now() - started)
  }
})

describe("restore on Kafka + RocksDB under kill -9", () => {
  it.live(
    `a restore of ${RECORDS} changelog records killed ${KILLS} times completes and the store is exact`,
    () =>
      Effect.gen(function* () {
        console.log(`restore: ${RECORDS} records, ${KILLS} kills, runner ${harness.runner.kind}, ${rerun}`)
        const s = yield* restore()
        console.log(`restore ${JSON.stringify(s)}`)
        assert.strictEqual(s.runs.filter((r) => r.killed).length, KILLS)
        assert.isTrue(
          s.runs.every((r, i) => i === 0 || r.fromRecords > s.runs[i - 1]!.fromRecords),
          `every restart resumed further along (${JSON.stringify(s.runs)})`
        )
      }).pipe(
        Effect.provide(
          KafkaLog.layer({ brokers: [inject("kafka")], clientId: "restore-test", maxBatchRecords: PRODUCE_CHUNK })
        ),
        Effect.mapError((e) => new Error(`${e.message}\n${rerun}`))
      ),
    TEST_TIMEOUT_MS
  )
})
