/**
 * `Coordination` on etcd 3 through etcd3: ZooKeeper's tree emulated on etcd's
 * flat keyspace.
 *
 * A node at path `P` of depth `d` is the key `<root>/n<ddd><P>` holding a small
 * JSON header (data version, ephemeral owner) and the data, so the direct
 * children of `P` are one prefix range. Its children version and sequence
 * counter live in `<root>/m<P>`. Every check-and-write is one etcd txn whose
 * compares pin every key it read; a session is a lease.
 *
 * Known differences from ZooKeeper: when a lease expires or is revoked, etcd
 * deletes the session's ephemeral nodes without bumping their parents'
 * `childrenVersion`; several writes to one node inside one `multi` count as one
 * data version bump per `set` but reach etcd as a single put.
 *
 * @since 0.1.0
 */
import {
  BadVersion,
  Coordination,
  type CoordinationError,
  CoordinationFaults,
  type CoordinationFaultsShape,
  type CoordinationShape,
  type CreateMode,
  coordinationError,
  type CoordinationErrorReason,
  ConnectionLoss,
  CoordinationPaths,
  CoordinationUnreachable,
  InvalidCoordinationOptions,
  InvalidPath,
  NoChildrenForEphemerals,
  type Node,
  NodeExists,
  NoNode,
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
import { Etcd3, type IKeyValue, type IRequestOp, type ICompare, type Watcher } from "etcd3"
import { AbsolutePath, invalidHostPort } from "./internal/options.js"

const { decodeOptions, PositiveInt, summary } = OptionSchemas

/** Why an endpoint is not `http://host:port` or `https://host:port` with a port in 1–65535, if it is not. */
const invalidEndpoint = (endpoint: string): string | undefined => {
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(endpoint)?.[1]
  if (scheme !== undefined && scheme !== "http" && scheme !== "https") {
    return `expected http://host:port or https://host:port, not ${scheme}://`
  }
  const problem = invalidHostPort(endpoint.replace(/^https?:\/\//, ""))
  return problem === undefined ? undefined : `${problem} (http://host:port or https://host:port)`
}

/** Options of the etcd coordination backend, validated by `make`. */
export const EtcdCoordinationOptions = Schema.Struct({
  /** etcd client URLs, e.g. `["http://127.0.0.1:2379"]`: at least one, all `http` or all `https`, ports in 1–65535. */
  endpoints: Schema.Array(Schema.String.check(Schema.makeFilter(invalidEndpoint))).check(
    Schema.makeFilter((endpoints: ReadonlyArray<string>) =>
      endpoints.length === 0 ? "expected at least one endpoint, e.g. http://127.0.0.1:2379" : undefined
    ),
    Schema.makeFilter((endpoints: ReadonlyArray<string>) => {
      const secure = endpoints.filter((e) => e.startsWith("https://")).length
      return secure === 0 || secure === endpoints.length
        ? undefined
        : "expected all endpoints http:// or all https:// (the client cannot mix them)"
    })
  ),
  /** Key prefix under which the tree lives, an absolute path (default `"/strata/coordination"`). */
  root: Schema.optional(AbsolutePath),
  /** Default session timeout in milliseconds (default 10 000; below 2 000 counts as 2 000). */
  sessionTimeoutMs: Schema.optional(PositiveInt)
})
/** @see EtcdCoordinationOptions */
export type EtcdCoordinationOptions = typeof EtcdCoordinationOptions.Type

/** The etcd backend's own service: the `Coordination` shape plus its fault injection. */
export class EtcdCoordination extends Context.Service<
  EtcdCoordination,
  CoordinationShape & { readonly faults: CoordinationFaultsShape }
>()("@strata/election/EtcdCoordination") {}

// ---------------------------------------------------------------------------
// Paths and keys
// ---------------------------------------------------------------------------

class Fail {
  constructor(readonly reason: CoordinationErrorReason) {}
}
const fail = (reason: CoordinationErrorReason): never => {
  throw new Fail(reason)
}

const validatePath = (path: string, sequential = false): void => {
  const reason = CoordinationPaths.invalidPath(path, sequential)
  if (reason !== undefined) fail(reason)
}

const { join, nameOf, parentOf } = CoordinationPaths
const depthOf = (path: string): number => (path === "/" ? 0 : path.split("/").length - 1)
const pad = (n: number, width: number): string => n.toString().padStart(width, "0")
const isSequential = (mode: CreateMode): boolean => mode === "persistent-sequential" || mode === "ephemeral-sequential"
const isEphemeral = (mode: CreateMode): boolean => mode === "ephemeral" || mode === "ephemeral-sequential"

const prefixEnd = (prefix: Buffer): Buffer => {
  const b = Buffer.from(prefix)
  for (let i = b.length - 1; i >= 0; i--) {
    const byte = b[i] ?? 0
    if (byte < 0xff) {
      b[i] = byte + 1
      return b.subarray(0, i + 1)
    }
  }
  return Buffer.from([0])
}

const makeKeys = (root: string) => ({
  data: (path: string): Buffer => Buffer.from(`${root}/n${pad(depthOf(path), 3)}${path}`),
  meta: (path: string): Buffer => Buffer.from(`${root}/m${path}`),
  children: (path: string): Buffer => Buffer.from(`${root}/n${pad(depthOf(path) + 1, 3)}${path === "/" ? "" : path}/`)
})
type Keys = ReturnType<typeof makeKeys>

// ---------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------

interface Header {
  readonly v: number
  readonly o: string | null
}
interface Meta {
  cv: number
  seq: number
}

const encodeData = (header: Header, data: Uint8Array): Buffer =>
  Buffer.concat([Buffer.from(`${JSON.stringify(header)}\n`), Buffer.from(data)])

const decodeData = (value: Buffer): { readonly header: Header; readonly data: Uint8Array } => {
  const i = value.indexOf(0x0a)
  const header = JSON.parse(value.subarray(0, i).toString("utf8")) as Header
  return { header, data: new Uint8Array(value.subarray(i + 1)) }
}

const decodeMeta = (kv: IKeyValue | undefined): Meta => {
  if (kv === undefined) return { cv: 0, seq: 0 }
  const m = JSON.parse(kv.value.toString("utf8")) as Meta
  return { cv: m.cv, seq: m.seq }
}

const toNode = (kv: IKeyValue, meta: IKeyValue | undefined): Node => {
  const { data, header } = decodeData(kv.value)
  return {
    data,
    stat: {
      version: header.v,
      childrenVersion: decodeMeta(meta).cv,
      ephemeralOwner: header.o,
      createdOrder: Number(kv.create_revision),
      modifiedOrder: Number(kv.mod_revision)
    }
  }
}

const range = (key: Buffer, rangeEnd?: Buffer, keysOnly = false): IRequestOp => ({
  request_range: {
    key,
    ...(rangeEnd === undefined ? {} : { range_end: rangeEnd }),
    ...(keysOnly ? { keys_only: true } : {})
  }
})

const pinned = (key: Buffer, kv: IKeyValue | undefined): ICompare =>
  kv === undefined
    ? { key, target: "Version", result: "Equal", version: 0 }
    : { key, target: "Mod", result: "Equal", mod_revision: kv.mod_revision }

// ---------------------------------------------------------------------------
// Write transactions: simulated on a consistent snapshot, applied as one txn
// ---------------------------------------------------------------------------

class Need {
  constructor(readonly what: string) {}
}

interface Snapshot {
  readonly data: Map<string, IKeyValue | undefined>
  readonly meta: Map<string, IKeyValue | undefined>
  readonly children: Map<string, ReadonlyArray<string>>
}

interface NodeState {
  data: Uint8Array
  version: number
  owner: string | null
  lease: string | null
  createdOrder: number | undefined
  dirty: boolean
}

class Overlay {
  readonly nodes = new Map<string, NodeState | null>()
  readonly metas = new Map<string, Meta & { dirty: boolean }>()
  readonly children = new Map<string, Set<string>>()
  readonly touched = new Set<string>()
  constructor(readonly snap: Snapshot) {}

  get(path: string): NodeState | null {
    const o = this.nodes.get(path)
    if (o !== undefined) return o
    if (!this.snap.data.has(path)) throw new Need(`n${path}`)
    const kv = this.snap.data.get(path)
    if (kv === undefined) {
      this.nodes.set(path, null)
      return null
    }
    const { data, header } = decodeData(kv.value)
    const state: NodeState = {
      data,
      version: header.v,
      owner: header.o,
      lease: kv.lease !== "0" && kv.lease !== "" ? kv.lease : null,
      createdOrder: Number(kv.create_revision),
      dirty: false
    }
    this.nodes.set(path, state)
    return state
  }
  require(path: string): NodeState {
    const n = this.get(path)
    return n === null ? fail(new NoNode({ path })) : n
  }
  meta(path: string): Meta & { dirty: boolean } {
    const o = this.metas.get(path)
    if (o !== undefined) return o
    if (!this.snap.meta.has(path)) throw new Need(`n${path}`)
    const m = { ...decodeMeta(this.snap.meta.get(path)), dirty: false }
    this.metas.set(path, m)
    return m
  }
  kids(path: string): Set<string> {
    const o = this.children.get(path)
    if (o !== undefined) return o
    const base = this.snap.children.get(path)
    if (base === undefined) throw new Need(`c${path}`)
    const s = new Set(base)
    this.children.set(path, s)
    return s
  }
  addChild(parent: string, name: string, delta: 1 | -1): void {
    const m = this.meta(parent)
    m.cv++
    m.dirty = true
    const kids = this.kids(parent)
    if (delta === 1) kids.add(name)
    else kids.delete(name)
  }
  put(path: string, state: NodeState | null): void {
    this.nodes.set(path, state)
    this.touched.add(path)
  }
}

interface SessionCtx {
  readonly id: string
  readonly lease: string
}

type Pending = (revision: number) => OpResult

const simulate = (tx: Overlay, ops: ReadonlyArray<Op>, ctx: SessionCtx): Array<Pending> => {
  const results: Array<Pending> = []
  const createAncestors = (path: string): void => {
    const existing = tx.get(path)
    if (existing !== null) {
      if (existing.owner !== null) fail(new NoChildrenForEphemerals({ path }))
      return
    }
    const parent = parentOf(path)
    createAncestors(parent)
    createNode(path, new Uint8Array(0), "persistent")
  }
  const createNode = (path: string, data: Uint8Array, mode: CreateMode): void => {
    const parent = parentOf(path)
    tx.put(path, {
      data: new Uint8Array(data),
      version: 0,
      owner: isEphemeral(mode) ? ctx.id : null,
      lease: isEphemeral(mode) ? ctx.lease : null,
      createdOrder: undefined,
      dirty: true
    })
    tx.metas.set(path, { cv: 0, seq: 0, dirty: tx.snap.meta.get(path) !== undefined })
    tx.children.set(path, new Set())
    tx.addChild(parent, nameOf(path), 1)
  }
  ops.forEach((op, index) => {
    try {
      switch (op._tag) {
        case "check": {
          validatePath(op.path)
          const n = tx.require(op.path)
          if (n.version !== op.version) fail(new BadVersion({ path: op.path, expected: op.version }))
          results.push(() => ({ _tag: "check" }))
          break
        }
        case "create": {
          const mode = op.mode ?? "persistent"
          const sequential = isSequential(mode)
          validatePath(op.path, sequential)
          if (!sequential && op.path === "/") fail(new NodeExists({ path: op.path }))
          const parent = parentOf(op.path)
          const p = tx.get(parent)
          if (p === null) {
            if ((op as { createParents?: boolean }).createParents === true) createAncestors(parent)
            else fail(new NoNode({ path: op.path }))
          } else if (p.owner !== null) fail(new NoChildrenForEphemerals({ path: parent }))
          const meta = tx.meta(parent)
          const actual = sequential ? join(parent, nameOf(op.path) + pad(meta.seq, 10)) : op.path
          if (sequential) {
            meta.seq++
            meta.dirty = true
          }
          if (tx.get(actual) !== null) fail(new NodeExists({ path: actual }))
          createNode(actual, op.data, mode)
          results.push(() => ({ _tag: "create", path: actual }))
          break
        }
        case "set": {
          validatePath(op.path)
          const n = tx.require(op.path)
          if (op.version !== undefined && n.version !== op.version) {
            fail(new BadVersion({ path: op.path, expected: op.version }))
          }
          n.data = new Uint8Array(op.data)
          n.version++
          n.dirty = true
          tx.touched.add(op.path)
          const version = n.version
          const owner = n.owner
          const created = n.createdOrder
          const cv = tx.meta(op.path).cv
          results.push((revision) => ({
            _tag: "set",
            stat: {
              version,
              childrenVersion: cv,
              ephemeralOwner: owner,
              createdOrder: created ?? revision,
              modifiedOrder: revision
            }
          }))
          break
        }
        case "delete": {
          validatePath(op.path)
          const n = tx.require(op.path)
          if (op.version !== undefined && n.version !== op.version) {
            fail(new BadVersion({ path: op.path, expected: op.version }))
          }
          if (op.path === "/") fail(new NotEmpty({ path: op.path }))
          if (tx.kids(op.path).size > 0) fail(new NotEmpty({ path: op.path }))
          tx.put(op.path, null)
          tx.metas.set(op.path, { cv: 0, seq: 0, dirty: false })
          tx.addChild(parentOf(op.path), nameOf(op.path), -1)
          results.push(() => ({ _tag: "delete" }))
          break
        }
      }
    } catch (e) {
      if (e instanceof Fail) throw Object.assign(e, { opIndex: index })
      throw e
    }
  })
  return results
}

const buildTxn = (tx: Overlay, keys: Keys) => {
  const compare: Array<ICompare> = []
  for (const [path, kv] of tx.snap.data) compare.push(pinned(keys.data(path), kv))
  for (const [path, kv] of tx.snap.meta) compare.push(pinned(keys.meta(path), kv))
  const success: Array<IRequestOp> = []
  const paths = new Set<string>([...tx.touched, ...tx.metas.keys()])
  for (const path of paths) {
    const node = tx.nodes.get(path)
    const existed = tx.snap.data.get(path) !== undefined
    if (node === null) {
      if (tx.touched.has(path) && existed) {
        success.push({ request_delete_range: { key: keys.data(path) } })
      }
      if (tx.touched.has(path) && tx.snap.meta.get(path) !== undefined) {
        success.push({ request_delete_range: { key: keys.meta(path) } })
      }
      continue
    }
    if (node?.dirty === true) {
      success.push({
        request_put: {
          key: keys.data(path),
          value: encodeData({ v: node.version, o: node.owner }, node.data),
          ...(node.lease === null ? {} : { lease: node.lease })
        }
      })
    }
    const meta = tx.metas.get(path)
    if (meta?.dirty === true) {
      success.push({
        request_put: { key: keys.meta(path), value: Buffer.from(JSON.stringify({ cv: meta.cv, seq: meta.seq })) }
      })
    }
  }
  return { compare, success }
}

// ---------------------------------------------------------------------------
// The backend
// ---------------------------------------------------------------------------

const isFinal = (state: SessionState): boolean => state === "expired" || state === "closed"

interface SessionInternal {
  readonly lease: string
  readonly end: (state: "expired" | "closed") => void
  readonly state: () => SessionState
}

/**
 * Connects to etcd for the life of the scope; sessions are leases. Options that fail `EtcdCoordinationOptions`
 * fail with `InvalidCoordinationOptions`, before anything connects.
 */
export const make = (
  options: EtcdCoordinationOptions
): Effect.Effect<EtcdCoordination["Service"], CoordinationError, Scope.Scope> =>
  Effect.gen(function* () {
    const o = yield* decodeOptions(EtcdCoordinationOptions)(options).pipe(
      Effect.mapError((bad) => coordinationError(new InvalidCoordinationOptions({ backend: "etcd", ...summary(bad) })))
    )
    const address = o.endpoints.join(",")
    const root = o.root ?? "/strata/coordination"
    const keys = makeKeys(root)
    const defaultTimeout = Math.max(2000, o.sessionTimeoutMs ?? 10_000)
    const client = yield* Effect.acquireRelease(
      Effect.sync(() => new Etcd3({ hosts: [...o.endpoints] })),
      (c) => Effect.sync(() => c.close())
    )
    const faultClient = yield* Effect.acquireRelease(
      Effect.sync(() => new Etcd3({ hosts: [...o.endpoints] })),
      (c) => Effect.sync(() => c.close())
    )
    const call = <A>(f: () => Promise<A>): Effect.Effect<A, CoordinationError> =>
      Effect.tryPromise({
        try: f,
        catch: (e) => coordinationError(new ConnectionLoss({ detail: e instanceof Error ? e.message : String(e) }))
      })

    // the tree's root node
    yield* call(() =>
      client.kv.txn({
        compare: [{ key: keys.data("/"), target: "Version", result: "Equal", version: 0 }],
        success: [{ request_put: { key: keys.data("/"), value: encodeData({ v: 0, o: null }, new Uint8Array(0)) } }]
      })
    ).pipe(
      Effect.mapError((e) =>
        e.reason._tag === "ConnectionLoss"
          ? coordinationError(new CoordinationUnreachable({ address, detail: e.reason.detail }))
          : e
      )
    )

    const sessions = new Map<string, SessionInternal>()

    const readSnapshot = (nodes: ReadonlySet<string>, children: ReadonlySet<string>) =>
      Effect.map(
        call(() => {
          const ops: Array<IRequestOp> = []
          for (const p of nodes) ops.push(range(keys.data(p)), range(keys.meta(p)))
          for (const p of children) {
            const prefix = keys.children(p)
            ops.push(range(prefix, prefixEnd(prefix), true))
          }
          return client.kv.txn({ success: ops })
        }),
        (res): Snapshot => {
          const snap: Snapshot = { data: new Map(), meta: new Map(), children: new Map() }
          let i = 0
          const next = () => res.responses[i++]?.response_range.kvs ?? []
          for (const p of nodes) {
            snap.data.set(p, next()[0])
            snap.meta.set(p, next()[0])
          }
          for (const p of children) {
            const prefix = keys.children(p).toString("utf8")
            snap.children.set(
              p,
              next().map((kv) => kv.key.toString("utf8").slice(prefix.length))
            )
          }
          return snap
        }
      )

    const runTxn = (
      ops: ReadonlyArray<Op>,
      ctx: SessionCtx,
      createParents: boolean,
      multi: boolean
    ): Effect.Effect<ReadonlyArray<OpResult>, CoordinationError> =>
      Effect.gen(function* () {
        const ops2: ReadonlyArray<Op> = createParents
          ? ops.map((op): Op => (op._tag === "create" ? ({ ...op, createParents: true } as Op) : op))
          : ops
        for (let attempt = 0; attempt < 100; attempt++) {
          const nodes = new Set<string>()
          const children = new Set<string>()
          let pending: Array<Pending> | undefined
          let tx: Overlay | undefined
          for (let round = 0; round < 100; round++) {
            const snap = yield* readSnapshot(nodes, children)
            tx = new Overlay(snap)
            try {
              pending = simulate(tx, ops2, ctx)
              break
            } catch (e) {
              if (e instanceof Need) {
                if (e.what.startsWith("n")) nodes.add(e.what.slice(1))
                else children.add(e.what.slice(1))
                continue
              }
              if (e instanceof Fail) {
                const index = (e as Fail & { opIndex?: number }).opIndex
                return yield* Effect.fail(coordinationError(e.reason, multi ? index : undefined))
              }
              throw e
            }
          }
          if (pending === undefined || tx === undefined) break
          const { compare, success } = buildTxn(tx, keys)
          if (success.length === 0 && compare.length === 0) return pending.map((f) => f(0))
          const res = yield* Effect.tryPromise({
            try: () => client.kv.txn({ compare, success }),
            catch: (e) => {
              const detail = e instanceof Error ? e.message : String(e)
              if (/lease not found/i.test(detail)) {
                sessions.get(ctx.id)?.end("expired")
                return coordinationError(new SessionExpired({ session: ctx.id }))
              }
              return coordinationError(new ConnectionLoss({ detail }))
            }
          })
          if (res.succeeded) {
            const revision = Number(res.header.revision)
            return pending.map((f) => f(revision))
          }
        }
        return yield* Effect.fail(coordinationError(new ConnectionLoss({ detail: "too much contention" })))
      })

    const validated = (path: string): Effect.Effect<void, CoordinationError> =>
      Effect.try({
        try: () => validatePath(path),
        catch: (e) => coordinationError(e instanceof Fail ? e.reason : new InvalidPath({ path, detail: String(e) }))
      })

    const readNode = (path: string) =>
      Effect.map(
        call(() => client.kv.txn({ success: [range(keys.data(path)), range(keys.meta(path))] })),
        (res) => {
          const kv = res.responses[0]?.response_range.kvs[0]
          const meta = res.responses[1]?.response_range.kvs[0]
          return {
            revision: Number(res.header.revision),
            node: kv === undefined ? Option.none<Node>() : Option.some(toNode(kv, meta))
          }
        }
      )

    const readChildren = (path: string) =>
      Effect.flatMap(
        call(() => {
          const prefix = keys.children(path)
          return client.kv.txn({ success: [range(keys.data(path)), range(prefix, prefixEnd(prefix), true)] })
        }),
        (res) => {
          if (res.responses[0]?.response_range.kvs[0] === undefined) {
            return Effect.fail(coordinationError(new NoNode({ path })))
          }
          const prefix = keys.children(path).toString("utf8")
          const names = (res.responses[1]?.response_range.kvs ?? [])
            .map((kv) => kv.key.toString("utf8").slice(prefix.length))
            .sort()
          return Effect.succeed({ revision: Number(res.header.revision), names })
        }
      )

    const session = (sessionOptions?: SessionOptions): Effect.Effect<Session, CoordinationError, Scope.Scope> =>
      Effect.gen(function* () {
        const timeoutMs = Math.max(
          2000,
          sessionOptions?.timeout === undefined
            ? defaultTimeout
            : Duration.toMillis(Duration.fromInputUnsafe(sessionOptions.timeout))
        )
        const lease = client.lease(Math.ceil(timeoutMs / 1000), { autoKeepAlive: true })
        const id = yield* call(() => lease.grant())
        const states = yield* PubSub.unbounded<SessionState>({ replay: 1 })
        let state: SessionState = "connected"
        PubSub.publishUnsafe(states, "connected")
        const watches = new Set<(error: CoordinationError) => void>()
        /** What an operation or watch of the session meets once it ended. */
        const endedError = (final: "expired" | "closed") =>
          coordinationError(
            final === "expired" ? new SessionExpired({ session: id }) : new SessionClosed({ session: id })
          )
        const end = (final: "expired" | "closed") => {
          if (isFinal(state)) return
          state = final
          PubSub.publishUnsafe(states, final)
          const error = endedError(final)
          for (const w of [...watches]) w(error)
          watches.clear()
          sessions.delete(id)
        }
        lease.on("lost", () => end("expired"))
        /** Moves between connected and suspended (a final state stays). */
        const setLive = (next: "connected" | "suspended") => {
          if (isFinal(state) || state === next) return
          state = next
          PubSub.publishUnsafe(states, next)
        }
        /** One keep-alive within `ms`: the lease's remaining TTL, 0 when gone, `undefined` without an answer. */
        const keepalive = (ms: number) =>
          Effect.tryPromise({
            try: () => lease.keepaliveOnce(),
            catch: (e) => (e instanceof Error ? e.message : String(e))
          }).pipe(
            Effect.map((res) => Number(res.TTL)),
            Effect.catch((detail) => (/lease not found/i.test(detail) ? Effect.succeed(0) : Effect.succeed(undefined))),
            Effect.timeoutOption(Duration.millis(ms)),
            Effect.map(Option.getOrUndefined)
          )
        // The connection watch: a keep-alive every sixth of the lease; one unanswered for a third of it suspends the
        // session (operations then fail at once with a lost connection), the next answered one restores it, and an
        // answer that the lease is gone expires it. A silent connection is so noticed within half the lease.
        yield* Effect.forkScoped(
          Effect.gen(function* () {
            while (!isFinal(state)) {
              yield* Effect.sleep(Duration.millis(Math.max(1, Math.floor(timeoutMs / 6))))
              if (isFinal(state)) return
              const ttl = yield* keepalive(Math.max(1, Math.floor(timeoutMs / 3)))
              if (ttl === undefined) setLive("suspended")
              else if (ttl > 0) setLive("connected")
              else end("expired")
            }
          })
        )
        sessions.set(id, { lease: id, end, state: () => state })
        yield* Effect.addFinalizer(() =>
          Effect.gen(function* () {
            const wasConnected = state === "connected"
            end("closed")
            if (wasConnected) yield* Effect.promise(() => lease.revoke().catch(() => undefined))
            else yield* Effect.sync(() => lease.release())
          })
        )
        const ctx: SessionCtx = { id, lease: id }

        const guard = <A>(self: Effect.Effect<A, CoordinationError>): Effect.Effect<A, CoordinationError> =>
          Effect.suspend(() =>
            state === "expired" || state === "closed"
              ? Effect.fail(endedError(state))
              : state === "suspended"
                ? Effect.fail(coordinationError(new ConnectionLoss({ detail: `session ${id} is disconnected` })))
                : self
          )

        const watchOn = (
          specs: ReadonlyArray<{
            readonly key: Buffer
            readonly prefix: boolean
            readonly map: (type: "put" | "delete", kv: IKeyValue) => WatchEvent | undefined
          }>,
          revision: number
        ): Effect.Effect<Effect.Effect<WatchEvent, CoordinationError>, CoordinationError> =>
          Effect.gen(function* () {
            const deferred = Deferred.makeUnsafe<WatchEvent, CoordinationError>()
            const watchers: Array<Watcher> = []
            let done = false
            const finish = (exit: Exit.Exit<WatchEvent, CoordinationError>) => {
              if (done) return
              done = true
              watches.delete(onEnd)
              Deferred.doneUnsafe(deferred, exit)
              for (const w of watchers) w.cancel().catch(() => undefined)
            }
            const onEnd = (error: CoordinationError) => finish(Exit.fail(error))
            // The session may have ended while the watch's read was under way: its end has passed, so say it now.
            if (state === "expired" || state === "closed") {
              onEnd(endedError(state))
              return Deferred.await(deferred)
            }
            watches.add(onEnd)
            for (const spec of specs) {
              const builder = client.watch().startRevision(String(revision + 1))
              const watcher = yield* call(() =>
                (spec.prefix ? builder.prefix(spec.key) : builder.key(spec.key)).create()
              ).pipe(
                Effect.tapError(() =>
                  Effect.sync(() => onEnd(coordinationError(new ConnectionLoss({ detail: "watch failed" }))))
                )
              )
              watchers.push(watcher)
              if (done) watcher.cancel().catch(() => undefined)
              const handle = (type: "put" | "delete") => (kv: IKeyValue) => {
                if (isFinal(state)) return
                const event = spec.map(type, kv)
                if (event !== undefined) finish(Exit.succeed(event))
              }
              watcher.on("put", handle("put"))
              watcher.on("delete", handle("delete"))
              // etcd cancels a watch it cannot serve (its start revision compacted away while the watcher
              // reconnected, say), and the watcher reconnects on its own after a lost stream: either way an event
              // may be missed, so the one-shot watch fails with a lost connection and its reader reads again.
              // (Without an `error` listener the client's emitter would throw from its stream instead.)
              const lostWatch = (what: string) => (error: unknown) =>
                onEnd(
                  coordinationError(
                    new ConnectionLoss({
                      detail: `watch ${what}: ${error instanceof Error ? error.message : String(error)}`
                    })
                  )
                )
              watcher.on("error", lostWatch("cancelled by etcd"))
              watcher.on("disconnected", lostWatch("disconnected"))
            }
            return Deferred.await(deferred)
          })

        const self: Session = {
          id,
          timeout: Duration.millis(Math.ceil(timeoutMs / 1000) * 1000),
          state: Effect.sync(() => state),
          changes: Stream.fromPubSub(states).pipe(Stream.takeUntil(isFinal)),
          // A keep-alive of the lease: the server renews it from when it receives the request, or says it is gone.
          ping: guard(
            Effect.flatMap(
              Effect.tryPromise({
                try: () => lease.keepaliveOnce(),
                catch: (e) => (e instanceof Error ? e.message : String(e))
              }).pipe(
                Effect.map((res) => Number(res.TTL) > 0),
                Effect.catch((detail) =>
                  /lease not found/i.test(detail)
                    ? Effect.succeed(false)
                    : Effect.fail(coordinationError(new ConnectionLoss({ detail })))
                )
              ),
              (alive) => {
                if (alive) return Effect.void
                end("expired")
                return Effect.fail(coordinationError(new SessionExpired({ session: id })))
              }
            )
          ),
          create: (path, data, createOptions) =>
            guard(
              Effect.map(
                runTxn(
                  [{ _tag: "create", path, data, mode: createOptions?.mode ?? "persistent" }],
                  ctx,
                  createOptions?.createParents === true,
                  false
                ),
                (results) => {
                  const r = results[0]
                  return r?._tag === "create" ? r.path : path
                }
              )
            ),
          get: (path) =>
            guard(
              Effect.flatMap(Effect.andThen(validated(path), readNode(path)), ({ node }) =>
                Option.isSome(node) ? Effect.succeed(node.value) : Effect.fail(coordinationError(new NoNode({ path })))
              )
            ),
          exists: (path) =>
            guard(
              Effect.map(Effect.andThen(validated(path), readNode(path)), ({ node }) =>
                Option.map(node, (n): Stat => n.stat)
              )
            ),
          set: (path, data, version) =>
            guard(
              Effect.map(
                runTxn(
                  [version === undefined ? { _tag: "set", path, data } : { _tag: "set", path, data, version }],
                  ctx,
                  false,
                  false
                ),
                (results) => {
                  const r = results[0]
                  if (r?._tag !== "set") throw new Error("unexpected result")
                  return r.stat
                }
              )
            ),
          delete: (path, version) =>
            guard(
              Effect.asVoid(
                runTxn(
                  [version === undefined ? { _tag: "delete", path } : { _tag: "delete", path, version }],
                  ctx,
                  false,
                  false
                )
              )
            ),
          children: (path) =>
            guard(Effect.map(Effect.andThen(validated(path), readChildren(path)), ({ names }) => names)),
          multi: (ops) => guard(ops.length === 0 ? Effect.succeed([]) : runTxn(ops, ctx, false, true)),
          watchNode: (path) =>
            guard(
              Effect.gen(function* () {
                yield* validated(path)
                const { node, revision } = yield* readNode(path)
                const existed = Option.isSome(node)
                const changed = yield* watchOn(
                  [
                    {
                      key: keys.data(path),
                      prefix: false,
                      map: (type) => ({
                        _tag: type === "delete" ? "NodeDeleted" : existed ? "NodeDataChanged" : "NodeCreated",
                        path
                      })
                    }
                  ],
                  revision
                )
                return { value: node, changed } satisfies Watch<Option.Option<Node>>
              })
            ),
          watchChildren: (path) =>
            guard(
              Effect.gen(function* () {
                yield* validated(path)
                const { names, revision } = yield* readChildren(path)
                const changed = yield* watchOn(
                  [
                    {
                      key: keys.data(path),
                      prefix: false,
                      map: (type) => (type === "delete" ? { _tag: "NodeDeleted", path } : undefined)
                    },
                    {
                      key: keys.children(path),
                      prefix: true,
                      map: (type, kv) =>
                        type === "delete" || kv.version === "1" ? { _tag: "NodeChildrenChanged", path } : undefined
                    }
                  ],
                  revision
                )
                return { value: names, changed } satisfies Watch<ReadonlyArray<string>>
              })
            )
        }
        return self
      })

    const faults: CoordinationFaultsShape = {
      expire: (s) =>
        Effect.gen(function* () {
          yield* call(() => faultClient.leaseClient.leaseRevoke({ ID: s.id })).pipe(Effect.ignore)
          sessions.get(s.id)?.end("expired")
        })
    }

    return { backend: "etcd", session, faults }
  })

/** A layer providing `EtcdCoordination`, `Coordination` and `CoordinationFaults` from one client. */
export const layer = (
  options: EtcdCoordinationOptions
): Layer.Layer<EtcdCoordination | Coordination | CoordinationFaults, CoordinationError> =>
  Layer.effectContext(
    Effect.map(make(options), (service) =>
      Context.make(EtcdCoordination, service).pipe(
        Context.add(Coordination, service),
        Context.add(CoordinationFaults, service.faults)
      )
    )
  )

/** Like `layer`, with the options read from configuration. */
export const layerConfig = (
  config: Config.Wrap<EtcdCoordinationOptions>
): Layer.Layer<EtcdCoordination | Coordination | CoordinationFaults, CoordinationError | Config.ConfigError> =>
  Layer.unwrap(Effect.map(Config.unwrap(config), layer))
