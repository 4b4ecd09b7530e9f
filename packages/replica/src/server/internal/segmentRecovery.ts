/**
 * Opening a segment log (its checkpoints, a cut in progress completed, the segments checked, a walk of its tail that
 * cuts a torn one off) and closing it. See `SegmentLog.ts`.
 *
 * @internal
 */
import { Models } from "@strata/core"
import { join } from "node:path"
import { Cause, Clock, Effect, Semaphore } from "effect"
import * as LeaderEpochCache from "../../machines/LeaderEpochCache.js"
import * as ProducerState from "../../machines/ProducerState.js"
import type { TabletLogError } from "../TabletLog.js"
import * as Files from "./segmentFiles.js"
import * as Format from "./segmentFormat.js"
import {
  active,
  closeSegment,
  corrupt,
  createSegment,
  cutSegment,
  deleteSegment,
  disk,
  dropSnapshots,
  emptyAtStart,
  handleOf,
  holding,
  indexOf,
  type Opened,
  type Settings,
  setProducers,
  walk,
  writeHighWatermark,
  writeLogState,
  writeSnapshot
} from "./segmentLogState.js"
import * as Segments from "./segments.js"
import * as RecentTail from "./recentTail.js"

/** The bytes of a high-watermark checkpoint. */
const HW_BYTES = Format.encodeHighWatermark(0).length

/** Closes every file the log has open (what a failed opening, or the closing, leaves). */
const closeFiles = (o: Opened) =>
  Effect.gen(function* () {
    yield* Effect.forEach(o.segments, (s) => closeSegment(s).pipe(Effect.ignore), { discard: true })
    const file = o.hwFile
    o.hwFile = undefined
    if (file !== undefined) yield* Effect.ignore(Files.close(file, Format.HIGH_WATERMARK_FILE))
  })

/** Opens the log in its directory (see `recoverLog`); a failure closes what it opened. */
export const load = (options: Settings): Effect.Effect<Opened, TabletLogError> =>
  Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    const o: Opened = {
      tablet: options.tablet,
      name: Models.tabletKey(options.tablet),
      directory: options.directory,
      options,
      lock: Semaphore.makeUnsafe(1),
      segments: [],
      start: 0,
      end: 0,
      hw: 0,
      epochs: LeaderEpochCache.empty,
      producers: new Map(),
      openedAt: now,
      lastAppend: new Map(),
      snapshots: [],
      open: [],
      written: 0,
      flushedTo: 0,
      directoryDirty: false,
      hwFile: undefined,
      closed: false,
      broken: undefined,
      tail: RecentTail.make(options.tailBytes)
    }
    return yield* recoverLog(o, now).pipe(
      Effect.onError(() => closeFiles(o)),
      Effect.as(o)
    )
  })

/**
 * Reads the checkpoints, completes a cut in progress, checks the segments, then walks them from the latest usable
 * snapshot (see the module comment of `SegmentLog.ts`).
 */
