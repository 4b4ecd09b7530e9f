// What TLS between the cluster's processes costs (`./dev bench:tls`): bench:replica's produce program (1 KB records,
// acks=all, 12 tablets, RF 3, min ISR 2) on a plaintext 3-server cluster and on one whose processes and client speak
// mutual TLS, warmed up and then interleaved, in the same run. The baseline is the plaintext cluster.
// Environment: BENCH_RECORDS (200000), BENCH_BATCH (1000), BENCH_IN_FLIGHT (4), BENCH_RUNS (3), BENCH_ZOOKEEPER
// (127.0.0.1:2181).
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Redacted } from "effect"
import { makeCa } from "../scripts/test-support/certificates.js"
import { type BenchOutput, collectGarbage, envInt, envString, type Figure, median, progress, round3 } from "./lib.js"
import { PARTITIONS, type Plan, type Run, SETTINGS, settleDisk, strataProduce } from "./replica.js"
import { createTable, startStrata } from "./strataCluster.js"

const DEFAULTS = { records: 200_000, batch: 1000, inFlight: 4, runs: 3, zookeeper: "127.0.0.1:2181" } as const

/** The two clusters' runs, interleaved, and their figures. */
const tlsPart = async (plan: Plan, runs: number, zookeeper: string) => {
  const directory = mkdtempSync(join(tmpdir(), "strata-bench-tls-"))
  const ca = makeCa(directory, "bench cluster CA")
  ca.issue("node", { cn: "strata-bench", ips: ["127.0.0.1"] })
  const tls = { tlsCa: ca.file("ca.pem"), tlsCert: ca.file("node.pem"), tlsKey: ca.file("node-key.pem") }
  const clientTls = { ca: ca.pem("ca.pem"), cert: ca.pem("node.pem"), key: Redacted.make(ca.pem("node-key.pem")) }
  const plain = await startStrata("plain", 3, zookeeper, SETTINGS)
  const secured = await startStrata("tls", 3, zookeeper, { ...SETTINGS, ...tls }, SETTINGS, [], clientTls)
  const valueBytes = 1000
  const p: Array<Run> = []
  const t: Array<Run> = []
  try {
    for (const [side, label] of [
      [plain, "plaintext"],
      [secured, "tls"]
    ] as const) {
      await createTable(side, "warmup", PARTITIONS)
      for (let i = 0; i < 3; i++) await strataProduce(side, plan, valueBytes, "warmup")
      progress(`warm-up ${label} done`)
    }
    for (let r = 0; r < runs; r++) {
      for (const label of r % 2 === 0 ? ["plaintext", "tls"] : ["tls", "plaintext"]) {
        collectGarbage()
        settleDisk()
        const side = label === "tls" ? secured : plain
        await createTable(side, `produce-${r}`, PARTITIONS)
        const run = await strataProduce(side, plan, valueBytes, `produce-${r}`)
        ;(label === "tls" ? t : p).push(run)
        progress(
          `produce 1000 B ${label}: ${Math.round(plan.records / run.seconds)} records/s, server CPU ${round3(run.serverCpu)} s, client CPU ${round3(run.clientCpu)} s`
        )
      }
    }
  } finally {
    await secured.close()
    await plain.close()
    rmSync(directory, { recursive: true, force: true })
  }
  const rate = (runs: ReadonlyArray<Run>) => median(runs.map((r) => plan.records / r.seconds))
  const cpu = (runs: ReadonlyArray<Run>, of: (r: Run) => number) => (median(runs.map(of)) * 100_000) / plan.records
  const figures: Array<Figure> = [
    {
      bench: "replica.tls.1000B.records_per_s",
      value: round3(rate(t)),
      unit: "records/s",
      baseline: round3(rate(p)),
      ratio: round3(rate(t) / rate(p))
    },
    {
      bench: "replica.tls.1000B.server_cpu_s_per_100k",
      value: round3(cpu(t, (r) => r.serverCpu)),
      unit: "CPU s per 100k records (3 servers)",
      baseline: round3(cpu(p, (r) => r.serverCpu)),
      ratio: round3(cpu(t, (r) => r.serverCpu) / cpu(p, (r) => r.serverCpu))
    },
    {
      bench: "replica.tls.1000B.client_cpu_s_per_100k",
      value: round3(cpu(t, (r) => r.clientCpu)),
      unit: "CPU s per 100k records (client)",
      baseline: round3(cpu(p, (r) => r.clientCpu)),
      ratio: round3(cpu(t, (r) => r.clientCpu) / cpu(p, (r) => r.clientCpu))
    }
  ]
  return {
    figures,
    details: { tls: { plaintext: p.map((r) => round3(r.seconds)), tls: t.map((r) => round3(r.seconds)) } }
  }
}

/** Runs the benchmark; its figures are kept when its parameters are the defaults. */
export const run = async (): Promise<BenchOutput & { readonly save: boolean }> => {
  const plan: Plan = {
    records: envInt("BENCH_RECORDS", DEFAULTS.records),
    batch: envInt("BENCH_BATCH", DEFAULTS.batch),
    inFlight: envInt("BENCH_IN_FLIGHT", DEFAULTS.inFlight)
  }
  const runs = envInt("BENCH_RUNS", DEFAULTS.runs)
  const { figures, details } = await tlsPart(plan, runs, envString("BENCH_ZOOKEEPER") ?? DEFAULTS.zookeeper)
  return {
    results: figures,
    details: { plan, settings: SETTINGS, ...details },
    save:
      plan.records === DEFAULTS.records &&
      plan.batch === DEFAULTS.batch &&
      plan.inFlight === DEFAULTS.inFlight &&
      runs === DEFAULTS.runs
  }
}
