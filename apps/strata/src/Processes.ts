/**
 * The cluster's processes, composed from `@strata/replica`'s layers over the coordination backend and store that
 * the configuration names (`ServerConfig`):
 *
 * - `tabletServer`: a `TabletServerNode` on a data directory (segment files, or a LevelDB or RocksDB store), until interrupted (SIGINT or
 *   SIGTERM: a controlled shutdown first), or until its id turns out to be another running server's
 *   (`DuplicateServerId`: it never acted for that id);
 * - `coordinator`: a `CoordinatorNode`, until interrupted.
 *
 * An operator's commands are in `Admin`.
 *
 * @since 0.1.0
 */
import { Coordination } from "@strata/core"
import { CoordinatorNode, TabletServerNode } from "@strata/replica"
import { Effect, Layer, type Scope } from "effect"
import * as Logging from "./Logging.js"
import * as OpsEndpoint from "./OpsEndpoint.js"
import * as ServerConfig from "./ServerConfig.js"
import * as Telemetry from "./Telemetry.js"

/**
 * Starts a process's parts and runs until interrupted. The parts' scope closes (a controlled shutdown, the logs)
 * before the layers under it (the store, the coordination session) are released.
 */
const forever = <E, R, E2, R2>(start: Effect.Effect<unknown, E, R | Scope.Scope>, layers: Layer.Layer<R, E2, R2>) =>
  Effect.scoped(Effect.andThen(start, Effect.never)).pipe(Effect.provide(layers))

/**
 * A tablet server process, until interrupted.
 *
 * @since 0.1.0
 */
export const tabletServer = (sources: ServerConfig.Sources) =>
  Effect.gen(function* () {
    const { settings, replication } = yield* ServerConfig.load(ServerConfig.TabletServerConfig, sources)
    const layers = Layer.merge(
      ServerConfig.coordinationLayer(settings.coordination, settings),
      ServerConfig.storageLayer(settings)
    )
    const tls = yield* ServerConfig.peerTlsOf(settings)
    return yield* forever(
      Effect.gen(function* () {
        const node = yield* TabletServerNode.make({
          serverId: settings.id,
          replication,
          ...optional("tls", tls),
          ...optional("namespace", settings.namespace),
          ...optional("listen", settings.listen),
          ...optional("advertise", settings.advertise),
          ...optional("dataListen", settings.dataListen),
          ...optional("dataAdvertise", settings.dataAdvertise),
          ...optional("rack", settings.rack)
        })
        yield* Effect.logInfo(
          `tablet server ${settings.id} ready at ${node.address} (${settings.store === "segments" ? "segment files" : `${settings.store} store`} in ${settings.data}, registration epoch ${node.registrationEpoch})`
        )
        const ops = yield* OpsEndpoint.serve(settings.httpListen, OpsEndpoint.tabletServerProbes(node, settings.id))
        yield* Effect.logInfo(
          `tablet server ${settings.id} ops endpoint on http://${ops} (/metrics, /healthz, /readyz)`
        )
        // Until interrupted, or until another server holds the id when this one registers again.
        return yield* node.held
      }),
      layers
    ).pipe(
      Telemetry.exporting("tablet-server", settings.id),
      Logging.withProcessLog(settings.logFormat, "tablet-server", settings.id)
    )
  })

/**
 * A coordinator process, until interrupted.
 *
 * @since 0.1.0
 */
export const coordinator = (sources: ServerConfig.Sources) =>
  Effect.gen(function* () {
    const { settings, replication } = yield* ServerConfig.load(ServerConfig.CoordinatorConfig, sources)
    const tls = yield* ServerConfig.peerTlsOf(settings)
    return yield* forever(
      Effect.gen(function* () {
        const node = yield* CoordinatorNode.make({
          serverId: settings.id,
          replication,
          ...optional("tls", tls),
          ...optional("namespace", settings.namespace),
          ...optional("listen", settings.listen),
          ...optional("advertise", settings.advertise),
          ...optional("rejoinBackoff", settings.rejoinBackoff),
          rebalance: ServerConfig.rebalanceOf(settings)
        })
        yield* Effect.logInfo(`coordinator ${settings.id} ready at ${node.address}`)
        const ops = yield* OpsEndpoint.serve(settings.httpListen, OpsEndpoint.coordinatorProbes(node, settings.id))
        yield* Effect.logInfo(
          `coordinator ${settings.id} ops endpoint on http://${ops} (/metrics, /healthz, /readyz, /cluster, /rebalance)`
        )
        // Until interrupted, or until the coordination refuses this coordinator's identity (it stops by itself then).
        const down = yield* node.coordinator.awaitState((s) => s._tag === "Down").pipe(Effect.orDie)
        if (down._tag === "Down" && down.refused !== undefined) {
          return yield* Effect.fail(
            Coordination.coordinationError(
              new Coordination.NotAuthorized({ path: settings.namespace ?? "/strata", detail: down.refused })
            )
          )
        }
        return yield* Effect.never
      }),
      ServerConfig.coordinationLayer(settings.coordination, settings)
    ).pipe(
      Telemetry.exporting("coordinator", settings.id),
      Logging.withProcessLog(settings.logFormat, "coordinator", settings.id)
    )
  })

/**
 * `{ [key]: value }`, or nothing when the value is not given.
 *
 * @since 0.1.0
 */
export const optional = <K extends string, V>(key: K, value: V | undefined): { [P in K]?: V } =>
  (value === undefined ? {} : { [key]: value }) as { [P in K]?: V }
