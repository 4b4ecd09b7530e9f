/**
 * The durable log of one tablet replica on core's `Store` protocol (memory, LevelDB or RocksDB): its batches of
 * records, each stamped with the leader epoch that wrote it; its log start and end offsets; its high-watermark
 * checkpoint; and its leader-epoch cache, written in the same atomic batch as the records it covers. After a crash
 * it reopens to a prefix of what was appended (every change is one atomic store write), never a torn batch.
 *
 * It also keeps each idempotent producer's entry (`ProducerState`), written with the batches that change it: an
 * append stamped with a producer is checked against it, a retry of a recent batch answers that batch's offsets
 * without a second copy, and truncation takes the entries back with the records (looking further back in the log
 * for a producer whose recent batches were all cut).
 *
 * Its size is exact: the bytes of the batches it holds as stored (their encoded records and headers; not the store's
 * keys, its own overhead or compaction), kept as a field written in the same atomic write as the batches it counts.
 *
 * Offsets are dense from the log start. Every operation runs alone (one at a time per log).
 *
 * @since 0.1.0
 */
import { Models, Store } from "@strata/core"
import { Clock, Data, Effect, Option, Semaphore, Stream } from "effect"
import * as Codec from "../wire/internal/batchCodec.js"
import * as LeaderEpochCache from "../machines/LeaderEpochCache.js"
import * as ProducerState from "../machines/ProducerState.js"
import type * as ReplicaManager from "../protocol/ReplicaManager.js"
import * as RecentTail from "./internal/recentTail.js"

export type { Batch, TabletRecord } from "../wire/internal/batchCodec.js"

/**
 * Why a tablet log operation failed.
 *
 * @since 0.1.0
 */
export class TabletLogError extends Data.TaggedError("TabletLogError")<{
  readonly tablet: string
  readonly reason:
    | { readonly _tag: "StoreFailed"; readonly cause: Store.StoreError }
    | { readonly _tag: "OffsetOutOfRange"; readonly offset: number; readonly start: number; readonly end: number }
    | { readonly _tag: "NotContiguous"; readonly baseOffset: number; readonly end: number }
    | { readonly _tag: "StaleEpoch"; readonly epoch: number; readonly latest: number }
    | { readonly _tag: "Corrupt"; readonly detail: string }
    | {
        readonly _tag: "ProducerRefused"
        readonly producer: number
        readonly verdict: Exclude<ProducerState.Verdict, { readonly _tag: "Append" | "Duplicate" }>
      }
}> {
  /** @since 0.1.0 */
  override get message(): string {
    const r = this.reason
    switch (r._tag) {
      case "StoreFailed":
        return `tablet ${this.tablet}: the store failed: ${r.cause.message}`
      case "OffsetOutOfRange":
        return `tablet ${this.tablet}: offset ${r.offset} is outside the log [${r.start}, ${r.end})`
      case "NotContiguous":
        return `tablet ${this.tablet}: a batch at ${r.baseOffset} does not start at the log end ${r.end}`
      case "StaleEpoch":
        return `tablet ${this.tablet}: epoch ${r.epoch} is older than the log's latest epoch ${r.latest}`
      case "Corrupt":
        return `tablet ${this.tablet}: the stored log cannot be read: ${r.detail}`
      case "ProducerRefused":
        return `tablet ${this.tablet}: producer ${r.producer}: ${ProducerState.describeRefusal(r.verdict)}`
      default:
        return `tablet ${this.tablet}: ${JSON.stringify(r)}`
    }
  }
}

/**
 * Whether a log error is its storage failing (the store's error, or data it cannot read), not a refused request.
 *
 * @since 0.1.0
 */
export const isStorageFailure = (e: TabletLogError): boolean =>
  e.reason._tag === "StoreFailed" || e.reason._tag === "Corrupt"

/**
 * Where an append was written: `duplicate` when it was a retry of a batch already in the log (then nothing was
 * written, and the offsets are that batch's).
 *
 * @since 0.1.0
 */
export interface Appended {
  readonly baseOffset: number
  readonly lastOffset: number
  readonly duplicate?: true
}

/**
 * A tablet replica's log.
 *
 * @since 0.1.0
 */
