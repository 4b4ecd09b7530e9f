import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { put, Store } from "@strata/core"
import * as LevelStore from "@strata/store-adapters/level"
import * as RocksDbStore from "@strata/store-adapters/rocksdb"
import { Effect, Exit, type Layer, Scope } from "effect"
import { afterAll } from "vitest"
import * as LeaderEpochCache from "../src/LeaderEpochCache.js"
import * as TabletLog from "../src/TabletLog.js"

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

/** Opens the tablet's log on the memory store in a scope of its own (closing it closes the store). */
const open = (id = { table: "tablet-orders", partition: 0 }) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const store = yield* Scope.provide((yield* Store).open(id), scope)
    const log = yield* TabletLog.make(store, tablet)
    return { log, store, close: Scope.close(scope, Exit.void) }
  })

const root = mkdtempSync(join(tmpdir(), "strata-tablet-log-"))
afterAll(() => rmSync(root, { recursive: true, force: true }))
let fresh = 0
/** The stores the log runs on; the persistent ones get a fresh directory per test. */
const stores: ReadonlyArray<readonly [string, () => Layer.Layer<Store, unknown>]> = [
  ["memory", () => Store.layerMemory()],
  ["level", () => LevelStore.layer({ directory: join(root, `level-${++fresh}`) })],
  ["rocksdb", () => RocksDbStore.layer({ directory: join(root, `rocksdb-${++fresh}`) })]
]

for (const [backend, layer] of stores) {
  const onStore = <A, E>(self: Effect.Effect<A, E, Store>) => self.pipe(Effect.provide(layer()), Effect.orDie)

  describe(`TabletLog on ${backend}`, () => {
    it.effect("appends, reads from any offset, and reopens to the same log with its epoch cache", () =>
      onStore(
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
      onStore(
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

    it.effect("the seed's scenario on two logs: A truncates to 100 and takes B's 100–105", () =>
      onStore(
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

    it.effect("retention drops whole batches below the start; reads begin there", () =>
      onStore(
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
          // Only the batch holding offset 7 is left.
          const batches = yield* store.getMany([
            new Uint8Array([1, 0, 0, 0, 0, 0, 0, 0, 0]),
            new Uint8Array([1, 0, 0, 0, 0, 0, 0, 0, 5])
          ])
          assert.deepStrictEqual(
            batches.map((b) => b._tag),
            ["None", "Some"]
          )
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

    it.effect("a follower's batches must continue the log and not go back in epoch; nothing is written otherwise", () =>
      onStore(
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

    it.effect("unreadable stored data is a typed error naming the tablet, never a wrong log", () =>
      onStore(
        Effect.gen(function* () {
          const id = { table: "tablet-bad", partition: 0 }
          const a = yield* open(id)
          yield* a.log.append(1, records(0, 2))
          yield* a.store.write([
            put(new Uint8Array([1, 0, 0, 0, 0, 0, 0, 0, 0]), new Uint8Array([0, 0, 0, 1, 0, 0, 0, 9]))
          ])
          const error = yield* Effect.flip(a.log.read(0, 100))
          assert.strictEqual(error.reason._tag, "Corrupt")
          assert.include(error.message, "orders/0")
          yield* a.store.write([put(new Uint8Array([2, ...enc.encode("end")]), new Uint8Array([1, 2, 3]))])
          yield* a.close
          const reopened = yield* Effect.flip(open(id))
          assert.strictEqual(reopened._tag, "TabletLogError")
        })
      )
    )
  })
}
