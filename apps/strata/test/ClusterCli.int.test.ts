/**
 * The cluster's commands as an operator runs them, against real processes on the test's ZooKeeper: a second
 * `tablet-server` with a running server's id never acts for it and exits with one line naming the id and the other
 * server; `tablets describe` of a missing table is one line and exit 1; `rebalance plan` after servers join prints
 * the fewest moves and changes nothing; a ZooKeeper URL at a port where something else answers says so.
 */
import { spawn } from "node:child_process"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as ZooKeeperCoordination from "@strata/election/zookeeper"
import { Effect } from "effect"
import { inject } from "vitest"
import type * as ProcessCluster from "../../../scripts/test-support/processCluster.js"
import { awaitMetadata, cliProcesses, client, faultSettings, zooKeeperCluster } from "./support/clusterTest.js"

const processes = cliProcesses()

const envName = (key: string): string => `STRATA_${key.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase()}`

/** The environment of the cluster's processes: its coordination, namespace and settings. */
const clusterEnv = (namespace: string): Record<string, string> => {
  const env: Record<string, string> = {
    ...(process.env as Record<string, string>),
    STRATA_COORDINATION: `zookeeper://${inject("zookeeper")}`,
    STRATA_NAMESPACE: namespace
  }
  for (const [key, value] of Object.entries(faultSettings)) env[envName(key)] = String(value)
  return env
}

interface Run {
  /** Everything it printed so far, stdout and stderr. */
  readonly output: () => string
  readonly signal: (sig: NodeJS.Signals) => void
  /** Its exit: code (null when a signal ended it), stdout, stderr. */
  readonly exited: Promise<{ readonly code: number | null; readonly stdout: string; readonly stderr: string }>
}

/** Runs the CLI with `args` in `env`. */
const cli = (args: ReadonlyArray<string>, env: Record<string, string>): Run => {
  const child = spawn(process.execPath, processes.runner().argv(args), { env, stdio: ["ignore", "pipe", "pipe"] })
  let stdout = ""
  let stderr = ""
  child.stdout.on("data", (c: Buffer) => {
    stdout += c.toString()
  })
  child.stderr.on("data", (c: Buffer) => {
    stderr += c.toString()
  })
  return {
    output: () => stdout + stderr,
    signal: (sig) => child.kill(sig),
    exited: new Promise((done) => child.on("close", (code) => done({ code, stdout, stderr })))
  }
}

/** Waits until `run` has printed something matching `pattern` (or fails if it exits first). */
const printed = (run: Run, pattern: RegExp): Promise<void> =>
  new Promise((done, fail) => {
    let finished = false
    run.exited.then((r) => {
      if (!finished) fail(new Error(`exited (code ${r.code}) before printing ${pattern}: ${run.output()}`))
    })
    const check = () => {
      if (finished) return
      if (pattern.test(run.output())) {
        finished = true
        done()
      } else setTimeout(check, 50)
    }
    check()
  })

/** A failed run's one line on stderr. */
const oneLine = (r: { readonly code: number | null; readonly stderr: string }): string => {
  assert.notStrictEqual(r.code, 0, r.stderr)
  const lines = r.stderr.trimEnd().split("\n")
  assert.strictEqual(lines.length, 1, r.stderr)
  return lines[0]!
}

/** A process cluster in a fresh directory and namespace; killed afterwards, its logs shown when the body fails. */
const withCluster = <A, E, R>(
  label: string,
  body: (cluster: ProcessCluster.ProcessCluster, namespace: string, directory: string) => Effect.Effect<A, E, R>
) =>
  Effect.gen(function* () {
    const { cluster, namespace, directory } = yield* zooKeeperCluster(processes, label)
    return yield* body(cluster, namespace, directory).pipe(Effect.tapError(() => Effect.logError(cluster.logTails(30))))
  }).pipe(Effect.scoped, Effect.provide(ZooKeeperCoordination.layer({ connectString: inject("zookeeper") })))

