/**
 * A registered table's handle: reads (`get`, `has`, `entries`, `scan`) and writes (`set`, `delete`, `update`) over
 * the partitions open here. Reads see, in order, the current record's own writes, the partition's write buffer, its
 * cache of stored values, then the store. Writes go into the current record's collector; outside `process` they are
 * sent on their own at once. Checks and lookups run synchronously: one Effect per call, not one per step.
 *
 * `Tables.register` builds handles (and `Tables` re-exports `TableHandle` and `PartitionOption`); this module
 * depends only on the definitions (`Table`) and the write path's parts, never on the manager.
 *
 * @since 0.1.0
 */
import { type Store, StoreValidation, type TableManager } from "@strata/core"
import { Effect, Option, Result, Stream } from "effect"
import { type Collector, CurrentCollector, make as makeCollector, type Registered } from "./internal/collector.js"
import * as PartitionWrites from "./internal/partitionWrites.js"
import type { Change } from "./internal/partitionWrites.js"
import {
  type Codecs,
  InvalidPartition,
  keyPartition,
  PartitionNotAvailable,
  PartitionRestoreFailed,
  TableError,
  TableStoreFailed
} from "./Table.js"

/** Where a read or write goes: an explicit partition, else the current source record's, else the key's hash. */
export interface PartitionOption {
  readonly partition?: number
}

/** A registered table. Reads see the worker's own uncommitted writes. */
export interface TableHandle<K, V> {
  readonly info: TableManager.TableInfo
  readonly get: (key: K, options?: PartitionOption) => Effect.Effect<Option.Option<V>, TableError>
  readonly has: (key: K, options?: PartitionOption) => Effect.Effect<boolean, TableError>
  readonly set: (key: K, value: V, options?: PartitionOption) => Effect.Effect<void, TableError>
  readonly delete: (key: K, options?: PartitionOption) => Effect.Effect<void, TableError>
  /** Reads, applies `f` to the current value (if any) and writes the result. */
  readonly update: (
    key: K,
    f: (current: Option.Option<V>) => V,
    options?: PartitionOption
  ) => Effect.Effect<V, TableError>
  /**
   * Every entry of a partition, in key-byte order (including the worker's uncommitted writes), as of one moment: a
   * commit running meanwhile waits for the store scan, so its values are read from either the buffer or the store.
   */
  readonly entries: (partition: number) => Effect.Effect<ReadonlyArray<readonly [K, V]>, TableError>
  /** `entries` as a stream. */
  readonly scan: (partition: number) => Stream.Stream<readonly [K, V], TableError>
}

/** What a handle needs from the table manager. */
export interface HandleDeps {
  /** Sends a collector's writes and buffers them (writes outside `process`). */
  readonly sendCollector: (collector: Collector) => Effect.Effect<void, TableError>
  /** The store's limits: a write beyond them is refused before anything is produced. */
  readonly limits: Store.Limits
}

/** One handle's parts: what its functions share. */
interface Handle<K, V> {
  readonly table: Registered
  readonly name: string
  readonly codecs: Codecs<K, V>
  readonly deps: HandleDeps
}

/** Where a key lives: its bytes, its partition, that partition's write state and the key's `keyId`. */
interface Located {
  readonly k: Uint8Array
  readonly partition: number
  readonly w: PartitionWrites.PartitionWrites
  readonly id: string
}

const tableError = (reason: TableError["reason"]) => new TableError({ reason })
const storeFailed = (table: string) => (cause: TableStoreFailed["cause"]) =>
  tableError(new TableStoreFailed({ table, cause }))
const compareBytes = (a: Uint8Array, b: Uint8Array): number => Buffer.compare(a, b)

/** The open partition `partition` of a table, or why it cannot be used here. */
export const lookupPartition = (table: Registered, partition: number): PartitionWrites.PartitionWrites | TableError => {
  const name = table.info.name
  if (!Number.isSafeInteger(partition) || partition < 0 || partition >= table.info.partitions) {
    return tableError(new InvalidPartition({ table: name, partition, partitions: table.info.partitions }))
  }
  const w = table.partitions.get(partition)
  if (w === undefined) {
    return tableError(new PartitionNotAvailable({ table: name, partition, detail: "not assigned to this worker" }))
  }
  return w.failure === undefined
    ? w
    : tableError(new PartitionRestoreFailed({ table: name, partition, reason: w.failure }))
}

