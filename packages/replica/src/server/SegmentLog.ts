/**
 * A tablet replica's log on segment files (Kafka's layout, written for Strata): the `TabletLog` of
 * `./TabletLog.ts` with its batches in files of their own rather than in a key-value store.
 *
 * One directory per log. The batches live in segment files named by their base offset
 * (`00000000000000000000.log`), each batch framed as its encoded length, a CRC-32 and its base offset, then the tablet
 * batch encoding (`batchCodec`). Appends go to the end of the last segment (the active one), one `writev` per call
 * (a follower's batches all in one); the log rolls to a new segment once the active one would pass `segmentBytes`,
 * or is `segmentMs` old (by Effect's `Clock`). Each segment has a sparse index (`.index`: an entry every
 * `indexIntervalBytes` of log, offset → position), so a read finds its start by a binary search of the index and a
 * short walk; the active segment also keeps the position of every batch in memory, so reads of the recent tail go
 * straight to their bytes. A read checks every batch's CRC: it never returns a damaged or torn batch.
 *
 * Beside the segments, checkpoint files, each replaced atomically (written to a temporary file, renamed over):
 * `log-state.checkpoint` (the log start offset and the leader-epoch cache, flushed to the device), the high
 * watermark (`high-watermark.checkpoint`: renamed into place on every checkpoint, flushed to the device only when
 * the log closes — it only shortens a restart's catch-up, and after a power loss the log opens with it at the log
 * start at worst) and producer snapshots (`<offset>.snapshot`: every producer's entry after the batches below that
 * offset, and the log start then; flushed), written when a segment rolls (as of its end), when the log closes,
 * truncates, moves its start or expires producers.
 *
 * Durability: the active segment is flushed to the device (`fsync`) when it rolls, when the log closes and before
 * a producer snapshot is written; otherwise only by the flush policy (`flushIntervalMs`, `flushBytes`), which by
 * default flushes nothing: like Kafka, the log relies on replication and the operating system (a process crash
 * loses nothing written, a power loss what the OS had not written back).
 *
 * Opening: the checkpoints are read, then the segments from the latest producer snapshot's offset (at least the
 * last segment) are walked frame by frame, rebuilding the producer entries, the epochs written after the log-state
 * checkpoint, the log end and the active segment's positions; a torn tail (a frame cut short, a CRC that does not
 * match, a batch out of place) is cut off the file, and any segment after it deleted. Every change is ordered so
 * that a process killed at any point reopens to the log before or after the change; each change is written before
 * the log's state in memory moves.
 *
 * It differs from the store-backed log where files make it so:
 * - `sizeBytes` is the bytes of its segment files: each batch's encoding plus its 16-byte frame; a read's
 *   `maxBytes` counts each batch's encoding only (as the store-backed log does, and as a reply carries it).
 * - `deleteBefore` deletes whole segments: the batches below the new start in the segment holding it stay on disk
 *   (and in `sizeBytes`) until their segment is deleted, never read.
 * - `truncateTo` at an offset held by a producer's batch that straddles the log start (the batch goes whole) leaves
 *   the log empty at its start, as the store-backed log does.
 * - a `resetTo` below the log end (no follower asks for one) that a crash interrupts may leave the log empty at its
 *   old end rather than at the offset asked.
 * - one open log per directory: a second `make` on a directory open in this process fails with `StoreLocked`
 *   (another process is the caller's to keep out). A storage failure in the middle of a change leaves the log
 *   refusing every operation with that failure until it is opened again (its files then say what was written).
 *
 * Every operation runs alone (one at a time per log); changes are not interruptible once started.
 *
 * @since 0.1.0
 */
import { Models, OptionSchemas, Store } from "@strata/core"
import { resolve } from "node:path"
import { Clock, Effect, Schema, type Scope } from "effect"
import * as LeaderEpochCache from "../machines/LeaderEpochCache.js"
import * as ProducerState from "../machines/ProducerState.js"
import * as Codec from "../wire/internal/batchCodec.js"
import * as Files from "./internal/segmentFiles.js"
import * as Format from "./internal/segmentFormat.js"
import {
  active,
  change,
  alone,
  corrupt,
  createSegment,
  deleteSegment,
  disk,
  dropSnapshots,
  endOf,
  error,
  flush,
  handleOf,
  holding,
  indexOf,
  keepFrom,
  type Opened,
  outOfRange,
  producersAt,
  rebuildIndexes,
  roll,
  setProducers,
  walkWhole,
  writeHighWatermark,
  writeLogState,
  writeSnapshot
} from "./internal/segmentLogState.js"
import { close, load } from "./internal/segmentRecovery.js"
import * as Segments from "./internal/segments.js"
import { type Appended, appendChecked, type TabletLog, type TabletLogError } from "./TabletLog.js"

