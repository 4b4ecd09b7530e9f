/**
 * Core's `Log` protocol on a Strata cluster's own tablets: a topic is a table, its partitions the table's tablets
 * (created by the controller with the cluster's replication factor), a partition's offsets the tablet's. Records
 * go through a `TabletClient` (batched, idempotent, acknowledged at the `acks` asked), and consumers read each
 * assigned tablet from its leader up to the high watermark, so Tables and Recovery run unchanged on the cluster.
 * A topic created with Kafka's `retention.ms` or `retention.bytes` in its config gets that retention for its table
 * (`-1`: none); the other configs are passed over.
 *
 * Consumer groups live in the cluster's coordination (members, partition owners and committed offsets under
 * `<ns>/groups/<group>`): a partition is announced `Assigned` only once its previous owner released it.
 *
 * What the cluster does not offer is declared in `capabilities`, and the operation fails with `Unsupported`:
 * transactions. `deleteRecords` moves a tablet's log start on its leader and returns once every in-sync replica's
 * start has moved too.
 *
 * A tombstone (a `null` value) travels as an empty value with the reserved header `strata.tombstone`, which a
 * record of the caller's may not carry.
 *
 * @since 0.1.0
 */
import { Coordination, type Election, Log, Models, OptionSchemas } from "@strata/core"
import { Clock, Config, Duration, Effect, Layer, Schema, type Scope } from "effect"
import * as ReplicaRpc from "../wire/ReplicaRpc.js"
import * as ReplicationConfig from "../wire/ReplicationConfig.js"
import { makeConsumer } from "./internal/strataConsumer.js"
import { makeGroupConsumer } from "./internal/strataGroup.js"
import {
  checkPartition,
  fromClient,
  hasTombstoneHeader,
  logError,
  offsetsOf,
  partitionsOf,
  recordSize,
  type Shared,
  TOMBSTONE_HEADER,
  toTablet
} from "./internal/strataShared.js"
import * as TabletClient from "../client/TabletClient.js"

/**
 * What the Strata log offers of the `Log` protocol (core's conformance suite runs what these allow, and checks the
 * rest fails with `Unsupported`).
 *
 * @since 0.1.0
 */
export const capabilities = { transactions: false, groups: true, deleteRecords: true, faults: false } as const

/**
 * The log's options. A duration takes any `Duration.Input` (`"20 millis"`, or a number of milliseconds).
 *
 * @since 0.1.0
 */
export const StrataLogOptions = Schema.Struct({
  /** The client's options (namespace, batching, timeouts; `TabletClient`). */
  client: Schema.Unknown.pipe(Schema.withDecodingDefaultKey(Effect.succeed({}))),
  /** The largest record accepted, key, value and headers together (1 MiB). */
  maxRecordBytes: OptionSchemas.PositiveInt.pipe(Schema.withDecodingDefaultKey(Effect.succeed(1_048_576))),
  /**
   * The least time between two reads of a caught-up partition by a consumer (20 millis); such a read also waits on
   * its leader for new records, for the longer of this and 500 millis (the leader bounds it by its `fetchMaxWait`).
   */
  pollInterval: OptionSchemas.DurationOption("positive").pipe(
    Schema.withDecodingDefaultKey(Effect.succeed<Duration.Input>("20 millis"))
  )
})

/**
 * The options' input: the schema's, with the client's options as `TabletClient` takes them (it checks them).
 *
 * @since 0.1.0
 */
export type StrataLogOptions = Omit<typeof StrataLogOptions.Encoded, "client"> & {
  readonly client?: TabletClient.TabletClientOptions
}

const isTopic = Schema.is(Models.Topic)

/**
 * The log on the `Coordination` in context; its client closes with the scope.
 *
 * @since 0.1.0
 */
export const make = (
  options: StrataLogOptions = {}
): Effect.Effect<
  Log.Shape,
  ReplicationConfig.InvalidReplicaOptions | Coordination.CoordinationError | Election.ElectionError,
  Coordination.Coordination | Scope.Scope
