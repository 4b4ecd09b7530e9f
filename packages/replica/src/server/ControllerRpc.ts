import type * as Tls from "node:tls"
/**
 * The controller's side of `ReplicaRpc.ControllerRpcs`, served by every coordinator: each request answered by the
 * controller while the coordinator leads, `NotController` while it does not.
 *
 * @since 0.1.0
 */
import { Models } from "@strata/core"
import type { RebalanceService } from "@strata/rebalance"
import { Duration, Effect, Random, Result, type Scope } from "effect"
import * as Assignment from "../machines/Assignment.js"
import * as Holdings from "./internal/holdings.js"
import type * as ControllerState from "../machines/ControllerState.js"
import type * as ReplicaManager from "../protocol/ReplicaManager.js"
import type { TabletServersShape } from "../wire/Peers.js"
import {
  type Address,
  type ClusterModelReply,
  type ClusterModelRequest,
  type ControllerHandlers,
  ControllerRpcs,
  type CreateTableRequest,
  CreateTableRefused,
  DeleteTableRefused,
  type ListenFailed,
  type Metadata,
  NotController,
  ReassignRefused,
  type RebalanceRequest,
  retentionOf,
  type ServerMetadata,
  serveGroup,
  type TabletMetadata
} from "../wire/ReplicaRpc.js"
import type { ControllerShape, ReassignReply } from "./Controller.js"

/**
 * What a coordinator's RPC endpoint answers from: the controller while this coordinator leads, and the registered
 * servers (for metadata, and for assigning a new table's replicas).
 *
 * @since 0.1.0
 */
export interface ControllerEndpoint {
  /** The controller, `undefined` while this coordinator does not lead. */
  readonly current: Effect.Effect<ControllerShape | undefined>
  /** The registered tablet servers. */
  readonly servers: Effect.Effect<ReadonlyArray<typeof ServerMetadata.Type>>
  /** Replicas per tablet when a request names none. */
  readonly replicationFactor: number
  /** The tablet servers, asked for their replicas' sizes (the cluster model's); without them no size is known. */
  readonly tabletServers?: TabletServersShape | undefined
  /** Where the controller is while this coordinator does not lead, when it knows (told in `NotController`). */
  readonly leader?: Effect.Effect<string | undefined> | undefined
  /** The coordinator's rebalance service while it leads (`Rebalance` requests go to it). */
  readonly rebalance?: Effect.Effect<RebalanceService.RebalanceServiceShape | undefined> | undefined
}

/** The clients' view of the controller's tablets (one table's, when named). */
const metadataOf = (
  state: ControllerState.State,
  servers: ReadonlyArray<typeof ServerMetadata.Type>,
  table: string | undefined
): Metadata => ({
  coordinatorEpoch: state.coordinatorEpoch,
  tablets: [...state.tablets.values()]
    .filter((t) => table === undefined || t.tablet.table === table)
    .map(tabletMetadata),
  servers: servers.filter((s) => state.live.has(s.id))
})

const tabletMetadata = (t: ControllerState.Tablet): typeof TabletMetadata.Type => ({
  tablet: t.tablet,
  replicas: t.replicas,
  state: t.state,
  leader: t.leaderAndIsr.leader,
  leaderEpoch: t.leaderAndIsr.leaderEpoch,
  isr: t.leaderAndIsr.isr,
  ...(t.reassignment === undefined ? {} : { target: t.reassignment.target, original: t.reassignment.original }),
  ...(t.reassignment?.throttleBytesPerSec === undefined
    ? {}
    : { throttleBytesPerSec: t.reassignment.throttleBytesPerSec }),
  ...(t.retired === undefined || t.retired.length === 0 ? {} : { retired: t.retired }),
  ...(t.retention === undefined ? {} : { retention: t.retention })
})

/** A move's answer as the RPC's: the tablet, or the refusal. */
const moved = (reply: ReassignReply): Effect.Effect<typeof TabletMetadata.Type, ReassignRefused> =>
  reply._tag === "ReassignRefused"
    ? Effect.fail(new ReassignRefused({ reason: reply.refusal, detail: reply.detail }))
    : Effect.succeed(tabletMetadata(reply.tablet))

/**
 * Creates a table on `controller`: its replicas assigned over the live registered servers (`Assignment`, leaders
 * and replicas spread evenly, racks apart when the servers name racks), starting at a random server; each tablet
 * keeps the retention the request names.
 */
