import { describe, expect, it } from "vitest"
import { seeded } from "../../../scripts/test-support/prng.js"
import * as EntryTable from "../src/internal/entryTable.js"

const latin1 = (b: Uint8Array) => Buffer.from(b).toString("latin1")
const same = (a: Uint8Array, b: Uint8Array) => Buffer.compare(a, b) === 0
/** A cheap assertion for the hot loop (`expect` per step would dominate the run). */
const check = (ok: boolean, what: string) => {
  if (!ok) throw new Error(what)
}

// The memory store's table against a Map, through generated runs of puts, overwrites and deletes: few distinct keys
// (so overwrites and deletes dominate and compaction runs often), values up to past the own-slab size, and scans'
// references taken along the way, which must keep reading what they read when taken.
describe("EntryTable", () => {
  it("agrees with a Map through rehashes, tombstones, compactions and large entries, over 40 generated runs", () => {
    for (let seed = 1; seed <= 40; seed++) {
      const random = seeded(seed)
      const t = EntryTable.make()
      const model = new Map<string, Uint8Array>()
      const keySpace = random.pick([8, 200, 3000])
      const kept: Array<{ snapshot: EntryTable.Snapshot; key: string; value: Uint8Array }> = []
      let compactions = 0
      for (let step = 0; step < 6000; step++) {
        const key = Buffer.from(`k${random.int(0, keySpace)}`.repeat(random.int(1, 3)))
        const roll = random.next()
        const deadBefore = t.deadBytes
        if (roll < 0.7) {
          const size = random.chance(0.01) ? random.int(64 * 1024, 70 * 1024) : random.int(0, 200)
          const value = Buffer.alloc(size, step & 0xff)
          if (size > 0) value[size - 1] = seed
          const isNew = EntryTable.put(t, key, value)
          check(isNew === !model.has(latin1(key)), `seed ${seed} step ${step}: put said new=${isNew}`)
          model.set(latin1(key), value)
        } else if (roll < 0.9) {
          const removed = EntryTable.remove(t, key)
          check(removed === model.delete(latin1(key)), `seed ${seed} step ${step}: remove said ${removed}`)
        } else {
          const i = EntryTable.find(t, key)
          const expected = model.get(latin1(key))
          if (expected === undefined) check(i === -1, `seed ${seed} step ${step}: found a removed key`)
          else {
            const value = EntryTable.valueAt(t, i)
            check(same(value, expected), `seed ${seed} step ${step}: wrong value`)
            kept.push({ snapshot: EntryTable.snapshot(t, [i]), key: latin1(key), value })
          }
        }
        if (t.deadBytes < deadBefore) compactions++
        check(t.count === model.size, `seed ${seed} step ${step}: count ${t.count} of ${model.size}`)
      }
      for (const [k, v] of model) {
        check(same(EntryTable.valueAt(t, EntryTable.find(t, Buffer.from(k, "latin1"))), v), `seed ${seed}: ${k}`)
      }
      // The order: every key once, sorted by bytes, each with the slot holding it.
      const order = EntryTable.order(t)
      expect(order.keys).toEqual([...model.keys()].sort())
      order.keys.forEach((k, j) => {
        check(same(EntryTable.valueAt(t, order.slots[j]!), model.get(k)!), `seed ${seed}: the order's slot of ${k}`)
      })
      // A snapshot reads the entry as it was, whatever happened after.
      for (const { snapshot, key, value } of kept) {
        const [[k, v]] = EntryTable.copyOut(snapshot, 0, 1) as [[Uint8Array, Uint8Array]]
        check(latin1(k) === key, `seed ${seed}: a snapshot's key changed`)
        check(same(v, value), `seed ${seed}: a snapshot's value changed`)
      }
      if (keySpace === 8) expect(compactions, `seed ${seed}: compaction ran`).toBeGreaterThan(0)
    }
  })

  it("keeps memory near the live bytes when the same keys are rewritten", () => {
    const t = EntryTable.make()
    const value = new Uint8Array(100)
    for (let round = 0; round < 200; round++) {
      for (let k = 0; k < 1000; k++) EntryTable.put(t, Buffer.from(`key-${k}`), value)
    }
    const slabBytes = t.slabs.reduce((n, s) => n + s.length, 0)
    expect(t.count).toBe(1000)
    // 1000 live entries of ~114 bytes; 200 rounds wrote 23 MB.
    expect(slabBytes).toBeLessThan(3 * t.liveBytes + 2 * 1024 * 1024)
  })

  it("clear forgets every entry", () => {
    const t = EntryTable.make()
    for (let k = 0; k < 100; k++) EntryTable.put(t, Buffer.from(`k${k}`), Buffer.from("v"))
    EntryTable.clear(t)
    expect(t.count).toBe(0)
    expect(EntryTable.find(t, Buffer.from("k1"))).toBe(-1)
    expect(EntryTable.order(t).keys).toEqual([])
  })
})
