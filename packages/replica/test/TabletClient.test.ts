/**
 * The client's failures: each call fails with one `TabletClientError` whose `reason` names what went wrong, and
 * the errors are Schemas (they encode and decode as themselves).
 */
import { assert, describe, it } from "@effect/vitest"
import { MemoryCoordination } from "@strata/core"
import { type Duration, Effect, Schema } from "effect"
import * as TabletClient from "../src/client/TabletClient.js"
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
})
