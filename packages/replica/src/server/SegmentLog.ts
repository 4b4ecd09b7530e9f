/**
 * A tablet replica's log on segment files (Kafka's layout, written for Strata): the `TabletLog` of
 * `./TabletLog.ts` with its batches in files of their own rather than in a key-value store.
 *
 * Layout. One directory per log. The batches live in segment files named by their base offset
 * (`00000000000000000000.log`), each batch framed as its encoded length, a CRC-32 and its base offset, then the tablet
 * batch encoding (`batchCodec`). Appends go to the end of the last segment (the active one), one `writev` per call
 * (a follower's batches all in one); the log rolls to a new segment once the active one would pass `segmentBytes`,
 * or is `segmentMs` old (by Effect's `Clock`). Each segment has a sparse index (an entry every `indexIntervalBytes`
 * of log, offset → position), written to its `.index` file (with a CRC-32) when the segment is sealed; a read finds
 * its start by a binary search of the index and a short walk. The active segment also keeps the positions of its
 * latest batches (`RECENT_POSITIONS` at least), so reads of the recent tail go straight to their bytes.
 *
 * Beside the segments, checkpoint files, each with a CRC-32: `log-state.checkpoint` (the log start offset, the
 * leader-epoch cache, and a cut in progress), replaced atomically (written beside, flushed, renamed over, the
 * directory flushed); `high-watermark.checkpoint`, written in place (one write of its 13 bytes, kept open) on every
 * change of the high watermark and flushed only when the log closes; and producer snapshots (`<offset>.snapshot`:
 * every producer's entry after the batches below that offset, and the log start then), replaced atomically.
 *
 * Durability. The active segment is flushed to the device (`fsync`) when it rolls (before the next segment exists,
 * so a sealed segment is always whole on the device), when the log closes, before a truncation, a producer expiry
 * or a retention that writes a snapshot, and by the flush policy (`flushIntervalMs`, in the background outside the
 * log's lock; `flushBytes`, in the append), which by default flushes nothing: like Kafka, the log relies on
 * replication and the operating system (a process crash loses nothing written, a power loss what the OS had not
 * written back). The log state is flushed on every write; snapshots when a truncation, a retention, a producer expiry
 * or the closing writes them, not when a roll does (a power loss that takes one costs the next opening a longer
 * walk, and producers' older batches below the log start); index files never (they are rebuilt when missing or
 * damaged); the high watermark when the log closes (after a power loss the log opens with it at the log start at
 * worst).
 *
 * Order of changes. Each change is ordered so that a process killed at any point reopens to the log before or after
 * it: an append is one write (its epoch's checkpoint after it is found again by the walk); a retention writes the
 * log state first, then deletes the segments wholly below the new start (deleting them again at the next opening);
 * a producer expiry is one snapshot. A truncation and a reset are cuts. A truncation first writes a snapshot of the
 * producers as of its new end (valid with the batches past it, and without them); then, for both, the log state
 * with the cut in it (`Format.Cut`: emptied, or the segment and position it ends at with the part of a batch kept,
 * to write back) — the point of no return — then the cut itself, each step one that can be done again (later
 * segments deleted, the kept part written back and flushed before the file is cut, the cut flushed), then the log
 * state without it; a log opened with a cut in its log state completes it first. The log's state in memory moves
 * once the write that commits the change succeeded (its end, for a cut, once the files are cut); a storage failure
 * in the middle of a change leaves the log refusing every operation with that failure until it is opened again (its
 * files then say what was written).
 *
 * Checked at open: the checkpoints' CRCs (a log state that fails is `Corrupt`; a high watermark or a snapshot that
 * fails reads as absent); a cut in progress completed; the first segment holding the log start; the segments from
 * the latest snapshot's on (at least the last) walked frame by frame — every CRC, each batch starting where the one
 * before it ended — rebuilding the producer entries, the epochs written after the log-state checkpoint, the log end
 * and the active segment's index; a torn tail of the last segment (a frame cut short, a CRC that does not match, a
 * batch out of place) cut off. Any such damage in a sealed segment is `Corrupt`, never cut: nothing is deleted but a
 * torn tail. Each sealed segment before the walk is checked cheaply: its batches from its index's last entry must end
 * where the next segment starts (a missing segment is `Corrupt`, not a gap). Checked on read: every batch's CRC, and
 * that the batches continue each other from the one holding the offset asked to the log end (across segments), so a
 * read never returns a damaged batch or skips offsets: `Corrupt` instead. A damaged index (its CRC) is rebuilt.
 *
 * It differs from the store-backed log where files make it so:
 * - `sizeBytes` is the bytes of its segment files: each batch's encoding plus its 16-byte frame; a read's
 *   `maxBytes` counts each batch's encoding only (as the store-backed log does, and as a reply carries it).
 * - `deleteBefore` deletes whole segments: the batches below the new start in the segment holding it stay on disk
 *   (and in `sizeBytes`) until their segment is deleted, never read.
 * - `truncateTo` at an offset held by a producer's batch that straddles the log start (the batch goes whole) leaves
 *   the log empty at its start, as the store-backed log does.
 * - one open log per directory: a second `make` on a directory open in this process fails with `StoreLocked`
 *   (another process is the caller's to keep out).
 * - `probe` writes, flushes and deletes a scratch file of one page in the log's directory.
 *
 * Every operation runs alone (one at a time per log); changes are not interruptible once started.
 *
 * @since 0.1.0
 */
