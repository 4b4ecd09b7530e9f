/**
 * The cluster's commands as an operator runs them, against real processes on the test's ZooKeeper: a second
 * `tablet-server` with a running server's id never acts for it and exits with one line naming the id and the other
 * server; `tablets describe` of a missing table is one line and exit 1; `rebalance plan` after servers join prints
 * the fewest moves and changes nothing; `tablets reassign` moves a tablet to a server that joined (and cancels a move
 * to one that is then killed), refusing a bad request with the controller's one line; `tablets list`, `create
 * --if-not-exists`, `delete --if-exists`, `describe`'s health filters, `cluster status` and `--output json` as servers
 * are killed; a ZooKeeper URL at a port where something else answers says so.
 */
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as ZooKeeperCoordination from "@strata/election/zookeeper"
import type { Models } from "@strata/core"
import type { ReplicaRpc, TabletClient } from "@strata/replica"
import { Effect } from "effect"
import { inject } from "vitest"
import type * as ProcessCluster from "../../../scripts/test-support/processCluster.js"
import { awaitMetadata, cliProcesses, client, readAll, record, zooKeeperCluster } from "./support/clusterTest.js"
import { cli as runCli, clusterEnv, printed, type Run } from "./support/cliRun.js"

const processes = cliProcesses()

/** Runs the bundled CLI with `args` in `env`. */
const cli = (args: ReadonlyArray<string>, env: Record<string, string>): Run => runCli(processes.runner(), args, env)

/** A failed run's one line on stderr. */
const oneLine = (r: { readonly code: number | null; readonly stderr: string }): string => {
  assert.notStrictEqual(r.code, 0, r.stderr)
  const lines = r.stderr.trimEnd().split("\n")
  assert.strictEqual(lines.length, 1, r.stderr)
  return lines[0]!
}

/** `strata tablets describe TABLE --json`: the controller's metadata of the table, as printed. */
const describedJson = (table: string, env: Record<string, string>) =>
  Effect.promise(async () => {
    const r = await cli(["tablets", "describe", table, "--json"], env).exited
    assert.strictEqual(r.code, 0, r.stderr)
    return JSON.parse(r.stdout) as ReplicaRpc.Metadata
  })

/** Runs `tablets describe TABLE --json` until `ok` holds of the bucket's tablet (every 300 ms, up to a minute). */
const awaitDescribed = (
  table: string,
  bucket: number,
  env: Record<string, string>,
  what: string,
  ok: (tablet: typeof ReplicaRpc.TabletMetadata.Type) => boolean
) =>
  Effect.gen(function* () {
    const deadline = Date.now() + 60_000
    let last: typeof ReplicaRpc.TabletMetadata.Type | undefined
    while (Date.now() < deadline) {
      last = (yield* describedJson(table, env)).tablets.find((t) => t.tablet.bucket === bucket)
      if (last !== undefined && ok(last)) return last
      yield* Effect.sleep("300 millis")
    }
    return yield* Effect.fail(
      new Error(`${table}:${bucket} ${what}: not within a minute; last ${JSON.stringify(last)}`)
    )
  })

/** Sends `values` to the tablet one at a time (acks=all); the values acknowledged, in order. */
const sendAll = (c: TabletClient.TabletClientShape, tablet: Models.TabletId, values: ReadonlyArray<string>) =>
  Effect.as(
    Effect.forEach(values, (v) => c.send(tablet, [record(v)]), { discard: true }),
    values
  )

