/**
 * A Strata cluster as real child processes for the fault tests: `strata coordinator` and `strata tablet-server`
 * (the CLI bundled once with esbuild), each configured through the environment, each tablet server on a RocksDB
 * directory of its own that survives its restarts. A test kills them with SIGKILL, pauses them with SIGSTOP and
 * SIGCONT, and starts them again; every process's output goes to a log file for a failure's report.
 *
 * With `proxied`, each tablet server is reached only through TCP proxies of its own (`tcpProxy.ts`), which outlive
 * its restarts: its RPC and its data link listen on loopback ports picked once for it and it advertises a proxy's
 * address for each, and it reaches coordination through a third proxy (its own `STRATA_COORDINATION`). A test so
 * cuts a server off from its peers, clients and the controller (its inbound proxies), from replication alone (its
 * data link's), or from coordination alone, and resets its connections, while the process runs on.
 *
 * `impostor` starts a second `tablet-server` with a running server's id (a data directory of its own): it must wait
 * for the id and never act for it.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { createWriteStream, mkdirSync, readFileSync, type WriteStream } from "node:fs"
import net from "node:net"
import { join } from "node:path"
import { Effect } from "effect"
import type { NodeRunner } from "./nodeRunner.js"
import { startProxy, type TcpProxy } from "./tcpProxy.js"

/** The two kinds of process. */
export type Kind = "coordinator" | "tablet-server"

/** One process of the cluster, while it runs. */
interface Running {
  readonly child: ChildProcess
  readonly exited: Promise<void>
  paused: boolean
}

/** The proxies a tablet server is reached (and reaches coordination) through, with `proxied`. */
export interface ServerProxies {
  /** To its RPC listener: what it advertises (`advertise`). */
  readonly rpc: TcpProxy
  /** To its data link (`dataAdvertise`). */
  readonly data: TcpProxy
  /** From it to the coordination service (its `coordination`). */
  readonly coordination: TcpProxy
  /** Where its RPC and data link listen (fixed for its life in the cluster). */
  readonly listen: { readonly rpc: string; readonly data: string }
}

/** A second `tablet-server` started with a running server's id. */
export interface Impostor {
  readonly id: number
  /** Its name in the logs (`impostor-<id>-<n>`). */
  readonly name: string
  readonly pid: number | undefined
  /** Resolves when it says it waits for the id (or exits). */
  readonly waiting: Promise<void>
  /** Its exit. */
  readonly exited: Promise<{ readonly code: number | null; readonly signal: NodeJS.Signals | null }>
  /** What it printed on stdout and on stderr. */
  readonly stdout: () => string
  readonly stderr: () => string
  /** SIGTERM, and its exit. */
  readonly terminate: () => Promise<{ readonly code: number | null; readonly signal: NodeJS.Signals | null }>
}

/** The cluster's processes. */
export interface ProcessCluster {
  /** Starts a process (again, on the same data directory) and waits until it says it is ready. */
  readonly start: (kind: Kind, id: number) => Effect.Effect<void, Error>
  /** SIGKILL, and waits for the exit. */
  readonly kill: (kind: Kind, id: number) => Effect.Effect<void>
  /** SIGTERM (a controlled shutdown), and waits for the exit. */
  readonly stop: (kind: Kind, id: number) => Effect.Effect<void>
  /** SIGSTOP. */
  readonly pause: (kind: Kind, id: number) => void
  /** SIGCONT. */
  readonly resume: (kind: Kind, id: number) => void
  readonly isRunning: (kind: Kind, id: number) => boolean
  readonly isPaused: (kind: Kind, id: number) => boolean
  /** The ids of `kind` that run (paused ones included). */
  readonly running: (kind: Kind) => ReadonlyArray<number>
  /** The OS process id of a running process. */
  readonly pid: (kind: Kind, id: number) => number | undefined
  /** Everything a process has logged, over all its starts (empty before its first). */
  readonly log: (kind: Kind, id: number) => string
  /** The end of every process's log, for a failure's message. */
  readonly logTails: (lines: number) => string
  /** A tablet server's data directory (the same across its restarts; a test may mount a filesystem there first). */
  readonly dataDirectory: (id: number) => string
  /** Whether its tablet servers are behind proxies. */
  readonly proxied: boolean
  /** A tablet server's proxies (`proxied`), once it has been started. */
  readonly proxies: (id: number) => ServerProxies | undefined
  /** Starts a second `tablet-server --id <id>` on a data directory of its own (direct to coordination). */
  readonly impostor: (id: number) => Impostor
  /** Kills every process (impostors too) and closes the proxies. */
  readonly killAll: Effect.Effect<void>
}

/** The cluster's settings: coordination, its namespace, and any `STRATA_` settings (`sessionTimeout`: …). */
export interface ProcessClusterOptions {
  readonly runner: NodeRunner
  readonly coordination: string
  readonly namespace: string
  /** Where each tablet server's data directory and every log file go. */
  readonly directory: string
  readonly settings: Readonly<Record<string, string | number | boolean>>
  /** How long a start may take to print its ready line (30 s). */
  readonly readyTimeoutMs?: number
  /** Each tablet server behind proxies of its own (see the module's comment). */
  readonly proxied?: boolean
}

