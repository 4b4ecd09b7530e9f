import { CoordinationConformance } from "@strata/core/testing"
import { inject } from "vitest"
import * as ZooKeeperCoordination from "../src/ZooKeeperCoordination.js"

CoordinationConformance.suite(
  "zookeeper",
  ZooKeeperCoordination.layer({ connectString: inject("zookeeper"), root: "/strata-election-test" })
)
