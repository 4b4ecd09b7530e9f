/**
 * The etcd backend's connection: its clients, its keys and its open sessions,
 * shared by every session and fault.
 *
 * @internal
 */
import { Coordination } from "@strata/core"
import { Effect, Redacted, type Scope } from "effect"
import { Etcd3, EtcdAuthenticationFailedError, EtcdInvalidAuthTokenError, EtcdPermissionDeniedError } from "etcd3"
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

/** How the clients connect: TLS material (PEM) and password credentials, each absent when not used. */
export interface Security {
  readonly credentials?: { readonly rootCertificate: Buffer; readonly certChain?: Buffer; readonly privateKey?: Buffer }
  readonly auth?: { readonly username: string; readonly password: Redacted.Redacted<string> }
}

/** Whether etcd refused the client's identity: its password, its token, or a permission its user lacks. */
const refused = (e: unknown): boolean =>
  e instanceof EtcdAuthenticationFailedError ||
  e instanceof EtcdInvalidAuthTokenError ||
  e instanceof EtcdPermissionDeniedError ||
  (e instanceof Error &&
    /authentication failed|permission denied|user name is empty|invalid auth token/i.test(e.message))

/**
 * One etcd3 call. A refused identity is `NotAuthorized` (not retried); whatever else it rejects with is a lost
 * connection.
 */
export const call = <A>(f: () => Promise<A>, path = "/"): Effect.Effect<A, Coordination.CoordinationError> =>
  Effect.tryPromise({
    try: f,
    catch: (e) =>
      Coordination.coordinationError(
        refused(e)
          ? new Coordination.NotAuthorized({ path, detail: `etcd refused the client: ${(e as Error).message}` })
          : new Coordination.ConnectionLoss({ detail: e instanceof Error ? e.message : String(e) })
      )
  })

const acquireClient = (
  endpoints: ReadonlyArray<string>,
  security: Security
): Effect.Effect<Etcd3, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(
      () =>
        new Etcd3({
          hosts: [...endpoints],
          ...(security.credentials === undefined ? {} : { credentials: { ...security.credentials } }),
          ...(security.auth === undefined
            ? {}
            : { auth: { username: security.auth.username, password: Redacted.value(security.auth.password) } })
        })
    ),
    (c) => Effect.sync(() => c.close())
  )

/**
 * Connects to etcd for the life of the scope (over TLS and with a password when `security` says so) and creates the
 * tree's root node if missing; an etcd it cannot reach fails with `CoordinationUnreachable`, one that refuses the
 * client with `NotAuthorized`.
 */
export const open = (
  endpoints: ReadonlyArray<string>,
  root: string,
  defaultTimeout: number,
  security: Security = {}
): Effect.Effect<EtcdStore, Coordination.CoordinationError, Scope.Scope> =>
  Effect.gen(function* () {
    const keys = makeKeys(root)
    const client = yield* acquireClient(endpoints, security)
    const faultClient = yield* acquireClient(endpoints, security)
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
