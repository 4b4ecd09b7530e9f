import type * as Tls from "node:tls"
import { Coordination, type Election, Errors, Models, OptionSchemas, type Store } from "@strata/core"
import * as ReplicaManager from "../protocol/ReplicaManager.js"
import { Deferred, Duration, Effect, Fiber, Schema, type Scope } from "effect"
import * as ServerStorage from "../server/ServerStorage.js"
import * as ClusterDirectory from "../client/ClusterDirectory.js"
import * as ClusterPaths from "../wire/ClusterPaths.js"
import * as DataLink from "../wire/DataLink.js"
import * as PeerTls from "../wire/PeerTls.js"
import { Peers } from "../wire/Peers.js"
import * as RemotePeers from "../client/RemotePeers.js"
import * as ReplicaRpc from "../wire/ReplicaRpc.js"
import * as ReplicationConfig from "../wire/ReplicationConfig.js"
import * as TabletServer from "../server/TabletServer.js"
import * as TabletServerRpc from "../server/TabletServerRpc.js"

/** A `host:port` TCP address. */
const AddressString = Schema.String.check(
  Schema.makeFilter((a: string) =>
    ReplicaRpc.parseAddress(a) === undefined ? `expected host:port (port 1–65535), got ${a}` : undefined
  )
)
/** A listen address: `host:port`, port 0 picking any free one. */
const ListenString = Schema.String.check(
  Schema.makeFilter((a: string) =>
    ReplicaRpc.parseListen(a) === undefined
      ? `expected host:port (port 0–65535; 0 picks a free one), got ${a}`
      : undefined
  )
)
/** A listen address the options' schema let through. */
export const listenAddress = (listen: string): ReplicaRpc.Address => {
  const parsed = ReplicaRpc.parseListen(listen)
  if (parsed === undefined) throw new Error(`not a listen address: ${listen}`)
  return parsed
}
/** An absolute coordination path. */
const NamespaceString = Schema.String.check(
  Schema.makeFilter((ns: string) =>
    /^(\/[^/\s]+)+$/.test(ns) ? undefined : `expected an absolute path such as /strata, got ${ns}`
  )
)

/**
 * A process's options shared by tablet servers and coordinators.
 *
 * @since 0.1.0
 */
export const NodeFields = {
  serverId: Models.ServerId,
  /** The cluster's coordination namespace (`/strata`). */
  namespace: NamespaceString.pipe(Schema.withDecodingDefaultKey(Effect.succeed("/strata"))),
  /** Where to listen, `host:port` (`127.0.0.1:0`: loopback, any free port). */
  listen: ListenString.pipe(Schema.withDecodingDefaultKey(Effect.succeed("127.0.0.1:0"))),
  /** The address others reach this process at, when not the one it listens on (a NAT, `0.0.0.0`). */
  advertise: Schema.optional(AddressString),
  /** The cluster's replication settings (`ReplicationConfig`; every key optional). */
  replication: ReplicationConfig.ReplicationConfig.pipe(Schema.withDecodingDefaultKey(Effect.succeed({}))),
  /** TLS on the RPC and the data link, served and used (`PeerTls`): every process of the cluster needs it then. */
  tls: Schema.optional(PeerTls.PeerTlsOptions)
}

/**
 * A process's TLS as its options give it: what its listeners serve with, and the transport its calls take (`tcp`
 * without TLS, else `RemotePeers.tls`).
 *
 * @since 0.1.0
 */
export const nodeTls = (
  options: PeerTls.PeerTlsOptions | undefined
): Effect.Effect<
  { readonly serve: Tls.TlsOptions | undefined; readonly transport: RemotePeers.TransportShape },
  ReplicationConfig.InvalidReplicaOptions
> =>
  options === undefined
    ? Effect.succeed({ serve: undefined, transport: RemotePeers.tcp })
    : Effect.flatMap(PeerTls.make(options), (tls) =>
        Effect.map(PeerTls.serverOptions(tls), (serve) => ({ serve, transport: RemotePeers.tls(tls) }))
      )

/**
 * A tablet server process's options.
 *
 * @since 0.1.0
 */
