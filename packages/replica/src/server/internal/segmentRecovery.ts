/**
 * Opening a segment log (its checkpoints, then a walk of its tail that cuts a torn one off) and closing it. See
 * `SegmentLog.ts`.
 *
 * @internal
 */
import { Models } from "@strata/core"
import { join } from "node:path"
import { Clock, Effect, Semaphore } from "effect"
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
  deleteSegment,
  disk,
  dropSnapshots,
  handleOf,
  holding,
  keepFrom,
  type Opened,
  type Settings,
  setProducers,
  walk,
  writeHighWatermark,
  writeLogState,
  writeSnapshot
} from "./segmentLogState.js"
import * as Segments from "./segments.js"

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
      unflushed: 0,
      closed: false,
      broken: undefined
    }
    return yield* recoverLog(o, now).pipe(
      Effect.onError(() => Effect.forEach(o.segments, (s) => closeSegment(s).pipe(Effect.ignore), { discard: true })),
      Effect.as(o)
    )
  })

/** Reads the checkpoints, then the segments from the latest usable snapshot (see the module comment). */
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
    const hwBytes = yield* disk(o, Files.readIfExists(path(Format.HIGH_WATERMARK_FILE)))
    // Not flushed on every checkpoint: one a power loss damaged reads as absent.
    const hwRead = hwBytes === undefined ? undefined : Format.decodeHighWatermark(hwBytes)
    const checkpointedHw = typeof hwRead === "number" ? hwRead : undefined

    o.start = logState?.start ?? bases[0] ?? 0
    // Segments wholly below the start (a retention or reset that stopped before deleting them).
    while (bases.length > 1 && bases[1]! <= o.start) {
      const base = bases.shift()!
      yield* disk(o, Files.remove(path(Format.segmentFile(base))))
      yield* disk(o, Files.remove(path(Format.indexFile(base))))
    }
    if (bases[0] !== undefined && bases[0] > o.start) o.start = bases[0]
    for (const base of bases) {
      o.segments.push(
        Segments.segmentAt(directory, base, yield* disk(o, Files.sizeOf(path(Format.segmentFile(base)))), now)
      )
    }
    if (o.segments.length === 0) o.segments.push(yield* createSegment(o, o.start, now))
    yield* dropSnapshots(o, (s) => s < o.segments[0]!.base)

    // Walk from the latest snapshot's segment (from the first when the epochs' checkpoint is missing); a snapshot
    // past the log end found (a power loss took batches it covers) is dropped for the one before it.
    let recovered: Recovered
    /** The log start when the snapshot used was written. */
    let snapshotStart: number | undefined
    for (;;) {
      const snapshot = o.snapshots.at(-1)
      const producers = new Map<number, ProducerState.Entry>()
      snapshotStart = undefined
      if (snapshot !== undefined) {
        const bytes = yield* disk(o, Files.readIfExists(path(Format.snapshotFile(snapshot))))
        const decoded = bytes === undefined ? "it is missing" : Format.decodeSnapshot(bytes)
        if (typeof decoded === "string" || decoded.asOf !== snapshot) {
          yield* Effect.logWarning(`tablet ${o.name}: producer snapshot ${snapshot} cannot be read; using an older one`)
          yield* dropSnapshots(o, (s) => s === snapshot)
          continue
        }
        for (const [id, entry] of decoded.producers) producers.set(id, entry)
        snapshotStart = decoded.start
      }
      const asOf = snapshot ?? o.segments[0]!.base
      const from = logState === undefined ? 0 : holding(o, asOf)
      recovered = yield* recover(o, from, asOf, logState?.epochs ?? LeaderEpochCache.empty, producers)
      if (snapshot !== undefined && recovered.end < snapshot) {
        yield* dropSnapshots(o, (s) => s === snapshot)
        continue
      }
      break
    }
    o.end = recovered.end
    if (o.start > o.end || (o.start === o.end && (o.segments.length > 1 || active(o).base !== o.start))) {
      // Every batch is below the start (a retention to the end, or a reset, that stopped half-way).
      for (const segment of o.segments) yield* deleteSegment(o, segment)
      o.segments = [yield* createSegment(o, o.start, now)]
      o.end = o.start
      recovered.producers.clear()
    }
    yield* dropSnapshots(o, (s) => s > o.end || s < o.segments[0]!.base)
    let epochs = recovered.epochs
    if (o.start < o.end) epochs = LeaderEpochCache.truncateFromEnd(epochs, o.end)
    o.epochs = LeaderEpochCache.truncateFromStart(epochs, o.start)
    // The start moved after the snapshot (a retention that stopped half-way): the producers that went with it go.
    setProducers(
      o,
      snapshotStart !== undefined && snapshotStart >= o.start
        ? recovered.producers
        : keepFrom(recovered.producers, o.start)
    )
    o.hw = Math.min(Math.max(checkpointedHw ?? o.start, o.start), o.end)
    if (
      logState === undefined ||
      logState.start !== o.start ||
      JSON.stringify(logState.epochs) !== JSON.stringify(o.epochs)
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
 * Walks the segments from the one at `from` to the last: checks every frame, cuts the log at the first that is not
 * whole (a torn tail) and deletes the segments after it (and after a segment that does not continue the one before
 * it); rebuilds their indexes, the active segment's positions, the epochs of the batches at or past the start, and
 * the producer entries of the batches at or past `asOf`.
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
      if (segment.base !== expect) {
        yield* Effect.logWarning(
          `tablet ${o.name}: segment ${segment.base} does not continue the log at ${expect}; deleting it and the later ones`
        )
        for (const later of o.segments.splice(i)) yield* deleteSegment(o, later)
        break
      }
      segment.index = new Format.Positions()
      segment.batches = new Format.Positions()
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
        yield* Effect.logWarning(
          `tablet ${o.name}: ${Format.segmentFile(segment.base)} ends in ${segment.size - walked.position} bytes that ` +
            `are not whole batches (${walked.bad ?? misplaced}); cutting them off`
        )
        yield* disk(o, Files.truncate(yield* handleOf(o, segment), segment.path, walked.position))
        segment.size = walked.position
        for (const later of o.segments.splice(i + 1)) yield* deleteSegment(o, later)
      }
    }
    for (const segment of o.segments.slice(from, -1)) {
      segment.batches = undefined
      yield* disk(o, Files.replace(o.directory, Format.indexFile(segment.base), segment.index!.encode(), true))
    }
    const last = active(o)
    o.open = o.open.filter((s) => s !== last)
    yield* handleOf(o, last)
    return { epochs, producers, end: expect }
  })

/** Flushes the log to the device and closes its files (a snapshot of the producers as of the log end first). */
export const close = (o: Opened): Effect.Effect<void> =>
  Semaphore.withPermit(
    o.lock,
    Effect.gen(function* () {
      if (o.closed) return
      if (o.broken === undefined) {
        yield* writeSnapshot(o, o.end, o.producers)
        yield* writeHighWatermark(o, o.hw, true)
      }
    }).pipe(
      Effect.catchCause((cause) => Effect.logWarning(`tablet ${o.name}: closing the log failed`, cause)),
      Effect.andThen(Effect.forEach(o.segments, (s) => closeSegment(s).pipe(Effect.ignore), { discard: true })),
      Effect.andThen(Effect.sync(() => (o.closed = true))),
      Effect.uninterruptible
    )
  )