/** Builds the handle of a registered table over the write path's parts. */
export const make = <K, V>(table: Registered, codecs: Codecs<K, V>, deps: HandleDeps): TableHandle<K, V> => {
  const h: Handle<K, V> = { table, name: table.info.name, codecs, deps }
  const handle: TableHandle<K, V> = {
    info: table.info,
    get: (key, options) => get(h, key, options),
    has: (key, options) => Effect.map(readRaw(h, key, options), Option.isSome),
    set: (key, value, options) => write(h, key, Option.some(value), options),
    delete: (key, options) => write(h, key, Option.none(), options),
    update: (key, f, options) => update(h, key, f, options),
    entries: (partition) => entries(h, partition),
    scan: (partition) => Stream.unwrap(Effect.map(entries(h, partition), Stream.fromIterable))
  }
  return handle
}

// ---------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------

/** The partition a key goes to: the explicit one, else the current source record's (tables), else its hash. */
const resolve = <K, V>(
  h: Handle<K, V>,
  encodedKey: Uint8Array,
  options: PartitionOption | undefined,
  collector: Collector | undefined
) =>
  options?.partition ??
  (collector?.source !== undefined && h.table.info.kind === "table"
    ? collector.source.partition
    : keyPartition(encodedKey, h.table.info.partitions))

/** Where a key lives, synchronously, or why it cannot be read or written. */
const locate = <K, V>(
  h: Handle<K, V>,
  key: K,
  options: PartitionOption | undefined,
  collector: Collector | undefined
): Located | TableError => {
  const encoded = h.codecs.encodeKeyWithId(key)
  if (Result.isFailure(encoded)) return tableError(encoded.failure)
  const k = encoded.success.bytes
  const partition = resolve(h, k, options, collector)
  const w = lookupPartition(h.table, partition)
  if (w instanceof TableError) return w
  return { k, partition, w, id: encoded.success.id }
}

/** The value not yet in the store (this record's writes first, then the buffer), if there is one. */
const unstored = (loc: Located, collector: Collector | undefined): Change | undefined =>
  collector?.view.get(loc.w)?.get(loc.id) ?? loc.w.dirty.get(loc.id)

/**
 * `then` of the value from the store (through the partition's cache), remembered for the next read: one Effect
 * step when the store is read, none when the cache knows the key.
 */
const stored = <A>(
  name: string,
  loc: Located,
  then: (raw: Option.Option<Uint8Array>) => Effect.Effect<A, TableError>
): Effect.Effect<A, TableError> => {
  const known = PartitionWrites.cached(loc.w, loc.id)
  if (known !== undefined) return then(Option.fromNullishOr(known))
  const version = loc.w.storeVersion
  return Effect.matchEffect(loc.w.store.get(loc.k), {
    onFailure: (cause) => Effect.fail(storeFailed(name)(cause)),
    onSuccess: (raw) => {
      // Only a value no store write can have overtaken.
      if (loc.w.storeVersion === version) PartitionWrites.remember(loc.w, loc.id, Option.getOrNull(raw))
      return then(raw)
    }
  })
}

/** A key's bytes as a read sees them, or none. */
const readRaw = <K, V>(h: Handle<K, V>, key: K, options?: PartitionOption) =>
  Effect.flatMap(CurrentCollector, (collector): Effect.Effect<Option.Option<Uint8Array>, TableError> => {
    const loc = locate(h, key, options, collector)
    if (loc instanceof TableError) return Effect.fail(loc)
    const change = unstored(loc, collector)
    return change !== undefined
      ? Effect.succeed(Option.fromNullishOr(change.value))
      : stored(h.name, loc, Effect.succeed)
  })

/** A value's bytes decoded, synchronously. */
const decoded = <K, V>(h: Handle<K, V>, raw: Option.Option<Uint8Array>): Option.Option<V> | TableError => {
  if (Option.isNone(raw)) return Option.none()
  const r = h.codecs.decodeValue(raw.value)
  return Result.isFailure(r) ? tableError(r.failure) : Option.some(r.success)
}

const get = <K, V>(h: Handle<K, V>, key: K, options?: PartitionOption) =>
  Effect.flatMap(readRaw(h, key, options), (raw) => {
    const value = decoded(h, raw)
    return value instanceof TableError ? Effect.fail(value) : Effect.succeed(value)
  })

/**
 * Every live entry of a partition, decoded, in key-byte order: the store and the buffer read under one permit (no
 * flush moves the buffer into the store between them), then the current record's writes on top.
 */
