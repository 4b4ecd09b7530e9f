/**
 * The planner: from a cluster model, the replica sets and leaders that balance it with the fewest replica moves.
 *
 * Hard rules, always: one replica of a tablet per server; no two on one rack while there are racks enough
 * (at most ⌈RF / racks⌉ on one); nothing left on a `draining` server; no new replica on an `excluded` one (it may
 * still lead a tablet it holds). Then the
 * goals, in the order given (all three by default):
 * - `replica-count`: every server that may hold replicas ends with ⌊T/n⌋ or ⌊T/n⌋+1 of the T replicas, by the
 *   fewest moves — exactly (a min-cost flow; see `internal/assignment.ts`). When the hard rules make exact balance
 *   impossible, the fewest replicas above those counts, then the fewest moves.
 * - `leader`: each tablet's leader among its final replicas, balanced the same way with the fewest leadership moves;
 *   a leader that stays a replica keeps leading unless balance needs it elsewhere. Leadership moves add no replica
 *   moves.
 * - `bytes`: among plans with the same moves, the smallest tablets move, onto the servers holding the fewest bytes.
 *
 * The plan lists each changed tablet's replicas before and after (after: its leader first, so it is the preferred
 * leader), the replica moves as pairs, and the figures: moves against the lower bound
 * LB = (replicas on draining servers) + Σ max(0, Lᵢ − q) − min(r, a), leadership moves, bytes moved, and the
 * distribution of replica and leader counts before and after. The same model and goals give the same plan.
 *
 * @since 0.1.0
 */
import { Models, OptionSchemas, Rebalancer } from "@strata/core"
import { Effect, Schema } from "effect"
import * as ClusterModel from "./ClusterModel.js"
import * as Assignment from "./internal/assignment.js"

/** A goal after the hard rules. */
export const Goal = Schema.Literals(["replica-count", "leader", "bytes"])
/** @see Goal */
export type Goal = typeof Goal.Type
/** Whether `text` names a goal. */
export const isGoal = Schema.is(Goal)

/** The planner's options. */
export const Options = Schema.Struct({
  /** The goals, in priority order (every goal by default). */
  goals: Schema.optional(Schema.Array(Goal))
})
/** @see Options */
export type Options = typeof Options.Encoded

/** One tablet whose replicas or leader change. */
export interface Change {
  readonly tablet: Models.TabletId
  readonly from: ReadonlyArray<Models.ServerId>
  /** Its replicas after the move, its leader first. */
  readonly to: ReadonlyArray<Models.ServerId>
  readonly leaderFrom: Models.ServerId | null
  readonly leaderTo: Models.ServerId
}

/** How counts spread over the servers that may hold replicas. */
export interface Distribution {
  readonly min: number
  readonly max: number
  readonly mean: number
  /** Coefficient of variation: the standard deviation over the mean (0 when the mean is 0). */
  readonly cv: number
}

/** A plan's figures. */
export interface Figures {
  readonly replicaMoves: number
  readonly lowerBound: number
  /** `replicaMoves / lowerBound` (1 when both are 0; null when only the bound is 0: moves the hard rules force). */
  readonly movesPerLowerBound: number | null
  /** Replicas above the balanced counts that the hard rules leave (0: exact balance). */
  readonly replicasAboveTarget: number
  readonly leaderMoves: number
  /** Leaders above the balanced counts that the replica placement leaves (0: exact balance). */
  readonly leadersAboveTarget: number
  readonly bytesMoved: number
  readonly replicas: { readonly before: Distribution; readonly after: Distribution }
  readonly leaders: { readonly before: Distribution; readonly after: Distribution }
}

/** A plan: the changed tablets, the replica moves, the figures. */
export interface Plan {
  readonly changes: ReadonlyArray<Change>
  readonly moves: ReadonlyArray<Rebalancer.Move>
  readonly figures: Figures
}

/** The model as the solver sees it: servers numbered by position, their groups and what they may do. */
interface Indexed {
  readonly model: ClusterModel.ClusterModel
  readonly index: ReadonlyMap<number, number>
  readonly groupOf: ReadonlyArray<number>
  readonly canKeep: ReadonlyArray<boolean>
  readonly canGain: ReadonlyArray<boolean>
  readonly racks: number
}