/**
 * The default segment size: 256 MiB.
 *
 * @since 0.1.0
 */
export const DEFAULT_SEGMENT_BYTES = 256 * 1024 * 1024

/**
 * The default bytes of log between two index entries: 4 KiB.
 *
 * @since 0.1.0
 */
export const DEFAULT_INDEX_INTERVAL_BYTES = 4096

/**
 * The bytes each stored batch takes besides its encoding (its frame: length, CRC, base offset).
 *
 * @since 0.1.0
 */
export const FRAME_BYTES = Format.FRAME_HEADER_BYTES

/** The largest segment size: positions in a segment are 32-bit. */
const MAX_SEGMENT_BYTES = 0x7fff_ffff

const PositiveInt = OptionSchemas.PositiveInt
const withDefault = (schema: Schema.Codec<number, number>, value: number) =>
  schema.pipe(Schema.withDecodingDefaultKey(Effect.succeed(value)))

/**
 * The options of a segment log (every key but `directory` and `tablet` optional).
 *
 * @since 0.1.0
 */
export const SegmentLogOptions = Schema.Struct({
  /** The log's directory (created if missing); the log owns every file in it. */
  directory: Schema.String.check(Schema.isNonEmpty()),
  /** The tablet it is the log of. */
  tablet: Models.TabletId,
  /** The size past which the active segment rolls (256 MiB; at most 2 GiB − 1). */
  segmentBytes: withDefault(PositiveInt.check(Schema.isLessThanOrEqualTo(MAX_SEGMENT_BYTES)), DEFAULT_SEGMENT_BYTES),
  /** The age at which the active segment rolls at the next append, in ms (unset: never by age). */
  segmentMs: Schema.optional(PositiveInt),
  /** The bytes of log between two entries of a segment's index (4 KiB). */
  indexIntervalBytes: withDefault(PositiveInt, DEFAULT_INDEX_INTERVAL_BYTES),
  /** Flushes the active segment to the device this often, in ms, when it has unflushed bytes (unset: never). */
  flushIntervalMs: Schema.optional(PositiveInt),
  /** Flushes the active segment to the device once this many bytes were written since the last flush (unset: never). */
  flushBytes: Schema.optional(PositiveInt)
})

/**
 * The options, decoded.
 *
 * @since 0.1.0
 */
export type SegmentLogOptions = typeof SegmentLogOptions.Type

/**
 * The options as given.
 *
 * @since 0.1.0
 */
export type SegmentLogOptionsInput = typeof SegmentLogOptions.Encoded

/** The directories of the logs open in this process. */
const openDirectories = new Set<string>()

/**
 * Opens (creating it if needed) the log in `options.directory`; closing the scope flushes it to the device and
 * closes its files. Bad options fail with `StoreFailed` (`InvalidStoreOptions`, naming the key).
 *
 * @since 0.1.0
 */
