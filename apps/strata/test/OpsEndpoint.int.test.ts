/**
 * The ops HTTP endpoint of real processes (a coordinator and three RocksDB tablet servers started with the CLI, on
 * ZooKeeper, logging JSON), scraped as Prometheus would: health and readiness, the servers' and the controller's
 * metrics checked against what the controller's metadata says (`tablets describe`), then a server killed with
 * SIGKILL (its tablets under-replicated, on the servers' and the controller's metrics) and started again (back to
 * 0, the ISR shrinks and expansions counted). With `OTEL_EXPORTER_OTLP_ENDPOINT` set, their spans reach an OTLP
 * collector.
 */
import { assert, describe, it } from "@effect/vitest"
import * as ZooKeeperCoordination from "@strata/election/zookeeper"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { Effect } from "effect"
import { inject } from "vitest"
import { client, cliProcesses, writeEach, zooKeeperCluster } from "./support/clusterTest.js"
import { all, eventually, getJson, opsAddress, type Sample, scrape, value } from "./support/opsScrape.js"

const processes = cliProcesses()

/** A span as the collector received it: its name and its process's `service.name`. */
interface ReceivedSpan {
  readonly name: string
  readonly service: string | undefined
}

/** An OTLP/JSON collector on loopback: the spans posted to `/v1/traces`. */
const startCollector = async () => {
  const received: Array<ReceivedSpan> = []
  const server = createServer((request, response) => {
    let body = ""
    request.on("data", (chunk: Buffer) => {
      body += chunk.toString()
    })
    request.on("end", () => {
      if (request.url === "/v1/traces") {
        const parsed = JSON.parse(body) as {
          resourceSpans?: ReadonlyArray<{
            resource?: { attributes?: ReadonlyArray<{ key: string; value: { stringValue?: string } }> }
            scopeSpans?: ReadonlyArray<{ spans?: ReadonlyArray<{ name: string }> }>
          }>
        }
        for (const rs of parsed.resourceSpans ?? []) {
          const service = rs.resource?.attributes?.find((a) => a.key === "service.name")?.value.stringValue
          for (const ss of rs.scopeSpans ?? [])
            for (const span of ss.spans ?? []) received.push({ name: span.name, service })
        }
      }
      response.writeHead(200, { "content-type": "application/json" }).end("{}")
    })
  })
  await new Promise<void>((done) => server.listen(0, "127.0.0.1", done))
  const { port } = server.address() as AddressInfo
  return {
    endpoint: `http://127.0.0.1:${port}`,
    spans: (): ReadonlyArray<ReceivedSpan> => received,
    close: () => new Promise<void>((done) => server.close(() => done()))
  }
}

const SERVERS = [1, 2, 3]
const COORDINATOR = 101
const TABLETS = 6

/** The sum of a metric's samples. */
const sum = (samples: ReadonlyArray<Sample>, name: string): number =>
  all(samples, name).reduce((acc, s) => acc + s.value, 0)

