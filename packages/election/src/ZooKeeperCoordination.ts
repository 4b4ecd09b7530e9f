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
import {
  BadVersion,
  ConnectionLoss,
  Coordination,
  type CoordinationError,
  type CoordinationErrorReason,
  CoordinationFaults,
  type CoordinationFaultsShape,
  type CoordinationShape,
  CoordinationUnreachable,
  type CreateMode,
  type CreateOptions,
  coordinationError,
  InvalidCoordinationOptions,
  InvalidPath,
  NoChildrenForEphemerals,
  NodeExists,
  NoNode,
  type Node,
  NotEmpty,
  type Op,
  type OpResult,
  type Session,
  type SessionOptions,
  type SessionState,
  SessionClosed,
  SessionExpired,
  type Stat,
  type Watch,
  type WatchEvent,
  OptionSchemas
} from "@strata/core"
import {
  Config,
  Context,
  Deferred,
  Duration,
  Effect,
  Exit,
  Layer,
  Option,
  PubSub,
  Schema,
  type Scope,
  Stream
} from "effect"
import zookeeper, { type Client, type Event as ZkEvent, type Stat as ZkStat } from "node-zookeeper-client"
import { invalidAbsolutePath, invalidHostPort } from "./internal/options.js"
import { bufferOf, bytesOf, invalidPath, parentOf, sessionIdOf, statOf } from "./internal/zookeeperPaths.js"

const { decodeOptions, PositiveInt, summary } = OptionSchemas

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
  /** Session timeout when a session asks for none, in milliseconds (default 10 000). */
  sessionTimeoutMs: Schema.optional(PositiveInt),
  /** How long opening a session may take, in milliseconds (default 10 000). */
  connectTimeoutMs: Schema.optional(PositiveInt)
})
/** @see ZooKeeperCoordinationOptions */
export type ZooKeeperCoordinationOptions = typeof ZooKeeperCoordinationOptions.Type

/** The ZooKeeper coordination service's own key; its layer provides `Coordination` and `CoordinationFaults` too. */
export class ZooKeeperCoordination extends Context.Service<
  ZooKeeperCoordination,
  CoordinationShape & { readonly faults: CoordinationFaultsShape }
>()("@strata/election/ZooKeeperCoordination") {}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

const Codes = {
  CONNECTION_LOSS: -4,
  BAD_ARGUMENTS: -8,
  NO_NODE: -101,
  BAD_VERSION: -103,
  NO_CHILDREN_FOR_EPHEMERALS: -108,
  NODE_EXISTS: -110,
  NOT_EMPTY: -111,
  SESSION_EXPIRED: -112,
  RUNTIME_INCONSISTENCY: -2
} as const

const codeOf = (error: unknown): number | undefined =>
  typeof error === "object" && error !== null && "getCode" in error && typeof error.getCode === "function"
    ? (error.getCode() as number)
    : undefined

const isFinal = (state: SessionState): boolean => state === "expired" || state === "closed"

// ---------------------------------------------------------------------------
// Sessions
// ---------------------------------------------------------------------------

interface SessionRec {
  readonly client: Client
  readonly id: string
  state: SessionState
  readonly states: PubSub.PubSub<SessionState>
  readonly watches: Set<Deferred.Deferred<WatchEvent, CoordinationError>>
}

const endReason = (rec: SessionRec): CoordinationErrorReason | undefined =>
  rec.state === "closed"
    ? new SessionClosed({ session: rec.id })
    : rec.state === "expired"
      ? new SessionExpired({ session: rec.id })
      : undefined

/** Read through a function, so narrowing does not assume the state cannot change meanwhile. */
const isExpired = (rec: SessionRec): boolean => rec.state === "expired"

const setState = (rec: SessionRec, state: SessionState): void => {
  if (isFinal(rec.state) || rec.state === state) return
  rec.state = state
  PubSub.publishUnsafe(rec.states, state)
  const reason = endReason(rec)
  if (reason !== undefined) {
    const failure = Exit.fail(coordinationError(reason))
    for (const deferred of rec.watches) Deferred.doneUnsafe(deferred, failure)
    rec.watches.clear()
  }
}

/** Context of a failing call, used to build the reason. */
interface Target {
  readonly path: string
  readonly version?: number | undefined
}

