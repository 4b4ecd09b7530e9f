import { assert, describe, it } from "@effect/vitest"
import * as RecentTail from "../src/server/internal/recentTail.js"
import type * as Codec from "../src/wire/internal/batchCodec.js"

/** A batch of `count` records at `baseOffset` (values name their offsets), as an entry of `bytes`. */
const entry = (baseOffset: number, count: number, bytes = 100): RecentTail.Entry => ({
  batch: {
    baseOffset,
    epoch: 1,
    records: Array.from(
      { length: count },
      (_, i): Codec.TabletRecord => ({
        key: null,
        value: new TextEncoder().encode(String(baseOffset + i)),
        headers: [],
        timestamp: 0
      })
    )
  },
  bytes
})

const offsets = (batches: ReadonlyArray<Codec.Batch> | undefined) =>
  batches?.flatMap((b) => b.records.map((_, i) => b.baseOffset + i))

const values = (batches: ReadonlyArray<Codec.Batch> | undefined) =>
  batches?.flatMap((b) => b.records.map((r) => Number(new TextDecoder().decode(r.value ?? new Uint8Array()))))

describe("RecentTail", () => {
  it("answers a read it holds from the batch holding `from`, cut at it, and nothing it does not hold", () => {
    const t = RecentTail.make(1000)
    RecentTail.note(t, [entry(10, 5), entry(15, 5), entry(20, 5)])
    assert.deepStrictEqual(offsets(RecentTail.read(t, 12, 10_000)), [12, 13, 14, ...range(15, 25)])
    assert.deepStrictEqual(values(RecentTail.read(t, 17, 10_000)), range(17, 25))
    assert.strictEqual(RecentTail.read(t, 9, 10_000), undefined)
    assert.strictEqual(RecentTail.read(t, 25, 10_000), undefined)
  })

  it("reads whole batches while they fit in maxBytes, the first whatever its size", () => {
    const t = RecentTail.make(10_000)
    RecentTail.note(t, [entry(0, 2, 300), entry(2, 2, 100), entry(4, 2, 100)])
    assert.deepStrictEqual(offsets(RecentTail.read(t, 0, 50)), [0, 1])
    assert.deepStrictEqual(offsets(RecentTail.read(t, 1, 400)), [1, 2, 3])
    assert.deepStrictEqual(offsets(RecentTail.read(t, 2, 200)), [2, 3, 4, 5])
  })

  it("keeps its newest batches within its limit, and none with a limit of 0", () => {
    const t = RecentTail.make(250)
    RecentTail.note(t, [entry(0, 1), entry(1, 1), entry(2, 1)])
    assert.deepStrictEqual(
      t.entries.map((e) => e.batch.baseOffset),
      [1, 2]
    )
    assert.strictEqual(t.bytes, 200)
    RecentTail.note(t, [entry(3, 1, 400)])
    assert.deepStrictEqual(t.entries, [])
    assert.strictEqual(t.bytes, 0)
    const none = RecentTail.make(0)
    RecentTail.note(none, [entry(0, 1)])
    assert.strictEqual(RecentTail.read(none, 0, 100), undefined)
  })

  it("starts over from batches that do not follow what it holds", () => {
    const t = RecentTail.make(1000)
    RecentTail.note(t, [entry(0, 5), entry(5, 5)])
    RecentTail.note(t, [entry(7, 3)])
    assert.deepStrictEqual(
      t.entries.map((e) => e.batch.baseOffset),
      [7]
    )
    assert.strictEqual(t.bytes, 100)
    assert.strictEqual(RecentTail.read(t, 6, 1000), undefined)
  })

  it("lets the batches wholly below an offset go, and forgets everything when dropped", () => {
    const t = RecentTail.make(1000)
    RecentTail.note(t, [entry(0, 5), entry(5, 5), entry(10, 5)])
    RecentTail.trimBelow(t, 7)
    assert.deepStrictEqual(
      t.entries.map((e) => e.batch.baseOffset),
      [5, 10]
    )
    assert.strictEqual(t.bytes, 200)
    RecentTail.drop(t)
    assert.strictEqual(RecentTail.read(t, 10, 1000), undefined)
    assert.strictEqual(t.bytes, 0)
  })

  it("moves a producer stamp's sequence with the records a read cuts off", () => {
    const t = RecentTail.make(1000)
    const stamped = entry(10, 4)
    RecentTail.note(t, [{ ...stamped, batch: { ...stamped.batch, producer: { id: 7, epoch: 0, sequence: 100 } } }])
    const [first] = RecentTail.read(t, 12, 1000) ?? []
    assert.deepStrictEqual(first?.producer, { id: 7, epoch: 0, sequence: 102 })
    assert.strictEqual(first?.baseOffset, 12)
  })
})

function range(from: number, to: number) {
  return Array.from({ length: to - from }, (_, i) => from + i)
}
