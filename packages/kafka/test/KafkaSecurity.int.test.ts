import { assert, describe, it } from "@effect/vitest"
import { Log } from "@strata/core"
import { KafkaLog } from "@strata/kafka"
import { Config, ConfigProvider, Effect, Layer, Redacted, Stream } from "effect"
import { inject } from "vitest"

// The broker's SASL_SSL listener (scripts/services): its certificate is signed by a CA made for the services
// directory; the user "strata" exists for PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512.
const broker = inject("kafkaSasl")
const ca = inject("kafkaCa")
if (ca === "") {
  throw new Error(
    "the running Kafka has no SASL_SSL listener (.services/kafka/tls/ca.pem is missing): restart it with ./dev services down kafka && ./dev services up kafka"
  )
}
const PASSWORD = "strata-secret"
const mechanisms = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] as const

/** Produces one record to a fresh topic and reads it back: every client of the log (admin, producer, consumer). */
const roundTrip = (topic: string) =>
  Effect.gen(function* () {
    const log = yield* Log.Log
    yield* log.ensureTopic({ topic, partitions: 1 })
    const offset = yield* log.produce({ topic, partition: 0, key: null, value: new TextEncoder().encode(topic) })
    const consumer = yield* log.consumer()
    yield* consumer.assign([{ topic, partition: 0 }])
    yield* consumer.seek({ topic, partition: 0 }, offset)
    const [batch] = yield* consumer.batches.pipe(Stream.take(1), Stream.runCollect)
    return new TextDecoder().decode(batch!.records[0]!.value!)
  }).pipe(Effect.scoped)

const failure = (options: KafkaLog.KafkaLogOptions) => Effect.flip(Effect.scoped(KafkaLog.make(options)))

describe("KafkaLog over TLS and SASL", () => {
  for (const mechanism of mechanisms) {
    it.live(`TLS with the broker's CA, then SASL ${mechanism}: produce and consume`, () =>
      Effect.gen(function* () {
        const topic = `secure-${mechanism.toLowerCase()}-${Date.now()}`
        const layer = KafkaLog.layer({
          brokers: [broker],
          tls: { ca },
          sasl: { mechanism, username: "strata", password: PASSWORD }
        })
        assert.strictEqual(yield* roundTrip(topic).pipe(Effect.provide(layer)), topic)
      })
    )
  }

  it.live("layerConfig reads the password as a Redacted from the configuration", () =>
    Effect.gen(function* () {
      const topic = `secure-config-${Date.now()}`
      const layer = KafkaLog.layerConfig({
        brokers: Config.succeed([broker] as const),
        tls: Config.succeed({ ca }),
        sasl: {
          mechanism: Config.succeed("SCRAM-SHA-512" as const),
          username: Config.String("KAFKA_USER"),
          password: Config.Redacted("KAFKA_PASSWORD")
        }
      }).pipe(
        Layer.provide(
          ConfigProvider.layer(ConfigProvider.fromUnknown({ KAFKA_USER: "strata", KAFKA_PASSWORD: PASSWORD }))
        )
      )
      assert.strictEqual(yield* roundTrip(topic).pipe(Effect.provide(layer)), topic)
    })
  )

  it.live("a wrong password is AuthenticationFailed naming the broker, at once, and the password is not in it", () =>
    Effect.gen(function* () {
      const started = Date.now()
      const e = yield* failure({
        brokers: [broker],
        tls: { ca },
        sasl: { mechanism: "SCRAM-SHA-256", username: "strata", password: "not-the-password" },
        requestTimeout: "20 seconds"
      })
      assert.strictEqual(e.reason._tag, "AuthenticationFailed")
      assert.include(e.message, broker)
      assert.include(e.message, "SASL")
      assert.isFalse(e.retryable)
      assert.notInclude(e.message, "not-the-password")
      assert.notInclude(String(e.cause ?? ""), "not-the-password")
      assert.isBelow(Date.now() - started, 20_000, "it must not wait out the request timeout")
    })
  )

  it.live(
    "a broker certificate that does not verify (no CA given, or another server name) is AuthenticationFailed",
    () =>
      Effect.gen(function* () {
        const sasl = { mechanism: "PLAIN", username: "strata", password: Redacted.make(PASSWORD) } as const
        const noCa = yield* failure({ brokers: [broker], tls: true, sasl })
        assert.strictEqual(noCa.reason._tag, "AuthenticationFailed")
        assert.include(noCa.message, broker)
        assert.match(noCa.message, /certificate/i)
        const otherName = yield* failure({ brokers: [broker], tls: { ca, servername: "kafka.example.com" }, sasl })
        assert.strictEqual(otherName.reason._tag, "AuthenticationFailed")
        assert.include(otherName.message, "kafka.example.com")
      })
  )

  it.live("plaintext to the TLS listener fails at once (InvalidRequest), saying it is a TLS listener", () =>
    Effect.gen(function* () {
      const e = yield* failure({ brokers: [broker], requestTimeout: "5 seconds" })
      assert.strictEqual(e.reason._tag, "InvalidRequest")
      assert.include(e.message, broker)
      assert.include(e.message, "set tls")
    })
  )

  it.live("a bad sasl option is refused naming it, without printing the password", () =>
    Effect.gen(function* () {
      const e = yield* failure({
        brokers: [broker],
        tls: { ca },
        // @ts-expect-error: a mechanism Kafka does not offer here
        sasl: { mechanism: "MD5", username: "strata", password: "hunter2-secret" }
      })
      assert.strictEqual(e.reason._tag, "InvalidRequest")
      assert.include(e.message, "sasl")
      assert.notInclude(e.message, "hunter2-secret")
    })
  )
})
