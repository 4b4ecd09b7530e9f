import { Effect, Option, Stream } from "effect"
import type { Offset, TopicPartition, TopicPartitionOffset } from "../Models.js"
import { tpKey } from "../Models.js"
import type {
  Entry,
  PartitionStore,
  ScanRange,
  StoreId,
  StoreLimits,
  StoreOp,
  StoreShape,
  WriteOptions
} from "../Store.js"
import { StoreClosed, StoreLocked, storeError } from "../Store.js"
import {
  checkBound,
  checkKey,
  checkOffsets,
  checkStoreId,
  checkValue,
  defaultLimits,
  prefixRange
} from "../StoreValidation.js"

/** A key as a latin1 string: one char per byte, so string order is byte order (for sorted scans). */
const toStr = (bytes: Uint8Array): string =>
  Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("latin1")

/** Entries copied out per scan page. */
const SCAN_PAGE = 1024

/**
 * A stored entry: one slab view holding the key's length (4 bytes, little-endian), the key, then the value. Entries
 * are never mutated: a put stores a new one, so a scan's snapshot of entries does not see later writes.
 */
type Stored = Uint8Array

const HEADER = 4

const keyLengthOf = (e: Stored): number => (e[0]! | (e[1]! << 8) | (e[2]! << 16) | (e[3]! << 24)) >>> 0

const storedKey = (e: Stored): Uint8Array => e.subarray(HEADER, HEADER + keyLengthOf(e))

const storedValue = (e: Stored): Uint8Array => e.subarray(HEADER + keyLengthOf(e))

/** Whether entry `e` holds `key`. */
const holds = (e: Stored, key: Uint8Array): boolean => {
  if (keyLengthOf(e) !== key.length) return false
  for (let i = 0; i < key.length; i++) if (e[HEADER + i] !== key[i]) return false
  return true
}

/**
 * FNV-1a of the key's bytes, cut to 30 bits so it stays a small integer: a map keyed by it is several times cheaper
 * than one keyed by strings (no string per key to build, hash and keep).
 */
const hashOf = (key: Uint8Array): number => {
  let h = 0x811c9dc5
  for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key[i]!, 0x01000193)
  return h & 0x3fffffff
}

/** A copy of a stored value for a caller (a stored value is a view into a shared slab). */
const valueCopy = (e: Stored): Uint8Array => Uint8Array.from(storedValue(e))

/** Entries by key hash: one entry, or the few whose keys share a hash. */
type Index = Map<number, Stored | Array<Stored>>

interface Partition {
  readonly index: Index
  readonly offsets: Map<string, TopicPartitionOffset>
  /** Keys in order (latin1 strings), rebuilt lazily after a key is added or removed. */
  sorted: Array<string> | undefined
  open: boolean
}

/** The entry holding `key`, if any. */
const lookup = (index: Index, key: Uint8Array): Stored | undefined => {
  const found = index.get(hashOf(key))
  if (found === undefined) return undefined
  if (!Array.isArray(found)) return holds(found, key) ? found : undefined
  for (const e of found) if (holds(e, key)) return e
  return undefined
}

/** Stores `e` under its key; whether the key is new. */
const insert = (index: Index, key: Uint8Array, e: Stored): boolean => {
  const h = hashOf(key)
  const found = index.get(h)
  if (found === undefined) {
    index.set(h, e)
    return true
  }
  if (!Array.isArray(found)) {
    if (holds(found, key)) {
      index.set(h, e)
      return false
    }
    index.set(h, [found, e])
    return true
  }
  for (let i = 0; i < found.length; i++) {
    if (holds(found[i]!, key)) {
      found[i] = e
      return false
    }
  }
  found.push(e)
  return true
}

/** Removes the entry holding `key`; whether there was one. */
const remove = (index: Index, key: Uint8Array): boolean => {
  const h = hashOf(key)
  const found = index.get(h)
  if (found === undefined) return false
  if (!Array.isArray(found)) {
    if (!holds(found, key)) return false
    index.delete(h)
    return true
  }
  const at = found.findIndex((e) => holds(e, key))
  if (at < 0) return false
  const rest = found.filter((_, i) => i !== at)
  index.set(h, rest.length === 1 ? rest[0]! : rest)
  return true
}

