import { describe, expect, it } from "@effect/vitest"
import { OptionSchemas } from "../src/index.js"
import { Duration, Effect, Schema } from "effect"

const Options = Schema.Struct({
  timeout: OptionSchemas.DurationOption("positive").pipe(
    Schema.withDecodingDefaultKey(Effect.succeed<Duration.Input>("30 seconds"))
  ),
  pause: Schema.optional(OptionSchemas.DurationOption("nonNegative"))
})
const decode = OptionSchemas.decodeOptions(Options, { exact: true })

describe("OptionSchemas.DurationOption", () => {
  it.effect("takes any Duration.Input and gives a Duration; a number is milliseconds; the default applies", () =>
    Effect.gen(function* () {
      expect(Duration.toMillis((yield* decode({})).timeout)).toBe(30_000)
      expect(Duration.toMillis((yield* decode({ timeout: "2 seconds" })).timeout)).toBe(2_000)
      expect(Duration.toMillis((yield* decode({ timeout: 1500 })).timeout)).toBe(1_500)
      expect(Duration.toMillis((yield* decode({ timeout: { minutes: 1 } })).timeout)).toBe(60_000)
      const pause = (yield* decode({ pause: 0 })).pause
      expect(pause === undefined ? undefined : Duration.toMillis(pause)).toBe(0)
    })
  )

  it.effect("refuses what is not a finite duration within its bound, naming the option and its value", () =>
    Effect.gen(function* () {
      const refused = (input: unknown) => Effect.flip(decode(input)).pipe(Effect.map(([first]) => first))
      expect(yield* refused({ timeout: "soon" })).toMatchObject({ option: "timeout", value: '"soon"' })
      expect(yield* refused({ timeout: 0 })).toMatchObject({
        option: "timeout",
        detail: "expected a duration above zero"
      })
      expect(yield* refused({ pause: -1 })).toMatchObject({
        option: "pause",
        detail: "expected a duration of zero or more"
      })
      expect(yield* refused({ timeout: "Infinity" })).toMatchObject({ option: "timeout" })
      expect(yield* refused({ timeoutMs: 10 })).toMatchObject({ option: "timeoutMs" })
    })
  )

  it("encodes back to milliseconds, so a configuration stays JSON", () => {
    expect(Schema.encodeSync(Options)({ timeout: Duration.seconds(3) })).toEqual({ timeout: 3_000 })
  })
})
