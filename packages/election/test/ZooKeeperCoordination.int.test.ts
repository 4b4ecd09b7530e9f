import { Coordination } from "@strata/core"
import { CoordinationConformance } from "@strata/core/testing"
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect } from "effect"
import { inject } from "vitest"
import * as ZooKeeperCoordination from "../src/ZooKeeperCoordination.js"
import * as Proxied from "./fixtures/proxiedCoordination.js"

const root = "/strata-election-test"

CoordinationConformance.suite("zookeeper", ZooKeeperCoordination.layer({ connectString: inject("zookeeper"), root }))

// Each session through a proxy of its own, which the test stalls to cut that session off.
CoordinationConformance.suspensionSuite(
  "zookeeper",
  Proxied.layer(inject("zookeeper"), (address) => ZooKeeperCoordination.make({ connectString: address, root })),
  { eventTimeout: "20 seconds", testTimeout: 60_000 }
)

describe("ZooKeeperCoordination sessionTimeout", () => {
  it.live("a duration string is the timeout a session asking for none gets", () =>
    Effect.gen(function* () {
      const coordination = yield* Coordination.Coordination
      const session = yield* coordination.session()
      assert.strictEqual(Duration.toMillis(session.timeout), 3000)
    }).pipe(
      Effect.scoped,
      Effect.provide(
        ZooKeeperCoordination.layer({ connectString: inject("zookeeper"), root, sessionTimeout: "3 seconds" })
      )
    )
  )
})
