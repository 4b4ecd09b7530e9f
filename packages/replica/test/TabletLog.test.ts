import { MemoryStore, Store } from "@strata/core"
import { mkdtempSync, rmSync } from "node:fs"
import { readdir, stat } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as LevelStore from "@strata/store-adapters/level"
import * as RocksDbStore from "@strata/store-adapters/rocksdb"
import { Context, Effect, Exit, Layer, Scope, Stream } from "effect"
import { TestClock } from "effect/testing"
import { afterAll } from "vitest"
import * as Codec from "../src/wire/internal/batchCodec.js"
import * as LeaderEpochCache from "../src/machines/LeaderEpochCache.js"
import * as SegmentLog from "../src/server/SegmentLog.js"
import * as TabletLog from "../src/server/TabletLog.js"

const tablet = { table: "orders", bucket: 0 }
const enc = new TextEncoder()
const record = (text: string): TabletLog.TabletRecord => ({
  key: enc.encode(`k-${text}`),
  value: enc.encode(text),
  headers: [{ key: "h", value: enc.encode(text) }],
  timestamp: 1_700_000_000_000
})
const records = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => record(String(from + i)))
const texts = (batches: ReadonlyArray<TabletLog.Batch>) =>
  batches.flatMap((b) => b.records.map((r, i) => `${b.baseOffset + i}@${b.epoch}:${new TextDecoder().decode(r.value)}`))

/** A log a test opened, and what the test may look at beneath it. */
interface Opened {
  readonly log: TabletLog.TabletLog
  /** Closes the log (and its store). */
  readonly close: Effect.Effect<void>
  /**
   * The log opened again on the same storage: on a store, beside the open one; on segments, once the open one is
   * closed (a directory has one open log), and `close` then closes the new one.
   */
  readonly reopen: Effect.Effect<TabletLog.TabletLog, TabletLog.TabletLogError>
  /** The bytes of the batches its storage holds, counted independently of the log. */
  readonly stored: Effect.Effect<number>
  /** The partition store beneath it (store backends only). */
  readonly store: Store.PartitionStore | undefined
}

/** Where the logs of a test live: `open` opens the log of a store id there. */
class Storage extends Context.Service<
  Storage,
  {
    /** Opens a log; `segmentBytes`: where a segment log rolls (a store-backed log has no segments). */
    readonly open: (
      id: Store.Id,
      segmentBytes?: number
    ) => Effect.Effect<Opened, TabletLog.TabletLogError | Store.StoreError>
  }
>()("test/TabletLog/Storage") {}

/** Opens the tablet's log of store id `id` in a scope of its own (closing it closes the store). */
const open = (id: Store.Id = { table: "tablet-orders", partition: 0 }, segmentBytes?: number) =>
  Effect.gen(function* () {
    return yield* (yield* Storage).open(id, segmentBytes)
  })

/** The store beneath a log (a test for store backends only). */
const storeOf = (opened: Opened): Store.PartitionStore => opened.store ?? assert.fail("not on a store")

/** What the store holds in the batch range, counted independently of the log. */
const storedInStore = (store: Store.PartitionStore) =>
  Stream.runFold(
    store.scan(Codec.BATCHES),
    () => 0,
    (n, [, v]) => n + v.length
  ).pipe(Effect.orDie)

/** Logs on a store: every store id is a partition store of it. */
const onStore = (layer: Layer.Layer<Store.Store, unknown>) =>
  Layer.effect(
    Storage,
    Effect.gen(function* () {
      const stores = yield* Store.Store
      return {
        open: (id: Store.Id) =>
          Effect.gen(function* () {
            const scope = yield* Scope.make()
            const store = yield* Scope.provide(stores.open(id), scope)
            const log = yield* TabletLog.make(store, tablet)
            const opened: Opened = {
              log,
              store,
              close: Scope.close(scope, Exit.void),
              reopen: TabletLog.make(store, tablet),
              stored: storedInStore(store)
            }
            return opened
          })
      }
    })
  ).pipe(Layer.provide(layer))

/** The bytes of the `.log` files of a directory. */
const segmentFileBytes = (directory: string) =>
  Effect.promise(async () => {
    let n = 0
    for (const file of await readdir(directory)) {
      if (file.endsWith(".log")) n += (await stat(join(directory, file))).size
    }
    return n
  })

