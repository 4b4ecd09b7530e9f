/**
 * The key and value rules every `Store` backend enforces, shared so that all
 * adapters reject the same input with the same typed errors.
 *
 * @since 0.1.0
 */
import type * as Models from "./Models.js"
import * as Store from "./Store.js"
import { Effect, Schema } from "effect"
import * as OptionSchemas from "./OptionSchemas.js"

/** The first byte of every key the store reserves for its own metadata. */
export const RESERVED_PREFIX = 0xff

/** Default size limits shared by every backend. */
export const defaultLimits: Store.Limits = { maxKeyBytes: 64 * 1024, maxValueBytes: 16 * 1024 * 1024 }

/** A positive integer option (bytes, counts). */
export const PositiveInt = OptionSchemas.PositiveInt

/** The size-limit options every backend accepts; an unset one takes its value from `defaultLimits`. */
export const limitsFields = {
  /** Largest key accepted, in bytes (default 64 KiB). */
  maxKeyBytes: Schema.optional(PositiveInt),
  /** Largest value accepted, in bytes (default 16 MiB). */
  maxValueBytes: Schema.optional(PositiveInt)
}

/** The options of a store that takes only size limits (the memory store). */
export const LimitsOptions = Schema.Struct(limitsFields)
/** @see LimitsOptions */
export type LimitsOptions = typeof LimitsOptions.Type

/**
 * Validates a backend's options with its Schema through `OptionSchemas.decodeOptions`, every field at once: a wrong
 * value and an unknown field (a typo, an option of another backend) both fail with `InvalidStoreOptions`, whose
 * detail names the field and the value given.
 */
export const decodeOptions =
  <S extends Schema.Codec<unknown, unknown>>(store: string, schema: S) =>
  (input: unknown): Effect.Effect<S["Type"], Store.StoreError> =>
    OptionSchemas.decodeOptions(schema, { exact: true })(input).pipe(
      Effect.mapError((bad) => {
        const { option, value, detail } = OptionSchemas.summary(bad)
        return Store.storeError(new Store.InvalidOptions({ store, detail: `${option} = ${value}: ${detail}` }))
      })
    ) as Effect.Effect<S["Type"], Store.StoreError>

/** Checks a user key; returns the error to fail with, if any. */
export const checkKey = (key: unknown, limits: Store.Limits): Store.StoreError | undefined => {
  if (!(key instanceof Uint8Array)) {
    return Store.storeError(new Store.InvalidKey({ detail: `expected a Uint8Array, got ${describe(key)}` }))
  }
  if (key.length === 0) return Store.storeError(new Store.InvalidKey({ detail: "keys must not be empty" }))
  if (key[0] === RESERVED_PREFIX) {
    return Store.storeError(
      new Store.InvalidKey({ detail: "keys starting with byte 0xFF are reserved for store metadata" })
    )
  }
  if (key.length > limits.maxKeyBytes) {
    return Store.storeError(
      new Store.InvalidKey({ detail: `${key.length} bytes exceeds the limit of ${limits.maxKeyBytes}` })
    )
  }
  return undefined
}

/** Checks a value; returns the error to fail with, if any. */
export const checkValue = (value: unknown, limits: Store.Limits): Store.StoreError | undefined => {
  if (!(value instanceof Uint8Array)) {
    return Store.storeError(new Store.InvalidValue({ detail: `expected a Uint8Array, got ${describe(value)}` }))
  }
  if (value.length > limits.maxValueBytes) {
    return Store.storeError(
      new Store.InvalidValue({ detail: `${value.length} bytes exceeds the limit of ${limits.maxValueBytes}` })
    )
  }
  return undefined
}

/** Checks a bound of a scan range or a prefix (may be any bytes, even reserved ones). */
export const checkBound = (bound: unknown, name: string): Store.StoreError | undefined =>
  bound === undefined || bound instanceof Uint8Array
    ? undefined
    : Store.storeError(
        new Store.InvalidKey({ detail: `scan bound ${name}: expected a Uint8Array, got ${describe(bound)}` })
      )

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

