/**
 * A local cluster in one command (`strata cluster up`, `strata cluster down`): coordinators and tablet servers
 * started as detached child processes of this same CLI, each logging to a file of the cluster's directory, each
 * serving its ops endpoint on a loopback port of its own. The directory's `cluster.json` (`ClusterFile`) says what
 * runs there: the coordination and namespace, and each process's kind, id, pid, arguments, RPC address and ops
 * endpoint. `RollingRestart` restarts the processes it lists.
 *
 * A process is started again by the CLI that runs the command (`process.execPath` with this process's exec
 * arguments and entry script), so it works under tsx as when bundled, and a rolling restart after an upgrade runs
 * the new version.
 *
 * @since 0.1.0
 */
import { type ChildProcess, spawn } from "node:child_process"
import {
  closeSync,
  existsSync,
  mkdirSync,
  openSync,
  readFileSync,
  readdirSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync
} from "node:fs"
import { join, resolve } from "node:path"
import { Clock, Console, Data, Duration, Effect, Option, Schema } from "effect"
import * as ServerConfig from "./ServerConfig.js"

// ---------------------------------------------------------------------------
// The cluster's file
// ---------------------------------------------------------------------------

/**
 * The two kinds of process.
 *
 * @since 0.1.0
 */
export const Kind = Schema.Literals(["coordinator", "tablet-server"])

/** @since 0.1.0 */
export type Kind = typeof Kind.Type

/**
 * One process of the cluster as `cluster.json` holds it: `args` are the CLI's arguments it runs with (after the
 * entry), `address` its RPC address and `ops` its ops endpoint (`http://host:port`) once it said so.
 *
 * @since 0.1.0
 */
export const ClusterProcess = Schema.Struct({
  kind: Kind,
  id: Schema.Int,
  pid: Schema.Int,
  args: Schema.Array(Schema.String),
  log: Schema.String,
  data: Schema.optional(Schema.String),
  address: Schema.optional(Schema.String),
  ops: Schema.optional(Schema.String)
})

/** @since 0.1.0 */
export type ClusterProcess = typeof ClusterProcess.Type

/**
 * `cluster.json`: the cluster a `strata cluster up` started in its directory. `env` holds the `STRATA_` variables
 * its processes were started with (they are started again with them), `config` the `--config` file, if any.
 *
 * @since 0.1.0
 */
export const ClusterFile = Schema.Struct({
  coordination: Schema.String,
  namespace: Schema.String,
  config: Schema.optional(Schema.String),
  env: Schema.Record(Schema.String, Schema.String),
  processes: Schema.Array(ClusterProcess)
})

/** @since 0.1.0 */
export type ClusterFile = typeof ClusterFile.Type

/**
 * Where coordination is when `strata cluster up` is given none: what `./dev services up zookeeper` starts.
 *
 * @since 0.1.0
 */
export const defaultCoordination = "zookeeper://127.0.0.1:2181"

/**
 * The file's path in a cluster's directory.
 *
 * @since 0.1.0
 */
export const fileOf = (dir: string): string => join(resolve(dir), "cluster.json")

/**
 * A process as lines name it: `coordinator 101`, `tablet server 1`.
 *
 * @since 0.1.0
 */
export const labelOf = (p: { readonly kind: Kind; readonly id: number }): string =>
  p.kind === "coordinator" ? `coordinator ${p.id}` : `tablet server ${p.id}`

/**
 * `cluster.json` cannot be read as a cluster's file.
 *
 * @since 0.1.0
 */
export class InvalidClusterFile extends Data.TaggedError("InvalidClusterFile")<{
  readonly path: string
  readonly detail: string
}> {
  /** @since 0.1.0 */
  override get message(): string {
    return `${this.path} cannot be read: ${this.detail}; remove it if no cluster runs there`
  }
}

/**
 * The directory has no `cluster.json`: no `strata cluster up` started a cluster there.
 *
 * @since 0.1.0
 */
export class NoClusterFile extends Data.TaggedError("NoClusterFile")<{ readonly dir: string }> {
  /** @since 0.1.0 */
  override get message(): string {
    return `no cluster.json in ${this.dir}: strata cluster up --dir ${this.dir} starts a cluster there`
  }
}

