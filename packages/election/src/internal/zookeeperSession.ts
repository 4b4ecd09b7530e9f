/**
 * A ZooKeeper session: one node-zookeeper-client client, its state, its
 * operations and one-shot watches, and the read timeout the client lacks.
 *
 * @internal
 */
import { Coordination } from "@strata/core"
import { Deferred, Duration, Effect, Exit, Option, PubSub, type Scope, Stream } from "effect"
import zookeeper, {
  type ACL,
  type Client,
  type Event as ZkEvent,
  type Stat as ZkStat,
  type Transaction,
  type TransactionResult
} from "node-zookeeper-client"
import { type Access, Codes, closeClient, codeOf, connect } from "./zookeeperClient.js"
import { bufferOf, bytesOf, invalidPath, parentOf, sessionIdOf, statOf } from "./zookeeperPaths.js"

/** Whether a session state is one a session never leaves. */
export const isFinal = (state: Coordination.SessionState): boolean => state === "expired" || state === "closed"

/** A session: its client, its state as the client last reported it, and the watches its end fails. */
export interface SessionRec {
  readonly client: Client
  readonly id: string
  /** The ACL of every node the session creates. */
  readonly acls: Array<ACL>
  state: Coordination.SessionState
  readonly states: PubSub.PubSub<Coordination.SessionState>
  readonly watches: Set<Deferred.Deferred<Coordination.WatchEvent, Coordination.CoordinationError>>
}

/** Why the session can no longer be used, once it ended. */
export const endReason = (rec: SessionRec): Coordination.ErrorReason | undefined =>
  rec.state === "closed"
    ? new Coordination.SessionClosed({ session: rec.id })
    : rec.state === "expired"
      ? new Coordination.SessionExpired({ session: rec.id })
      : undefined

/** Read through a function, so narrowing does not assume the state cannot change meanwhile. */
export const isExpired = (rec: SessionRec): boolean => rec.state === "expired"

