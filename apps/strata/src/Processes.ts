/**
 * The cluster's processes and an operator's commands, composed from `@strata/replica`'s layers over the
 * coordination backend and store that the configuration names (`ServerConfig`):
 *
 * - `tabletServer`: a `TabletServerNode` on a LevelDB or RocksDB data directory, until interrupted (SIGINT or
 *   SIGTERM: a controlled shutdown first), or until its id turns out to be another running server's
 *   (`DuplicateServerId`: it never acted for that id);
 * - `coordinator`: a `CoordinatorNode`, until interrupted;
 * - `createTable` / `describe` / `reassign`: a `TabletClient`'s calls to the controller.
 *
 * @since 0.1.0
 */
import type { Models } from "@strata/core"
import { ClusterPaths, CoordinatorNode, type ReplicaRpc, TabletClient, TabletServerNode } from "@strata/replica"
import { Planner } from "@strata/rebalance"
import { Console, Data, Effect, Layer, type Scope } from "effect"
import * as PlanReport from "./PlanReport.js"
import * as ServerConfig from "./ServerConfig.js"

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
      ServerConfig.coordinationLayer(settings.coordination),
      ServerConfig.storeLayer(settings.store, settings.data)
    )
    return yield* forever(
      Effect.gen(function* () {
        const node = yield* TabletServerNode.make({
          serverId: settings.id,
          replication,
          ...optional("namespace", settings.namespace),
          ...optional("listen", settings.listen),
          ...optional("advertise", settings.advertise),
          ...optional("dataListen", settings.dataListen),
          ...optional("dataAdvertise", settings.dataAdvertise),
          ...optional("rack", settings.rack)
        })
        yield* Effect.logInfo(
          `tablet server ${settings.id} ready at ${node.address} (${settings.store} store in ${settings.data}, registration epoch ${node.registrationEpoch})`
        )
        // Until interrupted, or until another server holds the id when this one registers again.
        return yield* node.held
      }),
      layers
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
    return yield* forever(
      Effect.gen(function* () {
        const node = yield* CoordinatorNode.make({
          serverId: settings.id,
          replication,
          ...optional("namespace", settings.namespace),
          ...optional("listen", settings.listen),
          ...optional("advertise", settings.advertise),
          ...optional("rejoinBackoff", settings.rejoinBackoff)
        })
        yield* Effect.logInfo(`coordinator ${settings.id} ready at ${node.address}`)
      }),
      ServerConfig.coordinationLayer(settings.coordination)
    )
  })

/** `{ [key]: value }`, or nothing when the value is not given. */
const optional = <K extends string, V>(key: K, value: V | undefined): { [P in K]?: V } =>
  (value === undefined ? {} : { [key]: value }) as { [P in K]?: V }

/**
 * `strata tablets describe TABLE` of a table the cluster does not have.
 *
 * @since 0.1.0
 */
export class NoSuchTable extends Data.TaggedError("NoSuchTable")<{ readonly table: string }> {
  /** @since 0.1.0 */
  override get message(): string {
    return `no table ${this.table} in the cluster`
  }
}

/** A client of the cluster the settings name, for one command. */
const withClient = <A, E>(
  sources: ServerConfig.Sources,
  use: (client: TabletClient.TabletClientShape) => Effect.Effect<A, E>
) =>
  Effect.gen(function* () {
    const { settings, replication } = yield* ServerConfig.load(ServerConfig.ClientConfig, sources)
    return yield* Effect.scoped(
      Effect.flatMap(
        TabletClient.make({
          replication,
          deliveryTimeout: "30 seconds",
          ...optional("namespace", settings.namespace)
        }),
        use
      )
    ).pipe(Effect.provide(ServerConfig.coordinationLayer(settings.coordination)))
  })

/** A tablet as `strata tablets` names it. */
const tabletName = (t: Models.TabletId): string => `${t.table}:${t.bucket}`

/**
 * A tablet's line in `strata tablets describe`: while it moves, the replicas it moves to (`target`); servers a move
 * took out that have not yet deleted their replica (`retired`).
 */
const describeTablet = (t: typeof ReplicaRpc.TabletMetadata.Type): string =>
  [
    `${tabletName(t.tablet)}\t${t.state}\tleader ${t.leader ?? "none"}\tepoch ${t.leaderEpoch}\treplicas ${t.replicas.join(",")}\tisr ${t.isr.join(",")}`,
    ...(t.target === undefined ? [] : [`target ${t.target.join(",")}`]),
    ...(t.retired === undefined || t.retired.length === 0 ? [] : [`retired ${t.retired.join(",")}`])
  ].join("\t")

/**
 * `strata tablets create`: a table of `buckets` tablets, assigned by the controller; prints each tablet.
 *
 * @since 0.1.0
 */
export const createTable = (
  sources: ServerConfig.Sources,
  table: string,
  options: { readonly buckets: number; readonly replicationFactor?: number }
) =>
  Effect.gen(function* () {
    // Refused before anything is read or sent (the controller refuses it too).
    const invalid = ClusterPaths.invalidTableName(table)
    if (invalid !== undefined) return yield* invalid
    return yield* createTableOf(sources, table, options)
  })

const createTableOf = (
  sources: ServerConfig.Sources,
  table: string,
  options: { readonly buckets: number; readonly replicationFactor?: number }
) =>
  withClient(sources, (client) =>
    Effect.gen(function* () {
      const tablets = yield* client.createTable(table, options)
      for (const t of tablets) yield* Console.log(describeTablet(t))
      yield* Console.log(`OK: created ${table} with ${tablets.length} tablets`)
    })
  )