const indexed = (model: ClusterModel.ClusterModel): Indexed => {
  const index = new Map(model.servers.map((s, i) => [s.id, i] as const))
  const rackIds = new Map<string, number>()
  const groupOf = model.servers.map((s) => {
    const rack = s.rack ?? `\u0000${s.id}`
    let g = rackIds.get(rack)
    if (g === undefined) {
      g = rackIds.size
      rackIds.set(rack, g)
    }
    return g
  })
  const canKeep = model.servers.map((s) => !ClusterModel.hasTag(s, "draining"))
  const canGain = model.servers.map((s, i) => canKeep[i]! && !ClusterModel.hasTag(s, "excluded"))
  const racks = new Set(groupOf.filter((_, i) => canKeep[i])).size
  return { model, index, groupOf, canKeep, canGain, racks }
}

const distribution = (counts: ReadonlyArray<number>): Distribution => {
  if (counts.length === 0) return { min: 0, max: 0, mean: 0, cv: 0 }
  const mean = counts.reduce((a, b) => a + b, 0) / counts.length
  const variance = counts.reduce((a, c) => a + (c - mean) ** 2, 0) / counts.length
  return {
    min: Math.min(...counts),
    max: Math.max(...counts),
    mean,
    cv: mean === 0 ? 0 : Math.sqrt(variance) / mean
  }
}

/** Per server that may keep replicas, how many of `sets` it is in. */
const countsOf = (x: Indexed, sets: ReadonlyArray<ReadonlyArray<number>>): Array<number> => {
  const counts = new Array<number>(x.groupOf.length).fill(0)
  for (const set of sets) for (const b of set) counts[b]!++
  return counts.filter((_, b) => x.canKeep[b])
}

/** LB = (replicas on draining servers) + Σ max(0, Lᵢ − q) − min(r, a) over the servers that may keep replicas. */
export const lowerBound = (loads: ReadonlyArray<number>, drained: number, total: number): number => {
  if (loads.length === 0) return drained
  const q = Math.floor(total / loads.length)
  const r = total - q * loads.length
  let above = 0
  let over = 0
  for (const l of loads) {
    above += Math.max(0, l - q)
    if (l > q) over++
  }
  return drained + above - Math.min(r, over)
}

const leaderOf = (t: ClusterModel.Tablet): Models.ServerId => t.leader ?? t.replicas[0]!

/**
 * Plans `model` (already decoded) for `goals`: the plan, or the first tablet no placement satisfies.
 *
 * @since 0.1.0
 */
export const planModel = (
  model: ClusterModel.ClusterModel,
  goals: ReadonlyArray<Goal> = ["replica-count", "leader", "bytes"]
): Plan | Rebalancer.PlanInfeasible => {
  const x = indexed(model)
  const bytes = goals.includes("bytes")
  const current = model.tablets.map((t) => t.replicas.map((id) => x.index.get(id)!))
  const replicas = Assignment.solve({
    groupOf: x.groupOf,
    canKeep: x.canKeep,
    canGain: x.canGain,
    balance: goals.includes("replica-count"),
    items: model.tablets.map((t, i) => ({
      demand: t.replicas.length,
      groupCap: Math.max(1, Math.ceil(t.replicas.length / Math.max(1, x.racks))),
      current: current[i]!,
      weight: bytes ? (t.sizeBytes ?? 0) : 0
    }))
  })
  if (replicas._tag === "Infeasible") return infeasible(model, replicas)
  const leaders = Assignment.solve({
    groupOf: x.groupOf.map((_, b) => b),
    canKeep: x.canKeep,
    canGain: x.canKeep,
    balance: goals.includes("leader"),
    items: model.tablets.map((t, i) => {
      const leader = x.index.get(leaderOf(t))!
      const placed = replicas.placed[i]!
      return {
        demand: 1,
        groupCap: 1,
        current: placed.includes(leader) ? [leader] : [],
        candidates: placed,
        weight: 0
      }
    })
  })
  if (leaders._tag === "Infeasible") return infeasible(model, leaders)
  return assemble(x, goals.includes("replica-count"), current, replicas, leaders)
}

