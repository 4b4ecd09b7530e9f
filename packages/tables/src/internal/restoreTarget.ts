/**
 * What recovery restores into: the open table partitions' stores. Each batch of changelog records is written as
 * one atomic store write with the offset of its last record and the source offsets its `strata-source` headers
 * name, so after a restore the store says where to resume each source partition.
 *
 * Every record is checked before anything of its batch is written: its key and value against the store's limits (the
 * same checks a store makes), and, for a table registered with a schema, decoded by the table's codecs. A record that
 * fails either fails the batch with `BadChangelogRecord` naming its offset, or, with `badRecords: "dead-letter"`, is
 * sent to the dead-letter topic (with headers naming where it came from and why) and skipped.
 *
 * @internal
 */
import { type Log, Models, Recovery, Store, StoreValidation } from "@strata/core"
import { Effect } from "effect"
import type { Codecs } from "../Table.js"
import * as PartitionWrites from "./partitionWrites.js"

/** The header `process` stamps on every changelog record: the source record it came from. */
const SOURCE_HEADER = "strata-source"

const decoder = new TextDecoder()

/** The `strata-source` header's text up to the offset, `["topic",partition,`, of a source partition. */
export const sourceHeaderPrefix = (source: Models.TopicPartition): string =>
  `${JSON.stringify([source.topic, source.partition]).slice(0, -1)},`

/** The `strata-source` header of a source record: `["topic",partition,offset]`, from its partition's prefix. */
export const sourceHeaderAt = (prefix: string, offset: number): Log.Header => ({
  key: SOURCE_HEADER,
  value: Buffer.from(`${prefix}${offset}]`, "utf8")
})

/** The value of a record's `strata-source` header, if it has one. */
const sourceHeaderOf = (headers: ReadonlyArray<Log.Header>): Uint8Array | undefined => {
  for (const h of headers) if (h.key === SOURCE_HEADER) return h.value
  return undefined
}

/** The source record a `strata-source` header's text names (`["topic",partition,offset]`), if it is one. */
const parseSource = (text: string): Models.TopicPartitionOffset | undefined => {
  try {
    const [topic, partition, offset] = JSON.parse(text) as [unknown, unknown, unknown]
    return typeof topic === "string" && Number.isSafeInteger(partition) && Number.isSafeInteger(offset)
      ? { topic, partition: partition as number, offset: offset as number }
      : undefined
  } catch {
    return undefined
  }
}

/** Longest run of offset digits read from bytes: 15 decimal digits always fit a safe integer. */
const MAX_DIGITS = 15

/** In a header ending `,<digits>]`, the index of that comma; -1 for any other shape. */
const sourceOffsetComma = (v: Uint8Array): number => {
  const close = v.length - 1
  if (close < 2 || v[close] !== 0x5d) return -1
  let i = close - 1
  while (i >= 0 && close - i <= MAX_DIGITS && v[i]! >= 0x30 && v[i]! <= 0x39) i--
  return i >= 0 && i < close - 1 && v[i] === 0x2c ? i : -1
}

/** The decimal number written in `v[from, to)` (ASCII digits only, checked by `sourceOffsetComma`). */
const digitsAt = (v: Uint8Array, from: number, to: number): number => {
  let n = 0
  for (let i = from; i < to; i++) n = n * 10 + (v[i]! - 0x30)
  return n
}

/** Whether `a` and `b` (both at least `length` long) agree on their first `length` bytes. */
const samePrefix = (a: Uint8Array, b: Uint8Array, length: number): boolean => {
  if (a === b) return true
  for (let i = 0; i < length; i++) if (a[i] !== b[i]) return false
  return true
}

