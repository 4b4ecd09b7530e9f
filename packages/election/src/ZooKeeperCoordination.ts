/**
 * `Coordination` on ZooKeeper through node-zookeeper-client.
 *
 * Every `session()` opens its own ZooKeeper client, hence its own ZooKeeper
 * session: its ephemeral nodes live until the scope closes or the server
 * expires it. Watches are ZooKeeper's one-shot watches, set atomically with
 * the read that returns the value.
 *
 * @since 0.1.0
 */
import { Coordination, OptionSchemas } from "@strata/core"
import { Clock, Config, Context, Duration, Effect, Layer, Schema, type Scope } from "effect"
import { invalidAbsolutePath, invalidHostPort } from "./internal/options.js"
import zookeeper from "node-zookeeper-client"
import { type Access, access, closeClient, connect } from "./internal/zookeeperClient.js"
import * as ZkSession from "./internal/zookeeperSession.js"

const { decodeOptions, DurationOption, Secret, summary } = OptionSchemas

/** Why a connect string is not `host:port[,host:port...]` with ports in 1–65535, if it is not. */
const invalidConnectString = (connectString: string): string | undefined => {
  const hosts = connectString.split(",")
  for (const host of hosts) {
    const problem = invalidHostPort(host)
    if (problem !== undefined) {
      return hosts.length === 1
        ? `${problem} (host:port[,host:port...]; a chroot goes in root)`
        : `${JSON.stringify(host)}: ${problem}`
    }
  }
  return undefined
}

/** Options of the ZooKeeper coordination service, validated by `make`. */
export const ZooKeeperCoordinationOptions = Schema.Struct({
  /** `host:port[,host:port...]` of the ensemble, ports in 1–65535 (a chroot goes in `root`). */
  connectString: Schema.String.check(Schema.makeFilter(invalidConnectString)),
  /** A chroot, an absolute path (e.g. `/strata`) under which every path lives; created if missing. `""` or `/`: none. */
  root: Schema.optional(
    Schema.String.check(Schema.makeFilter((root: string) => (root === "" ? undefined : invalidAbsolutePath(root))))
  ),
  /** Session timeout when a session asks for none (10 seconds). */
  sessionTimeout: DurationOption("positive").pipe(
    Schema.withDecodingDefault(Effect.succeed<Duration.Input>("10 seconds"))
  ),
  /** How long opening a session may take (10 seconds). */
  connectTimeout: DurationOption("positive").pipe(
    Schema.withDecodingDefault(Effect.succeed<Duration.Input>("10 seconds"))
  ),
  /**
   * Digest credentials every session adds (`username` without `:`; `password` as text or `Redacted`, never printed).
   * With them, every node Strata creates (the root included, when it creates it) is writable by this identity only:
   * another session, with other credentials or none, fails `NotAuthorized` when it changes or deletes one.
   */
  auth: Schema.optional(
    Schema.Struct({
      username: Schema.NonEmptyString.check(
        Schema.makeFilter((u: string) => (u.includes(":") ? "a digest username cannot hold ':'" : undefined))
      ),
      password: Secret
    })
  ),
  /** With `auth`: whether anyone may read the nodes (true, as Kafka's own nodes are) or only this identity (false). */
  worldReadable: Schema.optional(Schema.Boolean)
})
/** What `make` takes (see `ZooKeeperCoordinationOptions`): durations as any `Duration.Input`, a number being milliseconds. */
export type ZooKeeperCoordinationOptions = typeof ZooKeeperCoordinationOptions.Encoded

/** The ZooKeeper coordination service's own key; its layer provides `Coordination` and `CoordinationFaults` too. */
export class ZooKeeperCoordination extends Context.Service<
  ZooKeeperCoordination,
  Coordination.Shape & { readonly faults: Coordination.FaultsShape }
>()("@strata/election/ZooKeeperCoordination") {}

/** The service: what its sessions and faults share. */
interface Service {
  /** The ensemble's connect string with the chroot appended. */
  readonly connectString: string
  /** The session timeout a session asking for none gets, in whole milliseconds (as the client takes it). */
  readonly defaultTimeout: number
  readonly connectTimeoutMs: number
  /** The sessions' credentials and the ACL of the nodes they create. */
  readonly access: Access
  /** Each open session's record, for the faults. */
  readonly records: WeakMap<Coordination.Session, ZkSession.SessionRec>
}

/** A duration as the client takes it: whole milliseconds, at least one. */
const wholeMillis = (d: Duration.Duration): number => Math.max(1, Math.round(Duration.toMillis(d)))

/** Opens a session (its own client) in the scope, with the read timeout running beside it. */
const session = (
  svc: Service,
  sessionOptions?: Coordination.SessionOptions
): Effect.Effect<Coordination.Session, Coordination.CoordinationError, Scope.Scope> =>
  Effect.gen(function* () {
    const requested =
      sessionOptions?.timeout === undefined
        ? svc.defaultTimeout
        : wholeMillis(Duration.fromInputUnsafe(sessionOptions.timeout))
    const rec = yield* ZkSession.open(svc.connectString, requested, svc.connectTimeoutMs, svc.access)
    const s = ZkSession.makeSession(rec, Duration.millis(rec.client.getSessionTimeout()))
    svc.records.set(s, rec)
    yield* Effect.forkScoped(ZkSession.readTimeout(rec, s))
    return s
  })

/**
 * Holds the client's reconnects back in the scope: a reconnect it attempts waits until the scope closes. The
 * client's next connection then goes where it would have gone.
 */