const entries = <K, V>(h: Handle<K, V>, partition: number) =>
  Effect.gen(function* () {
    const w = lookupPartition(h.table, partition)
    if (w instanceof TableError) return yield* Effect.fail(w)
    const merged = new Map<string, Change>()
    yield* PartitionWrites.shared(
      w,
      Effect.map(Stream.runCollect(w.store.scan()), (stored) => {
        for (const [k, v] of stored) {
          const id = PartitionWrites.keyId(k)
          merged.set(id, { key: k, value: v, id })
        }
        for (const [id, change] of w.dirty) merged.set(id, change)
      })
    ).pipe(Effect.mapError(storeFailed(h.name)))
    const collector = yield* CurrentCollector
    if (collector !== undefined) {
      for (const c of collector.writes) {
        if (c.table === h.table && c.partition === partition) merged.set(c.change.id, c.change)
      }
    }
    const live: Array<{ readonly key: Uint8Array; readonly value: Uint8Array }> = []
    for (const c of merged.values()) if (c.value !== null) live.push({ key: c.key, value: c.value })
    live.sort((a, b) => compareBytes(a.key, b.key))
    const out: Array<readonly [K, V]> = []
    for (const c of live) {
      const k = h.codecs.decodeKey(c.key)
      if (Result.isFailure(k)) return yield* Effect.fail(tableError(k.failure))
      const v = h.codecs.decodeValue(c.value)
      if (Result.isFailure(v)) return yield* Effect.fail(tableError(v.failure))
      out.push([k.success, v.success] as const)
    }
    return out
  })

// ---------------------------------------------------------------------------
// Writes
// ---------------------------------------------------------------------------

/** Records a write in `collector`, synchronously: why it is refused, or nothing. */
const collect = <K, V>(
  h: Handle<K, V>,
  loc: Located,
  value: Option.Option<V>,
  collector: Collector
): TableError | undefined => {
  let v: Uint8Array | null = null
  if (Option.isSome(value)) {
    const r = h.codecs.encodeValue(value.value)
    if (Result.isFailure(r)) return tableError(r.failure)
    v = r.success
  }
  // The store's own checks, before the write is produced: a changelog record its store cannot take would fail
  // every later commit and every restore.
  const limits = h.deps.limits
  const refused =
    StoreValidation.checkKey(loc.k, limits) ?? (v === null ? undefined : StoreValidation.checkValue(v, limits))
  if (refused !== undefined) return tableError(new TableStoreFailed({ table: h.name, cause: refused }))
  if (loc.w.standby) {
    return tableError(
      new PartitionNotAvailable({
        table: h.name,
        partition: loc.partition,
        detail: "a standby replica here: not writable"
      })
    )
  }
  const change: Change = { key: loc.k, value: v, id: loc.id }
  collector.writes.push({ table: h.table, partition: loc.partition, change, source: collector.source })
  let own = collector.view.get(loc.w)
  if (own === undefined) {
    own = new Map()
    collector.view.set(loc.w, own)
  }
  own.set(loc.id, change)
  return undefined
}

/** Records a write in the current record's collector and gives `a`; outside `process` it is sent on its own. */
const stage = <K, V, A>(
  h: Handle<K, V>,
  loc: Located,
  value: Option.Option<V>,
  current: Collector | undefined,
  a: A
): Effect.Effect<A, TableError> => {
  const collector: Collector = current ?? makeCollector(undefined)
  const refused = collect(h, loc, value, collector)
  if (refused !== undefined) return Effect.fail(refused)
  return current === undefined ? Effect.as(h.deps.sendCollector(collector), a) : Effect.succeed(a)
}

const write = <K, V>(h: Handle<K, V>, key: K, value: Option.Option<V>, options?: PartitionOption) =>
  Effect.flatMap(CurrentCollector, (current): Effect.Effect<void, TableError> => {
    const loc = locate(h, key, options, current)
    return loc instanceof TableError ? Effect.fail(loc) : stage(h, loc, value, current, undefined)
  })

/** Read, `f`, write: the key located and encoded once. */
const update = <K, V>(h: Handle<K, V>, key: K, f: (current: Option.Option<V>) => V, options?: PartitionOption) =>
  Effect.flatMap(CurrentCollector, (current): Effect.Effect<V, TableError> => {
    const loc = locate(h, key, options, current)
    if (loc instanceof TableError) return Effect.fail(loc)
    const change = unstored(loc, current)
    return change !== undefined
      ? applyUpdate(h, loc, Option.fromNullishOr(change.value), f, current)
      : stored(h.name, loc, (raw) => applyUpdate(h, loc, raw, f, current))
  })

const applyUpdate = <K, V>(
  h: Handle<K, V>,
  loc: Located,
  raw: Option.Option<Uint8Array>,
  f: (current: Option.Option<V>) => V,
  current: Collector | undefined
): Effect.Effect<V, TableError> => {
  const value = decoded(h, raw)
  if (value instanceof TableError) return Effect.fail(value)
  const next = f(value)
  return stage(h, loc, Option.some(next), current, next)
}