/** A process cluster in a fresh directory and namespace; killed afterwards, its logs shown when the body fails. */
const withCluster = <A, E, R>(
  label: string,
  body: (cluster: ProcessCluster.ProcessCluster, namespace: string, directory: string) => Effect.Effect<A, E, R>,
  settings: Readonly<Record<string, string | number | boolean>> = {}
) =>
  Effect.gen(function* () {
    const { cluster, namespace, directory } = yield* zooKeeperCluster(processes, label, settings)
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
          // Every tablet's size came from its leader's log (empty ones here: 0 bytes each).
          assert.include(text.stdout, "bytes per server: before min 0 B max 0 B")
          assert.notInclude(text.stdout, "have no size")

          const json = yield* Effect.promise(() => cli(["rebalance", "plan", "--json"], env).exited)
          assert.strictEqual(json.code, 0, json.stderr)
          const { plan, model, sizesMissing } = JSON.parse(json.stdout) as {
            readonly plan: {
              readonly figures: { readonly replicaMoves: number; readonly lowerBound: number }
              readonly changes: ReadonlyArray<{ readonly to: ReadonlyArray<number> }>
            }
            readonly model: { readonly tablets: ReadonlyArray<{ readonly sizeBytes?: number }> }
            readonly sizesMissing: number
          }
          assert.strictEqual(sizesMissing, 0)
          assert.deepStrictEqual(
            model.tablets.map((t) => t.sizeBytes),
            Array.from({ length: 12 }, () => 0)
          )
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

  it.live(
    "tablets reassign moves a tablet to a server that joined (describe shows it done, every acknowledged record read back once); a bad request is one line with the controller's detail; a move to a server that is then killed is cancelled, back on its original replicas",
    () =>
      // Sessions of 10 s: a paused server stays registered while the CLI asks for a move to it.
      withCluster(
        "reassign",
        (cluster, namespace) =>
          Effect.gen(function* () {
            yield* cluster.start("coordinator", 101)
            yield* Effect.forEach([1, 2, 3], (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
            const c = yield* client(namespace)
            yield* c.createTable("moving", { buckets: 2, replicationFactor: 3 })
            const full = yield* awaitMetadata(c, "moving", "every tablet online with a full ISR", (m) =>
              m.tablets.every((t) => t.leader !== null && t.isr.length === 3)
            )
            const tablets = [0, 1].map((bucket) => ({ table: "moving", bucket }))
            const acked = yield* Effect.forEach(tablets, (t) =>
              sendAll(
                c,
                t,
                [0, 1, 2, 3, 4].map((i) => `before:${t.bucket}:${i}`)
              )
            )
            yield* Effect.forEach([4, 5], (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
            yield* awaitMetadata(c, "moving", "five servers registered", (m) => m.servers.length === 5)
            const env = clusterEnv(namespace)
            const reassign = (args: ReadonlyArray<string>) =>
              Effect.promise(() => cli(["tablets", "reassign", "moving", ...args], env).exited)

            // Tablet 0 moves its preferred leader's replica to server 4, which joined.
            const from = full.tablets.find((t) => t.tablet.bucket === 0)!.replicas
            const to = [4, from[1]!, from[2]!]
            const accepted = yield* reassign(["0", "--replicas", to.join(",")])
            assert.strictEqual(accepted.code, 0, accepted.stderr)
            assert.include(
              accepted.stdout,
              `OK: moving:0: moving from [${from.join(",")}] to [${to.join(",")}]; strata tablets describe shows its target until it is done`
            )
            const done = yield* awaitDescribed(
              "moving",
              0,
              env,
              `on [${to.join(",")}], the leaving replica deleted`,
              (t) => t.target === undefined && t.retired === undefined && t.replicas.join(",") === to.join(",")
            )
            assert.sameMembers([...done.isr], to)
            const text = yield* Effect.promise(() => cli(["tablets", "describe", "moving"], env).exited)
            assert.match(
              text.stdout,
              new RegExp(`^moving:0\tOnlineTablet\tleader \\d\tepoch \\d+\treplicas ${to.join(",")}\tisr [\\d,]+$`, "m")
            )
            const more = yield* sendAll(c, tablets[0]!, ["after:0:0", "after:0:1"])
            assert.deepStrictEqual(yield* readAll(c, tablets[0]!), [...acked[0]!, ...more])

            // Bad requests: the controller's refusal, or the flag named, as one line and a non-zero exit.
            const refusals: ReadonlyArray<readonly [ReadonlyArray<string>, string]> = [
              [
                ["1", "--replicas", "1,1,2"],
                "strata tablets reassign: moving/1: server 1 is named twice in the target replica set"
              ],
              [
                ["1", "--replicas", "1,2,99"],
                "strata tablets reassign: moving/1: server 99 is not a server of the cluster"
              ],
              [["1", "--cancel"], "strata tablets reassign: moving/1 is not moving"],
              [
                ["1", "--replicas", "1,x,2"],
                'strata tablets reassign: --replicas: expected server ids separated by commas (integers ≥ 0), got "1,x,2" ("x" is not a server id)'
              ],
              [
                ["1", "--replicas", ""],
                '--replicas: expected server ids separated by commas (integers ≥ 0), got "" (an empty id)'
              ],
              [
                ["1", "--replicas", "1,2,3", "--cancel"],
                "strata tablets reassign: --replicas and --cancel were both given"
              ],
              [["1"], "strata tablets reassign: neither --replicas nor --cancel was given"]
            ]
            for (const [args, expected] of refusals) {
              const line = oneLine(yield* reassign(args))
              assert.include(line, expected, args.join(" "))
              assert.notInclude(line, "--verbose", args.join(" "))
            }

            // Tablet 1 is to move to server 5, paused (still registered): its move waits, shown with its target.
            const original = full.tablets.find((t) => t.tablet.bucket === 1)!.replicas
            const target = [5, original[1]!, original[2]!]
            cluster.pause("tablet-server", 5)
            const waiting = yield* reassign(["1", "--replicas", target.join(",")])
            assert.strictEqual(waiting.code, 0, waiting.stderr)
            assert.include(waiting.stdout, `OK: moving:1: moving from [${original.join(",")}] to [${target.join(",")}]`)
            const described = yield* Effect.promise(() => cli(["tablets", "describe", "moving"], env).exited)
            assert.match(
              described.stdout,
              new RegExp(
                `^moving:1\t.*\treplicas ${[...target, original[0]].join(",")}\t.*\ttarget ${target.join(",")}$`,
                "m"
              )
            )
            const moving = (yield* describedJson("moving", env)).tablets.find((t) => t.tablet.bucket === 1)!
            assert.deepStrictEqual(moving.target, target)
            // Another move while it waits is refused, naming the one under way.
            assert.include(
              oneLine(yield* reassign(["1", "--replicas", original.join(",")])),
              `moving/1 is already moving to [${target.join(",")}]: cancel that move first`
            )

            // Server 5 is killed; the move is cancelled: back on the original replicas, 5 to delete its replica.
            yield* cluster.kill("tablet-server", 5)
            const cancelled = yield* reassign(["1", "--cancel"])
            assert.strictEqual(cancelled.code, 0, cancelled.stderr)
            assert.include(
              cancelled.stdout,
              `OK: moving:1: the move to [${target.join(",")}] is cancelled, back on [${original.join(",")}]; [5] delete their replicas`
            )
            const back = (yield* describedJson("moving", env)).tablets.find((t) => t.tablet.bucket === 1)!
            assert.deepStrictEqual(back.replicas, original)
            assert.isUndefined(back.target)
            assert.deepStrictEqual(back.retired, [5])
            const backText = yield* Effect.promise(() => cli(["tablets", "describe", "moving"], env).exited)
            assert.match(
              backText.stdout,
              new RegExp(`^moving:1\t.*\treplicas ${original.join(",")}\t.*\tretired 5$`, "m")
            )
            const more1 = yield* sendAll(c, tablets[1]!, ["after:1:0"])
            assert.deepStrictEqual(yield* readAll(c, tablets[1]!), [...acked[1]!, ...more1])

            // Server 5 is back: it deletes its replica, and the tablet has no retired replica any more.
            yield* cluster.start("tablet-server", 5)
            const cleared = yield* awaitDescribed(
              "moving",
              1,
              env,
              "no retired replica",
              (t) => t.retired === undefined
            )
            assert.deepStrictEqual(cleared.replicas, original)
            assert.isUndefined(cleared.target)
          }),
        { sessionTimeout: 10_000 }
      ),
    240_000
  )

  it.live(
    "an operator's commands: cluster status with no coordinator leading fails after saying so; tablets list, create --if-not-exists, delete --if-exists, --output json; describe --under-replicated / --unavailable / --under-min-isr and cluster status as servers are killed",
    () =>
      withCluster("operator", (cluster, namespace) =>
        Effect.gen(function* () {
          const env = clusterEnv(namespace)
          const run = (args: ReadonlyArray<string>) => Effect.promise(() => cli(args, env).exited)
          /** A run that succeeded: its stdout. */
          const ok = (args: ReadonlyArray<string>) =>
            Effect.map(run(args), (r) => {
              assert.strictEqual(r.code, 0, `${args.join(" ")}: ${r.stderr}`)
              return r.stdout
            })
          const json = <A>(args: ReadonlyArray<string>) =>
            Effect.map(ok([...args, "--output", "json"]), (out) => JSON.parse(out) as A)
          type Status = {
            readonly coordinators: ReadonlyArray<{
              readonly id: number
              readonly address: string
              readonly leader: boolean
            }>
            readonly leader: { readonly id: number; readonly epoch: number } | null
            readonly servers: ReadonlyArray<{ readonly id: number }>
            readonly down: ReadonlyArray<number> | null
            readonly minInsyncReplicas: number
            readonly tablets: {
              readonly total: number
              readonly offline: number
              readonly underReplicated: number
              readonly underMinIsr: number
              readonly deleting: number
            } | null
          }

          // Nothing runs yet: status says what it found, then fails with one line.
          const none = yield* run(["cluster", "status"])
          assert.strictEqual(none.code, 1, none.stderr)
          assert.include(none.stdout, "coordinators\t0 registered\tno leader")
          assert.include(none.stdout, "tablets\tunknown: no coordinator leads")
          assert.include(oneLine(none), "strata cluster status: no coordinator leads the cluster (0 registered)")

          yield* Effect.forEach([101, 102], (id) => cluster.start("coordinator", id), { concurrency: "unbounded" })
          yield* Effect.forEach([1, 2, 3], (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
          const c = yield* client(namespace)
          yield* awaitMetadata(c, "none", "three servers registered", (m) => m.servers.length === 3)

          // No table yet.
          assert.strictEqual(yield* ok(["tablets", "list"]), "")
          assert.deepStrictEqual(yield* json(["tablets", "list"]), [])

          // Create; again with --if-not-exists (text and JSON) is no failure; again without it is the refusal.
          const created = yield* ok(["tablets", "create", "alpha", "--tablets", "4"])
          assert.include(created, "OK: created alpha with 4 tablets")
          const again = yield* ok(["tablets", "create", "alpha", "--tablets", "4", "--if-not-exists"])
          assert.match(again, /^alpha:0\t/m)
          assert.include(again, "OK: alpha exists already with 4 tablets: nothing created")
          const otherCount = yield* ok(["tablets", "create", "alpha", "--tablets", "6", "--if-not-exists"])
          assert.include(otherCount, "OK: alpha exists already with 4 tablets (6 asked): nothing created")
          const existsJson = yield* json<{ table: string; created: boolean; tablets: ReadonlyArray<unknown> }>([
            "tablets",
            "create",
            "alpha",
            "--tablets",
            "4",
            "--if-not-exists"
          ])
          assert.strictEqual(existsJson.table, "alpha")
          assert.isFalse(existsJson.created)
          assert.lengthOf(existsJson.tablets, 4)
          assert.include(
            oneLine(yield* run(["tablets", "create", "alpha", "--tablets", "4"])),
            "strata tablets create: table alpha exists"
          )
          const beta = yield* json<{ created: boolean; tablets: ReadonlyArray<{ replicas: ReadonlyArray<number> }> }>([
            "tablets",
            "create",
            "beta",
            "--tablets",
            "2",
            "--rf",
            "2"
          ])
          assert.isTrue(beta.created)
          assert.deepStrictEqual(
            beta.tablets.map((t) => t.replicas.length),
            [2, 2]
          )

          // List: one table a line, and as JSON.
          const listed = yield* ok(["tablets", "list"])
          assert.strictEqual(listed, "alpha\ttablets 4\trf 3\nbeta\ttablets 2\trf 2\n")
          assert.deepStrictEqual(yield* json(["tablets", "list"]), [
            { name: "alpha", tablets: 4, replicationFactor: 3, deleting: false },
            { name: "beta", tablets: 2, replicationFactor: 2, deleting: false }
          ])

          // Deleting a table the cluster does not have: one line without the flag, no failure with it.
          const missing = yield* run(["tablets", "delete", "nope"])
          assert.strictEqual(missing.code, 1)
          const missingLine = oneLine(missing)
          assert.include(missingLine, "strata tablets delete: no table nope in the cluster")
          assert.notInclude(missingLine, "--verbose")
          assert.include(
            yield* ok(["tablets", "delete", "nope", "--if-exists"]),
            "OK: no table nope in the cluster: nothing deleted"
          )
          assert.deepStrictEqual(yield* json(["tablets", "delete", "nope", "--if-exists"]), {
            table: "nope",
            deleted: false,
            tablets: 0
          })
          assert.deepStrictEqual(yield* json(["tablets", "delete", "beta", "--if-exists"]), {
            table: "beta",
            deleted: true,
            tablets: 2
          })
          yield* awaitMetadata(c, "beta", "beta gone", (m) => m.tablets.length === 0)

          // A healthy cluster: status with both coordinators and one leader, no filter selects a tablet.
          const metadata = yield* awaitMetadata(c, "alpha", "every tablet online with a full ISR", (m) =>
            m.tablets.every((t) => t.leader !== null && t.isr.length === 3)
          )
          const healthy = yield* json<Status>(["cluster", "status"])
          assert.deepStrictEqual(
            healthy.coordinators.map((x) => x.id),
            [101, 102]
          )
          assert.strictEqual(healthy.leader?.epoch, metadata.coordinatorEpoch)
          assert.deepStrictEqual(
            healthy.coordinators.filter((x) => x.leader).map((x) => x.id),
            [healthy.leader!.id]
          )
          assert.deepStrictEqual(
            healthy.servers.map((s) => s.id),
            [1, 2, 3]
          )
          assert.deepStrictEqual(healthy.down, [])
          assert.deepStrictEqual(healthy.tablets, {
            total: 4,
            offline: 0,
            underReplicated: 0,
            underMinIsr: 0,
            deleting: 0
          })
          const healthyText = yield* ok(["cluster", "status"])
          assert.include(
            healthyText,
            `coordinators\t2 registered\tleader ${healthy.leader!.id}\tcoordinator epoch ${metadata.coordinatorEpoch}\n`
          )
          assert.include(healthyText, "tablet servers\t3 live\t0 down\n")
          assert.include(
            healthyText,
            "tablets\t4\toffline 0\tunder-replicated 0\tunder min ISR 0 (minInsyncReplicas 2)"
          )
          // Through the coordinators' addresses alone (the coordination URL here reaches nothing): the standby asked
          // first names the controller; an address where nothing listens is passed over.
          const standby = healthy.coordinators.find((x) => !x.leader)!.address
          const apart = { ...env, STRATA_COORDINATION: "zookeeper://127.0.0.1:1" }
          const viaStandby = yield* Effect.promise(() => cli(["tablets", "list", "--bootstrap", standby], apart).exited)
          assert.strictEqual(viaStandby.code, 0, viaStandby.stderr)
          assert.strictEqual(viaStandby.stdout, "alpha\ttablets 4\trf 3\n")
          const pastDead = yield* Effect.promise(
            () =>
              cli(["tablets", "describe", "alpha", "--output", "json", "--bootstrap", `127.0.0.1:1,${standby}`], apart)
                .exited
          )
          assert.strictEqual(pastDead.code, 0, pastDead.stderr)
          assert.lengthOf((JSON.parse(pastDead.stdout) as { tablets: ReadonlyArray<unknown> }).tablets, 4)
          const badBootstrap = yield* Effect.promise(
            () => cli(["tablets", "list", "--bootstrap", "nohost"], apart).exited
          )
          assert.strictEqual(badBootstrap.code, 1)
          assert.include(oneLine(badBootstrap), "bootstrap (from flags): ")

          const balanced = yield* json<{ moved: number }>(["tablets", "balance-leaders"])
          assert.isNumber(balanced.moved)
          for (const filter of ["--under-replicated", "--unavailable", "--under-min-isr"]) {
            assert.strictEqual(yield* ok(["tablets", "describe", "alpha", filter]), "", filter)
          }

          // Server 3 (a replica of every tablet) is killed: every tablet is under-replicated, none below two.
          yield* cluster.kill("tablet-server", 3)
          yield* awaitMetadata(c, "alpha", "server 3 out of every ISR", (m) =>
            m.tablets.every((t) => t.leader !== null && t.isr.length === 2 && !t.isr.includes(3))
          )
          const under = yield* ok(["tablets", "describe", "alpha", "--under-replicated"])
          assert.sameMembers(
            under
              .trimEnd()
              .split("\n")
              .map((line) => line.split("\t")[0]),
            ["alpha:0", "alpha:1", "alpha:2", "alpha:3"]
          )
          assert.notInclude(under, "coordinator epoch")
          const underJson = yield* json<ReplicaRpc.Metadata>(["tablets", "describe", "--under-replicated"])
          assert.lengthOf(underJson.tablets, 4)
          for (const t of underJson.tablets) assert.lengthOf(t.isr, 2)
          assert.strictEqual(yield* ok(["tablets", "describe", "alpha", "--under-min-isr"]), "")
          assert.strictEqual(yield* ok(["tablets", "describe", "alpha", "--unavailable"]), "")
          // The minimum is this command's setting.
          const strict = yield* ok(["tablets", "describe", "alpha", "--under-min-isr", "--set", "minInsyncReplicas=3"])
          assert.lengthOf(strict.trimEnd().split("\n"), 4)
          const degraded = yield* ok(["cluster", "status"])
          assert.include(degraded, "tablet servers\t2 live\t1 down (3)\n")
          assert.include(degraded, "tablets\t4\toffline 0\tunder-replicated 4\tunder min ISR 0")

          // Servers 1 and 2 are killed too: no tablet has a leader.
          yield* Effect.forEach([1, 2], (id) => cluster.kill("tablet-server", id), { concurrency: "unbounded" })
          yield* awaitMetadata(c, "alpha", "no tablet with a leader", (m) => m.tablets.every((t) => t.leader === null))
          const offline = yield* ok(["tablets", "describe", "alpha", "--unavailable"])
          assert.lengthOf(offline.trimEnd().split("\n"), 4)
          assert.match(offline, /^alpha:0\tOfflineTablet\tleader none\t/m)
          const down = yield* json<Status>(["cluster", "status"])
          assert.deepStrictEqual(down.servers, [])
          assert.deepStrictEqual(down.down, [1, 2, 3])
          assert.strictEqual(down.tablets?.offline, 4)
          assert.strictEqual(down.tablets?.underReplicated, 4)
        })
      ),
    300_000
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
