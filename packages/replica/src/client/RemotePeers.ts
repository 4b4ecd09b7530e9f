/**
 * The client side of `ReplicaRpc` and the data link: `Peers` (how a tablet server reaches its leaders and the
 * controller) and `TabletServers` (how the controller reaches the servers) over TCP, or the `Transport` provided.
 * Appends and follower fetches travel on the server's data link, and so do clients' reads of a server that has one
 * (on the RPC otherwise); everything else goes on the RPC.
 * One connection per address, opened on first use and kept (it reconnects by itself); every call ends within
 * `requestTimeout`, failing with `PeerUnreachable` then, as it does when the target cannot be located or reached,
 * or its answer does not decode.
 *
 * @since 0.1.0
 */
import { Errors, type Models } from "@strata/core"
import type { RebalanceService } from "@strata/rebalance"
import type * as ReplicaManager from "../protocol/ReplicaManager.js"
import { Cause, Context, Duration, Effect, Exit, Scope } from "effect"
import type { Rpc, RpcClientError, RpcGroup } from "effect/rpc"
import type { TabletServersShape } from "../wire/Peers.js"
import * as DataLink from "../wire/DataLink.js"
import * as PeerTls from "../wire/PeerTls.js"
import * as ConnectionPool from "./internal/connectionPool.js"
import { PeerUnreachable, type PeersShape } from "../wire/Peers.js"
import {
  type Client,
  ControllerRpcs,
  type CreateTableRefused,
  type CreateTableRequest,
  type DeleteTableRefused,
  connectGroup,
  type ClusterModelReply,
  type ClusterModelRequest,
  type Metadata,
  NotController,
  parseAddress,
  type ReassignRefused,
  type RebalanceRequest,
  TabletServerRpcs,
  type TabletMetadata
} from "../wire/ReplicaRpc.js"

/**
 * Where the peers are, and how long a call may take.
 *
 * @since 0.1.0
 */
export interface RemotePeersOptions {
  /** The `host:port` a tablet server listens on (from its registration, say). */
  readonly locate: (server: Models.ServerId) => Effect.Effect<string, PeerUnreachable>
  /**
   * The `host:port` of a tablet server's data link, where appends, follower fetches and reads go (`undefined`: it
   * registered none, and cannot be appended to or fetched from; it is read through its RPC).
   */
  readonly locateData: (server: Models.ServerId) => Effect.Effect<string | undefined, PeerUnreachable>
  /** The `host:port` the controller listens on now. */
  readonly controller: Effect.Effect<string, PeerUnreachable>
  /** The longest a call may take, connecting included (above a follower's fetch wait); a number is milliseconds. */
  readonly requestTimeout: Duration.Input
}

/**
 * The cluster's peers, reached through the `Transport` in context (TCP unless provided).
 *
 * @since 0.1.0
 */
export interface RemotePeers {
  readonly peers: PeersShape
  readonly servers: TabletServersShape
  /** A tablet server's client calls: appends, reads, and a replica's state. */
  readonly server: (id: Models.ServerId) => ServerCalls
  /** Clients' and operators' calls to the controller. */
  readonly admin: AdminCalls
}

/**
 * Clients' and operators' calls to the controller (wherever it is now).
 *
 * @since 0.1.0
 */
