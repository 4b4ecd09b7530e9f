/**
 * The `strata` command line: subcommands compose Strata's layers from flags.
 *
 * Flags that only one backend reads imply it (`--brokers` → `--log kafka`); a
 * flag several backends read needs the backend named (`--data-dir` needs
 * `--store level` or `--store rocksdb`); a flag given with a backend that does
 * not read it is rejected, never ignored.
 *
 * Failures are reported on stderr as one line naming what was wrong and what
 * to do, with a non-zero exit code; `--verbose` adds the full cause (stack
 * traces included).
 *
 * @since 0.1.0
 */
import {
  type Coordination,
  type Election,
  type Log,
  MemoryCoordination,
  MemoryLog,
  MemoryStore,
  type Store
} from "@strata/core"
import { readFileSync } from "node:fs"
import { join } from "node:path"
import { LocalCluster, ReplicaRpc, type ReplicationConfig } from "@strata/replica"
import { StrataLog } from "@strata/replica/log"
import { KafkaLog } from "@strata/kafka"
import * as LevelStore from "@strata/store-adapters/level"
import * as RocksDbStore from "@strata/store-adapters/rocksdb"
import { Cause, Console, Data, Effect, Layer, Option, Redacted, References, Runtime, Schema, Stdio } from "effect"
import { Argument, CliError, CliOutput, Command, Flag, GlobalFlag } from "effect/cli"
import packageJson from "../package.json" with { type: "json" }
import * as Admin from "./Admin.js"
import * as AdminReport from "./AdminReport.js"
import * as ClusterRunner from "./ClusterRunner.js"
import * as ConfigList from "./ConfigList.js"
import * as Coordinators from "./Coordinators.js"
import * as Demo from "./Demo.js"
import * as Processes from "./Processes.js"
import * as RollingRestart from "./RollingRestart.js"
import type * as ServerConfig from "./ServerConfig.js"

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/** Flags that cannot work together; `hint` says what to change. */
export class UsageError extends Data.TaggedError("UsageError")<{
  readonly detail: string
  readonly hint: string
}> {
  /** @since 0.1.0 */
  override get message(): string {
    return this.detail
  }
}

/** A failure already reported on stderr: the process exits non-zero without reporting it again. */
export class Reported extends Data.TaggedError("Reported")<{
  readonly line: string
  /** The process's exit code: 2 for a usage error (a bad invocation), 1 otherwise. */
  readonly exitCode: 1 | 2
}> {
  /** Read by the runtime: the failure needs no further log line. */
  override readonly [Runtime.errorReported] = false
  /** Read by the runtime: the process's exit code. */
  override get [Runtime.errorExitCode](): number {
    return this.exitCode
  }
  /** @since 0.1.0 */
  override get message(): string {
    return this.line
  }
}

/** Failures whose message is all there is to say: reported without pointing at `--verbose`. */
const complete = new Set([
  "InvalidTableName",
  "NoSuchTable",
  "DuplicateServerId",
  "ReassignRefused",
  "NoLeader",
  "ClusterRunning",
  "NoClusterFile",
  "InvalidClusterFile",
  "StartFailed",
  "WaitTimedOut",
  "NotRunning",
  "NoClusterNamed"
])

/** What to do about a failure of `command`, when the CLI knows. */
const hintOf = (command: string, error: unknown): string | undefined => {
  if (typeof error !== "object" || error === null || !("_tag" in error)) return undefined
  switch (error._tag) {
    case "DuplicateServerId":
      return "another tablet server runs with that id: stop it, or give this one another --id"
    case "NoSuchTable":
      return "strata tablets describe lists every table"
    case "InvalidTableName":
      return "pick another name"
  }
  if (!("reason" in error)) return undefined
  const reason = (error as { readonly reason: { readonly _tag?: unknown } }).reason._tag
  // The demo names its store's directory --data-dir, a tablet server --data.
  const dataFlag = command === "strata demo" ? "--data-dir" : "--data"
  switch (error._tag) {
    case "LogError":
      if (reason === "AuthenticationFailed") {
        return `check --kafka-sasl, --kafka-user and $${KAFKA_PASSWORD_VARIABLE}, and --kafka-ca (the CA of the brokers' certificates)`
      }
      return reason === "BrokerUnreachable"
        ? "start a broker (./dev services up kafka) or name a running one with --brokers host:port"
        : reason === "InvalidRequest"
          ? "check --brokers (comma-separated host:port)"
          : undefined
    case "StoreError":
      return reason === "StoreLocked"
        ? `another process holds that directory: stop it or pick another ${dataFlag}`
        : reason === "ForeignStoreDirectory" && command === "strata tablet-server"
          ? "start the server with the --store its data directory was written with (segments, rocksdb or level), or pick another --data"
          : `check ${dataFlag} (a directory this process can create and write, used by one process at a time)`
    case "InvalidConfig":
      return "fix that setting (in --config's file, the STRATA_ environment, or the flags)"
    case "TabletClientError":
      return reason === "HandshakeFailed"
        ? "check tlsCa (the CA of the cluster's certificates), and tlsCert and tlsKey (a certificate that CA signed)"
        : undefined
    case "CoordinationError":
      return reason === "NotAuthorized"
        ? "give every process of the cluster the same coordinationUsername and $STRATA_COORDINATION_PASSWORD"
        : "check the coordination servers are running and the coordination options"
    case "ElectionError":
      return "check the coordination servers are running and the coordination options"
    default:
      return undefined
  }
}

/** One line: newlines (a schema issue's `at ...` paths, say) become spaces. */
const oneLine = (text: string): string => text.replace(/\s*\n\s*/g, " ").trim()