const reasonOf = (
  rec: SessionRec,
  code: number | undefined,
  target: Target,
  error: unknown
): CoordinationErrorReason => {
  switch (code) {
    case Codes.NO_NODE:
      return new NoNode({ path: target.path })
    case Codes.NODE_EXISTS:
      return new NodeExists({ path: target.path })
    case Codes.BAD_VERSION:
      return new BadVersion({ path: target.path, expected: target.version ?? -1 })
    case Codes.NOT_EMPTY:
      return new NotEmpty({ path: target.path })
    case Codes.NO_CHILDREN_FOR_EPHEMERALS:
      return new NoChildrenForEphemerals({ path: target.path })
    case Codes.BAD_ARGUMENTS:
      return new InvalidPath({ path: target.path, detail: "rejected by the server" })
    case Codes.SESSION_EXPIRED:
      setState(rec, "expired")
      return new SessionExpired({ session: rec.id })
    default:
      return (
        endReason(rec) ??
        new ConnectionLoss({ detail: error instanceof Error ? error.message : `ZooKeeper error ${String(code)}` })
      )
  }
}

/** Why a call cannot go out now: the session ended, or the client knows its connection is down. */
const unusable = (rec: SessionRec): CoordinationError | undefined => {
  const ended = endReason(rec)
  if (ended !== undefined) return coordinationError(ended)
  return rec.state === "suspended"
    ? coordinationError(new ConnectionLoss({ detail: `session ${rec.id} is disconnected` }))
    : undefined
}

/**
 * Runs one driver call, after checking the session is still usable. While the client knows its connection is
 * down, a call fails at once with a retryable lost connection instead of queueing behind the reconnect.
 */
const call = <A>(
  rec: SessionRec,
  target: Target,
  run: (done: (error: unknown, value?: A) => void) => void
): Effect.Effect<A, CoordinationError> =>
  Effect.suspend(() => {
    const refused = unusable(rec)
    if (refused !== undefined) return Effect.fail(refused)
    return Effect.callback<A, CoordinationError>((resume) => {
      try {
        run((error, value) => {
          if (error !== null && error !== undefined) {
            resume(Effect.fail(coordinationError(reasonOf(rec, codeOf(error), target, error))))
          } else resume(Effect.succeed(value as A))
        })
      } catch (error) {
        resume(Effect.fail(coordinationError(reasonOf(rec, codeOf(error), target, error))))
      }
    })
  })

const validate = (path: string, sequential = false): Effect.Effect<void, CoordinationError> => {
  const reason = invalidPath(path, sequential)
  return reason === undefined ? Effect.void : Effect.fail(coordinationError(reason))
}

const zkMode = (mode: CreateMode): number => {
  switch (mode) {
    case "persistent":
      return zookeeper.CreateMode.PERSISTENT
    case "ephemeral":
      return zookeeper.CreateMode.EPHEMERAL
    case "persistent-sequential":
      return zookeeper.CreateMode.PERSISTENT_SEQUENTIAL
    case "ephemeral-sequential":
      return zookeeper.CreateMode.EPHEMERAL_SEQUENTIAL
  }
}

const isSequential = (mode: CreateMode): boolean => mode === "persistent-sequential" || mode === "ephemeral-sequential"

const eventOf = (event: ZkEvent): WatchEvent => {
  const path = event.getPath()
  switch (event.getType()) {
    case 1:
      return { _tag: "NodeCreated", path }
    case 2:
      return { _tag: "NodeDeleted", path }
    case 3:
      return { _tag: "NodeDataChanged", path }
    default:
      return { _tag: "NodeChildrenChanged", path }
  }
}

/** A deferred completed by a one-shot watcher; it is tracked only once its read is accepted. */
const makeWatcher = (rec: SessionRec) => {
  const deferred = Deferred.makeUnsafe<WatchEvent, CoordinationError>()
  const watcher = (event: ZkEvent) => {
    rec.watches.delete(deferred)
    Deferred.doneUnsafe(deferred, Exit.succeed(eventOf(event)))
  }
  return { deferred, watcher } as const
}