/** Segment logs: every store id is a directory under `root`; `tailBytes` as `SegmentLog.make` takes it. */
const onSegments = (root: string, tailBytes?: number) =>
  Layer.succeed(Storage, {
    open: (id: Store.Id, segmentBytes?: number) =>
      Effect.gen(function* () {
        const directory = join(root, `${id.table}-${id.partition}`)
        const openIn = (scope: Scope.Scope) =>
          Scope.provide(
            SegmentLog.make({
              directory,
              tablet,
              ...(segmentBytes === undefined ? {} : { segmentBytes }),
              ...(tailBytes === undefined ? {} : { tailBytes })
            }),
            scope
          )
        let scope = yield* Scope.make()
        const log = yield* openIn(scope)
        const opened: Opened = {
          log,
          store: undefined,
          close: Effect.suspend(() => Scope.close(scope, Exit.void)),
          reopen: Effect.gen(function* () {
            yield* Scope.close(scope, Exit.void)
            scope = yield* Scope.make()
            return yield* openIn(scope)
          }),
          stored: segmentFileBytes(directory)
        }
        return opened
      })
  })

const root = mkdtempSync(join(tmpdir(), "strata-tablet-log-"))
afterAll(() => rmSync(root, { recursive: true, force: true }))
let fresh = 0
/**
 * The storages the log runs on: core's stores (memory, LevelDB, RocksDB) under the store-backed log, and segment
 * files under the segment log; the persistent ones get a fresh directory per test. `frameBytes`: what each stored
 * batch takes besides its encoding.
 */
const backends: ReadonlyArray<{
  readonly name: string
  readonly kind: "store" | "segments"
  readonly frameBytes: number
  readonly layer: () => Layer.Layer<Storage, unknown>
}> = [
  { name: "memory", kind: "store", frameBytes: 0, layer: () => onStore(MemoryStore.layer()) },
  {
    name: "level",
    kind: "store",
    frameBytes: 0,
    layer: () => onStore(LevelStore.layer({ directory: join(root, `level-${++fresh}`) }))
  },
  {
    name: "rocksdb",
    kind: "store",
    frameBytes: 0,
    layer: () => onStore(RocksDbStore.layer({ directory: join(root, `rocksdb-${++fresh}`) }))
  },
  {
    name: "segment files",
    kind: "segments",
    frameBytes: SegmentLog.FRAME_BYTES,
    layer: () => onSegments(join(root, `segments-${++fresh}`))
  },
  {
    // Every read from the files: the tail in memory answers the recent ones otherwise.
    name: "segment files without a tail in memory",
    kind: "segments",
    frameBytes: SegmentLog.FRAME_BYTES,
    layer: () => onSegments(join(root, `segments-${++fresh}`), 0)
  },
  {
    // A tail of a few batches: reads start in it, before it, and across its start.
    name: "segment files with a small tail",
    kind: "segments",
    frameBytes: SegmentLog.FRAME_BYTES,
    layer: () => onSegments(join(root, `segments-${++fresh}`), 200)
  }
]