/** The one-line report of a failure: what was wrong, and what to do. */
const reportLine = (command: string, cause: Cause.Cause<unknown>): string => {
  const failure = Cause.findErrorOption(cause)
  if (Option.isSome(failure)) {
    const error = failure.value
    const message = (error instanceof Error ? error.message : String(error)).replace(/\.\s*$/, "")
    // A usage error is all there is to say; any other failure has a cause worth --verbose.
    if (error instanceof UsageError) return oneLine(`${command}: ${message}; ${error.hint}`)
    const hint = hintOf(command, error)
    const tag = typeof error === "object" && error !== null && "_tag" in error ? error._tag : undefined
    if (typeof tag === "string" && complete.has(tag)) {
      return oneLine(hint === undefined ? `${command}: ${message}` : `${command}: ${message}; ${hint}`)
    }
    return oneLine(
      hint === undefined
        ? `${command}: ${message} (--verbose shows the full cause)`
        : `${command}: ${message}; ${hint} (--verbose shows the full cause)`
    )
  }
  const defect = Cause.squash(cause)
  const message = defect instanceof Error ? defect.message : String(defect)
  return oneLine(`${command}: unexpected error: ${message} (a bug: run again with --verbose and report the trace)`)
}

/**
 * Runs a subcommand's work, reporting a failure on stderr: one line, then the
 * full cause with `--verbose`. The work fails with `Reported` afterwards.
 */
const reporting =
  (command: string) =>
  <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, Reported, R | GlobalFlag.Setting.Identifier<"verbose">> =>
    Effect.catchCause(self, (cause) =>
      Cause.hasInterruptsOnly(cause)
        ? Effect.interrupt
        : Effect.gen(function* () {
            const line = reportLine(command, cause)
            yield* Console.error(line)
            if (yield* Verbose) yield* Console.error(Cause.pretty(cause))
            const usage = Option.exists(Cause.findErrorOption(cause), (e) => e instanceof UsageError)
            return yield* Effect.fail(new Reported({ line, exitCode: usage ? 2 : 1 }))
          })
    )

// ---------------------------------------------------------------------------
// Flags
// ---------------------------------------------------------------------------

/** `--verbose`: on failure, the full cause (stack traces included) after the one-line report. */
export const Verbose = GlobalFlag.Setting("verbose")({
  flag: Flag.Boolean("verbose").pipe(
    Flag.withDescription("On failure, print the full cause (stack traces included) after the one-line report"),
    Flag.withDefault(false)
  )
})

/** Why a `--brokers` value is not `host:port[,host:port...]` with ports in 1–65535, if it is not. */
const invalidBrokers = (brokers: string): string | undefined => {
  const list = brokers.split(",").map((b) => b.trim())
  for (const broker of list) {
    const match = /^([^\s:]+):(\d{1,5})$/.exec(broker)
    if (match === null) return `expected comma-separated host:port, got ${JSON.stringify(broker)}`
    const port = Number(match[2])
    if (port < 1 || port > 65535) return `port ${port} of ${broker} is outside 1–65535`
  }
  return undefined
}

/**
 * The demo's Strata log: a cluster of three tablet servers and a coordinator in this process, talking over loopback
 * TCP, on the embedded memory coordination; the topics are its tables.
 */
const strataLog = StrataLog.layer({ client: { linger: 1 } }).pipe(
  Layer.provideMerge(LocalCluster.layer({ servers: 3, transport: "tcp" })),
  Layer.provide(MemoryCoordination.layer()),
  // The cluster's own progress lines would drown the demo's: only its warnings show.
  Layer.provide(Layer.succeed(References.MinimumLogLevel, "Warn"))
)

/** The demo's store layers, of one worker run and of its restart. */
const demoStores = (
  store: "memory" | "level" | "rocksdb",
  directory: string
): {
  readonly before: Layer.Layer<Store.Store, Store.StoreError>
  readonly after: Layer.Layer<Store.Store, Store.StoreError>
} => {
  switch (store) {
    case "memory":
      return { before: MemoryStore.layer(), after: MemoryStore.layer() }
    case "level":
      return { before: LevelStore.layer({ directory }), after: LevelStore.layer({ directory }) }
    case "rocksdb":
      return { before: RocksDbStore.layer({ directory }), after: RocksDbStore.layer({ directory }) }
  }
}

/** The SASL mechanisms `--kafka-sasl` takes. */
const SASL_MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] as const

/** The variable the demo reads the Kafka SASL password from (a flag would show in the process list). */
const KAFKA_PASSWORD_VARIABLE = "STRATA_KAFKA_PASSWORD"

/** The Kafka flags' TLS and SASL options, or what is wrong with them. */
const kafkaSecurity = (flags: {
  readonly kafkaCa: Option.Option<string>
  readonly kafkaTls: boolean
  readonly kafkaSasl: Option.Option<(typeof SASL_MECHANISMS)[number]>
  readonly kafkaUser: Option.Option<string>
}): Effect.Effect<Pick<KafkaLog.KafkaLogOptions, "tls" | "sasl">, UsageError> =>
  Effect.gen(function* () {
    const out: { tls?: KafkaLog.KafkaLogOptions["tls"]; sasl?: KafkaLog.KafkaLogOptions["sasl"] } = {}
    if (Option.isSome(flags.kafkaCa)) {
      const file = flags.kafkaCa.value
      const ca = yield* Effect.try({
        try: () => readFileSync(file, "utf8"),
        catch: (e) =>
          new UsageError({
            detail: `--kafka-ca ${file}: ${e instanceof Error ? e.message : String(e)}`,
            hint: "name a readable PEM file of the CA that signed the brokers' certificates"
          })
      })
      out.tls = { ca }
    } else if (flags.kafkaTls) out.tls = true
    if (Option.isSome(flags.kafkaSasl) !== Option.isSome(flags.kafkaUser)) {
      return yield* Effect.fail(
        new UsageError({
          detail: "--kafka-sasl and --kafka-user go together",
          hint: `give both, with the password in $${KAFKA_PASSWORD_VARIABLE}`
        })
      )
    }
    if (Option.isSome(flags.kafkaSasl) && Option.isSome(flags.kafkaUser)) {
      const password = process.env[KAFKA_PASSWORD_VARIABLE]
      if (password === undefined || password === "") {
        return yield* Effect.fail(
          new UsageError({
            detail: `--kafka-sasl needs the password in $${KAFKA_PASSWORD_VARIABLE}, which is not set`,
            hint: `export ${KAFKA_PASSWORD_VARIABLE}=… (it is never printed)`
          })
        )
      }
      out.sasl = {
        mechanism: flags.kafkaSasl.value,
        username: flags.kafkaUser.value,
        password: Redacted.make(password)
      }
    }
    return out
  })

