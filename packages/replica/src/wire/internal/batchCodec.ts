/**
 * The byte layout of a tablet log's batches and keys in its partition store.
 *
 * Keys: `0x01` + base offset (8 bytes, big-endian) for a batch, `0x02` + name for the log's own fields, `0x03` +
 * epoch (4 bytes, big-endian) for a leader-epoch cache entry, `0x04` + producer id (f64) for a producer's entry;
 * big-endian numbers sort as the store orders keys.
 * A batch: epoch (u32), record count (u32), a producer flag (u8; when 1: producer id f64, producer epoch u32, first
 * sequence u32), then per record a timestamp (f64), a key (i32 length, -1 for none), a value (u32 length), the
 * headers (u16 count; each a u16-length UTF-8 key and a u32-length value).
 * A producer entry: producer epoch (u32), batch count (u8), per batch first and last sequence (u32 each), base and
 * last offset (f64 each).
 *
 * @internal
 */
import type * as ReplicaManager from "../../protocol/ReplicaManager.js"
import type { Entry, Producer } from "../../machines/ProducerState.js"

/** One record of a tablet. */
export type TabletRecord = ReplicaManager.TabletRecord

/** A batch as stored: its base offset, the leader epoch that wrote it, its records, its producer's stamp. */
export type Batch = ReplicaManager.TabletBatch

const encoder = new TextEncoder()
const decoder = new TextDecoder()

/** The store key of the batch starting at `baseOffset`. */
export const batchKey = (baseOffset: number): Uint8Array => {
  const key = new Uint8Array(9)
  key[0] = 0x01
  new DataView(key.buffer).setBigUint64(1, BigInt(baseOffset))
  return key
}

/** The base offset a batch key names. */
export const offsetOfBatchKey = (key: Uint8Array): number =>
  Number(new DataView(key.buffer, key.byteOffset, key.byteLength).getBigUint64(1))

/** The first and the past-the-last key of the batch range. */
export const BATCHES = { gte: Uint8Array.of(0x01), lt: Uint8Array.of(0x02) } as const

/** The store key of one of the log's fields. */
export const fieldKey = (name: "hw" | "start" | "end" | "bytes"): Uint8Array =>
  Uint8Array.of(0x02, ...encoder.encode(name))

/** The store key of the epoch cache entry of `epoch`. */
export const epochKey = (epoch: number): Uint8Array => {
  const key = new Uint8Array(5)
  key[0] = 0x03
  new DataView(key.buffer).setUint32(1, epoch)
  return key
}

/** The epoch an epoch key names. */
export const epochOfKey = (key: Uint8Array): number =>
  new DataView(key.buffer, key.byteOffset, key.byteLength).getUint32(1)

/** The epoch-cache key range. */
export const EPOCHS = { gte: Uint8Array.of(0x03), lt: Uint8Array.of(0x04) } as const

/** The store key of producer `id`'s entry. */
export const producerKey = (id: number): Uint8Array => {
  const key = new Uint8Array(9)
  key[0] = 0x04
  new DataView(key.buffer).setFloat64(1, id)
  return key
}

/** The producer id a producer key names. */
export const producerOfKey = (key: Uint8Array): number =>
  new DataView(key.buffer, key.byteOffset, key.byteLength).getFloat64(1)

/** The producer-entry key range. */
export const PRODUCERS = { gte: Uint8Array.of(0x04), lt: Uint8Array.of(0x05) } as const

/** The bytes of a producer's entry. */
export const encodeProducer = (entry: Entry): Uint8Array => {
  const out = new Uint8Array(5 + entry.batches.length * 24)
  const view = new DataView(out.buffer)
  view.setUint32(0, entry.epoch)
  view.setUint8(4, entry.batches.length)
  entry.batches.forEach((b, i) => {
    const at = 5 + i * 24
    view.setUint32(at, b.firstSequence)
    view.setUint32(at + 4, b.lastSequence)
    view.setFloat64(at + 8, b.baseOffset)
    view.setFloat64(at + 16, b.lastOffset)
  })
  return out
}

