/**
 * The byte layout of a segment log's files, as pure functions (no I/O).
 *
 * Segment (`<base offset, 20 digits>.log`): stored batches one after another, each a frame: the length of its
 * encoded batch (u32), a CRC-32 (u32, of the base offset and the encoded batch), its base offset (u64), then the
 * batch in the tablet batch encoding (`batchCodec`: epoch, record count, producer stamp, records). Big-endian.
 *
 * Index (`<base offset>.index`): a CRC-32 of the entries (u32), then a sparse map from offsets to positions in its
 * segment, one entry of 8 bytes per `indexIntervalBytes` of log: the base offset of a batch relative to the segment's
 * (u32) and the position of its frame (u32), both increasing, the first at position 0.
 *
 * Checkpoints: `log-state.checkpoint` (the log start offset, the leader-epoch cache, and a cut in progress),
 * `high-watermark.checkpoint`, and one producer snapshot per offset it is as of (`<offset>.snapshot`: every
 * producer's entry after the batches below that offset, and the log start then). Each starts with a CRC-32 of the
 * rest, then a version byte.
 *
 * @internal
 */
import { crc32 } from "node:zlib"
import type * as LeaderEpochCache from "../../machines/LeaderEpochCache.js"
import type * as ProducerState from "../../machines/ProducerState.js"
import * as Codec from "../../wire/internal/batchCodec.js"

/** The bytes a frame adds before its encoded batch: length, CRC, base offset. */
export const FRAME_HEADER_BYTES = 16

/** The bytes of a batch encoding's header that the log reads without decoding records (with a producer stamp). */
const BATCH_HEADER_BYTES = 25

/** The largest encoded batch a frame may declare (beyond it, the length is not a length: a torn or foreign frame). */
export const MAX_BATCH_BYTES = 0x7fff_ffff

/** The file of the log start and the leader-epoch cache. */
export const LOG_STATE_FILE = "log-state.checkpoint"
/** The file of the high-watermark checkpoint. */
export const HIGH_WATERMARK_FILE = "high-watermark.checkpoint"

/** What a temporary file's name ends with (written, then renamed over its target). */
export const TEMP_SUFFIX = ".tmp"

const name = (offset: number, extension: string) => `${String(offset).padStart(20, "0")}.${extension}`

/** The segment file of the segment based at `base`. */
export const segmentFile = (base: number): string => name(base, "log")
/** The index file of the segment based at `base`. */
export const indexFile = (base: number): string => name(base, "index")
/** The producer snapshot as of `offset`. */
export const snapshotFile = (offset: number): string => name(offset, "snapshot")

/** A directory entry of the log: a segment, an index, a snapshot (by offset), or something else. */
export type FileKind =
  | { readonly _tag: "Segment" | "Index" | "Snapshot"; readonly offset: number }
  | { readonly _tag: "Temp" }
  | { readonly _tag: "Other" }

const FILE = /^(\d{20})\.(log|index|snapshot)$/

/** What a file of the log's directory is, by its name. */
export const kindOf = (file: string): FileKind => {
  if (file.endsWith(TEMP_SUFFIX)) return { _tag: "Temp" }
  const m = FILE.exec(file)
  if (m === null) return { _tag: "Other" }
  const offset = Number(m[1])
  if (!Number.isSafeInteger(offset)) return { _tag: "Other" }
  return { _tag: m[2] === "log" ? "Segment" : m[2] === "index" ? "Index" : "Snapshot", offset }
}

const setOffset = (view: DataView, at: number, offset: number) => {
  view.setUint32(at, Math.floor(offset / 0x1_0000_0000))
  view.setUint32(at + 4, offset >>> 0)
}

const getOffset = (view: DataView, at: number): number => view.getUint32(at) * 0x1_0000_0000 + view.getUint32(at + 4)

const viewOf = (bytes: Uint8Array) => new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)

/** The CRC-32 a frame carries: of its base offset's 8 bytes, then of the encoded batch. */
const frameCrc = (frameHead: Uint8Array, encoded: Uint8Array) => crc32(encoded, crc32(frameHead.subarray(8, 16)))

