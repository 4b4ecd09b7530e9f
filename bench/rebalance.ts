// The rebalance planner against a greedy baseline (docs/ARCHITECTURE.md, "Benchmarks"). No servers: both plan the
// same cluster models in this process.
//
// Shapes (RF 3; every initial placement keeps the rack rule; tablet sizes drawn from a seeded generator, 1–100 MB):
// - scale-out-10: 10 000 tablets on 100 servers in 10 racks (300 replicas each), plus 10 empty servers (the seed's
//   "add 10 servers"), LB 2 720;
// - scale-out-1: the same with 1 empty server, LB 297;
// - small-scale-out: 900 tablets on 9 servers without racks, plus 1 empty, LB 270;
// - drain-1: 100 servers in 10 racks, one of them tagged draining, LB 300 (its replicas).
// The planner is `Planner.planModel` (every goal). The baseline moves replicas the way Cruise Control's and Fluss's
// greedy goals do: draining servers first, then from the most loaded server to the least loaded one that the rack
// rule allows, until every server is within the average ± 9 %. For each: plan time (median of RUNS), replica moves,
// LB, moves / LB, the final coefficient of variation of replica and leader counts, and the hard-rule violations of
// the final placement (a server twice in a tablet, two replicas on a rack, a replica left on a draining server).
//
// With each plan, the executor's schedule (`Batches.schedule` at the default settings: batches of a fifth of the
// moves, 5 moves a server at once): its waves against the sum of the batches' makespan lower bounds, and against
// the whole plan's bound when it runs as one batch.
//
// Part 2, processes (needs ZooKeeper: `./dev services up zookeeper`; BENCH_PROCESSES=0 leaves it out): one
// coordinator and three RocksDB tablet servers holding 48 tablets (RF 3) of BENCH_FILL_KB (256) KB each under a
// steady acks=all load (4 senders, one record at a time); three servers join, and the rebalance service's trigger
// rebalances (checks every 5 s, gate window 3 s, the movers throttled to BENCH_THROTTLE_KB (1024) KB/s): the time
// from the joins to balance, the bytes moved against their lower bound (the 72 replicas the new servers must take),
// and the produce p99 before, during and after, against before.
//
// Environment (the results file is written only with the defaults): BENCH_RUNS (3), BENCH_PROCESSES (1),
// BENCH_FILL_KB (256), BENCH_THROTTLE_KB (1024), BENCH_ZOOKEEPER (127.0.0.1:2181)
import type { Models } from "../packages/core/src/index.js"
import { Batches, Planner, RebalanceConfig } from "../packages/rebalance/src/index.js"
import type { ClusterModel } from "../packages/rebalance/src/index.js"
import { seeded } from "../scripts/test-support/prng.js"
import { Effect } from "effect"
import { type BenchOutput, envInt, envString, type Figure, median, progress, round3 } from "./lib.js"
import { awaitTable, createTable, startStrata } from "./strataCluster.js"

type Model = ClusterModel.ClusterModel

interface Shape {
  readonly name: string
  readonly model: Model
}

/** `servers` servers (in `racks` racks, or none), `perServer` replicas each, then `empty` servers more. */
const shape = (name: string, servers: number, perServer: number, empty: number, racks: number): Shape => {
  const rng = seeded(servers * 1000 + empty)
  const list = Array.from({ length: servers + empty }, (_, i) => ({
    id: i + 1,
    ...(racks > 0 ? { rack: `rack-${i % racks}` } : {})
  }))
  const count = (servers * perServer) / 3
  // Replica k of tablet t on server (t + k·step) mod servers: every server gets perServer replicas, and with
  // step ≡ a non-zero multiple of neither racks, the three land on distinct racks.
  const step = racks > 0 ? Math.floor(servers / 3) + (Math.floor(servers / 3) % racks === 0 ? 1 : 0) : 1
  const tablets = Array.from({ length: count }, (_, t) => {
    const replicas = [0, 1, 2].map((k) => ((t + k * step) % servers) + 1)
    return {
      tablet: { table: "orders", bucket: t },
      replicas,
      leader: replicas[0]!,
      sizeBytes: Math.round(1e6 * (1 + 99 * rng.next() ** 3))
    }
  })
  return { name, model: { servers: list, tablets } }
}