const recoverLog = (o: Opened, now: number) =>
  Effect.gen(function* () {
    const directory = o.directory
    const path = (file: string) => join(directory, file)
    yield* disk(o, Files.ensureDirectory(directory))
    const bases: Array<number> = []
    const indexes: Array<number> = []
    for (const file of yield* disk(o, Files.list(directory))) {
      const kind = Format.kindOf(file)
      if (kind._tag === "Temp") yield* disk(o, Files.remove(path(file)))
      else if (kind._tag === "Segment") bases.push(kind.offset)
      else if (kind._tag === "Index") indexes.push(kind.offset)
      else if (kind._tag === "Snapshot") o.snapshots.push(kind.offset)
    }
    bases.sort((a, b) => a - b)
    o.snapshots.sort((a, b) => a - b)
    for (const i of indexes) if (!bases.includes(i)) yield* disk(o, Files.remove(path(Format.indexFile(i))))

    const stateBytes = yield* disk(o, Files.readIfExists(path(Format.LOG_STATE_FILE)))
    const logState = stateBytes === undefined ? undefined : Format.decodeLogState(stateBytes)
    if (typeof logState === "string") return yield* Effect.fail(corrupt(o, logState))
    /** What `log-state.checkpoint` holds now. */
    let written: Format.LogState | undefined = logState
    const hwBytes = yield* disk(o, Files.readIfExists(path(Format.HIGH_WATERMARK_FILE)))
    // Not flushed on every checkpoint: one a power loss damaged reads as absent.
    const hwRead = hwBytes === undefined ? undefined : Format.decodeHighWatermark(hwBytes)
    const checkpointedHw = typeof hwRead === "number" ? hwRead : undefined
    o.hwFile = yield* disk(o, Files.openOrCreate(path(Format.HIGH_WATERMARK_FILE)))

    o.start = logState?.start ?? bases[0] ?? 0
    for (const base of bases) {
      o.segments.push(
        Segments.segmentAt(directory, base, yield* disk(o, Files.sizeOf(path(Format.segmentFile(base)))), now)
      )
    }
    const cut = logState?.cut
    if (cut !== undefined) {
      yield* Effect.logWarning(`tablet ${o.name}: completing a cut of the log a crash interrupted`)
      if (cut._tag === "Empty") yield* emptyAtStart(o, now)
      else {
        const k = o.segments.findIndex((s) => s.base === cut.segment)
        if (k < 0) return yield* Effect.fail(corrupt(o, `the segment ${cut.segment} a cut ends in is missing`))
        yield* cutSegment(o, k, cut)
        yield* dropSnapshots(o, (s) => s > cut.end)
      }
    }
    // Segments wholly below the start (a retention that stopped before deleting them).
    while (o.segments.length > 1 && o.segments[1]!.base <= o.start) yield* deleteSegment(o, o.segments.shift()!)
    if (o.segments.length === 0) {
      // Only a new log has none: every change that deletes segments creates the next one first, or is a cut.
      if (logState !== undefined) return yield* Effect.fail(corrupt(o, "every segment file is missing"))
      o.segments.push(yield* createSegment(o, o.start, now))
    }
    if (o.segments[0]!.base > o.start) {
      const first = o.segments[0]!.base
      return yield* Effect.fail(corrupt(o, `the log starts at ${o.start}, its first segment at ${first}`))
    }
    yield* dropSnapshots(o, (s) => s < o.segments[0]!.base)

    // Walk from the latest snapshot's segment (from the first when the epochs' checkpoint is missing); a snapshot
    // past the log end found (a power loss took batches it covers) is dropped for the one before it.
    let recovered: Recovered
    let from: number
    for (;;) {
      const snapshot = o.snapshots.at(-1)
      const producers = new Map<number, ProducerState.Entry>()
      if (snapshot !== undefined) {
        const bytes = yield* disk(o, Files.readIfExists(path(Format.snapshotFile(snapshot))))
        const decoded = bytes === undefined ? "it is missing" : Format.decodeSnapshot(bytes)
        if (typeof decoded === "string" || decoded.asOf !== snapshot) {
          yield* Effect.logWarning(`tablet ${o.name}: producer snapshot ${snapshot} cannot be read; using an older one`)
          yield* dropSnapshots(o, (s) => s === snapshot)
          continue
        }
        for (const [id, entry] of decoded.producers) producers.set(id, entry)
      }
      const asOf = snapshot ?? o.segments[0]!.base
      from = logState === undefined ? 0 : holding(o, asOf)
      recovered = yield* recover(o, from, asOf, logState?.epochs ?? LeaderEpochCache.empty, producers)
      if (snapshot !== undefined && recovered.end < snapshot) {
        yield* dropSnapshots(o, (s) => s === snapshot)
        continue
      }
      break
    }
    // The segments before the walk: each must end where the next one starts.
    for (let i = 0; i < from && i < o.segments.length - 1; i++) yield* checkSealed(o, i)
    o.end = recovered.end
    let epochs = recovered.epochs
    if (o.start < o.end) epochs = LeaderEpochCache.truncateFromEnd(epochs, o.end)
    epochs = LeaderEpochCache.truncateFromStart(epochs, o.start)
    if (o.start > o.end || (o.start === o.end && (o.segments.length > 1 || active(o).base !== o.start))) {
      // Every batch is below the start (a retention to the end that stopped half-way, or a power loss that took
      // the batches past it): the log is emptied at its start, a cut like any other (its producers stay, as every
      // move of the start leaves them).
      written = { start: o.start, epochs, cut: { _tag: "Empty" } }
      yield* writeLogState(o, written)
      yield* emptyAtStart(o, now)
      if (recovered.producers.size > 0) yield* writeSnapshot(o, o.start, recovered.producers, true)
    }
    yield* dropSnapshots(o, (s) => s > o.end || s < o.segments[0]!.base)
    o.epochs = epochs
    // Producers stay when the start moves past their batches (see `SegmentLog.deleteBefore`).
    setProducers(o, recovered.producers)
    o.hw = Math.min(Math.max(checkpointedHw ?? o.start, o.start), o.end)
    if (hwBytes?.length !== HW_BYTES || checkpointedHw === undefined) {
      // Missing, or not a checkpoint: written whole once, so that each later one is a write in place.
      yield* writeHighWatermark(o, o.hw, false)
      yield* disk(o, Files.truncate(o.hwFile, Format.HIGH_WATERMARK_FILE, HW_BYTES))
    }
    if (
      written === undefined ||
      written.cut !== undefined ||
      written.start !== o.start ||
      JSON.stringify(written.epochs) !== JSON.stringify(o.epochs)
    ) {
      yield* writeLogState(o, { start: o.start, epochs: o.epochs })
    }
  })