for (const { name: backend, kind, frameBytes, layer } of backends) {
  const onStorage = <A, E>(self: Effect.Effect<A, E, Storage>) => self.pipe(Effect.provide(layer()), Effect.orDie)
  /** A test that looks at the store beneath the log: declared for store backends only (the segment log has its own). */
  const onStoreOnly = (...test: Parameters<typeof it.effect>) => {
    if (kind === "store") it.effect(...test)
  }

  describe(`TabletLog on ${backend}`, () => {
    it.effect("appends, reads from any offset, and reopens to the same log with its epoch cache", () =>
      onStorage(
        Effect.gen(function* () {
          const a = yield* open()
          assert.deepStrictEqual(yield* a.log.append(1, records(0, 4)), { baseOffset: 0, lastOffset: 4 })
          assert.deepStrictEqual(yield* a.log.append(3, records(5, 7)), { baseOffset: 5, lastOffset: 7 })
          assert.strictEqual(yield* a.log.logEndOffset, 8)
          assert.deepStrictEqual(texts(yield* a.log.read(3, 1_000_000)), ["3@1:3", "4@1:4", "5@3:5", "6@3:6", "7@3:7"])
          assert.deepStrictEqual(yield* a.log.read(8, 100), [])
          assert.deepStrictEqual(texts(yield* a.log.read(0, 1)), ["0@1:0", "1@1:1", "2@1:2", "3@1:3", "4@1:4"])
          yield* a.log.checkpointHighWatermark(6)
          yield* a.close

          const b = yield* open()
          assert.strictEqual(yield* b.log.logEndOffset, 8)
          assert.strictEqual(yield* b.log.highWatermark, 6)
          assert.deepStrictEqual(yield* b.log.epochs, [
            { epoch: 1, startOffset: 0 },
            { epoch: 3, startOffset: 5 }
          ])
          assert.deepStrictEqual(yield* b.log.endOffsetForEpoch(2), { epoch: 1, endOffset: 5 })
          const read = (yield* b.log.read(0, 1_000_000))[0]!.records[0]!
          assert.deepStrictEqual(read, record("0"), "keys, values, headers and timestamps come back as written")
          yield* b.close
        })
      )
    )

    it.effect("truncation cuts a straddling batch, drops the epochs it removed and takes the HW down", () =>
      onStorage(
        Effect.gen(function* () {
          const { log, close } = yield* open()
          yield* log.append(1, records(0, 4))
          yield* log.append(2, records(5, 9))
          yield* log.checkpointHighWatermark(9)
          yield* log.truncateTo(3)
          assert.strictEqual(yield* log.logEndOffset, 3)
          assert.strictEqual(yield* log.highWatermark, 3)
          assert.deepStrictEqual(yield* log.epochs, [{ epoch: 1, startOffset: 0 }])
          assert.deepStrictEqual(texts(yield* log.read(0, 1_000_000)), ["0@1:0", "1@1:1", "2@1:2"])
          yield* log.append(4, records(3, 4))
          assert.deepStrictEqual(yield* log.epochs, [
            { epoch: 1, startOffset: 0 },
            { epoch: 4, startOffset: 3 }
          ])
          yield* close
        })
      )
    )

    it.effect(
      "truncating inside an idempotent batch that retention left holding the log start empties the log at its start",
      () =>
        onStorage(
          Effect.gen(function* () {
            const { log, reopen, close } = yield* open()
            yield* log.append(1, records(0, 5), { id: 7, epoch: 0, sequence: 0 })
            yield* log.checkpointHighWatermark(6)
            yield* log.deleteBefore(3) // the batch [0, 5] holds the new start and stays whole
            yield* log.truncateTo(4) // the producer's batch goes whole: nothing is left at or past the start
            assert.deepStrictEqual(
              [yield* log.logStartOffset, yield* log.logEndOffset, yield* log.highWatermark],
              [3, 3, 3]
            )
            assert.deepStrictEqual(yield* log.read(3, 1_000_000), [])
            // It reopens as it is (before, the start passed the end and the log could not be opened again).
            const reopened = yield* reopen
            assert.deepStrictEqual([yield* reopened.logStartOffset, yield* reopened.logEndOffset], [3, 3])
            assert.deepStrictEqual(yield* reopened.append(2, records(3, 4)), { baseOffset: 3, lastOffset: 4 })
            yield* close
          })
        )
    )

    it.effect("the seed's scenario on two logs: A truncates to 100 and takes B's 100–105", () =>
      onStorage(
        Effect.gen(function* () {
          const a = yield* open({ table: "tablet-a", partition: 0 })
          const b = yield* open({ table: "tablet-b", partition: 0 })
          for (const log of [a.log, b.log]) yield* log.append(4, records(0, 99))
          yield* a.log.append(5, records(100, 110)) // A, leader of epoch 5, unreplicated; then it dies
          yield* b.log.append(6, records(100, 105)) // B, leader of epoch 6
          // A comes back as B's follower: where does its latest epoch end on B?
          const latest = LeaderEpochCache.latest(yield* a.log.epochs)!.epoch
          const answer = yield* b.log.endOffsetForEpoch(latest)
          const step = LeaderEpochCache.divergence(yield* a.log.epochs, yield* a.log.logEndOffset, answer)
          assert.deepStrictEqual(step, { _tag: "Truncate", offset: 100 })
          yield* a.log.truncateTo(100)
          yield* a.log.appendBatches(yield* b.log.read(100, 1_000_000))
          assert.deepStrictEqual(texts(yield* a.log.read(0, 1_000_000)), texts(yield* b.log.read(0, 1_000_000)))
          assert.deepStrictEqual(yield* a.log.epochs, yield* b.log.epochs)
          yield* a.close
          yield* b.close
        })
      )
    )

    it.effect(
      "retain lets go by age and by size from the start, never past the limit (nor, on segments, the active segment), and the start stays so",
      () =>
        onStorage(
          Effect.gen(function* () {
            // Ten batches of ten records, batch i's written at i seconds; on segments each batch is a segment.
            const { log, reopen, close } = yield* open(undefined, 1)
            for (let i = 0; i < 10; i++) {
              const batch = records(i * 10, i * 10 + 9).map((r) => ({ ...r, timestamp: i * 1000 }))
              yield* log.append(1, batch)
            }
            yield* log.checkpointHighWatermark(80)
            const oneBatch = (yield* log.sizeBytes) / 10
            // By age: the batches whose newest record is more than 5 s older than now (10 s): 0..4.
            assert.strictEqual(yield* log.retain({ ms: 5_000 }, 80, 10_000), 50)
            const below = yield* Effect.flip(log.read(49, 1_000_000))
            assert.strictEqual(below.reason._tag, "OffsetOutOfRange")
            assert.deepStrictEqual(texts(yield* log.read(50, 1)).slice(0, 1), ["50@1:50"])
            // Nothing more by age now; by size, the oldest go while what is left holds at least 2.5 batches.
            assert.strictEqual(yield* log.retain({ ms: 5_000 }, 80, 10_000), 50)
            assert.strictEqual(yield* log.retain({ bytes: Math.ceil(oneBatch * 2.5) }, 80, 10_000), 70)
            assert.isAtLeast(yield* log.sizeBytes, oneBatch * 2.5)
            // Never past the limit (the high watermark), whatever the age.
            assert.strictEqual(yield* log.retain({ ms: 1 }, 75, 1e15), 70)
            assert.strictEqual(yield* log.retain({ ms: 1 }, 80, 1e15), 80)
            // The last batch: a store-backed log lets it go; a segment log never deletes its active segment.
            yield* log.checkpointHighWatermark(100)
            const last = kind === "segments" ? 90 : 100
            assert.strictEqual(yield* log.retain({ ms: 1 }, 100, 1e15), last)
            const reopened = yield* reopen
            assert.deepStrictEqual([yield* reopened.logStartOffset, yield* reopened.logEndOffset], [last, 100])
            assert.deepStrictEqual(yield* reopened.append(2, records(100, 100)), { baseOffset: 100, lastOffset: 100 })
            yield* close
          })
        )
    )

    it.effect("retention drops whole batches below the start; reads begin there", () =>
      onStorage(
        Effect.gen(function* () {
          const { log, store, close } = yield* open()
          yield* log.append(1, records(0, 4))
          yield* log.append(2, records(5, 9))
          yield* log.deleteBefore(7)
          assert.strictEqual(yield* log.logStartOffset, 7)
          assert.deepStrictEqual(texts(yield* log.read(7, 1_000_000)), ["7@2:7", "8@2:8", "9@2:9"])
          const error = yield* Effect.flip(log.read(6, 100))
          assert.strictEqual(error.reason._tag, "OffsetOutOfRange")
          assert.deepStrictEqual(yield* log.epochs, [{ epoch: 2, startOffset: 7 }])
          if (store !== undefined) {
            // Only the batch holding offset 7 is left in the store (segment files keep the whole segment holding it:
            // SegmentLog.test.ts looks at those).
            const batches = yield* store.getMany([
              new Uint8Array([1, 0, 0, 0, 0, 0, 0, 0, 0]),
              new Uint8Array([1, 0, 0, 0, 0, 0, 0, 0, 5])
            ])
            assert.deepStrictEqual(
              batches.map((b) => b._tag),
              ["None", "Some"]
            )
          }
          yield* log.resetTo(40)
          assert.deepStrictEqual(
            [yield* log.logStartOffset, yield* log.logEndOffset, yield* log.highWatermark],
            [40, 40, 40]
          )
          assert.deepStrictEqual(yield* log.epochs, [])
          yield* close
        })
      )
    )

    it.effect(
      "its size is the bytes of the batches it holds: through appends, truncation, retention, reset and reopening",
      () =>
        onStorage(
          Effect.gen(function* () {
            const id = { table: "tablet-size", partition: 0 }
            // A batch as stored: its encoding, and its frame in a segment file.
            const size = (epoch: number, batch: ReadonlyArray<TabletLog.TabletRecord>) =>
              Codec.encodeBatch(epoch, batch).length + frameBytes
            const a = yield* open(id)
            assert.strictEqual(yield* a.log.sizeBytes, 0)
            yield* a.log.append(1, records(0, 4))
            assert.strictEqual(yield* a.log.sizeBytes, size(1, records(0, 4)))
            yield* a.log.append(2, records(5, 9), { id: 42, epoch: 0, sequence: 0 })
            yield* a.log.appendBatches([{ baseOffset: 10, epoch: 2, records: records(10, 14) }])
            const three = yield* a.log.sizeBytes
            assert.isAbove(three, 3 * size(1, records(0, 4)) - 1)
            assert.strictEqual(three, yield* a.stored)
            // Cuts the third batch whole, the producer's second whole (a retry rewrites it whole), keeps the first.
            yield* a.log.truncateTo(7)
            assert.strictEqual(yield* a.log.logEndOffset, 5)
            assert.strictEqual(yield* a.log.sizeBytes, size(1, records(0, 4)))
            // Cuts the first batch in the middle: the part written back counts, the rest does not.
            yield* a.log.truncateTo(2)
            assert.strictEqual(yield* a.log.sizeBytes, size(1, records(0, 1)))
            assert.strictEqual(yield* a.log.sizeBytes, yield* a.stored)
            yield* a.log.append(3, records(2, 6))
            yield* a.log.append(3, records(7, 9))
            // Retention drops the first batch from a store; the one holding offset 4 stays whole, and counts whole.
            // (Segment files drop whole segments only: the one segment here keeps the first batch too.)
            yield* a.log.deleteBefore(4)
            assert.strictEqual(
              yield* a.log.sizeBytes,
              (kind === "segments" ? size(1, records(0, 1)) : 0) + size(3, records(2, 6)) + size(3, records(7, 9))
            )
            assert.strictEqual(yield* a.log.sizeBytes, yield* a.stored)
            const kept = yield* a.log.sizeBytes
            yield* a.close

            const b = yield* open(id)
            assert.strictEqual(yield* b.log.sizeBytes, kept)
            // A log written without the size field (before it was kept) counts its batches when it opens (a store's
            // field; segment files are their own size).
            if (b.store !== undefined) yield* b.store.delete(Codec.fieldKey("bytes"))
            yield* b.close
            const c = yield* open(id)
            assert.strictEqual(yield* c.log.sizeBytes, kept)
            yield* c.log.resetTo(40)
            assert.strictEqual(yield* c.log.sizeBytes, 0)
            assert.strictEqual(yield* c.stored, 0)
            yield* c.close
            const d = yield* open(id)
            assert.strictEqual(yield* d.log.sizeBytes, 0)
            yield* d.close
          })
        )
    )

    it.effect("a follower's batches must continue the log and not go back in epoch; nothing is written otherwise", () =>
      onStorage(
        Effect.gen(function* () {
          const { log, close } = yield* open()
          yield* log.append(3, records(0, 1))
          const gap = yield* Effect.flip(log.appendBatches([{ baseOffset: 5, epoch: 3, records: records(5, 5) }]))
          assert.strictEqual(gap.reason._tag, "NotContiguous")
          assert.include(gap.message, "does not start at the log end 2")
          const stale = yield* Effect.flip(log.appendBatches([{ baseOffset: 2, epoch: 2, records: records(2, 2) }]))
          assert.strictEqual(stale.reason._tag, "StaleEpoch")
          assert.strictEqual(yield* log.logEndOffset, 2)
          yield* close
        })
      )
    )

    it.effect(
      "an idempotent retry gets its first offsets back, also after a reopen; gaps and fenced epochs are refused",
      () =>
        onStorage(
          Effect.gen(function* () {
            const id = { table: "tablet-idem", partition: 0 }
            const a = yield* open(id)
            const producer = (sequence: number, epoch = 0) => ({ id: 42, epoch, sequence })
            assert.deepStrictEqual(yield* a.log.append(1, records(0, 2), producer(0)), { baseOffset: 0, lastOffset: 2 })
            yield* a.log.append(1, records(3, 3))
            assert.deepStrictEqual(yield* a.log.append(1, records(4, 5), producer(3)), { baseOffset: 4, lastOffset: 5 })
            yield* a.close
            const b = yield* open(id)
            assert.deepStrictEqual(yield* b.log.append(2, records(0, 2), producer(0)), {
              baseOffset: 0,
              lastOffset: 2,
              duplicate: true
            })
            assert.strictEqual(yield* b.log.logEndOffset, 6, "the retry wrote nothing")
            const gap = yield* Effect.flip(b.log.append(2, records(6, 6), producer(9)))
            assert.include(gap.message, "producer 42: sequence 9 is out of order (expected 5)")
            yield* b.log.append(2, records(6, 6), producer(0, 1))
            const fenced = yield* Effect.flip(b.log.append(2, records(7, 7), producer(5, 0)))
            assert.include(fenced.message, "producer epoch 0 is older than the tablet's 1")
            const unknown = yield* Effect.flip(b.log.append(2, records(7, 7), { id: 9, epoch: 0, sequence: 3 }))
            assert.strictEqual(
              unknown.reason._tag === "ProducerRefused" && unknown.reason.verdict._tag,
              "UnknownProducer"
            )
            assert.strictEqual(yield* b.log.logEndOffset, 7)
            yield* b.close
          })
        )
    )

    it.effect("a follower's copy knows the producers; truncation takes them back, from the log when it must", () =>
      onStorage(
        Effect.gen(function* () {
          const leader = yield* open({ table: "tablet-l", partition: 0 })
          const follower = yield* open({ table: "tablet-f", partition: 0 })
          const producer = (sequence: number, epoch = 0) => ({ id: 5, epoch, sequence })
          for (let i = 0; i < 8; i++) yield* leader.log.append(1, records(i * 2, i * 2 + 1), producer(i * 2))
          yield* leader.log.append(2, records(16, 18), producer(0, 1))
          yield* follower.log.appendBatches(yield* leader.log.read(0, 1_000_000))
          assert.deepStrictEqual(yield* follower.log.producers, yield* leader.log.producers)
          // Cutting inside the epoch-1 producer batch removes it whole; the entry goes back to epoch 0's last five.
          yield* follower.log.truncateTo(17)
          assert.strictEqual(yield* follower.log.logEndOffset, 16)
          const entry = (yield* follower.log.producers).get(5)!
          assert.strictEqual(entry.epoch, 0)
          assert.deepStrictEqual(
            entry.batches.map((b) => b.firstSequence),
            [6, 8, 10, 12, 14]
          )
          // Now this replica leads: a retry of a kept batch is a duplicate; of the cut one, a fresh append.
          assert.isTrue((yield* follower.log.append(3, records(14, 15), producer(14))).duplicate)
          assert.deepStrictEqual(yield* follower.log.append(3, records(16, 18), producer(0, 1)), {
            baseOffset: 16,
            lastOffset: 18
          })
          // A cut below every batch of a producer forgets it.
          yield* follower.log.truncateTo(0)
          assert.strictEqual((yield* follower.log.producers).size, 0)
          yield* leader.close
          yield* follower.close
        })
      )
    )

    it.effect(
      "a producer whose batches all fall below the log start is kept: a retry of its last batch is still a duplicate",
      () =>
        onStorage(
          Effect.gen(function* () {
            const { log, reopen, close } = yield* open()
            yield* log.append(1, records(0, 1), { id: 1, epoch: 0, sequence: 0 })
            yield* log.append(1, records(2, 3), { id: 2, epoch: 0, sequence: 0 })
            yield* log.append(1, records(4, 5), { id: 1, epoch: 0, sequence: 2 })
            yield* log.deleteBefore(4)
            assert.deepStrictEqual([...(yield* log.producers).keys()].sort(), [1, 2])
            // Producer 2's retry of its batch (now below the start) is answered with its offsets, not appended.
            const retry = yield* log.append(1, records(2, 3), { id: 2, epoch: 0, sequence: 0 })
            assert.deepStrictEqual(retry, { baseOffset: 2, lastOffset: 3, duplicate: true })
            assert.strictEqual(yield* log.logEndOffset, 6)
            // And so after a reopen.
            const reopened = yield* reopen
            assert.deepStrictEqual([...(yield* reopened.producers).keys()].sort(), [1, 2])
            const again = yield* reopened.append(1, records(2, 3), { id: 2, epoch: 0, sequence: 0 })
            assert.strictEqual(again.duplicate, true)
            yield* close
          })
        )
    )

    // Store-backed only: it counts the store's reads (SegmentLog.test.ts has the segment log forget such a producer).
    onStoreOnly(
      "a truncation reads back at most PRODUCER_SCAN_BATCHES batches for a producer whose recent ones it cut",
      () =>
        onStorage(
          Effect.gen(function* () {
            const opened = yield* open()
            const { close } = opened
            const store = storeOf(opened)
            let read = 0
            const counted = {
              ...store,
              scan: (range?: Parameters<typeof store.scan>[0]) =>
                store.scan(range).pipe(Stream.tap(() => Effect.sync(() => read++)))
            }
            const log = yield* TabletLog.make(counted, tablet)
            // Producer 7's first batch, then more batches than the bound from others, then six more of 7's (its
            // entry's recent batches are those six).
            yield* log.append(1, records(0, 0), { id: 7, epoch: 0, sequence: 0 })
            for (let i = 0; i < TabletLog.PRODUCER_SCAN_BATCHES + 5; i++) yield* log.append(1, records(1, 1))
            const end = yield* log.logEndOffset
            for (let i = 1; i <= 6; i++) yield* log.append(1, records(2, 2), { id: 7, epoch: 0, sequence: i })
            read = 0
            yield* log.truncateTo(end)
            // Its older batch is beyond the bound: the producer is forgotten rather than the whole log read.
            // (Besides the six batches it cuts, which it reads too.)
            assert.isAtMost(read, TabletLog.PRODUCER_SCAN_BATCHES + 7)
            assert.isFalse((yield* log.producers).has(7))
            yield* close
          })
        )
    )

    it.effect("a producer idle for the expiration time is forgotten, in the store too; an active one is kept", () =>
      onStorage(
        Effect.gen(function* () {
          const { log, reopen, close } = yield* open()
          yield* log.append(1, records(0, 1), { id: 1, epoch: 0, sequence: 0 })
          yield* log.append(1, records(2, 3), { id: 2, epoch: 0, sequence: 0 })
          yield* TestClock.adjust("60 seconds")
          yield* log.append(1, records(4, 5), { id: 2, epoch: 0, sequence: 2 })
          assert.strictEqual(yield* log.expireProducers(60_000), 1)
          assert.deepStrictEqual([...(yield* log.producers).keys()], [2])
          // Producer 1 is back: its next batch does not start an epoch, so it is told it is unknown.
          const refused = yield* Effect.flip(log.append(1, records(6, 6), { id: 1, epoch: 0, sequence: 2 }))
          assert.strictEqual(
            refused.reason._tag === "ProducerRefused" && refused.reason.verdict._tag,
            "UnknownProducer"
          )
          const reopened = yield* reopen
          assert.deepStrictEqual([...(yield* reopened.producers).keys()], [2])
          // A loaded entry counts as seen when the log opened.
          assert.strictEqual(yield* reopened.expireProducers(60_000), 0)
          yield* TestClock.adjust("60 seconds")
          assert.strictEqual(yield* reopened.expireProducers(60_000), 1)
          yield* close
        })
      )
    )

    it.effect("reads of the open log (its recent batches kept in memory) match the log, through every change", () =>
      onStorage(
        Effect.gen(function* () {
          const id = { table: "tablet-tail", partition: 0 }
          const a = yield* open(id)
          // What each offset must read as: `offset@epoch:value`.
          const model = new Map<number, string>()
          let seed = 7
          const next = () => {
            seed = (seed * 1_103_515_245 + 12_345) % 2_147_483_648
            return seed / 2_147_483_648
          }
          let epoch = 1
          let value = 0
          const check = (log: TabletLog.TabletLog, label: string) =>
            Effect.gen(function* () {
              const first = yield* log.logStartOffset
              const last = yield* log.logEndOffset
              for (let o = first; o < last; o++) {
                const seen = texts(yield* log.read(o, 1 + Math.floor(next() * 300)))
                const want = Array.from({ length: seen.length }, (_, i) => model.get(o + i))
                assert.isAbove(seen.length, 0, `${label}: read from ${o}`)
                assert.deepStrictEqual(seen, want, `${label}: read from ${o}`)
              }
            })
          for (let step = 0; step < 80; step++) {
            const roll = next()
            const end = yield* a.log.logEndOffset
            const start = yield* a.log.logStartOffset
            if (roll < 0.55) {
              const batch = records(value, value + Math.floor(next() * 4))
              yield* a.log.append(epoch, batch)
              for (const [i, r] of batch.entries()) {
                model.set(end + i, `${end + i}@${epoch}:${new TextDecoder().decode(r.value)}`)
              }
              value += batch.length
            } else if (roll < 0.7) {
              yield* a.log.checkpointHighWatermark(start + Math.floor(next() * (end - start + 1)))
            } else if (roll < 0.8 && end > start) {
              const to = end - 1 - Math.floor(next() * Math.min(3, end - start))
              yield* a.log.truncateTo(to)
              for (let o = to; o < end; o++) model.delete(o)
            } else if (roll < 0.85 && end > start) {
              yield* a.log.deleteBefore(start + 1)
            } else epoch++
            yield* check(a.log, `step ${step}`)
          }
          // The same log opened again reads the store: the same answers.
          yield* a.close
          const b = yield* open(id)
          yield* check(b.log, "reopened")
          yield* b.close
        })
      )
    )

    it.effect("a read goes past maxBytes only by a first batch larger than it, from memory and from the store", () =>
      onStorage(
        Effect.gen(function* () {
          const id = { table: "tablet-bounded", partition: 0 }
          const a = yield* open(id)
          // 40 batches of one record each, every one `size` bytes as stored.
          const batch = (i: number) => [{ ...record(String(i).padStart(2, "0")), value: new Uint8Array(200).fill(i) }]
          for (let i = 0; i < 40; i++) yield* a.log.append(1, batch(i))
          const size = Codec.encodeBatch(1, batch(0)).length
          const bounded = (log: TabletLog.TabletLog, where: string) =>
            Effect.gen(function* () {
              for (const [from, maxBytes, count] of [
                [0, 1, 1],
                [0, size, 1],
                [0, size + 1, 1],
                [0, Math.floor(3.5 * size), 3],
                [10, 10 * size, 10],
                [35, 100 * size, 5]
              ] as const) {
                const got = yield* log.read(from, maxBytes)
                assert.strictEqual(got.length, count, `${where}: read(${from}, ${maxBytes}) of ${size}-byte batches`)
                assert.strictEqual(got[0]!.baseOffset, from)
              }
            })
          // The open log reads its recent batches from memory (nothing is below the high watermark yet).
          yield* bounded(a.log, "from memory")
          // Past the high watermark they are read from the store.
          yield* a.log.checkpointHighWatermark(40)
          yield* bounded(a.log, "from the store")
          yield* a.close
          const b = yield* open(id)
          yield* bounded(b.log, "reopened")
          yield* b.close
        })
      )
    )

    // Store-backed only: it writes the store's keys (SegmentLog.test.ts damages segment files and checkpoints).
    onStoreOnly("unreadable stored data is a typed error naming the tablet, never a wrong log", () =>
      onStorage(
        Effect.gen(function* () {
          const id = { table: "tablet-bad", partition: 0 }
          const a = yield* open(id)
          yield* a.log.append(1, records(0, 2))
          yield* storeOf(a).write([
            Store.put(new Uint8Array([1, 0, 0, 0, 0, 0, 0, 0, 0]), new Uint8Array([0, 0, 0, 1, 0, 0, 0, 9]))
          ])
          // The open log answers reads of its latest batches from what it wrote; opened again, it reads the store.
          yield* a.close
          const b = yield* open(id)
          const error = yield* Effect.flip(b.log.read(0, 100))
          assert.strictEqual(error.reason._tag, "Corrupt")
          assert.include(error.message, "orders/0")
          yield* storeOf(b).write([Store.put(new Uint8Array([2, ...enc.encode("end")]), new Uint8Array([1, 2, 3]))])
          yield* b.close
          const reopened = yield* Effect.flip(open(id))
          assert.strictEqual(reopened._tag, "TabletLogError")
        })
      )
    )
  })
}
