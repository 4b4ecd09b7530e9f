import { assert, it } from "@effect/vitest"
import { Effect, Logger } from "effect"
import { layer, program } from "../examples/worker.js"

it.live("the README's Worker example counts every word of the source topic once", () =>
  Effect.gen(function* () {
    const entries = yield* program.pipe(Effect.provide(layer), Effect.provide(Logger.layer([])))
    assert.deepStrictEqual(entries, [
      ["be", 2],
      ["is", 1],
      ["not", 1],
      ["or", 1],
      ["question", 1],
      ["that", 1],
      ["the", 1],
      ["to", 2]
    ])
  })
)
