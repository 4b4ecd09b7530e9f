/**
 * An open segment log's state, and the operations on its segments and checkpoints that `SegmentLog` and its
 * recovery share (see `SegmentLog.ts` for the layout, and for the order in which changes reach the files).
 *
 * @internal
 */
import { type Models, Store } from "@strata/core"
import { join } from "node:path"
import { Effect, Semaphore } from "effect"
import type * as LeaderEpochCache from "../../machines/LeaderEpochCache.js"
import * as ProducerState from "../../machines/ProducerState.js"
import { isStorageFailure, PRODUCER_SCAN_BATCHES, TabletLogError } from "../TabletLog.js"
import * as Files from "./segmentFiles.js"
import * as Format from "./segmentFormat.js"
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
  /** Bytes written to the active segment since it was last flushed to the device. */
  unflushed: number
  closed: boolean
  /** The storage failure that broke a change half-way: every operation fails with it until the log is reopened. */
  broken: TabletLogError | undefined
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

/** The segment's open file, opening it (and noting it among the open ones) if needed. */
export const handleOf = (o: Opened, segment: Segments.Segment) =>
  segment.handle === undefined
    ? Effect.gen(function* () {
        segment.handle = yield* disk(o, Files.open(segment.path, "r+"))
        yield* used(o, segment)
        return segment.handle
      })
    : Effect.as(used(o, segment), segment.handle)

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

/** Rebuilds a segment's index (and, for `withBatches`, every batch's position) from its frames. */
export const rebuildIndexes = (o: Opened, segment: Segments.Segment, withBatches: boolean) =>
  Effect.gen(function* () {
    const index = new Format.Positions()
    const batches = withBatches ? new Format.Positions() : undefined
    const fresh = { ...segment, index, batches, lastIndexed: 0 }
    yield* walkWhole(o, segment, 0, segment.size, Segments.WALK_CHUNK_BYTES, (f, position) => {
      Segments.noteBatch(fresh, f.baseOffset, position, o.options.indexIntervalBytes)
      return true
    })
    segment.index = index
    segment.lastIndexed = fresh.lastIndexed
    if (withBatches) segment.batches = batches
  })

/** A sealed segment's index: loaded from its file (rebuilt from the segment, and written, when it is not right). */
export const indexOf = (o: Opened, segment: Segments.Segment) =>
  Effect.gen(function* () {
    if (segment.index !== undefined) return segment.index
    const bytes = yield* disk(o, Files.readIfExists(segment.indexPath))
    const loaded = bytes === undefined ? undefined : Format.Positions.decode(bytes, segment.size)
    if (loaded !== undefined && typeof loaded !== "string") segment.index = loaded
    else {
      yield* rebuildIndexes(o, segment, false)
      yield* disk(o, Files.replace(o.directory, Format.indexFile(segment.base), segment.index!.encode(), true))
    }
    yield* used(o, segment)
    return segment.index!
  })

/** Creates an empty segment at `base` (the active one from now on, once pushed). */
export const createSegment = (o: { readonly name: string; readonly directory: string }, base: number, now: number) =>
  Effect.gen(function* () {
    const segment = Segments.segmentAt(o.directory, base, 0, now)
    segment.handle = yield* disk(o, Files.open(segment.path, "w+"))
    segment.index = new Format.Positions()
    segment.batches = new Format.Positions()
    yield* disk(o, Files.remove(segment.indexPath))
    yield* disk(o, Files.syncDirectory(o.directory))
    return segment
  })

/** Deletes a segment's files (closing it first). */
export const deleteSegment = (o: Opened, segment: Segments.Segment) =>
  Effect.gen(function* () {
    o.open = o.open.filter((s) => s !== segment)
    yield* disk(o, closeSegment(segment))
    yield* disk(o, Files.remove(segment.path))
    yield* disk(o, Files.remove(segment.indexPath))
  })

/** Replaces `log-state.checkpoint` (flushed to the device). */
export const writeLogState = (o: Opened, state: Format.LogState) =>
  disk(o, Files.replace(o.directory, Format.LOG_STATE_FILE, Format.encodeLogState(state), true))

/** Replaces `high-watermark.checkpoint` (flushed to the device when `durable`). */
export const writeHighWatermark = (o: Opened, hw: number, durable: boolean) =>
  disk(o, Files.replace(o.directory, Format.HIGH_WATERMARK_FILE, Format.encodeHighWatermark(hw), durable))

