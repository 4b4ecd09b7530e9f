// Benchmark phases that run in child processes of their own (docs/ARCHITECTURE.md, "Benchmarks"): each phase's peak
// RSS is its own and no phase inherits another's heap or JIT state. A child prints one result line; the parent
// kills a child that gives none in time.
import { spawn } from "node:child_process"
import { collectGarbage } from "./lib.js"

/** How a parent finds a child's result and how long it waits. */
export interface ChildProtocol {
  /** The flag the child is started with, followed by the spec as JSON. */
  readonly flag: string
  /** The prefix of the child's result line on stdout. */
  readonly prefix: string
  readonly timeoutMs: number
}

/**
 * Runs `command` with `args` as a child and returns its result line's value: the JSON after `protocol.prefix` on its
 * stdout. A child that gives none within `protocol.timeoutMs` is killed; `what` names it in the errors.
 */
export const runProgram = <R>(
  what: string,
  command: string,
  args: ReadonlyArray<string>,
  protocol: Omit<ChildProtocol, "flag">
): Promise<R> =>
  new Promise((resolvePromise, reject) => {
    const child = spawn(command, args, { stdio: ["ignore", "pipe", "inherit"] })
    // A phase that hangs fails the run instead of blocking it.
    let timedOut = false
    const timer = setTimeout(() => {
      timedOut = true
      child.kill("SIGKILL")
    }, protocol.timeoutMs)
    let out = ""
    child.stdout.setEncoding("utf8")
    child.stdout.on("data", (chunk: string) => {
      out += chunk
    })
    child.on("error", reject)
    child.on("close", (code) => {
      clearTimeout(timer)
      if (timedOut) {
        reject(new Error(`${what}: no result after ${protocol.timeoutMs / 1000} s, the child was killed`))
        return
      }
      const line = out.split("\n").find((l) => l.startsWith(protocol.prefix))
      if (code !== 0 || line === undefined) {
        reject(new Error(`${what}: the child exited with ${code} without a result`))
        return
      }
      resolvePromise(JSON.parse(line.slice(protocol.prefix.length)) as R)
    })
  })

/** Runs `file` (a bench module) as a child with this process's node and flags, and returns its result. */
export const runChild = <S extends { readonly phase: string }, R>(
  file: string,
  protocol: ChildProtocol,
  spec: S
): Promise<R> =>
  runProgram(spec.phase, process.execPath, [...process.execArgv, file, protocol.flag, JSON.stringify(spec)], protocol)

/** Prints a child's result line and exits once it is out (a client's leftover timers must not keep it alive). */
export const reportFromChild = (protocol: ChildProtocol, result: unknown): void => {
  process.stdout.write(`${protocol.prefix}${JSON.stringify(result)}\n`, () => process.exit(0))
}

/** What `measure` saw of a timed part. */
export interface Measured<A> {
  readonly value: A
  readonly ms: number
  /** User + system CPU time of the process (every thread). */
  readonly cpuMs: number
  /** CPU time of the JavaScript thread alone. */
  readonly mainCpuMs: number
  readonly rssBeforeMB: number
  readonly rssSampledPeakMB: number
  /** The process's maxRSS at the end of the timed part (its whole life up to then). */
  readonly peakRssMB: number
}

/** Wall and CPU time and RSS of a timed part (RSS sampled every 100 ms, then the process's maxRSS). */
export const measure = async <A>(f: () => Promise<A>, onSample?: () => void): Promise<Measured<A>> => {
  collectGarbage()
  const rssBefore = process.memoryUsage().rss
  let sampled = rssBefore
  const sampler = setInterval(() => {
    sampled = Math.max(sampled, process.memoryUsage().rss)
    onSample?.()
  }, 100)
  const cpu0 = process.cpuUsage()
  const main0 = process.threadCpuUsage()
  const t0 = performance.now()
  try {
    const value = await f()
    const ms = performance.now() - t0
    const cpu = process.cpuUsage(cpu0)
    const main = process.threadCpuUsage(main0)
    sampled = Math.max(sampled, process.memoryUsage().rss)
    const mb = (bytes: number) => Math.round(bytes / 2 ** 20)
    return {
      value,
      ms,
      cpuMs: (cpu.user + cpu.system) / 1000,
      mainCpuMs: (main.user + main.system) / 1000,
      rssBeforeMB: mb(rssBefore),
      rssSampledPeakMB: mb(sampled),
      peakRssMB: Math.round(process.resourceUsage().maxRSS / 1024)
    }
  } finally {
    clearInterval(sampler)
  }
}