export interface AdminCalls {
  readonly createTable: (
    request: typeof CreateTableRequest.Type
  ) => Effect.Effect<ReadonlyArray<typeof TabletMetadata.Type>, CreateTableRefused | PeerUnreachable>
  readonly metadata: (table?: string) => Effect.Effect<Metadata, PeerUnreachable>
  /** Moves leadership back to preferred replicas now; how many tablets moved. */
  readonly balanceLeaders: Effect.Effect<number, PeerUnreachable>
  /** Preferred leader election for `tablets`, whatever the imbalance; how many moved. */
  readonly electPreferred: (tablets: ReadonlyArray<Models.TabletId>) => Effect.Effect<number, PeerUnreachable>
  /** A producer id no producer of the cluster has had. */
  readonly initProducerId: Effect.Effect<number, PeerUnreachable>
  /** Deletes a table: how many tablets it had. */
  readonly deleteTable: (table: string) => Effect.Effect<number, DeleteTableRefused | PeerUnreachable>
  /** The cluster as a rebalance planner sees it, with each tablet's size when the servers told it in time. */
  readonly clusterModel: (
    request?: typeof ClusterModelRequest.Type
  ) => Effect.Effect<ClusterModelReply, PeerUnreachable>
  /**
   * Moves a tablet's replicas to `replicas` (the first is the preferred leader), the adding replicas copying at most
   * `options.throttleBytesPerSec` when given: the tablet as the move left it (with `target` while it is under way), or
   * `ReassignRefused` naming why not.
   */
  readonly reassign: (
    tablet: Models.TabletId,
    replicas: ReadonlyArray<Models.ServerId>,
    options?: { readonly throttleBytesPerSec?: number | undefined }
  ) => Effect.Effect<typeof TabletMetadata.Type, ReassignRefused | PeerUnreachable>
  /** Ends a tablet's move, back on its original replicas: the tablet as written, or `ReassignRefused`. */
  /** A rebalance request to the leading coordinator's rebalance service: the status after it. */
  readonly rebalance: (
    request: RebalanceRequest
  ) => Effect.Effect<RebalanceService.Status, RebalanceService.RebalanceCommandError | PeerUnreachable>
  readonly cancelReassign: (
    tablet: Models.TabletId
  ) => Effect.Effect<typeof TabletMetadata.Type, ReassignRefused | PeerUnreachable>
}

/**
 * A client's calls to one tablet server.
 *
 * @since 0.1.0
 */
export interface ServerCalls {
  readonly append: (
    request: ReplicaManager.AppendRequest
  ) => Effect.Effect<ReplicaManager.AppendResult, ReplicaManager.ReplicaError | PeerUnreachable>
  readonly read: (
    request: ReplicaManager.ReadRequest
  ) => Effect.Effect<ReplicaManager.ReadResult, ReplicaManager.ReplicaError | PeerUnreachable>
  readonly deleteRecords: (
    request: ReplicaManager.DeleteRecordsRequest
  ) => Effect.Effect<ReplicaManager.DeleteRecordsResult, ReplicaManager.ReplicaError | PeerUnreachable>
  readonly replicaState: (
    tablet: Models.TabletId
  ) => Effect.Effect<ReplicaManager.ReplicaState, ReplicaManager.ReplicaError | PeerUnreachable>
  /** The server's own log of a replica, whatever its role, past the high watermark too (a checker's read). */
  readonly readLog: (
    request: ReplicaManager.ReadRequest
  ) => Effect.Effect<ReplicaManager.ReadResult, ReplicaManager.ReplicaError | PeerUnreachable>
}

/**
 * How `RemotePeers` opens a connection to an address: an RPC client of a group, a data link client. Each lives in the
 * scope given. TCP unless another is provided (an in-memory network, in a simulation).
 *
 * @since 0.1.0
 */
export interface TransportShape {
  readonly rpc: <R extends Rpc.Any>(
    group: RpcGroup.RpcGroup<R>,
    address: string,
    scope: Scope.Scope
  ) => Effect.Effect<Client<R>, PeerUnreachable>
  readonly dataLink: (address: string, scope: Scope.Scope) => Effect.Effect<DataLink.DataLinkClient, PeerUnreachable>
  /**
   * What a connection closed by the server as soon as it opened may mean on this transport, added to the failure (a
   * TLS 1.3 server that does not accept the client's certificate closes the connection without a word).
   */
  readonly closedAtOnce?: string | undefined
  /**
   * Why the server at `address` closed a connection as soon as it opened, when this transport can find out (a
   * plaintext one asks whether a TLS server answers there): `undefined` when it cannot say.
   */
  readonly explainClose?: ((address: string) => Effect.Effect<string | undefined>) | undefined
}

/** Why a TLS server closed a plaintext client's connection: it speaks TLS (`undefined` when it does not). */
const plaintextClose = (address: string): Effect.Effect<string | undefined> => {
  const parsed = parseAddress(address)
  return parsed === undefined
    ? Effect.succeed(undefined)
    : Effect.map(PeerTls.speaksTls(parsed.host, parsed.port), (tls) =>
        tls
          ? "the server speaks TLS and this client has no TLS settings: give it the cluster's (tls; the CLI's tlsCa, tlsCert and tlsKey)"
          : undefined
      )
}

