/**
 * `strata cluster rolling-restart`: every process of a cluster restarted one at a time, in the order of the seed
 * (`fluss-coordination` §7.3), so that no tablet goes offline:
 *
 * 1. the tablet servers one at a time: SIGTERM (a controlled shutdown moves its leaderships first), its exit, its
 *    start on the same arguments, `/readyz` 200, then the controller's metadata showing it registered, every tablet
 *    with a leader and every ISR as large as its replicas;
 * 2. the standby coordinators one at a time, each until its `/readyz` answers 200;
 * 3. the leading coordinator last (a standby takes over), then until a coordinator leads and every tablet is online
 *    with a full ISR.
 *
 * `run` does it for the processes a `strata cluster up` started (`ClusterRunner`'s `cluster.json`); `script` prints
 * the same order and checks as a shell script an operator runs by hand, for any cluster.
 *
 * @since 0.1.0
 */
import { resolve } from "node:path"
import type { ReplicaRpc, TabletClient } from "@strata/replica"
import { Clock, Console, Data, Duration, Effect, Option } from "effect"
import * as Admin from "./Admin.js"
import * as AdminReport from "./AdminReport.js"
import * as ClusterRunner from "./ClusterRunner.js"
import * as ServerConfig from "./ServerConfig.js"

/**
 * The order of a rolling restart: the tablet servers, the standby coordinators, then the leading coordinator.
 *
 * @since 0.1.0
 */
export interface Plan {
  readonly servers: ReadonlyArray<number>
  readonly standbys: ReadonlyArray<number>
  readonly leader: number
}

/**
 * The plan for a cluster: its tablet servers and standby coordinators by id, the leader last.
 *
 * @since 0.1.0
 */
export const planOf = (servers: ReadonlyArray<number>, coordinators: ReadonlyArray<number>, leader: number): Plan => {
  const byId = (ids: ReadonlyArray<number>) => [...new Set(ids)].sort((a, b) => a - b)
  return { servers: byId(servers), standbys: byId(coordinators.filter((id) => id !== leader)), leader }
}

/**
 * Some processes of the cluster do not run: a rolling restart needs every one running.
 *
 * @since 0.1.0
 */
export class NotRunning extends Data.TaggedError("NotRunning")<{
  readonly dir: string
  readonly missing: ReadonlyArray<string>
}> {
  /** @since 0.1.0 */
  override get message(): string {
    return `not every process of the cluster in ${this.dir} runs (${this.missing.join(", ")}): strata cluster down --dir ${this.dir}, then strata cluster up, starts it again`
  }
}

/**
 * `--print` was given no cluster: no `--coordination` (nor `STRATA_COORDINATION`, nor one in `--config`), and no
 * `cluster.json` in the directory.
 *
 * @since 0.1.0
 */
export class NoClusterNamed extends Data.TaggedError("NoClusterNamed")<{ readonly dir: string }> {
  /** @since 0.1.0 */
  override get message(): string {
    return `no cluster named: no --coordination, and no cluster.json in ${this.dir}; give --coordination URL (and --namespace) of a running cluster, or --dir of one strata cluster up started`
  }
}

// ---------------------------------------------------------------------------
// The printed script
// ---------------------------------------------------------------------------

