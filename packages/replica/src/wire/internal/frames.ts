/**
 * The data link's framing: a frame is a u32 length (of what follows it), a version byte, a kind byte, a u32 request
 * id, a u32 header length, a JSON header, and a payload of raw bytes (a batch as the tablet log stores it). A reader
 * cuts a byte stream into frames, copying only a frame that arrived in more than one chunk; a frame of another
 * version ends the stream (the two sides do not speak the same framing).
 */

/** The framing's version, the second field of every frame. */
export const VERSION = 1

/** Bytes before a frame's header: length, version, kind, id, header length. */
export const PRELUDE = 14

/** The largest frame either side of a data link accepts by default: 64 MiB. */
export const DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024

/**
 * What a fetch's answer frame holds besides its batches, at the least: its prelude and the header naming a few
 * batches. An answer of more batches has a larger header: the leader then leaves the last ones for the next fetch.
 */
export const ANSWER_RESERVE = 1024

/** The most bytes of batches a fetch may ask for when its answer must fit in a frame of `maxFrameBytes`. */
export const fetchBytesWithin = (maxFrameBytes: number): number => maxFrameBytes - ANSWER_RESERVE

/** A frame taken off the wire: its kind, request id, header text and payload (a view of the bytes read). */
export interface Frame {
  readonly kind: number
  readonly id: number
  readonly header: string
  readonly payload: Uint8Array
}

const decoder = new TextDecoder("utf-8", { fatal: true })
const encoder = new TextEncoder()

/**
 * A frame's leading bytes, for a payload of `payloadBytes` bytes written after it: the prelude and the header.
 */
export const head = (kind: number, id: number, header: string, payloadBytes: number): Uint8Array => {
  const text = encoder.encode(header)
  const out = new Uint8Array(PRELUDE + text.length)
  const view = new DataView(out.buffer)
  view.setUint32(0, PRELUDE - 4 + text.length + payloadBytes)
  view.setUint8(4, VERSION)
  view.setUint8(5, kind)
  view.setUint32(6, id)
  view.setUint32(10, text.length)
  out.set(text, PRELUDE)
  return out
}

/**
 * A frame over the reader's limit that it passed over: its kind, request id and length (of what follows the length
 * field). Its bytes were dropped as they arrived, never held.
 */
export interface Skipped {
  readonly kind: number
  readonly id: number
  readonly skipped: number
}

/** Whether the reader passed over `frame`. */
export const isSkipped = (frame: Frame | Skipped): frame is Skipped => "skipped" in frame

/**
 * Cuts a stream of chunks into frames of at most `maxFrameBytes` bytes each. `push` returns the frames a chunk
 * completed, or a string saying why the stream is not frames (the connection is then beyond repair). A larger frame
 * is beyond repair too, unless `skippable` says its kind and id are those of a frame that may be passed over: then
 * its bytes are dropped as they come, and `push` returns it as `Skipped` (so that the stream, still in step, goes on
 * for the frames after it).
 */
export class FrameReader {
  private chunks: Array<Uint8Array> = []
  private buffered = 0
  /** Bytes of a skipped frame still to come, to drop. */
  private skipping = 0

  constructor(
    private readonly maxFrameBytes: number,
    private readonly skippable?: (kind: number, id: number) => boolean
  ) {}

  push(chunk: Uint8Array): Array<Frame | Skipped> | string {
    if (this.skipping > 0) {
      const drop = Math.min(this.skipping, chunk.length)
      this.skipping -= drop
      if (drop === chunk.length) return []
      chunk = chunk.subarray(drop)
    }
    this.chunks.push(chunk)
    this.buffered += chunk.length
    const frames: Array<Frame | Skipped> = []
    for (;;) {
      if (this.buffered < 4) return frames
      const length = this.peekUint32(0)
      if (length < PRELUDE - 4) return `a frame of ${length} bytes is shorter than its prelude`
      if (length > this.maxFrameBytes) {
        if (this.skippable !== undefined && this.buffered < PRELUDE) return frames
        const skipped = passOver(this.maxFrameBytes, this.skippable, length, () => this.peek(0, PRELUDE))
        if (typeof skipped === "string") return skipped
        const here = Math.min(this.buffered, 4 + length)
        this.take(here, false)
        this.skipping = 4 + length - here
        frames.push(skipped)
        continue
      }
      if (this.buffered < 4 + length) return frames
      const bytes = this.take(4 + length, true)
      const frame = parse(bytes)
      if (typeof frame === "string") return frame
      frames.push(frame)
    }
  }

  /** The u32 at `at` in the buffered bytes (at least `at + 4` of them). */
  private peekUint32(at: number): number {
    const bytes = this.peek(at, 4)
    return new DataView(bytes.buffer, bytes.byteOffset, 4).getUint32(0)
  }

  /** Buffered bytes `at`..`at + n` (there are that many): a view when one chunk holds them, else a copy. */
  private peek(at: number, n: number): Uint8Array {
    const first = this.chunks[0]!
    if (first.length >= at + n) return first.subarray(at, at + n)
    const out = new Uint8Array(n)
    let skip = at
    let i = 0
    for (const chunk of this.chunks) {
      for (let j = 0; j < chunk.length && i < n; j++) {
        if (skip > 0) skip--
        else out[i++] = chunk[j]!
      }
      if (i === n) break
    }
    return out
  }

