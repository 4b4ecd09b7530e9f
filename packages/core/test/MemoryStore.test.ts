import { MemoryStore, Store } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { StoreConformance } from "@strata/core/testing"
import { Context, Effect, Layer, Option, Stream } from "effect"

StoreConformance.suite("memory", MemoryStore.layer())

// The memory store indexes entries by a 30-bit hash of the key. These keys share a hash (found by search): entries
// that collide must stay apart through puts, overwrites, deletes, reads and scans.
describe("memory store: keys sharing a hash", () => {
  const enc = new TextEncoder()
  const dec = new TextDecoder()
  const triple = ["k3761396", "k3949118", "k5891204"] as const
  const pair = ["k32728", "k261234"] as const
  const id = { table: "collisions", partition: 0 }

  it.effect("stay distinct entries through every operation", () =>
    Effect.gen(function* () {
      const store = yield* Store.Store
      const p = yield* store.open(id)
      const put = (k: string, v: string) => p.put(enc.encode(k), enc.encode(v))
      const get = (k: string) =>
        Effect.map(
          p.get(enc.encode(k)),
          Option.map((v) => dec.decode(v))
        )
      const keys = () =>
        Effect.map(Stream.runCollect(p.scan()), (entries) =>
          entries.map(([k, v]) => `${dec.decode(k)}=${dec.decode(v)}`)
        )
      for (const k of [...triple, ...pair]) yield* put(k, `${k}-1`)
      assert.deepStrictEqual(yield* keys(), [
        "k261234=k261234-1",
        "k32728=k32728-1",
        "k3761396=k3761396-1",
        "k3949118=k3949118-1",
        "k5891204=k5891204-1"
      ])
      // Overwrite the middle of a bucket of three, delete its first, then the last of a pair.
      yield* put("k3949118", "two")
      yield* p.delete(enc.encode("k3761396"))
      yield* p.delete(enc.encode("k261234"))
      assert.deepStrictEqual(yield* get("k3949118"), Option.some("two"))
      assert.deepStrictEqual(yield* get("k3761396"), Option.none())
      assert.deepStrictEqual(yield* get("k5891204"), Option.some("k5891204-1"))
      assert.deepStrictEqual(yield* get("k32728"), Option.some("k32728-1"))
      assert.deepStrictEqual(yield* get("k261234"), Option.none())
      // A key of the same hash that was never stored is absent; deleting it changes nothing.
      yield* p.delete(enc.encode("k261234"))
      assert.deepStrictEqual(
        (yield* p.getMany(triple.map((k) => enc.encode(k)))).map(Option.map((v) => dec.decode(v))),
        [Option.none(), Option.some("two"), Option.some("k5891204-1")]
      )
      assert.deepStrictEqual(yield* keys(), ["k32728=k32728-1", "k3949118=two", "k5891204=k5891204-1"])
    }).pipe(Effect.scoped, Effect.provide(MemoryStore.layer()))
  )
})

describe("memory store options", () => {
  const refused = (options: unknown) =>
    Effect.flip(Effect.scoped(Layer.build(MemoryStore.layer(options as { maxValueBytes?: number }))))

  it.effect("a wrong or unknown option fails the layer with InvalidStoreOptions naming it", () =>
    Effect.gen(function* () {
      for (const [options, field] of [
        [{ maxValueBytes: -1 }, "maxValueBytes"],
        [{ maxKeyBytes: 0.5 }, "maxKeyBytes"],
        [{ maxKeyBytes: "64KB" }, "maxKeyBytes"],
        [{ cacheSize: "8MB" }, "cacheSize"]
      ] as const) {
        const e = yield* refused(options)
        assert.strictEqual(e.reason._tag, "InvalidStoreOptions", e.message)
        assert.include(e.message, field)
      }
    })
  )

  it.effect("valid limits apply; unset ones keep their defaults", () =>
    Effect.gen(function* () {
      const store = yield* Effect.map(Layer.build(MemoryStore.layer({ maxKeyBytes: 8 })), Context.get(Store.Store))
      assert.deepStrictEqual(store.limits, { maxKeyBytes: 8, maxValueBytes: 16 * 1024 * 1024 })
      const p = yield* store.open({ table: "limits", partition: 0 })
      const e = yield* Effect.flip(p.put(new Uint8Array(9).fill(1), new Uint8Array(0)))
      assert.strictEqual(e.reason._tag, "InvalidKey")
    })
  )
})