const drain = (base: Shape, server: number): Shape => ({
  name: "drain-1",
  model: {
    servers: base.model.servers.map((s) => (s.id === server ? { ...s, tags: ["draining" as const] } : s)),
    tablets: base.model.tablets
  }
})

/** Replica sets after a plan: the model's, with each change applied. */
const placementOf = (m: Model, plan: Planner.Plan): Array<ReadonlyArray<number>> => {
  const after = m.tablets.map((t) => t.replicas)
  const index = new Map(m.tablets.map((t, i) => [t.tablet.bucket, i] as const))
  for (const c of plan.changes) after[index.get(c.tablet.bucket)!] = c.to
  return after
}

/** Hard-rule violations of a placement: a server twice, two replicas on one rack, a replica on a draining server. */
const violations = (m: Model, placement: ReadonlyArray<ReadonlyArray<number>>): number => {
  const server = new Map(m.servers.map((s) => [s.id, s] as const))
  const racks = new Set(m.servers.filter((s) => !s.tags?.includes("draining")).map((s) => s.rack ?? `own-${s.id}`))
  let bad = 0
  for (const set of placement) {
    if (new Set(set).size !== set.length) bad++
    const perRack = new Map<string, number>()
    for (const id of set) {
      const s = server.get(id)!
      if (s.tags?.includes("draining")) bad++
      const rack = s.rack ?? `own-${id}`
      perRack.set(rack, (perRack.get(rack) ?? 0) + 1)
    }
    const cap = Math.ceil(set.length / racks.size)
    for (const n of perRack.values()) if (n > cap) bad++
  }
  return bad
}

const cv = (counts: ReadonlyArray<number>): number => {
  const mean = counts.reduce((a, b) => a + b, 0) / counts.length
  if (mean === 0) return 0
  return Math.sqrt(counts.reduce((a, c) => a + (c - mean) ** 2, 0) / counts.length) / mean
}

/**
 * The greedy baseline: draining servers emptied first, then one replica at a time from the most loaded server to the
 * least loaded one the rack rule allows, until all are within the average ± 9 % (or no move helps).
 */
const greedy = (m: Model): { readonly placement: Array<Array<number>>; readonly moves: number } => {
  const placement = m.tablets.map((t) => [...t.replicas])
  const draining = new Set(m.servers.filter((s) => s.tags?.includes("draining")).map((s) => s.id))
  const live = m.servers.filter((s) => !draining.has(s.id))
  const rackOf = new Map(m.servers.map((s) => [s.id, s.rack ?? `own-${s.id}`] as const))
  const racks = new Set(live.map((s) => rackOf.get(s.id)!)).size
  const load = new Map<number, number>(m.servers.map((s) => [s.id, 0] as const))
  const on = new Map<number, Set<number>>(m.servers.map((s) => [s.id, new Set<number>()] as const))
  placement.forEach((set, t) => {
    for (const id of set) {
      load.set(id, load.get(id)! + 1)
      on.get(id)!.add(t)
    }
  })
  const fits = (t: number, from: number, to: number): boolean => {
    const set = placement[t]!
    if (set.includes(to)) return false
    const cap = Math.ceil(set.length / racks)
    const rack = rackOf.get(to)!
    const same = set.filter((id) => id !== from && rackOf.get(id) === rack).length
    return same < cap
  }
  let moves = 0
  const move = (t: number, from: number, to: number) => {
    const set = placement[t]!
    set[set.indexOf(from)] = to
    load.set(from, load.get(from)! - 1)
    load.set(to, load.get(to)! + 1)
    on.get(from)!.delete(t)
    on.get(to)!.add(t)
    moves++
  }
  const byLoad = () => [...live].sort((a, b) => load.get(a.id)! - load.get(b.id)! || a.id - b.id)
  for (const d of draining) {
    for (const t of [...on.get(d)!]) {
      const to = byLoad().find((s) => fits(t, d, s.id))
      if (to !== undefined) move(t, d, to.id)
    }
  }
  const total = placement.reduce((n, s) => n + s.length, 0)
  const avg = total / live.length
  for (;;) {
    const sorted = byLoad()
    const most = sorted[sorted.length - 1]!
    const least = sorted[0]!
    if (load.get(most.id)! <= avg * 1.09 && load.get(least.id)! >= avg * 0.91) break
    let moved = false
    for (const to of sorted) {
      if (load.get(to.id)! + 1 >= load.get(most.id)!) break
      const t = [...on.get(most.id)!].find((tablet) => fits(tablet, most.id, to.id))
      if (t !== undefined) {
        move(t, most.id, to.id)
        moved = true
        break
      }
    }
    if (!moved) break
  }
  return { placement, moves }
}

