/**
 * The configuration of the cluster's processes (`strata tablet-server`, `strata coordinator`, and the operator's
 * `strata tablets ...`), read from a YAML or JSON file (`--config FILE`), then the environment (`STRATA_<KEY>`, e.g.
 * `STRATA_MIN_INSYNC_REPLICAS=2`), then flags (`--set key=value`, and the named flags), each source overriding
 * the one before. Each source is a `ConfigProvider` and the precedence is theirs (`ConfigProvider.orElse`); Effect's
 * `Config` reads every key from them, text parsed as the key's Schema wants it, and the settings are decoded by one
 * Schema per process. A bad value's error names its key and the source it came from.
 *
 * The coordination backend is a URL: `zookeeper://host:port[,host:port...][/chroot]` or
 * `etcd://host:port[,host:port...]` (`etcds://` for TLS endpoints).
 *
 * @since 0.1.0
 */
import { Coordination, HostPort, OptionSchemas, type Store } from "@strata/core"
import { readFileSync } from "node:fs"
import { extname } from "node:path"
import * as EtcdCoordination from "@strata/election/etcd"
import * as ZooKeeperCoordination from "@strata/election/zookeeper"
import * as LevelStore from "@strata/store-adapters/level"
import * as RocksDbStore from "@strata/store-adapters/rocksdb"
import { RebalanceConfig } from "@strata/rebalance"
import { PeerTls, ReplicaRpc, ReplicationConfig, SegmentLog, ServerStorage } from "@strata/replica"
import {
  Config,
  ConfigProvider,
  Data,
  Duration,
  Effect,
  Exit,
  Layer,
  Redacted,
  Schema,
  SchemaIssue,
  SchemaTransformation
} from "effect"
import * as Yaml from "yaml"
import * as Logging from "./Logging.js"
import * as ZooKeeperProbe from "./ZooKeeperProbe.js"

/**
 * A configuration that cannot be used: `key` names the setting, `source` where its value came from.
 *
 * @since 0.1.0
 */
export class InvalidConfig extends Data.TaggedError("InvalidConfig")<{
  readonly key: string
  readonly source: string
  readonly detail: string
}> {
  /** @since 0.1.0 */
  override get message(): string {
    return `${this.key} (from ${this.source}): ${this.detail}`
  }
}

/** The replication settings every process of a cluster shares (`ReplicationConfig`'s keys). */
const replicationKeys: ReadonlyArray<string> = Object.keys(ReplicationConfig.ReplicationConfig.fields)

const CoordinationUrl = Schema.String.check(
  Schema.makeFilter((url: string) =>
    parseCoordination(url) === undefined
      ? `expected zookeeper://host:port[,host:port...][/chroot] or etcd://host:port[,host:port...], got ${url}`
      : undefined
  )
)

/** Where coordination is, parsed from its URL. */
type CoordinationTarget =
  | { readonly _tag: "zookeeper"; readonly connectString: string; readonly root?: string }
  | { readonly _tag: "etcd"; readonly endpoints: ReadonlyArray<string> }

/** `host:port[,host:port...]`, each as the cluster's own addresses are read, if it is that. */
const hostPorts = (text: string): ReadonlyArray<string> | undefined => {
  const list = text.split(",")
  return list.every((hp) => ReplicaRpc.parseAddress(hp) !== undefined) ? list : undefined
}

/** A coordination URL's backend and servers, if it is one. */
const parseCoordination = (url: string): CoordinationTarget | undefined => {
  const match = /^(zookeeper|etcd|etcds):\/\/([^/]+)(\/.*)?$/.exec(url)
  if (match === null) return undefined
  const servers = hostPorts(match[2]!)
  if (servers === undefined) return undefined
  if (match[1] === "zookeeper") {
    const root = match[3]
    return root === undefined || root === "/"
      ? { _tag: "zookeeper", connectString: servers.join(",") }
      : { _tag: "zookeeper", connectString: servers.join(","), root }
  }
  if (match[3] !== undefined) return undefined
  const scheme = match[1] === "etcds" ? "https" : "http"
  return { _tag: "etcd", endpoints: servers.map((hp) => `${scheme}://${hp}`) }
}

/**
 * No ZooKeeper session could be opened where something answered, and what answered is not ZooKeeper (a Kafka
 * broker's port, say): the message says so instead of "cannot reach".
 *
 * @since 0.1.0
 */
export class NotZooKeeper extends Coordination.Unreachable {
  /** @since 0.1.0 */
  override get message(): string {
    return this.detail
  }
}

/**
 * `error` again, or, when it is an unreachable ZooKeeper and what answers at its addresses is not ZooKeeper, the
 * error saying so (each address asked once with ZooKeeper's handshake).
 */
