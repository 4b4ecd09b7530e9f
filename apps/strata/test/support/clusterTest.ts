/**
 * What the cluster fault tests share: the bundled `strata` CLI, a client on the test's coordination, records with
 * unique values, and a wait on the controller's metadata.
 */
import type { Coordination, Models } from "@strata/core"
import type { ReplicaManager } from "@strata/replica"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { type ReplicaRpc, TabletClient } from "@strata/replica"
import { Duration, Effect, Ref, type Scope } from "effect"
import { afterAll, beforeAll, inject } from "vitest"
import { type NodeRunner, nodeRunner } from "../../../../scripts/test-support/nodeRunner.js"
import * as ProcessCluster from "../../../../scripts/test-support/processCluster.js"
import type { Acked } from "./replicaChecker.js"

/** The CLI bundled once (drivers that load files relative to their install stay external). */
export const bundleCli = (): Promise<NodeRunner> =>
  nodeRunner("strata", fileURLToPath(new URL("../../src/bin.ts", import.meta.url)), [
    "classic-level",
    "@nxtedition/rocksdb",
    "etcd3",
    "node-zookeeper-client",
    "@platformatic/kafka"
  ])

/** A fresh directory for a cluster's data and logs. */
export const freshDirectory = (label: string) => mkdtemp(join(tmpdir(), `strata-${label}-`))

const encoder = new TextEncoder()

/** A record whose value is `value`. */
export const record = (value: string): ReplicaManager.TabletRecord => ({
  key: null,
  value: encoder.encode(value),
  headers: [],
  timestamp: 0
})

/** The settings the fault tests run the cluster with: failures noticed in seconds, not tens of seconds. */
export const faultSettings = {
  replicationFactor: 3,
  minInsyncReplicas: 2,
  sessionTimeout: 4_000,
  replicaLagTimeMax: 12_000,
  appendTimeout: 8_000,
  retryBackoff: 100
} as const

/** A client of the test's cluster. */
export const client = (namespace: string, deliveryTimeout = 60_000) =>
  TabletClient.make({
    namespace,
    deliveryTimeout,
    requestTimeout: 15_000,
    replication: faultSettings
  })

/** Polls the controller's metadata of `table` until `ok` holds (every 200 ms, up to `timeoutMs`). */
export const awaitMetadata = (
  c: TabletClient.TabletClientShape,
  table: string,
  what: string,
  ok: (metadata: ReplicaRpc.Metadata) => boolean,
  timeoutMs = 120_000
): Effect.Effect<ReplicaRpc.Metadata, Error> =>
  Effect.gen(function* () {
    const deadline = Date.now() + timeoutMs
    let last: ReplicaRpc.Metadata | undefined
    while (Date.now() < deadline) {
      const m = yield* Effect.option(c.metadata(table))
      if (m._tag === "Some") {
        last = m.value
        if (ok(m.value)) return m.value
      }
      yield* Effect.sleep(Duration.millis(200))
    }
    return yield* Effect.fail(
      new Error(`${what}: not within ${timeoutMs} ms; last metadata ${JSON.stringify(last?.tablets.slice(0, 12))}`)
    )
  })

/** Sends one record to each tablet (acks=all); the acknowledged sends. */
export const writeEach = (
  c: TabletClient.TabletClientShape,
  tablets: ReadonlyArray<Models.TabletId>,
  label: string
): Effect.Effect<ReadonlyArray<Acked>, never, never> =>
  Effect.map(
    Effect.forEach(
      tablets,
      (tablet) => {
        const value = `${label}:${tablet.bucket}`
        return Effect.map(Effect.result(c.send(tablet, [record(value)])), (r): Acked | undefined =>
          r._tag === "Success" ? { tablet, baseOffset: r.success.baseOffset, values: [value] } : undefined
        )
      },
      { concurrency: "unbounded" }
    ),
    (all) => all.filter((a): a is Acked => a !== undefined)
  )

/** One acknowledged send of a steady load: when it was acknowledged and how long it took. */
export interface Timed {
  readonly atMs: number
  readonly latencyMs: number
}