export const TabletServerNodeOptions = Schema.Struct({
  ...NodeFields,
  /** The rack (or zone) this server is in: a tablet's replicas are put on distinct racks. */
  rack: Schema.optional(Schema.NonEmptyString),
  /**
   * Where the data link listens (appends and follower fetches on their own framing, see `DataLink`), `host:port`;
   * by default the listen address's host, any free port.
   */
  dataListen: Schema.optional(ListenString),
  /** The address others reach the data link at, when not the one it listens on. */
  dataAdvertise: Schema.optional(AddressString),
  /** Move this server's leaderships away before it stops (true); false stops it as a crash would. */
  controlledShutdown: Schema.Boolean.pipe(Schema.withDecodingDefaultKey(Effect.succeed(true)))
})

/**
 * The options' input.
 *
 * @since 0.1.0
 */
export type TabletServerNodeOptions = typeof TabletServerNodeOptions.Encoded

/**
 * A running tablet server process.
 *
 * @since 0.1.0
 */
export interface TabletServerNode {
  readonly server: TabletServer.TabletServerShape
  /** The address it registered (`host:port`). */
  readonly address: string
  /** Its registration epoch at start (later ones, after a session expired, add one each). */
  readonly registrationEpoch: number
  /** The cluster as this server finds it, and its calls to other servers and the controller. */
  readonly directory: ClusterDirectory.ClusterDirectory
  readonly remote: RemotePeers.RemotePeers
  /**
   * Runs while the server keeps its id: fails with `DuplicateServerId` when, registering again after its session
   * ended, it found the id held by another live server (it no longer acts for the id then); with `NotAuthorized` when
   * the coordination refuses its identity.
   */
  readonly held: Effect.Effect<never, ClusterPaths.DuplicateServerId | Coordination.CoordinationError>
}

/**
 * How long another session's registration of a server's id is waited out, in session timeouts: the registration of
 * the server's previous life goes within about one.
 *
 * @since 0.1.0
 */
export const holderWaitTimeouts = 2

/**
 * Serves `server`'s appends, fetches and reads on a data link (over TLS with `tls`) until the scope closes; the
 * address it registers.
 */
const serveDataLink = (
  server: TabletServer.TabletServerShape,
  o: { readonly listen: string; readonly dataListen?: string | undefined; readonly dataAdvertise?: string | undefined },
  tls: Tls.TlsOptions | undefined
) =>
  Effect.map(
    DataLink.serve(
      listenAddress(o.dataListen ?? `${ReplicaRpc.formatAddress({ ...listenAddress(o.listen), port: 0 })}`),
      {
        append: server.append,
        fetch: server.fetch,
        read: server.read
      },
      {},
      tls
    ),
    (bound) => o.dataAdvertise ?? ReplicaRpc.formatAddress(bound)
  )

/** The time a call between processes may take: above the longest wait a request may have. */
export const requestTimeoutOf = (config: ReplicationConfig.ReplicationConfig): Duration.Duration =>
  Duration.sum(Duration.max(config.appendTimeout, config.fetchMaxWait), Duration.seconds(5))

/**
 * Starts a tablet server process on the `Coordination` and `ServerStorage` in context; it stops with the scope.
 *
 * @since 0.1.0
 */
export const make = (
  options: TabletServerNodeOptions
): Effect.Effect<
  TabletServerNode,
  | ReplicationConfig.InvalidReplicaOptions
  | Coordination.CoordinationError
  | Election.ElectionError
  | Store.StoreError
  | ReplicaRpc.ListenFailed
  | ClusterPaths.DuplicateServerId,
  Coordination.Coordination | ServerStorage.ServerStorage | Scope.Scope
