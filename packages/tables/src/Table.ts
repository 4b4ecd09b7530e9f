/**
 * Table definitions: a name, Schema codecs for keys and values, a partition
 * count and a kind — `Table` (partitioned by the source partition) or
 * `GlobalTable` (every worker holds every partition). Definitions are plain
 * values; `Tables.register` turns one into a live `TableHandle`.
 *
 * Keys and values are stored and sent to the changelog as the JSON of their
 * Schema encoding (Schema's canonical JSON codec), so any Schema works —
 * structs, branded ids, dates — and a value that does not fit its schema is
 * refused with a `TableError` naming the table, never stored.
 *
 * @since 0.1.0
 */
import { Log, Recovery, Store, type TableManager } from "@strata/core"
import { isUtf8 } from "node:buffer"
import { Result, Schema } from "effect"
import { partitionOf } from "./internal/murmur2.js"

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/** A key or value did not fit its table's schema (on write) or could not be read back (on read). */
export class CodecFailed extends Schema.TaggedError<CodecFailed>()("CodecFailed", {
  table: Schema.String,
  /** `"key"` or `"value"`. */
  part: Schema.Literals(["key", "value"]),
  /** `"encode"` (writing) or `"decode"` (reading). */
  direction: Schema.Literals(["encode", "decode"]),
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `table ${this.table}: cannot ${this.direction} the ${this.part}: ${this.detail}`
  }
}

/** The partition is not held by this worker (not assigned, or being restored). */
export class PartitionNotAvailable extends Schema.TaggedError<PartitionNotAvailable>()("PartitionNotAvailable", {
  table: Schema.String,
  partition: Schema.Int,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `table ${this.table}: partition ${this.partition} is not available here: ${this.detail}`
  }
}

/**
 * The partition's restore failed (`reason`: its store is ahead of its changelog, a changelog record cannot be
 * restored, its store failed): it is neither read nor written until a restore succeeds, when it is assigned again.
 */
export class PartitionRestoreFailed extends Schema.TaggedError<PartitionRestoreFailed>()("PartitionRestoreFailed", {
  table: Schema.String,
  partition: Schema.Int,
  reason: Recovery.ErrorReason
}) {
  /** @since 0.1.0 */
  override get message() {
    return `table ${this.table}: partition ${this.partition} cannot be used, its restore failed: ${this.reason.message}`
  }
}

/** A partition outside the table's range was named. */
export class InvalidPartition extends Schema.TaggedError<InvalidPartition>()("InvalidPartition", {
  table: Schema.String,
  partition: Schema.Number,
  partitions: Schema.Int
}) {
  /** @since 0.1.0 */
  override get message() {
    return `table ${this.table}: partition ${this.partition} is not in 0..${this.partitions - 1}`
  }
}

/** The table's store failed. */
export class TableStoreFailed extends Schema.TaggedError<TableStoreFailed>()("TableStoreFailed", {
  table: Schema.String,
  cause: Store.StoreError
}) {
  /** @since 0.1.0 */
  override get message() {
    return `table ${this.table}: store: ${this.cause.message}`
  }
}

/** Producing to the table's changelog failed (nothing was stored). */
export class ChangelogFailed extends Schema.TaggedError<ChangelogFailed>()("ChangelogFailed", {
  table: Schema.String,
  cause: Log.LogError
}) {
  /** @since 0.1.0 */
  override get message() {
    return `table ${this.table}: changelog: ${this.cause.message}`
  }
}

/** Why a table operation failed. */
export const TableErrorReason = Schema.Union([
  CodecFailed,
  PartitionNotAvailable,
  PartitionRestoreFailed,
  InvalidPartition,
  TableStoreFailed,
  ChangelogFailed
])
/** @see TableErrorReason */
export type TableErrorReason = typeof TableErrorReason.Type

/** The error of every table operation. */
export class TableError extends Schema.TaggedError<TableError>()("TableError", { reason: TableErrorReason }) {
  /** @since 0.1.0 */
  override get message() {
    return this.reason.message
  }
}

// ---------------------------------------------------------------------------
// Definitions
// ---------------------------------------------------------------------------

/** A Schema usable as a key or value codec (no services needed to encode or decode). */
export type Codec<A> = Schema.Codec<A, unknown, never, never>