/** The header of the frame of a batch encoded as `encoded` at `baseOffset` (the batch's bytes follow it). */
export const frameHeader = (baseOffset: number, encoded: Uint8Array): Uint8Array => {
  const head = new Uint8Array(FRAME_HEADER_BYTES)
  const view = viewOf(head)
  view.setUint32(0, encoded.length)
  setOffset(view, 8, baseOffset)
  view.setUint32(4, frameCrc(head, encoded))
  return head
}

/** What the log reads of a batch without decoding its records. */
export interface BatchHeader {
  readonly baseOffset: number
  readonly epoch: number
  readonly count: number
  readonly producer: ProducerState.Producer | undefined
}

/** A frame found in a buffer: its header, and where its encoded batch is. */
export interface Frame extends BatchHeader {
  /** The bytes of the encoded batch (a view of the buffer). */
  readonly encoded: Uint8Array
  /** The frame's bytes: header and batch. */
  readonly frameBytes: number
}

/** What is at a position of a buffer of frames. */
export type Parsed =
  | { readonly _tag: "Frame"; readonly frame: Frame }
  /** The buffer ends before the frame does: `need` bytes from the position hold it (0: its header is cut). */
  | { readonly _tag: "Short"; readonly need: number }
  /** Not a frame: a torn write, or bytes that were never one. */
  | { readonly _tag: "Bad"; readonly detail: string }

/** Reads the frame at `at` of `buffer`, checking its length, its CRC and its batch header. */
export const parseFrame = (buffer: Uint8Array, at: number): Parsed => {
  const available = buffer.length - at
  if (available < FRAME_HEADER_BYTES) return { _tag: "Short", need: 0 }
  const view = viewOf(buffer)
  const length = view.getUint32(at)
  const baseOffset = getOffset(view, at + 8)
  if (length < 9 || length > MAX_BATCH_BYTES) return { _tag: "Bad", detail: `a frame declares ${length} bytes` }
  const frameBytes = FRAME_HEADER_BYTES + length
  if (available < frameBytes) return { _tag: "Short", need: frameBytes }
  const encoded = buffer.subarray(at + FRAME_HEADER_BYTES, at + frameBytes)
  if (frameCrc(buffer.subarray(at, at + FRAME_HEADER_BYTES), encoded) !== view.getUint32(at + 4)) {
    return { _tag: "Bad", detail: `the batch at ${baseOffset} fails its CRC` }
  }
  const header = batchHeader(baseOffset, encoded)
  if (typeof header === "string") return { _tag: "Bad", detail: header }
  return { _tag: "Frame", frame: { ...header, encoded, frameBytes } }
}

/** The header of an encoded batch, or why it is not one. */
export const batchHeader = (baseOffset: number, encoded: Uint8Array): BatchHeader | string => {
  const view = viewOf(encoded)
  const epoch = view.getUint32(0)
  const count = view.getUint32(4)
  const flag = view.getUint8(8)
  if (count === 0) return `the batch at ${baseOffset} has no records`
  if (flag > 1) return `the batch at ${baseOffset} has producer flag ${flag}`
  if (flag === 0) return { baseOffset, epoch, count, producer: undefined }
  if (encoded.length < BATCH_HEADER_BYTES) return `the batch at ${baseOffset} ends in its producer stamp`
  const producer = { id: view.getFloat64(9), epoch: view.getUint32(17), sequence: view.getUint32(21) }
  return { baseOffset, epoch, count, producer }
}

/** The bytes an index file has before its entries (the CRC-32 of the entries). */
export const INDEX_HEADER_BYTES = 4

/**
 * Offsets (relative to a segment's base) and frame positions in it, both increasing: a segment's sparse index, or
 * (with `keep`) the positions of the active segment's latest batches, a window that keeps at least the `keep` latest
 * and at most twice that many (the older half goes when it is full).
 */
export class Positions {
  private offsets = new Uint32Array(16)
  private positions = new Uint32Array(16)
  /** How many entries it holds. */
  count = 0

  constructor(private readonly keep: number = Number.POSITIVE_INFINITY) {}

