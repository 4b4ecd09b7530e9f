// Strata's replicated tablets as processes, next to a 3-broker Kafka on the same machine (docs/ARCHITECTURE.md,
// "Benchmarks"). Needs ZooKeeper (Strata's coordination) and the 3-broker Kafka of scripts/services:
//   ./dev services up zookeeper kafka3 && ./dev bench:replica
//
// 1. produce: acks=all, RF 3, min ISR 2, 12 partitions/tablets, 3 servers/brokers on loopback, records of 100 B and
//    1 KB (16-byte keys), RECORDS records each, in calls of BATCH records with IN_FLIGHT calls outstanding, record i to
//    partition i % 12. Strata: 1 coordinator + 3 `strata tablet-server` processes on segment files, the client a
//    `TabletClient` (idempotent, acks all, linger 0). Kafka: 3 combined broker/controller JVMs, the client
//    @platformatic/kafka's idempotent Producer (acks -1), the same records per call. Runs alternate (strata, kafka,
//    then reversed) after an untimed warm-up of each side (at least 6 whole runs, until two in a row agree within 10%: Kafka's
//    JVMs take millions of records to reach their pace); each figure is the median. Latency is per call (BATCH records), p50 and p99 over every call of
//    every run. CPU: each side's server processes (from /proc, user + system) and the client process. Before each run,
//    `sync` writes the dirty page cache out, so no run pays for writing back the other side's data.
// 2. failover: 200 tablets RF 3 over 3 servers; the server leading most is killed with SIGKILL, KILLS times (each
//    time restarted, back in every ISR and leading its preferred tablets again before the next): the time until
//    every tablet took an acks=all write, median and p99, next to the session timeout (sessionTimeout 4000 ms); the
//    time from the restart until leadership is back on the preferred replicas, next to the check interval.
// 3. catch-up: one follower of 12 tablets killed, the others take appends for CATCHUP_SECONDS; it is restarted and
//    the time until it is back in every ISR gives its catch-up rate, next to the leaders' append rate.
// 4. takeover: 10 000 tablets in ZooKeeper, then 100 more written: a standby's warm view catches up (what a new
//    controller reads before it acts), next to a cold read of every tablet (a controller without the view).
// 5. log: core's `Log` protocol (what Tables uses) on both sides, `StrataLog` on the tablets next to `KafkaLog` on the
//    3 brokers: produce, a group-less read of the whole topic (checked record by record), and a Tables restore of a
//    changelog (bench/replicaLog.ts says how).
//
// Environment (the results file is written only with the defaults):
//   BENCH_RECORDS (200000), BENCH_BATCH (1000), BENCH_IN_FLIGHT (4), BENCH_RUNS (2), BENCH_KILLS (10),
//   BENCH_CATCHUP_SECONDS (10), BENCH_ZOOKEEPER (127.0.0.1:2181), BENCH_KAFKA3 (127.0.0.1:19092,…19094), BENCH_PARTS
//   (produce,failover,catchup,takeover,log), BENCH_KEEP (set: keep the processes' data and logs); the log part's own
//   BENCH_LOG_RECORDS, BENCH_RESTORE_RECORDS and BENCH_LOG_ROUNDS (bench/replicaLog.ts)
import { Coordination, type Models } from "../packages/core/src/index.js"
import type { ReplicaManager } from "../packages/replica/src/index.js"
import { execFileSync } from "node:child_process"
import { readFileSync, readdirSync } from "node:fs"
import { createRequire } from "node:module"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import * as ZooKeeperCoordination from "../packages/election/src/ZooKeeperCoordination.js"
import { Controller, ControllerView } from "../packages/replica/src/index.js"
import { CoordinationElection } from "../packages/election/src/index.js"
import { Effect } from "effect"
import { awaitTable, createTable, type StrataSide, startStrata } from "./strataCluster.js"
import {
  type BenchOutput,
  collectGarbage,
  envInt,
  envString,
  type Figure,
  median,
  progress,
  randomBytes,
  round3
} from "./lib.js"

/** The `@platformatic/kafka` module (the Kafka side's admin and producer). */
export type Platformatic = typeof import("../packages/kafka/node_modules/@platformatic/kafka/dist/index.js")