/**
 * Sends one record at a time to the tablets in turn from `workers` loops until `running` is false: the acknowledged
 * sends, and each one's time and latency (for percentiles before, during and after an operation).
 */
export const steadyLoad = (
  c: TabletClient.TabletClientShape,
  tablets: ReadonlyArray<Models.TabletId>,
  running: Ref.Ref<boolean>,
  workers = 4
): Effect.Effect<{ readonly acked: ReadonlyArray<Acked>; readonly timed: ReadonlyArray<Timed> }> =>
  Effect.map(
    Effect.forEach(
      Array.from({ length: workers }, (_, w) => w),
      (w) =>
        Effect.gen(function* () {
          const acked: Array<Acked> = []
          const timed: Array<Timed> = []
          for (let n = 0; yield* Ref.get(running); n++) {
            const tablet = tablets[(n * workers + w) % tablets.length]!
            const value = `load:${w}:${n}`
            const started = Date.now()
            const sent = yield* Effect.result(c.send(tablet, [record(value)]))
            if (sent._tag === "Success") {
              const now = Date.now()
              acked.push({ tablet, baseOffset: sent.success.baseOffset, values: [value] })
              timed.push({ atMs: now, latencyMs: now - started })
            }
          }
          return { acked, timed }
        }),
      { concurrency: "unbounded" }
    ),
    (all) => ({ acked: all.flatMap((a) => a.acked), timed: all.flatMap((a) => a.timed) })
  )

/** The `q` quantile (0–1) of `values` (0 when there are none). */
export const quantile = (values: ReadonlyArray<number>, q: number): number => {
  if (values.length === 0) return 0
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!
}

/** The scope's services a cluster test needs. */
export type ClusterTestR = Coordination.Coordination | Scope.Scope

/** A test file's bundled CLI and the directories its clusters used (see `cliProcesses`). */
export interface CliProcesses {
  /** The bundled CLI (once the file's `beforeAll` ran). */
  readonly runner: () => NodeRunner
  /** Directories to remove after the file's tests. */
  readonly directories: Array<string>
}

/** Bundles the CLI before a test file's tests, and disposes of it and removes their directories after them. */
export const cliProcesses = (): CliProcesses => {
  let runner: NodeRunner | undefined
  const directories: Array<string> = []
  beforeAll(async () => {
    runner = await bundleCli()
  }, 120_000)
  afterAll(async () => {
    await runner?.dispose()
    for (const d of directories) await rm(d, { recursive: true, force: true })
  })
  return {
    runner: () => {
      if (runner === undefined) throw new Error("the CLI is not bundled yet (cliProcesses runs it in beforeAll)")
      return runner
    },
    directories
  }
}

/**
 * A process cluster on the test's ZooKeeper in a fresh directory (removed after the file's tests) and a namespace
 * named after `label`, with `faultSettings` and `settings` over them; every process is killed as the scope closes.
 */
export const zooKeeperCluster = (
  processes: CliProcesses,
  label: string,
  settings: Readonly<Record<string, string | number | boolean>> = {}
) =>
  Effect.gen(function* () {
    const runner = processes.runner()
    const directory = yield* Effect.promise(() => freshDirectory(label))
    processes.directories.push(directory)
    const namespace = `/${label}-${Date.now()}`
    const cluster = ProcessCluster.make({
      runner,
      coordination: `zookeeper://${inject("zookeeper")}`,
      namespace,
      directory,
      settings: { ...faultSettings, ...settings }
    })
    yield* Effect.addFinalizer(() => cluster.killAll)
    return { cluster, namespace, directory }
  })

/** Every record value of the tablet, read from its leader up to its high watermark. */
export const readAll = (c: TabletClient.TabletClientShape, tablet: Models.TabletId) =>
  Effect.gen(function* () {
    const values: Array<string> = []
    let offset = 0
    while (true) {
      const page = yield* c.read(tablet, offset)
      if (page.batches.length === 0) return values
      for (const b of page.batches) for (const r of b.records) values.push(new TextDecoder().decode(r.value))
      const last = page.batches.at(-1)!
      offset = last.baseOffset + last.records.length
    }
  })
