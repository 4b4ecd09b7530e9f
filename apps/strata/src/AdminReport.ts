/**
 * An operator's commands' parts that decide nothing about the cluster: the tables of the controller's metadata
 * (`strata tablets list`), which tablets are unhealthy (`strata tablets describe --under-replicated | --unavailable |
 * --under-min-isr`, `strata cluster status`'s counts), and the lines an operator reads.
 *
 * A tablet being deleted is left out of every health figure: it serves nothing any more.
 *
 * @since 0.1.0
 */
import type { Models } from "@strata/core"
import type { ReplicaRpc } from "@strata/replica"

/**
 * How a command prints: lines for an operator, or one JSON value.
 *
 * @since 0.1.0
 */
export type Output = "text" | "json"

/** A tablet as the controller describes it. */
type Tablet = typeof ReplicaRpc.TabletMetadata.Type

/** A registered tablet server as the controller describes it. */
type Server = typeof ReplicaRpc.ServerMetadata.Type

/**
 * A tablet as `strata tablets` names it.
 *
 * @since 0.1.0
 */
export const tabletName = (t: Models.TabletId): string => `${t.table}:${t.bucket}`

/**
 * A tablet's line in `strata tablets describe`: while it moves, the replicas it moves to (`target`); servers a move
 * took out that have not yet deleted their replica (`retired`).
 *
 * @since 0.1.0
 */
export const tabletLine = (t: Tablet): string =>
  [
    `${tabletName(t.tablet)}\t${t.state}\tleader ${t.leader ?? "none"}\tepoch ${t.leaderEpoch}\treplicas ${t.replicas.join(",")}\tisr ${t.isr.join(",")}`,
    ...(t.target === undefined ? [] : [`target ${t.target.join(",")}`]),
    ...(t.retired === undefined || t.retired.length === 0 ? [] : [`retired ${t.retired.join(",")}`])
  ].join("\t")

/**
 * A registered server's line.
 *
 * @since 0.1.0
 */
export const serverLine = (s: Server): string =>
  `server ${s.id}\t${s.address}${s.dataAddress === undefined ? "" : `\tdata link ${s.dataAddress}`}${s.rack === undefined ? "" : `\track ${s.rack}`}`

/**
 * A table as `strata tablets list` shows it.
 *
 * @since 0.1.0
 */
export interface TableSummary {
  readonly name: string
  /** How many tablets it has. */
  readonly tablets: number
  /** The most replicas any of its tablets has (a moving tablet counted by the replicas it moves to). */
  readonly replicationFactor: number
  /** Every tablet of it is being deleted. */
  readonly deleting: boolean
  /** Its retention, when it was created with one: how long (`ms`) and how much (`bytes`) each replica keeps. */
  readonly retention?: { readonly ms?: number | undefined; readonly bytes?: number | undefined }
}

/**
 * The tables of the metadata's tablets, by name.
 *
 * @since 0.1.0
 */
export const tables = (metadata: ReplicaRpc.Metadata): ReadonlyArray<TableSummary> => {
  const byName = new Map<string, Array<Tablet>>()
  for (const t of metadata.tablets) {
    const list = byName.get(t.tablet.table)
    if (list === undefined) byName.set(t.tablet.table, [t])
    else list.push(t)
  }
  return [...byName.entries()]
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([name, list]) => {
      // Every tablet of a table has the table's retention.
      const retention = list.find((t) => t.retention !== undefined)?.retention
      return {
        name,
        tablets: list.length,
        replicationFactor: Math.max(...list.map(replicationFactorOf)),
        deleting: list.every((t) => t.state === "DeletingTablet"),
        ...(retention === undefined ? {} : { retention })
      }
    })
}

/**
 * `strata tablets list`'s lines: name, tablets and replication factor, then the retention a table has
 * (`retention-ms`, `retention-bytes`), tab-separated (`deleting` after a table being deleted).
 *
 * @since 0.1.0
 */
export const tableLines = (summaries: ReadonlyArray<TableSummary>): ReadonlyArray<string> =>
  summaries.map((s) =>
    [
      s.name,
      `tablets ${s.tablets}`,
      `rf ${s.replicationFactor}`,
      ...(s.retention?.ms === undefined ? [] : [`retention-ms ${s.retention.ms}`]),
      ...(s.retention?.bytes === undefined ? [] : [`retention-bytes ${s.retention.bytes}`]),
      ...(s.deleting ? ["deleting"] : [])
    ].join("\t")
  )

/** The replicas a tablet has once any move is done. */
const replicationFactorOf = (t: Tablet): number => (t.target ?? t.replicas).length

/**
 * What `strata tablets describe` can be narrowed to (one at a time): tablets whose ISR is smaller than their
 * replicas (for a moving tablet, than the replicas it moves to), tablets without a leader, or tablets whose ISR is
 * below `minInsyncReplicas` (acks=all appends to them fail).
 *
 * @since 0.1.0
 */
