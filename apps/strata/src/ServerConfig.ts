/**
 * The configuration of the cluster's processes (`strata tablet-server`, `strata coordinator`, and the operator's
 * `strata tablets ...`), read from a JSON file (`--config FILE`), then the environment (`STRATA_<KEY>`, e.g.
 * `STRATA_MIN_INSYNC_REPLICAS=2`), then flags (`--set key=value`, and the named flags), each source overriding
 * the one before. The merged settings are decoded by one Schema per process; a bad value's error names its key
 * and the source it came from.
 *
 * The coordination backend is a URL: `zookeeper://host:port[,host:port...][/chroot]` or
 * `etcd://host:port[,host:port...]` (`etcds://` for TLS endpoints).
 *
 * @since 0.1.0
 */
import { Coordination, HostPort, OptionSchemas, type Store } from "@strata/core"
import { readFileSync } from "node:fs"
import * as EtcdCoordination from "@strata/election/etcd"
import * as ZooKeeperCoordination from "@strata/election/zookeeper"
import * as LevelStore from "@strata/store-adapters/level"
import * as RocksDbStore from "@strata/store-adapters/rocksdb"
import { ReplicaRpc, ReplicationConfig } from "@strata/replica"
import { Data, Effect, Layer, Schema } from "effect"
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

/** Keys whose values are text: from the environment or a flag they are taken as written, not parsed. */
const textKeys = new Set([
  "coordination",
  "httpListen",
  "logFormat",
  "namespace",
  "listen",
  "advertise",
  "dataListen",
  "dataAdvertise",
  "rack",
  "store",
  "data",
  "leaderElection"
])

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

/** The coordination layer a URL names (a URL the config's schema let through). */
export const coordinationLayer = (
  url: string
): Layer.Layer<Coordination.Coordination, Coordination.CoordinationError> => {
  const target = parseCoordination(url)
  if (target === undefined) throw new Error(`not a coordination URL: ${url}`)
  if (target._tag === "etcd") return EtcdCoordination.layer({ endpoints: target.endpoints })
  const { connectString } = target
  return Layer.effect(Coordination.Coordination)(
    Effect.map(
      ZooKeeperCoordination.make(
        target.root === undefined ? { connectString } : { connectString, root: target.root }
      ).pipe(Effect.catch((e) => explainUnreachable(connectString, e))),
      (zk) => ({
        backend: zk.backend,
        session: (options) => Effect.catch(zk.session(options), (e) => explainUnreachable(connectString, e))
      })
    )
  )
}

/** The store layer of a server's data directory. */
export const storeLayer = (
  store: "level" | "rocksdb",
  directory: string
): Layer.Layer<Store.Store, Store.StoreError> =>
  store === "level" ? LevelStore.layer({ directory }) : RocksDbStore.layer({ directory })

const Int = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))

/** What every process reads. */
const common = {
  /** The coordination service, as a URL. */
  coordination: CoordinationUrl,
  /** The cluster's coordination namespace (`/strata`). */
  namespace: Schema.optional(Schema.String)
}

/** The settings of any process that listens. */
const listening = {
  ...common,
  id: Int,
  listen: Schema.optional(Schema.String),
  advertise: Schema.optional(Schema.String),
  /** Where the ops HTTP endpoint (`/metrics`, `/healthz`, `/readyz`) listens, `host:port`; default loopback, any port. */
  httpListen: Schema.String.check(
    Schema.makeFilter((text: string) =>
      HostPort.parse(text, { listen: true }) === undefined
        ? `expected host:port (port 0: any free one), got ${text}`
        : undefined
    )
  ).pipe(Schema.withDecodingDefaultKey(Effect.succeed("127.0.0.1:0"))),
  /** How the process writes its log: `pretty` (the default), `json` or `logfmt`. */
  logFormat: Logging.LogFormat.pipe(Schema.withDecodingDefaultKey(Effect.succeed<Logging.LogFormat>("pretty")))
}

/**
 * `strata tablet-server`'s settings: `id`, `data` and `coordination` required.
 *
 * @since 0.1.0
 */
