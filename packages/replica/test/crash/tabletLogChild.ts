/**
 * The TabletLog crash-test workload, and the child process that runs it.
 *
 * As a program: `tabletLogChild.ts <level|rocksdb> <directory> <seed> <from> <segments>
 * [--torn=batches-first|fields-first]` opens the backend at `directory`, the partition store `STORE_ID` and the
 * `TabletLog` of `TABLET` on it (with `segments` 1: the segment log of `TABLET` in `directory` instead, in segments
 * of `SEGMENT_BYTES`, and the backend argument names nothing), then runs
 * operation after operation from number `from` on, forever (the parent passes the one after the last it verified).
 * Operation n is `operation(seed, n, log)`: a function of (seed, n) and the log's start and end only, mostly an
 * append, sometimes a high-watermark checkpoint, a truncation a few records back, a retention cut or a reset. It
 * prints `opening` before it opens the database, `ready <from> <start> <end> <hw>` once the log is open, and
 * `w <n>` after operation n completed. It never exits by itself: the crash test kills it with SIGKILL.
 *
 * `--torn=…` makes it a deliberately broken log, for the checker's self-test: the partition store under the log
 * splits every write into two, the batch keys (`0x01…`) apart from the rest (fields, epoch entries), the batches
 * first (`batches-first`) or last (`fields-first`), with a short pause between the halves so that kills often land
 * there. A kill in between leaves the records and the log's fields apart.
 *
 * As a module: the deterministic workload and the model the crash test replays (`step`), on the same
 * `LeaderEpochCache` functions the log uses for its epochs.
 */
import type { Store } from "@strata/core"
import { Effect } from "effect"
import {
  type BackendName,
  type ChildArgs,
  childMain,
  openPartition,
  report,
  type StoreAdapter
} from "../../../../scripts/test-support/crashChild.js"
import { below, mix32, prng } from "../../../../scripts/test-support/prng.js"
import * as Codec from "../../src/wire/internal/batchCodec.js"
import * as LeaderEpochCache from "../../src/machines/LeaderEpochCache.js"
import * as SegmentLog from "../../src/server/SegmentLog.js"
import * as TabletLog from "../../src/server/TabletLog.js"

/** The partition store the log lives in, and the tablet it is the log of. */
export const STORE_ID = { table: "tablet-crash", partition: 0 } as const
export const TABLET = { table: "crash", bucket: 0 } as const

/** The segment size of the segment log's runs: small, so that the log rolls, and retention deletes whole segments. */
export const SEGMENT_BYTES = 64 * 1024

/** Opens the segment log the crash test runs on in `directory`. */
export const openSegmentLog = (directory: string) =>
  SegmentLog.make({ directory, tablet: TABLET, segmentBytes: SEGMENT_BYTES })

/** How a deliberately broken child splits each write of the log (see the module comment). */
export type TornMode = "batches-first" | "fields-first"
export const TORN_MODES: ReadonlyArray<TornMode> = ["batches-first", "fields-first"]

/** A batch holds 1 to MAX_RECORDS records; a value 0 to MAX_VALUE_BYTES bytes. */
export const MAX_RECORDS = 20
export const MAX_VALUE_BYTES = 2048

// ---------------------------------------------------------------------------
// The workload: operation n is a function of (seed, n) and the log's start and end
// ---------------------------------------------------------------------------

/** The random numbers of operation n, seeded from (seed, n) and a salt per use. */
const numbers = (seed: number, n: number, salt: number) => prng(mix32(mix32(seed ^ salt) ^ mix32(n + 0x9e3779b9)))

/** Fixed pseudo-random filler, so values do not compress away. */
const FILLER = (() => {
  const random = prng(0x7ab1e)
  const out = new Uint8Array(64 * 1024)
  for (let i = 0; i < out.length; i++) out[i] = below(random, 256)
  return out
})()

const encoder = new TextEncoder()

/** `length` bytes: the tag (cut when shorter), then filler from a position the random source picks. */
const bytes = (random: () => number, tag: string, length: number): Uint8Array => {
  const out = new Uint8Array(length)
  const head = encoder.encode(tag).subarray(0, length)
  out.set(head)
  const from = below(random, FILLER.length - length)
  out.set(FILLER.subarray(from, from + length - head.length), head.length)
  return out
}

