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
import { CoordinationElection, Coordinator } from "@strata/election"
import {
  type AppendRequest,
  type AppendResult,
  Coordination,
  type CoordinationError,
  type ReadRequest,
  type ReadResult,
  type ReplicaAcks,
  Election,
  type ReplicaError,
  type ServerId,
  Store,
  type TabletBatch,
  type TabletId,
  type TabletRecord,
  tabletKey
} from "@strata/core"
import { Context, Data, Effect, Exit, Layer, Schedule, Scope } from "effect"
import * as ClusterDirectory from "../client/ClusterDirectory.js"
import * as ClusterPaths from "../wire/ClusterPaths.js"
import type * as Controller from "../server/Controller.js"
import type * as ControllerState from "../machines/ControllerState.js"
import * as ControllerView from "../server/ControllerView.js"
import * as CoordinatorNode from "./CoordinatorNode.js"
import * as LocalProducer from "./internal/localProducer.js"
import { Peers, PeerUnreachable, type PeersShape } from "../wire/Peers.js"
import * as RemotePeers from "../client/RemotePeers.js"
import * as ReplicationConfig from "../wire/ReplicationConfig.js"
import * as TabletServer from "../server/TabletServer.js"
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
 * An operation on the cluster failed.
 *
 * @since 0.1.0
 */
export class LocalClusterError extends Data.TaggedError("LocalClusterError")<{ readonly detail: string }> {
  /** @since 0.1.0 */
  override get message(): string {
    return this.detail
  }
}

/**
 * The cluster.
 *
 * @since 0.1.0
 */
