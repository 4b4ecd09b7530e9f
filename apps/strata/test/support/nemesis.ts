/**
 * The process-level nemesis run: 3 coordinators and 5 tablet servers as child processes (RF 3, minInsyncReplicas
 * 2), producers writing at acks=all and recording every send's outcome, and a nemesis that, for `durationMs`,
 * kills -9 random servers, the server leading the most tablets and coordinators, pauses servers and coordinators
 * past the session timeout (SIGSTOP, then SIGCONT), and restarts the dead on their data directories. One seed draws
 * every choice, and every run prints it.
 *
 * When the faults stop, everything is restarted or resumed; liveness is asserted (every tablet leads with its full
 * ISR and takes a write), then the checker reads every replica's log.
 */
import type { TabletClient } from "@strata/replica"
import { Duration, Effect, Fiber } from "effect"
import { type Prng, seeded } from "../../../../scripts/test-support/prng.js"
import { awaitMetadata, client, faultSettings, record } from "./clusterTest.js"
import type { ProcessCluster } from "../../../../scripts/test-support/processCluster.js"
import * as Checker from "./replicaChecker.js"

/** What a run did and found. */
export interface NemesisResult {
  readonly seed: number
  readonly faults: ReadonlyArray<string>
  readonly sends: { readonly ok: number; readonly failed: number; readonly unknown: number }
  readonly report: Checker.Report
  /** Every tablet took a write after the faults stopped. */
  readonly liveAfter: boolean
}

const SERVERS = [1, 2, 3, 4, 5]
const COORDINATORS = [101, 102, 103]