/** The demo's backends, from flags that may imply or contradict one another. */
const demoBackends = (flags: {
  readonly store: Option.Option<"memory" | "level" | "rocksdb">
  readonly log: Option.Option<"memory" | "kafka" | "strata">
  readonly brokers: Option.Option<string>
  readonly dataDir: Option.Option<string>
  readonly kafkaCa: Option.Option<string>
  readonly kafkaTls: boolean
  readonly kafkaSasl: Option.Option<(typeof SASL_MECHANISMS)[number]>
  readonly kafkaUser: Option.Option<string>
}) =>
  Effect.gen(function* () {
    // --brokers and the --kafka-* flags are read by the Kafka log alone: they imply --log kafka, and contradict
    // another --log.
    const kafkaFlags = [
      ...(Option.isSome(flags.brokers) ? ["--brokers"] : []),
      ...(Option.isSome(flags.kafkaCa) ? ["--kafka-ca"] : []),
      ...(flags.kafkaTls ? ["--kafka-tls"] : []),
      ...(Option.isSome(flags.kafkaSasl) ? ["--kafka-sasl"] : []),
      ...(Option.isSome(flags.kafkaUser) ? ["--kafka-user"] : [])
    ]
    const log = Option.getOrElse(flags.log, () => (kafkaFlags.length > 0 ? "kafka" : "memory"))
    if (log !== "kafka" && kafkaFlags.length > 0) {
      return yield* Effect.fail(
        new UsageError({
          detail: `${kafkaFlags.join(", ")} ${kafkaFlags.length === 1 ? "is" : "are"} read only with --log kafka, and --log ${log} was given`,
          hint: `drop ${kafkaFlags.join(", ")}, or use --log kafka`
        })
      )
    }
    const security = yield* kafkaSecurity(flags)
    // --data-dir is read by two stores: it needs one named, and contradicts the memory store.
    const store = Option.getOrElse(flags.store, () => "memory" as const)
    if (store === "memory" && Option.isSome(flags.dataDir)) {
      return yield* Effect.fail(
        new UsageError({
          detail: `--data-dir is read only by a level or rocksdb store, and the store is memory${Option.isSome(flags.store) ? "" : " (the default)"}`,
          hint: "add --store level or --store rocksdb, or drop --data-dir"
        })
      )
    }
    const [first = "", ...rest] = Option.getOrElse(flags.brokers, () => "127.0.0.1:9092")
      .split(",")
      .map((b) => b.trim())
    const logLayer: Layer.Layer<
      Log.Log,
      | Log.LogError
      | LocalCluster.LocalClusterError
      | ReplicationConfig.InvalidReplicaOptions
      | Coordination.CoordinationError
      | Election.ElectionError
    > =
      log === "memory"
        ? MemoryLog.layer()
        : log === "kafka"
          ? KafkaLog.layer({ brokers: [first, ...rest], ...security })
          : strataLog
    const directory = Option.getOrElse(flags.dataDir, () => join(".strata-data", `demo-${store}`))
    return { store, directory, logLayer } as const
  })

// ---------------------------------------------------------------------------
// Commands
// ---------------------------------------------------------------------------

const demo = Command.make(
  "demo",
  {
    partitions: Flag.Int("partitions").pipe(
      Flag.withDescription("Partitions of the demo table and its changelog (1–1024)"),
      Flag.withSchema(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 1024 }))),
      Flag.withDefault(4)
    ),
    text: Flag.String("text").pipe(
      Flag.withDescription("Text whose words are counted"),
      Flag.withDefault(Demo.defaultText)
    ),
    store: Flag.Literals("store", ["memory", "level", "rocksdb"]).pipe(
      Flag.withDescription(
        "Where the table's partitions live: memory (the default) loses them on restart, level and rocksdb keep them"
      ),
      Flag.optional
    ),
    log: Flag.Literals("log", ["memory", "kafka", "strata"]).pipe(
      Flag.withDescription(
        "Where the source topic and the changelog live: memory (the default), kafka (the default with --brokers), or strata (a 3-server Strata cluster started on loopback, on memory coordination)"
      ),
      Flag.optional
    ),
    brokers: Flag.String("brokers").pipe(
      Flag.withDescription(
        "Kafka bootstrap brokers, comma-separated host:port (default 127.0.0.1:9092); implies --log kafka"
      ),
      Flag.withSchema(Schema.String.check(Schema.makeFilter(invalidBrokers))),
      Flag.optional
    ),
    dataDir: Flag.String("data-dir").pipe(
      Flag.withDescription(
        "Directory of the store (default .strata-data/demo-<store>); needs --store level or --store rocksdb"
      ),
      Flag.withSchema(Schema.NonEmptyString),
      Flag.optional
    ),
    kafkaCa: Flag.String("kafka-ca").pipe(
      Flag.withDescription(
        "TLS to the brokers, their certificates checked against this CA (a PEM file); implies --log kafka"
      ),
      Flag.optional
    ),
    kafkaTls: Flag.Boolean("kafka-tls").pipe(
      Flag.withDescription("TLS to the brokers, their certificates checked against Node's CAs; implies --log kafka"),
      Flag.withDefault(false)
    ),
    kafkaSasl: Flag.Literals("kafka-sasl", SASL_MECHANISMS).pipe(
      Flag.withDescription(
        `SASL to the brokers (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512) as --kafka-user, the password in $${KAFKA_PASSWORD_VARIABLE}; implies --log kafka`
      ),
      Flag.optional
    ),
    kafkaUser: Flag.String("kafka-user").pipe(
      Flag.withDescription("The SASL user (with --kafka-sasl)"),
      Flag.withSchema(Schema.NonEmptyString),
      Flag.optional
    )
  },
  Effect.fn(function* ({ partitions, text, store, log, brokers, dataDir, kafkaCa, kafkaTls, kafkaSasl, kafkaUser }) {
    const backends = yield* demoBackends({ store, log, brokers, dataDir, kafkaCa, kafkaTls, kafkaSasl, kafkaUser })
    if (backends.store !== "memory") yield* Console.log(`Store directory: ${backends.directory}`)
    const result = yield* Demo.run(
      { partitions, text, verbose: true },
      demoStores(backends.store, backends.directory)
    ).pipe(Effect.provide(backends.logLayer))
    if (!Demo.sameTable(result.before, result.after)) {
      return yield* Effect.fail(new Error("the restored table differs from the table before the restart"))
    }
    yield* Console.log(`OK: all ${result.after.size} words restored from ${result.changelogRecords} changelog records`)
  }, reporting("strata demo"))
).pipe(
  Command.withDescription(
    "Run a table (memory or Kafka changelog; memory, level or rocksdb store), restart the worker, restore it from its changelog"
  )
)

