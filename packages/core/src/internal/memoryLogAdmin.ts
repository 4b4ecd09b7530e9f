/**
 * The in-memory log's administrative operations: topic creation, partition
 * offsets, record deletion, and the `LogFaults` hooks (compaction, the records
 * held, injected append failures).
 */
import * as Log from "../Log.js"
import * as Models from "../Models.js"
import { Effect, Schema } from "effect"
import type { Broker } from "./memoryLogBroker.js"
import { lookup } from "./memoryLogBroker.js"
import type { PartitionLog } from "./memoryLogPartition.js"
import { checkOffset, indexAtOrAfter, invalid, makePartitionLog, outOfRange, wakeAll } from "./memoryLogPartition.js"

const isTopicName = Schema.is(Models.Topic)

/** A key's identity in maps (its bytes as latin1 text). */
const keyIdOf = (key: Uint8Array): string => Buffer.from(key.buffer, key.byteOffset, key.byteLength).toString("latin1")

/** Why a topic spec is invalid, if it is. */
const checkTopicSpec = (spec: Log.TopicSpec): Log.LogError | undefined => {
  if (!isTopicName(spec.topic) || spec.topic === "." || spec.topic === "..") {
    return invalid(`invalid topic name ${JSON.stringify(spec.topic)}`)
  }
  if (!Number.isSafeInteger(spec.partitions) || spec.partitions < 1) {
    return invalid(`partitions must be an integer ≥ 1, got ${spec.partitions}`)
  }
  const rf = spec.replicationFactor
  if (rf !== undefined && (!Number.isSafeInteger(rf) || rf < 1)) {
    return invalid(`replicationFactor must be an integer ≥ 1, got ${rf}`)
  }
  return undefined
}

/** `Log.ensureTopic`: creates the topic, or checks an existing one has as many partitions. */
export const ensureTopic = (s: Broker, spec: Log.TopicSpec): Effect.Effect<void, Log.LogError> =>
  Effect.suspend(() => {
    const bad = checkTopicSpec(spec)
    if (bad !== undefined) return Effect.fail(bad)
    const existing = s.topics.get(spec.topic)
    if (existing !== undefined) {
      return existing.partitions.length === spec.partitions
        ? Effect.void
        : Effect.fail(
            Log.logError(
              new Log.TopicMismatch({
                topic: spec.topic,
                expectedPartitions: spec.partitions,
                actualPartitions: existing.partitions.length
              })
            )
          )
    }
    const partitions: Array<PartitionLog> = []
    for (let p = 0; p < spec.partitions; p++) partitions.push(makePartitionLog(spec.topic, p))
    s.topics.set(spec.topic, { name: spec.topic, compacted: spec.compacted === true, partitions })
    return Effect.void
  })

/** `Log.offsets`: log start and highwater of each partition (the highwater is also the last stable offset). */
export const offsets = (
  s: Broker,
  tps: ReadonlyArray<Models.TopicPartition>
): Effect.Effect<ReadonlyArray<Log.PartitionOffsets>, Log.LogError> =>
  Effect.suspend(() => {
    const out: Array<Log.PartitionOffsets> = []
    for (const tp of tps) {
      const log = lookup(s, tp.topic, tp.partition)
      if ("_tag" in log) return Effect.fail(log)
      out.push({ topic: log.topic, partition: log.partition, logStart: log.logStart, highwater: log.highwater })
    }
    return Effect.succeed(out)
  })

/** `Log.deleteRecords`: moves the log start up to `offset`, dropping the records below it. */
export const deleteRecords = (
  s: Broker,
  tp: Models.TopicPartition,
  offset: number
): Effect.Effect<void, Log.LogError> =>
  Effect.suspend(() => {
    const log = lookup(s, tp.topic, tp.partition)
    if ("_tag" in log) return Effect.fail(log)
    const bad = checkOffset(offset)
    if (bad !== undefined) return Effect.fail(bad)
    if (offset < 0 || offset > log.highwater) return Effect.fail(outOfRange(log, offset))
    if (offset > log.logStart) {
      log.records.splice(0, indexAtOrAfter(log.records, offset))
      log.logStart = offset
      wakeAll(log.wakers)
    }
    return Effect.void
  })

/** `LogFaults.compact`: Kafka's log cleaner over the records below `until`; returns the removed offsets. */
export const compact = (
  s: Broker,
  tp: Models.TopicPartition,
  options?: Log.CompactOptions
): Effect.Effect<ReadonlyArray<number>, Log.LogError> =>
  Effect.suspend(() => {
    const log = lookup(s, tp.topic, tp.partition)
    if ("_tag" in log) return Effect.fail(log)
    if (!s.topics.get(log.topic)!.compacted) {
      return Effect.fail(invalid(`topic ${log.topic} is not compacted (it was created without compacted: true)`))
    }
    const until = options?.until ?? log.highwater
    const bad = checkOffset(until)
    if (bad !== undefined) return Effect.fail(bad)
    const end = indexAtOrAfter(log.records, until)
    // The latest offset of each key among the records cleaned (Kafka's offset map of the cleanable section).
    const latest = new Map<string, number>()
    for (let i = 0; i < end; i++) {
      const r = log.records[i]!
      if (r.key !== null) latest.set(keyIdOf(r.key), r.offset)
    }
    const last = log.highwater - 1
    const removeTombstones = options?.removeTombstones === true
    const removed: Array<number> = []
    const kept: Array<Log.Record> = []
    for (let i = 0; i < log.records.length; i++) {
      const r = log.records[i]!
      const drop =
        i < end &&
        r.key !== null &&
        (latest.get(keyIdOf(r.key))! > r.offset || (removeTombstones && r.value === null && r.offset !== last))
      if (drop) removed.push(r.offset)
      else kept.push(r)
    }
    log.records = kept
    return Effect.succeed(removed)
  })

/** `LogFaults.records`: a copy of the records a partition holds. */
export const recordsOf = (
  s: Broker,
  tp: Models.TopicPartition
): Effect.Effect<ReadonlyArray<Log.Record>, Log.LogError> =>
  Effect.suspend(() => {
    const log = lookup(s, tp.topic, tp.partition)
    return "_tag" in log ? Effect.fail(log) : Effect.succeed(log.records.slice())
  })

/** `LogFaults.failAppends`: the next `count` appends to `topic` fail (0 or less clears the fault). */
export const failAppends = (s: Broker, topic: string, count: number): Effect.Effect<void> =>
  Effect.sync(() => {
    if (count > 0) s.failing.set(topic, count)
    else s.failing.delete(topic)
  })
