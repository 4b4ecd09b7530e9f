/**
 * @strata/replica: replicated tablets — the replica state machine, the durable tablet log with its leader-epoch
 * cache and producer state, ISR/high-watermark replication, KIP-101/279 truncation, the controller, the tablet
 * server and its process, the coordinator's process, the client, a whole cluster in one process, and the requests
 * between processes (Effect RPC over TCP). Core's `Log` on the tablets is the subpath `@strata/replica/log`.
 *
 * The source is in layers whose imports point only down: `protocol/` (the `ReplicaManager` service a tablet
 * server provides, with its requests and answers), `machines/` (pure state machines), `wire/` (what travels
 * between processes and where the cluster keeps its state), `server/` and `client/` (beside each other), then
 * `node/` (the processes, and a cluster in one process) and `log/`.
 *
 * @since 0.1.0
 */
export * as ClusterDirectory from "./client/ClusterDirectory.js"
export * as ClusterPaths from "./wire/ClusterPaths.js"
export * as Assignment from "./machines/Assignment.js"
export * as Controller from "./server/Controller.js"
export * as ControllerMetrics from "./server/ControllerMetrics.js"
export * as ControllerRpc from "./server/ControllerRpc.js"
export * as ControllerState from "./machines/ControllerState.js"
export * as ControllerView from "./server/ControllerView.js"
export * as CoordinatorNode from "./node/CoordinatorNode.js"
export * as DataLink from "./wire/DataLink.js"
export * as FollowerState from "./machines/FollowerState.js"
export * as LeaderEpochCache from "./machines/LeaderEpochCache.js"
export * as LeaderState from "./machines/LeaderState.js"
export * as LocalCluster from "./node/LocalCluster.js"
export * as Peers from "./wire/Peers.js"
export * as PeerTls from "./wire/PeerTls.js"
export * as Reassignment from "./machines/Reassignment.js"
export * as ProducerIds from "./server/ProducerIds.js"
export * as ProducerState from "./machines/ProducerState.js"
export * as Replica from "./machines/Replica.js"
export * as RemotePeers from "./client/RemotePeers.js"
export * as ReplicaManager from "./protocol/ReplicaManager.js"
export * as ReplicaRpc from "./wire/ReplicaRpc.js"
export * as ReplicaState from "./machines/ReplicaState.js"
export * as ReplicationConfig from "./wire/ReplicationConfig.js"
export * as ServerMetrics from "./server/ServerMetrics.js"
export * as ServerStorage from "./server/ServerStorage.js"
export * as SegmentLog from "./server/SegmentLog.js"
export * as TabletClient from "./client/TabletClient.js"
export * as TabletLog from "./server/TabletLog.js"
export * as TabletServer from "./server/TabletServer.js"
export * as TabletServerNode from "./node/TabletServerNode.js"
export * as TabletServerRpc from "./server/TabletServerRpc.js"