const coordinators = Command.make(
  "coordinators",
  {},
  Effect.fn(function* () {
    const result = yield* Coordinators.run(true).pipe(Effect.provide(Coordinators.layerMemory))
    if (result.second.epoch <= result.first.epoch || result.staleWrite !== "FencedEpoch") {
      return yield* Effect.fail(new Error("the takeover did not fence the old leader"))
    }
    yield* Console.log(
      `OK: server ${result.second.serverId} leads with epoch ${result.second.epoch} > ${result.first.epoch}; the old leader is fenced`
    )
  }, reporting("strata coordinators"))
).pipe(
  Command.withDescription(
    "Three coordinators elect a leader on the embedded memory coordination; the leader is killed and another takes over with a higher epoch"
  )
)

// The cluster's processes: every setting from a YAML or JSON file (--config), the environment (STRATA_<KEY>) or
// flags (--set key=value and the named flags), later sources overriding earlier ones. A required setting's flag is
// optional here: the file or the environment may give it instead (`strata config list` lists the settings).

const setting = (name: string, description: string) =>
  Flag.String(name).pipe(Flag.withDescription(description), Flag.optional)

/** The flags every cluster command reads. */
const clusterFlags = {
  config: setting(
    "config",
    "A settings file, YAML (.yaml, .yml) or JSON (keys as in --set; strata config list lists them); the environment and flags override it"
  ),
  coordination: setting(
    "coordination",
    "The coordination service: zookeeper://host:port[,host:port...][/chroot] or etcd://host:port[,host:port...] (required: here, in --config or as STRATA_COORDINATION)"
  ),
  namespace: setting("namespace", "The cluster's coordination namespace (default /strata)"),
  set: Flag.KeyValuePair("set").pipe(
    Flag.withDescription(
      'Any setting as key=value, e.g. --set minInsyncReplicas=2 --set sessionTimeout=6000 or --set "sessionTimeout=6 seconds" (repeatable)'
    ),
    Flag.optional
  )
}

/** The flags of an operator's command: the cluster's, and the coordinators' addresses to reach it through instead. */
const adminFlags = {
  ...clusterFlags,
  bootstrap: setting(
    "bootstrap",
    "Coordinators' host:port[,host:port...]: reach the cluster through their RPC instead of --coordination (STRATA_BOOTSTRAP)"
  )
}

/** An operator's command's settings' sources. */
const adminSources = (
  f: Parameters<typeof sourcesOf>[0] & {
    readonly coordination: Option.Option<string>
    readonly namespace: Option.Option<string>
    readonly bootstrap: Option.Option<string>
  }
) => sourcesOf(f, { coordination: f.coordination, namespace: f.namespace, bootstrap: f.bootstrap })

/** The flags of a process that listens. */
const processFlags = {
  ...clusterFlags,
  id: Flag.Int("id").pipe(
    Flag.withDescription(
      "This process's server id, an integer ≥ 0 unique among the cluster's servers of its kind (required: here, in --config or as STRATA_ID)"
    ),
    Flag.withSchema(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))),
    Flag.optional
  ),
  listen: setting("listen", "Where to listen, host:port (default 127.0.0.1:0: loopback, any free port)"),
  advertise: setting("advertise", "The host:port others reach this process at, when not the listen address"),
  "http-listen": setting(
    "http-listen",
    "Where the ops HTTP endpoint (/metrics, /healthz, /readyz) listens, host:port (default 127.0.0.1:0: loopback, any free port)"
  ),
  "log-format": Flag.Literals("log-format", ["pretty", "json", "logfmt"]).pipe(
    Flag.withDescription("How the process writes its log (default pretty)"),
    Flag.optional
  )
}

/** The settings' sources: the file, the environment, and the flags (named ones over --set). */
const sourcesOf = (
  flags: {
    readonly config: Option.Option<string>
    readonly set: Option.Option<Record<string, string>>
  },
  named: Readonly<Record<string, Option.Option<string | number>>>
): ServerConfig.Sources => {
  const given: Record<string, string> = { ...Option.getOrElse(flags.set, () => ({})) }
  for (const [key, value] of Object.entries(named)) if (Option.isSome(value)) given[key] = String(value.value)
  return { file: Option.getOrUndefined(flags.config), env: process.env, flags: given }
}

