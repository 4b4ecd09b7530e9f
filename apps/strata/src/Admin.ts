/**
 * An operator's commands (`strata tablets ...`, `strata rebalance plan`, `strata cluster status`): a `TabletClient`'s
 * calls to the controller of the cluster the configuration names (`ServerConfig`), printed for an operator as lines
 * (`output: "text"`) or as one JSON value (`output: "json"`). What they print is made in `AdminReport` and
 * `PlanReport`.
 *
 * @since 0.1.0
 */
import { Coordination, Models } from "@strata/core"
import { ClusterPaths, type ReplicaRpc, type ReplicationConfig, TabletClient } from "@strata/replica"
import { Planner, RebalanceService } from "@strata/rebalance"
import { Console, Data, Effect, Option, Schema, type Scope } from "effect"
import * as AdminReport from "./AdminReport.js"
import * as PlanReport from "./PlanReport.js"
import * as RebalanceReport from "./RebalanceReport.js"
import { optional } from "./Processes.js"
import * as ServerConfig from "./ServerConfig.js"

/**
 * A table the cluster does not have (`strata tablets describe TABLE`, `strata tablets delete TABLE`).
 *
 * @since 0.1.0
 */
export class NoSuchTable extends Data.TaggedError("NoSuchTable")<{ readonly table: string }> {
  /** @since 0.1.0 */
  override get message(): string {
    return `no table ${this.table} in the cluster`
  }
}

/**
 * `strata cluster status` found no coordinator leading: the tablets' state is unknown.
 *
 * @since 0.1.0
 */
export class NoLeader extends Data.TaggedError("NoLeader")<{ readonly coordinators: number }> {
  /** @since 0.1.0 */
  override get message(): string {
    return `no coordinator leads the cluster (${this.coordinators} registered): the tablets' state is unknown`
  }
}

/**
 * What a command's work has: the client, the replication settings it was given, and the cluster's namespace.
 *
 * @since 0.1.0
 */
export interface Cluster {
  readonly client: TabletClient.TabletClientShape
  readonly replication: ReplicationConfig.ReplicationConfig
  readonly namespace: string
}

/**
 * A client of the cluster the settings name, for one command: through coordinators' addresses (`bootstrap`) or, without
 * them, through coordination (`coordination`, required then).
 *
 * @since 0.1.0
 */
export const withClient = <A, E>(
  sources: ServerConfig.Sources,
  use: (cluster: Cluster) => Effect.Effect<A, E, Scope.Scope>
) =>
  Effect.gen(function* () {
    const { settings, replication } = yield* ServerConfig.load(ServerConfig.AdminConfig, sources)
    const namespace = settings.namespace ?? "/strata"
    const options: TabletClient.TabletClientOptions = {
      replication,
      deliveryTimeout: "30 seconds",
      ...optional("namespace", settings.namespace),
      ...optional("tls", yield* ServerConfig.peerTlsOf(settings))
    }
    if (settings.bootstrap !== undefined) {
      const bootstrap = settings.bootstrap.split(",")
      return yield* Effect.scoped(
        Effect.flatMap(TabletClient.makeBootstrap({ ...options, bootstrap }), (client) =>
          use({ client, replication, namespace })
        )
      )
    }
    const coordination = yield* coordinationOf(settings.coordination)
    return yield* Effect.scoped(
      Effect.flatMap(TabletClient.make(options), (client) => use({ client, replication, namespace }))
    ).pipe(Effect.provide(ServerConfig.coordinationLayer(coordination, settings)))
  })

/**
 * A client of the cluster through coordination, which stays in context for `use` (what `strata cluster status` reads
 * there: the coordinators' registrations).
 *
 * @since 0.1.0
 */
export const withCoordination = <A, E>(
  sources: ServerConfig.Sources,
  use: (cluster: Cluster) => Effect.Effect<A, E, Coordination.Coordination | Scope.Scope>
) =>
  Effect.gen(function* () {
    const { settings, replication } = yield* ServerConfig.load(ServerConfig.ClientConfig, sources)
    const namespace = settings.namespace ?? "/strata"
    const tls = yield* ServerConfig.peerTlsOf(settings)
    return yield* Effect.scoped(
      Effect.flatMap(
        TabletClient.make({
          replication,
          deliveryTimeout: "30 seconds",
          ...optional("namespace", settings.namespace),
          ...optional("tls", tls)
        }),
        (client) => use({ client, replication, namespace })
      )
    ).pipe(Effect.provide(ServerConfig.coordinationLayer(settings.coordination, settings)))
  })

