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
import type * as core from "@strata/core"
import type { Entry, Producer } from "../ProducerState.js"

/** One record of a tablet. */
export type TabletRecord = core.TabletRecord

/** A batch as stored: its base offset, the leader epoch that wrote it, its records, its producer's stamp. */
export type Batch = core.TabletBatch

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
export const fieldKey = (name: "hw" | "start" | "end"): Uint8Array => Uint8Array.of(0x02, ...encoder.encode(name))

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

/** The whole batch each decoded record array came in: encoded again under the same header, it is those bytes. */
const decodedFrom = new WeakMap<ReadonlyArray<TabletRecord>, Uint8Array>()

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

/** The bytes a batch takes in the store. */
export const encodeBatch = (
  epoch: number,
  records: ReadonlyArray<TabletRecord>,
  producer?: Producer | undefined
): Uint8Array => {
  const whole = decodedFrom.get(records)
  if (whole !== undefined && sameHeader(whole, epoch, records.length, producer)) return whole
  const known = encodedRecords.get(records)
  if (known !== undefined) {
    const out = uninitialized((producer === undefined ? 9 : 25) + known.length)
    out.set(
      known,
      writeHeader(new DataView(out.buffer, out.byteOffset, out.byteLength), epoch, records.length, producer)
    )
    return out
  }
  const headerKeys = records.map((r) => r.headers.map((h) => encoder.encode(h.key)))
  let size = producer === undefined ? 9 : 25
  records.forEach((r, i) => {
    size += 8 + 4 + (r.key?.length ?? 0) + 4 + r.value.length + 2
    r.headers.forEach((h, j) => {
      size += 2 + headerKeys[i]![j]!.length + 4 + h.value.length
    })
  })
  const out = uninitialized(size)
  const view = new DataView(out.buffer, out.byteOffset, out.byteLength)
  const header = writeHeader(view, epoch, records.length, producer)
  let at = header
  const bytes = (b: Uint8Array) => {
    out.set(b, at)
    at += b.length
  }
  records.forEach((r, i) => {
    view.setFloat64(at, r.timestamp)
    at += 8
    view.setInt32(at, r.key === null ? -1 : r.key.length)
    at += 4
    if (r.key !== null) bytes(r.key)
    view.setUint32(at, r.value.length)
    at += 4
    bytes(r.value)
    view.setUint16(at, r.headers.length)
    at += 2
    r.headers.forEach((h, j) => {
      const k = headerKeys[i]![j]!
      view.setUint16(at, k.length)
      at += 2
      bytes(k)
      view.setUint32(at, h.value.length)
      at += 4
      bytes(h.value)
    })
  })
  encodedRecords.set(records, out.subarray(header))
  return out
}

/** Reads numbers and byte strings in order, throwing when the bytes end early. */
const reader = (bytes: Uint8Array, baseOffset: number) => {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  let at = 0
  const need = (n: number) => {
    if (at + n > bytes.length) throw new Error(`batch at ${baseOffset} ends early (byte ${at} of ${bytes.length})`)
  }
  const take = <A>(n: number, read: (at: number) => A): A => {
    need(n)
    const a = read(at)
    at += n
    return a
  }
  return {
    u8: () => take(1, (i) => view.getUint8(i)),
    u16: () => take(2, (i) => view.getUint16(i)),
    u32: () => take(4, (i) => view.getUint32(i)),
    i32: () => take(4, (i) => view.getInt32(i)),
    f64: () => take(8, (i) => view.getFloat64(i)),
    // Views, not copies: a decoded batch's bytes are its own (fresh from the wire or the store) and never changed.
    bytes: (n: number) => take(n, (i) => bytes.subarray(i, i + n)),
    at: () => at,
    left: () => bytes.length - at
  }
}

/** A stored batch back, or why it cannot be read. */
export const decodeBatch = (baseOffset: number, bytes: Uint8Array): Batch | string => {
  try {
    const r = reader(bytes, baseOffset)
    const epoch = r.u32()
    const count = r.u32()
    const stamped = r.u8()
    if (stamped > 1) return `batch at ${baseOffset} has producer flag ${stamped}`
    const producer = stamped === 1 ? { id: r.f64(), epoch: r.u32(), sequence: r.u32() } : undefined
    const header = r.at()
    const records: Array<TabletRecord> = []
    for (let i = 0; i < count; i++) {
      const timestamp = r.f64()
      const keyLength = r.i32()
      const key = keyLength < 0 ? null : r.bytes(keyLength)
      const value = r.bytes(r.u32())
      const headers: Array<{ key: string; value: Uint8Array }> = []
      for (let h = r.u16(); h > 0; h--) {
        const k = decoder.decode(r.bytes(r.u16()))
        headers.push({ key: k, value: r.bytes(r.u32()) })
      }
      records.push({ key, value, headers, timestamp })
    }
    if (r.left() !== 0) return `batch at ${baseOffset} has ${r.left()} bytes past its last record`
    encodedRecords.set(records, bytes.subarray(header))
    decodedFrom.set(records, bytes)
    return producer === undefined ? { baseOffset, epoch, records } : { baseOffset, epoch, records, producer }
  } catch (e) {
    return e instanceof Error ? e.message : String(e)
  }
}