> =>
  Effect.gen(function* () {
    const o = yield* OptionSchemas.decodeOptions(StrataLogOptions, { exact: true })(options).pipe(
      Effect.mapError(ReplicationConfig.invalidOptions)
    )
    const client = yield* TabletClient.make(options.client ?? {})
    const coordination = yield* Coordination.Coordination
    const namespace = options.client?.namespace ?? "/strata"
    const shared: Shared = { client, partitions: new Map(), pollInterval: o.pollInterval, ends: new Map() }
    const unsupported = (operation: string) =>
      Effect.fail(logError(new Log.Unsupported({ operation, backend: "strata" })))

    /**
     * Checks every record (appending nothing when one is bad) and queues them in order, each partition's records as
     * runs of up to `CHUNK_BYTES` (one wait per run, its offsets consecutive); the wait for the records' offsets.
     */
    const enqueue = (records: ReadonlyArray<Log.ProducerRecord>, acks: 0 | 1 | "all", abandon?: () => boolean) =>
      Effect.gen(function* () {
        // Each topic's partition count, asked once; then every record is checked without an effect of its own.
        const counts = new Map<string, number>()
        for (let i = 0; i < records.length; i++) {
          const topic = records[i]!.topic
          if (!counts.has(topic)) counts.set(topic, yield* partitionsOf(shared, topic))
        }
        const grouped = groupByTablet(records, counts, o.maxRecordBytes)
        if (grouped instanceof Log.LogError) return yield* grouped
        const { byTablet, sizes } = grouped
        const now = yield* Clock.currentTimeMillis
        const offsets = new Array<number>(records.length).fill(-1)
        const waits: Array<Effect.Effect<void, Log.LogError>> = []
        for (const { tablet, indexes } of byTablet) {
          for (const run of runsOf(indexes, sizes)) {
            const first = records[run[0]!]!
            const wait = yield* client.enqueue(
              tablet,
              run.map((i) => toTablet(records[i]!, now)),
              acks,
              abandon
            )
            waits.push(
              wait.pipe(
                Effect.tap((sent) =>
                  Effect.sync(() => {
                    if (acks !== 0) for (const [k, i] of run.entries()) offsets[i] = sent.baseOffset + k
                  })
                ),
                Effect.mapError(fromClient("producing", first))
              )
            )
          }
        }
        return Effect.as(Effect.all(waits, { concurrency: "unbounded", discard: true }), offsets)
      })

    const produceBatch: Log.Shape["produceBatch"] = (records, produceOptions) =>
      Effect.flatten(enqueue(records, produceOptions?.acks ?? "all"))

    return {
      backend: "strata",
      ensureTopic: (spec) =>
        Effect.gen(function* () {
          if (!isTopic(spec.topic) || spec.topic === "." || spec.topic === "..") {
            return yield* logError(
              new Log.InvalidRequest({ detail: `invalid topic name ${JSON.stringify(spec.topic)}` })
            )
          }
          if (
            !Number.isInteger(spec.partitions) ||
            spec.partitions < 1 ||
            spec.partitions > ReplicaRpc.MAX_TABLETS_PER_TABLE
          ) {
            return yield* logError(
              new Log.InvalidRequest({
                detail: `invalid partition count ${spec.partitions} (1–${ReplicaRpc.MAX_TABLETS_PER_TABLE})`
              })
            )
          }
          const retention = retentionOfConfig(spec.config ?? {})
          if (retention instanceof Log.InvalidRequest) return yield* logError(retention)
          const tp = { topic: spec.topic, partition: 0 }
          const existing = yield* client
            .metadata(spec.topic)
            .pipe(Effect.mapError(fromClient("reading the metadata", tp)))
          let count = existing.tablets.length
          if (count === 0) {
            const created = yield* Effect.result(
              client.createTable(spec.topic, {
                buckets: spec.partitions,
                ...(spec.replicationFactor === undefined ? {} : { replicationFactor: spec.replicationFactor }),
                ...retention
              })
            )
            if (created._tag === "Success") count = created.success.length
            else {
              // Created meanwhile by another caller: what it holds decides.
              const again = yield* client
                .metadata(spec.topic)
                .pipe(Effect.mapError(fromClient("reading the metadata", tp)))
              if (again.tablets.length === 0) return yield* fromClient("creating the topic", tp)(created.failure)
              count = again.tablets.length
            }
            // Every new tablet leads before the topic is used.
            yield* awaitLeaders(client, spec.topic)
          }
          if (count !== spec.partitions) {
            return yield* logError(
              new Log.TopicMismatch({ topic: spec.topic, expectedPartitions: spec.partitions, actualPartitions: count })
            )
          }
          shared.partitions.set(spec.topic, count)
        }),
      produce: (record, produceOptions) => Effect.map(produceBatch([record], produceOptions), (offsets) => offsets[0]!),
      produceBatch,
      flush: Effect.void,
      producer: (producerOptions) => makeProducer(enqueue, producerOptions?.acks ?? "all"),
      transactionalProducer: () => unsupported("transactions"),
      offsets: (list) => Effect.forEach(list, (tp) => offsetsOf(shared, tp), { concurrency: 16 }),
      deleteRecords: (tp, offset) =>
        Effect.gen(function* () {
          const tablet = yield* checkPartition(shared, tp)
          if (!Number.isSafeInteger(offset) || offset < 0) {
            return yield* logError(
              new Log.InvalidRequest({ detail: `deleteRecords: offset ${offset} is not a non-negative integer` })
            )
          }
          yield* client.deleteRecords(tablet, offset).pipe(Effect.mapError(fromClient("deleting records", tp)))
        }),
      consumer: (consumerOptions) => makeConsumer(shared, consumerOptions ?? {}),
      groupConsumer: (groupOptions) => makeGroupConsumer(shared, coordination, namespace, groupOptions)
    }
  })