/** The coordination URL an operator's command needs when it has no `bootstrap`. */
const coordinationOf = (url: string | undefined) =>
  url === undefined
    ? Effect.fail(
        new ServerConfig.InvalidConfig({
          key: "coordination",
          source: "defaults",
          detail: "required (or bootstrap: the coordinators' host:port[,host:port...])"
        })
      )
    : Effect.succeed(url)

/** Prints `value` as one JSON line. */
const printJson = (value: unknown) => Console.log(JSON.stringify(value))

/** Prints `lines`, one a line. */
const printLines = (lines: ReadonlyArray<string>) =>
  Effect.forEach(lines, (line) => Console.log(line), { discard: true })

/**
 * `strata tablets list`: one line per table (name, tablets, replication factor), or (`json`) an array of
 * `AdminReport.TableSummary`.
 *
 * @since 0.1.0
 */
export const listTables = (sources: ServerConfig.Sources, options: { readonly output: AdminReport.Output }) =>
  withClient(sources, ({ client }) =>
    Effect.gen(function* () {
      const summaries = AdminReport.tables(yield* client.metadata())
      if (options.output === "json") return yield* printJson(summaries)
      yield* printLines(AdminReport.tableLines(summaries))
    })
  )

/**
 * `strata tablets create`'s options: `ifNotExists`, a table that exists (not being deleted) is no failure;
 * `retentionMs` and `retentionBytes`, the table's retention (how long, how much each replica keeps).
 *
 * @since 0.1.0
 */
export interface CreateOptions {
  readonly buckets: number
  readonly replicationFactor?: number
  readonly retentionMs?: number
  readonly retentionBytes?: number
  readonly ifNotExists?: boolean
  readonly output?: AdminReport.Output
}

/**
 * `strata tablets create`: a table of `buckets` tablets, assigned by the controller; prints each tablet. With
 * `ifNotExists`, a table of that name that exists is left as it is and printed (asked before the create, and again
 * after a refused one: another operator's create may have come first); a table being deleted still fails.
 * JSON: `{ table, created, tablets }`.
 *
 * @since 0.1.0
 */
export const createTable = (sources: ServerConfig.Sources, table: string, options: CreateOptions) =>
  Effect.gen(function* () {
    // Refused before anything is read or sent (the controller refuses it too).
    const invalid = ClusterPaths.invalidTableName(table)
    if (invalid !== undefined) return yield* invalid
    return yield* withClient(sources, ({ client }) =>
      Effect.gen(function* () {
        const json = options.output === "json"
        /** The table's tablets, when it exists and is not being deleted. */
        const existing = Effect.map(client.metadata(table), (m) =>
          m.tablets.some((t) => t.state !== "DeletingTablet") ? m.tablets : undefined
        )
        const exists = (tablets: ReadonlyArray<typeof ReplicaRpc.TabletMetadata.Type>) => {
          if (json) return printJson({ table, created: false, tablets })
          const asked = tablets.length === options.buckets ? "" : ` (${options.buckets} asked)`
          return Effect.andThen(
            printLines(tablets.map(AdminReport.tabletLine)),
            Console.log(`OK: ${table} exists already with ${tablets.length} tablets${asked}: nothing created`)
          )
        }
        if (options.ifNotExists === true) {
          const before = yield* existing
          if (before !== undefined) return yield* exists(before)
        }
        const created = yield* Effect.result(
          client.createTable(table, {
            buckets: options.buckets,
            ...optional("replicationFactor", options.replicationFactor),
            ...optional("retentionMs", options.retentionMs),
            ...optional("retentionBytes", options.retentionBytes)
          })
        )
        if (created._tag === "Failure") {
          const refused = created.failure.reason._tag === "CreateTableRefused"
          const after = refused && options.ifNotExists === true ? yield* existing : undefined
          if (after !== undefined) return yield* exists(after)
          return yield* created.failure
        }
        const tablets = created.success
        if (json) return yield* printJson({ table, created: true, tablets })
        yield* printLines(tablets.map(AdminReport.tabletLine))
        yield* Console.log(`OK: created ${table} with ${tablets.length} tablets`)
      })
    )
  })