export interface TabletLog {
  readonly tablet: Models.TabletId
  /** The first offset still in the log. */
  readonly logStartOffset: Effect.Effect<number>
  /** One past the last record (LEO). */
  readonly logEndOffset: Effect.Effect<number>
  /** The high watermark last checkpointed. */
  readonly highWatermark: Effect.Effect<number>
  /**
   * The bytes of the batches the log holds, as stored (each batch's encoding: its header and records; a batch that
   * retention left straddling the log start counts whole, as it stays whole in the store). Exact: kept with every
   * append, truncation, retention and reset, in the same write, and read back when the log opens (counted from the
   * batches once when the log was written without it).
   */
  readonly sizeBytes: Effect.Effect<number>
  readonly epochs: Effect.Effect<LeaderEpochCache.LeaderEpochCache>
  /** What the log knows of each idempotent producer (a copy). */
  readonly producers: Effect.Effect<ReadonlyMap<number, ProducerState.Entry>>
  /**
   * Forgets every producer that has not appended for `idleMs` (since the log opened, for one it loaded), as Kafka
   * expires producer ids after `producer.id.expiration.ms`; how many went. A forgotten producer's next batch is
   * refused `UnknownProducer` unless it starts a producer epoch.
   */
  readonly expireProducers: (idleMs: number) => Effect.Effect<number, TabletLogError>
  /**
   * Appends records written under `epoch` at the log end, as one batch (a leader); with a producer stamp, checked
   * against the producer's entry first (`ProducerRefused` when refused, the earlier offsets for a retry).
   */
  readonly append: (
    epoch: number,
    records: ReadonlyArray<Codec.TabletRecord>,
    producer?: ProducerState.Producer
  ) => Effect.Effect<Appended, TabletLogError>
  /** Appends a leader's batches as they are (a follower): the first must start at the log end. */
  readonly appendBatches: (batches: ReadonlyArray<Codec.Batch>) => Effect.Effect<void, TabletLogError>
  /**
   * Batches from the one holding `from`, whole batches while they fit in `maxBytes` (the first one whatever its size:
   * a read never goes past `maxBytes` but by a first batch larger than it), records before `from` cut off. `from`
   * equal to the log end reads nothing.
   */
  readonly read: (from: number, maxBytes: number) => Effect.Effect<ReadonlyArray<Codec.Batch>, TabletLogError>
  /** Where `epoch` ends in this log (KIP-279; `undefined` when it has no epoch at or below it). */
  readonly endOffsetForEpoch: (
    epoch: number
  ) => Effect.Effect<{ readonly epoch: number; readonly endOffset: number } | undefined>
  /**
   * Drops every record at or past `offset` (and the epochs that wrote only those); the HW follows it down. An
   * idempotent producer's batch holding `offset` goes whole (a retry rewrites it whole).
   */
  readonly truncateTo: (offset: number) => Effect.Effect<void, TabletLogError>
  /** Drops every record before `offset` (retention); a batch holding it stays, read from `offset` on. */
  readonly deleteBefore: (offset: number) => Effect.Effect<void, TabletLogError>
  /**
   * Deletes from the log start what `retention` lets go below `limit` (the replica's high watermark): the oldest
   * parts of the log (whole segments of a segment log, never its active one; whole batches of a store-backed log)
   * while their newest record is more than `retention.ms` older than `nowMs`, or while the log holds at least
   * `retention.bytes` without them. The log start after.
   */
  readonly retain: (
    retention: ReplicaManager.Retention,
    limit: number,
    nowMs: number
  ) => Effect.Effect<number, TabletLogError>
  /** Moves the log to start at `offset`, empty (a follower catching up from a leader whose log starts past its). */
  readonly resetTo: (offset: number) => Effect.Effect<void, TabletLogError>
  /** Checkpoints the high watermark (at most the log end). */
  readonly checkpointHighWatermark: (hw: number) => Effect.Effect<void, TabletLogError>
  /**
   * Checks that the log's storage takes a write now, changing nothing the log holds (a replica whose storage failed
   * is tried by it): the store-backed log writes its high watermark field again; the segment log writes (and
   * deletes) a scratch file the size of a page, so a file system with no room fails it.
   */
  readonly probe: Effect.Effect<void, TabletLogError>
}

interface Fields {
  start: number
  end: number
  hw: number
  /** The bytes of the stored batches. */
  bytes: number
  epochs: LeaderEpochCache.LeaderEpochCache
}

interface Loaded extends Fields {
  /** Each producer's entry: changed in place, only after the write that changes it in the store. */
  readonly producers: Map<number, ProducerState.Entry>
}