/** `text` as one shell word. */
const quoted = (text: string): string => (/^[\w@%+=:,./-]+$/.test(text) ? text : `'${text.replace(/'/g, `'\\''`)}'`)

/**
 * `script`'s options: the cluster's coordination and namespace (every `strata` command of the script names them),
 * how long each wait may take, and the tablet servers the tablets name that are not registered (not restarted).
 *
 * @since 0.1.0
 */
export interface ScriptOptions {
  readonly coordination: string
  readonly namespace: string
  readonly timeoutSeconds: number
  readonly down?: ReadonlyArray<number>
}

/**
 * The plan as a POSIX shell script an operator edits (`restart_process`, or `RESTART_COMMAND KIND ID` in its
 * environment: how a process is restarted where it runs; `ops_endpoint`: where its `/readyz` is) and runs: each step restarts one process and waits, every 2 s up to the
 * timeout, for what the rolling restart waits for, checked with `strata cluster status`, `strata tablets describe
 * --unavailable` / `--under-replicated` and `curl /readyz`; a wait that times out stops the script naming it.
 *
 * @since 0.1.0
 */
export const script = (plan: Plan, options: ScriptOptions): string => {
  const down = options.down ?? []
  const lines: Array<string> = [
    "#!/bin/sh",
    `# A rolling restart of the Strata cluster at ${options.coordination} (namespace ${options.namespace}), printed by`,
    "# strata cluster rolling-restart --print. The order (no tablet goes offline, no needless leader change):",
    `#   1. the tablet servers one at a time: ${plan.servers.join(" ") || "none"}; after each, until it is registered again,`,
    "#      every tablet has a leader and every ISR is as large as its replicas;",
    `#   2. the standby coordinators one at a time: ${plan.standbys.join(" ") || "none"}; after each, until it is registered again;`,
    `#   3. the leading coordinator last: ${plan.leader} (a standby takes over); then until a coordinator leads and every`,
    "#      tablet is online with a full ISR.",
    "# Never the leading coordinator first: every tablet server would report to a new controller at once.",
    ...(down.length === 0
      ? []
      : [
          `# Not registered when this was printed (down: not restarted, and every ISR stays short until they are back): ${down.join(" ")}`
        ]),
    "# Set RESTART_COMMAND or edit restart_process (and ops_endpoint, for the /readyz waits), then: sh THIS-FILE",
    "set -eu",
    "",
    `STRATA=\${STRATA:-strata}`,
    `COORDINATION=${quoted(options.coordination)}`,
    `NAMESPACE=${quoted(options.namespace)}`,
    `TIMEOUT=\${TIMEOUT:-${options.timeoutSeconds}}`,
    "",
    "# Restarts one process ($1: tablet-server or coordinator, $2: its id): SIGTERM (a tablet server's controlled",
    "# shutdown moves its leaderships first), wait for its exit, start it again with the same arguments. RESTART_COMMAND",
    "# (run as: $RESTART_COMMAND KIND ID) does it, or replace the body with how your processes run (systemctl restart",
    "# strata-$1@$2, kubectl delete pod strata-$1-$2, ...); without either it asks you to, and waits for Enter.",
    "restart_process() {",
    `  if [ -n "\${RESTART_COMMAND:-}" ]; then`,
    `    $RESTART_COMMAND "$1" "$2"`,
    "  else",
    `    printf 'restart %s %s now (SIGTERM, wait for its exit, start it again), then press Enter: ' "$1" "$2" >&2`,
    "    read -r _ </dev/tty",
    "  fi",
    "}",
    "",
    "# The ops endpoint (host:port, its --http-listen) of a process, for the /readyz wait; none: no /readyz wait.",
    "ops_endpoint() {",
    `  case "$1 $2" in`,
    `    # "tablet-server 1") echo 10.0.0.1:9250 ;;`,
    `    *) echo "" ;;`,
    "  esac",
    "}",
    "",
    `strata_cluster() { $STRATA "$@" --coordination "$COORDINATION" --namespace "$NAMESPACE"; }`,
    "",
    "# Runs the command after $1 every 2 s until it succeeds; stops the script after TIMEOUT seconds, naming $1.",
    "wait_for() {",
    "  what=$1",
    "  shift",
    "  waited=0",
    `  until "$@" >/dev/null 2>&1; do`,
    `    if [ "$waited" -ge "$TIMEOUT" ]; then`,
    `      echo "rolling restart stopped: not within \${TIMEOUT} s: $what" >&2`,
    "      exit 1",
    "    fi",
    "    sleep 2",
    "    waited=$((waited + 2))",
    "  done",
    "}",
    "",
    "# The process's /readyz answers 200 (or it has no ops endpoint named above).",
    `ready() { ops=$(ops_endpoint "$1" "$2"); [ -z "$ops" ] || curl -fsS "http://$ops/readyz"; }`,
    "# It is registered: its line in strata cluster status ($1: server or coordinator).",
    `registered() { strata_cluster cluster status | grep -q "^$1 $2[[:space:]]"; }`,
    "# A coordinator leads (strata cluster status fails when none does).",
    "leading() { strata_cluster cluster status; }",
    "# It is the coordinator that leads.",
    `leads() { strata_cluster cluster status | grep -q "^coordinator $1[[:space:]].*leader\\$"; }`,
    "# Every tablet has a leader and an ISR as large as its replicas.",
    "healthy() {",
    '  offline=$(strata_cluster tablets describe --unavailable) && [ -z "$offline" ] &&',
    '    under=$(strata_cluster tablets describe --under-replicated) && [ -z "$under" ]',
    "}",
    `step() { echo "$(date +%H:%M:%S) $*"; }`,
    "",
    'wait_for "every tablet led with a full ISR before anything restarts" healthy'
  ]
  if (plan.servers.length > 0) lines.push("", "# 1. The tablet servers, one at a time.")
  for (const id of plan.servers) {
    lines.push(
      `step "restarting tablet server ${id}"`,
      `restart_process tablet-server ${id}`,
      `wait_for "tablet server ${id}'s /readyz answering 200" ready tablet-server ${id}`,
      `wait_for "tablet server ${id} registered again" registered server ${id}`,
      `wait_for "every tablet led with a full ISR after tablet server ${id}'s restart" healthy`
    )
  }
  lines.push(
    "",
    "# 2. The standby coordinators, one at a time (the leader is checked first: it is restarted last).",
    `leads ${plan.leader} || { echo "coordinator ${plan.leader} does not lead any more: print the script again" >&2; exit 1; }`
  )
  for (const id of plan.standbys) {
    lines.push(
      `step "restarting standby coordinator ${id}"`,
      `restart_process coordinator ${id}`,
      `wait_for "coordinator ${id}'s /readyz answering 200" ready coordinator ${id}`,
      `wait_for "coordinator ${id} registered again" registered coordinator ${id}`
    )
  }
  lines.push(
    "",
    "# 3. The leading coordinator, last: a standby takes over.",
    `step "restarting leading coordinator ${plan.leader}"`,
    `restart_process coordinator ${plan.leader}`,
    `wait_for "coordinator ${plan.leader}'s /readyz answering 200" ready coordinator ${plan.leader}`,
    `wait_for "coordinator ${plan.leader} registered again" registered coordinator ${plan.leader}`,
    'wait_for "a coordinator leading" leading',
    'wait_for "every tablet online with a full ISR under the new leader" healthy',
    'step "rolling restart done"'
  )
  return `${lines.join("\n")}\n`
}

