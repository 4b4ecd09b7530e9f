/**
 * The client's failures: each call fails with one `TabletClientError` whose `reason` names what went wrong, and
 * the errors are Schemas (they encode and decode as themselves).
 */
import { assert, describe, it } from "@effect/vitest"
import { MemoryCoordination } from "@strata/core"
import { Effect, Schema } from "effect"
import * as TabletClient from "../src/client/TabletClient.js"
import { PeerUnreachable } from "../src/wire/Peers.js"

const replication = { sessionTimeoutMs: 1_000, replicaLagTimeMaxMs: 3_000, retryBackoffMs: 20 }

/** A client of a namespace no coordinator leads: every call to the controller finds nobody. */
const nobody = (deliveryTimeoutMs: number) =>
  TabletClient.make({ namespace: "/nobody", deliveryTimeoutMs, retryBackoffMs: 20, replication })

describe("TabletClient errors", () => {
  it.live("a controller nobody leads: an admin call ends DeliveryUnknown naming the unreachable controller", () =>
    Effect.gen(function* () {
      const client = yield* nobody(200)
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
