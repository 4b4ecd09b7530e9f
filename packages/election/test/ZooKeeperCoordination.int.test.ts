import { CoordinationConformance } from "@strata/core/testing"
import { inject } from "vitest"
import * as ZooKeeperCoordination from "../src/ZooKeeperCoordination.js"
import * as ProxiedZooKeeper from "./fixtures/proxiedZooKeeper.js"

CoordinationConformance.suite(
  "zookeeper",
  ZooKeeperCoordination.layer({ connectString: inject("zookeeper"), root: "/strata-election-test" })
)

// Each session through a proxy of its own, which the test stalls to cut that session off.
CoordinationConformance.suspensionSuite(
  "zookeeper",
  ProxiedZooKeeper.layer(inject("zookeeper"), "/strata-election-test"),
  { eventTimeout: "20 seconds", testTimeout: 60_000 }
)