/** A producer's entry back, or why it cannot be read. */
export const decodeProducer = (bytes: Uint8Array): Entry | string => {
  if (bytes.length < 5) return `a producer entry of ${bytes.length} bytes`
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  const count = view.getUint8(4)
  if (bytes.length !== 5 + count * 24) return `a producer entry of ${bytes.length} bytes for ${count} batches`
  const batches = Array.from({ length: count }, (_, i) => ({
    firstSequence: view.getUint32(5 + i * 24),
    lastSequence: view.getUint32(9 + i * 24),
    baseOffset: view.getFloat64(13 + i * 24),
    lastOffset: view.getFloat64(21 + i * 24)
  }))
  return { epoch: view.getUint32(0), batches }
}

/** An offset as 8 bytes. */
export const encodeOffset = (offset: number): Uint8Array => {
  const bytes = new Uint8Array(8)
  new DataView(bytes.buffer).setBigUint64(0, BigInt(offset))
  return bytes
}

/** 8 bytes as an offset, `undefined` for anything else. */
export const decodeOffset = (bytes: Uint8Array): number | undefined =>
  bytes.length === 8 ? Number(new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0)) : undefined

/**
 * The encoded records of the record arrays this module decoded or encoded: a batch's records travel from the wire
 * to the store and from the store to the wire as they are, so encoding them again (under another epoch or producer
 * stamp) is one copy of their bytes behind a new header, not a pass over every record. Record arrays are never
 * changed once made, so the bytes stay theirs.
 */
const encodedRecords = new WeakMap<ReadonlyArray<TabletRecord>, Uint8Array>()

/**
 * The whole batch each record array was last decoded from or encoded into: encoded again under the same header, it
 * is those bytes.
 */
const wholeBatch = new WeakMap<ReadonlyArray<TabletRecord>, Uint8Array>()

/**
 * Record arrays decoded from bytes nothing else holds (a request's, fresh off the wire): the first encoding of one
 * under another header of the same length writes that header over the bytes' own, instead of copying the records
 * behind a new one. Only the first: the bytes may be kept (written, served) as that encoding from then on.
 */
const adoptable = new WeakSet<ReadonlyArray<TabletRecord>>()

/**
 * Lets the next encoding of `records`, decoded by `decodeBatch` from bytes nothing else holds or will read again,
 * take those bytes over (see `adoptable`).
 */
export const adopt = (records: ReadonlyArray<TabletRecord>): void => {
  if (wholeBatch.has(records)) adoptable.add(records)
}

/** Whether `bytes` starts with the header `epoch`, `count`, `producer` would be written as. */
const sameHeader = (bytes: Uint8Array, epoch: number, count: number, producer: Producer | undefined) => {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  if (view.getUint32(0) !== epoch || view.getUint32(4) !== count) return false
  if (producer === undefined) return view.getUint8(8) === 0
  return (
    view.getUint8(8) === 1 &&
    view.getFloat64(9) === producer.id &&
    view.getUint32(17) === producer.epoch &&
    view.getUint32(21) === producer.sequence
  )
}

/** Bytes to fill completely: not zeroed first. */
const uninitialized = (size: number): Uint8Array => Buffer.allocUnsafe(size)

/** A batch's header: epoch, record count, producer flag and stamp. */
const writeHeader = (view: DataView, epoch: number, count: number, producer: Producer | undefined): number => {
  view.setUint32(0, epoch)
  view.setUint32(4, count)
  if (producer === undefined) {
    view.setUint8(8, 0)
    return 9
  }
  view.setUint8(8, 1)
  view.setFloat64(9, producer.id)
  view.setUint32(17, producer.epoch)
  view.setUint32(21, producer.sequence)
  return 25
}

/**
 * Header keys are few and repeat on every record (a changelog's `strata-source`, a tracing key): each is encoded and
 * decoded once, not once per record. At most `HEADER_KEYS` of them are kept, each at most `HEADER_KEY_BYTES` long;
 * past that they are encoded and decoded every time.
 */
const HEADER_KEYS = 32
const HEADER_KEY_BYTES = 64
const headerKeyEncodings = new Map<string, Uint8Array>()
const headerKeyStrings: Array<{ readonly bytes: Uint8Array; readonly key: string }> = []

