import { Coordination } from "@strata/core"
import { ElectionConformance } from "@strata/core/testing"
import { Layer } from "effect"
import * as CoordinationElection from "../src/CoordinationElection.js"

ElectionConformance.suite("memory", (namespace) =>
  CoordinationElection.layer({ namespace }).pipe(Layer.provide(Coordination.layerMemory()))
)
