/**
 * The cluster's requests between processes: Effect RPC over TCP, every request and answer a Schema, encoded with
 * `SchemaBinary`. Reads carry their records as batches in the tablet log's own encoding (one byte array a batch):
 * the RPC benchmark (`./dev bench:rpc`) measured a Schema pass per record at about 3× the cost. Appends and
 * follower fetches are not here: they travel only on the data link (`DataLink`), whose framing writes a batch's
 * bytes to the socket as they are.
 *
 * - `TabletServerRpcs`, served by every tablet server: the controller's `LeaderAndIsr`, `LogEnd`, `Holdings` and
 *   `StopReplica`, followers' `EndOffsetForEpoch`, clients' `Read`, `ReplicaState` and `ReadLog`.
 * - `ControllerRpcs`, served by the coordinator that leads: leaders' `AdjustIsr` and servers' `ControlledShutdown`;
 *   a coordinator that is not the controller answers `NotController`.
 *
 * This module is the wire: the groups, their Schemas and the TCP transport (`serveGroup`, `connectGroup`).
 * `TabletServerRpc` and `ControllerRpc` answer them from a tablet server and a controller; `RemotePeers` is the
 * client side.
 *
 * @since 0.1.0
 */
import type * as Tls from "node:tls"
import { HostPort, Models } from "@strata/core"
import { Planner, RebalanceService } from "@strata/rebalance"
import * as ReplicaManager from "../protocol/ReplicaManager.js"
import * as Reassignment from "../machines/Reassignment.js"
import { NodeSocket, NodeSocketServer } from "@effect/platform-node"
import {
  type Context,
  Effect,
  Layer,
  References,
  Schedule,
  Schema,
  SchemaIssue,
  SchemaTransformation,
  Scope
} from "effect"
import { Rpc, RpcClient, type RpcClientError, RpcGroup, RpcSerialization, RpcServer } from "effect/rpc"
import { SocketServer } from "effect/socket"
import * as Codec from "./internal/batchCodec.js"
import { PeerUnreachable } from "./Peers.js"
import type * as PeerTls from "./PeerTls.js"

/**
 * The coordinator asked is not the controller (a standby, or one that resigned): ask the one that leads.
 *
 * @since 0.1.0
 */
export class NotController extends Schema.TaggedError<NotController>()("NotController", {
  detail: Schema.String,
  /** Where the controller is, as the coordinator that answered knows it (a client asks there next). */
  leader: Schema.optional(Schema.String)
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `not the controller: ${this.detail}${this.leader === undefined ? "" : `; the controller is at ${this.leader}`}`
  }
}

/**
 * A process could not listen where it was asked (the port is taken, the address is not this host's): `service` says
 * which listener, `detail` what the system said.
 *
 * @since 0.1.0
 */
export class ListenFailed extends Schema.TaggedError<ListenFailed>()("ListenFailed", {
  service: Schema.String,
  address: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `the ${this.service} cannot listen on ${this.address}: ${this.detail}`
  }
}

/** `ListenFailed` from a socket server's failure to open. */
export const listenFailed = (service: string, listen: Address, cause: unknown): ListenFailed =>
  new ListenFailed({
    service,
    address: formatAddress(listen),
    detail:
      cause instanceof SocketServer.SocketServerError && cause.reason._tag === "SocketServerOpenError"
        ? String(cause.reason.cause instanceof Error ? cause.reason.cause.message : cause.reason.cause)
        : cause instanceof Error
          ? cause.message
          : String(cause)
  })

/** Why bytes are not a batch, as a Schema issue. */
const notABatch = (why: string) => new SchemaIssue.InvalidValue({ message: `not a tablet batch: ${why}` })

/**
 * What the batch codec decodes to, taken as it is: the codec built every record, so a Schema pass over each again
 * would only spend what the encoding saves.
 */
const DecodedBatch = Schema.declare(
  (u: unknown): u is ReplicaManager.TabletBatch =>
    typeof u === "object" && u !== null && "records" in u && "baseOffset" in u,
  { identifier: "TabletBatch" }
)

