// Coordinator failover time of the fenced election (docs/ARCHITECTURE.md, "Election and failover", "Benchmarks") on real ZooKeeper and etcd.
//
// POOL candidate processes (`packages/election/test/fixtures/candidate.ts`, bundled once with esbuild) campaign in a
// fresh namespace with the configured session timeout. The leader is killed KILLS times with `kill -9` (its session
// must expire) and KILLS times with SIGTERM (a clean close: it resigns and closes its session), alternating. Each
// failover is the time from sending the signal to this process seeing, through the election's `changes` stream (an
// observer session watching the leader node), a new leader registered with a higher epoch. After each failover a
// replacement candidate is started and the next kill waits until it has created its candidate node (plus 300 ms for
// its watch), so every kill hits a leader with waiting successors and no process is starting meanwhile.
//
// Figures per backend and kind: the median (value), p99 (nearest rank: with 20 samples, the largest), min and max,
// next to the configured session timeout. For kill -9 the session timeout is the reference (baseline): the failover
// cannot be shorter than the server's expiry of the dead session. ZooKeeper (minSessionTimeout 2000, tickTime 1000
// in scripts/services) expires sessions in tick-sized buckets; etcd expires the lease (TTL in whole seconds) with
// its lease checker. Needs ZooKeeper and etcd running (`./dev services up zookeeper etcd`).
//
// Environment (the results file is written only with the defaults):
//   BENCH_KILLS (20 of each kind), BENCH_SESSION_TIMEOUT_MS (2000), BENCH_BACKENDS (zookeeper,etcd),
//   BENCH_ZOOKEEPER (STRATA_ZK or 127.0.0.1:2181), BENCH_ETCD (STRATA_ETCD or 127.0.0.1:2379)
import type { Coordination } from "../packages/core/src/index.js"
import { connect } from "node:net"
import { Cause, Effect, Exit, Fiber, Layer, Logger, Option, Stream } from "effect"
import * as CoordinationElection from "../packages/election/src/CoordinationElection.js"
import * as EtcdCoordination from "../packages/election/src/EtcdCoordination.js"
import * as ZooKeeperCoordination from "../packages/election/src/ZooKeeperCoordination.js"
import { type CandidateRunner, candidateRunner } from "../packages/election/test/fixtures/bundle.js"
import { CandidateGroup, killAllCandidates } from "../packages/election/test/fixtures/candidates.js"
import { type BenchOutput, envInt, envString, type Figure, median, progress, round3 } from "./lib.js"

type Backend = "zookeeper" | "etcd"
type Kind = "kill9" | "sigterm"

const DEFAULTS = { kills: 20, sessionTimeoutMs: 2000, backends: ["zookeeper", "etcd"] } as const
/** Candidate processes alive at each kill (the leader and its waiting successors). */
const POOL = 3
const ROOT = "/strata-bench-failover"
/** Time for a new candidate to set its predecessor watch after creating its node. */
const WATCH_SETTLE_MS = 300

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** Fails with a clear message when nothing listens at `address` (host:port). */
const reachable = (name: string, address: string): Promise<void> =>
  new Promise((resolve, reject) => {
    const colon = address.lastIndexOf(":")
    const socket = connect({ host: address.slice(0, colon), port: Number(address.slice(colon + 1)) })
    const fail = (detail: string) => {
      socket.destroy()
      reject(
        new Error(
          `failover bench: ${name} is not reachable at ${address} (${detail}); start it with \`./dev services up zookeeper etcd\``
        )
      )
    }
    socket.setTimeout(3_000, () => fail("timed out"))
    socket.once("error", (error) => fail(error.message))
    socket.once("connect", () => {
      socket.end()
      resolve()
    })
  })

/** A leader seen by the observer, with when this process saw it (performance.now()). */
interface Seen {
  readonly serverId: number
  readonly epoch: number
  readonly at: number
}