import { Models, OptionSchemas, Store } from "@strata/core"
import { join, resolve } from "node:path"
import { Clock, Effect, Schema, type Scope } from "effect"
import * as LeaderEpochCache from "../machines/LeaderEpochCache.js"
import * as ProducerState from "../machines/ProducerState.js"
import type * as ReplicaManager from "../protocol/ReplicaManager.js"
import * as Codec from "../wire/internal/batchCodec.js"
import * as Files from "./internal/segmentFiles.js"
import * as Format from "./internal/segmentFormat.js"
import * as RecentTail from "./internal/recentTail.js"
import {
  active,
  alone,
  change,
  corrupt,
  cutSegment,
  disk,
  dropSnapshots,
  emptyAtStart,
  endOf,
  error,
  flush,
  frameHolding,
  holding,
  indexOf,
  type Opened,
  outOfRange,
  producersAt,
  roll,
  setProducers,
  walkWhole,
  writeHighWatermark,
  writeLogState,
  writeSnapshot,
  deleteSegment
} from "./internal/segmentLogState.js"
import { close, load } from "./internal/segmentRecovery.js"
import * as Segments from "./internal/segments.js"
import {
  type Appended,
  appendChecked,
  newestOf as newestOfBatch,
  retained,
  type TabletLog,
  type TabletLogError
} from "./TabletLog.js"

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

/**
 * The largest segment size: positions in a segment are 32-bit.
 *
 * @since 0.1.0
 */
export const MAX_SEGMENT_BYTES = 0x7fff_ffff

/**
 * The default bytes of the recent tail a log keeps in memory: 1 MiB.
 *
 * @since 0.1.0
 */
export const DEFAULT_TAIL_BYTES = 1024 * 1024

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
  flushBytes: Schema.optional(PositiveInt),
  /**
   * The bytes of the batches last written that the log keeps in memory, as written (1 MiB; 0: none): a read from
   * there (a follower's fetch, a consumer at the end) is answered without reading the segment files.
   */
  tailBytes: withDefault(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)), DEFAULT_TAIL_BYTES)
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

/** The scratch file `probe` writes (a temporary file: one a crash leaves is deleted when the log opens). */
const PROBE_FILE = `probe${Format.TEMP_SUFFIX}`

/** The bytes `probe` writes: a page. */
const PROBE_BYTES = 4096

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
      yield* Effect.forkScoped(Effect.forever(Effect.andThen(Effect.sleep(every), Effect.ignore(flushAside(o)))))
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
      retain: (retention, limit, nowMs) => change(o, retain(o, retention, limit, nowMs)),
      resetTo: (offset) => change(o, resetTo(o, offset)),
      checkpointHighWatermark: (hw) => change(o, checkpointHighWatermark(o, hw)),
      probe: alone(o, disk(o, Files.scratch(join(directory, PROBE_FILE), new Uint8Array(PROBE_BYTES))))
    }
    return log
  })