const track = (
  rec: SessionRec,
  deferred: Deferred.Deferred<WatchEvent, CoordinationError>
): Effect.Effect<WatchEvent, CoordinationError> => {
  const ended = endReason(rec)
  if (ended !== undefined) Deferred.doneUnsafe(deferred, Exit.fail(coordinationError(ended)))
  else if (!Deferred.isDoneUnsafe(deferred)) rec.watches.add(deferred)
  return Deferred.await(deferred)
}

const makeSession = (rec: SessionRec, timeout: Duration.Duration): Session => {
  const { client } = rec

  const createOne = (path: string, data: Uint8Array, mode: CreateMode) =>
    call<string>(rec, { path }, (done) => client.create(path, bufferOf(data), zkMode(mode), done))

  const ensureParents = (path: string): Effect.Effect<void, CoordinationError> => {
    const parent = parentOf(path)
    if (parent === "/") return Effect.void
    return createOne(parent, new Uint8Array(0), "persistent").pipe(
      Effect.asVoid,
      Effect.catchIf(
        (e: CoordinationError) => e.reason._tag === "NodeExists",
        () => Effect.void
      ),
      Effect.catchIf(
        (e: CoordinationError) => e.reason._tag === "NoNode",
        () =>
          Effect.andThen(ensureParents(parent), createOne(parent, new Uint8Array(0), "persistent")).pipe(
            Effect.asVoid,
            Effect.catchIf(
              (e: CoordinationError) => e.reason._tag === "NodeExists",
              () => Effect.void
            )
          )
      )
    )
  }

  const create = (path: string, data: Uint8Array, options?: CreateOptions) => {
    const mode = options?.mode ?? "persistent"
    const copy = data.slice()
    return Effect.andThen(
      validate(path, isSequential(mode)),
      options?.createParents === true
        ? createOne(path, copy, mode).pipe(
            Effect.catchIf(
              (e: CoordinationError) => e.reason._tag === "NoNode",
              () => Effect.andThen(ensureParents(path), createOne(path, copy, mode))
            )
          )
        : createOne(path, copy, mode)
    )
  }

  const getRaw = (path: string) =>
    call<readonly [Buffer | null, ZkStat]>(rec, { path }, (done) =>
      client.getData(path, (error, data, stat) => done(error, [data, stat] as const))
    )

  const get = (path: string): Effect.Effect<Node, CoordinationError> =>
    Effect.andThen(
      validate(path),
      Effect.map(getRaw(path), ([data, stat]) => ({ data: bytesOf(data), stat: statOf(stat) }))
    )

  const exists = (path: string): Effect.Effect<Option.Option<Stat>, CoordinationError> =>
    Effect.andThen(
      validate(path),
      Effect.map(
        call<ZkStat | null>(rec, { path }, (done) => client.exists(path, done)),
        (stat) => (stat === null || stat === undefined ? Option.none() : Option.some(statOf(stat)))
      )
    )

  const set = (path: string, data: Uint8Array, version?: number) =>
    Effect.andThen(
      validate(path),
      Effect.map(
        call<ZkStat>(rec, { path, version }, (done) => client.setData(path, bufferOf(data), version ?? -1, done)),
        statOf
      )
    )

  const remove = (path: string, version?: number) =>
    Effect.andThen(
      validate(path),
      call<void>(rec, { path, version }, (done) => client.remove(path, version ?? -1, (error) => done(error)))
    )

  const children = (path: string) =>
    Effect.andThen(
      validate(path),
      Effect.map(
        call<Array<string>>(rec, { path }, (done) => client.getChildren(path, done)),
        (names): ReadonlyArray<string> => [...names].sort()
      )
    )

  const multi = (ops: ReadonlyArray<Op>): Effect.Effect<ReadonlyArray<OpResult>, CoordinationError> =>
    Effect.gen(function* () {
      for (const [i, o] of ops.entries()) {
        const reason = invalidPath(o.path, o._tag === "create" && isSequential(o.mode ?? "persistent"))
        if (reason !== undefined) return yield* Effect.fail(coordinationError(reason, i))
      }
      if (ops.length === 0) return []
      const refused = unusable(rec)
      if (refused !== undefined) return yield* Effect.fail(refused)
      return yield* Effect.callback<ReadonlyArray<OpResult>, CoordinationError>((resume) => {
        const tx = client.transaction()
        /** node-zookeeper-client 1.1.3 replaces a version of 0 by -1 (`version || -1`): restore the real one. */
        const pinVersion = (version: number | undefined) => {
          const queued = tx.ops[tx.ops.length - 1]
          if (queued !== undefined && version !== undefined) queued.version = version
        }
        for (const o of ops) {
          switch (o._tag) {
            case "check":
              tx.check(o.path, o.version)
              pinVersion(o.version)
              break
            case "create":
              tx.create(o.path, bufferOf(o.data), zkMode(o.mode ?? "persistent"))
              break
            case "set":
              tx.setData(o.path, bufferOf(o.data), o.version ?? -1)
              pinVersion(o.version)
              break
            case "delete":
              tx.remove(o.path, o.version ?? -1)
              pinVersion(o.version)
              break
          }
        }
        tx.commit((error, results) => {
          if (error === null || error === undefined) {
            resume(
              Effect.succeed(
                ops.map((o, i): OpResult => {
                  const r = results[i]
                  if (o._tag === "create") return { _tag: "create", path: r?.path ?? o.path }
                  if (o._tag === "set" && r?.stat !== undefined) return { _tag: "set", stat: statOf(r.stat) }
                  return o._tag === "check" ? { _tag: "check" } : { _tag: "delete" }
                })
              )
            )
            return
          }
          const index =
            results === undefined
              ? -1
              : results.findIndex((r) => r.err !== undefined && r.err !== 0 && r.err !== Codes.RUNTIME_INCONSISTENCY)
          const failed = index >= 0 ? ops[index]! : undefined
          const version = failed === undefined ? undefined : "version" in failed ? failed.version : undefined
          const reason = reasonOf(rec, codeOf(error), { path: failed?.path ?? "", version }, error)
          resume(Effect.fail(coordinationError(reason, index >= 0 ? index : undefined)))
        })
      })
    })

  const watchNode = (path: string): Effect.Effect<Watch<Option.Option<Node>>, CoordinationError> =>
    Effect.andThen(
      validate(path),
      Effect.gen(function* () {
        while (true) {
          const data = makeWatcher(rec)
          const read = yield* call<readonly [Buffer | null, ZkStat] | undefined>(rec, { path }, (done) =>
            client.getData(path, data.watcher, (error, bytes, stat) => {
              if (codeOf(error) === Codes.NO_NODE) done(null, undefined)
              else done(error, [bytes, stat] as const)
            })
          )
          if (read !== undefined) {
            const node: Node = { data: bytesOf(read[0]), stat: statOf(read[1]) }
            return { value: Option.some(node), changed: track(rec, data.deferred) }
          }
          const existence = makeWatcher(rec)
          const stat = yield* call<ZkStat | null>(rec, { path }, (done) => client.exists(path, existence.watcher, done))
          if (stat === null || stat === undefined) {
            return { value: Option.none<Node>(), changed: track(rec, existence.deferred) }
          }
          // created between the two reads: read again
        }
      })
    )

  const watchChildren = (path: string): Effect.Effect<Watch<ReadonlyArray<string>>, CoordinationError> =>
    Effect.andThen(
      validate(path),
      Effect.suspend(() => {
        const w = makeWatcher(rec)
        return Effect.map(
          call<Array<string>>(rec, { path }, (done) => client.getChildren(path, w.watcher, done)),
          (names) => ({ value: [...names].sort() as ReadonlyArray<string>, changed: track(rec, w.deferred) })
        )
      })
    )

  // A round trip on the session's connection: the server answers only for a live session.
  const ping = Effect.asVoid(call<ZkStat | null>(rec, { path: "/" }, (done) => client.exists("/", done)))

  return {
    id: rec.id,
    timeout,
    state: Effect.sync(() => rec.state),
    changes: Stream.fromPubSub(rec.states).pipe(Stream.takeUntil(isFinal)),
    ping,
    create,
    get,
    exists,
    set,
    delete: remove,
    children,
    multi,
    watchNode,
    watchChildren
  }
}

