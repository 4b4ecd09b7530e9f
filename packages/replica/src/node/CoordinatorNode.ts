/**
 * A coordinator as a process runs it: the election and coordinator lifecycle (`@strata/election`) on the
 * `Coordination` in context, with the `Controller` as its leader-only service (starting from the coordinator's warm
 * `ControllerView`), and `ReplicaRpc`'s controller
 * endpoint on a TCP address (the address the election's leader node announces). A standby answers `NotController`;
 * tablet servers and clients find the leader through the election.
 *
 * @since 0.1.0
 */
import { type Coordination, Election, OptionSchemas } from "@strata/core"
import { Coordinator } from "@strata/election"
import { RebalanceConfig, RebalanceService } from "@strata/rebalance"
import { type Duration, Effect, Option, Schema, type Scope } from "effect"
import * as ClusterDirectory from "../client/ClusterDirectory.js"
import * as ClusterPaths from "../wire/ClusterPaths.js"
import * as Controller from "../server/Controller.js"
import * as ControllerMetrics from "../server/ControllerMetrics.js"
import * as ControllerView from "../server/ControllerView.js"
import * as RemotePeers from "../client/RemotePeers.js"
import * as ReplicaRpc from "../wire/ReplicaRpc.js"
import * as ReplicationConfig from "../wire/ReplicationConfig.js"
import { listenAddress, NodeFields, nodeTls, requestTimeoutOf } from "./TabletServerNode.js"
import * as ControllerRpc from "../server/ControllerRpc.js"
import * as RebalanceControl from "../server/RebalanceControl.js"

/**
 * A coordinator process's options. A duration takes any `Duration.Input` (`"1 second"`, or a number of
 * milliseconds).
 *
 * @since 0.1.0
 */
export const CoordinatorNodeOptions = Schema.Struct({
  ...NodeFields,
  /** The pause before campaigning again after a leadership ended (1 second). */
  rejoinBackoff: OptionSchemas.DurationOption("positive").pipe(
    Schema.withDecodingDefaultKey(Effect.succeed<Duration.Input>("1 second"))
  ),
  /** The rebalance settings (`@strata/rebalance`'s `RebalanceConfig`; every key at its default when left out). */
  rebalance: RebalanceConfig.RebalanceConfig.pipe(
    Schema.withDecodingDefaultKey(Effect.succeed<RebalanceConfig.RebalanceConfigInput>({}))
  ),
  /** How often a rebalance under way observes the cluster (1 second). */
  rebalanceObserveInterval: OptionSchemas.DurationOption("positive").pipe(
    Schema.withDecodingDefaultKey(Effect.succeed<Duration.Input>("1 second"))
  )
})

/**
 * The options' input.
 *
 * @since 0.1.0
 */
export type CoordinatorNodeOptions = typeof CoordinatorNodeOptions.Encoded

/**
 * A running coordinator process.
 *
 * @since 0.1.0
 */
export interface CoordinatorNode {
  readonly coordinator: Coordinator.CoordinatorShape
  /** The address its controller endpoint listens on (`host:port`). */
  readonly address: string
  /** Its controller while it leads. */
  readonly controller: Effect.Effect<Controller.ControllerShape | undefined>
  /** Its rebalance service while it leads (started after the controller). */
  readonly rebalance: Effect.Effect<RebalanceService.RebalanceServiceShape | undefined>
  readonly directory: ClusterDirectory.ClusterDirectory
  /** Its warm view of the tablets. */
  readonly view: ControllerView.ControllerView
  /** Sets its controller gauges (`ControllerMetrics`) from its controller's state now, or a standby's. */
  readonly refreshMetrics: Effect.Effect<void>
}

/**
 * The `Controller` as a coordinator's leader service: started under each leadership with the cluster's settings,
 * reaching the servers through `servers`, and told to `track` as it starts (`undefined` as it stops).
 *
 * @since 0.1.0
 */
export const controllerService = (options: {
  readonly namespace: string
  readonly config: ReplicationConfig.ReplicationConfig
  readonly servers: Controller.TabletServersShape
  /** Gives up the coordinator's leadership. */
  readonly resign: Effect.Effect<void>
  readonly track: (controller: Controller.ControllerShape | undefined) => Effect.Effect<void>
  /** The coordinator's warm view of the tablets, which each of its controllers starts from. */
  readonly view?: ControllerView.ControllerView
  /** The coordinator's controller metrics. */
  readonly metrics?: ControllerMetrics.ControllerMetrics
}) =>
  Coordinator.service("controller", (leadership) =>
    Effect.acquireRelease(
      Controller.make(leadership, {
        namespace: options.namespace,
        uncleanLeaderElection: options.config.uncleanLeaderElection,
        leaderElection: options.config.leaderElection,
        minInsyncReplicas: options.config.minInsyncReplicas,
        leaderImbalanceCheckInterval: options.config.leaderImbalanceCheckInterval,
        leaderImbalancePercent: options.config.leaderImbalancePercent,
        retryBackoff: options.config.retryBackoff,
        resign: options.resign,
        ...(options.view === undefined ? {} : { view: options.view }),
        ...(options.metrics === undefined ? {} : { metrics: options.metrics })
      }).pipe(
        Effect.provideService(Controller.TabletServers, options.servers),
        Effect.tap((c) => options.track(c))
      ),
      () => options.track(undefined)
    )
  )

