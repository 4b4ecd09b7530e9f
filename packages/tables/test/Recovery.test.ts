import { Log } from "@strata/core"
import { recoverySuite } from "./recoverySuite.js"

recoverySuite("memory log", () => Log.layerMemory())
