import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Schema } from "effect"
import * as ReplicationConfig from "../src/wire/ReplicationConfig.js"

const refused = (input: unknown) => Effect.flip(ReplicationConfig.decode(input))

describe("ReplicationConfig", () => {
  it.effect("fills every default, and the defaults keep the rules", () =>
    Effect.gen(function* () {
      const c = yield* ReplicationConfig.decode({})
      assert.deepStrictEqual(
        [
          c.replicationFactor,
          c.minInsyncReplicas,
          Duration.toMillis(c.sessionTimeout),
          Duration.toMillis(c.replicaLagTimeMax)
        ],
        [3, 2, 10_000, 30_000]
      )
      assert.isFalse(c.uncleanLeaderElection)
      assert.strictEqual(c.leaderElection, "first-in-isr")
    })
  )

  it.effect("a session timeout at or above replicaLagTimeMax is refused, naming the key and why (Fluss #2708)", () =>
    Effect.gen(function* () {
      const e = yield* refused({ sessionTimeout: 30_000 })
      assert.strictEqual(e.option, "replicaLagTimeMax")
      assert.include(e.message, "must be above sessionTimeout (30s)")
      assert.include(e.message, "before a dead leader's session ends")
    })
  )

  it.effect("minInsyncReplicas above the replication factor, non-positive numbers and unknown keys are refused", () =>
    Effect.gen(function* () {
      const over = yield* refused({ minInsyncReplicas: 4, replicationFactor: 3 })
      assert.strictEqual(over.option, "minInsyncReplicas")
      assert.include(over.message, "at most replicationFactor (3)")
      const zero = yield* refused({ minInsyncReplicas: 0 })
      assert.strictEqual(zero.option, "minInsyncReplicas")
      assert.strictEqual(zero.value, "0")
      const typo = yield* refused({ minIsr: 2 })
      assert.strictEqual(typo.option, "minIsr")
      const wait = yield* refused({ fetchMaxWait: 20_000 })
      assert.strictEqual(wait.option, "fetchMaxWait")
      const election = yield* refused({ leaderElection: "longest" })
      assert.strictEqual(election.option, "leaderElection")
      assert.strictEqual(election.value, '"longest"')
    })
  )

  it.effect("a fetchMaxBytes no data link frame can carry is refused, naming both values", () =>
    Effect.gen(function* () {
      // The data link's frames are at most 64 MiB (67 108 864 bytes); an answer needs 1 024 of them for its header.
      const over = yield* refused({ fetchMaxBytes: 64 * 1024 * 1024 })
      assert.strictEqual(over.option, "fetchMaxBytes")
      assert.strictEqual(over.value, "67108864")
      assert.include(over.message, "must be at most 67107840")
      assert.include(over.message, "frame limit of 67108864 bytes")
      const most = yield* ReplicationConfig.decode({ fetchMaxBytes: 67_107_840 })
      assert.strictEqual(most.fetchMaxBytes, 67_107_840)
    })
  )

  it.effect("a duration takes any Duration.Input (a number is milliseconds) and encodes back to milliseconds", () =>
    Effect.gen(function* () {
      const c = yield* ReplicationConfig.decode({
        sessionTimeout: "2 seconds",
        replicaLagTimeMax: { seconds: 6 },
        fetchMaxWait: 250,
        leaderImbalanceCheckInterval: 0
      })
      assert.deepStrictEqual(
        [c.sessionTimeout, c.replicaLagTimeMax, c.fetchMaxWait, c.leaderImbalanceCheckInterval].map(Duration.toMillis),
        [2_000, 6_000, 250, 0]
      )
      const encoded = Schema.encodeSync(ReplicationConfig.ReplicationConfig)(c)
      assert.deepStrictEqual(
        [encoded.sessionTimeout, encoded.replicaLagTimeMax, encoded.producerIdExpiration],
        [2_000, 6_000, 86_400_000]
      )
      const fetchWait = yield* refused({ fetchMaxWait: "20 seconds" })
      assert.strictEqual(fetchWait.option, "fetchMaxWait")
      assert.include(fetchWait.message, "must be below half of replicaLagTimeMax (30s)")
    })
  )

  it.effect("a bad duration is refused, naming its key and value", () =>
    Effect.gen(function* () {
      const soon = yield* refused({ sessionTimeout: "soon" })
      assert.strictEqual(soon.option, "sessionTimeout")
      assert.strictEqual(soon.value, '"soon"')
      const negative = yield* refused({ retryBackoff: -1 })
      assert.strictEqual(negative.option, "retryBackoff")
      assert.include(negative.message, "expected a duration above zero")
      const never = yield* refused({ leaderImbalanceCheckInterval: -1 })
      assert.strictEqual(never.option, "leaderImbalanceCheckInterval")
      assert.include(never.message, "expected a duration of zero or more")
      const old = yield* refused({ sessionTimeoutMs: 6_000 })
      assert.strictEqual(old.option, "sessionTimeoutMs")
    })
  )
})
