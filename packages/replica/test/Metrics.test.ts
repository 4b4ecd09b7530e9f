import { assert, describe, it } from "@effect/vitest"
import { MemoryCoordination } from "@strata/core"
import { Effect, Metric } from "effect"
import * as ControllerMetrics from "../src/server/ControllerMetrics.js"
import * as ControllerState from "../src/machines/ControllerState.js"
import * as LocalCluster from "../src/node/LocalCluster.js"
import * as ServerMetrics from "../src/server/ServerMetrics.js"
import { quickReplication } from "./support/servers.js"

const tablet = (bucket: number) => ({ table: "t", bucket })

const enc = new TextEncoder()
const records = (count: number) =>
  Array.from({ length: count }, (_, i) => ({ key: null, value: enc.encode(`r${i}`), headers: [], timestamp: 0 }))

/** The one sample of `name` whose attributes include `attributes`, or `undefined` when there is none. */
const sampleOf = (name: string, attributes: Readonly<Record<string, string>>) =>
  Effect.map(Metric.snapshot, (all) => {
    const found = all.filter(
      (s) => s.id === name && Object.entries(attributes).every(([k, v]) => s.attributes?.[k] === v)
    )
    if (found.length > 1) throw new Error(`${found.length} series of ${name} ${JSON.stringify(attributes)}`)
    return found[0]?.state as { readonly value?: number; readonly count?: number } | undefined
  })

describe("ServerMetrics", () => {
  it("totals count leaders, under-replicated, under and at the minimum ISR, and replicas not loaded", () => {
    const t = ServerMetrics.totals(
      [
        { tablet: tablet(0), replicas: 3, online: true, isr: 3, producers: 2 },
        { tablet: tablet(1), replicas: 3, online: true, isr: 2, producers: 1 },
        { tablet: tablet(2), replicas: 3, online: true, isr: 1 },
        { tablet: tablet(3), replicas: 3, online: true, highWatermark: 4, logEndOffset: 5 },
        { tablet: tablet(4), replicas: 3, online: false }
      ],
      2
    )
    assert.deepStrictEqual(t, {
      leaders: 3,
      replicas: 5,
      underReplicated: 2,
      underMinIsr: 1,
      atMinIsr: 1,
      offline: 1,
      producers: 3
    })
  })

  it("an ISR change is a shrink, an expansion, both or neither", () => {
    assert.deepStrictEqual(ServerMetrics.isrChange([1, 2, 3], [1, 2]), { shrunk: true, expanded: false })
    assert.deepStrictEqual(ServerMetrics.isrChange([1, 2], [1, 2, 3]), { shrunk: false, expanded: true })
    assert.deepStrictEqual(ServerMetrics.isrChange([1, 2], [1, 3]), { shrunk: true, expanded: true })
    assert.deepStrictEqual(ServerMetrics.isrChange([1, 2], [2, 1]), { shrunk: false, expanded: false })
  })

  it.effect("refresh sets each tablet's series; a tablet no longer hosted loses them", () =>
    Effect.gen(function* () {
      const metrics = ServerMetrics.make(9)
      yield* metrics.refresh(
        [
          { tablet: tablet(0), replicas: 3, online: true, isr: 3, highWatermark: 5, logEndOffset: 6 },
          { tablet: tablet(1), replicas: 3, online: true, highWatermark: 2, logEndOffset: 2 }
        ],
        2
      )
      const at = (bucket: number) => ({ server: "9", table: "t", bucket: String(bucket) })
      assert.strictEqual((yield* sampleOf("strata_tablet_high_watermark", at(0)))?.value, 5)
      assert.strictEqual((yield* sampleOf("strata_tablet_log_end_offset", at(1)))?.value, 2)
      assert.isUndefined(yield* sampleOf("strata_tablet_isr_count", at(1)), "a follower has no ISR series")
      yield* metrics.refresh([{ tablet: tablet(1), replicas: 3, online: true, isr: 2 }], 2)
      assert.isUndefined(yield* sampleOf("strata_tablet_high_watermark", at(0)))
      assert.isUndefined(yield* sampleOf("strata_tablet_isr_count", at(0)))
      assert.strictEqual((yield* sampleOf("strata_tablet_isr_count", at(1)))?.value, 2)
      assert.strictEqual((yield* sampleOf("strata_server_under_replicated_tablets", { server: "9" }))?.value, 1)
      assert.strictEqual((yield* sampleOf("strata_server_at_min_isr_tablets", { server: "9" }))?.value, 1)
    }).pipe(Effect.provideService(Metric.MetricRegistry, new Map()))
  )

  it.live(
    "a cluster's servers report their tablets, appends and ISR changes",
    () =>
      Effect.gen(function* () {
        const cluster = yield* LocalCluster.make({ servers: 3, replication: quickReplication })
        yield* cluster.createTable("t", { buckets: 2 })
        const first = yield* cluster.awaitTablet(tablet(0), (t) => t.leaderAndIsr.isr.length === 3)
        yield* cluster.awaitTablet(tablet(1), (t) => t.leaderAndIsr.isr.length === 3)
        yield* cluster.append(tablet(0), records(10))
        const leader = first.leaderAndIsr.leader!
        const server = yield* cluster.server(leader)
        yield* server.refreshMetrics
        const at = { server: String(leader), table: "t", bucket: "0" }
        assert.strictEqual((yield* sampleOf("strata_tablet_isr_count", at))?.value, 3)
        assert.strictEqual((yield* sampleOf("strata_tablet_log_end_offset", at))?.value, 10)
        assert.strictEqual((yield* sampleOf("strata_server_replica_count", { server: String(leader) }))?.value, 2)
        assert.strictEqual((yield* sampleOf("strata_server_records_in_total", { server: String(leader) }))?.count, 10)
        assert.strictEqual(
          (yield* sampleOf("strata_server_append_latency_seconds", { server: String(leader) }))?.count,
          1
        )
        // A follower stops: the leader's ISR shrinks once it lags, and the tablet is under-replicated.
        const follower = first.replicas.find((s) => s !== leader)!
        yield* cluster.stopServer(follower)
        yield* cluster.awaitTablet(tablet(0), (t) => !t.leaderAndIsr.isr.includes(follower))
        yield* server.refreshMetrics
        assert.isAtLeast(
          (yield* sampleOf("strata_server_isr_shrinks_total", { server: String(leader) }))?.count ?? 0,
          1
        )
        assert.strictEqual((yield* sampleOf("strata_tablet_isr_count", at))?.value, 2)
        assert.isAtLeast(
          (yield* sampleOf("strata_server_under_replicated_tablets", { server: String(leader) }))?.value ?? 0,
          1
        )
        // The servers' series are in the process's registry (requests are served on fibers of their own).
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer())),
    30_000
  )
})

