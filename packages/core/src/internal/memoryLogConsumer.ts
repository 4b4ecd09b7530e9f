/**
 * The in-memory log's changelog consumer (no group, manual assignment), and its
 * `seek` and `position`, which group consumers share.
 */
import * as Log from "../Log.js"
import * as Models from "../Models.js"
import type { Scope } from "effect"
import { Effect, Stream } from "effect"
import type { Broker } from "./memoryLogBroker.js"
import { lookup } from "./memoryLogBroker.js"
import type { Assigned, Fetcher } from "./memoryLogFetcher.js"
import {
  addAssigned,
  assignmentOf,
  checkMaxBatch,
  closeFetcher,
  fetchBatch,
  ifOpen,
  makeFetcher,
  pausedOf,
  removeAssigned,
  setPaused
} from "./memoryLogFetcher.js"
import type { PartitionLog } from "./memoryLogPartition.js"
import { checkOffset, outOfRange, wakeAll } from "./memoryLogPartition.js"

/** The partitions named, or the first one that does not exist. */
const resolve = (s: Broker, tps: ReadonlyArray<Models.TopicPartition>): Array<PartitionLog> | Log.LogError => {
  const out: Array<PartitionLog> = []
  for (const tp of tps) {
    const log = lookup(s, tp.topic, tp.partition)
    if ("_tag" in log) return log
    out.push(log)
  }
  return out
}

/** The fetcher's entry of an assigned partition; `NotAssigned` for an existing partition it does not hold. */
const entryOf = (s: Broker, f: Fetcher, tp: Models.TopicPartition): Assigned | Log.LogError => {
  const e = f.assigned.get(Models.tpKey(tp))
  if (e !== undefined) return e
  const log = lookup(s, tp.topic, tp.partition)
  if ("_tag" in log) return log
  return Log.logError(new Log.NotAssigned({ topic: log.topic, partition: log.partition }))
}

/** `LogConsumer.assign`: adds the partitions not yet assigned, each at its log start. */
const assign = (s: Broker, f: Fetcher, tps: ReadonlyArray<Models.TopicPartition>): Effect.Effect<void, Log.LogError> =>
  ifOpen(f, () => {
    const logs = resolve(s, tps)
    if ("_tag" in logs) return Effect.fail(logs)
    for (const log of logs) {
      const tp = { topic: log.topic, partition: log.partition }
      const key = Models.tpKey(tp)
      if (!f.assigned.has(key)) addAssigned(f, { tp, key, log, position: log.logStart, paused: false })
    }
    wakeAll(f.wakers)
    return Effect.void
  })

/** `LogConsumer.unassign`: removes the partitions (all must exist). */
const unassign = (
  s: Broker,
  f: Fetcher,
  tps: ReadonlyArray<Models.TopicPartition>
): Effect.Effect<void, Log.LogError> =>
  ifOpen(f, () => {
    const logs = resolve(s, tps)
    if ("_tag" in logs) return Effect.fail(logs)
    removeAssigned(f, new Set(tps.map(Models.tpKey)))
    wakeAll(f.wakers)
    return Effect.void
  })

/** `seek` of plain and group consumers: checked eagerly against the partition's current bounds. */
export const seek = (
  s: Broker,
  f: Fetcher,
  tp: Models.TopicPartition,
  offset: number
): Effect.Effect<void, Log.LogError> =>
  ifOpen(f, () => {
    const e = entryOf(s, f, tp)
    if ("_tag" in e) return Effect.fail(e)
    const bad = checkOffset(offset)
    if (bad !== undefined) return Effect.fail(bad)
    if (offset < e.log.logStart || offset > e.log.highwater) return Effect.fail(outOfRange(e.log, offset))
    e.position = offset
    wakeAll(f.wakers)
    return Effect.void
  })

/** `position` of plain and group consumers. */
export const position = (s: Broker, f: Fetcher, tp: Models.TopicPartition): Effect.Effect<number, Log.LogError> =>
  ifOpen(f, () => {
    const e = entryOf(s, f, tp)
    return "_tag" in e ? Effect.fail(e) : Effect.succeed(e.position)
  })

/** The `LogConsumer` over a fetcher. */
const makeConsumer = (s: Broker, f: Fetcher): Log.Consumer => ({
  assign: (tps) => assign(s, f, tps),
  unassign: (tps) => unassign(s, f, tps),
  assignment: Effect.sync(() => assignmentOf(f)),
  seek: (tp, offset) => seek(s, f, tp, offset),
  position: (tp) => position(s, f, tp),
  pause: (tps) => Effect.sync(() => setPaused(f, tps, true)),
  resume: (tps) => Effect.sync(() => setPaused(f, tps, false)),
  paused: Effect.sync(() => pausedOf(f)),
  batches: Stream.fromEffectRepeat(fetchBatch(f))
})

/** `Log.consumer`: a changelog consumer, closed with its scope. */
export const consumer = (
  s: Broker,
  options?: Log.ConsumerOptions
): Effect.Effect<Log.Consumer, Log.LogError, Scope.Scope> =>
  Effect.suspend(() => {
    const max = checkMaxBatch(options)
    if (typeof max === "object") return Effect.fail(max)
    return Effect.acquireRelease(
      Effect.sync(() => makeFetcher("consumer", max)),
      (f) => Effect.sync(() => closeFetcher(f))
    ).pipe(Effect.map((f) => makeConsumer(s, f)))
  })