/**
 * Checks a scan's `limit`: absent, or a non-negative safe integer (`0` selects nothing). `NaN`, fractions,
 * negative numbers and `Infinity` are refused rather than read differently by each backend.
 */
export const checkLimit = (limit: unknown, name = "limit"): Store.StoreError | undefined =>
  limit === undefined || (Number.isSafeInteger(limit) && (limit as number) >= 0)
    ? undefined
    : Store.storeError(
        new Store.InvalidKey({ detail: `scan ${name}: expected a non-negative integer, got ${describeNumber(limit)}` })
      )

const describeNumber = (u: unknown): string => (typeof u === "number" ? String(u) : describe(u))

const TOPIC = /^[a-zA-Z0-9._-]{1,249}$/

/**
 * Checks a changelog topic-partition a persisted offset is read or written for: a valid topic name and a partition
 * in `[0, 2³¹)`. Returns the error to fail with, if any.
 */
export const checkTopicPartition = (tp: Models.TopicPartition): Store.StoreError | undefined => {
  const topic: unknown = tp?.topic
  const partition: unknown = tp?.partition
  const where = `${typeof topic === "string" ? topic : describe(topic)}/${describeNumber(partition)}`
  if (typeof topic !== "string" || !TOPIC.test(topic)) {
    return Store.storeError(new Store.InvalidValue({ detail: `persisted offset for ${where}: invalid topic name` }))
  }
  if (!Number.isInteger(partition) || (partition as number) < 0 || (partition as number) >= 2 ** 31) {
    return Store.storeError(
      new Store.InvalidValue({ detail: `persisted offset for ${where}: partition must be an integer in [0, 2^31)` })
    )
  }
  return undefined
}

/** Checks offsets to persist: a valid topic, a partition in `[0, 2³¹)` and a non-negative safe-integer offset. */
export const checkOffsets = (offsets: ReadonlyArray<Models.TopicPartitionOffset>): Store.StoreError | undefined => {
  for (const o of offsets) {
    const where = `${String(o.topic)}/${String(o.partition)}`
    const badPartition = checkTopicPartition(o)
    if (badPartition) return badPartition
    if (!Number.isSafeInteger(o.offset) || o.offset < 0) {
      return Store.storeError(
        new Store.InvalidValue({
          detail: `persisted offset for ${where}: offset must be a non-negative safe integer, got ${o.offset}`
        })
      )
    }
  }
  return undefined
}

/** Checks a store id: a table name of 1–255 UTF-8 bytes and a partition in `[0, 2³¹)`. */
export const checkStoreId = (id: Store.Id): Store.StoreError | undefined => {
  if (typeof id?.table !== "string" || id.table.length === 0 || Buffer.byteLength(id.table, "utf8") > 255) {
    return Store.storeError(new Store.InvalidId({ detail: "the table name must be 1 to 255 UTF-8 bytes" }))
  }
  if (!Number.isInteger(id.partition) || id.partition < 0 || id.partition >= 2 ** 31) {
    return Store.storeError(
      new Store.InvalidId({ detail: `${id.table}: the partition must be an integer in [0, 2^31), got ${id.partition}` })
    )
  }
  return undefined
}

/** The scan range of every key that starts with `prefix`, with a prefix scan's options. */
export const prefixRange = (
  prefix: Uint8Array,
  options?: { readonly reverse?: boolean; readonly limit?: number }
): Store.ScanRange => {
  const upper = prefixUpperBound(prefix)
  return {
    gte: prefix,
    ...(upper === undefined ? {} : { lt: upper }),
    ...(options?.reverse === undefined ? {} : { reverse: options.reverse }),
    ...(options?.limit === undefined ? {} : { limit: options.limit })
  }
}
