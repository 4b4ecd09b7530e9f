/**
 * A whole replicated cluster in one process, for examples, users' tests and the embedded demo: coordinators running
 * the election with the `Controller` as their leader service, tablet servers each on its own memory store, all on
 * the `Coordination` in context (memory coordination, typically). Calls between them are made directly, or with
 * `transport: "tcp"` over loopback TCP as separate processes make them (`ReplicaRpc`: every server and coordinator
 * listens on a port of its own and registers that address; `ClusterDirectory` finds them). Servers can be stopped
 * (their session ends, as a crash that the coordination service noticed) and started again on the same store.
 *
 * Its client side is a small idempotent producer: each append is stamped with a producer id the controller allocated
 * and the tablet's next sequence, routed to the leader the controller last wrote, and retried (after `NotLeader`,
 * `NotEnoughReplicas`, a timeout) until the leader answers; a retry of a batch already written is answered with
 * its offsets, never written twice. Appends to one tablet go one at a time; after a failed one the tablet's next
 * append starts a new producer epoch, so a failure leaves no gap in the sequence.
 *
 * @since 0.1.0
 */
import { Coordination, Election, MemoryStore, Models, Retry, type Store } from "@strata/core"
import type * as ReplicaManager from "../protocol/ReplicaManager.js"
import { CoordinationElection, Coordinator } from "@strata/election"
import { Context, Effect, Exit, Layer, Schedule, Schema, Scope } from "effect"
import * as ClusterDirectory from "../client/ClusterDirectory.js"
import * as ClusterPaths from "../wire/ClusterPaths.js"
import type * as Controller from "../server/Controller.js"
import type * as ControllerState from "../machines/ControllerState.js"
import * as ControllerView from "../server/ControllerView.js"
import * as CoordinatorNode from "./CoordinatorNode.js"
import * as LocalProducer from "./internal/localProducer.js"
import { Peers, PeerUnreachable, type PeersShape } from "../wire/Peers.js"
import * as RemotePeers from "../client/RemotePeers.js"
import type * as TabletClient from "../client/TabletClient.js"
import { CreateTableRefused, ReassignRefused, retentionOf } from "../wire/ReplicaRpc.js"
import * as ReplicationConfig from "../wire/ReplicationConfig.js"
import * as TabletServer from "../server/TabletServer.js"
import * as ServerStorage from "../server/ServerStorage.js"
import * as TabletServerNode from "./TabletServerNode.js"

/**
 * The cluster's options.
 *
 * @since 0.1.0
 */
export interface LocalClusterOptions {
  /** How many tablet servers (ids 1…n). */
  readonly servers: number
  /** How many coordinators (ids 101…; default 1). */
  readonly coordinators?: number
  readonly replication?: ReplicationConfig.ReplicationConfigInput
  /** The coordination namespace (`/strata`). */
  readonly namespace?: string
  /** How the parts call each other: directly (the default), or over loopback TCP. */
  readonly transport?: "direct" | "tcp"
}

/**
 * The cluster's election could not be set up.
 *
 * @since 0.1.0
 */
export class ElectionFailed extends Schema.TaggedError<ElectionFailed>()("ElectionFailed", {
  cause: Election.ElectionError
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `the election: ${this.cause.message}`
  }
}

/**
 * The controller gave the cluster's producer no producer id (`detail`: why), however often it was asked.
 *
 * @since 0.1.0
 */
export class ProducerIdUnavailable extends Schema.TaggedError<ProducerIdUnavailable>()("ProducerIdUnavailable", {
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `no producer id: ${this.detail}`
  }
}

/**
 * A part of the cluster (tablet server or coordinator `id`) failed to start; `detail` says why.
 *
 * @since 0.1.0
 */
export class StartFailed extends Schema.TaggedError<StartFailed>()("StartFailed", {
  part: Schema.Literals(["server", "coordinator"]),
  id: Schema.Int,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `starting ${this.part} ${this.id}: ${this.detail}`
  }
}

/**
 * No coordinator led, however long the call waited for one.
 *
 * @since 0.1.0
 */
export class NoController extends Schema.TaggedError<NoController>()("NoController", {}) {
  /** @since 0.1.0 */
  override get message(): string {
    return "no controller (yet)"
  }
}

/**
 * The controller asked resigned (its coordinator lost the election) before it answered.
 *
 * @since 0.1.0
 */
