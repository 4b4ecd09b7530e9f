/**
 * The manager's write path: `process` / `processBatch` run source records one at a time per source partition, collect
 * their writes, and hand each call's writes to the changelog producer in one send, buffering them in their
 * partitions at once (reads see them) and linking them to the source partition the next commit persists.
 *
 * @internal
 */
import { type Log, Models } from "@strata/core"
import { Effect, Semaphore } from "effect"
import { ChangelogFailed, type TableError } from "../Table.js"
import { type Collector, CurrentCollector, make as makeCollector, type Registered } from "./collector.js"
import { type Manager, partitionId, type SourceLink, tableError } from "./manager.js"
import * as PartitionWrites from "./partitionWrites.js"
import type { Change } from "./partitionWrites.js"
import * as RestoreTarget from "./restoreTarget.js"

/** A partition one send writes: its changes in order and their indexes in the send. */
interface Target {
  readonly table: Registered
  readonly partition: number
  readonly w: PartitionWrites.PartitionWrites
  readonly changes: Array<Change>
  readonly indexes: Array<number>
}

/** The fixed order partitions' permits are taken in: by table name, then partition. */
const compareTargets = (a: Target, b: Target): number =>
  a.table.info.name < b.table.info.name ? -1 : a.table.info.name > b.table.info.name ? 1 : a.partition - b.partition

/** A collector's changelog records, each naming the source record that wrote it (one header per source record). */
const changelogRecords = (collector: Collector): Array<Log.ProducerRecord> => {
  let lastSource: Models.TopicPartitionOffset | undefined
  let headers: ReadonlyArray<Log.Header> = []
  let prefixOf: Models.TopicPartitionOffset | undefined
  let prefix = ""
  return collector.writes.map((w) => {
    if (w.source !== lastSource) {
      lastSource = w.source
      if (w.source === undefined) headers = []
      else {
        if (prefixOf === undefined || prefixOf.partition !== w.source.partition || prefixOf.topic !== w.source.topic) {
          prefixOf = w.source
          prefix = RestoreTarget.sourceHeaderPrefix(w.source)
        }
        headers = [RestoreTarget.sourceHeaderAt(prefix, w.source.offset)]
      }
    }
    return {
      topic: w.table.info.changelogTopic,
      partition: w.partition,
      key: w.change.key,
      value: w.change.value,
      headers
    }
  })
}

/** The highest offset among `offsets[i]` for the given indexes (`-1` when none is known). */
const highestOf = (offsets: ReadonlyArray<number>, indexes: ReadonlyArray<number>): number => {
  let max = -1
  for (const i of indexes) {
    const o = offsets[i] ?? -1
    if (o > max) max = o
  }
  return max
}

/** The link of a source partition, made on first use. */
const linkOf = (m: Manager, source: Models.TopicPartitionOffset): SourceLink => {
  const key = Models.tpKey(source)
  let found = m.links.get(key)
  if (found === undefined) {
    found = { tp: { topic: source.topic, partition: source.partition }, changelogs: new Set() }
    m.links.set(key, found)
  }
  return found
}

/** The lock that keeps one source partition's records one at a time. */
const sourceLock = (m: Manager, source: Models.TopicPartition) => {
  const key = Models.tpKey(source)
  let lock = m.sourceLocks.get(key)
  if (lock === undefined) {
    lock = Semaphore.makeUnsafe(1)
    m.sourceLocks.set(key, lock)
  }
  return lock
}

/**
 * Hands a collector's writes to the producer in one send and buffers them at once, holding one permit on every
 * partition written (taken in a fixed order); the acks are awaited by the next flush.
 */
