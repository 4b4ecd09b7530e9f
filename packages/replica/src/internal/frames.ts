/**
 * The data link's framing: a frame is a u32 length (of what follows it), a kind byte, a u32 request id, a u32
 * header length, a JSON header, and a payload of raw bytes (a batch as the tablet log stores it). A reader cuts a
 * byte stream into frames, copying only a frame that arrived in more than one chunk.
 */

/** Bytes before a frame's header: length, kind, id, header length. */
export const PRELUDE = 13

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
  view.setUint8(4, kind)
  view.setUint32(5, id)
  view.setUint32(9, text.length)
  out.set(text, PRELUDE)
  return out
}

/**
 * Cuts a stream of chunks into frames of at most `maxFrameBytes` bytes each. `push` returns the frames a chunk
 * completed, or a string saying why the stream is not frames (the connection is then beyond repair).
 */
export class FrameReader {
  private chunks: Array<Uint8Array> = []
  private buffered = 0

  constructor(private readonly maxFrameBytes: number) {}

  push(chunk: Uint8Array): Array<Frame> | string {
    this.chunks.push(chunk)
    this.buffered += chunk.length
    const frames: Array<Frame> = []
    for (;;) {
      if (this.buffered < 4) return frames
      const length = this.peekLength()
      if (length < PRELUDE - 4) return `a frame of ${length} bytes is shorter than its prelude`
      if (length > this.maxFrameBytes) return `a frame of ${length} bytes is over the limit of ${this.maxFrameBytes}`
      if (this.buffered < 4 + length) return frames
      const bytes = this.take(4 + length)
      const frame = parse(bytes)
      if (typeof frame === "string") return frame
      frames.push(frame)
    }
  }

  /** The u32 at the front of the buffered bytes. */
  private peekLength(): number {
    const first = this.chunks[0]!
    if (first.length >= 4) return new DataView(first.buffer, first.byteOffset, 4).getUint32(0)
    let n = 0
    let i = 0
    for (const chunk of this.chunks) {
      for (let j = 0; j < chunk.length && i < 4; j++, i++) n = n * 256 + chunk[j]!
      if (i === 4) break
    }
    return n
  }

  /** The next `n` buffered bytes: a view when one chunk holds them, else one copy. */
  private take(n: number): Uint8Array {
    this.buffered -= n
    const first = this.chunks[0]!
    if (first.length >= n) {
      if (first.length === n) this.chunks.shift()
      else this.chunks[0] = first.subarray(n)
      return first.subarray(0, n)
    }
    const out = new Uint8Array(n)
    let at = 0
    while (at < n) {
      const chunk = this.chunks[0]!
      const part = Math.min(chunk.length, n - at)
      out.set(part === chunk.length ? chunk : chunk.subarray(0, part), at)
      at += part
      if (part === chunk.length) this.chunks.shift()
      else this.chunks[0] = chunk.subarray(part)
    }
    return out
  }
}

/** A whole frame's bytes (its length included) as a `Frame`, or why they are not one. */
const parse = (bytes: Uint8Array): Frame | string => {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length)
  const kind = view.getUint8(4)
  const id = view.getUint32(5)
  const headerBytes = view.getUint32(9)
  if (PRELUDE + headerBytes > bytes.length) return `frame ${id}: a header of ${headerBytes} bytes overruns the frame`
  let header: string
  try {
    header = decoder.decode(bytes.subarray(PRELUDE, PRELUDE + headerBytes))
  } catch {
    return `frame ${id}: the header is not UTF-8`
  }
  return { kind, id, header, payload: bytes.subarray(PRELUDE + headerBytes) }
}
