/**
 * An open segment log's state, and the operations on its segments and checkpoints that `SegmentLog` and its
 * recovery share (see `SegmentLog.ts` for the layout, and for the order in which changes reach the files).
 *
 * @internal
 */
import { type Models, Store } from "@strata/core"
import type { FileHandle } from "node:fs/promises"
import { join } from "node:path"
import { Effect, Semaphore } from "effect"
import type * as LeaderEpochCache from "../../machines/LeaderEpochCache.js"
import * as ProducerState from "../../machines/ProducerState.js"
import { isStorageFailure, PRODUCER_SCAN_BATCHES, TabletLogError } from "../TabletLog.js"
import * as Files from "./segmentFiles.js"
import * as Format from "./segmentFormat.js"
import * as RecentTail from "./recentTail.js"
import * as Segments from "./segments.js"

/** The most segments other than the active one kept open (file and index) at once. */
const MAX_OPEN_SEGMENTS = 16

/** The log's settings (its options, decoded). */
export interface Settings {
  readonly directory: string
  readonly tablet: Models.TabletId
  readonly segmentBytes: number
  readonly segmentMs?: number | undefined
  readonly indexIntervalBytes: number
  readonly flushIntervalMs?: number | undefined
  readonly flushBytes?: number | undefined
  readonly tailBytes: number
}

/** An open log: what its functions share. Its fields change only after the files say the same. */
export interface Opened {
  readonly tablet: Models.TabletId
  readonly name: string
  readonly directory: string
  readonly options: Settings
  readonly lock: Semaphore.Semaphore
  /** Its segments by base offset; the last is the active one. */
  segments: Array<Segments.Segment>
  start: number
  end: number
  hw: number
  epochs: LeaderEpochCache.LeaderEpochCache
  readonly producers: Map<number, ProducerState.Entry>
  /** When the log opened, in ms: a producer entry loaded is as of then. */
  readonly openedAt: number
  /** When each producer last appended here (since the log opened). */
  readonly lastAppend: Map<number, number>
  /** The offsets of its producer snapshots, increasing. */
  snapshots: Array<number>
  /** The sealed segments open (file and index), least recently used first. */
  open: Array<Segments.Segment>
  /** The bytes appended since the log opened (to whichever segment). */
  written: number
  /** How many of `written` are flushed to the device (the active segment's bytes past them are not). */
  flushedTo: number
  /** Whether a segment file was created since the directory was last flushed to the device. */
  directoryDirty: boolean
  /** The high-watermark checkpoint's file, open while the log is (written in place). */
  hwFile: FileHandle | undefined
  closed: boolean
  /** The storage failure that broke a change half-way: every operation fails with it until the log is reopened. */
  broken: TabletLogError | undefined
  /** The batches last written, as written, up to `tailBytes` of encodings: reads from there are answered from memory. */
  readonly tail: RecentTail.RecentTail
}

/** A log error of the log named `o.name`. */
export const error = (o: { readonly name: string }, reason: TabletLogError["reason"]) =>
  new TabletLogError({ tablet: o.name, reason })
/** A storage failure of the log. */
export const storeFailed = (o: { readonly name: string }) => (cause: Store.StoreError) =>
  error(o, { _tag: "StoreFailed", cause })
/** Data of the log that cannot be read. */
export const corrupt = (o: { readonly name: string }, detail: string) => error(o, { _tag: "Corrupt", detail })
/** An offset outside the log. */
export const outOfRange = (o: Opened, offset: number) =>
  error(o, { _tag: "OffsetOutOfRange", offset, start: o.start, end: o.end })

/** A file operation of the log. */
export const disk = <A>(o: { readonly name: string }, self: Effect.Effect<A, Store.StoreError>) =>
  Effect.mapError(self, storeFailed(o))

/** Runs `self` holding the log's lock, unless the log is closed or broken. */
export const alone = <A>(o: Opened, self: Effect.Effect<A, TabletLogError>) =>
  Semaphore.withPermit(
    o.lock,
    Effect.suspend(() => {
      if (o.broken !== undefined) return Effect.fail(o.broken)
      if (o.closed) {
        return Effect.fail(
          storeFailed(o)(Store.storeError(new Store.Closed({ store: `${Files.STORE_NAME} ${o.directory}` })))
        )
      }
      return self
    })
  )

/** Runs a change alone and uninterruptibly; a storage failure in it breaks the log (see the module comment). */
export const change = <A>(o: Opened, self: Effect.Effect<A, TabletLogError>) =>
  alone(
    o,
    Effect.uninterruptible(self).pipe(
      Effect.tapError((e) =>
        Effect.sync(() => {
          if (isStorageFailure(e)) o.broken = e
        })
      )
    )
  )