/** Producer entries a write changes: the new entry, or `undefined` where the entry goes. */
type ProducerChanges = ReadonlyMap<number, ProducerState.Entry | undefined>

const noChanges: ProducerChanges = new Map()

/** Reads the log's fields and epoch cache from the store, checking they agree with the batches. */
const load = (store: Store.PartitionStore, fail: (detail: string) => TabletLogError) =>
  Effect.gen(function* () {
    const field = (name: "hw" | "start" | "end" | "bytes") =>
      Effect.map(
        store.get(Codec.fieldKey(name)),
        Option.map((b) => Codec.decodeOffset(b))
      )
    // A field not written reads as `absent` (0, or the size counted from the batches).
    const read = (
      name: "hw" | "start" | "end" | "bytes",
      absent: Effect.Effect<number, Store.StoreError> = Effect.succeed(0)
    ) =>
      Effect.flatMap(
        field(name),
        (o): Effect.Effect<number, Store.StoreError | TabletLogError> =>
          Option.isNone(o)
            ? absent
            : o.value === undefined
              ? Effect.fail(fail(`the ${name} field is not an offset`))
              : Effect.succeed(o.value)
      )
    const entries = yield* Stream.runCollect(store.scan(Codec.EPOCHS))
    let epochs = LeaderEpochCache.empty
    for (const [k, v] of entries) {
      const at = Codec.decodeOffset(v)
      if (at === undefined) return yield* Effect.fail(fail(`epoch entry ${Codec.epochOfKey(k)} is not an offset`))
      epochs = [...epochs, { epoch: Codec.epochOfKey(k), startOffset: at }]
    }
    const producers = new Map<number, ProducerState.Entry>()
    for (const [k, v] of yield* Stream.runCollect(store.scan(Codec.PRODUCERS))) {
      const entry = Codec.decodeProducer(v)
      if (typeof entry === "string") return yield* Effect.fail(fail(`producer ${Codec.producerOfKey(k)}: ${entry}`))
      producers.set(Codec.producerOfKey(k), entry)
    }
    const loaded: Loaded = {
      start: yield* read("start"),
      end: yield* read("end"),
      hw: yield* read("hw"),
      bytes: yield* read("bytes", storedBytes(store)),
      epochs,
      producers
    }
    if (loaded.start > loaded.end || loaded.hw > loaded.end) {
      return yield* Effect.fail(fail(`start ${loaded.start}, end ${loaded.end} and hw ${loaded.hw} do not agree`))
    }
    return loaded
  })

/** The bytes of every stored batch, counted (a log written without its size field). */
const storedBytes = (store: Store.PartitionStore) =>
  Stream.runFold(
    store.scan(Codec.BATCHES),
    () => 0,
    (n, [, v]) => n + v.length
  )

/**
 * The most batches a truncation reads back to find the older batches of producers whose recent ones it cut: the
 * scan runs under the log's lock, so its cost is bounded whatever the log's length.
 *
 * @since 0.1.0
 */
export const PRODUCER_SCAN_BATCHES = 10_000

/** The most a log's tail of recent batches holds, in encoded bytes. */
const tailMaxBytes = 4 * 1024 * 1024

/** Records `skip`..`last` of a batch, its producer stamp's sequence moved along with them. */
const sliced = (b: Codec.Batch, skip: number, last: number): Codec.Batch => {
  const cut = { baseOffset: b.baseOffset + skip, epoch: b.epoch, records: b.records.slice(skip, last) }
  return b.producer === undefined ? cut : { ...cut, producer: { ...b.producer, sequence: b.producer.sequence + skip } }
}

/** An open log: what its functions share. `state` and the tail change only under `lock`, after a write succeeded. */
interface Opened {
  readonly tablet: Models.TabletId
  readonly name: string
  readonly store: Store.PartitionStore
  readonly lock: Semaphore.Semaphore
  readonly state: Loaded
  /** When the log opened, in ms: a producer entry loaded is as of then. */
  readonly openedAt: number
  /** When each producer last appended here (since the log opened). */
  readonly lastAppend: Map<number, number>
  /**
   * The batches appended last, above the high watermark, as they were written: the followers in the ISR fetch from
   * at least the high watermark, so their fetches are answered from here without reading the store. Entries leave
   * once the high watermark passes them, and the oldest beyond `tailMaxBytes`; a truncation or a moved log start
   * empties it.
   */
  readonly tail: RecentTail.RecentTail
}