const explainUnreachable = (
  connectString: string,
  error: Coordination.CoordinationError
): Effect.Effect<never, Coordination.CoordinationError> =>
  error.reason._tag !== "CoordinationUnreachable" || error.reason instanceof NotZooKeeper
    ? Effect.fail(error)
    : Effect.flatMap(
        Effect.forEach(
          connectString.split(","),
          (hp) => Effect.map(ZooKeeperProbe.probe(hp), (a) => [hp, a] as const),
          {
            concurrency: "unbounded"
          }
        ),
        (answers) => {
          const others = answers.filter(([, a]) => a._tag === "NotZooKeeper")
          if (others.length === 0 || answers.some(([, a]) => a._tag === "ZooKeeper")) return Effect.fail(error)
          const what = others
            .map(([hp, a]) => `${hp}${others.length > 1 ? ` (${a._tag === "NotZooKeeper" ? a.detail : ""})` : ""}`)
            .join(", ")
          const how = others.length === 1 && others[0]![1]._tag === "NotZooKeeper" ? `: ${others[0]![1].detail}` : ""
          const silent = answers.filter(([, a]) => a._tag === "NoConnection").map(([hp]) => hp)
          return Effect.fail(
            new Coordination.CoordinationError({
              reason: new NotZooKeeper({
                address: connectString,
                detail: `something answered at ${what}, but it is not ZooKeeper${how}; no ZooKeeper session was established${silent.length === 0 ? "" : ` (nothing answered at ${silent.join(", ")})`}`
              })
            })
          )
        }
      )

/**
 * The coordination layer a URL names (a URL the config's schema let through), with the credentials of `access`: a
 * ZooKeeper digest user, or an etcd user and its TLS files. A setting the backend cannot use fails as an invalid
 * option rather than be ignored.
 */
export const coordinationLayer = (
  url: string,
  access: CoordinationAccess = {}
): Layer.Layer<Coordination.Coordination, Coordination.CoordinationError> => {
  const target = parseCoordination(url)
  if (target === undefined) throw new Error(`not a coordination URL: ${url}`)
  const { coordinationUsername: username, coordinationPassword: password } = access
  if ((username === undefined) !== (password === undefined)) {
    return username === undefined
      ? badSetting(
          target._tag,
          "coordinationPassword",
          "<redacted>",
          "coordinationUsername and coordinationPassword go together"
        )
      : badSetting(
          target._tag,
          "coordinationUsername",
          JSON.stringify(username),
          "coordinationUsername and coordinationPassword go together"
        )
  }
  if (target._tag === "etcd") {
    if (access.coordinationCa !== undefined && !target.endpoints.every((e) => e.startsWith("https://"))) {
      return badSetting(
        "etcd",
        "coordinationCa",
        JSON.stringify(access.coordinationCa),
        "TLS needs an etcds:// coordination URL"
      )
    }
    return etcdLayer(target.endpoints, access)
  }
  const tlsFile = (["coordinationCa", "coordinationCert", "coordinationKey"] as const).find(
    (k) => access[k] !== undefined
  )
  if (tlsFile !== undefined) {
    return badSetting(
      "zookeeper",
      tlsFile,
      JSON.stringify(access[tlsFile]),
      "TLS to ZooKeeper is not supported; it is for etcds:// URLs"
    )
  }
  const { connectString } = target
  const auth =
    username === undefined || password === undefined
      ? {}
      : {
          auth: { username, password },
          ...(access.coordinationWorldReadable === undefined ? {} : { worldReadable: access.coordinationWorldReadable })
        }
  return Layer.effect(Coordination.Coordination)(
    Effect.map(
      ZooKeeperCoordination.make(
        target.root === undefined ? { connectString, ...auth } : { connectString, root: target.root, ...auth }
      ).pipe(Effect.catch((e) => explainUnreachable(connectString, e))),
      (zk) => ({
        backend: zk.backend,
        session: (options) => Effect.catch(zk.session(options), (e) => explainUnreachable(connectString, e))
      })
    )
  )
}

/**
 * A tablet server's storage on its data directory: segment files, or a LevelDB / RocksDB store.
 *
 * @since 0.1.0
 */
export const storageLayer = (
  settings: typeof TabletServerConfig.Type
): Layer.Layer<ServerStorage.ServerStorage, Store.StoreError> => {
  const directory = settings.data
  switch (settings.store) {
    case "segments": {
      const { segmentBytes, segmentMs, flushIntervalMs, flushBytes, tailBytes } = settings
      return ServerStorage.layerSegments({
        directory,
        ...(segmentBytes === undefined ? {} : { segmentBytes }),
        ...(segmentMs === undefined ? {} : { segmentMs }),
        ...(flushIntervalMs === undefined ? {} : { flushIntervalMs }),
        ...(flushBytes === undefined ? {} : { flushBytes }),
        ...(tailBytes === undefined ? {} : { tailBytes })
      })
    }
    case "level":
      return Layer.provide(ServerStorage.layerStore, LevelStore.layer({ directory }))
    case "rocksdb":
      return Layer.provide(ServerStorage.layerStore, RocksDbStore.layer({ directory }))
  }
}

const Int = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))
/** A segment's size: positions in a segment are 32-bit. */
const SegmentBytes = OptionSchemas.PositiveInt.check(Schema.isLessThanOrEqualTo(SegmentLog.MAX_SEGMENT_BYTES))

/** A setting's one-line meaning (what `strata config list` prints), and its default when a process supplies it. */
const about = <S extends Schema.Top>(description: string, shown?: S["Type"]) =>
  Schema.annotateKey<S>(shown === undefined ? { description } : { description, default: shown })

/**
 * ZooKeeper digest credentials and the ACL of the nodes Strata creates (`ZooKeeperCoordination`'s `auth` and
 * `worldReadable`): every process of a cluster needs the same ones.
 */
