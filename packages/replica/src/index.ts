/**
 * @strata/replica: replicated tablets — the replica state machine, the durable tablet log with its leader-epoch
 * cache and producer state, ISR/high-watermark replication, KIP-101/279 truncation, the controller, the tablet
 * server and its process, the coordinator's process, the client, a whole cluster in one process, and the requests between processes (Effect RPC over TCP).
 *
 * @since 0.1.0
 */
export * as ClusterDirectory from "./ClusterDirectory.js"
export * as ClusterPaths from "./ClusterPaths.js"
export * as Assignment from "./Assignment.js"
export * as Controller from "./Controller.js"
export * as ControllerState from "./ControllerState.js"
export * as ControllerView from "./ControllerView.js"
export * as CoordinatorNode from "./CoordinatorNode.js"
export * as DataLink from "./DataLink.js"
export * as FollowerState from "./FollowerState.js"
export * as LeaderEpochCache from "./LeaderEpochCache.js"
export * as LeaderState from "./LeaderState.js"
export * as LocalCluster from "./LocalCluster.js"
export * as Peers from "./Peers.js"
export * as ProducerIds from "./ProducerIds.js"
export * as ProducerState from "./ProducerState.js"
export * as RemotePeers from "./RemotePeers.js"
export * as ReplicaRpc from "./ReplicaRpc.js"
export * as ReplicaState from "./ReplicaState.js"
export * as ReplicationConfig from "./ReplicationConfig.js"
export * as StrataLog from "./StrataLog.js"
export * as TabletClient from "./TabletClient.js"
export * as TabletLog from "./TabletLog.js"
export * as TabletServer from "./TabletServer.js"
export * as TabletServerNode from "./TabletServerNode.js"