// ---------------------------------------------------------------------------
// Segments and checkpoints
// ---------------------------------------------------------------------------

/** The active segment: the last. */
export const active = (o: Opened): Segments.Segment => o.segments[o.segments.length - 1]!

/** The index of the segment holding `offset`: the last one based at or below it. */
export const holding = (o: Opened, offset: number): number => {
  let lo = 0
  let hi = o.segments.length - 1
  while (lo < hi) {
    const mid = (lo + hi + 1) >>> 1
    if (o.segments[mid]!.base <= offset) lo = mid
    else hi = mid - 1
  }
  return lo
}

/** Where the segment at `i` ends: the next one's base, or the log end. */
export const endOf = (o: Opened, i: number): number => o.segments[i + 1]?.base ?? o.end

/**
 * The segment's open file, opening it (and noting it among the open ones) if needed; not interruptible, so a file
 * opened is always kept (and closed with the segment).
 */
export const handleOf = (o: Opened, segment: Segments.Segment) =>
  Effect.uninterruptible(
    Effect.suspend(() =>
      segment.handle === undefined
        ? Effect.gen(function* () {
            segment.handle = yield* disk(o, Files.open(segment.path, "r+"))
            yield* used(o, segment)
            return segment.handle
          })
        : Effect.as(used(o, segment), segment.handle)
    )
  )

/** Notes that a sealed segment was used; closes the least recently used beyond `MAX_OPEN_SEGMENTS`. */
export const used = (o: Opened, segment: Segments.Segment) =>
  Effect.suspend(() => {
    if (segment === active(o)) return Effect.void
    o.open = [...o.open.filter((s) => s !== segment), segment]
    const evicted = o.open.length > MAX_OPEN_SEGMENTS ? o.open.splice(0, o.open.length - MAX_OPEN_SEGMENTS) : []
    return Effect.forEach(evicted, (s) => closeSegment(s).pipe(Effect.ignore), { discard: true })
  })

/** Closes a segment's file and forgets its index (it is read again when needed). */
export const closeSegment = (segment: Segments.Segment) =>
  Effect.suspend(() => {
    const handle = segment.handle
    segment.handle = undefined
    if (segment.batches === undefined) segment.index = undefined
    return handle === undefined ? Effect.void : Files.close(handle, segment.path)
  })

/** Reads the segment's frames from `position` up to `limit` (see `Segments.walk`). */
export const walk = (
  o: Opened,
  segment: Segments.Segment,
  position: number,
  limit: number,
  chunkBytes: number,
  visit: (frame: Format.Frame, position: number) => boolean
) => Effect.flatMap(handleOf(o, segment), (h) => disk(o, Segments.walk(segment, h, position, limit, chunkBytes, visit)))

/** Walks frames that must be whole (not the tail being recovered): a bad frame is `Corrupt`. */
export const walkWhole = (
  o: Opened,
  segment: Segments.Segment,
  position: number,
  limit: number,
  chunkBytes: number,
  visit: (frame: Format.Frame, position: number) => boolean
) =>
  Effect.flatMap(walk(o, segment, position, limit, chunkBytes, visit), (w) =>
    w.bad === undefined
      ? Effect.succeed(w)
      : Effect.fail(corrupt(o, `${Format.segmentFile(segment.base)} at byte ${w.position}: ${w.bad}`))
  )

/**
 * Rebuilds a sealed segment's index from its frames, checking that they continue each other from its base (each
 * batch where the one before it ended).
 */
export const rebuildIndex = (o: Opened, segment: Segments.Segment) =>
  Effect.gen(function* () {
    const fresh = { ...segment, index: new Format.Positions(), batches: undefined, lastIndexed: 0 }
    let expect = segment.base
    let misplaced: string | undefined
    yield* walkWhole(o, segment, 0, segment.size, Segments.WALK_CHUNK_BYTES, (f, position) => {
      if (f.baseOffset !== expect) {
        misplaced = `${Format.segmentFile(segment.base)}: a batch at ${f.baseOffset} where ${expect} was expected`
        return false
      }
      Segments.noteBatch(fresh, f.baseOffset, position, o.options.indexIntervalBytes)
      expect += f.count
      return true
    })
    if (misplaced !== undefined) return yield* Effect.fail(corrupt(o, misplaced))
    segment.index = fresh.index
    segment.lastIndexed = fresh.lastIndexed
    return fresh.index
  })

/**
 * A sealed segment's index: loaded from its file, or rebuilt from the segment (and written again) when the file is
 * missing or fails its checks (its CRC, its order, its positions).
 */
