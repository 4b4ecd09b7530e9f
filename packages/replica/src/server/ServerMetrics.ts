/**
 * A tablet server's metrics, named as operators of Kafka and Fluss know them and in Prometheus's base units (seconds,
 * bytes). Every series carries the server's id (`server`); a tablet's also its `table` and `bucket`.
 *
 * | name | type | meaning |
 * | --- | --- | --- |
 * | `strata_tablet_isr_count` | gauge | a tablet this server leads: its committed ISR's size |
 * | `strata_tablet_high_watermark` | gauge | the tablet's high watermark on this replica |
 * | `strata_tablet_log_end_offset` | gauge | the tablet's log end on this replica |
 * | `strata_server_leader_count` | gauge | tablets this server leads |
 * | `strata_server_replica_count` | gauge | replicas this server hosts |
 * | `strata_server_under_replicated_tablets` | gauge | tablets it leads whose ISR is smaller than their replicas |
 * | `strata_server_under_min_isr_tablets` | gauge | tablets it leads whose ISR is below `minInsyncReplicas` |
 * | `strata_server_at_min_isr_tablets` | gauge | tablets it leads whose ISR is exactly `minInsyncReplicas` |
 * | `strata_server_offline_replicas` | gauge | replicas whose log is not open (storage failed, or loading) |
 * | `strata_server_producer_count` | gauge | idempotent producers the logs of the tablets it leads know |
 * | `strata_server_replication_throttle_bytes_per_second` | gauge | the rate its throttled follower fetches (replicas a move adds) share; 0: none |
 * | `strata_server_isr_shrinks_total` | counter | committed ISR changes that removed members, on tablets it leads |
 * | `strata_server_isr_expands_total` | counter | committed ISR changes that added members |
 * | `strata_server_append_latency_seconds` | histogram | an append from its arrival to its answer (acks=all: the HW passing it) |
 * | `strata_server_fetch_latency_seconds` | histogram | a follower's fetch, its long-poll wait included |
 * | `strata_server_bytes_in_total` | counter | record bytes (keys, values, headers) appended as leader |
 * | `strata_server_records_in_total` | counter | records appended as leader |
 * | `strata_server_bytes_out_total` | counter | record bytes served to followers and readers |
 *
 * The gauges are set from the server's replicas when the metrics are read (`refresh`, before a scrape), so no append
 * or fetch pays for them; a tablet no longer hosted loses its series then.
 *
 * @since 0.1.0
 */
import type { Models } from "@strata/core"
import { Effect, Metric } from "effect"

/**
 * The metrics (without the `server` attribute `make` adds).
 *
 * @since 0.1.0
 */
export const metrics = {
  isrCount: Metric.gauge("strata_tablet_isr_count", {
    description: "A tablet this server leads: its committed ISR's size"
  }),
  highWatermark: Metric.gauge("strata_tablet_high_watermark", {
    description: "The tablet's high watermark on this replica"
  }),
  logEndOffset: Metric.gauge("strata_tablet_log_end_offset", {
    description: "The tablet's log end offset on this replica"
  }),
  leaderCount: Metric.gauge("strata_server_leader_count", { description: "Tablets this server leads" }),
  replicaCount: Metric.gauge("strata_server_replica_count", { description: "Replicas this server hosts" }),
  underReplicated: Metric.gauge("strata_server_under_replicated_tablets", {
    description: "Tablets this server leads whose ISR is smaller than their replicas"
  }),
  underMinIsr: Metric.gauge("strata_server_under_min_isr_tablets", {
    description: "Tablets this server leads whose ISR is below minInsyncReplicas (acks=all appends refused)"
  }),
  atMinIsr: Metric.gauge("strata_server_at_min_isr_tablets", {
    description: "Tablets this server leads whose ISR is exactly minInsyncReplicas (one more loss refuses appends)"
  }),
  offlineReplicas: Metric.gauge("strata_server_offline_replicas", {
    description: "Replicas hosted here whose log is not open (its storage failed, or it is loading)"
  }),
  producerCount: Metric.gauge("strata_server_producer_count", {
    description: "Idempotent producers known to the logs of the tablets this server leads"
  }),
  replicationThrottle: Metric.gauge("strata_server_replication_throttle_bytes_per_second", {
    description:
      "The rate, in record bytes a second, the follower fetches of the replicas a move adds here share (0: none throttled)"
  }),
  isrShrinks: Metric.counter("strata_server_isr_shrinks_total", {
    description: "Committed ISR changes that removed members, on tablets this server leads",
    incremental: true
  }),
  isrExpands: Metric.counter("strata_server_isr_expands_total", {
    description: "Committed ISR changes that added members, on tablets this server leads",
    incremental: true
  }),
  appendLatency: Metric.histogram("strata_server_append_latency_seconds", {
    description: "An append from its arrival to its answer (acks=all: until the high watermark passed it)",
    boundaries: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
  }),
  fetchLatency: Metric.histogram("strata_server_fetch_latency_seconds", {
    description: "A follower's fetch from its arrival to its answer, the long-poll wait included",
    boundaries: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
  }),
  bytesIn: Metric.counter("strata_server_bytes_in_total", {
    description: "Record bytes (keys, values, headers) appended here as leader",
    incremental: true
  }),
  recordsIn: Metric.counter("strata_server_records_in_total", {
    description: "Records appended here as leader",
    incremental: true
  }),
  bytesOut: Metric.counter("strata_server_bytes_out_total", {
    description: "Record bytes served to followers and readers",
    incremental: true
  })
} as const

