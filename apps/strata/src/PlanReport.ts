/**
 * `strata rebalance plan`'s parts that decide nothing about the cluster: the planner's model from the controller's
 * cluster model, and the plan as the operator reads it (text or JSON).
 *
 * @since 0.1.0
 */
import type { ClusterModel, Planner } from "@strata/rebalance"
import type { ReplicaRpc } from "@strata/replica"

/**
 * The cluster as the planner sees it, from the controller's `ClusterModel` reply: the registered servers with their
 * racks, a server holding replicas without being registered (stopped, or dead) tagged `excluded` (it takes nothing
 * new), and every tablet being served (a tablet being deleted is left out) with its size in bytes where the servers
 * told it (without one, the planner counts it as 0).
 *
 * @since 0.1.0
 */
export const modelOf = (reply: ReplicaRpc.ClusterModelReply): ClusterModel.ClusterModel => ({
  servers: reply.servers.map((s) => ({
    id: s.id,
    ...(s.rack === undefined ? {} : { rack: s.rack }),
    ...(s.tags === undefined ? {} : { tags: s.tags })
  })),
  tablets: reply.tablets.map((t) => ({
    tablet: t.tablet,
    replicas: t.replicas,
    leader: t.leader,
    ...(t.sizeBytes === undefined ? {} : { sizeBytes: t.sizeBytes })
  }))
})

/**
 * The plan's bytes: what its moves copy, and the bytes per server (each server that may keep replicas: a draining one
 * is left out, as the planner's counts leave it) before and after. `undefined` when no tablet has a size.
 *
 * @since 0.1.0
 */
export interface BytesFigures {
  readonly moved: number
  readonly before: Planner.Distribution
  readonly after: Planner.Distribution
  /** Tablets without a size (counted as 0 bytes). */
  readonly sizesMissing: number
}

const distributionOf = (values: ReadonlyArray<number>): Planner.Distribution => {
  if (values.length === 0) return { min: 0, max: 0, mean: 0, cv: 0 }
  const mean = values.reduce((a, b) => a + b, 0) / values.length
  const variance = values.reduce((a, v) => a + (v - mean) ** 2, 0) / values.length
  return { min: Math.min(...values), max: Math.max(...values), mean, cv: mean === 0 ? 0 : Math.sqrt(variance) / mean }
}

/**
 * The plan's bytes figures (see `BytesFigures`), `undefined` when no tablet of the model has a size.
 *
 * @since 0.1.0
 */
export const bytesOf = (model: ClusterModel.ClusterModel, plan: Planner.Plan): BytesFigures | undefined => {
  const sized = model.tablets.filter((t) => t.sizeBytes !== undefined).length
  if (sized === 0) return undefined
  const keep = model.servers.filter((s) => !s.tags?.includes("draining")).map((s) => s.id)
  const after = new Map(plan.changes.map((c) => [`${c.tablet.table}\u0000${c.tablet.bucket}`, c.to]))
  const before = new Map(keep.map((id) => [id, 0]))
  const then = new Map(keep.map((id) => [id, 0]))
  const add = (on: Map<number, number>, id: number, size: number) => {
    const was = on.get(id)
    if (was !== undefined) on.set(id, was + size)
  }
  for (const t of model.tablets) {
    const size = t.sizeBytes ?? 0
    for (const r of t.replicas) add(before, r, size)
    for (const r of after.get(`${t.tablet.table}\u0000${t.tablet.bucket}`) ?? t.replicas) add(then, r, size)
  }
  return {
    moved: plan.figures.bytesMoved,
    before: distributionOf([...before.values()]),
    after: distributionOf([...then.values()]),
    sizesMissing: model.tablets.length - sized
  }
}

const units = ["KiB", "MiB", "GiB", "TiB", "PiB"] as const

/** A byte count as an operator reads it: `512 B`, `1.5 MiB`. */
const size = (bytes: number): string => {
  if (bytes < 1024) return `${Math.round(bytes)} B`
  let value = bytes / 1024
  let unit = 0
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024
    unit++
  }
  return `${value.toFixed(1)} ${units[unit]}`
}

const distribution = (d: Planner.Distribution): string =>
  `min ${d.min} max ${d.max} mean ${d.mean.toFixed(2)} cv ${d.cv.toFixed(4)}`

const bytesDistribution = (d: Planner.Distribution): string =>
  `min ${size(d.min)} max ${size(d.max)} mean ${size(d.mean)} cv ${d.cv.toFixed(4)}`

/** The bytes lines: what moves and the bytes per server when sizes are known; how many tablets had none. */
const bytesLines = (model: ClusterModel.ClusterModel, plan: Planner.Plan): ReadonlyArray<string> => {
  const b = bytesOf(model, plan)
  if (b === undefined) {
    return model.tablets.length === 0
      ? []
      : [`no tablet's size is known (${model.tablets.length} tablets): bytes not planned`]
  }
  return [
    `bytes moved ${size(b.moved)} (${b.moved} B)`,
    `bytes per server: before ${bytesDistribution(b.before)}; after ${bytesDistribution(b.after)}`,
    ...(b.sizesMissing > 0
      ? [
          `${b.sizesMissing} of ${model.tablets.length} tablets have no size (no server told it in time): counted as 0 B`
        ]
      : [])
  ]
}

/**
 * The plan as lines: one per changed tablet (`table:bucket  [from] -> [to]  leader a -> b`), then the moves against
 * the lower bound, the distributions before and after, and the bytes (moved, per server) when tablet sizes are known
 * (how many tablets had none, when some had).
 *
 * @since 0.1.0
 */
export const lines = (model: ClusterModel.ClusterModel, plan: Planner.Plan): ReadonlyArray<string> => {
  const f = plan.figures
  const absent = model.servers.filter((s) => s.tags?.includes("excluded")).map((s) => s.id)
  return [
    ...plan.changes.map(
      (c) =>
        `${c.tablet.table}:${c.tablet.bucket}\t[${c.from.join(",")}] -> [${c.to.join(",")}]\tleader ${c.leaderFrom ?? "none"} -> ${c.leaderTo}`
    ),
    `replica moves ${f.replicaMoves}, lower bound ${f.lowerBound}, moves/LB ${f.movesPerLowerBound === null ? "n/a" : f.movesPerLowerBound.toFixed(3)}${f.replicasAboveTarget > 0 ? `, ${f.replicasAboveTarget} replicas above the balanced counts (the rack rule allows no better)` : ""}`,
    `leadership moves ${f.leaderMoves}`,
    `replicas per server: before ${distribution(f.replicas.before)}; after ${distribution(f.replicas.after)}`,
    `leaders per server: before ${distribution(f.leaders.before)}; after ${distribution(f.leaders.after)}`,
    ...bytesLines(model, plan),
    ...(absent.length > 0 ? [`not registered, given nothing new: servers ${absent.join(",")}`] : []),
    "nothing was changed (a plan only)"
  ]
}

/**
 * The plan as `--json` prints it: the model (tablet sizes included), the plan, and the bytes figures (`null` when no
 * tablet's size is known) with the count of tablets without a size.
 *
 * @since 0.1.0
 */
export const json = (model: ClusterModel.ClusterModel, plan: Planner.Plan) => ({
  model,
  plan,
  bytes: bytesOf(model, plan) ?? null,
  sizesMissing: model.tablets.filter((t) => t.sizeBytes === undefined).length
})
