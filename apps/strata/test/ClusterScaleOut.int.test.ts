/**
 * The seed's third operation as real processes, the rebalance running by itself (ZooKeeper, three coordinators,
 * RocksDB tablet servers, scaled to a 2-core machine):
 *
 * 1. 48 tablets (RF 3) on three servers, filled and under a steady acks=all load; three servers join; the trigger
 *    starts a rebalance within one check interval; it runs in batches through the stability gate, its adding
 *    replicas throttled; the leading coordinator is killed (-9) mid-rebalance and the next one finishes it; the final
 *    distribution is the planner's optimum (24 replicas and 8 leaders a server); every acknowledged record is read
 *    back exactly once from every in-sync replica. The produce p99 before, during and after, the time to balance,
 *    the bytes moved against their lower bound and the movers' fetch rate against the throttle are logged.
 * 2. A gate failure: while a batch runs, an original server is stopped (SIGSTOP): the batch is rolled back (no tablet
 *    left moving, the batch's tablets on their original replicas) and the rebalance pauses; the server resumed,
 *    `POST /rebalance/resume` on the coordinator's ops endpoint finishes it.
 */
import { Models } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import * as ZooKeeperCoordination from "@strata/election/zookeeper"
import type { RebalanceService } from "@strata/rebalance"
import type { ReplicaRpc, TabletClient } from "@strata/replica"
import { Duration, Effect, Fiber, Ref } from "effect"
import { inject } from "vitest"
import type * as ProcessCluster from "../../../scripts/test-support/processCluster.js"
import {
  awaitMetadata,
  cliProcesses,
  client,
  quantile,
  record,
  steadyLoad,
  zooKeeperCluster
} from "./support/clusterTest.js"
import { cli, clusterEnv } from "./support/cliRun.js"
import { opsAddress } from "./support/opsScrape.js"
import * as Checker from "./support/replicaChecker.js"

const processes = cliProcesses()

const TABLE = "scale"
const COORDINATORS = [101, 102, 103]
/** Bytes each tablet is filled with before the servers join (so moves copy something the throttle can cap). */
const FILL_BYTES = 128 * 1024
const THROTTLE = 256 * 1024

/** The rebalance settings the test runs with: checks and gates in seconds, the movers throttled. */
const rebalanceSettings = {
  rebalanceCheckInterval: 5_000,
  rebalanceGateWindow: 2_000,
  rebalanceCooldown: 5_000,
  rebalanceMaxConcurrentMigrations: 4,
  rebalanceThrottleBytesPerSec: THROTTLE,
  rebalanceMoveTimeout: 120_000,
  // The test machine (two cores, nine processes) is saturated by design: latency up to 10× its baseline passes.
  rebalanceGateLatencyFactor: 10
} as const

type Client = TabletClient.TabletClientShape

/** The rebalance status from the leading coordinator. */
const status = (c: Client) => Effect.map(c.rebalance({ action: "status" }), (s) => s)

/** Polls the status until `ok` holds (every 250 ms, up to `timeoutMs`). */
const awaitStatus = (
  c: Client,
  what: string,
  ok: (s: RebalanceService.Status) => boolean,
  timeoutMs = 240_000
): Effect.Effect<RebalanceService.Status, Error> =>
  Effect.gen(function* () {
    const deadline = Date.now() + timeoutMs
    let last: RebalanceService.Status | undefined
    while (Date.now() < deadline) {
      const s = yield* Effect.option(status(c))
      if (s._tag === "Some") {
        last = s.value
        if (ok(s.value)) return s.value
      }
      yield* Effect.sleep(Duration.millis(250))
    }
    return yield* Effect.fail(new Error(`${what}: not within ${timeoutMs} ms; last status ${JSON.stringify(last)}`))
  })

const phase = (s: RebalanceService.Status) => s.rebalance?.phase

/** Fills every tablet with `bytes` of records (acks=all, 8 KB records); the acknowledged sends. */
const fill = (c: Client, tablets: ReadonlyArray<Models.TabletId>, bytes: number) =>
  Effect.map(
    Effect.forEach(
      tablets,
      (tablet) =>
        Effect.gen(function* () {
          const acked: Array<Checker.Acked> = []
          for (let i = 0; i * 8192 < bytes; i++) {
            const value = `fill:${tablet.bucket}:${i}:`.padEnd(8192, "x")
            const sent = yield* c.send(tablet, [record(value)])
            acked.push({ tablet, baseOffset: sent.baseOffset, values: [value] })
          }
          return acked
        }),
      { concurrency: 8 }
    ),
    (all) => all.flat()
  )

