import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { execFile } from "node:child_process"
import { fileURLToPath } from "node:url"
import { ServerStorage } from "@strata/replica"
import * as RocksDbStore from "@strata/store-adapters/rocksdb"
import { Effect, Layer, type Scope } from "effect"
import { describe, expect, it } from "vitest"

const bin = fileURLToPath(new URL("../src/bin.ts", import.meta.url))
const tsx = fileURLToPath(new URL("../../../node_modules/.bin/tsx", import.meta.url))

const strata = (args: ReadonlyArray<string>) =>
  new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
    execFile(tsx, ["--conditions=@strata/source", bin, ...args], { timeout: 60_000 }, (error, stdout, stderr) => {
      resolve({ code: error ? (typeof error.code === "number" ? error.code : 1) : 0, stdout, stderr })
    })
  })

/** Stack frame lines, as `Error.stack` prints them. */
const STACK_FRAME = /^\s+at \S/m

/** A failed run reported as one line on stderr, without a stack trace. */
const expectOneLineFailure = (r: { code: number; stdout: string; stderr: string }) => {
  expect(r.code).not.toBe(0)
  expect(r.stderr.trimEnd().split("\n"), r.stderr).toHaveLength(1)
  expect(r.stderr).not.toMatch(STACK_FRAME)
  expect(r.stderr).toMatch(/^strata[ :]/)
  return r.stderr.trim()
}