/** What walking the tail of the log found: where it ends, the epochs, the producer entries. */
interface Recovered {
  readonly end: number
  readonly epochs: LeaderEpochCache.LeaderEpochCache
  readonly producers: Map<number, ProducerState.Entry>
}

/**
 * Walks the segments from the one at `from` to the last: checks every frame, and that each batch starts where the
 * one before it ended (across segments too); cuts the last segment at the first bytes that are not a whole batch
 * there (a torn tail). Anything else (a bad frame, or a segment that does not continue the one before it, in a
 * sealed segment) is `Corrupt`: sealed segments were flushed to the device before the next one was created, and
 * cuts are completed before the walk. Rebuilds the walked segments' indexes, the active segment's recent positions,
 * the epochs of the batches reaching past the start, and the producer entries of the batches at or past `asOf`.
 */
const recover = (
  o: Opened,
  from: number,
  asOf: number,
  checkpointed: LeaderEpochCache.LeaderEpochCache,
  producers: Map<number, ProducerState.Entry>
): Effect.Effect<Recovered, TabletLogError> =>
  Effect.gen(function* () {
    let epochs = checkpointed
    let expect = o.segments[from]!.base
    for (let i = from; i < o.segments.length; i++) {
      const segment = o.segments[i]!
      const last = i === o.segments.length - 1
      const file = Format.segmentFile(segment.base)
      if (segment.base !== expect) {
        return yield* Effect.fail(corrupt(o, `${file} does not continue the log at ${expect}`))
      }
      if (!last && segment.size === 0) return yield* Effect.fail(corrupt(o, `${file} is empty, not the last`))
      segment.index = new Format.Positions()
      segment.batches = Segments.recentPositions()
      segment.lastIndexed = 0
      let misplaced: string | undefined
      const walked = yield* walk(o, segment, 0, segment.size, Segments.WALK_CHUNK_BYTES, (f, position) => {
        if (f.baseOffset !== expect) {
          misplaced = `a batch at ${f.baseOffset} where ${expect} was expected`
          return false
        }
        Segments.noteBatch(segment, f.baseOffset, position, o.options.indexIntervalBytes)
        if (f.baseOffset + f.count > o.start) {
          epochs = LeaderEpochCache.assign(epochs, f.epoch, f.baseOffset)
          if (f.producer !== undefined && f.baseOffset >= asOf) {
            const id = f.producer.id
            producers.set(id, ProducerState.record(producers.get(id), f.producer, f.count, f.baseOffset))
          }
        }
        expect += f.count
        return true
      })
      if (walked.position < segment.size) {
        const why = walked.bad ?? misplaced
        if (!last) return yield* Effect.fail(corrupt(o, `${file} at byte ${walked.position}: ${why}`))
        yield* Effect.logWarning(
          `tablet ${o.name}: ${file} ends in ${segment.size - walked.position} bytes that are not whole batches ` +
            `(${why}); cutting them off`
        )
        yield* disk(o, Files.truncate(yield* handleOf(o, segment), segment.path, walked.position))
        segment.size = walked.position
      }
    }
    for (const segment of o.segments.slice(from, -1)) {
      segment.batches = undefined
      // Derived from the segment: not flushed (one lost or torn is rebuilt).
      yield* disk(o, Files.replace(o.directory, Format.indexFile(segment.base), segment.index!.encode(), false))
    }
    const last = active(o)
    o.open = o.open.filter((s) => s !== last)
    yield* handleOf(o, last)
    return { epochs, producers, end: expect }
  })