/** Follows the election's `changes` from this process: every registered leader, in order. */
const observe = (backend: Backend, address: string, namespace: string, sessionTimeoutMs: number) => {
  const seen: Array<Seen> = []
  let failure: string | undefined
  const coordination: Layer.Layer<Coordination.Coordination, Coordination.CoordinationError> =
    backend === "zookeeper"
      ? ZooKeeperCoordination.layer({ connectString: address, root: ROOT, sessionTimeout: sessionTimeoutMs })
      : EtcdCoordination.layer({ endpoints: [`http://${address}`], root: ROOT, sessionTimeout: sessionTimeoutMs })
  const election = CoordinationElection.layer({ namespace, sessionTimeout: `${sessionTimeoutMs} millis` }).pipe(
    Layer.provide(coordination)
  )
  const program = Effect.gen(function* () {
    const service = yield* CoordinationElection.CoordinationElection
    yield* Stream.runForEach(service.changes, (leader) =>
      Effect.sync(() => {
        if (Option.isSome(leader)) {
          seen.push({ serverId: leader.value.serverId, epoch: leader.value.epoch, at: performance.now() })
        }
      })
    )
  }).pipe(Effect.provide(election), Effect.provide(Logger.layer([])))
  const fiber = Effect.runFork(program)
  fiber.addObserver((exit) => {
    if (Exit.isFailure(exit) && !Cause.hasInterruptsOnly(exit.cause)) failure = Cause.pretty(exit.cause).slice(0, 800)
  })
  return {
    seen,
    failure: () => failure,
    stop: () => Effect.runPromise(Fiber.interrupt(fiber))
  }
}

/** Nearest-rank percentile. */
const percentile = (samples: ReadonlyArray<number>, p: number): number => {
  const sorted = [...samples].sort((a, b) => a - b)
  return sorted[Math.max(0, Math.ceil((p / 100) * sorted.length) - 1)] ?? Number.NaN
}

interface Samples {
  readonly kill9: Array<number>
  readonly sigterm: Array<number>
  /** The same failovers timed by the new leader's own report (its `leader` line, Date.now() in the child). */
  readonly childKill9: Array<number>
  readonly childSigterm: Array<number>
}

/** Runs `kills` failovers of each kind on one backend. */
const measure = async (
  runner: CandidateRunner,
  backend: Backend,
  address: string,
  kills: number,
  sessionTimeoutMs: number
): Promise<Samples> => {
  const namespace = `failover-${backend}-${Date.now()}-${Math.floor(Math.random() * 1e9)}`
  const group = new CandidateGroup(runner, backend, address, namespace, sessionTimeoutMs, ROOT)
  const observer = observe(backend, address, namespace, sessionTimeoutMs)
  const samples: Samples = { kill9: [], sigterm: [], childKill9: [], childSigterm: [] }
  const observed = () => {
    const failure = observer.failure()
    if (failure !== undefined) throw new Error(`failover bench (${backend}): the observer failed: ${failure}`)
    return observer.seen.at(-1)
  }
  try {
    let nextId = 1
    for (; nextId <= POOL; nextId++) group.start(nextId)
    for (let round = 0; round < 2 * kills; round++) {
      const kind: Kind = round % 2 === 0 ? "kill9" : "sigterm"
      // Steady state: POOL live candidates with their nodes, one leader, and the observer has seen it.
      await group.waitUntil(
        "the candidates and a leader seen by the observer",
        () => {
          const leaders = [...group.leaders().entries()]
          const last = observed()
          return (
            group.candidateNames().size >= POOL &&
            leaders.length === 1 &&
            last !== undefined &&
            last.serverId === leaders[0]?.[0] &&
            last.epoch === leaders[0]?.[1]
          )
        },
        60_000
      )
      await sleep(WATCH_SETTLE_MS)
      const [leader, epoch] = [...group.leaders().entries()][0] ?? [0, 0]
      const mark = group.events.length
      const t0 = performance.now()
      const wallT0 = Date.now()
      group.signal(leader, kind === "kill9" ? "SIGKILL" : "SIGTERM")
      const deadline = t0 + sessionTimeoutMs + 15_000
      let next: Seen | undefined
      while (next === undefined) {
        const last = observed()
        if (last !== undefined && last.epoch > epoch) next = observer.seen.find((s) => s.epoch > epoch)
        else if (performance.now() > deadline) throw new Error(group.describe(`no new leader seen after ${kind}`))
        else await sleep(2)
      }
      const child = await group.waitFor(
        "the new leader's report",
        (e) => e.event === "leader" && (e.epoch ?? 0) > epoch,
        10_000,
        mark
      )
      const ms = next.at - t0
      const childMs = child.at - wallT0
      if (kind === "kill9") {
        samples.kill9.push(ms)
        samples.childKill9.push(childMs)
      } else {
        samples.sigterm.push(ms)
        samples.childSigterm.push(childMs)
      }
      progress(
        `failover ${backend} ${kind} #${Math.floor(round / 2) + 1}: ${ms.toFixed(1)} ms (leader ${leader}@${epoch} -> ${next.serverId}@${next.epoch})`
      )
      group.start(nextId)
      const id = nextId
      nextId++
      await group.waitFor(`candidate ${id}'s node`, (e) => e.event === "candidate" && e.serverId === id, 30_000, mark)
    }
    return samples
  } finally {
    await group.stopAll()
    await observer.stop()
  }
}

