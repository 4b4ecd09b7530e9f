import { KafkaLog } from "@strata/kafka"
import { inject } from "vitest"
import { recoverySuite } from "./recoverySuite.js"

recoverySuite("kafka", () => KafkaLog.layer({ brokers: [inject("kafka")] }))