describe("the ops HTTP endpoint of real processes", () => {
  it.live(
    "/healthz, /readyz, /cluster and /metrics agree with the controller's metadata; a killed server's tablets show as under-replicated until it is back",
    () =>
      Effect.gen(function* () {
        // An OTLP collector: the processes send their spans here (OTLP/JSON over HTTP).
        const collector = yield* Effect.acquireRelease(Effect.promise(startCollector), (c) =>
          Effect.promise(() => c.close())
        )
        process.env.OTEL_EXPORTER_OTLP_ENDPOINT = collector.endpoint
        process.env.OTEL_BSP_SCHEDULE_DELAY = "200"
        const { cluster, namespace } = yield* zooKeeperCluster(processes, "ops", { logFormat: "json" }).pipe(
          Effect.ensuring(
            Effect.sync(() => {
              delete process.env.OTEL_EXPORTER_OTLP_ENDPOINT
              delete process.env.OTEL_BSP_SCHEDULE_DELAY
            })
          )
        )
        yield* cluster.start("coordinator", COORDINATOR)
        yield* Effect.forEach(SERVERS, (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
        const ops = (kind: "coordinator" | "tablet-server", id: number) =>
          Effect.promise(() => eventually(`${kind} ${id}'s ops endpoint`, async () => opsAddress(cluster, kind, id)))
        const coordinatorOps = yield* ops("coordinator", COORDINATOR)
        const serverOps = new Map<number, string>()
        for (const id of SERVERS) serverOps.set(id, yield* ops("tablet-server", id))

        // Every process alive and ready.
        for (const [kind, address] of [
          ["coordinator", coordinatorOps],
          ...SERVERS.map((id) => ["tablet-server", serverOps.get(id)!] as const)
        ] as const) {
          const health = yield* Effect.promise(() => getJson(address, "/healthz"))
          assert.strictEqual(health.status, 200, `${kind} /healthz: ${JSON.stringify(health.body)}`)
          assert.strictEqual(health.body.role, kind)
          const ready = yield* Effect.promise(() =>
            eventually(`${kind} ready`, async () => {
              const r = await getJson(address, "/readyz")
              return r.status === 200 ? r : undefined
            })
          )
          assert.strictEqual(ready.body.status, "ok")
        }

        const c = yield* client(namespace)
        const tablets = yield* c.createTable("ops", { buckets: TABLETS, replicationFactor: 3 })
        assert.strictEqual(tablets.length, TABLETS)
        const acked = yield* writeEach(
          c,
          tablets.map((t) => t.tablet),
          "first"
        )
        assert.strictEqual(acked.length, TABLETS)

        // The controller's figures and the servers' agree with the metadata.
        const healthy = yield* Effect.promise(() =>
          eventually("the cluster healthy on /metrics", async () => {
            const coordinator = await scrape(coordinatorOps)
            if (value(coordinator, "strata_controller_tablets") !== TABLETS) return undefined
            if (value(coordinator, "strata_controller_under_replicated_tablets") !== 0) return undefined
            const servers = await Promise.all(SERVERS.map((id) => scrape(serverOps.get(id)!)))
            if (servers.reduce((acc, s) => acc + sum(s, "strata_server_leader_count"), 0) !== TABLETS) return undefined
            return { coordinator, servers }
          })
        )
        const metadata = yield* c.metadata("ops")
        assert.strictEqual(value(healthy.coordinator, "strata_controller_active"), 1)
        assert.strictEqual(value(healthy.coordinator, "strata_controller_offline_tablets"), 0)
        assert.strictEqual(value(healthy.coordinator, "strata_controller_live_servers"), SERVERS.length)
        for (const [i, id] of SERVERS.entries()) {
          const leads = metadata.tablets.filter((t) => t.leader === id)
          const hosts = metadata.tablets.filter((t) => t.replicas.includes(id))
          const server = healthy.servers[i]!
          assert.strictEqual(
            value(healthy.coordinator, "strata_controller_tablet_distribution", {
              server: String(id),
              kind: "leaders"
            }),
            leads.length,
            `server ${id}'s leaders on the controller`
          )
          assert.strictEqual(
            value(healthy.coordinator, "strata_controller_tablet_distribution", {
              server: String(id),
              kind: "replicas"
            }),
            hosts.length
          )
          assert.strictEqual(value(server, "strata_server_leader_count"), leads.length, `server ${id}'s leader_count`)
          assert.strictEqual(value(server, "strata_server_replica_count"), hosts.length)
          assert.strictEqual(value(server, "strata_server_under_replicated_tablets"), 0)
          for (const t of leads) {
            const labels = { table: "ops", bucket: String(t.tablet.bucket) }
            assert.strictEqual(value(server, "strata_tablet_isr_count", labels), t.isr.length)
            assert.isAtLeast(value(server, "strata_tablet_high_watermark", labels), 1)
          }
          if (leads.length > 0) {
            assert.isAtLeast(value(server, "strata_server_records_in_total"), leads.length)
            assert.isAtLeast(value(server, "strata_server_append_latency_seconds_count"), leads.length)
          }
        }
        const distribution = yield* Effect.promise(() => getJson(coordinatorOps, "/cluster"))
        assert.strictEqual(distribution.status, 200)
        assert.deepStrictEqual(distribution.body.tablets, {
          total: TABLETS,
          offline: 0,
          underReplicated: 0,
          underMinIsr: 0,
          moving: 0
        })

        // The processes' spans reached the collector, each named after its process.
        const spans = yield* Effect.promise(() =>
          eventually("spans at the collector", async () => {
            const names = collector.spans()
            return [
              "strata.tablet.append",
              "strata.tablet.fetch",
              "strata.controller.step",
              "strata.election.campaign"
            ].every((n) => names.some((s) => s.name === n))
              ? names
              : undefined
          })
        )
        assert.isTrue(
          spans.some((s) => s.name === "strata.tablet.append" && s.service === "strata-tablet-server"),
          "an append's span comes from a tablet server"
        )
        assert.isTrue(
          spans.some((s) => s.name === "strata.controller.step" && s.service === "strata-coordinator"),
          "a controller step's span comes from the coordinator"
        )

        // Server 3 killed: every tablet it held is under-replicated, on the controller and on its leaders.
        yield* cluster.kill("tablet-server", 3)
        const held = metadata.tablets.filter((t) => t.replicas.includes(3)).length
        assert.strictEqual(held, TABLETS, "RF 3 on 3 servers: server 3 holds every tablet")
        yield* Effect.promise(() =>
          eventually(
            "under-replicated tablets after the kill",
            async () => {
              const coordinator = await scrape(coordinatorOps)
              const servers = await Promise.all([1, 2].map((id) => scrape(serverOps.get(id)!)))
              const onServers = servers.reduce((acc, s) => acc + sum(s, "strata_server_under_replicated_tablets"), 0)
              return value(coordinator, "strata_controller_under_replicated_tablets") === held && onServers === held
                ? true
                : undefined
            },
            90_000
          )
        )
        const unreachable = yield* Effect.promise(() =>
          fetch(`http://${serverOps.get(3)!}/healthz`).then(
            () => "answered",
            () => "refused"
          )
        )
        assert.strictEqual(unreachable, "refused", "a killed server's endpoint is gone")

        // Started again: back in every ISR, the shrinks and expansions counted.
        yield* cluster.start("tablet-server", 3)
        yield* Effect.promise(() =>
          eventually(
            "under-replicated back to 0",
            async () => {
              const coordinator = await scrape(coordinatorOps)
              return value(coordinator, "strata_controller_under_replicated_tablets") === 0 ? true : undefined
            },
            90_000
          )
        )
        const after = yield* Effect.promise(() => Promise.all([1, 2].map((id) => scrape(serverOps.get(id)!))))
        assert.isAtLeast(
          after.reduce((acc, s) => acc + value(s, "strata_server_isr_shrinks_total"), 0),
          1,
          "ISR shrinks counted"
        )
        assert.isAtLeast(
          after.reduce((acc, s) => acc + value(s, "strata_server_isr_expands_total"), 0),
          1,
          "ISR expansions counted"
        )

        // Every line the processes logged is JSON carrying their role and id.
        for (const [kind, id] of [
          ["coordinator", COORDINATOR],
          ...SERVERS.map((s) => ["tablet-server", s] as const)
        ] as const) {
          for (const line of cluster.log(kind, id).split("\n")) {
            if (line === "" || line.startsWith("--- ")) continue
            const entry = JSON.parse(line) as { annotations?: { role?: string; id?: number }; timestamp?: string }
            assert.strictEqual(entry.annotations?.role, kind, line)
            assert.strictEqual(entry.annotations?.id, id, line)
            assert.match(entry.timestamp ?? "", /^\d{4}-\d{2}-\d{2}T/, line)
          }
        }
      }).pipe(Effect.scoped, Effect.provide(ZooKeeperCoordination.layer({ connectString: inject("zookeeper") }))),
    300_000
  )
})
