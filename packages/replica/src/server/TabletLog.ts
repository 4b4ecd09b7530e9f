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
 * Offsets are dense from the log start. Every operation runs alone (one at a time per log).
 *
 * @since 0.1.0
 */
import { del, type PartitionStore, put, type StoreError, type StoreOp, type TabletId, tabletKey } from "@strata/core"
import { Clock, Data, Effect, Option, Semaphore, Stream } from "effect"
import * as Codec from "../wire/internal/batchCodec.js"
import * as LeaderEpochCache from "../machines/LeaderEpochCache.js"
import * as ProducerState from "../machines/ProducerState.js"

export type { Batch, TabletRecord } from "../wire/internal/batchCodec.js"

/**
 * Why a tablet log operation failed.
 *
 * @since 0.1.0
 */
export class TabletLogError extends Data.TaggedError("TabletLogError")<{
  readonly tablet: string
  readonly reason:
    | { readonly _tag: "StoreFailed"; readonly cause: StoreError }
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
  readonly tablet: TabletId
  /** The first offset still in the log. */
  readonly logStartOffset: Effect.Effect<number>
  /** One past the last record (LEO). */
  readonly logEndOffset: Effect.Effect<number>
  /** The high watermark last checkpointed. */
  readonly highWatermark: Effect.Effect<number>
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
  /** Moves the log to start at `offset`, empty (a follower catching up from a leader whose log starts past its). */
  readonly resetTo: (offset: number) => Effect.Effect<void, TabletLogError>
  /** Checkpoints the high watermark (at most the log end). */
  readonly checkpointHighWatermark: (hw: number) => Effect.Effect<void, TabletLogError>
}