function coordinationAccess() {
  return {
    coordinationUsername: Schema.optional(Schema.NonEmptyString).pipe(
      about(
        "ZooKeeper digest user every coordination session authenticates as; the nodes Strata creates are then writable by that user only"
      )
    ),
    coordinationPassword: Schema.optional(OptionSchemas.Secret).pipe(
      about("The password of coordinationUsername (give it as $STRATA_COORDINATION_PASSWORD; never printed)")
    ),
    coordinationWorldReadable: Schema.optional(Schema.Boolean).pipe(
      about("With ZooKeeper and coordinationUsername: whether anyone may read the nodes (false: that user only)", true)
    ),
    coordinationCa: Schema.optional(Schema.NonEmptyString).pipe(
      about("With etcds://: a PEM file of the CA that signed etcd's certificate")
    ),
    coordinationCert: Schema.optional(Schema.NonEmptyString).pipe(
      about("With etcds://: a PEM file of this process's client certificate (etcd with --client-cert-auth)")
    ),
    coordinationKey: Schema.optional(Schema.NonEmptyString).pipe(
      about("With etcds://: a PEM file of the client certificate's private key")
    )
  }
}

/** The coordination credentials of a process's settings. */
export interface CoordinationAccess {
  readonly coordinationUsername?: string | undefined
  readonly coordinationPassword?: Redacted.Redacted<string> | undefined
  readonly coordinationWorldReadable?: boolean | undefined
  readonly coordinationCa?: string | undefined
  readonly coordinationCert?: string | undefined
  readonly coordinationKey?: string | undefined
}

/** A failed coordination layer: the setting at fault, its value as shown, and why. */
const badSetting = (backend: string, option: string, value: string, detail: string) =>
  Layer.effect(Coordination.Coordination)(
    Effect.fail(Coordination.coordinationError(new Coordination.InvalidOptions({ backend, option, value, detail })))
  )

/** The etcd layer with `access`'s TLS files read and its credentials. */
const etcdLayer = (
  endpoints: ReadonlyArray<string>,
  access: CoordinationAccess
): Layer.Layer<Coordination.Coordination, Coordination.CoordinationError> =>
  Layer.unwrap(
    Effect.gen(function* () {
      const read = (option: string, file: string | undefined) =>
        file === undefined
          ? Effect.succeed(undefined)
          : Effect.try({
              try: () => readFileSync(file, "utf8"),
              catch: (e) =>
                Coordination.coordinationError(
                  new Coordination.InvalidOptions({
                    backend: "etcd",
                    option,
                    value: JSON.stringify(file),
                    detail: e instanceof Error ? e.message : String(e)
                  })
                )
            })
      const ca = yield* read("coordinationCa", access.coordinationCa)
      const cert = yield* read("coordinationCert", access.coordinationCert)
      const key = yield* read("coordinationKey", access.coordinationKey)
      const { coordinationUsername: username, coordinationPassword: password } = access
      return EtcdCoordination.layer({
        endpoints,
        ...(ca === undefined
          ? {}
          : { tls: { ca, ...(cert === undefined ? {} : { cert }), ...(key === undefined ? {} : { key }) } }),
        ...(username === undefined || password === undefined ? {} : { auth: { username, password } })
      })
    })
  )

/**
 * TLS between the cluster's processes (`PeerTls`), as PEM files: every process of a cluster, and every operator's
 * command, needs the same CA; servers and coordinators their certificate and key.
 */
function peerTlsFields() {
  return {
    tlsCa: Schema.optional(Schema.NonEmptyString).pipe(
      about(
        "A PEM file of the CA that signs the cluster's certificates: with it, the RPC and the data link are served and called over TLS"
      )
    ),
    tlsCert: Schema.optional(Schema.NonEmptyString).pipe(
      about(
        "With tlsCa: a PEM file of this process's certificate (required to listen, and to call servers that require one)"
      )
    ),
    tlsKey: Schema.optional(Schema.NonEmptyString).pipe(about("With tlsCa: a PEM file of tlsCert's private key")),
    tlsMutual: Schema.optional(Schema.Boolean).pipe(
      about("With tlsCa: whether servers take only clients with a certificate the CA signed", true)
    ),
    tlsServerName: Schema.optional(Schema.NonEmptyString).pipe(
      about("With tlsCa: the name every server's certificate is checked against, instead of the host of its address")
    )
  }
}

/** The peer TLS settings of a process. */
export interface PeerTlsSettings {
  readonly tlsCa?: string | undefined
  readonly tlsCert?: string | undefined
  readonly tlsKey?: string | undefined
  readonly tlsMutual?: boolean | undefined
  readonly tlsServerName?: string | undefined
}

/**
 * The `PeerTls` options the settings give, their files read and checked (`undefined`: no `tlsCa`, plaintext); a file
 * that cannot be read, or does not hold what its key says, fails naming the key and the file (never a key's content).
 *
 * @since 0.1.0
 */
