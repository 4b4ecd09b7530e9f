/**
 * The planner against an independent exact solver: thousands of seeded random clusters (racks or none, RF 1–3,
 * draining and excluded servers, skewed and rack-violating placements), each planned and also written as an integer
 * program solved by HiGHS. Every plan keeps the hard rules, and has exactly the optimum's replicas above the balanced
 * counts and, with those, exactly its number of moves.
 *
 * - More clusters: `STRATA_PLANNER_CASES=N`; one case: `STRATA_PLANNER_SEED=N`.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as HighsModule from "highs"
import { envInt } from "../../../scripts/test-support/childRun.js"
import { seeded } from "../../../scripts/test-support/prng.js"
import type { ClusterModel } from "../src/index.js"
import { Planner } from "../src/index.js"

type Model = ClusterModel.ClusterModel

/** A random small cluster: 2–8 servers, maybe racks, some tagged; tablets on random (possibly bad) replica sets. */
const randomModel = (seed: number): Model => {
  const rng = seeded(seed)
  const large = rng.chance(0.1)
  const servers = large ? rng.int(9, 16) : rng.int(2, 8)
  const racks = rng.chance(0.3) ? 0 : rng.int(1, 4)
  const list = Array.from({ length: servers }, (_, i) => {
    const tags: Array<"draining" | "excluded"> = []
    const roll = rng.next()
    if (roll < 0.1) tags.push("draining")
    else if (roll < 0.19) tags.push("excluded")
    return {
      id: i + 1,
      ...(racks > 0 ? { rack: `r${rng.int(0, racks - 1)}` } : {}),
      ...(tags.length > 0 ? { tags } : {})
    }
  })
  // Skew: a few servers are likelier to hold replicas (a new one may hold none).
  const weights: Array<number> = list.map(() => (rng.chance(0.3) ? 0 : rng.int(1, 5)))
  if (weights.reduce((a, b) => a + b, 0) === 0) weights[0] = 1
  const pickServer = (exclude: ReadonlySet<number>): number => {
    const open = list.filter((s) => !exclude.has(s.id) && weights[s.id - 1]! > 0)
    const pool = open.length > 0 ? open : list.filter((s) => !exclude.has(s.id))
    const total = pool.reduce((n, s) => n + Math.max(1, weights[s.id - 1]!), 0)
    let at = rng.next() * total
    for (const s of pool) {
      at -= Math.max(1, weights[s.id - 1]!)
      if (at < 0) return s.id
    }
    return pool[pool.length - 1]!.id
  }
  const rf = rng.int(1, Math.min(3, servers))
  const tablets = Array.from({ length: large ? rng.int(15, 40) : rng.int(1, 14) }, (_, bucket) => {
    const replicas: Array<number> = []
    const taken = new Set<number>()
    for (let k = 0; k < rf; k++) {
      const id = pickServer(taken)
      taken.add(id)
      replicas.push(id)
    }
    return {
      tablet: { table: "t", bucket },
      replicas,
      leader: rng.pick(replicas),
      sizeBytes: rng.int(0, 1000)
    }
  })
  return { servers: list, tablets }
}

interface Optimum {
  readonly above: number
  readonly moves: number
}

/** The loader: the module's default export under ESM, typed as the CommonJS module's `default`. */
const loadHighs = ((HighsModule.default as unknown as { readonly default?: unknown }).default ??
  HighsModule.default) as unknown as typeof HighsModule.default.default

type Highs = Awaited<ReturnType<typeof loadHighs>>

/** Solves an LP-format model, a model HiGHS cannot read failing with its text. */
const solveLp = (highs: Highs, lp: string) => {
  try {
    return highs.solve(lp, { output_flag: false })
  } catch (e) {
    throw new Error(`${String(e)}\n${lp}`)
  }
}

/**
 * The optimum as an integer program: x(t,s) = 1 when tablet t ends on server s; every tablet keeps its RF on
 * distinct servers, at most ⌈RF / racks⌉ on one rack, none on a draining server, none new on an excluded one; each
 * server's count at most q + y(s) + o(s) with Σ y ≤ r; minimise (T+1)·Σ o + Σ new x.
 */
