/**
 * The in-memory `Log`: a Kafka-like log held in arrays, one per partition.
 *
 * Each partition holds its records in an array sorted by offset, so appends are
 * O(1) and fetches are a binary search and a slice. Offsets are dense until
 * `LogFaults.compact` removes records: then, as in Kafka, the remaining records
 * keep their offsets (gaps), the log start and highwater stay, and a consumer
 * positioned on a removed offset gets the next record that remains.
 * Consumers fetch synchronously (a fetch either takes a whole batch or takes
 * nothing), so `pause`/`unassign`/`seek` take effect for every later fetch,
 * including one already waiting. Waiting fetches are woken by callbacks that
 * `produce`, `assign`, `seek`, `resume`, rebalances and closing register, so
 * nothing polls.
 *
 * Where Kafka leaves a choice, this log: validates `seek` eagerly; ignores
 * `maxWait` (a fetch simply waits); compacts a `compacted` topic only when a
 * test calls `LogFaults.compact` (there is no background cleaner); ignores
 * `pause`/`resume` of partitions not assigned; rejects a group consumer of
 * an unknown topic (`UnknownTopic`); starts a newly assigned group partition
 * at its committed offset clamped to `[logStart, highwater]` (Kafka's
 * `auto.offset.reset=earliest`), while a position that later falls below the
 * log start fails the fetch; ends a group member's `events` stream when its
 * scope closes. Group membership changes take effect at once: the rebalance
 * runs inside `groupConsumer` and inside the scope's finalizer.
 *
 * A transactional producer holds what it sends until `commit`, which appends it
 * all at once with the source offsets: no consumer ever sees an open or aborted
 * transaction, so both isolation levels read committed data only, and the last
 * stable offset is the highwater. A commit is refused (`Fenced`) for a member
 * no longer in its group or no longer owning a partition it commits, and for a
 * producer whose transactional id a newer producer took.
 *
 * @since 0.1.0
 */
import type { Cause, Scope } from "effect"
import { Clock, Context, Deferred, Effect, Layer, Queue, Schema, Stream } from "effect"
import { OffsetOutOfRange } from "../Errors.js"
import type {
  Acks,
  CompactOptions,
  ConsumerOptions,
  GroupConsumer,
  GroupConsumerOptions,
  GroupEvent,
  Header,
  LogBatch,
  LogConsumer,
  LogError,
  LogFaultsShape,
  LogProducer,
  LogRecord,
  LogShape,
  PartitionOffsets,
  ProduceOptions,
  ProducerOptions,
  ProducerRecord,
  TopicSpec,
  TransactionalProducer,
  TransactionalProducerOptions,
  TransactionOffsets
} from "../Log.js"
import {
  Fenced,
  InvalidRequest,
  Log,
  LogClosed,
  LogFaults,
  LogIoError,
  logError,
  NotAssigned,
  RecordTooLarge,
  TopicMismatch,
  UnknownPartition,
  UnknownTopic
} from "../Log.js"
import type { TopicPartition, TopicPartitionOffset } from "../Models.js"
import { Topic, tpCompare, tpKey } from "../Models.js"

/** Options of the in-memory log. */
export interface MemoryLogOptions {
  /** Largest record (key + value + headers) accepted, in bytes (default 1 MiB, like Kafka). */
  readonly maxRecordBytes?: number
}

const DEFAULT_MAX_RECORD_BYTES = 1024 * 1024
const DEFAULT_MAX_BATCH_RECORDS = 1000

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

/** A one-shot wake-up callback of a waiting fetch. */
type Waker = () => void

interface PartitionLog {
  readonly topic: string
  readonly partition: number
  /** The records held, in offset order: `[logStart, highwater)` with gaps where compaction removed records. */
  records: Array<LogRecord>
  logStart: number
  highwater: number
  /** Fetches waiting for this partition to grow. */
  readonly wakers: Set<Waker>
}

interface TopicState {
  readonly name: string
  /** `cleanup.policy=compact`: only such topics can be compacted. */
  readonly compacted: boolean
  readonly partitions: ReadonlyArray<PartitionLog>
}

/** One partition assigned to a consumer. */
interface Assigned {
  readonly tp: TopicPartition
  readonly key: string
  readonly log: PartitionLog
  /** The next offset to read. */
  position: number
  paused: boolean
}