/**
 * A read batch on the wire: its base offset and its bytes as the log stores them.
 *
 * @since 0.1.0
 */
export const EncodedBatch = Schema.Struct({ baseOffset: Models.Offset, bytes: Schema.Uint8Array }).pipe(
  Schema.decodeTo(
    DecodedBatch,
    SchemaTransformation.transformEffect({
      decode: ({ baseOffset, bytes }: { readonly baseOffset: number; readonly bytes: Uint8Array }) => {
        const batch = Codec.decodeBatch(baseOffset, bytes)
        return typeof batch === "string" ? Effect.fail(notABatch(batch)) : Effect.succeed(batch)
      },
      encode: (batch: ReplicaManager.TabletBatch) =>
        Effect.succeed({
          baseOffset: batch.baseOffset,
          bytes: Codec.encodeBatch(batch.epoch, batch.records, batch.producer)
        })
    })
  )
)

/** `ReadResult`, its batches encoded as the log stores them. */
const ReadResultOnWire = Schema.Struct({ ...ReplicaManager.ReadResult.fields, batches: Schema.Array(EncodedBatch) })

/**
 * What every tablet server serves.
 *
 * @since 0.1.0
 */
export class TabletServerRpcs extends RpcGroup.make(
  Rpc.make("LeaderAndIsr", { payload: ReplicaManager.LeaderAndIsrRequest, error: ReplicaManager.ReplicaError }),
  Rpc.make("LogEnd", {
    payload: ReplicaManager.LogEndRequest,
    success: ReplicaManager.LogEndResult,
    error: ReplicaManager.ReplicaError
  }),
  Rpc.make("Holdings", {
    payload: ReplicaManager.HoldingsRequest,
    success: ReplicaManager.HoldingsResult,
    error: ReplicaManager.ReplicaError
  }),
  Rpc.make("StopReplica", { payload: ReplicaManager.StopReplicaRequest, error: ReplicaManager.ReplicaError }),
  Rpc.make("EndOffsetForEpoch", {
    payload: ReplicaManager.EndOffsetRequest,
    success: ReplicaManager.EndOffsetResult,
    error: ReplicaManager.ReplicaError
  }),
  Rpc.make("Read", {
    payload: ReplicaManager.ReadRequest,
    success: ReadResultOnWire,
    error: ReplicaManager.ReplicaError
  }),
  Rpc.make("DeleteRecords", {
    payload: ReplicaManager.DeleteRecordsRequest,
    success: ReplicaManager.DeleteRecordsResult,
    error: ReplicaManager.ReplicaError
  }),
  Rpc.make("ReplicaState", {
    payload: Schema.Struct({ tablet: Models.TabletId }),
    success: ReplicaManager.ReplicaState,
    error: ReplicaManager.ReplicaError
  }),
  Rpc.make("ReadLog", {
    payload: ReplicaManager.ReadRequest,
    success: ReadResultOnWire,
    error: ReplicaManager.ReplicaError
  })
) {}

/**
 * The most tablets one table may have: what a cluster was seen to do. Measured on a 2-core machine with three tablet
 * servers, two coordinators and one ZooKeeper: 30 000 tablets created in 22 s and all in full ISRs within 40 s, and
 * deleted in 20 s, the controller's leadership never lapsing; a 100 000-tablet create outran it (issue 32).
 *
 * @since 0.1.0
 */
export const MAX_TABLETS_PER_TABLE = 32_768

/**
 * An operator's request to create a table: `buckets` tablets of `replicationFactor` replicas each (the cluster's
 * `replicationFactor` when not given), assigned by the controller over the live servers. `retentionMs` and
 * `retentionBytes` (whole numbers ≥ 1) are the table's retention (`ReplicaManager.Retention`'s `ms` and `bytes`):
 * every replica of its tablets keeps that long, or that much; without them, everything is kept.
 *
 * @since 0.1.0
 */
export const CreateTableRequest = Schema.Struct({
  table: Schema.NonEmptyString,
  buckets: Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: MAX_TABLETS_PER_TABLE })),
  replicationFactor: Schema.optional(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 64 }))),
  retentionMs: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))),
  retentionBytes: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(1)))
})

