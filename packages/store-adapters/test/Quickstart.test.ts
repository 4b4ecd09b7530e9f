import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, it } from "@effect/vitest"
import * as LevelStore from "@strata/store-adapters/level"
import { Effect, Option } from "effect"
import { program } from "../examples/quickstart.js"

it.live("the README example persists the offset with its batch", () =>
  Effect.gen(function* () {
    const directory = mkdtempSync(join(tmpdir(), "strata-quickstart-"))
    yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(directory, { recursive: true, force: true })))
    const offset = yield* program.pipe(Effect.provide(LevelStore.layer({ directory })))
    assert.deepStrictEqual(offset, Option.some(41))
  })
)