/** Flushes the active segment to the device if it has unflushed bytes. */
export const flush = (o: Opened) =>
  Effect.suspend(() => {
    if (o.unflushed === 0) return Effect.void
    const segment = active(o)
    return disk(o, Files.sync(segment.handle!, segment.path)).pipe(
      Effect.tap(() => Effect.sync(() => (o.unflushed = 0)))
    )
  })

/**
 * Writes the producer snapshot as of `asOf` (at most the log end), after flushing the active segment (a snapshot
 * never covers batches the device may not have), then deletes the snapshots it supersedes: those after the base of
 * the segment holding `asOf` and before it.
 */
export const writeSnapshot = (o: Opened, asOf: number, producers: Format.Producers) =>
  Effect.gen(function* () {
    yield* flush(o)
    const bytes = Format.encodeSnapshot({ asOf, start: o.start, producers })
    yield* disk(o, Files.replace(o.directory, Format.snapshotFile(asOf), bytes, true))
    const base = o.segments[holding(o, asOf)]!.base
    const superseded = o.snapshots.filter((s) => s > base && s < asOf)
    o.snapshots = [...o.snapshots.filter((s) => s !== asOf && !superseded.includes(s)), asOf].sort((a, b) => a - b)
    // Superseded snapshots are still right as of their offsets: one left behind does no harm.
    yield* Effect.forEach(
      superseded,
      (s) => Files.remove(join(o.directory, Format.snapshotFile(s))).pipe(Effect.ignore),
      {
        discard: true
      }
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

/** Rolls: flushes the active segment and writes its index, starts a new one at the log end, snapshots there. */
export const roll = (o: Opened, now: number) =>
  Effect.gen(function* () {
    const old = active(o)
    yield* disk(o, Files.sync(old.handle!, old.path))
    o.unflushed = 0
    yield* disk(o, Files.replace(o.directory, Format.indexFile(old.base), old.index!.encode(), true))
    const next = yield* createSegment(o, o.end, now)
    yield* writeSnapshot(o, o.end, o.producers)
    old.batches = undefined
    o.segments.push(next)
    yield* used(o, old)
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
 * epoch's, at most `RECENT_BATCHES`, oldest first; found by reading the log back from `end`, segment by segment, at
 * most `PRODUCER_SCAN_BATCHES` batches (as the store-backed log does: a producer not found within them is
 * forgotten).
 */
const latestBatchesOf = (o: Opened, lost: ReadonlySet<number>, end: number) =>
  Effect.gen(function* () {
    const found = new Map<number, Array<Format.BatchHeader>>()
    const done = new Set<number>()
    let scanned = 0
    for (let i = holding(o, end - 1); i >= 0 && done.size < lost.size && scanned < PRODUCER_SCAN_BATCHES; i--) {
      const segment = o.segments[i]!
      // The segment's batches below `end`, oldest first: the last `PRODUCER_SCAN_BATCHES` of them are enough.
      let headers: Array<Format.BatchHeader> = []
      yield* walkWhole(o, segment, 0, segment.size, Segments.WALK_CHUNK_BYTES, (f) => {
        if (f.baseOffset >= end) return false
        if (f.baseOffset + f.count > o.start) {
          headers.push({ baseOffset: f.baseOffset, epoch: f.epoch, count: f.count, producer: f.producer })
        }
        if (headers.length > 2 * PRODUCER_SCAN_BATCHES) headers = headers.slice(-PRODUCER_SCAN_BATCHES)
        return true
      })
      for (let h = headers.length - 1; h >= 0 && done.size < lost.size && scanned < PRODUCER_SCAN_BATCHES; h--) {
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
    }
    return found
  })

/** Keeps the producers with a batch at or past `start` (the others went with the records below it). */
export const keepFrom = (producers: Map<number, ProducerState.Entry>, start: number) => {
  for (const [id, entry] of producers) if (entry.batches.every((b) => b.lastOffset < start)) producers.delete(id)
  return producers
}

/** Makes the log's producer entries `next` (forgetting when the ones gone last appended). */
export const setProducers = (o: Opened, next: ReadonlyMap<number, ProducerState.Entry>) => {
  o.producers.clear()
  for (const [id, entry] of next) o.producers.set(id, entry)
  for (const id of o.lastAppend.keys()) if (!next.has(id)) o.lastAppend.delete(id)
}