/** What the target needs from the table manager. */
export interface RestoreTargetDeps {
  /** The open partition a changelog partition restores into. */
  readonly partitionOf: (tp: Models.TopicPartition) => PartitionWrites.PartitionWrites | undefined
  /** Flushes every table buffer and the producer, before recovery reads persisted offsets. */
  readonly flushAll: Effect.Effect<void, Recovery.RestoreFailed>
  /** Highest source offset (next to read) replayed from changelog headers, by source partition; updated here. */
  readonly replayed: Map<string, number>
  /** The store's limits: a record beyond them cannot be restored. */
  readonly limits: Store.Limits
  /** The key and value codecs of a changelog partition's table, if it has them. */
  readonly codecsOf: (tp: Models.TopicPartition) => Codecs<unknown, unknown> | undefined
  /** What to do with a record that cannot be restored: fail the partition's restore, or dead-letter it and go on. */
  readonly badRecords: "fail" | "dead-letter"
  /** Sends records that cannot be restored to the dead-letter topic, with why; waits for their acks. */
  readonly deadLetter: (
    records: ReadonlyArray<{ readonly record: Log.Record; readonly detail: string }>
  ) => Effect.Effect<void, Recovery.RestoreFailed>
}

/** Why a changelog record cannot be restored, if it cannot. */
export const badRecordDetail = (
  record: Log.Record,
  limits: Store.Limits,
  codecs: Codecs<unknown, unknown> | undefined
): string | undefined => {
  if (record.key === null) return "the record has no key"
  const key = StoreValidation.checkKey(record.key, limits)
  if (key !== undefined) return key.message
  if (record.value !== null) {
    const value = StoreValidation.checkValue(record.value, limits)
    if (value !== undefined) return value.message
  }
  if (codecs === undefined) return undefined
  const k = codecs.checkKey(record.key)
  if (k !== undefined) return k.message
  return record.value === null ? undefined : codecs.checkValue(record.value)?.message
}

/**
 * Sends records that cannot be restored to `topic` (made when first needed), each with its headers and two more:
 * `strata-dead-letter-from` (`[topic, partition, offset]`) and `strata-dead-letter-reason`.
 */
export const deadLetters = (log: Log.Shape, topic: string): RestoreTargetDeps["deadLetter"] => {
  let made = false
  return (bad) =>
    Effect.gen(function* () {
      if (!made) {
        yield* log.ensureTopic({ topic, partitions: 1 })
        made = true
      }
      yield* log.produceBatch(
        bad.map(({ record, detail }) => ({
          topic,
          partition: 0,
          key: record.key,
          value: record.value,
          headers: [
            ...record.headers,
            {
              key: "strata-dead-letter-from",
              value: Buffer.from(JSON.stringify([record.topic, record.partition, record.offset]))
            },
            { key: "strata-dead-letter-reason", value: Buffer.from(detail) }
          ]
        }))
      )
    }).pipe(
      Effect.mapError((e) =>
        restoreFailed(bad[0]!.record, `sending a record that cannot be restored to ${topic}: ${e.message}`)
      )
    )
}

const restoreFailed = (tp: Models.TopicPartition, detail: string) =>
  new Recovery.RestoreFailed({ topic: tp.topic, partition: tp.partition, detail })