export const make = (options: SegmentLogOptionsInput): Effect.Effect<TabletLog, TabletLogError, Scope.Scope> =>
  Effect.gen(function* () {
    const decoded = yield* OptionSchemas.decodeOptions(SegmentLogOptions, { exact: true })(options).pipe(
      Effect.mapError((bad) => {
        const { option, value, detail } = OptionSchemas.summary(bad)
        const cause = Store.storeError(
          new Store.InvalidOptions({ store: Files.STORE_NAME, detail: `${option} = ${value}: ${detail}` })
        )
        return error({ name: nameOf(options) }, { _tag: "StoreFailed", cause })
      })
    )
    const directory = resolve(decoded.directory)
    const name = Models.tabletKey(decoded.tablet)
    const o = yield* Effect.acquireRelease(
      Effect.suspend(() => {
        if (openDirectories.has(directory)) {
          const cause = Store.storeError(new Store.Locked({ store: Files.STORE_NAME, path: directory }))
          return Effect.fail(error({ name }, { _tag: "StoreFailed", cause }))
        }
        openDirectories.add(directory)
        return load({ ...decoded, directory }).pipe(
          Effect.onError(() => Effect.sync(() => openDirectories.delete(directory)))
        )
      }).pipe(Effect.uninterruptible),
      (o) => close(o).pipe(Effect.ensuring(Effect.sync(() => openDirectories.delete(directory))))
    )
    const every = decoded.flushIntervalMs
    if (every !== undefined) {
      yield* Effect.forkScoped(
        Effect.forever(Effect.andThen(Effect.sleep(every), change(o, flush(o)).pipe(Effect.ignore)))
      )
    }
    const log: TabletLog = {
      tablet: decoded.tablet,
      logStartOffset: Effect.sync(() => o.start),
      logEndOffset: Effect.sync(() => o.end),
      highWatermark: Effect.sync(() => o.hw),
      sizeBytes: Effect.sync(() => o.segments.reduce((n, s) => n + s.size, 0)),
      epochs: Effect.sync(() => o.epochs),
      producers: Effect.sync(() => new Map(o.producers)),
      expireProducers: (idleMs) => change(o, expireProducers(o, idleMs)),
      append: (epoch, records, producer) => change(o, append(o, epoch, records, producer)),
      appendBatches: (batches) => change(o, appendAt(o, batches)),
      read: (from, maxBytes) => alone(o, read(o, from, maxBytes)),
      endOffsetForEpoch: (epoch) => Effect.sync(() => LeaderEpochCache.endOffsetFor(o.epochs, epoch, o.end)),
      truncateTo: (offset) => change(o, truncateTo(o, offset)),
      deleteBefore: (offset) => change(o, deleteBefore(o, offset)),
      resetTo: (offset) => change(o, resetTo(o, offset)),
      checkpointHighWatermark: (hw) => change(o, checkpointHighWatermark(o, hw))
    }
    return log
  })

/** The tablet options name, for an error about them (whatever they hold). */
const nameOf = (options: unknown): string => {
  const tablet = typeof options === "object" && options !== null ? (options as { tablet?: unknown }).tablet : undefined
  const t = typeof tablet === "object" && tablet !== null ? (tablet as { table?: unknown; bucket?: unknown }) : {}
  return `${String(t.table)}/${String(t.bucket)}`
}

// ---------------------------------------------------------------------------
// Appends
// ---------------------------------------------------------------------------

/** Notes that producers `ids` appended now. */
const touch = (o: Opened, ids: Iterable<number>) =>
  Effect.map(Clock.currentTimeMillis, (now) => {
    for (const id of ids) o.lastAppend.set(id, now)
  })

/** Appends `records` at the log end under `epoch`; a producer's retry of a batch it wrote is answered as before. */
const append = (
  o: Opened,
  epoch: number,
  records: ReadonlyArray<Codec.TabletRecord>,
  producer: ProducerState.Producer | undefined
): Effect.Effect<Appended, TabletLogError> =>
  Effect.suspend(() =>
    appendChecked(
      o.producers,
      o.end,
      epoch,
      records,
      producer,
      (refusal) => error(o, refusal),
      (batch) => appendAt(o, [batch])
    )
  )

/**
 * Writes batches at the log end in one write to the active segment (rolling first when due), then the log-state
 * checkpoint when they start an epoch.
 */
