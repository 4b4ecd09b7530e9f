import { assert, describe, it } from "@effect/vitest"
import { Log, Store } from "@strata/core"
import { Effect, Layer } from "effect"
import * as Demo from "../src/Demo.js"

const text = "the quick brown fox jumps over the lazy dog the end"

describe("demo", () => {
  it.effect("restores the table from its changelog after a restart that lost the store", () =>
    Effect.gen(function* () {
      const result = yield* Demo.run({ text, partitions: 3, verbose: false }, Store.layerMemory()).pipe(
        Effect.provide(Layer.mergeAll(Store.layerMemory(), Log.layerMemory()))
      )
      assert.strictEqual(result.before.get("the"), 3)
      assert.strictEqual(result.before.size, 9)
      assert.isTrue(Demo.sameTable(result.before, result.after))
      // One changelog record per update; the fresh store replays every partition from offset 0.
      assert.strictEqual(result.changelogRecords, 11)
      assert.strictEqual(
        result.replayed.reduce((n, r) => n + r.to - r.from, 0),
        11
      )
      assert.isTrue(result.replayed.every((r) => r.from === 0))
    })
  )

  it.effect("a restart that keeps the store replays only what its persisted offsets do not cover", () =>
    Effect.gen(function* () {
      const store = Store.layerMemory()
      // The same store layer instance before and after: the store survives the restart.
      const result = yield* Effect.gen(function* () {
        const context = yield* Layer.build(store)
        return yield* Demo.run({ text, partitions: 4, verbose: false }, Layer.succeedContext(context)).pipe(
          Effect.provide(Layer.mergeAll(Layer.succeedContext(context), Log.layerMemory()))
        )
      })
      assert.isTrue(Demo.sameTable(result.before, result.after))
      for (const r of result.replayed) {
        // Even partitions persisted their last offset: nothing left to replay.
        if (r.partition % 2 === 0) assert.strictEqual(r.from, r.to)
        else assert.strictEqual(r.from, 0)
      }
    })
  )

  it("sameTable compares every entry", () => {
    assert.isTrue(Demo.sameTable(new Map([["a", 1]]), new Map([["a", 1]])))
    assert.isFalse(Demo.sameTable(new Map([["a", 1]]), new Map([["a", 2]])))
    assert.isFalse(
      Demo.sameTable(
        new Map([["a", 1]]),
        new Map([
          ["a", 1],
          ["b", 1]
        ])
      )
    )
  })
})
