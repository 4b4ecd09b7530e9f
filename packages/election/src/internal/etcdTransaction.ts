/**
 * The etcd backend's writes: the ops are simulated on a consistent snapshot of
 * the keys they read (an `Overlay` over it), then applied as one etcd txn whose
 * compares pin every key read, retried when another write got there first.
 *
 * @internal
 */
import { Coordination, CoordinationPaths } from "@strata/core"
import { Effect } from "effect"
import type { ICompare, IKeyValue, IRequestOp } from "etcd3"
import {
  decodeData,
  decodeMeta,
  encodeData,
  Fail,
  fail,
  isEphemeral,
  isSequential,
  type Keys,
  type Meta,
  pad,
  pinned,
  prefixEnd,
  range,
  validatePath
} from "./etcdKeys.js"
import { call, type EtcdStore } from "./etcdStore.js"

const { join, nameOf, parentOf } = CoordinationPaths

/** A simulation needs a key its snapshot did not read (`n<path>`: a node, `c<path>`: its children): read again. */
class Need {
  constructor(readonly what: string) {}
}

/** The keys a simulation read, as of one revision. */
interface Snapshot {
  readonly data: Map<string, IKeyValue | undefined>
  readonly meta: Map<string, IKeyValue | undefined>
  readonly children: Map<string, ReadonlyArray<string>>
}

/** A node as the simulation sees it; `dirty` once the transaction writes it. */
interface NodeState {
  data: Uint8Array
  version: number
  owner: string | null
  lease: string | null
  createdOrder: number | undefined
  dirty: boolean
}

/** The snapshot with the simulated writes on top. */
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
    return n === null ? fail(new Coordination.NoNode({ path })) : n
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

/** The session a transaction runs for: its ephemeral nodes' owner and lease. */
export interface SessionCtx {
  readonly id: string
  readonly lease: string
}

/** An op's result, once the revision the transaction committed at is known. */
type Pending = (revision: number) => Coordination.OpResult