/** A header key's UTF-8 bytes (never changed by the caller: the same array is handed out again). */
const headerKeyBytes = (key: string): Uint8Array => {
  const known = headerKeyEncodings.get(key)
  if (known !== undefined) return known
  const bytes = encoder.encode(key)
  if (bytes.length <= HEADER_KEY_BYTES && headerKeyEncodings.size < HEADER_KEYS) headerKeyEncodings.set(key, bytes)
  return bytes
}

/** The header key of `length` bytes at `at` in `bytes`. */
const headerKeyOf = (bytes: Uint8Array, at: number, length: number): string => {
  if (length > HEADER_KEY_BYTES) return decoder.decode(bytes.subarray(at, at + length))
  for (const known of headerKeyStrings) {
    const k = known.bytes
    if (k.length !== length) continue
    let i = 0
    while (i < length && k[i] === bytes[at + i]) i++
    if (i === length) return known.key
  }
  const key = decoder.decode(bytes.subarray(at, at + length))
  if (headerKeyStrings.length < HEADER_KEYS) headerKeyStrings.push({ bytes: bytes.slice(at, at + length), key })
  return key
}

/** The bytes a batch takes in the store. */
export const encodeBatch = (
  epoch: number,
  records: ReadonlyArray<TabletRecord>,
  producer?: Producer | undefined
): Uint8Array => {
  const whole = wholeBatch.get(records)
  if (whole !== undefined && sameHeader(whole, epoch, records.length, producer)) return whole
  if (whole !== undefined && adoptable.delete(records) && (whole[8] === 1) === (producer !== undefined)) {
    writeHeader(new DataView(whole.buffer, whole.byteOffset, whole.byteLength), epoch, records.length, producer)
    return whole
  }
  const known = encodedRecords.get(records)
  if (known !== undefined) {
    const out = uninitialized((producer === undefined ? 9 : 25) + known.length)
    out.set(
      known,
      writeHeader(new DataView(out.buffer, out.byteOffset, out.byteLength), epoch, records.length, producer)
    )
    wholeBatch.set(records, out)
    return out
  }
  // Header keys are the only part that needs encoding first (most records have none, and the others repeat a few
  // keys, each encoded once: `headerKeyBytes`).
  let size = producer === undefined ? 9 : 25
  for (let i = 0; i < records.length; i++) {
    const r = records[i]!
    size += 18 + (r.key === null ? 0 : r.key.length) + r.value.length
    const headers = r.headers
    for (let j = 0; j < headers.length; j++) {
      size += 6 + headerKeyBytes(headers[j]!.key).length + headers[j]!.value.length
    }
  }
  const out = uninitialized(size)
  const view = new DataView(out.buffer, out.byteOffset, out.byteLength)
  const header = writeHeader(view, epoch, records.length, producer)
  let at = header
  for (let i = 0; i < records.length; i++) {
    const r = records[i]!
    view.setFloat64(at, r.timestamp)
    if (r.key === null) {
      view.setInt32(at + 8, -1)
      at += 12
    } else {
      view.setInt32(at + 8, r.key.length)
      out.set(r.key, at + 12)
      at += 12 + r.key.length
    }
    view.setUint32(at, r.value.length)
    out.set(r.value, at + 4)
    at += 4 + r.value.length
    view.setUint16(at, r.headers.length)
    at += 2
    for (let j = 0; j < r.headers.length; j++) {
      const k = headerKeyBytes(r.headers[j]!.key)
      const v = r.headers[j]!.value
      view.setUint16(at, k.length)
      out.set(k, at + 2)
      at += 2 + k.length
      view.setUint32(at, v.length)
      out.set(v, at + 4)
      at += 4 + v.length
    }
  }
  encodedRecords.set(records, out.subarray(header))
  wholeBatch.set(records, out)
  return out
}

/** The headers of a record that has none: one array for all of them (records are never changed). */
const noHeaders: ReadonlyArray<{ readonly key: string; readonly value: Uint8Array }> = Object.freeze([])

/**
 * A stored batch back, or why it cannot be read. Its values, keys and header values are views of `bytes` (fresh from
 * the wire or the store, and never changed), not copies.
 */
