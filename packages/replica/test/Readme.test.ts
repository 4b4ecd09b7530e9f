import { assert, it } from "@effect/vitest"
import { MemoryCoordination } from "@strata/core"
import { Effect, Layer } from "effect"
import * as LocalCluster from "../src/node/LocalCluster.js"
import * as StrataLog from "../src/log/StrataLog.js"
import { program } from "../examples/localCluster.js"
import { program as strataLogProgram } from "../examples/strataLog.js"

it.live("the README example runs: three orders survive the leader's loss", () =>
  Effect.map(program, (orders) => assert.deepStrictEqual(orders, ["order-1", "order-2", "order-3"]))
)

it.live("the README's StrataLog example reads back every order it produced", () =>
  Effect.gen(function* () {
    // The example's program on a cluster in this process (the install test runs it on the CLI's processes).
    const layer = StrataLog.layer().pipe(
      Layer.provideMerge(LocalCluster.layer({ servers: 3, transport: "tcp" })),
      Layer.provide(MemoryCoordination.layer())
    )
    assert.strictEqual(yield* strataLogProgram(3_000).pipe(Effect.provide(layer)), 3_000)
  })
)
