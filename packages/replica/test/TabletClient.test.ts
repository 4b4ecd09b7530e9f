/**
 * The client's failures: each call fails with one `TabletClientError` whose `reason` names what went wrong, and
 * the errors are Schemas (they encode and decode as themselves). And its reads' long-poll on a cluster over TCP:
 * answered as soon as an append commits, empty once the wait is over, never past the call's timeout, ended when
 * the caller goes.
 */
import { assert, describe, it } from "@effect/vitest"
import { MemoryCoordination } from "@strata/core"
import { Clock, type Duration, Effect, Fiber, Schema } from "effect"
import * as TabletClient from "../src/client/TabletClient.js"
import * as LocalCluster from "../src/node/LocalCluster.js"
import { quickReplication, records, values } from "./support/servers.js"
import { PeerUnreachable } from "../src/wire/Peers.js"
import * as ReplicationConfig from "../src/wire/ReplicationConfig.js"

const replication = { sessionTimeout: 1_000, replicaLagTimeMax: 3_000, retryBackoff: 20 }

/** A client of a namespace no coordinator leads: every call to the controller finds nobody. */
const nobody = (deliveryTimeout: Duration.Input) =>
  TabletClient.make({ namespace: "/nobody", deliveryTimeout, retryBackoff: 20, replication })