export class ControllerResigned extends Schema.TaggedError<ControllerResigned>()("ControllerResigned", {
  coordinatorEpoch: Schema.Int
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `the controller of coordinator epoch ${this.coordinatorEpoch} resigned`
  }
}

/**
 * The controller holds no tablet `tablet`.
 *
 * @since 0.1.0
 */
export class TabletNotFound extends Schema.TaggedError<TabletNotFound>()("TabletNotFound", { tablet: Schema.String }) {
  /** @since 0.1.0 */
  override get message(): string {
    return `no tablet ${this.tablet}`
  }
}

/**
 * Tablet server `server` is not running (never started, or stopped).
 *
 * @since 0.1.0
 */
export class ServerNotRunning extends Schema.TaggedError<ServerNotRunning>()("ServerNotRunning", {
  server: Schema.Int
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `server ${this.server} is not running`
  }
}

/**
 * The controller's view of `tablet` did not come to satisfy an `awaitTablet` check in time.
 *
 * @since 0.1.0
 */
export class NotSettled extends Schema.TaggedError<NotSettled>()("NotSettled", { tablet: Schema.String }) {
  /** @since 0.1.0 */
  override get message(): string {
    return `${this.tablet}: not yet as awaited`
  }
}

/**
 * Why a cluster operation failed: the election could not be set up, no producer id, a part failed to start, no
 * controller (or it resigned), no such tablet, a server not running, a leader unreachable (over TCP, or a tablet
 * without one), a table's creation or a tablet's move refused (the controller's reason), or a tablet not settled as
 * awaited.
 *
 * @since 0.1.0
 */
export const LocalClusterErrorReason = Schema.Union([
  ElectionFailed,
  ProducerIdUnavailable,
  StartFailed,
  NoController,
  ControllerResigned,
  TabletNotFound,
  ServerNotRunning,
  PeerUnreachable,
  CreateTableRefused,
  ReassignRefused,
  NotSettled
])

/**
 * @since 0.1.0
 * @see LocalClusterErrorReason
 */
export type LocalClusterErrorReason = typeof LocalClusterErrorReason.Type

/**
 * An operation on the cluster failed; `reason` says why.
 *
 * @since 0.1.0
 */
export class LocalClusterError extends Schema.TaggedError<LocalClusterError>()("LocalClusterError", {
  reason: LocalClusterErrorReason
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return this.reason.message
  }
}

/** A cluster failure for `reason`. */
const fail = (reason: LocalClusterErrorReason) => new LocalClusterError({ reason })

/**
 * The cluster.
 *
 * @since 0.1.0
 */
export interface LocalCluster {
  /**
   * Creates `buckets` tablets of `table`, replicas spread round-robin over the servers (`rf` each), kept for
   * `retentionMs` or up to `retentionBytes` a replica when given (as `TabletClient.createTable`).
   */
  readonly createTable: (
    table: string,
    options: TabletClient.CreateTableOptions
  ) => Effect.Effect<ReadonlyArray<ControllerState.Tablet>, LocalClusterError>
  /**
   * Moves the tablet's replicas to `replicas` (see `Reassignment`), under `options.throttleBytesPerSec` when given:
   * the tablet as the move left it (its `reassignment` set while under way), or `ReassignRefused` naming why not.
   */
  readonly reassign: (
    tablet: Models.TabletId,
    replicas: ReadonlyArray<Models.ServerId>,
    options?: Controller.ReassignOptions
  ) => Effect.Effect<ControllerState.Tablet, LocalClusterError>
  /** Ends the tablet's move, back on its original replicas: the tablet as written, or `ReassignRefused`. */
  readonly cancelReassign: (tablet: Models.TabletId) => Effect.Effect<ControllerState.Tablet, LocalClusterError>
  /** Appends to the tablet's leader as an idempotent producer, retrying until acknowledged as `acks` asks. */
  readonly append: (
    tablet: Models.TabletId,
    records: ReadonlyArray<ReplicaManager.TabletRecord>,
    acks?: ReplicaManager.ReplicaAcks
  ) => Effect.Effect<
    { readonly baseOffset: number; readonly lastOffset: number },
    ReplicaManager.ReplicaError | LocalClusterError
  >
  /** Every committed record of the tablet (up to the leader's high watermark), from the leader. */
  readonly read: (
    tablet: Models.TabletId
  ) => Effect.Effect<ReadonlyArray<ReplicaManager.TabletBatch>, ReplicaManager.ReplicaError | LocalClusterError>
  /** The tablet as the controller holds it. */
  readonly tablet: (tablet: Models.TabletId) => Effect.Effect<ControllerState.Tablet, LocalClusterError>
  /** Stops tablet server `id` at once: its session ends, its replicas stop answering. */
  readonly stopServer: (id: Models.ServerId) => Effect.Effect<void>
  /** Starts tablet server `id` again on the store it had. */
  readonly startServer: (id: Models.ServerId) => Effect.Effect<void, LocalClusterError>
  /** A running tablet server. */
  readonly server: (id: Models.ServerId) => Effect.Effect<TabletServer.TabletServerShape, LocalClusterError>
  /** Waits until `check` holds for the controller's view of `tablet` (polling every 10 ms). */
  readonly awaitTablet: (
    tablet: Models.TabletId,
    check: (t: ControllerState.Tablet) => boolean
  ) => Effect.Effect<ControllerState.Tablet, LocalClusterError>
}