> =>
  Effect.gen(function* () {
    const o = yield* OptionSchemas.decodeOptions(TabletServerNodeOptions, { exact: true })(options).pipe(
      Effect.mapError(ReplicationConfig.invalidOptions)
    )
    const config = o.replication
    const paths = ClusterPaths.make(o.namespace)
    const tls = yield* nodeTls(o.tls)
    const coordination = yield* Coordination.Coordination
    const election = yield* ClusterPaths.electionOf(o.namespace, config)
    const directory = yield* ClusterDirectory.make(paths, election, { retryBackoff: config.retryBackoff })
    const remote = yield* RemotePeers.make({
      locate: directory.locate,
      locateData: directory.locateData,
      controller: directory.controller,
      requestTimeout: requestTimeoutOf(config)
    }).pipe(Effect.provideService(RemotePeers.Transport, tls.transport))
    const server = yield* TabletServer.make({
      serverId: o.serverId,
      replication: config
    }).pipe(Effect.provideService(Peers, remote.peers))
    // This process's registration now (`undefined`: none, or not yet): until it has one, it takes no instruction
    // addressed to server `serverId` (another process may be that server).
    let current: number | undefined
    const unregistered = (request: { readonly registration?: number | undefined }) =>
      new ReplicaManager.ReplicaError({
        reason: new Errors.FencedEpoch({
          resource: `registration of server ${o.serverId} (not registered)`,
          current: 0,
          attempted: request.registration ?? 0
        })
      })
    const whenRegistered =
      <Q extends { readonly registration?: number | undefined }, A>(
        f: (request: Q) => Effect.Effect<A, ReplicaManager.ReplicaError>
      ) =>
      (request: Q): Effect.Effect<A, ReplicaManager.ReplicaError> =>
        Effect.suspend(() => (current === undefined ? Effect.fail(unregistered(request)) : f(request)))
    const served: TabletServer.TabletServerShape = {
      ...server,
      leaderAndIsr: whenRegistered(server.leaderAndIsr),
      stopReplica: whenRegistered(server.stopReplica),
      holdings: whenRegistered(server.holdings)
    }
    const bound = yield* TabletServerRpc.serveTabletServer(listenAddress(o.listen), tls.serve).pipe(
      Effect.provideService(TabletServer.TabletServer, served)
    )
    const address = o.advertise ?? ReplicaRpc.formatAddress(bound)
    const dataAddress = yield* serveDataLink(server, o, tls.serve)
    const registrationEpoch = yield* (yield* ServerStorage.ServerStorage).nextRegistrationEpoch
    yield* Effect.logInfo(`tablet server ${o.serverId} listening on ${address}, data link on ${dataAddress}`)
    const first = yield* Deferred.make<void, ClusterPaths.DuplicateServerId | Coordination.CoordinationError>()
    const keeping = yield* Effect.forkScoped(
      ClusterPaths.keepRegistered(coordination, paths, o.serverId, {
        address,
        dataAddress,
        ...(o.rack === undefined ? {} : { rack: o.rack }),
        sessionTimeout: config.sessionTimeout,
        firstEpoch: registrationEpoch,
        retryBackoff: config.retryBackoff,
        holderWaitTimeouts,
        onRegistered: (registration) =>
          registration === undefined
            ? Effect.suspend(() => {
                const had = current !== undefined
                current = undefined
                return Effect.andThen(
                  server.registered(undefined),
                  had ? Effect.logInfo(`tablet server ${o.serverId}: registration ended with its session`) : Effect.void
                )
              })
            : server.registered(registration).pipe(
                Effect.andThen(
                  Effect.sync(() => {
                    current = registration
                  })
                ),
                Effect.andThen(Effect.logInfo(`tablet server ${o.serverId} registered at ${paths.server(o.serverId)}`)),
                Effect.andThen(Deferred.succeed(first, undefined))
              )
      }).pipe(Effect.tapError((e) => Deferred.fail(first, e)))
    )
    // Nothing is done for the id before this process holds it.
    yield* Deferred.await(first)
    if (o.controlledShutdown) {
      // Added last, so run first: while it runs the server still answers its followers' fetches.
      yield* Effect.addFinalizer(() =>
        Effect.suspend(() =>
          current === undefined
            ? Effect.logInfo(
                `tablet server ${o.serverId}: no controlled shutdown, it is not registered (its session ended)`
              )
            : Effect.flatMap(server.controlledShutdown, (left) =>
                left === 0
                  ? Effect.logInfo(`tablet server ${o.serverId}: controlled shutdown done`)
                  : left < 0
                    ? Effect.logWarning(
                        `tablet server ${o.serverId}: controlled shutdown could not reach the controller; stopping with its leaderships where they are (they move once its registration ends)`
                      )
                    : Effect.logWarning(`tablet server ${o.serverId}: stopping while leading ${left} tablets`)
              )
        )
      )
    }
    return { server, address, registrationEpoch, directory, remote, held: Fiber.join(keeping) }
  })
