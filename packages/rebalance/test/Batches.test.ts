/**
 * Batches and waves: a hand scale-out, then seeded random plans (from random clusters through the planner) checked
 * for the invariants, and the scale-out shapes' total waves against the sum of the batches' lower bounds.
 *
 * - One case: `STRATA_BATCHES_SEED=N`.
 */
import { assert, describe, it } from "@effect/vitest"
import { envInt } from "../../../scripts/test-support/childRun.js"
import { seeded } from "../../../scripts/test-support/prng.js"
import type { ClusterModel } from "../src/index.js"
import { Batches, Planner } from "../src/index.js"

type Model = ClusterModel.ClusterModel

const key = (c: Planner.Change) => `${c.tablet.table}/${c.tablet.bucket}`

/** `before` servers holding `tablets` tablets of RF `rf` round-robin, `after − before` servers joining empty. */
const scaleOut = (before: number, after: number, tablets: number, rf: number): Model => ({
  servers: Array.from({ length: after }, (_, i) => ({ id: i + 1 })),
  tablets: Array.from({ length: tablets }, (_, bucket) => {
    const replicas = Array.from({ length: rf }, (_, k) => ((bucket + k) % before) + 1)
    return { tablet: { table: "t", bucket }, replicas, leader: replicas[0]!, sizeBytes: 1000 * (1 + (bucket % 7)) }
  })
})

/** A random cluster: 2–10 servers, some joining empty, some draining, RF 1–3, tablets skewed onto a few servers. */
const randomModel = (seed: number): Model => {
  const rng = seeded(seed)
  const n = rng.int(2, 10)
  const servers = Array.from({ length: n }, (_, i) => ({
    id: i + 1,
    ...(i > 0 && rng.chance(0.1) ? { tags: ["draining" as const] } : {})
  }))
  const holders = rng.int(1, n)
  const rf = rng.int(1, Math.min(3, holders))
  const tablets = Array.from({ length: rng.int(1, 40) }, (_, bucket) => {
    const taken = new Set<number>()
    while (taken.size < rf) taken.add(rng.int(1, holders))
    const replicas = [...taken]
    const leader = rng.chance(0.8) ? replicas[0]! : replicas[rng.int(0, rf - 1)]!
    return { tablet: { table: "t", bucket }, replicas, leader, sizeBytes: rng.int(0, 5000) }
  })
  return { servers, tablets }
}

/** The plan of `model`; when draining leaves too few servers for a tablet, the plan with nothing draining. */
const planOf = (model: Model): Planner.Plan => {
  const p = Planner.planModel(model)
  if ("changes" in p) return p
  const again = Planner.planModel({ ...model, servers: model.servers.map((s) => ({ id: s.id })) })
  if (!("changes" in again)) throw new Error(`no plan: ${again.message}`)
  return again
}

/** Every invariant of `schedule`; a message naming the first broken one, or undefined. */
const broken = (plan: Planner.Plan, limits: Batches.Limits): string | undefined => {
  const s = Batches.schedule(plan.changes, limits)
  const moving = plan.changes.filter(Batches.movesReplicas)
  const cap = Math.max(1, Math.ceil(limits.batchRatio * moving.length))
  const inBatches = s.batches.flatMap((b) => b.changes.map(key))
  const inWaves = s.batches.flatMap((b) => b.waves.flat().map(key))
  const all = plan.changes.map(key).sort()
  if (JSON.stringify([...inBatches].sort()) !== JSON.stringify(all)) return "a change not in exactly one batch"
  if (JSON.stringify([...inWaves].sort()) !== JSON.stringify(all)) return "a change not in exactly one wave"
  for (const [i, b] of s.batches.entries()) {
    const inBatch = new Set(b.changes.map(key))
    if (!b.waves.flat().every((c) => inBatch.has(key(c)))) return `batch ${i}: a wave holds another batch's change`
    if (b.kind === "replicas") {
      if (b.changes.length > cap) return `batch ${i}: ${b.changes.length} changes > ${cap}`
      if (!b.changes.every(Batches.movesReplicas)) return `batch ${i}: a leadership-only change`
    } else {
      if (i !== s.batches.length - 1) return `batch ${i}: the leadership batch is not last`
      if (b.changes.some(Batches.movesReplicas)) return `batch ${i}: a replica move in the leadership batch`
    }
    if (b.waves.length < b.lowerBound) return `batch ${i}: ${b.waves.length} waves below the bound ${b.lowerBound}`
    for (const [w, wave] of b.waves.entries()) {
      if (wave.length === 0) return `batch ${i} wave ${w}: empty`
      if (wave.length > limits.maxClusterMigrations) return `batch ${i} wave ${w}: ${wave.length} > cluster limit`
      const loads = new Map<number, number>()
      for (const c of wave) for (const srv of Batches.touched(c)) loads.set(srv, (loads.get(srv) ?? 0) + 1)
      for (const [srv, n] of loads)
        if (n > limits.maxConcurrentMigrations) return `batch ${i} wave ${w}: server ${srv} in ${n} moves`
    }
  }
  if (s.batches.length > 0 && JSON.stringify(s) !== JSON.stringify(Batches.schedule(plan.changes, limits)))
    return "not deterministic"
  return undefined
}