/**
 * The retention a topic's config names, by Kafka's keys: `retention.ms` and `retention.bytes`, each a whole number ≥ 1
 * as a string of digits, or `-1` for none (everything kept); other keys are passed over. A value that is neither is
 * `InvalidRequest` naming the key and the value.
 */
const retentionOfConfig = (config: {
  readonly [key: string]: string
}): { retentionMs?: number; retentionBytes?: number } | Log.InvalidRequest => {
  const out: { retentionMs?: number; retentionBytes?: number } = {}
  for (const [key, field] of [
    ["retention.ms", "retentionMs"],
    ["retention.bytes", "retentionBytes"]
  ] as const) {
    const value = config[key]
    if (value === undefined || value === "-1") continue
    const n = /^\d+$/.test(value) ? Number(value) : Number.NaN
    if (!Number.isSafeInteger(n) || n < 1) {
      return new Log.InvalidRequest({
        detail: `topic config ${key}=${JSON.stringify(value)}: expected a whole number ≥ 1 (or -1: unlimited)`
      })
    }
    out[field] = n
  }
  return out
}

/** A produce call's records by tablet, in order, and each record's size. */
interface Grouped {
  readonly byTablet: ReadonlyArray<{ readonly tablet: Models.TabletId; readonly indexes: Array<number> }>
  readonly sizes: ReadonlyArray<number>
}

/**
 * Checks every record of a produce call against its topic's partition count (`counts`), the size limit and the
 * reserved header, and groups the records by tablet; the first bad record's error, when one is.
 */
const groupByTablet = (
  records: ReadonlyArray<Log.ProducerRecord>,
  counts: ReadonlyMap<string, number>,
  maxRecordBytes: number
): Grouped | Log.LogError => {
  const byTablet: Array<{ readonly tablet: Models.TabletId; readonly indexes: Array<number> }> = []
  // Each topic's groups by partition; most calls name one topic, so the last one is kept at hand.
  const topics = new Map<string, Array<Array<number> | undefined>>()
  let lastTopic: string | undefined
  let lastGroups: Array<Array<number> | undefined> = []
  const sizes = new Array<number>(records.length)
  for (let i = 0; i < records.length; i++) {
    const r = records[i]!
    const partitions = counts.get(r.topic)!
    if (!Number.isInteger(r.partition) || r.partition < 0 || r.partition >= partitions) {
      return logError(new Log.UnknownPartition({ topic: r.topic, partition: r.partition, partitions }))
    }
    const size = recordSize(r)
    if (size > maxRecordBytes) {
      return logError(new Log.RecordTooLarge({ topic: r.topic, partition: r.partition, size, max: maxRecordBytes }))
    }
    if (hasTombstoneHeader(r)) {
      return logError(new Log.InvalidRequest({ detail: `the header ${TOMBSTONE_HEADER} is reserved` }))
    }
    sizes[i] = size
    if (r.topic !== lastTopic) {
      lastTopic = r.topic
      let groups = topics.get(r.topic)
      if (groups === undefined) {
        groups = []
        topics.set(r.topic, groups)
      }
      lastGroups = groups
    }
    const group = lastGroups[r.partition]
    if (group !== undefined) group.push(i)
    else {
      const indexes = [i]
      lastGroups[r.partition] = indexes
      byTablet.push({ tablet: { table: r.topic, bucket: r.partition }, indexes })
    }
  }
  return { byTablet, sizes }
}