  /** Adds an entry past every other (dropping the oldest ones of a full window). */
  push(offset: number, position: number): void {
    if (this.count === this.offsets.length) {
      if (this.count >= 2 * this.keep) {
        const drop = this.count - this.keep
        this.offsets.copyWithin(0, drop, this.count)
        this.positions.copyWithin(0, drop, this.count)
        this.count -= drop
      } else {
        const offsets = new Uint32Array(this.count * 2)
        const positions = new Uint32Array(this.count * 2)
        offsets.set(this.offsets)
        positions.set(this.positions)
        this.offsets = offsets
        this.positions = positions
      }
    }
    this.offsets[this.count] = offset
    this.positions[this.count] = position
    this.count++
  }

  /** Entry `i`'s offset (relative to the segment's base). */
  offsetAt(i: number): number {
    return this.offsets[i]!
  }

  /** Entry `i`'s position in the segment. */
  positionAt(i: number): number {
    return this.positions[i]!
  }

  /** The last entry whose offset is at most `offset` (-1: none). */
  floor(offset: number): number {
    let lo = 0
    let hi = this.count - 1
    let found = -1
    while (lo <= hi) {
      const mid = (lo + hi) >>> 1
      if (this.offsets[mid]! <= offset) {
        found = mid
        lo = mid + 1
      } else hi = mid - 1
    }
    return found
  }

  /** Keeps the entries whose position is below `position`. */
  cutAt(position: number): void {
    while (this.count > 0 && this.positions[this.count - 1]! >= position) this.count--
  }

  /** The index file's bytes: the CRC-32 of the entries, then the entries. */
  encode(): Uint8Array {
    const out = new Uint8Array(INDEX_HEADER_BYTES + this.count * 8)
    const view = viewOf(out)
    for (let i = 0; i < this.count; i++) {
      view.setUint32(INDEX_HEADER_BYTES + i * 8, this.offsets[i]!)
      view.setUint32(INDEX_HEADER_BYTES + i * 8 + 4, this.positions[i]!)
    }
    view.setUint32(0, crc32(out.subarray(INDEX_HEADER_BYTES)))
    return out
  }

  /** An index file's entries, or why they cannot be an index of a segment of `size` bytes. */
  static decode(bytes: Uint8Array, size: number): Positions | string {
    if (bytes.length < INDEX_HEADER_BYTES || (bytes.length - INDEX_HEADER_BYTES) % 8 !== 0) {
      return `an index of ${bytes.length} bytes`
    }
    const view = viewOf(bytes)
    if (crc32(bytes.subarray(INDEX_HEADER_BYTES)) !== view.getUint32(0)) return "an index that fails its CRC"
    const out = new Positions()
    for (let at = INDEX_HEADER_BYTES; at < bytes.length; at += 8) {
      const offset = view.getUint32(at)
      const position = view.getUint32(at + 4)
      const last = out.count - 1
      if (position >= size) return `an index entry at position ${position} of a ${size}-byte segment`
      if (last >= 0 && (offset <= out.offsetAt(last) || position <= out.positionAt(last))) {
        return `index entries out of order at entry ${(at - INDEX_HEADER_BYTES) / 8}`
      }
      out.push(offset, position)
    }
    if (size > 0 && (out.count === 0 || out.positionAt(0) !== 0 || out.offsetAt(0) !== 0)) {
      return "an index without the segment's first batch"
    }
    return out
  }
}

/**
 * The last entry of an index file of `fileBytes` bytes from its last 8 bytes (`tail`), unchecked (the index's CRC
 * covers all its entries; the frame the entry points at checks it), or `undefined` when it has none.
 */
export const lastIndexEntry = (
  fileBytes: number,
  tail: Uint8Array
): { readonly offset: number; readonly position: number } | undefined => {
  if (fileBytes < INDEX_HEADER_BYTES + 8 || (fileBytes - INDEX_HEADER_BYTES) % 8 !== 0 || tail.length !== 8) {
    return undefined
  }
  const view = viewOf(tail)
  return { offset: view.getUint32(0), position: view.getUint32(4) }
}

// ---------------------------------------------------------------------------
// Checkpoints
// ---------------------------------------------------------------------------

const VERSION = 1

