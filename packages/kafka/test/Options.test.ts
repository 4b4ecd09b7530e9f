import { inspect } from "node:util"
import { assert, describe, it } from "@effect/vitest"
import { KafkaLog } from "@strata/kafka"
import { Duration, Effect, Redacted, Schema } from "effect"
import { checkAnswer } from "../src/internal/brokerProbe.js"

// Every case here decodes options only, or fails in `make` before anything connects: no broker is needed.

describe("KafkaLog options", () => {
  it("a SASL password and a TLS key decode to Redacted values that never print, given as text or as Redacted", () => {
    const decode = Schema.decodeUnknownSync(KafkaLog.KafkaLogOptions)
    for (const password of ["s3cret-pass", Redacted.make("s3cret-pass")]) {
      const o = decode({
        brokers: ["127.0.0.1:9094"],
        tls: { ca: "CA PEM", key: "KEY PEM s3cret-key" },
        sasl: { mechanism: "SCRAM-SHA-512", username: "strata", password }
      })
      assert.isTrue(Redacted.isRedacted(o.sasl?.password))
      assert.strictEqual(Redacted.value(o.sasl!.password), "s3cret-pass")
      const shown = `${JSON.stringify(o)} ${String(o.sasl?.password)} ${inspect(o, { depth: 5 })}`
      assert.notInclude(shown, "s3cret-pass")
      assert.notInclude(shown, "s3cret-key")
    }
  })

  it("the start-up probe reads a TLS record where a frame size should be as a TLS listener", () => {
    // A TLS alert (content type 21, TLS 1.2) as a Kafka SASL_SSL listener answers a plaintext request.
    const alert = Buffer.from([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x50])
    const answer = checkAnswer(alert, 7)
    assert.deepStrictEqual(answer, { wrong: "a TLS record: a TLS listener, so set tls" })
    // An ApiVersions answer still passes: size 16, correlation id 7, no error, one api (18, 0..3).
    const ok = Buffer.from([0, 0, 0, 16, 0, 0, 0, 7, 0, 0, 0, 0, 0, 1, 0, 18, 0, 0, 0, 3])
    assert.strictEqual(checkAnswer(ok, 7), "ok")
  })

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
