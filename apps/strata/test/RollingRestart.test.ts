/**
 * The rolling restart's order and its printed script: the tablet servers, the standby coordinators, the leading
 * coordinator last; the script run by `sh` against a fake `strata` restarts in that order and stops, naming the wait,
 * when the cluster does not become healthy. The local cluster's stop order and `--timeout`'s durations.
 */
import { spawnSync } from "node:child_process"
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Option } from "effect"
import type * as AdminReport from "../src/AdminReport.js"
import * as ClusterRunner from "../src/ClusterRunner.js"
import * as RollingRestart from "../src/RollingRestart.js"

/** A status as `strata cluster status` reads it: servers 3, 1, 2; coordinators 103, 101, 102, the leader 102. */
const status: AdminReport.ClusterStatus = {
  coordinators: [
    { id: 103, address: "127.0.0.1:4103", leader: false },
    { id: 101, address: "127.0.0.1:4101", leader: false },
    { id: 102, address: "127.0.0.1:4102", leader: true }
  ],
  leader: { id: 102, epoch: 4, address: "127.0.0.1:4102" },
  servers: [
    { id: 3, address: "127.0.0.1:5003" },
    { id: 1, address: "127.0.0.1:5001" },
    { id: 2, address: "127.0.0.1:5002" }
  ],
  down: [],
  minInsyncReplicas: 2,
  tablets: { total: 6, offline: 0, underReplicated: 0, underMinIsr: 0, deleting: 0 }
}

const options = { coordination: "zookeeper://127.0.0.1:2181", namespace: "/rolling test", timeoutSeconds: 4 }

/** The `restart_process KIND ID` lines of a script, in order. */
const restarts = (text: string) =>
  text
    .split("\n")
    .filter((line) => line.startsWith("restart_process "))
    .map((line) => line.slice("restart_process ".length))

/**
 * Runs `script` with `sh` in a fresh directory: `strata` is a fake printing a healthy cluster led by coordinator 102
 * (or, `unhealthy`, one under-replicated tablet forever), and the restarts are appended to a file; what `sh` printed
 * and the restarts, in order.
 */