/** The fetch state shared by plain and group consumers. */
interface Fetcher {
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

interface Member {
  readonly id: string
  readonly topics: ReadonlySet<string>
  readonly fetcher: Fetcher
  readonly events: Queue.Queue<GroupEvent, LogError | Cause.Done>
}

interface Group {
  readonly id: string
  /** Members in join order (ids sort in join order too). */
  members: Array<Member>
  /** Next offset to read, per `tpKey`. */
  readonly committed: Map<string, number>
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const isTopicName = Schema.is(Topic)

const invalid = (detail: string): LogError => logError(new InvalidRequest({ detail }))

const closedError = (what: string): LogError => logError(new LogClosed({ what }))

const outOfRange = (log: PartitionLog, offset: number): LogError =>
  logError(
    new OffsetOutOfRange({
      topic: log.topic,
      partition: log.partition,
      offset,
      logStart: log.logStart,
      highwater: log.highwater
    })
  )

const wakeAll = (wakers: Set<Waker>): void => {
  if (wakers.size === 0) return
  for (const wake of Array.from(wakers)) wake()
}

const recordSize = (record: ProducerRecord): number => {
  let size = (record.key?.byteLength ?? 0) + (record.value?.byteLength ?? 0)
  if (record.headers !== undefined) {
    for (const h of record.headers) size += Buffer.byteLength(h.key, "utf8") + h.value.byteLength
  }
  return size
}

/** A key's identity in maps (its bytes as latin1 text). */
const keyIdOf = (key: Uint8Array): string => Buffer.from(key.buffer, key.byteOffset, key.byteLength).toString("latin1")

const sortTps = (tps: Iterable<TopicPartition>): Array<TopicPartition> => Array.from(tps).sort(tpCompare)

const makeFetcher = (what: string, maxBatchRecords: number): Fetcher => ({
  what,
  maxBatchRecords,
  closed: false,
  assigned: new Map(),
  order: [],
  cursor: 0,
  wakers: new Set()
})

const addAssigned = (f: Fetcher, entry: Assigned): void => {
  f.assigned.set(entry.key, entry)
  f.order.push(entry)
}

const removeAssigned = (f: Fetcher, keys: ReadonlySet<string>): void => {
  if (keys.size === 0) return
  for (const k of keys) f.assigned.delete(k)
  f.order = f.order.filter((e) => !keys.has(e.key))
  if (f.cursor >= f.order.length) f.cursor = 0
}

const assignmentOf = (f: Fetcher): Array<TopicPartition> => sortTps(f.order.map((e) => e.tp))

/** The index of the first record at or after `offset` (`records.length` when there is none). */
const indexAtOrAfter = (records: ReadonlyArray<LogRecord>, offset: number): number => {
  let lo = 0
  let hi = records.length
  while (lo < hi) {
    const mid = (lo + hi) >>> 1
    if (records[mid]!.offset < offset) lo = mid + 1
    else hi = mid
  }
  return lo
}

/**
 * Takes one batch if any assigned, non-paused partition has records; fails when
 * a position fell below its log start; `undefined` when there is nothing to read.
 */
const tryFetch = (f: Fetcher): LogBatch | LogError | undefined => {
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
const fetchBatch = (f: Fetcher): Effect.Effect<LogBatch, LogError> => {
  const loop: Effect.Effect<LogBatch, LogError> = Effect.suspend(() => {
    const r = tryFetch(f)
    if (r === undefined) return Effect.flatMap(awaitChange(f), () => loop)
    return "_tag" in r ? Effect.fail(r) : Effect.succeed(r)
  })
  return loop
}

const checkMaxBatch = (options: ConsumerOptions | undefined): number | LogError => {
  const max = options?.maxBatchRecords ?? DEFAULT_MAX_BATCH_RECORDS
  if (!Number.isSafeInteger(max) || max < 1) return invalid(`maxBatchRecords must be an integer ≥ 1, got ${max}`)
  return max
}

const checkAcks = (options: ProduceOptions | undefined): Acks | LogError => {
  const acks = options?.acks ?? "all"
  if (acks !== 0 && acks !== 1 && acks !== "all") return invalid(`acks must be 0, 1 or "all", got ${String(acks)}`)
  return acks
}

// ---------------------------------------------------------------------------
// The log
// ---------------------------------------------------------------------------

/** The in-memory log and its fault hooks. */
export interface MemoryLog {
  readonly log: LogShape
  readonly faults: LogFaultsShape
}

/** The in-memory log as a layer providing `Log` and `LogFaults`. */
export const layer = (options?: MemoryLogOptions): Layer.Layer<Log | LogFaults> =>
  Layer.effectContext(
    Effect.map(make(options), ({ faults, log }) => Context.make(Log, log).pipe(Context.add(LogFaults, faults)))
  )

/** Builds an in-memory log. */
export const make = (options?: MemoryLogOptions): Effect.Effect<MemoryLog> =>
  Effect.sync(() => {
    const maxRecordBytes = options?.maxRecordBytes ?? DEFAULT_MAX_RECORD_BYTES
    const topics = new Map<string, TopicState>()
    const groups = new Map<string, Group>()
    let memberSeq = 0

    const lookupTopic = (topic: string): TopicState | LogError =>
      topics.get(topic) ?? logError(new UnknownTopic({ topic }))

    const lookup = (topic: string, partition: number): PartitionLog | LogError => {
      const t = lookupTopic(topic)
      if ("_tag" in t) return t
      if (!Number.isSafeInteger(partition)) return invalid(`partition must be an integer, got ${partition}`)
      return (
        t.partitions[partition] ?? logError(new UnknownPartition({ topic, partition, partitions: t.partitions.length }))
      )
    }

    const checkOffset = (offset: number): LogError | undefined =>
      Number.isSafeInteger(offset) ? undefined : invalid(`offset must be an integer, got ${offset}`)

    // --- topics -----------------------------------------------------------

    const ensureTopic = (spec: TopicSpec): Effect.Effect<void, LogError> =>
      Effect.suspend(() => {
        if (!isTopicName(spec.topic) || spec.topic === "." || spec.topic === "..") {
          return Effect.fail(invalid(`invalid topic name ${JSON.stringify(spec.topic)}`))
        }
        if (!Number.isSafeInteger(spec.partitions) || spec.partitions < 1) {
          return Effect.fail(invalid(`partitions must be an integer ≥ 1, got ${spec.partitions}`))
        }
        const rf = spec.replicationFactor
        if (rf !== undefined && (!Number.isSafeInteger(rf) || rf < 1)) {
          return Effect.fail(invalid(`replicationFactor must be an integer ≥ 1, got ${rf}`))
        }
        const existing = topics.get(spec.topic)
        if (existing !== undefined) {
          return existing.partitions.length === spec.partitions
            ? Effect.void
            : Effect.fail(
                logError(
                  new TopicMismatch({
                    topic: spec.topic,
                    expectedPartitions: spec.partitions,
                    actualPartitions: existing.partitions.length
                  })
                )
              )
        }
        const partitions: Array<PartitionLog> = []
        for (let p = 0; p < spec.partitions; p++) {
          partitions.push({
            topic: spec.topic,
            partition: p,
            records: [],
            logStart: 0,
            highwater: 0,
            wakers: new Set()
          })
        }
        topics.set(spec.topic, { name: spec.topic, compacted: spec.compacted === true, partitions })
        return Effect.void
      })

    // --- producing ----------------------------------------------------------

    const validateRecord = (record: ProducerRecord): PartitionLog | LogError => {
      const log = lookup(record.topic, record.partition)
      if ("_tag" in log) return log
      if (record.timestamp !== undefined && !Number.isFinite(record.timestamp)) {
        return invalid(`timestamp must be a finite number, got ${record.timestamp}`)
      }
      const size = recordSize(record)
      if (size > maxRecordBytes) return logError(new RecordTooLarge({ topic: record.topic, size, max: maxRecordBytes }))
      return log
    }

    const append = (log: PartitionLog, record: ProducerRecord, now: number): number => {
      const offset = log.highwater
      const headers: ReadonlyArray<Header> =
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

    /** Topics whose next appends fail (`LogFaults.failAppends`), with how many are left. */
    const failing = new Map<string, number>()

    /** The partition logs of a batch's records, or the first record's problem. */
    const validateAll = (records: ReadonlyArray<ProducerRecord>): Array<PartitionLog> | LogError => {
      const logs: Array<PartitionLog> = []
      for (const record of records) {
        const log = validateRecord(record)
        if ("_tag" in log) return log
        logs.push(log)
      }
      return logs
    }

    /** Appends a checked batch whole, unless a pending fault refuses it (then nothing). */
    const appendChecked = (
      records: ReadonlyArray<ProducerRecord>,
      logs: ReadonlyArray<PartitionLog>,
      acks: Acks,
      now: number
    ): ReadonlyArray<number> | LogError => {
      for (const topic of new Set(records.map((r) => r.topic))) {
        const left = failing.get(topic) ?? 0
        if (left > 0) {
          if (left === 1) failing.delete(topic)
          else failing.set(topic, left - 1)
          return logError(
            new LogIoError({ operation: "produce", detail: `injected append failure on ${topic}`, retryable: true })
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

    const produceBatch = (
      records: ReadonlyArray<ProducerRecord>,
      options?: ProduceOptions
    ): Effect.Effect<ReadonlyArray<number>, LogError> =>
      Effect.flatMap(Clock.currentTimeMillis, (now) =>
        Effect.suspend(() => {
          const acks = checkAcks(options)
          if (typeof acks === "object") return Effect.fail(acks)
          // Every record is checked first: a batch is appended entirely or not at all.
          const logs = validateAll(records)
          if ("_tag" in logs) return Effect.fail(logs)
          const appended = appendChecked(records, logs, acks, now)
          return "_tag" in appended ? Effect.fail(appended) : Effect.succeed(appended)
        })
      )

    const produce = (record: ProducerRecord, options?: ProduceOptions): Effect.Effect<number, LogError> =>
      Effect.map(produceBatch([record], options), (offsets) => offsets[0]!)

    /** A producer whose sends append at once; an injected append failure stops it for good. */
    const producer = (options?: ProducerOptions): Effect.Effect<LogProducer, LogError, Scope.Scope> =>
      Effect.suspend(() => {
        const acks = checkAcks(options)
        if (typeof acks === "object") return Effect.fail(acks)
        let failure: LogError | undefined
        let closed = false
        const send: LogProducer["send"] = (records) =>
          Effect.flatMap(Clock.currentTimeMillis, (now) =>
            Effect.suspend((): Effect.Effect<Effect.Effect<ReadonlyArray<number>, LogError>, LogError> => {
              if (closed) return Effect.fail(closedError("memory producer"))
              if (failure !== undefined) return Effect.fail(failure)
              // A record the log cannot take fails this call only; a refused append stops the producer.
              const logs = validateAll(records)
              if ("_tag" in logs) return Effect.fail(logs)
              const appended = appendChecked(records, logs, acks, now)
              if ("_tag" in appended) {
                failure = appended
                return Effect.succeed(Effect.fail(appended))
              }
              return Effect.succeed(Effect.succeed(appended))
            })
          )
        const shape: LogProducer = {
          send,
          flush: Effect.suspend(() => (failure === undefined ? Effect.void : Effect.fail(failure))),
          failure: Effect.sync(() => failure)
        }
        return Effect.as(
          Effect.addFinalizer(() =>
            Effect.sync(() => {
              closed = true
            })
          ),
          shape
        )
      })

    // --- transactions ---------------------------------------------------------

    /** The newest epoch of each transactional id: a producer of an older epoch is fenced. */
    const epochs = new Map<string, number>()
    /** Each group consumer this log made, with its group and member (a commit's offsets are checked against them). */
    const members = new WeakMap<GroupConsumer, { readonly group: Group; readonly member: Member }>()

    /** Why a transaction's source offsets cannot be committed for this member, if they cannot. */
    const checkTransactionOffsets = (t: TransactionOffsets): LogError | undefined => {
      const known = members.get(t.group)
      if (known === undefined) return invalid("the transaction's group consumer is not one of this log's")
      const { group, member } = known
      if (!group.members.includes(member)) {
        return logError(new Fenced({ detail: `member ${member.id} is no longer in group ${group.id}` }))
      }
      for (const o of t.offsets) {
        const log = lookup(o.topic, o.partition)
        if ("_tag" in log) return log
        const bad = checkOffset(o.offset)
        if (bad !== undefined) return bad
        if (o.offset < 0) return invalid(`a committed offset must be ≥ 0, got ${o.offset}`)
        if (!member.fetcher.assigned.has(tpKey(o))) {
          return logError(
            new Fenced({ detail: `member ${member.id} of group ${group.id} no longer owns ${o.topic}/${o.partition}` })
          )
        }
      }
      return undefined
    }

    /** A transactional producer: sends are held until `commit` appends them with the offsets, all at once. */
    const transactionalProducer = (
      options: TransactionalProducerOptions
    ): Effect.Effect<TransactionalProducer, LogError, Scope.Scope> =>
      Effect.suspend(() => {
        const id = options?.transactionalId
        if (typeof id !== "string" || id.length === 0) {
          return Effect.fail(invalid("transactionalId must be a non-empty string"))
        }
        const epoch = (epochs.get(id) ?? 0) + 1
        epochs.set(id, epoch)
        interface Held {
          readonly records: ReadonlyArray<ProducerRecord>
          readonly logs: ReadonlyArray<PartitionLog>
          readonly done: Deferred.Deferred<ReadonlyArray<number>, LogError>
        }
        let held: Array<Held> = []
        let failure: LogError | undefined
        let closed = false
        /** Ends the open transaction: what it held fails with `error` and is dropped. */
        const end = (error: LogError) => {
          for (const h of held) Deferred.doneUnsafe(h.done, Effect.fail(error))
          held = []
        }
        const usable = (): LogError | undefined => {
          if (closed) return closedError(`transactional producer ${id}`)
          if (failure !== undefined) return failure
          if (epochs.get(id) !== epoch) {
            failure = logError(new Fenced({ detail: `transactional id ${id} was taken by a newer producer` }))
            end(failure)
            return failure
          }
          return undefined
        }
        const aborted = () =>
          logError(new LogIoError({ operation: "produce", detail: `transaction of ${id} aborted`, retryable: false }))
        const shape: TransactionalProducer = {
          send: (records) =>
            Effect.suspend(() => {
              const unusable = usable()
              if (unusable !== undefined) return Effect.fail(unusable)
              // A record the log cannot take fails this call only.
              const logs = validateAll(records)
              if ("_tag" in logs) return Effect.fail(logs)
              const done = Deferred.makeUnsafe<ReadonlyArray<number>, LogError>()
              held.push({ records, logs, done })
              return Effect.succeed(Deferred.await(done))
            }),
          commit: (t) =>
            Effect.flatMap(Clock.currentTimeMillis, (now) =>
              Effect.suspend(() => {
                const unusable = usable()
                if (unusable !== undefined) return Effect.fail(unusable)
                const refused = checkTransactionOffsets(t)
                if (refused !== undefined) {
                  // Nothing of the transaction is appended; the caller aborts or closes.
                  failure = refused
                  end(refused)
                  return Effect.fail(refused)
                }
                const appended = appendChecked(
                  held.flatMap((h) => h.records),
                  held.flatMap((h) => h.logs),
                  "all",
                  now
                )
                if ("_tag" in appended) {
                  failure = appended
                  end(appended)
                  return Effect.fail(appended)
                }
                let at = 0
                for (const h of held) {
                  Deferred.doneUnsafe(h.done, Effect.succeed(appended.slice(at, at + h.records.length)))
                  at += h.records.length
                }
                held = []
                const { group } = members.get(t.group)!
                for (const o of t.offsets) group.committed.set(tpKey(o), o.offset)
                return Effect.void
              })
            ),
          abort: Effect.sync(() => {
            if (closed) return
            end(aborted())
            // After an abort the producer starts afresh (unless a newer one fenced it).
            failure = undefined
          })
        }
        return Effect.as(
          Effect.addFinalizer(() =>
            Effect.sync(() => {
              end(aborted())
              closed = true
            })
          ),
          shape
        )
      })

    // --- offsets ------------------------------------------------------------

    const offsets = (tps: ReadonlyArray<TopicPartition>): Effect.Effect<ReadonlyArray<PartitionOffsets>, LogError> =>
      Effect.suspend(() => {
        const out: Array<PartitionOffsets> = []
        for (const tp of tps) {
          const log = lookup(tp.topic, tp.partition)
          if ("_tag" in log) return Effect.fail(log)
          out.push({ topic: log.topic, partition: log.partition, logStart: log.logStart, highwater: log.highwater })
        }
        return Effect.succeed(out)
      })

    const deleteRecords = (tp: TopicPartition, offset: number): Effect.Effect<void, LogError> =>
      Effect.suspend(() => {
        const log = lookup(tp.topic, tp.partition)
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

    // --- plain consumers ------------------------------------------------------

    const makeConsumer = (f: Fetcher): LogConsumer => {
      const ifOpen = <A>(body: () => Effect.Effect<A, LogError>): Effect.Effect<A, LogError> =>
        Effect.suspend(() => (f.closed ? Effect.fail(closedError(f.what)) : body()))

      const resolve = (tps: ReadonlyArray<TopicPartition>): Array<PartitionLog> | LogError => {
        const out: Array<PartitionLog> = []
        for (const tp of tps) {
          const log = lookup(tp.topic, tp.partition)
          if ("_tag" in log) return log
          out.push(log)
        }
        return out
      }

      const entryOf = (tp: TopicPartition): Assigned | LogError => {
        const e = f.assigned.get(tpKey(tp))
        if (e !== undefined) return e
        const log = lookup(tp.topic, tp.partition)
        if ("_tag" in log) return log
        return logError(new NotAssigned({ topic: log.topic, partition: log.partition }))
      }

      return {
        assign: (tps) =>
          ifOpen(() => {
            const logs = resolve(tps)
            if ("_tag" in logs) return Effect.fail(logs)
            for (const log of logs) {
              const tp = { topic: log.topic, partition: log.partition }
              const key = tpKey(tp)
              if (!f.assigned.has(key)) addAssigned(f, { tp, key, log, position: log.logStart, paused: false })
            }
            wakeAll(f.wakers)
            return Effect.void
          }),
        unassign: (tps) =>
          ifOpen(() => {
            const logs = resolve(tps)
            if ("_tag" in logs) return Effect.fail(logs)
            removeAssigned(f, new Set(tps.map(tpKey)))
            wakeAll(f.wakers)
            return Effect.void
          }),
        assignment: Effect.sync(() => assignmentOf(f)),
        seek: (tp, offset) =>
          ifOpen(() => {
            const e = entryOf(tp)
            if ("_tag" in e) return Effect.fail(e)
            const bad = checkOffset(offset)
            if (bad !== undefined) return Effect.fail(bad)
            if (offset < e.log.logStart || offset > e.log.highwater) return Effect.fail(outOfRange(e.log, offset))
            e.position = offset
            wakeAll(f.wakers)
            return Effect.void
          }),
        position: (tp) =>
          ifOpen(() => {
            const e = entryOf(tp)
            return "_tag" in e ? Effect.fail(e) : Effect.succeed(e.position)
          }),
        pause: (tps) => Effect.sync(() => setPaused(f, tps, true)),
        resume: (tps) => Effect.sync(() => setPaused(f, tps, false)),
        paused: Effect.sync(() => pausedOf(f)),
        batches: Stream.fromEffectRepeat(fetchBatch(f))
      }
    }

    const consumer = (options?: ConsumerOptions): Effect.Effect<LogConsumer, LogError, Scope.Scope> =>
      Effect.suspend(() => {
        const max = checkMaxBatch(options)
        if (typeof max === "object") return Effect.fail(max)
        return Effect.acquireRelease(
          Effect.sync(() => makeFetcher("consumer", max)),
          (f) => Effect.sync(() => closeFetcher(f))
        ).pipe(Effect.map(makeConsumer))
      })

    // --- group consumers ----------------------------------------------------

    /** Round-robin over sorted partitions and sorted members, skipping members not subscribed to a topic. */
    const computeAssignment = (group: Group): Map<Member, Array<TopicPartition>> => {
      const result = new Map<Member, Array<TopicPartition>>()
      const members = [...group.members].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0))
      for (const m of members) result.set(m, [])
      if (members.length === 0) return result
      const topicNames = new Set<string>()
      for (const m of members) for (const t of m.topics) topicNames.add(t)
      const tps: Array<TopicPartition> = []
      for (const name of topicNames) {
        const t = topics.get(name)
        if (t !== undefined) for (const p of t.partitions) tps.push({ topic: name, partition: p.partition })
      }
      tps.sort(tpCompare)
      let k = 0
      for (const tp of tps) {
        for (let tries = 0; tries < members.length; tries++) {
          const m = members[k % members.length]!
          k++
          if (m.topics.has(tp.topic)) {
            result.get(m)!.push(tp)
            break
          }
        }
      }
      return result
    }

    const startOffset = (group: Group, log: PartitionLog): number => {
      const c = group.committed.get(tpKey(log))
      if (c === undefined) return log.logStart
      return Math.min(Math.max(c, log.logStart), log.highwater)
    }

    /** Recomputes the group's assignment; revocations are applied and announced before assignments. */
    const rebalance = (group: Group): void => {
      const target = computeAssignment(group)
      const added: Array<[Member, Array<TopicPartition>]> = []
      for (const [m, tps] of target) {
        const keys = new Set(tps.map(tpKey))
        const revoked = m.fetcher.order.filter((e) => !keys.has(e.key)).map((e) => e.tp)
        if (revoked.length > 0) {
          removeAssigned(m.fetcher, new Set(revoked.map(tpKey)))
          Queue.offerUnsafe(m.events, { _tag: "Revoked", partitions: sortTps(revoked) })
        }
        added.push([m, tps.filter((tp) => !m.fetcher.assigned.has(tpKey(tp)))])
      }
      for (const [m, tps] of added) {
        if (tps.length === 0) continue
        for (const tp of tps) {
          const log = topics.get(tp.topic)!.partitions[tp.partition]!
          addAssigned(m.fetcher, { tp, key: tpKey(tp), log, position: startOffset(group, log), paused: false })
        }
        Queue.offerUnsafe(m.events, { _tag: "Assigned", partitions: sortTps(tps) })
        wakeAll(m.fetcher.wakers)
      }
    }

    const join = (
      options: GroupConsumerOptions,
      maxBatchRecords: number,
      events: Queue.Queue<GroupEvent, LogError | Cause.Done>
    ): Member => {
      let group = groups.get(options.groupId)
      if (group === undefined) {
        group = { id: options.groupId, members: [], committed: new Map() }
        groups.set(options.groupId, group)
      }
      memberSeq++
      const member: Member = {
        id: `${options.groupId}-${String(memberSeq).padStart(10, "0")}`,
        topics: new Set(options.topics),
        fetcher: makeFetcher(`group consumer of ${options.groupId}`, maxBatchRecords),
        events
      }
      group.members.push(member)
      rebalance(group)
      return member
    }

    const leave = (groupId: string, member: Member): void => {
      const group = groups.get(groupId)
      closeFetcher(member.fetcher)
      Queue.endUnsafe(member.events)
      if (group === undefined) return
      group.members = group.members.filter((m) => m !== member)
      rebalance(group)
    }

    const makeGroupConsumer = (group: Group, m: Member): GroupConsumer => {
      const f = m.fetcher
      const ifOpen = <A>(body: () => Effect.Effect<A, LogError>): Effect.Effect<A, LogError> =>
        Effect.suspend(() => (f.closed ? Effect.fail(closedError(f.what)) : body()))
      // Seek and position work as a plain consumer's on the member's fetcher.
      const plain = makeConsumer(f)
      return {
        events: Stream.fromQueue(m.events),
        assignment: Effect.sync(() => assignmentOf(f)),
        batches: Stream.fromEffectRepeat(fetchBatch(f)),
        pause: (tps) => Effect.sync(() => setPaused(f, tps, true)),
        resume: (tps) => Effect.sync(() => setPaused(f, tps, false)),
        seek: plain.seek,
        position: plain.position,
        commit: (entries) =>
          ifOpen(() => {
            for (const e of entries) {
              const log = lookup(e.topic, e.partition)
              if ("_tag" in log) return Effect.fail(log)
              const bad = checkOffset(e.offset)
              if (bad !== undefined) return Effect.fail(bad)
              if (e.offset < 0) return Effect.fail(invalid(`a committed offset must be ≥ 0, got ${e.offset}`))
            }
            for (const e of entries) group.committed.set(tpKey(e), e.offset)
            return Effect.void
          }),
        committed: (tps) =>
          ifOpen(() => {
            const out: Array<TopicPartitionOffset> = []
            for (const tp of tps) {
              const log = lookup(tp.topic, tp.partition)
              if ("_tag" in log) return Effect.fail(log)
              const offset = group.committed.get(tpKey(tp))
              if (offset !== undefined) out.push({ topic: log.topic, partition: log.partition, offset })
            }
            return Effect.succeed(out)
          }),
        // Rebalances run at once here, so every member's fetcher holds the group's current assignment.
        membership: ifOpen(() =>
          Effect.succeed({
            memberId: m.id,
            members: [...group.members]
              .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0))
              .map((other) => ({ memberId: other.id, partitions: assignmentOf(other.fetcher) }))
          })
        )
      }
    }

    const groupConsumer = (options: GroupConsumerOptions): Effect.Effect<GroupConsumer, LogError, Scope.Scope> =>
      Effect.suspend(() => {
        const max = checkMaxBatch(options)
        if (typeof max === "object") return Effect.fail(max)
        if (typeof options.groupId !== "string" || options.groupId.length === 0) {
          return Effect.fail(invalid("groupId must be a non-empty string"))
        }
        if (options.topics.length === 0) return Effect.fail(invalid("a group consumer needs at least one topic"))
        for (const t of options.topics) {
          const topic = lookupTopic(t)
          if ("_tag" in topic) return Effect.fail(topic)
        }
        return Effect.acquireRelease(
          Effect.flatMap(Queue.unbounded<GroupEvent, LogError | Cause.Done>(), (events) =>
            Effect.sync(() => join(options, max, events))
          ),
          (m) => Effect.sync(() => leave(options.groupId, m))
        ).pipe(
          Effect.map((member) => {
            const group = groups.get(options.groupId)!
            const consumer = makeGroupConsumer(group, member)
            members.set(consumer, { group, member })
            return consumer
          })
        )
      })

    // --- faults --------------------------------------------------------------

    const compact = (tp: TopicPartition, options?: CompactOptions): Effect.Effect<ReadonlyArray<number>, LogError> =>
      Effect.suspend(() => {
        const log = lookup(tp.topic, tp.partition)
        if ("_tag" in log) return Effect.fail(log)
        if (!topics.get(log.topic)!.compacted) {
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
        const kept: Array<LogRecord> = []
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

    const recordsOf = (tp: TopicPartition): Effect.Effect<ReadonlyArray<LogRecord>, LogError> =>
      Effect.suspend(() => {
        const log = lookup(tp.topic, tp.partition)
        return "_tag" in log ? Effect.fail(log) : Effect.succeed(log.records.slice())
      })

    const shape: LogShape = {
      backend: "memory",
      ensureTopic,
      produce,
      produceBatch,
      flush: Effect.void,
      producer,
      transactionalProducer,
      offsets,
      deleteRecords,
      consumer,
      groupConsumer
    }
    const failAppends = (topic: string, count: number): Effect.Effect<void> =>
      Effect.sync(() => {
        if (count > 0) failing.set(topic, count)
        else failing.delete(topic)
      })
    return { log: shape, faults: { compact, records: recordsOf, failAppends } }
  })

// ---------------------------------------------------------------------------
// Fetcher helpers that need no log state
// ---------------------------------------------------------------------------

function setPaused(f: Fetcher, tps: ReadonlyArray<TopicPartition>, paused: boolean): void {
  if (f.closed) return
  let changed = false
  for (const tp of tps) {
    const e = f.assigned.get(tpKey(tp))
    if (e !== undefined && e.paused !== paused) {
      e.paused = paused
      changed = true
    }
  }
  // Pausing also wakes waiting fetches so they re-register without the paused partitions.
  if (changed) wakeAll(f.wakers)
}

function pausedOf(f: Fetcher): Array<TopicPartition> {
  return sortTps(f.order.filter((e) => e.paused).map((e) => e.tp))
}

function closeFetcher(f: Fetcher): void {
  if (f.closed) return
  f.closed = true
  f.assigned.clear()
  f.order = []
  wakeAll(f.wakers)
}
