/**
 * One run of a real child process for kill tests: spawn it, split its stdout into lines for the test, keep the tail
 * of its stderr, SIGKILL it on the test's cue with a deadline for its exit, and settle once with the test's outcome
 * or a `HarnessError` (the harness went wrong: not a verdict on what the child runs). Interrupting the run (a test
 * timeout) kills the child too.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { rm } from "node:fs/promises"
import { Data, Effect } from "effect"
import { afterAll, beforeAll } from "vitest"
import { type NodeRunner, nodeRunner, tsxRunner } from "./nodeRunner.js"

/** The harness itself went wrong (spawn failed, the child hung, died by itself or did not exit after SIGKILL). */
export class HarnessError extends Data.TaggedError("HarnessError")<{ readonly detail: string }> {
  override get message() {
    return this.detail
  }
}

/** What a test can do to its child while it runs. */
export interface ChildControl {
  /** Milliseconds since the spawn. */
  readonly elapsed: () => number
  /** Sends SIGKILL now (once); the child must then exit within the run's `exitTimeoutMs`. */
  readonly kill: () => void
  /** Sends SIGKILL after `delayMs` (at once for 0). */
  readonly killAfter: (delayMs: number) => void
  /** Whether SIGKILL was sent. */
  readonly killed: () => boolean
  /** Fails the run with `detail` (the stderr tail is added) and kills the child. */
  readonly fail: (detail: string) => void
  /** Runs `f` after `ms` unless the run has settled. */
  readonly after: (ms: number, f: () => void) => void
  /** Runs `f` every `ms` until the run settles. */
  readonly every: (ms: number, f: () => void) => void
}

/** How the child ended, for the test's verdict on the run. */
export interface ChildExit {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
  /** Whether the test killed it. */
  readonly killed: boolean
}

/** A run: the test's outcome, or the reason the harness failed (the stderr tail is added). */
export type RunVerdict<A> = { readonly outcome: A } | { readonly failure: string }

/** A test file's child program: how to start it, the children alive and the directories to remove afterwards. */
export interface ChildHarness {
  /** The bundle (or the tsx fallback) once `beforeAll` has built it. */
  readonly runner: NodeRunner
  /** Children alive: killed in `afterAll` if a test left any behind. */
  readonly live: Set<ChildProcess>
  /** Directories removed in `afterAll`. */
  readonly tempDirs: Array<string>
}

/**
 * Registers the file's `beforeAll` (bundle `source` once with esbuild, `external` drivers kept as installed; or run
 * it under tsx when `preferTsx`) and `afterAll` (kill what is left, remove `tempDirs`, remove the bundle).
 */
export const childHarness = (options: {
  readonly label: string
  readonly source: string
  readonly external: ReadonlyArray<string>
  readonly preferTsx: boolean
}): ChildHarness => {
  let runner: NodeRunner = tsxRunner(options.source)
  const live = new Set<ChildProcess>()
  const tempDirs: Array<string> = []
  beforeAll(async () => {
    runner = await nodeRunner(options.label, options.source, [...options.external], options.preferTsx)
  }, 60_000)
  afterAll(async () => {
    for (const child of live) child.kill("SIGKILL")
    for (const directory of tempDirs) await rm(directory, { recursive: true, force: true })
    await runner.dispose()
  })
  return {
    get runner() {
      return runner
    },
    live,
    tempDirs
  }
}

/** A non-negative integer knob from the environment, `fallback` when unset. */
export const envInt = (name: string, fallback: number): number => {
  const text = process.env[name]
  if (text === undefined || text === "") return fallback
  const n = Number(text)
  if (!Number.isSafeInteger(n) || n < 0) throw new Error(`${name} must be a non-negative integer, got ${text}`)
  return n
}

/**
 * How to rerun a seeded test: `seed=N (rerun: <SEED_VAR>=N <other knobs of the prefix set now> … vitest run …)`, so
 * a failure printed in CI can be replayed as it ran.
 */
export const rerunCommand = (options: {
  readonly seedVar: string
  readonly seed: number
  readonly project: "unit" | "integration"
  readonly file: string
}): string => {
  const prefix = options.seedVar.slice(0, options.seedVar.lastIndexOf("_") + 1)
  const knobs = Object.entries(process.env)
    .filter(([name, value]) => name.startsWith(prefix) && name !== options.seedVar && value)
    .map(([name, value]) => `${name}=${value} `)
    .join("")
  const keep = options.project === "integration" ? "STRATA_KEEP_SERVICES=1 " : ""
  return `seed=${options.seed} (rerun: ${options.seedVar}=${options.seed} ${knobs}${keep}./dev exec vitest run --project ${options.project} ${options.file})`
}