/** A checkpoint's bytes: CRC-32 of the rest, version, then `body` bytes written by `write`. */
const checkpoint = (body: number, write: (view: DataView, at: number) => void): Uint8Array => {
  const out = new Uint8Array(5 + body)
  const view = viewOf(out)
  view.setUint8(4, VERSION)
  write(view, 5)
  view.setUint32(0, crc32(out.subarray(4)))
  return out
}

/** A checkpoint's body, or why it cannot be read. */
const opened = (bytes: Uint8Array, what: string): DataView | string => {
  if (bytes.length < 5) return `the ${what} checkpoint has ${bytes.length} bytes`
  const view = viewOf(bytes)
  if (crc32(bytes.subarray(4)) !== view.getUint32(0)) return `the ${what} checkpoint fails its CRC`
  if (view.getUint8(4) !== VERSION) return `the ${what} checkpoint has version ${view.getUint8(4)}`
  return new DataView(bytes.buffer, bytes.byteOffset + 5, bytes.byteLength - 5)
}

/**
 * A cut of the log in progress: written in `log-state.checkpoint` before its first file changes, cleared once it is
 * done; a log that opens with one completes it first (each of its steps can be done again).
 */
export type Cut =
  /** The log is emptied, to start and end at the log state's start (a reset, or a truncation below the start). */
  | { readonly _tag: "Empty" }
  /**
   * The log ends in the segment based at `segment`: its bytes from `position` on go, `frame` (when set: a batch's
   * records below `end`, framed) is written at `position` first, and every later segment goes; the log then ends at
   * `end`.
   */
  | {
      readonly _tag: "At"
      readonly segment: number
      readonly position: number
      readonly end: number
      readonly frame: Uint8Array | undefined
    }

/** What `log-state.checkpoint` holds. */
export interface LogState {
  readonly start: number
  readonly epochs: LeaderEpochCache.LeaderEpochCache
  /** The cut in progress, if any. */
  readonly cut?: Cut | undefined
}

/** The bytes a cut takes in `log-state.checkpoint`. */
const cutBytes = (cut: Cut | undefined): number =>
  cut === undefined || cut._tag === "Empty" ? 1 : 1 + 24 + 4 + (cut.frame?.length ?? 0)

/**
 * The bytes of `log-state.checkpoint`: start (u64), entry count (u32), per entry epoch (u32) and start (u64), then
 * the cut in progress: none (0), `Empty` (1), or `At` (2) with its segment, position and end (u64 each), then its
 * frame's length (u32, 0 for none) and bytes.
 */
export const encodeLogState = (s: LogState): Uint8Array =>
  checkpoint(12 + s.epochs.length * 12 + cutBytes(s.cut), (view, at) => {
    setOffset(view, at, s.start)
    view.setUint32(at + 8, s.epochs.length)
    s.epochs.forEach((e, i) => {
      view.setUint32(at + 12 + i * 12, e.epoch)
      setOffset(view, at + 16 + i * 12, e.startOffset)
    })
    const c = at + 12 + s.epochs.length * 12
    const cut = s.cut
    view.setUint8(c, cut === undefined ? 0 : cut._tag === "Empty" ? 1 : 2)
    if (cut?._tag !== "At") return
    setOffset(view, c + 1, cut.segment)
    setOffset(view, c + 9, cut.position)
    setOffset(view, c + 17, cut.end)
    view.setUint32(c + 25, cut.frame?.length ?? 0)
    if (cut.frame !== undefined) new Uint8Array(view.buffer, view.byteOffset + c + 29, cut.frame.length).set(cut.frame)
  })