/**
 * The plan for a cluster as `strata cluster status` reads it: its registered tablet servers, its standby
 * coordinators, its leader last; nothing when no coordinator leads.
 *
 * @since 0.1.0
 */
export const planOfStatus = (status: AdminReport.ClusterStatus): Plan | undefined =>
  status.leader === null
    ? undefined
    : planOf(
        status.servers.map((s) => s.id),
        status.coordinators.map((c) => c.id),
        status.leader.id
      )

/**
 * `strata cluster rolling-restart --print`: the script for the cluster the flags name (`--coordination`, or
 * without it the `cluster.json` of `dir`, or the environment's `STRATA_COORDINATION` when `dir` has none), its
 * order from `strata cluster status`'s reading: the registered tablet servers, the standby coordinators, the leader.
 * With no coordinator leading it fails with `Admin.NoLeader`.
 *
 * @since 0.1.0
 */
export const print = (
  sources: ServerConfig.Sources,
  options: { readonly dir: string; readonly timeout: Duration.Duration }
) =>
  Effect.gen(function* () {
    const fromFile =
      sources.flags.coordination === undefined ? yield* ClusterRunner.readFile(options.dir) : Option.none()
    const cluster = Option.match(fromFile, { onNone: () => sources, onSome: sourcesOfFile })
    const { settings } = yield* ServerConfig.load(ServerConfig.ClientConfig, cluster).pipe(
      Effect.catchIf(
        (e) => e.key === "coordination" && e.source === "defaults",
        () => Effect.fail(new NoClusterNamed({ dir: resolve(options.dir) }))
      )
    )
    const status = yield* Admin.readStatus(cluster)
    const plan = planOfStatus(status)
    if (plan === undefined) return yield* new Admin.NoLeader({ coordinators: status.coordinators.length })
    yield* Console.log(
      script(plan, {
        coordination: settings.coordination,
        namespace: settings.namespace ?? "/strata",
        timeoutSeconds: Math.ceil(Duration.toSeconds(options.timeout)),
        down: status.down ?? []
      }).trimEnd()
    )
  })

/** The settings' sources of a cluster `cluster up` started: its coordination, namespace, config and environment. */
const sourcesOfFile = (file: ClusterRunner.ClusterFile): ServerConfig.Sources => ({
  file: file.config,
  env: file.env,
  flags: { coordination: file.coordination, namespace: file.namespace }
})

// ---------------------------------------------------------------------------
// The restart
// ---------------------------------------------------------------------------

/** Milliseconds since the epoch, from Effect's clock. */
const now = Clock.currentTimeMillis

