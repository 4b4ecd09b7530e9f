/**
 * One partition of the in-memory log (its records, log start, highwater and the
 * fetches waiting on it), the offset search over its records, and the
 * `LogError` helpers every module of the memory log shares.
 */
import * as Errors from "../Errors.js"
import * as Log from "../Log.js"

/** A one-shot wake-up callback of a waiting fetch. */
export type Waker = () => void

/** One partition: its records in offset order and its offsets. */
export interface PartitionLog {
  readonly topic: string
  readonly partition: number
  /** The records held, in offset order: `[logStart, highwater)` with gaps where compaction removed records. */
  records: Array<Log.Record>
  logStart: number
  highwater: number
  /** Fetches waiting for this partition to grow. */
  readonly wakers: Set<Waker>
}

/** A topic and its partitions. */
export interface TopicState {
  readonly name: string
  /** `cleanup.policy=compact`: only such topics can be compacted. */
  readonly compacted: boolean
  readonly partitions: ReadonlyArray<PartitionLog>
}

/** An empty partition of `topic`. */
export const makePartitionLog = (topic: string, partition: number): PartitionLog => ({
  topic,
  partition,
  records: [],
  logStart: 0,
  highwater: 0,
  wakers: new Set()
})

/** An `InvalidRequest` log error. */
export const invalid = (detail: string): Log.LogError => Log.logError(new Log.InvalidRequest({ detail }))

/** A `LogClosed` log error for the closed `what`. */
export const closedError = (what: string): Log.LogError => Log.logError(new Log.Closed({ what }))

/** An `OffsetOutOfRange` log error for `offset` of a partition, with its current bounds. */
export const outOfRange = (log: PartitionLog, offset: number): Log.LogError =>
  Log.logError(
    new Errors.OffsetOutOfRange({
      topic: log.topic,
      partition: log.partition,
      offset,
      logStart: log.logStart,
      highwater: log.highwater
    })
  )

/** Why `offset` is not a valid offset, if it is not. */
export const checkOffset = (offset: number): Log.LogError | undefined =>
  Number.isSafeInteger(offset) ? undefined : invalid(`offset must be an integer, got ${offset}`)

/** Calls every waker registered now (each unregisters itself when called). */
export const wakeAll = (wakers: Set<Waker>): void => {
  if (wakers.size === 0) return
  for (const wake of Array.from(wakers)) wake()
}

/** The index of the first record at or after `offset` (`records.length` when there is none). */
export const indexAtOrAfter = (records: ReadonlyArray<Log.Record>, offset: number): number => {
  let lo = 0
  let hi = records.length
  while (lo < hi) {
    const mid = (lo + hi) >>> 1
    if (records[mid]!.offset < offset) lo = mid + 1
    else hi = mid
  }
  return lo
}
