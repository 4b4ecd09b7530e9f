/**
 * Producing to the in-memory log: record checks, appends (a batch is appended
 * whole or not at all), `produce`/`produceBatch`, and the pipelined producer
 * whose first failure is sticky.
 */
import * as Log from "../Log.js"
import type { Scope } from "effect"
import { Clock, Effect } from "effect"
import type { Broker } from "./memoryLogBroker.js"
import { lookup } from "./memoryLogBroker.js"
import type { PartitionLog } from "./memoryLogPartition.js"
import { closedError, invalid, wakeAll } from "./memoryLogPartition.js"

/** The `acks` option, or why it is invalid. */
const checkAcks = (options: Log.ProduceOptions | undefined): Log.Acks | Log.LogError => {
  const acks = options?.acks ?? "all"
  if (acks !== 0 && acks !== 1 && acks !== "all") return invalid(`acks must be 0, 1 or "all", got ${String(acks)}`)
  return acks
}

/** A record's size as `maxRecordBytes` counts it: key, value, header keys (UTF-8) and values. */
const recordSize = (record: Log.ProducerRecord): number => {
  let size = (record.key?.byteLength ?? 0) + (record.value?.byteLength ?? 0)
  if (record.headers !== undefined) {
    for (const h of record.headers) size += Buffer.byteLength(h.key, "utf8") + h.value.byteLength
  }
  return size
}

/** The partition a record goes to, or why the log cannot take it. */
const validateRecord = (s: Broker, record: Log.ProducerRecord): PartitionLog | Log.LogError => {
  const log = lookup(s, record.topic, record.partition)
  if ("_tag" in log) return log
  if (record.timestamp !== undefined && !Number.isFinite(record.timestamp)) {
    return invalid(`timestamp must be a finite number, got ${record.timestamp}`)
  }
  const size = recordSize(record)
  if (size > s.maxRecordBytes)
    return Log.logError(new Log.RecordTooLarge({ topic: record.topic, size, max: s.maxRecordBytes }))
  return log
}

/** Appends a copy of the record at the highwater and returns its offset. */
const append = (log: PartitionLog, record: Log.ProducerRecord, now: number): number => {
  const offset = log.highwater
  const headers: ReadonlyArray<Log.Header> =
    record.headers === undefined ? [] : record.headers.map((h) => ({ key: h.key, value: h.value.slice() }))
  log.records.push({
    topic: log.topic,
    partition: log.partition,
    offset,
    key: record.key === null ? null : record.key.slice(),
    value: record.value === null ? null : record.value.slice(),
    headers,
    timestamp: record.timestamp ?? now
  })
  log.highwater = offset + 1
  return offset
}

/** The partition logs of a batch's records, or the first record's problem. */
export const validateAll = (
  s: Broker,
  records: ReadonlyArray<Log.ProducerRecord>
): Array<PartitionLog> | Log.LogError => {
  const logs: Array<PartitionLog> = []
  for (const record of records) {
    const log = validateRecord(s, record)
    if ("_tag" in log) return log
    logs.push(log)
  }
  return logs
}

/** Appends a checked batch whole, unless a pending fault refuses it (then nothing). */
export const appendChecked = (
  s: Broker,
  records: ReadonlyArray<Log.ProducerRecord>,
  logs: ReadonlyArray<PartitionLog>,
  acks: Log.Acks,
  now: number
): ReadonlyArray<number> | Log.LogError => {
  for (const topic of new Set(records.map((r) => r.topic))) {
    const left = s.failing.get(topic) ?? 0
    if (left > 0) {
      if (left === 1) s.failing.delete(topic)
      else s.failing.set(topic, left - 1)
      return Log.logError(
        new Log.IoError({ operation: "produce", detail: `injected append failure on ${topic}`, retryable: true })
      )
    }
  }
  const offsets: Array<number> = []
  const touched = new Set<PartitionLog>()
  for (let i = 0; i < records.length; i++) {
    const log = logs[i]!
    const offset = append(log, records[i]!, now)
    offsets.push(acks === 0 ? -1 : offset)
    touched.add(log)
  }
  for (const log of touched) wakeAll(log.wakers)
  return offsets
}

/** `Log.produceBatch`: every record is checked first, then the batch is appended entirely or not at all. */
export const produceBatch = (
  s: Broker,
  records: ReadonlyArray<Log.ProducerRecord>,
  options?: Log.ProduceOptions
): Effect.Effect<ReadonlyArray<number>, Log.LogError> =>
  Effect.flatMap(Clock.currentTimeMillis, (now) =>
    Effect.suspend(() => {
      const acks = checkAcks(options)
      if (typeof acks === "object") return Effect.fail(acks)
      const logs = validateAll(s, records)
      if ("_tag" in logs) return Effect.fail(logs)
      const appended = appendChecked(s, records, logs, acks, now)
      return "_tag" in appended ? Effect.fail(appended) : Effect.succeed(appended)
    })
  )

/** `Log.produce`: a batch of one record. */
export const produce = (
  s: Broker,
  record: Log.ProducerRecord,
  options?: Log.ProduceOptions
): Effect.Effect<number, Log.LogError> => Effect.map(produceBatch(s, [record], options), (offsets) => offsets[0]!)

/** The state of one pipelined producer. */
interface ProducerState {
  readonly acks: Log.Acks
  /** The first refused append: it stops the producer for good. */
  failure: Log.LogError | undefined
  closed: boolean
}

/** `LogProducer.send`: appends at once (the returned effect just gives the offsets). */
const send = (
  s: Broker,
  p: ProducerState,
  records: ReadonlyArray<Log.ProducerRecord>
): Effect.Effect<Effect.Effect<ReadonlyArray<number>, Log.LogError>, Log.LogError> =>
  Effect.flatMap(Clock.currentTimeMillis, (now) =>
    Effect.suspend((): Effect.Effect<Effect.Effect<ReadonlyArray<number>, Log.LogError>, Log.LogError> => {
      if (p.closed) return Effect.fail(closedError("memory producer"))
      if (p.failure !== undefined) return Effect.fail(p.failure)
      // A record the log cannot take fails this call only; a refused append stops the producer.
      const logs = validateAll(s, records)
      if ("_tag" in logs) return Effect.fail(logs)
      const appended = appendChecked(s, records, logs, p.acks, now)
      if ("_tag" in appended) {
        p.failure = appended
        return Effect.succeed(Effect.fail(appended))
      }
      return Effect.succeed(Effect.succeed(appended))
    })
  )

/** `Log.producer`: a producer whose sends append at once; an injected append failure stops it for good. */
export const producer = (
  s: Broker,
  options?: Log.ProducerOptions
): Effect.Effect<Log.Producer, Log.LogError, Scope.Scope> =>
  Effect.suspend(() => {
    const acks = checkAcks(options)
    if (typeof acks === "object") return Effect.fail(acks)
    const p: ProducerState = { acks, failure: undefined, closed: false }
    const shape: Log.Producer = {
      send: (records) => send(s, p, records),
      flush: Effect.suspend(() => (p.failure === undefined ? Effect.void : Effect.fail(p.failure))),
      failure: Effect.sync(() => p.failure)
    }
    return Effect.as(
      Effect.addFinalizer(() =>
        Effect.sync(() => {
          p.closed = true
        })
      ),
      shape
    )
  })