const optimum = (highs: Highs, m: Model): Optimum | "infeasible" => {
  const keep = m.servers.filter((s) => !s.tags?.includes("draining"))
  if (keep.length === 0) return "infeasible"
  const rackOf = (s: Model["servers"][number]) => s.rack ?? `own-${s.id}`
  const racks = new Set(keep.map(rackOf)).size
  const total = m.tablets.reduce((n, t) => n + t.replicas.length, 0)
  const q = Math.floor(total / keep.length)
  const r = total - q * keep.length
  const big = total + 1
  const objective: Array<string> = []
  const rows: Array<string> = []
  const binaries: Array<string> = []
  const generals: Array<string> = []
  const load = new Map<number, Array<string>>()
  m.tablets.forEach((t, i) => {
    const vars: Array<string> = []
    const byRack = new Map<string, Array<string>>()
    for (const s of keep) {
      const holds = t.replicas.includes(s.id)
      if (!holds && s.tags?.includes("excluded")) continue
      const x = `x_${i}_${s.id}`
      vars.push(x)
      binaries.push(x)
      if (!holds) objective.push(`+ 1 ${x}`)
      load.set(s.id, [...(load.get(s.id) ?? []), x])
      byRack.set(rackOf(s), [...(byRack.get(rackOf(s)) ?? []), x])
    }
    if (vars.length === 0) vars.push("0 zero")
    rows.push(`t${i}: ${vars.join(" + ")} = ${t.replicas.length}`)
    const cap = Math.ceil(t.replicas.length / racks)
    let k = 0
    for (const xs of byRack.values()) rows.push(`g${i}_${k++}: ${xs.join(" + ")} <= ${cap}`)
  })
  for (const s of keep) {
    const xs = load.get(s.id) ?? []
    binaries.push(`y_${s.id}`)
    generals.push(`o_${s.id}`)
    objective.push(`+ ${big} o_${s.id}`)
    rows.push(`c${s.id}: ${xs.length > 0 ? `${xs.join(" + ")} - ` : ""}y_${s.id} - o_${s.id} <= ${q}`)
  }
  rows.push(`extra: ${keep.map((s) => `y_${s.id}`).join(" + ")} <= ${r}`)
  const lp = [
    "Minimize",
    ` obj: ${objective.length > 0 ? objective.join(" ") : "0 zero"}`,
    "Subject To",
    ...rows.map((row) => ` ${row}`),
    " fix: zero = 0",
    "Bounds",
    ...keep.map((s) => ` 0 <= o_${s.id} <= ${total}`),
    "Binaries",
    ` ${binaries.join(" ")}`,
    "Generals",
    ` ${generals.join(" ")} zero`,
    "End"
  ].join("\n")
  const result = solveLp(highs, lp)
  if (result.Status === "Infeasible") return "infeasible"
  if (result.Status !== "Optimal") throw new Error(`HiGHS: ${result.Status}\n${lp}`)
  let above = 0
  for (const s of keep) above += Math.round(result.Columns[`o_${s.id}`]?.Primal ?? 0)
  const value = Math.round(result.ObjectiveValue)
  return { above, moves: value - above * big }
}

/**
 * The leaders' optimum for the plan's final replica sets: l(t,s) = 1 when s leads t, among t's final replicas (an
 * excluded server takes no new replica, but may lead one it has); each server at most q + y(s) + o(s) leaders, Σ y ≤ r;
 * minimise (T+1)·Σ o + the tablets whose leader changes.
 */
const leaderOptimum = (highs: Highs, m: Model, plan: Planner.Plan): Optimum => {
  const keep = m.servers.filter((s) => !s.tags?.includes("draining"))
  const after = new Map(plan.changes.map((c) => [c.tablet.bucket, c.to] as const))
  const total = m.tablets.length
  const q = Math.floor(total / keep.length)
  const r = total - q * keep.length
  const big = total + 1
  const objective: Array<string> = []
  const rows: Array<string> = []
  const binaries: Array<string> = []
  const load = new Map<number, Array<string>>()
  m.tablets.forEach((t, i) => {
    const current = t.leader ?? t.replicas[0]!
    const vars: Array<string> = []
    for (const id of after.get(t.tablet.bucket) ?? t.replicas) {
      const l = `l_${i}_${id}`
      vars.push(l)
      binaries.push(l)
      if (id !== current) objective.push(`+ 1 ${l}`)
      load.set(id, [...(load.get(id) ?? []), l])
    }
    rows.push(`t${i}: ${vars.join(" + ")} = 1`)
  })
  for (const s of keep) {
    const ls = load.get(s.id) ?? []
    binaries.push(`y_${s.id}`)
    objective.push(`+ ${big} o_${s.id}`)
    rows.push(`c${s.id}: ${ls.length > 0 ? `${ls.join(" + ")} - ` : ""}y_${s.id} - o_${s.id} <= ${q}`)
  }
  rows.push(`extra: ${keep.map((s) => `y_${s.id}`).join(" + ")} <= ${r}`)
  const lp = [
    "Minimize",
    ` obj: ${objective.join(" ")}`,
    "Subject To",
    ...rows.map((row) => ` ${row}`),
    "Bounds",
    ...keep.map((s) => ` 0 <= o_${s.id} <= ${total}`),
    "Binaries",
    ` ${binaries.join(" ")}`,
    "Generals",
    ` ${keep.map((s) => `o_${s.id}`).join(" ")}`,
    "End"
  ].join("\n")
  const result = solveLp(highs, lp)
  if (result.Status !== "Optimal") throw new Error(`HiGHS: ${result.Status}\n${lp}`)
  let above = 0
  for (const s of keep) above += Math.round(result.Columns[`o_${s.id}`]?.Primal ?? 0)
  return { above, moves: Math.round(result.ObjectiveValue) - above * big }
}

