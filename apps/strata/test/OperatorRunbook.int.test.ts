/**
 * The seed's three operations as docs/OPERATIONS.md tells an operator to run and watch them, on real processes (the
 * CLI's coordinators and RocksDB tablet servers on ZooKeeper), checked only through what an operator has: the logs,
 * `/metrics`, `/readyz` and `/cluster` of each process's ops endpoint.
 *
 * 1. Cold start in the seed's order (ZooKeeper, three coordinators at once, then the servers): exactly one coordinator
 *    leads, its epoch the same in its log ("Became coordinator leader with epoch N") and on its `/metrics`
 *    (`strata_controller_coordinator_epoch`), the others standing by; every process ready by `/readyz`.
 * 2. kill -9 of the server leading the most tablets (found on the servers' `strata_server_leader_count`): the
 *    controller's `strata_controller_under_replicated_tablets` rises, every tablet takes an acks=all write again (the
 *    seconds until then printed, a figure, not an assertion), the server restarted, under-replicated back to 0, and
 *    every acknowledged record read back.
 * 3. Scale-out: two servers join; `strata_controller_tablet_distribution` shows them holding nothing (rebalance, which
 *    would move replicas onto them, is not built yet) while `/cluster` lists them as live.
 */
import { assert, describe, it } from "@effect/vitest"
import * as ZooKeeperCoordination from "@strata/election/zookeeper"
import { Effect } from "effect"
import { inject } from "vitest"
import { client, cliProcesses, writeEach, zooKeeperCluster } from "./support/clusterTest.js"
import { all, eventually, getJson, opsAddress, scrape, value } from "./support/opsScrape.js"
import * as Checker from "./support/replicaChecker.js"

const processes = cliProcesses()

const COORDINATORS = [101, 102, 103]
const SERVERS = [1, 2, 3]
const JOINING = [4, 5]
const TABLETS = 12