/** Connections over TCP, and TLS when `tls` is given. */
function tcpWith(tls: PeerTls.PeerTls | undefined): TransportShape {
  return {
    ...(tls === undefined ? { explainClose: plaintextClose } : {}),
    closedAtOnce:
      tls === undefined
        ? "a server that speaks TLS closes a plaintext connection so: if the cluster's processes use TLS, give this one their TLS settings (tls; the CLI's tlsCa)"
        : tls.hasCertificate
          ? "over TLS, this is also how a server refuses a certificate the cluster's CA did not sign"
          : "over TLS, this is also how a server that requires a client certificate refuses a connection without one",
    rpc: (group, address, scope) => connectGroup(group, scope, address, tls),
    dataLink: (address, scope) => {
      const parsed = parseAddress(address)
      return parsed === undefined
        ? Effect.fail(new PeerUnreachable({ target: address, detail: "not a host:port address" }))
        : DataLink.connect(parsed, {}, tls).pipe(Scope.provide(scope))
    }
  }
}

/**
 * The TCP transport: `ReplicaRpc`'s protocol over sockets, the data link's own framing.
 *
 * @since 0.1.0
 */
export const tcp: TransportShape = tcpWith(undefined)

/**
 * The TCP transport over TLS: every RPC and data link connection checks its server's certificate against `tls`'s CA,
 * and presents this process's certificate when it has one.
 *
 * @since 0.1.0
 */
export const tls = (tls: PeerTls.PeerTls): TransportShape => tcpWith(tls)

/**
 * The transport `RemotePeers` connects with (`tcp` unless provided).
 *
 * @since 0.1.0
 */
export const Transport = Context.Reference<TransportShape>("@strata/replica/RemotePeers/Transport", {
  defaultValue: () => tcp
})

/** What every call shares: the options, the connection pools, and where each peer was last found. */
interface Remote {
  readonly options: RemotePeersOptions
  /** `options.requestTimeout` as a `Duration`. */
  readonly requestTimeout: Duration.Duration
  readonly servers: ConnectionPool.ConnectionPool<Client<RpcGroup.Rpcs<typeof TabletServerRpcs>>>
  readonly controllers: ConnectionPool.ConnectionPool<Client<RpcGroup.Rpcs<typeof ControllerRpcs>>>
  readonly links: ConnectionPool.ConnectionPool<DataLink.DataLinkClient>
  /** Where each server's RPC was last found: a server found elsewhere retires its old address's connection. */
  readonly located: Map<Models.ServerId, string>
  /** Where each server's data link was last found, retired as `located` is. */
  readonly linked: Map<Models.ServerId, string>
  controllerAt: string | undefined
  /**
   * Where a coordinator that does not lead said the controller is: asked first until a call there fails (a client
   * that knows only some coordinators' addresses finds the leader so).
   */
  controllerHint: string | undefined
  /** The transport the connections were opened with. */
  readonly transport: TransportShape
  /** The addresses whose RPC answered a call at least once. */
  readonly answered: Set<string>
}

/** Whether a failure is the RPC client's own (the connection, not the peer's answer). */
const isRpcClientError = (e: unknown): e is RpcClientError.RpcClientError =>
  typeof e === "object" && e !== null && "_tag" in e && e._tag === "RpcClientError"

/**
 * An RPC client error as a line: its own message ("SocketOpenError: An error occurred during Open"), and the system's
 * reason beneath it (a refused connection, a TLS handshake's alert or certificate check), when it has one; `refused`
 * when that reason is a TLS handshake that cannot succeed as configured (`Errors.TLS_REFUSAL`).
 */
const describeRpcError = (
  e: RpcClientError.RpcClientError,
  closedAtOnce: string | undefined
): { readonly detail: string; readonly refused: boolean } => {
  // The system's error is the innermost one that is not Effect's own (those are tagged).
  const reason = Errors.causes(e.reason).findLast((c): c is Error => c instanceof Error && !("_tag" in c))
  const code = (reason as { readonly code?: unknown } | undefined)?.code
  // OpenSSL's messages carry its internals (`40ED…:error:0A00045C:SSL routines:ssl3_read_bytes:tlsv13 alert
  // certificate required:../deps/…`): the alert's words and Node's code say it.
  const openssl =
    reason === undefined
      ? null
      : /(tlsv1\d? alert [a-z ]+|sslv3 alert [a-z ]+|wrong version number)/.exec(reason.message)
  const why = reason === undefined ? undefined : openssl === null ? reason.message : `${openssl[1]} (${String(code)})`
  const refused = typeof code === "string" && Errors.TLS_REFUSAL.test(code)
  // A refused handshake is said by its reason alone: the socket's own words add nothing.
  const line = why === undefined ? e.message : refused ? why : `${e.message}: ${why}`
  return {
    detail: closedAtOnce !== undefined && e.reason._tag === "SocketCloseError" ? `${line} (${closedAtOnce})` : line,
    refused
  }
}