export const sendCollector = (m: Manager, collector: Collector): Effect.Effect<void, TableError> =>
  Effect.suspend(() => {
    if (collector.writes.length === 0) return Effect.void
    // The partitions written, by their write state now, each with its writes' indexes in the send.
    const targets = new Map<PartitionWrites.PartitionWrites, Target>()
    for (let i = 0; i < collector.writes.length; i++) {
      const write = collector.writes[i]!
      const w = write.table.partitions.get(write.partition)
      if (w === undefined) continue
      let target = targets.get(w)
      if (target === undefined) {
        target = { table: write.table, partition: write.partition, w, changes: [], indexes: [] }
        targets.set(w, target)
      }
      target.changes.push(write.change)
      target.indexes.push(i)
    }
    const send = sendAndBuffer(m, collector, targets)
    if (targets.size === 1) return PartitionWrites.shared(targets.keys().next().value!, send)
    return [...targets.values()]
      .sort((a, b) => compareTargets(b, a))
      .reduce<Effect.Effect<void, TableError>>((inner, { w }) => PartitionWrites.shared(w, inner), send)
  })

/** Sends the records, then buffers each target's changes with the ack of its highest offset, and links them. */
const sendAndBuffer = (
  m: Manager,
  collector: Collector,
  targets: ReadonlyMap<PartitionWrites.PartitionWrites, Target>
) =>
  Effect.gen(function* () {
    const acked = yield* m.producer
      .send(changelogRecords(collector))
      .pipe(
        Effect.mapError((cause) =>
          tableError(new ChangelogFailed({ table: collector.writes[0]!.table.info.name, cause }))
        )
      )
    const link = collector.source === undefined ? undefined : linkOf(m, collector.source)
    for (const target of targets.values()) {
      // The partition was revoked while the record was processed: the changelog has the write, the next owner
      // replays it.
      if (target.table.partitions.get(target.partition) !== target.w) continue
      PartitionWrites.buffer(
        target.w,
        target.changes,
        Effect.map(acked, (offsets) => highestOf(offsets, target.indexes)),
        collector.source
      )
      const id = partitionId(target.table, target.partition)
      if (link === undefined) m.unlinked.add(id)
      else link.changelogs.add(id)
    }
  })

/** Runs `effect` as the processing of one source record (see `TablesShape.process`). */
export const process = <A, E, R>(
  m: Manager,
  source: Models.TopicPartitionOffset,
  effect: Effect.Effect<A, E, R>
): Effect.Effect<A, E | TableError, R> =>
  Semaphore.withPermit(
    sourceLock(m, source),
    m.producer.gated(
      Effect.gen(function* () {
        const collector = makeCollector(source)
        const a = yield* Effect.provideService(effect, CurrentCollector, collector)
        yield* sendCollector(m, collector)
        return a
      })
    )
  )

/** Runs `f` for each source record of one source partition, sending their writes in one batch (`processBatch`). */
export const processBatch = <S extends Models.TopicPartitionOffset, E, R>(
  m: Manager,
  sources: ReadonlyArray<S>,
  f: (source: S) => Effect.Effect<void, E, R>
): Effect.Effect<void, E | TableError, R> =>
  Effect.suspend(() => {
    const first = sources[0]
    if (first === undefined) return Effect.void
    return Semaphore.withPermit(
      sourceLock(m, first),
      m.producer.gated(
        Effect.suspend(() => {
          // One collector for the batch, provided once; it names the record being processed.
          const collector = makeCollector(undefined)
          // forEach calls its function as each step starts: the collector names that step's record.
          const each = Effect.forEach(
            sources,
            (source) => {
              collector.source = source
              return f(source)
            },
            { discard: true }
          )
          return Effect.andThen(Effect.provideService(each, CurrentCollector, collector), sendCollector(m, collector))
        })
      )
    )
  })

/** Runs `effect` once no record of these source partitions is being processed, and none starts meanwhile. */
export const withSourcesIdle = <A, E>(
  m: Manager,
  tps: ReadonlyArray<Models.TopicPartition>,
  effect: Effect.Effect<A, E>
) =>
  [...new Map(tps.map((tp) => [Models.tpKey(tp), tp] as const))]
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .reduce<Effect.Effect<A, E>>((inner, [, tp]) => Semaphore.withPermit(sourceLock(m, tp), inner), effect)
