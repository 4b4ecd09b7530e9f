/**
 * In-memory `Coordination`: a ZooKeeper-like tree of nodes in one process.
 *
 * Every operation runs synchronously against the tree, so each one (and each
 * `multi`) is atomic and a read registers its watch in the same step. Session
 * liveness runs on Effect's Clock: a connected session is always heard from; a
 * disconnected one is expired by the "server" once its timeout has passed.
 */
import * as Coordination from "../Coordination.js"
import type { Duration as DurationNs, Scope } from "effect"
import { Context, Deferred, Duration, Effect, Exit, Fiber, Layer, Option, PubSub, Stream } from "effect"
import type { NodeRec } from "./memoryCoordinationTree.js"
import {
  applyOp,
  Fail,
  fail,
  makeTree,
  nodeOf,
  sortedChildren,
  statOf,
  Tx,
  validatePath
} from "./memoryCoordinationTree.js"

/** Options of the in-memory coordination service. */
export interface MemoryCoordinationOptions {
  /** Session timeout used when a session asks for none (default 10 seconds). */
  readonly defaultSessionTimeout?: DurationNs.Input
}

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

/** A registered one-shot watch. */
interface WatchRec {
  readonly session: SessionRec
  readonly kind: "node" | "children"
  readonly path: string
  readonly deferred: Deferred.Deferred<Coordination.WatchEvent, Coordination.CoordinationError>
}

/** One session as the service tracks it. */
interface SessionRec {
  readonly id: string
  readonly timeout: DurationNs.Duration
  state: Coordination.SessionState
  readonly states: PubSub.PubSub<Coordination.SessionState>
  /** Registered watches that have not fired yet. */
  readonly watches: Set<WatchRec>
  /** Watches that fired while the session was suspended, delivered on reconnect. */
  readonly undelivered: Array<readonly [WatchRec, Coordination.WatchEvent]>
  /** Bumped on every disconnect, so a stale expiry timer does nothing. */
  disconnects: number
  expiryTimer: Fiber.Fiber<void> | undefined
}

/** Everything one in-memory coordination service holds. */
interface State {
  /** The layer's scope: expiry timers of disconnected sessions run in it. */
  readonly layerScope: Scope.Scope
  readonly defaultTimeout: DurationNs.Duration
  readonly tree: Map<string, NodeRec>
  /** The order number of the last committed write. */
  order: number
  sessionCounter: number
  readonly nodeWatches: Map<string, Set<WatchRec>>
  readonly childWatches: Map<string, Set<WatchRec>>
  readonly records: WeakMap<Coordination.Session, SessionRec>
  /** Side effects that resume other fibers, run by `flush` once the tree is consistent. */
  outbox: Array<() => void>
}

/** Whether a session can no longer change state. */
const isFinal = (state: Coordination.SessionState): boolean => state === "expired" || state === "closed"

/** The error a session's operations and watches fail with once it ended. */
const endReason = (session: SessionRec): Coordination.ErrorReason =>
  session.state === "closed"
    ? new Coordination.SessionClosed({ session: session.id })
    : new Coordination.SessionExpired({ session: session.id })

/** Runs the queued side effects, including those they queue. */
const flush = (s: State): void => {
  while (s.outbox.length > 0) {
    const batch = s.outbox
    s.outbox = []
    for (const k of batch) k()
  }
}

/** Runs a synchronous step, mapping `Fail` to a `CoordinationError`. */
const step = <A>(
  s: State,
  f: () => A,
  opIndex?: (failure: Fail) => number | undefined
): Effect.Effect<A, Coordination.CoordinationError> =>
  Effect.suspend(() => {
    try {
      const a = f()
      flush(s)
      return Effect.succeed(a)
    } catch (e) {
      flush(s)
      if (e instanceof Fail) return Effect.fail(Coordination.coordinationError(e.reason, opIndex?.(e)))
      throw e
    }
  })

/** Sets a session's state; subscribers hear of it at the next flush. */
const publishState = (s: State, session: SessionRec, state: Coordination.SessionState): void => {
  session.state = state
  s.outbox.push(() => {
    PubSub.publishUnsafe(session.states, state)
  })
}