export type TabletFilter = "under-replicated" | "unavailable" | "under-min-isr"

/**
 * The filters, as their flags name them.
 *
 * @since 0.1.0
 */
export const tabletFilters: ReadonlyArray<TabletFilter> = ["under-replicated", "unavailable", "under-min-isr"]

/**
 * Whether `filter` selects tablet `t`, the cluster's `minInsyncReplicas` being `minInsyncReplicas`. A tablet being
 * deleted is never selected.
 *
 * @since 0.1.0
 */
export const selects = (filter: TabletFilter, minInsyncReplicas: number, t: Tablet): boolean => {
  if (t.state === "DeletingTablet") return false
  switch (filter) {
    case "under-replicated":
      return t.isr.length < replicationFactorOf(t)
    case "unavailable":
      return t.leader === null
    case "under-min-isr":
      return t.isr.length < minInsyncReplicas
  }
}

/**
 * The tablets' health in figures.
 *
 * @since 0.1.0
 */
export interface TabletCounts {
  /** Every tablet the controller holds, those being deleted included. */
  readonly total: number
  /** Without a leader. */
  readonly offline: number
  readonly underReplicated: number
  readonly underMinIsr: number
  readonly deleting: number
}

/**
 * The figures of `tablets`.
 *
 * @since 0.1.0
 */
export const counts = (tablets: ReadonlyArray<Tablet>, minInsyncReplicas: number): TabletCounts => {
  const count = (filter: TabletFilter) => tablets.filter((t) => selects(filter, minInsyncReplicas, t)).length
  return {
    total: tablets.length,
    offline: count("unavailable"),
    underReplicated: count("under-replicated"),
    underMinIsr: count("under-min-isr"),
    deleting: tablets.filter((t) => t.state === "DeletingTablet").length
  }
}

/**
 * A registered coordinator.
 *
 * @since 0.1.0
 */
export interface CoordinatorStatus {
  readonly id: number
  readonly address: string
  /** It is the coordinator the election's leader node names. */
  readonly leader: boolean
}

/**
 * `strata cluster status`: the registered coordinators and the one that leads (with its coordinator epoch), the live
 * (registered) tablet servers, the servers the tablets name that are not registered (`down`), and the tablets'
 * figures. With no coordinator leading, `down` and `tablets` are unknown (`null`).
 *
 * @since 0.1.0
 */
export interface ClusterStatus {
  readonly coordinators: ReadonlyArray<CoordinatorStatus>
  readonly leader: { readonly id: number; readonly epoch: number; readonly address: string } | null
  readonly servers: ReadonlyArray<Server>
  readonly down: ReadonlyArray<number> | null
  /** The `minInsyncReplicas` the under-min-ISR figure is counted against. */
  readonly minInsyncReplicas: number
  readonly tablets: TabletCounts | null
}

/**
 * The servers named by the tablets' replicas (those being deleted left out) that are not among `servers`, by id.
 *
 * @since 0.1.0
 */
export const downServers = (
  tablets: ReadonlyArray<Tablet>,
  servers: ReadonlyArray<{ readonly id: number }>
): ReadonlyArray<number> => {
  const live = new Set(servers.map((s) => s.id))
  const named = new Set<number>()
  for (const t of tablets) if (t.state !== "DeletingTablet") for (const id of t.replicas) named.add(id)
  return [...named].filter((id) => !live.has(id)).sort((a, b) => a - b)
}

/**
 * `strata cluster status`'s lines: a heading line for the coordinators, the tablet servers and the tablets, each
 * followed by one line a coordinator or server, tab-separated.
 *
 * @since 0.1.0
 */
export const statusLines = (status: ClusterStatus): ReadonlyArray<string> => {
  const leads =
    status.leader === null ? "no leader" : `leader ${status.leader.id}\tcoordinator epoch ${status.leader.epoch}`
  const down =
    status.down === null
      ? ""
      : status.down.length === 0
        ? "\t0 down"
        : `\t${status.down.length} down (${status.down.join(",")})`
  const t = status.tablets
  return [
    `coordinators\t${status.coordinators.length} registered\t${leads}`,
    ...status.coordinators.map((c) => `coordinator ${c.id}\t${c.address}${c.leader ? "\tleader" : ""}`),
    `tablet servers\t${status.servers.length} live${down}`,
    ...status.servers.map(serverLine),
    t === null
      ? "tablets\tunknown: no coordinator leads"
      : `tablets\t${t.total}\toffline ${t.offline}\tunder-replicated ${t.underReplicated}\tunder min ISR ${t.underMinIsr} (minInsyncReplicas ${status.minInsyncReplicas})${t.deleting === 0 ? "" : `\tdeleting ${t.deleting}`}`
  ]
}
