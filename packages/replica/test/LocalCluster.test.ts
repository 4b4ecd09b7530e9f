import { assert, describe, it } from "@effect/vitest"
import { MemoryCoordination } from "@strata/core"
import { Effect, Fiber } from "effect"
import * as LocalCluster from "../src/node/LocalCluster.js"
import { quickReplication } from "./support/servers.js"

const enc = new TextEncoder()
const dec = new TextDecoder()
const records = (from: number, count: number) =>
  Array.from({ length: count }, (_, i) => ({
    key: null,
    value: enc.encode(`r${from + i}`),
    headers: [],
    timestamp: 0
  }))

const replication = quickReplication

describe("LocalCluster", () => {
  for (const transport of ["direct", "tcp"] as const) {
    it.live(
      `acks=all appends survive the leader's loss; the old leader comes back as a follower with the same log (${transport})`,
      () =>
        Effect.gen(function* () {
          const cluster = yield* LocalCluster.make({ servers: 3, replication, transport })
          const tablet = { table: "orders", bucket: 0 }
          yield* cluster.createTable("orders", { buckets: 3 })
          const first = yield* cluster.awaitTablet(tablet, (t) => t.leaderAndIsr.isr.length === 3)
          for (let i = 0; i < 100; i += 10) yield* cluster.append(tablet, records(i, 10))
          const old = first.leaderAndIsr.leader!
          yield* cluster.stopServer(old)
          const moved = yield* cluster.awaitTablet(tablet, (t) => t.leaderAndIsr.leader !== old)
          assert.strictEqual(moved.leaderAndIsr.leaderEpoch, first.leaderAndIsr.leaderEpoch + 1)
          for (let i = 100; i < 200; i += 10) yield* cluster.append(tablet, records(i, 10))
          const values = (yield* cluster.read(tablet)).flatMap((b) => b.records.map((r) => dec.decode(r.value)))
          assert.deepStrictEqual(
            values,
            Array.from({ length: 200 }, (_, i) => `r${i}`)
          )
          yield* cluster.startServer(old)
          yield* cluster.awaitTablet(tablet, (t) => t.leaderAndIsr.isr.includes(old))
          const log = (yield* (yield* cluster.server(old)).logOf(tablet))!
          const copy = (yield* log.read(0, 10_000_000)).flatMap((b) => b.records.map((r) => dec.decode(r.value)))
          assert.deepStrictEqual(copy.slice(0, 200), values)
        }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer())),
      30_000
    )
  }

  for (const transport of ["direct", "tcp"] as const) {
    it.live(`concurrent appends to one tablet are each written once (${transport})`, () =>
      Effect.gen(function* () {
        const cluster = yield* LocalCluster.make({ servers: 3, replication, transport })
        const tablet = { table: "orders", bucket: 0 }
        yield* cluster.createTable("orders", { buckets: 1 })
        const first = yield* cluster.awaitTablet(tablet, (t) => t.leaderAndIsr.isr.length === 3)
        yield* cluster.append(tablet, records(0, 3))
        // The leader stops while they are in flight: each is retried on the next leader, in no particular order.
        const appends = yield* Effect.forkChild(
          Effect.all(
            Array.from({ length: 19 }, (_, i) => cluster.append(tablet, records(3 + i * 3, 3))),
            { concurrency: "unbounded" }
          )
        )
        yield* cluster.stopServer(first.leaderAndIsr.leader!)
        yield* Fiber.join(appends)
        const values = (yield* cluster.read(tablet)).flatMap((b) => b.records.map((r) => dec.decode(r.value)))
        assert.deepStrictEqual([...values].sort(), Array.from({ length: 60 }, (_, i) => `r${i}`).sort())
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
    )
  }

  it.live("an append that failed leaves no gap: the tablet's next append is written", () =>
    Effect.gen(function* () {
      const cluster = yield* LocalCluster.make({ servers: 3, replication })
      const tablet = { table: "orders", bucket: 0 }
      yield* cluster.createTable("orders", { buckets: 1 })
      yield* cluster.awaitTablet(tablet, (t) => t.leaderAndIsr.isr.length === 3)
      yield* cluster.append(tablet, records(0, 2))
      for (const id of [1, 2, 3]) yield* cluster.stopServer(id)
      // No server runs: the append cannot be written, and its caller gives up on it.
      const failed = yield* Effect.exit(cluster.append(tablet, records(2, 2)).pipe(Effect.timeout("300 millis")))
      assert.strictEqual(failed._tag, "Failure")
      for (const id of [1, 2, 3]) yield* cluster.startServer(id)
      yield* cluster.append(tablet, records(4, 2))
      const values = (yield* cluster.read(tablet)).flatMap((b) => b.records.map((r) => dec.decode(r.value)))
      assert.deepStrictEqual(values, ["r0", "r1", "r4", "r5"])
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )

  it.live(
    "largest-log-end: after the leader's loss the live ISR members are asked, and the one whose log goes furthest leads",
    () =>
      Effect.gen(function* () {
        const cluster = yield* LocalCluster.make({
          servers: 3,
          replication: { ...replication, leaderElection: "largest-log-end" }
        })
        const tablet = { table: "orders", bucket: 1 }
        yield* cluster.createTable("orders", { buckets: 2 })
        const first = yield* cluster.awaitTablet(tablet, (t) => t.leaderAndIsr.isr.length === 3)
        for (let i = 0; i < 50; i += 10) yield* cluster.append(tablet, records(i, 10))
        const old = first.leaderAndIsr.leader!
        // The followers' log ends as they are now: the new leader's must be the furthest of them.
        const ends = yield* Effect.forEach(
          first.replicas.filter((s) => s !== old),
          (s) => Effect.flatMap(cluster.server(s), (server) => server.logEnd({ tablet }))
        )
        yield* cluster.stopServer(old)
        const moved = yield* cluster.awaitTablet(
          tablet,
          (t) => t.leaderAndIsr.leader !== null && t.leaderAndIsr.leader !== old
        )
        // Offline while asking, then led: two epochs on.
        assert.strictEqual(moved.leaderAndIsr.leaderEpoch, first.leaderAndIsr.leaderEpoch + 2)
        const furthest = Math.max(...ends.map((e) => e.logEndOffset))
        const chosen = yield* (yield* cluster.server(moved.leaderAndIsr.leader!)).logEnd({ tablet })
        assert.isAtLeast(chosen.logEndOffset, furthest)
        yield* cluster.append(tablet, records(50, 10))
        const values = (yield* cluster.read(tablet)).flatMap((b) => b.records.map((r) => dec.decode(r.value)))
        assert.deepStrictEqual(
          values,
          Array.from({ length: 60 }, (_, i) => `r${i}`)
        )
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer())),
    30_000
  )

  it.live("a failed operation names its reason: an unknown tablet, a stopped server, a refused creation", () =>
    Effect.gen(function* () {
      const cluster = yield* LocalCluster.make({ servers: 3, replication })
      const unknown = yield* Effect.flip(cluster.tablet({ table: "nothing", bucket: 0 }))
      assert.strictEqual(unknown.reason._tag, "TabletNotFound")
      assert.include(unknown.message, "no tablet")
      yield* cluster.stopServer(2)
      const stopped = yield* Effect.flip(cluster.server(2))
      assert.deepStrictEqual(stopped.reason, new LocalCluster.ServerNotRunning({ server: 2 }))
      assert.strictEqual(stopped.message, "server 2 is not running")
      // Four replicas over three servers: one server would hold two of a tablet's replicas.
      const refused = yield* Effect.flip(cluster.createTable("orders", { buckets: 1, replicationFactor: 4 }))
      assert.strictEqual(refused.reason._tag, "CreateTableRefused")
      assert.include(refused.message, "a server holds two of its replicas")
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )
})