export interface ChildRunSpec<A> {
  /** What the child is called in messages ("child", "worker"). */
  readonly label: string
  /** The file's harness: its program and its live children. */
  readonly harness: ChildHarness
  /** Arguments after the program. */
  readonly args: ReadonlyArray<string>
  /** How long the child may take to exit after SIGKILL. */
  readonly exitTimeoutMs: number
  /** The encoding of the child's stdout (default utf8). */
  readonly encoding?: BufferEncoding
  /** Each line the child prints on stdout, without its newline. */
  readonly onLine: (line: string, control: ChildControl) => void
  /** Called once after the spawn: timers and kill plans. */
  readonly onStart?: (control: ChildControl) => void
  /** The verdict once the child has exited and no failure was set. */
  readonly onExit: (exit: ChildExit) => RunVerdict<A>
}

const STDERR_TAIL = 8192

/** Runs the child of `spec` to its end. */
export const runChild = <A>(spec: ChildRunSpec<A>): Effect.Effect<A, HarnessError> =>
  Effect.callback<A, HarnessError>((resume) => {
    const started = performance.now()
    const child = spawn(process.execPath, spec.harness.runner.argv(spec.args), { stdio: ["ignore", "pipe", "pipe"] })
    const live = spec.harness.live
    live.add(child)
    const timeouts: Array<ReturnType<typeof setTimeout>> = []
    const intervals: Array<ReturnType<typeof setInterval>> = []
    let killed = false
    let failure: string | undefined
    let settled = false
    let pending = ""
    let stderr = ""

    const settle = (effect: Effect.Effect<A, HarnessError>) => {
      if (settled) return
      settled = true
      for (const t of timeouts) clearTimeout(t)
      for (const t of intervals) clearInterval(t)
      resume(effect)
    }
    const harnessFailure = (detail: string) =>
      Effect.fail(new HarnessError({ detail: `${detail}; stderr:\n${stderr || "(empty)"}` }))
    const after = (ms: number, f: () => void) => {
      if (!settled) timeouts.push(setTimeout(f, ms))
    }
    const kill = () => {
      if (killed) return
      killed = true
      child.kill("SIGKILL")
      after(spec.exitTimeoutMs, () =>
        settle(
          Effect.fail(
            new HarnessError({
              detail: `${spec.label} ${child.pid} did not exit within ${spec.exitTimeoutMs} ms of SIGKILL`
            })
          )
        )
      )
    }
    const control: ChildControl = {
      elapsed: () => performance.now() - started,
      kill,
      killAfter: (delayMs) => (delayMs === 0 ? kill() : after(delayMs, kill)),
      killed: () => killed,
      fail: (detail) => {
        failure ??= detail
        kill()
      },
      after,
      every: (ms, f) => {
        if (!settled) intervals.push(setInterval(f, ms))
      }
    }

    child.stdout.setEncoding(spec.encoding ?? "utf8")
    child.stdout.on("data", (chunk: string) => {
      pending += chunk
      for (let nl = pending.indexOf("\n"); nl >= 0; nl = pending.indexOf("\n")) {
        const line = pending.slice(0, nl)
        pending = pending.slice(nl + 1)
        spec.onLine(line, control)
      }
    })
    child.stderr.setEncoding("utf8")
    child.stderr.on("data", (chunk: string) => {
      stderr = (stderr + chunk).slice(-STDERR_TAIL)
    })
    child.on("error", (error) => {
      live.delete(child)
      settle(Effect.fail(new HarnessError({ detail: `spawning the ${spec.label} failed: ${error.message}` })))
    })
    child.on("close", (code, signal) => {
      live.delete(child)
      if (failure !== undefined) {
        settle(harnessFailure(failure))
        return
      }
      const verdict = spec.onExit({ code, signal, killed })
      settle("outcome" in verdict ? Effect.succeed(verdict.outcome) : harnessFailure(verdict.failure))
    })
    spec.onStart?.(control)
    // Interrupted (test timeout): do not leave the child behind.
    return Effect.sync(() => {
      for (const t of timeouts) clearTimeout(t)
      for (const t of intervals) clearInterval(t)
      if (!killed) {
        killed = true
        child.kill("SIGKILL")
      }
    })
  })

/** A line of JSON from a child, or `undefined` for anything else it printed. */
export const parseJsonLine = <E>(line: string): E | undefined => {
  try {
    return JSON.parse(line) as E
  } catch {
    return undefined
  }
}