describe("TabletClient errors", () => {
  it.live("a controller nobody leads: an admin call ends DeliveryUnknown naming the unreachable controller", () =>
    Effect.gen(function* () {
      // A duration option takes a string as well as a number of milliseconds: the call ends after it.
      const client = yield* nobody("200 millis")
      const error = yield* Effect.flip(client.metadata())
      assert.instanceOf(error, TabletClient.TabletClientError)
      assert.strictEqual(error.reason._tag, "DeliveryUnknown")
      assert.include(error.message, "the metadata: not acknowledged within the delivery timeout")
      assert.include(error.message, "the controller unreachable")
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )

  it.live(
    "a send the leader keeps refusing retriably (too few in-sync replicas) ends DeliveryUnknown at the delivery timeout, naming the last refusal",
    () =>
      Effect.gen(function* () {
        const replication = { ...quickReplication, minInsyncReplicas: 2 }
        const cluster = yield* LocalCluster.make({ servers: 2, replication, transport: "tcp" })
        const tablet = { table: "orders", bucket: 0 }
        yield* cluster.createTable("orders", { buckets: 1, replicationFactor: 2 })
        yield* cluster.awaitTablet(tablet, (t) => t.leaderAndIsr.isr.length === 2)
        const client = yield* TabletClient.make({ deliveryTimeout: 1_500, retryBackoff: 20, linger: 0, replication })
        yield* client.send(tablet, records("r", 0, 1))
        const leader = (yield* cluster.tablet(tablet)).leaderAndIsr.leader!
        yield* cluster.stopServer(leader === 1 ? 2 : 1)
        yield* cluster.awaitTablet(tablet, (t) => t.leaderAndIsr.isr.length === 1)
        const error = yield* Effect.flip(client.send(tablet, records("r", 1, 2)))
        assert.strictEqual(error.reason._tag, "DeliveryUnknown", error.message)
        assert.include(error.message, "orders/0")
        assert.match(error.message, /NotEnoughReplicas|in-sync/i)
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer())),
    30_000
  )

  it.live("a send with no producer id to be had fails NoProducerId, naming the tablet", () =>
    Effect.gen(function* () {
      const client = yield* nobody(200)
      const record = { key: null, value: new Uint8Array([1]), headers: [], timestamp: 0 }
      const error = yield* Effect.flip(client.send({ table: "orders", bucket: 0 }, [record]))
      assert.strictEqual(error.reason._tag, "NoProducerId")
      assert.include(error.message, "no producer id from the controller")
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )

  it.live("a name the controller would refuse is refused before it is sent", () =>
    Effect.gen(function* () {
      const client = yield* nobody(60_000)
      const error = yield* Effect.flip(client.createTable("a/b", { buckets: 1 }))
      assert.strictEqual(error.reason._tag, "CreateTableRefused")
      assert.include(error.message, JSON.stringify("a/b"))
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )

  it.live("a retention that is not a whole number ≥ 1 is refused before it is sent, naming it", () =>
    Effect.gen(function* () {
      // Nobody leads: a create that were sent would wait out the minute.
      const client = yield* nobody(60_000)
      for (const [options, named] of [
        [{ retentionMs: 0 }, "retentionMs must be a whole number ≥ 1, not 0"],
        [{ retentionMs: 1_000, retentionBytes: 1.5 }, "retentionBytes must be a whole number ≥ 1, not 1.5"],
        [{ retentionBytes: -1 }, "retentionBytes must be a whole number ≥ 1, not -1"]
      ] as const) {
        const error = yield* Effect.flip(client.createTable("orders", { buckets: 1, ...options }))
        assert.strictEqual(error.reason._tag, "CreateTableRefused")
        assert.include(error.message, named)
      }
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )

  it.effect("a bad duration option is refused before the client starts, naming it", () =>
    Effect.gen(function* () {
      const soon = yield* Effect.flip(nobody("soon" as Duration.Input))
      assert.instanceOf(soon, ReplicationConfig.InvalidReplicaOptions)
      assert.strictEqual(soon.option, "deliveryTimeout")
      assert.strictEqual(soon.value, '"soon"')
      const negative = yield* Effect.flip(TabletClient.make({ linger: -1 }))
      assert.instanceOf(negative, ReplicationConfig.InvalidReplicaOptions)
      assert.strictEqual(negative.option, "linger")
      assert.include(negative.message, "expected a duration of zero or more")
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )

  it("the errors are Schemas: a client error and the transport's error encode and decode as themselves", () => {
    const codec = Schema.toCodecJson(TabletClient.TabletClientError)
    for (const reason of [
      new TabletClient.NoSuchTablet({ tablet: "orders-0" }),
      new TabletClient.DeliveryUnknown({ tablet: "orders-0", last: "server 1 unreachable: not running" }),
      new TabletClient.NoProducerId({ tablet: "orders-0", last: "the controller unreachable: no coordinator leads" }),
      new TabletClient.ClientClosed({ tablet: "orders-0" }),
      new TabletClient.Abandoned({ tablet: "orders-0" })
    ]) {
      const error = new TabletClient.TabletClientError({ reason })
      const back = Schema.decodeUnknownSync(codec)(Schema.encodeSync(codec)(error))
      assert.instanceOf(back, TabletClient.TabletClientError)
      assert.strictEqual(back.reason._tag, reason._tag)
      assert.strictEqual(back.message, reason.message)
    }
    const unreachable = new PeerUnreachable({ target: "server 3", detail: "not registered" })
    assert.strictEqual(unreachable.message, "server 3 unreachable: not registered")
    const peerCodec = Schema.toCodecJson(PeerUnreachable)
    const back = Schema.decodeUnknownSync(peerCodec)(Schema.encodeSync(peerCodec)(unreachable))
    assert.instanceOf(back, PeerUnreachable)
    assert.strictEqual(back.message, unreachable.message)
  })

  it.live(
    "a read's long-poll: answered when an append commits, empty after its wait, within the call's timeout, ended when the caller goes",
    () =>
      Effect.gen(function* () {
        // The leader would wait up to 2 s; the client's calls may take 600 ms.
        const replication = { ...quickReplication, fetchMaxWait: 2_000, minInsyncReplicas: 1 }
        const cluster = yield* LocalCluster.make({ servers: 1, replication, transport: "tcp" })
        const tablet = { table: "orders", bucket: 0 }
        yield* cluster.createTable("orders", { buckets: 1, replicationFactor: 1 })
        yield* cluster.awaitTablet(tablet, (t) => t.leaderAndIsr.leader === 1)
        const client = yield* TabletClient.make({ requestTimeout: 600, retryBackoff: 20, linger: 0, replication })
        yield* client.send(tablet, records("r", 0, 3))
        const timed = <A, E>(self: Effect.Effect<A, E>) =>
          Effect.gen(function* () {
            const start = yield* Clock.currentTimeMillis
            const a = yield* self
            return { a, ms: (yield* Clock.currentTimeMillis) - start }
          })
        // Answered as soon as the append commits.
        const polling = yield* Effect.forkChild(timed(client.read(tablet, 3, 1_000_000, { maxWaitMs: 280 })))
        yield* Effect.sleep(60)
        yield* client.send(tablet, records("r", 3, 5))
        const woken = yield* Fiber.join(polling)
        assert.deepStrictEqual(values(woken.a.batches), ["r3", "r4"])
        assert.isBelow(woken.ms, 250)
        // Empty once the wait is over; a wait longer than the call may take is cut to half of it, not timed out.
        const empty = yield* timed(client.read(tablet, 5, 1_000_000, { maxWaitMs: 150 }))
        assert.deepStrictEqual([empty.a.batches.length, empty.a.highWatermark], [0, 5])
        assert.isAtLeast(empty.ms, 140)
        const long = yield* timed(client.read(tablet, 5, 1_000_000, { maxWaitMs: 60_000 }))
        assert.strictEqual(long.a.batches.length, 0)
        assert.isAtLeast(long.ms, 290)
        assert.isBelow(long.ms, 600)
        // A caller that goes ends its read at once; the next one is served.
        const going = yield* Effect.forkChild(client.read(tablet, 5, 1_000_000, { maxWaitMs: 280 }))
        yield* Effect.sleep(30)
        const interrupted = yield* timed(Fiber.interrupt(going))
        assert.isBelow(interrupted.ms, 100)
        assert.strictEqual((yield* client.read(tablet, 0)).batches.length > 0, true)
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer())),
    30_000
  )
})