/** A call that ends in time; a transport failure is `PeerUnreachable`. */
const timed = <A, E>(
  r: Remote,
  target: string,
  call: Effect.Effect<A, E | RpcClientError.RpcClientError>,
  /** The peer's `host:port`, asked why when it closed the connection at once (`TransportShape.explainClose`). */
  address?: string
): Effect.Effect<A, Exclude<E, RpcClientError.RpcClientError> | PeerUnreachable> =>
  call.pipe(
    Effect.timeoutOrElse({
      duration: r.requestTimeout,
      orElse: () =>
        Effect.fail(new PeerUnreachable({ target, detail: `no answer within ${Duration.format(r.requestTimeout)}` }))
    }),
    Effect.tap(() => Effect.sync(() => address !== undefined && r.answered.add(address))),
    Effect.catchIf(isRpcClientError, (e) => {
      const described = describeRpcError(e, r.transport.closedAtOnce)
      const explain = r.transport.explainClose
      // Asked only of a peer that never answered: one that did speaks this transport (it restarted, say).
      return e.reason._tag === "SocketCloseError" &&
        explain !== undefined &&
        address !== undefined &&
        !r.answered.has(address)
        ? Effect.flatMap(explain(address), (why) =>
            Effect.fail(
              new PeerUnreachable(why === undefined ? { target, ...described } : { target, detail: why, refused: true })
            )
          )
        : Effect.fail(new PeerUnreachable({ target, ...described }))
    }),
    // An answer that did not decode (a peer of another version, say) must not end the caller's fiber.
    Effect.catchDefect((defect) =>
      Effect.fail(new PeerUnreachable({ target, detail: `the call failed: ${String(defect)}` }))
    ),
    // Nor a connection closed under the call (retired: the peer moved to another address), which ends the
    // call as an interruption: the caller tries again, and finds the peer where it is now.
    Effect.catchCause((cause) =>
      Cause.hasInterruptsOnly(cause)
        ? Effect.fail(new PeerUnreachable({ target, detail: "the connection closed during the call" }))
        : Effect.failCause(cause)
    )
  ) as Effect.Effect<A, Exclude<E, RpcClientError.RpcClientError> | PeerUnreachable>

/**
 * The connection to `address` from `pool`, peer `id` noted there in `found`: a peer found at a new address retires
 * its old one's connection (unless another peer is there now).
 */
const connectionAt = <C>(
  pool: ConnectionPool.ConnectionPool<C>,
  found: Map<Models.ServerId, string>,
  id: Models.ServerId,
  address: string
): Effect.Effect<C, PeerUnreachable> =>
  Effect.gen(function* () {
    const before = found.get(id)
    found.set(id, address)
    if (before !== undefined && before !== address && ![...found.values()].includes(before)) {
      yield* pool.retire(before)
    }
    return yield* pool.get(address)
  })

/** Bounds a call with its finding and connecting: a connection that never completes must not hold the caller. */
const bounded = <A, E>(r: Remote, target: string, call: Effect.Effect<A, E | PeerUnreachable>) =>
  call.pipe(
    Effect.timeoutOrElse({
      duration: Duration.sum(r.requestTimeout, Duration.seconds(1)),
      orElse: () =>
        Effect.fail(
          new PeerUnreachable({ target, detail: `no connection within ${Duration.format(r.requestTimeout)}` })
        )
    })
  )

/** A call to server `id`'s RPC, finding and connecting to it included. */
const onServer = <A, E>(
  r: Remote,
  id: Models.ServerId,
  call: (client: Client<RpcGroup.Rpcs<typeof TabletServerRpcs>>) => Effect.Effect<A, E | RpcClientError.RpcClientError>
): Effect.Effect<A, Exclude<E, RpcClientError.RpcClientError> | PeerUnreachable> =>
  bounded(
    r,
    `server ${id}`,
    Effect.flatMap(r.options.locate(id), (address) =>
      Effect.flatMap(connectionAt(r.servers, r.located, id, address), (client) =>
        timed(r, `server ${id} (${address})`, call(client), address)
      )
    )
  )