const createTable = (
  controller: ControllerShape,
  endpoint: ControllerEndpoint,
  request: typeof CreateTableRequest.Type
): Effect.Effect<ReadonlyArray<typeof TabletMetadata.Type>, NotController | CreateTableRefused> =>
  Effect.gen(function* () {
    const state = yield* controller.state
    const same = [...state.tablets.values()].filter((t) => t.tablet.table === request.table)
    if (same.length > 0) {
      const deleting = same.every((t) => t.state === "DeletingTablet")
      return yield* new CreateTableRefused({
        detail: deleting
          ? `table ${request.table} is being deleted (each of its replicas deletes itself, a server that is down when it is back)`
          : `table ${request.table} exists`
      })
    }
    const servers = (yield* endpoint.servers).filter((s) => state.live.has(s.id) && !state.shuttingDown.has(s.id))
    const assigned = Assignment.assign({
      table: request.table,
      buckets: request.buckets,
      replicationFactor: request.replicationFactor ?? endpoint.replicationFactor,
      servers,
      existing: [...state.tablets.values()],
      start: yield* Random.nextIntBetween(0, Math.max(1, servers.length) - 1)
    })
    if (Result.isFailure(assigned)) return yield* new CreateTableRefused({ detail: assigned.failure.detail })
    const retention = retentionOf(request)
    const reply = yield* controller
      .createTablets(retention === undefined ? assigned.success : assigned.success.map((t) => ({ ...t, retention })))
      .pipe(Effect.mapError((e) => new NotController({ detail: e.message })))
    if (reply._tag === "Created") return reply.tablets.map(tabletMetadata)
    return yield* new CreateTableRefused({
      detail: reply._tag === "CreateRefused" ? reply.detail : `unexpected answer ${reply._tag}`
    })
  })

/** Deletes every tablet of `table`; how many there are. */
const deleteTable = (
  controller: ControllerShape,
  table: string
): Effect.Effect<number, NotController | DeleteTableRefused> =>
  Effect.gen(function* () {
    const state = yield* controller.state
    const tablets = [...state.tablets.values()].filter((t) => t.tablet.table === table).map((t) => t.tablet)
    if (tablets.length === 0) return yield* new DeleteTableRefused({ detail: `no table ${table}` })
    return yield* controller
      .deleteTablets(tablets)
      .pipe(Effect.mapError((e) => new NotController({ detail: e.message })))
  })

/** How long the cluster model waits for the servers' sizes unless the request says. */
const defaultSizeTimeoutMs = 5_000

/**
 * Each replica's size as the servers holding replicas tell it (`Holdings.holdingsOf`: asked under the controller's
 * epoch and each server's registration, every one at once, one that fails or has not answered within `timeout` left
 * out), by server and tablet key.
 */
const sizesOf = (
  servers: TabletServersShape | undefined,
  state: ControllerState.State,
  asked: ReadonlyArray<Models.ServerId>,
  timeout: Duration.Duration
): Effect.Effect<ReadonlyMap<Models.ServerId, ReadonlyMap<string, number>>> =>
  Effect.map(Holdings.holdingsOf(servers, state, asked, timeout), (answers) => {
    const out = new Map<Models.ServerId, ReadonlyMap<string, number>>()
    for (const [id, held] of answers) {
      const sizes = new Map<string, number>()
      for (const h of held.tablets) if (h.sizeBytes !== undefined) sizes.set(Models.tabletKey(h.tablet), h.sizeBytes)
      out.set(id, sizes)
    }
    return out
  })

/**
 * Each live server's health as its answer to `Holdings` tells it (`ReplicaManager.ServerHealth`: its recent p99
 * append latency, its ISR shrinks), asked as the cluster model's sizes are: every server of `state.live` at once, one
 * that fails, has not answered within `timeout`, or keeps no health (a server older than health) left out. What
 * `ControllerShape.serverHealth` answers.
 *
 * @since 0.1.0
 */
export const serverHealth: (
  servers: TabletServersShape | undefined,
  state: ControllerState.State,
  timeout: Duration.Duration
) => Effect.Effect<ReadonlyMap<Models.ServerId, ReplicaManager.ServerHealth>> = Holdings.serverHealth

/**
 * The cluster as a rebalance planner sees it: the live registered servers with their racks, and every tablet not
 * being deleted. A moving tablet is given the replicas it ends with (its leader only when one of them); a replica on
 * a server not registered now keeps its place, that server listed `excluded`. A tablet's size is its leader's log's
 * figure, else the largest any of its replicas gave in time; without one it has no `sizeBytes`, and is counted in
 * `sizesMissing`.
 *
 * @since 0.1.0
 */
export const clusterModel = (
  controller: ControllerShape,
  endpoint: ControllerEndpoint,
  request: typeof ClusterModelRequest.Type
): Effect.Effect<ClusterModelReply> =>
  Effect.gen(function* () {
    const state = yield* controller.state
    const registered = (yield* endpoint.servers).filter((s) => state.live.has(s.id))
    const ids = new Set(registered.map((s) => s.id))
    const tablets = [...state.tablets.values()].filter((t) => t.state !== "DeletingTablet")
    const holders = new Set(tablets.flatMap((t) => t.replicas))
    const timeout = Duration.millis(request.sizeTimeoutMs ?? defaultSizeTimeoutMs)
    const sizes = yield* sizesOf(
      endpoint.tabletServers,
      state,
      [...holders].filter((id) => ids.has(id)),
      timeout
    )
    const absent = new Set<number>()
    let sizesMissing = 0
    const modelled = tablets.map((t): (typeof ClusterModelReply.Type)["tablets"][number] => {
      const replicas = t.reassignment?.target ?? t.replicas
      for (const r of replicas) if (!ids.has(r)) absent.add(r)
      const leader = t.leaderAndIsr.leader
      const key = Models.tabletKey(t.tablet)
      const told = t.replicas.flatMap((r) => {
        const size = sizes.get(r)?.get(key)
        return size === undefined ? [] : [size]
      })
      const size =
        (leader === null ? undefined : sizes.get(leader)?.get(key)) ?? (told.length > 0 ? Math.max(...told) : undefined)
      if (size === undefined) sizesMissing++
      return {
        tablet: t.tablet,
        replicas,
        leader: leader !== null && replicas.includes(leader) ? leader : null,
        ...(size === undefined ? {} : { sizeBytes: size })
      }
    })
    return {
      coordinatorEpoch: state.coordinatorEpoch,
      servers: [
        ...registered.map((s) => ({ id: s.id, ...(s.rack === undefined ? {} : { rack: s.rack }) })),
        ...[...absent].sort((a, b) => a - b).map((id) => ({ id, tags: ["excluded" as const] }))
      ],
      tablets: modelled,
      sizesMissing
    }
  })

