import * as Models from "../Models.js"
import * as Store from "../Store.js"
import { Effect, Option, Stream } from "effect"
import * as EntryTable from "./entryTable.js"
import {
  checkBound,
  checkKey,
  checkLimit,
  checkOffsets,
  checkStoreId,
  checkTopicPartition,
  checkValue,
  defaultLimits,
  prefixRange
} from "../StoreValidation.js"

/** A key as a latin1 string: one char per byte, so string order is byte order (for sorted scans). */
const toStr = (bytes: Uint8Array): string =>
  Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("latin1")

/** Entries copied out per scan page. */
const SCAN_PAGE = 1024

interface Partition {
  readonly entries: EntryTable.EntryTable
  readonly offsets: Map<string, Models.TopicPartitionOffset>
  /** Keys in order and their slots, rebuilt lazily after a key is added or removed. */
  order: EntryTable.Order | undefined
  open: boolean
}

const orderOf = (p: Partition): EntryTable.Order => {
  if (p.order === undefined) p.order = EntryTable.order(p.entries)
  return p.order
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

const storeName = (id: Store.Id) => `${id.table}/${id.partition}`

/** Builds an in-memory store backend. */
export const make = (
  options?: {
    readonly [K in keyof Store.Limits]?: Store.Limits[K] | undefined
  }
): Effect.Effect<Store.Shape> =>
  Effect.sync(() => {
    const limits: Store.Limits = {
      maxKeyBytes: options?.maxKeyBytes ?? defaultLimits.maxKeyBytes,
      maxValueBytes: options?.maxValueBytes ?? defaultLimits.maxValueBytes
    }
    const partitions = new Map<string, Partition>()

    /** A valid id of a partition store nobody has open, or the error saying why not. */
    const closedStore = (id: Store.Id) =>
      checkStoreId(id) ??
      (partitions.get(storeName(id))?.open ? Store.storeError(new Store.Locked({ store: storeName(id) })) : undefined)

    const open = (id: Store.Id) =>
      Effect.acquireRelease(
        Effect.suspend(() => {
          const unavailable = closedStore(id)
          if (unavailable) return Effect.fail(unavailable)
          const name = storeName(id)
          let p = partitions.get(name)
          if (p === undefined) {
            p = { entries: EntryTable.make(), offsets: new Map(), order: undefined, open: false }
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

    const drop = (id: Store.Id) =>
      Effect.suspend(() => {
        const unavailable = closedStore(id)
        if (unavailable) return Effect.fail(unavailable)
        partitions.delete(storeName(id))
        return Effect.void
      })

    return { backend: "memory", limits, open, drop }
  })

const makePartitionStore = (id: Store.Id, p: Partition, limits: Store.Limits) => {
  const handle = { closed: false, store: undefined as unknown as Store.PartitionStore }
  const name = storeName(id)
  const closedError = () => Store.storeError(new Store.Closed({ store: name }))
  /** Runs `f` unless the store is closed. */
  const guard = <A>(f: () => A) =>
    Effect.suspend(() => (handle.closed ? Effect.fail(closedError()) : Effect.succeed(f())))

  /** A copy of the value stored under `key`, if any. */
  const storedValue = (key: Uint8Array): Option.Option<Uint8Array> => {
    const i = EntryTable.find(p.entries, key)
    return i < 0 ? Option.none() : Option.some(EntryTable.valueAt(p.entries, i))
  }

  const applyOps = (ops: ReadonlyArray<Store.Op>, offsets: ReadonlyArray<Models.TopicPartitionOffset>) => {
    // The store keeps its own copies (callers may reuse their buffers), in the table's slabs.
    for (const op of ops) {
      if (op._tag === "put" ? EntryTable.put(p.entries, op.key, op.value) : EntryTable.remove(p.entries, op.key))
        p.order = undefined
    }
    for (const o of offsets)
      p.offsets.set(Models.tpKey(o), { topic: o.topic, partition: o.partition, offset: o.offset })
  }

  const write = (ops: ReadonlyArray<Store.Op>, options?: Store.WriteOptions) =>
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

  const scan = (range: Store.ScanRange = {}): Stream.Stream<Store.Entry, ReturnType<typeof closedError>> =>
    Stream.suspend(() => {
      if (handle.closed) return Stream.fail(closedError())
      for (const b of ["gt", "gte", "lt", "lte"] as const) {
        const bad = checkBound(range[b], b)
        if (bad) return Stream.fail(bad)
      }
      const badLimit = checkLimit(range.limit)
      if (badLimit) return Stream.fail(badLimit)
      const { keys, slots } = orderOf(p)
      let from = 0
      let to = keys.length
      if (range.gte !== undefined) from = Math.max(from, lowerBound(keys, toStr(range.gte), false))
      if (range.gt !== undefined) from = Math.max(from, lowerBound(keys, toStr(range.gt), true))
      if (range.lt !== undefined) to = Math.min(to, lowerBound(keys, toStr(range.lt), false))
      if (range.lte !== undefined) to = Math.min(to, lowerBound(keys, toStr(range.lte), true))
      let selected = slots.subarray(from, Math.max(from, to))
      if (range.reverse) selected = selected.slice().reverse()
      if (range.limit !== undefined) selected = selected.subarray(0, Math.max(0, range.limit))
      // Where the entries are now: slab bytes are never changed once written, so later writes are not seen.
      const snapshot = EntryTable.snapshot(p.entries, selected)
      const count = snapshot.ats.length
      // Copies leave the store one page at a time (one buffer per page), so a large scan never holds every copy.
      return Stream.paginate(0, (at: number) =>
        Effect.sync(() => {
          const end = Math.min(at + SCAN_PAGE, count)
          const page: Array<Store.Entry> = EntryTable.copyOut(snapshot, at, end)
          return [page, end < count ? Option.some(end) : Option.none()] as const
        })
      )
    })

  const store: Store.PartitionStore = {
    id,
    get: (key) =>
      Effect.suspend(() => {
        const bad = checkKey(key, limits)
        if (bad) return Effect.fail(bad)
        return guard(() => storedValue(key))
      }),
    getMany: (keys) =>
      Effect.suspend(() => {
        for (const key of keys) {
          const bad = checkKey(key, limits)
          if (bad) return Effect.fail(bad)
        }
        return guard(() => keys.map(storedValue))
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
    persistedOffset: (tp: Models.TopicPartition) =>
      Effect.suspend(() => {
        const bad = checkTopicPartition(tp)
        if (bad) return Effect.fail(bad)
        return guard(() =>
          Option.map(Option.fromUndefinedOr(p.offsets.get(Models.tpKey(tp))), (o): Models.Offset => o.offset)
        )
      }),
    persistedOffsets: guard(() => Array.from(p.offsets.values())),
    setPersistedOffset: (tp, offset) => write([], { offsets: [{ topic: tp.topic, partition: tp.partition, offset }] }),
    clear: guard(() => {
      EntryTable.clear(p.entries)
      p.offsets.clear()
      p.order = undefined
    })
  }
  handle.store = store
  return handle
}
