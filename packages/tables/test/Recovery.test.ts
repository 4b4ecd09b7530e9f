import { MemoryLog } from "@strata/core"
import { recoverySuite } from "./recoverySuite.js"

recoverySuite("memory log", () => MemoryLog.layer())