const tabletServer = Command.make(
  "tablet-server",
  {
    ...processFlags,
    data: setting(
      "data",
      "The data directory of this server's replicas (required: here, in --config or as STRATA_DATA)"
    ),
    store: Flag.Literals("store", ["segments", "rocksdb", "level"]).pipe(
      Flag.withDescription(
        "How the replicas' logs are kept in the data directory: segments (segment files, the default), rocksdb or level"
      ),
      Flag.optional
    ),
    rack: setting("rack", "The rack or zone of this server: a tablet's replicas go to distinct racks"),
    "data-listen": setting(
      "data-listen",
      "Where the data link (appends and follower fetches) listens, host:port (default: the listen host, any free port)"
    ),
    "data-advertise": setting(
      "data-advertise",
      "The host:port others reach the data link at, when not where it listens"
    )
  },
  Effect.fn(function* (f) {
    yield* Processes.tabletServer(
      sourcesOf(f, {
        id: f.id,
        coordination: f.coordination,
        namespace: f.namespace,
        listen: f.listen,
        advertise: f.advertise,
        httpListen: f["http-listen"],
        logFormat: f["log-format"],
        data: f.data,
        store: f.store,
        rack: f.rack,
        dataListen: f["data-listen"],
        dataAdvertise: f["data-advertise"]
      })
    )
  }, reporting("strata tablet-server"))
).pipe(
  Command.withDescription(
    "Run a tablet server: hosts replicas on its data directory, registers in coordination, serves the cluster's RPC until SIGINT/SIGTERM (a controlled shutdown first)"
  )
)

const coordinator = Command.make(
  "coordinator",
  { ...processFlags },
  Effect.fn(function* (f) {
    yield* Processes.coordinator(
      sourcesOf(f, {
        id: f.id,
        coordination: f.coordination,
        namespace: f.namespace,
        listen: f.listen,
        advertise: f.advertise,
        httpListen: f["http-listen"],
        logFormat: f["log-format"]
      })
    )
  }, reporting("strata coordinator"))
).pipe(
  Command.withDescription(
    "Run a coordinator: campaigns in the election, runs the controller while it leads, serves the controller's RPC until SIGINT/SIGTERM"
  )
)

// An operator's commands print lines (`--output text`, the default) or one JSON value (`--output json`); `--json`,
// where a command had it first, is `--output json`.

/** `--output text|json`. */
const outputFlag = Flag.Literals("output", ["text", "json"]).pipe(
  Flag.withDescription("How to print: text (lines for an operator, the default) or json (one JSON value)"),
  Flag.optional
)

/** `--json`: the same as `--output json`. */
const jsonFlag = (what: string) =>
  Flag.Boolean("json").pipe(Flag.withDescription(`The same as --output json: ${what}`), Flag.withDefault(false))

/** How to print, from `--output` and `--json` (which contradict each other only with `--output text`). */
const outputOf = (output: Option.Option<"text" | "json">, json = false): Effect.Effect<"text" | "json", UsageError> =>
  json && Option.isSome(output) && output.value === "text"
    ? Effect.fail(
        new UsageError({
          detail: "--json and --output text were both given",
          hint: "--json is --output json: drop one"
        })
      )
    : Effect.succeed(json ? "json" : Option.getOrElse(output, () => "text" as const))

const configList = Command.make(
  "list",
  { output: outputFlag },
  Effect.fn(function* (f) {
    yield* Console.log(ConfigList.render(yield* outputOf(f.output)))
  }, reporting("strata config list"))
).pipe(
  Command.withDescription(
    "List every setting the cluster's processes read: its key (in --config's file and --set), its STRATA_ environment variable, its default, the processes that read it (operator: the tablets, rebalance and cluster commands), and what it means"
  )
)

const config = Command.make("config").pipe(
  Command.withDescription("The settings of the cluster's processes"),
  Command.withSubcommands([configList])
)

const tabletsList = Command.make(
  "list",
  { ...adminFlags, output: outputFlag },
  Effect.fn(function* (f) {
    yield* Admin.listTables(adminSources(f), {
      output: yield* outputOf(f.output)
    })
  }, reporting("strata tablets list"))
).pipe(
  Command.withDescription(
    "List the cluster's tables, one a line: name, tablets, replication factor, retention when the table has one (deleting after a table being deleted)"
  )
)

const tabletsCreate = Command.make(
  "create",
  {
    ...adminFlags,
    output: outputFlag,
    "if-not-exists": Flag.Boolean("if-not-exists").pipe(
      Flag.withDescription("A table of that name that exists is no failure: it is left as it is, and printed"),
      Flag.withDefault(false)
    ),
    table: Argument.String("table").pipe(Argument.withDescription("The table's name")),
    tablets: Flag.Int("tablets").pipe(
      Flag.withDescription(`How many tablets (buckets), 1–${ReplicaRpc.MAX_TABLETS_PER_TABLE}`),
      Flag.withSchema(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: ReplicaRpc.MAX_TABLETS_PER_TABLE })))
    ),
    rf: Flag.Int("rf").pipe(
      Flag.withDescription("Replicas per tablet (default: the cluster's replicationFactor, 3)"),
      Flag.withSchema(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 64 }))),
      Flag.optional
    ),
    "retention-ms": Flag.Int("retention-ms").pipe(
      Flag.withDescription(
        "How long each replica keeps the table's records, in milliseconds (≥ 1; default: kept until deleted)"
      ),
      Flag.withSchema(Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))),
      Flag.optional
    ),
    "retention-bytes": Flag.Int("retention-bytes").pipe(
      Flag.withDescription("How many bytes of the table's records each replica keeps (≥ 1; default: no limit)"),
      Flag.withSchema(Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))),
      Flag.optional
    )
  },
  Effect.fn(function* (f) {
    yield* Admin.createTable(adminSources(f), f.table, {
      buckets: f.tablets,
      ifNotExists: f["if-not-exists"],
      output: yield* outputOf(f.output),
      ...Processes.optional("replicationFactor", Option.getOrUndefined(f.rf)),
      ...Processes.optional("retentionMs", Option.getOrUndefined(f["retention-ms"])),
      ...Processes.optional("retentionBytes", Option.getOrUndefined(f["retention-bytes"]))
    })
  }, reporting("strata tablets create"))
).pipe(
  Command.withDescription(
    "Create a table: the controller assigns its tablets' replicas over the live servers; --retention-ms and --retention-bytes: how long and how much each replica keeps"
  )
)

