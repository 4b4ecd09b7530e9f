/**
 * The `Store` protocol: an ordered byte key-value store per (table, partition),
 * whose persisted changelog offsets are written in the same atomic batch as the
 * data they cover.
 *
 * Keys are non-empty byte strings that do not start with `0xFF` (that prefix is
 * reserved for the store's own metadata; UTF-8 text never starts with it).
 *
 * @since 0.1.0
 */
import type * as Models from "./Models.js"
import type { Option, Scope, Stream } from "effect"
import { Context, type Effect, Schema } from "effect"

/** Identifies one partition store: the table's name and the partition number. */
export interface Id {
  readonly table: string
  readonly partition: number
}

/** One operation of an atomic write batch. */
export type Op =
  | { readonly _tag: "put"; readonly key: Uint8Array; readonly value: Uint8Array }
  | { readonly _tag: "delete"; readonly key: Uint8Array }

/** Builds a put operation. */
export const put = (key: Uint8Array, value: Uint8Array): Op => ({ _tag: "put", key, value })
/** Builds a delete operation. */
export const del = (key: Uint8Array): Op => ({ _tag: "delete", key })

/** Bounds of a scan; keys compare bytewise. With no bound the scan covers every key. */
export interface ScanRange {
  readonly gt?: Uint8Array
  readonly gte?: Uint8Array
  readonly lt?: Uint8Array
  readonly lte?: Uint8Array
  /** Largest keys first. */
  readonly reverse?: boolean
  /** At most this many entries. */
  readonly limit?: number
}

/** A key and its value, as a scan yields them. */
export type Entry = readonly [key: Uint8Array, value: Uint8Array]

/** Options of `PartitionStore.write`. */
export interface WriteOptions {
  /** Changelog offsets to persist in the same atomic batch as the operations. */
  readonly offsets?: ReadonlyArray<Models.TopicPartitionOffset>
}

/** Size limits a store enforces on keys and values. */
export interface Limits {
  readonly maxKeyBytes: number
  readonly maxValueBytes: number
}

/** An open partition store. Closed by the scope it was opened in. */
export interface PartitionStore {
  readonly id: Id
  /** The value of a key, if present. */
  readonly get: (key: Uint8Array) => Effect.Effect<Option.Option<Uint8Array>, StoreError>
  /** The values of many keys, in the order asked. */
  readonly getMany: (
    keys: ReadonlyArray<Uint8Array>
  ) => Effect.Effect<ReadonlyArray<Option.Option<Uint8Array>>, StoreError>
  /** Sets one key. */
  readonly put: (key: Uint8Array, value: Uint8Array) => Effect.Effect<void, StoreError>
  /** Removes one key (no error when absent). */
  readonly delete: (key: Uint8Array) => Effect.Effect<void, StoreError>
  /**
   * Applies the operations and persists the given offsets atomically: after a
   * crash either all of it is visible or none of it. Invalid input fails the
   * whole batch before anything is written.
   */
  readonly write: (ops: ReadonlyArray<Op>, options?: WriteOptions) => Effect.Effect<void, StoreError>
  /** Entries in key order (or reverse); stopping early releases the iterator. */
  readonly scan: (range?: ScanRange) => Stream.Stream<Entry, StoreError>
  /** Entries whose key starts with `prefix`. */
  readonly scanPrefix: (
    prefix: Uint8Array,
    options?: { readonly reverse?: boolean; readonly limit?: number }
  ) => Stream.Stream<Entry, StoreError>
  /** The offset last persisted for a changelog partition, if any. */
  readonly persistedOffset: (tp: Models.TopicPartition) => Effect.Effect<Option.Option<Models.Offset>, StoreError>
  /** Every persisted offset of this store. */
  readonly persistedOffsets: Effect.Effect<ReadonlyArray<Models.TopicPartitionOffset>, StoreError>
  /** Persists one offset on its own (an empty atomic batch). */
  readonly setPersistedOffset: (tp: Models.TopicPartition, offset: Models.Offset) => Effect.Effect<void, StoreError>
  /** Removes every entry and every persisted offset, atomically. */
  readonly clear: Effect.Effect<void, StoreError>
}

/** The `Store` service: opens and drops partition stores of one backend. */
export interface Shape {
  /** The backend's name, e.g. `"memory"`, `"level"`, `"rocksdb"`. */
  readonly backend: string
  readonly limits: Limits
  /**
   * Opens (creating if needed) the store of one partition. A partition store is
   * owned by one opener at a time: a second open while it is open fails with
   * `StoreLocked`. It is closed when the scope closes.
   */
  readonly open: (id: Id) => Effect.Effect<PartitionStore, StoreError, Scope.Scope>
  /** Deletes a partition's data for good. Fails with `StoreLocked` while it is open. */
  readonly drop: (id: Id) => Effect.Effect<void, StoreError>
}