/** A rebalance request to the leading coordinator's rebalance service: the status after it. */
const rebalance = (
  endpoint: ControllerEndpoint,
  request: RebalanceRequest
): Effect.Effect<RebalanceService.Status, NotController | RebalanceService.RebalanceCommandError> =>
  Effect.gen(function* () {
    const service = endpoint.rebalance === undefined ? undefined : yield* endpoint.rebalance
    if (service === undefined)
      return yield* new NotController({ detail: "this coordinator leads but runs no rebalance service (yet)" })
    switch (request.action) {
      case "start":
        yield* service.start(request.goals === undefined ? {} : { goals: request.goals })
        break
      case "pause":
        yield* service.pause
        break
      case "resume":
        yield* service.resume
        break
      case "cancel":
        yield* service.cancel
        break
      case "status":
        break
    }
    return yield* service.status
  })

/**
 * Serves `endpoint`'s controller on `listen` until the scope closes, over TLS when `tls` is given (a coordinator that
 * does not lead answers `NotController`); the address bound.
 *
 * @since 0.1.0
 */
export const serveController = (
  listen: Address,
  endpoint: ControllerEndpoint,
  tls?: Tls.TlsOptions
): Effect.Effect<Address, ListenFailed, Scope.Scope> =>
  Effect.flatMap(ControllerRpcs.toHandlers(controllerHandlers(endpoint)), (handlers) =>
    serveGroup(ControllerRpcs, handlers, listen, tls)
  )

/**
 * `ControllerRpcs` answered from `endpoint` (what `serveController` serves; an in-memory network serves them too).
 *
 * @since 0.1.0
 */
export const controllerHandlers = (endpoint: ControllerEndpoint): ControllerHandlers => {
  const leader = endpoint.leader ?? Effect.succeed(undefined)
  const controller = Effect.flatMap(endpoint.current, (c) =>
    c === undefined
      ? Effect.flatMap(leader, (at) =>
          Effect.fail(
            new NotController({
              detail: "this coordinator does not lead",
              ...(at === undefined ? {} : { leader: at })
            })
          )
        )
      : Effect.succeed(c)
  )
  const resigned = (e: { readonly message: string }) => new NotController({ detail: e.message })
  return {
    AdjustIsr: (request) => Effect.flatMap(controller, (c) => Effect.mapError(c.adjustIsr(request), resigned)),
    ControlledShutdown: ({ server }) =>
      Effect.flatMap(controller, (c) => Effect.mapError(c.controlledShutdown(server), resigned)),
    CreateTable: (request) => Effect.flatMap(controller, (c) => createTable(c, endpoint, request)),
    Metadata: ({ table }) =>
      Effect.flatMap(controller, (c) =>
        Effect.zipWith(c.state, endpoint.servers, (state, servers) => metadataOf(state, servers, table))
      ),
    BalanceLeaders: ({ tablets }) =>
      Effect.flatMap(controller, (c) =>
        Effect.mapError(tablets === undefined ? c.balanceLeaders : c.electPreferred(tablets), resigned)
      ),
    InitProducerId: () => Effect.flatMap(controller, (c) => Effect.mapError(c.initProducerId, resigned)),
    ReplicaStorage: (report) => Effect.flatMap(controller, (c) => Effect.mapError(c.replicaStorage(report), resigned)),
    DeleteTable: ({ table }) => Effect.flatMap(controller, (c) => deleteTable(c, table)),
    Reassign: ({ tablet, replicas, throttleBytesPerSec }) =>
      Effect.flatMap(controller, (c) =>
        Effect.flatMap(Effect.mapError(c.reassign(tablet, replicas, { throttleBytesPerSec }), resigned), moved)
      ),
    CancelReassign: ({ tablet }) =>
      Effect.flatMap(controller, (c) => Effect.flatMap(Effect.mapError(c.cancelReassign(tablet), resigned), moved)),
    ClusterModel: (request) => Effect.flatMap(controller, (c) => clusterModel(c, endpoint, request)),
    Rebalance: (request) => Effect.flatMap(controller, () => rebalance(endpoint, request))
  }
}