const DEFAULTS = {
  records: 200_000,
  batch: 1000,
  inFlight: 4,
  runs: 2,
  kills: 10,
  catchupSeconds: 10,
  zookeeper: "127.0.0.1:2181",
  kafka3: "127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094"
} as const
/** Partitions (tablets) of every produce topic. */
export const PARTITIONS = 12
const KEY_BYTES = 16
/** The Strata cluster's replication settings (Kafka's topics: RF 3, min ISR 2). */
export const SETTINGS = {
  replicationFactor: 3,
  minInsyncReplicas: 2,
  sessionTimeout: 4_000,
  replicaLagTimeMax: 12_000,
  appendTimeout: 10_000,
  // Leaders go back to their preferred replicas within a second of being back in the ISR, every one of them.
  leaderImbalanceCheckInterval: 1_000,
  leaderImbalancePercent: 0
} as const

/** How many records a produce run sends, in calls of `batch` records with `inFlight` calls outstanding. */
export interface Plan {
  readonly records: number
  readonly batch: number
  readonly inFlight: number
}

/**
 * Writes the page cache's dirty pages out before a timed run: the two sides share one disk, and a run must not pay
 * for writing back what the other side's last run left.
 */
export const settleDisk = () => execFileSync("sync")

/** One produce run's figures. */
export interface Run {
  readonly seconds: number
  readonly latenciesMs: ReadonlyArray<number>
  /** CPU seconds of the servers, and of the client process. */
  readonly serverCpu: number
  readonly clientCpu: number
}

/** The `p`th percentile of some samples (nearest rank). */
export const percentile = (samples: ReadonlyArray<number>, p: number): number => {
  if (samples.length === 0) return Number.NaN
  const sorted = [...samples].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!
}

/** CPU seconds (user + system) a process used so far, from /proc (0 once it is gone). */
const cpuOf = (pid: number): number => {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ")
    return (Number(fields[11]) + Number(fields[12])) / 100
  } catch {
    return 0
  }
}
/** CPU seconds (user + system) some processes used so far. */
export const cpuOfAll = (pids: ReadonlyArray<number>) => pids.reduce((n, pid) => n + cpuOf(pid), 0)
/** CPU seconds (user + system) this process used so far. */
export const clientCpu = () => {
  const u = process.cpuUsage()
  return (u.user + u.system) / 1e6
}

/** The children of a process (the 3 JVMs under the kafka3 wrapper). */
const childrenOf = (pid: number): Array<number> =>
  readdirSync(`/proc/${pid}/task`).flatMap((task) => {
    try {
      return readFileSync(`/proc/${pid}/task/${task}/children`, "utf8").trim().split(/\s+/).filter(Boolean).map(Number)
    } catch {
      return []
    }
  })

/** Runs `send(start, end)` over every batch, `inFlight` at a time; the latency of each call. */
export const produceAll = async (plan: Plan, send: (start: number, end: number) => Promise<unknown>) => {
  const latencies: Array<number> = []
  let next = 0
  const worker = async () => {
    while (next < plan.records) {
      const start = next
      next = Math.min(plan.records, start + plan.batch)
      const t = performance.now()
      await send(start, next)
      latencies.push(performance.now() - t)
    }
  }
  await Promise.all(Array.from({ length: plan.inFlight }, worker))
  return latencies
}

/** Record i's key: 16 bytes, `key-` and i in 12 digits. */
export const keyOf = (i: number) => Buffer.from(`key-${String(i).padStart(12, "0")}`, "latin1")

// ---------------------------------------------------------------------------
// Strata
// ---------------------------------------------------------------------------