interface Fields {
  start: number
  end: number
  hw: number
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
const load = (store: PartitionStore, fail: (detail: string) => TabletLogError) =>
  Effect.gen(function* () {
    const field = (name: "hw" | "start" | "end") =>
      Effect.map(
        store.get(Codec.fieldKey(name)),
        Option.map((b) => Codec.decodeOffset(b))
      )
    const read = (name: "hw" | "start" | "end") =>
      Effect.flatMap(field(name), (o) =>
        Option.isNone(o)
          ? Effect.succeed(0)
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
      epochs,
      producers
    }
    if (loaded.start > loaded.end || loaded.hw > loaded.end) {
      return yield* Effect.fail(fail(`start ${loaded.start}, end ${loaded.end} and hw ${loaded.hw} do not agree`))
    }
    return loaded
  })

/** Records `skip`..`last` of a batch, its producer stamp's sequence moved along with them. */
/**
 * The most batches a truncation reads back to find the older batches of producers whose recent ones it cut: the
 * scan runs under the log's lock, so its cost is bounded whatever the log's length.
 *
 * @since 0.1.0
 */
export const PRODUCER_SCAN_BATCHES = 10_000

/** The most a log's tail of recent batches holds, in encoded bytes (at least its newest batch). */
const tailMaxBytes = 4 * 1024 * 1024

const sliced = (b: Codec.Batch, skip: number, last: number): Codec.Batch => {
  const cut = { baseOffset: b.baseOffset + skip, epoch: b.epoch, records: b.records.slice(skip, last) }
  return b.producer === undefined ? cut : { ...cut, producer: { ...b.producer, sequence: b.producer.sequence + skip } }
}

/**
 * Opens the log of `tablet` on an open partition store (its own: the log owns every key in it).
 *
 * @since 0.1.0
 */
export const make = (store: PartitionStore, tablet: TabletId): Effect.Effect<TabletLog, TabletLogError> =>
  Effect.gen(function* () {
    const name = tabletKey(tablet)
    const error = (reason: TabletLogError["reason"]) => new TabletLogError({ tablet: name, reason })
    const storeFailed = (cause: StoreError) => error({ _tag: "StoreFailed", cause })
    const corrupt = (detail: string) => error({ _tag: "Corrupt", detail })
    const state = yield* load(store, corrupt).pipe(Effect.catchTag("StoreError", (e) => Effect.fail(storeFailed(e))))
    const lock = Semaphore.makeUnsafe(1)
    const alone = <A, E>(self: Effect.Effect<A, E>) => Semaphore.withPermit(lock, self)
    const write = (ops: ReadonlyArray<StoreOp>) => store.write(ops).pipe(Effect.mapError(storeFailed))
    const fields = (s: Fields): Array<StoreOp> => [
      put(Codec.fieldKey("start"), Codec.encodeOffset(s.start)),
      put(Codec.fieldKey("end"), Codec.encodeOffset(s.end)),
      put(Codec.fieldKey("hw"), Codec.encodeOffset(s.hw))
    ]
    /** The store ops that make the epoch cache `next` where it was `prev`. */
    const epochOps = (prev: LeaderEpochCache.LeaderEpochCache, next: LeaderEpochCache.LeaderEpochCache) => {
      const ops: Array<StoreOp> = []
      for (const e of prev) if (!next.some((n) => n.epoch === e.epoch)) ops.push(del(Codec.epochKey(e.epoch)))
      for (const e of next) {
        const was = prev.find((p) => p.epoch === e.epoch)
        if (was === undefined || was.startOffset !== e.startOffset) {
          ops.push(put(Codec.epochKey(e.epoch), Codec.encodeOffset(e.startOffset)))
        }
      }
      return ops
    }
    /** The store ops of producer entry changes (as many as there are changes, whatever the producer count). */
    const producerOps = (changes: ProducerChanges) => {
      const ops: Array<StoreOp> = []
      for (const [id, entry] of changes) {
        ops.push(
          entry === undefined ? del(Codec.producerKey(id)) : put(Codec.producerKey(id), Codec.encodeProducer(entry))
        )
      }
      return ops
    }
    /** When each producer last appended here (since the log opened: an entry loaded is as of the opening). */
    const openedAt = yield* Clock.currentTimeMillis
    const lastAppend = new Map<number, number>()
    const touch = (ids: Iterable<number>) =>
      Effect.map(Clock.currentTimeMillis, (now) => {
        for (const id of ids) lastAppend.set(id, now)
      })
    /**
     * The batches appended last, above the high watermark, as they were written: the followers in the ISR fetch from
     * at least the high watermark, so their fetches are answered from here without reading the store. Entries leave
     * once the high watermark passes them, and the oldest beyond `tailMaxBytes`; a truncation or a moved log start
     * empties it.
     */
    let tail: Array<{ readonly batch: Codec.Batch; readonly size: number }> = []
    let tailBytes = 0
    const trimTail = (below: number) => {
      let drop = 0
      while (
        drop < tail.length - 1 &&
        (tail[drop]!.batch.baseOffset + tail[drop]!.batch.records.length <= below || tailBytes > tailMaxBytes)
      ) {
        tailBytes -= tail[drop]!.size
        drop++
      }
      if (drop > 0) tail = tail.slice(drop)
    }

    /**
     * Makes `next` the log's fields, writing `ops`, every field and epoch that changed and the producer `changes`, at
     * once; the state changes only once the write succeeded.
     */
    const commit = (ops: ReadonlyArray<StoreOp>, next: Fields, changes: ProducerChanges = noChanges) =>
      write([...ops, ...epochOps(state.epochs, next.epochs), ...producerOps(changes), ...fields(next)]).pipe(
        Effect.tap(() =>
          Effect.sync(() => {
            if (next.end < state.end || next.start !== state.start) {
              tail = []
              tailBytes = 0
            }
            state.start = next.start
            state.end = next.end
            state.hw = next.hw
            state.epochs = next.epochs
            for (const [id, entry] of changes) {
              if (entry === undefined) {
                state.producers.delete(id)
                lastAppend.delete(id)
              } else state.producers.set(id, entry)
            }
          })
        )
      )

    /** Writes batches at the log end with their epochs, fields, epoch and producer entries in one atomic write. */
    const appendAt = (batches: ReadonlyArray<Codec.Batch>) =>
      Effect.suspend(() => {
        let epochs = state.epochs
        let end = state.end
        const producers = new Map<number, ProducerState.Entry>()
        const ops: Array<StoreOp> = []
        const written: Array<{ readonly batch: Codec.Batch; readonly size: number }> = []
        for (const b of batches) {
          if (b.baseOffset !== end) return Effect.fail(error({ _tag: "NotContiguous", baseOffset: b.baseOffset, end }))
          const latest = LeaderEpochCache.latest(epochs)
          if (latest !== undefined && b.epoch < latest.epoch) {
            return Effect.fail(error({ _tag: "StaleEpoch", epoch: b.epoch, latest: latest.epoch }))
          }
          if (b.records.length === 0) continue
          epochs = LeaderEpochCache.assign(epochs, b.epoch, b.baseOffset)
          const bytes = Codec.encodeBatch(b.epoch, b.records, b.producer)
          ops.push(put(Codec.batchKey(b.baseOffset), bytes))
          written.push({ batch: b, size: bytes.length })
          if (b.producer !== undefined) {
            const id = b.producer.id
            const entry = producers.get(id) ?? state.producers.get(id)
            producers.set(id, ProducerState.record(entry, b.producer, b.records.length, b.baseOffset))
          }
          end += b.records.length
        }
        return commit(ops, { start: state.start, hw: state.hw, end, epochs }, producers).pipe(
          Effect.tap(() => (producers.size === 0 ? Effect.void : touch(producers.keys()))),
          Effect.tap(() =>
            Effect.sync(() => {
              // Contiguous with what the tail holds (or the tail starts here).
              const last = tail.at(-1)
              if (
                last !== undefined &&
                last.batch.baseOffset + last.batch.records.length !== written[0]?.batch.baseOffset
              ) {
                tail = []
                tailBytes = 0
              }
              for (const w of written) {
                tail.push(w)
                tailBytes += w.size
              }
              trimTail(state.hw)
            })
          )
        )
      })

    /** Every stored batch from the one holding `from` on (or the last ones, reversed, when `reverse`). */
    const batchesFrom = (from: number) =>
      Effect.gen(function* () {
        // The batch holding `from` starts at or before it: the last batch key at or below it.
        const before = yield* Stream.runCollect(
          store.scan({ gte: Codec.BATCHES.gte, lte: Codec.batchKey(from), reverse: true, limit: 1 })
        )
        const first = before[0] === undefined ? from : Codec.offsetOfBatchKey(before[0][0])
        return store.scan({ gte: Codec.batchKey(first), lt: Codec.BATCHES.lt })
      }).pipe(Stream.unwrap)

    const decode = (key: Uint8Array, value: Uint8Array) => {
      const b = Codec.decodeBatch(Codec.offsetOfBatchKey(key), value)
      return typeof b === "string" ? Effect.fail(corrupt(b)) : Effect.succeed(b)
    }

    const read: TabletLog["read"] = (from, maxBytes) =>
      alone(
        Effect.gen(function* () {
          if (from < state.start || from > state.end) {
            return yield* Effect.fail(
              error({ _tag: "OffsetOutOfRange", offset: from, start: state.start, end: state.end })
            )
          }
          if (from === state.end) return []
          // Whole batches while they fit in `maxBytes` (their sizes as stored), the first one whatever its size (as
          // Kafka does): a read never goes past `maxBytes` but by a first batch larger than it.
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
          const first = tail[0]
          if (first !== undefined && from >= first.batch.baseOffset) {
            for (const { batch, size } of tail) {
              if (batch.baseOffset + batch.records.length <= from) continue
              if (!fits(size)) break
              take(batch)
            }
            return out
          }
          // Sized before they are decoded, each as it comes (not by the chunk the store hands them out in).
          yield* batchesFrom(from).pipe(
            Stream.mapError(storeFailed),
            Stream.takeWhile(([, v]) => fits(v.length)),
            Stream.runForEach(([k, v]) => Effect.map(decode(k, v), take))
          )
          return out
        })
      )

    /**
     * The batches at or past `offset`, to cut: delete each, and write back the part of one straddling it (unless a
     * producer stamped it: then it goes whole, and the log ends at its base offset).
     */
    const cutFrom = (offset: number) =>
      Effect.gen(function* () {
        const ops: Array<StoreOp> = []
        let end = offset
        yield* batchesFrom(offset).pipe(
          Stream.mapError(storeFailed),
          Stream.runForEach(([k, v]) =>
            Effect.gen(function* () {
              const b = yield* decode(k, v)
              ops.push(del(k))
              const kept = offset - b.baseOffset
              if (kept <= 0) return
              if (b.producer === undefined) ops.push(put(k, Codec.encodeBatch(b.epoch, b.records.slice(0, kept))))
              else end = b.baseOffset
            })
          )
        )
        return { ops, end }
      })

    /**
     * The producer entry changes once the log ends at `end`: each entry loses its batches past it, and a producer left
     * with none gets its latest batches before `end` back from the log, looking back at most
     * `PRODUCER_SCAN_BATCHES` batches (none found: its entry goes).
     */
    const producersBefore = (end: number) =>
      Effect.gen(function* () {
        const changes = new Map<number, ProducerState.Entry | undefined>()
        const lost = new Set<number>()
        for (const [id, entry] of state.producers) {
          if (entry.batches.every((b) => b.lastOffset < end)) continue
          const kept = ProducerState.truncateFromEnd(entry, end)
          changes.set(id, kept)
          if (kept === undefined) lost.add(id)
        }
        if (lost.size === 0 || end <= state.start) return changes
        // Newest first: a producer's entry is its latest producer epoch's batches, at most RECENT_BATCHES of them.
        const found = new Map<number, Array<Codec.Batch>>()
        const done = new Set<number>()
        yield* store.scan({ gte: Codec.BATCHES.gte, lt: Codec.batchKey(end), reverse: true }).pipe(
          Stream.mapError(storeFailed),
          Stream.takeWhile(() => done.size < lost.size),
          // Bounded: a producer not found within the latest batches is forgotten (its next batch that does not start
          // a producer epoch is refused `UnknownProducer`, as Kafka's producer state beyond its snapshots is).
          Stream.take(PRODUCER_SCAN_BATCHES),
          Stream.runForEach(([k, v]) =>
            Effect.map(decode(k, v), (b) => {
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
        for (const [id, batches] of found) {
          let entry: ProducerState.Entry | undefined
          for (const b of batches) entry = ProducerState.record(entry, b.producer!, b.records.length, b.baseOffset)
          changes.set(id, entry)
        }
        return changes
      })

    const truncateTo: TabletLog["truncateTo"] = (offset) =>
      alone(
        Effect.gen(function* () {
          if (offset >= state.end) return
          if (offset < state.start) {
            return yield* Effect.fail(error({ _tag: "OffsetOutOfRange", offset, start: state.start, end: state.end }))
          }
          const { ops, end } = yield* cutFrom(offset)
          const epochs = LeaderEpochCache.truncateFromEnd(state.epochs, end)
          const changes = yield* producersBefore(end)
          yield* commit(ops, { start: state.start, end, hw: Math.min(state.hw, end), epochs }, changes)
        })
      )

    const deleteBefore: TabletLog["deleteBefore"] = (offset) =>
      alone(
        Effect.gen(function* () {
          if (offset <= state.start) return
          if (offset > state.end) {
            return yield* Effect.fail(error({ _tag: "OffsetOutOfRange", offset, start: state.start, end: state.end }))
          }
          // Whole batches below `offset` go; the one holding it stays (read from `offset` on).
          const ops: Array<StoreOp> = []
          yield* store.scan({ gte: Codec.BATCHES.gte, lt: Codec.batchKey(offset) }).pipe(
            Stream.mapError(storeFailed),
            Stream.runForEach(([k, v]) =>
              Effect.map(decode(k, v), (b) => {
                if (b.baseOffset + b.records.length <= offset) ops.push(del(k))
              })
            )
          )
          const epochs = LeaderEpochCache.truncateFromStart(state.epochs, offset)
          // A producer whose batches all went with them goes too (Kafka removes such producers at log start moves).
          const changes = new Map<number, undefined>()
          for (const [id, entry] of state.producers) {
            if (entry.batches.every((b) => b.lastOffset < offset)) changes.set(id, undefined)
          }
          yield* commit(ops, { start: offset, end: state.end, hw: Math.max(state.hw, offset), epochs }, changes)
        })
      )

    const resetTo: TabletLog["resetTo"] = (offset) =>
      alone(
        Effect.gen(function* () {
          const ops: Array<StoreOp> = []
          yield* store.scan(Codec.BATCHES).pipe(
            Stream.mapError(storeFailed),
            Stream.runForEach(([k]) => Effect.sync(() => ops.push(del(k))))
          )
          const changes = new Map<number, undefined>()
          for (const id of state.producers.keys()) changes.set(id, undefined)
          yield* commit(ops, { start: offset, end: offset, hw: offset, epochs: LeaderEpochCache.empty }, changes)
        })
      )

    const log: TabletLog = {
      tablet,
      logStartOffset: Effect.sync(() => state.start),
      logEndOffset: Effect.sync(() => state.end),
      highWatermark: Effect.sync(() => state.hw),
      epochs: Effect.sync(() => state.epochs),
      producers: Effect.sync(() => new Map(state.producers)),
      expireProducers: (idleMs) =>
        alone(
          Effect.gen(function* () {
            const now = yield* Clock.currentTimeMillis
            const changes = new Map<number, undefined>()
            for (const id of state.producers.keys()) {
              if (now - (lastAppend.get(id) ?? openedAt) >= idleMs) changes.set(id, undefined)
            }
            if (changes.size > 0) yield* commit([], state, changes)
            return changes.size
          })
        ),
      append: (epoch, records, producer) =>
        alone(
          Effect.suspend(() => {
            const baseOffset = state.end
            if (producer !== undefined) {
              const verdict = ProducerState.check(state.producers.get(producer.id), producer, records.length)
              if (verdict._tag === "Duplicate") {
                return Effect.succeed<Appended>({
                  baseOffset: verdict.baseOffset,
                  lastOffset: verdict.lastOffset,
                  duplicate: true
                })
              }
              if (verdict._tag !== "Append") {
                return Effect.fail(error({ _tag: "ProducerRefused", producer: producer.id, verdict }))
              }
            }
            return Effect.as(appendAt([{ baseOffset, epoch, records, producer }]), {
              baseOffset,
              lastOffset: baseOffset + records.length - 1
            })
          })
        ),
      appendBatches: (batches) => alone(appendAt(batches)),
      read,
      endOffsetForEpoch: (epoch) => Effect.sync(() => LeaderEpochCache.endOffsetFor(state.epochs, epoch, state.end)),
      truncateTo,
      deleteBefore,
      resetTo,
      checkpointHighWatermark: (hw) =>
        alone(
          Effect.suspend(() => {
            const next = Math.min(Math.max(hw, state.start), state.end)
            return write([put(Codec.fieldKey("hw"), Codec.encodeOffset(next))]).pipe(
              Effect.tap(() =>
                Effect.sync(() => {
                  state.hw = next
                  trimTail(next)
                })
              )
            )
          })
        )
    }
    return log
  })
