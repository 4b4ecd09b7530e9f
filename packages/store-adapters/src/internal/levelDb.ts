/**
 * The store implementation shared by the LevelDB and RocksDB adapters: both
 * drivers speak the abstract-level interface, so one module maps the `Store`
 * protocol onto it.
 *
 * Layout: one database per directory. A partition store is the key range that
 * starts with its prefix `[u16 table length][table UTF-8][u32 partition]`:
 *
 *     prefix + userKey                                → value
 *     prefix + 0xFF + [u16 len][topic][u32 partition] → persisted offset (u64 BE)
 *
 * User keys never start with 0xFF, so data sorts before metadata and a write
 * batch carries both atomically. One database per directory also means one
 * block cache, one write-ahead log and one LOCK file for every partition.
 */
import type {
  Offset,
  PartitionStore,
  ScanRange,
  StoreId,
  StoreLimits,
  StoreOp,
  StoreShape,
  TopicPartition,
  TopicPartitionOffset
} from "@strata/core"
import {
  StoreClosed,
  StoreCorrupted,
  StoreIoError,
  StoreLocked,
  StoreValidation,
  storeError,
  type StoreError
} from "@strata/core"
import { Effect, Option, Stream } from "effect"

/**
 * A native batch through abstract-level's implementer methods (`_put`, `_del`, `_clear`), which the bindings
 * implement and abstract-level's public `put` wraps: the public one validates again, copies options and builds an
 * operation object per call, ~7% of a restore's time on the JavaScript thread. Keys and values reach it already
 * validated and as buffers.
 */
export interface NativeBatch {
  _put(key: Buffer, value: Uint8Array): void
  _del(key: Buffer): void
  _clear(): void
}

/**
 * Adds a write's operations to a cleared native batch, synchronously: the bindings copy keys and values as they
 * are added, so the buffers passed may be reused right after.
 */
export type FillBatch = (batch: NativeBatch) => void

/** Key lengths a partition store keeps a reusable key buffer for. */
const MAX_KEY_BUFFERS = 64

/** The part of an abstract-level iterator the store uses. */
export interface DriverIterator {
  nextv(size: number): Promise<Array<[Buffer, Buffer]>>
  close(): Promise<void>
}

/** The part of an abstract-level database the store uses. */
export interface DriverDb {
  /** Writes, atomically, what `fill` adds to a cleared native batch. */
  batch(fill: FillBatch, options: { sync: boolean }): Promise<void>
  get(key: Buffer): Promise<Buffer | undefined>
  /** A synchronous read, where the driver has one that is cheap enough to block the calling thread for. */
  getSync?: (key: Buffer) => Buffer | undefined
  getMany(keys: Array<Buffer>): Promise<Array<Buffer | undefined>>
  iterator(options: DriverRange & { keys?: boolean; values?: boolean }): DriverIterator
  close(): Promise<void>
}

/** Bounds as abstract-level takes them. */
export interface DriverRange {
  gt?: Buffer
  gte?: Buffer
  lt?: Buffer
  lte?: Buffer
  reverse?: boolean
  limit?: number
}

/** What a backend module gives the shared implementation. */
export interface Backend {
  readonly name: string
  readonly directory: string
  readonly sync: boolean
  readonly limits: StoreLimits
  /** Opens the database; rejects with the driver's error. */
  readonly open: () => Promise<DriverDb>
}

const SCAN_CHUNK = 1024
const META = 0xff

const storeName = (id: StoreId) => `${id.table}/${id.partition}`

/** The key prefix of one partition store. */
export const storePrefix = (id: StoreId): Buffer => {
  const table = Buffer.from(id.table, "utf8")
  const prefix = Buffer.allocUnsafe(2 + table.length + 4)
  prefix.writeUInt16BE(table.length, 0)
  table.copy(prefix, 2)
  prefix.writeUInt32BE(id.partition, 2 + table.length)
  return prefix
}

const withPrefix = (prefix: Buffer, key: Uint8Array): Buffer => {
  const out = Buffer.allocUnsafe(prefix.length + key.length)
  prefix.copy(out, 0)
  out.set(key, prefix.length)
  return out
}

const metaKey = (prefix: Buffer, tp: TopicPartition): Buffer => {
  const topic = Buffer.from(tp.topic, "utf8")
  const out = Buffer.allocUnsafe(prefix.length + 1 + 2 + topic.length + 4)
  prefix.copy(out, 0)
  let at = prefix.length
  out[at++] = META
  out.writeUInt16BE(topic.length, at)
  at += 2
  topic.copy(out, at)
  out.writeUInt32BE(tp.partition, at + topic.length)
  return out
}