/** The one filter `strata tablets describe` was given, if any: two or more are a usage error. */
const describeFilter = (flags: Readonly<Record<AdminReport.TabletFilter, boolean>>) => {
  const given = AdminReport.tabletFilters.filter((filter) => flags[filter])
  return given.length > 1
    ? Effect.fail(
        new UsageError({
          detail: `${given.map((filter) => `--${filter}`).join(" and ")} were given together`,
          hint: "the filters are exclusive: give one of --under-replicated, --unavailable, --under-min-isr"
        })
      )
    : Effect.succeed(given[0])
}

const tabletsDescribe = Command.make(
  "describe",
  {
    ...adminFlags,
    table: Argument.String("table").pipe(Argument.withDescription("Only this table"), Argument.optional),
    output: outputFlag,
    json: jsonFlag("the controller's metadata (servers and tablets) as one JSON object"),
    "under-replicated": Flag.Boolean("under-replicated").pipe(
      Flag.withDescription(
        "Only tablets whose ISR is smaller than their replicas (a moving tablet's: than those it moves to)"
      ),
      Flag.withDefault(false)
    ),
    unavailable: Flag.Boolean("unavailable").pipe(
      Flag.withDescription("Only tablets without a leader (offline)"),
      Flag.withDefault(false)
    ),
    "under-min-isr": Flag.Boolean("under-min-isr").pipe(
      Flag.withDescription(
        "Only tablets whose ISR is below minInsyncReplicas (as this command's settings give it: --set minInsyncReplicas=N)"
      ),
      Flag.withDefault(false)
    )
  },
  Effect.fn(function* (f) {
    const output = yield* outputOf(f.output, f.json)
    const filter = yield* describeFilter(f)
    yield* Admin.describe(adminSources(f), Option.getOrUndefined(f.table), { output, filter })
  }, reporting("strata tablets describe"))
).pipe(
  Command.withDescription(
    "Print the live servers and every tablet's state, leader, epoch, replicas and ISR; a moving tablet's target replicas, and a move's retired ones until they have deleted theirs; --under-replicated, --unavailable or --under-min-isr: only those tablets"
  )
)

/**
 * `--replicas` as server ids, or why it is not `id[,id...]` of integers ≥ 0. Duplicates pass: the controller refuses
 * them, naming the server.
 */
const parseReplicas = (replicas: string): ReadonlyArray<number> | UsageError => {
  const ids = replicas.split(",").map((id) => id.trim())
  const bad = ids.find((id) => !/^\d{1,9}$/.test(id))
  if (bad === undefined) return ids.map(Number)
  return new UsageError({
    detail: `--replicas: expected server ids separated by commas (integers ≥ 0), got ${JSON.stringify(replicas)}${bad === "" ? " (an empty id)" : ` (${JSON.stringify(bad)} is not a server id)`}`,
    hint: "e.g. --replicas 1,4,5 (the first is the preferred leader)"
  })
}

/** What `strata tablets reassign` is asked: exactly one of `--replicas` and `--cancel`. */
const reassignRequest = (
  replicas: Option.Option<string>,
  cancel: boolean
): Effect.Effect<Admin.ReassignRequest, UsageError> => {
  if (Option.isSome(replicas) && cancel) {
    return Effect.fail(
      new UsageError({
        detail: "--replicas and --cancel were both given",
        hint: "give --replicas to move the tablet, or --cancel to end its move"
      })
    )
  }
  if (cancel) return Effect.succeed({ _tag: "Cancel" })
  if (Option.isNone(replicas)) {
    return Effect.fail(
      new UsageError({
        detail: "neither --replicas nor --cancel was given",
        hint: "give --replicas 1,4,5 to move the tablet there, or --cancel to end its move"
      })
    )
  }
  const parsed = parseReplicas(replicas.value)
  return parsed instanceof UsageError ? Effect.fail(parsed) : Effect.succeed({ _tag: "Move", replicas: parsed })
}

const tabletsReassign = Command.make(
  "reassign",
  {
    ...adminFlags,
    table: Argument.String("table").pipe(Argument.withDescription("The table's name")),
    bucket: Argument.Int("bucket").pipe(
      Argument.withDescription("The tablet's bucket (0 to the table's tablets - 1)"),
      Argument.withSchema(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)))
    ),
    replicas: Flag.String("replicas").pipe(
      Flag.withDescription(
        "The servers the tablet moves to, comma-separated ids (the first is the preferred leader), e.g. 1,4,5"
      ),
      Flag.optional
    ),
    cancel: Flag.Boolean("cancel").pipe(
      Flag.withDescription("End the tablet's move under way: back on its original replicas"),
      Flag.withDefault(false)
    ),
    output: outputFlag
  },
  Effect.fn(function* (f) {
    const request = yield* reassignRequest(f.replicas, f.cancel)
    const output = yield* outputOf(f.output)
    yield* Admin.reassign(adminSources(f), f.table, f.bucket, request, { output })
  }, reporting("strata tablets reassign"))
).pipe(
  Command.withDescription(
    "Move one tablet's replicas (--replicas 1,4,5: the new ones copy its log, then the leaving ones delete theirs), or cancel its move (--cancel)"
  )
)

const tabletsBalanceLeaders = Command.make(
  "balance-leaders",
  { ...adminFlags, output: outputFlag },
  Effect.fn(function* (f) {
    yield* Admin.balanceLeaders(adminSources(f), {
      output: yield* outputOf(f.output)
    })
  }, reporting("strata tablets balance-leaders"))
).pipe(
  Command.withDescription(
    "Move leadership back to each tablet's preferred replica (its first) where that replica is in the ISR"
  )
)