// ---------------------------------------------------------------------------
// Watches and commits
// ---------------------------------------------------------------------------

/** The watch table of a kind of watch. */
const tableOf = (s: State, kind: WatchRec["kind"]) => (kind === "node" ? s.nodeWatches : s.childWatches)

/** Removes a watch from its table and its session. */
const unregister = (s: State, watch: WatchRec): void => {
  const table = tableOf(s, watch.kind)
  const set = table.get(watch.path)
  if (set !== undefined) {
    set.delete(watch)
    if (set.size === 0) table.delete(watch.path)
  }
  watch.session.watches.delete(watch)
}

/** Completes a fired watch at the next flush, or keeps it for reconnect while its session is suspended. */
const deliver = (s: State, watch: WatchRec, event: Coordination.WatchEvent): void => {
  if (watch.session.state === "suspended") watch.session.undelivered.push([watch, event])
  else s.outbox.push(() => Deferred.doneUnsafe(watch.deferred, Exit.succeed(event)))
}

/** Fires (and unregisters) the watches of `table` on the event's path. */
const trigger = (s: State, table: Map<string, Set<WatchRec>>, event: Coordination.WatchEvent): void => {
  const set = table.get(event.path)
  if (set === undefined) return
  for (const watch of Array.from(set)) {
    unregister(s, watch)
    deliver(s, watch, event)
  }
}

/** Applies a staged transaction and fires the watches it triggers, each at most once. */
const commit = (s: State, tx: Tx): void => {
  if (tx.writes.size === 0) return
  s.order = tx.order
  for (const [path, rec] of tx.writes) {
    if (rec === undefined) s.tree.delete(path)
    else s.tree.set(path, rec)
  }
  for (const event of tx.events) {
    if (event._tag === "NodeChildrenChanged") trigger(s, s.childWatches, event)
    else {
      trigger(s, s.nodeWatches, event)
      if (event._tag === "NodeDeleted") trigger(s, s.childWatches, event)
    }
  }
}

/** Runs `f` on a new transaction and commits it (a `Fail` thrown by `f` commits nothing). */
const transact = <A>(s: State, f: (tx: Tx) => A): A => {
  const tx = new Tx(s.tree, s.order + 1)
  const a = f(tx)
  commit(s, tx)
  return a
}

/** Registers a one-shot watch of `path` for the session; `value` is what the read saw. */
const makeWatch = <A>(
  s: State,
  session: SessionRec,
  kind: WatchRec["kind"],
  path: string,
  value: A
): Coordination.Watch<A> => {
  const deferred = Deferred.makeUnsafe<Coordination.WatchEvent, Coordination.CoordinationError>()
  const watch: WatchRec = { session, kind, path, deferred }
  const table = tableOf(s, kind)
  let set = table.get(path)
  if (set === undefined) {
    set = new Set()
    table.set(path, set)
  }
  set.add(watch)
  session.watches.add(watch)
  return { value, changed: Deferred.await(deferred) }
}

// ---------------------------------------------------------------------------
// Session lifecycle
// ---------------------------------------------------------------------------

/** Throws unless the session is connected. */
const ensureLive = (session: SessionRec) => {
  switch (session.state) {
    case "connected":
      return
    case "suspended":
      return fail(new Coordination.ConnectionLoss({ detail: `session ${session.id} is disconnected` }))
    case "expired":
      return fail(new Coordination.SessionExpired({ session: session.id }))
    case "closed":
      return fail(new Coordination.SessionClosed({ session: session.id }))
  }
}

/** Ends a session (expiry or close): fails its watches, deletes its ephemeral nodes; returns its expiry timer. */
const end = (s: State, session: SessionRec, state: "expired" | "closed"): Fiber.Fiber<void> | undefined => {
  if (isFinal(session.state)) return undefined
  const timer = session.expiryTimer
  session.expiryTimer = undefined
  publishState(s, session, state)
  const failure = Exit.fail(Coordination.coordinationError(endReason(session)))
  for (const watch of Array.from(session.watches)) {
    unregister(s, watch)
    s.outbox.push(() => Deferred.doneUnsafe(watch.deferred, failure))
  }
  for (const [watch] of session.undelivered.splice(0)) {
    s.outbox.push(() => Deferred.doneUnsafe(watch.deferred, failure))
  }
  const owned: Array<string> = []
  for (const [path, rec] of s.tree) if (rec.ephemeralOwner === session.id) owned.push(path)
  owned.sort()
  transact(s, (tx) => {
    for (const path of owned) tx.delete(path, undefined)
  })
  return timer
}