/** Runs the nemesis for `durationMs` on `cluster` (nothing started yet) with a table of `tablets` tablets. */
export const run = (
  cluster: ProcessCluster,
  options: { readonly namespace: string; readonly seed: number; readonly durationMs: number; readonly tablets: number }
) =>
  Effect.gen(function* () {
    const random = seeded(options.seed)
    const table = "nemesis"
    yield* Effect.forEach(COORDINATORS, (id) => cluster.start("coordinator", id), { concurrency: "unbounded" })
    yield* Effect.forEach(SERVERS, (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
    const c = yield* client(options.namespace, 20_000)
    const created = yield* c.createTable(table, { buckets: options.tablets })
    const tablets = created.map((t) => t.tablet)
    yield* awaitMetadata(c, table, "the table online", (m) => m.tablets.every((t) => t.isr.length === 3))

    // Producers: each sends 1–4 records at a time to a tablet it draws, recording the outcome.
    const acked: Array<Checker.Acked> = []
    const sends = { ok: 0, failed: 0, unknown: 0 }
    let stop = false
    const producer = (p: number) =>
      Effect.gen(function* () {
        const own = seeded(options.seed ^ (p * 0x9e3779b1))
        let n = 0
        while (!stop) {
          const tablet = own.pick(tablets)
          const values = Array.from({ length: own.int(1, 4) }, () => `p${p}-${n++}`)
          const result = yield* Effect.result(c.send(tablet, values.map(record)))
          if (result._tag === "Success") {
            sends.ok++
            acked.push({ tablet, baseOffset: result.success.baseOffset, values })
          } else if (result.failure.reason._tag === "DeliveryUnknown") sends.unknown++
          else sends.failed++
        }
      })
    const producers = yield* Effect.forEach([0, 1, 2, 3], (p) => Effect.forkChild(producer(p)))

    const faults: Array<string> = []
    const deadline = Date.now() + options.durationMs
    const pauseMs = () => faultSettings.sessionTimeoutMs + random.int(500, 3_000)
    while (Date.now() < deadline) {
      yield* Effect.sleep(Duration.millis(random.int(1_000, 3_000)))
      const fault = yield* nextFault(cluster, random, c, table, pauseMs)
      if (fault !== undefined)
        faults.push(`${Math.round((options.durationMs - (deadline - Date.now())) / 1000)}s ${fault}`)
    }

    // Heal: everything runs again; the cluster must become whole and take writes.
    for (const id of SERVERS) cluster.resume("tablet-server", id)
    for (const id of COORDINATORS) cluster.resume("coordinator", id)
    for (const id of COORDINATORS) if (!cluster.isRunning("coordinator", id)) yield* cluster.start("coordinator", id)
    for (const id of SERVERS) if (!cluster.isRunning("tablet-server", id)) yield* cluster.start("tablet-server", id)
    stop = true
    yield* Effect.forEach(producers, Fiber.join, { discard: true })
    yield* awaitMetadata(c, table, "every tablet leading with its full ISR after the faults", (m) =>
      m.tablets.every((t) => t.leader !== null && t.isr.length === t.replicas.length)
    )
    const final = yield* Effect.forEach(
      tablets,
      (tablet) =>
        Effect.result(c.send(tablet, [record(`final-${tablet.bucket}`)])).pipe(
          Effect.map((r) => {
            if (r._tag === "Success")
              acked.push({ tablet, baseOffset: r.success.baseOffset, values: [`final-${tablet.bucket}`] })
            return r._tag === "Success"
          })
        ),
      { concurrency: "unbounded" }
    )
    const report = yield* Checker.check(c, table, acked)
    return { seed: options.seed, faults, sends, report, liveAfter: final.every((ok) => ok) } satisfies NemesisResult
  })

/** Draws and applies one fault (or a restart of the dead, when too many are down); what it did. */
const nextFault = (
  cluster: ProcessCluster,
  random: Prng,
  c: TabletClient.TabletClientShape,
  table: string,
  pauseMs: () => number
) =>
  Effect.gen(function* () {
    const downServers = SERVERS.filter((id) => !cluster.isRunning("tablet-server", id))
    const downCoordinators = COORDINATORS.filter((id) => !cluster.isRunning("coordinator", id))
    // At most two servers and one coordinator down at once: the dead come back first.
    if (downServers.length >= 2 || (downServers.length > 0 && random.chance(0.5))) {
      yield* cluster.start("tablet-server", random.pick(downServers))
    }
    if (downCoordinators.length > 0 && random.chance(0.6)) {
      yield* cluster.start("coordinator", random.pick(downCoordinators))
    }
    const liveServers = SERVERS.filter(
      (id) => cluster.isRunning("tablet-server", id) && !cluster.isPaused("tablet-server", id)
    )
    const liveCoordinators = COORDINATORS.filter(
      (id) => cluster.isRunning("coordinator", id) && !cluster.isPaused("coordinator", id)
    )
    const kind = random.pick([
      "kill-server",
      "kill-leader-server",
      "pause-server",
      "kill-coordinator",
      "pause-coordinator"
    ])
    if ((kind === "kill-coordinator" || kind === "pause-coordinator") && liveCoordinators.length >= 2) {
      const id = random.pick(liveCoordinators)
      if (kind === "kill-coordinator") {
        yield* cluster.kill("coordinator", id)
        return `kill -9 coordinator ${id}`
      }
      const ms = pauseMs()
      cluster.pause("coordinator", id)
      yield* Effect.forkDetach(
        Effect.delay(
          Effect.sync(() => cluster.resume("coordinator", id)),
          Duration.millis(ms)
        )
      )
      return `SIGSTOP coordinator ${id} for ${ms} ms`
    }
    if (liveServers.length <= 3) return undefined
    if (kind === "kill-leader-server") {
      const m = yield* Effect.option(c.metadata(table))
      const leads = new Map<number, number>()
      if (m._tag === "Some")
        for (const t of m.value.tablets) if (t.leader !== null) leads.set(t.leader, (leads.get(t.leader) ?? 0) + 1)
      const id = [...leads.entries()].filter(([id]) => liveServers.includes(id)).sort((a, b) => b[1] - a[1])[0]?.[0]
      if (id !== undefined) {
        yield* cluster.kill("tablet-server", id)
        return `kill -9 server ${id} (leading ${leads.get(id)} tablets)`
      }
    }
    const id = random.pick(liveServers)
    if (kind === "pause-server") {
      const ms = pauseMs()
      cluster.pause("tablet-server", id)
      yield* Effect.forkDetach(
        Effect.delay(
          Effect.sync(() => cluster.resume("tablet-server", id)),
          Duration.millis(ms)
        )
      )
      return `SIGSTOP server ${id} for ${ms} ms`
    }
    yield* cluster.kill("tablet-server", id)
    return `kill -9 server ${id}`
  })
