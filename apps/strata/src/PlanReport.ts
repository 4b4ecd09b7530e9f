/**
 * `strata rebalance plan`'s parts that decide nothing about the cluster: the planner's model from the controller's
 * metadata, and the plan as the operator reads it (text or JSON).
 *
 * @since 0.1.0
 */
import type { ClusterModel, Planner } from "@strata/rebalance"
import type { ReplicaRpc } from "@strata/replica"

/**
 * The cluster as the planner sees it, from the controller's metadata: the registered servers with their racks, and
 * every tablet being served (a tablet being deleted is left out). A replica on a server that is not registered now
 * (stopped, or dead) keeps its place: that server is listed `excluded`, so it takes nothing new.
 *
 * @since 0.1.0
 */
export const modelOf = (metadata: ReplicaRpc.Metadata): ClusterModel.ClusterModel => {
  const registered = new Set(metadata.servers.map((s) => s.id))
  const absent = new Set<number>()
  const tablets = metadata.tablets
    .filter((t) => t.state !== "DeletingTablet")
    .map((t) => {
      for (const r of t.replicas) if (!registered.has(r)) absent.add(r)
      return { tablet: t.tablet, replicas: t.replicas, leader: t.leader }
    })
  const servers = [
    ...metadata.servers.map((s) => ({ id: s.id, ...(s.rack === undefined ? {} : { rack: s.rack }) })),
    ...[...absent].sort((a, b) => a - b).map((id) => ({ id, tags: ["excluded" as const] }))
  ]
  return { servers, tablets }
}

const distribution = (d: Planner.Distribution): string =>
  `min ${d.min} max ${d.max} mean ${d.mean.toFixed(2)} cv ${d.cv.toFixed(4)}`

/**
 * The plan as lines: one per changed tablet (`table:bucket  [from] -> [to]  leader a -> b`), then the moves against
 * the lower bound and the distributions before and after.
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
    ...(absent.length > 0 ? [`not registered, given nothing new: servers ${absent.join(",")}`] : []),
    "nothing was changed (a plan only)"
  ]
}
