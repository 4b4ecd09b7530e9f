/**
 * The processes' settings as `ServerConfig.load` reads them from a file (YAML or JSON), the environment and flags,
 * flags winning over the environment, the environment over the file, the file over the defaults: a duration given as
 * text is a number of milliseconds or a duration such as "6 seconds", and a bad value names its key and the source it
 * came from.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, assert, describe, it } from "@effect/vitest"
import { ReplicationConfig } from "@strata/replica"
import { Duration, Effect } from "effect"
import * as ServerConfig from "../src/ServerConfig.js"

const directory = mkdtempSync(join(tmpdir(), "strata-config-"))
afterAll(() => rmSync(directory, { recursive: true, force: true }))

/** A settings file named `name` holding `text`; its path. */
const file = (name: string, text: string): string => {
  const path = join(directory, name)
  writeFileSync(path, text)
  return path
}

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

  it.effect("flags win over the environment, the environment over the file, the file over the defaults", () =>
    Effect.gen(function* () {
      const yaml = file(
        "precedence.yaml",
        [
          "id: 7",
          "coordination: zookeeper://127.0.0.1:2181",
          "data: /tmp/strata-unused",
          "minInsyncReplicas: 1",
          "sessionTimeout: 5 seconds",
          "fetchMaxWait: 300",
          "rack: from-file",
          ""
        ].join("\n")
      )
      const { settings, replication } = yield* ServerConfig.load(ServerConfig.TabletServerConfig, {
        file: yaml,
        env: { STRATA_MIN_INSYNC_REPLICAS: "2", STRATA_SESSION_TIMEOUT: "6000", STRATA_RACK: "from-env" },
        flags: { minInsyncReplicas: "3", rack: "from-flags" }
      })
      // In all three: the flag's. In the environment and the file: the environment's. Only in the file: the file's.
      assert.strictEqual(replication.minInsyncReplicas, 3)
      assert.strictEqual(settings.rack, "from-flags")
      assert.strictEqual(Duration.toMillis(replication.sessionTimeout), 6_000)
      assert.strictEqual(Duration.toMillis(replication.fetchMaxWait), 300)
      assert.strictEqual(settings.id, 7)
      // Nowhere: the default.
      assert.strictEqual(replication.replicationFactor, 3)
      assert.strictEqual(settings.store, "segments")
    })
  )

  it.effect(
    "a coordinator's rebalance settings: their defaults, a STRATA_REBALANCE_ variable, and a bad one named",
    () =>
      Effect.gen(function* () {
        const base = { id: "101", coordination: "zookeeper://127.0.0.1:2181" }
        const { settings } = yield* ServerConfig.load(ServerConfig.CoordinatorConfig, {
          env: { STRATA_REBALANCE_BATCH_RATIO: "0.5", STRATA_REBALANCE_GATE_WINDOW: "10 seconds" },
          flags: { ...base, rebalanceEnabled: "false" }
        })
        const config = ServerConfig.rebalanceOf(settings)
        assert.strictEqual(config.batchRatio, 0.5)
        assert.strictEqual(Duration.toMillis(config.gateWindow), 10_000)
        assert.isFalse(config.enabled)
        assert.strictEqual(config.maxConcurrentMigrations, 5)
        assert.strictEqual(Duration.toMillis(config.checkInterval), 300_000)
        const bad = yield* Effect.flip(
          ServerConfig.load(ServerConfig.CoordinatorConfig, {
            env: { STRATA_REBALANCE_BATCH_RATIO: "0" },
            flags: base
          })
        )
        assert.match(bad.message, /^rebalanceBatchRatio \(from \$STRATA_REBALANCE_BATCH_RATIO\): "?0"?: /)
        const zero = yield* Effect.flip(
          ServerConfig.load(ServerConfig.CoordinatorConfig, {
            env: {},
            flags: { ...base, rebalanceMaxConcurrentMigrations: "0" }
          })
        )
        assert.include(zero.message, "rebalanceMaxConcurrentMigrations (from flags)")
        // A tablet server does not read them: a file holding one is refused for it, naming the key.
        const forServer = yield* Effect.flip(
          ServerConfig.load(ServerConfig.TabletServerConfig, {
            env: {},
            flags: { id: "1", coordination: "zookeeper://127.0.0.1:2181", data: "/tmp/x", rebalanceBatchRatio: "0.5" }
          })
        )
        assert.include(forServer.message, "rebalanceBatchRatio (from --set): unknown setting")
      })
  )

  it.effect("a YAML file (.yaml, .yml, or by its content) and a JSON one give the same settings", () =>
    Effect.gen(function* () {
      const yaml = [
        "# a tablet server",
        "id: 4",
        "coordination: etcd://127.0.0.1:2379",
        "data: /tmp/strata-unused",
        "store: level",
        "uncleanLeaderElection: true",
        "replicaLagTimeMax: 40 seconds",
        ""
      ].join("\n")
      const json = JSON.stringify({
        id: 4,
        coordination: "etcd://127.0.0.1:2379",
        data: "/tmp/strata-unused",
        store: "level",
        uncleanLeaderElection: true,
        replicaLagTimeMax: "40 seconds"
      })
      const read = (path: string) =>
        Effect.map(ServerConfig.load(ServerConfig.TabletServerConfig, { file: path, env: {}, flags: {} }), (c) => ({
          ...c.settings,
          unclean: c.replication.uncleanLeaderElection,
          lag: Duration.toMillis(c.replication.replicaLagTimeMax)
        }))
      const expected = {
        id: 4,
        coordination: "etcd://127.0.0.1:2379",
        data: "/tmp/strata-unused",
        store: "level",
        httpListen: "127.0.0.1:0",
        logFormat: "pretty",
        unclean: true,
        lag: 40_000
      }
      for (const path of [
        file("server.yaml", yaml),
        file("server.yml", yaml),
        file("server-yaml.conf", yaml),
        file("server.json", json),
        file("server-json.conf", json)
      ]) {
        assert.deepStrictEqual(yield* read(path), expected, path)
      }
    })
  )

  it.effect("a YAML syntax error names the file and the line", () =>
    Effect.gen(function* () {
      const path = file("broken.yaml", "id: 1\ncoordination: zookeeper://127.0.0.1:2181\ndata: 'unclosed\n")
      const error = yield* Effect.flip(
        ServerConfig.load(ServerConfig.TabletServerConfig, { file: path, env: {}, flags: {} })
      )
      assert.strictEqual(error._tag, "InvalidConfig")
      assert.strictEqual(error.key, "--config")
      assert.strictEqual(error.source, path)
      assert.include(error.message, `--config (from ${path}): not valid YAML`)
      assert.match(error.message, /at line 4, column 1/)
      const duplicate = file("duplicate.yml", "id: 1\nrack: a\nrack: b\n")
      const twice = yield* Effect.flip(
        ServerConfig.load(ServerConfig.TabletServerConfig, { file: duplicate, env: {}, flags: {} })
      )
      assert.include(twice.message, `--config (from ${duplicate})`)
      assert.match(twice.message, /unique at line 3/)
    })
  )

  it.effect("an unknown key, in the file or in --set, is refused naming it and listing the known ones", () =>
    Effect.gen(function* () {
      const path = file("unknown.yaml", "id: 1\nminInsync: 2\n")
      const fromFile = yield* Effect.flip(
        ServerConfig.load(ServerConfig.CoordinatorConfig, { file: path, env: {}, flags: {} })
      )
      assert.strictEqual(fromFile.message.split(" (known: ")[0], `minInsync (from ${path}): unknown setting`)
      const fromFlags = yield* Effect.flip(
        ServerConfig.load(ServerConfig.CoordinatorConfig, { env: {}, flags: { minInsync: "2" } })
      )
      assert.strictEqual(fromFlags.message.split(" (known: ")[0], "minInsync (from --set): unknown setting")
      for (const known of ["rejoinBackoff", "minInsyncReplicas", "coordination", "id"]) {
        assert.include(fromFlags.message, known)
      }
      // The coordinator reads no data directory.
      assert.notInclude(fromFlags.message, "dataListen")
      // A key the environment has and no process reads is not a setting: it is left alone.
      yield* ServerConfig.load(ServerConfig.CoordinatorConfig, {
        env: { STRATA_MIN_INSYNC: "2" },
        flags: { id: "1", coordination: server.coordination }
      })
    })
  )

  it.effect(
    "the ops endpoint's address and the log format are settings like the others: checked, naming their source",
    () =>
      Effect.gen(function* () {
        const { settings } = yield* ServerConfig.load(ServerConfig.TabletServerConfig, { env: {}, flags: server })
        assert.strictEqual(settings.httpListen, "127.0.0.1:0", "loopback, any free port, by default")
        assert.strictEqual(settings.logFormat, "pretty")
        const set = yield* ServerConfig.load(ServerConfig.CoordinatorConfig, {
          env: { STRATA_HTTP_LISTEN: "0.0.0.0:9124", STRATA_LOG_FORMAT: "json" },
          flags: { id: "101", coordination: server.coordination }
        })
        assert.strictEqual(set.settings.httpListen, "0.0.0.0:9124")
        assert.strictEqual(set.settings.logFormat, "json")
        const bad = yield* Effect.flip(
          ServerConfig.load(ServerConfig.TabletServerConfig, {
            env: { STRATA_HTTP_LISTEN: "metrics-please" },
            flags: server
          })
        )
        assert.strictEqual(bad.key, "httpListen")
        assert.strictEqual(bad.source, "$STRATA_HTTP_LISTEN")
        assert.include(bad.message, "expected host:port")
        const format = yield* Effect.flip(
          ServerConfig.load(ServerConfig.TabletServerConfig, { env: {}, flags: { ...server, logFormat: "xml" } })
        )
        assert.strictEqual(format.key, "logFormat")
      })
  )

  it.effect("a bad value names the source it came from: the file, $STRATA_X, flags, or defaults", () =>
    Effect.gen(function* () {
      const path = file(
        "bad.yaml",
        "id: 1\ncoordination: zookeeper://127.0.0.1:2181\ndata: /tmp/x\nreplicationFactor: many\n"
      )
      const load = (sources: ServerConfig.Sources) =>
        Effect.flip(ServerConfig.load(ServerConfig.TabletServerConfig, sources))
      const inFile = yield* load({ file: path, env: {}, flags: {} })
      assert.strictEqual(inFile.message, `replicationFactor (from ${path}): "many": expected a number`)
      const inEnv = yield* load({ file: path, env: { STRATA_REPLICATION_FACTOR: "0" }, flags: {} })
      assert.strictEqual(inEnv.key, "replicationFactor")
      assert.strictEqual(inEnv.source, "$STRATA_REPLICATION_FACTOR")
      const inFlags = yield* load({ file: path, env: { STRATA_ID: "2" }, flags: { id: "x" } })
      assert.strictEqual(inFlags.message, 'id (from flags): "x": expected a number')
      const badEnvId = yield* load({
        env: { STRATA_ID: "-1" },
        flags: { coordination: server.coordination, data: "d" }
      })
      assert.strictEqual(badEnvId.source, "$STRATA_ID")
      assert.include(badEnvId.message, "greater than or equal to 0")
      const missing = yield* load({ env: {}, flags: { id: "1", coordination: server.coordination } })
      assert.strictEqual(missing.message, "data (from defaults): required")
      const list = file("list.yaml", "id: 1\nsessionTimeout: [1, 2]\n")
      const notValue = yield* load({ file: list, env: {}, flags: {} })
      assert.strictEqual(notValue.key, "sessionTimeout")
      assert.strictEqual(notValue.source, list)
    })
  )

  it.effect("a variable only some others start with (STRATA_DATA of STRATA_DATA_LISTEN) does not hide the file's", () =>
    Effect.gen(function* () {
      const path = file("data.yaml", "data: /tmp/strata-from-file\n")
      const { settings } = yield* ServerConfig.load(ServerConfig.TabletServerConfig, {
        file: path,
        env: { STRATA_DATA_LISTEN: "127.0.0.1:0", STRATA_ID: "3", STRATA_COORDINATION: server.coordination },
        flags: {}
      })
      assert.strictEqual(settings.data, "/tmp/strata-from-file")
      assert.strictEqual(settings.dataListen, "127.0.0.1:0")
      assert.strictEqual(settings.id, 3)
    })
  )

  it.effect("the settings list has every key the processes read, with the variable the environment is read at", () =>
    Effect.gen(function* () {
      const list = ServerConfig.settingsList()
      const keys = list.map((s) => s.key)
      const expected = new Set([
        ...Object.keys(ServerConfig.TabletServerConfig.fields),
        ...Object.keys(ServerConfig.CoordinatorConfig.fields),
        ...Object.keys(ServerConfig.AdminConfig.fields),
        ...Object.keys(ReplicationConfig.ReplicationConfig.fields)
      ])
      assert.deepStrictEqual(new Set(keys), expected)
      assert.strictEqual(keys.length, expected.size)
      for (const setting of list) {
        assert.strictEqual(setting.env, ServerConfig.envName(setting.key))
        assert.isAbove(setting.description.length, 10, setting.key)
      }
      const byKey = new Map(list.map((s) => [s.key, s]))
      assert.deepInclude(byKey.get("sessionTimeout"), { env: "STRATA_SESSION_TIMEOUT", default: "10 seconds" })
      assert.deepInclude(byKey.get("id"), { required: true, default: undefined })
      assert.deepStrictEqual(byKey.get("id")?.readBy, ["tablet-server", "coordinator"])
      assert.deepStrictEqual(byKey.get("data")?.readBy, ["tablet-server"])
      assert.deepStrictEqual(byKey.get("bootstrap")?.readBy, ["operator"])
      assert.strictEqual(byKey.get("bootstrap")?.env, "STRATA_BOOTSTRAP")
      assert.deepInclude(byKey.get("rack"), { required: false, default: undefined })
      assert.deepInclude(byKey.get("store"), { required: false, default: "segments" })
      assert.deepInclude(byKey.get("segmentBytes"), { required: false, default: "268435456" })
      assert.deepInclude(byKey.get("rejoinBackoff"), { default: "1 second" })
      // Each listed variable is where the environment source reads its key: a bad value there names it.
      for (const key of ["id", "sessionTimeout", "minInsyncReplicas", "leaderImbalanceCheckInterval", "logFormat"]) {
        const env = byKey.get(key)!.env
        const flags =
          key === "id" ? { coordination: server.coordination } : { id: "1", coordination: server.coordination }
        const error = yield* Effect.flip(
          ServerConfig.load(ServerConfig.CoordinatorConfig, { env: { [env]: "not-a-value" }, flags })
        )
        assert.strictEqual(error.source, `$${env}`, key)
      }
    })
  )
})
