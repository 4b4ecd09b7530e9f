/**
 * An etcd session's node operations and one-shot watches, and the `Session`
 * they make up: reads are one txn at one revision, writes go through
 * `etcdTransaction`, a watch starts at the revision after its read.
 *
 * @internal
 */
import { Coordination } from "@strata/core"
import { Deferred, Duration, Effect, Exit, Option, Stream } from "effect"
import type { IKeyValue, Watcher } from "etcd3"
import { Fail, prefixEnd, range, toNode, validatePath } from "./etcdKeys.js"
import { type EtcdSession, endedError, guard, ping } from "./etcdSession.js"
import { call, type EtcdStore, isFinal } from "./etcdStore.js"
import { runTxn } from "./etcdTransaction.js"

/** Checks `path` against the path rules. */
const validated = (path: string): Effect.Effect<void, Coordination.CoordinationError> =>
  Effect.try({
    try: () => validatePath(path),
    catch: (e) =>
      Coordination.coordinationError(
        e instanceof Fail ? e.reason : new Coordination.InvalidPath({ path, detail: String(e) })
      )
  })

/** The node at `path` (if any) and the revision it was read at. */
const readNode = (store: EtcdStore, path: string) =>
  Effect.map(
    call(() => store.client.kv.txn({ success: [range(store.keys.data(path)), range(store.keys.meta(path))] })),
    (res) => {
      const kv = res.responses[0]?.response_range.kvs[0]
      const meta = res.responses[1]?.response_range.kvs[0]
      return {
        revision: Number(res.header.revision),
        node: kv === undefined ? Option.none<Coordination.Node>() : Option.some(toNode(kv, meta))
      }
    }
  )

/** The sorted child names of `path` and the revision they were read at; fails with `NoNode` without the node. */
const readChildren = (store: EtcdStore, path: string) =>
  Effect.flatMap(
    call(() => {
      const prefix = store.keys.children(path)
      return store.client.kv.txn({
        success: [range(store.keys.data(path)), range(prefix, prefixEnd(prefix), true)]
      })
    }),
    (res) => {
      if (res.responses[0]?.response_range.kvs[0] === undefined) {
        return Effect.fail(Coordination.coordinationError(new Coordination.NoNode({ path })))
      }
      const prefix = store.keys.children(path).toString("utf8")
      const names = (res.responses[1]?.response_range.kvs ?? [])
        .map((kv) => kv.key.toString("utf8").slice(prefix.length))
        .sort()
      return Effect.succeed({ revision: Number(res.header.revision), names })
    }
  )

/** One key (or prefix) a watch follows, and the event (if any) each of its changes means. */
interface WatchSpec {
  readonly key: Buffer
  readonly prefix: boolean
  readonly map: (type: "put" | "delete", kv: IKeyValue) => Coordination.WatchEvent | undefined
}

/**
 * A one-shot watch on `specs` from the revision after `revision`: completes with the first event any of them
 * maps a change to, or fails when the session ends or a watcher may have missed a change.
 */
const watchOn = (
  s: EtcdSession,
  specs: ReadonlyArray<WatchSpec>,
  revision: number
): Effect.Effect<
  Effect.Effect<Coordination.WatchEvent, Coordination.CoordinationError>,
  Coordination.CoordinationError
> =>
  Effect.gen(function* () {
    const deferred = Deferred.makeUnsafe<Coordination.WatchEvent, Coordination.CoordinationError>()
    const watchers: Array<Watcher> = []
    let done = false
    const finish = (exit: Exit.Exit<Coordination.WatchEvent, Coordination.CoordinationError>) => {
      if (done) return
      done = true
      s.watches.delete(onEnd)
      Deferred.doneUnsafe(deferred, exit)
      for (const w of watchers) w.cancel().catch(() => undefined)
    }
    const onEnd = (error: Coordination.CoordinationError) => finish(Exit.fail(error))
    // The session may have ended while the watch's read was under way: its end has passed, so say it now.
    if (s.state === "expired" || s.state === "closed") {
      onEnd(endedError(s, s.state))
      return Deferred.await(deferred)
    }
    s.watches.add(onEnd)
    for (const spec of specs) {
      const builder = s.store.client.watch().startRevision(String(revision + 1))
      const watcher = yield* call(() => (spec.prefix ? builder.prefix(spec.key) : builder.key(spec.key)).create()).pipe(
        Effect.tapError(() =>
          Effect.sync(() =>
            onEnd(Coordination.coordinationError(new Coordination.ConnectionLoss({ detail: "watch failed" })))
          )
        )
      )
      watchers.push(watcher)
      if (done) watcher.cancel().catch(() => undefined)
      const handle = (type: "put" | "delete") => (kv: IKeyValue) => {
        if (isFinal(s.state)) return
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
          Coordination.coordinationError(
            new Coordination.ConnectionLoss({
              detail: `watch ${what}: ${error instanceof Error ? error.message : String(error)}`
            })
          )
        )
      watcher.on("error", lostWatch("cancelled by etcd"))
      watcher.on("disconnected", lostWatch("disconnected"))
    }
    return Deferred.await(deferred)
  })

