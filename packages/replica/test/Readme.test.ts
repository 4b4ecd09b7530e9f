import { assert, it } from "@effect/vitest"
import { Store } from "@strata/core"
import { Effect } from "effect"
import { TabletLog } from "../src/index.js"

// The README's example, as written there.
it.effect("the README example runs: one record appended, epoch 1 ends at the log end", () =>
  Effect.gen(function* () {
    const store = yield* (yield* Store).open({ table: "tablet-orders", partition: 0 })
    const log = yield* TabletLog.make(store, { table: "orders", bucket: 0 })
    const value = new TextEncoder().encode("hello")
    yield* log.append(1, [{ key: null, value, headers: [], timestamp: Date.now() }])
    const end = yield* log.endOffsetForEpoch(1)
    assert.deepStrictEqual(end, { epoch: 1, endOffset: 1 })
  }).pipe(Effect.scoped, Effect.provide(Store.layerMemory()))
)