/**
 * The `LocalCluster` service key.
 *
 * @since 0.1.0
 */
export class LocalClusterService extends Context.Service<LocalClusterService, LocalCluster>()(
  "@strata/replica/LocalCluster"
) {}

/** What the cluster's producer and reader call on a leader. */
interface LeaderCalls {
  readonly append: (
    request: ReplicaManager.AppendRequest
  ) => Effect.Effect<ReplicaManager.AppendResult, ReplicaManager.ReplicaError | LocalClusterError>
  readonly read: (
    request: ReplicaManager.ReadRequest
  ) => Effect.Effect<ReplicaManager.ReadResult, ReplicaManager.ReplicaError | LocalClusterError>
}

interface Running {
  readonly server: TabletServer.TabletServerShape
  readonly scope: Scope.Closeable
}

const unreachable = (target: string) => Effect.fail(new PeerUnreachable({ target, detail: "not running" }))

/** A cluster in one process: what its functions share. */
interface Cluster {
  readonly options: LocalClusterOptions
  readonly config: ReplicationConfig.ReplicationConfig
  readonly namespace: string
  readonly paths: ClusterPaths.ClusterPaths
  readonly coordination: Coordination.Coordination["Service"]
  readonly scope: Scope.Scope
  readonly tcp: boolean
  /** The running servers, by id; each server's store outlives its stops. */
  readonly running: Map<Models.ServerId, Running>
  readonly stores: Map<Models.ServerId, Context.Context<Store.Store | ServerStorage.ServerStorage>>
  /** Each coordinator's controller while it leads. */
  readonly leading: Array<Effect.Effect<Controller.ControllerShape | undefined>>
  /** The controller now, for the servers' direct calls (in one process). */
  controller: Controller.ControllerShape | undefined
  /** The client's view of the cluster over TCP: calls go where the servers and the controller registered. */
  remote: RemotePeers.RemotePeers | undefined
}

/**
 * Starts the cluster on the `Coordination` in context; it stops with the scope.
 *
 * @since 0.1.0
 */
export const make = (
  options: LocalClusterOptions
): Effect.Effect<
  LocalCluster,
  ReplicationConfig.InvalidReplicaOptions | Coordination.CoordinationError | LocalClusterError,
  Coordination.Coordination | Scope.Scope