export const indexOf = (o: Opened, segment: Segments.Segment) =>
  Effect.gen(function* () {
    if (segment.index !== undefined) return segment.index
    const bytes = yield* disk(o, Files.readIfExists(segment.indexPath))
    const loaded = bytes === undefined ? undefined : Format.Positions.decode(bytes, segment.size)
    if (loaded !== undefined && typeof loaded !== "string") segment.index = loaded
    else {
      if (typeof loaded === "string") {
        yield* Effect.logWarning(`tablet ${o.name}: ${Format.indexFile(segment.base)}: ${loaded}; rebuilding it`)
      }
      const index = yield* rebuildIndex(o, segment)
      // Derived from the segment: not flushed (one lost or torn is rebuilt again).
      yield* disk(o, Files.replace(o.directory, Format.indexFile(segment.base), index.encode(), false))
    }
    yield* used(o, segment)
    return segment.index!
  })

/** The frame of a segment holding `offset` (an offset the segment holds), and its position. */
export const frameHolding = (o: Opened, segment: Segments.Segment, offset: number) =>
  Effect.gen(function* () {
    const relative = offset - segment.base
    const recent = segment.batches
    const j = recent === undefined ? -1 : recent.floor(relative)
    let from: number
    let limit = segment.size
    if (recent !== undefined && j >= 0) {
      from = recent.positionAt(j)
      if (j + 1 < recent.count) limit = recent.positionAt(j + 1)
    } else {
      const index = segment.index ?? (yield* indexOf(o, segment))
      const e = index.floor(relative)
      from = e < 0 ? 0 : index.positionAt(e)
      if (e + 1 < index.count) limit = index.positionAt(e + 1)
    }
    let found: { readonly frame: Format.Frame; readonly position: number } | undefined
    yield* walkWhole(o, segment, from, limit, Math.min(limit - from, Segments.WALK_CHUNK_BYTES), (f, position) => {
      if (f.baseOffset + f.count <= offset) return true
      if (f.baseOffset <= offset) found = { frame: f, position }
      return false
    })
    if (found === undefined) {
      return yield* Effect.fail(corrupt(o, `${Format.segmentFile(segment.base)} has no batch holding ${offset}`))
    }
    return found
  })

/**
 * Creates an empty segment at `base` (the active one from now on, once pushed); its file is closed again if a later
 * step fails. The directory is not flushed here: the next flush of the log does it (`directoryDirty`).
 */
export const createSegment = (
  o: { readonly name: string; readonly directory: string; directoryDirty: boolean },
  base: number,
  now: number
) =>
  Effect.gen(function* () {
    const segment = Segments.segmentAt(o.directory, base, 0, now)
    segment.handle = yield* disk(o, Files.open(segment.path, "w+"))
    segment.index = new Format.Positions()
    segment.batches = Segments.recentPositions()
    o.directoryDirty = true
    yield* disk(o, Files.remove(segment.indexPath)).pipe(
      Effect.onError(() => closeSegment(segment).pipe(Effect.ignore))
    )
    return segment
  }).pipe(Effect.uninterruptible)

/** Deletes a segment's files (closing it first). */
export const deleteSegment = (o: Opened, segment: Segments.Segment) =>
  Effect.gen(function* () {
    o.open = o.open.filter((s) => s !== segment)
    yield* disk(o, closeSegment(segment))
    yield* disk(o, Files.remove(segment.path))
    yield* disk(o, Files.remove(segment.indexPath))
  })

/** Replaces `log-state.checkpoint`, flushed to the device (the directory too). */
export const writeLogState = (o: Opened, state: Format.LogState) =>
  disk(o, Files.replace(o.directory, Format.LOG_STATE_FILE, Format.encodeLogState(state), true)).pipe(
    Effect.tap(() => Effect.sync(() => (o.directoryDirty = false)))
  )

/**
 * Writes the high-watermark checkpoint in place (one write at position 0 of its open file: a write torn by a power
 * loss fails its CRC and reads as absent), flushed to the device when `durable`.
 */
export const writeHighWatermark = (o: Opened, hw: number, durable: boolean) =>
  Effect.suspend(() => {
    const file = o.hwFile
    const path = join(o.directory, Format.HIGH_WATERMARK_FILE)
    if (file === undefined) {
      return Effect.fail(storeFailed(o)(Store.storeError(new Store.Closed({ store: `${Files.STORE_NAME} ${path}` }))))
    }
    const written = disk(o, Files.writeAt(file, path, [Format.encodeHighWatermark(hw)], 0))
    return durable ? Effect.andThen(written, disk(o, Files.sync(file, path))) : written
  })

