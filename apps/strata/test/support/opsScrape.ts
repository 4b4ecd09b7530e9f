/**
 * Reading a process's ops endpoint as an operator's tools do: its address from the process's log, `/metrics` parsed
 * from Prometheus's text format, and the JSON of `/healthz`, `/readyz` and `/cluster`.
 */
import type * as ProcessCluster from "../../../../scripts/test-support/processCluster.js"

/** One sample of a scrape: a metric's name, its labels and its value. */
export interface Sample {
  readonly name: string
  readonly labels: Readonly<Record<string, string>>
  readonly value: number
}

/** The ops endpoint's `host:port` as the process's latest start logged it. */
export const opsAddress = (cluster: ProcessCluster.ProcessCluster, kind: ProcessCluster.Kind, id: number) => {
  const log = cluster.log(kind, id)
  const starts = log.split("--- start ")
  const last = starts[starts.length - 1] ?? ""
  const match = /ops endpoint on http:\/\/([^\s"]+)/.exec(last)
  if (match === null) throw new Error(`${kind} ${id} has not logged its ops endpoint yet`)
  return match[1]!
}

/** `/metrics` of the endpoint at `address`, parsed (comments skipped). */
export const scrape = async (address: string): Promise<ReadonlyArray<Sample>> => {
  const response = await fetch(`http://${address}/metrics`)
  if (response.status !== 200) throw new Error(`GET /metrics answered ${response.status}`)
  if (!(response.headers.get("content-type") ?? "").startsWith("text/plain")) {
    throw new Error(`GET /metrics answered ${response.headers.get("content-type")}, not text/plain`)
  }
  const samples: Array<Sample> = []
  for (const line of (await response.text()).split("\n")) {
    if (line === "" || line.startsWith("#")) continue
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line)
    if (match === null) throw new Error(`not a Prometheus sample line: ${line}`)
    const labels: Record<string, string> = {}
    for (const pair of (match[2] ?? "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
      labels[pair[1]!] = pair[2]!
    }
    samples.push({ name: match[1]!, labels, value: Number(match[3]) })
  }
  return samples
}

/** The value of the one sample named `name` whose labels include `labels`; fails when there is not exactly one. */
export const value = (
  samples: ReadonlyArray<Sample>,
  name: string,
  labels: Readonly<Record<string, string>> = {}
): number => {
  const found = samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
  if (found.length !== 1) {
    throw new Error(`${found.length} samples of ${name}${JSON.stringify(labels)} (expected one)`)
  }
  return found[0]!.value
}

/** The samples named `name`. */
export const all = (samples: ReadonlyArray<Sample>, name: string): ReadonlyArray<Sample> =>
  samples.filter((s) => s.name === name)

/** `GET path` of the endpoint: its status and JSON body. */
export const getJson = async (
  address: string,
  path: string
): Promise<{ readonly status: number; readonly body: Record<string, unknown> }> => {
  const response = await fetch(`http://${address}${path}`)
  return { status: response.status, body: (await response.json()) as Record<string, unknown> }
}

/** Polls `check` every 200 ms until it returns something, for up to `timeoutMs`; its last error otherwise. */
export const eventually = async <A>(what: string, check: () => Promise<A | undefined>, timeoutMs = 60_000) => {
  const deadline = Date.now() + timeoutMs
  let last: unknown
  while (Date.now() < deadline) {
    try {
      const found = await check()
      if (found !== undefined) return found
    } catch (e) {
      last = e
    }
    await new Promise((r) => setTimeout(r, 200))
  }
  throw new Error(`timed out waiting for ${what}${last === undefined ? "" : `: ${String(last)}`}`)
}
