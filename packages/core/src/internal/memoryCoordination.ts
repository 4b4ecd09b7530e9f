/**
 * In-memory `Coordination`: a ZooKeeper-like tree of nodes in one process.
 *
 * Every operation runs synchronously against the tree, so each one (and each
 * `multi`) is atomic and a read registers its watch in the same step. Session
 * liveness runs on Effect's Clock: a connected session is always heard from; a
 * disconnected one is expired by the "server" once its timeout has passed.
 */
import { invalidPath, join, nameOf, parentOf } from "../CoordinationPaths.js"
import type { Duration as DurationNs, Scope } from "effect"
import { Context, Deferred, Duration, Effect, Exit, Fiber, Layer, Option, PubSub, Stream } from "effect"
import type {
  CoordinationErrorReason,
  CoordinationFaultsShape,
  CoordinationShape,
  CreateMode,
  CreateOptions,
  Node,
  Op,
  OpResult,
  Session,
  SessionOptions,
  SessionState,
  Stat,
  Watch,
  WatchEvent
} from "../Coordination.js"
import {
  BadVersion,
  ConnectionLoss,
  Coordination,
  coordinationError,
  CoordinationFaults,
  InvalidPath,
  NoChildrenForEphemerals,
  NodeExists,
  NoNode,
  NotEmpty,
  SessionClosed,
  SessionExpired
} from "../Coordination.js"
import type { CoordinationError } from "../Coordination.js"

/** Options of the in-memory coordination service. */
export interface MemoryCoordinationOptions {
  /** Session timeout used when a session asks for none (default 10 seconds). */
  readonly defaultSessionTimeout?: DurationNs.Input
}

// ---------------------------------------------------------------------------
// The tree
// ---------------------------------------------------------------------------

interface NodeRec {
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
class Fail {
  constructor(readonly reason: CoordinationErrorReason) {}
}

const fail = (reason: CoordinationErrorReason): never => {
  throw new Fail(reason)
}

const pad10 = (n: number): string => n.toString().padStart(10, "0")

const isSequential = (mode: CreateMode): boolean => mode === "persistent-sequential" || mode === "ephemeral-sequential"

const isEphemeral = (mode: CreateMode): boolean => mode === "ephemeral" || mode === "ephemeral-sequential"

/** Throws (as the module's other checks do) when a path is invalid. */
const validatePath = (path: string, sequential = false): void => {
  const reason = invalidPath(path, sequential)
  if (reason !== undefined) fail(reason)
}

const statOf = (rec: NodeRec): Stat => ({
  version: rec.version,
  childrenVersion: rec.childrenVersion,
  ephemeralOwner: rec.ephemeralOwner,
  createdOrder: rec.createdOrder,
  modifiedOrder: rec.modifiedOrder
})

const nodeOf = (rec: NodeRec): Node => ({ data: rec.data.slice(), stat: statOf(rec) })

const sortedChildren = (rec: NodeRec): ReadonlyArray<string> => Array.from(rec.children).sort()

/**
 * One write transaction: changes are staged on top of the tree and applied by
 * `commit` only if every operation succeeded; all its writes share one order
 * number (like a zxid / etcd revision).
 */
class Tx {
  readonly writes = new Map<string, NodeRec | undefined>()
  readonly events: Array<WatchEvent> = []
  constructor(
    readonly tree: Map<string, NodeRec>,
    readonly order: number
  ) {}

  get(path: string): NodeRec | undefined {
    return this.writes.has(path) ? this.writes.get(path) : this.tree.get(path)
  }

  require(path: string, reported: string = path): NodeRec {
    const rec = this.get(path)
    return rec === undefined ? fail(new NoNode({ path: reported })) : rec
  }

  checkVersion(path: string, rec: NodeRec, version: number | undefined): void {
    if (version !== undefined && rec.version !== version) fail(new BadVersion({ path, expected: version }))
  }

  check(path: string, version: number): void {
    validatePath(path)
    this.checkVersion(path, this.require(path), version)
  }