/**
 * `strata tablets delete`: a table's tablets lead no more and every replica deletes its data. A table the cluster
 * does not have fails with `NoSuchTable`, or with `ifExists` is said so and is no failure. JSON:
 * `{ table, deleted, tablets }`.
 *
 * @since 0.1.0
 */
export const deleteTable = (
  sources: ServerConfig.Sources,
  table: string,
  options: { readonly ifExists?: boolean; readonly output?: AdminReport.Output } = {}
) =>
  withClient(sources, ({ client }) =>
    Effect.gen(function* () {
      // The controller refuses a delete only when it has no table of that name.
      const tablets = yield* client.deleteTable(table).pipe(
        Effect.map((n): number | undefined => n),
        Effect.catchIf(
          (e) => e.reason._tag === "DeleteTableRefused",
          () => Effect.succeed(undefined)
        )
      )
      if (tablets === undefined && options.ifExists !== true) return yield* new NoSuchTable({ table })
      if (options.output === "json") {
        return yield* printJson({ table, deleted: tablets !== undefined, tablets: tablets ?? 0 })
      }
      if (tablets === undefined) return yield* Console.log(`OK: no table ${table} in the cluster: nothing deleted`)
      yield* Console.log(
        `OK: deleting ${table} (${tablets} tablets): each replica deletes its data, a server that is down when it is back`
      )
    })
  )

/**
 * `strata tablets balance-leaders`: leadership back to preferred replicas now, as the controller also does every
 * `leaderImbalanceCheckInterval`. JSON: `{ moved }`.
 *
 * @since 0.1.0
 */
export const balanceLeaders = (sources: ServerConfig.Sources, options: { readonly output?: AdminReport.Output } = {}) =>
  withClient(sources, ({ client }) =>
    Effect.gen(function* () {
      const moved = yield* client.balanceLeaders
      if (options.output === "json") return yield* printJson({ moved })
      yield* Console.log(`OK: ${moved} tablets led by their preferred replica again`)
    })
  )

/**
 * `strata tablets describe`'s options: `filter`, only the tablets it selects (`AdminReport.selects`, against the
 * `minInsyncReplicas` of the command's settings).
 *
 * @since 0.1.0
 */
export interface DescribeOptions {
  readonly output?: AdminReport.Output
  readonly filter?: AdminReport.TabletFilter | undefined
}

/**
 * `strata tablets describe`: every tablet (or one table's) and the live servers, as the controller holds them, as
 * lines or (`json`) as the metadata's JSON; a moving tablet shows its target replicas, and a move's retired ones until
 * they have deleted their replica. With a filter, only the tablets it selects (as lines, without the epoch and
 * servers; as JSON, the metadata with those tablets). A table the cluster does not have fails with `NoSuchTable`,
 * printing nothing.
 *
 * @since 0.1.0
 */