export const peerTlsOf = (
  settings: PeerTlsSettings
): Effect.Effect<PeerTls.PeerTlsOptions | undefined, InvalidConfig> =>
  Effect.gen(function* () {
    const { tlsCa, tlsCert, tlsKey, tlsMutual, tlsServerName } = settings
    if (tlsCa === undefined) {
      const stray = (["tlsCert", "tlsKey", "tlsMutual", "tlsServerName"] as const).find(
        (k) => settings[k] !== undefined
      )
      return stray === undefined
        ? undefined
        : yield* new InvalidConfig({ key: stray, source: "settings", detail: "TLS needs tlsCa" })
    }
    const read = (key: string, file: string | undefined) =>
      file === undefined
        ? Effect.succeed(undefined)
        : Effect.try({
            try: () => readFileSync(file, "utf8"),
            catch: (e) =>
              new InvalidConfig({ key, source: `the file ${file}`, detail: e instanceof Error ? e.message : String(e) })
          })
    const ca = (yield* read("tlsCa", tlsCa))!
    const cert = yield* read("tlsCert", tlsCert)
    const key = yield* read("tlsKey", tlsKey)
    const options: PeerTls.PeerTlsOptions = {
      ca,
      ...(cert === undefined ? {} : { cert }),
      ...(key === undefined ? {} : { key: Redacted.make(key) }),
      ...(tlsMutual === undefined ? {} : { mutual: tlsMutual }),
      ...(tlsServerName === undefined ? {} : { serverName: tlsServerName })
    }
    // Checked here, where the files are known: a PEM that does not parse is named by its key and file.
    yield* Effect.mapError(PeerTls.make(options), (e) => {
      const setting = (text: string) => text.replace(/\btls\.(\w)/g, (_, c: string) => `tls${c.toUpperCase()}`)
      const name = setting(e.option)
      const file = { tlsCa, tlsCert, tlsKey }[name as "tlsCa" | "tlsCert" | "tlsKey"]
      return new InvalidConfig({
        key: name,
        source: file === undefined ? "settings" : `the file ${file}`,
        detail: setting(e.detail)
      })
    })
    return options
  })

/** What every process reads. */
const common = {
  coordination: CoordinationUrl.pipe(
    about(
      "The coordination service: zookeeper://host:port[,host:port...][/chroot] or etcd://host:port[,host:port...] (etcds:// for TLS)"
    )
  ),
  namespace: Schema.optional(Schema.String).pipe(about("The cluster's coordination namespace", "/strata")),
  ...coordinationAccess(),
  ...peerTlsFields()
}

/** The settings of any process that listens. */
const listening = {
  ...common,
  id: Int.pipe(about("This process's server id: an integer ≥ 0, unique among the cluster's servers of its kind")),
  listen: Schema.optional(Schema.String).pipe(
    about("Where the process's RPC listens, host:port (port 0: any free one)", "127.0.0.1:0")
  ),
  advertise: Schema.optional(Schema.String).pipe(
    about("The host:port others reach this process at, when not where it listens")
  ),
  httpListen: Schema.String.check(
    Schema.makeFilter((text: string) =>
      HostPort.parse(text, { listen: true }) === undefined
        ? `expected host:port (port 0: any free one), got ${text}`
        : undefined
    )
  ).pipe(
    Schema.withDecodingDefaultKey(Effect.succeed("127.0.0.1:0")),
    about("Where the ops HTTP endpoint (/metrics, /healthz, /readyz) listens, host:port (port 0: any free one)")
  ),
  logFormat: Logging.LogFormat.pipe(
    Schema.withDecodingDefaultKey(Effect.succeed<Logging.LogFormat>("pretty")),
    about("How the process writes its log: pretty (one line an entry), json or logfmt")
  )
}

/**
 * `strata tablet-server`'s settings: `id`, `data` and `coordination` required.
 *
 * @since 0.1.0
 */
export const TabletServerConfig = Schema.Struct({
  ...listening,
  data: Schema.NonEmptyString.pipe(about("The server's data directory (its replicas' logs)")),
  store: Schema.Literals(["segments", "rocksdb", "level"]).pipe(
    Schema.withDecodingDefaultKey(Effect.succeed<"segments">("segments")),
    about(
      "How the replicas' logs are kept in the data directory: segments (segment files, as Kafka), rocksdb or level (a store)"
    )
  ),
  segmentBytes: Schema.optional(SegmentBytes).pipe(
    about("With store segments: the size past which a log's active segment rolls, in bytes", 256 * 1024 * 1024)
  ),
  segmentMs: Schema.optional(OptionSchemas.PositiveInt).pipe(
    about("With store segments: the age in ms at which a log's active segment rolls (unset: never by age)")
  ),
  flushIntervalMs: Schema.optional(OptionSchemas.PositiveInt).pipe(
    about(
      "With store segments: flush each log to the device this often, in ms (unset: never; replication and the OS keep it, as Kafka)"
    )
  ),
  flushBytes: Schema.optional(OptionSchemas.PositiveInt).pipe(
    about("With store segments: flush a log to the device once this many bytes were written since its last flush")
  ),
  tailBytes: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))).pipe(
    about(
      "With store segments: the bytes of each log's last written batches kept in memory, which answer follower fetches and consumers at the end without reading the files (0: none)",
      1024 * 1024
    )
  ),
  rack: Schema.optional(Schema.String).pipe(
    about("The rack or zone of this server: a tablet's replicas go to distinct racks")
  ),
  dataListen: Schema.optional(Schema.String).pipe(
    about(
      "Where the data link (appends and follower fetches) listens, host:port; when unset, the listen host, any free port"
    )
  ),
  dataAdvertise: Schema.optional(Schema.String).pipe(
    about("The host:port others reach the data link at, when not where it listens")
  )
})