/**
 * Opens the log of `tablet` on an open partition store (its own: the log owns every key in it).
 *
 * @since 0.1.0
 */
export const make = (store: Store.PartitionStore, tablet: Models.TabletId): Effect.Effect<TabletLog, TabletLogError> =>
  Effect.gen(function* () {
    const name = Models.tabletKey(tablet)
    const state = yield* load(
      store,
      (detail) => new TabletLogError({ tablet: name, reason: { _tag: "Corrupt", detail } })
    ).pipe(
      Effect.catchTag("StoreError", (cause) =>
        Effect.fail(new TabletLogError({ tablet: name, reason: { _tag: "StoreFailed", cause } }))
      )
    )
    const o: Opened = {
      tablet,
      name,
      store,
      lock: Semaphore.makeUnsafe(1),
      state,
      openedAt: yield* Clock.currentTimeMillis,
      lastAppend: new Map(),
      tail: RecentTail.make(tailMaxBytes)
    }
    return {
      tablet,
      logStartOffset: Effect.sync(() => o.state.start),
      logEndOffset: Effect.sync(() => o.state.end),
      highWatermark: Effect.sync(() => o.state.hw),
      sizeBytes: Effect.sync(() => o.state.bytes),
      epochs: Effect.sync(() => o.state.epochs),
      producers: Effect.sync(() => new Map(o.state.producers)),
      expireProducers: (idleMs) => alone(o, expireProducers(o, idleMs)),
      append: (epoch, records, producer) => alone(o, append(o, epoch, records, producer)),
      appendBatches: (batches) => alone(o, appendAt(o, batches)),
      read: (from, maxBytes) => alone(o, read(o, from, maxBytes)),
      endOffsetForEpoch: (epoch) =>
        Effect.sync(() => LeaderEpochCache.endOffsetFor(o.state.epochs, epoch, o.state.end)),
      truncateTo: (offset) => alone(o, truncateTo(o, offset)),
      deleteBefore: (offset) => alone(o, deleteBefore(o, offset)),
      retain: (retention, limit, nowMs) => alone(o, retain(o, retention, limit, nowMs)),
      resetTo: (offset) => alone(o, resetTo(o, offset)),
      checkpointHighWatermark: (hw) => alone(o, checkpointHighWatermark(o, hw)),
      probe: alone(
        o,
        Effect.suspend(() => checkpointHighWatermark(o, o.state.hw))
      )
    }
  })

const error = (o: Opened, reason: TabletLogError["reason"]) => new TabletLogError({ tablet: o.name, reason })
const storeFailed = (o: Opened) => (cause: Store.StoreError) => error(o, { _tag: "StoreFailed", cause })
const corrupt = (o: Opened, detail: string) => error(o, { _tag: "Corrupt", detail })
const outOfRange = (o: Opened, offset: number) =>
  error(o, { _tag: "OffsetOutOfRange", offset, start: o.state.start, end: o.state.end })

/** Runs `self` holding the log's lock: one change or read at a time. */
const alone = <A, E>(o: Opened, self: Effect.Effect<A, E>) => Semaphore.withPermit(o.lock, self)

const write = (o: Opened, ops: ReadonlyArray<Store.Op>) => o.store.write(ops).pipe(Effect.mapError(storeFailed(o)))

/** The store ops of the log's fields. */
const fieldOps = (s: Fields): Array<Store.Op> => [
  Store.put(Codec.fieldKey("start"), Codec.encodeOffset(s.start)),
  Store.put(Codec.fieldKey("end"), Codec.encodeOffset(s.end)),
  Store.put(Codec.fieldKey("hw"), Codec.encodeOffset(s.hw)),
  Store.put(Codec.fieldKey("bytes"), Codec.encodeOffset(s.bytes))
]

/** The store ops that make the epoch cache `next` where it was `prev`. */
const epochOps = (prev: LeaderEpochCache.LeaderEpochCache, next: LeaderEpochCache.LeaderEpochCache) => {
  const ops: Array<Store.Op> = []
  for (const e of prev) if (!next.some((n) => n.epoch === e.epoch)) ops.push(Store.del(Codec.epochKey(e.epoch)))
  for (const e of next) {
    const was = prev.find((p) => p.epoch === e.epoch)
    if (was === undefined || was.startOffset !== e.startOffset) {
      ops.push(Store.put(Codec.epochKey(e.epoch), Codec.encodeOffset(e.startOffset)))
    }
  }
  return ops
}

