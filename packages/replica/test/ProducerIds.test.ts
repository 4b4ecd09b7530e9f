import { Coordination, MemoryCoordination } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit } from "effect"
import * as ProducerIds from "../src/server/ProducerIds.js"

const encoder = new TextEncoder()

describe("ProducerIds", () => {
  it.effect("allocators racing on one node, and their successors, never hand out an id twice", () =>
    Effect.gen(function* () {
      const coordination = yield* Coordination.Coordination
      const session = yield* coordination.session()
      const path = "/ids/producer-ids"
      const given: Array<number> = []
      // Three allocators at once (coordinators racing), each taking more ids than its block holds.
      for (let round = 0; round < 2; round++) {
        const allocators = yield* Effect.forEach([0, 1, 2], () => ProducerIds.make({ path, blockSize: 7 }))
        const ids = yield* Effect.forEach(
          allocators,
          (a) => Effect.forEach(Array.from({ length: 20 }), () => a.next(session)),
          { concurrency: "unbounded" }
        )
        given.push(...ids.flat())
      }
      assert.strictEqual(given.length, 120)
      assert.strictEqual(new Set(given).size, 120, "an id given twice")
      // Each block is reserved whole: the node is past every id given.
      const next = Number(new TextDecoder().decode((yield* session.get(path)).data))
      assert.isAtLeast(next, Math.max(...given) + 1)
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )

  it.effect("a node holding something else stops the allocator rather than starting again from 0", () =>
    Effect.gen(function* () {
      const coordination = yield* Coordination.Coordination
      const session = yield* coordination.session()
      yield* session.create("/bad", encoder.encode("not a number"))
      const allocator = yield* ProducerIds.make({ path: "/bad" })
      const exit = yield* Effect.exit(allocator.next(session))
      assert.isTrue(Exit.hasDies(exit))
      assert.include(String(Exit.isFailure(exit) ? exit.cause : ""), "not the next producer id")
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )

  it.effect("bad options are refused by name", () =>
    Effect.gen(function* () {
      const e = yield* Effect.flip(ProducerIds.make({ path: "/p", blockSize: 0 }))
      assert.include(e.message, "blockSize")
    })
  )
})