const runScript = (text: string, unhealthy = false) => {
  const dir = mkdtempSync(join(tmpdir(), "strata-rolling-script-"))
  try {
    const fake = join(dir, "strata")
    writeFileSync(
      fake,
      [
        "#!/bin/sh",
        `echo "$*" >> "${join(dir, "calls")}"`,
        'case "$1 $2" in',
        `  "cluster status") printf 'coordinators\\t3 registered\\tleader 102\\ncoordinator 101\\t127.0.0.1:4101\\ncoordinator 102\\t127.0.0.1:4102\\tleader\\ncoordinator 103\\t127.0.0.1:4103\\nserver 1\\t127.0.0.1:5001\\nserver 2\\t127.0.0.1:5002\\nserver 3\\t127.0.0.1:5003\\n' ;;`,
        `  "tablets describe") case "$3" in --under-replicated) ${unhealthy ? "echo 'orders:0\tOnlineTablet\tleader 1'" : ":"} ;; esac ;;`,
        "esac",
        ""
      ].join("\n")
    )
    chmodSync(fake, 0o755)
    const restart = join(dir, "restart")
    writeFileSync(restart, `#!/bin/sh\necho "$1 $2" >> "${join(dir, "restarted")}"\n`)
    chmodSync(restart, 0o755)
    const result = spawnSync("sh", ["-s"], {
      input: text,
      encoding: "utf8",
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin", STRATA: fake, RESTART_COMMAND: restart, TIMEOUT: "2" },
      timeout: 30_000
    })
    const read = (name: string) => {
      try {
        return readFileSync(join(dir, name), "utf8")
      } catch {
        return ""
      }
    }
    return {
      code: result.status,
      stdout: result.stdout,
      stderr: result.stderr,
      restarted: read("restarted").trimEnd().split("\n").filter(Boolean),
      calls: read("calls")
    }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

describe("RollingRestart", () => {
  it("plans the tablet servers by id, then the standby coordinators, the leader last", () => {
    assert.deepStrictEqual(RollingRestart.planOfStatus(status), {
      servers: [1, 2, 3],
      standbys: [101, 103],
      leader: 102
    })
    assert.isUndefined(RollingRestart.planOfStatus({ ...status, leader: null }))
    assert.deepStrictEqual(RollingRestart.planOf([2, 1], [101], 101), { servers: [1, 2], standbys: [], leader: 101 })
  })

  it("prints a script restarting in that order, each step followed by its waits", () => {
    const text = RollingRestart.script(RollingRestart.planOfStatus(status)!, { ...options, down: [4] })
    assert.deepStrictEqual(restarts(text), [
      "tablet-server 1",
      "tablet-server 2",
      "tablet-server 3",
      "coordinator 101",
      "coordinator 103",
      "coordinator 102"
    ])
    // After each tablet server: its /readyz, its registration, then every tablet led with a full ISR.
    const lines = text.split("\n")
    const after = lines.indexOf("restart_process tablet-server 2")
    assert.deepStrictEqual(lines.slice(after + 1, after + 4), [
      `wait_for "tablet server 2's /readyz answering 200" ready tablet-server 2`,
      `wait_for "tablet server 2 registered again" registered server 2`,
      `wait_for "every tablet led with a full ISR after tablet server 2's restart" healthy`
    ])
    // The leader is checked before the standbys restart; after it, a coordinator leads and every tablet is online.
    assert.isBelow(
      lines.indexOf(
        `leads 102 || { echo "coordinator 102 does not lead any more: print the script again" >&2; exit 1; }`
      ),
      lines.indexOf("restart_process coordinator 101")
    )
    assert.isAbove(
      lines.indexOf('wait_for "a coordinator leading" leading'),
      lines.indexOf("restart_process coordinator 102")
    )
    assert.include(text, "COORDINATION=zookeeper://127.0.0.1:2181\nNAMESPACE='/rolling test'\n")
    assert.include(text, "down: not restarted")
    assert.strictEqual(spawnSync("sh", ["-n"], { input: text }).status, 0, "the script parses")
  })

  it("the script, run against a healthy cluster, restarts in the plan's order and checks with strata", () => {
    const run = runScript(RollingRestart.script(RollingRestart.planOfStatus(status)!, options))
    assert.strictEqual(run.code, 0, run.stderr)
    assert.deepStrictEqual(run.restarted, [
      "tablet-server 1",
      "tablet-server 2",
      "tablet-server 3",
      "coordinator 101",
      "coordinator 103",
      "coordinator 102"
    ])
    assert.include(
      run.calls,
      "tablets describe --under-replicated --coordination zookeeper://127.0.0.1:2181 --namespace /rolling test"
    )
    assert.include(run.stdout, "rolling restart done")
  })

  it("the script stops when a wait times out, naming what it waited for, before restarting anything", () => {
    const run = runScript(RollingRestart.script(RollingRestart.planOfStatus(status)!, options), true)
    assert.strictEqual(run.code, 1)
    assert.include(run.stderr, "not within 2 s: every tablet led with a full ISR before anything restarts")
    assert.deepStrictEqual(run.restarted, [])
  })
})

describe("ClusterRunner", () => {
  const proc = (kind: ClusterRunner.Kind, id: number): ClusterRunner.ClusterProcess => ({
    kind,
    id,
    pid: 1_000_000 + id,
    args: [kind, "--id", String(id)],
    log: `/tmp/${kind}-${id}.log`
  })
  const processes = [
    proc("coordinator", 101),
    proc("coordinator", 102),
    proc("tablet-server", 1),
    proc("tablet-server", 2)
  ]

  it("stops the tablet servers first, then the standby coordinators, the leader last", () => {
    const order = ClusterRunner.stopOrder(processes, processes[0])
    assert.deepStrictEqual(
      order.map((group) => group.map(ClusterRunner.labelOf)),
      [["tablet server 1", "tablet server 2"], ["coordinator 102"], ["coordinator 101"]]
    )
    assert.deepStrictEqual(
      ClusterRunner.stopOrder(processes, undefined).map((group) => group.length),
      [2, 2]
    )
  })

  it("reads --timeout as a duration above zero", () => {
    const ms = (text: string) => Option.map(Option.fromNullishOr(ClusterRunner.durationOf(text)), Duration.toMillis)
    assert.deepStrictEqual(ms("5 minutes"), Option.some(300_000))
    assert.deepStrictEqual(ms("90s"), Option.some(90_000))
    assert.deepStrictEqual(ms("2m"), Option.some(120_000))
    assert.deepStrictEqual(ms("500ms"), Option.some(500))
    assert.isTrue(Option.isNone(ms("0s")))
    assert.isTrue(Option.isNone(ms("soon")))
  })

  it.effect("writes and reads cluster.json; a process whose pid is gone does not run", () =>
    Effect.gen(function* () {
      const dir = mkdtempSync(join(tmpdir(), "strata-cluster-file-"))
      try {
        assert.isTrue(Option.isNone(yield* ClusterRunner.readFile(dir)))
        const file: ClusterRunner.ClusterFile = {
          coordination: "zookeeper://127.0.0.1:2181",
          namespace: "/t",
          env: { STRATA_SESSION_TIMEOUT: "4000" },
          processes
        }
        yield* ClusterRunner.writeFile(dir, file)
        assert.deepStrictEqual(yield* ClusterRunner.requireFile(dir), file)
        const dead = spawnSync("true")
        assert.isFalse(ClusterRunner.isRunning({ pid: dead.pid ?? 1_000_000, kind: "coordinator", id: 101 }))
        // This process runs, but it is not `strata coordinator 101`.
        assert.isFalse(ClusterRunner.isRunning({ pid: process.pid, kind: "coordinator", id: 101 }))
        writeFileSync(join(dir, "cluster.json"), "{}")
        const bad = yield* Effect.flip(ClusterRunner.requireFile(dir))
        assert.strictEqual(bad._tag, "InvalidClusterFile")
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    })
  )
})
