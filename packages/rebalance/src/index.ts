/**
 * @strata/rebalance — the rebalance planner: from a cluster model (servers with racks and tags, tablets with
 * replicas, leaders and sizes), the replica sets and leaders that balance it with the fewest moves; the rebalance
 * settings; and the trigger that decides when a rebalance starts by itself.
 *
 * @since 0.1.0
 */
/** A plan cut into batches (⌈batchRatio × N⌉ moves, leadership last) and waves within the concurrency limits. */
export * as Batches from "./Batches.js"
/** The rebalance executor as a pure machine: batches within the limits, the stability gate, rollback, pause, cancel. */
export * as Executor from "./Executor.js"
export * as ClusterModel from "./ClusterModel.js"
export * as Planner from "./Planner.js"
/** The rebalance service: the trigger and the executor run by the controller's leader, through a `ClusterControl`. */
export * as RebalanceService from "./RebalanceService.js"
/** A rebalance's state in coordination, in chunks of bounded size. */
export * as RebalanceStore from "./RebalanceStore.js"
/** The rebalance settings (`rebalance.*`), decoded with errors naming the key. */
export * as RebalanceConfig from "./RebalanceConfig.js"
/** The automatic trigger as a pure state machine: imbalance, hysteresis, cooldown, at most one rebalance. */
export * as Trigger from "./Trigger.js"