/** The tablet options name, for an error about them (whatever they hold). */
const nameOf = (options: unknown): string => {
  const tablet = typeof options === "object" && options !== null ? (options as { tablet?: unknown }).tablet : undefined
  const t = typeof tablet === "object" && tablet !== null ? (tablet as { table?: unknown; bucket?: unknown }) : {}
  return `${String(t.table)}/${String(t.bucket)}`
}

/**
 * The flush of `flushIntervalMs`: what to flush is taken under the log's lock, the flush itself runs outside it
 * (appends and reads go on meanwhile). A flush that fails breaks the log (what the device holds is unknown), unless
 * its segment was sealed or deleted meanwhile (then it was flushed, or is gone).
 */
const flushAside = (o: Opened) =>
  Effect.gen(function* () {
    const due = yield* alone(
      o,
      Effect.sync(() => {
        const segment = active(o)
        const taken = { segment, handle: segment.handle, written: o.written, directory: o.directoryDirty }
        o.directoryDirty = false
        return taken
      })
    )
    const bytes = due.written > o.flushedTo
    if (!bytes && !due.directory) return
    const segmentSynced = yield* Effect.result(
      bytes && due.handle !== undefined ? disk(o, Files.sync(due.handle, due.segment.path)) : Effect.void
    )
    const directorySynced = yield* Effect.result(
      due.directory ? disk(o, Files.syncDirectory(o.directory)) : Effect.void
    )
    yield* alone(
      o,
      Effect.sync(() => {
        const still = active(o) === due.segment
        if (segmentSynced._tag === "Failure" && still) o.broken = segmentSynced.failure
        else if (segmentSynced._tag === "Success" && still) o.flushedTo = Math.max(o.flushedTo, due.written)
        if (directorySynced._tag === "Failure") {
          o.directoryDirty = true
          o.broken = directorySynced.failure
        }
      })
    )
  })

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
 * checkpoint when they start an epoch (a crash before it: the walk at the next opening finds the epoch in the
 * batches). The log's end, producers and positions move once the batches are written, its epochs once the
 * checkpoint is.
 */
const appendAt = (o: Opened, batches: ReadonlyArray<Codec.Batch>) =>
  Effect.gen(function* () {
    let epochs = o.epochs
    let end = o.end
    const producers = new Map<number, ProducerState.Entry>()
    const frames: Array<{
      readonly baseOffset: number
      readonly batch: Codec.Batch
      readonly head: Uint8Array
      readonly encoded: Uint8Array
    }> = []
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
      frames.push({ baseOffset: b.baseOffset, batch: b, head: Format.frameHeader(b.baseOffset, encoded), encoded })
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
    RecentTail.note(
      o.tail,
      frames.map((f) => ({ batch: Codec.encodedBatch(f.batch, f.encoded), bytes: f.encoded.length }))
    )
    o.written += total
    for (const [id, entry] of producers) o.producers.set(id, entry)
    if (producers.size > 0) yield* touch(o, producers.keys())
    if (epochs !== o.epochs) {
      yield* writeLogState(o, { start: o.start, epochs })
      o.epochs = epochs
    }
    const flushBytes = o.options.flushBytes
    if (flushBytes !== undefined && o.written - o.flushedTo >= flushBytes) yield* flush(o)
  })

// ---------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------

/** The largest read of a segment past its recent positions, in bytes (a first batch larger than it reads whole). */
const MAX_READ_CHUNK_BYTES = 4 * 1024 * 1024

/**
 * The frames' encoded batches, each buffer they were read in that holds at least four times the bytes taken from it
 * copied first (the bytes taken only, into one buffer): the records decoded are views of their bytes, and would keep
 * the whole buffer alive.
 */
const compacted = (frames: ReadonlyArray<Format.Frame>): Array<Uint8Array> => {
  const taken = new Map<ArrayBufferLike, number>()
  for (const f of frames) taken.set(f.encoded.buffer, (taken.get(f.encoded.buffer) ?? 0) + f.encoded.byteLength)
  const copies = new Map<ArrayBufferLike, { readonly bytes: Uint8Array; at: number }>()
  for (const [buffer, bytes] of taken) {
    if (bytes * 4 < buffer.byteLength) copies.set(buffer, { bytes: new Uint8Array(bytes), at: 0 })
  }
  return frames.map((f) => {
    const copy = copies.get(f.encoded.buffer)
    if (copy === undefined) return f.encoded
    const view = copy.bytes.subarray(copy.at, copy.at + f.encoded.byteLength)
    view.set(f.encoded)
    copy.at += f.encoded.byteLength
    return view
  })
}

