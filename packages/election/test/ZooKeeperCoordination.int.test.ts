import { CoordinationConformance } from "@strata/core/testing"
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
