/**
 * A registered table's handle: reads (`get`, `has`, `entries`, `scan`) and writes (`set`, `delete`, `update`) over
 * the partitions open here. Reads see, in order, the current record's own writes, the partition's write buffer, its
 * cache of stored values, then the store. Writes go into the current record's collector; outside `process` they are
 * sent on their own at once. Checks and lookups run synchronously: one Effect per call, not one per step.
 *
 * @internal
 */
import { type StoreLimits, StoreValidation } from "@strata/core"
import { Effect, Option, Result, Stream } from "effect"
import { type Codecs, keyPartition, PartitionNotAvailable, TableError, TableStoreFailed } from "../Table.js"
import type { PartitionOption, TableHandle } from "../Tables.js"
import { type Collector, CurrentCollector, make as makeCollector, type Registered } from "./collector.js"
import * as PartitionWrites from "./partitionWrites.js"
import type { Change } from "./partitionWrites.js"

/** What a handle needs from the table manager. */
export interface HandleDeps {
  /** The open partition, or why it cannot be used here. */
  readonly lookupPartition: (table: Registered, partition: number) => PartitionWrites.PartitionWrites | TableError
  /** Sends a collector's writes and buffers them (writes outside `process`). */
  readonly sendCollector: (collector: Collector) => Effect.Effect<void, TableError>
  /** The store's limits: a write beyond them is refused before anything is produced. */
  readonly limits: StoreLimits
}

const tableError = (reason: TableError["reason"]) => new TableError({ reason })
const storeFailed = (table: string) => (cause: TableStoreFailed["cause"]) =>
  tableError(new TableStoreFailed({ table, cause }))
const compareBytes = (a: Uint8Array, b: Uint8Array): number => Buffer.compare(a, b)