/**
 * Checks that the sealed segment at `i` ends where the next one starts, cheaply: its batches from its index's last
 * entry on (read from the index file's last 8 bytes, checked by the batch it points at; the whole index, rebuilt
 * from the segment when it fails its checks, when that entry does not lead to the segment's end). A bad batch
 * there, or an end that is not the next segment's base (a segment missing between them), is `Corrupt`.
 */
const checkSealed = (o: Opened, i: number) =>
  Effect.gen(function* () {
    const segment = o.segments[i]!
    const next = o.segments[i + 1]!.base
    const file = Format.segmentFile(segment.base)
    if (segment.size === 0) return yield* Effect.fail(corrupt(o, `${file} is empty, not the last`))
    /** Where the segment's batches from an index entry on end (or why they do not). */
    const endFrom = (entry: { readonly offset: number; readonly position: number }) =>
      Effect.gen(function* () {
        let expect = segment.base + entry.offset
        let misplaced: string | undefined
        const walked = yield* walk(o, segment, entry.position, segment.size, Segments.WALK_CHUNK_BYTES, (f) => {
          if (f.baseOffset !== expect) {
            misplaced = `a batch at ${f.baseOffset} where ${expect} was expected`
            return false
          }
          expect += f.count
          return true
        })
        const bad = walked.bad ?? misplaced
        if (bad !== undefined) return `${file} at byte ${walked.position}: ${bad}`
        return expect === next ? undefined : `${file} ends at ${expect}, the next segment starts at ${next}`
      })
    const tail = segment.index === undefined ? yield* disk(o, Files.readTail(segment.indexPath, 8)) : undefined
    const entry = tail === undefined ? undefined : Format.lastIndexEntry(tail.size, tail.tail)
    if (entry !== undefined && entry.position < segment.size && (yield* endFrom(entry)) === undefined) return
    // The index file missing, damaged, or not leading to the end: the whole index (rebuilt when it fails its checks).
    const index = yield* indexOf(o, segment)
    const wrong = yield* endFrom({
      offset: index.offsetAt(index.count - 1),
      position: index.positionAt(index.count - 1)
    })
    if (wrong !== undefined) return yield* Effect.fail(corrupt(o, wrong))
  })

/** Flushes the log to the device and closes its files (a snapshot of the producers as of the log end first). */
export const close = (o: Opened): Effect.Effect<void> =>
  Semaphore.withPermit(
    o.lock,
    Effect.gen(function* () {
      if (o.closed) return
      if (o.broken === undefined) {
        yield* writeSnapshot(o, o.end, o.producers, true)
        yield* writeHighWatermark(o, o.hw, true)
      }
    }).pipe(
      // One line: a log closed after its storage failed (a full disk) is closed again at every try of the storage.
      Effect.catchCause((cause) => {
        const e = Cause.squash(cause)
        return Effect.logWarning(
          `tablet ${o.name}: closing the log failed: ${e instanceof Error ? e.message : String(e)}`
        )
      }),
      Effect.andThen(closeFiles(o)),
      Effect.andThen(Effect.sync(() => (o.closed = true))),
      Effect.uninterruptible
    )
  )