/** The store ops of producer entry changes (as many as there are changes, whatever the producer count). */
const producerOps = (changes: ProducerChanges) => {
  const ops: Array<Store.Op> = []
  for (const [id, entry] of changes) {
    ops.push(
      entry === undefined
        ? Store.del(Codec.producerKey(id))
        : Store.put(Codec.producerKey(id), Codec.encodeProducer(entry))
    )
  }
  return ops
}

/** Notes that producers `ids` appended now. */
const touch = (o: Opened, ids: Iterable<number>) =>
  Effect.map(Clock.currentTimeMillis, (now) => {
    for (const id of ids) o.lastAppend.set(id, now)
  })

/**
 * Makes `next` the log's fields, writing `ops`, every field and epoch that changed and the producer `changes`, at
 * once; the state changes only once the write succeeded.
 */
const commit = (o: Opened, ops: ReadonlyArray<Store.Op>, next: Fields, changes: ProducerChanges = noChanges) =>
  write(o, [...ops, ...epochOps(o.state.epochs, next.epochs), ...producerOps(changes), ...fieldOps(next)]).pipe(
    Effect.tap(() =>
      Effect.sync(() => {
        const state = o.state
        if (next.end < state.end || next.start !== state.start) RecentTail.drop(o.tail)
        state.start = next.start
        state.end = next.end
        state.hw = next.hw
        state.bytes = next.bytes
        state.epochs = next.epochs
        for (const [id, entry] of changes) {
          if (entry === undefined) {
            state.producers.delete(id)
            o.lastAppend.delete(id)
          } else state.producers.set(id, entry)
        }
      })
    )
  )

/** Appends `records` at the log end under `epoch`; a producer's retry of a batch it wrote is answered as before. */
const append = (
  o: Opened,
  epoch: number,
  records: ReadonlyArray<Codec.TabletRecord>,
  producer: Parameters<TabletLog["append"]>[2]
): Effect.Effect<Appended, TabletLogError> =>
  Effect.suspend(() =>
    appendChecked(
      o.state.producers,
      o.state.end,
      epoch,
      records,
      producer,
      (refusal) => error(o, refusal),
      (batch) => appendAt(o, [batch])
    )
  )

/**
 * A leader's append of `records` at `baseOffset` under `epoch`, as every tablet log does it: with a producer stamp
 * checked against the producer's entry in `producers` first — a retry of a batch it wrote answered with its earlier
 * offsets, a refused stamp failed as `ProducerRefused` (made by `fail`) — then the batch written by `write`.
 *
 * @since 0.1.0
 */
export const appendChecked = (
  producers: ReadonlyMap<number, ProducerState.Entry>,
  baseOffset: number,
  epoch: number,
  records: ReadonlyArray<Codec.TabletRecord>,
  producer: ProducerState.Producer | undefined,
  fail: (refusal: Extract<TabletLogError["reason"], { readonly _tag: "ProducerRefused" }>) => TabletLogError,
  write: (batch: Codec.Batch) => Effect.Effect<void, TabletLogError>
): Effect.Effect<Appended, TabletLogError> => {
  if (producer !== undefined) {
    const verdict = ProducerState.check(producers.get(producer.id), producer, records.length)
    if (verdict._tag === "Duplicate")
      return Effect.succeed({ baseOffset: verdict.baseOffset, lastOffset: verdict.lastOffset, duplicate: true })
    if (verdict._tag !== "Append") return Effect.fail(fail({ _tag: "ProducerRefused", producer: producer.id, verdict }))
  }
  return Effect.as(write({ baseOffset, epoch, records, producer }), {
    baseOffset,
    lastOffset: baseOffset + records.length - 1
  })
}

