import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as ClusterPaths from "../src/ClusterPaths.js"
import type * as ControllerState from "../src/ControllerState.js"

const tablet: ControllerState.Tablet = {
  tablet: { table: "orders", bucket: 3 },
  replicas: [1, 2, 3],
  state: "OnlineTablet",
  leaderAndIsr: { leader: 2, leaderEpoch: 7, isr: [2], coordinatorEpoch: 4, version: 11 },
  registrations: { "2": 40 },
  eligible: [1, 3]
}

describe("ClusterPaths", () => {
  it.effect("a stored tablet reads back whole: registrations and eligible replicas included, version the node's", () =>
    Effect.gen(function* () {
      const read = yield* ClusterPaths.decodeTablet("/x", ClusterPaths.encodeTablet(tablet), 12)
      assert.deepStrictEqual(read, { ...tablet, leaderAndIsr: { ...tablet.leaderAndIsr, version: 12 } })
    })
  )

  it.effect("a node that is not a tablet is CorruptClusterData naming its path", () =>
    Effect.gen(function* () {
      const e = yield* Effect.flip(ClusterPaths.decodeTablet("/ns/tablets/orders:3", new TextEncoder().encode("{}"), 0))
      assert.strictEqual(e._tag, "CorruptClusterData")
      assert.include(e.message, "/ns/tablets/orders:3")
    })
  )
})