/**
 * The `RebalanceService` as a coordinator's leader service, after the controller (`controller` is the one the
 * controller service started under the same leadership): its trigger checks also when the live servers change.
 *
 * @since 0.1.0
 */
export const rebalanceService = (options: {
  readonly namespace: string
  readonly config: RebalanceConfig.RebalanceConfig
  readonly observeInterval: Duration.Input
  readonly controller: Effect.Effect<Controller.ControllerShape | undefined>
  readonly endpoint: ControllerRpc.ControllerEndpoint
  readonly track: (service: RebalanceService.RebalanceServiceShape | undefined) => Effect.Effect<void>
}) =>
  Coordinator.service("rebalance", (leadership) =>
    Effect.acquireRelease(
      Effect.gen(function* () {
        const controller = yield* options.controller
        if (controller === undefined) return yield* Effect.die("the rebalance service starts after the controller")
        const service = yield* RebalanceService.make(leadership, {
          control: RebalanceControl.make(controller, options.endpoint),
          root: ClusterPaths.make(options.namespace).rebalance,
          config: options.config,
          observeInterval: options.observeInterval,
          checks: RebalanceControl.serverChanges(controller)
        })
        yield* options.track(service)
        return service
      }),
      () => options.track(undefined)
    )
  )

/**
 * Starts a coordinator process on the `Coordination` in context; it stops (resigning if it leads) with the scope.
 *
 * @since 0.1.0
 */
export const make = (
  options: CoordinatorNodeOptions
): Effect.Effect<
  CoordinatorNode,
  | ReplicationConfig.InvalidReplicaOptions
  | Coordination.CoordinationError
  | Election.ElectionError
  | ReplicaRpc.ListenFailed
  | Coordinator.InvalidCoordinatorOptions,
  Coordination.Coordination | Scope.Scope
> =>
  Effect.gen(function* () {
    const o = yield* OptionSchemas.decodeOptions(CoordinatorNodeOptions, { exact: true })(options).pipe(
      Effect.mapError(ReplicationConfig.invalidOptions)
    )
    const config = o.replication
    const tls = yield* nodeTls(o.tls)
    const election = yield* ClusterPaths.electionOf(o.namespace, config)
    const directory = yield* ClusterDirectory.make(ClusterPaths.make(o.namespace), election, {
      retryBackoff: config.retryBackoff
    })
    const remote = yield* RemotePeers.make({
      locate: directory.locate,
      locateData: directory.locateData,
      controller: directory.controller,
      requestTimeout: requestTimeoutOf(config)
    }).pipe(Effect.provideService(RemotePeers.Transport, tls.transport))
    let mine: Controller.ControllerShape | undefined
    const current = Effect.sync(() => mine)
    let rebalancing: RebalanceService.RebalanceServiceShape | undefined
    const endpoint: ControllerRpc.ControllerEndpoint = {
      current,
      rebalance: Effect.sync(() => rebalancing),
      servers: directory.servers,
      replicationFactor: config.replicationFactor,
      tabletServers: remote.servers,
      leader: Effect.map(Effect.option(directory.controller), Option.getOrUndefined)
    }
    const bound = yield* ControllerRpc.serveController(listenAddress(o.listen), endpoint, tls.serve)
    const address = o.advertise ?? ReplicaRpc.formatAddress(bound)
    yield* Effect.logInfo(`coordinator ${o.serverId} listening on ${address}`)
    // Kept warm while this coordinator stands by: taking over reads only the tablets written since.
    const view = yield* ControllerView.make({
      namespace: o.namespace,
      keepWarm: { retryBackoff: config.retryBackoff }
    })
    const metrics = ControllerMetrics.make(o.serverId)
    const resign: { run: Effect.Effect<void> } = { run: Effect.void }
    const coordinator = yield* Coordinator.make({
      serverId: o.serverId,
      address,
      rejoinBackoff: o.rejoinBackoff,
      services: [
        controllerService({
          namespace: o.namespace,
          config,
          servers: remote.servers,
          resign: Effect.suspend(() => resign.run),
          track: (c) =>
            Effect.sync(() => {
              mine = c
            }),
          view,
          metrics
        }),
        rebalanceService({
          namespace: o.namespace,
          config: o.rebalance,
          observeInterval: o.rebalanceObserveInterval,
          controller: current,
          endpoint,
          track: (service) =>
            Effect.sync(() => {
              rebalancing = service
            })
        })
      ]
    }).pipe(Effect.provideService(Election.Election, election))
    resign.run = coordinator.resign
    const refreshMetrics = Effect.flatMap(current, (c) =>
      c === undefined ? metrics.refresh(undefined) : Effect.flatMap(c.state, metrics.refresh)
    )
    const rebalance = Effect.sync(() => rebalancing)
    return { coordinator, address, controller: current, rebalance, directory, view, refreshMetrics }
  })
