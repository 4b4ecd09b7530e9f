/**
 * The key and value rules every `Store` backend enforces, shared so that all
 * adapters reject the same input with the same typed errors.
 *
 * @since 0.1.0
 */
import type { TopicPartitionOffset } from "./Models.js"
import {
  InvalidKey,
  InvalidStoreId,
  InvalidValue,
  type ScanRange,
  type StoreError,
  type StoreId,
  type StoreLimits,
  storeError
} from "./Store.js"

/** The first byte of every key the store reserves for its own metadata. */
export const RESERVED_PREFIX = 0xff

/** Default size limits shared by every backend. */
export const defaultLimits: StoreLimits = { maxKeyBytes: 64 * 1024, maxValueBytes: 16 * 1024 * 1024 }

/** Checks a user key; returns the error to fail with, if any. */
export const checkKey = (key: unknown, limits: StoreLimits): StoreError | undefined => {
  if (!(key instanceof Uint8Array)) {
    return storeError(new InvalidKey({ detail: `expected a Uint8Array, got ${describe(key)}` }))
  }
  if (key.length === 0) return storeError(new InvalidKey({ detail: "keys must not be empty" }))
  if (key[0] === RESERVED_PREFIX) {
    return storeError(new InvalidKey({ detail: "keys starting with byte 0xFF are reserved for store metadata" }))
  }
  if (key.length > limits.maxKeyBytes) {
    return storeError(new InvalidKey({ detail: `${key.length} bytes exceeds the limit of ${limits.maxKeyBytes}` }))
  }
  return undefined
}

/** Checks a value; returns the error to fail with, if any. */
export const checkValue = (value: unknown, limits: StoreLimits): StoreError | undefined => {
  if (!(value instanceof Uint8Array)) {
    return storeError(new InvalidValue({ detail: `expected a Uint8Array, got ${describe(value)}` }))
  }
  if (value.length > limits.maxValueBytes) {
    return storeError(
      new InvalidValue({ detail: `${value.length} bytes exceeds the limit of ${limits.maxValueBytes}` })
    )
  }
  return undefined
}

/** Checks a bound of a scan range or a prefix (may be any bytes, even reserved ones). */
export const checkBound = (bound: unknown, name: string): StoreError | undefined =>
  bound === undefined || bound instanceof Uint8Array
    ? undefined
    : storeError(new InvalidKey({ detail: `scan bound ${name}: expected a Uint8Array, got ${describe(bound)}` }))

const describe = (u: unknown): string =>
  u === null
    ? "null"
    : Array.isArray(u)
      ? "an array"
      : typeof u === "object"
        ? (u.constructor?.name ?? "an object")
        : typeof u

/** The smallest key greater than every key starting with `prefix`, or undefined when there is none. */
export const prefixUpperBound = (prefix: Uint8Array): Uint8Array | undefined => {
  const end = Uint8Array.from(prefix)
  for (let i = end.length - 1; i >= 0; i--) {
    if (end[i]! < 0xff) {
      end[i]! += 1
      return end.subarray(0, i + 1)
    }
  }
  return undefined
}

const TOPIC = /^[a-zA-Z0-9._-]{1,249}$/

/** Checks offsets to persist: a valid topic, a partition in `[0, 2³¹)` and a non-negative safe-integer offset. */
export const checkOffsets = (offsets: ReadonlyArray<TopicPartitionOffset>): StoreError | undefined => {
  for (const o of offsets) {
    const where = `${String(o.topic)}/${String(o.partition)}`
    if (typeof o.topic !== "string" || !TOPIC.test(o.topic)) {
      return storeError(new InvalidValue({ detail: `persisted offset for ${where}: invalid topic name` }))
    }
    if (!Number.isInteger(o.partition) || o.partition < 0 || o.partition >= 2 ** 31) {
      return storeError(
        new InvalidValue({ detail: `persisted offset for ${where}: partition must be an integer in [0, 2^31)` })
      )
    }
    if (!Number.isSafeInteger(o.offset) || o.offset < 0) {
      return storeError(
        new InvalidValue({
          detail: `persisted offset for ${where}: offset must be a non-negative safe integer, got ${o.offset}`
        })
      )
    }
  }
  return undefined
}

/** Checks a store id: a table name of 1–255 UTF-8 bytes and a partition in `[0, 2³¹)`. */
export const checkStoreId = (id: StoreId): StoreError | undefined => {
  if (typeof id?.table !== "string" || id.table.length === 0 || Buffer.byteLength(id.table, "utf8") > 255) {
    return storeError(new InvalidStoreId({ detail: "the table name must be 1 to 255 UTF-8 bytes" }))
  }
  if (!Number.isInteger(id.partition) || id.partition < 0 || id.partition >= 2 ** 31) {
    return storeError(
      new InvalidStoreId({ detail: `${id.table}: the partition must be an integer in [0, 2^31), got ${id.partition}` })
    )
  }
  return undefined
}

/** The scan range of every key that starts with `prefix`, with a prefix scan's options. */
export const prefixRange = (
  prefix: Uint8Array,
  options?: { readonly reverse?: boolean; readonly limit?: number }
): ScanRange => {
  const upper = prefixUpperBound(prefix)
  return {
    gte: prefix,
    ...(upper === undefined ? {} : { lt: upper }),
    ...(options?.reverse === undefined ? {} : { reverse: options.reverse }),
    ...(options?.limit === undefined ? {} : { limit: options.limit })
  }
}