> =>
  Effect.gen(function* () {
    const namespace = options.namespace ?? "/strata"
    const k: Cluster = {
      options,
      config: yield* ReplicationConfig.decode(options.replication ?? {}),
      namespace,
      paths: ClusterPaths.make(namespace),
      coordination: yield* Coordination.Coordination,
      scope: yield* Effect.scope,
      tcp: options.transport === "tcp",
      running: new Map(),
      stores: new Map(),
      leading: [],
      controller: undefined,
      remote: undefined
    }
    // Coordinators: each runs the election, and the controller while it leads; over TCP each is a coordinator
    // process's parts.
    const election = yield* CoordinationElection.make({
      namespace: namespace.replace(/^\/+/, ""),
      sessionTimeout: k.config.sessionTimeout,
      replicaLagTimeMax: k.config.replicaLagTimeMax
    }).pipe(Effect.mapError((cause) => fail(new ElectionFailed({ cause }))))
    for (let i = 0; i < (options.coordinators ?? 1); i++) yield* startCoordinator(k, 101 + i, election)
    if (k.tcp) {
      const directory = yield* ClusterDirectory.make(k.paths, election, { retryBackoff: k.config.retryBackoff })
      k.remote = yield* RemotePeers.make({
        locate: directory.locate,
        locateData: directory.locateData,
        controller: directory.controller,
        requestTimeout: TabletServerNode.requestTimeoutOf(k.config)
      })
    }
    for (let id = 1; id <= options.servers; id++) yield* startServer(k, id)
    const producer = yield* LocalProducer.make(
      Effect.flatMap(current(k), (c) =>
        c.initProducerId.pipe(Effect.mapError((e) => fail(new ProducerIdUnavailable({ detail: e.message }))))
      ).pipe(Retry.retry({ schedule: Schedule.spaced(k.config.retryBackoff), times: 600 }))
    )
    return shapeOf(k, producer)
  })

/** A coordinator: over TCP a coordinator process's parts, else the election with the controller as its service. */
const startCoordinator = (k: Cluster, id: number, election: Election.Election["Service"]) =>
  Effect.gen(function* () {
    if (k.tcp) {
      const node = yield* CoordinatorNode.make({
        serverId: id,
        namespace: k.namespace,
        replication: k.options.replication ?? {}
      }).pipe(Effect.mapError((e) => fail(new StartFailed({ part: "coordinator", id, detail: e.message }))))
      k.leading.push(node.controller)
      return
    }
    const resign: { run: Effect.Effect<void> } = { run: Effect.void }
    let mine: Controller.ControllerShape | undefined
    const view = yield* ControllerView.make({
      namespace: k.namespace,
      keepWarm: { retryBackoff: k.config.retryBackoff }
    })
    const coordinator = yield* Coordinator.make({
      serverId: id,
      address: `local:${id}`,
      services: [
        CoordinatorNode.controllerService({
          namespace: k.namespace,
          config: k.config,
          servers: directServers(k),
          resign: Effect.suspend(() => resign.run),
          track: (c) =>
            Effect.sync(() => {
              if (c !== undefined) k.controller = c
              else if (k.controller === mine) k.controller = undefined
              mine = c
            }),
          view
        })
      ]
    }).pipe(
      Effect.provideService(Election.Election, election),
      Effect.mapError((e) => fail(new StartFailed({ part: "coordinator", id, detail: e.message })))
    )
    resign.run = coordinator.resign
    k.leading.push(Effect.sync(() => mine))
  })

/** The controller as the servers reach it in one process (unreachable while there is none). */
const onController = <A, E extends { readonly message: string }>(
  k: Cluster,
  f: (controller: Controller.ControllerShape) => Effect.Effect<A, E>
) =>
  Effect.suspend(() =>
    k.controller === undefined
      ? unreachable("the controller")
      : f(k.controller).pipe(
          Effect.mapError((e) => new PeerUnreachable({ target: "the controller", detail: e.message }))
        )
  )

/** A call to running server `id` (unreachable when it is not running). */
const onRunning = <A>(
  k: Cluster,
  id: Models.ServerId,
  f: (server: TabletServer.TabletServerShape) => Effect.Effect<A, ReplicaManager.ReplicaError>
): Effect.Effect<A, ReplicaManager.ReplicaError | PeerUnreachable> =>
  Effect.suspend((): Effect.Effect<A, ReplicaManager.ReplicaError | PeerUnreachable> => {
    const r = k.running.get(id)
    return r === undefined ? unreachable(`server ${id}`) : f(r.server)
  })

/** The servers' calls to one another and to the controller, in one process. */
const directPeers = (k: Cluster): PeersShape => ({
  leader: (id) => ({
    fetch: (request) => onRunning(k, id, (server) => server.fetch(request)),
    endOffsetForEpoch: (request) => onRunning(k, id, (server) => server.endOffsetForEpoch(request))
  }),
  controller: {
    adjustIsr: (request) => onController(k, (c) => c.adjustIsr(request)),
    controlledShutdown: (server) => onController(k, (c) => c.controlledShutdown(server)),
    replicaStorage: (report) => onController(k, (c) => c.replicaStorage(report))
  }
})

