/**
 * The fetch state of one in-memory log consumer, shared by plain and group
 * consumers: its assigned partitions with their positions, fair rotation over
 * them, pause/resume, and fetches that wait on wake-up callbacks (no polling).
 */
import type * as Log from "../Log.js"
import * as Models from "../Models.js"
import { Effect } from "effect"
import type { PartitionLog, Waker } from "./memoryLogPartition.js"
import { closedError, indexAtOrAfter, invalid, outOfRange, wakeAll } from "./memoryLogPartition.js"

const DEFAULT_MAX_BATCH_RECORDS = 1000

/** One partition assigned to a consumer. */
export interface Assigned {
  readonly tp: Models.TopicPartition
  readonly key: string
  readonly log: PartitionLog
  /** The next offset to read. */
  position: number
  paused: boolean
}

/** The fetch state shared by plain and group consumers. */
export interface Fetcher {
  readonly what: string
  readonly maxBatchRecords: number
  closed: boolean
  readonly assigned: Map<string, Assigned>
  /** Assigned partitions in assignment order, for fair rotation. */
  order: Array<Assigned>
  cursor: number
  /** Fetches of this consumer waiting for anything to change. */
  readonly wakers: Set<Waker>
}

/** An open fetcher with nothing assigned; `what` names its consumer in `LogClosed` errors. */
export const makeFetcher = (what: string, maxBatchRecords: number): Fetcher => ({
  what,
  maxBatchRecords,
  closed: false,
  assigned: new Map(),
  order: [],
  cursor: 0,
  wakers: new Set()
})

/** The consumer's `maxBatchRecords`, or why it is invalid. */
export const checkMaxBatch = (options: Log.ConsumerOptions | undefined): number | Log.LogError => {
  const max = options?.maxBatchRecords ?? DEFAULT_MAX_BATCH_RECORDS
  if (!Number.isSafeInteger(max) || max < 1) return invalid(`maxBatchRecords must be an integer ≥ 1, got ${max}`)
  return max
}

/** Partitions in `tpCompare` order. */
export const sortTps = (tps: Iterable<Models.TopicPartition>): Array<Models.TopicPartition> =>
  Array.from(tps).sort(Models.tpCompare)

/** Runs `body` unless the fetcher is closed (then fails with `LogClosed`). */
export const ifOpen = <A>(f: Fetcher, body: () => Effect.Effect<A, Log.LogError>): Effect.Effect<A, Log.LogError> =>
  Effect.suspend(() => (f.closed ? Effect.fail(closedError(f.what)) : body()))

/** Adds a partition at the end of the rotation. */
export const addAssigned = (f: Fetcher, entry: Assigned): void => {
  f.assigned.set(entry.key, entry)
  f.order.push(entry)
}

/** Removes the partitions with these `tpKey`s. */
export const removeAssigned = (f: Fetcher, keys: ReadonlySet<string>): void => {
  if (keys.size === 0) return
  for (const k of keys) f.assigned.delete(k)
  f.order = f.order.filter((e) => !keys.has(e.key))
  if (f.cursor >= f.order.length) f.cursor = 0
}

/** The assigned partitions, sorted. */
export const assignmentOf = (f: Fetcher): Array<Models.TopicPartition> => sortTps(f.order.map((e) => e.tp))

/** The paused partitions, sorted. */
export const pausedOf = (f: Fetcher): Array<Models.TopicPartition> =>
  sortTps(f.order.filter((e) => e.paused).map((e) => e.tp))

/** Pauses or resumes assigned partitions (others are ignored). */
export const setPaused = (f: Fetcher, tps: ReadonlyArray<Models.TopicPartition>, paused: boolean): void => {
  if (f.closed) return
  let changed = false
  for (const tp of tps) {
    const e = f.assigned.get(Models.tpKey(tp))
    if (e !== undefined && e.paused !== paused) {
      e.paused = paused
      changed = true
    }
  }
  // Pausing also wakes waiting fetches so they re-register without the paused partitions.
  if (changed) wakeAll(f.wakers)
}

/** Closes the fetcher: forgets its partitions and wakes its waiting fetches (which then fail). */
export const closeFetcher = (f: Fetcher): void => {
  if (f.closed) return
  f.closed = true
  f.assigned.clear()
  f.order = []
  wakeAll(f.wakers)
}

/**
 * Takes one batch if any assigned, non-paused partition has records; fails when
 * a position fell below its log start; `undefined` when there is nothing to read.
 */
const tryFetch = (f: Fetcher): Log.Batch | Log.LogError | undefined => {
  if (f.closed) return closedError(f.what)
  const n = f.order.length
  for (let i = 0; i < n; i++) {
    const idx = (f.cursor + i) % n
    const e = f.order[idx]!
    if (e.paused) continue
    const log = e.log
    if (e.position < log.logStart || e.position > log.highwater) return outOfRange(log, e.position)
    if (e.position === log.highwater) continue
    const start = indexAtOrAfter(log.records, e.position)
    if (start === log.records.length) {
      // Only removed offsets are left below the highwater: skip them, as a Kafka consumer does.
      e.position = log.highwater
      continue
    }
    const records = log.records.slice(start, start + f.maxBatchRecords)
    const next = start + records.length
    e.position = next < log.records.length ? records[records.length - 1]!.offset + 1 : log.highwater
    f.cursor = (idx + 1) % n
    return { topic: log.topic, partition: log.partition, records, highwater: log.highwater }
  }
  return undefined
}

/** Waits until a partition this fetcher could read grows or the fetcher itself changes. */
const awaitChange = (f: Fetcher): Effect.Effect<void> =>
  Effect.callback<void>((resume) => {
    const logs: Array<PartitionLog> = []
    let done = false
    const unregister = () => {
      done = true
      f.wakers.delete(wake)
      for (const log of logs) log.wakers.delete(wake)
    }
    const wake: Waker = () => {
      if (done) return
      unregister()
      resume(Effect.void)
    }
    f.wakers.add(wake)
    for (const e of f.order) {
      if (!e.paused) {
        e.log.wakers.add(wake)
        logs.push(e.log)
      }
    }
    return Effect.sync(unregister)
  })

/** One fetch: a batch as soon as one is available; waits (without polling) until then. */
export const fetchBatch = (f: Fetcher): Effect.Effect<Log.Batch, Log.LogError> => {
  const loop: Effect.Effect<Log.Batch, Log.LogError> = Effect.suspend(() => {
    const r = tryFetch(f)
    if (r === undefined) return Effect.flatMap(awaitChange(f), () => loop)
    return "_tag" in r ? Effect.fail(r) : Effect.succeed(r)
  })
  return loop
}