/** A call on server `id`'s data link, finding and connecting to it included. */
const onLink = <A>(
  r: Remote,
  id: Models.ServerId,
  call: (link: DataLink.DataLinkClient) => Effect.Effect<A, ReplicaManager.ReplicaError | PeerUnreachable>
): Effect.Effect<A, ReplicaManager.ReplicaError | PeerUnreachable> =>
  bounded(
    r,
    `server ${id}`,
    Effect.flatMap(r.options.locateData(id), (address) =>
      address === undefined
        ? Effect.fail(new PeerUnreachable({ target: `server ${id}`, detail: "it registered no data link" }))
        : Effect.flatMap(connectionAt(r.links, r.linked, id, address), (link) =>
            timed(r, `server ${id} (${address})`, call(link))
          )
    )
  )

/**
 * A call on server `id`'s data link when it registered one, else `rpc` to its RPC (a server without a link), finding
 * and connecting included.
 */
const onLinkOrServer = <A>(
  r: Remote,
  id: Models.ServerId,
  call: (link: DataLink.DataLinkClient) => Effect.Effect<A, ReplicaManager.ReplicaError | PeerUnreachable>,
  rpc: (
    client: Client<RpcGroup.Rpcs<typeof TabletServerRpcs>>
  ) => Effect.Effect<A, ReplicaManager.ReplicaError | RpcClientError.RpcClientError>
): Effect.Effect<A, ReplicaManager.ReplicaError | PeerUnreachable> =>
  Effect.flatMap(
    bounded(r, `server ${id}`, r.options.locateData(id)),
    (address): Effect.Effect<A, ReplicaManager.ReplicaError | PeerUnreachable> =>
      address === undefined
        ? onServer(r, id, rpc)
        : bounded(
            r,
            `server ${id}`,
            Effect.flatMap(connectionAt(r.links, r.linked, id, address), (link) =>
              timed(r, `server ${id} (${address})`, call(link))
            )
          )
  )

/** A call to the controller; a coordinator that is not the controller (any more) is as good as unreachable. */
const toController = <A, E>(
  r: Remote,
  call: (
    client: Client<RpcGroup.Rpcs<typeof ControllerRpcs>>
  ) => Effect.Effect<A, E | NotController | RpcClientError.RpcClientError>
): Effect.Effect<A, Exclude<E, NotController | RpcClientError.RpcClientError> | PeerUnreachable> =>
  bounded(
    r,
    "the controller",
    Effect.flatMap(
      r.controllerHint === undefined ? r.options.controller : Effect.succeed(r.controllerHint),
      (address) =>
        Effect.catchIf(
          callController(r, address, call),
          (e): e is NotController => e instanceof NotController && e.leader !== undefined && e.leader !== address,
          // Redirected once: the coordinator asked named the controller.
          (e) => {
            r.controllerHint = e.leader
            return callController(r, e.leader!, call)
          }
        )
    ).pipe(
      Effect.mapError((e) =>
        e instanceof NotController ? new PeerUnreachable({ target: "the controller", detail: e.message }) : e
      )
    )
  ) as Effect.Effect<A, Exclude<E, NotController | RpcClientError.RpcClientError> | PeerUnreachable>

/** One call to the controller at `address`; finding it unreachable or not the controller forgets a hint naming it. */
const callController = <A, E>(
  r: Remote,
  address: string,
  call: (
    client: Client<RpcGroup.Rpcs<typeof ControllerRpcs>>
  ) => Effect.Effect<A, E | NotController | RpcClientError.RpcClientError>
): Effect.Effect<A, E | NotController | PeerUnreachable> =>
  Effect.gen(function* () {
    const before = r.controllerAt
    r.controllerAt = address
    if (before !== undefined && before !== address) yield* r.controllers.retire(before)
    const client = yield* r.controllers.get(address)
    return yield* timed(r, `the controller (${address})`, call(client), address)
  }).pipe(
    Effect.tapError((e) =>
      Effect.sync(() => {
        if (r.controllerHint === address && (e instanceof NotController || e instanceof PeerUnreachable)) {
          r.controllerHint = undefined
        }
      })
    )
  ) as Effect.Effect<A, E | NotController | PeerUnreachable>

