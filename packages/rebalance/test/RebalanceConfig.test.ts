import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Schema } from "effect"
import { RebalanceConfig } from "../src/index.js"

const refused = (input: unknown) => Effect.flip(RebalanceConfig.decode(input))

describe("RebalanceConfig", () => {
  it.effect("fills every default", () =>
    Effect.gen(function* () {
      const c = yield* RebalanceConfig.decode({})
      assert.deepStrictEqual(
        {
          ...c,
          checkInterval: Duration.toMillis(c.checkInterval),
          cooldown: Duration.toMillis(c.cooldown),
          moveTimeout: Duration.toMillis(c.moveTimeout),
          gateWindow: Duration.toMillis(c.gateWindow)
        },
        {
          checkInterval: 300_000,
          triggerThreshold: 0.1,
          cooldown: 600_000,
          batchRatio: 0.2,
          maxConcurrentMigrations: 5,
          maxClusterMigrations: 50,
          throttleBytesPerSec: 0,
          moveTimeout: 600_000,
          gateWindow: 30_000,
          gateLatencyFactor: 2,
          enabled: true
        }
      )
      const made = yield* RebalanceConfig.make()
      assert.deepStrictEqual(Schema.encodeSync(RebalanceConfig.RebalanceConfig)(made), {
        ...Schema.encodeSync(RebalanceConfig.RebalanceConfig)(RebalanceConfig.defaults)
      })
    })
  )

  it.effect("takes the bounds' edges and any Duration.Input, and encodes durations back to milliseconds", () =>
    Effect.gen(function* () {
      const c = yield* RebalanceConfig.make({
        checkInterval: "2 seconds",
        triggerThreshold: 10,
        cooldown: 0,
        batchRatio: 1,
        maxConcurrentMigrations: 1,
        maxClusterMigrations: 1,
        throttleBytesPerSec: 1_048_576,
        moveTimeout: { minutes: 3 },
        gateWindow: 250,
        gateLatencyFactor: 1,
        enabled: false
      })
      assert.deepStrictEqual(
        [c.checkInterval, c.cooldown, c.moveTimeout, c.gateWindow].map(Duration.toMillis),
        [2_000, 0, 180_000, 250]
      )
      assert.deepStrictEqual(
        [c.triggerThreshold, c.batchRatio, c.throttleBytesPerSec, c.gateLatencyFactor, c.enabled],
        [10, 1, 1_048_576, 1, false]
      )
      const encoded = Schema.encodeSync(RebalanceConfig.RebalanceConfig)(c)
      assert.deepStrictEqual([encoded.checkInterval, encoded.moveTimeout], [2_000, 180_000])
    })
  )

  it.effect("refuses each bad value, naming the key and the value", () =>
    Effect.gen(function* () {
      const cases: ReadonlyArray<readonly [Record<string, unknown>, string, string]> = [
        [{ batchRatio: 0 }, "batchRatio", "0"],
        [{ batchRatio: 1.5 }, "batchRatio", "1.5"],
        [{ maxConcurrentMigrations: 0 }, "maxConcurrentMigrations", "0"],
        [{ maxConcurrentMigrations: 2.5 }, "maxConcurrentMigrations", "2.5"],
        [{ maxClusterMigrations: -1 }, "maxClusterMigrations", "-1"],
        [{ triggerThreshold: -1 }, "triggerThreshold", "-1"],
        [{ triggerThreshold: 0 }, "triggerThreshold", "0"],
        [{ triggerThreshold: 10.5 }, "triggerThreshold", "10.5"],
        [{ triggerThreshold: Number.NaN }, "triggerThreshold", "NaN"],
        [{ throttleBytesPerSec: -1 }, "throttleBytesPerSec", "-1"],
        [{ gateLatencyFactor: 0.5 }, "gateLatencyFactor", "0.5"],
        [{ gateLatencyFactor: Number.POSITIVE_INFINITY }, "gateLatencyFactor", "Infinity"],
        [{ checkInterval: "soon" }, "checkInterval", '"soon"'],
        [{ checkInterval: 0 }, "checkInterval", "0"],
        [{ moveTimeout: "0 seconds" }, "moveTimeout", '"0 seconds"'],
        [{ cooldown: -1 }, "cooldown", "-1"],
        [{ gateWindow: "Infinity" }, "gateWindow", '"Infinity"'],
        [{ enabled: "yes" }, "enabled", '"yes"'],
        [{ batchSize: 10 }, "batchSize", "10"]
      ]
      for (const [input, option, value] of cases) {
        const e = yield* refused(input)
        assert.strictEqual(e._tag, "InvalidRebalanceOptions", JSON.stringify(input))
        assert.strictEqual(e.option, option, String(input[option]))
        assert.strictEqual(e.value, value, option)
        assert.include(e.message, `invalid rebalance option ${option} = ${value}: `)
      }
    })
  )

  it.effect("names the first bad key and lists the others in the detail", () =>
    Effect.gen(function* () {
      const e = yield* refused({ batchRatio: 0, maxConcurrentMigrations: 0 })
      assert.strictEqual(e.option, "batchRatio")
      assert.include(e.detail, "also maxConcurrentMigrations = 0")
      const notObject = yield* refused("fast")
      assert.strictEqual(notObject.option, "options")
    })
  )
})