/** Ports below the system's ephemeral range, so that no outgoing connection holds one while its server is down. */
const PORTS = { from: 20_000, to: 32_000 } as const
const reserved = new Set<number>()

/** A loopback port nothing listens on now, below the ephemeral range, not handed out before by this process. */
const freePort = async (): Promise<number> => {
  for (let attempt = 0; attempt < 200; attempt++) {
    const port = PORTS.from + Math.floor(Math.random() * (PORTS.to - PORTS.from))
    if (reserved.has(port)) continue
    const free = await new Promise<boolean>((done) => {
      const probe = net.createServer()
      probe.once("error", () => done(false))
      probe.listen(port, "127.0.0.1", () => probe.close(() => done(true)))
    })
    if (free) {
      reserved.add(port)
      return port
    }
  }
  throw new Error(`no free loopback port in ${PORTS.from}-${PORTS.to}`)
}

/** `scheme://host:port[/chroot]` → its one `host:port` and a function putting another in its place. */
const coordinationTarget = (url: string) => {
  const match = /^([a-z]+):\/\/([^/,]+)(\/.*)?$/.exec(url)
  if (match === null) throw new Error(`proxied: expected a coordination URL with one host:port, got ${url}`)
  return { target: match[2]!, through: (address: string) => `${match[1]}://${address}${match[3] ?? ""}` }
}

const envName = (key: string): string => `STRATA_${key.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase()}`

