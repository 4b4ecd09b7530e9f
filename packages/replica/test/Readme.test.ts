import { assert, it } from "@effect/vitest"
import { MemoryCoordination } from "@strata/core"
import { Effect } from "effect"
import { LocalCluster } from "../src/index.js"

// The README's example, as written there.
const text = (s: string) => ({ key: null, value: new TextEncoder().encode(s), headers: [], timestamp: Date.now() })

const program = Effect.gen(function* () {
  const cluster = yield* LocalCluster.make({ servers: 3, replication: { minInsyncReplicas: 2 } })
  const orders = { table: "orders", bucket: 0 }
  yield* cluster.createTable("orders", { buckets: 1 })
  const before = yield* cluster.awaitTablet(orders, (t) => t.leaderAndIsr.isr.length === 3)

  // acks=all: acknowledged once every in-sync replica holds the records (at least minInsyncReplicas of them).
  yield* cluster.append(orders, [text("order-1"), text("order-2")], "all")

  // The leader dies; the controller elects another in-sync replica under a higher leader epoch.
  yield* cluster.stopServer(before.leaderAndIsr.leader!)
  yield* cluster.awaitTablet(orders, (t) => t.leaderAndIsr.leader !== before.leaderAndIsr.leader)
  yield* cluster.append(orders, [text("order-3")], "all")

  // Everything acknowledged is there, in order.
  const batches = yield* cluster.read(orders)
  return batches.flatMap((b) => b.records.map((r) => new TextDecoder().decode(r.value)))
}).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))

it.live("the README example runs: three orders survive the leader's loss", () =>
  Effect.map(program, (orders) => assert.deepStrictEqual(orders, ["order-1", "order-2", "order-3"]))
)