/** Flushes the active segment to the device if it has unflushed bytes, and the directory if a segment was created. */
export const flush = (o: Opened) =>
  Effect.gen(function* () {
    if (o.written > o.flushedTo) {
      const segment = active(o)
      yield* disk(o, Files.sync(segment.handle!, segment.path))
      o.flushedTo = o.written
    }
    if (o.directoryDirty) {
      yield* disk(o, Files.syncDirectory(o.directory))
      o.directoryDirty = false
    }
  })

/**
 * Writes the producer snapshot as of `asOf` (at most the log end), then deletes the snapshots it supersedes: those
 * after the base of the segment holding `asOf` and before it. `durable`: the log is flushed first (the snapshot
 * never covers batches the device may not have) and the snapshot after; otherwise it is only renamed into place (a
 * power loss may take it, and the log opens from an older one).
 */
export const writeSnapshot = (o: Opened, asOf: number, producers: Format.Producers, durable: boolean) =>
  Effect.gen(function* () {
    if (durable) yield* flush(o)
    const bytes = Format.encodeSnapshot({ asOf, start: o.start, producers })
    yield* disk(o, Files.replace(o.directory, Format.snapshotFile(asOf), bytes, durable))
    const base = o.segments[holding(o, asOf)]!.base
    const superseded = o.snapshots.filter((s) => s > base && s < asOf)
    o.snapshots = [...o.snapshots.filter((s) => s !== asOf && !superseded.includes(s)), asOf].sort((a, b) => a - b)
    // Superseded snapshots are still right as of their offsets: one left behind does no harm.
    yield* Effect.forEach(
      superseded,
      (s) => Files.remove(join(o.directory, Format.snapshotFile(s))).pipe(Effect.ignore),
      { discard: true }
    )
  })

/** Deletes the snapshots `drop` selects. */
export const dropSnapshots = (o: Opened, drop: (asOf: number) => boolean) =>
  Effect.gen(function* () {
    for (const s of o.snapshots.filter(drop)) {
      yield* disk(o, Files.remove(join(o.directory, Format.snapshotFile(s))))
      o.snapshots = o.snapshots.filter((x) => x !== s)
    }
  })

/**
 * Rolls: flushes the active segment to the device (so a sealed segment is whole on the device before a later one
 * exists), writes its index, starts a new segment at the log end, and snapshots the producers there. The index and
 * the snapshot are not flushed: a power loss that takes them costs the next opening a longer walk.
 */
export const roll = (o: Opened, now: number) =>
  Effect.gen(function* () {
    const old = active(o)
    yield* disk(o, Files.sync(old.handle!, old.path))
    o.flushedTo = o.written
    yield* disk(o, Files.replace(o.directory, Format.indexFile(old.base), old.index!.encode(), false))
    const next = yield* createSegment(o, o.end, now)
    yield* writeSnapshot(o, o.end, o.producers, false).pipe(
      Effect.onError(() => closeSegment(next).pipe(Effect.ignore))
    )
    old.batches = undefined
    o.segments.push(next)
    yield* used(o, old)
  }).pipe(Effect.uninterruptible)

/**
 * Empties the log at its start (see `Format.Cut`'s `Empty`): every segment goes, an empty one starts at the start,
 * and every snapshot goes (an empty log has no producers).
 */
export const emptyAtStart = (o: Opened, now: number) =>
  Effect.gen(function* () {
    // The last first, each left among the segments until it is closed (the closing closes the others).
    while (o.segments.length > 0) {
      yield* deleteSegment(o, o.segments.at(-1)!)
      o.segments.pop()
    }
    o.open = []
    RecentTail.drop(o.tail)
    o.flushedTo = o.written
    o.segments = [yield* createSegment(o, o.start, now)]
    o.end = o.start
    yield* dropSnapshots(o, () => true)
  })

/**
 * Cuts the log as `cut` (an `At`) says, its segment being `o.segments[k]`, each step one that can be done again:
 * the segments after it go (the last first), `cut.frame` is written at `cut.position` and flushed, the segment is
 * cut after it and flushed, and its index file goes (it is the active segment now).
 */
