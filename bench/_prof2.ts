import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import * as ZooKeeperCoordination from "../packages/election/src/ZooKeeperCoordination.js"
import { TabletClient } from "../packages/replica/src/index.js"
import { Effect, Layer, Scope, Context } from "effect"
import { nodeRunner } from "../scripts/test-support/nodeRunner.js"
import * as ProcessCluster from "../scripts/test-support/processCluster.js"

const SETTINGS = {
  replicationFactor: 3,
  minInsyncReplicas: 2,
  sessionTimeoutMs: 4000,
  replicaLagTimeMaxMs: 12000,
  appendTimeoutMs: 10000
}
const runner = await nodeRunner("strata", fileURLToPath(new URL("../apps/strata/src/bin.ts", import.meta.url)), [
  "classic-level",
  "@nxtedition/rocksdb",
  "etcd3",
  "node-zookeeper-client",
  "@platformatic/kafka"
])
const directory = mkdtempSync(join(tmpdir(), "strata-prof-"))
const namespace = `/prof-${Date.now()}`
const cluster = ProcessCluster.make({
  runner,
  coordination: "zookeeper://127.0.0.1:2181",
  namespace,
  directory,
  settings: SETTINGS
})
const scope = await Effect.runPromise(Scope.make())
const context = await Effect.runPromise(
  Layer.buildWithScope(ZooKeeperCoordination.layer({ connectString: "127.0.0.1:2181" }), scope)
)
const run = <A, E>(e: Effect.Effect<A, E, any>) =>
  Effect.runPromise(e.pipe(Effect.provide(Context.add(context, Scope.Scope, scope))) as Effect.Effect<A, E>)
await run(cluster.start("coordinator", 101))
for (let id = 1; id <= 3; id++) await run(cluster.start("tablet-server", id))
const client = await run(
  TabletClient.make({
    namespace,
    lingerMs: 0,
    deliveryTimeoutMs: 120000,
    requestTimeoutMs: 20000,
    replication: SETTINGS
  })
)
await run(client.createTable("p", { buckets: 12 }))
await new Promise((r) => setTimeout(r, 3000))
const value = new Uint8Array(1000).fill(3)
const t0 = performance.now()
const inflight: Array<Promise<unknown>> = []
for (let c = 0; c < 200; c++) {
  const calls = Array.from({ length: 12 }, (_, p) =>
    client.send(
      { table: "p", bucket: p },
      Array.from({ length: 83 }, () => ({ key: null, value, headers: [], timestamp: 0 }))
    )
  )
  inflight.push(run(Effect.all(calls, { concurrency: "unbounded" })))
  if (inflight.length >= 4) {
    await inflight.shift()
  }
}
await Promise.all(inflight)
console.log(`${200 * 12 * 83} records in ${Math.round(performance.now() - t0)} ms; dir ${directory}`)
for (let id = 1; id <= 3; id++) await run(cluster.stop("tablet-server", id))
await Effect.runPromise(cluster.killAll)
process.exit(0)