/**
 * Whole batches from the one holding `from` while their encodings fit in `maxBytes`, the first one whatever its
 * size, records before `from` cut off; across segments. Each batch must start where the one before it ended (the
 * first at or before `from`), and each segment read to its end must end where the next one starts: anything else is
 * `Corrupt`, never a read that skips offsets.
 */
const read = (o: Opened, from: number, maxBytes: number): Effect.Effect<Array<Codec.Batch>, TabletLogError> =>
  Effect.gen(function* () {
    if (from < o.start || from > o.end) return yield* Effect.fail(outOfRange(o, from))
    if (from === o.end) return []
    const recent = RecentTail.read(o.tail, from, maxBytes)
    if (recent !== undefined) return recent
    const taken: Array<Format.Frame> = []
    let bytes = 0
    let full = false
    let bad: string | undefined
    let cursor = from
    const fits = (size: number) => taken.length === 0 || bytes + size <= maxBytes
    const visit = (f: Format.Frame) => {
      // The batches before the one holding `from` (a walk starts at an index entry at or below it).
      if (taken.length === 0 && f.baseOffset + f.count <= cursor) return true
      if (taken.length === 0 ? f.baseOffset > cursor : f.baseOffset !== cursor) {
        bad = `a batch at ${f.baseOffset} where ${cursor} was expected`
        return false
      }
      if (!fits(f.encoded.length)) {
        full = true
        return false
      }
      taken.push(f)
      bytes += f.encoded.length
      cursor = f.baseOffset + f.count
      return true
    }
    for (let i = holding(o, from); i < o.segments.length && !full && cursor < o.end; i++) {
      const segment = o.segments[i]!
      const recent = segment.batches
      const j = recent === undefined ? -1 : recent.floor(cursor - segment.base)
      if (recent !== undefined && j >= 0) {
        // The recent tail of the active segment: exactly the bytes of the batches that fit, in one read.
        const first = recent.positionAt(j)
        let past = first
        let planned = bytes
        let count = taken.length
        let k = j
        for (; k < recent.count; k++) {
          const next = k + 1 < recent.count ? recent.positionAt(k + 1) : segment.size
          const size = next - past - Format.FRAME_HEADER_BYTES
          if (count > 0 && planned + size > maxBytes) break
          planned += size
          count++
          past = next
        }
        if (past > first) yield* walkWhole(o, segment, first, past, past - first, visit)
        if (k < recent.count) full = true
      } else {
        const index = segment.index ?? (yield* indexOf(o, segment))
        const e = index.floor(cursor - segment.base)
        const position = e < 0 ? 0 : index.positionAt(e)
        const budget = Math.min(Math.max(0, maxBytes - bytes), MAX_READ_CHUNK_BYTES)
        const chunk = Math.max(64 * 1024, budget + o.options.indexIntervalBytes + 2 * Format.FRAME_HEADER_BYTES)
        yield* walkWhole(o, segment, position, segment.size, chunk, visit)
      }
      const file = Format.segmentFile(segment.base)
      if (bad !== undefined) return yield* Effect.fail(corrupt(o, `${file}: ${bad}`))
      if (!full && cursor !== endOf(o, i)) {
        return yield* Effect.fail(corrupt(o, `${file} ends at ${cursor}, where ${endOf(o, i)} was expected`))
      }
    }
    const encoded = compacted(taken)
    const out: Array<Codec.Batch> = []
    for (let i = 0; i < taken.length; i++) {
      const f = taken[i]!
      // Checked, not decoded: a batch on its way to the wire goes as the bytes it was read as.
      const batch = Codec.storedBatch(f.baseOffset, encoded[i]!)
      if (typeof batch === "string") return yield* Effect.fail(corrupt(o, batch))
      out.push(batch.baseOffset < from ? RecentTail.sliced(batch, from - batch.baseOffset) : batch)
    }
    return out
  })

// ---------------------------------------------------------------------------
// Truncation, retention, reset
// ---------------------------------------------------------------------------

