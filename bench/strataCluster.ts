// A Strata cluster as processes for the benchmarks (the CLI bundled once, each process configured through the
// environment, a client of the cluster on the same ZooKeeper): what bench:replica and bench:rebalance share.
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import type { Coordination } from "../packages/core/src/index.js"
import * as ZooKeeperCoordination from "../packages/election/src/ZooKeeperCoordination.js"
import { type PeerTls, TabletClient } from "../packages/replica/src/index.js"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import { nodeRunner } from "../scripts/test-support/nodeRunner.js"
import * as ProcessCluster from "../scripts/test-support/processCluster.js"
import { envString } from "./lib.js"

/** A cluster's settings: the replication settings every process and the client share, and any others of its processes. */
export type Settings = Readonly<Record<string, string | number | boolean>>

/** A process cluster, a way to run effects on its coordination, and a client of it. */
export interface StrataSide {
  readonly cluster: ProcessCluster.ProcessCluster
  readonly namespace: string
  readonly run: <A, E>(effect: Effect.Effect<A, E, Coordination.Coordination | Scope.Scope>) => Promise<A>
  readonly client: TabletClient.TabletClientShape
  readonly close: () => Promise<void>
}

/** A cluster of `servers` tablet servers and one coordinator as processes, and a client of it. */
export const startStrata = async (
  label: string,
  servers: number,
  zookeeper: string,
  settings: Settings,
  /** The client's replication settings (the cluster's, when they are all there is). */
  replication: Settings = settings,
  /** Node's options for every process of the cluster (e.g. `--cpu-prof`). */
  nodeOptions: ReadonlyArray<string> = [],
  /** The client's TLS, for a cluster whose processes speak TLS (`tlsCa`, `tlsCert`, `tlsKey` in `settings`). */
  tls?: PeerTls.PeerTlsOptions
): Promise<StrataSide> => {
  const bundled = await nodeRunner("strata", fileURLToPath(new URL("../apps/strata/src/bin.ts", import.meta.url)), [
    "classic-level",
    "@nxtedition/rocksdb",
    "etcd3",
    "node-zookeeper-client",
    "@platformatic/kafka"
  ])
  const runner = { ...bundled, argv: (args: ReadonlyArray<string>) => [...nodeOptions, ...bundled.argv(args)] }
  const directory = mkdtempSync(join(tmpdir(), `strata-bench-${label}-`))
  const namespace = `/bench-${label}-${process.pid}-${Date.now()}`
  const cluster = ProcessCluster.make({
    runner,
    coordination: `zookeeper://${zookeeper}`,
    namespace,
    directory,
    settings
  })
  const scope = await Effect.runPromise(Scope.make())
  const context = await Effect.runPromise(
    Layer.buildWithScope(ZooKeeperCoordination.layer({ connectString: zookeeper }), scope)
  )
  const run = <A, E>(effect: Effect.Effect<A, E, Coordination.Coordination | Scope.Scope>) =>
    Effect.runPromise(effect.pipe(Effect.provide(Context.add(context, Scope.Scope, scope))) as Effect.Effect<A, E>)
  await run(cluster.start("coordinator", 101))
  for (let id = 1; id <= servers; id++) await run(cluster.start("tablet-server", id))
  const client = await run(
    TabletClient.make({
      namespace,
      linger: 0,
      deliveryTimeout: "120 seconds",
      requestTimeout: "20 seconds",
      replication,
      ...(tls === undefined ? {} : { tls })
    })
  )
  return {
    cluster,
    namespace,
    run,
    client,
    close: async () => {
      await Effect.runPromise(cluster.killAll)
      await Effect.runPromise(Scope.close(scope, Exit.void))
      await runner.dispose()
      // BENCH_KEEP keeps the processes' data and logs, to look into a run.
      if (envString("BENCH_KEEP") === undefined) rmSync(directory, { recursive: true, force: true })
    }
  }
}

/** Creates a table and waits until every tablet leads with its full ISR. */
export const createTable = async (side: StrataSide, table: string, buckets: number) => {
  await side.run(side.client.createTable(table, { buckets }))
  await awaitTable(side, table, (t) => t.leader !== null && t.isr.length === t.replicas.length)
}

export const awaitTable = async (
  side: StrataSide,
  table: string,
  ok: (t: {
    readonly leader: number | null
    readonly isr: ReadonlyArray<number>
    readonly replicas: ReadonlyArray<number>
  }) => boolean,
  timeoutMs = 120_000
) => {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    const m = await side.run(Effect.option(side.client.metadata(table)))
    if (m._tag === "Some" && m.value.tablets.length > 0 && m.value.tablets.every(ok)) return m.value
    await new Promise((r) => setTimeout(r, 50))
  }
  throw new Error(`${table}: not as expected within ${timeoutMs} ms`)
}
