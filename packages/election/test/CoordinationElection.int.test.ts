import { ElectionConformance } from "@strata/core/testing"
import { Layer } from "effect"
import { inject } from "vitest"
import * as CoordinationElection from "../src/CoordinationElection.js"
import * as EtcdCoordination from "../src/EtcdCoordination.js"
import * as ZooKeeperCoordination from "../src/ZooKeeperCoordination.js"

ElectionConformance.suite("zookeeper", (namespace) =>
  CoordinationElection.layer({ namespace, sessionTimeout: "6 seconds" }).pipe(
    Layer.provide(ZooKeeperCoordination.layer({ connectString: inject("zookeeper"), root: "/strata-election-test" }))
  )
)

ElectionConformance.suite("etcd", (namespace) =>
  CoordinationElection.layer({ namespace, sessionTimeout: "6 seconds" }).pipe(
    Layer.provide(EtcdCoordination.layer({ endpoints: [`http://${inject("etcd")}`], root: "/strata-election-test" }))
  )
)