const countsOn = (m: Model, sets: ReadonlyArray<ReadonlyArray<number>>): Array<number> => {
  const live = m.servers.filter((s) => !s.tags?.includes("draining"))
  const count = new Map<number, number>(live.map((s) => [s.id, 0] as const))
  for (const set of sets) for (const id of set) if (count.has(id)) count.set(id, count.get(id)! + 1)
  return [...count.values()]
}

const timed = <A>(f: () => A): { readonly value: A; readonly ms: number } => {
  const t0 = performance.now()
  const value = f()
  return { value, ms: performance.now() - t0 }
}

const measure = (s: Shape, runs: number): Figure => {
  const plannerTimes: Array<number> = []
  const greedyTimes: Array<number> = []
  let plan: Planner.Plan | undefined
  let baseline: ReturnType<typeof greedy> | undefined
  for (let i = 0; i < runs; i++) {
    const p = timed(() => Planner.planModel(s.model))
    if (!("figures" in p.value)) throw new Error(`${s.name}: ${p.value.message}`)
    plan = p.value
    plannerTimes.push(p.ms)
    const g = timed(() => greedy(s.model))
    baseline = g.value
    greedyTimes.push(g.ms)
  }
  const f = plan!.figures
  const planned = placementOf(s.model, plan!)
  const leadersAfter = s.model.tablets.map((t) => [
    plan!.changes.find((c) => c.tablet.bucket === t.tablet.bucket)?.leaderTo ?? t.leader ?? t.replicas[0]!
  ])
  const greedyLeaders = baseline!.placement.map((set, i) => {
    const t = s.model.tablets[i]!
    return [set.includes(t.leader ?? -1) ? t.leader! : set[0]!]
  })
  const lb = f.lowerBound
  const figure: Figure = {
    bench: `rebalance.${s.name}`,
    value: round3(median(plannerTimes)),
    unit: "ms to plan",
    baseline: round3(median(greedyTimes)),
    ratio: round3(median(plannerTimes) / median(greedyTimes)),
    baselineClient: "greedy most-to-least loaded within average ± 9 % (Cruise Control / Fluss goals), same run",
    servers: s.model.servers.length,
    tablets: s.model.tablets.length,
    lowerBound: lb,
    moves: f.replicaMoves,
    movesPerLowerBound: f.movesPerLowerBound === null ? null : round3(f.movesPerLowerBound),
    replicasAboveTarget: f.replicasAboveTarget,
    leaderMoves: f.leaderMoves,
    bytesMovedGB: round3(f.bytesMoved / 1e9),
    cvReplicasBefore: round3(f.replicas.before.cv),
    cvReplicasAfter: round3(cv(countsOn(s.model, planned))),
    cvLeadersAfter: round3(cv(countsOn(s.model, leadersAfter))),
    violations: violations(s.model, planned),
    greedyMoves: baseline!.moves,
    greedyMovesPerLowerBound: lb === 0 ? null : round3(baseline!.moves / lb),
    greedyCvReplicasAfter: round3(cv(countsOn(s.model, baseline!.placement))),
    greedyCvLeadersAfter: round3(cv(countsOn(s.model, greedyLeaders))),
    greedyViolations: violations(s.model, baseline!.placement),
    ...executorFigures(plan!)
  }
  progress(
    `rebalance ${s.name}: planner ${figure.value} ms, ${f.replicaMoves} moves (LB ${lb}), cv ${figure.cvReplicasAfter}; greedy ${figure.baseline} ms, ${baseline!.moves} moves, cv ${figure.greedyCvReplicasAfter}`
  )
  return figure
}

