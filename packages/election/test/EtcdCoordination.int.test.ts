import { CoordinationConformance } from "@strata/core/testing"
import { inject } from "vitest"
import * as EtcdCoordination from "../src/EtcdCoordination.js"

CoordinationConformance.suite(
  "etcd",
  EtcdCoordination.layer({
    endpoints: [`http://${inject("etcd")}`],
    root: `/strata-test/${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`
  })
)