const appendAt = (o: Opened, batches: ReadonlyArray<Codec.Batch>) =>
  Effect.gen(function* () {
    let epochs = o.epochs
    let end = o.end
    const producers = new Map<number, ProducerState.Entry>()
    const frames: Array<{ readonly baseOffset: number; readonly head: Uint8Array; readonly encoded: Uint8Array }> = []
    let total = 0
    for (const b of batches) {
      if (b.baseOffset !== end)
        return yield* Effect.fail(error(o, { _tag: "NotContiguous", baseOffset: b.baseOffset, end }))
      const latest = LeaderEpochCache.latest(epochs)
      if (latest !== undefined && b.epoch < latest.epoch) {
        return yield* Effect.fail(error(o, { _tag: "StaleEpoch", epoch: b.epoch, latest: latest.epoch }))
      }
      if (b.records.length === 0) continue
      epochs = LeaderEpochCache.assign(epochs, b.epoch, b.baseOffset)
      const encoded = Codec.encodeBatch(b.epoch, b.records, b.producer)
      frames.push({ baseOffset: b.baseOffset, head: Format.frameHeader(b.baseOffset, encoded), encoded })
      total += Format.FRAME_HEADER_BYTES + encoded.length
      if (b.producer !== undefined) {
        const id = b.producer.id
        producers.set(
          id,
          ProducerState.record(producers.get(id) ?? o.producers.get(id), b.producer, b.records.length, b.baseOffset)
        )
      }
      end += b.records.length
    }
    if (frames.length === 0) return
    const now = yield* Clock.currentTimeMillis
    const current = active(o)
    const segmentMs = o.options.segmentMs
    if (
      current.size > 0 &&
      (current.size + total > o.options.segmentBytes ||
        (segmentMs !== undefined && now - current.createdAt >= segmentMs) ||
        end - current.base > 0xffff_ffff)
    ) {
      yield* roll(o, now)
    }
    const segment = active(o)
    yield* disk(
      o,
      Files.writeAt(
        segment.handle!,
        segment.path,
        frames.flatMap((f) => [f.head, f.encoded]),
        segment.size
      )
    )
    let position = segment.size
    for (const f of frames) {
      Segments.noteBatch(segment, f.baseOffset, position, o.options.indexIntervalBytes)
      position += f.head.length + f.encoded.length
    }
    segment.size = position
    o.end = end
    o.unflushed += total
    for (const [id, entry] of producers) o.producers.set(id, entry)
    if (epochs !== o.epochs) {
      yield* writeLogState(o, { start: o.start, epochs })
      o.epochs = epochs
    }
    if (producers.size > 0) yield* touch(o, producers.keys())
    const flushBytes = o.options.flushBytes
    if (flushBytes !== undefined && o.unflushed >= flushBytes) yield* flush(o)
  })

// ---------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------

/** Records `skip`.. of a batch, its producer stamp's sequence moved along with them. */
const sliced = (b: Codec.Batch, skip: number): Codec.Batch => {
  const cut = { baseOffset: b.baseOffset + skip, epoch: b.epoch, records: b.records.slice(skip) }
  return b.producer === undefined ? cut : { ...cut, producer: { ...b.producer, sequence: b.producer.sequence + skip } }
}

/**
 * Whole batches from the one holding `from` while their encodings fit in `maxBytes`, the first one whatever its
 * size, records before `from` cut off; across segments.
 */
const read = (o: Opened, from: number, maxBytes: number): Effect.Effect<Array<Codec.Batch>, TabletLogError> =>
  Effect.gen(function* () {
    if (from < o.start || from > o.end) return yield* Effect.fail(outOfRange(o, from))
    if (from === o.end) return []
    const out: Array<Codec.Batch> = []
    let bytes = 0
    let full = false
    let failed: string | undefined
    let cursor = from
    const fits = (size: number) => out.length === 0 || bytes + size <= maxBytes
    const visit = (f: Format.Frame) => {
      if (f.baseOffset + f.count <= cursor) return true
      if (!fits(f.encoded.length)) {
        full = true
        return false
      }
      const batch = Codec.decodeBatch(f.baseOffset, f.encoded)
      if (typeof batch === "string") {
        failed = batch
        return false
      }
      bytes += f.encoded.length
      out.push(batch.baseOffset < from ? sliced(batch, from - batch.baseOffset) : batch)
      cursor = f.baseOffset + f.count
      return true
    }
    for (let i = holding(o, from); i < o.segments.length && !full && cursor < o.end; i++) {
      const segment = o.segments[i]!
      const positions = segment.batches
      if (positions !== undefined) {
        // The active segment: exactly the bytes of the batches that fit, in one read.
        let j = Math.max(0, positions.floor(cursor - segment.base))
        const first = positions.positionAt(j)
        let past = first
        let planned = bytes
        let count = out.length
        for (; j < positions.count; j++) {
          const next = j + 1 < positions.count ? positions.positionAt(j + 1) : segment.size
          const size = next - past - Format.FRAME_HEADER_BYTES
          if (count > 0 && planned + size > maxBytes) break
          planned += size
          count++
          past = next
        }
        if (past > first) yield* walkWhole(o, segment, first, past, past - first, visit)
        if (j < positions.count) full = true
      } else {
        const index = yield* indexOf(o, segment)
        const position = index.positionAt(Math.max(0, index.floor(cursor - segment.base)))
        const budget = Math.min(Math.max(0, maxBytes - bytes), 4 * 1024 * 1024)
        const chunk = Math.max(64 * 1024, budget + o.options.indexIntervalBytes + 2 * Format.FRAME_HEADER_BYTES)
        yield* walkWhole(o, segment, position, segment.size, chunk, visit)
      }
      if (failed !== undefined) return yield* Effect.fail(corrupt(o, failed))
      if (!full) cursor = Math.max(cursor, endOf(o, i))
    }
    return out
  })