/**
 * The retention a create request names (`undefined`: none, everything is kept).
 *
 * @since 0.1.0
 */
export const retentionOf = (request: {
  readonly retentionMs?: number | undefined
  readonly retentionBytes?: number | undefined
}): ReplicaManager.Retention | undefined =>
  request.retentionMs === undefined && request.retentionBytes === undefined
    ? undefined
    : {
        ...(request.retentionMs === undefined ? {} : { ms: request.retentionMs }),
        ...(request.retentionBytes === undefined ? {} : { bytes: request.retentionBytes })
      }

/**
 * Why a create's retention would be refused (naming the option and its value), if it would: each given is a whole
 * number ≥ 1 (`CreateTableRequest`'s check, made before a request is sent).
 *
 * @since 0.1.0
 */
export const invalidRetention = (options: {
  readonly retentionMs?: number | undefined
  readonly retentionBytes?: number | undefined
}): string | undefined => {
  for (const [name, value] of [
    ["retentionMs", options.retentionMs],
    ["retentionBytes", options.retentionBytes]
  ] as const) {
    if (value !== undefined && !(Number.isSafeInteger(value) && value >= 1)) {
      return `${name} must be a whole number ≥ 1, not ${value}`
    }
  }
  return undefined
}

/**
 * The controller would not create the table (it exists, or the live servers cannot hold it); `detail` says why.
 *
 * @since 0.1.0
 */
export class CreateTableRefused extends Schema.TaggedError<CreateTableRefused>()("CreateTableRefused", {
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return this.detail
  }
}

/**
 * A move's replication throttle: a whole number of bytes a second, at least 1.
 *
 * @since 0.1.0
 */
export const ThrottleBytesPerSec = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))

/**
 * A request to move a tablet's replicas to `replicas` (the first is the preferred leader), the adding replicas
 * copying at most `throttleBytesPerSec` on each server when given (see `Reassignment`).
 *
 * @since 0.1.0
 */
export const ReassignRequest = Schema.Struct({
  tablet: Models.TabletId,
  replicas: Schema.Array(Models.ServerId),
  throttleBytesPerSec: Schema.optional(ThrottleBytesPerSec)
})

/**
 * A request to move leadership back to preferred replicas: with `tablets`, those tablets' (preferred leader election,
 * whatever the imbalance); without, every server's whose preferred tablets are led elsewhere above the threshold.
 *
 * @since 0.1.0
 */
export const BalanceLeadersRequest = Schema.Struct({ tablets: Schema.optional(Schema.Array(Models.TabletId)) })

/**
 * One tablet as clients see it: where its replicas are, who leads, under which epoch.
 *
 * @since 0.1.0
 */
export const TabletMetadata = Schema.Struct({
  tablet: Models.TabletId,
  replicas: Schema.Array(Models.ServerId),
  state: Schema.Literals(["NewTablet", "OnlineTablet", "OfflineTablet", "DeletingTablet"]),
  leader: Schema.NullOr(Models.ServerId),
  leaderEpoch: Models.Epoch,
  isr: Schema.Array(Models.ServerId),
  /** The replicas a move under way ends with (see `Reassignment`). */
  target: Schema.optional(Schema.Array(Models.ServerId)),
  /** The replicas a move under way started from (a cancel returns to them). */
  original: Schema.optional(Schema.Array(Models.ServerId)),
  /** Servers a move took out that have not yet deleted their replica. */
  retired: Schema.optional(Schema.Array(Models.ServerId)),
  /** The replication throttle of the move under way, in bytes a second, if it names one. */
  throttleBytesPerSec: Schema.optional(ThrottleBytesPerSec),
  /** Its table's retention, if the table was created with one. */
  retention: Schema.optional(ReplicaManager.Retention)
})

/**
 * A registered tablet server as clients see it.
 *
 * @since 0.1.0
 */
export const ServerMetadata = Schema.Struct({
  id: Models.ServerId,
  address: Schema.String,
  /** Where its data link listens, when it serves one. */
  dataAddress: Schema.optional(Schema.String),
  rack: Schema.optional(Schema.String)
})

