// Profiles Strata's tablet servers under the replica benchmark's produce load (1 KB, acks=all, RF 3, 12 tablets):
// each server runs with --cpu-prof and is stopped with SIGTERM, so it writes its profile; the top functions by self
// time of each are printed. Needs ZooKeeper:
//   ./dev exec tsx --conditions=@strata/source bench/profileServers.ts
// Environment: PROFILE_RECORDS (200000), PROFILE_VALUE_BYTES (1000), PROFILE_DIR (/tmp/strata-profile),
// PROFILE_SETTINGS (extra settings of the servers, JSON), PROFILE_READS (0: how many times every tablet is then read
// back whole, 1 MiB a read, all tablets at once, as a consumer reads; the profile then holds both), PROFILE_NODE_OPTIONS
// (the servers' Node options, space-separated, in place of --cpu-prof: e.g. --trace-gc with BENCH_KEEP set, whose
// output lands in each process's log in the kept directory).
import { mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { join } from "node:path"
import type { Models } from "../packages/core/src/index.js"
import type { ReplicaManager } from "../packages/replica/src/index.js"
import { Effect } from "effect"
import { envInt, envString, randomBytes } from "./lib.js"
import { cpuOfAll, keyOf, PARTITIONS, produceAll, SETTINGS } from "./replica.js"
import { awaitTable, createTable, startStrata } from "./strataCluster.js"

interface Node {
  readonly callFrame: { readonly functionName: string; readonly url: string; readonly lineNumber: number }
  readonly hitCount: number
  readonly id: number
}

/** The `top` functions of a `.cpuprofile` by self samples, as shares of all samples. */
const summarize = (file: string, top: number) => {
  const profile = JSON.parse(readFileSync(file, "utf8")) as { nodes: ReadonlyArray<Node> }
  const self = new Map<string, number>()
  let total = 0
  for (const n of profile.nodes) {
    const f = n.callFrame
    const where =
      f.url === "" ? "" : ` ${f.url.replace(/^.*\/(node_modules\/|strata-bundle[^/]*\/)/, "")}:${f.lineNumber + 1}`
    const name = `${f.functionName || "(anonymous)"}${where}`
    self.set(name, (self.get(name) ?? 0) + n.hitCount)
    total += n.hitCount
  }
  return [...self]
    .sort((a, b) => b[1] - a[1])
    .slice(0, top)
    .map(([name, hits]) => `${((100 * hits) / total).toFixed(1).padStart(5)}%  ${name}`)
}

const main = async () => {
  const records = envInt("PROFILE_RECORDS", 200_000)
  const valueBytes = envInt("PROFILE_VALUE_BYTES", 1000)
  const dir = envString("PROFILE_DIR") ?? "/tmp/strata-profile"
  rmSync(dir, { recursive: true, force: true })
  mkdirSync(dir, { recursive: true })
  const extra = JSON.parse(envString("PROFILE_SETTINGS") ?? "{}") as Record<string, string | number | boolean>
  const side = await startStrata(
    "profile",
    3,
    envString("BENCH_ZOOKEEPER") ?? "127.0.0.1:2181",
    { ...SETTINGS, ...extra },
    SETTINGS,
    envString("PROFILE_NODE_OPTIONS")?.split(" ") ?? ["--cpu-prof", `--cpu-prof-dir=${dir}`]
  )
  try {
    const table = "profiled"
    await createTable(side, table, PARTITIONS)
    await awaitTable(side, table, (t) => t.isr.length === 3)
    const tablets: Array<Models.TabletId> = Array.from({ length: PARTITIONS }, (_, bucket) => ({ table, bucket }))
    const values = randomBytes(valueBytes * 64, 0x5eed)
    const servers = side.cluster.running("tablet-server").map((id) => side.cluster.pid("tablet-server", id)!)
    const cpu0 = cpuOfAll(servers)
    const t0 = performance.now()
    await produceAll({ records, batch: 1000, inFlight: 4 }, (start, end) => {
      const byTablet = new Map<number, Array<ReplicaManager.TabletRecord>>()
      for (let i = start; i < end; i++) {
        const list = byTablet.get(i % PARTITIONS) ?? []
        byTablet.set(i % PARTITIONS, list)
        const v = (i % 64) * valueBytes
        list.push({ key: keyOf(i), value: values.subarray(v, v + valueBytes), headers: [], timestamp: 0 })
      }
      return side.run(
        Effect.all(
          [...byTablet].map(([p, list]) => side.client.send(tablets[p]!, list)),
          { concurrency: "unbounded" }
        )
      )
    })
    const seconds = (performance.now() - t0) / 1000
    const cpu = cpuOfAll(servers) - cpu0
    console.log(
      `${records} records of ${valueBytes} B in ${seconds.toFixed(1)} s: ${Math.round(records / seconds)} records/s, server CPU ${((cpu * 100_000) / records).toFixed(2)} CPU-s per 100k`
    )
    const reads = envInt("PROFILE_READS", 0)
    if (reads > 0) {
      const cpu1 = cpuOfAll(servers)
      const t1 = performance.now()
      let read = 0
      for (let round = 0; round < reads; round++) {
        await side.run(
          Effect.forEach(
            tablets,
            (tablet) =>
              Effect.gen(function* () {
                let offset = 0
                for (;;) {
                  const result = yield* side.client.read(tablet, offset, 1_048_576)
                  const last = result.batches.at(-1)
                  if (last === undefined) return
                  for (const b of result.batches) read += b.records.length
                  offset = last.baseOffset + last.records.length
                }
              }),
            { concurrency: "unbounded", discard: true }
          )
        )
      }
      const readSeconds = (performance.now() - t1) / 1000
      const readCpu = cpuOfAll(servers) - cpu1
      console.log(
        `read ${read} records in ${readSeconds.toFixed(1)} s: ${Math.round(read / readSeconds)} records/s, server CPU ${((readCpu * 100_000) / read).toFixed(2)} CPU-s per 100k`
      )
    }
    for (const id of side.cluster.running("tablet-server")) await side.run(side.cluster.stop("tablet-server", id))
  } finally {
    await side.close()
  }
  for (const file of readdirSync(dir).filter((f) => f.endsWith(".cpuprofile"))) {
    const path = join(dir, file)
    // The servers' profiles are the large ones (the coordinator's is small).
    console.log(`\n${file}`)
    for (const line of summarize(path, 25)) console.log(line)
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
