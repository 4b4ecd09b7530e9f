/**
 * One segment of a segment log in memory (its file, its size, its indexes) and the reading of its frames.
 *
 * @internal
 */
import type { Store } from "@strata/core"
import type { FileHandle } from "node:fs/promises"
import { join } from "node:path"
import { Effect } from "effect"
import * as Files from "./segmentFiles.js"
import { FRAME_HEADER_BYTES, type Frame, indexFile, parseFrame, Positions, segmentFile } from "./segmentFormat.js"

/** A segment: the batches from `base` on, up to the next segment's base (the log end for the active one). */
export interface Segment {
  readonly base: number
  /** Its file's path. */
  readonly path: string
  /** Its index file's path. */
  readonly indexPath: string
  /** Its file's size in bytes (what the log wrote to it). */
  size: number
  /** Its open file, when open (the active segment's always is). */
  handle: FileHandle | undefined
  /** Its sparse index, when loaded (the active segment's always is). */
  index: Positions | undefined
  /** The position of its index's last entry. */
  lastIndexed: number
  /**
   * The active segment's: the positions of its latest batches, consecutive up to its end (at least
   * `RECENT_POSITIONS` of them, when it has that many; `undefined` for the others).
   */
  batches: Positions | undefined
  /** When it became the active segment (ms; when the log opened for one loaded). */
  createdAt: number
  /** A sealed segment's newest record timestamp past its last index entry, once retention read it. */
  newest: number | undefined
}

/**
 * How many of the active segment's latest batch positions it keeps (at most twice that many): reads of the recent
 * tail go straight to their bytes, older ones through the sparse index.
 */
export const RECENT_POSITIONS = 1024

/** A fresh window of the active segment's latest batch positions. */
export const recentPositions = (): Positions => new Positions(RECENT_POSITIONS)

/** A segment of the directory, nothing read yet. */
export const segmentAt = (directory: string, base: number, size: number, createdAt: number): Segment => ({
  base,
  path: join(directory, segmentFile(base)),
  indexPath: join(directory, indexFile(base)),
  size,
  handle: undefined,
  index: undefined,
  lastIndexed: 0,
  batches: undefined,
  createdAt,
  newest: undefined
})

/** Notes a batch written (or found) at `position`: in the active segment's batch positions, and in its index. */
export const noteBatch = (segment: Segment, baseOffset: number, position: number, indexIntervalBytes: number) => {
  const relative = baseOffset - segment.base
  segment.newest = undefined
  segment.batches?.push(relative, position)
  const index = segment.index
  if (index !== undefined && (index.count === 0 || position - segment.lastIndexed >= indexIntervalBytes)) {
    index.push(relative, position)
    segment.lastIndexed = position
  }
}

/** Cuts the segment's indexes at `position` (the segment's new size). */
export const cutIndexes = (segment: Segment, position: number) => {
  segment.newest = undefined
  segment.batches?.cutAt(position)
  segment.index?.cutAt(position)
  const last = segment.index === undefined ? 0 : segment.index.count - 1
  segment.lastIndexed = last >= 0 && segment.index !== undefined ? segment.index.positionAt(last) : 0
}

/** How a walk over a segment's frames ended. */
export interface Walked {
  /** Where it stopped: the segment's end, the frame `visit` declined, or the first bytes that are not a frame. */
  readonly position: number
  /** Why the bytes at `position` are not a frame (a torn write, or damage), when they are not. */
  readonly bad?: string
}

/** The chunk a walk reads at a time. */
export const WALK_CHUNK_BYTES = 1024 * 1024

/**
 * Reads the segment's frames from `position` (a frame's start) up to `limit` (a frame's start, or the segment's
 * size) in chunks of `chunkBytes` (a frame larger than that in one read of its own), checking each (length, CRC,
 * batch header), handing each to `visit` in order until it returns false. Stops at `limit`, or at bytes that are not
 * a frame (`bad`).
 */
export const walk = (
  segment: Segment,
  handle: FileHandle,
  position: number,
  limit: number,
  chunkBytes: number,
  visit: (frame: Frame, position: number) => boolean
): Effect.Effect<Walked, Store.StoreError> =>
  Effect.gen(function* () {
    let at = position
    let want = chunkBytes
    while (at < limit) {
      const asked = Math.min(limit - at, want)
      const buffer = yield* Files.readAt(handle, segment.path, at, asked)
      want = chunkBytes
      let used = 0
      for (;;) {
        if (at + used >= limit) break
        const parsed = parseFrame(buffer, used)
        if (parsed._tag === "Bad") return { position: at + used, bad: parsed.detail }
        if (parsed._tag === "Short") {
          const need = Math.max(parsed.need, FRAME_HEADER_BYTES)
          if (at + used + need > limit || buffer.length < asked) {
            return { position: at + used, bad: "a frame cut short by the end of the segment" }
          }
          // The next read starts at this frame and holds it whole.
          if (used === 0) want = Math.max(chunkBytes, need)
          break
        }
        if (!visit(parsed.frame, at + used)) return { position: at + used }
        used += parsed.frame.frameBytes
      }
      at += used
    }
    return { position: at }
  })
