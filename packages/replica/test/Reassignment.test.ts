/**
 * Reassignment on a whole in-memory cluster (`LocalCluster`): a tablet's replicas move while a producer writes with
 * acks=all — first with its leader staying, then with its leader leaving — and every acknowledged record reads back
 * once from the new replicas while the old ones delete theirs; a move that cannot finish (its leader takes no
 * instructions, as when cut off from the controller) is cancelled, the tablet back on its original replicas and the
 * adding server deleting its replica once it is back; refusals arrive typed.
 */
import { assert, describe, it } from "@effect/vitest"
import { Coordination, MemoryCoordination, type Models } from "@strata/core"
import { Effect, Fiber } from "effect"
import type * as ControllerState from "../src/machines/ControllerState.js"
import * as LocalCluster from "../src/node/LocalCluster.js"
import * as ClusterPaths from "../src/wire/ClusterPaths.js"

const enc = new TextEncoder()
const dec = new TextDecoder()
const records = (values: ReadonlyArray<string>) =>
  values.map((v) => ({ key: null, value: enc.encode(v), headers: [], timestamp: 0 }))
const valuesOf = (batches: ReadonlyArray<{ readonly records: ReadonlyArray<{ readonly value: Uint8Array }> }>) =>
  batches.flatMap((b) => b.records.map((r) => dec.decode(r.value)))

const replication = {
  sessionTimeout: 2_000,
  replicaLagTimeMax: 6_000,
  fetchMaxWait: 50,
  retryBackoff: 20,
  appendTimeout: 5_000,
  minInsyncReplicas: 2
}

const sorted = (servers: ReadonlyArray<number>) => [...servers].sort((a, b) => a - b)

/** The tablet has `replicas` and no move under way. */
const settledOn = (replicas: ReadonlyArray<Models.ServerId>) => (t: ControllerState.Tablet) =>
  t.reassignment === undefined && t.replicas.join(",") === replicas.join(",")

/** The refusal's reason tag of a failed cluster call. */
const refusalOf = (e: LocalCluster.LocalClusterError) =>
  e.reason._tag === "ReassignRefused" ? e.reason.reason._tag : `not a refusal: ${e.reason._tag}`

/** Waits until `server` hosts (or no longer hosts) a replica of `tablet`, polling every 10 ms. */
const awaitHosting = (cluster: LocalCluster.LocalCluster, server: number, tablet: Models.TabletId, hosts: boolean) =>
  Effect.gen(function* () {
    for (let i = 0; i < 3_000; i++) {
      const tablets = yield* (yield* cluster.server(server)).tablets
      if (tablets.some((t) => t.table === tablet.table && t.bucket === tablet.bucket) === hosts) return
      yield* Effect.sleep("10 millis")
    }
    assert.fail(`server ${server} ${hosts ? "never hosted" : "still hosts"} ${tablet.table}:${tablet.bucket}`)
  })

