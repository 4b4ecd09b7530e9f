import { assert, describe, it } from "@effect/vitest"
import { LogConformance } from "@strata/core/testing"
import { KafkaLog } from "@strata/kafka"
import { Effect } from "effect"
import { inject } from "vitest"

LogConformance.suite("kafka", KafkaLog.layer({ brokers: [inject("kafka")] }))

describe("KafkaLog start-up", () => {
  it.live("unreachable brokers give BrokerUnreachable naming them, after the configured attempts", () =>
    Effect.gen(function* () {
      const e = yield* Effect.flip(Effect.scoped(KafkaLog.make({ brokers: ["127.0.0.1:1"], connectAttempts: 2 })))
      assert.strictEqual(e.reason._tag, "BrokerUnreachable")
      assert.include(e.message, "127.0.0.1:1")
      assert.isTrue(e.retryable)
    })
  )

  it.live("invalid options are rejected before connecting, naming the field", () =>
    Effect.gen(function* () {
      const e = yield* Effect.flip(Effect.scoped(KafkaLog.make({ brokers: ["no-port"] })))
      assert.strictEqual(e.reason._tag, "InvalidRequest")
      assert.include(e.message, "brokers")
    })
  )
})