/** Builds the handle of a registered table over the write path's parts. */
export const make = <K, V>(table: Registered, codecs: Codecs<K, V>, deps: HandleDeps): TableHandle<K, V> => {
  const { lookupPartition, sendCollector } = deps
  const partitionOf = (partition: number) =>
    Effect.suspend(() => {
      const w = lookupPartition(table, partition)
      return w instanceof TableError ? Effect.fail(w) : Effect.succeed(w)
    })
  const name = table.info.name
  const partitions = table.info.partitions
  const resolve = (encodedKey: Uint8Array, options: PartitionOption | undefined, collector: Collector | undefined) =>
    options?.partition ??
    (collector?.source !== undefined && table.info.kind === "table"
      ? collector.source.partition
      : keyPartition(encodedKey, partitions))

  const decodeValue = (bytes: Uint8Array) => {
    const r = codecs.decodeValue(bytes)
    return Result.isFailure(r) ? Effect.fail(tableError(r.failure)) : Effect.succeed(r.success)
  }

  // Reads and writes run their checks and lookups synchronously: one Effect each, not one per step.

  /** Where a key lives: its bytes, its partition and that partition's write state. */
  const locate = (key: K, options: PartitionOption | undefined, collector: Collector | undefined) => {
    const encoded = codecs.encodeKey(key)
    if (Result.isFailure(encoded)) return tableError(encoded.failure)
    const k = encoded.success
    const partition = resolve(k, options, collector)
    const w = lookupPartition(table, partition)
    if (w instanceof TableError) return w
    return { k, partition, w, id: PartitionWrites.keyId(k) }
  }
  type Located = Exclude<ReturnType<typeof locate>, TableError>

  /** The value not yet in the store (this record's writes first, then the buffer), if there is one. */
  const unstored = (loc: Located, collector: Collector | undefined): Change | undefined =>
    collector?.view.get(loc.w)?.get(loc.id) ?? loc.w.dirty.get(loc.id)

  /**
   * `then` of the value from the store (through the partition's cache), remembered for the next read: one Effect
   * step when the store is read, none when the cache knows the key.
   */
  const stored = <A>(
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

  const readLocated = (loc: Located, collector: Collector | undefined) => {
    const change = unstored(loc, collector)
    return change !== undefined ? Effect.succeed(Option.fromNullishOr(change.value)) : stored(loc, Effect.succeed)
  }

  const readRaw = (key: K, options?: PartitionOption) =>
    Effect.flatMap(CurrentCollector, (collector): Effect.Effect<Option.Option<Uint8Array>, TableError> => {
      const loc = locate(key, options, collector)
      return loc instanceof TableError ? Effect.fail(loc) : readLocated(loc, collector)
    })

  const decoded = (raw: Option.Option<Uint8Array>): Option.Option<V> | TableError => {
    if (Option.isNone(raw)) return Option.none()
    const r = codecs.decodeValue(raw.value)
    return Result.isFailure(r) ? tableError(r.failure) : Option.some(r.success)
  }

  const get = (key: K, options?: PartitionOption) =>
    Effect.flatMap(readRaw(key, options), (raw) => {
      const value = decoded(raw)
      return value instanceof TableError ? Effect.fail(value) : Effect.succeed(value)
    })

  /** Records a write in `collector`, synchronously: why it is refused, or nothing. */
  const collect = (loc: Located, value: Option.Option<V>, collector: Collector): TableError | undefined => {
    let v: Uint8Array | null = null
    if (Option.isSome(value)) {
      const r = codecs.encodeValue(value.value)
      if (Result.isFailure(r)) return tableError(r.failure)
      v = r.success
    }
    // The store's own checks, before the write is produced: a changelog record its store cannot take would fail
    // every later commit and every restore.
    const refused =
      StoreValidation.checkKey(loc.k, deps.limits) ??
      (v === null ? undefined : StoreValidation.checkValue(v, deps.limits))
    if (refused !== undefined) return tableError(new TableStoreFailed({ table: name, cause: refused }))
    if (loc.w.standby) {
      return tableError(
        new PartitionNotAvailable({
          table: name,
          partition: loc.partition,
          detail: "a standby replica here: not writable"
        })
      )
    }
    const change: Change = { key: loc.k, value: v, id: loc.id }
    collector.writes.push({ table, partition: loc.partition, change, source: collector.source })
    let own = collector.view.get(loc.w)
    if (own === undefined) {
      own = new Map()
      collector.view.set(loc.w, own)
    }
    own.set(loc.id, change)
    return undefined
  }

  /** Records a write in the current record's collector and gives `a`; outside `process` it is sent on its own. */
  const stage = <A>(loc: Located, value: Option.Option<V>, current: Collector | undefined, a: A) => {
    const collector: Collector = current ?? makeCollector(undefined)
    const refused = collect(loc, value, collector)
    if (refused !== undefined) return Effect.fail(refused)
    return current === undefined ? Effect.as(sendCollector(collector), a) : Effect.succeed(a)
  }

  const write = (key: K, value: Option.Option<V>, options?: PartitionOption) =>
    Effect.flatMap(CurrentCollector, (current): Effect.Effect<void, TableError> => {
      const loc = locate(key, options, current)
      return loc instanceof TableError ? Effect.fail(loc) : stage(loc, value, current, undefined)
    })

  /** Read, `f`, write: the key located and encoded once. */
  const update = (key: K, f: (current: Option.Option<V>) => V, options?: PartitionOption) =>
    Effect.flatMap(CurrentCollector, (current): Effect.Effect<V, TableError> => {
      const loc = locate(key, options, current)
      if (loc instanceof TableError) return Effect.fail(loc)
      const change = unstored(loc, current)
      return change !== undefined
        ? applyUpdate(loc, Option.fromNullishOr(change.value), f, current)
        : stored(loc, (raw) => applyUpdate(loc, raw, f, current))
    })

  const applyUpdate = (
    loc: Located,
    raw: Option.Option<Uint8Array>,
    f: (current: Option.Option<V>) => V,
    current: Collector | undefined
  ): Effect.Effect<V, TableError> => {
    const value = decoded(raw)
    if (value instanceof TableError) return Effect.fail(value)
    const next = f(value)
    return stage(loc, Option.some(next), current, next)
  }

  const handle: TableHandle<K, V> = {
    info: table.info,
    get,
    has: (key, options) => Effect.map(readRaw(key, options), Option.isSome),
    set: (key, value, options) => write(key, Option.some(value), options),
    delete: (key, options) => write(key, Option.none(), options),
    update,
    entries: (partition) =>
      Effect.gen(function* () {
        const w = yield* partitionOf(partition)
        const merged = new Map<string, Change>()
        // The store scan and the buffer read share one permit: no flush moves the buffer into the store between them.
        yield* PartitionWrites.shared(
          w,
          Effect.map(Stream.runCollect(w.store.scan()), (stored) => {
            for (const [k, v] of stored) {
              const id = PartitionWrites.keyId(k)
              merged.set(id, { key: k, value: v, id })
            }
            for (const [id, change] of w.dirty) merged.set(id, change)
          })
        ).pipe(Effect.mapError(storeFailed(name)))
        const collector = yield* CurrentCollector
        if (collector !== undefined) {
          for (const c of collector.writes) {
            if (c.table === table && c.partition === partition) merged.set(c.change.id, c.change)
          }
        }
        const live: Array<{ readonly key: Uint8Array; readonly value: Uint8Array }> = []
        for (const c of merged.values()) if (c.value !== null) live.push({ key: c.key, value: c.value })
        live.sort((a, b) => compareBytes(a.key, b.key))
        const out: Array<readonly [K, V]> = []
        for (const c of live) {
          const k = codecs.decodeKey(c.key)
          if (Result.isFailure(k)) return yield* Effect.fail(tableError(k.failure))
          out.push([k.success, yield* decodeValue(c.value)] as const)
        }
        return out
      }),
    scan: (partition) => Stream.unwrap(Effect.map(handle.entries(partition), Stream.fromIterable))
  }
  return handle
}