export const strataProduce = async (side: StrataSide, plan: Plan, valueBytes: number, table: string): Promise<Run> => {
  const values = randomBytes(valueBytes * 64, 0x5eed)
  const tablets: Array<Models.TabletId> = Array.from({ length: PARTITIONS }, (_, bucket) => ({ table, bucket }))
  const servers = side.cluster.running("tablet-server").map((id) => side.cluster.pid("tablet-server", id)!)
  const cpu0 = cpuOfAll(servers)
  const client0 = clientCpu()
  const t0 = performance.now()
  const latencies = await produceAll(plan, (start, end) => {
    const byTablet = new Map<number, Array<ReplicaManager.TabletRecord>>()
    for (let i = start; i < end; i++) {
      const p = i % PARTITIONS
      let list = byTablet.get(p)
      if (list === undefined) {
        list = []
        byTablet.set(p, list)
      }
      const v = (i % 64) * valueBytes
      list.push({ key: keyOf(i), value: values.subarray(v, v + valueBytes), headers: [], timestamp: 0 })
    }
    return side.run(
      Effect.all(
        [...byTablet].map(([p, records]) => side.client.send(tablets[p]!, records)),
        { concurrency: "unbounded" }
      )
    )
  })
  const seconds = (performance.now() - t0) / 1000
  return { seconds, latenciesMs: latencies, serverCpu: cpuOfAll(servers) - cpu0, clientCpu: clientCpu() - client0 }
}

// ---------------------------------------------------------------------------
// Kafka
// ---------------------------------------------------------------------------

/** Resolves packages as `@strata/kafka` does (its `@platformatic/kafka`). */
export const kafkaRequire = createRequire(new URL("../packages/kafka/package.json", import.meta.url))

/** The 3 broker JVMs of scripts/services' kafka3. */
export const kafkaPids = (): Array<number> => {
  const wrapper = Number(readFileSync(join(process.cwd(), ".services", "kafka3", "pid"), "utf8").trim())
  return childrenOf(wrapper)
}

const kafkaProduce = async (
  pk: Platformatic,
  brokers: ReadonlyArray<string>,
  plan: Plan,
  valueBytes: number
): Promise<Run> => {
  const topic = `strata-bench-replica-${process.pid}-${Date.now()}-${valueBytes}`
  const admin = new pk.Admin({ clientId: "strata-bench-admin", bootstrapBrokers: [...brokers] })
  await admin.createTopics({
    topics: [topic],
    partitions: PARTITIONS,
    replicas: 3,
    configs: [{ name: "min.insync.replicas", value: "2" }]
  })
  for (let attempt = 0; ; attempt++) {
    const md = await admin.metadata({ topics: [topic], forceUpdate: true }).catch(() => undefined)
    const info = md?.topics.get(topic)
    if (info?.partitions.every((p) => p.leader >= 0 && p.isr.length === 3)) break
    if (attempt > 300) throw new Error(`${topic}: not fully replicated after 30 s`)
    await new Promise((r) => setTimeout(r, 100))
  }
  const values = randomBytes(valueBytes * 64, 0x5eed)
  const producer = new pk.Producer({
    clientId: "strata-bench-replica",
    bootstrapBrokers: [...brokers],
    idempotent: true,
    acks: -1,
    timeout: 30_000,
    retries: 3
  })
  const servers = kafkaPids()
  try {
    // One small send first: the producer's metadata and its producer id are outside the timed part.
    await producer.send({ messages: [{ topic, partition: 0, key: keyOf(0), value: values.subarray(0, valueBytes) }] })
    const cpu0 = cpuOfAll(servers)
    const client0 = clientCpu()
    const t0 = performance.now()
    const latencies = await produceAll(plan, (start, end) => {
      const messages = new Array<{ topic: string; partition: number; key: Buffer; value: Buffer }>(end - start)
      for (let i = start; i < end; i++) {
        const v = (i % 64) * valueBytes
        messages[i - start] = {
          topic,
          partition: i % PARTITIONS,
          key: keyOf(i),
          value: values.subarray(v, v + valueBytes)
        }
      }
      return producer.send({ messages })
    })
    const seconds = (performance.now() - t0) / 1000
    return { seconds, latenciesMs: latencies, serverCpu: cpuOfAll(servers) - cpu0, clientCpu: clientCpu() - client0 }
  } finally {
    await producer.close()
    await admin.deleteTopics({ topics: [topic] }).catch(() => undefined)
    await admin.close()
  }
}

// ---------------------------------------------------------------------------
// The three parts
// ---------------------------------------------------------------------------

