/**
 * A Strata cluster as real child processes for the fault tests: `strata coordinator` and `strata tablet-server`
 * (the CLI bundled once with esbuild), each configured through the environment, each tablet server on a RocksDB
 * directory of its own that survives its restarts. A test kills them with SIGKILL, pauses them with SIGSTOP and
 * SIGCONT, and starts them again; every process's output goes to a log file for a failure's report.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { createWriteStream, mkdirSync, readFileSync, type WriteStream } from "node:fs"
import { join } from "node:path"
import { Effect } from "effect"
import type { NodeRunner } from "./nodeRunner.js"

/** The two kinds of process. */
export type Kind = "coordinator" | "tablet-server"

/** One process of the cluster, while it runs. */
interface Running {
  readonly child: ChildProcess
  readonly exited: Promise<void>
  paused: boolean
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
  /** Kills every process. */
  readonly killAll: Effect.Effect<void>
}

/** The cluster's settings: coordination, its namespace, and any `STRATA_` settings (`sessionTimeoutMs`: …). */
export interface ProcessClusterOptions {
  readonly runner: NodeRunner
  readonly coordination: string
  readonly namespace: string
  /** Where each tablet server's data directory and every log file go. */
  readonly directory: string
  readonly settings: Readonly<Record<string, string | number | boolean>>
  /** How long a start may take to print its ready line (30 s). */
  readonly readyTimeoutMs?: number
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

  const start = (kind: Kind, id: number) =>
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
          : ["tablet-server", "--id", String(id), "--data", join(options.directory, `data-${id}`)]
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
    killAll: Effect.promise(async () => {
      const all = [...running.values()]
      for (const r of all) r.child.kill("SIGKILL")
      await Promise.all(all.map((r) => r.exited))
      for (const s of streams.values()) s.end()
    })
  }
}