export const describe = (sources: ServerConfig.Sources, table: string | undefined, options: DescribeOptions = {}) =>
  withClient(sources, ({ client, replication }) =>
    Effect.gen(function* () {
      const metadata = yield* client.metadata(table)
      if (table !== undefined && metadata.tablets.length === 0) return yield* new NoSuchTable({ table })
      const filter = options.filter
      const tablets =
        filter === undefined
          ? metadata.tablets
          : metadata.tablets.filter((t) => AdminReport.selects(filter, replication.minInsyncReplicas, t))
      if (options.output === "json") return yield* printJson({ ...metadata, tablets })
      if (filter === undefined) {
        yield* Console.log(`coordinator epoch ${metadata.coordinatorEpoch}`)
        yield* printLines(metadata.servers.map(AdminReport.serverLine))
      }
      yield* printLines(tablets.map(AdminReport.tabletLine))
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
 * done) or done already. A refusal fails with `ReassignRefused`, its one-line detail naming what was wrong. JSON:
 * `{ action: "move", done, tablet }` or `{ action: "cancel", cancelled, tablet }` (`cancelled`: the target the move
 * had, `tablet`: the tablet as the controller left it).
 *
 * @since 0.1.0
 */
export const reassign = (
  sources: ServerConfig.Sources,
  table: string,
  bucket: number,
  request: ReassignRequest,
  options: { readonly output?: AdminReport.Output } = {}
) =>
  withClient(sources, ({ client }) =>
    Effect.gen(function* () {
      const tablet = { table, bucket }
      const name = AdminReport.tabletName(tablet)
      const json = options.output === "json"
      const list = (servers: ReadonlyArray<number>) => `[${servers.join(",")}]`
      if (request._tag === "Cancel") {
        // The move as it was, to say what is cancelled (the reply is the tablet back on its replicas).
        const before = (yield* client.metadata(table)).tablets.find((t) => t.tablet.bucket === bucket)
        const back = yield* refusedAsItself(client.cancelReassign(tablet))
        if (json) return yield* printJson({ action: "cancel", cancelled: before?.target ?? null, tablet: back })
        const from = before?.target === undefined ? "" : ` to ${list(before.target)}`
        const retired = back.retired === undefined ? "" : `; ${list(back.retired)} delete their replicas`
        return yield* Console.log(`OK: ${name}: the move${from} is cancelled, back on ${list(back.replicas)}${retired}`)
      }
      const moved = yield* refusedAsItself(client.reassign(tablet, request.replicas))
      if (json) return yield* printJson({ action: "move", done: moved.target === undefined, tablet: moved })
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
  options: { readonly goals?: ReadonlyArray<string> | undefined; readonly output: AdminReport.Output }
) =>
  withClient(sources, ({ client }) =>
    Effect.gen(function* () {
      const model = PlanReport.modelOf(yield* client.clusterModel())
      // The goals as given: the planner's options schema names a goal it does not know.
      const plan = yield* Planner.plan(
        model,
        (options.goals === undefined ? {} : { goals: options.goals }) as Planner.Options
      )
      if (options.output === "json") yield* printJson(PlanReport.json(model, plan))
      else yield* printLines(PlanReport.lines(model, plan))
    })
  )

/**
 * `strata rebalance start|status|pause|resume|cancel`: the request to the leading coordinator's rebalance service,
 * then its status, as lines or JSON. A refusal (nothing to pause, one already running, no plan) fails as the
 * `RebalanceCommandError` itself, its message saying why.
 *
 * @since 0.1.0
 */
export const rebalanceControl = (
  sources: ServerConfig.Sources,
  action: ReplicaRpc.RebalanceRequest["action"],
  options: { readonly goals?: ReadonlyArray<string> | undefined; readonly output: AdminReport.Output }
) =>
  withClient(sources, ({ client }) =>
    Effect.gen(function* () {
      const goals = options.goals === undefined ? undefined : yield* goalsOf(options.goals)
      const status = yield* client.rebalance({ action, ...(goals === undefined ? {} : { goals }) }).pipe(
        Effect.catchIf(
          (e) => e.reason._tag === "RebalanceCommandError",
          (e) => Effect.fail(e.reason as RebalanceService.RebalanceCommandError)
        )
      )
      if (options.output === "json") yield* printJson(status)
      else yield* printLines(RebalanceReport.lines(status))
    })
  )

/** Goals as given, each one the planner knows, or a refusal naming the one it does not. */
const goalsOf = (given: ReadonlyArray<string>) =>
  Effect.forEach(given, (goal) =>
    Schema.decodeUnknownEffect(Planner.Goal)(goal).pipe(
      Effect.mapError(
        () =>
          new RebalanceService.RebalanceCommandError({
            reason: { _tag: "PlanFailed", detail: `unknown goal ${goal} (goals: replica-count, leader, bytes)` }
          })
      )
    )
  )

const decoder = new TextDecoder()
/** A coordinator's registration, as the election writes it (`<ns>/coordinators/ids/<id>`). */
const decodeCandidate = Schema.decodeUnknownOption(
  Schema.fromJsonString(Schema.Struct({ serverId: Models.ServerId, address: Schema.String }))
)
const decodeLeader = Schema.decodeUnknownOption(Schema.fromJsonString(Models.LeaderInfo))
const decodeRegistration = Schema.decodeUnknownOption(Schema.fromJsonString(ClusterPaths.Registration))

/** A node's data as text, or `undefined` when there is no node at `path`. */
const dataAt = (session: Coordination.Session, path: string) =>
  session.get(path).pipe(
    Effect.map((node): string | undefined => decoder.decode(node.data)),
    Effect.catchIf(
      (e) => e.reason._tag === "NoNode",
      () => Effect.succeed(undefined)
    )
  )

/** The children of `path`, none when there is no node there. */
const childrenOf = (session: Coordination.Session, path: string) =>
  session.children(path).pipe(
    Effect.catchIf(
      (e) => e.reason._tag === "NoNode",
      () => Effect.succeed([] as ReadonlyArray<string>)
    )
  )

/**
 * What coordination holds of the cluster's processes, read through one session: the coordinators registered in the
 * election (`/<ns>/coordinators/ids/<id>`) and its leader node (`/<ns>/coordinators/leader`), as `@strata/election`
 * lays them out, and the tablet servers' registrations (`ClusterPaths`).
 */
const registered = (namespace: string) =>
  Effect.gen(function* () {
    const session = yield* (yield* Coordination.Coordination).session()
    const base = `/${namespace.replace(/^\/+|\/+$/g, "")}/coordinators`
    const leaderText = yield* dataAt(session, `${base}/leader`)
    const leader = leaderText === undefined ? undefined : Option.getOrUndefined(decodeLeader(leaderText))
    const coordinators: Array<AdminReport.CoordinatorStatus> = []
    for (const name of yield* childrenOf(session, `${base}/ids`)) {
      const text = yield* dataAt(session, `${base}/ids/${name}`)
      const candidate = text === undefined ? undefined : Option.getOrUndefined(decodeCandidate(text))
      if (candidate === undefined) continue
      coordinators.push({
        id: candidate.serverId,
        address: candidate.address,
        leader: leader?.serverId === candidate.serverId
      })
    }
    const paths = ClusterPaths.make(namespace)
    const servers: Array<typeof ReplicaRpc.ServerMetadata.Type> = []
    for (const name of yield* childrenOf(session, paths.servers)) {
      const id = ClusterPaths.serverIdOf(name)
      const text = id === undefined ? undefined : yield* dataAt(session, paths.server(id))
      const r = text === undefined ? undefined : Option.getOrUndefined(decodeRegistration(text))
      if (id === undefined || r === undefined) continue
      servers.push({
        id,
        address: r.address,
        ...optional("dataAddress", r.dataAddress),
        ...optional("rack", r.rack)
      })
    }
    return {
      coordinators: coordinators.sort((a, b) => a.id - b.id),
      leader,
      servers: servers.sort((a, b) => a.id - b.id)
    }
  })

/**
 * `strata cluster status`: the coordinators (which leads, at which coordinator epoch), the live tablet servers, the
 * servers the tablets name that are not registered, and the tablets' figures: total, offline, under-replicated, under
 * min ISR (against the `minInsyncReplicas` of the command's settings). As lines, or (`json`) as one
 * `AdminReport.ClusterStatus`. With no coordinator leading it prints what it found, then fails with `NoLeader`.
 *
 * @since 0.1.0
 */
export const clusterStatus = (sources: ServerConfig.Sources, options: { readonly output: AdminReport.Output }) =>
  withCoordination(sources, (cluster) =>
    Effect.gen(function* () {
      const status = yield* statusOf(cluster)
      if (options.output === "json") yield* printJson(status)
      else yield* printLines(AdminReport.statusLines(status))
      if (status.leader === null) return yield* new NoLeader({ coordinators: status.coordinators.length })
    })
  )

/**
 * What `strata cluster status` prints, read and not printed (`leader` and `tablets` are `null` when no coordinator
 * leads).
 *
 * @since 0.1.0
 */
export const readStatus = (sources: ServerConfig.Sources) => withCoordination(sources, statusOf)

/** The cluster's status, through one command's client. */
const statusOf = ({ client, replication, namespace }: Cluster) =>
  Effect.gen(function* () {
    const found = yield* registered(namespace)
    const metadata = found.leader === undefined ? undefined : yield* client.metadata()
    const minInsyncReplicas = replication.minInsyncReplicas
    const status: AdminReport.ClusterStatus = {
      coordinators: found.coordinators,
      leader:
        found.leader === undefined
          ? null
          : { id: found.leader.serverId, epoch: found.leader.epoch, address: found.leader.address },
      servers: found.servers,
      down: metadata === undefined ? null : AdminReport.downServers(metadata.tablets, found.servers),
      minInsyncReplicas,
      tablets: metadata === undefined ? null : AdminReport.counts(metadata.tablets, minInsyncReplicas)
    }
    return status
  })