const producePart = async (plan: Plan, runs: number, zookeeper: string, brokers: ReadonlyArray<string>) => {
  const pk = (await import(pathToFileURL(kafkaRequire.resolve("@platformatic/kafka")).href)) as Platformatic
  const strata = await startStrata("produce", 3, zookeeper, SETTINGS)
  const figures: Array<Figure> = []
  const details: Record<string, unknown> = {}
  try {
    for (const valueBytes of [100, 1000]) {
      const s: Array<Run> = []
      const k: Array<Run> = []
      // Untimed warm-up of each side (the JVMs' JIT above all, which takes millions of records to settle): whole
      // runs until two in a row are within 10% of each other, at least 6 (a cold 3-broker Kafka's first runs can agree
      // with each other at a third of its pace) and at most 15.
      await createTable(strata, `warmup-${valueBytes}`, PARTITIONS)
      const warm = async (label: string, once: () => Promise<Run>) => {
        const rates: Array<number> = []
        while (rates.length < 15) {
          settleDisk()
          rates.push(plan.records / (await once()).seconds)
          const [a, b] = rates.slice(-2)
          if (rates.length >= 6 && a !== undefined && b !== undefined && Math.abs(a - b) <= 0.1 * Math.max(a, b)) break
        }
        progress(`warm-up ${valueBytes} B ${label}: ${rates.map((r) => Math.round(r)).join(", ")} records/s`)
      }
      await warm("strata", () => strataProduce(strata, plan, valueBytes, `warmup-${valueBytes}`))
      await warm("kafka", () => kafkaProduce(pk, brokers, plan, valueBytes))
      for (let r = 0; r < runs; r++) {
        const order = r % 2 === 0 ? ["strata", "kafka"] : ["kafka", "strata"]
        for (const side of order) {
          collectGarbage()
          settleDisk()
          if (side === "strata") {
            const table = `produce-${valueBytes}-${r}`
            await createTable(strata, table, PARTITIONS)
            s.push(await strataProduce(strata, plan, valueBytes, table))
          } else {
            k.push(await kafkaProduce(pk, brokers, plan, valueBytes))
          }
          const last = (side === "strata" ? s : k).at(-1)!
          progress(
            `produce ${valueBytes} B ${side}: ${Math.round(plan.records / last.seconds)} records/s, p99 ${round3(percentile(last.latenciesMs, 99))} ms, server CPU ${round3(last.serverCpu)} s, client CPU ${round3(last.clientCpu)} s`
          )
        }
      }
      const rate = (runs: ReadonlyArray<Run>) => median(runs.map((r) => plan.records / r.seconds))
      const lat = (runs: ReadonlyArray<Run>, p: number) =>
        percentile(
          runs.flatMap((r) => r.latenciesMs),
          p
        )
      const recordBytes = valueBytes + KEY_BYTES
      const sr = rate(s)
      const kr = rate(k)
      figures.push(
        {
          bench: `replica.produce.${valueBytes}B.records_per_s`,
          value: round3(sr),
          unit: "records/s",
          baseline: round3(kr),
          ratio: round3(sr / kr)
        },
        {
          bench: `replica.produce.${valueBytes}B.MB_per_s`,
          value: round3((sr * recordBytes) / 1e6),
          unit: "MB/s",
          baseline: round3((kr * recordBytes) / 1e6),
          ratio: round3(sr / kr)
        },
        {
          bench: `replica.produce.${valueBytes}B.p50_ms`,
          value: round3(lat(s, 50)),
          unit: "ms per call",
          baseline: round3(lat(k, 50)),
          ratio: round3(lat(s, 50) / lat(k, 50))
        },
        {
          bench: `replica.produce.${valueBytes}B.p99_ms`,
          value: round3(lat(s, 99)),
          unit: "ms per call",
          baseline: round3(lat(k, 99)),
          ratio: round3(lat(s, 99) / lat(k, 99))
        },
        {
          bench: `replica.produce.${valueBytes}B.server_cpu_s_per_100k`,
          value: round3((median(s.map((r) => r.serverCpu)) * 100_000) / plan.records),
          unit: "CPU s per 100k records (3 servers)",
          baseline: round3((median(k.map((r) => r.serverCpu)) * 100_000) / plan.records)
        },
        {
          bench: `replica.produce.${valueBytes}B.client_cpu_s_per_100k`,
          value: round3((median(s.map((r) => r.clientCpu)) * 100_000) / plan.records),
          unit: "CPU s per 100k records (client)",
          baseline: round3((median(k.map((r) => r.clientCpu)) * 100_000) / plan.records)
        }
      )
      details[`produce${valueBytes}`] = {
        strata: s.map((r) => ({
          seconds: round3(r.seconds),
          serverCpu: round3(r.serverCpu),
          clientCpu: round3(r.clientCpu)
        })),
        kafka: k.map((r) => ({
          seconds: round3(r.seconds),
          serverCpu: round3(r.serverCpu),
          clientCpu: round3(r.clientCpu)
        }))
      }
    }
  } finally {
    await strata.close()
  }
  return { figures, details }
}