/** Starts nothing yet: the test starts the processes it wants. */
export const make = (options: ProcessClusterOptions): ProcessCluster => {
  const running = new Map<string, Running>()
  const logs = new Map<string, string>()
  const streams = new Map<string, WriteStream>()
  mkdirSync(options.directory, { recursive: true })
  const env: Record<string, string> = {
    ...(process.env as Record<string, string>),
    STRATA_COORDINATION: options.coordination,
    STRATA_NAMESPACE: options.namespace
  }
  for (const [key, value] of Object.entries(options.settings)) env[envName(key)] = String(value)
  const name = (kind: Kind, id: number) => `${kind}-${id}`

  const dataDirectory = (id: number) => join(options.directory, `data-${id}`)
  const proxies = new Map<number, ServerProxies>()
  const openProxies = new Set<TcpProxy>()
  /** A tablet server's proxies, started at its first start. */
  const proxiesOf = async (id: number): Promise<ServerProxies> => {
    const found = proxies.get(id)
    if (found !== undefined) return found
    const coordination = coordinationTarget(options.coordination)
    const listen = { rpc: `127.0.0.1:${await freePort()}`, data: `127.0.0.1:${await freePort()}` }
    const made: ServerProxies = {
      rpc: await startProxy(listen.rpc),
      data: await startProxy(listen.data),
      coordination: await startProxy(coordination.target),
      listen
    }
    for (const p of [made.rpc, made.data, made.coordination]) openProxies.add(p)
    proxies.set(id, made)
    return made
  }
  /** The environment of a tablet server's start: through its proxies, with `proxied`. */
  const envOf = (kind: Kind, id: number): Effect.Effect<Record<string, string>> =>
    options.proxied !== true || kind !== "tablet-server"
      ? Effect.succeed(env)
      : Effect.map(
          Effect.promise(() => proxiesOf(id)),
          (p) => ({
            ...env,
            STRATA_COORDINATION: coordinationTarget(options.coordination).through(p.coordination.address),
            STRATA_LISTEN: p.listen.rpc,
            STRATA_ADVERTISE: p.rpc.address,
            STRATA_DATA_LISTEN: p.listen.data,
            STRATA_DATA_ADVERTISE: p.data.address
          })
        )

  const start = (kind: Kind, id: number) => Effect.flatMap(envOf(kind, id), (env) => spawnReady(kind, id, env))

  const spawnReady = (kind: Kind, id: number, env: Record<string, string>) =>
    Effect.callback<void, Error>((resume) => {
      const key = name(kind, id)
      if (running.has(key)) {
        resume(Effect.fail(new Error(`${key} runs already`)))
        return
      }
      const log = join(options.directory, `${key}.log`)
      logs.set(key, log)
      let stream = streams.get(key)
      if (stream === undefined) {
        stream = createWriteStream(log, { flags: "a" })
        streams.set(key, stream)
      }
      stream.write(`--- start ${new Date().toISOString()}\n`)
      const args =
        kind === "coordinator"
          ? ["coordinator", "--id", String(id)]
          : ["tablet-server", "--id", String(id), "--data", dataDirectory(id)]
      const child = spawn(process.execPath, options.runner.argv(args), { env, stdio: ["ignore", "pipe", "pipe"] })
      let ready = false
      let buffered = ""
      const timer = setTimeout(() => {
        if (!ready) resume(Effect.fail(new Error(`${key} was not ready within ${options.readyTimeoutMs ?? 30_000} ms`)))
      }, options.readyTimeoutMs ?? 30_000)
      const onData = (chunk: Buffer) => {
        stream.write(chunk)
        if (ready) return
        buffered += chunk.toString()
        if (/ ready at /.test(buffered)) {
          ready = true
          clearTimeout(timer)
          resume(Effect.void)
        }
      }
      child.stdout!.on("data", onData)
      child.stderr!.on("data", onData)
      const exited = new Promise<void>((done) => {
        child.on("exit", (code, signal) => {
          stream.write(`--- exit code ${code} signal ${signal}\n`)
          if (running.get(key)?.child === child) running.delete(key)
          if (!ready) {
            clearTimeout(timer)
            resume(Effect.fail(new Error(`${key} exited (code ${code}, signal ${signal}) before it was ready`)))
          }
          done()
        })
      })
      running.set(key, { child, exited, paused: false })
    })

  const readLog = (key: string) => {
    const file = logs.get(key)
    if (file === undefined) return ""
    try {
      return readFileSync(file, "utf8")
    } catch {
      return ""
    }
  }

  const signal = (kind: Kind, id: number, sig: NodeJS.Signals) =>
    Effect.promise(async () => {
      const r = running.get(name(kind, id))
      if (r === undefined) return
      if (r.paused && sig !== "SIGKILL") r.child.kill("SIGCONT")
      r.child.kill(sig)
      await r.exited
    })

  const impostors = new Set<ChildProcess>()
  let impostorCount = 0
  const impostor = (id: number): Impostor => {
    const key = `impostor-${id}-${++impostorCount}`
    const log = join(options.directory, `${key}.log`)
    logs.set(key, log)
    const stream = createWriteStream(log, { flags: "a" })
    streams.set(key, stream)
    stream.write(`--- start ${new Date().toISOString()}\n`)
    const child = spawn(
      process.execPath,
      options.runner.argv(["tablet-server", "--id", String(id), "--data", join(options.directory, `data-${key}`)]),
      { env, stdio: ["ignore", "pipe", "pipe"] }
    )
    impostors.add(child)
    let stdout = ""
    let stderr = ""
    let saidWaiting: () => void = () => {}
    const waiting = new Promise<void>((done) => {
      saidWaiting = done
    })
    child.stdout!.on("data", (chunk: Buffer) => {
      stream.write(chunk)
      stdout += chunk.toString()
      if (/is registered by another session/.test(stdout)) saidWaiting()
    })
    child.stderr!.on("data", (chunk: Buffer) => {
      stream.write(chunk)
      stderr += chunk.toString()
    })
    const exited = new Promise<{ readonly code: number | null; readonly signal: NodeJS.Signals | null }>((done) => {
      child.on("close", (code, signal) => {
        stream.write(`--- exit code ${code} signal ${signal}\n`)
        impostors.delete(child)
        saidWaiting()
        done({ code, signal })
      })
    })
    return {
      id,
      name: key,
      pid: child.pid,
      waiting,
      exited,
      stdout: () => stdout,
      stderr: () => stderr,
      terminate: () => {
        child.kill("SIGTERM")
        return exited
      }
    }
  }

  return {
    start,
    kill: (kind, id) => signal(kind, id, "SIGKILL"),
    stop: (kind, id) => signal(kind, id, "SIGTERM"),
    pause: (kind, id) => {
      const r = running.get(name(kind, id))
      if (r === undefined || r.paused) return
      r.paused = true
      r.child.kill("SIGSTOP")
    },
    resume: (kind, id) => {
      const r = running.get(name(kind, id))
      if (r === undefined || !r.paused) return
      r.paused = false
      r.child.kill("SIGCONT")
    },
    isRunning: (kind, id) => running.has(name(kind, id)),
    pid: (kind, id) => running.get(name(kind, id))?.child.pid,
    isPaused: (kind, id) => running.get(name(kind, id))?.paused === true,
    running: (kind) =>
      [...running.keys()].filter((k) => k.startsWith(`${kind}-`)).map((k) => Number(k.slice(kind.length + 1))),
    log: (kind, id) => readLog(name(kind, id)),
    logTails: (lines) =>
      [...logs.keys()].map((key) => `==> ${key}\n${readLog(key).split("\n").slice(-lines).join("\n")}`).join("\n"),
    dataDirectory,
    proxied: options.proxied === true,
    proxies: (id) => proxies.get(id),
    impostor,
    killAll: Effect.promise(async () => {
      const all = [...running.values()]
      for (const r of all) r.child.kill("SIGKILL")
      const others = [...impostors]
      for (const child of others) child.kill("SIGKILL")
      await Promise.all([
        ...all.map((r) => r.exited),
        ...others.map((child) => new Promise((done) => child.once("close", done)))
      ])
      await Promise.all([...openProxies].map((p) => p.close()))
      openProxies.clear()
      for (const s of streams.values()) s.end()
    })
  }
}