/** Options of a table definition. */
export interface TableOptions<K, V> {
  /** The table's name: unique in an app, `[A-Za-z0-9._-]+`. */
  readonly name: string
  readonly key: Codec<K>
  readonly value: Codec<V>
  /** Partitions of the table and its changelog: the source topic's partition count. */
  readonly partitions: number
  /** The changelog topic (default `<app>-<name>-changelog`). */
  readonly changelogTopic?: string
}

/** A table definition: what `Tables.register` needs. */
export interface TableDef<K, V> {
  readonly kind: TableManager.TableKind
  readonly name: string
  readonly partitions: number
  readonly changelogTopic: string | undefined
  readonly key: Codec<K>
  readonly value: Codec<V>
}

/** A partitioned table: each worker holds the partitions of its source assignment. */
export const make = <K, V>(options: TableOptions<K, V>): TableDef<K, V> => ({
  kind: "table",
  name: options.name,
  partitions: options.partitions,
  changelogTopic: options.changelogTopic,
  key: options.key,
  value: options.value
})

/** A global table: every worker holds (and restores, then tails) every partition. */
export const global = <K, V>(options: TableOptions<K, V>): TableDef<K, V> => ({
  ...make(options),
  kind: "global"
})

/** The changelog topic of a table in an app. */
export const changelogTopicOf = (app: string, def: TableDef<unknown, unknown>): string =>
  def.changelogTopic ?? `${app}-${def.name}-changelog`

const NAME = /^[A-Za-z0-9._-]+$/

/** Why a definition is invalid, if it is. */
export const validate = (def: {
  readonly name: string
  readonly partitions: number
  readonly changelogTopic: string | undefined
}): string | undefined => {
  if (!NAME.test(def.name)) return `the name must match ${NAME.source}, got ${JSON.stringify(def.name)}`
  if (!Number.isSafeInteger(def.partitions) || def.partitions < 1) {
    return `partitions must be a positive integer, got ${def.partitions}`
  }
  if (def.changelogTopic !== undefined && !NAME.test(def.changelogTopic)) {
    return `the changelog topic must match ${NAME.source}, got ${JSON.stringify(def.changelogTopic)}`
  }
  return undefined
}

// ---------------------------------------------------------------------------
// Codecs
// ---------------------------------------------------------------------------

const decoder = new TextDecoder("utf-8", { fatal: true })

/** Encoders and decoders of one table's keys and values to bytes. */
export interface Codecs<K, V> {
  readonly encodeKey: (key: K) => Result.Result<Uint8Array, CodecFailed>
  /** `encodeKey`, with the bytes' latin1 text (the write path's key id), taken from the JSON text when it is ASCII. */
  readonly encodeKeyWithId: (key: K) => Result.Result<EncodedKey, CodecFailed>
  readonly decodeKey: (bytes: Uint8Array) => Result.Result<K, CodecFailed>
  readonly encodeValue: (value: V) => Result.Result<Uint8Array, CodecFailed>
  readonly decodeValue: (bytes: Uint8Array) => Result.Result<V, CodecFailed>
  /** Why the bytes are not a key of the table (`undefined`: they are); cheaper than decoding for common schemas. */
  readonly checkKey: (bytes: Uint8Array) => CodecFailed | undefined
  /** Why the bytes are not a value of the table (`undefined`: they are). */
  readonly checkValue: (bytes: Uint8Array) => CodecFailed | undefined
}

/** A key's bytes and their latin1 text (one char per byte). */
export interface EncodedKey {
  readonly bytes: Uint8Array
  readonly id: string
}

/**
 * Whether the bytes are certainly the JSON of a plain string: quoted, valid UTF-8, no escape, quote or control byte
 * inside. `false` means only "not certain": the full decode decides.
 */
const plainJsonString = (bytes: Uint8Array): boolean => {
  const last = bytes.length - 1
  if (last < 1 || bytes[0] !== 0x22 || bytes[last] !== 0x22) return false
  let ascii = true
  for (let i = 1; i < last; i++) {
    const b = bytes[i]!
    if (b < 0x20 || b === 0x22 || b === 0x5c) return false
    if (b > 0x7f) ascii = false
  }
  return ascii || isUtf8(bytes)
}

/** The integer `plainJsonInt` accepted. */
const intOf = (bytes: Uint8Array): number => {
  const negative = bytes[0] === 0x2d
  let n = 0
  for (let i = negative ? 1 : 0; i < bytes.length; i++) n = n * 10 + (bytes[i]! - 0x30)
  return negative ? -n : n
}