/** The controller's calls to the servers, in one process. */
const directServers = (k: Cluster): Controller.TabletServersShape => ({
  leaderAndIsr: (id, request) => onRunning(k, id, (server) => server.leaderAndIsr(request)),
  logEnd: (id, request) => onRunning(k, id, (server) => server.logEnd(request)),
  holdings: (id, request) => onRunning(k, id, (server) => server.holdings(request)),
  stopReplica: (id, request) => onRunning(k, id, (server) => server.stopReplica(request))
})

/** Starts server `id` on its store (made on its first start): over TCP as a process runs it, else in process. */
const startServer = (k: Cluster, id: Models.ServerId) =>
  Effect.gen(function* () {
    if (k.running.has(id)) return
    let store = k.stores.get(id)
    if (store === undefined) {
      store = yield* Layer.buildWithScope(Layer.provideMerge(ServerStorage.layerStore, MemoryStore.layer()), k.scope)
      k.stores.set(id, store)
    }
    const serverScope = yield* Scope.fork(k.scope, "sequential")
    if (k.tcp) {
      // As a process runs it: listening on loopback, registered, finding the others through coordination.
      const node = yield* TabletServerNode.make({
        serverId: id,
        namespace: k.namespace,
        replication: k.options.replication ?? {},
        controlledShutdown: false
      }).pipe(Effect.provide(Context.add(store, Coordination.Coordination, k.coordination)), Scope.provide(serverScope))
      k.running.set(id, { server: node.server, scope: serverScope })
      return
    }
    const server = yield* TabletServer.make({ serverId: id, replication: k.options.replication ?? {} }).pipe(
      Effect.provide(Context.add(store, Peers, directPeers(k))),
      Scope.provide(serverScope)
    )
    k.running.set(id, { server, scope: serverScope })
    const session = yield* Scope.provide(k.coordination.session(), serverScope)
    const registration = yield* ClusterPaths.register(session, k.paths, id, {
      address: `local:${id}`,
      registrationEpoch: 0
    })
    yield* server.registered(registration)
  }).pipe(Effect.mapError((e) => fail(new StartFailed({ part: "server", id, detail: e.message }))))

const stopServer = (k: Cluster, id: Models.ServerId) =>
  Effect.suspend(() => {
    const r = k.running.get(id)
    k.running.delete(id)
    return r === undefined ? Effect.void : Scope.close(r.scope, Exit.void)
  })

/** The controller now (waited for while there is none). */
const current = (k: Cluster) =>
  Effect.flatMap(Effect.all(k.leading), (found) => {
    const c = found.find((c) => c !== undefined)
    return c === undefined ? Effect.fail(fail(new NoController())) : Effect.succeed(c)
  }).pipe(Retry.retry({ schedule: Schedule.spaced(10), times: 1000 }))

const tabletOf = (k: Cluster, t: Models.TabletId) =>
  Effect.flatMap(current(k), (c) =>
    Effect.flatMap(c.state, (s) => {
      const found = s.tablets.get(Models.tabletKey(t))
      return found === undefined
        ? Effect.fail(fail(new TabletNotFound({ tablet: Models.tabletKey(t) })))
        : Effect.succeed(found)
    })
  )

const serverOf = (k: Cluster, id: Models.ServerId) =>
  Effect.suspend(() => {
    const r = k.running.get(id)
    return r === undefined ? Effect.fail(fail(new ServerNotRunning({ server: id }))) : Effect.succeed(r.server)
  })

/** The leader's calls, made directly or over TCP (where an unreachable leader is retried as a stale one is). */
const leaderOf = (k: Cluster, t: Models.TabletId) =>
  Effect.flatMap(tabletOf(k, t), (found): Effect.Effect<LeaderCalls, LocalClusterError> => {
    const id = found.leaderAndIsr.leader
    if (id === null) {
      const target = `the leader of ${Models.tabletKey(t)}`
      return Effect.fail(fail(new PeerUnreachable({ target, detail: "the tablet has no leader" })))
    }
    if (k.remote === undefined) return serverOf(k, id)
    const calls = k.remote.server(id)
    const reached = <A, E>(call: Effect.Effect<A, E | PeerUnreachable>) =>
      Effect.mapError(call, (e) => (e instanceof PeerUnreachable ? fail(e) : e)) as Effect.Effect<
        A,
        Exclude<E, PeerUnreachable> | LocalClusterError
      >
    return Effect.succeed({
      append: (request) => reached(calls.append(request)),
      read: (request) => reached(calls.read(request))
    })
  })