/**
 * The read timeout the client lacks (node-zookeeper-client pings but never gives up on a silent connection, so a
 * partitioned client would believe itself connected until TCP gives up, minutes later): a request every sixth of
 * the session timeout, and when one gets no answer within a third of it, the session is suspended and the
 * connection reset. The client so notices a silent connection within half the session timeout and has the other
 * half to reconnect (to another server, if it has one) before the server expires the session.
 */
const readTimeout = (rec: SessionRec, s: Session): Effect.Effect<void> =>
  Effect.gen(function* () {
    const timeoutMs = Duration.toMillis(s.timeout)
    while (endReason(rec) === undefined) {
      yield* Effect.sleep(Duration.millis(Math.max(1, Math.floor(timeoutMs / 6))))
      if (rec.state !== "connected") continue
      const answered = yield* s.ping.pipe(
        Effect.timeoutOption(Duration.millis(Math.max(1, Math.floor(timeoutMs / 3)))),
        Effect.option
      )
      if (Option.isSome(answered) && Option.isNone(answered.value) && rec.state === "connected") {
        setState(rec, "suspended")
        rec.client.connectionManager?.socket?.destroy()
      }
    }
  })

/** Opens a client and waits until it is connected (or fails within `connectTimeoutMs`). */
const connect = (
  connectString: string,
  options: { readonly sessionTimeout: number; readonly sessionId?: Buffer; readonly sessionPassword?: Buffer },
  connectTimeoutMs: number
): Effect.Effect<Client, CoordinationError> =>
  Effect.callback<Client, CoordinationError>((resume) => {
    const client = zookeeper.createClient(connectString, { ...options, spinDelay: 100, retries: 0 })
    let settled = false
    const finish = (effect: Effect.Effect<Client, CoordinationError>) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      client.removeListener("state", onState)
      resume(effect)
    }
    const onState = (state: unknown) => {
      if (state === zookeeper.State.SYNC_CONNECTED || state === zookeeper.State.CONNECTED_READ_ONLY) {
        finish(Effect.succeed(client))
      } else if (state === zookeeper.State.EXPIRED || state === zookeeper.State.AUTH_FAILED) {
        client.close()
        finish(
          Effect.fail(
            coordinationError(
              new CoordinationUnreachable({ address: connectString, detail: `session ${String(state)}` })
            )
          )
        )
      }
    }
    const timer = setTimeout(() => {
      client.close()
      finish(
        Effect.fail(
          coordinationError(
            new CoordinationUnreachable({
              address: connectString,
              detail: `not connected after ${connectTimeoutMs} ms`
            })
          )
        )
      )
    }, connectTimeoutMs)
    client.on("state", onState)
    client.connect()
    return Effect.sync(() => {
      if (!settled) {
        settled = true
        clearTimeout(timer)
        client.close()
      }
    })
  })