const infeasible = (model: ClusterModel.ClusterModel, failed: Assignment.Infeasible): Rebalancer.PlanInfeasible => {
  const t = model.tablets[failed.item]
  return new Rebalancer.PlanInfeasible({
    detail: `tablet ${t === undefined ? failed.item : Models.tabletKey(t.tablet)}: ${failed.detail}`
  })
}

/** The plan from the two solutions: changes, moves and figures. */
const assemble = (
  x: Indexed,
  balance: boolean,
  current: ReadonlyArray<ReadonlyArray<number>>,
  replicas: Assignment.Solution,
  leaders: Assignment.Solution
): Plan => {
  const { model } = x
  const id = (b: number) => model.servers[b]!.id
  const changes: Array<Change> = []
  const moves: Array<Rebalancer.Move> = []
  let leaderMoves = 0
  let bytesMoved = 0
  model.tablets.forEach((t, i) => {
    const leader = leaders.placed[i]![0]!
    const after = replicas.placed[i]!
    const to = [leader, ...after.filter((b) => b !== leader)].map(id)
    const leaderFrom = t.leader ?? null
    const leaderTo = id(leader)
    if (leaderTo !== leaderOf(t)) leaderMoves++
    const removed = current[i]!.filter((b) => !after.includes(b))
    const added = after.filter((b) => !current[i]!.includes(b))
    added.forEach((b, k) => {
      const size = t.sizeBytes ?? 0
      bytesMoved += size
      moves.push({ tablet: t.tablet, from: id(removed[k]!), to: id(b), size })
    })
    const same = to.length === t.replicas.length && to.every((s, k) => s === t.replicas[k])
    if (!same || leaderTo !== leaderOf(t))
      changes.push({ tablet: t.tablet, from: t.replicas, to, leaderFrom, leaderTo })
  })
  const drained = current.reduce((n, set) => n + set.filter((b) => !x.canKeep[b]).length, 0)
  const total = current.reduce((n, set) => n + set.length, 0)
  const lb = balance ? lowerBound(countsOf(x, current), drained, total) : drained
  const leadersBefore = model.tablets.map((t) => [x.index.get(leaderOf(t))!])
  return {
    changes,
    moves,
    figures: {
      replicaMoves: replicas.moves,
      lowerBound: lb,
      movesPerLowerBound: lb === 0 ? (replicas.moves === 0 ? 1 : null) : replicas.moves / lb,
      replicasAboveTarget: replicas.overflow,
      leaderMoves,
      leadersAboveTarget: leaders.overflow,
      bytesMoved,
      replicas: { before: distribution(countsOf(x, current)), after: distribution(countsOf(x, replicas.placed)) },
      leaders: { before: distribution(countsOf(x, leadersBefore)), after: distribution(countsOf(x, leaders.placed)) }
    }
  }
}

const decodeModel = OptionSchemas.decodeOptions(ClusterModel.ClusterModel)
const decodePlanOptions = OptionSchemas.decodeOptions(Options, { exact: true })

/**
 * Plans a cluster model given as data (decoded here: a bad one fails `InvalidModel` naming the field).
 *
 * @since 0.1.0
 */
export const plan = (model: unknown, options?: Options): Effect.Effect<Plan, Rebalancer.RebalanceError> =>
  Effect.gen(function* () {
    const decoded = yield* decodeModel(model).pipe(
      Effect.mapError(([bad]) => invalid(bad.option, `${bad.value}: ${bad.detail}`))
    )
    const o = yield* decodePlanOptions(options ?? {}).pipe(
      Effect.mapError(([bad]) => invalid(`options.${bad.option}`, `${bad.value}: ${bad.detail}`))
    )
    const result = planModel(decoded, o.goals)
    if (result instanceof Rebalancer.PlanInfeasible) return yield* new Rebalancer.RebalanceError({ reason: result })
    return result
  })

const invalid = (field: string, detail: string) =>
  new Rebalancer.RebalanceError({ reason: new Rebalancer.InvalidModel({ field, detail }) })
