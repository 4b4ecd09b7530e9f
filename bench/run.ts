// Runs the benchmarks (docs/ARCHITECTURE.md, "Benchmarks"): `./dev bench` runs them all, `./dev bench <name>...` (or `./dev bench:<name>`)
// some. Each prints one JSON line per figure on stdout (progress goes to stderr) and, when run with its default
// parameters, keeps its figures with the command that produced them in `bench/results/<name>.json`.
// Benchmarks are not tests: nothing here asserts on timings.
import { mkdirSync, writeFileSync } from "node:fs"
import { cpus, loadavg, totalmem } from "node:os"
import { fileURLToPath } from "node:url"
import type { BenchOutput } from "./lib.js"
import { envString, progress, round3 } from "./lib.js"

const benches: Record<string, () => Promise<BenchOutput & { readonly save: boolean }>> = {
  store: async () => (await import("./store.js")).run(),
  kafka: async () => (await import("./kafka.js")).run(),
  failover: async () => (await import("./failover.js")).run(),
  tables: async () => (await import("./tables.js")).run(),
  recovery: async () => (await import("./recovery.js")).run(),
  worker: async () => (await import("./worker.js")).run(),
  rpc: async () => (await import("./rpc.js")).run(),
  replica: async () => (await import("./replica.js")).run(),
  producers: async () => (await import("./producers.js")).run(),
  rebalance: async () => (await import("./rebalance.js")).run(),
  tls: async () => (await import("./tls.js")).run()
}

/** The command line as the user typed it, as far as it can be told, with what it ran. */
const command = (): string => {
  const event = envString("npm_lifecycle_event")
  const script = envString("npm_lifecycle_script")
  const env = Object.entries(process.env)
    .filter(([k]) => k.startsWith("BENCH_"))
    .map(([k, v]) => `${k}=${v} `)
    .join("")
  const args = process.argv.slice(2)
  if (event === undefined || script === undefined) return `${env}${process.argv.join(" ")}`
  // pnpm appends extra arguments to the script; the ones the script itself names are not extra.
  const extra = script.endsWith(args.join(" ")) ? "" : ` ${args.join(" ")}`
  return `${env}pnpm ${event}${extra} (${script}${extra})`
}

const main = async () => {
  const wanted = process.argv.slice(2)
  for (const name of wanted) {
    if (!(name in benches)) throw new Error(`unknown benchmark ${name} (known: ${Object.keys(benches).join(", ")})`)
  }
  const names = wanted.length > 0 ? wanted : Object.keys(benches)
  for (const name of names) {
    const date = new Date().toISOString()
    const started = performance.now()
    const loadBefore = loadavg()[0]!
    const output = await benches[name]!()
    for (const figure of output.results) process.stdout.write(`${JSON.stringify(figure)}\n`)
    const seconds = Math.round((performance.now() - started) / 1000)
    if (output.save) {
      const dir = fileURLToPath(new URL("results/", import.meta.url))
      mkdirSync(dir, { recursive: true })
      const file = `${dir}${name}.json`
      const record = {
        command: command(),
        date,
        seconds,
        machine: {
          cpus: cpus().length,
          cpuModel: cpus()[0]?.model ?? "unknown",
          memoryGB: Math.round(totalmem() / 2 ** 30),
          platform: `${process.platform}-${process.arch}`,
          node: process.version,
          // Other work on the machine skews absolute times (ratios less so): 1-minute load before and after.
          loadAverage: [round3(loadBefore), round3(loadavg()[0]!)]
        },
        results: output.results,
        ...(output.details === undefined ? {} : { details: output.details })
      }
      writeFileSync(file, `${JSON.stringify(record, null, 2)}\n`)
      progress(`${name}: ${seconds} s, results kept in ${file}`)
    } else {
      progress(`${name}: ${seconds} s, non-default parameters: results not kept`)
    }
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`)
  process.exitCode = 1
})