describe("Batches: a scale-out by hand", () => {
  it("3 servers with 12 tablets RF 3, 3 join: batches of ⌈0.2 N⌉, leadership last, waves within limits", () => {
    const plan = planOf(scaleOut(3, 6, 12, 3))
    const moving = plan.changes.filter(Batches.movesReplicas)
    const leadership = plan.changes.filter((c) => !Batches.movesReplicas(c))
    assert.isAbove(moving.length, 0)
    const size = Math.ceil(0.2 * moving.length)
    const limits = { batchRatio: 0.2, maxConcurrentMigrations: 2, maxClusterMigrations: 3 }
    const bs = Batches.batches(plan.changes, limits)
    const replicaBatches = bs.filter((b) => b.kind === "replicas")
    assert.strictEqual(replicaBatches.length, Math.ceil(moving.length / size))
    for (const b of replicaBatches) assert.isAtMost(b.changes.length, size)
    if (leadership.length > 0) {
      assert.strictEqual(bs[bs.length - 1]!.kind, "leadership")
      assert.sameMembers(bs[bs.length - 1]!.changes.map(key), leadership.map(key))
    }
    // Each batch spreads over the servers: no server touched by more than its share of the batch rounded up.
    for (const b of replicaBatches) {
      const perServer = new Map<number, number>()
      for (const c of b.changes) for (const s of Batches.touched(c)) perServer.set(s, (perServer.get(s) ?? 0) + 1)
      const touchedTotal = b.changes.reduce((n, c) => n + Batches.touched(c).length, 0)
      assert.isAtMost(Math.max(...perServer.values()), Math.ceil(touchedTotal / 3), JSON.stringify(b.changes))
    }
    assert.isUndefined(broken(plan, limits))
  })

  it("waves of hand-made moves: a server in many moves paces them, the cluster cap too", () => {
    const change = (bucket: number, from: number, to: number): Planner.Change => ({
      tablet: { table: "t", bucket },
      from: [from],
      to: [to],
      leaderFrom: from,
      leaderTo: to
    })
    // Four moves out of server 1, one from 2 to 3: with c = 2, server 1 needs two waves.
    const batch = [change(0, 1, 4), change(1, 1, 5), change(2, 1, 6), change(3, 1, 7), change(4, 2, 3)]
    const limits = { maxConcurrentMigrations: 2, maxClusterMigrations: 10 }
    const ws = Batches.waves(batch, limits)
    assert.deepStrictEqual(
      ws.map((w) => w.length),
      [3, 2]
    )
    assert.strictEqual(Batches.makespanLowerBound(batch, limits), 2)
    // A cluster cap of 1: one move per wave.
    assert.strictEqual(Batches.waves(batch, { maxConcurrentMigrations: 2, maxClusterMigrations: 1 }).length, 5)
    assert.strictEqual(Batches.makespanLowerBound(batch, { maxConcurrentMigrations: 2, maxClusterMigrations: 1 }), 5)
    assert.deepStrictEqual(Batches.schedule([], { ...limits, batchRatio: 0.2 }), {
      batches: [],
      waves: 0,
      lowerBound: 0,
      wavesPerLowerBound: 1
    })
  })
})

describe("Batches: seeded random plans", () => {
  const only = envInt("STRATA_BATCHES_SEED", 0) || undefined
  it(`${only === undefined ? "400 random plans" : `seed ${only}`}: every invariant holds`, () => {
    const seeds = only === undefined ? Array.from({ length: 400 }, (_, i) => i + 1) : [only]
    for (const seed of seeds) {
      const plan = planOf(randomModel(seed))
      const rng = seeded(seed * 7919 + 1)
      const limits = {
        batchRatio: [0.05, 0.2, 0.5, 1][rng.int(0, 3)]!,
        maxConcurrentMigrations: rng.int(1, 5),
        maxClusterMigrations: rng.int(1, 20)
      }
      const why = broken(plan, limits)
      assert.isUndefined(why, `seed ${seed} (${JSON.stringify(limits)}): ${why}`)
    }
  })

  it("scale-out 3 → 6 servers, 48 tablets RF 3: waves within 1.2 × the sum of the batches' bounds", () => {
    const plan = planOf(scaleOut(3, 6, 48, 3))
    for (const c of [1, 2, 5]) {
      const limits = { batchRatio: 0.2, maxConcurrentMigrations: c, maxClusterMigrations: 50 }
      assert.isUndefined(broken(plan, limits), `c = ${c}`)
      const s = Batches.schedule(plan.changes, limits)
      assert.isAtMost(s.wavesPerLowerBound, 1.2, `c = ${c}: ${s.waves} waves, bound ${s.lowerBound}`)
    }
  })
})