/** Writes batches at the log end with their epochs, fields, epoch and producer entries in one atomic write. */
const appendAt = (o: Opened, batches: ReadonlyArray<Codec.Batch>) =>
  Effect.suspend(() => {
    const state = o.state
    let epochs = state.epochs
    let end = state.end
    const producers = new Map<number, ProducerState.Entry>()
    const ops: Array<Store.Op> = []
    const written: Array<RecentTail.Entry> = []
    let bytes = state.bytes
    for (const b of batches) {
      if (b.baseOffset !== end) return Effect.fail(error(o, { _tag: "NotContiguous", baseOffset: b.baseOffset, end }))
      const latest = LeaderEpochCache.latest(epochs)
      if (latest !== undefined && b.epoch < latest.epoch) {
        return Effect.fail(error(o, { _tag: "StaleEpoch", epoch: b.epoch, latest: latest.epoch }))
      }
      if (b.records.length === 0) continue
      epochs = LeaderEpochCache.assign(epochs, b.epoch, b.baseOffset)
      const encoded = Codec.encodeBatch(b.epoch, b.records, b.producer)
      ops.push(Store.put(Codec.batchKey(b.baseOffset), encoded))
      written.push({ batch: b, bytes: encoded.length })
      bytes += encoded.length
      if (b.producer !== undefined) {
        const id = b.producer.id
        const entry = producers.get(id) ?? state.producers.get(id)
        producers.set(id, ProducerState.record(entry, b.producer, b.records.length, b.baseOffset))
      }
      end += b.records.length
    }
    return commit(o, ops, { start: state.start, hw: state.hw, end, bytes, epochs }, producers).pipe(
      Effect.tap(() => (producers.size === 0 ? Effect.void : touch(o, producers.keys()))),
      Effect.tap(() => Effect.sync(() => addToTail(o, written)))
    )
  })

/** Adds batches just written to the tail, then lets those the high watermark passed go. */
const addToTail = (o: Opened, written: ReadonlyArray<RecentTail.Entry>) => {
  RecentTail.note(o.tail, written)
  RecentTail.trimBelow(o.tail, o.state.hw)
}

/** Every stored batch from the one holding `from` on. */
const batchesFrom = (o: Opened, from: number) =>
  Effect.gen(function* () {
    // The batch holding `from` starts at or before it: the last batch key at or below it.
    const before = yield* Stream.runCollect(
      o.store.scan({ gte: Codec.BATCHES.gte, lte: Codec.batchKey(from), reverse: true, limit: 1 })
    )
    const first = before[0] === undefined ? from : Codec.offsetOfBatchKey(before[0][0])
    return o.store.scan({ gte: Codec.batchKey(first), lt: Codec.BATCHES.lt })
  }).pipe(Stream.unwrap)

const decode = (o: Opened, key: Uint8Array, value: Uint8Array) => {
  const b = Codec.decodeBatch(Codec.offsetOfBatchKey(key), value)
  return typeof b === "string" ? Effect.fail(corrupt(o, b)) : Effect.succeed(b)
}

/**
 * Whole batches from `from` while they fit in `maxBytes` (their sizes as stored), the first one whatever its size
 * (as Kafka does): a read never goes past `maxBytes` but by a first batch larger than it. From the tail when it
 * holds `from`, else from the store.
 */
const read = (o: Opened, from: number, maxBytes: number): Effect.Effect<Array<Codec.Batch>, TabletLogError> =>
  Effect.gen(function* () {
    const state = o.state
    if (from < state.start || from > state.end) return yield* Effect.fail(outOfRange(o, from))
    if (from === state.end) return []
    const out: Array<Codec.Batch> = []
    let bytes = 0
    let taken = 0
    const fits = (size: number) => {
      if (taken > 0 && bytes + size > maxBytes) return false
      taken++
      bytes += size
      return true
    }
    const take = (b: Codec.Batch) => {
      const skip = Math.max(0, Math.max(from, state.start) - b.baseOffset)
      const last = Math.min(b.records.length, state.end - b.baseOffset)
      if (skip < last) out.push(skip === 0 && last === b.records.length ? b : sliced(b, skip, last))
    }
    const recent = RecentTail.read(o.tail, from, maxBytes)
    if (recent !== undefined) return recent
    // Sized before they are decoded, each as it comes (not by the chunk the store hands them out in).
    yield* batchesFrom(o, from).pipe(
      Stream.mapError(storeFailed(o)),
      Stream.takeWhile(([, v]) => fits(v.length)),
      Stream.runForEach(([k, v]) => Effect.map(decode(o, k, v), take))
    )
    return out
  })

/**
 * The batches at or past `offset`, to cut: delete each, and write back the part of one straddling it (unless a
 * producer stamped it: then it goes whole, and the log ends at its base offset); `bytes`: how the stored batches'
 * size changes (what goes, less what is written back).
 */
