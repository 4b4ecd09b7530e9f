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
import { type Models, Store, StoreValidation } from "@strata/core"
import { mkdir } from "node:fs/promises"
import { Effect, Option, type Scope, Stream } from "effect"
import type { DriverDb, DriverRange, NativeBatch } from "./driver.js"
import { reopeningDb } from "./reopeningDb.js"
import * as StoreDirectory from "./storeDirectory.js"

export type { DriverDb, DriverIterator, DriverRange, FillBatch, NativeBatch } from "./driver.js"

/** Key lengths a partition store keeps a reusable key buffer for. */
const MAX_KEY_BUFFERS = 64

/** How the engine is to open the directory, decided before it sees it (see `storeDirectory.ts`). */
export interface OpenMode {
  /**
   * True: nothing of value is there, create a new database (`createIfMissing`, and `errorIfExists` should one
   * appear meanwhile). False: open the existing database, never creating one over it.
   */
  readonly create: boolean
}

/** What a backend module gives the shared implementation. */
export interface Backend {
  /** The backend's name, also the engine whose directories it opens. */
  readonly name: StoreDirectory.Engine
  readonly directory: string
  readonly sync: boolean
  readonly limits: Store.Limits
  /**
   * Checks an existing database's files before the engine reads them, where the engine does not check them itself;
   * resolves with a description of the damage found, if any. `names` are the directory's entries.
   */
  readonly check?: (names: ReadonlyArray<string>) => Promise<string | undefined>
  /** Opens the database; rejects with the driver's error. */
  readonly open: (mode: OpenMode) => Promise<DriverDb>
}

const SCAN_CHUNK = 1024
const META = 0xff

const storeName = (id: Store.Id) => `${id.table}/${id.partition}`