/** Stops an expiry timer, if there is one. */
const interruptTimer = (timer: Fiber.Fiber<void> | undefined) =>
  timer === undefined ? Effect.void : Fiber.interrupt(timer)

/** Ends a session, then stops its expiry timer. */
const endEffect = (s: State, session: SessionRec, state: "expired" | "closed") =>
  Effect.suspend(() => {
    const timer = end(s, session, state)
    flush(s)
    return interruptTimer(timer)
  })

/** `CoordinationFaults.disconnect`: suspends a connected session and lets the "server" expire it after its timeout. */
const disconnect = (s: State, rec: SessionRec): Effect.Effect<void> =>
  Effect.suspend(() => {
    if (rec.state !== "connected") return Effect.void
    publishState(s, rec, "suspended")
    flush(s)
    const generation = ++rec.disconnects
    const expireLater = Effect.sleep(rec.timeout).pipe(
      Effect.andThen(
        Effect.sync(() => {
          if (rec.state !== "suspended" || rec.disconnects !== generation) return
          rec.expiryTimer = undefined
          end(s, rec, "expired")
          flush(s)
        })
      )
    )
    return Effect.forkIn(expireLater, s.layerScope).pipe(
      Effect.tap((fiber) =>
        Effect.sync(() => {
          if (rec.state === "suspended" && rec.disconnects === generation) rec.expiryTimer = fiber
        })
      ),
      Effect.asVoid
    )
  })

/** `CoordinationFaults.reconnect`: a suspended session is connected again and gets the watches that fired meanwhile. */
const reconnect = (s: State, rec: SessionRec): Effect.Effect<void> =>
  Effect.suspend(() => {
    if (rec.state !== "suspended") return Effect.void
    const timer = rec.expiryTimer
    rec.expiryTimer = undefined
    rec.disconnects++
    publishState(s, rec, "connected")
    for (const [watch, event] of rec.undelivered.splice(0)) deliver(s, watch, event)
    flush(s)
    return interruptTimer(timer)
  })

// ---------------------------------------------------------------------------
// Session operations
// ---------------------------------------------------------------------------

/** A step of a connected session. */
const op = <A>(s: State, rec: SessionRec, f: () => A): Effect.Effect<A, Coordination.CoordinationError> =>
  step(s, () => {
    ensureLive(rec)
    return f()
  })

/** A node as the tree holds it now, after checking its path. */
const read = (s: State, path: string): NodeRec | undefined => {
  validatePath(path)
  return s.tree.get(path)
}

/** `Session.multi`: every operation applies, or none; a failure reports the index of the operation that failed. */
const multi = (
  s: State,
  rec: SessionRec,
  ops: ReadonlyArray<Coordination.Op>
): Effect.Effect<ReadonlyArray<Coordination.OpResult>, Coordination.CoordinationError> => {
  let index: number | undefined
  return step(
    s,
    () => {
      index = undefined
      ensureLive(rec)
      return transact(s, (tx) =>
        ops.map((o, i): Coordination.OpResult => {
          index = i
          return applyOp(tx, o, rec.id)
        })
      )
    },
    () => index
  )
}