export const decodeBatch = (baseOffset: number, encoded: Uint8Array): Batch | string => {
  try {
    // Records are views of a plain Uint8Array even when `encoded` is a Buffer: a Buffer's `subarray` makes each view
    // through its species constructor, several times the cost of a plain one, and a batch makes several a record.
    const bytes = new Uint8Array(encoded.buffer, encoded.byteOffset, encoded.byteLength)
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
    const length = bytes.length
    let at = 0
    const need = (n: number) => {
      if (at + n > length) throw new Error(`batch at ${baseOffset} ends early (byte ${at} of ${length})`)
    }
    need(9)
    const epoch = view.getUint32(0)
    const count = view.getUint32(4)
    const stamped = view.getUint8(8)
    at = 9
    if (stamped > 1) return `batch at ${baseOffset} has producer flag ${stamped}`
    let producer: Producer | undefined
    if (stamped === 1) {
      need(16)
      producer = { id: view.getFloat64(9), epoch: view.getUint32(17), sequence: view.getUint32(21) }
      at = 25
    }
    const header = at
    // A record takes at least 18 bytes: a count beyond that is corrupt, and must not size an array.
    if (count > (length - at) / 18) return `batch at ${baseOffset} claims ${count} records in ${length} bytes`
    const records: Array<TabletRecord> = new Array(count)
    for (let i = 0; i < count; i++) {
      need(12)
      const timestamp = view.getFloat64(at)
      const keyLength = view.getInt32(at + 8)
      at += 12
      let key: Uint8Array | null = null
      if (keyLength >= 0) {
        need(keyLength)
        key = bytes.subarray(at, at + keyLength)
        at += keyLength
      }
      need(4)
      const valueLength = view.getUint32(at)
      at += 4
      need(valueLength)
      const value = bytes.subarray(at, at + valueLength)
      at += valueLength
      need(2)
      const headerCount = view.getUint16(at)
      at += 2
      let headers = noHeaders
      if (headerCount > 0) {
        const list: Array<{ key: string; value: Uint8Array }> = []
        for (let h = 0; h < headerCount; h++) {
          need(2)
          const keyBytes = view.getUint16(at)
          at += 2
          need(keyBytes)
          const k = headerKeyOf(bytes, at, keyBytes)
          at += keyBytes
          need(4)
          const valueBytes = view.getUint32(at)
          at += 4
          need(valueBytes)
          list.push({ key: k, value: bytes.subarray(at, at + valueBytes) })
          at += valueBytes
        }
        headers = list
      }
      records[i] = { key, value, headers, timestamp }
    }
    if (at !== length) return `batch at ${baseOffset} has ${length - at} bytes past its last record`
    encodedRecords.set(records, encoded.subarray(header))
    wholeBatch.set(records, encoded)
    return producer === undefined ? { baseOffset, epoch, records } : { baseOffset, epoch, records, producer }
  } catch (e) {
    return e instanceof Error ? e.message : String(e)
  }
}

/** What a batch read with `storedBatch` carries besides its fields: its bytes, record count and record bytes. */
interface Stored {
  readonly bytes: Uint8Array
  readonly count: number
  readonly recordBytes: number
}

/** The stored form of the batches `storedBatch` made. */
const stored = new WeakMap<Batch, Stored>()

/**
 * A stored batch back without decoding its records, or why it cannot be read: its layout is checked (every length
 * within the bytes, nothing past the last record, as `decodeBatch` checks it) in one pass that makes nothing, and
 * its `records` are decoded the first time they are asked for. A server passing batches from its log to the wire
 * (`bytesOf`, `countOf`, `recordBytesOf`) never decodes them.
 */