const holdReconnects = (rec: ZkSession.SessionRec): Effect.Effect<void, never, Scope.Scope> => {
  const manager = rec.client.connectionManager
  if (manager === undefined) return Effect.void
  const waiting: Array<() => void> = []
  let held = true
  const own = Object.getOwnPropertyDescriptor(manager, "findNextServer")
  return Effect.acquireRelease(
    Effect.sync(() => {
      const next = manager.findNextServer
      manager.findNextServer = (callback) => {
        if (held) waiting.push(() => next.call(manager, callback))
        else next.call(manager, callback)
      }
    }),
    () =>
      Effect.sync(() => {
        held = false
        if (own === undefined) Reflect.deleteProperty(manager, "findNextServer")
        else Object.defineProperty(manager, "findNextServer", own)
        for (const resume of waiting.splice(0)) resume()
      })
  )
}

/**
 * Expires a session on the server, as `CoordinationFaults.expire`: a second client on the same session id and
 * password takes the session over and closes it, which ends it on the server. The original client is held back
 * from reconnecting meanwhile (else it could win the session back before the close arrives); once let go, it
 * reconnects and is told its session expired.
 */
const expire = (svc: Service, s: Coordination.Session): Effect.Effect<void, Coordination.CoordinationError> =>
  Effect.gen(function* () {
    const rec = svc.records.get(s)
    if (rec === undefined) {
      return yield* Effect.fail(Coordination.coordinationError(new Coordination.SessionClosed({ session: s.id })))
    }
    const ended = ZkSession.endReason(rec)
    if (ended !== undefined) return yield* Effect.fail(Coordination.coordinationError(ended))
    yield* Effect.scoped(
      Effect.gen(function* () {
        yield* holdReconnects(rec)
        const twin = yield* connect(
          svc.connectString,
          {
            sessionTimeout: rec.client.getSessionTimeout(),
            sessionId: rec.client.getSessionId(),
            sessionPassword: rec.client.getSessionPassword()
          },
          svc.connectTimeoutMs
        )
        yield* closeClient(twin)
      })
    )
    const deadline = (yield* Clock.currentTimeMillis) + svc.connectTimeoutMs
    while (!ZkSession.isExpired(rec) && (yield* Clock.currentTimeMillis) < deadline) yield* Effect.sleep("20 millis")
    ZkSession.setState(rec, "expired")
  })

// ---------------------------------------------------------------------------
// The service
// ---------------------------------------------------------------------------

const decode = (
  input: unknown
): Effect.Effect<typeof ZooKeeperCoordinationOptions.Type, Coordination.CoordinationError> =>
  decodeOptions(ZooKeeperCoordinationOptions, { exact: true })(input).pipe(
    Effect.mapError((bad) =>
      Coordination.coordinationError(new Coordination.InvalidOptions({ backend: "zookeeper", ...summary(bad) }))
    )
  )

/**
 * Builds the ZooKeeper coordination service; the root (chroot) node is created if missing. Options that fail
 * `ZooKeeperCoordinationOptions` fail with `InvalidCoordinationOptions`, before anything connects.
 */
export const make = (
  options: ZooKeeperCoordinationOptions
): Effect.Effect<ZooKeeperCoordination["Service"], Coordination.CoordinationError, Scope.Scope> =>
  Effect.gen(function* () {
    const o = yield* decode(options)
    const defaultTimeout = wholeMillis(o.sessionTimeout)
    const connectTimeoutMs = Math.ceil(Duration.toMillis(o.connectTimeout))
    const root = o.root === undefined || o.root === "" || o.root === "/" ? "" : o.root
    const nodeAccess = access(o.auth, o.worldReadable ?? true)
    if (root !== "") {
      const bootstrap = yield* connect(
        o.connectString,
        { sessionTimeout: defaultTimeout },
        connectTimeoutMs,
        nodeAccess.digest
      )
      yield* Effect.callback<void, Coordination.CoordinationError>((resume) => {
        bootstrap.mkdirp(root, null, nodeAccess.acls, zookeeper.CreateMode.PERSISTENT, (error) => {
          resume(
            error === null || error === undefined
              ? Effect.void
              : Effect.fail(
                  Coordination.coordinationError(
                    new Coordination.Unreachable({ address: o.connectString, detail: error.message })
                  )
                )
          )
        })
      }).pipe(Effect.ensuring(closeClient(bootstrap)))
    }
    const svc: Service = {
      connectString: `${o.connectString}${root}`,
      defaultTimeout,
      connectTimeoutMs,
      access: nodeAccess,
      records: new WeakMap()
    }
    const faults: Coordination.FaultsShape = { expire: (s) => expire(svc, s) }
    return { backend: "zookeeper", session: (sessionOptions) => session(svc, sessionOptions), faults }
  })

/** A layer providing `ZooKeeperCoordination`, `Coordination` and `CoordinationFaults`. */
export const layer = (
  options: ZooKeeperCoordinationOptions
): Layer.Layer<
  ZooKeeperCoordination | Coordination.Coordination | Coordination.Faults,
  Coordination.CoordinationError
> =>
  Layer.effectContext(
    Effect.map(make(options), (service) =>
      Context.make(ZooKeeperCoordination, service).pipe(
        Context.add(Coordination.Coordination, service),
        Context.add(Coordination.Faults, service.faults)
      )
    )
  )

/** Like `layer`, with the options read from configuration. */
export const layerConfig = (
  config: Config.Wrap<ZooKeeperCoordinationOptions>
): Layer.Layer<
  ZooKeeperCoordination | Coordination.Coordination | Coordination.Faults,
  Coordination.CoordinationError | Config.ConfigError
> => Layer.unwrap(Effect.map(Config.unwrap(config), layer))