export const TabletServerConfig = Schema.Struct({
  ...listening,
  /** The server's data directory (its replicas' logs). */
  data: Schema.NonEmptyString,
  /** The store backend over the data directory (`rocksdb`, the default, or `level`). */
  store: Schema.Literals(["rocksdb", "level"]).pipe(
    Schema.withDecodingDefaultKey(Effect.succeed<"rocksdb">("rocksdb"))
  ),
  rack: Schema.optional(Schema.String),
  /** Where the data link (appends and follower fetches) listens, `host:port`; default the listen host, any port. */
  dataListen: Schema.optional(Schema.String),
  /** The `host:port` others reach the data link at, when not the one it listens on. */
  dataAdvertise: Schema.optional(Schema.String)
})

/**
 * `strata coordinator`'s settings: `id` and `coordination` required.
 *
 * @since 0.1.0
 */
export const CoordinatorConfig = Schema.Struct({
  ...listening,
  /** The pause before campaigning again after a leadership ended (`"1 second"`, or a number of milliseconds). */
  rejoinBackoff: Schema.optional(OptionSchemas.DurationOption("positive"))
})

/**
 * The settings of an operator's command (`strata tablets ...`).
 *
 * @since 0.1.0
 */
export const ClientConfig = Schema.Struct(common)

/** Where settings were given, for the error that names a bad one. */
export interface Sources {
  /** A JSON file (`--config`), if given. */
  readonly file?: string | undefined
  /** The environment (`STRATA_<KEY>`). */
  readonly env: Readonly<Record<string, string | undefined>>
  /** Settings from flags, by key (`--set key=value` and the named flags). */
  readonly flags: Readonly<Record<string, string | undefined>>
}

/** `sessionTimeout` → `STRATA_SESSION_TIMEOUT`. */
export const envName = (key: string): string => `STRATA_${key.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase()}`

/** A value given as text (environment, flag) as the key wants it. */
const fromText = (key: string, text: string): unknown => {
  if (textKeys.has(key)) return text
  if (text === "true" || text === "false") return text === "true"
  const n = Number(text)
  return text.trim() !== "" && Number.isFinite(n) ? n : text
}

/**
 * The settings of `schema` (and the replication settings) merged from `sources`: the process's own settings, and
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
    const own = Object.keys(schema.fields)
    const known = new Set<string>([...own, ...replicationKeys])
    const merged: Record<string, unknown> = {}
    const origin: Record<string, string> = {}
    if (sources.file !== undefined) {
      const file = sources.file
      const parsed = yield* Effect.try({
        try: () => JSON.parse(readFileSync(file, "utf8")) as unknown,
        catch: (e) => new InvalidConfig({ key: "--config", source: file, detail: String(e) })
      })
      if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
        return yield* new InvalidConfig({ key: "--config", source: file, detail: "expected a JSON object" })
      }
      for (const [key, value] of Object.entries(parsed)) {
        if (!known.has(key)) {
          return yield* new InvalidConfig({
            key,
            source: file,
            detail: `unknown setting (known: ${[...known].join(", ")})`
          })
        }
        merged[key] = value
        origin[key] = file
      }
    }
    for (const key of known) {
      const text = sources.env[envName(key)]
      if (text === undefined) continue
      merged[key] = fromText(key, text)
      origin[key] = `$${envName(key)}`
    }
    for (const [key, text] of Object.entries(sources.flags)) {
      if (text === undefined) continue
      if (!known.has(key)) {
        return yield* new InvalidConfig({
          key,
          source: "--set",
          detail: `unknown setting (known: ${[...known].join(", ")})`
        })
      }
      merged[key] = fromText(key, text)
      origin[key] = "flags"
    }
    const ownInput: Record<string, unknown> = {}
    const replication: Record<string, unknown> = {}
    for (const [key, value] of Object.entries(merged)) {
      if (replicationKeys.includes(key)) replication[key] = value
      else ownInput[key] = value
    }
    const settings = yield* OptionSchemas.decodeOptions(schema, { exact: true })(ownInput).pipe(
      Effect.mapError((bad) => {
        const first = OptionSchemas.summary(bad)
        const key = first.option.split(/[.[]/)[0]!
        return new InvalidConfig({
          key: first.option,
          source: origin[key] ?? "defaults",
          detail: first.value === "undefined" ? first.detail : `${first.value}: ${first.detail}`
        })
      })
    )
    const decoded = yield* ReplicationConfig.decode(replication).pipe(
      Effect.mapError(
        (e) =>
          new InvalidConfig({
            key: e.option,
            source: origin[e.option] ?? "defaults",
            detail: e.value === "unset" ? e.detail : `${e.value}: ${e.detail}`
          })
      )
    )
    return { settings, replication: decoded }
  })
