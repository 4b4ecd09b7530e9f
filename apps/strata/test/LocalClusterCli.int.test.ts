/**
 * A local cluster in one command, against the test's ZooKeeper, as an operator runs it: `strata cluster up` starts
 * two coordinators and three tablet servers (each ready, `cluster.json` listing them) and refuses a second `up` while
 * they run; `strata cluster rolling-restart` restarts every one in the seed's order while a client writes acks=all
 * records, no tablet going offline in the controller's metadata and every acknowledged record reading back exactly
 * once; `strata cluster down` stops every process and removes `cluster.json`, keeping the data and logs.
 */
import { existsSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as ZooKeeperCoordination from "@strata/election/zookeeper"
import { Effect, Fiber } from "effect"
import { inject } from "vitest"
import * as ClusterRunner from "../src/ClusterRunner.js"
import { cli as runCli, clusterEnv, type Run } from "./support/cliRun.js"
import { awaitMetadata, cliProcesses, client, freshDirectory, readAll, record } from "./support/clusterTest.js"
import * as Checker from "./support/replicaChecker.js"

const processes = cliProcesses()

/** Runs the bundled CLI with `args` in `env`. */
const cli = (args: ReadonlyArray<string>, env: Record<string, string>): Run => runCli(processes.runner(), args, env)

/** The directory's cluster.json as written. */
const clusterFile = (dir: string): ClusterRunner.ClusterFile =>
  JSON.parse(readFileSync(join(dir, "cluster.json"), "utf8")) as ClusterRunner.ClusterFile

/** An HTTP GET's status, or 0 when nothing answered. */
const status = (url: string) =>
  Effect.promise(() =>
    fetch(url, { signal: AbortSignal.timeout(5_000) }).then(
      (r) => r.status,
      () => 0
    )
  )

describe("strata cluster up, rolling-restart and down", () => {
  it.live(
    "up starts every process ready and refuses a second up; rolling-restart in the seed's order while acks=all writes go on: no tablet offline, every acknowledged record once; down stops every process",
    () =>
      Effect.gen(function* () {
        const base = yield* Effect.promise(() => freshDirectory("local-cluster"))
        processes.directories.push(base)
        const dir = join(base, "cluster")
        const namespace = `/local-cluster-${Date.now()}`
        const coordination = `zookeeper://${inject("zookeeper")}`
        // The fault tests' settings from the environment; the coordination and namespace from the flags alone.
        const env = clusterEnv(namespace)
        delete env.STRATA_COORDINATION
        delete env.STRATA_NAMESPACE
        const where = ["--coordination", coordination, "--namespace", namespace]
        // Whatever happens, no process of the cluster outlives the test.
        const started = new Map<number, ClusterRunner.ClusterProcess>()
        yield* Effect.addFinalizer(() =>
          Effect.sync(() => {
            for (const p of started.values()) if (ClusterRunner.isRunning(p)) process.kill(p.pid, "SIGKILL")
          })
        )
        const remember = (file: ClusterRunner.ClusterFile) => {
          for (const p of file.processes) started.set(p.pid, p)
        }

        // Up: two coordinators and three tablet servers, each ready.
        const up = yield* Effect.promise(
          () => cli(["cluster", "up", "--dir", dir, "--coordinators", "2", "--servers", "3", ...where], env).exited
        )
        if (existsSync(join(dir, "cluster.json"))) remember(clusterFile(dir))
        assert.strictEqual(up.code, 0, up.stderr + up.stdout)
        const before = clusterFile(dir)
        assert.strictEqual(before.coordination, coordination)
        assert.strictEqual(before.namespace, namespace)
        assert.deepStrictEqual(
          before.processes.map((p) => `${p.kind} ${p.id}`),
          ["coordinator 101", "coordinator 102", "tablet-server 1", "tablet-server 2", "tablet-server 3"]
        )
        for (const p of before.processes) {
          assert.isTrue(ClusterRunner.isRunning(p), `${ClusterRunner.labelOf(p)} runs`)
          assert.match(p.address ?? "", /^127\.0\.0\.1:\d+$/)
          assert.strictEqual(yield* status(`${p.ops}/readyz`), 200, `${ClusterRunner.labelOf(p)}'s /readyz`)
          assert.isTrue(existsSync(p.log), p.log)
        }
        assert.strictEqual(before.processes[2]!.data, join(dir, "server-1"))
        assert.strictEqual(yield* status(`${before.processes[0]!.ops}/metrics`), 200)
        assert.include(up.stdout, `strata tablets create orders --tablets 6 --rf 3 --coordination ${coordination}`)
        assert.include(up.stdout, `curl ${before.processes[0]!.ops}/metrics`)
        assert.notInclude(up.stdout, "no --coordination given")

        // A second up on the directory refuses, naming the processes that run.
        const again = yield* Effect.promise(() => cli(["cluster", "up", "--dir", dir, ...where], env).exited)
        assert.strictEqual(again.code, 1, again.stdout)
        const refusal = again.stderr.trimEnd().split("\n")
        assert.lengthOf(refusal, 1, again.stderr)
        assert.include(refusal[0], `strata cluster up: a cluster runs in ${dir} already: `)
        for (const p of before.processes) assert.include(refusal[0], `${ClusterRunner.labelOf(p)} (pid ${p.pid})`)
        assert.deepStrictEqual(clusterFile(dir), before, "the refused up changed nothing")

        // A table of six tablets on all three servers, created with the CLI.
        const created = yield* Effect.promise(
          () => cli(["tablets", "create", "rolling", "--tablets", "6", "--rf", "3", ...where], env).exited
        )
        assert.strictEqual(created.code, 0, created.stderr)
        const c = yield* client(namespace)
        const healthy = yield* awaitMetadata(c, "rolling", "every tablet led with a full ISR", (m) =>
          m.tablets.every((t) => t.leader !== null && t.isr.length === 3)
        )
        const tablets = healthy.tablets.map((t) => t.tablet)
        assert.lengthOf(tablets, 6)

        // --print: the steps as a script, for the cluster the flags name (as for one not started by up) and for DIR's.
        const printed = (args: ReadonlyArray<string>) =>
          Effect.map(
            Effect.promise(() => cli(["cluster", "rolling-restart", "--print", ...args], env).exited),
            (r) => {
              assert.strictEqual(r.code, 0, r.stderr)
              return r.stdout
                .split("\n")
                .filter((line) => line.startsWith("restart_process "))
                .map((line) => line.slice("restart_process ".length))
            }
          )
        const fromFlags = yield* printed(where)
        assert.deepStrictEqual(yield* printed(["--dir", dir]), fromFlags)
        assert.deepStrictEqual(fromFlags.slice(0, 3), ["tablet-server 1", "tablet-server 2", "tablet-server 3"])
        assert.sameMembers(fromFlags.slice(3), ["coordinator 101", "coordinator 102"])
        const leading = yield* ClusterRunner.leaderOf(before.processes.filter((p) => p.kind === "coordinator"))
        assert.isDefined(leading, "a coordinator leads")
        assert.strictEqual(fromFlags.at(-1), `coordinator ${leading!.id}`, "the leader last")

        // Writers (one per tablet, acks=all, one record at a time) and a poller of the controller's metadata.
        let stop = false
        const acked: Array<Checker.Acked & { readonly at: number }> = []
        let failed = 0
        const offline: Array<string> = []
        let polls = 0
        let unanswered = 0
        const writers = yield* Effect.forkChild(
          Effect.forEach(
            tablets,
            (tablet) =>
              Effect.gen(function* () {
                for (let n = 0; !stop; n++) {
                  const value = `w:${tablet.bucket}:${n}`
                  const sent = yield* Effect.result(c.send(tablet, [record(value)]))
                  if (sent._tag === "Success") {
                    acked.push({ tablet, baseOffset: sent.success.baseOffset, values: [value], at: Date.now() })
                  } else failed++
                  yield* Effect.sleep("25 millis")
                }
              }),
            { concurrency: "unbounded", discard: true }
          )
        )
        const poller = yield* Effect.forkChild(
          Effect.gen(function* () {
            while (!stop) {
              const m = yield* Effect.option(c.metadata("rolling").pipe(Effect.timeout("5 seconds")))
              polls++
              if (m._tag === "None") unanswered++
              else {
                for (const t of m.value.tablets) {
                  if (t.leader === null)
                    offline.push(`${t.tablet.table}:${t.tablet.bucket} at ${new Date().toISOString()}`)
                }
              }
              yield* Effect.sleep("200 millis")
            }
          })
        )

        // The rolling restart.
        yield* Effect.sleep("1 second")
        const restartBegan = Date.now()
        const rolling = yield* Effect.promise(() => cli(["cluster", "rolling-restart", "--dir", dir], env).exited)
        const restartEnded = Date.now()
        if (existsSync(join(dir, "cluster.json"))) remember(clusterFile(dir))
        yield* Effect.sleep("1 second")
        stop = true
        yield* Fiber.join(poller)
        yield* Fiber.join(writers).pipe(
          Effect.timeout("90 seconds"),
          Effect.catch(() => Fiber.interrupt(writers))
        )
        console.log(
          `strata cluster rolling-restart (${((restartEnded - restartBegan) / 1000).toFixed(1)} s as the test saw it):\n${rolling.stdout}${rolling.stderr}`
        )
        console.log(
          `writes: ${acked.length} acknowledged (${acked.filter((a) => a.at >= restartBegan && a.at <= restartEnded).length} during the restart), ${failed} failed; metadata polls: ${polls}, ${unanswered} unanswered, ${offline.length} offline tablets seen`
        )
        assert.strictEqual(rolling.code, 0, rolling.stderr)
        const lines = rolling.stdout.trimEnd().split("\n")
        const stepLines = lines.filter((line) => line.startsWith("restarting "))
        const after = clusterFile(dir)
        const leader = stepLines.at(-1)?.match(/^restarting leading coordinator (\d+) /)?.[1]
        assert.isDefined(leader, rolling.stdout)
        const standby = leader === "101" ? 102 : 101
        assert.strictEqual(stepLines.length, 5, rolling.stdout)
        for (const [i, id] of [1, 2, 3].entries()) {
          assert.match(
            stepLines[i]!,
            new RegExp(`^restarting tablet server ${id} … back, 0 under-replicated after \\d+\\.\\d s$`)
          )
        }
        assert.match(stepLines[3]!, new RegExp(`^restarting standby coordinator ${standby} … back after \\d+\\.\\d s$`))
        assert.match(
          stepLines[4]!,
          new RegExp(
            `^restarting leading coordinator ${leader} … back; coordinator (101|102) leads, 0 offline, 0 under-replicated after \\d+\\.\\d s$`
          )
        )
        assert.match(lines.at(-1)!, /^OK: rolling restart of 3 tablet servers and 2 coordinators done in /)

        // No tablet went offline; writes went on through the restart.
        assert.deepStrictEqual(offline, [], "a tablet without a leader in the controller's metadata")
        assert.isAbove(polls, 10)
        assert.isAbove(
          acked.filter((a) => a.at >= restartBegan && a.at <= restartEnded).length,
          0,
          "acknowledged writes during the restart"
        )

        // Every process was restarted (a new pid) and runs, ready.
        for (const p of after.processes) {
          const old = before.processes.find((b) => b.kind === p.kind && b.id === p.id)!
          assert.notStrictEqual(p.pid, old.pid, `${ClusterRunner.labelOf(p)} restarted`)
          assert.isFalse(ClusterRunner.isRunning(old), `${ClusterRunner.labelOf(p)}'s old process exited`)
          assert.isTrue(ClusterRunner.isRunning(p), `${ClusterRunner.labelOf(p)} runs`)
          assert.strictEqual(yield* status(`${p.ops}/readyz`), 200, `${ClusterRunner.labelOf(p)}'s /readyz`)
          assert.deepStrictEqual(p.args, old.args, `${ClusterRunner.labelOf(p)} restarted with the same arguments`)
        }

        // Every acknowledged record is there exactly once, on every ISR member.
        yield* awaitMetadata(c, "rolling", "every tablet led with a full ISR after the restart", (m) =>
          m.tablets.every((t) => t.leader !== null && t.isr.length === 3)
        )
        const report = yield* Checker.check(c, "rolling", acked)
        assert.deepStrictEqual(report.lost, [])
        assert.deepStrictEqual(report.duplicates, [])
        assert.deepStrictEqual(report.divergent, [])
        assert.deepStrictEqual(report.epochConflicts, [])
        const held = new Map<string, number>()
        for (const tablet of tablets) for (const v of yield* readAll(c, tablet)) held.set(v, (held.get(v) ?? 0) + 1)
        const notOnce = acked
          .filter((a) => held.get(a.values[0]!) !== 1)
          .map((a) => `${a.values[0]} ×${held.get(a.values[0]!) ?? 0}`)
        assert.deepStrictEqual(notOnce, [], "acknowledged records not read back exactly once")

        // Down: every process stops, cluster.json goes; the data and logs stay.
        const down = yield* Effect.promise(() => cli(["cluster", "down", "--dir", dir], env).exited)
        assert.strictEqual(down.code, 0, down.stderr)
        console.log(`strata cluster down:\n${down.stdout}`)
        const stops = down.stdout
          .split("\n")
          .map((line) => line.match(/^(tablet server|coordinator) (\d+) \(pid \d+\) stopped in /))
          .filter((m) => m !== null)
          .map((m) => `${m[1]} ${m[2]}`)
        const newLeader = stepLines[4]!.match(/coordinator (\d+) leads/)![1]
        assert.deepStrictEqual(stops.slice(0, 3), ["tablet server 1", "tablet server 2", "tablet server 3"])
        assert.deepStrictEqual(stops.slice(3), [
          `coordinator ${newLeader === "101" ? 102 : 101}`,
          `coordinator ${newLeader}`
        ])
        assert.include(down.stdout, "OK: the cluster in ")
        for (const p of started.values())
          assert.isFalse(ClusterRunner.isRunning(p), `${ClusterRunner.labelOf(p)} (pid ${p.pid}) stopped`)
        assert.isFalse(existsSync(join(dir, "cluster.json")))
        assert.isTrue(existsSync(join(dir, "server-1")))
        assert.isTrue(existsSync(join(dir, "tablet-server-1.log")))
      }).pipe(Effect.scoped, Effect.provide(ZooKeeperCoordination.layer({ connectString: inject("zookeeper") }))),
    240_000
  )
})
