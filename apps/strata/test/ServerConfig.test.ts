/**
 * The processes' settings as `ServerConfig.load` merges them from a file, the environment and flags: a duration
 * given as text is a number of milliseconds or a duration such as "6 seconds", and a bad one names its key and the
 * source it came from.
 */
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect } from "effect"
import * as ServerConfig from "../src/ServerConfig.js"

const server = { id: "1", coordination: "zookeeper://127.0.0.1:2181", data: "/tmp/strata-unused" }

describe("ServerConfig", () => {
  it("a setting's environment variable is STRATA_ and its key in upper snake case", () => {
    assert.strictEqual(ServerConfig.envName("sessionTimeout"), "STRATA_SESSION_TIMEOUT")
    assert.strictEqual(ServerConfig.envName("minInsyncReplicas"), "STRATA_MIN_INSYNC_REPLICAS")
  })

  it.effect("a duration from the environment or a flag is a number of milliseconds or a duration's text", () =>
    Effect.gen(function* () {
      const { replication } = yield* ServerConfig.load(ServerConfig.TabletServerConfig, {
        env: { STRATA_SESSION_TIMEOUT: "6 seconds", STRATA_REPLICA_LAG_TIME_MAX: "30000" },
        flags: { ...server, fetchMaxWait: "250 millis" }
      })
      assert.deepStrictEqual(
        [replication.sessionTimeout, replication.replicaLagTimeMax, replication.fetchMaxWait].map(Duration.toMillis),
        [6_000, 30_000, 250]
      )
      const { settings } = yield* ServerConfig.load(ServerConfig.CoordinatorConfig, {
        env: {},
        flags: { id: "101", coordination: server.coordination, rejoinBackoff: "2 seconds" }
      })
      const rejoin = settings.rejoinBackoff
      assert.strictEqual(rejoin === undefined ? undefined : Duration.toMillis(rejoin), 2_000)
    })
  )

  it.effect("a bad duration names its key and where it came from", () =>
    Effect.gen(function* () {
      const soon = yield* Effect.flip(
        ServerConfig.load(ServerConfig.TabletServerConfig, { env: { STRATA_SESSION_TIMEOUT: "soon" }, flags: server })
      )
      assert.strictEqual(soon.key, "sessionTimeout")
      assert.strictEqual(soon.source, "$STRATA_SESSION_TIMEOUT")
      assert.include(soon.message, "sessionTimeout (from $STRATA_SESSION_TIMEOUT)")
      const negative = yield* Effect.flip(
        ServerConfig.load(ServerConfig.CoordinatorConfig, {
          env: {},
          flags: { id: "101", coordination: server.coordination, rejoinBackoff: "-1" }
        })
      )
      assert.strictEqual(negative.key, "rejoinBackoff")
      assert.strictEqual(negative.source, "flags")
      assert.include(negative.message, "expected a duration above zero")
    })
  )
})