const cutFrom = (o: Opened, offset: number) =>
  Effect.gen(function* () {
    const ops: Array<Store.Op> = []
    let end = offset
    let bytes = 0
    yield* batchesFrom(o, offset).pipe(
      Stream.mapError(storeFailed(o)),
      Stream.runForEach(([k, v]) =>
        Effect.gen(function* () {
          const b = yield* decode(o, k, v)
          ops.push(Store.del(k))
          bytes -= v.length
          const kept = offset - b.baseOffset
          if (kept <= 0) return
          if (b.producer === undefined) {
            const part = Codec.encodeBatch(b.epoch, b.records.slice(0, kept))
            ops.push(Store.put(k, part))
            bytes += part.length
          } else end = b.baseOffset
        })
      )
    )
    return { ops, end, bytes }
  })

/**
 * The producer entry changes once the log ends at `end`: each entry loses its batches past it, and a producer left
 * with none gets its latest batches before `end` back from the log, looking back at most `PRODUCER_SCAN_BATCHES`
 * batches (none found: its entry goes).
 */
const producersBefore = (o: Opened, end: number) =>
  Effect.gen(function* () {
    const changes = new Map<number, ProducerState.Entry | undefined>()
    const lost = new Set<number>()
    for (const [id, entry] of o.state.producers) {
      if (entry.batches.every((b) => b.lastOffset < end)) continue
      const kept = ProducerState.truncateFromEnd(entry, end)
      changes.set(id, kept)
      if (kept === undefined) lost.add(id)
    }
    if (lost.size === 0 || end <= o.state.start) return changes
    const found = yield* latestBatchesOf(o, lost, end)
    for (const [id, batches] of found) {
      let entry: ProducerState.Entry | undefined
      for (const b of batches) entry = ProducerState.record(entry, b.producer!, b.records.length, b.baseOffset)
      changes.set(id, entry)
    }
    return changes
  })

/**
 * The latest batches below `end` of each producer of `lost` (its latest producer epoch's, at most `RECENT_BATCHES`,
 * oldest first), newest first from the log, within `PRODUCER_SCAN_BATCHES` batches: a producer not found within
 * them is forgotten (its next batch that does not start a producer epoch is refused `UnknownProducer`, as Kafka's
 * producer state beyond its snapshots is).
 */
const latestBatchesOf = (o: Opened, lost: ReadonlySet<number>, end: number) =>
  Effect.gen(function* () {
    const found = new Map<number, Array<Codec.Batch>>()
    const done = new Set<number>()
    yield* o.store.scan({ gte: Codec.BATCHES.gte, lt: Codec.batchKey(end), reverse: true }).pipe(
      Stream.mapError(storeFailed(o)),
      Stream.takeWhile(() => done.size < lost.size),
      Stream.take(PRODUCER_SCAN_BATCHES),
      Stream.runForEach(([k, v]) =>
        Effect.map(decode(o, k, v), (b) => {
          const p = b.producer
          if (p === undefined || !lost.has(p.id) || done.has(p.id)) return
          const seen = found.get(p.id) ?? []
          if (seen.length > 0 && seen[0]!.producer!.epoch !== p.epoch) {
            done.add(p.id)
            return
          }
          seen.unshift(b)
          found.set(p.id, seen)
          if (seen.length === ProducerState.RECENT_BATCHES) done.add(p.id)
        })
      )
    )
    return found
  })

const truncateTo = (o: Opened, offset: number): Effect.Effect<void, TabletLogError> =>
  Effect.gen(function* () {
    const state = o.state
    if (offset >= state.end) return
    if (offset < state.start) return yield* Effect.fail(outOfRange(o, offset))
    const cut = yield* cutFrom(o, offset)
    const { ops, bytes } = cut
    // An idempotent producer's batch holding `offset` goes whole; when it also held the log start (retention kept it
    // whole), the log is left empty at its start rather than ending below it.
    const end = Math.max(cut.end, state.start)
    const epochs = LeaderEpochCache.truncateFromEnd(state.epochs, end)
    const changes = yield* producersBefore(o, end)
    const next = { start: state.start, end, hw: Math.min(state.hw, end), bytes: state.bytes + bytes, epochs }
    yield* commit(o, ops, next, changes)
  })