/**
 * The cluster as the controller holds it: every tablet (or one table's) and the registered servers.
 *
 * @since 0.1.0
 */
export const Metadata = Schema.Struct({
  coordinatorEpoch: Models.Epoch,
  tablets: Schema.Array(TabletMetadata),
  servers: Schema.Array(ServerMetadata)
})

/**
 * The metadata's type.
 *
 * @since 0.1.0
 */
export type Metadata = typeof Metadata.Type

/**
 * A table cannot be deleted as asked (there is none of that name).
 *
 * @since 0.1.0
 */
export class DeleteTableRefused extends Schema.TaggedError<DeleteTableRefused>()("DeleteTableRefused", {
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return this.detail
  }
}

/**
 * A reassignment (or its cancel) was refused: `reason` says why, `detail` as one line naming the tablet.
 *
 * @since 0.1.0
 */
export class ReassignRefused extends Schema.TaggedError<ReassignRefused>()("ReassignRefused", {
  reason: Reassignment.Refusal,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return this.detail
  }
}

/**
 * A server of the cluster model (shaped like `@strata/rebalance`'s `ClusterModel.Server`): a registered server with
 * its rack, or one that holds replicas but is not registered now (stopped, or dead), tagged `excluded`: it keeps
 * what it holds and takes nothing new.
 *
 * @since 0.1.0
 */
export const ModelServer = Schema.Struct({
  id: Models.ServerId,
  rack: Schema.optional(Schema.String),
  tags: Schema.optional(Schema.Array(Schema.Literals(["draining", "excluded"])))
})

/**
 * A tablet of the cluster model (shaped like `@strata/rebalance`'s `ClusterModel.Tablet`): its replicas (for a tablet
 * that is moving, the replicas it ends with), its leader when that is one of them, and its size in bytes when it
 * was learned in time (its leader's log's figure, else the largest its replicas gave).
 *
 * @since 0.1.0
 */
export const ModelTablet = Schema.Struct({
  tablet: Models.TabletId,
  replicas: Schema.Array(Models.ServerId),
  leader: Schema.NullOr(Models.ServerId),
  sizeBytes: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)))
})

/**
 * The most a `ClusterModel` request may wait for the servers' sizes, in ms.
 *
 * @since 0.1.0
 */
export const MAX_SIZE_TIMEOUT_MS = 60_000

/**
 * A request for the cluster model: `sizeTimeoutMs`, how long the controller waits for the servers' sizes (5000
 * unless given; a server that has not answered by then gives none).
 *
 * @since 0.1.0
 */
export const ClusterModelRequest = Schema.Struct({
  sizeTimeoutMs: Schema.optional(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: MAX_SIZE_TIMEOUT_MS })))
})

/**
 * The cluster as a rebalance planner sees it, from the controller: the registered servers and those holding
 * replicas without being registered, every tablet not being deleted, and how many of them are given without a size.
 *
 * @since 0.1.0
 */
export const ClusterModelReply = Schema.Struct({
  coordinatorEpoch: Models.Epoch,
  servers: Schema.Array(ModelServer),
  tablets: Schema.Array(ModelTablet),
  /** Tablets given without `sizeBytes`: no server holding one told its size in time. */
  sizesMissing: Schema.Int
})

/**
 * The cluster model's type.
 *
 * @since 0.1.0
 */
export type ClusterModelReply = typeof ClusterModelReply.Type

/**
 * An operator's rebalance request: `start` (with `goals`, every goal by default), `status`, `pause` (once the moves
 * under way end), `resume`, `cancel`. Every one is answered with the status after it.
 *
 * @since 0.1.0
 */
export const RebalanceRequest = Schema.Struct({
  action: Schema.Literals(["start", "status", "pause", "resume", "cancel"]),
  goals: Schema.optional(Schema.Array(Planner.Goal))
})

/** @see RebalanceRequest */
export type RebalanceRequest = typeof RebalanceRequest.Type

/**
 * What the controller serves.
 *
 * @since 0.1.0
 */
