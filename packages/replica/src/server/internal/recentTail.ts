/**
 * A log's recent tail: the batches it wrote last, as written, kept in memory up to a number of encoded bytes, so
 * that reads at the log end (in-sync followers' fetches, consumers keeping up) are answered without reading storage.
 * Both tablet logs (`TabletLog` on a partition store, `SegmentLog` on segment files) keep one.
 *
 * The tail is contiguous and its last batch ends at the log end: the log drops it on a truncation or a reset, and
 * trims it when its start moves.
 *
 * @since 0.1.0
 */
import * as Codec from "../../wire/internal/batchCodec.js"

/** A batch of the tail, with its encoding's length. */
export interface Entry {
  readonly batch: Codec.Batch
  readonly bytes: number
}

/** A recent tail (mutable: it belongs to one open log and changes only under that log's lock). */
export interface RecentTail {
  /** The most encoded bytes it holds; 0 keeps nothing. */
  readonly limit: number
  entries: Array<Entry>
  /** The encodings' bytes in `entries`. */
  bytes: number
}

/** An empty tail holding up to `limit` encoded bytes (0: none). */
export const make = (limit: number): RecentTail => ({ limit, entries: [], bytes: 0 })

/** Forgets every batch (a truncation or a reset changed what the log ends with). */
export const drop = (t: RecentTail): void => {
  t.entries = []
  t.bytes = 0
}

const endOf = (b: Codec.Batch) => b.baseOffset + Codec.countOf(b)

/**
 * Notes batches just written at the log end (each with its encoding's length; emptied first unless they follow what
 * it holds), then lets the oldest go while it holds more than its limit.
 */
export const note = (t: RecentTail, written: ReadonlyArray<Entry>): void => {
  if (t.limit === 0) return
  const last = t.entries.at(-1)
  const first = written[0]
  if (last !== undefined && first !== undefined && endOf(last.batch) !== first.batch.baseOffset) drop(t)
  for (const entry of written) {
    t.entries.push(entry)
    t.bytes += entry.bytes
  }
  let gone = 0
  while (gone < t.entries.length && t.bytes > t.limit) t.bytes -= t.entries[gone++]!.bytes
  if (gone > 0) t.entries.splice(0, gone)
}

/** Lets the batches wholly below `offset` go. */
export const trimBelow = (t: RecentTail, offset: number): void => {
  let gone = 0
  while (gone < t.entries.length && endOf(t.entries[gone]!.batch) <= offset) t.bytes -= t.entries[gone++]!.bytes
  if (gone > 0) t.entries.splice(0, gone)
}

/** Records `skip`.. of a batch, its producer stamp's sequence moved along with them. */
export const sliced = (b: Codec.Batch, skip: number): Codec.Batch => {
  const cut = { baseOffset: b.baseOffset + skip, epoch: b.epoch, records: b.records.slice(skip) }
  return b.producer === undefined ? cut : { ...cut, producer: { ...b.producer, sequence: b.producer.sequence + skip } }
}

/**
 * A log's read from `from` (below the log end) when the tail holds it, else `undefined`: whole batches from the one
 * holding `from` while their encodings fit in `maxBytes`, the first one whatever its size, records before `from`
 * cut off.
 */
export const read = (t: RecentTail, from: number, maxBytes: number): Array<Codec.Batch> | undefined => {
  const entries = t.entries
  if (entries.length === 0 || from < entries[0]!.batch.baseOffset || from >= endOf(entries.at(-1)!.batch)) {
    return undefined
  }
  // The last batch starting at or before `from`.
  let lo = 0
  let hi = entries.length - 1
  while (lo < hi) {
    const mid = (lo + hi + 1) >>> 1
    if (entries[mid]!.batch.baseOffset <= from) lo = mid
    else hi = mid - 1
  }
  const out: Array<Codec.Batch> = []
  let bytes = 0
  for (let i = lo; i < entries.length; i++) {
    const entry = entries[i]!
    if (out.length > 0 && bytes + entry.bytes > maxBytes) break
    out.push(entry.batch)
    bytes += entry.bytes
  }
  const first = out[0]!
  if (first.baseOffset < from) out[0] = sliced(first, from - first.baseOffset)
  return out
}
