/**
 * How a tablet server reaches the rest of the cluster: other tablet servers (a follower's fetches and end-offset
 * questions to its leader) and the current controller (a leader's ISR changes, a server's controlled shutdown).
 * The transport is the layer's business: direct calls in one process, an in-memory network in the simulator, RPC
 * between processes.
 *
 * @since 0.1.0
 */
import type { Models } from "@strata/core"
import type * as ReplicaManager from "../protocol/ReplicaManager.js"
import { Context, type Effect, Schema } from "effect"
import type * as ControllerState from "../machines/ControllerState.js"

/**
 * A call found nobody to answer it: the target is down, partitioned away, not the controller, or did not answer in
 * time. The caller backs off and tries again; the request is safe to repeat. One `refused` by TLS is not tried again.
 *
 * @since 0.1.0
 */
export class PeerUnreachable extends Schema.TaggedError<PeerUnreachable>()("PeerUnreachable", {
  /** Who was called: `server 3`, `the controller`, an address. */
  target: Schema.String,
  /** Why the call found nobody. */
  detail: Schema.String,
  /**
   * The connection's TLS handshake failed as configured (a certificate one end does not accept, or none where one is
   * required): the call is not tried again, as doing so would not help.
   */
  refused: Schema.optional(Schema.Boolean)
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `${this.target} unreachable: ${this.detail}`
  }
}

/**
 * The calls a follower makes to its leader.
 *
 * @since 0.1.0
 */
export interface LeaderCalls {
  readonly fetch: (
    request: ReplicaManager.FetchRequest
  ) => Effect.Effect<ReplicaManager.FetchResult, ReplicaManager.ReplicaError | PeerUnreachable>
  readonly endOffsetForEpoch: (
    request: ReplicaManager.EndOffsetRequest
  ) => Effect.Effect<ReplicaManager.EndOffsetResult, ReplicaManager.ReplicaError | PeerUnreachable>
}

/**
 * The calls a tablet server makes to the controller.
 *
 * @since 0.1.0
 */
export interface ControllerCalls {
  readonly adjustIsr: (
    request: ControllerState.AdjustIsrRequest
  ) => Effect.Effect<ControllerState.AdjustIsrReply, PeerUnreachable>
  readonly controlledShutdown: (server: Models.ServerId) => Effect.Effect<number, PeerUnreachable>
  /** Tells the controller this server's replicas of `tablets` failed their storage (`failed`) or work again. */
  readonly replicaStorage: (request: ReplicaStorageReport) => Effect.Effect<void, PeerUnreachable>
}

/**
 * A tablet server's report on its replicas' storage, as the controller takes it.
 *
 * @since 0.1.0
 */
export interface ReplicaStorageReport {
  readonly server: Models.ServerId
  /** The registration (life) of the server that reports. */
  readonly registration?: number | undefined
  readonly tablets: ReadonlyArray<Models.TabletId>
  readonly failed: boolean
  /** Its place among the server's reports: the controller drops one older than a report it took. */
  readonly sequence: number
}

/**
 * The `Peers` service shape, as seen from one tablet server.
 *
 * @since 0.1.0
 */
export interface PeersShape {
  readonly leader: (server: Models.ServerId) => LeaderCalls
  readonly controller: ControllerCalls
}

/**
 * The `Peers` service key.
 *
 * @since 0.1.0
 */
export class Peers extends Context.Service<Peers, PeersShape>()("@strata/replica/Peers") {}

/**
 * How the controller reaches tablet servers. Each call ends within the transport's timeout (`PeerUnreachable`
 * then): the controller retries, and must not wait forever on a server that went away.
 *
 * @since 0.1.0
 */
export interface TabletServersShape {
  readonly leaderAndIsr: (
    server: Models.ServerId,
    request: ReplicaManager.LeaderAndIsrRequest
  ) => Effect.Effect<void, ReplicaManager.ReplicaError | PeerUnreachable>
  /** Asks a server how far its log of a tablet goes (a candidate leader, before an election decides). */
  readonly logEnd: (
    server: Models.ServerId,
    request: ReplicaManager.LogEndRequest
  ) => Effect.Effect<ReplicaManager.LogEndResult, ReplicaManager.ReplicaError | PeerUnreachable>
  /** Asks a server what it holds (a new controller, resuming: it instructs only where the server falls behind). */
  readonly holdings: (
    server: Models.ServerId,
    request: ReplicaManager.HoldingsRequest
  ) => Effect.Effect<ReplicaManager.HoldingsResult, ReplicaManager.ReplicaError | PeerUnreachable>
  /** Tells a server to delete its replicas of some tablets (their table was deleted). */
  readonly stopReplica: (
    server: Models.ServerId,
    request: ReplicaManager.StopReplicaRequest
  ) => Effect.Effect<void, ReplicaManager.ReplicaError | PeerUnreachable>
}

/**
 * The `TabletServers` service key: the controller's channel to the tablet servers.
 *
 * @since 0.1.0
 */
export class TabletServers extends Context.Service<TabletServers, TabletServersShape>()(
  "@strata/replica/TabletServers"
) {}