export const cutSegment = (o: Opened, k: number, cut: Extract<Format.Cut, { readonly _tag: "At" }>) =>
  Effect.gen(function* () {
    while (o.segments.length > k + 1) {
      yield* deleteSegment(o, o.segments.at(-1)!)
      o.segments.pop()
    }
    const segment = o.segments[k]!
    if (segment.size < cut.position) {
      return yield* Effect.fail(
        corrupt(
          o,
          `${Format.segmentFile(segment.base)} has ${segment.size} bytes, not the ${cut.position} it is cut at`
        )
      )
    }
    const handle = yield* handleOf(o, segment)
    const size = cut.position + (cut.frame?.length ?? 0)
    if (cut.frame !== undefined) {
      yield* disk(o, Files.writeAt(handle, segment.path, [cut.frame], cut.position))
      // On the device before the truncation: a file system may otherwise commit the shorter size first.
      yield* disk(o, Files.sync(handle, segment.path))
    }
    if (segment.size !== size) {
      yield* disk(o, Files.truncate(handle, segment.path, size))
      yield* disk(o, Files.sync(handle, segment.path))
    }
    segment.size = size
    o.open = o.open.filter((s) => s !== segment)
    yield* disk(o, Files.remove(segment.indexPath))
  })

/**
 * The producer entries once the log ends at `end` (a batch boundary), as the store-backed log has them: each entry
 * loses its batches at or past `end`, and one left with none gets its latest batches below `end` back from the log
 * (see `latestBatchesOf`; none found, or `end` at or below the start: it goes).
 */
export const producersAt = (o: Opened, end: number) =>
  Effect.gen(function* () {
    const next = new Map<number, ProducerState.Entry>()
    const lost = new Set<number>()
    for (const [id, entry] of o.producers) {
      if (entry.batches.every((b) => b.lastOffset < end)) next.set(id, entry)
      else {
        const kept = ProducerState.truncateFromEnd(entry, end)
        if (kept === undefined) lost.add(id)
        else next.set(id, kept)
      }
    }
    if (lost.size === 0 || end <= o.start) return next
    for (const [id, batches] of yield* latestBatchesOf(o, lost, end)) {
      let entry: ProducerState.Entry | undefined
      for (const b of batches) entry = ProducerState.record(entry, b.producer!, b.count, b.baseOffset)
      if (entry !== undefined) next.set(id, entry)
    }
    return next
  })

/**
 * The latest batches below `end` (and reaching past the start) of each producer of `lost`: its latest producer
 * epoch's, at most `RECENT_BATCHES`, oldest first; found by reading the log back from `end`, a stretch between two
 * index entries at a time, at most `PRODUCER_SCAN_BATCHES` batches (as the store-backed log does: a producer not
 * found within them is forgotten).
 */
const latestBatchesOf = (o: Opened, lost: ReadonlySet<number>, end: number) =>
  Effect.gen(function* () {
    const found = new Map<number, Array<Format.BatchHeader>>()
    const done = new Set<number>()
    let scanned = 0
    const more = () => done.size < lost.size && scanned < PRODUCER_SCAN_BATCHES
    for (let i = holding(o, end - 1); i >= 0 && more(); i--) {
      const segment = o.segments[i]!
      const index = segment.index ?? (yield* indexOf(o, segment))
      // From the index entry at or below the last batch before `end`, back to the segment's first.
      let limit = segment.size
      for (let e = index.floor(end - 1 - segment.base); e >= 0 && more(); e--) {
        const from = index.positionAt(e)
        const headers: Array<Format.BatchHeader> = []
        yield* walkWhole(o, segment, from, limit, Math.max(1, limit - from), (f) => {
          if (f.baseOffset >= end) return false
          if (f.baseOffset + f.count > o.start) {
            headers.push({ baseOffset: f.baseOffset, epoch: f.epoch, count: f.count, producer: f.producer })
          }
          return true
        })
        limit = from
        for (let h = headers.length - 1; h >= 0 && more(); h--) {
          scanned++
          const b = headers[h]!
          const p = b.producer
          if (p === undefined || !lost.has(p.id) || done.has(p.id)) continue
          const seen = found.get(p.id) ?? []
          if (seen.length > 0 && seen[0]!.producer!.epoch !== p.epoch) {
            done.add(p.id)
            continue
          }
          seen.unshift(b)
          found.set(p.id, seen)
          if (seen.length === ProducerState.RECENT_BATCHES) done.add(p.id)
        }
        // The batches before this stretch all end at or below its first offset: none reaches past the start.
        if (segment.base + index.offsetAt(e) <= o.start) return found
      }
    }
    return found
  })

/** Makes the log's producer entries `next` (forgetting when the ones gone last appended). */
export const setProducers = (o: Opened, next: ReadonlyMap<number, ProducerState.Entry>) => {
  o.producers.clear()
  for (const [id, entry] of next) o.producers.set(id, entry)
  for (const id of o.lastAppend.keys()) if (!next.has(id)) o.lastAppend.delete(id)
}