export const storedBatch = (baseOffset: number, bytes: Uint8Array): Batch | string => {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  const length = bytes.length
  if (length < 9) return `batch at ${baseOffset} ends early (byte 0 of ${length})`
  const epoch = view.getUint32(0)
  const count = view.getUint32(4)
  const stamped = view.getUint8(8)
  if (stamped > 1) return `batch at ${baseOffset} has producer flag ${stamped}`
  if (stamped === 1 && length < 25) return `batch at ${baseOffset} ends early (byte 9 of ${length})`
  const producer: Producer | undefined =
    stamped === 1 ? { id: view.getFloat64(9), epoch: view.getUint32(17), sequence: view.getUint32(21) } : undefined
  let at = stamped === 1 ? 25 : 9
  if (count > (length - at) / 18) return `batch at ${baseOffset} claims ${count} records in ${length} bytes`
  let recordBytes = 0
  for (let i = 0; i < count; i++) {
    if (at + 12 > length) return `batch at ${baseOffset} ends early (byte ${at} of ${length})`
    const keyLength = view.getInt32(at + 8)
    at += 12 + Math.max(0, keyLength)
    if (at + 4 > length) return `batch at ${baseOffset} ends early (byte ${at} of ${length})`
    const valueLength = view.getUint32(at)
    at += 4 + valueLength
    recordBytes += Math.max(0, keyLength) + valueLength
    if (at + 2 > length) return `batch at ${baseOffset} ends early (byte ${at} of ${length})`
    const headerCount = view.getUint16(at)
    at += 2
    for (let h = 0; h < headerCount; h++) {
      if (at + 2 > length) return `batch at ${baseOffset} ends early (byte ${at} of ${length})`
      const keyBytes = view.getUint16(at)
      at += 2 + keyBytes
      if (at + 4 > length) return `batch at ${baseOffset} ends early (byte ${at} of ${length})`
      const valueBytes = view.getUint32(at)
      at += 4 + valueBytes
      recordBytes += keyBytes + valueBytes
    }
  }
  if (at !== length) {
    return at > length
      ? `batch at ${baseOffset} ends early (byte ${length} of ${at})`
      : `batch at ${baseOffset} has ${length - at} bytes past its last record`
  }
  return lazyBatch(baseOffset, epoch, producer, bytes, count, recordBytes)
}

/** A batch of `bytes` (their layout known to be sound), its records decoded the first time they are asked for. */
const lazyBatch = (
  baseOffset: number,
  epoch: number,
  producer: Producer | undefined,
  bytes: Uint8Array,
  count: number,
  recordBytes: number
): Batch => {
  let records: ReadonlyArray<TabletRecord> | undefined
  const batch: Batch = {
    baseOffset,
    epoch,
    get records() {
      if (records === undefined) {
        const decoded = decodeBatch(baseOffset, bytes)
        // The layout is sound: decoding it cannot fail.
        records = typeof decoded === "string" ? [] : decoded.records
      }
      return records
    },
    ...(producer === undefined ? {} : { producer })
  }
  stored.set(batch, { bytes, count, recordBytes })
  return batch
}

/**
 * Batch `b` as `storedBatch` would make it from `bytes`, its encoding (`encodeBatch` of its fields), without checking
 * the layout again: what a log keeps of a batch it just wrote holds those bytes only, not its records.
 */
export const encodedBatch = (b: Batch, bytes: Uint8Array): Batch => {
  const records = b.records
  let headers = 0
  for (let i = 0; i < records.length; i++) headers += records[i]!.headers.length
  // Everything but the records' keys, values and header keys and values: the batch header, 18 bytes a record
  // (timestamp, key and value lengths, header count) and 6 a header (its key and value lengths).
  const framing = (b.producer === undefined ? 9 : 25) + 18 * records.length + 6 * headers
  return lazyBatch(b.baseOffset, b.epoch, b.producer, bytes, records.length, bytes.length - framing)
}

/** A batch's bytes: those it was read from when `storedBatch` made it, else its encoding. */
export const bytesOf = (b: Batch): Uint8Array => stored.get(b)?.bytes ?? encodeBatch(b.epoch, b.records, b.producer)

/** How many records a batch has, without decoding a stored one. */
export const countOf = (b: Batch): number => stored.get(b)?.count ?? b.records.length

/**
 * The bytes of a stored batch's keys, values and header keys and values (header keys as UTF-8); `undefined` for a
 * batch `storedBatch` did not make.
 */
export const recordBytesOf = (b: Batch): number | undefined => stored.get(b)?.recordBytes