const decodeMetaKey = (prefix: Buffer, key: Buffer): TopicPartition => {
  const at = prefix.length + 1
  const len = key.readUInt16BE(at)
  return {
    topic: key.toString("utf8", at + 2, at + 2 + len),
    partition: key.readUInt32BE(at + 2 + len)
  }
}

const encodeOffset = (offset: number): Buffer => {
  const out = Buffer.allocUnsafe(8)
  out.writeBigUInt64BE(BigInt(offset))
  return out
}

const decodeOffset = (value: Buffer): Offset => Number(value.readBigUInt64BE(0))

/** The smallest key after every key that starts with `prefix` (prefixes never end in 0xFF bytes only). */
const prefixEnd = (prefix: Buffer): Buffer => Buffer.from(StoreValidation.prefixUpperBound(prefix)!)

const message = (cause: unknown): string => {
  if (cause instanceof Error) {
    const inner = (cause as { cause?: unknown }).cause
    return inner instanceof Error && inner.message !== cause.message
      ? `${cause.message}: ${inner.message}`
      : cause.message
  }
  return String(cause)
}

const codes = (cause: unknown): string => {
  const c = cause as { code?: unknown; cause?: { code?: unknown; message?: unknown } } | undefined
  return `${String(c?.code ?? "")} ${String(c?.cause?.code ?? "")} ${message(cause)}`
}

/** Maps a driver error at open time to a typed reason: locked, corrupted, or plain I/O. */
export const openError = (backend: Pick<Backend, "name" | "directory">, cause: unknown): StoreError => {
  const text = codes(cause)
  if (/LEVEL_LOCKED|lock hold|No locks available|Resource temporarily unavailable|\/LOCK\b/i.test(text)) {
    return storeError(new StoreLocked({ store: backend.name, path: backend.directory }))
  }
  if (/LEVEL_CORRUPTION|Corruption|corrupted|bad magic|not an sstable/i.test(text)) {
    return storeError(new StoreCorrupted({ store: backend.name, path: backend.directory, detail: message(cause) }))
  }
  return storeError(new StoreIoError({ operation: `open ${backend.directory}`, detail: message(cause) }))
}

/** Opens the database in a scope and serves the `Store` protocol from it. */
export const make = (backend: Backend): Effect.Effect<StoreShape, StoreError, import("effect").Scope.Scope> =>
  Effect.gen(function* () {
    const db = yield* Effect.acquireRelease(
      Effect.tryPromise({ try: backend.open, catch: (cause) => openError(backend, cause) }),
      (db) => Effect.promise(() => db.close().catch(() => undefined))
    )
    const open = new Set<string>()
    const io = <A>(operation: string, f: () => Promise<A>): Effect.Effect<A, StoreError> =>
      Effect.tryPromise({
        try: f,
        catch: (cause) => storeError(new StoreIoError({ operation, detail: message(cause) }))
      })

    /** Deletes a whole key range in one atomic batch. */
    const deleteRange = (operation: string, from: Buffer, to: Buffer) =>
      io(operation, async () => {
        const it = db.iterator({ gte: from, lt: to, values: false })
        const keys: Array<Buffer> = []
        try {
          for (;;) {
            const entries = await it.nextv(SCAN_CHUNK)
            if (entries.length === 0) break
            for (const [key] of entries) keys.push(key)
          }
        } finally {
          await it.close()
        }
        if (keys.length > 0)
          await db.batch(
            (batch) => {
              for (const key of keys) batch._del(key)
            },
            { sync: backend.sync }
          )
      })

    /** A valid id of a partition store nobody has open, or the error saying why not. */
    const closedStore = (id: StoreId): StoreError | undefined =>
      StoreValidation.checkStoreId(id) ??
      (open.has(storeName(id))
        ? storeError(new StoreLocked({ store: storeName(id), path: backend.directory }))
        : undefined)

    const openStore = (id: StoreId) =>
      Effect.acquireRelease(
        Effect.suspend(() => {
          const unavailable = closedStore(id)
          if (unavailable) return Effect.fail(unavailable)
          open.add(storeName(id))
          return Effect.succeed(makePartition(id, db, backend, io, deleteRange))
        }),
        (handle) =>
          Effect.sync(() => {
            handle.closed = true
            open.delete(storeName(id))
          })
      ).pipe(Effect.map((handle) => handle.store))

    const drop = (id: StoreId) =>
      Effect.suspend(() => {
        const unavailable = closedStore(id)
        if (unavailable) return Effect.fail(unavailable)
        const prefix = storePrefix(id)
        return deleteRange(`drop ${storeName(id)}`, prefix, prefixEnd(prefix))
      })

    return { backend: backend.name, limits: backend.limits, open: openStore, drop } satisfies StoreShape
  })

