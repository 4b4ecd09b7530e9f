/**
 * The node tree of the in-memory coordination service and its write
 * transaction: staged creates, sets and deletes applied together with one
 * order number, with the watch events they cause. Everything here is
 * synchronous; a failed check throws `Fail`, which the service turns into a
 * `CoordinationError`.
 */
import * as Coordination from "../Coordination.js"
import { invalidPath, join, nameOf, parentOf } from "../CoordinationPaths.js"

/** One node as stored: immutable, replaced on every change. */
export interface NodeRec {
  readonly data: Uint8Array
  readonly version: number
  readonly childrenVersion: number
  readonly ephemeralOwner: string | null
  readonly createdOrder: number
  readonly modifiedOrder: number
  /** Names of the children. */
  readonly children: ReadonlySet<string>
}

/** A failure inside a synchronous step; turned into a `CoordinationError` at the edge. */
export class Fail {
  constructor(readonly reason: Coordination.ErrorReason) {}
}

/** Throws `Fail` (the step running it turns that into a `CoordinationError`). */
export const fail = (reason: Coordination.ErrorReason): never => {
  throw new Fail(reason)
}

const pad10 = (n: number): string => n.toString().padStart(10, "0")

const isSequential = (mode: Coordination.CreateMode): boolean =>
  mode === "persistent-sequential" || mode === "ephemeral-sequential"

const isEphemeral = (mode: Coordination.CreateMode): boolean => mode === "ephemeral" || mode === "ephemeral-sequential"

/** Throws `Fail` (as the other checks here do) when a path is invalid. */
export const validatePath = (path: string, sequential = false): void => {
  const reason = invalidPath(path, sequential)
  if (reason !== undefined) fail(reason)
}

/** The public `Stat` of a node. */
export const statOf = (rec: NodeRec): Coordination.Stat => ({
  version: rec.version,
  childrenVersion: rec.childrenVersion,
  ephemeralOwner: rec.ephemeralOwner,
  createdOrder: rec.createdOrder,
  modifiedOrder: rec.modifiedOrder
})

/** A node's data (a copy) and stat. */
export const nodeOf = (rec: NodeRec): Coordination.Node => ({ data: rec.data.slice(), stat: statOf(rec) })

/** A node's child names, sorted. */
export const sortedChildren = (rec: NodeRec): ReadonlyArray<string> => Array.from(rec.children).sort()

/**
 * One write transaction: changes are staged on top of the tree and applied by
 * `commit` only if every operation succeeded; all its writes share one order
 * number (like a zxid / etcd revision).
 */
export class Tx {
  readonly writes = new Map<string, NodeRec | undefined>()
  readonly events: Array<Coordination.WatchEvent> = []
  constructor(
    readonly tree: Map<string, NodeRec>,
    readonly order: number
  ) {}

  get(path: string): NodeRec | undefined {
    return this.writes.has(path) ? this.writes.get(path) : this.tree.get(path)
  }

  require(path: string, reported: string = path): NodeRec {
    const rec = this.get(path)
    return rec === undefined ? fail(new Coordination.NoNode({ path: reported })) : rec
  }

  checkVersion(path: string, rec: NodeRec, version: number | undefined): void {
    if (version !== undefined && rec.version !== version) fail(new Coordination.BadVersion({ path, expected: version }))
  }

  check(path: string, version: number): void {
    validatePath(path)
    this.checkVersion(path, this.require(path), version)
  }