  /** Takes the next `n` buffered bytes: a view when one chunk holds them, else one copy (none when not `keep`). */
  private take(n: number, keep: boolean): Uint8Array {
    this.buffered -= n
    const first = this.chunks[0]!
    if (first.length >= n) {
      if (first.length === n) this.chunks.shift()
      else this.chunks[0] = first.subarray(n)
      return first.subarray(0, n)
    }
    const out = keep ? Buffer.allocUnsafe(n) : undefined
    let at = 0
    while (at < n) {
      const chunk = this.chunks[0]!
      const part = Math.min(chunk.length, n - at)
      out?.set(part === chunk.length ? chunk : chunk.subarray(0, part), at)
      at += part
      if (part === chunk.length) this.chunks.shift()
      else this.chunks[0] = chunk.subarray(part)
    }
    return out ?? first.subarray(0, 0)
  }
}

/**
 * A `FrameReader` for chunks that are only lent to `push` (a socket reading into one buffer it reuses): each frame is
 * gathered into a buffer of its own size as its bytes come, one copy and one allocation a frame, and nothing of a
 * chunk is kept once `push` returns. Frames over the limit are told and passed over as `FrameReader`'s are.
 */
export class GatheringFrameReader {
  /** The prelude of the next frame, as far as it came. */
  private readonly prelude = new Uint8Array(PRELUDE)
  private preludeFilled = 0
  /** The frame being gathered (its prelude included), and how much of it came. */
  private frame: Uint8Array | undefined
  private filled = 0
  /** Bytes of a skipped frame still to come, to drop. */
  private skipping = 0

  constructor(
    private readonly maxFrameBytes: number,
    private readonly skippable?: (kind: number, id: number) => boolean
  ) {}

  push(chunk: Uint8Array): Array<Frame | Skipped> | string {
    const frames: Array<Frame | Skipped> = []
    let at = 0
    while (at < chunk.length) {
      if (this.skipping > 0) {
        const drop = Math.min(this.skipping, chunk.length - at)
        this.skipping -= drop
        at += drop
        continue
      }
      const frame = this.frame
      if (frame !== undefined) {
        const n = Math.min(frame.length - this.filled, chunk.length - at)
        frame.set(chunk.subarray(at, at + n), this.filled)
        this.filled += n
        at += n
        if (this.filled === frame.length) {
          this.frame = undefined
          const parsed = parse(frame)
          if (typeof parsed === "string") return parsed
          frames.push(parsed)
        }
        continue
      }
      const n = Math.min(PRELUDE - this.preludeFilled, chunk.length - at)
      this.prelude.set(chunk.subarray(at, at + n), this.preludeFilled)
      this.preludeFilled += n
      at += n
      const view = new DataView(this.prelude.buffer)
      if (this.preludeFilled >= 4 && view.getUint32(0) < PRELUDE - 4) {
        return `a frame of ${view.getUint32(0)} bytes is shorter than its prelude`
      }
      if (this.preludeFilled < PRELUDE) continue
      this.preludeFilled = 0
      const length = view.getUint32(0)
      if (length > this.maxFrameBytes) {
        const skipped = passOver(this.maxFrameBytes, this.skippable, length, () => this.prelude)
        if (typeof skipped === "string") return skipped
        this.skipping = 4 + length - PRELUDE
        frames.push(skipped)
        continue
      }
      const whole = Buffer.allocUnsafe(4 + length)
      whole.set(this.prelude)
      if (whole.length === PRELUDE) {
        const parsed = parse(whole)
        if (typeof parsed === "string") return parsed
        frames.push(parsed)
      } else {
        this.frame = whole
        this.filled = PRELUDE
      }
    }
    return frames
  }
}

/**
 * A frame of `length` bytes (past its length field), over the limit: passed over when `skippable` says so of its kind
 * and id (read from its `prelude`, which must then be there), else why the stream ends.
 */
const passOver = (
  maxFrameBytes: number,
  skippable: ((kind: number, id: number) => boolean) | undefined,
  length: number,
  prelude: () => Uint8Array
): Skipped | string => {
  const over = `a frame of ${length} bytes is over the limit of ${maxFrameBytes}`
  if (skippable === undefined) return over
  const bytes = prelude()
  const view = new DataView(bytes.buffer, bytes.byteOffset, PRELUDE)
  const version = view.getUint8(4)
  if (version !== VERSION) return unknownVersion(version)
  const kind = view.getUint8(5)
  const id = view.getUint32(6)
  return skippable(kind, id) ? { kind, id, skipped: length } : over
}

/** Why a frame of `version` ends the stream. */
const unknownVersion = (version: number) =>
  `a frame of data link version ${version}, where this side speaks version ${VERSION}`

/** A whole frame's bytes (its length included) as a `Frame`, or why they are not one. */
const parse = (bytes: Uint8Array): Frame | string => {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length)
  const version = view.getUint8(4)
  if (version !== VERSION) return unknownVersion(version)
  const kind = view.getUint8(5)
  const id = view.getUint32(6)
  const headerBytes = view.getUint32(10)
  if (PRELUDE + headerBytes > bytes.length) return `frame ${id}: a header of ${headerBytes} bytes overruns the frame`
  let header: string
  try {
    header = decoder.decode(bytes.subarray(PRELUDE, PRELUDE + headerBytes))
  } catch {
    return `frame ${id}: the header is not UTF-8`
  }
  return { kind, id, header, payload: bytes.subarray(PRELUDE + headerBytes) }
}