/** The coordinator leading at `epoch`, from its log. */
const leaderAt = (cluster: ProcessCluster.ProcessCluster, epoch: number) =>
  COORDINATORS.find((id) =>
    new RegExp(`Became coordinator leader with epoch ${epoch}\\b`).test(cluster.log("coordinator", id))
  )

/** Replicas and leaders per server. */
const distribution = (m: ReplicaRpc.Metadata) => {
  const replicas = new Map<number, number>()
  const leaders = new Map<number, number>()
  for (const t of m.tablets) {
    for (const s of t.replicas) replicas.set(s, (replicas.get(s) ?? 0) + 1)
    if (t.leader !== null) leaders.set(t.leader, (leaders.get(t.leader) ?? 0) + 1)
  }
  const sorted = (counts: Map<number, number>) => [...counts].sort((a, b) => a[0] - b[0]).map(([, n]) => n)
  return { replicas: sorted(replicas), leaders: sorted(leaders) }
}

/** A tablet's first move as the metadata showed it: when it was first seen under way, when it ended, its target. */
interface SeenMove {
  readonly startMs: number
  endMs?: number
  readonly target: ReadonlyArray<number>
}

/** Watches the metadata every 250 ms while `running`: each tablet's first move (later ones are leadership moves). */
const watchMoves = (c: Client, running: Ref.Ref<boolean>) =>
  Effect.gen(function* () {
    const moves = new Map<string, SeenMove>()
    while (yield* Ref.get(running)) {
      const m = yield* Effect.option(c.metadata(TABLE))
      if (m._tag === "Some") {
        const now = Date.now()
        for (const t of m.value.tablets) {
          const key = Models.tabletKey(t.tablet)
          const seen = moves.get(key)
          if (t.target !== undefined && seen === undefined) moves.set(key, { startMs: now, target: t.target })
          else if (t.target === undefined && seen !== undefined && seen.endMs === undefined) seen.endMs = now
        }
      }
      yield* Effect.sleep(Duration.millis(250))
    }
    return [...moves.values()]
  })

/**
 * The highest copy rate onto `server`, bytes a second: its moves' intervals merged where they overlap, each merged
 * interval's bytes (`bytesEach` a move) over its length.
 */
const peakRate = (moves: ReadonlyArray<SeenMove>, server: number, bytesEach: number): number => {
  const onto = moves
    .filter((m) => m.target.includes(server) && m.endMs !== undefined)
    .sort((a, b) => a.startMs - b.startMs)
  let peak = 0
  let i = 0
  while (i < onto.length) {
    const start = onto[i]!.startMs
    let end = onto[i]!.endMs!
    let count = 0
    while (i < onto.length && onto[i]!.startMs <= end) {
      end = Math.max(end, onto[i]!.endMs!)
      count++
      i++
    }
    peak = Math.max(peak, (count * bytesEach) / (Math.max(250, end - start) / 1000))
  }
  return peak
}

