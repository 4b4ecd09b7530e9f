/**
 * A coordinator's controller metrics, named as operators of Kafka and Fluss know them, in seconds. Every series
 * carries the coordinator's id (`coordinator`); only the leading coordinator reports the cluster's figures (a standby
 * reports `strata_controller_active 0` and no distribution), so summing a metric over the coordinators gives the
 * cluster's.
 *
 * | name | type | meaning |
 * | --- | --- | --- |
 * | `strata_controller_active` | gauge | 1 while this coordinator runs the controller, else 0 (Kafka's ActiveControllerCount) |
 * | `strata_controller_coordinator_epoch` | gauge | the coordinator epoch the controller runs under |
 * | `strata_controller_live_servers` | gauge | registered tablet servers |
 * | `strata_controller_tablets` | gauge | tablets the controller holds |
 * | `strata_controller_offline_tablets` | gauge | tablets with no leader |
 * | `strata_controller_under_replicated_tablets` | gauge | tablets whose ISR is smaller than their replicas |
 * | `strata_controller_under_min_isr_tablets` | gauge | tablets whose ISR is below `minInsyncReplicas` |
 * | `strata_controller_moving_tablets` | gauge | tablets whose replicas are being moved |
 * | `strata_controller_tablet_distribution` | gauge | per `server` and `kind` (`replicas`, `leaders`): how many it holds |
 * | `strata_controller_leader_elections_total` | counter | leaders chosen, by `kind`: `clean` (from the ISR), `eligible` (an eligible leader replica, KIP-966), `unclean` |
 * | `strata_controller_event_queue_time_seconds` | histogram | how long an input waited before the controller took it |
 * | `strata_controller_failover_seconds` | gauge | the last takeover: the election (from the predecessor gone) plus loading the tablets, until the controller took inputs |
 *
 * The gauges are set from the controller's state when the metrics are read (`refresh`).
 *
 * @since 0.1.0
 */
import { Models } from "@strata/core"
import { Effect, Metric } from "effect"
import type * as ControllerState from "../machines/ControllerState.js"

/**
 * The metrics (without the `coordinator` attribute `make` adds).
 *
 * @since 0.1.0
 */
export const metrics = {
  active: Metric.gauge("strata_controller_active", {
    description: "1 while this coordinator runs the controller, else 0"
  }),
  coordinatorEpoch: Metric.gauge("strata_controller_coordinator_epoch", {
    description: "The coordinator epoch the controller runs under (the leading coordinator's)"
  }),
  liveServers: Metric.gauge("strata_controller_live_servers", { description: "Registered tablet servers" }),
  tablets: Metric.gauge("strata_controller_tablets", { description: "Tablets the controller holds" }),
  offline: Metric.gauge("strata_controller_offline_tablets", { description: "Tablets with no leader" }),
  underReplicated: Metric.gauge("strata_controller_under_replicated_tablets", {
    description: "Tablets whose ISR is smaller than their replicas"
  }),
  underMinIsr: Metric.gauge("strata_controller_under_min_isr_tablets", {
    description: "Tablets whose ISR is below minInsyncReplicas"
  }),
  moving: Metric.gauge("strata_controller_moving_tablets", {
    description: "Tablets whose replicas are being moved (a reassignment under way)"
  }),
  distribution: Metric.gauge("strata_controller_tablet_distribution", {
    description: "Per server: the replicas (kind=replicas) and leaderships (kind=leaders) it holds"
  }),
  elections: Metric.counter("strata_controller_leader_elections_total", {
    description: "Leaders chosen, by kind: clean (from the ISR), eligible (an eligible leader replica), unclean",
    incremental: true
  }),
  queueTime: Metric.histogram("strata_controller_event_queue_time_seconds", {
    description: "How long an input waited in the controller's queue before it was taken",
    boundaries: [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10]
  }),
  failover: Metric.gauge("strata_controller_failover_seconds", {
    description:
      "The last takeover: the election (from the predecessor gone) plus loading the tablets, until the controller took inputs"
  })
} as const

/**
 * The cluster's figures as the controller holds them.
 *
 * @since 0.1.0
 */
export interface Figures {
  readonly coordinatorEpoch: number
  readonly liveServers: number
  readonly tablets: number
  readonly offline: number
  readonly underReplicated: number
  readonly underMinIsr: number
  readonly moving: number
  /** Per server (every live one, and any holding a replica): its replicas and leaderships. */
  readonly distribution: ReadonlyMap<Models.ServerId, { readonly replicas: number; readonly leaders: number }>
}

/**
 * The figures of a controller's state (a pure function). A deleting tablet counts in none of them.
 *
 * @since 0.1.0
 */
