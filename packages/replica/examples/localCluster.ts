/**
 * The README's example: a 3-server cluster in one process; two orders acknowledged with acks=all survive the
 * leader's loss. Run it with `./dev exec tsx --conditions=@strata/source packages/replica/examples/localCluster.ts`.
 */
import { MemoryCoordination } from "@strata/core"
import { LocalCluster } from "@strata/replica"
import { Effect } from "effect"

const text = (s: string) => ({ key: null, value: new TextEncoder().encode(s), headers: [], timestamp: Date.now() })

export const program = Effect.gen(function* () {
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

if (import.meta.url === `file://${process.argv[1]}`) {
  Effect.runPromise(program).then((orders) => console.log(orders)) // [ 'order-1', 'order-2', 'order-3' ]
}