/** Waits (up to 30 s) until every tablet of `table` has a leader. */
const awaitLeaders = (client: TabletClient.TabletClientShape, table: string) =>
  Effect.gen(function* () {
    for (let i = 0; i < 300; i++) {
      const m = yield* Effect.option(client.metadata(table))
      if (m._tag === "Some" && m.value.tablets.every((t) => t.leader !== null)) return
      yield* Effect.sleep(Duration.millis(100))
    }
  })

/** How many bytes of one partition's records `produceBatch` queues as one run (the client batches runs together). */
const CHUNK_BYTES = 65_536

/** `indexes` cut into consecutive runs of at most `CHUNK_BYTES` by `sizes` (a larger record a run of its own). */
const runsOf = (indexes: ReadonlyArray<number>, sizes: ReadonlyArray<number>): Array<Array<number>> => {
  const runs: Array<Array<number>> = []
  let run: Array<number> = []
  let bytes = 0
  for (const i of indexes) {
    const n = sizes[i]!
    if (run.length > 0 && bytes + n > CHUNK_BYTES) {
      runs.push(run)
      run = []
      bytes = 0
    }
    run.push(i)
    bytes += n
  }
  if (run.length > 0) runs.push(run)
  return runs
}

/** A pipelined producer with a sticky first failure. */
const makeProducer = (
  enqueue: (
    records: ReadonlyArray<Log.ProducerRecord>,
    acks: 0 | 1 | "all",
    abandon: () => boolean
  ) => Effect.Effect<Effect.Effect<ReadonlyArray<number>, Log.LogError>, Log.LogError>,
  acks: 0 | 1 | "all"
) =>
  Effect.gen(function* () {
    let failure: Log.LogError | undefined
    const pending = new Set<Effect.Effect<unknown>>()
    let closed = false
    yield* Effect.addFinalizer(() =>
      Effect.suspend(() => {
        closed = true
        return Effect.all([...pending], { concurrency: "unbounded", discard: true })
      })
    )
    const send = (records: ReadonlyArray<Log.ProducerRecord>) =>
      Effect.gen(function* () {
        if (closed) return yield* logError(new Log.Closed({ what: "the producer" }))
        if (failure !== undefined) return yield* failure
        // Once a send failed, what is still queued behind it is dropped unsent.
        const wait = yield* enqueue(records, acks, () => failure !== undefined)
        const settled = yield* Effect.cached(
          wait.pipe(
            Effect.tapError((e) =>
              Effect.sync(() => {
                failure ??= e
              })
            )
          )
        )
        const ignored = Effect.ignore(settled)
        pending.add(ignored)
        return Effect.ensuring(
          Effect.suspend(() =>
            failure !== undefined ? Effect.flatMap(Effect.ignore(settled), () => Effect.fail(failure!)) : settled
          ),
          Effect.sync(() => pending.delete(ignored))
        )
      })
    return {
      send,
      flush: Effect.suspend(() =>
        Effect.andThen(Effect.all([...pending], { concurrency: "unbounded", discard: true }), () =>
          failure === undefined ? Effect.void : Effect.fail(failure)
        )
      ),
      failure: Effect.sync(() => failure)
    }
  })

/**
 * The log as a layer on the `Coordination` in context.
 *
 * @since 0.1.0
 */
export const layer = (
  options: StrataLogOptions = {}
): Layer.Layer<
  Log.Log,
  ReplicationConfig.InvalidReplicaOptions | Coordination.CoordinationError | Election.ElectionError,
  Coordination.Coordination
> => Layer.effect(Log.Log, make(options))

/**
 * Like `layer`, with the options read from configuration.
 *
 * @since 0.1.0
 */
export const layerConfig = (
  config: Config.Wrap<StrataLogOptions>
): Layer.Layer<
  Log.Log,
  | ReplicationConfig.InvalidReplicaOptions
  | Coordination.CoordinationError
  | Election.ElectionError
  | Config.ConfigError,
  Coordination.Coordination
> => Layer.unwrap(Effect.map(Config.unwrap(config), layer))