/**
 * `strata coordinator`'s settings: `id` and `coordination` required.
 *
 * @since 0.1.0
 */
export const CoordinatorConfig = Schema.Struct({
  ...listening,
  rejoinBackoff: Schema.optional(OptionSchemas.DurationOption("positive")).pipe(
    about("The pause before campaigning again after a leadership ended", Duration.seconds(1))
  ),
  ...rebalanceFields()
})

/**
 * The rebalance settings a coordinator reads, each `RebalanceConfig` key under a `rebalance` prefix
 * (`rebalanceCheckInterval`, `STRATA_REBALANCE_CHECK_INTERVAL`), checked by `RebalanceConfig`'s own rules.
 */
function rebalanceFields() {
  const f = RebalanceConfig.RebalanceConfig.fields
  return {
    rebalanceEnabled: f.enabled.pipe(
      about("Whether the controller starts rebalances by itself (a manual start works either way)")
    ),
    rebalanceCheckInterval: f.checkInterval.pipe(
      about("How often the rebalance trigger checks the imbalance (it also checks when a server joins)")
    ),
    rebalanceTriggerThreshold: f.triggerThreshold.pipe(
      about(
        "The imbalance (coefficient of variation, population sd / mean, of replica counts over eligible servers) above which a rebalance starts; it re-arms below half of it"
      )
    ),
    rebalanceCooldown: f.cooldown.pipe(about("How long after a rebalance ends before the trigger may start another")),
    rebalanceBatchRatio: f.batchRatio.pipe(about("A batch's share of the plan's moves, in (0, 1]")),
    rebalanceMaxConcurrentMigrations: f.maxConcurrentMigrations.pipe(
      about("The most moves in flight into or out of one server at once")
    ),
    rebalanceMaxClusterMigrations: f.maxClusterMigrations.pipe(
      about("The most moves in flight in the cluster at once")
    ),
    rebalanceThrottleBytesPerSec: f.throttleBytesPerSec.pipe(
      about("The fetch rate of a server's replicas being added by a rebalance, bytes per second (0: unthrottled)")
    ),
    rebalanceMoveTimeout: f.moveTimeout.pipe(
      about("How long one move may take before it is cancelled and tried again")
    ),
    rebalanceGateWindow: f.gateWindow.pipe(
      about("How long the cluster must stay healthy between batches (and the baseline's measuring window)")
    ),
    rebalanceGateLatencyFactor: f.gateLatencyFactor.pipe(
      about(
        "A server's append latency p99 may grow to this factor of its baseline (and baseline + 20 ms) during a rebalance"
      )
    )
  }
}

/**
 * The `RebalanceConfig` of a coordinator's settings.
 *
 * @since 0.1.0
 */
export const rebalanceOf = (settings: typeof CoordinatorConfig.Type): RebalanceConfig.RebalanceConfig => ({
  enabled: settings.rebalanceEnabled,
  checkInterval: settings.rebalanceCheckInterval,
  triggerThreshold: settings.rebalanceTriggerThreshold,
  cooldown: settings.rebalanceCooldown,
  batchRatio: settings.rebalanceBatchRatio,
  maxConcurrentMigrations: settings.rebalanceMaxConcurrentMigrations,
  maxClusterMigrations: settings.rebalanceMaxClusterMigrations,
  throttleBytesPerSec: settings.rebalanceThrottleBytesPerSec,
  moveTimeout: settings.rebalanceMoveTimeout,
  gateWindow: settings.rebalanceGateWindow,
  gateLatencyFactor: settings.rebalanceGateLatencyFactor
})

/**
 * The settings of an operator's command (`strata tablets ...`).
 *
 * @since 0.1.0
 */
export const ClientConfig = Schema.Struct(common)

/**
 * The settings of an operator's command, which reaches the cluster through coordination (`coordination`) or through
 * coordinators' addresses (`bootstrap`, `host:port[,host:port...]`: their RPC, with no coordination session).
 *
 * @since 0.1.0
 */
export const AdminConfig = Schema.Struct({
  coordination: Schema.optional(common.coordination),
  namespace: common.namespace,
  ...coordinationAccess(),
  ...peerTlsFields(),
  bootstrap: Schema.optional(
    Schema.String.check(
      Schema.makeFilter((text: string) =>
        hostPorts(text) === undefined ? `expected host:port[,host:port...], got ${text}` : undefined
      )
    )
  ).pipe(
    about(
      "Coordinators' host:port[,host:port...]: an operator's command reaches the cluster through their RPC instead of coordination"
    )
  )
})

/**
 * What each replication setting means, for `strata config list` (`ReplicationConfig`'s fields carry their meaning
 * in doc comments, which are not there at run time).
 */