/** A tablet server's calls to its leaders and to the controller. */
const peersOf = (r: Remote): PeersShape => ({
  leader: (id) => ({
    fetch: (request) => onLink(r, id, (link) => link.fetch(request)),
    endOffsetForEpoch: (request) => onServer(r, id, (client) => client.EndOffsetForEpoch(request))
  }),
  controller: {
    adjustIsr: (request) => toController(r, (c) => c.AdjustIsr(request)),
    controlledShutdown: (id) => toController(r, (c) => c.ControlledShutdown({ server: id })),
    replicaStorage: (report) =>
      toController(r, (c) =>
        c.ReplicaStorage({
          server: report.server,
          ...(report.registration === undefined ? {} : { registration: report.registration }),
          tablets: report.tablets,
          failed: report.failed,
          sequence: report.sequence
        })
      )
  }
})

/** The controller's calls to the tablet servers. */
const tabletServersOf = (r: Remote): TabletServersShape => ({
  leaderAndIsr: (id, request) => onServer(r, id, (client) => client.LeaderAndIsr(request)),
  logEnd: (id, request) => onServer(r, id, (client) => client.LogEnd(request)),
  holdings: (id, request) => onServer(r, id, (client) => client.Holdings(request)),
  stopReplica: (id, request) => onServer(r, id, (client) => client.StopReplica(request))
})

/** A client's calls to one tablet server. */
const serverCallsOf =
  (r: Remote) =>
  (id: Models.ServerId): ServerCalls => ({
    append: (request) => onLink(r, id, (link) => link.append(request)),
    read: (request) =>
      onLinkOrServer(
        r,
        id,
        (link) => link.read(request),
        (client) => client.Read(request)
      ),
    deleteRecords: (request) => onServer(r, id, (client) => client.DeleteRecords(request)),
    replicaState: (tablet) => onServer(r, id, (client) => client.ReplicaState({ tablet })),
    readLog: (request) => onServer(r, id, (client) => client.ReadLog(request))
  })

/** Clients' and operators' calls to the controller. */
const adminOf = (r: Remote): AdminCalls => ({
  createTable: (request) => toController(r, (c) => c.CreateTable(request)),
  metadata: (table) => toController(r, (c) => c.Metadata(table === undefined ? {} : { table })),
  balanceLeaders: toController(r, (c) => c.BalanceLeaders({})),
  electPreferred: (tablets) => toController(r, (c) => c.BalanceLeaders({ tablets })),
  initProducerId: toController(r, (c) => c.InitProducerId({})),
  deleteTable: (table) => toController(r, (c) => c.DeleteTable({ table })),
  clusterModel: (request = {}) => toController(r, (c) => c.ClusterModel(request)),
  reassign: (tablet, replicas, options) =>
    toController(r, (c) =>
      c.Reassign({
        tablet,
        replicas,
        ...(options?.throttleBytesPerSec === undefined ? {} : { throttleBytesPerSec: options.throttleBytesPerSec })
      })
    ),
  cancelReassign: (tablet) => toController(r, (c) => c.CancelReassign({ tablet })),
  rebalance: (request) => toController(r, (c) => c.Rebalance(request))
})

/**
 * Peers over the `Transport` in context (TCP unless provided), their connections closed with the scope.
 *
 * @since 0.1.0
 */
export const make = (options: RemotePeersOptions): Effect.Effect<RemotePeers, never, Scope.Scope> =>
  Effect.gen(function* () {
    const scope = yield* Scope.fork(yield* Effect.scope, "parallel")
    yield* Effect.addFinalizer(() => Scope.close(scope, Exit.void))
    const transport = yield* Transport
    const r: Remote = {
      options,
      requestTimeout: Duration.fromInputUnsafe(options.requestTimeout),
      servers: ConnectionPool.make(scope, (address, entryScope) =>
        transport.rpc(TabletServerRpcs, address, entryScope)
      ),
      controllers: ConnectionPool.make(scope, (address, entryScope) =>
        transport.rpc(ControllerRpcs, address, entryScope)
      ),
      links: ConnectionPool.make(scope, transport.dataLink),
      located: new Map(),
      linked: new Map(),
      controllerAt: undefined,
      controllerHint: undefined,
      transport,
      answered: new Set()
    }
    return { peers: peersOf(r), servers: tabletServersOf(r), server: serverCallsOf(r), admin: adminOf(r) }
  })
