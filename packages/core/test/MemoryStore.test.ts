import { Store } from "@strata/core"
import { StoreConformance } from "@strata/core/testing"

StoreConformance.suite("memory", Store.layerMemory())