export class ControllerRpcs extends RpcGroup.make(
  Rpc.make("AdjustIsr", {
    payload: ReplicaManager.AdjustIsrRequest,
    success: ReplicaManager.AdjustIsrReply,
    error: NotController
  }),
  Rpc.make("ControlledShutdown", {
    payload: Schema.Struct({ server: Models.ServerId }),
    success: Schema.Int,
    error: NotController
  }),
  Rpc.make("CreateTable", {
    payload: CreateTableRequest,
    success: Schema.Array(TabletMetadata),
    error: Schema.Union([NotController, CreateTableRefused])
  }),
  Rpc.make("Metadata", {
    payload: Schema.Struct({ table: Schema.optional(Schema.String) }),
    success: Metadata,
    error: NotController
  }),
  Rpc.make("BalanceLeaders", { payload: BalanceLeadersRequest, success: Schema.Int, error: NotController }),
  Rpc.make("ReplicaStorage", {
    payload: Schema.Struct({
      server: Models.ServerId,
      registration: Schema.optional(Schema.Int),
      tablets: Schema.Array(Models.TabletId),
      failed: Schema.Boolean,
      sequence: Schema.Int
    }),
    error: NotController
  }),
  Rpc.make("InitProducerId", { payload: Schema.Struct({}), success: Schema.Int, error: NotController }),
  Rpc.make("DeleteTable", {
    payload: Schema.Struct({ table: Schema.NonEmptyString }),
    success: Schema.Int,
    error: Schema.Union([NotController, DeleteTableRefused])
  }),
  Rpc.make("Reassign", {
    payload: ReassignRequest,
    success: TabletMetadata,
    error: Schema.Union([NotController, ReassignRefused])
  }),
  Rpc.make("CancelReassign", {
    payload: Schema.Struct({ tablet: Models.TabletId }),
    success: TabletMetadata,
    error: Schema.Union([NotController, ReassignRefused])
  }),
  Rpc.make("ClusterModel", { payload: ClusterModelRequest, success: ClusterModelReply, error: NotController }),
  Rpc.make("Rebalance", {
    payload: RebalanceRequest,
    success: RebalanceService.Status,
    error: Schema.Union([NotController, RebalanceService.RebalanceCommandError])
  })
) {}

/**
 * A TCP address, `host:port`.
 *
 * @since 0.1.0
 */
export interface Address {
  readonly host: string
  readonly port: number
}

/**
 * `host:port` as an `Address`, if it is one.
 *
 * @since 0.1.0
 */
export const parseAddress = (text: string): Address | undefined => HostPort.parse(text)

/**
 * `host:port` as an address to listen on (port 0: any free one), if it is one.
 *
 * @since 0.1.0
 */
export const parseListen = (text: string): Address | undefined => HostPort.parse(text, { listen: true })

/**
 * An `Address` as `host:port`.
 *
 * @since 0.1.0
 */
export const formatAddress = (address: Address): string => HostPort.format(address)

/**
 * Serves `group` with `handlers` on a TCP listener at `listen` until the scope closes, over TLS when `tls` is given
 * (a listener's TLS: `PeerTls.serverOptions`); the address it is bound to.
 *
 * @since 0.1.0
 */
export const serveGroup = <R extends Rpc.Any>(
  group: RpcGroup.RpcGroup<R>,
  handlers: Context.Context<Rpc.ToHandler<R>>,
  listen: Address,
  tls?: Tls.TlsOptions
): Effect.Effect<Address, ListenFailed, Scope.Scope> =>
  Effect.gen(function* () {
    const at = { host: listen.host, port: listen.port }
    const socketServer = yield* (
      tls === undefined ? NodeSocketServer.make(at) : NodeSocketServer.makeTls({ ...tls, ...at })
    ).pipe(Effect.mapError((e) => listenFailed("RPC", listen, e)))
    const bound = socketServer.address
    // Built in this scope, not an inner one: the protocol's connection loop lives as long as the server.
    const serialization = yield* Layer.build(RpcSerialization.layerSchemaBinary())
    // A peer that goes away mid-connection (a restart, a kill) is an everyday event here, not an error to report.
    const protocol = yield* RpcServer.makeProtocolSocketServer.pipe(
      Effect.provideService(SocketServer.SocketServer, socketServer),
      Effect.provide(serialization),
      Effect.provideService(References.UnhandledLogLevel, "Debug")
    )
    yield* Effect.forkScoped(
      RpcServer.make(group).pipe(
        Effect.provideService(RpcServer.Protocol, protocol),
        Effect.provide(handlers),
        Effect.provideService(References.UnhandledLogLevel, "Debug"),
        Effect.catchCause((cause) => Effect.logError("rpc server stopped", cause))
      ) as Effect.Effect<void>
    )
    return bound._tag === "UnixPathAddress" ? listen : { host: listen.host, port: bound.port }
  })