/** Every stored entry, in no order. */
const entriesOf = function* (index: Index): Generator<Stored> {
  for (const found of index.values()) {
    if (Array.isArray(found)) yield* found
    else yield found
  }
}

const sortedKeys = (p: Partition): Array<string> => {
  if (p.sorted === undefined) p.sorted = Array.from(entriesOf(p.index), (e) => toStr(storedKey(e))).sort()
  return p.sorted
}

/** First index in `keys` whose key is ≥ `k` (or > `k` when `strict`). */
const lowerBound = (keys: ReadonlyArray<string>, k: string, strict: boolean): number => {
  let lo = 0
  let hi = keys.length
  while (lo < hi) {
    const mid = (lo + hi) >>> 1
    const m = keys[mid]!
    if (m < k || (strict && m === k)) lo = mid + 1
    else hi = mid
  }
  return lo
}

const storeName = (id: StoreId) => `${id.table}/${id.partition}`

/** Builds an in-memory store backend. */
export const make = (options?: Partial<StoreLimits>): Effect.Effect<StoreShape> =>
  Effect.sync(() => {
    const limits: StoreLimits = { ...defaultLimits, ...options }
    const partitions = new Map<string, Partition>()

    /** A valid id of a partition store nobody has open, or the error saying why not. */
    const closedStore = (id: StoreId) =>
      checkStoreId(id) ??
      (partitions.get(storeName(id))?.open ? storeError(new StoreLocked({ store: storeName(id) })) : undefined)

    const open = (id: StoreId) =>
      Effect.acquireRelease(
        Effect.suspend(() => {
          const unavailable = closedStore(id)
          if (unavailable) return Effect.fail(unavailable)
          const name = storeName(id)
          let p = partitions.get(name)
          if (p === undefined) {
            p = { index: new Map(), offsets: new Map(), sorted: undefined, open: false }
            partitions.set(name, p)
          }
          p.open = true
          return Effect.succeed({ p, handle: makePartitionStore(id, p, limits) })
        }),
        ({ handle, p }) =>
          Effect.sync(() => {
            handle.closed = true
            p.open = false
          })
      ).pipe(Effect.map(({ handle }) => handle.store))

    const drop = (id: StoreId) =>
      Effect.suspend(() => {
        const unavailable = closedStore(id)
        if (unavailable) return Effect.fail(unavailable)
        partitions.delete(storeName(id))
        return Effect.void
      })

    return { backend: "memory", limits, open, drop }
  })

const SLAB = 64 * 1024
const OWN = 4 * 1024
let slab = new Uint8Array(SLAB)
let slabUsed = 0

/** `n` bytes from the current slab (a fresh one when it is full); large entries get their own allocation. */
const allocate = (n: number): Uint8Array => {
  if (n > OWN) return new Uint8Array(n)
  if (slabUsed + n > SLAB) {
    slab = new Uint8Array(SLAB)
    slabUsed = 0
  }
  const view = slab.subarray(slabUsed, slabUsed + n)
  slabUsed += n
  return view
}