/**
 * `strata cluster up` on a directory whose processes still run.
 *
 * @since 0.1.0
 */
export class ClusterRunning extends Data.TaggedError("ClusterRunning")<{
  readonly dir: string
  readonly running: ReadonlyArray<string>
}> {
  /** @since 0.1.0 */
  override get message(): string {
    return `a cluster runs in ${this.dir} already: ${this.running.join(", ")}; strata cluster down --dir ${this.dir} stops it`
  }
}

/**
 * A process exited, or could not be started, before it was ready.
 *
 * @since 0.1.0
 */
export class StartFailed extends Data.TaggedError("StartFailed")<{
  readonly process: string
  readonly detail: string
  readonly log: string
}> {
  /** @since 0.1.0 */
  override get message(): string {
    return `${this.process} ${this.detail}; its log: ${this.log}`
  }
}

/**
 * A wait that did not end within its time: `process` names whom it was about, `waited` what it waited for.
 *
 * @since 0.1.0
 */
export class WaitTimedOut extends Data.TaggedError("WaitTimedOut")<{
  readonly process: string
  readonly waited: string
  readonly within: Duration.Duration
}> {
  /** @since 0.1.0 */
  override get message(): string {
    return `${this.process}: not within ${Duration.format(this.within)}: waited for ${this.waited}`
  }
}

/**
 * This CLI cannot tell how it was started (no entry script in `process.argv`), so it cannot start itself again.
 *
 * @since 0.1.0
 */
export class NoEntry extends Data.TaggedError("NoEntry")<{}> {
  /** @since 0.1.0 */
  override get message(): string {
    return "this strata was not started from a script (process.argv has no entry), so it cannot start its processes"
  }
}

const decodeFile = Schema.decodeUnknownEffect(Schema.fromJsonString(ClusterFile))

/**
 * The directory's `cluster.json`, or nothing when there is none.
 *
 * @since 0.1.0
 */
export const readFile = (dir: string): Effect.Effect<Option.Option<ClusterFile>, InvalidClusterFile> => {
  const path = fileOf(dir)
  return Effect.gen(function* () {
    if (!existsSync(path)) return Option.none()
    const text = yield* Effect.try({
      try: () => readFileSync(path, "utf8"),
      catch: (e) => new InvalidClusterFile({ path, detail: e instanceof Error ? e.message : String(e) })
    })
    return Option.some(
      yield* decodeFile(text).pipe(
        Effect.mapError((e) => new InvalidClusterFile({ path, detail: e.message.replace(/\s*\n\s*/g, " ") }))
      )
    )
  })
}

/**
 * The directory's `cluster.json`; `NoClusterFile` when there is none.
 *
 * @since 0.1.0
 */
export const requireFile = (dir: string): Effect.Effect<ClusterFile, InvalidClusterFile | NoClusterFile> =>
  Effect.flatMap(readFile(dir), (found) =>
    Option.match(found, {
      onNone: () => Effect.fail(new NoClusterFile({ dir })),
      onSome: Effect.succeed
    })
  )

/**
 * Writes `cluster.json` (whole, through a temporary file renamed over it).
 *
 * @since 0.1.0
 */
export const writeFile = (dir: string, file: ClusterFile): Effect.Effect<void> =>
  Effect.sync(() => {
    const path = fileOf(dir)
    writeFileSync(`${path}.tmp`, `${JSON.stringify(file, null, 2)}\n`)
    renameSync(`${path}.tmp`, path)
  })

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/** Whether `/proc` tells about processes here (Linux). */
const hasProc = existsSync("/proc/self/stat")

/**
 * Whether the process runs: its pid is alive, not a zombie (it exited, its parent has not reaped it), and, where
 * `/proc` tells, running `strata <kind>` with its id (another program may have the pid after a reboot).
 *
 * @since 0.1.0
 */
