/**
 * The etcd backend's connection: its clients, its keys and its open sessions,
 * shared by every session and fault.
 *
 * @internal
 */
import { Coordination } from "@strata/core"
import { Effect, type Scope } from "effect"
import { Etcd3 } from "etcd3"
import { encodeData, type Keys, makeKeys } from "./etcdKeys.js"

/** Whether a session state is one a session never leaves. */
export const isFinal = (state: Coordination.SessionState): boolean => state === "expired" || state === "closed"

/** What the store knows of an open session. */
export interface SessionHandle {
  readonly lease: string
  /** Ends the session (once): its state, its watches, its entry here. */
  readonly end: (state: "expired" | "closed") => void
  readonly state: () => Coordination.SessionState
}

/** The backend's connection to etcd. */
export interface EtcdStore {
  /** The sessions' client. */
  readonly client: Etcd3
  /** The faults' own client. */
  readonly faultClient: Etcd3
  readonly keys: Keys
  /** Session timeout in milliseconds when a session asks for none. */
  readonly defaultTimeout: number
  /** The open sessions by id (their lease id). */
  readonly sessions: Map<string, SessionHandle>
}

/** One etcd3 call; whatever it rejects with is a lost connection. */
export const call = <A>(f: () => Promise<A>): Effect.Effect<A, Coordination.CoordinationError> =>
  Effect.tryPromise({
    try: f,
    catch: (e) =>
      Coordination.coordinationError(
        new Coordination.ConnectionLoss({ detail: e instanceof Error ? e.message : String(e) })
      )
  })

const acquireClient = (endpoints: ReadonlyArray<string>): Effect.Effect<Etcd3, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => new Etcd3({ hosts: [...endpoints] })),
    (c) => Effect.sync(() => c.close())
  )

/**
 * Connects to etcd for the life of the scope and creates the tree's root node if missing; an etcd it cannot
 * reach fails with `CoordinationUnreachable`.
 */
export const open = (
  endpoints: ReadonlyArray<string>,
  root: string,
  defaultTimeout: number
): Effect.Effect<EtcdStore, Coordination.CoordinationError, Scope.Scope> =>
  Effect.gen(function* () {
    const keys = makeKeys(root)
    const client = yield* acquireClient(endpoints)
    const faultClient = yield* acquireClient(endpoints)
    // the tree's root node
    yield* call(() =>
      client.kv.txn({
        compare: [{ key: keys.data("/"), target: "Version", result: "Equal", version: 0 }],
        success: [{ request_put: { key: keys.data("/"), value: encodeData({ v: 0, o: null }, new Uint8Array(0)) } }]
      })
    ).pipe(
      Effect.mapError((e) =>
        e.reason._tag === "ConnectionLoss"
          ? Coordination.coordinationError(
              new Coordination.Unreachable({ address: endpoints.join(","), detail: e.reason.detail })
            )
          : e
      )
    )
    return { client, faultClient, keys, defaultTimeout, sessions: new Map() }
  })