/** Whether the bytes are certainly the JSON of a safe integer (`false`: the full decode decides). */
const plainJsonInt = (bytes: Uint8Array): boolean => {
  const n = bytes.length
  let i = bytes[0] === 0x2d ? 1 : 0
  if (n === i || n - i > 15 || (bytes[i] === 0x30 && n - i > 1)) return false
  for (; i < n; i++) if (bytes[i]! < 0x30 || bytes[i]! > 0x39) return false
  return true
}

const describe = (error: unknown): string => (error instanceof Error ? error.message : String(error))

const codecOf = <A>(table: string, part: "key" | "value", schema: Codec<A>) => {
  const json = Schema.toCodecJson(schema)
  const encode = Schema.encodeResult(json)
  const decode = Schema.decodeUnknownResult(json)
  const fail = (direction: "encode" | "decode", detail: string) =>
    Result.fail(new CodecFailed({ table, part, direction, detail }))
  // Plain strings and integers, the common keys and values, skip the JSON text and the schema both ways.
  const kind = (schema as unknown) === Schema.String ? "string" : (schema as unknown) === Schema.Int ? "int" : undefined
  const plain = kind === "string" ? plainJsonString : kind === "int" ? plainJsonInt : undefined
  const decodeBytes = (bytes: Uint8Array): Result.Result<A, CodecFailed> => {
    let parsed: unknown
    try {
      parsed = JSON.parse(decoder.decode(bytes))
    } catch (e) {
      return fail("decode", `not JSON: ${describe(e)}`)
    }
    const decoded = decode(parsed)
    return Result.isFailure(decoded) ? fail("decode", decoded.failure.message) : Result.succeed(decoded.success)
  }
  /** The JSON text of a value. */
  const textOf = (a: A): Result.Result<string, CodecFailed> => {
    if (kind === "int" && Number.isSafeInteger(a)) return Result.succeed(String(a))
    if (kind === "string" && typeof a === "string") return Result.succeed(JSON.stringify(a))
    const encoded = encode(a)
    if (Result.isFailure(encoded)) return fail("encode", encoded.failure.message)
    try {
      return Result.succeed(JSON.stringify(encoded.success))
    } catch (e) {
      return fail("encode", describe(e))
    }
  }
  return {
    encode: (a: A): Result.Result<Uint8Array, CodecFailed> => {
      const text = textOf(a)
      // Buffer.from allocates small strings from a shared pool: much cheaper per call than TextEncoder.
      return Result.isFailure(text) ? Result.fail(text.failure) : Result.succeed(Buffer.from(text.success, "utf8"))
    },
    encodeWithId: (a: A): Result.Result<EncodedKey, CodecFailed> => {
      const text = textOf(a)
      if (Result.isFailure(text)) return Result.fail(text.failure)
      const bytes = Buffer.from(text.success, "utf8")
      // As many bytes as chars: the text is ASCII, its own latin1 reading.
      return Result.succeed({
        bytes,
        id: bytes.length === text.success.length ? text.success : bytes.toString("latin1")
      })
    },
    decode: (bytes: Uint8Array): Result.Result<A, CodecFailed> => {
      if (kind === "int" && plainJsonInt(bytes)) return Result.succeed(intOf(bytes) as A)
      if (kind === "string" && plainJsonString(bytes)) {
        return Result.succeed(Buffer.from(bytes.buffer, bytes.byteOffset + 1, bytes.length - 2).toString("utf8") as A)
      }
      return decodeBytes(bytes)
    },
    check: (bytes: Uint8Array): CodecFailed | undefined => {
      if (plain?.(bytes) === true) return undefined
      const decoded = decodeBytes(bytes)
      return Result.isFailure(decoded) ? decoded.failure : undefined
    }
  }
}

/** Builds the byte codecs of a definition. */
export const codecs = <K, V>(def: TableDef<K, V>): Codecs<K, V> => {
  const key = codecOf(def.name, "key", def.key)
  const value = codecOf(def.name, "value", def.value)
  return {
    encodeKey: key.encode,
    encodeKeyWithId: key.encodeWithId,
    decodeKey: key.decode,
    encodeValue: value.encode,
    decodeValue: value.decode,
    checkKey: key.check,
    checkValue: value.check
  }
}

/** The partition Kafka's default partitioner gives an encoded key (murmur2), for writes with no source partition. */
export const keyPartition = (encodedKey: Uint8Array, partitions: number): number => partitionOf(encodedKey, partitions)