export const isRunning = (p: { readonly pid: number; readonly kind: Kind; readonly id: number }): boolean => {
  try {
    process.kill(p.pid, 0)
  } catch {
    return false
  }
  if (!hasProc) return true
  try {
    const stat = readFileSync(`/proc/${p.pid}/stat`, "utf8")
    if (stat.slice(stat.lastIndexOf(")") + 2).startsWith("Z")) return false
    const argv = readFileSync(`/proc/${p.pid}/cmdline`, "utf8").split("\0")
    return argv.includes(p.kind) && argv.includes(String(p.id))
  } catch {
    return false
  }
}

/**
 * Sends `sig` to the process; one that is gone already is no failure.
 *
 * @since 0.1.0
 */
export const sendSignal = (pid: number, sig: NodeJS.Signals): Effect.Effect<void> =>
  Effect.sync(() => {
    try {
      process.kill(pid, sig)
    } catch {
      // Gone already.
    }
  })

/** Milliseconds since the epoch, from Effect's clock. */
const now = Clock.currentTimeMillis

/**
 * Waits until the process has exited (polled every 100 ms); whether it did before `within` was over.
 *
 * @since 0.1.0
 */
export const awaitExit = (p: ClusterProcess, within: Duration.Duration): Effect.Effect<boolean> =>
  Effect.gen(function* () {
    const deadline = (yield* now) + Duration.toMillis(within)
    while (isRunning(p)) {
      if ((yield* now) >= deadline) return false
      yield* Effect.sleep("100 millis")
    }
    return true
  })

/**
 * An HTTP GET of the ops endpoint: its status and body, or nothing when it did not answer within two seconds.
 *
 * @since 0.1.0
 */
export const get = (url: string): Effect.Effect<Option.Option<{ readonly status: number; readonly body: string }>> =>
  Effect.option(
    Effect.tryPromise(async (signal) => {
      const response = await fetch(url, { signal: AbortSignal.any([signal, AbortSignal.timeout(2_000)]) })
      return { status: response.status, body: await response.text() }
    })
  )

/** A `/readyz` or `/healthz` answer's `detail`, or its body when it has none. */
const detailOf = (body: string): string => {
  try {
    const parsed: unknown = JSON.parse(body)
    if (typeof parsed === "object" && parsed !== null && "detail" in parsed && typeof parsed.detail === "string") {
      return parsed.detail
    }
  } catch {
    // Not JSON: the body as it is.
  }
  return body.trim()
}

/**
 * Which of the coordinators leads: the one whose ops endpoint answers `/cluster` (a standby answers 503).
 *
 * @since 0.1.0
 */
export const leaderOf = (coordinators: ReadonlyArray<ClusterProcess>): Effect.Effect<ClusterProcess | undefined> =>
  Effect.map(
    Effect.forEach(
      coordinators,
      (c) =>
        c.ops === undefined
          ? Effect.succeed(false)
          : Effect.map(get(`${c.ops}/cluster`), (r) => Option.isSome(r) && r.value.status === 200),
      { concurrency: "unbounded" }
    ),
    (leads) => coordinators.find((_, i) => leads[i])
  )

/** How to run this CLI again: the Node binary, its exec arguments and the entry script. */
const entry = (): Effect.Effect<ReadonlyArray<string>, NoEntry> => {
  const script = process.argv[1]
  return script === undefined ? Effect.fail(new NoEntry()) : Effect.succeed([...process.execArgv, script])
}

/** A process this CLI has started: its pid, where its start's lines begin in its log, and its exit once it exited. */
interface Started {
  readonly process: ClusterProcess
  readonly offset: number
  readonly exit: () => string | undefined
}

/** The environment a process starts in: this one's, its `STRATA_` variables replaced by the cluster's. */
const envOf = (file: ClusterFile): Record<string, string> => {
  const env: Record<string, string> = {}
  for (const [key, value] of Object.entries(process.env)) {
    if (value !== undefined && !key.startsWith("STRATA_")) env[key] = value
  }
  return { ...env, ...file.env }
}

/**
 * Starts the process (detached: it outlives this CLI, and a Ctrl-C of the terminal does not reach it), its output
 * appended to its log.
 */