const retryable = (e: ReplicaManager.ReplicaError | LocalClusterError) => e._tag === "LocalClusterError" || e.retryable

/** Asks the controller now for a move or its cancel: the tablet as the reply has it, or the refusal. */
const moveWith = (
  k: Cluster,
  ask: (c: Controller.ControllerShape) => Effect.Effect<Controller.ReassignReply, Controller.ControllerResigned>
) =>
  Effect.flatMap(current(k), (c) =>
    ask(c).pipe(
      Effect.mapError((e) => fail(new ControllerResigned({ coordinatorEpoch: e.coordinatorEpoch }))),
      Effect.flatMap((reply) =>
        reply._tag === "ReassignRefused"
          ? Effect.fail(fail(new ReassignRefused({ reason: reply.refusal, detail: reply.detail })))
          : Effect.succeed(reply.tablet)
      )
    )
  )

/** The cluster as its users see it. */
const shapeOf = (k: Cluster, producer: LocalProducer.LocalProducer<LocalClusterError>): LocalCluster => {
  const retrying = Schedule.spaced(k.config.retryBackoff)
  return {
    createTable: (table, o) =>
      Effect.gen(function* () {
        const rf = o.replicationFactor ?? k.config.replicationFactor
        const retention = retentionOf(o)
        const specs = Array.from({ length: o.buckets }, (_, bucket) => ({
          tablet: { table, bucket },
          replicas: Array.from({ length: rf }, (_, r) => ((bucket + r) % k.options.servers) + 1),
          ...(retention === undefined ? {} : { retention })
        }))
        const reply = yield* Effect.flatMap(current(k), (c) =>
          c
            .createTablets(specs)
            .pipe(Effect.mapError((e) => fail(new ControllerResigned({ coordinatorEpoch: e.coordinatorEpoch }))))
        )
        if (reply._tag !== "Created") {
          const detail = reply._tag === "CreateRefused" ? reply.detail : `unexpected answer ${reply._tag}`
          return yield* fail(new CreateTableRefused({ detail }))
        }
        return reply.tablets
      }),
    reassign: (t, replicas, options) => moveWith(k, (c) => c.reassign(t, replicas, options)),
    cancelReassign: (t) => moveWith(k, (c) => c.cancelReassign(t)),
    append: (t, records, acks = "all") =>
      producer.append(
        Models.tabletKey(t),
        (stamp) =>
          Effect.flatMap(leaderOf(k, t), (server) => server.append({ tablet: t, records, acks, producer: stamp })).pipe(
            Retry.retry({ schedule: retrying, times: 600, while: retryable }),
            Effect.map((result) => ({ baseOffset: result.baseOffset, lastOffset: result.lastOffset }))
          ),
        records.length
      ),
    read: (t) =>
      Effect.gen(function* () {
        const out: Array<ReplicaManager.TabletBatch> = []
        let offset = 0
        while (true) {
          const page = yield* Effect.flatMap(leaderOf(k, t), (server) =>
            server.read({ tablet: t, offset, maxBytes: 1_048_576 })
          ).pipe(Retry.retry({ schedule: retrying, times: 600, while: retryable }))
          if (page.batches.length === 0) return out
          out.push(...page.batches)
          const last = page.batches.at(-1)!
          offset = last.baseOffset + last.records.length
        }
      }),
    tablet: (t) => tabletOf(k, t),
    stopServer: (id) => stopServer(k, id),
    startServer: (id) => startServer(k, id),
    server: (id) => serverOf(k, id),
    awaitTablet: (t, check) =>
      Effect.flatMap(tabletOf(k, t), (found) =>
        check(found) ? Effect.succeed(found) : Effect.fail(fail(new NotSettled({ tablet: Models.tabletKey(t) })))
      ).pipe(Retry.retry({ schedule: Schedule.spaced(10), times: 3000 }))
  }
}

/**
 * The cluster as a layer on the `Coordination` in context.
 *
 * @since 0.1.0
 */
export const layer = (
  options: LocalClusterOptions
): Layer.Layer<
  LocalClusterService,
  ReplicationConfig.InvalidReplicaOptions | Coordination.CoordinationError | LocalClusterError,
  Coordination.Coordination
> => Layer.effect(LocalClusterService, make(options))
