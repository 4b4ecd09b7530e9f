/**
 * The key and value rules every `Store` backend enforces, shared so that all
 * adapters reject the same input with the same typed errors.
 *
 * @since 0.1.0
 */
import { InvalidKey, InvalidValue, type StoreError, type StoreLimits, storeError } from "./Store.js"

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