/** Sends one record to every tablet until each took one; the time when the last did. */
const everyTabletWrites = async (side: StrataSide, tablets: ReadonlyArray<Models.TabletId>, since: number) => {
  const times = await side.run(
    Effect.forEach(
      tablets,
      (tablet) =>
        Effect.map(
          side.client.send(tablet, [{ key: null, value: Buffer.from("probe"), headers: [], timestamp: 0 }]),
          () => Date.now()
        ),
      { concurrency: "unbounded" }
    )
  )
  return Math.max(...times) - since
}

const failoverPart = async (kills: number, zookeeper: string) => {
  const side = await startStrata("failover", 3, zookeeper, SETTINGS)
  const tablets: Array<Models.TabletId> = Array.from({ length: 200 }, (_, bucket) => ({ table: "failover", bucket }))
  const writable: Array<number> = []
  const led: Array<number> = []
  const rejoined: Array<number> = []
  const balanced: Array<number> = []
  try {
    await createTable(side, "failover", 200)
    await everyTabletWrites(side, tablets, Date.now())
    for (let k = 0; k < kills; k++) {
      const m = await side.run(side.client.metadata("failover"))
      const leads = new Map<number, number>()
      for (const t of m.tablets) if (t.leader !== null) leads.set(t.leader, (leads.get(t.leader) ?? 0) + 1)
      const [victim, count] = [...leads].sort((a, b) => b[1] - a[1])[0]!
      const t0 = Date.now()
      await side.run(side.cluster.kill("tablet-server", victim))
      const ms = await everyTabletWrites(side, tablets, t0)
      writable.push(ms)
      led.push(count)
      const r0 = Date.now()
      await side.run(side.cluster.start("tablet-server", victim))
      await awaitTable(side, "failover", (t) => t.isr.length === t.replicas.length)
      rejoined.push(Date.now() - r0)
      // The controller's periodic check moves leadership back to the preferred replicas (the first of each).
      await awaitTable(side, "failover", (t) => t.leader === t.replicas[0])
      balanced.push(Date.now() - r0)
      progress(
        `failover ${k + 1}/${kills}: server ${victim} led ${count}; every tablet writable after ${ms} ms; back in every ISR ${rejoined.at(-1)} ms and leading its preferred tablets ${balanced.at(-1)} ms after its restart`
      )
    }
  } finally {
    await side.close()
  }
  return {
    figures: [
      {
        bench: "replica.failover.all_writable_ms.median",
        value: round3(median(writable)),
        unit: "ms",
        baseline: SETTINGS.sessionTimeout,
        ratio: round3(median(writable) / SETTINGS.sessionTimeout),
        tabletsLedByVictim: round3(median(led))
      },
      {
        bench: "replica.failover.all_writable_ms.p99",
        value: round3(percentile(writable, 99)),
        unit: "ms",
        baseline: SETTINGS.sessionTimeout,
        ratio: round3(percentile(writable, 99) / SETTINGS.sessionTimeout)
      },
      {
        bench: "replica.failover.rejoin_ms.median",
        value: round3(median(rejoined)),
        unit: "ms (restart to back in every ISR)"
      },
      {
        bench: "replica.failover.leaders_back_ms.median",
        value: round3(median(balanced)),
        unit: "ms (restart to leading every tablet it is preferred for)",
        baseline: SETTINGS.leaderImbalanceCheckInterval,
        ratio: round3(median(balanced) / SETTINGS.leaderImbalanceCheckInterval)
      }
    ] satisfies Array<Figure>,
    details: { failover: { writableMs: writable, ledByVictim: led, rejoinMs: rejoined, leadersBackMs: balanced } }
  }
}

