/**
 * @strata/rebalance — the rebalance planner: from a cluster model (servers with racks and tags, tablets with
 * replicas, leaders and sizes), the replica sets and leaders that balance it with the fewest moves.
 *
 * @since 0.1.0
 */
export * as ClusterModel from "./ClusterModel.js"
export * as Planner from "./Planner.js"