const spawnProcess = (file: ClusterFile, p: ClusterProcess): Effect.Effect<Started, NoEntry | StartFailed> =>
  Effect.gen(function* () {
    const prefix = yield* entry()
    return yield* Effect.try({
      try: (): Started => {
        const offset = existsSync(p.log) ? statSync(p.log).size : 0
        writeFileSync(p.log, `--- ${new Date().toISOString()} strata cluster: starting ${labelOf(p)}\n`, {
          flag: "a"
        })
        const fd = openSync(p.log, "a")
        let child: ChildProcess
        try {
          child = spawn(process.execPath, [...prefix, ...p.args], {
            detached: true,
            stdio: ["ignore", fd, fd],
            env: envOf(file)
          })
        } finally {
          closeSync(fd)
        }
        let exit: string | undefined
        child.on("exit", (code, sig) => {
          exit = sig === null ? `exit code ${code}` : `signal ${sig}`
        })
        child.on("error", (e) => {
          exit = e.message
        })
        child.unref()
        if (child.pid === undefined) throw new Error(`${process.execPath} could not be started`)
        return { process: { ...p, pid: child.pid }, offset, exit: () => exit }
      },
      catch: (e) =>
        new StartFailed({
          process: labelOf(p),
          detail: `could not be started: ${e instanceof Error ? e.message : String(e)}`,
          log: p.log
        })
    })
  })

/** The log's text from `offset`. */
const logFrom = (path: string, offset: number): string => {
  try {
    return readFileSync(path).subarray(offset).toString("utf8")
  } catch {
    return ""
  }
}

/** The last line of a start's log that says something (the CLI's one-line report when the process failed). */
const lastLine = (text: string): string =>
  text
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line !== "" && !line.startsWith("--- "))
    .at(-1)
    ?.slice(0, 400) ?? "it logged nothing"

/**
 * Waits until a started process is ready: its log names its RPC address and its ops endpoint, and `/readyz` answers
 * 200. Fails with `StartFailed` when it exits first, `WaitTimedOut` after `within`.
 */
