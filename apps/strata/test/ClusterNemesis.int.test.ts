import type { Coordination } from "@strata/core"
import { rm } from "node:fs/promises"
import { assert, describe, it } from "@effect/vitest"
import * as EtcdCoordination from "@strata/election/etcd"
import * as ZooKeeperCoordination from "@strata/election/zookeeper"
import { Effect, type Layer } from "effect"
import { afterAll, beforeAll, inject } from "vitest"
import type { NodeRunner } from "../../../scripts/test-support/nodeRunner.js"
import { bundleCli, faultSettings, freshDirectory } from "./support/clusterTest.js"
import * as Nemesis from "./support/nemesis.js"
import * as ProcessCluster from "../../../scripts/test-support/processCluster.js"

// `./dev soak:replica` runs the ZooKeeper run for STRATA_NEMESIS_MS (and STRATA_NEMESIS_SEED replays a seed).
const DURATION_MS = Number(process.env.STRATA_NEMESIS_MS ?? 100_000)
const SEED = process.env.STRATA_NEMESIS_SEED === undefined ? undefined : Number(process.env.STRATA_NEMESIS_SEED)

let runner: NodeRunner
const directories: Array<string> = []
/** The directories of failed runs: kept, with the processes' logs, for a look afterwards. */
const failed = new Set<string>()
beforeAll(async () => {
  runner = await bundleCli()
}, 120_000)
afterAll(async () => {
  await runner?.dispose()
  for (const d of directories) if (!failed.has(d)) await rm(d, { recursive: true, force: true })
})

/** How many faults of each kind a run drew. */
const faultCounts = (faults: ReadonlyArray<string>): string => {
  const kinds: Array<readonly [string, RegExp]> = [
    ["kill -9", /kill -9/],
    ["SIGSTOP", /SIGSTOP/],
    ["isolated", /cut off from peers/],
    ["data link cut", /data link cut/],
    ["coordination cut", /cut off from coordination/],
    ["connections reset", /reset every connection/],
    ["impostor", /impostor/]
  ]
  return kinds.map(([name, pattern]) => `${name} ${faults.filter((f) => pattern.test(f)).length}`).join(", ")
}

const nemesis = (
  backend: string,
  coordination: string,
  layer: Layer.Layer<Coordination.Coordination, Coordination.CoordinationError>,
  durationMs: number,
  minFaults: number
) =>
  Effect.gen(function* () {
    const seed = SEED ?? Math.floor(Math.random() * 2 ** 31)
    const directory = yield* Effect.promise(() => freshDirectory(`nemesis-${backend}`))
    directories.push(directory)
    const namespace = `/nemesis-${backend}-${seed}-${Date.now()}`
    // Every tablet server behind proxies of its own, for the network faults.
    const cluster = ProcessCluster.make({
      runner,
      coordination,
      namespace,
      directory,
      settings: faultSettings,
      proxied: true
    })
    yield* Effect.addFinalizer(() => cluster.killAll)
    console.log(`nemesis on ${backend}: seed ${seed} (replay: STRATA_NEMESIS_SEED=${seed}), ${durationMs} ms of faults`)
    // Bounded below the test's timeout, so that a run that wedges still reports its seed and the processes' logs.
    const result = yield* Effect.scoped(Nemesis.run(cluster, { namespace, seed, durationMs, tablets: 12 })).pipe(
      Effect.timeoutOrElse({
        duration: durationMs + 240_000,
        orElse: () => Effect.fail(new Error(`the run did not end within ${durationMs + 240_000} ms`))
      }),
      Effect.tapError((e) =>
        Effect.sync(() => {
          failed.add(directory)
          console.log(`seed ${seed} failed (${String(e)}); logs kept in ${directory}\n${cluster.logTails(60)}`)
        })
      ),
      Effect.provide(layer)
    )
    const { report } = result
    console.log(
      `nemesis on ${backend}, seed ${seed}: ${result.faults.length} faults (${faultCounts(result.faults)}); sends ok ${result.sends.ok}, failed ${result.sends.failed}, unknown ${result.sends.unknown}; ${report.acked} acked records checked against ${report.records} held\n  ${result.faults.join("\n  ")}\n  impostors:\n  ${result.impostors.join("\n  ")}`
    )
    const context = `seed ${seed}`
    if (result.anomalies.length > 0) {
      failed.add(directory)
      console.log(`seed ${seed}: logs kept in ${directory}`)
    }
    assert.deepStrictEqual(result.anomalies, [], `what the faults' own checks found (${context})`)
    assert.deepStrictEqual(report.lost, [], `acknowledged records lost (${context})`)
    assert.deepStrictEqual(report.duplicates, [], `duplicates (${context})`)
    assert.deepStrictEqual(report.divergent, [], `replicas diverge below the HW (${context})`)
    assert.deepStrictEqual(report.epochConflicts, [], `two leaders of one epoch (${context})`)
    assert.isTrue(result.liveAfter, `every tablet takes a write after the faults (${context})`)
    assert.isAtLeast(result.faults.length, minFaults, context)
    assert.isAtLeast(result.sends.ok, 100, `the producers made progress (${context})`)
  }).pipe(Effect.scoped)

describe("the nemesis on real processes", () => {
  it.live(
    "ZooKeeper: kill -9 and SIGSTOP of servers, leaders and coordinators, network cuts (a server isolated, its data link alone, its coordination alone), reset connections and impostors of a server id lose no acknowledged record, duplicate none, and the cluster heals",
    () =>
      nemesis(
        "zookeeper",
        `zookeeper://${inject("zookeeper")}`,
        ZooKeeperCoordination.layer({ connectString: inject("zookeeper") }),
        DURATION_MS,
        Math.floor((DURATION_MS / 100_000) * 20)
      ),
    DURATION_MS + 360_000
  )

  it.live(
    "etcd: the same faults, a shorter run",
    () =>
      nemesis(
        "etcd",
        `etcd://${inject("etcd")}`,
        EtcdCoordination.layer({ endpoints: [`http://${inject("etcd")}`] }),
        60_000,
        8
      ),
    460_000
  )
})