/** The executor's schedule of `plan` at the default settings: waves against the makespan lower bounds. */
const executorFigures = (plan: Planner.Plan) => {
  const limits = RebalanceConfig.defaults
  const batched = Batches.schedule(plan.changes, limits)
  const moving = plan.changes.filter(Batches.movesReplicas)
  const whole = Batches.waves(moving, limits)
  const bound = Batches.makespanLowerBound(moving, limits)
  return {
    executorBatches: batched.batches.length,
    executorWaves: batched.waves,
    executorWavesPerLowerBound: round3(batched.wavesPerLowerBound),
    executorOneBatchWavesPerLowerBound: bound === 0 ? 1 : round3(whole.length / bound)
  }
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** The `q` quantile of `samples` (0 when there are none). */
const quantile = (samples: ReadonlyArray<number>, q: number): number => {
  if (samples.length === 0) return 0
  const sorted = [...samples].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!
}

/** The real-process scale-out 3 → 6 (see the header): its figures. */
const processPart = async (fillKb: number, throttleKb: number): Promise<ReadonlyArray<Figure>> => {
  const replication = {
    replicationFactor: 3,
    minInsyncReplicas: 2,
    sessionTimeout: 6_000,
    replicaLagTimeMax: 12_000,
    appendTimeout: 10_000
  }
  const side = await startStrata(
    "rebalance",
    3,
    envString("BENCH_ZOOKEEPER") ?? "127.0.0.1:2181",
    {
      ...replication,
      rebalanceCheckInterval: 5_000,
      rebalanceGateWindow: 3_000,
      rebalanceCooldown: 60_000,
      rebalanceThrottleBytesPerSec: throttleKb * 1024,
      rebalanceGateLatencyFactor: 10
    },
    replication
  )
  try {
    const table = "scale"
    await createTable(side, table, 48)
    const tablets: Array<Models.TabletId> = Array.from({ length: 48 }, (_, bucket) => ({ table, bucket }))
    const value = new Uint8Array(8 * 1024).fill(120)
    const record = { key: null, value, headers: [], timestamp: 0 }
    // Filled, eight senders at a time.
    const perTablet = Math.ceil(fillKb / 8)
    await side.run(
      Effect.forEach(
        tablets,
        (t) => Effect.forEach(Array.from({ length: perTablet }), () => side.client.send(t, [record])),
        {
          concurrency: 8,
          discard: true
        }
      )
    )
    // The steady load: four senders, one small record at a time, each send timed.
    const timed: Array<{ readonly at: number; readonly ms: number }> = []
    let running = true
    const small = { key: null, value: new Uint8Array(100).fill(97), headers: [], timestamp: 0 }
    const sender = async (w: number) => {
      for (let n = 0; running; n++) {
        const t0 = performance.now()
        const ok = await side.run(Effect.option(side.client.send(tablets[(n * 4 + w) % tablets.length]!, [small])))
        if (ok._tag === "Some") timed.push({ at: Date.now(), ms: performance.now() - t0 })
      }
    }
    const load = Promise.all([0, 1, 2, 3].map(sender))
    await sleep(5_000)
    const joinedAt = Date.now()
    await side.run(
      Effect.forEach([4, 5, 6], (id) => side.cluster.start("tablet-server", id), { concurrency: "unbounded" })
    )
    // Balanced: 24 replicas on each server, nothing moving, every ISR full, and the rebalance completed.
    let startedAt: number | undefined
    let status: Awaited<ReturnType<typeof statusOf>> | undefined
    const statusOf = () => side.run(Effect.option(side.client.rebalance({ action: "status" })))
    for (const deadline = Date.now() + 600_000; Date.now() < deadline; await sleep(250)) {
      const s = await statusOf()
      if (s._tag === "Some" && s.value.rebalance !== undefined) {
        startedAt ??= Date.now()
        if (s.value.rebalance.phase === "completed") {
          status = s
          break
        }
      }
    }
    const balancedAt = Date.now()
    await awaitTable(side, table, (t) => t.isr.length === 3)
    await sleep(5_000)
    running = false
    await load
    if (status?._tag !== "Some" || status.value.rebalance === undefined)
      throw new Error("the rebalance did not complete in 10 minutes")
    const r = status.value.rebalance
    const p99 = (from: number, to: number) =>
      quantile(
        timed.filter((t) => t.at >= from && t.at < to).map((t) => t.ms),
        0.99
      )
    const before = p99(0, joinedAt)
    const during = p99(startedAt ?? joinedAt, balancedAt)
    const after = p99(balancedAt, Date.now())
    const lowerBoundBytes = 72 * perTablet * 8 * 1024
    const seconds = (balancedAt - joinedAt) / 1000
    progress(
      `rebalance processes: balanced ${seconds.toFixed(1)} s after the joins, ${r.movesTotal} moves in ${r.batches} batches, ${r.bytesMoved} bytes (LB ${lowerBoundBytes}); produce p99 ${before.toFixed(1)} / ${during.toFixed(1)} / ${after.toFixed(1)} ms`
    )
    return [
      {
        bench: "rebalance.processes.time-to-balance",
        value: round3(seconds),
        unit: "s from 3 servers joining to the rebalance completed",
        // The floor: the bytes each new server must take at the throttle.
        baseline: round3((24 * perTablet * 8 * 1024) / (throttleKb * 1024)),
        ratio: round3(seconds / ((24 * perTablet * 8 * 1024) / (throttleKb * 1024))),
        baselineClient: "each new server's 24 replicas copied at the throttle, back to back",
        moves: r.movesTotal,
        batches: r.batches,
        gateFailures: r.gateFailures,
        fillKb,
        throttleKb
      },
      {
        bench: "rebalance.processes.bytes-moved",
        value: r.bytesMoved,
        unit: "bytes the finished replica moves copied",
        baseline: lowerBoundBytes,
        ratio: round3(r.bytesMoved / lowerBoundBytes),
        baselineClient: "the 72 replicas the new servers must take, at the fill size"
      },
      {
        bench: "rebalance.processes.produce-p99-during",
        value: round3(during),
        unit: "ms (acks=all, one record at a time, 4 senders)",
        baseline: round3(before),
        ratio: round3(during / before),
        baselineClient: "the same load before the servers joined",
        after: round3(after),
        sends: timed.length
      }
    ]
  } finally {
    await side.close()
  }
}

/** Runs the shapes, then the processes' part; see the header. */
export const run = async (): Promise<BenchOutput & { readonly save: boolean }> => {
  const runs = envInt("BENCH_RUNS", 3)
  const processes = envInt("BENCH_PROCESSES", 1)
  const fillKb = envInt("BENCH_FILL_KB", 256)
  const throttleKb = envInt("BENCH_THROTTLE_KB", 1024)
  const big = shape("scale-out-10", 100, 300, 10, 10)
  const shapes: ReadonlyArray<Shape> = [
    big,
    shape("scale-out-1", 100, 300, 1, 10),
    shape("small-scale-out", 9, 300, 1, 0),
    drain(shape("drain-1", 100, 300, 0, 10), 1)
  ]
  const results = shapes.map((s) => measure(s, runs))
  const real = processes === 0 ? [] : await processPart(fillKb, throttleKb)
  return {
    results: [...results, ...real],
    save: runs === 3 && processes === 1 && fillKb === 256 && throttleKb === 1024
  }
}

if (process.argv[1] === new URL(import.meta.url).pathname) {
  process.stderr.write("bench/rebalance.ts runs from bench/run.ts (./dev bench:rebalance)\n")
}