  create(path: string, data: Uint8Array, mode: Coordination.CreateMode, owner: string, createParents: boolean): string {
    const sequential = isSequential(mode)
    validatePath(path, sequential)
    if (!sequential && path === "/") return fail(new Coordination.NodeExists({ path }))
    const parentPath = parentOf(path)
    let parent = this.get(parentPath)
    if (parent === undefined) {
      if (!createParents) return fail(new Coordination.NoNode({ path }))
      parent = this.createAncestors(parentPath)
    }
    const name = sequential ? nameOf(path) + pad10(parent.childrenVersion) : nameOf(path)
    const actual = join(parentPath, name)
    if (this.get(actual) !== undefined) return fail(new Coordination.NodeExists({ path: actual }))
    if (parent.ephemeralOwner !== null) return fail(new Coordination.NoChildrenForEphemerals({ path: parentPath }))
    this.addChild(parentPath, parent, name, {
      data: data.slice(),
      version: 0,
      childrenVersion: 0,
      ephemeralOwner: isEphemeral(mode) ? owner : null,
      createdOrder: this.order,
      modifiedOrder: this.order,
      children: new Set()
    })
    return actual
  }

  /** Creates the missing ancestors of a node (and `path` itself) as persistent nodes with empty data. */
  private createAncestors(path: string): NodeRec {
    const existing = this.get(path)
    if (existing !== undefined) return existing
    const parentPath = parentOf(path)
    const parent = this.createAncestors(parentPath)
    if (parent.ephemeralOwner !== null) return fail(new Coordination.NoChildrenForEphemerals({ path: parentPath }))
    const rec: NodeRec = {
      data: new Uint8Array(0),
      version: 0,
      childrenVersion: 0,
      ephemeralOwner: null,
      createdOrder: this.order,
      modifiedOrder: this.order,
      children: new Set()
    }
    this.addChild(parentPath, parent, nameOf(path), rec)
    return rec
  }

  private addChild(parentPath: string, parent: NodeRec, name: string, rec: NodeRec): void {
    const path = join(parentPath, name)
    const children = new Set(parent.children)
    children.add(name)
    this.writes.set(parentPath, { ...parent, childrenVersion: parent.childrenVersion + 1, children })
    this.writes.set(path, rec)
    this.events.push({ _tag: "NodeCreated", path }, { _tag: "NodeChildrenChanged", path: parentPath })
  }

  set(path: string, data: Uint8Array, version: number | undefined): Coordination.Stat {
    validatePath(path)
    const rec = this.require(path)
    this.checkVersion(path, rec, version)
    const next: NodeRec = { ...rec, data: data.slice(), version: rec.version + 1, modifiedOrder: this.order }
    this.writes.set(path, next)
    this.events.push({ _tag: "NodeDataChanged", path })
    return statOf(next)
  }

  delete(path: string, version: number | undefined): void {
    validatePath(path)
    if (path === "/") fail(new Coordination.InvalidPath({ path, detail: "the root cannot be deleted" }))
    const rec = this.require(path)
    this.checkVersion(path, rec, version)
    if (rec.children.size > 0) fail(new Coordination.NotEmpty({ path }))
    const parentPath = parentOf(path)
    const parent = this.require(parentPath)
    const children = new Set(parent.children)
    children.delete(nameOf(path))
    this.writes.set(parentPath, { ...parent, childrenVersion: parent.childrenVersion + 1, children })
    this.writes.set(path, undefined)
    this.events.push({ _tag: "NodeDeleted", path }, { _tag: "NodeChildrenChanged", path: parentPath })
  }
}

/** Applies one operation of a `multi` to a transaction. */
export const applyOp = (tx: Tx, o: Coordination.Op, owner: string): Coordination.OpResult => {
  if (o._tag === "check") {
    tx.check(o.path, o.version)
    return { _tag: "check" }
  }
  if (o._tag === "create")
    return { _tag: "create", path: tx.create(o.path, o.data, o.mode ?? "persistent", owner, false) }
  if (o._tag === "set") return { _tag: "set", stat: tx.set(o.path, o.data, o.version) }
  tx.delete(o.path, o.version)
  return { _tag: "delete" }
}

/** A tree holding only the empty root node. */
export const makeTree = (): Map<string, NodeRec> => {
  const tree = new Map<string, NodeRec>()
  tree.set("/", {
    data: new Uint8Array(0),
    version: 0,
    childrenVersion: 0,
    ephemeralOwner: null,
    createdOrder: 0,
    modifiedOrder: 0,
    children: new Set()
  })
  return tree
}
