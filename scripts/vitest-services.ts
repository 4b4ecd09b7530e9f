// Vitest globalSetup for the "integration" project: makes sure ZooKeeper, etcd and Kafka are serving
// on loopback (via scripts/services), hands their addresses to the tests, and stops afterwards only
// the servers that this run started (set STRATA_KEEP_SERVICES=1 to leave them running).
//
// In a test:  import { inject } from "vitest";  const zk = inject("zookeeper")  // "127.0.0.1:2181"
// or read process.env.STRATA_ZK / STRATA_ETCD / STRATA_KAFKA.
import { spawnSync } from "node:child_process"
import { existsSync, readFileSync } from "node:fs"
import { join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import type { TestProject } from "vitest/node"

declare module "vitest" {
  export interface ProvidedContext {
    /** ZooKeeper connect string, "127.0.0.1:2181" */
    zookeeper: string
    /** etcd client endpoint, "127.0.0.1:2379" */
    etcd: string
    /** Kafka bootstrap broker, "127.0.0.1:9092" */
    kafka: string
    /** The same broker's SASL_SSL listener, "127.0.0.1:9094" (user "strata", password "strata-secret") */
    kafkaSasl: string
    /** The CA certificate (PEM) that signed the SASL_SSL listener's certificate */
    kafkaCa: string
  }
}

const SERVICES = ["zookeeper", "etcd", "kafka"] as const
type Service = (typeof SERVICES)[number]

const script = fileURLToPath(new URL("./services", import.meta.url))

// Same defaults as scripts/services.
const port = (name: string, fallback: number) => Number(process.env[name] ?? fallback)
const addresses: Record<Service, string> = {
  zookeeper: `127.0.0.1:${port("STRATA_ZK_PORT", 2181)}`,
  etcd: `127.0.0.1:${port("STRATA_ETCD_PORT", 2379)}`,
  kafka: `127.0.0.1:${port("STRATA_KAFKA_PORT", 9092)}`
}

// stdout is captured (one line per server); stderr (apt/maven progress, log tails) goes straight through.
function services(args: ReadonlyArray<string>): { status: number | null; stdout: string } {
  const result = spawnSync("bash", [script, ...args], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"],
    timeout: 20 * 60_000 // a fresh machine installs packages and resolves the Kafka jars first
  })
  if (result.error) throw result.error
  return { status: result.status, stdout: result.stdout }
}

// Which servers are not up yet (so this run will be the one starting them)?
function notRunning(): Array<Service> {
  const { stdout } = services(["status"])
  const up = new Set(
    stdout
      .split("\n")
      .map((line) => line.trim().split(/\s+/))
      .filter(([, state]) => state === "up")
      .map(([name]) => name)
  )
  return SERVICES.filter((name) => !up.has(name))
}

const keep = () => !["", "0", "false"].includes(process.env.STRATA_KEEP_SERVICES ?? "")

function stop(names: ReadonlyArray<Service>): void {
  if (names.length === 0 || keep()) return
  const down = services(["down", ...names])
  if (down.status !== 0) process.stderr.write(down.stdout)
}

export default function setup(project: TestProject): () => void {
  const started = notRunning()
  if (started.length > 0) {
    const up = services(["up", ...started])
    process.stdout.write(up.stdout)
    if (up.status !== 0) {
      stop(started) // do not leave half of them running
      throw new Error(`scripts/services up ${started.join(" ")} failed (exit ${up.status}); see the log tail above`)
    }
  }

  for (const name of SERVICES) project.provide(name, addresses[name])
  const servicesDir = resolve(
    process.env.STRATA_SERVICES_DIR ?? fileURLToPath(new URL("../.services", import.meta.url))
  )
  project.provide("kafkaSasl", `127.0.0.1:${port("STRATA_KAFKA_SASL_PORT", 9094)}`)
  // Empty when the running broker was started before its SASL_SSL listener existed; the tests that need it say so.
  const ca = join(servicesDir, "kafka", "tls", "ca.pem")
  project.provide("kafkaCa", existsSync(ca) ? readFileSync(ca, "utf8") : "")
  process.env.STRATA_ZK = addresses.zookeeper
  process.env.STRATA_ETCD = addresses.etcd
  process.env.STRATA_KAFKA = addresses.kafka

  return () => stop(started)
}