/** A frame's bytes (header and encoding) for a batch's first `count` records. */
const framedPart = (o: Opened, frame: Format.Frame, count: number) =>
  Effect.suspend(() => {
    const batch = Codec.decodeBatch(frame.baseOffset, frame.encoded)
    if (typeof batch === "string") return Effect.fail(corrupt(o, batch))
    const encoded = Codec.encodeBatch(batch.epoch, batch.records.slice(0, count))
    const out = new Uint8Array(Format.FRAME_HEADER_BYTES + encoded.length)
    out.set(Format.frameHeader(frame.baseOffset, encoded))
    out.set(encoded, Format.FRAME_HEADER_BYTES)
    return Effect.succeed(out)
  })

/**
 * Drops every record at or past `offset`: the segments after the one holding it go, and that one is cut at the
 * batch holding it — the part below `offset` written back in its place, unless a producer stamped it (then it goes
 * whole; and when that batch straddles the log start, the log is left empty at its start). A cut (see the module
 * comment): the producer snapshot as of the new end, the log state with the cut, the cut, the high watermark, the
 * log state without the cut.
 */
const truncateTo = (o: Opened, offset: number): Effect.Effect<void, TabletLogError> =>
  Effect.gen(function* () {
    if (offset >= o.end) return
    if (offset < o.start) return yield* Effect.fail(outOfRange(o, offset))
    RecentTail.drop(o.tail)
    const now = yield* Clock.currentTimeMillis
    const k = holding(o, offset)
    const segment = o.segments[k]!
    const { frame, position } = yield* frameHolding(o, segment, offset)
    const kept = frame.producer === undefined ? offset - frame.baseOffset : 0
    const end = frame.baseOffset + kept
    if (end < o.start) {
      // A producer's batch straddling the log start goes whole: the log is left empty at its start.
      const epochs = LeaderEpochCache.truncateFromEnd(o.epochs, o.start)
      yield* writeLogState(o, { start: o.start, epochs, cut: { _tag: "Empty" } })
      o.epochs = epochs
      setProducers(o, new Map())
      yield* emptyAtStart(o, now)
    } else {
      const epochs = LeaderEpochCache.truncateFromEnd(o.epochs, end)
      const producers = yield* producersAt(o, end)
      const written = kept > 0 ? yield* framedPart(o, frame, kept) : undefined
      const cut = { _tag: "At", segment: segment.base, position, end, frame: written } as const
      // Valid with the batches past `end` (the producers before the cut) and without them (after it).
      yield* writeSnapshot(o, end, producers, true)
      // A sealed segment becomes the active one: its whole index in memory.
      const sealed = segment.batches === undefined
      if (sealed) yield* indexOf(o, segment)
      yield* writeLogState(o, { start: o.start, epochs, cut })
      o.epochs = epochs
      setProducers(o, producers)
      yield* cutSegment(o, k, cut)
      if (sealed) {
        segment.batches = Segments.recentPositions()
        segment.createdAt = now
      }
      Segments.cutIndexes(segment, position)
      if (written !== undefined) {
        Segments.noteBatch(segment, frame.baseOffset, position, o.options.indexIntervalBytes)
      }
      o.end = end
      o.flushedTo = o.written
      yield* dropSnapshots(o, (s) => s > end)
    }
    if (o.hw > o.end) {
      yield* writeHighWatermark(o, o.end, false)
      o.hw = o.end
    }
    yield* writeLogState(o, { start: o.start, epochs: o.epochs })
  })

/**
 * Moves the log start to `offset` (retention): the log-state checkpoint first, then the segments wholly below it go
 * (the active one too when `offset` is the log end: the log rolls first). A snapshot of the producers is written
 * first only when no snapshot at or past the first segment kept is left (the segments below go with theirs); to the
 * log end, one at the end is written (flushed) before anything moves, so that an opening after a crash half-way,
 * which empties the log at its new start, still has every producer.
 */