describe("strata cluster commands on real processes", () => {
  it.live(
    "a second tablet-server --id 1 never acts for server 1: SIGTERM while it waits runs no controlled shutdown; left waiting, it exits non-zero with one line naming the id and server 1's address; server 1 keeps its leaderships and ISRs",
    () =>
      withCluster("dup-id", (cluster, namespace, directory) =>
        Effect.gen(function* () {
          yield* cluster.start("coordinator", 101)
          yield* Effect.forEach([1, 2, 3], (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
          const c = yield* client(namespace)
          yield* c.createTable("dup", { buckets: 6 })
          const full = yield* awaitMetadata(c, "dup", "every tablet online with a full ISR", (m) =>
            m.tablets.every((t) => t.leader !== null && t.isr.length === 3)
          )
          const leadership = (m: typeof full) =>
            m.tablets.map((t) => ({ tablet: t.tablet.bucket, leader: t.leader, epoch: t.leaderEpoch, isr: t.isr }))
          const before = leadership(full)
          assert.isTrue(
            before.some((t) => t.leader === 1),
            "server 1 leads a tablet"
          )
          const address = full.servers.find((s) => s.id === 1)!.address
          const env = clusterEnv(namespace)
          const duplicate = ["tablet-server", "--id", "1", "--data", join(directory, "data-duplicate")]

          // Stopped (SIGTERM) while it waits for the id.
          const stopped = cli(duplicate, env)
          yield* Effect.promise(() => printed(stopped, /server id 1 is registered by another session/))
          stopped.signal("SIGTERM")
          const first = yield* Effect.promise(() => stopped.exited)
          assert.notMatch(first.stdout + first.stderr, /controlled shutdown|stopping while/)
          assert.notMatch(first.stdout + first.stderr, / ready at /)

          // Left waiting: one line naming the id and the server holding it, exit non-zero.
          const waited = yield* Effect.promise(() => cli(duplicate, env).exited)
          const line = oneLine(waited)
          assert.include(line, `strata tablet-server: server id 1 is registered by another server at ${address}`)
          assert.notMatch(waited.stdout, /controlled shutdown|stopping while| ready at /)

          // Server 1 kept everything: its leaderships, its ISRs, its registration.
          assert.deepStrictEqual(leadership(yield* c.metadata("dup")), before)
          assert.strictEqual((yield* c.metadata("dup")).servers.find((s) => s.id === 1)?.address, address)
          assert.isTrue(cluster.isRunning("tablet-server", 1))
        })
      ),
    180_000
  )

  it.live("tablets describe of a missing table is one line naming it, exit 1; of a table, its tablets", () =>
    withCluster("describe", (cluster, namespace) =>
      Effect.gen(function* () {
        yield* cluster.start("coordinator", 101)
        yield* Effect.forEach([1, 2], (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
        const c = yield* client(namespace)
        yield* c.createTable("present", { buckets: 2, replicationFactor: 2 })
        const env = clusterEnv(namespace)
        const missing = yield* Effect.promise(() => cli(["tablets", "describe", "missing"], env).exited)
        assert.strictEqual(missing.code, 1)
        assert.include(oneLine(missing), "strata tablets describe: no table missing")
        assert.strictEqual(missing.stdout, "")
        const present = yield* Effect.promise(() => cli(["tablets", "describe", "present"], env).exited)
        assert.strictEqual(present.code, 0, present.stderr)
        assert.match(present.stdout, /^present:0\t/m)
        assert.match(present.stdout, /^present:1\t/m)
      })
    )
  )

  it.live(
    "rebalance plan after two servers join: the fewest moves to exact balance, as text and JSON, changing nothing; a goal it does not know is one line",
    () =>
      withCluster("plan", (cluster, namespace) =>
        Effect.gen(function* () {
          yield* cluster.start("coordinator", 101)
          yield* Effect.forEach([1, 2, 3], (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
          const c = yield* client(namespace)
          yield* c.createTable("spread", { buckets: 12, replicationFactor: 3 })
          yield* awaitMetadata(c, "spread", "every tablet online with a full ISR", (m) =>
            m.tablets.every((t) => t.leader !== null && t.isr.length === 3)
          )
          yield* Effect.forEach([4, 5], (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
          const before = yield* awaitMetadata(c, "spread", "five servers registered", (m) => m.servers.length === 5)
          const env = clusterEnv(namespace)

          // 36 replicas, 12 on each of three servers; balanced is 7 or 8 on each of five: 5 + 5 + 4 = 14 moves.
          const text = yield* Effect.promise(() => cli(["rebalance", "plan"], env).exited)
          assert.strictEqual(text.code, 0, text.stderr)
          assert.include(text.stdout, "replica moves 14, lower bound 14, moves/LB 1.000")
          assert.include(text.stdout, "replicas per server: before min 0 max 12")
          assert.include(text.stdout, "after min 7 max 8")
          assert.match(text.stdout, /^spread:\d+\t\[\d,\d,\d\] -> \[\d,\d,\d\]\tleader \d -> \d$/m)

          const json = yield* Effect.promise(() => cli(["rebalance", "plan", "--json"], env).exited)
          assert.strictEqual(json.code, 0, json.stderr)
          const { plan } = JSON.parse(json.stdout) as {
            readonly plan: {
              readonly figures: { readonly replicaMoves: number; readonly lowerBound: number }
              readonly changes: ReadonlyArray<{ readonly to: ReadonlyArray<number> }>
            }
          }
          assert.strictEqual(plan.figures.replicaMoves, 14)
          assert.strictEqual(plan.figures.lowerBound, 14)
          for (const change of plan.changes) assert.strictEqual(new Set(change.to).size, 3)

          // A plan only: every tablet's replicas are where they were.
          const after = yield* c.metadata("spread")
          assert.deepStrictEqual(
            after.tablets.map((t) => t.replicas),
            before.tablets.map((t) => t.replicas)
          )

          const bad = yield* Effect.promise(() => cli(["rebalance", "plan", "--goals", "leader,speed"], env).exited)
          const line = oneLine(bad)
          assert.include(line, "strata rebalance plan: invalid planner input: options.goals[1]")
          assert.include(line, "speed")
        })
      ),
    180_000
  )

  it.live("a ZooKeeper URL at a port where something else answers (Kafka's) says it is not ZooKeeper", () =>
    Effect.gen(function* () {
      const kafka = inject("kafka")
      const r = yield* Effect.promise(
        () => cli(["tablets", "describe", "--coordination", `zookeeper://${kafka}`], { ...process.env } as never).exited
      )
      const line = oneLine(r)
      assert.include(line, `something answered at ${kafka}, but it is not ZooKeeper`)
      assert.notInclude(line, "cannot reach")
    })
  )
})
