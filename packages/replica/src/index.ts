/**
 * @strata/replica: the replica state machine, ISR/high-watermark replication, leader-epoch truncation and
 * failover. Built so far: the replica state machine, the leader-epoch cache and the durable tablet log.
 *
 * @since 0.1.0
 */
export * as LeaderEpochCache from "./LeaderEpochCache.js"
export * as ReplicaState from "./ReplicaState.js"
export * as TabletLog from "./TabletLog.js"