const replicationMeanings: Readonly<Record<keyof ReplicationConfig.ReplicationConfig, string>> = {
  replicationFactor: "Replicas per tablet",
  minInsyncReplicas: "In-sync replicas an acks=all append needs, and below which the high watermark stops",
  sessionTimeout: "The tablet servers' coordination session timeout: how long a dead server goes unnoticed",
  replicaLagTimeMax: "A follower not caught up for this long leaves the ISR (checked every half of it)",
  fetchMaxBytes: "The most a follower's fetch returns, in bytes (at least one batch)",
  fetchMaxWait: "How long a fetch with nothing to return waits for an append",
  appendTimeout: "How long an acks=all append waits for its records to be replicated",
  retryBackoff: "The pause before a failed fetch or ISR request is sent again",
  producerIdExpiration: "How long a tablet remembers an idempotent producer that has stopped appending to it",
  retentionCheckInterval: "How often each replica deletes what its table's retention lets go",
  uncleanLeaderElection:
    "Elect a replica outside the ISR when no ISR member is live (it may lose acknowledged records)",
  leaderElection: "How a new leader is chosen among the live in-sync replicas: first-in-isr or largest-log-end",
  leaderImbalanceCheckInterval:
    "How often the controller moves leadership back to preferred replicas in the ISR (0: never)",
  leaderImbalancePercent:
    "A server's share of its preferred tablets led elsewhere, in percent, above which they move back to it"
}

/** Where settings were given, for the error that names a bad one. */
export interface Sources {
  /** A settings file (`--config`), if given: YAML (`.yaml`, `.yml`) or JSON (`.json`; otherwise by its content). */
  readonly file?: string | undefined
  /** The environment (`STRATA_<KEY>`). */
  readonly env: Readonly<Record<string, string | undefined>>
  /** Settings from flags, by key (`--set key=value` and the named flags). */
  readonly flags: Readonly<Record<string, string | undefined>>
}

/** `sessionTimeout` → `STRATA_SESSION_TIMEOUT`. */
export const envName = (key: string): string => `STRATA_${key.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase()}`

// ---------------------------------------------------------------------------
// The settings file
// ---------------------------------------------------------------------------

/** The file's text as a value: YAML or JSON by its extension, else JSON when it opens with `{`. */
const parseFile = (file: string, text: string): Effect.Effect<unknown, InvalidConfig> => {
  const extension = extname(file).toLowerCase()
  const yaml =
    extension === ".yaml" || extension === ".yml" ? true : extension === ".json" ? false : !/^\s*\{/.test(text)
  const invalid = (detail: string) => new InvalidConfig({ key: "--config", source: file, detail })
  if (!yaml) {
    return Effect.try({
      try: () => JSON.parse(text) as unknown,
      catch: (e) => invalid(`not valid JSON: ${e instanceof Error ? e.message : String(e)}`)
    })
  }
  return Effect.suspend(() => {
    const document = Yaml.parseDocument(text)
    const [error] = document.errors
    // The parser's message names the line and column, then shows the line: the first line of it is enough.
    if (error !== undefined) {
      return Effect.fail(invalid(`not valid YAML: ${error.message.split("\n")[0]!.replace(/:$/, "")}`))
    }
    return Effect.try({
      try: () => document.toJS() as unknown,
      catch: (e) => invalid(`not valid YAML: ${e instanceof Error ? e.message : String(e)}`)
    })
  })
}

/**
 * The settings of `file`, a mapping of known keys to values (text, numbers, booleans): an unknown key, or a value
 * that is a list, a mapping or null, is refused naming the key.
 */
const readFile = (
  file: string,
  known: ReadonlyArray<string>
): Effect.Effect<Readonly<Record<string, string | number | boolean>>, InvalidConfig> =>
  Effect.gen(function* () {
    const text = yield* Effect.try({
      try: () => readFileSync(file, "utf8"),
      catch: (e) =>
        new InvalidConfig({ key: "--config", source: file, detail: e instanceof Error ? e.message : String(e) })
    })
    const parsed = yield* parseFile(file, text)
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
      return yield* new InvalidConfig({
        key: "--config",
        source: file,
        detail: `expected a mapping of settings (key: value), got ${OptionSchemas.show(parsed)}`
      })
    }
    const settings: Record<string, string | number | boolean> = {}
    for (const [key, value] of Object.entries(parsed)) {
      if (!known.includes(key)) {
        return yield* new InvalidConfig({ key, source: file, detail: `unknown setting (known: ${known.join(", ")})` })
      }
      if (typeof value !== "string" && typeof value !== "number" && typeof value !== "boolean") {
        return yield* new InvalidConfig({
          key,
          source: file,
          detail: `${OptionSchemas.show(value)}: expected a value (text, a number, true or false); leave the key out to leave it unset`
        })
      }
      settings[key] = value
    }
    return settings
  })

// ---------------------------------------------------------------------------
// The sources as ConfigProviders
// ---------------------------------------------------------------------------

/**
 * `provider` finding only values: a name that is only the start of others (`STRATA_DATA` of `STRATA_DATA_LISTEN`)
 * is not found, so the next source is asked for it.
 */
const valuesOnly = (provider: ConfigProvider.ConfigProvider): ConfigProvider.ConfigProvider =>
  ConfigProvider.make((path) =>
    Effect.map(provider.load(path), (node) =>
      node?.value === undefined ? undefined : ConfigProvider.makeValue(node.value)
    )
  )

/** One source of settings: its provider, and how an error names it for a key. */
interface Source {
  readonly provider: ConfigProvider.ConfigProvider
  readonly name: (key: string) => string
}