/** Tablet servers a takeover benchmark never reaches: its tablets have no live replica. */
const unreached: Controller.TabletServersShape = {
  leaderAndIsr: () => Effect.void,
  logEnd: () => Effect.succeed({ lastEpoch: null, logEndOffset: 0 }),
  holdings: () => Effect.succeed({ tablets: [] }),
  stopReplica: () => Effect.void
}

/**
 * A standby's warm view against a cold read of every tablet, catching up on ZooKeeper after `changed` tablet writes
 * among `tablets`: what a new controller pays before it can act, with and without the view.
 */
const takeoverPart = async (tablets: number, changed: number, zookeeper: string) => {
  const namespace = `/bench-takeover-${Date.now()}`
  const specs = (table: string, count: number) =>
    Array.from({ length: count }, (_, bucket) => ({ tablet: { table, bucket }, replicas: [1, 2, 3] }))
  const program = Effect.gen(function* () {
    const election = yield* CoordinationElection.make({
      namespace: namespace.slice(1),
      sessionTimeout: "10 seconds",
      replicaLagTimeMax: "30 seconds"
    })
    const warm = yield* ControllerView.make({ namespace, keepWarm: { retryBackoff: "100 millis" } })
    const leadership = yield* election.campaign({ serverId: 1, address: "bench" })
    const controller = yield* Controller.make(leadership, {
      namespace,
      uncleanLeaderElection: false,
      minInsyncReplicas: 1,
      retryBackoff: "100 millis",
      resign: Effect.void
    }).pipe(Effect.provideService(Controller.TabletServers, unreached))
    for (let i = 0; i < tablets; i += 1000) {
      yield* controller.createTablets(specs(`t${i}`, Math.min(1000, tablets - i)))
    }
    while ((yield* warm.stats).tablets < tablets) yield* Effect.sleep("50 millis")
    yield* controller.createTablets(specs("late", changed))
    const session = yield* (yield* Coordination.Coordination).session()
    const timed = <A, E>(self: Effect.Effect<A, E>) =>
      Effect.gen(function* () {
        const started = performance.now()
        const result = yield* self
        return { result, ms: performance.now() - started }
      })
    // The warm view first, right after the writes: its watch has had no time to read them yet.
    const warmSync = yield* timed(warm.sync(session))
    const cold = yield* ControllerView.make({ namespace })
    const coldSync = yield* timed(cold.sync(session))
    return { warmSync, coldSync }
  })
  const { warmSync, coldSync } = await Effect.runPromise(
    Effect.scoped(program).pipe(Effect.provide(ZooKeeperCoordination.layer({ connectString: zookeeper })))
  )
  progress(
    `takeover: ${tablets + changed} tablets; warm view read ${warmSync.result.read} in ${round3(warmSync.ms)} ms, a cold read ${coldSync.result.read} in ${round3(coldSync.ms)} ms`
  )
  return {
    figures: [
      {
        bench: "replica.takeover.catch_up_ms",
        value: round3(warmSync.ms),
        unit: `ms (a standby's warm view after ${changed} tablet writes, ${tablets + changed} tablets)`,
        baseline: round3(coldSync.ms),
        ratio: round3(warmSync.ms / coldSync.ms),
        tabletsRead: warmSync.result.read,
        baselineTabletsRead: coldSync.result.read
      }
    ] satisfies Array<Figure>,
    details: { takeover: { tablets: tablets + changed, changed } }
  }
}