/** Writes `text` to stdout without ending the line (a step's line is ended when the step is). */
const write = (text: string) => Effect.sync(() => void process.stdout.write(text))

/** The controller's metadata, or nothing when it does not answer within five seconds. */
const metadataNow = (client: TabletClient.TabletClientShape) =>
  client.metadata().pipe(Effect.timeout("5 seconds"), Effect.option)

/** What the health wait found: the figures of a reading, or no reading. */
const healthOf = (metadata: Option.Option<ReplicaRpc.Metadata>, minInsyncReplicas: number, server?: number) =>
  Option.map(metadata, (m) => {
    const live = m.tablets.filter((t) => t.state !== "DeletingTablet")
    const counts = AdminReport.counts(m.tablets, minInsyncReplicas)
    const short = live
      .filter((t) => t.leader === null || AdminReport.selects("under-replicated", minInsyncReplicas, t))
      .map((t) => AdminReport.tabletName(t.tablet))
    const registered = server === undefined || m.servers.some((s) => s.id === server)
    return { counts, short, registered, ok: registered && counts.offline === 0 && counts.underReplicated === 0 }
  })

/** A health reading as the timeout's line tells it. */
const healthText = (health: ReturnType<typeof healthOf>, server?: number): string =>
  Option.match(health, {
    onNone: () => "no answer from the controller",
    onSome: (h) =>
      [
        ...(h.registered || server === undefined ? [] : [`server ${server} not registered`]),
        `${h.counts.offline} offline, ${h.counts.underReplicated} under-replicated`,
        ...(h.short.length === 0
          ? []
          : [`${h.short.slice(0, 8).join(", ")}${h.short.length > 8 ? `, … (${h.short.length})` : ""}`])
      ].join("; ")
  })

/**
 * Waits until the controller's metadata shows every tablet with a leader and a full ISR (and `server` registered,
 * when given), polled every 200 ms until `deadline`; fails with `WaitTimedOut` naming `who`.
 */
const awaitHealthy = (
  cluster: Admin.Cluster,
  who: string,
  deadline: number,
  within: Duration.Duration,
  server?: number
) =>
  Effect.gen(function* () {
    while (true) {
      const health = healthOf(yield* metadataNow(cluster.client), cluster.replication.minInsyncReplicas, server)
      if (Option.isSome(health) && health.value.ok) return health.value.counts
      if ((yield* now) >= deadline) {
        const registered = server === undefined ? "" : `tablet server ${server} registered, `
        return yield* new ClusterRunner.WaitTimedOut({
          process: who,
          waited: `${registered}every tablet led with a full ISR in the controller's metadata (last: ${healthText(health, server)})`,
          within
        })
      }
      yield* Effect.sleep("200 millis")
    }
  })

/** Waits until one of the coordinators leads (its `/cluster` answers 200); fails with `WaitTimedOut` naming `who`. */
const awaitLeader = (
  coordinators: () => ReadonlyArray<ClusterRunner.ClusterProcess>,
  who: string,
  deadline: number,
  within: Duration.Duration
) =>
  Effect.gen(function* () {
    while (true) {
      const leader = yield* ClusterRunner.leaderOf(coordinators())
      if (leader !== undefined) return leader
      if ((yield* now) >= deadline) {
        return yield* new ClusterRunner.WaitTimedOut({
          process: who,
          waited: "a coordinator leading (its ops endpoint's /cluster answering 200)",
          within
        })
      }
      yield* Effect.sleep("200 millis")
    }
  })

/**
 * `strata cluster rolling-restart`: restarts every process `dir`'s `cluster.json` lists, in the module's order,
 * printing one line per step; each step (from its SIGTERM to the end of its wait) has `timeout`, and one that
 * passes fails the command with `WaitTimedOut` naming the process and what it waited for. Before the first step the
 * cluster must be healthy (every tablet led with a full ISR) within `timeout`.
 *
 * @since 0.1.0
 */
