import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect, Fiber, Logger, Schedule } from "effect"
import { TestClock } from "effect/testing"
import { Retry } from "../src/index.js"

/** An effect failing `fails` times (recording when each try ran), then succeeding with the tries it took. */
const flaky = (fails: number) => {
  const at: Array<number> = []
  const self = Effect.gen(function* () {
    at.push(yield* Clock.currentTimeMillis)
    if (at.length <= fails) return yield* Effect.fail(new Error(`try ${at.length} failed`))
    return at.length
  })
  return { self, at }
}

/** Runs `self` in a fiber, moving the TestClock on until it ends. */
const settle = <A, E>(self: Effect.Effect<A, E>) =>
  Effect.gen(function* () {
    const fiber = yield* Effect.forkChild(Effect.exit(self))
    for (let i = 0; i < 200 && fiber.pollUnsafe() === undefined; i++) yield* TestClock.adjust("100 millis")
    return yield* Fiber.join(fiber)
  })

describe("Retry", () => {
  it.effect("tries again on the schedule until it works", () =>
    Effect.gen(function* () {
      const { self, at } = flaky(3)
      const exit = yield* settle(Retry.retry(self, { schedule: Schedule.spaced("1 second") }))
      assert.deepStrictEqual(exit._tag === "Success" && exit.value, 4)
      assert.deepStrictEqual(at, [0, 1000, 2000, 3000])
    })
  )

  it.effect("backoff doubles its pause up to the most", () =>
    Effect.gen(function* () {
      const { self, at } = flaky(5)
      yield* settle(Retry.retry(self, { schedule: Retry.backoff("100 millis", "500 millis") }))
      assert.deepStrictEqual(at, [0, 100, 300, 700, 1200, 1700])
    })
  )

  it.effect("gives up past the deadline, or after so many retries, with the last failure", () =>
    Effect.gen(function* () {
      const late = flaky(100)
      const timedOut = yield* settle(
        Retry.retry(late.self, { schedule: Schedule.spaced("1 second"), deadline: "2500 millis" })
      )
      assert.strictEqual(timedOut._tag, "Failure")
      assert.deepStrictEqual(late.at, [0, 1000, 2000, 3000])
      const counted = flaky(100)
      const out = yield* settle(Retry.retry(counted.self, { schedule: Schedule.spaced("1 second"), times: 2 }))
      assert.strictEqual(out._tag === "Failure" && String(out.cause).includes("try 3 failed"), true)
      assert.strictEqual(counted.at.length, 3)
    })
  )

  it.effect("retries only what `while` accepts, and says why every so often", () =>
    Effect.gen(function* () {
      const lines: Array<string> = []
      const logger = Logger.make(({ message }) => {
        lines.push(String(Array.isArray(message) ? message[0] : message))
      })
      const { self, at } = flaky(5)
      const exit = yield* settle(
        Retry.retry(self, {
          schedule: Schedule.spaced("10 millis"),
          while: (e) => e.message !== "try 4 failed",
          tell: { what: () => "asking", every: 2 }
        }).pipe(Effect.provide(Logger.layer([logger])))
      )
      assert.strictEqual(exit._tag === "Failure" && String(exit.cause).includes("try 4 failed"), true)
      assert.strictEqual(at.length, 4)
      assert.deepStrictEqual(lines, [
        "asking failed (1 try): try 1 failed",
        "asking failed (2 tries): try 2 failed",
        "asking failed (4 tries): try 4 failed"
      ])
    })
  )
})