const catchupPart = async (seconds: number, zookeeper: string) => {
  const side = await startStrata("catchup", 3, zookeeper, SETTINGS)
  try {
    await createTable(side, "catchup", PARTITIONS)
    const tablets: Array<Models.TabletId> = Array.from({ length: PARTITIONS }, (_, bucket) => ({
      table: "catchup",
      bucket
    }))
    await side.run(side.cluster.kill("tablet-server", 3))
    await awaitTable(side, "catchup", (t) => !t.isr.includes(3) && t.leader !== null)
    const values = randomBytes(100 * 64, 7)
    let appended = 0
    const t0 = performance.now()
    const until = t0 + seconds * 1000
    await Promise.all(
      Array.from({ length: 4 }, async (_, w) => {
        let i = w
        while (performance.now() < until) {
          const records: Array<ReplicaManager.TabletRecord> = Array.from({ length: 1000 }, (_, j) => ({
            key: keyOf(i * 1000 + j),
            value: values.subarray((j % 64) * 100, (j % 64) * 100 + 100),
            headers: [],
            timestamp: 0
          }))
          await side.run(side.client.send(tablets[i % PARTITIONS]!, records))
          appended += records.length
          i += 4
        }
      })
    )
    const appendRate = appended / ((performance.now() - t0) / 1000)
    const r0 = performance.now()
    await side.run(side.cluster.start("tablet-server", 3))
    await awaitTable(side, "catchup", (t) => t.isr.includes(3), 600_000)
    const catchupSeconds = (performance.now() - r0) / 1000
    const catchupRate = appended / catchupSeconds
    progress(
      `catch-up: ${appended} records appended at ${Math.round(appendRate)}/s while server 3 was down; it caught up in ${round3(catchupSeconds)} s (${Math.round(catchupRate)} records/s, process start included)`
    )
    return {
      figures: [
        {
          bench: "replica.catchup.records_per_s",
          value: round3(catchupRate),
          unit: "records/s (restart to back in every ISR)",
          baseline: round3(appendRate),
          ratio: round3(catchupRate / appendRate),
          records: appended
        }
      ] satisfies Array<Figure>,
      details: { catchup: { appended, appendRate: round3(appendRate), catchupSeconds: round3(catchupSeconds) } }
    }
  } finally {
    await side.close()
  }
}

export const run = async (): Promise<BenchOutput & { readonly save: boolean }> => {
  const plan: Plan = {
    records: envInt("BENCH_RECORDS", DEFAULTS.records),
    batch: envInt("BENCH_BATCH", DEFAULTS.batch),
    inFlight: envInt("BENCH_IN_FLIGHT", DEFAULTS.inFlight)
  }
  const runs = envInt("BENCH_RUNS", DEFAULTS.runs)
  const kills = envInt("BENCH_KILLS", DEFAULTS.kills)
  const catchupSeconds = envInt("BENCH_CATCHUP_SECONDS", DEFAULTS.catchupSeconds)
  const zookeeper = envString("BENCH_ZOOKEEPER") ?? DEFAULTS.zookeeper
  const brokers = (envString("BENCH_KAFKA3") ?? DEFAULTS.kafka3).split(",")
  const save =
    plan.records === DEFAULTS.records &&
    plan.batch === DEFAULTS.batch &&
    plan.inFlight === DEFAULTS.inFlight &&
    runs === DEFAULTS.runs &&
    kills === DEFAULTS.kills &&
    catchupSeconds === DEFAULTS.catchupSeconds
  const parts = (envString("BENCH_PARTS") ?? "produce,failover,catchup,takeover,log").split(",")
  const figures: Array<Figure> = []
  const details: Record<string, unknown> = { plan, settings: SETTINGS }
  if (parts.includes("produce")) {
    const p = await producePart(plan, runs, zookeeper, brokers)
    figures.push(...p.figures)
    Object.assign(details, p.details)
  }
  if (parts.includes("failover")) {
    const f = await failoverPart(kills, zookeeper)
    figures.push(...f.figures)
    Object.assign(details, f.details)
  }
  if (parts.includes("catchup")) {
    const c = await catchupPart(catchupSeconds, zookeeper)
    figures.push(...c.figures)
    Object.assign(details, c.details)
  }
  if (parts.includes("takeover")) {
    const t = await takeoverPart(10_000, 100, zookeeper)
    figures.push(...t.figures)
    Object.assign(details, t.details)
  }
  let logDefaults = true
  if (parts.includes("log")) {
    const l = await (await import("./replicaLog.js")).logPart(plan, zookeeper, brokers)
    figures.push(...l.figures)
    Object.assign(details, l.details)
    logDefaults = l.defaults
  }
  return {
    results: figures,
    details,
    save: save && logDefaults && parts.length === 5
  }
}
