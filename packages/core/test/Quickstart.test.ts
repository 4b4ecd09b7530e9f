import { assert, it } from "@effect/vitest"
import { Effect, Option } from "effect"
import { layer, program } from "../examples/quickstart.js"

it.effect("the README example stores the value and persists its changelog offset", () =>
  Effect.gen(function* () {
    const result = yield* program.pipe(Effect.provide(layer))
    assert.deepStrictEqual(result.stored, Option.some("world"))
    assert.deepStrictEqual(result.persisted, Option.some(0))
  })
)