const deleteBefore = (o: Opened, offset: number): Effect.Effect<void, TabletLogError> =>
  Effect.gen(function* () {
    if (offset <= o.start) return
    if (offset > o.end) return yield* Effect.fail(outOfRange(o, offset))
    if (offset === o.end && o.producers.size > 0) yield* writeSnapshot(o, o.end, o.producers, true)
    const epochs = LeaderEpochCache.truncateFromStart(o.epochs, offset)
    yield* writeLogState(o, { start: offset, epochs })
    o.start = offset
    RecentTail.trimBelow(o.tail, offset)
    o.epochs = epochs
    // The producers stay, even one whose batches all went (KIP-360): a retry of its last batch must still be known
    // as one, not appended again; it is forgotten once idle for `producerIdExpiration`.
    if (o.hw < offset) {
      yield* writeHighWatermark(o, offset, false)
      o.hw = offset
    }
    if (offset === o.end && active(o).size > 0) yield* roll(o, yield* Clock.currentTimeMillis)
    else {
      const first = o.segments[holding(o, offset)]!.base
      if (!o.snapshots.some((s) => s >= first)) yield* writeSnapshot(o, o.end, o.producers, true)
    }
    while (o.segments.length > 1 && o.segments[1]!.base <= offset) {
      const gone = o.segments.shift()!
      yield* deleteSegment(o, gone)
    }
    yield* dropSnapshots(o, (s) => s < o.segments[0]!.base)
  })

/**
 * A sealed segment's newest record timestamp: of the batches past its last index entry (the segment's last
 * `indexIntervalBytes` or so), read once and kept.
 */
const newestOf = (o: Opened, segment: Segments.Segment): Effect.Effect<number, TabletLogError> =>
  Effect.gen(function* () {
    if (segment.newest !== undefined) return segment.newest
    const index = yield* indexOf(o, segment)
    const from = index.count === 0 ? 0 : index.positionAt(index.count - 1)
    let newest = Number.NEGATIVE_INFINITY
    let failed: string | undefined
    yield* walkWhole(o, segment, from, segment.size, Math.max(4096, segment.size - from), (f) => {
      const batch = Codec.decodeBatch(f.baseOffset, f.encoded)
      if (typeof batch === "string") {
        failed = batch
        return false
      }
      newest = Math.max(newest, newestOfBatch(batch))
      return true
    })
    if (failed !== undefined) return yield* Effect.fail(corrupt(o, failed))
    segment.newest = newest
    return newest
  })

/**
 * Whole sealed segments from the start while retention lets them go, below `limit` (see `TabletLog.retain`); a
 * segment's time is its newest record's past its last index entry.
 */
const retain = (
  o: Opened,
  retention: ReplicaManager.Retention,
  limit: number,
  nowMs: number
): Effect.Effect<number, TabletLogError> =>
  Effect.gen(function* () {
    let cut = o.start
    let total = o.segments.reduce((n, s) => n + s.size, 0)
    for (let i = 0; i < o.segments.length - 1; i++) {
      const segment = o.segments[i]!
      const end = o.segments[i + 1]!.base
      if (end > limit) break
      const newest = retention.ms === undefined ? Number.POSITIVE_INFINITY : yield* newestOf(o, segment)
      if (!retained(retention, nowMs, newest, segment.size, total)) break
      cut = end
      total -= segment.size
    }
    if (cut > o.start) yield* deleteBefore(o, cut)
    return o.start
  })

/**
 * Empties the log and starts it at `offset`, a cut (see the module comment): the log state with the new start and
 * the cut, every segment deleted and an empty one created at `offset`, the snapshots deleted, the high watermark,
 * the log state without the cut.
 */
const resetTo = (o: Opened, offset: number): Effect.Effect<void, TabletLogError> =>
  Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    RecentTail.drop(o.tail)
    yield* writeLogState(o, { start: offset, epochs: LeaderEpochCache.empty, cut: { _tag: "Empty" } })
    o.start = offset
    o.epochs = LeaderEpochCache.empty
    setProducers(o, new Map())
    yield* emptyAtStart(o, now)
    yield* writeHighWatermark(o, offset, false)
    o.hw = offset
    yield* writeLogState(o, { start: offset, epochs: LeaderEpochCache.empty })
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
      yield* writeSnapshot(o, o.end, kept, true)
      setProducers(o, kept)
    }
    return gone
  })

/** Checkpoints the high watermark (clamped to the log), when it moved: one write in place. */
const checkpointHighWatermark = (o: Opened, hw: number): Effect.Effect<void, TabletLogError> =>
  Effect.gen(function* () {
    const next = Math.min(Math.max(hw, o.start), o.end)
    if (next === o.hw) return
    yield* writeHighWatermark(o, next, false)
    o.hw = next
  })
