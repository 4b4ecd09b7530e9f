import { Coordination } from "@strata/core"
import { CoordinationConformance } from "@strata/core/testing"
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect } from "effect"
import { inject } from "vitest"
import * as EtcdCoordination from "../src/EtcdCoordination.js"
import * as Proxied from "./fixtures/proxiedCoordination.js"

const root = `/strata-test/${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`

CoordinationConformance.suite("etcd", EtcdCoordination.layer({ endpoints: [`http://${inject("etcd")}`], root }))

// Each session through a proxy (and a client) of its own, which the test stalls to cut that session off.
CoordinationConformance.suspensionSuite(
  "etcd",
  Proxied.layer(inject("etcd"), (address) => EtcdCoordination.make({ endpoints: [`http://${address}`], root })),
  { eventTimeout: "20 seconds", testTimeout: 60_000 }
)

describe("EtcdCoordination sessionTimeout", () => {
  it.live("a duration string is the timeout a session asking for none gets", () =>
    Effect.gen(function* () {
      const coordination = yield* Coordination.Coordination
      const session = yield* coordination.session()
      assert.strictEqual(Duration.toMillis(session.timeout), 3000)
    }).pipe(
      Effect.scoped,
      Effect.provide(
        EtcdCoordination.layer({ endpoints: [`http://${inject("etcd")}`], root, sessionTimeout: "3 seconds" })
      )
    )
  )
})