const create = (s: EtcdSession, path: string, data: Uint8Array, createOptions?: Coordination.CreateOptions) =>
  Effect.map(
    runTxn(
      s.store,
      [{ _tag: "create", path, data, mode: createOptions?.mode ?? "persistent" }],
      s.ctx,
      createOptions?.createParents === true,
      false
    ),
    (results) => {
      const r = results[0]
      return r?._tag === "create" ? r.path : path
    }
  )

const get = (s: EtcdSession, path: string) =>
  Effect.flatMap(Effect.andThen(validated(path), readNode(s.store, path)), ({ node }) =>
    Option.isSome(node)
      ? Effect.succeed(node.value)
      : Effect.fail(Coordination.coordinationError(new Coordination.NoNode({ path })))
  )

const exists = (s: EtcdSession, path: string) =>
  Effect.map(Effect.andThen(validated(path), readNode(s.store, path)), ({ node }) =>
    Option.map(node, (n): Coordination.Stat => n.stat)
  )

const set = (s: EtcdSession, path: string, data: Uint8Array, version?: number) =>
  Effect.map(
    runTxn(
      s.store,
      [version === undefined ? { _tag: "set", path, data } : { _tag: "set", path, data, version }],
      s.ctx,
      false,
      false
    ),
    (results) => {
      const r = results[0]
      if (r?._tag !== "set") throw new Error("unexpected result")
      return r.stat
    }
  )

const remove = (s: EtcdSession, path: string, version?: number) =>
  Effect.asVoid(
    runTxn(
      s.store,
      [version === undefined ? { _tag: "delete", path } : { _tag: "delete", path, version }],
      s.ctx,
      false,
      false
    )
  )

const children = (s: EtcdSession, path: string) =>
  Effect.map(Effect.andThen(validated(path), readChildren(s.store, path)), ({ names }) => names)

const multi = (
  s: EtcdSession,
  ops: ReadonlyArray<Coordination.Op>
): Effect.Effect<ReadonlyArray<Coordination.OpResult>, Coordination.CoordinationError> =>
  ops.length === 0 ? Effect.succeed([]) : runTxn(s.store, ops, s.ctx, false, true)

const watchNode = (s: EtcdSession, path: string) =>
  Effect.gen(function* () {
    yield* validated(path)
    const { node, revision } = yield* readNode(s.store, path)
    const existed = Option.isSome(node)
    const changed = yield* watchOn(
      s,
      [
        {
          key: s.store.keys.data(path),
          prefix: false,
          map: (type) => ({
            _tag: type === "delete" ? "NodeDeleted" : existed ? "NodeDataChanged" : "NodeCreated",
            path
          })
        }
      ],
      revision
    )
    return { value: node, changed } satisfies Coordination.Watch<Option.Option<Coordination.Node>>
  })

const watchChildren = (s: EtcdSession, path: string) =>
  Effect.gen(function* () {
    yield* validated(path)
    const { names, revision } = yield* readChildren(s.store, path)
    const changed = yield* watchOn(
      s,
      [
        {
          key: s.store.keys.data(path),
          prefix: false,
          map: (type) => (type === "delete" ? { _tag: "NodeDeleted", path } : undefined)
        },
        {
          key: s.store.keys.children(path),
          prefix: true,
          map: (type, kv) =>
            type === "delete" || kv.version === "1" ? { _tag: "NodeChildrenChanged", path } : undefined
        }
      ],
      revision
    )
    return { value: names, changed } satisfies Coordination.Watch<ReadonlyArray<string>>
  })

/** The `Session` of an etcd session: every call passes the session's guard. */
export const sessionOf = (s: EtcdSession): Coordination.Session => ({
  id: s.id,
  timeout: Duration.millis(Math.ceil(s.timeoutMs / 1000) * 1000),
  state: Effect.sync(() => s.state),
  changes: Stream.fromPubSub(s.states).pipe(Stream.takeUntil(isFinal)),
  ping: ping(s),
  create: (path, data, createOptions) => guard(s, create(s, path, data, createOptions)),
  get: (path) => guard(s, get(s, path)),
  exists: (path) => guard(s, exists(s, path)),
  set: (path, data, version) => guard(s, set(s, path, data, version)),
  delete: (path, version) => guard(s, remove(s, path, version)),
  children: (path) => guard(s, children(s, path)),
  multi: (ops) => guard(s, multi(s, ops)),
  watchNode: (path) => guard(s, watchNode(s, path)),
  watchChildren: (path) => guard(s, watchChildren(s, path))
})