/** The `Store` service key. */
export class Store extends Context.Service<Store, Shape>()("@strata/core/Store") {}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/** The store was used after it was closed. */
export class Closed extends Schema.TaggedError<Closed>()("StoreClosed", { store: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `store ${this.store} is closed`
  }
}

/** The store is already open (by this or another process). */
export class Locked extends Schema.TaggedError<Locked>()("StoreLocked", {
  store: Schema.String,
  path: Schema.optional(Schema.String)
}) {
  /** @since 0.1.0 */
  override get message() {
    return `store ${this.store} is locked: it is already open${this.path ? ` (${this.path})` : ""}`
  }
}

/**
 * The store's files are unreadable or corrupted: an engine checksum failed, a file the database needs is missing
 * (e.g. `CURRENT` beside table files), or a table or log is damaged. Nothing was wiped.
 */
export class Corrupted extends Schema.TaggedError<Corrupted>()("StoreCorrupted", {
  store: Schema.String,
  path: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `store ${this.store} at ${this.path} is corrupted or unreadable: ${this.detail}`
  }
}

/**
 * The directory holds something other than this backend's database: another engine's database (a LevelDB one for
 * the RocksDB store, or the reverse) or files no store engine writes. Nothing was written to it.
 */
export class ForeignStoreDirectory extends Schema.TaggedError<ForeignStoreDirectory>()("ForeignStoreDirectory", {
  store: Schema.String,
  path: Schema.String,
  /** What the directory holds, e.g. `a LevelDB database (CURRENT, MANIFEST-000004, 000005.ldb)`. */
  found: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `store ${this.store} cannot open ${this.path}: it holds ${this.found}; nothing was written to it`
  }
}

/** The process may not read or write the store's directory (its permissions, a read-only file system). */
export class AccessDenied extends Schema.TaggedError<AccessDenied>()("StoreAccessDenied", {
  store: Schema.String,
  path: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `store ${this.store} may not use ${this.path}: ${this.detail}`
  }
}

/** A key was not a non-empty `Uint8Array` within the limits, or used the reserved `0xFF` prefix. */
export class InvalidKey extends Schema.TaggedError<InvalidKey>()("InvalidKey", { detail: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `invalid key: ${this.detail}`
  }
}

/**
 * A value was not a `Uint8Array` or was larger than the store allows, or a persisted offset (its topic, partition or
 * offset) was invalid.
 */
export class InvalidValue extends Schema.TaggedError<InvalidValue>()("InvalidValue", { detail: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `invalid value: ${this.detail}`
  }
}

/** The backend failed while doing I/O. */
export class IoError extends Schema.TaggedError<IoError>()("StoreIoError", {
  operation: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `store ${this.operation} failed: ${this.detail}`
  }
}

/** The options a store backend was given are invalid; nothing was opened. */
export class InvalidOptions extends Schema.TaggedError<InvalidOptions>()("InvalidStoreOptions", {
  store: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `invalid ${this.store} store options: ${this.detail}`
  }
}

/** A store id names no valid partition store (empty or oversized table name, bad partition number). */
export class InvalidId extends Schema.TaggedError<InvalidId>()("InvalidStoreId", { detail: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `invalid store id: ${this.detail}`
  }
}

/** Why a store operation failed. */
export const ErrorReason = Schema.Union([
  Closed,
  InvalidOptions,
  InvalidId,
  Locked,
  Corrupted,
  ForeignStoreDirectory,
  AccessDenied,
  InvalidKey,
  InvalidValue,
  IoError
])
/** @see StoreErrorReason */
export type ErrorReason = typeof ErrorReason.Type

/** The error of every `Store` operation; `reason` says what went wrong. */
export class StoreError extends Schema.TaggedError<StoreError>()("StoreError", { reason: ErrorReason }) {
  /** @since 0.1.0 */
  override get message() {
    return this.reason.message
  }
  /** Whether trying again may succeed. */
  get retryable(): boolean {
    return this.reason._tag === "StoreIoError" || this.reason._tag === "StoreLocked"
  }
}

/** Wraps a reason into a `StoreError`. */
export const storeError = (reason: ErrorReason): StoreError => new StoreError({ reason })