const tabletsDelete = Command.make(
  "delete",
  {
    ...adminFlags,
    table: Argument.String("table").pipe(Argument.withDescription("The table's name")),
    output: outputFlag,
    "if-exists": Flag.Boolean("if-exists").pipe(
      Flag.withDescription("A table the cluster does not have is no failure: it says so"),
      Flag.withDefault(false)
    )
  },
  Effect.fn(function* (f) {
    yield* Admin.deleteTable(adminSources(f), f.table, {
      ifExists: f["if-exists"],
      output: yield* outputOf(f.output)
    })
  }, reporting("strata tablets delete"))
).pipe(Command.withDescription("Delete a table: its tablets stop, and every replica deletes its data"))

/** `--goals`: the planner's goals after the hard rules, in priority order. */
const goalsFlag = Flag.String("goals").pipe(
  Flag.withDescription(
    "The goals after the hard rules, in priority order, comma-separated (default: replica-count,leader,bytes)"
  ),
  Flag.optional
)
/** `--goals`' value as a list. */
const goalsOf = (goals: Option.Option<string>) =>
  Option.getOrUndefined(Option.map(goals, (g) => g.split(",").map((goal) => goal.trim())))

const rebalancePlan = Command.make(
  "plan",
  {
    ...adminFlags,
    goals: goalsFlag,
    output: outputFlag,
    json: jsonFlag("the model and the plan as one JSON object")
  },
  Effect.fn(function* (f) {
    const output = yield* outputOf(f.output, f.json)
    yield* Admin.rebalancePlan(adminSources(f), {
      goals: goalsOf(f.goals),
      output
    })
  }, reporting("strata rebalance plan"))
).pipe(
  Command.withDescription(
    "Plan a rebalance: the fewest replica moves to exact balance (rack rule kept), leaders balanced; changes nothing"
  )
)

/** `strata rebalance <action>`: a request to the leading coordinator's rebalance service, then its status. */
const rebalanceAction = (action: "status" | "pause" | "resume" | "cancel", description: string) =>
  Command.make(
    action,
    { ...adminFlags, output: outputFlag },
    Effect.fn(
      function* (f) {
        yield* Admin.rebalanceControl(adminSources(f), action, { output: yield* outputOf(f.output) })
      },
      reporting(`strata rebalance ${action}`)
    )
  ).pipe(Command.withDescription(description))

const rebalanceStart = Command.make(
  "start",
  {
    ...adminFlags,
    goals: goalsFlag,
    output: outputFlag
  },
  Effect.fn(function* (f) {
    yield* Admin.rebalanceControl(adminSources(f), "start", {
      goals: goalsOf(f.goals),
      output: yield* outputOf(f.output)
    })
  }, reporting("strata rebalance start"))
).pipe(Command.withDescription("Plan and start a rebalance now (one at a time): its status"))

const rebalance = Command.make("rebalance").pipe(
  Command.withDescription(
    "Plan, start and control the progressive rebalance the controller runs (batches, stability gate, rollback)"
  ),
  Command.withSubcommands([
    rebalancePlan,
    rebalanceStart,
    rebalanceAction(
      "status",
      "The current or last rebalance (phase, batch, moves, why it waits or paused) and the trigger"
    ),
    rebalanceAction("pause", "Pause the rebalance once the moves under way end"),
    rebalanceAction("resume", "Resume a paused rebalance (it measures its baseline again first)"),
    rebalanceAction("cancel", "Cancel the rebalance: moves under way go back, finished batches stay")
  ])
)

const tablets = Command.make("tablets").pipe(
  Command.withDescription(
    "List, create, describe and delete the cluster's tables, balance their leaders, and move a tablet's replicas"
  ),
  Command.withSubcommands([
    tabletsList,
    tabletsCreate,
    tabletsDescribe,
    tabletsDelete,
    tabletsBalanceLeaders,
    tabletsReassign
  ])
)

const clusterStatus = Command.make(
  "status",
  { ...clusterFlags, output: outputFlag },
  Effect.fn(function* (f) {
    yield* Admin.clusterStatus(sourcesOf(f, { coordination: f.coordination, namespace: f.namespace }), {
      output: yield* outputOf(f.output)
    })
  }, reporting("strata cluster status"))
).pipe(
  Command.withDescription(
    "Print the coordinators (which leads, at which coordinator epoch), the live tablet servers, and the tablets: total, offline, under-replicated, under min ISR"
  )
)

// A local cluster from one command (`ClusterRunner`), and a rolling restart in the seed's order (`RollingRestart`).

/** `--dir`: a local cluster's directory. */
const dirFlag = Flag.String("dir").pipe(
  Flag.withDescription(
    "The local cluster's directory: its cluster.json, each process's log, each tablet server's data (default .strata-cluster)"
  ),
  Flag.withDefault(".strata-cluster")
)

/** `--timeout`: a duration such as "5 minutes", "90 seconds", "90s", "5m". */
const timeoutFlag = (description: string, fallback: string) =>
  Flag.String("timeout").pipe(
    Flag.withDescription(`${description} (e.g. "5 minutes", "90s"; default ${fallback})`),
    Flag.withSchema(
      Schema.String.check(
        Schema.makeFilter((text: string) =>
          ClusterRunner.durationOf(text) === undefined
            ? `expected a duration above zero such as "5 minutes", "90 seconds" or "90s", got ${text}`
            : undefined
        )
      )
    ),
    Flag.withDefault(fallback)
  )

/** A `--timeout` the flag's schema let through, as a duration. */
const timeoutOf = (text: string) => ClusterRunner.durationOf(text) ?? ClusterRunner.durationOf("5 minutes")!