const createNode = (
  tx: Overlay,
  ctx: SessionCtx,
  path: string,
  data: Uint8Array,
  mode: Coordination.CreateMode
): void => {
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

/** Creates `path` and its missing ancestors, persistent and empty; an ephemeral ancestor cannot have children. */
const createAncestors = (tx: Overlay, ctx: SessionCtx, path: string): void => {
  const existing = tx.get(path)
  if (existing !== null) {
    if (existing.owner !== null) fail(new Coordination.NoChildrenForEphemerals({ path }))
    return
  }
  const parent = parentOf(path)
  createAncestors(tx, ctx, parent)
  createNode(tx, ctx, path, new Uint8Array(0), "persistent")
}

const check = (tx: Overlay, op: Extract<Coordination.Op, { _tag: "check" }>): Pending => {
  validatePath(op.path)
  const n = tx.require(op.path)
  if (n.version !== op.version) fail(new Coordination.BadVersion({ path: op.path, expected: op.version }))
  return () => ({ _tag: "check" })
}

const create = (tx: Overlay, ctx: SessionCtx, op: Extract<Coordination.Op, { _tag: "create" }>): Pending => {
  const mode = op.mode ?? "persistent"
  const sequential = isSequential(mode)
  validatePath(op.path, sequential)
  if (!sequential && op.path === "/") fail(new Coordination.NodeExists({ path: op.path }))
  const parent = parentOf(op.path)
  const p = tx.get(parent)
  if (p === null) {
    if ((op as { createParents?: boolean }).createParents === true) createAncestors(tx, ctx, parent)
    else fail(new Coordination.NoNode({ path: op.path }))
  } else if (p.owner !== null) fail(new Coordination.NoChildrenForEphemerals({ path: parent }))
  const meta = tx.meta(parent)
  const actual = sequential ? join(parent, nameOf(op.path) + pad(meta.seq, 10)) : op.path
  if (sequential) {
    meta.seq++
    meta.dirty = true
  }
  if (tx.get(actual) !== null) fail(new Coordination.NodeExists({ path: actual }))
  createNode(tx, ctx, actual, op.data, mode)
  return () => ({ _tag: "create", path: actual })
}

const set = (tx: Overlay, op: Extract<Coordination.Op, { _tag: "set" }>): Pending => {
  validatePath(op.path)
  const n = tx.require(op.path)
  if (op.version !== undefined && n.version !== op.version) {
    fail(new Coordination.BadVersion({ path: op.path, expected: op.version }))
  }
  n.data = new Uint8Array(op.data)
  n.version++
  n.dirty = true
  tx.touched.add(op.path)
  const version = n.version
  const owner = n.owner
  const created = n.createdOrder
  const cv = tx.meta(op.path).cv
  return (revision) => ({
    _tag: "set",
    stat: {
      version,
      childrenVersion: cv,
      ephemeralOwner: owner,
      createdOrder: created ?? revision,
      modifiedOrder: revision
    }
  })
}

const remove = (tx: Overlay, op: Extract<Coordination.Op, { _tag: "delete" }>): Pending => {
  validatePath(op.path)
  const n = tx.require(op.path)
  if (op.version !== undefined && n.version !== op.version) {
    fail(new Coordination.BadVersion({ path: op.path, expected: op.version }))
  }
  if (op.path === "/") fail(new Coordination.NotEmpty({ path: op.path }))
  if (tx.kids(op.path).size > 0) fail(new Coordination.NotEmpty({ path: op.path }))
  tx.put(op.path, null)
  tx.metas.set(op.path, { cv: 0, seq: 0, dirty: false })
  tx.addChild(parentOf(op.path), nameOf(op.path), -1)
  return () => ({ _tag: "delete" })
}

/**
 * Applies `ops` to the overlay in order; a failing op throws `Fail` carrying its index (`opIndex`), a key the
 * snapshot lacks throws `Need`.
 */
const simulate = (tx: Overlay, ops: ReadonlyArray<Coordination.Op>, ctx: SessionCtx): Array<Pending> => {
  const results: Array<Pending> = []
  ops.forEach((op, index) => {
    try {
      switch (op._tag) {
        case "check":
          results.push(check(tx, op))
          break
        case "create":
          results.push(create(tx, ctx, op))
          break
        case "set":
          results.push(set(tx, op))
          break
        case "delete":
          results.push(remove(tx, op))
          break
      }
    } catch (e) {
      if (e instanceof Fail) throw Object.assign(e, { opIndex: index })
      throw e
    }
  })
  return results
}

/** The txn that applies the overlay's writes if every key it read is unchanged. */
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

/** Reads the data and meta keys of `nodes` and the child names of `children`, all at one revision. */
const readSnapshot = (store: EtcdStore, nodes: ReadonlySet<string>, children: ReadonlySet<string>) =>
  Effect.map(
    call(() => {
      const ops: Array<IRequestOp> = []
      for (const p of nodes) ops.push(range(store.keys.data(p)), range(store.keys.meta(p)))
      for (const p of children) {
        const prefix = store.keys.children(p)
        ops.push(range(prefix, prefixEnd(prefix), true))
      }
      return store.client.kv.txn({ success: ops })
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
        const prefix = store.keys.children(p).toString("utf8")
        snap.children.set(
          p,
          next().map((kv) => kv.key.toString("utf8").slice(prefix.length))
        )
      }
      return snap
    }
  )

/**
 * Runs `ops` as one transaction for the session `ctx`: simulated on a snapshot that grows until it holds every key
 * the ops read, then applied with those keys pinned; a txn whose compares fail starts over. A failing op fails
 * with its reason (and, for a `multi`, its index); a lease etcd no longer has expires the session.
 */
export const runTxn = (
  store: EtcdStore,
  ops: ReadonlyArray<Coordination.Op>,
  ctx: SessionCtx,
  createParents: boolean,
  multi: boolean
): Effect.Effect<ReadonlyArray<Coordination.OpResult>, Coordination.CoordinationError> =>
  Effect.gen(function* () {
    const ops2: ReadonlyArray<Coordination.Op> = createParents
      ? ops.map(
          (op): Coordination.Op => (op._tag === "create" ? ({ ...op, createParents: true } as Coordination.Op) : op)
        )
      : ops
    for (let attempt = 0; attempt < 100; attempt++) {
      const nodes = new Set<string>()
      const children = new Set<string>()
      let pending: Array<Pending> | undefined
      let tx: Overlay | undefined
      for (let round = 0; round < 100; round++) {
        const snap = yield* readSnapshot(store, nodes, children)
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
            return yield* Effect.fail(Coordination.coordinationError(e.reason, multi ? index : undefined))
          }
          throw e
        }
      }
      if (pending === undefined || tx === undefined) break
      const { compare, success } = buildTxn(tx, store.keys)
      if (success.length === 0 && compare.length === 0) return pending.map((f) => f(0))
      const res = yield* Effect.tryPromise({
        try: () => store.client.kv.txn({ compare, success }),
        catch: (e) => {
          const detail = e instanceof Error ? e.message : String(e)
          if (/lease not found/i.test(detail)) {
            store.sessions.get(ctx.id)?.end("expired")
            return Coordination.coordinationError(new Coordination.SessionExpired({ session: ctx.id }))
          }
          return Coordination.coordinationError(new Coordination.ConnectionLoss({ detail }))
        }
      })
      if (res.succeeded) {
        const revision = Number(res.header.revision)
        return pending.map((f) => f(revision))
      }
    }
    return yield* Effect.fail(
      Coordination.coordinationError(new Coordination.ConnectionLoss({ detail: "too much contention" }))
    )
  })
