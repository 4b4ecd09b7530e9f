/**
 * One open table partition on the write path: its store, the changes not yet in the store (the write buffer reads
 * see at once), the acks of the changelog records those changes were sent as, and the source offsets they cover.
 *
 * A write is buffered and its changelog records handed to the producer in one step, without waiting for the ack;
 * a flush waits for every ack, then writes the buffer, the highest changelog offset and the source offsets in one
 * atomic store batch. Writers hold one permit of the partition's lock while they buffer and send, and so does a
 * scan while it reads the store and then the buffer; a flush holds them all, so it never persists an offset ahead
 * of a change, nor loses a change buffered meanwhile, and a scan sees the buffer either before or after a flush.
 *
 * @internal
 */
import { type Log, Models, type Recovery, Store } from "@strata/core"
import { Data, Effect, Option, type Scope, Semaphore } from "effect"
import { advance } from "./offsets.js"

/** A change of one key: a `null` value deletes it. */
export interface Change {
  readonly key: Uint8Array
  readonly value: Uint8Array | null
  /** The key's `keyId`. */
  readonly id: string
}

/** The write state of one open table partition. */
export interface PartitionWrites {
  readonly store: Store.PartitionStore
  readonly scope: Scope.Closeable
  /** Changes sent to the changelog, not yet in the store, by key (`keyId`). */
  readonly dirty: Map<string, Change>
  /** For each send not yet persisted, the highest changelog offset it wrote here (`-1` when unknown, acks 0). */
  acks: Array<Effect.Effect<number, Log.LogError>>
  /** Per source partition, one past the last source record whose writes are buffered here. */
  readonly sources: Map<string, Models.TopicPartitionOffset>
  readonly lock: Semaphore.Semaphore
  /** A standby replica: restored and tailed, not written (until promoted). */
  standby: boolean
  /**
   * Values known to be in the store, by key (`keyId`), at most `cacheEntries`: a read found here does not go to the
   * store. Oldest first; an entry used since it was last passed over gets a second chance (the clock policy, LRU's
   * usual approximation: a hit sets a flag instead of moving the entry).
   */
  readonly cache: Map<string, CacheEntry>
  readonly cacheEntries: number
  /**
   * Bumped before every write to the store: a read that started before may have seen the old value and must not
   * put it in the cache.
   */
  storeVersion: number
  /** Why the partition's restore failed, if it did: it is neither read nor written while set. */
  failure: Recovery.ErrorReason | undefined
  /** The highest changelog offset the store persisted, as far as known here: a flush never writes a lower one. */
  persisted: number | undefined
}

/** A cached store value (`null`: known absent) and whether a read used it since eviction last passed it over. */
export interface CacheEntry {
  value: Uint8Array | null
  used: boolean
}

const EXCLUSIVE = 1 << 30

/** The key of a change in `dirty`: its bytes as latin1 text (one char per byte). */
export const keyId = (key: Uint8Array): string =>
  key instanceof Buffer
    ? key.toString("latin1")
    : Buffer.from(key.buffer, key.byteOffset, key.byteLength).toString("latin1")

/** A partition's write state over an opened store. */
export const make = (
  store: Store.PartitionStore,
  scope: Scope.Closeable,
  standby: boolean,
  cacheEntries: number
): PartitionWrites => ({
  store,
  cache: new Map(),
  cacheEntries,
  storeVersion: 0,
  failure: undefined,
  persisted: undefined,
  scope,
  dirty: new Map(),
  acks: [],
  sources: new Map(),
  lock: Semaphore.makeUnsafe(EXCLUSIVE),
  standby
})

/** Runs `effect` holding one permit: many writers and readers at once, no flush meanwhile. */
export const shared = <A, E, R>(w: PartitionWrites, effect: Effect.Effect<A, E, R>) =>
  Semaphore.withPermits(w.lock, 1)(effect)

/** Runs `effect` holding every permit: no writer meanwhile. */
export const exclusive = <A, E, R>(w: PartitionWrites, effect: Effect.Effect<A, E, R>) =>
  Semaphore.withPermits(w.lock, EXCLUSIVE)(effect)

/**
 * Buffers one send's changes (in order: a later change of a key replaces an earlier one), with the effect that
 * gives the send's highest changelog offset here and the source record it processed.
 */
export const buffer = (
  w: PartitionWrites,
  changes: ReadonlyArray<Change>,
  ack: Effect.Effect<number, Log.LogError>,
  source: Models.TopicPartitionOffset | undefined
): void => {
  for (const change of changes) w.dirty.set(change.id, change)
  w.acks.push(ack)
  if (source !== undefined) {
    const next = { ...source, offset: source.offset + 1 }
    const seen = w.sources.get(Models.tpKey(next))
    if (seen === undefined || next.offset > seen.offset) w.sources.set(Models.tpKey(next), next)
  }
}