/**
 * `strata tablets delete`: a table's tablets lead no more and every replica deletes its data.
 *
 * @since 0.1.0
 */
export const deleteTable = (sources: ServerConfig.Sources, table: string) =>
  withClient(sources, (client) =>
    Effect.gen(function* () {
      const tablets = yield* client.deleteTable(table)
      yield* Console.log(
        `OK: deleting ${table} (${tablets} tablets): each replica deletes its data, a server that is down when it is back`
      )
    })
  )

/**
 * `strata tablets balance-leaders`: leadership back to preferred replicas now, as the controller also does every
 * `leaderImbalanceCheckInterval`.
 *
 * @since 0.1.0
 */
export const balanceLeaders = (sources: ServerConfig.Sources) =>
  withClient(sources, (client) =>
    Effect.gen(function* () {
      const moved = yield* client.balanceLeaders
      yield* Console.log(`OK: ${moved} tablets led by their preferred replica again`)
    })
  )

/**
 * `strata tablets describe`: every tablet (or one table's) and the live servers, as the controller holds them, as
 * lines or (`json`) as the metadata's JSON; a moving tablet shows its target replicas, and a move's retired ones until
 * they have deleted their replica. A table the cluster does not have fails with `NoSuchTable`, printing nothing.
 *
 * @since 0.1.0
 */
export const describe = (
  sources: ServerConfig.Sources,
  table: string | undefined,
  options: { readonly json?: boolean } = {}
) =>
  withClient(sources, (client) =>
    Effect.gen(function* () {
      const metadata = yield* client.metadata(table)
      if (table !== undefined && metadata.tablets.length === 0) return yield* new NoSuchTable({ table })
      if (options.json === true) return yield* Console.log(JSON.stringify(metadata))
      yield* Console.log(`coordinator epoch ${metadata.coordinatorEpoch}`)
      for (const s of metadata.servers) {
        const data = s.dataAddress === undefined ? "" : `\tdata link ${s.dataAddress}`
        yield* Console.log(`server ${s.id}\t${s.address}${data}${s.rack === undefined ? "" : `\track ${s.rack}`}`)
      }
      for (const t of metadata.tablets) yield* Console.log(describeTablet(t))
    })
  )

/**
 * What `strata tablets reassign` asks: the tablet's new replicas (the first its preferred leader), or the end of its
 * move.
 *
 * @since 0.1.0
 */
export type ReassignRequest =
  | { readonly _tag: "Move"; readonly replicas: ReadonlyArray<number> }
  | { readonly _tag: "Cancel" }

/**
 * `strata tablets reassign`: moves one tablet's replicas (or cancels its move) and prints what the controller
 * accepted — from and to, and whether the move is under way (`strata tablets describe` shows its target until it is
 * done) or done already. A refusal fails with `ReassignRefused`, its one-line detail naming what was wrong.
 *
 * @since 0.1.0
 */
export const reassign = (sources: ServerConfig.Sources, table: string, bucket: number, request: ReassignRequest) =>
  withClient(sources, (client) =>
    Effect.gen(function* () {
      const tablet = { table, bucket }
      const name = tabletName(tablet)
      const list = (servers: ReadonlyArray<number>) => `[${servers.join(",")}]`
      if (request._tag === "Cancel") {
        // The move as it was, to say what is cancelled (the reply is the tablet back on its replicas).
        const before = (yield* client.metadata(table)).tablets.find((t) => t.tablet.bucket === bucket)
        const back = yield* refusedAsItself(client.cancelReassign(tablet))
        const from = before?.target === undefined ? "" : ` to ${list(before.target)}`
        const retired = back.retired === undefined ? "" : `; ${list(back.retired)} delete their replicas`
        return yield* Console.log(`OK: ${name}: the move${from} is cancelled, back on ${list(back.replicas)}${retired}`)
      }
      const moved = yield* refusedAsItself(client.reassign(tablet, request.replicas))
      if (moved.target === undefined) return yield* Console.log(`OK: ${name}: done, on ${list(moved.replicas)}`)
      yield* Console.log(
        `OK: ${name}: moving from ${list(moved.original ?? [])} to ${list(moved.target)}; strata tablets describe shows its target until it is done`
      )
    })
  )

/** A client call whose refused move fails as the `ReassignRefused` itself, its detail all there is to say. */
const refusedAsItself = <A>(call: Effect.Effect<A, TabletClient.TabletClientError>) =>
  Effect.catchIf(
    call,
    (e) => e.reason._tag === "ReassignRefused",
    (e) => Effect.fail(e.reason as ReplicaRpc.ReassignRefused)
  )

/**
 * `strata rebalance plan`: the planner's plan for the cluster as the controller describes it (`ClusterModel`: each
 * tablet's size in bytes from its leader's log, so the `bytes` goal moves the smallest tablets onto the servers
 * holding the fewest bytes; a tablet whose size no server told in time counts as 0), printed as lines or as JSON.
 * Changes nothing.
 *
 * @since 0.1.0
 */
export const rebalancePlan = (
  sources: ServerConfig.Sources,
  options: { readonly goals?: ReadonlyArray<string> | undefined; readonly json: boolean }
) =>
  withClient(sources, (client) =>
    Effect.gen(function* () {
      const model = PlanReport.modelOf(yield* client.clusterModel())
      // The goals as given: the planner's options schema names a goal it does not know.
      const plan = yield* Planner.plan(
        model,
        (options.goals === undefined ? {} : { goals: options.goals }) as Planner.Options
      )
      if (options.json) yield* Console.log(JSON.stringify(PlanReport.json(model, plan)))
      else for (const line of PlanReport.lines(model, plan)) yield* Console.log(line)
    })
  )