// ---------------------------------------------------------------------------
// Truncation, retention, reset
// ---------------------------------------------------------------------------

/** The frame at `position` of a segment (`size` bytes). */
const frameAt = (o: Opened, segment: Segments.Segment, position: number, size: number) =>
  Effect.gen(function* () {
    let found: Format.Frame | undefined
    yield* walkWhole(o, segment, position, position + size, size, (f) => {
      found = f
      return false
    })
    if (found === undefined) return yield* Effect.fail(corrupt(o, `no batch at byte ${position} of ${segment.base}`))
    return found
  })

/**
 * Drops every record at or past `offset`: the segments after the one holding it go, and that one is cut at the
 * batch holding it — written back up to `offset` in place, unless a producer stamped it (then it goes whole; and when
 * that batch straddles the log start, the log is left empty at its start). In order: the producer snapshot as of
 * the new end, the log-state checkpoint, the cut, the later segments, the high watermark (see the module comment).
 */
const truncateTo = (o: Opened, offset: number): Effect.Effect<void, TabletLogError> =>
  Effect.gen(function* () {
    if (offset >= o.end) return
    if (offset < o.start) return yield* Effect.fail(outOfRange(o, offset))
    const k = holding(o, offset)
    const segment = o.segments[k]!
    const sealed = segment !== active(o)
    if (segment.batches === undefined) yield* rebuildIndexes(o, segment, true)
    const positions = segment.batches!
    const j = Math.max(0, positions.floor(offset - segment.base))
    const position = positions.positionAt(j)
    const next = j + 1 < positions.count ? positions.positionAt(j + 1) : segment.size
    const frame = yield* frameAt(o, segment, position, next - position)
    let end = frame.baseOffset
    let cut = position
    let writeBack: ReadonlyArray<Uint8Array> | undefined
    if (frame.baseOffset < offset && frame.producer === undefined) {
      const batch = Codec.decodeBatch(frame.baseOffset, frame.encoded)
      if (typeof batch === "string") return yield* Effect.fail(corrupt(o, batch))
      const encoded = Codec.encodeBatch(batch.epoch, batch.records.slice(0, offset - frame.baseOffset))
      writeBack = [Format.frameHeader(frame.baseOffset, encoded), encoded]
      cut = position + Format.FRAME_HEADER_BYTES + encoded.length
      end = offset
    }
    // A producer's batch straddling the log start goes whole too: the log is left empty at its start.
    const emptied = end < o.start
    const epochs = LeaderEpochCache.truncateFromEnd(o.epochs, end)
    const producers = yield* producersAt(o, end)
    if (emptied) end = o.start

    yield* writeSnapshot(o, end, producers)
    yield* dropSnapshots(o, (s) => s > end)
    yield* writeLogState(o, { start: o.start, epochs })
    o.epochs = epochs
    setProducers(o, producers)
    const handle = yield* handleOf(o, segment)
    if (writeBack !== undefined) yield* disk(o, Files.writeAt(handle, segment.path, writeBack, position))
    yield* disk(o, Files.truncate(handle, segment.path, cut))
    segment.size = cut
    Segments.cutIndexes(segment, position)
    if (writeBack !== undefined) Segments.noteBatch(segment, frame.baseOffset, position, o.options.indexIntervalBytes)
    o.end = end
    for (const later of o.segments.splice(k + 1).reverse()) yield* deleteSegment(o, later)
    if (sealed) {
      // It is the active segment now: its index file is written again when it rolls.
      o.open = o.open.filter((s) => s !== segment)
      yield* disk(o, Files.remove(segment.indexPath))
    }
    o.unflushed += writeBack === undefined ? 0 : cut - position
    if (emptied) {
      // Every batch left is below the start: a new segment starts there, and the others go.
      o.segments.push(yield* createSegment(o, o.start, yield* Clock.currentTimeMillis))
      for (const gone of o.segments.splice(0, o.segments.length - 1)) yield* deleteSegment(o, gone)
      o.unflushed = 0
      yield* dropSnapshots(o, (s) => s < o.start)
    }
    if (o.hw > end) {
      yield* writeHighWatermark(o, end, false)
      o.hw = end
    }
  })

