import { assert, describe, it } from "@effect/vitest"
import { KafkaLog } from "@strata/kafka"
import { Duration, Effect, Schema } from "effect"

// Every case here decodes options only, or fails in `make` before anything connects: no broker is needed.

describe("KafkaLog options", () => {
  it("durations take any Duration.Input (a number is milliseconds) and have their defaults", () => {
    const decode = Schema.decodeUnknownSync(KafkaLog.KafkaLogOptions)
    const given = decode({ brokers: ["127.0.0.1:9092"], requestTimeout: "2 seconds", maxWait: 100, linger: "5 millis" })
    assert.strictEqual(Duration.toMillis(given.requestTimeout), 2000)
    assert.strictEqual(Duration.toMillis(given.maxWait), 100)
    assert.strictEqual(Duration.toMillis(given.linger), 5)
    const defaults = decode({ brokers: ["127.0.0.1:9092"] })
    assert.strictEqual(Duration.toMillis(defaults.requestTimeout), 10_000)
    assert.strictEqual(Duration.toMillis(defaults.maxWait), 250)
    assert.strictEqual(Duration.toMillis(defaults.linger), 0)
  })

  it.live("a duration that is none, or out of its bound, fails make with InvalidRequest naming the option", () =>
    Effect.gen(function* () {
      const refused = (options: KafkaLog.KafkaLogOptions) => Effect.flip(Effect.scoped(KafkaLog.make(options)))
      const brokers: [string] = ["127.0.0.1:1"]
      for (const [options, key] of [
        [{ brokers, requestTimeout: "soon" as Duration.Input }, "requestTimeout"],
        [{ brokers, requestTimeout: 0 }, "requestTimeout"],
        [{ brokers, maxWait: -1 }, "maxWait"],
        [{ brokers, linger: -1 }, "linger"],
        [{ brokers, linger: Number.POSITIVE_INFINITY }, "linger"],
        [{ brokers, lingerMs: 5 } as unknown as KafkaLog.KafkaLogOptions, "lingerMs = 5"]
      ] as const) {
        const e = yield* refused(options)
        assert.strictEqual(e.reason._tag, "InvalidRequest", e.message)
        assert.include(e.message, key)
      }
    })
  )
})
