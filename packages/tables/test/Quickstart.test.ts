import { assert, it } from "@effect/vitest"
import { Effect, Logger } from "effect"
import { layer, program } from "../examples/quickstart.js"

it.effect("the README example counts the words of a source partition into the table", () =>
  Effect.gen(function* () {
    const entries = yield* program.pipe(Effect.provide(layer), Effect.provide(Logger.layer([])))
    assert.deepStrictEqual(entries, [
      ["be", 2],
      ["not", 1],
      ["or", 1],
      ["to", 2]
    ])
  })
)