describe("the operator's runbook on real processes", () => {
  it.live(
    "cold start in the seed's order, kill -9 of the busiest server, scale-out: watched through logs, /metrics, /readyz and /cluster",
    () =>
      Effect.gen(function* () {
        const { cluster, namespace } = yield* zooKeeperCluster(processes, "runbook")
        const ops = (kind: "coordinator" | "tablet-server", id: number) =>
          Effect.promise(() => eventually(`${kind} ${id}'s ops endpoint`, async () => opsAddress(cluster, kind, id)))
        const ready = (address: string) =>
          Effect.promise(() =>
            eventually(`${address} ready`, async () =>
              (await getJson(address, "/readyz")).status === 200 ? true : undefined
            )
          )

        // (1) Cold start: the three coordinators at once, then the servers.
        yield* Effect.forEach(COORDINATORS, (id) => cluster.start("coordinator", id), { concurrency: "unbounded" })
        const coordinatorOps = new Map<number, string>()
        for (const id of COORDINATORS) coordinatorOps.set(id, yield* ops("coordinator", id))
        const leading = yield* Effect.promise(() =>
          eventually("one active controller", async () => {
            const active = await Promise.all(
              COORDINATORS.map(
                async (id) => [id, value(await scrape(coordinatorOps.get(id)!), "strata_controller_active")] as const
              )
            )
            const leaders = active.filter(([, a]) => a === 1)
            return leaders.length === 1 && active.every(([, a]) => a === 0 || a === 1) ? leaders[0]![0] : undefined
          })
        )
        const epochInLog = [
          ...cluster.log("coordinator", leading).matchAll(/Became coordinator leader with epoch (\d+)/g)
        ]
        assert.strictEqual(epochInLog.length, 1, "the leader's log names its epoch once")
        const leaderMetrics = yield* Effect.promise(() => scrape(coordinatorOps.get(leading)!))
        assert.strictEqual(value(leaderMetrics, "strata_controller_coordinator_epoch"), Number(epochInLog[0]![1]))
        for (const id of COORDINATORS.filter((c) => c !== leading)) {
          const log = cluster.log("coordinator", id)
          assert.notMatch(log, /Became coordinator leader/, `coordinator ${id} never led`)
          assert.match(log, /candidate node created/, `coordinator ${id} campaigns`)
          const standby = yield* Effect.promise(() => scrape(coordinatorOps.get(id)!))
          assert.lengthOf(all(standby, "strata_controller_tablet_distribution"), 0, "a standby reports no distribution")
          const clusterView = yield* Effect.promise(() => getJson(coordinatorOps.get(id)!, "/cluster"))
          assert.strictEqual(clusterView.status, 503, "a standby's /cluster names the leader instead")
        }
        yield* Effect.forEach(SERVERS, (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
        const serverOps = new Map<number, string>()
        for (const id of SERVERS) serverOps.set(id, yield* ops("tablet-server", id))
        for (const address of [...coordinatorOps.values(), ...serverOps.values()]) yield* ready(address)

        // (2) kill -9 of the server leading the most tablets.
        const c = yield* client(namespace)
        const created = yield* c.createTable("runbook", { buckets: TABLETS, replicationFactor: 3 })
        const tablets = created.map((t) => t.tablet)
        const leaderOps = coordinatorOps.get(leading)!
        yield* Effect.promise(() =>
          eventually("every tablet online with a full ISR", async () => {
            const m = await scrape(leaderOps)
            return value(m, "strata_controller_tablets") === TABLETS &&
              value(m, "strata_controller_under_replicated_tablets") === 0 &&
              value(m, "strata_controller_offline_tablets") === 0
              ? true
              : undefined
          })
        )
        const acked: Array<Checker.Acked> = [...(yield* writeEach(c, tablets, "before"))]
        assert.strictEqual(acked.length, TABLETS)
        const leaderCounts = yield* Effect.promise(() =>
          Promise.all(
            SERVERS.map(
              async (id) => [id, value(await scrape(serverOps.get(id)!), "strata_server_leader_count")] as const
            )
          )
        )
        assert.strictEqual(
          leaderCounts.reduce((acc, [, n]) => acc + n, 0),
          TABLETS,
          "the servers' leader counts add up to the tablets"
        )
        const [busiest, led] = [...leaderCounts].sort((a, b) => b[1] - a[1])[0]!
        const killedAt = Date.now()
        yield* cluster.kill("tablet-server", busiest)
        yield* Effect.promise(() =>
          eventually(
            "under-replicated tablets on the controller",
            async () =>
              value(await scrape(leaderOps), "strata_controller_under_replicated_tablets") === TABLETS
                ? true
                : undefined,
            90_000
          )
        )
        // Every tablet writable again: each takes an acks=all write (retried until it does).
        let pending = tablets
        while (pending.length > 0 && Date.now() - killedAt < 120_000) {
          const written = yield* writeEach(c, pending, `after-${Date.now()}`)
          acked.push(...written)
          const done = new Set(written.map((w) => w.tablet.bucket))
          pending = pending.filter((t) => !done.has(t.bucket))
        }
        assert.lengthOf(pending, 0, "every tablet takes a write after the kill")
        const writableSeconds = (Date.now() - killedAt) / 1000
        console.log(
          `runbook: server ${busiest} (leading ${led} of ${TABLETS} tablets) killed; every tablet writable again after ${writableSeconds.toFixed(1)} s`
        )
        yield* cluster.start("tablet-server", busiest)
        serverOps.set(busiest, yield* ops("tablet-server", busiest))
        yield* ready(serverOps.get(busiest)!)
        yield* Effect.promise(() =>
          eventually(
            "under-replicated back to 0",
            async () =>
              value(await scrape(leaderOps), "strata_controller_under_replicated_tablets") === 0 ? true : undefined,
            90_000
          )
        )
        const report = yield* Checker.check(c, "runbook", acked)
        assert.deepStrictEqual(report.lost, [], "no acknowledged record lost")
        assert.deepStrictEqual(report.duplicates, [], "none written twice")
        assert.deepStrictEqual(report.divergent, [], "the replicas agree")

        // (3) Scale-out: two servers join and hold nothing until a rebalance moves replicas onto them.
        yield* Effect.forEach(JOINING, (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
        const joined = yield* Effect.promise(() =>
          eventually("the joining servers on the controller", async () => {
            const m = await scrape(leaderOps)
            return value(m, "strata_controller_live_servers") === SERVERS.length + JOINING.length ? m : undefined
          })
        )
        for (const id of JOINING) {
          assert.strictEqual(
            value(joined, "strata_controller_tablet_distribution", { server: String(id), kind: "replicas" }),
            0,
            `server ${id} holds nothing yet`
          )
        }
        const view = yield* Effect.promise(() => getJson(leaderOps, "/cluster"))
        assert.deepStrictEqual(view.body.liveServers, [...SERVERS, ...JOINING])
      }).pipe(Effect.scoped, Effect.provide(ZooKeeperCoordination.layer({ connectString: inject("zookeeper") }))),
    300_000
  )
})