/** Applies changelog records to a partition's store with their offset (and the source offsets they carry). */
const applyRecords = (
  deps: RestoreTargetDeps,
  tp: Models.TopicPartition,
  w: PartitionWrites.PartitionWrites,
  records: ReadonlyArray<Log.Record>
): Effect.Effect<Recovery.ApplyResult, Recovery.RestoreFailed | Recovery.BadChangelogRecord> =>
  Effect.gen(function* () {
    if (records.length === 0) return NOTHING_SKIPPED
    const codecs = deps.codecsOf(tp)
    const bad: Array<{ readonly record: Log.Record; readonly detail: string }> = []
    for (const r of records) {
      const detail = badRecordDetail(r, deps.limits, codecs)
      if (detail === undefined) continue
      if (deps.badRecords === "fail") {
        return yield* Effect.fail(
          new Recovery.BadChangelogRecord({ topic: tp.topic, partition: tp.partition, offset: r.offset, detail })
        )
      }
      bad.push({ record: r, detail })
    }
    // Set aside before the batch's offset passes them: a crash in between dead-letters them again, never loses them.
    if (bad.length > 0) yield* deps.deadLetter(bad)
    const skipped = bad.length === 0 ? undefined : new Set(bad.map((b) => b.record))
    const ops: Array<Store.Op> = new Array(records.length)
    let n = 0
    // Per source partition (the header's `["topic",partition,` prefix), the highest source offset seen: the
    // offset is read from the header's bytes and the prefix decoded only when it differs from the previous one.
    const highest = new Map<string, number>()
    let lastPrefix: Uint8Array | undefined
    let lastPrefixLength = -1
    let lastPrefixText = ""
    for (const r of records) {
      if (r.key === null || skipped?.has(r) === true) continue
      ops[n++] = r.value === null ? Store.del(r.key) : Store.put(r.key, r.value)
      // The buffered change of a key, if any, is older than the changelog record: drop it.
      if (w.dirty.size > 0 || w.cache.size > 0) {
        const id = PartitionWrites.keyId(r.key)
        w.dirty.delete(id)
        PartitionWrites.forget(w, id)
      }
      const header = sourceHeaderOf(r.headers)
      if (header === undefined) continue
      const comma = sourceOffsetComma(header)
      let prefix: string
      let offset: number
      if (comma < 0) {
        // Not the usual shape: the general path.
        const text = decoder.decode(header)
        const at = text.lastIndexOf(",")
        offset = Number(text.slice(at + 1, -1))
        prefix = text.slice(0, at + 1)
      } else {
        offset = digitsAt(header, comma + 1, header.length - 1)
        if (lastPrefix === undefined || lastPrefixLength !== comma + 1 || !samePrefix(lastPrefix, header, comma + 1)) {
          lastPrefix = header
          lastPrefixLength = comma + 1
          lastPrefixText = decoder.decode(header.subarray(0, comma + 1))
        }
        prefix = lastPrefixText
      }
      if (Number.isSafeInteger(offset) && offset > (highest.get(prefix) ?? -1)) highest.set(prefix, offset)
    }
    ops.length = n
    const sources: Array<Models.TopicPartitionOffset> = []
    for (const [prefix, offset] of highest) {
      const from = parseSource(`${prefix}${offset}]`)
      // A header naming no valid source (not written by `process`) is ignored, not a reason to fail the restore.
      if (from === undefined || StoreValidation.checkOffsets([from]) !== undefined) continue
      const key = Models.tpKey(from)
      const seen = Math.max(deps.replayed.get(key) ?? 0, from.offset + 1)
      deps.replayed.set(key, seen)
      sources.push({ topic: from.topic, partition: from.partition, offset: seen })
    }
    const last = records[records.length - 1]!.offset
    w.storeVersion++
    yield* w.store
      .write(ops, { offsets: [{ topic: tp.topic, partition: tp.partition, offset: last }, ...sources] })
      .pipe(Effect.mapError((e) => restoreFailed(tp, e.message)))
    w.persisted = last
    return bad.length === 0
      ? NOTHING_SKIPPED
      : { skipped: bad.map((b) => ({ offset: b.record.offset, detail: b.detail })) }
  })

const NOTHING_SKIPPED: Recovery.ApplyResult = { skipped: [] }

/** The restore target over the table manager's open partitions. */
export const make = (deps: RestoreTargetDeps): Recovery.RestoreTarget => {
  const partition = (tp: Models.TopicPartition) =>
    Effect.suspend(() => {
      const w = deps.partitionOf(tp)
      return w === undefined
        ? Effect.fail(restoreFailed(tp, "the changelog partition's table partition is not open here"))
        : Effect.succeed(w)
    })
  return {
    persistedOffset: (tp) =>
      Effect.flatMap(partition(tp), (w) =>
        w.store.persistedOffset(tp).pipe(Effect.mapError((e) => restoreFailed(tp, e.message)))
      ),
    apply: (tp, records) =>
      Effect.flatMap(partition(tp), (w) => PartitionWrites.exclusive(w, applyRecords(deps, tp, w, records))),
    wipe: (tp) =>
      Effect.flatMap(partition(tp), (w) =>
        Effect.suspend(() => {
          PartitionWrites.discard(w)
          w.cache.clear()
          w.storeVersion++
          w.persisted = undefined
          return w.store.clear.pipe(Effect.mapError((e) => restoreFailed(tp, e.message)))
        })
      ),
    flush: deps.flushAll,
    failed: (tp, reason) =>
      Effect.sync(() => {
        const w = deps.partitionOf(tp)
        if (w !== undefined) w.failure = reason
      })
  }
}