// Each case starts the CLI under tsx, a few seconds apiece on a loaded machine: the cases get more than the default.
describe("strata CLI (a real child process)", { timeout: 120_000 }, () => {
  it("--version prints the version in the CLI's package.json", async () => {
    const { version } = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8"))
    const r = await strata(["--version"])
    expect(r.code).toBe(0)
    expect(r.stdout.trim()).toBe(`strata v${version}`)
  })

  it("demo writes, restarts and restores the table", async () => {
    const r = await strata(["demo", "--partitions", "3", "--text", "one two two three three three"])
    expect(r.stderr).toBe("")
    expect(r.code).toBe(0)
    expect(r.stdout).toContain("Counted 6 words: 3 distinct words, 6 changelog records")
    expect(r.stdout).toContain("OK: all 3 words restored from 6 changelog records")
  })

  it("demo --store level keeps the table in a LevelDB directory across the restart", async () => {
    const dir = mkdtempSync(join(tmpdir(), "strata-cli-"))
    try {
      const r = await strata([
        "demo",
        "--store",
        "level",
        "--data-dir",
        dir,
        "--partitions",
        "2",
        "--text",
        "a b b c c c"
      ])
      expect(r.code).toBe(0)
      expect(r.stdout).toContain("store: level")
      expect(r.stdout).toContain("OK: all 3 words restored from 6 changelog records")
      // Partition 0 persisted its offset before the restart: nothing to replay there.
      expect(r.stdout).toMatch(/partition 0: replayed 0 records/)
      expect(readdirSync(dir)).toContain("CURRENT")
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })

  it("coordinators: the leader is killed and another takes over with a higher epoch", async () => {
    const r = await strata(["coordinators"])
    expect(r.code).toBe(0)
    expect(r.stdout).toMatch(/Became coordinator leader: server \d with epoch 1/)
    expect(r.stdout).toMatch(/Became coordinator leader: server \d with epoch 2 \(took over in \d+ ms\)/)
    expect(r.stdout).toContain("The killed leader's write is refused: FencedEpoch")
    expect(r.stdout).toContain("OK: server")
    // Three Coordinators: each logs its standby start; each leader starts its two services in order and
    // the killed leader stops them in reverse.
    expect(r.stdout.match(/standby start/g)).toHaveLength(3)
    expect(r.stdout.match(/leader services started/g)).toHaveLength(2)
    const killed = /Killing the leader \(server (\d)\)/.exec(r.stdout)?.[1]
    expect(r.stdout).toContain(
      `  server ${killed}: channel-manager started (epoch 1)\n  server ${killed}: event-processor started (epoch 1)`
    )
    expect(r.stdout).toContain(
      `  server ${killed}: event-processor stopped\n  server ${killed}: channel-manager stopped`
    )
    expect(r.stdout).toMatch(/server \d: channel-manager started \(epoch 2\)/)
  })

  it("rejects a bad flag value with a message that names it", async () => {
    const r = await strata(["demo", "--partitions", "0"])
    expect(r.code).not.toBe(0)
    expect(`${r.stdout}${r.stderr}`).toMatch(/partitions/)
    const s = await strata(["demo", "--store", "floppy"])
    expect(s.code).not.toBe(0)
    expect(`${s.stdout}${s.stderr}`).toMatch(/store/)
  })

  it("a bad flag value is one line on stderr naming the flag and where the flags are listed, without the help", async () => {
    const r = await strata(["demo", "--partitions", "0"])
    const line = expectOneLineFailure(r)
    expect(line).toContain("--partitions")
    expect(line).toContain('"0"')
    expect(line).toContain("strata demo --help")
    expect(r.stdout).toBe("")
    expect(r.code, "a bad invocation exits 2").toBe(2)
    const b = await strata(["demo", "--brokers", "127.0.0.1:99999"])
    expect(expectOneLineFailure(b)).toContain("--brokers")
    expect(b.stdout).toBe("")
  })

  it("--brokers with --log memory is rejected with one line saying which flag to drop", async () => {
    const r = await strata(["demo", "--log", "memory", "--brokers", "127.0.0.1:9092", "--partitions", "1"])
    const line = expectOneLineFailure(r)
    expect(line).toContain("--brokers")
    expect(line).toContain("--log memory")
    expect(r.stdout).not.toContain("OK:")
  })

  it("--brokers alone implies --log kafka: the demo goes to the named brokers (none answers here)", async () => {
    const r = await strata(["demo", "--brokers", "127.0.0.1:1", "--partitions", "1"])
    const line = expectOneLineFailure(r)
    expect(line).toContain("cannot reach brokers 127.0.0.1:1")
    expect(line).toContain("./dev services up kafka")
    expect(r.stdout).not.toContain("OK:")
    expect(r.code, "a failure that is not a usage error exits 1").toBe(1)
  })

  it("--data-dir with the memory store is rejected with one line naming the stores that read it", async () => {
    const r = await strata(["demo", "--data-dir", join(tmpdir(), "strata-cli-unused"), "--partitions", "1"])
    const line = expectOneLineFailure(r)
    expect(line).toContain("--data-dir")
    expect(line).toContain("--store level")
    expect(r.stdout).not.toContain("OK:")
    const m = await strata(["demo", "--store", "memory", "--data-dir", "x", "--partitions", "1"])
    expect(expectOneLineFailure(m)).toContain("--data-dir")
  })

  it("a failing run is one line naming what failed and what to do; --verbose adds the full cause", async () => {
    const dir = mkdtempSync(join(tmpdir(), "strata-cli-"))
    const file = join(dir, "not-a-directory")
    writeFileSync(file, "x")
    try {
      const r = await strata(["demo", "--store", "level", "--data-dir", file, "--partitions", "1"])
      const line = expectOneLineFailure(r)
      expect(line).toContain(file)
      expect(line).toContain("--data-dir")
      expect(line).toContain("--verbose")
      const v = await strata(["demo", "--store", "level", "--data-dir", file, "--partitions", "1", "--verbose"])
      expect(v.code).not.toBe(0)
      expect(v.stderr.startsWith(`${line}\n`), v.stderr).toBe(true)
      expect(v.stderr.trimEnd().split("\n").length).toBeGreaterThan(1)
      expect(v.stderr).toMatch(STACK_FRAME)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })

  it("--verbose is listed in the help", async () => {
    const r = await strata(["demo", "--help"])
    expect(r.code).toBe(0)
    expect(r.stdout).toContain("--verbose")
  })
  it("demo --log strata keeps the source topic and the changelog on a Strata cluster started on loopback", async () => {
    const r = await strata(["demo", "--log", "strata", "--partitions", "3", "--text", "one two two three three three"])
    expect(r.stderr).toBe("")
    expect(r.code).toBe(0)
    expect(r.stdout).toContain("on strata")
    expect(r.stdout).toContain("OK: all 3 words restored from 6 changelog records")
  })

  it("a server's bad setting is one line naming the setting and where it came from", async () => {
    const data = mkdtempSync(join(tmpdir(), "strata-cli-"))
    try {
      const zk = "zookeeper://127.0.0.1:1"
      const badId = expectOneLineFailure(
        await strata(["tablet-server", "--set", "id=x", "--coordination", zk, "--data", data])
      )
      expect(badId).toContain('id (from flags): "x": expected a number')
      const rule = expectOneLineFailure(
        await strata([
          "tablet-server",
          "--id",
          "1",
          "--coordination",
          zk,
          "--data",
          data,
          "--set",
          "minInsyncReplicas=5"
        ])
      )
      expect(rule).toContain("minInsyncReplicas (from flags)")
      expect(rule).toContain("at most replicationFactor")
      const missing = expectOneLineFailure(await strata(["coordinator", "--id", "101"]))
      expect(missing).toContain("coordination")
      const url = expectOneLineFailure(await strata(["coordinator", "--id", "101", "--coordination", "zk://nowhere"]))
      expect(url).toContain("zookeeper://host:port")
      const unknown = expectOneLineFailure(
        await strata(["coordinator", "--id", "101", "--coordination", zk, "--set", "minInsync=2"])
      )
      expect(unknown).toContain("minInsync (from --set): unknown setting")
      const file = join(data, "server.json")
      writeFileSync(file, JSON.stringify({ id: 1, coordination: zk, data, sessionTimeout: 40_000 }))
      const fromFile = expectOneLineFailure(await strata(["tablet-server", "--config", file]))
      expect(fromFile).toContain(`replicaLagTimeMax (from defaults)`)
      expect(fromFile).toContain("must be above sessionTimeout (40s)")
      const yaml = join(data, "server.yaml")
      writeFileSync(yaml, `id: 1\ncoordination: ${zk}\ndata: ${data}\nstore: [level\n`)
      const broken = expectOneLineFailure(await strata(["tablet-server", "--config", yaml]))
      expect(broken).toContain(`--config (from ${yaml}): not valid YAML`)
      expect(broken).toMatch(/at line \d+/)
      // Nothing was written to the data directory by a run refused before it started.
      expect(readdirSync(data).sort()).toEqual(["server.json", "server.yaml"])
    } finally {
      rmSync(data, { recursive: true, force: true })
    }
  })

  it("a typed flag's bad value is a usage error (exit 2) naming the flag; --help marks the required settings", async () => {
    const zk = "zookeeper://127.0.0.1:1"
    const id = await strata([
      "tablet-server",
      "--id",
      "x",
      "--coordination",
      zk,
      "--data",
      join(tmpdir(), "strata-cli-unused")
    ])
    const line = expectOneLineFailure(id)
    expect(line).toContain("--id")
    expect(line).toContain('"x"')
    expect(id.code).toBe(2)
    const store = await strata(["tablet-server", "--id", "1", "--store", "floppy", "--coordination", zk])
    expect(expectOneLineFailure(store)).toContain("--store")
    expect(store.code).toBe(2)
    const format = await strata(["coordinator", "--id", "1", "--log-format", "xml", "--coordination", zk])
    expect(expectOneLineFailure(format)).toContain("--log-format")
    expect(format.code).toBe(2)
    const help = await strata(["tablet-server", "--help"])
    expect(help.code).toBe(0)
    for (const [flag, env] of [
      ["--id", "STRATA_ID"],
      ["--coordination", "STRATA_COORDINATION"],
      ["--data", "STRATA_DATA"]
    ]) {
      const described = help.stdout.split("\n").find((l) => l.trimStart().startsWith(`${flag} `))
      expect(described, flag).toContain(`(required: here, in --config or as ${env})`)
    }
    const rack = help.stdout.split("\n").find((l) => l.trimStart().startsWith("--rack "))
    expect(rack).not.toContain("required")
  })

  it("config list prints every setting with its environment variable, default and readers; --output json parses", async () => {
    const r = await strata(["config", "list"])
    expect(r.stderr).toBe("")
    expect(r.code).toBe(0)
    const lines = r.stdout.trimEnd().split("\n")
    expect(lines[0]).toMatch(/^KEY\s+ENV\s+DEFAULT\s+READ BY\s+MEANING$/)
    const row = (key: string) => lines.find((l) => l.startsWith(`${key} `))
    expect(row("sessionTimeout")).toMatch(
      /^sessionTimeout\s+STRATA_SESSION_TIMEOUT\s+10 seconds\s+tablet-server,coordinator,operator\s+\S/
    )
    expect(row("id")).toMatch(/^id\s+STRATA_ID\s+required\s+tablet-server,coordinator\s+\S/)
    expect(row("data")).toMatch(/^data\s+STRATA_DATA\s+required\s+tablet-server\s+\S/)
    expect(row("rack")).toMatch(/^rack\s+STRATA_RACK\s+none\s+/)
    expect(row("rejoinBackoff")).toMatch(/^rejoinBackoff\s+STRATA_REJOIN_BACKOFF\s+1 second\s+coordinator\s+\S/)
    const j = await strata(["config", "list", "--output", "json"])
    expect(j.code).toBe(0)
    const settings = JSON.parse(j.stdout) as ReadonlyArray<{
      readonly key: string
      readonly env: string
      readonly default: string | null
      readonly required: boolean
      readonly readBy: ReadonlyArray<string>
      readonly description: string
    }>
    // The text lists the same settings, one a line after the header.
    expect(lines.slice(1).map((l) => l.split(/\s+/)[0])).toEqual(settings.map((s) => s.key))
    for (const key of [
      "coordination",
      "namespace",
      "id",
      "httpListen",
      "logFormat",
      "store",
      "minInsyncReplicas",
      "leaderImbalancePercent"
    ]) {
      expect(settings.map((s) => s.key)).toContain(key)
    }
    for (const s of settings) {
      expect(s.env).toBe(`STRATA_${s.key.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase()}`)
      expect(row(s.key), s.key).toContain(s.env)
      expect(s.description.length, s.key).toBeGreaterThan(10)
      expect(s.readBy.length, s.key).toBeGreaterThan(0)
    }
    expect(settings.find((s) => s.key === "sessionTimeout")).toMatchObject({
      env: "STRATA_SESSION_TIMEOUT",
      default: "10 seconds",
      required: false
    })
    expect(settings.find((s) => s.key === "coordination")).toMatchObject({ default: null, required: true })
  })

  it("a tablet server on a data directory another process holds says to pick another --data (its flag), segment files or a store", async () => {
    const held: ReadonlyArray<{
      readonly store: string
      readonly hold: (directory: string) => Effect.Effect<unknown, unknown, Scope.Scope>
    }> = [
      { store: "segments", hold: (directory) => Layer.build(ServerStorage.layerSegments({ directory })) },
      { store: "rocksdb", hold: (directory) => Layer.build(RocksDbStore.layer({ directory })) }
    ]
    for (const { store, hold } of held) {
      const data = mkdtempSync(join(tmpdir(), "strata-cli-"))
      try {
        // This process holds the directory while the server starts on it.
        const r = await Effect.runPromise(
          Effect.scoped(
            Effect.andThen(
              hold(data),
              Effect.promise(() =>
                strata([
                  "tablet-server",
                  "--id",
                  "1",
                  "--coordination",
                  "zookeeper://127.0.0.1:1",
                  "--data",
                  data,
                  "--store",
                  store
                ])
              )
            )
          )
        )
        const line = expectOneLineFailure(r)
        expect(line).toContain("is locked")
        expect(line).toContain("pick another --data ")
        expect(line).not.toContain("--data-dir")
      } finally {
        rmSync(data, { recursive: true, force: true })
      }
    }
  })

  it("a tablet server on segment files (the default) refuses a data directory a RocksDB store wrote, saying which --store", async () => {
    const data = mkdtempSync(join(tmpdir(), "strata-cli-"))
    try {
      await Effect.runPromise(Effect.scoped(Layer.build(RocksDbStore.layer({ directory: data }))))
      const before = readdirSync(data).sort()
      const r = await strata([
        "tablet-server",
        "--id",
        "1",
        "--coordination",
        "zookeeper://127.0.0.1:1",
        "--data",
        data
      ])
      const line = expectOneLineFailure(r)
      expect(line).toContain("a LevelDB or RocksDB database")
      expect(line).toContain("start the server with the --store its data directory was written with")
      expect(readdirSync(data).sort()).toEqual(before)
    } finally {
      rmSync(data, { recursive: true, force: true })
    }
  })

  it("tablets create refuses more tablets than a table may have (what a cluster was measured to do), before it connects", async () => {
    const r = await strata([
      "tablets",
      "create",
      "big",
      "--tablets",
      "100000",
      "--coordination",
      "zookeeper://127.0.0.1:1"
    ])
    const line = expectOneLineFailure(r)
    expect(line).toContain("32768")
    expect(line).not.toContain("cannot reach")
    expect(r.stdout).toBe("")
  })

  it("tablets create takes --retention-ms and --retention-bytes; a value that is not a whole number ≥ 1 is refused naming the flag, before it connects", async () => {
    const zk = ["--coordination", "zookeeper://127.0.0.1:1"]
    const help = await strata(["tablets", "create", "--help"])
    expect(help.code).toBe(0)
    expect(help.stdout).toContain("--retention-ms")
    expect(help.stdout).toContain("--retention-bytes")
    for (const [flag, value] of [
      ["--retention-ms", "0"],
      ["--retention-bytes", "-5"],
      ["--retention-ms", "1.5"]
    ] as const) {
      const r = await strata(["tablets", "create", "t", "--tablets", "1", flag, value, ...zk])
      const line = expectOneLineFailure(r)
      expect(line).toContain(`Invalid value for flag ${flag}: ${JSON.stringify(value)}`)
      expect(line).not.toContain("cannot reach")
      expect(r.code, "a usage error exits 2").toBe(2)
      expect(r.stdout).toBe("")
    }
    // Good values parse: the command goes on to the cluster (here, one it cannot reach).
    const good = await strata([
      "tablets",
      "create",
      "t",
      "--tablets",
      "1",
      "--retention-ms",
      "86400000",
      "--retention-bytes",
      "1073741824",
      ...zk
    ])
    expect(expectOneLineFailure(good)).toContain("cannot reach 127.0.0.1:1")
  })

  it("tablets describe's filters are exclusive: two or more are one usage line, before it connects, with the exit code of other usage errors", async () => {
    const zk = ["--coordination", "zookeeper://127.0.0.1:1"]
    // Another usage error of the same command group, for its exit code.
    const other = await strata(["tablets", "reassign", "t", "0", ...zk])
    expect(expectOneLineFailure(other)).toContain("neither --replicas nor --cancel was given")
    const two = await strata(["tablets", "describe", "--under-replicated", "--unavailable", ...zk])
    const line = expectOneLineFailure(two)
    expect(line).toContain("strata tablets describe: --under-replicated and --unavailable were given together")
    expect(line).toContain("give one of --under-replicated, --unavailable, --under-min-isr")
    expect(line).not.toContain("--verbose")
    expect(line).not.toContain("cannot reach")
    expect(other.code, "a usage error exits 2").toBe(2)
    expect(two.code).toBe(other.code)
    expect(two.stdout).toBe("")
    const three = await strata([
      "tablets",
      "describe",
      "t",
      "--under-min-isr",
      "--unavailable",
      "--under-replicated",
      ...zk
    ])
    expect(expectOneLineFailure(three)).toContain(
      "--under-replicated and --unavailable and --under-min-isr were given together"
    )
    expect(three.code).toBe(other.code)
  })

  it("--output takes text or json; --json with --output text is one usage line, before it connects", async () => {
    const zk = ["--coordination", "zookeeper://127.0.0.1:1"]
    const yaml = await strata(["cluster", "status", "--output", "yaml", ...zk])
    const line = expectOneLineFailure(yaml)
    expect(line).toContain("--output")
    expect(line).toContain('"yaml"')
    expect(line).toContain("strata cluster status --help")
    for (const command of [
      ["tablets", "describe"],
      ["rebalance", "plan"]
    ]) {
      const r = await strata([...command, "--json", "--output", "text", ...zk])
      const both = expectOneLineFailure(r)
      expect(both).toContain(`strata ${command.join(" ")}: --json and --output text were both given`)
      expect(both).not.toContain("cannot reach")
    }
  })

  it("tablets list is listed; create, delete and describe take --output, --if-not-exists, --if-exists and the filters", async () => {
    const tablets = await strata(["tablets", "--help"])
    expect(tablets.code).toBe(0)
    expect(tablets.stdout).toMatch(/^\s+list\s/m)
    const flags = async (command: ReadonlyArray<string>) => {
      const r = await strata([...command, "--help"])
      expect(r.code).toBe(0)
      return r.stdout
    }
    const create = await flags(["tablets", "create"])
    expect(create).toContain("--if-not-exists")
    expect(create).toContain("--output")
    const remove = await flags(["tablets", "delete"])
    expect(remove).toContain("--if-exists")
    expect(remove).toContain("--output")
    const describe = await flags(["tablets", "describe"])
    for (const flag of ["--under-replicated", "--unavailable", "--under-min-isr", "--json", "--output"]) {
      expect(describe).toContain(flag)
    }
  })

  it("tablets create refuses a table name that is not [A-Za-z0-9._-]+, naming it and the rule, before it connects", async () => {
    for (const name of ["..", "a/b"]) {
      const r = await strata(["tablets", "create", name, "--tablets", "1", "--coordination", "zookeeper://127.0.0.1:1"])
      const line = expectOneLineFailure(r)
      expect(line).toContain(`invalid table name ${JSON.stringify(name)}`)
      expect(line).toContain("[A-Za-z0-9._-]")
      expect(line).not.toContain("cannot reach")
      expect(r.stdout).toBe("")
    }
  })
})