export interface LocalCluster {
  /** Creates `buckets` tablets of `table`, replicas spread round-robin over the servers (`rf` each). */
  readonly createTable: (
    table: string,
    options: { readonly buckets: number; readonly replicationFactor?: number }
  ) => Effect.Effect<ReadonlyArray<ControllerState.Tablet>, LocalClusterError>
  /** Appends to the tablet's leader as an idempotent producer, retrying until acknowledged as `acks` asks. */
  readonly append: (
    tablet: TabletId,
    records: ReadonlyArray<TabletRecord>,
    acks?: ReplicaAcks
  ) => Effect.Effect<{ readonly baseOffset: number; readonly lastOffset: number }, ReplicaError | LocalClusterError>
  /** Every committed record of the tablet (up to the leader's high watermark), from the leader. */
  readonly read: (tablet: TabletId) => Effect.Effect<ReadonlyArray<TabletBatch>, ReplicaError | LocalClusterError>
  /** The tablet as the controller holds it. */
  readonly tablet: (tablet: TabletId) => Effect.Effect<ControllerState.Tablet, LocalClusterError>
  /** Stops tablet server `id` at once: its session ends, its replicas stop answering. */
  readonly stopServer: (id: ServerId) => Effect.Effect<void>
  /** Starts tablet server `id` again on the store it had. */
  readonly startServer: (id: ServerId) => Effect.Effect<void, LocalClusterError>
  /** A running tablet server. */
  readonly server: (id: ServerId) => Effect.Effect<TabletServer.TabletServerShape, LocalClusterError>
  /** Waits until `check` holds for the controller's view of `tablet` (polling every 10 ms). */
  readonly awaitTablet: (
    tablet: TabletId,
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
  readonly append: (request: AppendRequest) => Effect.Effect<AppendResult, ReplicaError | LocalClusterError>
  readonly read: (request: ReadRequest) => Effect.Effect<ReadResult, ReplicaError | LocalClusterError>
}

interface Running {
  readonly server: TabletServer.TabletServerShape
  readonly scope: Scope.Closeable
}

const unreachable = (target: string) => Effect.fail(new PeerUnreachable({ target, detail: "not running" }))

/**
 * Starts the cluster on the `Coordination` in context; it stops with the scope.
 *
 * @since 0.1.0
 */
export const make = (
  options: LocalClusterOptions
): Effect.Effect<
  LocalCluster,
  ReplicationConfig.InvalidReplicaOptions | CoordinationError | LocalClusterError,
  Coordination | Scope.Scope
> =>
  Effect.gen(function* () {
    const config = yield* ReplicationConfig.decode(options.replication ?? {})
    const namespace = options.namespace ?? "/strata"
    const paths = ClusterPaths.make(namespace)
    const coordination = yield* Coordination
    const scope = yield* Effect.scope
    const running = new Map<ServerId, Running>()
    const stores = new Map<ServerId, Context.Context<Store>>()
    let controller: Controller.ControllerShape | undefined

    const directPeers: PeersShape = {
      leader: (id) => ({
        fetch: (request) => {
          const r = running.get(id)
          return r === undefined ? unreachable(`server ${id}`) : r.server.fetch(request)
        },
        endOffsetForEpoch: (request) => {
          const r = running.get(id)
          return r === undefined ? unreachable(`server ${id}`) : r.server.endOffsetForEpoch(request)
        }
      }),
      controller: {
        adjustIsr: (request) =>
          controller === undefined
            ? unreachable("the controller")
            : controller
                .adjustIsr(request)
                .pipe(Effect.mapError((e) => new PeerUnreachable({ target: "the controller", detail: e.message }))),
        controlledShutdown: (server) =>
          controller === undefined
            ? unreachable("the controller")
            : controller
                .controlledShutdown(server)
                .pipe(Effect.mapError((e) => new PeerUnreachable({ target: "the controller", detail: e.message }))),
        replicaStorage: (report) =>
          controller === undefined
            ? unreachable("the controller")
            : controller
                .replicaStorage(report)
                .pipe(Effect.mapError((e) => new PeerUnreachable({ target: "the controller", detail: e.message })))
      }
    }
    const tcp = options.transport === "tcp"
    /** A call to running server `id` (unreachable when it is not running). */
    const onRunning = <A>(
      id: ServerId,
      f: (server: TabletServer.TabletServerShape) => Effect.Effect<A, ReplicaError>
    ) => {
      const r = running.get(id)
      return r === undefined ? unreachable(`server ${id}`) : f(r.server)
    }
    const direct: Controller.TabletServersShape = {
      leaderAndIsr: (id, request) => onRunning(id, (server) => server.leaderAndIsr(request)),
      logEnd: (id, request) => onRunning(id, (server) => server.logEnd(request)),
      holdings: (id, request) => onRunning(id, (server) => server.holdings(request)),
      stopReplica: (id, request) => onRunning(id, (server) => server.stopReplica(request))
    }

    const startServer = (id: ServerId) =>
      Effect.gen(function* () {
        if (running.has(id)) return
        let store = stores.get(id)
        if (store === undefined) {
          store = yield* Layer.buildWithScope(Store.layerMemory(), scope)
          stores.set(id, store)
        }
        const serverScope = yield* Scope.fork(scope, "sequential")
        if (tcp) {
          // As a process runs it: listening on loopback, registered, finding the others through coordination.
          const node = yield* TabletServerNode.make({
            serverId: id,
            namespace,
            replication: options.replication ?? {},
            controlledShutdown: false
          }).pipe(Effect.provide(Context.add(store, Coordination, coordination)), Scope.provide(serverScope))
          running.set(id, { server: node.server, scope: serverScope })
          return
        }
        const server = yield* TabletServer.make({ serverId: id, replication: options.replication ?? {} }).pipe(
          Effect.provide(Context.add(store, Peers, directPeers)),
          Scope.provide(serverScope)
        )
        running.set(id, { server, scope: serverScope })
        const session = yield* Scope.provide(coordination.session(), serverScope)
        const registration = yield* ClusterPaths.register(session, paths, id, {
          address: `local:${id}`,
          registrationEpoch: 0
        })
        yield* server.registered(registration)
      }).pipe(Effect.mapError((e) => new LocalClusterError({ detail: `starting server ${id}: ${e.message}` })))

    const stopServer = (id: ServerId) =>
      Effect.suspend(() => {
        const r = running.get(id)
        running.delete(id)
        return r === undefined ? Effect.void : Scope.close(r.scope, Exit.void)
      })

    // Coordinators: each runs the election, and the controller while it leads; over TCP each is a coordinator
    // process's parts.
    const leading: Array<Effect.Effect<Controller.ControllerShape | undefined>> = []
    const election = yield* CoordinationElection.make({
      namespace: namespace.replace(/^\/+/, ""),
      sessionTimeout: config.sessionTimeoutMs,
      replicaLagTimeMax: config.replicaLagTimeMaxMs
    }).pipe(Effect.mapError((e) => new LocalClusterError({ detail: `the election: ${e.message}` })))
    for (let i = 0; i < (options.coordinators ?? 1); i++) {
      const id = 101 + i
      if (tcp) {
        const node = yield* CoordinatorNode.make({
          serverId: id,
          namespace,
          replication: options.replication ?? {}
        }).pipe(Effect.mapError((e) => new LocalClusterError({ detail: `starting coordinator ${id}: ${e.message}` })))
        leading.push(node.controller)
        continue
      }
      const resign: { run: Effect.Effect<void> } = { run: Effect.void }
      let mine: Controller.ControllerShape | undefined
      const view = yield* ControllerView.make({ namespace, keepWarm: { retryBackoffMs: config.retryBackoffMs } })
      const coordinator = yield* Coordinator.make({
        serverId: id,
        address: `local:${id}`,
        services: [
          CoordinatorNode.controllerService({
            namespace,
            config,
            servers: direct,
            resign: Effect.suspend(() => resign.run),
            track: (c) =>
              Effect.sync(() => {
                if (c !== undefined) controller = c
                else if (controller === mine) controller = undefined
                mine = c
              }),
            view
          })
        ]
      }).pipe(
        Effect.provideService(Election, election),
        Effect.mapError((e) => new LocalClusterError({ detail: e.message }))
      )
      resign.run = coordinator.resign
      leading.push(Effect.sync(() => mine))
    }
    // The client's view of the cluster over TCP: calls go to the servers and the controller where they registered.
    let remote: RemotePeers.RemotePeers | undefined
    if (tcp) {
      const directory = yield* ClusterDirectory.make(paths, election, { retryBackoffMs: config.retryBackoffMs })
      remote = yield* RemotePeers.make({
        locate: directory.locate,
        locateData: directory.locateData,
        controller: directory.controller,
        requestTimeoutMs: TabletServerNode.requestTimeoutOf(config)
      })
    }
    for (let id = 1; id <= options.servers; id++) yield* startServer(id)

    const current = Effect.flatMap(Effect.all(leading), (found) => {
      const c = found.find((c) => c !== undefined)
      return c === undefined ? Effect.fail(new LocalClusterError({ detail: "no controller (yet)" })) : Effect.succeed(c)
    }).pipe(Effect.retry({ schedule: Schedule.spaced(10), times: 1000 }))

    const tablet = (t: TabletId) =>
      Effect.flatMap(current, (c) =>
        Effect.flatMap(c.state, (s) => {
          const found = s.tablets.get(tabletKey(t))
          return found === undefined
            ? Effect.fail(new LocalClusterError({ detail: `no tablet ${tabletKey(t)}` }))
            : Effect.succeed(found)
        })
      )

    const serverOf = (id: ServerId | null) =>
      Effect.suspend(() => {
        const r = id === null ? undefined : running.get(id)
        return r === undefined
          ? Effect.fail(new LocalClusterError({ detail: `server ${id} is not running` }))
          : Effect.succeed(r.server)
      })

    /** The leader's calls, made directly or over TCP (where an unreachable leader is retried as a stale one is). */
    const leaderOf = (t: TabletId) =>
      Effect.flatMap(tablet(t), (found): Effect.Effect<LeaderCalls, LocalClusterError> => {
        const id = found.leaderAndIsr.leader
        if (remote === undefined || id === null) return serverOf(id)
        const calls = remote.server(id)
        const reached = <A, E>(call: Effect.Effect<A, E | PeerUnreachable>) =>
          Effect.mapError(call, (e) =>
            e instanceof PeerUnreachable ? new LocalClusterError({ detail: e.message }) : e
          ) as Effect.Effect<A, Exclude<E, PeerUnreachable> | LocalClusterError>
        return Effect.succeed({
          append: (request) => reached(calls.append(request)),
          read: (request) => reached(calls.read(request))
        })
      })

    const retrying = Schedule.spaced(config.retryBackoffMs)
    const retryable = (e: ReplicaError | LocalClusterError) => e._tag === "LocalClusterError" || e.retryable
    const producer = yield* LocalProducer.make(
      Effect.flatMap(current, (c) =>
        c.initProducerId.pipe(Effect.mapError((e) => new LocalClusterError({ detail: `no producer id: ${e.message}` })))
      ).pipe(Effect.retry({ schedule: retrying, times: 600 }))
    )

    return {
      createTable: (table, o) =>
        Effect.gen(function* () {
          const rf = o.replicationFactor ?? config.replicationFactor
          const specs = Array.from({ length: o.buckets }, (_, bucket) => ({
            tablet: { table, bucket },
            replicas: Array.from({ length: rf }, (_, r) => ((bucket + r) % options.servers) + 1)
          }))
          const reply = yield* Effect.flatMap(current, (c) => c.createTablets(specs)).pipe(
            Effect.mapError((e) => new LocalClusterError({ detail: e.message }))
          )
          if (reply._tag !== "Created") return yield* new LocalClusterError({ detail: JSON.stringify(reply) })
          return reply.tablets
        }),
      append: (t, records, acks = "all") =>
        producer.append(
          tabletKey(t),
          (stamp) =>
            Effect.flatMap(leaderOf(t), (server) => server.append({ tablet: t, records, acks, producer: stamp })).pipe(
              Effect.retry({ schedule: retrying, times: 600, while: retryable }),
              Effect.map((result) => ({ baseOffset: result.baseOffset, lastOffset: result.lastOffset }))
            ),
          records.length
        ),
      read: (t) =>
        Effect.gen(function* () {
          const out: Array<TabletBatch> = []
          let offset = 0
          while (true) {
            const page = yield* Effect.flatMap(leaderOf(t), (server) =>
              server.read({ tablet: t, offset, maxBytes: 1_048_576 })
            ).pipe(Effect.retry({ schedule: retrying, times: 600, while: retryable }))
            if (page.batches.length === 0) return out
            out.push(...page.batches)
            const last = page.batches.at(-1)!
            offset = last.baseOffset + last.records.length
          }
        }),
      tablet,
      stopServer,
      startServer,
      server: (id) => serverOf(id),
      awaitTablet: (t, check) =>
        Effect.flatMap(tablet(t), (found) =>
          check(found) ? Effect.succeed(found) : Effect.fail(new LocalClusterError({ detail: "not yet" }))
        ).pipe(Effect.retry({ schedule: Schedule.spaced(10), times: 3000 }))
    }
  })

/**
 * The cluster as a layer on the `Coordination` in context.
 *
 * @since 0.1.0
 */
export const layer = (
  options: LocalClusterOptions
): Layer.Layer<
  LocalClusterService,
  ReplicationConfig.InvalidReplicaOptions | CoordinationError | LocalClusterError,
  Coordination
> => Layer.effect(LocalClusterService, make(options))