export const figures = (state: ControllerState.State): Figures => {
  const distribution = new Map<Models.ServerId, { replicas: number; leaders: number }>()
  for (const s of state.live) distribution.set(s, { replicas: 0, leaders: 0 })
  const at = (s: Models.ServerId) => {
    let d = distribution.get(s)
    if (d === undefined) {
      d = { replicas: 0, leaders: 0 }
      distribution.set(s, d)
    }
    return d
  }
  let tablets = 0
  let offline = 0
  let underReplicated = 0
  let underMinIsr = 0
  let moving = 0
  for (const t of state.tablets.values()) {
    if (t.state === "DeletingTablet") continue
    tablets++
    const { leader, isr } = t.leaderAndIsr
    if (leader === null) offline++
    else at(leader).leaders++
    for (const r of t.replicas) at(r).replicas++
    if (isr.length < t.replicas.length) underReplicated++
    if (isr.length < (state.options.minInsyncReplicas ?? 1)) underMinIsr++
    if (t.reassignment !== undefined) moving++
  }
  return {
    coordinatorEpoch: state.coordinatorEpoch,
    liveServers: state.live.size,
    tablets,
    offline,
    underReplicated,
    underMinIsr,
    moving,
    distribution
  }
}

/**
 * The kind of election a tablet's write makes, if it chooses a leader: a new leader or a new leader epoch with one.
 * `clean` when the leader comes from the ISR it had, `eligible` from its eligible leader replicas, `unclean` otherwise.
 *
 * @since 0.1.0
 */
export const electionOf = (
  before: ControllerState.Tablet | undefined,
  after: ControllerState.Tablet
): "clean" | "eligible" | "unclean" | undefined => {
  const leader = after.leaderAndIsr.leader
  if (leader === null) return undefined
  if (before === undefined) return "clean"
  const was = before.leaderAndIsr
  if (was.leader === leader && was.leaderEpoch === after.leaderAndIsr.leaderEpoch) return undefined
  if (was.isr.includes(leader)) return "clean"
  return before.eligible?.includes(leader) === true ? "eligible" : "unclean"
}

/**
 * A coordinator's controller metrics, its id bound as the `coordinator` attribute.
 *
 * @since 0.1.0
 */
export interface ControllerMetrics {
  /** A step's writes: each one choosing a leader counts as an election of its kind. */
  readonly stepped: (
    before: ControllerState.State,
    commands: ReadonlyArray<ControllerState.Command>
  ) => Effect.Effect<void>
  /** How long an input waited before it was taken. */
  readonly queued: (seconds: number) => Effect.Effect<void>
  /** A takeover took `seconds`. */
  readonly tookOver: (seconds: number) => Effect.Effect<void>
  /** Sets the gauges from the state of the controller this coordinator runs, or to a standby's when none. */
  readonly refresh: (state: ControllerState.State | undefined) => Effect.Effect<void>
}

/**
 * The controller metrics of coordinator `coordinatorId`.
 *
 * @since 0.1.0
 */
export const make = (coordinatorId: Models.ServerId): ControllerMetrics => {
  const own = { coordinator: String(coordinatorId) }
  const bound = <M extends Metric.Metric<number, unknown>>(m: M): M => Metric.withAttributes(m, own) as M
  const clusterWide = [
    [bound(metrics.coordinatorEpoch), (f: Figures) => f.coordinatorEpoch],
    [bound(metrics.liveServers), (f: Figures) => f.liveServers],
    [bound(metrics.tablets), (f: Figures) => f.tablets],
    [bound(metrics.offline), (f: Figures) => f.offline],
    [bound(metrics.underReplicated), (f: Figures) => f.underReplicated],
    [bound(metrics.underMinIsr), (f: Figures) => f.underMinIsr],
    [bound(metrics.moving), (f: Figures) => f.moving]
  ] as const
  const active = bound(metrics.active)
  const queueTime = bound(metrics.queueTime)
  const failover = bound(metrics.failover)
  const elections = {
    clean: Metric.withAttributes(metrics.elections, { ...own, kind: "clean" }),
    eligible: Metric.withAttributes(metrics.elections, { ...own, kind: "eligible" }),
    unclean: Metric.withAttributes(metrics.elections, { ...own, kind: "unclean" })
  }
  // The distribution's series last set, by `server kind`: those gone since are removed.
  let reported = new Map<string, Metric.Gauge<number>>()
  return {
    stepped: (before, commands) =>
      Effect.forEach(
        commands,
        (command) => {
          if (command._tag !== "Write") return Effect.void
          const kind = electionOf(before.tablets.get(Models.tabletKey(command.tablet.tablet)), command.tablet)
          return kind === undefined ? Effect.void : Metric.update(elections[kind], 1)
        },
        { discard: true }
      ),
    queued: (seconds) => Metric.update(queueTime, seconds),
    tookOver: (seconds) => Metric.update(failover, seconds),
    refresh: (state) =>
      Effect.gen(function* () {
        yield* Metric.update(active, state === undefined || state.resigned ? 0 : 1)
        const now = new Map<string, Metric.Gauge<number>>()
        if (state !== undefined && !state.resigned) {
          const f = figures(state)
          for (const [metric, value] of clusterWide) yield* Metric.update(metric, value(f))
          for (const [server, d] of f.distribution) {
            for (const kind of ["replicas", "leaders"] as const) {
              const gauge = Metric.withAttributes(metrics.distribution, { ...own, server: String(server), kind })
              now.set(`${server} ${kind}`, gauge)
              yield* Metric.update(gauge, d[kind])
            }
          }
        } else {
          for (const [metric] of clusterWide) yield* Metric.remove(metric)
        }
        for (const [key, gauge] of reported) if (!now.has(key)) yield* Metric.remove(gauge)
        reported = now
      })
  }
}