/**
 * Moves the log start to `offset` (retention): the log-state checkpoint first, then the segments wholly below it go
 * (the active one too when `offset` is the log end: the log rolls first).
 */
const deleteBefore = (o: Opened, offset: number): Effect.Effect<void, TabletLogError> =>
  Effect.gen(function* () {
    if (offset <= o.start) return
    if (offset > o.end) return yield* Effect.fail(outOfRange(o, offset))
    const epochs = LeaderEpochCache.truncateFromStart(o.epochs, offset)
    yield* writeLogState(o, { start: offset, epochs })
    o.start = offset
    o.epochs = epochs
    // A producer whose batches all went with them goes too (Kafka removes such producers at log start moves).
    setProducers(o, keepFrom(new Map(o.producers), offset))
    if (o.hw < offset) {
      yield* writeHighWatermark(o, offset, false)
      o.hw = offset
    }
    // The producers as of the new start (the roll's snapshot, when it rolls), then the segments below it go.
    if (offset === o.end && active(o).size > 0) yield* roll(o, yield* Clock.currentTimeMillis)
    else yield* writeSnapshot(o, o.end, o.producers)
    while (o.segments.length > 1 && o.segments[1]!.base <= offset) {
      const gone = o.segments.shift()!
      yield* deleteSegment(o, gone)
    }
    yield* dropSnapshots(o, (s) => s < o.segments[0]!.base)
  })

/**
 * Empties the log and starts it at `offset`: the log-state checkpoint first (every segment is then below the start),
 * then the files. Below the log end, it first resets to the end, then moves the empty log down to `offset`.
 */
const resetTo = (o: Opened, offset: number): Effect.Effect<void, TabletLogError> =>
  Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    const at = Math.max(offset, o.end)
    yield* writeLogState(o, { start: at, epochs: LeaderEpochCache.empty })
    o.start = at
    o.epochs = LeaderEpochCache.empty
    setProducers(o, new Map())
    yield* writeHighWatermark(o, at, false)
    o.hw = at
    for (const segment of o.segments.splice(0).reverse()) yield* deleteSegment(o, segment)
    o.open = []
    o.unflushed = 0
    o.segments = [yield* createSegment(o, at, now)]
    o.end = at
    // An empty log needs no snapshot: its producers are none, and so are those of a walk from its start.
    yield* dropSnapshots(o, () => true)
    if (offset === at) return
    // Below the end: the empty segment moves down to `offset`.
    yield* deleteSegment(o, o.segments[0]!)
    o.segments = [yield* createSegment(o, offset, now)]
    o.end = offset
    yield* writeLogState(o, { start: offset, epochs: LeaderEpochCache.empty })
    o.start = offset
    yield* writeHighWatermark(o, offset, false)
    o.hw = offset
  })

/** Drops the producers idle for `idleMs` (an entry loaded counts from the opening); how many. */
const expireProducers = (o: Opened, idleMs: number): Effect.Effect<number, TabletLogError> =>
  Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    const kept = new Map(o.producers)
    for (const id of o.producers.keys()) {
      if (now - (o.lastAppend.get(id) ?? o.openedAt) >= idleMs) kept.delete(id)
    }
    const gone = o.producers.size - kept.size
    if (gone > 0) {
      yield* writeSnapshot(o, o.end, kept)
      setProducers(o, kept)
    }
    return gone
  })

const checkpointHighWatermark = (o: Opened, hw: number): Effect.Effect<void, TabletLogError> =>
  Effect.gen(function* () {
    const next = Math.min(Math.max(hw, o.start), o.end)
    if (next === o.hw) return
    yield* writeHighWatermark(o, next, false)
    o.hw = next
  })