describe("scale-out by the rebalance service", () => {
  it.live(
    "48 tablets on 3 servers under load, 3 join: the trigger starts a rebalance that runs in gated, throttled batches, survives the leading coordinator's kill -9 and ends at the planner's optimum; every acknowledged record read back once",
    () =>
      Effect.gen(function* () {
        const { cluster, namespace } = yield* zooKeeperCluster(processes, "scaleout", rebalanceSettings)
        const body = Effect.gen(function* () {
          yield* Effect.forEach(COORDINATORS, (id) => cluster.start("coordinator", id), { concurrency: "unbounded" })
          yield* Effect.forEach([1, 2, 3], (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
          const c = yield* client(namespace)
          const created = yield* c.createTable(TABLE, { buckets: 48, replicationFactor: 3 })
          const tablets = created.map((t) => t.tablet)
          yield* awaitMetadata(c, TABLE, "every tablet online with a full ISR", (m) =>
            m.tablets.every((t) => t.leader !== null && t.isr.length === 3)
          )
          const filled = yield* fill(c, tablets, FILL_BYTES)
          const running = yield* Ref.make(true)
          const load = yield* Effect.forkScoped(steadyLoad(c, tablets, running))
          const watching = yield* Ref.make(true)
          const watch = yield* Effect.forkScoped(watchMoves(c, watching))
          yield* Effect.sleep(Duration.seconds(3)) // the load's latency before
          const before = yield* status(c)
          assert.isUndefined(before.rebalance, "no rebalance before the servers join")

          const joinedAt = Date.now()
          yield* Effect.forEach([4, 5, 6], (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
          const joined = Date.now()
          const started = yield* awaitStatus(c, "the trigger started a rebalance", (s) => s.rebalance !== undefined)
          const startedAt = Date.now()
          assert.strictEqual(started.rebalance!.reason, "empty-server")
          assert.isAtMost(
            startedAt - joined,
            rebalanceSettings.rebalanceCheckInterval + 5_000,
            "the trigger fired within one check interval of the joins (and a status poll)"
          )

          // Mid-rebalance (a batch past the first running), the leading coordinator is killed.
          const mid = yield* awaitStatus(c, "the second batch under way", (s) => (s.rebalance?.batch ?? 0) >= 2)
          const epoch = (yield* c.metadata(TABLE)).coordinatorEpoch
          const leading = leaderAt(cluster, epoch)
          assert.isDefined(leading, `the coordinator leading at epoch ${epoch}`)
          yield* cluster.kill("coordinator", leading!)
          // The imbalance after is measured just after the end (a read of the cluster): waited for too.
          const done = yield* awaitStatus(
            c,
            "the rebalance completed under the next coordinator, its imbalance after measured",
            (s) => phase(s) === "completed" && s.imbalanceAfter !== undefined
          )
          assert.strictEqual(done.rebalance!.id, mid.rebalance!.id, "the same rebalance, not a new one")
          const balancedAt = Date.now()
          const successor = leaderAt(cluster, (yield* c.metadata(TABLE)).coordinatorEpoch)
          assert.isDefined(successor)
          assert.notStrictEqual(successor, leading)
          assert.include(
            cluster.log("coordinator", successor!),
            `rebalance ${mid.rebalance!.id}: taken over`,
            "the successor took the stored rebalance over"
          )
          const r = done.rebalance!
          assert.strictEqual(r.movesDone, r.movesTotal, JSON.stringify(r))
          assert.isAtLeast(r.batches, 5)
          assert.strictEqual(done.imbalanceAfter, 0, JSON.stringify(done))

          // The planner's optimum: 48 × 3 replicas over 6 servers, 24 each; 8 leaders each.
          const final = yield* awaitMetadata(c, TABLE, "no tablet moving", (m) =>
            m.tablets.every((t) => t.target === undefined && t.isr.length === 3)
          )
          assert.deepStrictEqual(distribution(final), {
            replicas: [24, 24, 24, 24, 24, 24],
            leaders: [8, 8, 8, 8, 8, 8]
          })

          yield* Effect.sleep(Duration.seconds(3)) // the load's latency after
          yield* Ref.set(running, false)
          yield* Ref.set(watching, false)
          const { acked, timed } = yield* Fiber.join(load)
          const moves = yield* Fiber.join(watch)
          const report = yield* Checker.check(c, TABLE, [...filled, ...acked])
          assert.isAbove(acked.length, 100, "the load ran throughout")
          assert.deepStrictEqual(report.lost, [])
          assert.deepStrictEqual(report.duplicates, [])
          assert.deepStrictEqual(report.divergent, [])
          assert.strictEqual(report.acked, filled.length + acked.length)

          // Figures: produce p99 before / during / after, time to balance, bytes against the lower bound, fetch rate.
          const p99 = (from: number, to: number) =>
            quantile(
              timed.filter((t) => t.atMs >= from && t.atMs < to).map((t) => t.latencyMs),
              0.99
            )
          const tabletBytes = FILL_BYTES + 8192 // filled, plus a few load records
          const lowerBoundBytes = 72 * FILL_BYTES // 72 replicas must land on the new servers
          const rates = [4, 5, 6].map((server) => peakRate(moves, server, tabletBytes))
          yield* Effect.logInfo(
            [
              `scale-out 3 → 6 (48 tablets RF 3, ${FILL_BYTES} bytes each): balanced ${((balancedAt - joinedAt) / 1000).toFixed(1)} s after the joins`,
              `${r.movesTotal} moves in ${r.batches} batches, ${r.bytesMoved} bytes moved (lower bound ${lowerBoundBytes})`,
              `produce p99 before ${p99(0, joinedAt)} ms, during ${p99(startedAt, balancedAt)} ms, after ${p99(balancedAt, Date.now())} ms (${acked.length} acknowledged sends)`,
              `movers' peak copy rate (bytes/s) ${rates.map((x) => x.toFixed(0)).join(", ")} against the throttle ${THROTTLE}`
            ].join("; ")
          )
          assert.isAtLeast(r.bytesMoved, lowerBoundBytes)
          for (const rate of rates)
            assert.isAtMost(rate, THROTTLE * 1.5, "a mover's fetch rate stays near the throttle")
        })
        return yield* body.pipe(Effect.tapError(() => Effect.logError(cluster.logTails(60))))
      }).pipe(Effect.scoped, Effect.provide(ZooKeeperCoordination.layer({ connectString: inject("zookeeper") }))),
    600_000
  )

  it.live(
    "a server stopped mid-batch fails the stability gate: the batch rolls back and the rebalance pauses; resumed over HTTP it completes",
    () =>
      Effect.gen(function* () {
        const { cluster, namespace } = yield* zooKeeperCluster(processes, "scalegate", {
          ...rebalanceSettings,
          rebalanceMaxConcurrentMigrations: 2,
          rebalanceThrottleBytesPerSec: 32 * 1024, // moves of seconds each: the stop lands mid-batch
          rebalanceBatchRatio: 0.5
        })
        const body = Effect.gen(function* () {
          yield* cluster.start("coordinator", 101)
          yield* Effect.forEach([1, 2, 3], (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
          const c = yield* client(namespace)
          const created = yield* c.createTable(TABLE, { buckets: 12, replicationFactor: 3 })
          const tablets = created.map((t) => t.tablet)
          yield* awaitMetadata(c, TABLE, "every tablet online with a full ISR", (m) =>
            m.tablets.every((t) => t.leader !== null && t.isr.length === 3)
          )
          const filled = yield* fill(c, tablets, FILL_BYTES)
          const running = yield* Ref.make(true)
          const load = yield* Effect.forkScoped(steadyLoad(c, tablets, running, 2))
          yield* cluster.start("tablet-server", 4)
          // A batch under way with moves in flight.
          const inFlight = yield* awaitStatus(
            c,
            "a move under way",
            (s) => phase(s) === "running" && (s.rebalance?.movesActive ?? 0) > 0
          )
          const batch = inFlight.rebalance!.batch
          cluster.pause("tablet-server", 1)
          const paused = yield* awaitStatus(c, "the rebalance paused by its gate", (s) => phase(s) === "paused")
          cluster.resume("tablet-server", 1)
          const p = paused.rebalance!
          yield* Effect.logInfo(`the gate paused the rebalance: ${p.detail}`)
          assert.include(p.detail ?? "", "stability gate failed")
          assert.isAtLeast(p.gateFailures, 1)
          assert.strictEqual(p.rollbacks, 1)
          assert.strictEqual(p.batch, batch, "paused in the batch that failed")
          assert.strictEqual(p.movesActive, 0)
          const after = yield* c.metadata(TABLE)
          assert.deepStrictEqual(
            after.tablets.filter((t) => t.target !== undefined).map((t) => Models.tabletKey(t.tablet)),
            [],
            "no tablet left moving"
          )
          // Server 4 holds only what earlier batches moved (none of the rolled-back batch's moves).
          const onFour = after.tablets.filter((t) => t.replicas.includes(4)).length
          assert.isAtMost(onFour, p.movesDone)

          // Resumed over the ops endpoint, once the stopped server is back in every ISR.
          yield* awaitMetadata(c, TABLE, "server 1 back in every ISR", (m) =>
            m.tablets.every((t) => !t.replicas.includes(1) || t.isr.includes(1))
          )
          const ops = opsAddress(cluster, "coordinator", 101)
          const resumed = yield* Effect.promise(() => fetch(`http://${ops}/rebalance/resume`, { method: "POST" }))
          assert.strictEqual(resumed.status, 200, yield* Effect.promise(() => resumed.text()))
          yield* awaitStatus(c, "the resumed rebalance completed", (s) => phase(s) === "completed")
          const text = yield* Effect.promise(
            () => cli(processes.runner(), ["rebalance", "status"], clusterEnv(namespace)).exited
          )
          assert.strictEqual(text.code, 0, text.stderr)
          assert.match(text.stdout, /completed, batch \d+ of \d+/)
          assert.match(text.stdout, /stability gate: \d+ failures, 1 batches rolled back/)
          // Nothing to pause now: one line, exit 1; an unknown goal over HTTP: 409 naming it.
          const pause = yield* Effect.promise(
            () => cli(processes.runner(), ["rebalance", "pause"], clusterEnv(namespace)).exited
          )
          assert.strictEqual(pause.code, 1)
          assert.include(pause.stderr, "no rebalance is in progress")
          const badGoal = yield* Effect.promise(() =>
            fetch(`http://${ops}/rebalance?goals=replica-count,speed`, { method: "POST" })
          )
          assert.strictEqual(badGoal.status, 409)
          assert.include(yield* Effect.promise(() => badGoal.text()), "unknown goal speed")

          yield* Ref.set(running, false)
          const { acked } = yield* Fiber.join(load)
          const report = yield* Checker.check(c, TABLE, [...filled, ...acked])
          assert.deepStrictEqual(report.lost, [])
          assert.deepStrictEqual(report.duplicates, [])
        })
        return yield* body.pipe(Effect.tapError(() => Effect.logError(cluster.logTails(60))))
      }).pipe(Effect.scoped, Effect.provide(ZooKeeperCoordination.layer({ connectString: inject("zookeeper") }))),
    480_000
  )
})
