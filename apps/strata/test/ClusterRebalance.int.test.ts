/**
 * The seed's third operation with real processes (ZooKeeper, three coordinators, RocksDB tablet servers), its moves
 * applied by hand as an operator would: a table of 24 tablets (RF 3) on three servers under a steady acks=all load;
 * two servers join; `strata rebalance plan` finds the fewest moves; each is applied with `strata tablets reassign`,
 * the leading coordinator killed (-9) while one is under way (its new replica stopped, so the move cannot finish
 * first), and that move finishes under the next coordinator; a move to a server that is then killed is cancelled, the
 * tablet back on its original replicas; every acknowledged record is read back from every in-sync replica, once.
 */
import { Models } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import * as ZooKeeperCoordination from "@strata/election/zookeeper"
import { Effect, Fiber, Ref } from "effect"
import { inject } from "vitest"
import { awaitMetadata, cliProcesses, client, steadyLoad, zooKeeperCluster } from "./support/clusterTest.js"
import { cli, clusterEnv } from "./support/cliRun.js"
import { eventually } from "./support/opsScrape.js"
import * as Checker from "./support/replicaChecker.js"

const processes = cliProcesses()

const TABLE = "moves"
const BUCKETS = 24
const COORDINATORS = [101, 102, 103]

interface Change {
  readonly tablet: Models.TabletId
  readonly from: ReadonlyArray<number>
  readonly to: ReadonlyArray<number>
}