export const run = (options: { readonly dir: string; readonly timeout: Duration.Duration }) =>
  Effect.gen(function* () {
    const dir = resolve(options.dir)
    let file = yield* ClusterRunner.requireFile(dir)
    const missing = file.processes.filter((p) => !ClusterRunner.isRunning(p))
    if (missing.length > 0) {
      return yield* new NotRunning({ dir, missing: missing.map((p) => `${ClusterRunner.labelOf(p)} (pid ${p.pid})`) })
    }
    const timeout = options.timeout
    const current = (kind: ClusterRunner.Kind, id: number) =>
      file.processes.find((p) => p.kind === kind && p.id === id)!
    const save = (next: ClusterRunner.ClusterProcess) =>
      Effect.suspend(() => {
        file = {
          ...file,
          processes: file.processes.map((p) => (p.kind === next.kind && p.id === next.id ? next : p))
        }
        return ClusterRunner.writeFile(dir, file)
      })
    const ids = (kind: ClusterRunner.Kind) =>
      file.processes
        .filter((p) => p.kind === kind)
        .map((p) => p.id)
        .sort((a, b) => a - b)
    const coordinators = () => file.processes.filter((p) => p.kind === "coordinator")

    /** SIGTERM, the exit, the start on the same arguments until `/readyz` answers 200; by `deadline`. */
    const restart = (kind: ClusterRunner.Kind, id: number, deadline: number) =>
      Effect.gen(function* () {
        const p = current(kind, id)
        const who = ClusterRunner.labelOf(p)
        yield* ClusterRunner.sendSignal(p.pid, "SIGTERM")
        const left = () => Effect.map(now, (t) => Duration.millis(Math.max(0, deadline - t)))
        if (!(yield* ClusterRunner.awaitExit(p, yield* left()))) {
          return yield* new ClusterRunner.WaitTimedOut({
            process: who,
            waited: `its exit after SIGTERM (pid ${p.pid})`,
            within: timeout
          })
        }
        const ready = yield* ClusterRunner.start(file, p, yield* left(), save).pipe(
          Effect.mapError((e) =>
            e._tag === "WaitTimedOut" ? new ClusterRunner.WaitTimedOut({ ...e, within: timeout }) : e
          )
        )
        yield* save(ready)
      })

    /** One step: its line begun, the work, its line ended with what the work returns and the step's seconds. */
    const step = <E, R>(begin: string, work: (deadline: number) => Effect.Effect<string, E, R>) =>
      Effect.gen(function* () {
        const began = yield* now
        yield* write(`${begin} … `)
        const end = yield* work(began + Duration.toMillis(timeout)).pipe(Effect.onError(() => write("failed\n")))
        yield* Console.log(`${end} after ${(((yield* now) - began) / 1000).toFixed(1)} s`)
      })

    const sources = sourcesOfFile(file)
    yield* Admin.withClient(sources, (cluster) =>
      Effect.gen(function* () {
        const began = yield* now
        const before = yield* awaitHealthy(
          cluster,
          "before anything restarts",
          began + Duration.toMillis(timeout),
          timeout
        )
        yield* Console.log(
          `the cluster in ${dir}: ${ClusterRunner.count(before.total, "tablet")}, every one led with a full ISR; restarting ${ClusterRunner.count(ids("tablet-server").length, "tablet server")}, then ${ClusterRunner.count(ids("coordinator").length, "coordinator")}`
        )
        for (const id of ids("tablet-server")) {
          yield* step(`restarting tablet server ${id}`, (deadline) =>
            Effect.gen(function* () {
              yield* restart("tablet-server", id, deadline)
              const counts = yield* awaitHealthy(cluster, `tablet server ${id}`, deadline, timeout, id)
              return `back, ${counts.underReplicated} under-replicated`
            })
          )
        }
        const leader = yield* awaitLeader(
          coordinators,
          "before the coordinators restart",
          (yield* now) + Duration.toMillis(timeout),
          timeout
        )
        for (const id of ids("coordinator").filter((id) => id !== leader.id)) {
          yield* step(`restarting standby coordinator ${id}`, (deadline) =>
            Effect.as(restart("coordinator", id, deadline), "back")
          )
        }
        yield* step(`restarting leading coordinator ${leader.id}`, (deadline) =>
          Effect.gen(function* () {
            yield* restart("coordinator", leader.id, deadline)
            const who = `coordinator ${leader.id} (the leader)`
            const leads = yield* awaitLeader(coordinators, who, deadline, timeout)
            const counts = yield* awaitHealthy(cluster, who, deadline, timeout)
            return `back; coordinator ${leads.id} leads, ${counts.offline} offline, ${counts.underReplicated} under-replicated`
          })
        )
        yield* Console.log(
          `OK: rolling restart of ${ClusterRunner.count(ids("tablet-server").length, "tablet server")} and ${ClusterRunner.count(ids("coordinator").length, "coordinator")} done in ${(((yield* now) - began) / 1000).toFixed(1)} s`
        )
      })
    )
  })