const deleteBefore = (o: Opened, offset: number): Effect.Effect<void, TabletLogError> =>
  Effect.gen(function* () {
    const state = o.state
    if (offset <= state.start) return
    if (offset > state.end) return yield* Effect.fail(outOfRange(o, offset))
    // Whole batches below `offset` go; the one holding it stays (read from `offset` on).
    const ops: Array<Store.Op> = []
    let bytes = state.bytes
    yield* o.store.scan({ gte: Codec.BATCHES.gte, lt: Codec.batchKey(offset) }).pipe(
      Stream.mapError(storeFailed(o)),
      Stream.runForEach(([k, v]) =>
        Effect.map(decode(o, k, v), (b) => {
          if (b.baseOffset + b.records.length > offset) return
          ops.push(Store.del(k))
          bytes -= v.length
        })
      )
    )
    const epochs = LeaderEpochCache.truncateFromStart(state.epochs, offset)
    // The producers stay, even one whose batches all went (KIP-360): a retry of its last batch must still be known
    // as one, not appended again; it is forgotten once idle for `producerIdExpiration`.
    yield* commit(o, ops, { start: offset, end: state.end, hw: Math.max(state.hw, offset), bytes, epochs })
  })

/** The most batches one `retain` of a store-backed log reads (it holds the log's lock): the next one goes on. */
const RETAIN_SCAN_BATCHES = 10_000

/** Whether retention lets a part of the log go: its newest record, its bytes, and the log's bytes with it. */
export const retained = (
  retention: ReplicaManager.Retention,
  nowMs: number,
  newest: number,
  bytes: number,
  total: number
): boolean =>
  (retention.ms !== undefined && nowMs - newest > retention.ms) ||
  (retention.bytes !== undefined && total - bytes >= retention.bytes)

/** The newest timestamp of a batch's records. */
export const newestOf = (b: Codec.Batch): number => b.records.reduce((n, r) => Math.max(n, r.timestamp), -Infinity)

/** Whole batches from the start while retention lets them go, below `limit` (see `TabletLog.retain`). */
const retain = (
  o: Opened,
  retention: ReplicaManager.Retention,
  limit: number,
  nowMs: number
): Effect.Effect<number, TabletLogError> =>
  Effect.gen(function* () {
    let cut = o.state.start
    let total = o.state.bytes
    let scanned = 0
    yield* batchesFrom(o, o.state.start).pipe(
      Stream.mapError(storeFailed(o)),
      Stream.takeWhile(() => scanned++ < RETAIN_SCAN_BATCHES),
      Stream.mapEffect(([k, v]) => Effect.map(decode(o, k, v), (b) => ({ b, size: v.length }))),
      Stream.takeWhile(({ b, size }) => {
        const end = b.baseOffset + b.records.length
        if (end > limit || !retained(retention, nowMs, newestOf(b), size, total)) return false
        cut = end
        total -= size
        return true
      }),
      Stream.runDrain
    )
    if (cut > o.state.start) yield* deleteBefore(o, cut)
    return o.state.start
  })

const resetTo = (o: Opened, offset: number): Effect.Effect<void, TabletLogError> =>
  Effect.gen(function* () {
    const ops: Array<Store.Op> = []
    yield* o.store.scan(Codec.BATCHES).pipe(
      Stream.mapError(storeFailed(o)),
      Stream.runForEach(([k]) => Effect.sync(() => ops.push(Store.del(k))))
    )
    const changes = new Map<number, undefined>()
    for (const id of o.state.producers.keys()) changes.set(id, undefined)
    yield* commit(o, ops, { start: offset, end: offset, hw: offset, bytes: 0, epochs: LeaderEpochCache.empty }, changes)
  })

/** Drops the producers idle for `idleMs` (an entry loaded counts from the opening); how many. */
const expireProducers = (o: Opened, idleMs: number): Effect.Effect<number, TabletLogError> =>
  Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    const changes = new Map<number, undefined>()
    for (const id of o.state.producers.keys()) {
      if (now - (o.lastAppend.get(id) ?? o.openedAt) >= idleMs) changes.set(id, undefined)
    }
    if (changes.size > 0) yield* commit(o, [], o.state, changes)
    return changes.size
  })

const checkpointHighWatermark = (o: Opened, hw: number): Effect.Effect<void, TabletLogError> =>
  Effect.suspend(() => {
    const next = Math.min(Math.max(hw, o.state.start), o.state.end)
    return write(o, [Store.put(Codec.fieldKey("hw"), Codec.encodeOffset(next))]).pipe(
      Effect.tap(() =>
        Effect.sync(() => {
          o.state.hw = next
          RecentTail.trimBelow(o.tail, next)
        })
      )
    )
  })