/** The key prefix of one partition store. */
export const storePrefix = (id: Store.Id): Buffer => {
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

const metaKey = (prefix: Buffer, tp: Models.TopicPartition): Buffer => {
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

const decodeMetaKey = (prefix: Buffer, key: Buffer): Models.TopicPartition => {
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

const decodeOffset = (value: Buffer): Models.Offset => Number(value.readBigUInt64BE(0))

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

/** The store, path and detail of a reason about the directory. */
const at = (backend: Pick<Backend, "name" | "directory">, cause: unknown) => ({
  store: backend.name,
  path: backend.directory,
  detail: message(cause)
})

/** The engine's lock is held (by another process, or by another open in this one). */
const LOCKED = /LEVEL_LOCKED|IO error: lock |While lock file|lock hold by current process|already held by process/i
/** The file system refused: permissions, a read-only file system. */
const DENIED = /EACCES|EPERM|EROFS|Permission denied|Operation not permitted|Read-only file system/i
/** The engine found damage (LevelDB and RocksDB both say "Corruption"). */
const CORRUPTED = /LEVEL_CORRUPTION|Corruption|corrupted|bad magic|not an sstable/i

/**
 * Maps a driver error at open time to a typed reason: locked, access denied, corrupted, or plain I/O. The lock is
 * recognised by the engines' own lock messages, not by a path that ends in `/LOCK`: a LOCK file the process may not
 * open is a permission problem, not another owner.
 */
export const openError = (backend: Pick<Backend, "name" | "directory">, cause: unknown): Store.StoreError => {
  const text = codes(cause)
  if (LOCKED.test(text) || /No locks available|Resource temporarily unavailable/i.test(text)) {
    return Store.storeError(new Store.Locked({ store: backend.name, path: backend.directory }))
  }
  if (DENIED.test(text)) return Store.storeError(new Store.AccessDenied(at(backend, cause)))
  if (CORRUPTED.test(text)) return Store.storeError(new Store.Corrupted(at(backend, cause)))
  return Store.storeError(new Store.IoError({ operation: `open ${backend.directory}`, detail: message(cause) }))
}

/** Maps a driver error of a read or write: damage the engine met is `StoreCorrupted`, anything else I/O. */
const ioError = (
  backend: Pick<Backend, "directory">,
  store: string,
  operation: string,
  cause: unknown
): Store.StoreError =>
  CORRUPTED.test(codes(cause))
    ? Store.storeError(
        new Store.Corrupted({ store, path: backend.directory, detail: `${operation}: ${message(cause)}` })
      )
    : Store.storeError(new Store.IoError({ operation: `${operation} ${store}`, detail: message(cause) }))

/**
 * Decides, from the directory's entries, whether the engine may see it and how (`storeDirectory.ts`), and runs the
 * backend's own checks on an existing database. Fails without having written anything.
 */
const prepare = (backend: Backend): Effect.Effect<OpenMode, Store.StoreError> =>
  Effect.gen(function* () {
    const listing = yield* Effect.tryPromise({
      try: () => StoreDirectory.list(backend.directory),
      catch: (cause) => openError(backend, cause)
    })
    const verdict = StoreDirectory.classify(listing, backend.name)
    switch (verdict._tag) {
      case "NotADirectory":
        return yield* Effect.fail(
          Store.storeError(new Store.IoError({ operation: `open ${backend.directory}`, detail: "not a directory" }))
        )
      case "Foreign":
        return yield* Effect.fail(
          Store.storeError(
            new Store.ForeignStoreDirectory({ store: backend.name, path: backend.directory, found: verdict.found })
          )
        )
      case "Corrupted":
        return yield* Effect.fail(
          Store.storeError(
            new Store.Corrupted({ store: backend.name, path: backend.directory, detail: verdict.detail })
          )
        )
      case "Create":
        if (listing._tag === "Missing") {
          // The engines create one directory level only.
          yield* Effect.tryPromise({
            try: () => mkdir(backend.directory, { recursive: true }),
            catch: (cause) => openError(backend, cause)
          })
        }
        return { create: true }
      case "Open": {
        const check = backend.check
        if (check !== undefined && listing._tag === "Entries") {
          const names = listing.entries.map((e) => e.name)
          const damage = yield* Effect.tryPromise({
            try: () => check(names),
            catch: (cause) => openError(backend, cause)
          })
          if (damage !== undefined) {
            return yield* Effect.fail(
              Store.storeError(new Store.Corrupted({ store: backend.name, path: backend.directory, detail: damage }))
            )
          }
        }
        return { create: false }
      }
    }
  })

/** Opens the database in a scope and serves the `Store` protocol from it. */
export const make = (backend: Backend): Effect.Effect<Store.Shape, Store.StoreError, Scope.Scope> =>
  Effect.gen(function* () {
    const mode = yield* prepare(backend)
    // After a failed write the database is opened again (`reopeningDb.ts`): it exists by then, so never created.
    const db = yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: () => backend.open(mode).then((first) => reopeningDb(first, () => backend.open({ create: false }))),
        catch: (cause) => openError(backend, cause)
      }),
      (db) => Effect.promise(() => db.close().catch(() => undefined))
    )
    const open = new Set<string>()
    /** Runs a driver call of `operation` (e.g. `"get"`) on the partition store `store`. */
    const io = <A>(store: string, operation: string, f: () => Promise<A>): Effect.Effect<A, Store.StoreError> =>
      Effect.tryPromise({ try: f, catch: (cause) => ioError(backend, store, operation, cause) })

    /** Deletes a whole key range in one atomic batch. */
    const deleteRange = (store: string, operation: string, from: Buffer, to: Buffer) =>
      io(store, operation, async () => {
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
    const closedStore = (id: Store.Id): Store.StoreError | undefined =>
      StoreValidation.checkStoreId(id) ??
      (open.has(storeName(id))
        ? Store.storeError(new Store.Locked({ store: storeName(id), path: backend.directory }))
        : undefined)

    const openStore = (id: Store.Id) =>
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

    const drop = (id: Store.Id) =>
      Effect.suspend(() => {
        const unavailable = closedStore(id)
        if (unavailable) return Effect.fail(unavailable)
        const prefix = storePrefix(id)
        return deleteRange(storeName(id), "drop", prefix, prefixEnd(prefix))
      })

    return { backend: backend.name, limits: backend.limits, open: openStore, drop } satisfies Store.Shape
  })

/**
 * Translates a user range into the key space of the partition under `prefix` (its data ends at `dataEnd`);
 * `undefined` when it selects nothing.
 */
const driverRange = (prefix: Buffer, dataEnd: Buffer, range: Store.ScanRange): DriverRange | undefined => {
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

const makePartition = (
  id: Store.Id,
  db: DriverDb,
  backend: Backend,
  io: <A>(store: string, operation: string, f: () => Promise<A>) => Effect.Effect<A, Store.StoreError>,
  deleteRange: (store: string, operation: string, from: Buffer, to: Buffer) => Effect.Effect<void, Store.StoreError>
) => {
  const name = storeName(id)
  const prefix = storePrefix(id)
  const dataEnd = Buffer.concat([prefix, Buffer.from([META])])
  const end = prefixEnd(prefix)
  const limits = backend.limits
  const handle = { closed: false, store: undefined as unknown as Store.PartitionStore }
  const closed = () => Store.storeError(new Store.Closed({ store: name }))
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

  const write = (
    ops: ReadonlyArray<Store.Op>,
    options?: { readonly offsets?: ReadonlyArray<Models.TopicPartitionOffset> }
  ) =>
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
      return io(name, "write", () => db.batch(fill, { sync: backend.sync }))
    })

  const scan = (range: Store.ScanRange = {}) =>
    Stream.unwrap(
      Effect.gen(function* () {
        if (handle.closed) return yield* Effect.fail(closed())
        for (const b of ["gt", "gte", "lt", "lte"] as const) {
          const bad = StoreValidation.checkBound(range[b], b)
          if (bad) return yield* Effect.fail(bad)
        }
        const badLimit = StoreValidation.checkLimit(range.limit)
        if (badLimit) return yield* Effect.fail(badLimit)
        const r = driverRange(prefix, dataEnd, range)
        if (r === undefined) return Stream.empty
        const it = yield* Effect.acquireRelease(
          Effect.sync(() => db.iterator(r)),
          (it) => Effect.promise(() => it.close().catch(() => undefined))
        )
        return Stream.paginate(undefined, () =>
          io(name, "scan", () => it.nextv(SCAN_CHUNK)).pipe(
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
  const guard = <A>(f: () => Effect.Effect<A, Store.StoreError>) =>
    Effect.suspend(() => (handle.closed ? Effect.fail(closed()) : f()))
  /** One key, read synchronously when the driver can. */
  const readOne = (operation: string, key: Buffer): Effect.Effect<Buffer | undefined, Store.StoreError> => {
    const getSync = db.getSync
    return getSync === undefined
      ? io(name, operation, () => db.get(key))
      : Effect.try({ try: () => getSync(key), catch: (cause) => ioError(backend, name, operation, cause) })
  }

  const store: Store.PartitionStore = {
    id,
    get: (key) =>
      guard(() => {
        const bad = checked(key)
        if (bad) return Effect.fail(bad)
        return Effect.map(readOne("get", withPrefix(prefix, key)), (v) =>
          Option.fromUndefinedOr(v as Uint8Array | undefined)
        )
      }),
    getMany: (keys) =>
      guard(() => {
        for (const key of keys) {
          const bad = checked(key)
          if (bad) return Effect.fail(bad)
        }
        const driverKeys = keys.map((k) => withPrefix(prefix, k))
        const getManySync = db.getManySync
        const values =
          getManySync === undefined
            ? io(name, "getMany", () => db.getMany(driverKeys))
            : Effect.try({
                try: () => getManySync(driverKeys),
                catch: (cause) => ioError(backend, name, "getMany", cause)
              })
        return Effect.map(values, (vs) => vs.map((v) => Option.fromUndefinedOr(v as Uint8Array | undefined)))
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
      guard(() => {
        // A partition of NaN or 0.4 would be written into the key as 0: another partition's offset.
        const bad = StoreValidation.checkTopicPartition(tp)
        if (bad) return Effect.fail(bad)
        return Effect.map(readOne("persistedOffset", metaKey(prefix, tp)), (v) =>
          v === undefined ? Option.none() : Option.some(decodeOffset(v))
        )
      }),
    persistedOffsets: guard(() =>
      io(name, "persistedOffsets", async () => {
        const it = db.iterator({ gte: dataEnd, lt: end })
        const out: Array<Models.TopicPartitionOffset> = []
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
    clear: guard(() => deleteRange(name, "clear", prefix, end))
  }
  handle.store = store
  return handle
}