/**
 * One hosted replica as the metrics see it.
 *
 * @since 0.1.0
 */
export interface ReplicaSample {
  readonly tablet: Models.TabletId
  /** Its replicas, as the last instruction named them. */
  readonly replicas: number
  /** Whether its log is open. */
  readonly online: boolean
  /** Its committed ISR's size while this server leads it. */
  readonly isr?: number | undefined
  readonly highWatermark?: number | undefined
  readonly logEndOffset?: number | undefined
  /** Idempotent producers its log knows, while this server leads it. */
  readonly producers?: number | undefined
}

/**
 * The per-server figures of a set of replicas.
 *
 * @since 0.1.0
 */
export interface Totals {
  readonly leaders: number
  readonly replicas: number
  readonly underReplicated: number
  readonly underMinIsr: number
  readonly atMinIsr: number
  readonly offline: number
  readonly producers: number
}

/**
 * The per-server figures of `samples` (a pure function), with `minInsyncReplicas` as the cluster sets it.
 *
 * @since 0.1.0
 */
export const totals = (samples: ReadonlyArray<ReplicaSample>, minInsyncReplicas: number): Totals => {
  let leaders = 0
  let underReplicated = 0
  let underMinIsr = 0
  let atMinIsr = 0
  let offline = 0
  let producers = 0
  for (const s of samples) {
    if (!s.online) offline++
    if (s.isr === undefined) continue
    leaders++
    producers += s.producers ?? 0
    if (s.isr < s.replicas) underReplicated++
    if (s.isr < minInsyncReplicas) underMinIsr++
    else if (s.isr === minInsyncReplicas) atMinIsr++
  }
  return { leaders, replicas: samples.length, underReplicated, underMinIsr, atMinIsr, offline, producers }
}

/**
 * Whether a committed ISR change removed members (a shrink), added some (an expansion), both, or neither.
 *
 * @since 0.1.0
 */
export const isrChange = (
  before: ReadonlyArray<Models.ServerId>,
  after: ReadonlyArray<Models.ServerId>
): { readonly shrunk: boolean; readonly expanded: boolean } => ({
  shrunk: before.some((s) => !after.includes(s)),
  expanded: after.some((s) => !before.includes(s))
})

/**
 * A server's metrics, its id bound as the `server` attribute.
 *
 * @since 0.1.0
 */
export interface ServerMetrics {
  /** An append served as leader: its records, their bytes, and how long it took. */
  readonly appended: (records: number, bytes: number, seconds: number) => Effect.Effect<void>
  /** A follower's fetch served: the bytes it carried and how long it took. */
  readonly fetched: (bytes: number, seconds: number) => Effect.Effect<void>
  /** Record bytes a client's read carried. */
  readonly read: (bytes: number) => Effect.Effect<void>
  /** A committed ISR change on a tablet this server leads. */
  readonly isrChanged: (
    before: ReadonlyArray<Models.ServerId>,
    after: ReadonlyArray<Models.ServerId>
  ) => Effect.Effect<void>
  /**
   * Sets the gauges from the replicas now, and the replication throttle's rate (0, the default: none); a tablet no
   * longer among them loses its series.
   */
  readonly refresh: (
    samples: ReadonlyArray<ReplicaSample>,
    minInsyncReplicas: number,
    throttleBytesPerSecond?: number
  ) => Effect.Effect<void>
}

