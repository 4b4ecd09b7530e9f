/**
 * The README's cluster on real ZooKeeper instead of memory coordination: the controller's tablets, fenced writes and
 * server registrations live in ZooKeeper; 20 000 acks=all records survive the leader's loss, the old leader
 * rejoins under its new registration, and bad input gets typed errors; once with direct calls, once over loopback
 * TCP.
 */
import { assert, describe, it } from "@effect/vitest"
import * as ZooKeeperCoordination from "@strata/election/zookeeper"
import { Effect } from "effect"
import { inject } from "vitest"
import { LocalCluster } from "../src/index.js"

const text = (s: string) => ({ key: null, value: new TextEncoder().encode(s), headers: [], timestamp: 0 })
const coordination = () => ZooKeeperCoordination.layer({ connectString: inject("zookeeper") })

describe("LocalCluster on ZooKeeper", () => {
  for (const transport of ["direct", "tcp"] as const) {
    it.live(`acks=all records survive the leader's loss; bad input is refused by name (${transport})`, () =>
      Effect.gen(function* () {
        const cluster = yield* LocalCluster.make({
          servers: 3,
          transport,
          namespace: `/strata-local-${transport}-${Date.now().toString(36)}`,
          replication: { minInsyncReplicas: 2, sessionTimeout: 4_000, replicaLagTimeMax: 12_000 }
        })
        const orders = { table: "orders", bucket: 0 }
        yield* cluster.createTable("orders", { buckets: 3 })
        const before = yield* cluster.awaitTablet(orders, (t) => t.leaderAndIsr.isr.length === 3)
        const n = 20_000
        for (let i = 0; i < n; i += 500) {
          yield* cluster.append(
            orders,
            Array.from({ length: 500 }, (_, j) => text(`order-${i + j}`)),
            "all"
          )
        }
        const old = before.leaderAndIsr.leader!
        yield* cluster.stopServer(old)
        const after = yield* cluster.awaitTablet(orders, (t) => t.leaderAndIsr.leader !== old)
        assert.strictEqual(after.leaderAndIsr.leaderEpoch, before.leaderAndIsr.leaderEpoch + 1)
        yield* cluster.append(orders, [text("order-last")], "all")
        const values = (yield* cluster.read(orders)).flatMap((b) =>
          b.records.map((r) => new TextDecoder().decode(r.value))
        )
        assert.deepStrictEqual(values, [...Array.from({ length: n }, (_, i) => `order-${i}`), "order-last"])
        // The old leader returns as a new registration (a new ZooKeeper node): it catches up and rejoins the ISR
        // under that registration, and holds the same records.
        yield* cluster.startServer(old)
        const rejoined = yield* cluster.awaitTablet(orders, (t) => t.leaderAndIsr.isr.includes(old))
        assert.notStrictEqual(rejoined.registrations?.[String(old)], before.registrations?.[String(old)])
        const copy = yield* (yield* cluster.server(old)).logEnd({ tablet: orders })
        assert.deepStrictEqual(copy, { lastEpoch: after.leaderAndIsr.leaderEpoch, logEndOffset: n + 1 })

        const leader = yield* cluster.server(after.leaderAndIsr.leader!)
        const empty = yield* Effect.flip(leader.append({ tablet: orders, records: [], acks: "all" }))
        assert.strictEqual(empty.reason._tag, "InvalidRequest")
        const unknown = yield* Effect.flip(
          leader.append({ tablet: { table: "nope", bucket: 0 }, records: [text("x")], acks: 1 })
        )
        assert.strictEqual(unknown.reason._tag, "UnknownTablet")
        assert.include(unknown.message, "nope/0")
        const bad = yield* Effect.flip(LocalCluster.make({ servers: 3, replication: { sessionTimeout: 40_000 } }))
        assert.strictEqual(bad._tag, "InvalidReplicaOptions")
        assert.include(bad.message, "replicaLagTimeMax")
      }).pipe(Effect.scoped, Effect.provide(coordination()))
    )
  }
})
