/**
 * The CLI run as an operator runs it, as a child process of the test: its environment for a test cluster, its output
 * and exit, and waiting for a line it prints.
 */
import { spawn } from "node:child_process"
import { inject } from "vitest"
import type { NodeRunner } from "../../../../scripts/test-support/nodeRunner.js"
import { faultSettings } from "./clusterTest.js"

const envName = (key: string): string => `STRATA_${key.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase()}`

/** The environment of a test cluster's processes: its coordination (the test's ZooKeeper), namespace and settings. */
export const clusterEnv = (namespace: string): Record<string, string> => {
  const env: Record<string, string> = {
    ...(process.env as Record<string, string>),
    STRATA_COORDINATION: `zookeeper://${inject("zookeeper")}`,
    STRATA_NAMESPACE: namespace
  }
  for (const [key, value] of Object.entries(faultSettings)) env[envName(key)] = String(value)
  return env
}

/** A CLI run. */
export interface Run {
  /** Everything it printed so far, stdout and stderr. */
  readonly output: () => string
  readonly signal: (sig: NodeJS.Signals) => void
  /** Its exit: code (null when a signal ended it), stdout, stderr. */
  readonly exited: Promise<{ readonly code: number | null; readonly stdout: string; readonly stderr: string }>
}

/** Runs the bundled CLI (`runner`) with `args` in `env`. */
export const cli = (runner: NodeRunner, args: ReadonlyArray<string>, env: Record<string, string>): Run => {
  const child = spawn(process.execPath, runner.argv(args), { env, stdio: ["ignore", "pipe", "pipe"] })
  let stdout = ""
  let stderr = ""
  child.stdout.on("data", (c: Buffer) => {
    stdout += c.toString()
  })
  child.stderr.on("data", (c: Buffer) => {
    stderr += c.toString()
  })
  return {
    output: () => stdout + stderr,
    signal: (sig) => child.kill(sig),
    exited: new Promise((done) => child.on("close", (code) => done({ code, stdout, stderr })))
  }
}

/** Waits until `run` has printed something matching `pattern` (or fails if it exits first). */
export const printed = (run: Run, pattern: RegExp): Promise<void> =>
  new Promise((done, fail) => {
    let finished = false
    run.exited.then((r) => {
      if (!finished) fail(new Error(`exited (code ${r.code}) before printing ${pattern}: ${run.output()}`))
    })
    const check = () => {
      if (finished) return
      if (pattern.test(run.output())) {
        finished = true
        done()
      } else setTimeout(check, 50)
    }
    check()
  })
