/**
 * @strata/replica: the replica state machine, ISR/high-watermark replication, leader-epoch truncation and
 * failover. Built so far: the replica state machine, the leader-epoch cache, the durable tablet log and the
 * leader's ISR/HW state and the follower's fetch protocol.
 *
 * @since 0.1.0
 */
export * as FollowerState from "./FollowerState.js"
export * as LeaderEpochCache from "./LeaderEpochCache.js"
export * as LeaderState from "./LeaderState.js"
export * as ReplicaState from "./ReplicaState.js"
export * as TabletLog from "./TabletLog.js"