const summary = (samples: ReadonlyArray<number>) => ({
  median: round3(median(samples)),
  p99: round3(percentile(samples, 99)),
  min: round3(Math.min(...samples)),
  max: round3(Math.max(...samples)),
  mean: round3(samples.reduce((a, b) => a + b, 0) / samples.length)
})

export const run = async (): Promise<BenchOutput & { readonly save: boolean }> => {
  const kills = envInt("BENCH_KILLS", DEFAULTS.kills)
  const sessionTimeoutMs = envInt("BENCH_SESSION_TIMEOUT_MS", DEFAULTS.sessionTimeoutMs)
  const backends = (envString("BENCH_BACKENDS") ?? DEFAULTS.backends.join(",")).split(",").filter((b) => b !== "")
  for (const b of backends) {
    if (b !== "zookeeper" && b !== "etcd") throw new Error(`BENCH_BACKENDS: unknown backend ${b}`)
  }
  const addresses: Record<Backend, string> = {
    zookeeper: envString("BENCH_ZOOKEEPER") ?? envString("STRATA_ZK") ?? "127.0.0.1:2181",
    etcd: envString("BENCH_ETCD") ?? envString("STRATA_ETCD") ?? "127.0.0.1:2379"
  }
  const save =
    kills === DEFAULTS.kills &&
    sessionTimeoutMs === DEFAULTS.sessionTimeoutMs &&
    backends.join(",") === DEFAULTS.backends.join(",")
  for (const b of backends as ReadonlyArray<Backend>) {
    await reachable(b === "zookeeper" ? "ZooKeeper" : "etcd", addresses[b])
  }

  progress(`failover: ${kills} kill -9 and ${kills} SIGTERM per backend, session timeout ${sessionTimeoutMs} ms`)
  const runner = await candidateRunner()
  process.once("exit", killAllCandidates)
  const results: Array<Figure> = []
  const details: Record<string, unknown> = {
    candidates: `${POOL} candidate processes (${runner.kind === "bundle" ? "esbuild bundle" : "tsx"}), one replaced after each kill`,
    timing:
      "signal sent -> a leader with a higher epoch seen through the election's changes stream (leader node watch) in the bench process",
    baseline: "kill -9 figures: the configured session timeout (the dead session's expiry bounds the failover)",
    p99: `nearest rank over ${kills} samples`
  }
  try {
    for (const backend of backends as ReadonlyArray<Backend>) {
      const samples = await measure(runner, backend, addresses[backend], kills, sessionTimeoutMs)
      const kill9 = summary(samples.kill9)
      const sigterm = summary(samples.sigterm)
      const common = { kills, sessionTimeoutMs, candidates: POOL, node: process.version }
      results.push(
        {
          bench: `failover.${backend}.kill9`,
          value: kill9.median,
          unit: "ms",
          baseline: sessionTimeoutMs,
          ratio: round3(kill9.median / sessionTimeoutMs),
          p99: kill9.p99,
          min: kill9.min,
          max: kill9.max,
          ...common
        },
        {
          bench: `failover.${backend}.sigterm`,
          value: sigterm.median,
          unit: "ms",
          p99: sigterm.p99,
          min: sigterm.min,
          max: sigterm.max,
          ...common
        }
      )
      details[backend] = {
        address: addresses[backend],
        kill9: { ...kill9, samples: samples.kill9.map(round3) },
        sigterm: { ...sigterm, samples: samples.sigterm.map(round3) },
        reportedByNewLeader: {
          note: "signal -> the new leader's own `leader` line (child clock, ms resolution)",
          kill9: summary(samples.childKill9),
          sigterm: summary(samples.childSigterm)
        }
      }
    }
  } finally {
    killAllCandidates()
    await runner.dispose()
  }
  return { results, details, save }
}
