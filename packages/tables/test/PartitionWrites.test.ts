import { assert, describe, it } from "@effect/vitest"
import * as PartitionWrites from "../src/internal/partitionWrites.js"

/** A partition's write state for its cache alone (the cache never touches the store or the scope). */
const withCache = (entries: number) => PartitionWrites.make(undefined as never, undefined as never, false, entries)
const value = (n: number) => Uint8Array.of(n)

describe("PartitionWrites' cache of stored values", () => {
  it("keeps at most cacheEntries; beyond, the oldest entry not read since it was passed over goes", () => {
    const w = withCache(3)
    PartitionWrites.remember(w, "a", value(1))
    PartitionWrites.remember(w, "b", value(2))
    PartitionWrites.remember(w, "c", null)
    // a is read: the next eviction passes over it once and drops b.
    assert.deepStrictEqual(PartitionWrites.cached(w, "a"), value(1))
    PartitionWrites.remember(w, "d", value(4))
    assert.deepStrictEqual([...w.cache.keys()].sort(), ["a", "c", "d"])
    assert.isUndefined(PartitionWrites.cached(w, "b"))
    // Known absent is cached as null, not as "unknown".
    assert.strictEqual(PartitionWrites.cached(w, "c"), null)
    // Every entry read (c just now): one pass clears them all, then the oldest goes (c, passed over first).
    PartitionWrites.cached(w, "a")
    PartitionWrites.cached(w, "d")
    PartitionWrites.remember(w, "e", value(5))
    assert.deepStrictEqual([...w.cache.keys()], ["a", "d", "e"])
    // The entry just remembered is never the one its own insertion evicts.
    PartitionWrites.cached(w, "a")
    PartitionWrites.cached(w, "d")
    PartitionWrites.remember(w, "f", value(6))
    assert.deepStrictEqual([...w.cache.keys()].sort(), ["a", "d", "f"])
  })

  it("a key remembered again takes its new value without growing the cache; forget drops it; 0 keeps nothing", () => {
    const w = withCache(2)
    PartitionWrites.remember(w, "a", value(1))
    PartitionWrites.remember(w, "a", value(2))
    assert.strictEqual(w.cache.size, 1)
    assert.deepStrictEqual(PartitionWrites.cached(w, "a"), value(2))
    PartitionWrites.forget(w, "a")
    assert.isUndefined(PartitionWrites.cached(w, "a"))
    const none = withCache(0)
    PartitionWrites.remember(none, "a", value(1))
    assert.strictEqual(none.cache.size, 0)
  })

  it("keyId reads a key's bytes as latin1, from a Buffer or any other view", () => {
    const bytes = Uint8Array.of(0x22, 0xc3, 0xa9, 0x22)
    assert.strictEqual(PartitionWrites.keyId(bytes), '"Ã©"')
    assert.strictEqual(PartitionWrites.keyId(Buffer.from(bytes)), '"Ã©"')
    assert.strictEqual(PartitionWrites.keyId(new Uint8Array(bytes.buffer, 1, 2)), "Ã©")
  })
})