const awaitReady = (
  started: Started,
  within: Duration.Duration
): Effect.Effect<ClusterProcess, StartFailed | WaitTimedOut> =>
  Effect.gen(function* () {
    const p = started.process
    const deadline = (yield* now) + Duration.toMillis(within)
    let waited = "its log's ops endpoint line"
    while (true) {
      const text = logFrom(p.log, started.offset)
      const exit = started.exit()
      if (exit !== undefined) {
        return yield* new StartFailed({
          process: labelOf(p),
          detail: `exited before it was ready (${exit}): ${lastLine(text)}`,
          log: p.log
        })
      }
      const ops = /ops endpoint on (http:\/\/[^\s"()]+)/.exec(text)?.[1]
      const address = /ready at ([^\s"()]+)/.exec(text)?.[1]
      if (ops !== undefined) {
        const answer = yield* get(`${ops}/readyz`)
        if (Option.isSome(answer) && answer.value.status === 200) {
          return { ...p, ops, ...(address === undefined ? {} : { address }) }
        }
        waited = `${ops}/readyz to answer 200 (${Option.match(answer, {
          onNone: () => "no answer",
          onSome: (a) => `last ${a.status}: ${detailOf(a.body)}`
        })})`
      }
      if ((yield* now) >= deadline) return yield* new WaitTimedOut({ process: labelOf(p), waited, within })
      yield* Effect.sleep("100 millis")
    }
  })

/**
 * Starts the process (again: on the same arguments, its log appended to) and waits until it is ready; the process
 * as `cluster.json` then holds it (its new pid, address and ops endpoint).
 *
 * @since 0.1.0
 */
export const start = (
  file: ClusterFile,
  p: ClusterProcess,
  within: Duration.Duration,
  /** Told the pid once the process is started, before it is ready. */
  onSpawn: (p: ClusterProcess) => Effect.Effect<void> = () => Effect.void
): Effect.Effect<ClusterProcess, NoEntry | StartFailed | WaitTimedOut> =>
  Effect.gen(function* () {
    const { address: _address, ops: _ops, ...before } = p
    const started = yield* spawnProcess(file, before)
    yield* onSpawn(started.process)
    return yield* awaitReady(started, within)
  })

/** What became of a process sent SIGTERM. */
interface Stopped {
  readonly process: ClusterProcess
  /** It had exited already. */
  readonly wasRunning: boolean
  /** It did not exit within the time and was sent SIGKILL. */
  readonly killed: boolean
  readonly seconds: number
}

/** SIGTERM to each of `group` at once, and their exits; SIGKILL to those still running after `within`. */
const stopGroup = (group: ReadonlyArray<ClusterProcess>, within: Duration.Duration) =>
  Effect.forEach(
    group,
    (p) =>
      Effect.gen(function* () {
        const started = yield* now
        if (!isRunning(p)) return { process: p, wasRunning: false, killed: false, seconds: 0 } satisfies Stopped
        yield* sendSignal(p.pid, "SIGTERM")
        const exited = yield* awaitExit(p, within)
        if (!exited) {
          yield* sendSignal(p.pid, "SIGKILL")
          yield* awaitExit(p, Duration.seconds(10))
        }
        const seconds = ((yield* now) - started) / 1000
        return { process: p, wasRunning: true, killed: !exited, seconds } satisfies Stopped
      }),
    { concurrency: "unbounded" }
  )

/** A stop's line. */
const stoppedLine = (s: Stopped, within: Duration.Duration): string =>
  !s.wasRunning
    ? `${labelOf(s.process)} (pid ${s.process.pid}) was not running`
    : s.killed
      ? `${labelOf(s.process)} (pid ${s.process.pid}) did not exit within ${Duration.format(within)} of SIGTERM: killed (SIGKILL)`
      : `${labelOf(s.process)} (pid ${s.process.pid}) stopped in ${s.seconds.toFixed(1)} s`

/**
 * The order a cluster stops in: the tablet servers, then the standby coordinators, the leading one last (one that
 * does not answer on its ops endpoint counts as a standby).
 *
 * @since 0.1.0
 */
export const stopOrder = (
  processes: ReadonlyArray<ClusterProcess>,
  leader: ClusterProcess | undefined
): ReadonlyArray<ReadonlyArray<ClusterProcess>> =>
  [
    processes.filter((p) => p.kind === "tablet-server"),
    processes.filter((p) => p.kind === "coordinator" && p.id !== leader?.id),
    leader === undefined ? [] : [leader]
  ].filter((group) => group.length > 0)

// ---------------------------------------------------------------------------
// up and down
// ---------------------------------------------------------------------------

/**
 * `strata cluster up`'s options: the directory, how many of each process, how long each may take to be ready.
 *
 * @since 0.1.0
 */
export interface UpOptions {
  readonly dir: string
  readonly coordinators: number
  readonly servers: number
  readonly timeout: Duration.Duration
}

/** A running process's name for the refusal: `coordinator 101 (pid 1234)`. */
const runningName = (p: ClusterProcess): string => `${labelOf(p)} (pid ${p.pid})`

/**
 * The coordination and namespace the sources give, `defaultCoordination` when none of them names a coordination
 * (`defaulted`).
 */
const settingsOf = (sources: ServerConfig.Sources) =>
  ServerConfig.load(ServerConfig.ClientConfig, sources).pipe(
    Effect.map((loaded) => ({ ...loaded, defaulted: false })),
    Effect.catchIf(
      (e) => e.key === "coordination" && e.source === "defaults",
      () =>
        Effect.map(
          ServerConfig.load(ServerConfig.ClientConfig, {
            ...sources,
            flags: { ...sources.flags, coordination: defaultCoordination }
          }),
          (loaded) => ({ ...loaded, defaulted: true })
        )
    )
  )

/** The arguments every process of the cluster runs with after its own: the cluster's settings. */
const sharedArgs = (sources: ServerConfig.Sources, coordination: string, namespace: string): Array<string> => {
  const args = ["--coordination", coordination, "--namespace", namespace]
  if (sources.file !== undefined) args.push("--config", resolve(sources.file))
  for (const [key, value] of Object.entries(sources.flags)) {
    if (value === undefined || key === "coordination" || key === "namespace") continue
    args.push("--set", `${key}=${value}`)
  }
  // Each process on a loopback port of its own (a --set httpListen would put them all on one).
  args.push("--http-listen", "127.0.0.1:0")
  return args
}

/** The `STRATA_` variables of this environment. */
const strataEnv = (): Record<string, string> => {
  const env: Record<string, string> = {}
  for (const [key, value] of Object.entries(process.env)) {
    if (value !== undefined && key.startsWith("STRATA_")) env[key] = value
  }
  return env
}

/**
 * `strata cluster up`: starts the coordinators (ids 101, 102, …), waits until each is ready, then the tablet servers
 * (ids 1, 2, …, data in `DIR/server-<id>`), each logging to `DIR/<kind>-<id>.log`; writes `DIR/cluster.json` as
 * they start, and prints the endpoints and what to run next. A directory whose processes still run is refused
 * (`ClusterRunning`). When a process fails to start, those started are stopped and `cluster.json` removed.
 *
 * @since 0.1.0
 */
export const up = (sources: ServerConfig.Sources, options: UpOptions) =>
  Effect.gen(function* () {
    const dir = resolve(options.dir)
    const existing = yield* readFile(dir)
    if (Option.isSome(existing)) {
      const running = existing.value.processes.filter(isRunning)
      if (running.length > 0) return yield* new ClusterRunning({ dir, running: running.map(runningName) })
    }
    const { settings, defaulted } = yield* settingsOf(sources)
    if (defaulted) {
      yield* Console.log(
        `no --coordination given: using ${defaultCoordination} (./dev services up zookeeper starts ZooKeeper there)`
      )
    }
    const namespace = settings.namespace ?? "/strata"
    const shared = sharedArgs(sources, settings.coordination, namespace)
    const processes: Array<ClusterProcess> = [
      ...Array.from({ length: options.coordinators }, (_, i): ClusterProcess => {
        const id = 101 + i
        return {
          kind: "coordinator",
          id,
          pid: 0,
          args: ["coordinator", "--id", String(id), ...shared],
          log: join(dir, `coordinator-${id}.log`)
        }
      }),
      ...Array.from({ length: options.servers }, (_, i): ClusterProcess => {
        const id = 1 + i
        const data = join(dir, `server-${id}`)
        return {
          kind: "tablet-server",
          id,
          pid: 0,
          args: ["tablet-server", "--id", String(id), "--data", data, ...shared],
          log: join(dir, `tablet-server-${id}.log`),
          data
        }
      })
    ]
    yield* Effect.sync(() => mkdirSync(dir, { recursive: true }))
    const base = {
      coordination: settings.coordination,
      namespace,
      ...(sources.file === undefined ? {} : { config: resolve(sources.file) }),
      env: strataEnv()
    }
    /** The file as the processes stand: those not started yet left out. */
    const save = () => writeFile(dir, { ...base, processes: processes.filter((p) => p.pid !== 0) })
    const update = (next: ClusterProcess) =>
      Effect.suspend(() => {
        const i = processes.findIndex((p) => p.kind === next.kind && p.id === next.id)
        processes[i] = next
        return save()
      })
    const began = yield* now
    const startAll = (kind: Kind) =>
      Effect.forEach(
        processes.filter((p) => p.kind === kind),
        (p) => Effect.flatMap(start({ ...base, processes: [] }, p, options.timeout, update), (ready) => update(ready)),
        { concurrency: "unbounded", discard: true }
      )
    yield* Effect.andThen(startAll("coordinator"), startAll("tablet-server")).pipe(
      Effect.onError(() =>
        Effect.gen(function* () {
          const started = processes.filter((p) => p.pid !== 0)
          for (const group of stopOrder(started, undefined)) yield* stopGroup(group, Duration.seconds(10))
          yield* Effect.sync(() => rmSync(fileOf(dir), { force: true }))
        })
      )
    )
    const seconds = ((yield* now) - began) / 1000
    const file: ClusterFile = { ...base, processes }
    yield* Effect.forEach(upLines(file, dir, seconds), (line) => Console.log(line), { discard: true })
  })

/**
 * `n thing` or `n things`.
 *
 * @since 0.1.0
 */
export const count = (n: number, thing: string): string => `${n} ${thing}${n === 1 ? "" : "s"}`

/** `strata cluster up`'s lines once every process is ready: the processes, then what to run next. */
const upLines = (file: ClusterFile, dir: string, seconds: number): ReadonlyArray<string> => {
  const coordinators = file.processes.filter((p) => p.kind === "coordinator")
  const servers = file.processes.filter((p) => p.kind === "tablet-server")
  const cluster = `--coordination ${file.coordination} --namespace ${file.namespace}`
  const ops = file.processes[0]?.ops ?? "http://127.0.0.1:PORT"
  return [
    ...file.processes.map(
      (p) =>
        `${labelOf(p)}\tpid ${p.pid}\trpc ${p.address ?? "?"}\tops ${p.ops ?? "?"}\tlog ${p.log}${p.data === undefined ? "" : `\tdata ${p.data}`}`
    ),
    `OK: ${count(coordinators.length, "coordinator")} and ${count(servers.length, "tablet server")} ready in ${seconds.toFixed(1)} s on ${file.coordination} (namespace ${file.namespace}); ${fileOf(dir)} lists them`,
    "Next:",
    `  strata tablets create orders --tablets 6 --rf ${Math.min(3, servers.length)} ${cluster}`,
    `  strata cluster status ${cluster}`,
    `  curl ${ops}/metrics`,
    `  strata cluster rolling-restart --dir ${dir}`,
    `  strata cluster down --dir ${dir}`
  ]
}

/**
 * `strata cluster down`'s options: `purge` removes the data directories and logs too; `timeout` is how long the
 * processes of one group may take to exit after SIGTERM before they are sent SIGKILL.
 *
 * @since 0.1.0
 */
export interface DownOptions {
  readonly dir: string
  readonly purge: boolean
  readonly timeout: Duration.Duration
}

/**
 * `strata cluster down`: SIGTERM to the tablet servers, then to the standby coordinators, then to the leading one,
 * each group's exits awaited (SIGKILL after `timeout`, said so); then `cluster.json` is removed, the data and logs
 * kept unless `purge`. A directory without `cluster.json` has nothing to stop, and says so.
 *
 * @since 0.1.0
 */
export const down = (options: DownOptions) =>
  Effect.gen(function* () {
    const dir = resolve(options.dir)
    const found = yield* readFile(dir)
    if (Option.isNone(found)) return yield* Console.log(`OK: no cluster.json in ${dir}: nothing to stop`)
    const file = found.value
    const running = file.processes.filter(isRunning)
    const leader = yield* leaderOf(running.filter((p) => p.kind === "coordinator"))
    const order = stopOrder(file.processes, leader)
    let killed = 0
    for (const group of order) {
      for (const stopped of yield* stopGroup(group, options.timeout)) {
        if (stopped.killed) killed++
        yield* Console.log(stoppedLine(stopped, options.timeout))
      }
    }
    yield* Effect.sync(() => {
      rmSync(fileOf(dir), { force: true })
      if (!options.purge) return
      for (const p of file.processes) {
        rmSync(p.log, { force: true })
        if (p.data !== undefined) rmSync(p.data, { recursive: true, force: true })
      }
      if (readdirSync(dir).length === 0) rmSync(dir, { recursive: true, force: true })
    })
    const kept = options.purge ? "its data and logs removed" : "its data and logs kept (--purge removes them)"
    const hard = killed === 0 ? "" : `, ${killed} killed with SIGKILL`
    yield* Console.log(`OK: the cluster in ${dir} is down (${file.processes.length} processes${hard}); ${kept}`)
  })

/**
 * A duration as a command's flag gives it: `5 minutes`, `90 seconds`, or short (`90s`, `5m`, `1h`, `500ms`).
 *
 * @since 0.1.0
 */
export const durationOf = (text: string): Duration.Duration | undefined => {
  const short = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$/.exec(text)
  const units = { ms: "millis", s: "seconds", m: "minutes", h: "hours" } as const
  const input = short === null ? text.trim() : `${short[1]} ${units[short[2] as keyof typeof units]}`
  const d = Duration.fromInput(input as Duration.Input)
  return Option.isSome(d) && Duration.isFinite(d.value) && Duration.toMillis(d.value) > 0 ? d.value : undefined
}