/** The sources, first the one that wins: flags, then the environment, then the file. */
const sourcesList = (
  sources: Sources,
  file: Readonly<Record<string, string | number | boolean>> | undefined
): ReadonlyArray<Source> => {
  const defined = (record: Readonly<Record<string, string | undefined>>): Record<string, string> =>
    Object.fromEntries(Object.entries(record).filter((entry): entry is [string, string] => entry[1] !== undefined))
  const list: Array<Source> = [
    {
      provider: ConfigProvider.fromUnknown(defined(sources.flags), { preserveEmptyStrings: true }),
      name: () => "flags"
    },
    {
      provider: valuesOnly(
        ConfigProvider.fromEnv({ env: defined(sources.env), preserveEmptyStrings: true }).pipe(
          ConfigProvider.constantCase,
          ConfigProvider.nested("STRATA")
        )
      ),
      name: (key) => `$${envName(key)}`
    }
  ]
  if (file !== undefined && sources.file !== undefined) {
    const path = sources.file
    list.push({ provider: ConfigProvider.fromUnknown(file, { preserveEmptyStrings: true }), name: () => path })
  }
  return list
}

/** Where each key's value comes from (the first source that has it), and its text there. */
const originsOf = (
  list: ReadonlyArray<Source>,
  keys: ReadonlyArray<string>
): Effect.Effect<ReadonlyMap<string, { readonly source: string; readonly text: string }>, InvalidConfig> =>
  Effect.gen(function* () {
    const origins = new Map<string, { readonly source: string; readonly text: string }>()
    for (const key of keys) {
      for (const source of list) {
        const node = yield* source.provider
          .load([key])
          .pipe(Effect.mapError((e) => new InvalidConfig({ key, source: source.name(key), detail: e.message })))
        if (node?.value !== undefined) {
          origins.set(key, { source: source.name(key), text: node.value })
          break
        }
      }
    }
    return origins
  })

// ---------------------------------------------------------------------------
// Reading the keys with Config
// ---------------------------------------------------------------------------

/** A duration read as text: a number of milliseconds (`6000`) or a duration's text (`6 seconds`). */
const DurationText = Schema.String.pipe(
  Schema.decodeTo(
    Schema.Union([Schema.Finite, Schema.String]),
    SchemaTransformation.transform({
      decode: (text: string) => (text.trim() !== "" && Number.isFinite(Number(text)) ? Number(text) : text),
      encode: (input: number | string) => String(input)
    })
  )
)

/**
 * Whether `schema` can be read from text (its input is text, a number, a boolean or a literal): deriving its text
 * form throws for a declared input without one (a duration's `Duration.Input`).
 */
const readsText = (schema: Schema.Top): boolean => {
  try {
    Schema.toCodecStringTree(schema)
    return true
  } catch {
    return false
  }
}

/**
 * The Schema `Config` reads `fields`' input with: every key optional, its text parsed as its Schema's input wants
 * (`"3"` a number, `"true"` a boolean; a duration, whose input is declared rather than text, by `DurationText`).
 * What it reads is then decoded by the settings' own Schema, defaults and rules between keys included.
 */
const inputOf = (fields: Schema.Struct.Fields) =>
  Schema.Struct(
    Object.fromEntries(
      Object.entries(fields).map(([key, field]) => {
        const input = Schema.toEncoded(field)
        return [key, Schema.optionalKey(readsText(input) ? input : DurationText)]
      })
    )
  )

const formatter = SchemaIssue.makeFormatterStandardSchemaV1()

/** A Schema's message as the rest of the error reads: `Expected a string representing a finite number` → `expected a number`. */
const readable = (text: string): string =>
  (text.startsWith("Expected") ? `e${text.slice(1)}` : text).replace(
    "a string representing a finite number",
    "a number"
  )

/** `fields`' input read with `Config` from `provider`; a value that is not what its key wants names its source. */
const readInput = (
  fields: Schema.Struct.Fields,
  provider: ConfigProvider.ConfigProvider,
  origins: ReadonlyMap<string, { readonly source: string; readonly text: string }>
): Effect.Effect<Readonly<Record<string, unknown>>, InvalidConfig> =>
  Config.schema(inputOf(fields))
    .parse(provider)
    .pipe(
      Effect.mapError((error) => {
        if (error.cause._tag === "SourceError") {
          // The sources are in memory: none of them fails to be read.
          return new InvalidConfig({ key: "settings", source: "config provider", detail: error.cause.message })
        }
        const [first] = formatter(error.cause.issue).issues
        const key = String(first?.path?.map((p) => (typeof p === "object" ? p.key : p))[0] ?? "settings")
        const origin = origins.get(key)
        const detail = readable(first?.message ?? error.message)
        return new InvalidConfig({
          key,
          source: origin?.source ?? "defaults",
          detail: origin === undefined ? detail : `${OptionSchemas.show(origin.text)}: ${detail}`
        })
      })
    )

/**
 * The settings of `schema` (and the replication settings) from `sources`: the process's own settings, and
 * `replication` for `ReplicationConfig`. A key no source may hold, a file that cannot be read, or a value the
 * schema refuses fails with `InvalidConfig`.
 *
 * @since 0.1.0
 */