  create(path: string, data: Uint8Array, mode: CreateMode, owner: string, createParents: boolean): string {
    const sequential = isSequential(mode)
    validatePath(path, sequential)
    if (!sequential && path === "/") return fail(new NodeExists({ path }))
    const parentPath = parentOf(path)
    let parent = this.get(parentPath)
    if (parent === undefined) {
      if (!createParents) return fail(new NoNode({ path }))
      parent = this.createAncestors(parentPath)
    }
    const name = sequential ? nameOf(path) + pad10(parent.childrenVersion) : nameOf(path)
    const actual = join(parentPath, name)
    if (this.get(actual) !== undefined) return fail(new NodeExists({ path: actual }))
    if (parent.ephemeralOwner !== null) return fail(new NoChildrenForEphemerals({ path: parentPath }))
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
    if (parent.ephemeralOwner !== null) return fail(new NoChildrenForEphemerals({ path: parentPath }))
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

  set(path: string, data: Uint8Array, version: number | undefined): Stat {
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
    if (path === "/") fail(new InvalidPath({ path, detail: "the root cannot be deleted" }))
    const rec = this.require(path)
    this.checkVersion(path, rec, version)
    if (rec.children.size > 0) fail(new NotEmpty({ path }))
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
const applyOp = (tx: Tx, o: Op, owner: string): OpResult => {
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

// ---------------------------------------------------------------------------
// Sessions and watches
// ---------------------------------------------------------------------------

interface WatchRec {
  readonly session: SessionRec
  readonly kind: "node" | "children"
  readonly path: string
  readonly deferred: Deferred.Deferred<WatchEvent, CoordinationError>
}

interface SessionRec {
  readonly id: string
  readonly timeout: DurationNs.Duration
  state: SessionState
  readonly states: PubSub.PubSub<SessionState>
  /** Registered watches that have not fired yet. */
  readonly watches: Set<WatchRec>
  /** Watches that fired while the session was suspended, delivered on reconnect. */
  readonly undelivered: Array<readonly [WatchRec, WatchEvent]>
  /** Bumped on every disconnect, so a stale expiry timer does nothing. */
  disconnects: number
  expiryTimer: Fiber.Fiber<void> | undefined
}

const isFinal = (state: SessionState): boolean => state === "expired" || state === "closed"

const endReason = (session: SessionRec): CoordinationErrorReason =>
  session.state === "closed" ? new SessionClosed({ session: session.id }) : new SessionExpired({ session: session.id })

/** Builds the in-memory coordination layer. */
export const layer = (options?: MemoryCoordinationOptions): Layer.Layer<Coordination | CoordinationFaults> =>
  Layer.effectContext(
    Effect.gen(function* () {
      const layerScope: Scope.Scope = yield* Effect.scope
      const defaultTimeout = Duration.fromInputUnsafe(options?.defaultSessionTimeout ?? "10 seconds")

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
      let order = 0
      let sessionCounter = 0
      const nodeWatches = new Map<string, Set<WatchRec>>()
      const childWatches = new Map<string, Set<WatchRec>>()
      const records = new WeakMap<Session, SessionRec>()

      // Side effects that resume other fibers run after the tree is consistent.
      let outbox: Array<() => void> = []
      const flush = () => {
        while (outbox.length > 0) {
          const batch = outbox
          outbox = []
          for (const k of batch) k()
        }
      }

      /** Runs a synchronous step, mapping `Fail` to a `CoordinationError`. */
      const step = <A>(
        f: () => A,
        opIndex?: (failure: Fail) => number | undefined
      ): Effect.Effect<A, CoordinationError> =>
        Effect.suspend(() => {
          try {
            const a = f()
            flush()
            return Effect.succeed(a)
          } catch (e) {
            flush()
            if (e instanceof Fail) return Effect.fail(coordinationError(e.reason, opIndex?.(e)))
            throw e
          }
        })

      const publishState = (session: SessionRec, state: SessionState) => {
        session.state = state
        outbox.push(() => {
          PubSub.publishUnsafe(session.states, state)
        })
      }

      const tableOf = (kind: WatchRec["kind"]) => (kind === "node" ? nodeWatches : childWatches)

      const unregister = (watch: WatchRec) => {
        const table = tableOf(watch.kind)
        const set = table.get(watch.path)
        if (set !== undefined) {
          set.delete(watch)
          if (set.size === 0) table.delete(watch.path)
        }
        watch.session.watches.delete(watch)
      }

      const deliver = (watch: WatchRec, event: WatchEvent) => {
        if (watch.session.state === "suspended") watch.session.undelivered.push([watch, event])
        else outbox.push(() => Deferred.doneUnsafe(watch.deferred, Exit.succeed(event)))
      }

      const trigger = (table: Map<string, Set<WatchRec>>, event: WatchEvent) => {
        const set = table.get(event.path)
        if (set === undefined) return
        for (const watch of Array.from(set)) {
          unregister(watch)
          deliver(watch, event)
        }
      }

      /** Applies a staged transaction and fires the watches it triggers, each at most once. */
      const commit = (tx: Tx) => {
        if (tx.writes.size === 0) return
        order = tx.order
        for (const [path, rec] of tx.writes) {
          if (rec === undefined) tree.delete(path)
          else tree.set(path, rec)
        }
        for (const event of tx.events) {
          if (event._tag === "NodeChildrenChanged") trigger(childWatches, event)
          else {
            trigger(nodeWatches, event)
            if (event._tag === "NodeDeleted") trigger(childWatches, event)
          }
        }
      }

      const transact = <A>(f: (tx: Tx) => A): A => {
        const tx = new Tx(tree, order + 1)
        const a = f(tx)
        commit(tx)
        return a
      }

      const ensureLive = (session: SessionRec) => {
        switch (session.state) {
          case "connected":
            return
          case "suspended":
            return fail(new ConnectionLoss({ detail: `session ${session.id} is disconnected` }))
          case "expired":
            return fail(new SessionExpired({ session: session.id }))
          case "closed":
            return fail(new SessionClosed({ session: session.id }))
        }
      }

      /** Ends a session (expiry or close): fails its watches, deletes its ephemeral nodes. */
      const end = (session: SessionRec, state: "expired" | "closed"): Fiber.Fiber<void> | undefined => {
        if (isFinal(session.state)) return undefined
        const timer = session.expiryTimer
        session.expiryTimer = undefined
        publishState(session, state)
        const failure = Exit.fail(coordinationError(endReason(session)))
        for (const watch of Array.from(session.watches)) {
          unregister(watch)
          outbox.push(() => Deferred.doneUnsafe(watch.deferred, failure))
        }
        for (const [watch] of session.undelivered.splice(0)) {
          outbox.push(() => Deferred.doneUnsafe(watch.deferred, failure))
        }
        const owned: Array<string> = []
        for (const [path, rec] of tree) if (rec.ephemeralOwner === session.id) owned.push(path)
        owned.sort()
        transact((tx) => {
          for (const path of owned) tx.delete(path, undefined)
        })
        return timer
      }

      const interruptTimer = (timer: Fiber.Fiber<void> | undefined) =>
        timer === undefined ? Effect.void : Fiber.interrupt(timer)

      const endEffect = (session: SessionRec, state: "expired" | "closed") =>
        Effect.suspend(() => {
          const timer = end(session, state)
          flush()
          return interruptTimer(timer)
        })

      const makeWatch = <A>(session: SessionRec, kind: WatchRec["kind"], path: string, value: A): Watch<A> => {
        const deferred = Deferred.makeUnsafe<WatchEvent, CoordinationError>()
        const watch: WatchRec = { session, kind, path, deferred }
        const table = tableOf(kind)
        let set = table.get(path)
        if (set === undefined) {
          set = new Set()
          table.set(path, set)
        }
        set.add(watch)
        session.watches.add(watch)
        return { value, changed: Deferred.await(deferred) }
      }

      const makeSession = (rec: SessionRec): Session => {
        const op = <A>(f: () => A) =>
          step(() => {
            ensureLive(rec)
            return f()
          })
        return {
          id: rec.id,
          timeout: rec.timeout,
          state: Effect.sync(() => rec.state),
          changes: Stream.fromPubSub(rec.states).pipe(Stream.takeUntil(isFinal)),
          ping: op(() => undefined),
          create: (path: string, data: Uint8Array, options?: CreateOptions) =>
            op(() =>
              transact((tx) =>
                tx.create(path, data, options?.mode ?? "persistent", rec.id, options?.createParents ?? false)
              )
            ),
          get: (path: string) =>
            op(() => {
              validatePath(path)
              const node = tree.get(path)
              return node === undefined ? fail(new NoNode({ path })) : nodeOf(node)
            }),
          exists: (path: string) =>
            op(() => {
              validatePath(path)
              const node = tree.get(path)
              return node === undefined ? Option.none<Stat>() : Option.some(statOf(node))
            }),
          set: (path: string, data: Uint8Array, version?: number) =>
            op(() => transact((tx) => tx.set(path, data, version))),
          delete: (path: string, version?: number) => op(() => transact((tx) => tx.delete(path, version))),
          children: (path: string) =>
            op(() => {
              validatePath(path)
              const node = tree.get(path)
              return node === undefined ? fail(new NoNode({ path })) : sortedChildren(node)
            }),
          multi: (ops: ReadonlyArray<Op>) => {
            let index: number | undefined
            return step(
              () => {
                index = undefined
                ensureLive(rec)
                return transact((tx) =>
                  ops.map((o, i): OpResult => {
                    index = i
                    return applyOp(tx, o, rec.id)
                  })
                )
              },
              () => index
            )
          },
          watchNode: (path: string) =>
            op(() => {
              validatePath(path)
              const node = tree.get(path)
              return makeWatch(rec, "node", path, node === undefined ? Option.none<Node>() : Option.some(nodeOf(node)))
            }),
          watchChildren: (path: string) =>
            op(() => {
              validatePath(path)
              const node = tree.get(path)
              if (node === undefined) return fail(new NoNode({ path }))
              return makeWatch(rec, "children", path, sortedChildren(node))
            })
        }
      }

      const session = (sessionOptions?: SessionOptions): Effect.Effect<Session, CoordinationError, Scope.Scope> =>
        Effect.acquireRelease(
          Effect.gen(function* () {
            const states = yield* PubSub.unbounded<SessionState>({ replay: 1 })
            sessionCounter++
            const rec: SessionRec = {
              id: `0x${sessionCounter.toString(16).padStart(16, "0")}`,
              timeout:
                sessionOptions?.timeout === undefined
                  ? defaultTimeout
                  : Duration.fromInputUnsafe(sessionOptions.timeout),
              state: "connected",
              states,
              watches: new Set(),
              undelivered: [],
              disconnects: 0,
              expiryTimer: undefined
            }
            PubSub.publishUnsafe(states, "connected")
            const s = makeSession(rec)
            records.set(s, rec)
            return s
          }),
          (s) => {
            const rec = records.get(s)
            return rec === undefined ? Effect.void : endEffect(rec, "closed")
          }
        )

      const lookup = (s: Session): Effect.Effect<SessionRec> =>
        Effect.suspend(() => {
          const rec = records.get(s)
          return rec === undefined
            ? Effect.die(new Error(`session ${s.id} does not belong to this memory coordination service`))
            : Effect.succeed(rec)
        })

      const faults: CoordinationFaultsShape = {
        expire: (s) => Effect.flatMap(lookup(s), (rec) => endEffect(rec, "expired")),
        disconnect: (s) =>
          Effect.flatMap(lookup(s), (rec) =>
            Effect.suspend(() => {
              if (rec.state !== "connected") return Effect.void
              publishState(rec, "suspended")
              flush()
              const generation = ++rec.disconnects
              const expireLater = Effect.sleep(rec.timeout).pipe(
                Effect.andThen(
                  Effect.sync(() => {
                    if (rec.state !== "suspended" || rec.disconnects !== generation) return
                    rec.expiryTimer = undefined
                    end(rec, "expired")
                    flush()
                  })
                )
              )
              return Effect.forkIn(expireLater, layerScope).pipe(
                Effect.tap((fiber) =>
                  Effect.sync(() => {
                    if (rec.state === "suspended" && rec.disconnects === generation) rec.expiryTimer = fiber
                  })
                ),
                Effect.asVoid
              )
            })
          ),
        reconnect: (s) =>
          Effect.flatMap(lookup(s), (rec) =>
            Effect.suspend(() => {
              if (rec.state !== "suspended") return Effect.void
              const timer = rec.expiryTimer
              rec.expiryTimer = undefined
              rec.disconnects++
              publishState(rec, "connected")
              for (const [watch, event] of rec.undelivered.splice(0)) deliver(watch, event)
              flush()
              return interruptTimer(timer)
            })
          )
      }

      const coordination: CoordinationShape = { backend: "memory", session }
      return Context.make(Coordination, coordination).pipe(Context.add(CoordinationFaults, faults))
    })
  )