/** The leader epoch operation n appends under: it grows every 37 operations. */
export const epochOf = (n: number): number => 1 + Math.floor(n / 37)

/** The records operation n appends (when it is an append): 1–20, keys null or 0–32 bytes, 0–2 headers. */
export const recordsOf = (seed: number, n: number): Array<TabletLog.TabletRecord> => {
  const random = numbers(seed, n, 0x5eed_0001)
  const count = 1 + below(random, MAX_RECORDS)
  return Array.from({ length: count }, (_, i) => {
    const tag = `n${n}r${i}|`
    const key = random() < 0.25 ? null : bytes(random, tag, below(random, 33))
    const value = bytes(random, tag, below(random, MAX_VALUE_BYTES + 1))
    const headers = Array.from({ length: below(random, 3) }, (_, h) => ({
      key: h === 0 ? "trace" : `ключ-${below(random, 100)}`,
      value: bytes(random, tag, below(random, 65))
    }))
    return { key, value, headers, timestamp: 1_700_000_000_000 + n * 1000 + i }
  })
}

/** One operation on the log. */
export type Operation =
  | { readonly _tag: "append"; readonly epoch: number; readonly records: ReadonlyArray<TabletLog.TabletRecord> }
  | { readonly _tag: "checkpoint"; readonly hw: number }
  | { readonly _tag: "truncate"; readonly offset: number }
  | { readonly _tag: "deleteBefore"; readonly offset: number }
  | { readonly _tag: "reset"; readonly offset: number }

export const OPERATION_KINDS: ReadonlyArray<Operation["_tag"]> = [
  "append",
  "checkpoint",
  "truncate",
  "deleteBefore",
  "reset"
]

/**
 * Operation n on a log from `start` to `end`. Every one is valid there: truncations stay at or past the start,
 * retention cuts and checkpoints at or before the end, and epochs never go down. Retention keeps the log to a few
 * hundred records (at most about 1,500), so that reading it back after every kill stays cheap.
 */
export const operation = (
  seed: number,
  n: number,
  log: { readonly start: number; readonly end: number }
): Operation => {
  const random = numbers(seed, n, 0x0fe7_0002)
  const r = random()
  const size = log.end - log.start
  if (r < 0.7) return { _tag: "append", epoch: epochOf(n), records: recordsOf(seed, n) }
  if (r < 0.84) return { _tag: "checkpoint", hw: log.end - below(random, Math.min(size, 40) + 1) }
  if (r < 0.92) return { _tag: "truncate", offset: Math.max(log.start, log.end - 1 - below(random, 30)) }
  if (r < 0.995) {
    const offset = random() < 0.1 ? log.end : Math.max(log.start, log.end - below(random, 1200))
    return { _tag: "deleteBefore", offset }
  }
  return { _tag: "reset", offset: log.end + below(random, 100) }
}

/** Runs an operation on a log. */
export const apply = (log: TabletLog.TabletLog, op: Operation): Effect.Effect<void, TabletLog.TabletLogError> => {
  switch (op._tag) {
    case "append":
      return Effect.asVoid(log.append(op.epoch, op.records))
    case "checkpoint":
      return log.checkpointHighWatermark(op.hw)
    case "truncate":
      return log.truncateTo(op.offset)
    case "deleteBefore":
      return log.deleteBefore(op.offset)
    case "reset":
      return log.resetTo(op.offset)
  }
}

// ---------------------------------------------------------------------------
// The model: what the log holds after operations 0..n
// ---------------------------------------------------------------------------

/** A log as the model keeps it: `batches` are the stored ones (the first may begin before `start`). */
export interface State {
  readonly start: number
  readonly end: number
  readonly hw: number
  readonly epochs: LeaderEpochCache.LeaderEpochCache
  readonly batches: ReadonlyArray<TabletLog.Batch>
}

export const initial: State = { start: 0, end: 0, hw: 0, epochs: LeaderEpochCache.empty, batches: [] }