const makePartition = (
  id: StoreId,
  db: DriverDb,
  backend: Backend,
  io: <A>(operation: string, f: () => Promise<A>) => Effect.Effect<A, StoreError>,
  deleteRange: (operation: string, from: Buffer, to: Buffer) => Effect.Effect<void, StoreError>
) => {
  const name = storeName(id)
  const prefix = storePrefix(id)
  const dataEnd = Buffer.concat([prefix, Buffer.from([META])])
  const end = prefixEnd(prefix)
  const limits = backend.limits
  const handle = { closed: false, store: undefined as unknown as PartitionStore }
  const closed = () => storeError(new StoreClosed({ store: name }))
  const strip = (key: Buffer) => key.subarray(prefix.length)

  /**
   * Prefixed keys are built in a buffer kept per key length (the bindings copy a key when it is added to a batch),
   * so a write allocates nothing per key; keys of other lengths than the first `MAX_KEY_BUFFERS` get a buffer each.
   */
  const keyBuffers = new Map<number, Buffer>()
  const prefixed = (key: Uint8Array): Buffer => {
    const length = prefix.length + key.length
    let buffer = keyBuffers.get(length)
    if (buffer === undefined) {
      buffer = Buffer.allocUnsafe(length)
      prefix.copy(buffer, 0)
      if (keyBuffers.size < MAX_KEY_BUFFERS) keyBuffers.set(length, buffer)
    }
    buffer.set(key, prefix.length)
    return buffer
  }

  const write = (ops: ReadonlyArray<StoreOp>, options?: { readonly offsets?: ReadonlyArray<TopicPartitionOffset> }) =>
    Effect.suspend(() => {
      if (handle.closed) return Effect.fail(closed())
      // Validate everything first: a bad operation fails the write before anything reaches the batch.
      for (let i = 0; i < ops.length; i++) {
        const op = ops[i]!
        const bad =
          StoreValidation.checkKey(op.key, limits) ??
          (op._tag === "put" ? StoreValidation.checkValue(op.value, limits) : undefined)
        if (bad) return Effect.fail(bad)
      }
      const offsets = options?.offsets ?? []
      const badOffset = StoreValidation.checkOffsets(offsets)
      if (badOffset) return Effect.fail(badOffset)
      if (ops.length === 0 && offsets.length === 0) return Effect.void
      const fill = (batch: NativeBatch) => {
        for (let i = 0; i < ops.length; i++) {
          const op = ops[i]!
          if (op._tag === "put") batch._put(prefixed(op.key), op.value)
          else batch._del(prefixed(op.key))
        }
        for (const o of offsets) batch._put(metaKey(prefix, o), encodeOffset(o.offset))
      }
      return io(`write ${name}`, () => db.batch(fill, { sync: backend.sync }))
    })

  /** Translates a user range into the partition's key space; `undefined` when it selects nothing. */
  const driverRange = (range: ScanRange): DriverRange | undefined => {
    if (range.limit !== undefined && range.limit <= 0) return undefined
    let lower: { key: Buffer; inclusive: boolean } = { key: prefix, inclusive: true }
    let upper: { key: Buffer; inclusive: boolean } = { key: dataEnd, inclusive: false }
    const raise = (key: Uint8Array, inclusive: boolean) => {
      const k = withPrefix(prefix, key)
      const c = Buffer.compare(k, lower.key)
      if (c > 0 || (c === 0 && !inclusive)) lower = { key: k, inclusive }
    }
    const lowerTo = (key: Uint8Array, inclusive: boolean) => {
      const k = withPrefix(prefix, key)
      const c = Buffer.compare(k, upper.key)
      if (c < 0 || (c === 0 && !inclusive)) upper = { key: k, inclusive }
    }
    if (range.gte !== undefined) raise(range.gte, true)
    if (range.gt !== undefined) raise(range.gt, false)
    if (range.lte !== undefined) lowerTo(range.lte, true)
    if (range.lt !== undefined) lowerTo(range.lt, false)
    const c = Buffer.compare(lower.key, upper.key)
    if (c > 0 || (c === 0 && !(lower.inclusive && upper.inclusive))) return undefined
    const out: DriverRange = {}
    if (lower.inclusive) out.gte = lower.key
    else out.gt = lower.key
    if (upper.inclusive) out.lte = upper.key
    else out.lt = upper.key
    if (range.reverse) out.reverse = true
    if (range.limit !== undefined) out.limit = range.limit
    return out
  }

  const scan = (range: ScanRange = {}) =>
    Stream.unwrap(
      Effect.gen(function* () {
        if (handle.closed) return yield* Effect.fail(closed())
        for (const b of ["gt", "gte", "lt", "lte"] as const) {
          const bad = StoreValidation.checkBound(range[b], b)
          if (bad) return yield* Effect.fail(bad)
        }
        const r = driverRange(range)
        if (r === undefined) return Stream.empty
        const it = yield* Effect.acquireRelease(
          Effect.sync(() => db.iterator(r)),
          (it) => Effect.promise(() => it.close().catch(() => undefined))
        )
        return Stream.paginate(undefined, () =>
          io(`scan ${name}`, () => it.nextv(SCAN_CHUNK)).pipe(
            Effect.map(
              (entries) =>
                [
                  entries.map(([k, v]): readonly [Uint8Array, Uint8Array] => [strip(k), v]),
                  entries.length === 0 ? Option.none() : Option.some(undefined)
                ] as const
            )
          )
        )
      })
    )

  const checked = (key: Uint8Array) => StoreValidation.checkKey(key, limits)
  const guard = <A>(f: () => Effect.Effect<A, StoreError>) =>
    Effect.suspend(() => (handle.closed ? Effect.fail(closed()) : f()))

  const store: PartitionStore = {
    id,
    get: (key) =>
      guard(() => {
        const bad = checked(key)
        if (bad) return Effect.fail(bad)
        const getSync = db.getSync
        if (getSync !== undefined) {
          return Effect.try({
            try: () => Option.fromUndefinedOr(getSync(withPrefix(prefix, key)) as Uint8Array | undefined),
            catch: (cause) => storeError(new StoreIoError({ operation: `get ${name}`, detail: message(cause) }))
          })
        }
        return Effect.map(
          io(`get ${name}`, () => db.get(withPrefix(prefix, key))),
          (v) => Option.fromUndefinedOr(v as Uint8Array | undefined)
        )
      }),
    getMany: (keys) =>
      guard(() => {
        for (const key of keys) {
          const bad = checked(key)
          if (bad) return Effect.fail(bad)
        }
        return Effect.map(
          io(`getMany ${name}`, () => db.getMany(keys.map((k) => withPrefix(prefix, k)))),
          (vs) => vs.map((v) => Option.fromUndefinedOr(v as Uint8Array | undefined))
        )
      }),
    put: (key, value) => write([{ _tag: "put", key, value }]),
    delete: (key) => write([{ _tag: "delete", key }]),
    write,
    scan,
    scanPrefix: (p, options) =>
      Stream.suspend(() => {
        const bad = StoreValidation.checkBound(p, "prefix")
        return bad ? Stream.fail(bad) : scan(StoreValidation.prefixRange(p, options))
      }),
    persistedOffset: (tp) =>
      guard(() =>
        Effect.map(
          io(`persistedOffset ${name}`, () => db.get(metaKey(prefix, tp))),
          (v) => (v === undefined ? Option.none() : Option.some(decodeOffset(v)))
        )
      ),
    persistedOffsets: guard(() =>
      io(`persistedOffsets ${name}`, async () => {
        const it = db.iterator({ gte: dataEnd, lt: end })
        const out: Array<TopicPartitionOffset> = []
        try {
          for (;;) {
            const entries = await it.nextv(SCAN_CHUNK)
            if (entries.length === 0) break
            for (const [k, v] of entries) out.push({ ...decodeMetaKey(prefix, k), offset: decodeOffset(v) })
          }
        } finally {
          await it.close()
        }
        return out
      })
    ),
    setPersistedOffset: (tp, offset) => write([], { offsets: [{ topic: tp.topic, partition: tp.partition, offset }] }),
    clear: guard(() => deleteRange(`clear ${name}`, prefix, end))
  }
  handle.store = store
  return handle
}
