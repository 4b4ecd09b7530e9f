/**
 * The client side of `ReplicaRpc`: `Peers` (how a tablet server reaches its leaders and the controller) and
 * `TabletServers` (how the controller reaches the servers) over TCP, or the `Transport` provided. One connection per
 * address, opened on first use and kept (it reconnects by itself); every call ends within `requestTimeoutMs`,
 * failing with `PeerUnreachable` then, as it does when the target cannot be located or reached, or its answer does
 * not decode.
 *
 * @since 0.1.0
 */
import type {
  AppendRequest,
  AppendResult,
  ReadRequest,
  ReadResult,
  ReplicaError,
  ReplicaState,
  ServerId,
  TabletId
} from "@strata/core"
import { Cause, Context, Effect, Exit, Scope } from "effect"
import type { Rpc, RpcClientError, RpcGroup } from "effect/rpc"
import type { TabletServersShape } from "../wire/Peers.js"
import * as DataLink from "../wire/DataLink.js"
import * as ConnectionPool from "./internal/connectionPool.js"
import { PeerUnreachable, type PeersShape } from "../wire/Peers.js"
import {
  type Client,
  ControllerRpcs,
  type CreateTableRefused,
  type CreateTableRequest,
  type DeleteTableRefused,
  connectGroup,
  encodeAppend,
  type Metadata,
  NotController,
  parseAddress,
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
  readonly locate: (server: ServerId) => Effect.Effect<string, PeerUnreachable>
  /**
   * The `host:port` of a tablet server's data link, `undefined` when it has none: appends and follower fetches go
   * there when it has one, else through the RPC (always, without this option).
   */
  readonly locateData?: (server: ServerId) => Effect.Effect<string | undefined, PeerUnreachable>
  /** The `host:port` the controller listens on now. */
  readonly controller: Effect.Effect<string, PeerUnreachable>
  /** The longest a call may take, connecting included (above a follower's fetch wait). */
  readonly requestTimeoutMs: number
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
  readonly server: (id: ServerId) => ServerCalls
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
  /** A producer id no producer of the cluster has had. */
  readonly initProducerId: Effect.Effect<number, PeerUnreachable>
  /** Deletes a table: how many tablets it had. */
  readonly deleteTable: (table: string) => Effect.Effect<number, DeleteTableRefused | PeerUnreachable>
}

/**
 * A client's calls to one tablet server.
 *
 * @since 0.1.0
 */
export interface ServerCalls {
  readonly append: (request: AppendRequest) => Effect.Effect<AppendResult, ReplicaError | PeerUnreachable>
  readonly read: (request: ReadRequest) => Effect.Effect<ReadResult, ReplicaError | PeerUnreachable>
  readonly replicaState: (tablet: TabletId) => Effect.Effect<ReplicaState, ReplicaError | PeerUnreachable>
  /** The server's own log of a replica, whatever its role, past the high watermark too (a checker's read). */
  readonly readLog: (request: ReadRequest) => Effect.Effect<ReadResult, ReplicaError | PeerUnreachable>
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
}

/**
 * The TCP transport: `ReplicaRpc`'s protocol over sockets, the data link's own framing.
 *
 * @since 0.1.0
 */
export const tcp: TransportShape = {
  rpc: (group, address, scope) => connectGroup(group, scope, address),
  dataLink: (address, scope) => {
    const parsed = parseAddress(address)
    return parsed === undefined
      ? Effect.fail(new PeerUnreachable({ target: address, detail: "not a host:port address" }))
      : DataLink.connect(parsed).pipe(Scope.provide(scope))
  }
}

/**
 * The transport `RemotePeers` connects with (`tcp` unless provided).
 *
 * @since 0.1.0
 */