describe("rebalancing real processes by hand", () => {
  it.live(
    "24 tablets on 3 servers under load, 2 join: the planned moves applied with tablets reassign, one finishing under the next coordinator after the leader's kill -9, one cancelled after its new server's kill; every acknowledged record read back once",
    () =>
      Effect.gen(function* () {
        // By hand, as an operator applying a plan would: the trigger off, or its own rebalance (on the joins) moves
        // the same tablets and neither plan's end is ever reached.
        const { cluster, namespace } = yield* zooKeeperCluster(processes, "moves", { rebalanceEnabled: false })
        const body = Effect.gen(function* () {
          yield* Effect.forEach(COORDINATORS, (id) => cluster.start("coordinator", id), { concurrency: "unbounded" })
          yield* Effect.forEach([1, 2, 3], (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
          const c = yield* client(namespace)
          const created = yield* c.createTable(TABLE, { buckets: BUCKETS, replicationFactor: 3 })
          const tablets = created.map((t) => t.tablet)
          yield* awaitMetadata(c, TABLE, "every tablet online with a full ISR", (m) =>
            m.tablets.every((t) => t.leader !== null && t.isr.length === 3)
          )
          const running = yield* Ref.make(true)
          const load = yield* Effect.forkScoped(steadyLoad(c, tablets, running))
          yield* Effect.forEach([4, 5], (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
          yield* awaitMetadata(c, TABLE, "five servers registered", (m) => m.servers.length === 5)
          const env = clusterEnv(namespace)
          const run = (args: ReadonlyArray<string>) => Effect.promise(() => cli(processes.runner(), args, env).exited)

          // 72 replicas, 24 on each of three servers; balanced is 15, 15, 14, 14, 14: 10 + 10 + 10 − 2 = 28 moves.
          const planned = yield* run(["rebalance", "plan", "--json"])
          assert.strictEqual(planned.code, 0, planned.stderr)
          const plan = JSON.parse(planned.stdout).plan as {
            readonly changes: ReadonlyArray<Change>
            readonly figures: { readonly replicaMoves: number; readonly lowerBound: number }
          }
          assert.deepStrictEqual([plan.figures.replicaMoves, plan.figures.lowerBound], [28, 28])
          const reassign = (change: Change) =>
            run(["tablets", "reassign", TABLE, String(change.tablet.bucket), "--replicas", change.to.join(",")])

          // The first move's new replica is stopped (SIGSTOP) so the move is under way when the leading
          // coordinator is killed; resumed at once, it catches up while no coordinator leads.
          const [first, ...rest] = plan.changes
          assert.isDefined(first)
          const adding = first!.to.find((s) => !first!.from.includes(s))!
          const deposed = (yield* c.metadata(TABLE)).coordinatorEpoch
          const leading = COORDINATORS.find((id) =>
            new RegExp(`Became coordinator leader with epoch ${deposed}\\b`).test(cluster.log("coordinator", id))
          )
          assert.isDefined(leading, `the coordinator leading at epoch ${deposed}`)
          cluster.pause("tablet-server", adding)
          const accepted = yield* reassign(first!)
          assert.strictEqual(accepted.code, 0, accepted.stderr)
          yield* cluster.kill("coordinator", leading!)
          cluster.resume("tablet-server", adding)
          const key = Models.tabletKey(first!.tablet)
          const after = yield* awaitMetadata(
            c,
            TABLE,
            `${key} moved to [${first!.to}] under the next coordinator`,
            (m) =>
              m.coordinatorEpoch > deposed &&
              m.tablets.some((t) => Models.tabletKey(t.tablet) === key && t.target === undefined)
          )
          const moved = after.tablets.find((t) => Models.tabletKey(t.tablet) === key)!
          assert.deepStrictEqual(moved.replicas, first!.to)
          // The metadata shows the move done as soon as the controller's step made it; its log line follows.
          const logged = () =>
            COORDINATORS.find((id) =>
              cluster.log("coordinator", id).includes(`${key}: moved to [${first!.to.join(",")}]`)
            )
          const successor = yield* Effect.promise(() => eventually("the move's log line", async () => logged()))
          assert.isDefined(successor, "the next coordinator's controller finished the move")
          assert.notStrictEqual(successor, leading)

          // The rest, one command each.
          for (const change of rest) {
            const r = yield* reassign(change)
            assert.strictEqual(r.code, 0, `${Models.tabletKey(change.tablet)}: ${r.stderr}`)
          }
          const balanced = yield* awaitMetadata(c, TABLE, "every planned move finished", (m) =>
            plan.changes.every((change) =>
              m.tablets.some(
                (t) =>
                  Models.tabletKey(t.tablet) === Models.tabletKey(change.tablet) &&
                  t.target === undefined &&
                  t.replicas.join(",") === change.to.join(",")
              )
            )
          )
          const counts = new Map<number, number>()
          for (const t of balanced.tablets) for (const s of t.replicas) counts.set(s, (counts.get(s) ?? 0) + 1)
          assert.deepStrictEqual(
            [...counts.values()].sort((a, b) => a - b),
            [14, 14, 14, 15, 15]
          )

          // A move to server 5, stopped then killed before it copies anything, is cancelled: back where it was.
          const victim = balanced.tablets.find((t) => !t.replicas.includes(5) && t.leader !== null)!
          const original = victim.replicas
          const target = [...original.slice(0, 2), 5]
          cluster.pause("tablet-server", 5)
          const toDead = yield* run([
            "tablets",
            "reassign",
            TABLE,
            String(victim.tablet.bucket),
            "--replicas",
            target.join(",")
          ])
          assert.strictEqual(toDead.code, 0, toDead.stderr)
          yield* cluster.kill("tablet-server", 5)
          yield* awaitMetadata(c, TABLE, "server 5 gone", (m) => !m.servers.some((s) => s.id === 5))
          const cancelled = yield* run(["tablets", "reassign", TABLE, String(victim.tablet.bucket), "--cancel"])
          assert.strictEqual(cancelled.code, 0, cancelled.stderr)
          const back = yield* awaitMetadata(c, TABLE, "the cancelled tablet back on its replicas", (m) =>
            m.tablets.some((t) => t.tablet.bucket === victim.tablet.bucket && t.target === undefined)
          )
          const restored = back.tablets.find((t) => t.tablet.bucket === victim.tablet.bucket)!
          assert.deepStrictEqual(restored.replicas, original)
          assert.deepStrictEqual(restored.retired, [5])
          // Server 5 back: it deletes the replica it was given, and takes its planned replicas' place again.
          yield* cluster.start("tablet-server", 5)
          yield* awaitMetadata(
            c,
            TABLE,
            "server 5 back in every ISR, its cancelled replica deleted",
            (m) => m.tablets.every((t) => t.retired === undefined && (!t.replicas.includes(5) || t.isr.includes(5))),
            180_000
          )

          yield* Ref.set(running, false)
          const { acked } = yield* Fiber.join(load)
          const report = yield* Checker.check(c, TABLE, acked)
          yield* Effect.logInfo(
            `rebalance by hand: ${plan.changes.length} tablets moved (${plan.figures.replicaMoves} replica moves, lower bound ${plan.figures.lowerBound}) under a load of ${acked.length} acknowledged sends`
          )
          assert.isAbove(acked.length, 100, "the load ran throughout")
          assert.deepStrictEqual(report.lost, [])
          assert.deepStrictEqual(report.duplicates, [])
          assert.deepStrictEqual(report.divergent, [])
          assert.deepStrictEqual(report.epochConflicts, [])
          assert.strictEqual(report.acked, acked.length)
        })
        return yield* body.pipe(Effect.tapError(() => Effect.logError(cluster.logTails(40))))
      }).pipe(Effect.scoped, Effect.provide(ZooKeeperCoordination.layer({ connectString: inject("zookeeper") }))),
    420_000
  )
})