/** Closes a client and waits (briefly) for the server to end its session. */
const closeClient = (client: Client): Effect.Effect<void> =>
  Effect.callback<void>((resume) => {
    const timer = setTimeout(() => resume(Effect.void), 2000)
    client.once("disconnected", () => {
      clearTimeout(timer)
      resume(Effect.void)
    })
    try {
      client.close()
    } catch {
      clearTimeout(timer)
      resume(Effect.void)
    }
  })

// ---------------------------------------------------------------------------
// The service
// ---------------------------------------------------------------------------

const decode = (input: unknown): Effect.Effect<ZooKeeperCoordinationOptions, CoordinationError> =>
  decodeOptions(ZooKeeperCoordinationOptions)(input).pipe(
    Effect.mapError((bad) =>
      coordinationError(new InvalidCoordinationOptions({ backend: "zookeeper", ...summary(bad) }))
    )
  )

/**
 * Builds the ZooKeeper coordination service; the root (chroot) node is created if missing. Options that fail
 * `ZooKeeperCoordinationOptions` fail with `InvalidCoordinationOptions`, before anything connects.
 */
export const make = (
  options: ZooKeeperCoordinationOptions
): Effect.Effect<ZooKeeperCoordination["Service"], CoordinationError, Scope.Scope> =>
  Effect.gen(function* () {
    const o = yield* decode(options)
    const defaultTimeout = o.sessionTimeoutMs ?? 10_000
    const connectTimeoutMs = o.connectTimeoutMs ?? 10_000
    const root = o.root === undefined || o.root === "" || o.root === "/" ? "" : o.root
    if (root !== "") {
      const bootstrap = yield* connect(o.connectString, { sessionTimeout: defaultTimeout }, connectTimeoutMs)
      yield* Effect.callback<void, CoordinationError>((resume) => {
        bootstrap.mkdirp(root, (error) => {
          resume(
            error === null || error === undefined
              ? Effect.void
              : Effect.fail(
                  coordinationError(new CoordinationUnreachable({ address: o.connectString, detail: error.message }))
                )
          )
        })
      }).pipe(Effect.ensuring(closeClient(bootstrap)))
    }
    const connectString = `${o.connectString}${root}`
    const records = new WeakMap<Session, SessionRec>()

    const session = (sessionOptions?: SessionOptions): Effect.Effect<Session, CoordinationError, Scope.Scope> =>
      Effect.gen(function* () {
        const requested =
          sessionOptions?.timeout === undefined
            ? defaultTimeout
            : Math.max(1, Math.round(Duration.toMillis(Duration.fromInputUnsafe(sessionOptions.timeout))))
        const rec = yield* Effect.acquireRelease(
          Effect.gen(function* () {
            const client = yield* connect(connectString, { sessionTimeout: requested }, connectTimeoutMs)
            const states = yield* PubSub.unbounded<SessionState>({ replay: 1 })
            const rec: SessionRec = {
              client,
              id: sessionIdOf(client.getSessionId()),
              state: "connected",
              states,
              watches: new Set()
            }
            PubSub.publishUnsafe(states, "connected")
            client.on("state", (state: unknown) => {
              if (state === zookeeper.State.SYNC_CONNECTED || state === zookeeper.State.CONNECTED_READ_ONLY) {
                setState(rec, "connected")
              } else if (state === zookeeper.State.DISCONNECTED) setState(rec, "suspended")
              else if (state === zookeeper.State.EXPIRED) setState(rec, "expired")
            })
            return rec
          }),
          (rec) =>
            Effect.suspend(() => {
              const wasExpired = rec.state === "expired"
              setState(rec, "closed")
              return wasExpired ? Effect.sync(() => rec.client.close()) : closeClient(rec.client)
            })
        )
        const s = makeSession(rec, Duration.millis(rec.client.getSessionTimeout()))
        records.set(s, rec)
        yield* Effect.forkScoped(readTimeout(rec, s))
        return s
      })

    const expire = (s: Session): Effect.Effect<void, CoordinationError> =>
      Effect.gen(function* () {
        const rec = records.get(s)
        if (rec === undefined) {
          return yield* Effect.fail(coordinationError(new SessionClosed({ session: s.id })))
        }
        const ended = endReason(rec)
        if (ended !== undefined) return yield* Effect.fail(coordinationError(ended))
        // A second client on the same session id and password closes the session on the server. The original
        // client may win the session back by reconnecting before the twin's close arrives, so repeat until the
        // original client is told its session expired.
        for (let attempt = 0; attempt < 5 && !isExpired(rec); attempt++) {
          const twin = yield* Effect.option(
            connect(
              connectString,
              {
                sessionTimeout: rec.client.getSessionTimeout(),
                sessionId: rec.client.getSessionId(),
                sessionPassword: rec.client.getSessionPassword()
              },
              connectTimeoutMs
            )
          )
          if (Option.isSome(twin)) yield* closeClient(twin.value)
          for (let i = 0; i < 50 && !isExpired(rec); i++) yield* Effect.sleep("20 millis")
        }
        setState(rec, "expired")
      })

    const faults: CoordinationFaultsShape = { expire }
    return { backend: "zookeeper", session, faults }
  })

/** A layer providing `ZooKeeperCoordination`, `Coordination` and `CoordinationFaults`. */
export const layer = (
  options: ZooKeeperCoordinationOptions
): Layer.Layer<ZooKeeperCoordination | Coordination | CoordinationFaults, CoordinationError> =>
  Layer.effectContext(
    Effect.map(make(options), (service) =>
      Context.make(ZooKeeperCoordination, service).pipe(
        Context.add(Coordination, service),
        Context.add(CoordinationFaults, service.faults)
      )
    )
  )

/** Like `layer`, with the options read from configuration. */
export const layerConfig = (
  config: Config.Wrap<ZooKeeperCoordinationOptions>
): Layer.Layer<ZooKeeperCoordination | Coordination | CoordinationFaults, CoordinationError | Config.ConfigError> =>
  Layer.unwrap(Effect.map(Config.unwrap(config), layer))