export const Transport = Context.Reference<TransportShape>("@strata/replica/RemotePeers/Transport", {
  defaultValue: () => tcp
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
    const servers = ConnectionPool.make<Client<RpcGroup.Rpcs<typeof TabletServerRpcs>>>(scope, (address, entryScope) =>
      transport.rpc(TabletServerRpcs, address, entryScope)
    )
    const controllers = ConnectionPool.make<Client<RpcGroup.Rpcs<typeof ControllerRpcs>>>(
      scope,
      (address, entryScope) => transport.rpc(ControllerRpcs, address, entryScope)
    )
    const links = ConnectionPool.make<DataLink.DataLinkClient>(scope, transport.dataLink)
    /** A call that ends in time; a transport failure is `PeerUnreachable`. */
    const timed = <A, E>(
      target: string,
      call: Effect.Effect<A, E | RpcClientError.RpcClientError>
    ): Effect.Effect<A, Exclude<E, RpcClientError.RpcClientError> | PeerUnreachable> =>
      call.pipe(
        Effect.timeoutOrElse({
          duration: options.requestTimeoutMs,
          orElse: () =>
            Effect.fail(new PeerUnreachable({ target, detail: `no answer within ${options.requestTimeoutMs} ms` }))
        }),
        Effect.catchIf(
          (e): e is RpcClientError.RpcClientError =>
            typeof e === "object" && e !== null && "_tag" in e && e._tag === "RpcClientError",
          (e) => Effect.fail(new PeerUnreachable({ target, detail: e.message }))
        ),
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
    // Where each server was last found: a server found elsewhere retires its old address's connection.
    const located = new Map<ServerId, string>()
    let controllerAt: string | undefined
    const server = (id: ServerId) =>
      Effect.flatMap(options.locate(id), (address) =>
        Effect.gen(function* () {
          const before = located.get(id)
          located.set(id, address)
          if (before !== undefined && before !== address && ![...located.values()].includes(before)) {
            yield* servers.retire(before)
          }
          const client = yield* servers.get(address)
          return { client, target: `server ${id} (${address})` }
        })
      )
    /**
     * A call to server `id`, finding and connecting to it included, bounded as a whole: a connection that never
     * completes (a peer gone mid-handshake) must not hold the caller past the timeout either.
     */
    const onServer = <A, E>(
      id: ServerId,
      call: (
        client: Client<RpcGroup.Rpcs<typeof TabletServerRpcs>>
      ) => Effect.Effect<A, E | RpcClientError.RpcClientError>
    ): Effect.Effect<A, Exclude<E, RpcClientError.RpcClientError> | PeerUnreachable> =>
      Effect.flatMap(server(id), ({ client, target }) => timed(target, call(client))).pipe(
        Effect.timeoutOrElse({
          duration: options.requestTimeoutMs + 1_000,
          orElse: () =>
            Effect.fail(
              new PeerUnreachable({
                target: `server ${id}`,
                detail: `no connection within ${options.requestTimeoutMs} ms`
              })
            )
        })
      )
    // Where each server's data link was last found, retired as `located` is.
    const linked = new Map<ServerId, string>()
    const locateData = options.locateData
    /**
     * A call on server `id`'s data link when it registered one, else `otherwise` (through the RPC); bounded as a
     * whole as `onServer` is.
     */
    const onLink = <A>(
      id: ServerId,
      call: (link: DataLink.DataLinkClient) => Effect.Effect<A, ReplicaError | PeerUnreachable>,
      otherwise: Effect.Effect<A, ReplicaError | PeerUnreachable>
    ): Effect.Effect<A, ReplicaError | PeerUnreachable> =>
      locateData === undefined
        ? otherwise
        : Effect.flatMap(locateData(id), (address) => {
            if (address === undefined) return otherwise
            return Effect.gen(function* () {
              const before = linked.get(id)
              linked.set(id, address)
              if (before !== undefined && before !== address && ![...linked.values()].includes(before)) {
                yield* links.retire(before)
              }
              return yield* timed(`server ${id} (${address})`, call(yield* links.get(address)))
            })
          })
    const controller = Effect.flatMap(options.controller, (address) =>
      Effect.gen(function* () {
        const before = controllerAt
        controllerAt = address
        if (before !== undefined && before !== address) yield* controllers.retire(before)
        const client = yield* controllers.get(address)
        return { client, target: `the controller (${address})` }
      })
    )
    /** A coordinator that is not the controller (any more) is as good as unreachable: the caller looks again. */
    const toController = <A, E>(
      call: (
        client: Client<RpcGroup.Rpcs<typeof ControllerRpcs>>
      ) => Effect.Effect<A, E | NotController | RpcClientError.RpcClientError>
    ): Effect.Effect<A, Exclude<E, NotController | RpcClientError.RpcClientError> | PeerUnreachable> =>
      Effect.flatMap(controller, ({ client, target }) =>
        timed(target, call(client)).pipe(
          Effect.mapError((e) => (e instanceof NotController ? new PeerUnreachable({ target, detail: e.message }) : e))
        )
      ).pipe(
        Effect.timeoutOrElse({
          duration: options.requestTimeoutMs + 1_000,
          orElse: () =>
            Effect.fail(
              new PeerUnreachable({
                target: "the controller",
                detail: `no connection within ${options.requestTimeoutMs} ms`
              })
            )
        })
      ) as Effect.Effect<A, Exclude<E, NotController | RpcClientError.RpcClientError> | PeerUnreachable>

    const peers: PeersShape = {
      leader: (id) => ({
        fetch: (request) =>
          onLink(
            id,
            (link) => link.fetch(request),
            onServer(id, (client) => client.Fetch(request))
          ),
        endOffsetForEpoch: (request) => onServer(id, (client) => client.EndOffsetForEpoch(request))
      }),
      controller: {
        adjustIsr: (request) => toController((c) => c.AdjustIsr(request)),
        controlledShutdown: (id) => toController((c) => c.ControlledShutdown({ server: id })),
        replicaStorage: (report) =>
          toController((c) =>
            c.ReplicaStorage({
              server: report.server,
              ...(report.registration === undefined ? {} : { registration: report.registration }),
              tablets: report.tablets,
              failed: report.failed,
              sequence: report.sequence
            })
          )
      }
    }
    const tabletServers: TabletServersShape = {
      leaderAndIsr: (id, request) => onServer(id, (client) => client.LeaderAndIsr(request)),
      logEnd: (id, request) => onServer(id, (client) => client.LogEnd(request)),
      holdings: (id, request) => onServer(id, (client) => client.Holdings(request)),
      stopReplica: (id, request) => onServer(id, (client) => client.StopReplica(request))
    }
    const calls = (id: ServerId): ServerCalls => ({
      append: (request) =>
        onLink(
          id,
          (link) => link.append(request),
          onServer(id, (client) => client.Append(encodeAppend(request)))
        ),
      read: (request) => onServer(id, (client) => client.Read(request)),
      replicaState: (tablet) => onServer(id, (client) => client.ReplicaState({ tablet })),
      readLog: (request) => onServer(id, (client) => client.ReadLog(request))
    })
    const admin: AdminCalls = {
      createTable: (request) => toController((c) => c.CreateTable(request)),
      metadata: (table) => toController((c) => c.Metadata(table === undefined ? {} : { table })),
      balanceLeaders: toController((c) => c.BalanceLeaders({})),
      initProducerId: toController((c) => c.InitProducerId({})),
      deleteTable: (table) => toController((c) => c.DeleteTable({ table }))
    }
    return { peers, servers: tabletServers, server: calls, admin }
  })