/** The hard rules on a plan's final replica sets. */
const hardRuleBroken = (m: Model, plan: Planner.Plan): string | undefined => {
  const server = new Map(m.servers.map((s) => [s.id, s] as const))
  const after = new Map(m.tablets.map((t) => [`${t.tablet.bucket}`, t.replicas] as const))
  for (const c of plan.changes) after.set(`${c.tablet.bucket}`, c.to)
  const keep = m.servers.filter((s) => !s.tags?.includes("draining"))
  const racks = new Set(keep.map((s) => s.rack ?? `own-${s.id}`)).size
  for (const t of m.tablets) {
    const set = after.get(`${t.tablet.bucket}`)!
    if (set.length !== t.replicas.length)
      return `tablet ${t.tablet.bucket}: RF ${t.replicas.length} became ${set.length}`
    if (new Set(set).size !== set.length) return `tablet ${t.tablet.bucket}: a server twice in ${set}`
    const perRack = new Map<string, number>()
    for (const id of set) {
      const s = server.get(id)!
      if (s.tags?.includes("draining")) return `tablet ${t.tablet.bucket}: left on draining server ${id}`
      if (s.tags?.includes("excluded") && !t.replicas.includes(id))
        return `tablet ${t.tablet.bucket}: new replica on excluded server ${id}`
      const rack = s.rack ?? `own-${id}`
      perRack.set(rack, (perRack.get(rack) ?? 0) + 1)
    }
    const cap = Math.ceil(t.replicas.length / racks)
    for (const [rack, n] of perRack) if (n > cap) return `tablet ${t.tablet.bucket}: ${n} replicas on rack ${rack}`
  }
  return undefined
}

const cases = envInt("STRATA_PLANNER_CASES", 2000)
const only = process.env.STRATA_PLANNER_SEED === undefined ? undefined : envInt("STRATA_PLANNER_SEED", 0)

describe("Planner against an exact integer program", () => {
  it.effect(
    `${only === undefined ? `${cases} random clusters` : `seed ${only}`}: hard rules kept, the optimum reached`,
    () =>
      Effect.gen(function* () {
        const highs = yield* Effect.promise(() => loadHighs())
        const seeds = only === undefined ? Array.from({ length: cases }, (_, i) => i + 1) : [only]
        let solved = 0
        let infeasible = 0
        for (const seed of seeds) {
          const model = randomModel(seed)
          const exact = optimum(highs, model)
          const planned = yield* Effect.result(Planner.plan(model))
          if (exact === "infeasible") {
            assert.isTrue(planned._tag === "Failure", `seed ${seed}: HiGHS finds no placement, the planner planned one`)
            infeasible++
            continue
          }
          assert.isTrue(planned._tag === "Success", `seed ${seed}: the planner failed where HiGHS placed every replica`)
          if (planned._tag !== "Success") continue
          const plan = planned.success
          const broken = hardRuleBroken(model, plan)
          assert.isUndefined(broken, `seed ${seed}: ${broken}`)
          assert.strictEqual(plan.figures.replicasAboveTarget, exact.above, `seed ${seed}: replicas above the target`)
          assert.strictEqual(plan.figures.replicaMoves, exact.moves, `seed ${seed}: moves`)
          const leaders = leaderOptimum(highs, model, plan)
          assert.strictEqual(plan.figures.leadersAboveTarget, leaders.above, `seed ${seed}: leaders above the target`)
          assert.strictEqual(plan.figures.leaderMoves, leaders.moves, `seed ${seed}: leadership moves`)
          for (const c of plan.changes)
            assert.isTrue(c.to[0] === c.leaderTo, `seed ${seed}: the leader comes first in ${c.to}`)
          solved++
        }
        console.log(`planner: ${solved} plans at the optimum, ${infeasible} infeasible clusters refused by both`)
        if (only === undefined) assert.isAbove(solved, cases * 0.8)
      }),
    Math.max(60_000, cases * 60)
  )
})