/** `log-state.checkpoint` back, or why it cannot be read. */
export const decodeLogState = (bytes: Uint8Array): LogState | string => {
  const view = opened(bytes, "log state")
  if (typeof view === "string") return view
  if (view.byteLength < 13) return "the log state checkpoint is cut short"
  const count = view.getUint32(8)
  const c = 12 + count * 12
  if (view.byteLength < c + 1) return `the log state checkpoint has the wrong size for ${count} epochs`
  const epochs = Array.from({ length: count }, (_, i) => ({
    epoch: view.getUint32(12 + i * 12),
    startOffset: getOffset(view, 16 + i * 12)
  }))
  for (let i = 1; i < epochs.length; i++) {
    if (epochs[i]!.epoch <= epochs[i - 1]!.epoch || epochs[i]!.startOffset < epochs[i - 1]!.startOffset) {
      return "the log state checkpoint's epochs are out of order"
    }
  }
  const start = getOffset(view, 0)
  const tag = view.getUint8(c)
  if (tag === 0 || tag === 1) {
    if (view.byteLength !== c + 1) return "the log state checkpoint has bytes past its end"
    return tag === 0 ? { start, epochs } : { start, epochs, cut: { _tag: "Empty" } }
  }
  if (tag !== 2) return `the log state checkpoint has cut kind ${tag}`
  if (view.byteLength < c + 29) return "the log state checkpoint's cut is cut short"
  const length = view.getUint32(c + 25)
  if (view.byteLength !== c + 29 + length) return "the log state checkpoint's cut has the wrong size"
  const frame = length === 0 ? undefined : new Uint8Array(view.buffer, view.byteOffset + c + 29, length).slice()
  const cut: Cut = {
    _tag: "At",
    segment: getOffset(view, c + 1),
    position: getOffset(view, c + 9),
    end: getOffset(view, c + 17),
    frame
  }
  return { start, epochs, cut }
}

/** The bytes of `high-watermark.checkpoint`: the high watermark (u64). */
export const encodeHighWatermark = (hw: number): Uint8Array => checkpoint(8, (view, at) => setOffset(view, at, hw))

/** `high-watermark.checkpoint` back, or why it cannot be read. */
export const decodeHighWatermark = (bytes: Uint8Array): number | string => {
  const view = opened(bytes, "high watermark")
  if (typeof view === "string") return view
  return view.byteLength === 8 ? getOffset(view, 0) : "the high watermark checkpoint has the wrong size"
}

/** The producers a snapshot holds, by producer id. */
export type Producers = ReadonlyMap<number, ProducerState.Entry>

/** What a producer snapshot holds. */
export interface Snapshot {
  /** The offset it is as of: the producers' entries after the batches below it. */
  readonly asOf: number
  /** The log start when it was written. */
  readonly start: number
  readonly producers: Producers
}

/**
 * The bytes of a producer snapshot: as-of offset (u64), log start (u64), producer count (u32), then per producer its
 * id (f64), the length of its entry (u32) and the entry in `batchCodec`'s producer encoding.
 */
export const encodeSnapshot = (s: Snapshot): Uint8Array => {
  const entries = [...s.producers].map(([id, entry]) => [id, Codec.encodeProducer(entry)] as const)
  const body = 20 + entries.reduce((n, [, e]) => n + 12 + e.length, 0)
  return checkpoint(body, (view, at) => {
    setOffset(view, at, s.asOf)
    setOffset(view, at + 8, s.start)
    view.setUint32(at + 16, entries.length)
    let p = at + 20
    for (const [id, e] of entries) {
      view.setFloat64(p, id)
      view.setUint32(p + 8, e.length)
      new Uint8Array(view.buffer, view.byteOffset + p + 12, e.length).set(e)
      p += 12 + e.length
    }
  })
}

/** A producer snapshot back, or why it cannot be read. */
export const decodeSnapshot = (bytes: Uint8Array): Snapshot | string => {
  const view = opened(bytes, "producer snapshot")
  if (typeof view === "string") return view
  if (view.byteLength < 20) return "the producer snapshot is cut short"
  const count = view.getUint32(16)
  const producers = new Map<number, ProducerState.Entry>()
  let p = 20
  for (let i = 0; i < count; i++) {
    if (p + 12 > view.byteLength) return "the producer snapshot is cut short"
    const id = view.getFloat64(p)
    const length = view.getUint32(p + 8)
    if (p + 12 + length > view.byteLength) return "the producer snapshot is cut short"
    const entry = Codec.decodeProducer(new Uint8Array(view.buffer, view.byteOffset + p + 12, length))
    if (typeof entry === "string") return `producer ${id}: ${entry}`
    producers.set(id, entry)
    p += 12 + length
  }
  if (p !== view.byteLength) return "the producer snapshot has bytes past its last producer"
  return { asOf: getOffset(view, 0), start: getOffset(view, 8), producers }
}
