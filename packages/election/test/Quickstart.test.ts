import { assert, it } from "@effect/vitest"
import { Effect, Logger } from "effect"
import { layer, program } from "../examples/quickstart.js"

it.live("the README example hands the leadership over with a higher epoch and fences the old one", () =>
  Effect.gen(function* () {
    const result = yield* program.pipe(Effect.provide(layer), Effect.provide(Logger.layer([])))
    assert.strictEqual(result.firstEpoch, 1)
    assert.strictEqual(result.secondEpoch, 2)
    assert.strictEqual(result.refused, "FencedEpoch")
    assert.deepStrictEqual(result.events, [
      "1: scheduler started at epoch 1",
      "1: scheduler stopped",
      "2: scheduler started at epoch 2"
    ])
  })
)