/**
 * The handlers of `TabletServerRpcs`.
 *
 * @since 0.1.0
 */
export type TabletServerHandlers = RpcGroup.HandlersFrom<RpcGroup.Rpcs<typeof TabletServerRpcs>>

/**
 * Serves `TabletServerRpcs` with `handlers` on `listen` (port 0: any free port) until the scope closes; the address
 * bound.
 *
 * @since 0.1.0
 */
export const serveTabletServerWith = (
  listen: Address,
  handlers: TabletServerHandlers,
  tls?: Tls.TlsOptions
): Effect.Effect<Address, ListenFailed, Scope.Scope> =>
  Effect.flatMap(TabletServerRpcs.toHandlers(handlers), (context) => serveGroup(TabletServerRpcs, context, listen, tls))

/**
 * The handlers of `ControllerRpcs`.
 *
 * @since 0.1.0
 */
export type ControllerHandlers = RpcGroup.HandlersFrom<RpcGroup.Rpcs<typeof ControllerRpcs>>

/** How often a lost connection is opened again: from 100 ms, doubling, at most every second. */
const reconnectPolicy = Schedule.min([Schedule.exponential(100, 2), Schedule.spaced(1000)])

/**
 * A client of an RPC group, its errors including the transport's.
 *
 * @since 0.1.0
 */
export type Client<R extends Rpc.Any> = RpcClient.RpcClient<R, RpcClientError.RpcClientError>

/**
 * A client of `group` at `address` (`host:port`), its connection living in `scope` and reconnecting by itself; over
 * TLS when `tls` is given (a failed handshake fails the calls as a connection that cannot be opened does).
 *
 * @since 0.1.0
 */
export const connectGroup = <R extends Rpc.Any>(
  group: RpcGroup.RpcGroup<R>,
  scope: Scope.Scope,
  address: string,
  tls?: PeerTls.PeerTls
): Effect.Effect<Client<R>, PeerUnreachable> => {
  const parsed = parseAddress(address)
  if (parsed === undefined) {
    return Effect.fail(new PeerUnreachable({ target: address, detail: "not a host:port address" }))
  }
  // A connection that cannot be opened (the server is down) fails the calls waiting on it at once, and every call
  // after it until a reconnection, tried again and again in the background, succeeds: a caller learns a peer is gone
  // in a round trip, not after its request timeout.
  const protocol = RpcClient.layerProtocolSocket({ retryTransientErrors: false, retryPolicy: reconnectPolicy }).pipe(
    Layer.provide(
      tls === undefined
        ? NodeSocket.layerNet({ host: parsed.host, port: parsed.port })
        : NodeSocket.layerTls(tls.client(parsed.host, parsed.port))
    ),
    Layer.provide(RpcSerialization.layerSchemaBinary())
  )
  // Built in the peers' scope, not in one that closes once the client is made.
  const connected = Layer.buildWithScope(protocol, scope).pipe(
    Effect.flatMap((context) => RpcClient.make(group).pipe(Effect.provide(context), Scope.provide(scope))),
    Effect.mapError((e) => new PeerUnreachable({ target: address, detail: e.message }))
  )
  // The groups here use no client middleware: nothing is left to provide.
  return connected as Effect.Effect<Client<R>, PeerUnreachable>
}