/** The bytes of records as the metrics count them: keys, values and headers. */
export const recordBytes = (
  records: ReadonlyArray<{
    readonly key: Uint8Array | null
    readonly value: Uint8Array
    readonly headers: ReadonlyArray<{ readonly key: string; readonly value: Uint8Array }>
  }>
): number => {
  let bytes = 0
  for (const r of records) {
    bytes += r.value.byteLength + (r.key?.byteLength ?? 0)
    for (const h of r.headers) bytes += h.key.length + h.value.byteLength
  }
  return bytes
}

/**
 * The metrics of server `serverId`.
 *
 * @since 0.1.0
 */
export const make = (serverId: Models.ServerId): ServerMetrics => {
  const server = { server: String(serverId) }
  const bound = <M extends Metric.Metric<number, unknown>>(m: M): M => Metric.withAttributes(m, server) as M
  const m = {
    leaderCount: bound(metrics.leaderCount),
    replicaCount: bound(metrics.replicaCount),
    underReplicated: bound(metrics.underReplicated),
    underMinIsr: bound(metrics.underMinIsr),
    atMinIsr: bound(metrics.atMinIsr),
    offlineReplicas: bound(metrics.offlineReplicas),
    producerCount: bound(metrics.producerCount),
    replicationThrottle: bound(metrics.replicationThrottle),
    isrShrinks: bound(metrics.isrShrinks),
    isrExpands: bound(metrics.isrExpands),
    appendLatency: bound(metrics.appendLatency),
    fetchLatency: bound(metrics.fetchLatency),
    bytesIn: bound(metrics.bytesIn),
    recordsIn: bound(metrics.recordsIn),
    bytesOut: bound(metrics.bytesOut)
  }
  // The tablets whose series were last set, by key: those gone since are removed.
  let reported = new Map<string, Readonly<Record<string, string>>>()
  const perTablet = [metrics.isrCount, metrics.highWatermark, metrics.logEndOffset] as const
  return {
    appended: (records, bytes, seconds) =>
      Effect.all(
        [Metric.update(m.appendLatency, seconds), Metric.update(m.bytesIn, bytes), Metric.update(m.recordsIn, records)],
        {
          discard: true
        }
      ),
    fetched: (bytes, seconds) =>
      Effect.andThen(Metric.update(m.fetchLatency, seconds), Metric.update(m.bytesOut, bytes)),
    read: (bytes) => Metric.update(m.bytesOut, bytes),
    isrChanged: (before, after) => {
      const change = isrChange(before, after)
      return Effect.andThen(
        change.shrunk ? Metric.update(m.isrShrinks, 1) : Effect.void,
        change.expanded ? Metric.update(m.isrExpands, 1) : Effect.void
      )
    },
    refresh: (samples, minInsyncReplicas, throttleBytesPerSecond = 0) =>
      Effect.gen(function* () {
        yield* Metric.update(m.replicationThrottle, throttleBytesPerSecond)
        const t = totals(samples, minInsyncReplicas)
        yield* Metric.update(m.leaderCount, t.leaders)
        yield* Metric.update(m.replicaCount, t.replicas)
        yield* Metric.update(m.underReplicated, t.underReplicated)
        yield* Metric.update(m.underMinIsr, t.underMinIsr)
        yield* Metric.update(m.atMinIsr, t.atMinIsr)
        yield* Metric.update(m.offlineReplicas, t.offline)
        yield* Metric.update(m.producerCount, t.producers)
        const now = new Map<string, Readonly<Record<string, string>>>()
        for (const s of samples) {
          const attributes = { ...server, table: s.tablet.table, bucket: String(s.tablet.bucket) }
          now.set(`${s.tablet.table}\u0000${s.tablet.bucket}`, attributes)
          const values = [s.isr, s.highWatermark, s.logEndOffset] as const
          for (let i = 0; i < perTablet.length; i++) {
            const metric = Metric.withAttributes(perTablet[i]!, attributes)
            const value = values[i]
            yield* value === undefined ? Metric.remove(metric) : Metric.update(metric, value)
          }
        }
        for (const [key, attributes] of reported) {
          if (now.has(key)) continue
          for (const metric of perTablet) yield* Metric.remove(Metric.withAttributes(metric, attributes))
        }
        reported = now
      })
  }
}