/** A value the store holds, if the cache knows it (`undefined`: not cached). */
export const cached = (w: PartitionWrites, id: string): Uint8Array | null | undefined => {
  const entry = w.cache.get(id)
  if (entry === undefined) return undefined
  entry.used = true
  return entry.value
}

/** Remembers what the store holds for a key; beyond the bound, the oldest entry not used since it was passed over goes. */
export const remember = (w: PartitionWrites, id: string, value: Uint8Array | null): void => {
  if (w.cacheEntries === 0) return
  const entry = w.cache.get(id)
  if (entry !== undefined) {
    entry.value = value
    entry.used = true
    return
  }
  // Room is made before the entry goes in last: it is the last one a pass reaches.
  if (w.cache.size >= w.cacheEntries) evictOne(w.cache)
  w.cache.set(id, { value, used: false })
}

/** Drops one entry: the oldest not used since it was last passed over; a used one passed over moves to the end. */
const evictOne = (cache: Map<string, CacheEntry>): void => {
  // Every pass clears the flags it meets, so the second pass at the latest finds one to drop.
  for (const [id, entry] of cache) {
    cache.delete(id)
    if (!entry.used) return
    entry.used = false
    cache.set(id, entry)
  }
}

/** Forgets what the cache knows of a key (the store changed under it). */
export const forget = (w: PartitionWrites, id: string): void => {
  if (w.cache.size > 0) w.cache.delete(id)
}

/**
 * A flush would persist a changelog offset below the one the store holds: the changelog was deleted and made again,
 * or truncated, under the partition. Nothing is written; the store's data no longer matches its changelog.
 */
export class ChangelogBehindStore extends Data.TaggedError("ChangelogBehindStore")<{
  readonly changelog: Models.TopicPartition
  readonly persisted: number
  readonly offset: number
}> {
  override get message() {
    return (
      `the changelog ${this.changelog.topic}/${this.changelog.partition} gave offset ${this.offset}, below the ` +
      `offset ${this.persisted} the store persisted: it was recreated or truncated; nothing was persisted`
    )
  }
}

/** Whether a flush has anything to write. */
const isClean = (w: PartitionWrites) => w.dirty.size === 0 && w.acks.length === 0

/**
 * Waits for every ack, then writes the buffer, the highest changelog offset of `changelog` and the source offsets
 * (with `extra`) in one atomic batch, and empties the buffer. A failed ack fails the flush and leaves the buffer as
 * it was: nothing of it reaches the store.
 */
export const flush = (
  w: PartitionWrites,
  changelog: Models.TopicPartition,
  extra: ReadonlyArray<Models.TopicPartitionOffset>
): Effect.Effect<void, Log.LogError | Store.StoreError | ChangelogBehindStore> =>
  exclusive(
    w,
    Effect.gen(function* () {
      if (isClean(w) && extra.length === 0) return
      const offsets = yield* Effect.all(w.acks)
      let pending: number | undefined
      for (const offset of offsets) pending = advance(pending, offset)
      const ops: Array<Store.Op> = []
      for (const change of w.dirty.values())
        ops.push(change.value === null ? Store.del(change.key) : Store.put(change.key, change.value))
      // The source offsets of every buffered write go with it: the store then says where to resume each source.
      const sources = new Map(w.sources)
      for (const o of extra) {
        const seen = sources.get(Models.tpKey(o))
        if (seen === undefined || o.offset > seen.offset) sources.set(Models.tpKey(o), o)
      }
      const persisted: Array<Models.TopicPartitionOffset> = [...sources.values()]
      if (pending !== undefined) {
        // A persisted offset never goes backwards.
        if (w.persisted === undefined) {
          w.persisted = Option.getOrUndefined(yield* w.store.persistedOffset(changelog))
        }
        if (w.persisted !== undefined && pending < w.persisted) {
          return yield* Effect.fail(new ChangelogBehindStore({ changelog, persisted: w.persisted, offset: pending }))
        }
        persisted.push({ ...changelog, offset: pending })
      }
      w.storeVersion++
      yield* w.store.write(ops, { offsets: persisted })
      if (pending !== undefined) w.persisted = pending
      // What was written is what the store holds now.
      for (const [id, change] of w.dirty) remember(w, id, change.value)
      discard(w)
    })
  )

/** Forgets every change not yet in the store (their changelog records stay in the log). */
export const discard = (w: PartitionWrites): void => {
  w.dirty.clear()
  w.acks = []
  w.sources.clear()
}
