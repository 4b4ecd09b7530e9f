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
import * as Log from "../Log.js"
import { Context, Effect, Layer } from "effect"
import { compact, deleteRecords, ensureTopic, failAppends, offsets, recordsOf } from "./memoryLogAdmin.js"
import { makeBroker } from "./memoryLogBroker.js"
import { consumer } from "./memoryLogConsumer.js"
import { groupConsumer } from "./memoryLogGroupConsumer.js"
import { produce, produceBatch, producer } from "./memoryLogProducer.js"
import { transactionalProducer } from "./memoryLogTransactionalProducer.js"

/** Options of the in-memory log. */
export interface MemoryLogOptions {
  /** Largest record (key + value + headers) accepted, in bytes (default 1 MiB, like Kafka). */
  readonly maxRecordBytes?: number
}

const DEFAULT_MAX_RECORD_BYTES = 1024 * 1024

/** The in-memory log and its fault hooks. */
export interface MemoryLog {
  readonly log: Log.Shape
  readonly faults: Log.FaultsShape
}

/** The in-memory log as a layer providing `Log` and `LogFaults`. */
export const layer = (options?: MemoryLogOptions): Layer.Layer<Log.Log | Log.Faults> =>
  Layer.effectContext(
    Effect.map(make(options), ({ faults, log }) => Context.make(Log.Log, log).pipe(Context.add(Log.Faults, faults)))
  )

/** Builds an in-memory log: one broker state, and the `Log` and `LogFaults` shapes over it. */
export const make = (options?: MemoryLogOptions): Effect.Effect<MemoryLog> =>
  Effect.sync(() => {
    const s = makeBroker(options?.maxRecordBytes ?? DEFAULT_MAX_RECORD_BYTES)
    const log: Log.Shape = {
      backend: "memory",
      ensureTopic: (spec) => ensureTopic(s, spec),
      produce: (record, produceOptions) => produce(s, record, produceOptions),
      produceBatch: (records, produceOptions) => produceBatch(s, records, produceOptions),
      flush: Effect.void,
      producer: (producerOptions) => producer(s, producerOptions),
      transactionalProducer: (producerOptions) => transactionalProducer(s, producerOptions),
      offsets: (tps) => offsets(s, tps),
      deleteRecords: (tp, offset) => deleteRecords(s, tp, offset),
      consumer: (consumerOptions) => consumer(s, consumerOptions),
      groupConsumer: (consumerOptions) => groupConsumer(s, consumerOptions)
    }
    const faults: Log.FaultsShape = {
      compact: (tp, compactOptions) => compact(s, tp, compactOptions),
      records: (tp) => recordsOf(s, tp),
      failAppends: (topic, count) => failAppends(s, topic, count)
    }
    return { log, faults }
  })
