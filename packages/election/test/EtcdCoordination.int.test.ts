import { CoordinationConformance } from "@strata/core/testing"
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