const clusterUp = Command.make(
  "up",
  {
    ...clusterFlags,
    dir: dirFlag,
    coordinators: Flag.Int("coordinators").pipe(
      Flag.withDescription("How many coordinators (ids 101, 102, …), 1–9"),
      Flag.withSchema(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 9 }))),
      Flag.withDefault(3)
    ),
    servers: Flag.Int("servers").pipe(
      Flag.withDescription("How many tablet servers (ids 1, 2, …), 1–64"),
      Flag.withSchema(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 64 }))),
      Flag.withDefault(3)
    ),
    timeout: timeoutFlag("How long each process may take to be ready", "2 minutes")
  },
  Effect.fn(function* (f) {
    yield* ClusterRunner.up(sourcesOf(f, { coordination: f.coordination, namespace: f.namespace }), {
      dir: f.dir,
      coordinators: f.coordinators,
      servers: f.servers,
      timeout: timeoutOf(f.timeout)
    })
  }, reporting("strata cluster up"))
).pipe(
  Command.withDescription(
    `Start a local cluster: coordinators and tablet servers as background processes of this CLI, each ready (its /readyz 200) before it returns, on --coordination (default ${ClusterRunner.defaultCoordination}); DIR/cluster.json lists them`
  )
)

const clusterDown = Command.make(
  "down",
  {
    dir: dirFlag,
    purge: Flag.Boolean("purge").pipe(
      Flag.withDescription("Remove the tablet servers' data and the logs too"),
      Flag.withDefault(false)
    ),
    timeout: timeoutFlag("How long the processes may take to exit after SIGTERM before SIGKILL", "30 seconds")
  },
  Effect.fn(function* (f) {
    yield* ClusterRunner.down({ dir: f.dir, purge: f.purge, timeout: timeoutOf(f.timeout) })
  }, reporting("strata cluster down"))
).pipe(
  Command.withDescription(
    "Stop the local cluster of cluster up: SIGTERM to the tablet servers, the standby coordinators, then the leader; removes DIR/cluster.json, keeps data and logs unless --purge"
  )
)

const clusterRollingRestart = Command.make(
  "rolling-restart",
  {
    ...clusterFlags,
    dir: dirFlag,
    timeout: timeoutFlag("How long each step may take, from its SIGTERM to the end of its wait", "5 minutes"),
    print: Flag.Boolean("print").pipe(
      Flag.withDescription(
        "Print the order and the checks as a shell script to run by hand, for any cluster (--coordination, or DIR/cluster.json), instead of restarting"
      ),
      Flag.withDefault(false)
    )
  },
  Effect.fn(function* (f) {
    const timeout = timeoutOf(f.timeout)
    if (f.print) {
      return yield* RollingRestart.print(sourcesOf(f, { coordination: f.coordination, namespace: f.namespace }), {
        dir: f.dir,
        timeout
      })
    }
    const given = [
      Option.isSome(f.coordination) ? "--coordination" : undefined,
      Option.isSome(f.namespace) ? "--namespace" : undefined,
      Option.isSome(f.config) ? "--config" : undefined,
      Option.isSome(f.set) ? "--set" : undefined
    ].filter((flag) => flag !== undefined)
    if (given.length > 0) {
      return yield* Effect.fail(
        new UsageError({
          detail: `${given.join(" and ")} ${given.length > 1 ? "are" : "is"} read only with --print: a rolling restart restarts the processes DIR/cluster.json lists, on their own settings`,
          hint: "drop them, or add --print for the script of any cluster"
        })
      )
    }
    yield* RollingRestart.run({ dir: f.dir, timeout })
  }, reporting("strata cluster rolling-restart"))
).pipe(
  Command.withDescription(
    "Restart every process of the local cluster of cluster up one at a time: each tablet server until it is back and every tablet is led with a full ISR, the standby coordinators, the leading coordinator last; --print: the steps as a shell script, for any cluster"
  )
)

const cluster = Command.make("cluster").pipe(
  Command.withDescription(
    "The cluster's processes and its tablets' health at a glance; a local cluster started and stopped in one command, and rolling restarts"
  ),
  Command.withSubcommands([clusterStatus, clusterUp, clusterDown, clusterRollingRestart])
)

/** The root command. */
export const strata = Command.make("strata").pipe(
  Command.withDescription("Partitioned, replicated, stateful services in TypeScript"),
  Command.withSubcommands([demo, coordinators, tabletServer, coordinator, tablets, rebalance, cluster, config]),
  Command.withGlobalFlags([Verbose])
)

// ---------------------------------------------------------------------------
// Running
// ---------------------------------------------------------------------------

/**
 * Presents help and version as usual; a bad invocation (a bad flag value, an
 * unknown flag) as one line on stderr naming it and where the flags are
 * listed, followed by the help only with `--verbose`.
 */
const presenter = (verbose: boolean): CliOutput.Presenter => ({
  present: (event) => {
    if (event._tag !== "InvalidInvocation") return CliOutput.defaultPresenter.present(event)
    const command = event.commandPath.join(" ")
    const line = oneLine(
      `${command}: ${event.errors.map((e) => e.message.replace(/\.\s*$/, "")).join("; ")} (see ${command} --help)`
    )
    return verbose
      ? Effect.andThen(
          Console.error(line),
          CliOutput.defaultPresenter.present({ ...event, _tag: "Help", reason: "Implicit" })
        )
      : Console.error(line)
  }
})

/** The version `--version` prints: the one in the CLI's package.json (bundled into the build). */
export const version: string = packageJson.version

/** Runs the CLI with the arguments of the `Stdio` in context. */
export const run = Effect.gen(function* () {
  const args = yield* (yield* Stdio.Stdio).args
  // The parser failed when the presenter is called, so --verbose is looked for among the raw arguments.
  const end = args.indexOf("--")
  const verbose = (end < 0 ? args : args.slice(0, end)).includes("--verbose")
  return yield* Command.runWith(strata, { version })(args).pipe(
    Effect.provideService(CliOutput.Presenter, presenter(verbose)),
    // A bad invocation (already presented as one line) exits 2, as a usage error does.
    Effect.catchIf(
      (e): e is CliError.CliError =>
        CliError.isCliError(e) && e._tag !== "UserError" && (e._tag !== "ShowHelp" || e.errors.length > 0),
      (e) => Effect.fail(new Reported({ line: e.message, exitCode: 2 }))
    )
  )
})
