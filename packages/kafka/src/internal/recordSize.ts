/**
 * Record sizes as a produce request carries them (record batch format v2, uncompressed, as the adapter sends), for
 * keeping each request within the brokers' limits. A topic's `max.message.bytes` (the broker's `message.max.bytes`
 * unless the topic sets its own) bounds each record batch, and a request holds one batch per partition; the broker
 * refuses the whole batch, so every record in it, when the batch is over.
 *
 * @internal
 */
import type { Log } from "@strata/core"
import type { RequestSize } from "./sendQueue.js"

/** A record batch's own bytes: base offset and length (12), then the v2 header (49). */
export const BATCH_OVERHEAD = 61
/** Kafka's default `message.max.bytes`, for a topic whose limit cannot be read. */
export const DEFAULT_MESSAGE_MAX_BYTES = 1_048_588
/** Most record bytes of one request, all partitions together: well under Kafka's `socket.request.max.bytes` (100 MiB). */
export const MAX_REQUEST_BYTES = 64 * 1024 * 1024
/** The most a record's varints take: length, timestamp delta (64-bit), offset delta, key and value lengths, headers. */
const RECORD_VARINTS = 5 + 1 + 10 + 5 + 5 + 5 + 5
/** The most a header's two length varints take. */
const HEADER_VARINTS = 10

/** Bytes of a zigzag varint holding the 32-bit integer `n`. */
const varintBytes = (n: number): number => {
  let z = n >= 0 ? 2 * n : -2 * n - 1
  let bytes = 1
  while (z >= 128) {
    z = Math.floor(z / 128)
    bytes++
  }
  return bytes
}

/** A nullable byte field: its length varint (-1 for null) and its bytes. */
const fieldBytes = (b: Uint8Array | null): number => (b === null ? 1 : varintBytes(b.length) + b.length)

/** The last header key measured: records mostly repeat one (a changelog's `strata-source`). */
let lastKey = ""
let lastKeyBytes = 0
const keyBytes = (key: string): number => {
  if (key !== lastKey) {
    lastKey = key
    lastKeyBytes = Buffer.byteLength(key, "utf8")
  }
  return lastKeyBytes
}

/** Key, value and header bytes of a record (what `maxRecordBytes` limits). */
export const payloadBytes = (r: Log.ProducerRecord): number => {
  let n = (r.key?.length ?? 0) + (r.value?.length ?? 0)
  const headers = r.headers
  if (headers !== undefined) {
    for (let i = 0; i < headers.length; i++) n += keyBytes(headers[i]!.key) + headers[i]!.value.length
  }
  return n
}

/** The most bytes a record's varints take (each at its largest). */
export const varintsBound = (r: Log.ProducerRecord): number =>
  RECORD_VARINTS + (r.headers === undefined ? 0 : HEADER_VARINTS * r.headers.length)

/** The most bytes a record adds to a record batch (its payload, its varints at their largest). */
export const recordBound = (r: Log.ProducerRecord): number => payloadBytes(r) + varintsBound(r)

/** The exact size of a record batch holding only this record (its timestamp and offset deltas are 0). */
export const loneBatchBytes = (r: Log.ProducerRecord): number => {
  const headers = r.headers ?? []
  let body = 3 + fieldBytes(r.key) + fieldBytes(r.value) + varintBytes(headers.length)
  for (const h of headers) {
    const key = Buffer.byteLength(h.key, "utf8")
    body += varintBytes(key) + key + varintBytes(h.value.length) + h.value.length
  }
  return BATCH_OVERHEAD + varintBytes(body) + body
}

/**
 * Measures produce requests as the send queue forms them: a record fits while its partition's batch stays within
 * its topic's limit and the request within `MAX_REQUEST_BYTES`. Per record: a size sum and a lookup, no allocation
 * (one array per topic per request).
 */
export const requestSize = (limitOf: (topic: string) => number): RequestSize<Log.ProducerRecord> => {
  const batches = new Map<string, Array<number>>()
  let total = 0
  // The last topic seen: consecutive records mostly share it.
  let topic: string | undefined
  let limit = 0
  let sizes: Array<number> = []
  return {
    reset: () => {
      batches.clear()
      total = 0
      topic = undefined
    },
    add: (r) => {
      if (r.topic !== topic) {
        topic = r.topic
        limit = limitOf(topic)
        let known = batches.get(topic)
        if (known === undefined) {
          known = []
          batches.set(topic, known)
        }
        sizes = known
      }
      const n = recordBound(r)
      const batch = (sizes[r.partition] ?? BATCH_OVERHEAD) + n
      if (batch > limit || total + n > MAX_REQUEST_BYTES) return false
      sizes[r.partition] = batch
      total += n
      return true
    }
  }
}

/** The largest record batch of a request (by `recordBound`), naming its partition. */
export const largestBatch = (
  records: ReadonlyArray<Log.ProducerRecord>
): { readonly topic: string; readonly partition: number; readonly bytes: number } => {
  const sums = new Map<string, number>()
  let largest = { topic: records[0]?.topic ?? "", partition: records[0]?.partition ?? 0, bytes: 0 }
  for (const r of records) {
    const key = `${r.topic}/${r.partition}`
    const bytes = (sums.get(key) ?? BATCH_OVERHEAD) + recordBound(r)
    sums.set(key, bytes)
    if (bytes > largest.bytes) largest = { topic: r.topic, partition: r.partition, bytes }
  }
  return largest
}