const makePartitionStore = (id: StoreId, p: Partition, limits: StoreLimits) => {
  const handle = { closed: false, store: undefined as unknown as PartitionStore }
  const name = storeName(id)
  const closedError = () => storeError(new StoreClosed({ store: name }))
  /** Runs `f` unless the store is closed. */
  const guard = <A>(f: () => A) =>
    Effect.suspend(() => (handle.closed ? Effect.fail(closedError()) : Effect.succeed(f())))

  const applyOps = (ops: ReadonlyArray<StoreOp>, offsets: ReadonlyArray<TopicPartitionOffset>) => {
    // The store keeps its own copies (callers may reuse their buffers), carved from shared slabs as Node's Buffer
    // pool does: a typed array of its own per entry costs a microsecond and GC work each.
    for (const op of ops) {
      if (op._tag === "put") {
        const { key, value } = op
        const e = allocate(HEADER + key.length + value.length)
        const n = key.length
        e[0] = n & 0xff
        e[1] = (n >>> 8) & 0xff
        e[2] = (n >>> 16) & 0xff
        e[3] = (n >>> 24) & 0xff
        e.set(key, HEADER)
        e.set(value, HEADER + n)
        if (insert(p.index, key, e)) p.sorted = undefined
      } else if (remove(p.index, op.key)) {
        p.sorted = undefined
      }
    }
    for (const o of offsets) p.offsets.set(tpKey(o), { topic: o.topic, partition: o.partition, offset: o.offset })
  }

  const write = (ops: ReadonlyArray<StoreOp>, options?: WriteOptions) =>
    Effect.suspend(() => {
      if (handle.closed) return Effect.fail(closedError())
      for (const op of ops) {
        const bad = checkKey(op.key, limits) ?? (op._tag === "put" ? checkValue(op.value, limits) : undefined)
        if (bad) return Effect.fail(bad)
      }
      const badOffset = checkOffsets(options?.offsets ?? [])
      if (badOffset) return Effect.fail(badOffset)
      applyOps(ops, options?.offsets ?? [])
      return Effect.void
    })

  const scan = (range: ScanRange = {}): Stream.Stream<Entry, ReturnType<typeof closedError>> =>
    Stream.suspend(() => {
      if (handle.closed) return Stream.fail(closedError())
      for (const b of ["gt", "gte", "lt", "lte"] as const) {
        const bad = checkBound(range[b], b)
        if (bad) return Stream.fail(bad)
      }
      const keys = sortedKeys(p)
      let from = 0
      let to = keys.length
      if (range.gte !== undefined) from = Math.max(from, lowerBound(keys, toStr(range.gte), false))
      if (range.gt !== undefined) from = Math.max(from, lowerBound(keys, toStr(range.gt), true))
      if (range.lt !== undefined) to = Math.min(to, lowerBound(keys, toStr(range.lt), false))
      if (range.lte !== undefined) to = Math.min(to, lowerBound(keys, toStr(range.lte), true))
      // A snapshot by reference: a put replaces a stored entry, never mutates it, so later writes are not seen.
      let slice = from < to ? keys.slice(from, to) : []
      if (range.reverse) slice.reverse()
      if (range.limit !== undefined) slice = slice.slice(0, Math.max(0, range.limit))
      const snapshot = slice.map((k) => lookup(p.index, Buffer.from(k, "latin1"))!)
      // Copies leave the store one page at a time, so a large scan never holds every copy at once.
      return Stream.paginate(0, (at: number) =>
        Effect.sync(() => {
          const end = Math.min(at + SCAN_PAGE, snapshot.length)
          const page: Array<Entry> = new Array(end - at)
          for (let i = at; i < end; i++) {
            const e = snapshot[i]!
            page[i - at] = [Uint8Array.from(storedKey(e)), valueCopy(e)]
          }
          return [page, end < snapshot.length ? Option.some(end) : Option.none()] as const
        })
      )
    })

  const store: PartitionStore = {
    id,
    get: (key) =>
      Effect.suspend(() => {
        const bad = checkKey(key, limits)
        if (bad) return Effect.fail(bad)
        return guard(() => Option.map(Option.fromUndefinedOr(lookup(p.index, key)), valueCopy))
      }),
    getMany: (keys) =>
      Effect.suspend(() => {
        for (const key of keys) {
          const bad = checkKey(key, limits)
          if (bad) return Effect.fail(bad)
        }
        return guard(() => keys.map((key) => Option.map(Option.fromUndefinedOr(lookup(p.index, key)), valueCopy)))
      }),
    put: (key, value) => write([{ _tag: "put", key, value }]),
    delete: (key) => write([{ _tag: "delete", key }]),
    write,
    scan,
    scanPrefix: (prefix, options) =>
      Stream.suspend(() => {
        const bad = checkBound(prefix, "prefix")
        return bad ? Stream.fail(bad) : scan(prefixRange(prefix, options))
      }),
    persistedOffset: (tp: TopicPartition) =>
      guard(() => Option.map(Option.fromUndefinedOr(p.offsets.get(tpKey(tp))), (o): Offset => o.offset)),
    persistedOffsets: guard(() => Array.from(p.offsets.values())),
    setPersistedOffset: (tp, offset) => write([], { offsets: [{ topic: tp.topic, partition: tp.partition, offset }] }),
    clear: guard(() => {
      p.index.clear()
      p.offsets.clear()
      p.sorted = undefined
    })
  }
  handle.store = store
  return handle
}