/** Moves the session to `state` (a final state stays) and fails its pending watches when it ends. */
export const setState = (rec: SessionRec, state: Coordination.SessionState): void => {
  if (isFinal(rec.state) || rec.state === state) return
  rec.state = state
  PubSub.publishUnsafe(rec.states, state)
  const reason = endReason(rec)
  if (reason !== undefined) {
    const failure = Exit.fail(Coordination.coordinationError(reason))
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
): Coordination.ErrorReason => {
  switch (code) {
    case Codes.NO_NODE:
      return new Coordination.NoNode({ path: target.path })
    case Codes.NO_AUTH:
      return new Coordination.NotAuthorized({
        path: target.path,
        detail: "ZooKeeper refused this session's identity (NoAuth): the node's ACL names another"
      })
    case Codes.NODE_EXISTS:
      return new Coordination.NodeExists({ path: target.path })
    case Codes.BAD_VERSION:
      return new Coordination.BadVersion({ path: target.path, expected: target.version ?? -1 })
    case Codes.NOT_EMPTY:
      return new Coordination.NotEmpty({ path: target.path })
    case Codes.NO_CHILDREN_FOR_EPHEMERALS:
      return new Coordination.NoChildrenForEphemerals({ path: target.path })
    case Codes.BAD_ARGUMENTS:
      return new Coordination.InvalidPath({ path: target.path, detail: "rejected by the server" })
    case Codes.SESSION_EXPIRED:
      setState(rec, "expired")
      return new Coordination.SessionExpired({ session: rec.id })
    default:
      return (
        endReason(rec) ??
        new Coordination.ConnectionLoss({
          detail: error instanceof Error ? error.message : `ZooKeeper error ${String(code)}`
        })
      )
  }
}

/** Why a call cannot go out now: the session ended, or the client knows its connection is down. */
const unusable = (rec: SessionRec): Coordination.CoordinationError | undefined => {
  const ended = endReason(rec)
  if (ended !== undefined) return Coordination.coordinationError(ended)
  return rec.state === "suspended"
    ? Coordination.coordinationError(new Coordination.ConnectionLoss({ detail: `session ${rec.id} is disconnected` }))
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
): Effect.Effect<A, Coordination.CoordinationError> =>
  Effect.suspend(() => {
    const refused = unusable(rec)
    if (refused !== undefined) return Effect.fail(refused)
    return Effect.callback<A, Coordination.CoordinationError>((resume) => {
      try {
        run((error, value) => {
          if (error !== null && error !== undefined) {
            resume(Effect.fail(Coordination.coordinationError(reasonOf(rec, codeOf(error), target, error))))
          } else resume(Effect.succeed(value as A))
        })
      } catch (error) {
        resume(Effect.fail(Coordination.coordinationError(reasonOf(rec, codeOf(error), target, error))))
      }
    })
  })

const validate = (path: string, sequential = false): Effect.Effect<void, Coordination.CoordinationError> => {
  const reason = invalidPath(path, sequential)
  return reason === undefined ? Effect.void : Effect.fail(Coordination.coordinationError(reason))
}

const zkMode = (mode: Coordination.CreateMode): number => {
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

const isSequential = (mode: Coordination.CreateMode): boolean =>
  mode === "persistent-sequential" || mode === "ephemeral-sequential"

const eventOf = (event: ZkEvent): Coordination.WatchEvent => {
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
  const deferred = Deferred.makeUnsafe<Coordination.WatchEvent, Coordination.CoordinationError>()
  const watcher = (event: ZkEvent) => {
    rec.watches.delete(deferred)
    Deferred.doneUnsafe(deferred, Exit.succeed(eventOf(event)))
  }
  return { deferred, watcher } as const
}

const track = (
  rec: SessionRec,
  deferred: Deferred.Deferred<Coordination.WatchEvent, Coordination.CoordinationError>
): Effect.Effect<Coordination.WatchEvent, Coordination.CoordinationError> => {
  const ended = endReason(rec)
  if (ended !== undefined) Deferred.doneUnsafe(deferred, Exit.fail(Coordination.coordinationError(ended)))
  else if (!Deferred.isDoneUnsafe(deferred)) rec.watches.add(deferred)
  return Deferred.await(deferred)
}

// ---------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------

const createOne = (rec: SessionRec, path: string, data: Uint8Array, mode: Coordination.CreateMode) =>
  call<string>(rec, { path }, (done) => rec.client.create(path, bufferOf(data), rec.acls, zkMode(mode), done))

/** Creates the missing ancestors of `path`, persistent and empty (one created meanwhile is fine). */
const ensureParents = (rec: SessionRec, path: string): Effect.Effect<void, Coordination.CoordinationError> => {
  const parent = parentOf(path)
  if (parent === "/") return Effect.void
  return createOne(rec, parent, new Uint8Array(0), "persistent").pipe(
    Effect.asVoid,
    Effect.catchIf(
      (e: Coordination.CoordinationError) => e.reason._tag === "NodeExists",
      () => Effect.void
    ),
    Effect.catchIf(
      (e: Coordination.CoordinationError) => e.reason._tag === "NoNode",
      () =>
        Effect.andThen(ensureParents(rec, parent), createOne(rec, parent, new Uint8Array(0), "persistent")).pipe(
          Effect.asVoid,
          Effect.catchIf(
            (e: Coordination.CoordinationError) => e.reason._tag === "NodeExists",
            () => Effect.void
          )
        )
    )
  )
}

const create = (rec: SessionRec, path: string, data: Uint8Array, options?: Coordination.CreateOptions) => {
  const mode = options?.mode ?? "persistent"
  const copy = data.slice()
  return Effect.andThen(
    validate(path, isSequential(mode)),
    options?.createParents === true
      ? createOne(rec, path, copy, mode).pipe(
          Effect.catchIf(
            (e: Coordination.CoordinationError) => e.reason._tag === "NoNode",
            () => Effect.andThen(ensureParents(rec, path), createOne(rec, path, copy, mode))
          )
        )
      : createOne(rec, path, copy, mode)
  )
}

const getRaw = (rec: SessionRec, path: string) =>
  call<readonly [Buffer | null, ZkStat]>(rec, { path }, (done) =>
    rec.client.getData(path, (error, data, stat) => done(error, [data, stat] as const))
  )

const get = (rec: SessionRec, path: string): Effect.Effect<Coordination.Node, Coordination.CoordinationError> =>
  Effect.andThen(
    validate(path),
    Effect.map(getRaw(rec, path), ([data, stat]) => ({ data: bytesOf(data), stat: statOf(stat) }))
  )

const exists = (
  rec: SessionRec,
  path: string
): Effect.Effect<Option.Option<Coordination.Stat>, Coordination.CoordinationError> =>
  Effect.andThen(
    validate(path),
    Effect.map(
      call<ZkStat | null>(rec, { path }, (done) => rec.client.exists(path, done)),
      (stat) => (stat === null || stat === undefined ? Option.none() : Option.some(statOf(stat)))
    )
  )

const set = (rec: SessionRec, path: string, data: Uint8Array, version?: number) =>
  Effect.andThen(
    validate(path),
    Effect.map(
      call<ZkStat>(rec, { path, version }, (done) => rec.client.setData(path, bufferOf(data), version ?? -1, done)),
      statOf
    )
  )

const remove = (rec: SessionRec, path: string, version?: number) =>
  Effect.andThen(
    validate(path),
    call<void>(rec, { path, version }, (done) => rec.client.remove(path, version ?? -1, (error) => done(error)))
  )

const children = (rec: SessionRec, path: string) =>
  Effect.andThen(
    validate(path),
    Effect.map(
      call<Array<string>>(rec, { path }, (done) => rec.client.getChildren(path, done)),
      (names): ReadonlyArray<string> => [...names].sort()
    )
  )

/** Queues `ops` on a transaction, the nodes it creates with `acls`. */
const queue = (tx: Transaction, ops: ReadonlyArray<Coordination.Op>, acls: Array<ACL>): void => {
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
        tx.create(o.path, bufferOf(o.data), acls, zkMode(o.mode ?? "persistent"))
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
}

/** The results of a committed transaction, one per op. */
const resultsOf = (
  ops: ReadonlyArray<Coordination.Op>,
  results: Array<TransactionResult>
): ReadonlyArray<Coordination.OpResult> =>
  ops.map((o, i): Coordination.OpResult => {
    const r = results[i]
    if (o._tag === "create") return { _tag: "create", path: r?.path ?? o.path }
    if (o._tag === "set" && r?.stat !== undefined) return { _tag: "set", stat: statOf(r.stat) }
    return o._tag === "check" ? { _tag: "check" } : { _tag: "delete" }
  })

/** Why a transaction failed, with the index of the op that failed it when the server names one. */
const failureOf = (
  rec: SessionRec,
  ops: ReadonlyArray<Coordination.Op>,
  error: unknown,
  results: Array<TransactionResult> | undefined
): Coordination.CoordinationError => {
  const index =
    results === undefined
      ? -1
      : results.findIndex((r) => r.err !== undefined && r.err !== 0 && r.err !== Codes.RUNTIME_INCONSISTENCY)
  const failed = index >= 0 ? ops[index]! : undefined
  const version = failed === undefined ? undefined : "version" in failed ? failed.version : undefined
  const reason = reasonOf(rec, codeOf(error), { path: failed?.path ?? "", version }, error)
  return Coordination.coordinationError(reason, index >= 0 ? index : undefined)
}

const multi = (
  rec: SessionRec,
  ops: ReadonlyArray<Coordination.Op>
): Effect.Effect<ReadonlyArray<Coordination.OpResult>, Coordination.CoordinationError> =>
  Effect.gen(function* () {
    for (const [i, o] of ops.entries()) {
      const reason = invalidPath(o.path, o._tag === "create" && isSequential(o.mode ?? "persistent"))
      if (reason !== undefined) return yield* Effect.fail(Coordination.coordinationError(reason, i))
    }
    if (ops.length === 0) return []
    const refused = unusable(rec)
    if (refused !== undefined) return yield* Effect.fail(refused)
    return yield* Effect.callback<ReadonlyArray<Coordination.OpResult>, Coordination.CoordinationError>((resume) => {
      const tx = rec.client.transaction()
      queue(tx, ops, rec.acls)
      tx.commit((error, results) => {
        if (error === null || error === undefined) resume(Effect.succeed(resultsOf(ops, results)))
        else resume(Effect.fail(failureOf(rec, ops, error, results)))
      })
    })
  })

const watchNode = (
  rec: SessionRec,
  path: string
): Effect.Effect<Coordination.Watch<Option.Option<Coordination.Node>>, Coordination.CoordinationError> =>
  Effect.andThen(
    validate(path),
    Effect.gen(function* () {
      while (true) {
        const data = makeWatcher(rec)
        const read = yield* call<readonly [Buffer | null, ZkStat] | undefined>(rec, { path }, (done) =>
          rec.client.getData(path, data.watcher, (error, bytes, stat) => {
            if (codeOf(error) === Codes.NO_NODE) done(null, undefined)
            else done(error, [bytes, stat] as const)
          })
        )
        if (read !== undefined) {
          const node: Coordination.Node = { data: bytesOf(read[0]), stat: statOf(read[1]) }
          return { value: Option.some(node), changed: track(rec, data.deferred) }
        }
        const existence = makeWatcher(rec)
        const stat = yield* call<ZkStat | null>(rec, { path }, (done) =>
          rec.client.exists(path, existence.watcher, done)
        )
        if (stat === null || stat === undefined) {
          return { value: Option.none<Coordination.Node>(), changed: track(rec, existence.deferred) }
        }
        // created between the two reads: read again
      }
    })
  )

const watchChildren = (
  rec: SessionRec,
  path: string
): Effect.Effect<Coordination.Watch<ReadonlyArray<string>>, Coordination.CoordinationError> =>
  Effect.andThen(
    validate(path),
    Effect.suspend(() => {
      const w = makeWatcher(rec)
      return Effect.map(
        call<Array<string>>(rec, { path }, (done) => rec.client.getChildren(path, w.watcher, done)),
        (names) => ({ value: [...names].sort() as ReadonlyArray<string>, changed: track(rec, w.deferred) })
      )
    })
  )

/** The `Session` of a record. */
export const makeSession = (rec: SessionRec, timeout: Duration.Duration): Coordination.Session => ({
  id: rec.id,
  timeout,
  state: Effect.sync(() => rec.state),
  changes: Stream.fromPubSub(rec.states).pipe(Stream.takeUntil(isFinal)),
  // A round trip on the session's connection: the server answers only for a live session.
  ping: Effect.asVoid(call<ZkStat | null>(rec, { path: "/" }, (done) => rec.client.exists("/", done))),
  create: (path, data, options) => create(rec, path, data, options),
  get: (path) => get(rec, path),
  exists: (path) => exists(rec, path),
  set: (path, data, version) => set(rec, path, data, version),
  delete: (path, version) => remove(rec, path, version),
  children: (path) => children(rec, path),
  multi: (ops) => multi(rec, ops),
  watchNode: (path) => watchNode(rec, path),
  watchChildren: (path) => watchChildren(rec, path)
})

/**
 * Opens a session's client in the scope, following the client's state; closing the scope closes it (and waits
 * for the server to end the session, unless it expired).
 */
export const open = (
  connectString: string,
  sessionTimeout: number,
  connectTimeoutMs: number,
  access: Access
): Effect.Effect<SessionRec, Coordination.CoordinationError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.gen(function* () {
      const client = yield* connect(connectString, { sessionTimeout }, connectTimeoutMs, access.digest)
      const states = yield* PubSub.unbounded<Coordination.SessionState>({ replay: 1 })
      const rec: SessionRec = {
        client,
        id: sessionIdOf(client.getSessionId()),
        acls: access.acls,
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

/**
 * The read timeout the client lacks (node-zookeeper-client pings but never gives up on a silent connection, so a
 * partitioned client would believe itself connected until TCP gives up, minutes later): a request every sixth of
 * the session timeout, and when one gets no answer within a third of it, the session is suspended and the
 * connection reset. The client so notices a silent connection within half the session timeout and has the other
 * half to reconnect (to another server, if it has one) before the server expires the session.
 */
export const readTimeout = (rec: SessionRec, s: Coordination.Session): Effect.Effect<void> =>
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
