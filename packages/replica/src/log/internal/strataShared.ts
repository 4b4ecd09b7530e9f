/**
 * What the Strata log's producer side and its consumers share: the client, the topics' partition counts, how a
 * client failure reads as the log's, and how records look on a tablet.
 *
 * @internal
 */
import { Errors, Log, type Models } from "@strata/core"
import type * as ReplicaManager from "../../protocol/ReplicaManager.js"
import { type Duration, Effect } from "effect"
import type * as TabletClient from "../../client/TabletClient.js"

/** The header that marks a tombstone. */
export const TOMBSTONE_HEADER = "strata.tombstone"

export const logError = (reason: Log.ErrorReason) => new Log.LogError({ reason })

/** A client failure as the log's. */
export const fromClient =
  (operation: string, tp: Models.TopicPartition) =>
  (e: TabletClient.TabletClientError): Log.LogError => {
    const r = e.reason
    switch (r._tag) {
      case "NoSuchTablet":
        return logError(new Log.UnknownTopic({ topic: tp.topic }))
      case "ClientClosed":
        return logError(new Log.Closed({ what: "the strata log" }))
      case "Abandoned":
        return logError(new Log.IoError({ operation, detail: r.message, retryable: false }))
      case "HandshakeFailed":
        return logError(new Log.AuthenticationFailed({ brokers: [r.target], detail: r.detail }))
      case "DeliveryUnknown":
      case "NoProducerId":
        return logError(new Log.IoError({ operation, detail: r.message, retryable: true }))
      case "CreateTableRefused":
      case "DeleteTableRefused":
      case "ReassignRefused":
        return logError(new Log.InvalidRequest({ detail: r.detail }))
      case "RebalanceCommandError":
        return logError(new Log.InvalidRequest({ detail: r.message }))
      case "ReplicaError": {
        const reason = r.reason
        if (reason._tag === "OffsetOutOfRange") {
          return logError(
            new Errors.OffsetOutOfRange({
              topic: tp.topic,
              partition: tp.partition,
              offset: reason.offset,
              logStart: reason.logStart,
              highwater: reason.highwater
            })
          )
        }
        if (reason._tag === "InvalidRequest") return logError(new Log.InvalidRequest({ detail: reason.message }))
        return logError(new Log.IoError({ operation, detail: r.message, retryable: r.retryable }))
      }
    }
  }

/** A record as a tablet holds it. */
export const toTablet = (r: Log.ProducerRecord, now: number): ReplicaManager.TabletRecord => {
  const headers = r.headers ?? []
  return r.value === null
    ? {
        key: r.key,
        value: new Uint8Array(0),
        headers: [...headers, { key: TOMBSTONE_HEADER, value: new Uint8Array(0) }],
        timestamp: r.timestamp ?? now
      }
    : { key: r.key, value: r.value, headers, timestamp: r.timestamp ?? now }
}

/** Whether a tablet record's headers mark it a tombstone. */
const isTombstone = (headers: ReplicaManager.TabletRecord["headers"]): boolean => {
  for (let i = 0; i < headers.length; i++) if (headers[i]!.key === TOMBSTONE_HEADER) return true
  return false
}

/**
 * A tablet's record as the log reads it: its key, value and headers are the tablet record's own (not copied), but for
 * a tombstone's, which lose the marking header.
 */
export const fromTablet = (tp: Models.TopicPartition, offset: number, r: ReplicaManager.TabletRecord): Log.Record =>
  isTombstone(r.headers)
    ? {
        topic: tp.topic,
        partition: tp.partition,
        offset,
        key: r.key,
        value: null,
        headers: r.headers.filter((h) => h.key !== TOMBSTONE_HEADER),
        timestamp: r.timestamp
      }
    : {
        topic: tp.topic,
        partition: tp.partition,
        offset,
        key: r.key,
        value: r.value,
        headers: r.headers,
        timestamp: r.timestamp
      }

/** A record's size as `maxRecordBytes` counts it: its key, value, and headers' keys and values. */
export const recordSize = (r: Log.ProducerRecord): number => {
  let n = (r.key?.length ?? 0) + (r.value?.length ?? 0)
  const headers = r.headers
  if (headers !== undefined)
    for (let i = 0; i < headers.length; i++) n += headers[i]!.key.length + headers[i]!.value.length
  return n
}

/** Whether a record to produce carries the header reserved for tombstones. */
export const hasTombstoneHeader = (r: Log.ProducerRecord): boolean => r.headers !== undefined && isTombstone(r.headers)

/** What every part of the log shares: the client, the topics' partition counts as last seen. */
export interface Shared {
  readonly client: TabletClient.TabletClientShape
  readonly partitions: Map<string, number>
  /** How often an idle consumer asks its leaders for new records. */
  readonly pollInterval: Duration.Duration
  /** Each tablet's log end as last seen, where an offsets question starts. */
  readonly ends: Map<string, number>
}

/** The partition count of `topic`, from the controller when not known; `UnknownTopic` when it has none. */
export const partitionsOf = (shared: Shared, topic: string): Effect.Effect<number, Log.LogError> =>
  Effect.gen(function* () {
    const known = shared.partitions.get(topic)
    if (known !== undefined) return known
    const metadata = yield* shared.client
      .metadata(topic)
      .pipe(Effect.mapError(fromClient("reading the metadata", { topic, partition: 0 })))
    if (metadata.tablets.length === 0) return yield* logError(new Log.UnknownTopic({ topic }))
    shared.partitions.set(topic, metadata.tablets.length)
    return metadata.tablets.length
  })

/** Checks that `tp` exists. */
export const checkPartition = (
  shared: Shared,
  tp: Models.TopicPartition
): Effect.Effect<Models.TabletId, Log.LogError> =>
  Effect.flatMap(partitionsOf(shared, tp.topic), (partitions) =>
    Number.isInteger(tp.partition) && tp.partition >= 0 && tp.partition < partitions
      ? Effect.succeed({ table: tp.topic, bucket: tp.partition })
      : Effect.fail(logError(new Log.UnknownPartition({ topic: tp.topic, partition: tp.partition, partitions })))
  )

/** A partition's log start and high watermark, from its leader. */
export const offsetsOf = (shared: Shared, tp: Models.TopicPartition) =>
  Effect.gen(function* () {
    const tablet = yield* checkPartition(shared, tp)
    const key = `${tp.topic}:${tp.partition}`
    // Asked at the log end last seen, the leader answers with its bounds and (almost always) no records.
    const ask = (offset: number) => shared.client.read(tablet, offset, 1)
    let page = yield* Effect.result(ask(shared.ends.get(key) ?? 0))
    if (page._tag === "Failure") {
      const r = page.failure.reason
      if (r._tag !== "ReplicaError" || r.reason._tag !== "OffsetOutOfRange") {
        return yield* fromClient("reading the offsets", tp)(page.failure)
      }
      page = yield* Effect.result(ask(r.reason.highwater))
      if (page._tag === "Failure") return yield* fromClient("reading the offsets", tp)(page.failure)
    }
    shared.ends.set(key, page.success.logEndOffset)
    return {
      topic: tp.topic,
      partition: tp.partition,
      logStart: page.success.logStartOffset,
      highwater: page.success.highWatermark
    }
  })