export const load = <T>(
  schema: Schema.Decoder<T> & { readonly fields: Schema.Struct.Fields },
  sources: Sources
): Effect.Effect<{ readonly settings: T; readonly replication: ReplicationConfig.ReplicationConfig }, InvalidConfig> =>
  Effect.gen(function* () {
    const known = [...Object.keys(schema.fields), ...replicationKeys]
    const file = sources.file === undefined ? undefined : yield* readFile(sources.file, known)
    for (const [key, text] of Object.entries(sources.flags)) {
      if (text !== undefined && !known.includes(key)) {
        return yield* new InvalidConfig({
          key,
          source: "--set",
          detail: `unknown setting (known: ${known.join(", ")})`
        })
      }
    }
    const list = sourcesList(sources, file)
    const provider = list.map((s) => s.provider).reduce((first, next) => ConfigProvider.orElse(first, next))
    const origins = yield* originsOf(list, known)
    const sourceOf = (key: string) => origins.get(key)?.source ?? "defaults"
    const ownInput = yield* readInput(schema.fields, provider, origins)
    const replicationInput = yield* readInput(ReplicationConfig.ReplicationConfig.fields, provider, origins)
    const settings = yield* OptionSchemas.decodeOptions(schema, { exact: true })(ownInput).pipe(
      Effect.mapError((bad) => {
        const first = OptionSchemas.summary(bad)
        return new InvalidConfig({
          key: first.option,
          source: sourceOf(first.option.split(/[.[]/)[0]!),
          detail: first.value === "undefined" ? first.detail : `${first.value}: ${first.detail}`
        })
      })
    )
    const replication = yield* ReplicationConfig.decode(replicationInput).pipe(
      Effect.mapError(
        (e) =>
          new InvalidConfig({
            key: e.option,
            source: sourceOf(e.option),
            detail: e.value === "unset" ? e.detail : `${e.value}: ${e.detail}`
          })
      )
    )
    return { settings, replication }
  })

// ---------------------------------------------------------------------------
// The settings, listed
// ---------------------------------------------------------------------------

/**
 * A process that reads settings: `operator` is the operator's commands (`strata tablets`, `rebalance`, `cluster`).
 *
 * @since 0.1.0
 */
export type Reader = "tablet-server" | "coordinator" | "operator"

/**
 * One setting, as `strata config list` prints it.
 *
 * @since 0.1.0
 */
export interface Setting {
  /** Its key, in `--config`'s file and `--set key=value`. */
  readonly key: string
  /** Its environment variable. */
  readonly env: string
  /** Its default, as it would be written (a duration as `30 seconds`); undefined when it has none. */
  readonly default: string | undefined
  /** Whether a process that reads it refuses to start without it. */
  readonly required: boolean
  /** The processes that read it. */
  readonly readBy: ReadonlyArray<Reader>
  /** What it means, on one line. */
  readonly description: string
}

/** A duration as it would be written: the largest unit that holds it whole (`30 seconds`, `1 day`, `500 millis`). */
const durationText = (duration: Duration.Duration): string => {
  const millis = Duration.toMillis(duration)
  const units: ReadonlyArray<readonly [string, number]> = [
    ["day", 86_400_000],
    ["hour", 3_600_000],
    ["minute", 60_000],
    ["second", 1_000]
  ]
  for (const [unit, size] of units) {
    if (millis >= size && millis % size === 0) return `${millis / size} ${unit}${millis === size ? "" : "s"}`
  }
  return `${millis} millis`
}

/** A default as it would be written. */
const defaultText = (value: unknown): string => (Duration.isDuration(value) ? durationText(value) : String(value))

/** What decoding nothing gives `field`: its default, nothing, or a failure (it is required). */
const defaultOf = (key: string, field: Schema.Constraint): { readonly required: boolean; readonly value: unknown } => {
  // The settings' Schemas need no services to decode.
  const one = Schema.Struct({ [key]: field }) as unknown as Schema.Decoder<Readonly<Record<string, unknown>>>
  const exit = Schema.decodeUnknownExit(one)({})
  if (Exit.isFailure(exit)) return { required: true, value: undefined }
  const value = (exit.value as Readonly<Record<string, unknown>>)[key]
  return { required: false, value: value ?? field.ast.context?.annotations?.default }
}

/**
 * Every setting the cluster's processes read (the tablet server's, the coordinator's, the operator's commands', and
 * the replication settings all of them share), in that order.
 *
 * @since 0.1.0
 */
export const settingsList = (): ReadonlyArray<Setting> => {
  const readers: ReadonlyArray<readonly [Reader, Schema.Struct.Fields]> = [
    ["tablet-server", TabletServerConfig.fields],
    ["coordinator", CoordinatorConfig.fields],
    ["operator", AdminConfig.fields]
  ]
  const keys = [...new Set(readers.flatMap(([, fields]) => Object.keys(fields)))]
  const own = keys.map((key): Setting => {
    const readBy = readers.filter(([, fields]) => key in fields).map(([reader]) => reader)
    const field = readers.find(([, fields]) => key in fields)![1][key]!
    const { required, value } = defaultOf(key, field)
    const description = field.ast.context?.annotations?.description
    return {
      key,
      env: envName(key),
      default: value === undefined ? undefined : defaultText(value),
      required,
      readBy,
      description: typeof description === "string" ? description : ""
    }
  })
  const replicationFields: Schema.Struct.Fields = ReplicationConfig.ReplicationConfig.fields
  const replication = Object.entries(replicationFields).map(([key, field]): Setting => {
    const { required, value } = defaultOf(key, field)
    return {
      key,
      env: envName(key),
      default: value === undefined ? undefined : defaultText(value),
      required,
      readBy: ["tablet-server", "coordinator", "operator"],
      description: replicationMeanings[key as keyof ReplicationConfig.ReplicationConfig]
    }
  })
  return [...own, ...replication]
}