/** The state after an operation, as the log's documentation describes it. */
export const next = (s: State, op: Operation): State => {
  switch (op._tag) {
    case "append":
      return {
        ...s,
        end: s.end + op.records.length,
        epochs: LeaderEpochCache.assign(s.epochs, op.epoch, s.end),
        batches: [...s.batches, { baseOffset: s.end, epoch: op.epoch, records: op.records }]
      }
    case "checkpoint":
      return { ...s, hw: Math.min(Math.max(op.hw, s.start), s.end) }
    case "truncate": {
      if (op.offset >= s.end) return s
      const batches: Array<TabletLog.Batch> = []
      for (const b of s.batches) {
        if (b.baseOffset >= op.offset) break
        const kept = Math.min(b.records.length, op.offset - b.baseOffset)
        batches.push(kept === b.records.length ? b : { ...b, records: b.records.slice(0, kept) })
      }
      return {
        start: s.start,
        end: op.offset,
        hw: Math.min(s.hw, op.offset),
        epochs: LeaderEpochCache.truncateFromEnd(s.epochs, op.offset),
        batches
      }
    }
    case "deleteBefore":
      if (op.offset <= s.start) return s
      return {
        start: op.offset,
        end: s.end,
        hw: Math.max(s.hw, op.offset),
        epochs: LeaderEpochCache.truncateFromStart(s.epochs, op.offset),
        batches: s.batches.filter((b) => b.baseOffset + b.records.length > op.offset)
      }
    case "reset":
      return { start: op.offset, end: op.offset, hw: op.offset, epochs: LeaderEpochCache.empty, batches: [] }
  }
}

/** Operation n of `seed` on the model, and the state after it. */
export const step = (seed: number, n: number, s: State): { readonly op: Operation; readonly state: State } => {
  const op = operation(seed, n, s)
  return { op, state: next(s, op) }
}

// ---------------------------------------------------------------------------
// The child program
// ---------------------------------------------------------------------------

/** The adapter of `backend`, imported when first asked for (the other backend's driver stays unloaded). */
export const loadAdapter = (
  backend: BackendName
): Promise<StoreAdapter<Store.Id, Store.PartitionStore, Store.StoreError>> =>
  backend === "level" ? import("@strata/store-adapters/level") : import("@strata/store-adapters/rocksdb")

/** How long a torn child waits between the two halves of a write: a kill lands there often, the self-test is quick. */
const TORN_PAUSE_MS = 2

/** The partition store with each write split in two: batch keys and the rest, in `mode`'s order. */
const tornStore = (store: Store.PartitionStore, mode: TornMode): Store.PartitionStore => {
  const isBatch = (key: Uint8Array) => key[0] === Codec.BATCHES.gte[0]
  return {
    ...store,
    write: (ops, options) => {
      const batches = ops.filter((op) => isBatch(op.key))
      const rest = ops.filter((op) => !isBatch(op.key))
      if (batches.length === 0 || rest.length === 0) return store.write(ops, options)
      const [first, second] = mode === "batches-first" ? [batches, rest] : [rest, batches]
      return store
        .write(first)
        .pipe(Effect.andThen(Effect.sleep(TORN_PAUSE_MS)), Effect.andThen(store.write(second, options)))
    }
  }
}

/** Opens the log the child runs on: on the backend's partition store, or the segment log. */
const openLog = (backend: BackendName, directory: string, segments: boolean, torn: TornMode | undefined) =>
  segments
    ? Effect.andThen(report.opening, openSegmentLog(directory))
    : Effect.gen(function* () {
        const partition = yield* openPartition(() => loadAdapter(backend), directory, STORE_ID, report.opening)
        return yield* TabletLog.make(torn === undefined ? partition : tornStore(partition, torn), TABLET)
      })

const run = ({
  backend,
  directory,
  seed,
  numbers: { from, segments },
  torn
}: ChildArgs<"from" | "segments", TornMode>) =>
  Effect.scoped(
    Effect.gen(function* () {
      const log = yield* openLog(backend, directory, segments === 1, torn)
      const view = { start: yield* log.logStartOffset, end: yield* log.logEndOffset }
      yield* report.ready(from, view.start, view.end, yield* log.highWatermark)
      for (let n = from; ; n++) {
        yield* apply(log, operation(seed, n, view))
        view.start = yield* log.logStartOffset
        view.end = yield* log.logEndOffset
        yield* report.acked(n)
      }
    })
  )

childMain(import.meta.url, {
  program: "tabletLogChild.ts",
  numbers: ["from", "segments"],
  tornModes: TORN_MODES,
  loopName: "operation loop",
  loop: run
})