describe("ControllerMetrics", () => {
  const options = { uncleanLeaderElection: false, minInsyncReplicas: 2 }
  const state = (
    tablets: ReadonlyArray<ControllerState.Tablet>,
    live: ReadonlyArray<number>
  ): ControllerState.State => ({
    ...ControllerState.make(options),
    live: new Set(live),
    tablets: new Map(tablets.map((t) => [`${t.tablet.table}/${t.tablet.bucket}`, t]))
  })
  const tabletWith = (
    bucket: number,
    replicas: ReadonlyArray<number>,
    leader: number | null,
    isr: ReadonlyArray<number>,
    more: Partial<ControllerState.Tablet> = {}
  ): ControllerState.Tablet => ({
    tablet: tablet(bucket),
    replicas,
    state: leader === null ? "OfflineTablet" : "OnlineTablet",
    leaderAndIsr: { leader, leaderEpoch: 1, isr, coordinatorEpoch: 1, version: 1 },
    ...more
  })

  it("figures: the distribution per server (live ones with nothing included), offline, under-replicated, moving", () => {
    const f = ControllerMetrics.figures(
      state(
        [
          tabletWith(0, [1, 2, 3], 1, [1, 2, 3]),
          tabletWith(1, [2, 3, 1], 2, [2, 3]),
          tabletWith(2, [3, 1, 2], null, [3]),
          tabletWith(3, [1, 2, 3], 1, [1, 2, 3], { state: "DeletingTablet" })
        ],
        [1, 2, 3, 4]
      )
    )
    assert.strictEqual(f.tablets, 3)
    assert.strictEqual(f.offline, 1)
    assert.strictEqual(f.underReplicated, 2)
    assert.strictEqual(f.underMinIsr, 1)
    assert.strictEqual(f.liveServers, 4)
    assert.deepStrictEqual(Object.fromEntries(f.distribution), {
      1: { replicas: 3, leaders: 1 },
      2: { replicas: 3, leaders: 1 },
      3: { replicas: 3, leaders: 0 },
      4: { replicas: 0, leaders: 0 }
    })
  })

  it("an election is clean from the ISR, eligible from the eligible replicas, unclean otherwise; a rewrite is none", () => {
    const before = tabletWith(0, [1, 2, 3], 1, [1, 2], { eligible: [3] })
    const elected = (leader: number) => ({
      ...before,
      leaderAndIsr: { ...before.leaderAndIsr, leader, leaderEpoch: 2, isr: [leader] }
    })
    assert.strictEqual(ControllerMetrics.electionOf(before, elected(2)), "clean")
    assert.strictEqual(ControllerMetrics.electionOf(before, elected(3)), "eligible")
    assert.strictEqual(ControllerMetrics.electionOf(tabletWith(0, [1, 2, 3], 1, [1]), elected(3)), "unclean")
    assert.strictEqual(
      ControllerMetrics.electionOf(before, { ...before, leaderAndIsr: { ...before.leaderAndIsr, isr: [1] } }),
      undefined
    )
    assert.strictEqual(ControllerMetrics.electionOf(undefined, before), "clean")
  })

  it.effect("refresh: a standby reports not active and no distribution; a server gone loses its series", () =>
    Effect.gen(function* () {
      const metrics = ControllerMetrics.make(7)
      yield* metrics.refresh(state([tabletWith(0, [1, 2], 1, [1, 2])], [1, 2]))
      assert.strictEqual((yield* sampleOf("strata_controller_active", { coordinator: "7" }))?.value, 1)
      assert.strictEqual(
        (yield* sampleOf("strata_controller_tablet_distribution", { coordinator: "7", server: "2", kind: "replicas" }))
          ?.value,
        1
      )
      yield* metrics.refresh(state([tabletWith(0, [1], 1, [1])], [1]))
      assert.isUndefined(
        yield* sampleOf("strata_controller_tablet_distribution", { coordinator: "7", server: "2", kind: "replicas" })
      )
      yield* metrics.refresh(undefined)
      assert.strictEqual((yield* sampleOf("strata_controller_active", { coordinator: "7" }))?.value, 0)
      assert.isUndefined(yield* sampleOf("strata_controller_tablets", { coordinator: "7" }))
      assert.isUndefined(
        yield* sampleOf("strata_controller_tablet_distribution", { coordinator: "7", server: "1", kind: "leaders" })
      )
    }).pipe(Effect.provideService(Metric.MetricRegistry, new Map()))
  )
})