describe("reassignment on a LocalCluster", () => {
  it.live(
    "[1,2,3] → [1,4,5] (the leader stays) then → [4,5,2] (the leader leaves) under acks=all writes: every acknowledged record once on each new replica; the leaving ones delete theirs",
    () =>
      Effect.gen(function* () {
        const cluster = yield* LocalCluster.make({ servers: 5, replication })
        const tablet = { table: "moves", bucket: 0 }
        yield* cluster.createTable("moves", { buckets: 1 })
        const first = yield* cluster.awaitTablet(tablet, (t) => t.leaderAndIsr.isr.length === 3)
        assert.deepStrictEqual(first.replicas, [1, 2, 3])
        assert.strictEqual(first.leaderAndIsr.leader, 1)

        // A producer writes throughout, one acks=all append at a time; each value is noted once acknowledged.
        const acked: Array<string> = []
        for (let i = 0; i < 40; i += 4) {
          const values = [0, 1, 2, 3].map((j) => `a${i + j}`)
          yield* cluster.append(tablet, records(values))
          acked.push(...values)
        }
        let writing = true
        const producer = yield* Effect.forkChild(
          Effect.gen(function* () {
            for (let i = 0; writing; i += 2) {
              const values = [`b${i}`, `b${i + 1}`]
              yield* cluster.append(tablet, records(values))
              acked.push(...values)
            }
          })
        )

        // The leader stays: 4 and 5 join as followers, copying under the move's replication throttle (high enough
        // not to slow the test); once both are in the ISR the tablet is on [1,4,5].
        const throttle = { throttleBytesPerSec: 50_000_000 }
        const moving = yield* cluster.reassign(tablet, [1, 4, 5], throttle)
        assert.deepStrictEqual(moving.reassignment, { original: [1, 2, 3], target: [1, 4, 5], ...throttle })
        assert.deepStrictEqual(moving.replicas, [1, 4, 5, 2, 3])
        assert.strictEqual(moving.leaderAndIsr.leader, 1)
        // Asking again for the move under way is accepted, and changes nothing.
        assert.deepStrictEqual((yield* cluster.reassign(tablet, [1, 4, 5], throttle)).reassignment, moving.reassignment)
        const moved = yield* cluster.awaitTablet(tablet, settledOn([1, 4, 5]))
        // The move over, its new replicas fetch unthrottled.
        for (const server of [4, 5]) {
          const s = yield* cluster.server(server)
          const held = (yield* s.holdings({ coordinatorEpoch: yield* s.coordinatorEpoch })).tablets
          assert.deepStrictEqual(
            held.map((h) => h.throttleBytesPerSec),
            [undefined],
            `server ${server}`
          )
        }
        assert.strictEqual(moved.leaderAndIsr.leader, 1)
        assert.deepStrictEqual(sorted(moved.leaderAndIsr.isr), [1, 4, 5])
        yield* cluster.awaitTablet(tablet, (t) => t.retired === undefined)
        yield* awaitHosting(cluster, 2, tablet, false)
        yield* awaitHosting(cluster, 3, tablet, false)

        // The leader leaves: 2 (which deleted its replica) joins again, and 4 — the first target replica in the ISR —
        // leads once the move is done.
        const leaving = yield* cluster.reassign(tablet, [4, 5, 2])
        assert.deepStrictEqual(leaving.reassignment, { original: [1, 4, 5], target: [4, 5, 2] })
        const left = yield* cluster.awaitTablet(tablet, settledOn([4, 5, 2]))
        assert.strictEqual(left.leaderAndIsr.leader, 4)
        assert.isAbove(left.leaderAndIsr.leaderEpoch, moved.leaderAndIsr.leaderEpoch)
        assert.deepStrictEqual(sorted(left.leaderAndIsr.isr), [2, 4, 5])
        yield* cluster.awaitTablet(tablet, (t) => t.retired === undefined)
        yield* awaitHosting(cluster, 1, tablet, false)

        writing = false
        yield* Fiber.join(producer)
        const more = ["c0", "c1", "c2"]
        yield* cluster.append(tablet, records(more))
        acked.push(...more)
        assert.isAbove(acked.length, 43)

        // Once each, in the order written: from the leader, and in the log of every new replica.
        assert.deepStrictEqual(valuesOf(yield* cluster.read(tablet)), acked)
        for (const server of [4, 5, 2]) {
          const log = yield* (yield* cluster.server(server)).logOf(tablet)
          assert.isDefined(log, `server ${server} hosts the tablet`)
          assert.deepStrictEqual(valuesOf(yield* log!.read(0, 100_000_000)), acked, `server ${server}'s log`)
        }
        for (const server of [1, 3]) assert.deepStrictEqual(yield* (yield* cluster.server(server)).tablets, [])
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer())),
    60_000
  )

  it.live(
    "a move that cannot finish is cancelled: back on [1,2,3], the adding server (stopped meanwhile) deletes its replica once it is back; refusals are typed",
    () =>
      Effect.gen(function* () {
        const cluster = yield* LocalCluster.make({ servers: 5, replication })
        const tablet = { table: "cancel", bucket: 0 }
        yield* cluster.createTable("cancel", { buckets: 1 })
        const first = yield* cluster.awaitTablet(tablet, (t) => t.leaderAndIsr.isr.length === 3)
        assert.deepStrictEqual(first.replicas, [1, 2, 3])
        assert.strictEqual(first.leaderAndIsr.leader, 1)
        const acked = ["a0", "a1", "a2", "a3"]
        yield* cluster.append(tablet, records(acked))

        // Refused, each naming why.
        const refused = (replicas: ReadonlyArray<number>) => Effect.flip(cluster.reassign(tablet, replicas))
        assert.strictEqual(refusalOf(yield* refused([1, 1, 4])), "DuplicateServer")
        assert.strictEqual(refusalOf(yield* refused([1, 2, 9])), "UnknownServer")
        assert.strictEqual(refusalOf(yield* refused([4])), "ReplicationFactor")
        assert.strictEqual(refusalOf(yield* Effect.flip(cluster.cancelReassign(tablet))), "NotMoving")
        const unknown = yield* Effect.flip(cluster.reassign({ table: "cancel", bucket: 7 }, [1, 2, 3]))
        assert.strictEqual(refusalOf(unknown), "UnknownTablet")
        assert.strictEqual(unknown.message, "no tablet cancel/7")

        // The leader takes no instructions from the controller (as when cut off from it while its session lives):
        // it goes on under its epoch, and the adding replica on 4 follows a leader that does not know it.
        const session = yield* (yield* Coordination.Coordination).session()
        const stat = yield* session.exists(ClusterPaths.make("/strata").server(1))
        assert.isTrue(stat._tag === "Some")
        const registration = stat._tag === "Some" ? stat.value.createdOrder : 0
        const leader = yield* cluster.server(1)
        yield* leader.registered(registration + 1_000)

        const moving = yield* cluster.reassign(tablet, [1, 2, 4])
        assert.deepStrictEqual(moving.reassignment, { original: [1, 2, 3], target: [1, 2, 4] })
        // Another move while this one is under way is refused, naming it.
        assert.strictEqual(refusalOf(yield* refused([1, 2, 5])), "AlreadyMoving")
        yield* awaitHosting(cluster, 4, tablet, true)
        yield* cluster.stopServer(4)

        const back = yield* cluster.cancelReassign(tablet)
        assert.deepStrictEqual(back.replicas, [1, 2, 3])
        assert.isUndefined(back.reassignment)
        assert.deepStrictEqual(back.retired, [4])
        assert.strictEqual(back.leaderAndIsr.leader, 1)
        assert.deepStrictEqual(sorted(back.leaderAndIsr.isr), [1, 2, 3])
        assert.isAbove(back.leaderAndIsr.leaderEpoch, moving.leaderAndIsr.leaderEpoch)

        // The leader takes instructions again: the tablet is written to and read on its original replicas.
        yield* leader.registered(registration)
        const more = ["b0", "b1"]
        yield* cluster.append(tablet, records(more))
        acked.push(...more)
        assert.deepStrictEqual(valuesOf(yield* cluster.read(tablet)), acked)

        // Server 4 is back: told to delete its replica, it does, and is retired no more.
        yield* cluster.startServer(4)
        const done = yield* cluster.awaitTablet(tablet, (t) => t.retired === undefined)
        assert.deepStrictEqual(done.replicas, [1, 2, 3])
        assert.isUndefined(done.reassignment)
        assert.deepStrictEqual(yield* (yield* cluster.server(4)).tablets, [])
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer())),
    60_000
  )
})