/** The `Session` of a session record. */
const makeSession = (s: State, rec: SessionRec): Coordination.Session => ({
  id: rec.id,
  timeout: rec.timeout,
  state: Effect.sync(() => rec.state),
  changes: Stream.fromPubSub(rec.states).pipe(Stream.takeUntil(isFinal)),
  ping: op(s, rec, () => undefined),
  create: (path: string, data: Uint8Array, options?: Coordination.CreateOptions) =>
    op(s, rec, () =>
      transact(s, (tx) => tx.create(path, data, options?.mode ?? "persistent", rec.id, options?.createParents ?? false))
    ),
  get: (path: string) =>
    op(s, rec, () => {
      const node = read(s, path)
      return node === undefined ? fail(new Coordination.NoNode({ path })) : nodeOf(node)
    }),
  exists: (path: string) =>
    op(s, rec, () => {
      const node = read(s, path)
      return node === undefined ? Option.none<Coordination.Stat>() : Option.some(statOf(node))
    }),
  set: (path: string, data: Uint8Array, version?: number) =>
    op(s, rec, () => transact(s, (tx) => tx.set(path, data, version))),
  delete: (path: string, version?: number) => op(s, rec, () => transact(s, (tx) => tx.delete(path, version))),
  children: (path: string) =>
    op(s, rec, () => {
      const node = read(s, path)
      return node === undefined ? fail(new Coordination.NoNode({ path })) : sortedChildren(node)
    }),
  multi: (ops: ReadonlyArray<Coordination.Op>) => multi(s, rec, ops),
  watchNode: (path: string) =>
    op(s, rec, () => {
      const node = read(s, path)
      return makeWatch(
        s,
        rec,
        "node",
        path,
        node === undefined ? Option.none<Coordination.Node>() : Option.some(nodeOf(node))
      )
    }),
  watchChildren: (path: string) =>
    op(s, rec, () => {
      const node = read(s, path)
      if (node === undefined) return fail(new Coordination.NoNode({ path }))
      return makeWatch(s, rec, "children", path, sortedChildren(node))
    })
})

/** `Coordination.session`: a new connected session, closed with its scope. */
const session = (
  s: State,
  sessionOptions?: Coordination.SessionOptions
): Effect.Effect<Coordination.Session, Coordination.CoordinationError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.gen(function* () {
      const states = yield* PubSub.unbounded<Coordination.SessionState>({ replay: 1 })
      s.sessionCounter++
      const rec: SessionRec = {
        id: `0x${s.sessionCounter.toString(16).padStart(16, "0")}`,
        timeout:
          sessionOptions?.timeout === undefined ? s.defaultTimeout : Duration.fromInputUnsafe(sessionOptions.timeout),
        state: "connected",
        states,
        watches: new Set(),
        undelivered: [],
        disconnects: 0,
        expiryTimer: undefined
      }
      PubSub.publishUnsafe(states, "connected")
      const made = makeSession(s, rec)
      s.records.set(made, rec)
      return made
    }),
    (made) => {
      const rec = s.records.get(made)
      return rec === undefined ? Effect.void : endEffect(s, rec, "closed")
    }
  )

/** The record of a session this service made (a defect for any other session). */
const lookup = (s: State, session: Coordination.Session): Effect.Effect<SessionRec> =>
  Effect.suspend(() => {
    const rec = s.records.get(session)
    return rec === undefined
      ? Effect.die(new Error(`session ${session.id} does not belong to this memory coordination service`))
      : Effect.succeed(rec)
  })

/** Builds the in-memory coordination layer. */
export const layer = (
  options?: MemoryCoordinationOptions
): Layer.Layer<Coordination.Coordination | Coordination.Faults> =>
  Layer.effectContext(
    Effect.gen(function* () {
      const s: State = {
        layerScope: yield* Effect.scope,
        defaultTimeout: Duration.fromInputUnsafe(options?.defaultSessionTimeout ?? "10 seconds"),
        tree: makeTree(),
        order: 0,
        sessionCounter: 0,
        nodeWatches: new Map(),
        childWatches: new Map(),
        records: new WeakMap(),
        outbox: []
      }
      const faults: Coordination.FaultsShape = {
        expire: (session) => Effect.flatMap(lookup(s, session), (rec) => endEffect(s, rec, "expired")),
        disconnect: (session) => Effect.flatMap(lookup(s, session), (rec) => disconnect(s, rec)),
        reconnect: (session) => Effect.flatMap(lookup(s, session), (rec) => reconnect(s, rec))
      }
      const coordination: Coordination.Shape = { backend: "memory", session: (o) => session(s, o) }
      return Context.make(Coordination.Coordination, coordination).pipe(Context.add(Coordination.Faults, faults))
    })
  )
