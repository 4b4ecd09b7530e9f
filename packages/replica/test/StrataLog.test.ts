import { MemoryCoordination } from "@strata/core"
import { LogConformance } from "@strata/core/testing"
import { Layer } from "effect"
import * as LocalCluster from "../src/node/LocalCluster.js"
import * as StrataLog from "../src/log/StrataLog.js"

// Core's Log conformance on a cluster of three tablet servers talking over loopback TCP, as separate processes do,
// with the capabilities the Strata log declares.
const cluster = LocalCluster.layer({
  servers: 3,
  transport: "tcp",
  replication: { sessionTimeout: 2_000, replicaLagTimeMax: 6_000 }
})
const log = StrataLog.layer({ client: { linger: 1 } }).pipe(
  Layer.provideMerge(cluster),
  Layer.provide(MemoryCoordination.layer())
)

LogConformance.suite("strata", log, { capabilities: StrataLog.capabilities, timeout: "20 seconds" })
