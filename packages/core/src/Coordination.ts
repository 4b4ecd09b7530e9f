/**
 * The `Coordination` protocol: ZooKeeper-like primitives every backend can
 * honour (ZooKeeper natively, etcd through leases and revisions, memory on
 * Effect's Clock).
 *
 * Paths are absolute, `/`-separated, without a trailing slash. Data is bytes.
 * Versions start at 0 when a node is created and grow by one on every `set`.
 *
 * @since 0.1.0
 */
import type { Duration, Effect, Option, Scope, Stream } from "effect"
import { Context, Schema } from "effect"

/** How a node lives: ephemeral nodes die with their session; sequential ones get a 10-digit suffix. */
export type CreateMode = "persistent" | "ephemeral" | "persistent-sequential" | "ephemeral-sequential"

/** Metadata of a node. */
export interface Stat {
  /** Data version: 0 at creation, +1 per `set`. */
  readonly version: number
  /** Children version: +1 per child created or deleted. */
  readonly childrenVersion: number
  /** The session owning an ephemeral node, `null` for persistent ones. */
  readonly ephemeralOwner: string | null
  /** A store-wide number that orders creations (ZooKeeper czxid, etcd create revision). */
  readonly createdOrder: number
  /** A store-wide number that orders modifications (mzxid, mod revision). */
  readonly modifiedOrder: number
}

/** A node's data with its metadata. */
export interface Node {
  readonly data: Uint8Array
  readonly stat: Stat
}

/** A session's connection state. `expired` and `closed` are final. */
export type SessionState = "connected" | "suspended" | "expired" | "closed"

/** What a one-shot watch reports. */
export interface WatchEvent {
  readonly _tag: "NodeCreated" | "NodeDeleted" | "NodeDataChanged" | "NodeChildrenChanged"
  readonly path: string
}

/**
 * A read that set a one-shot watch atomically with it. `changed` completes
 * once, at the first change after the read; it fails with `SessionExpired` or
 * `SessionClosed` if the session ends first, so a waiter never hangs.
 */
export interface Watch<A> {
  readonly value: A
  readonly changed: Effect.Effect<WatchEvent, CoordinationError>
}

/** One operation of an atomic `multi`. */
export type Op =
  | { readonly _tag: "check"; readonly path: string; readonly version: number }
  | { readonly _tag: "create"; readonly path: string; readonly data: Uint8Array; readonly mode?: CreateMode }
  | { readonly _tag: "set"; readonly path: string; readonly data: Uint8Array; readonly version?: number }
  | { readonly _tag: "delete"; readonly path: string; readonly version?: number }

/** The result of one operation of a successful `multi`, in order. */
export type OpResult =
  | { readonly _tag: "check" }
  | { readonly _tag: "create"; readonly path: string }
  | { readonly _tag: "set"; readonly stat: Stat }
  | { readonly _tag: "delete" }

/** Builders for `multi` operations. */
export const op = {
  /** Succeeds only if the node's version is `version`. */
  check: (path: string, version: number): Op => ({ _tag: "check", path, version }),
  /** Creates a node. */
  create: (path: string, data: Uint8Array, mode: CreateMode = "persistent"): Op => ({
    _tag: "create",
    path,
    data,
    mode
  }),
  /** Sets a node's data, optionally only at `version`. */
  set: (path: string, data: Uint8Array, version?: number): Op =>
    version === undefined ? { _tag: "set", path, data } : { _tag: "set", path, data, version },
  /** Deletes a node, optionally only at `version`. */
  delete: (path: string, version?: number): Op =>
    version === undefined ? { _tag: "delete", path } : { _tag: "delete", path, version }
} as const

/** Options of `create`. */
export interface CreateOptions {
  readonly mode?: CreateMode
  /** Create missing parents as persistent nodes with empty data. */
  readonly createParents?: boolean
}

/** A session with the coordination service; its ephemeral nodes live as long as it does. */
export interface Session {
  /** The session's id (ZooKeeper session id, etcd lease id). */
  readonly id: string
  /** The negotiated session timeout. */
  readonly timeout: Duration.Duration
  readonly state: Effect.Effect<SessionState>
  /** The current state, then every change; ends after a final state (`expired` or `closed`). */
  readonly changes: Stream.Stream<SessionState>
  /**
   * Proves the session alive: succeeds only once the server has answered for this session, so the session cannot
   * expire before `timeout` after the call was made. Fails with `SessionExpired` / `SessionClosed` when it ended,
   * with `ConnectionLoss` when the server could not be asked.
   */
  readonly ping: Effect.Effect<void, CoordinationError>
  /** Creates a node and returns its actual path (with the sequence suffix for sequential modes). */
  readonly create: (path: string, data: Uint8Array, options?: CreateOptions) => Effect.Effect<string, CoordinationError>
  /** Reads a node (`NoNode` if absent). */
  readonly get: (path: string) => Effect.Effect<Node, CoordinationError>
  /** A node's metadata, if it exists. */
  readonly exists: (path: string) => Effect.Effect<Option.Option<Stat>, CoordinationError>
  /** Writes a node's data, only at `version` when given (`BadVersion` otherwise). */
  readonly set: (path: string, data: Uint8Array, version?: number) => Effect.Effect<Stat, CoordinationError>
  /** Deletes a childless node, only at `version` when given. */
  readonly delete: (path: string, version?: number) => Effect.Effect<void, CoordinationError>
  /** Names (not paths) of a node's children, sorted. */
  readonly children: (path: string) => Effect.Effect<ReadonlyArray<string>, CoordinationError>
  /** Applies all operations atomically or none; the error names the first failing operation. */
  readonly multi: (ops: ReadonlyArray<Op>) => Effect.Effect<ReadonlyArray<OpResult>, CoordinationError>
  /** Reads a node (or its absence) and watches for its creation, deletion or data change. */
  readonly watchNode: (path: string) => Effect.Effect<Watch<Option.Option<Node>>, CoordinationError>
  /** Reads a node's children and watches for a child change or the node's deletion. */
  readonly watchChildren: (path: string) => Effect.Effect<Watch<ReadonlyArray<string>>, CoordinationError>
}

/** Options of a session. */
export interface SessionOptions {
  /** Session timeout; the backend may negotiate it within its bounds. */
  readonly timeout?: Duration.Input
}

/** The `Coordination` service shape. */
export interface Shape {
  /** The backend's name, e.g. `"memory"`, `"zookeeper"`, `"etcd"`. */
  readonly backend: string
  /** Opens a session; closing the scope closes it and deletes its ephemeral nodes. */
  readonly session: (options?: SessionOptions) => Effect.Effect<Session, CoordinationError, Scope.Scope>
}

/** The `Coordination` service key. */
export class Coordination extends Context.Service<Coordination, Shape>()("@strata/core/Coordination") {}

/**
 * Fault injection for a coordination backend, used by the conformance suite and
 * the simulator: what a test can do to a session from outside.
 */
export interface FaultsShape {
  /** Ends the session on the server side now, as if its timeout had passed. */
  readonly expire: (session: Session) => Effect.Effect<void, CoordinationError>
  /** Cuts the session's connection (it becomes `suspended`) until `reconnect`; the server expires it after its timeout. */
  readonly disconnect?: (session: Session) => Effect.Effect<void, CoordinationError>
  /** Restores a cut connection; a session the server already expired becomes `expired`. */
  readonly reconnect?: (session: Session) => Effect.Effect<void, CoordinationError>
}

/** The `CoordinationFaults` service key. */
export class Faults extends Context.Service<Faults, FaultsShape>()("@strata/core/CoordinationFaults") {}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/** The node does not exist (or a parent of a node to create does not). */
export class NoNode extends Schema.TaggedError<NoNode>()("NoNode", { path: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `no node at ${this.path}`
  }
}

/** A node already exists at the path. */
export class NodeExists extends Schema.TaggedError<NodeExists>()("NodeExists", { path: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `a node already exists at ${this.path}`
  }
}

/** A versioned write or check found another version. */
export class BadVersion extends Schema.TaggedError<BadVersion>()("BadVersion", {
  path: Schema.String,
  expected: Schema.Int
}) {
  /** @since 0.1.0 */
  override get message() {
    return `${this.path} is not at version ${this.expected}`
  }
}

/** A node with children cannot be deleted. */
export class NotEmpty extends Schema.TaggedError<NotEmpty>()("NotEmpty", { path: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `${this.path} has children`
  }
}

/** Ephemeral nodes cannot have children. */
export class NoChildrenForEphemerals extends Schema.TaggedError<NoChildrenForEphemerals>()("NoChildrenForEphemerals", {
  path: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `${this.path} is ephemeral and cannot have children`
  }
}

/** A path is not absolute, has empty segments or a trailing slash. */
export class InvalidPath extends Schema.TaggedError<InvalidPath>()("InvalidPath", {
  path: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `invalid path ${JSON.stringify(this.path)}: ${this.detail}`
  }
}

/** The session expired: its ephemeral nodes are gone; open a new session. */
export class SessionExpired extends Schema.TaggedError<SessionExpired>()("SessionExpired", { session: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `session ${this.session} expired`
  }
}

/** The session was closed by its owner. */
export class SessionClosed extends Schema.TaggedError<SessionClosed>()("SessionClosed", { session: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `session ${this.session} is closed`
  }
}

/** The connection dropped during the operation: it may or may not have been applied. */
export class ConnectionLoss extends Schema.TaggedError<ConnectionLoss>()("ConnectionLoss", { detail: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `connection lost: ${this.detail}`
  }
}

/**
 * The session's identity may not do this to the node (ZooKeeper's `NoAuth`: an ACL that names another identity, or
 * credentials the backend refused). Not retryable: the same identity is refused again.
 *
 * @since 0.1.0
 */
export class NotAuthorized extends Schema.TaggedError<NotAuthorized>()("NotAuthorized", {
  path: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `not authorized on ${this.path}: ${this.detail}`
  }
}

/** The servers could not be reached (after retries). */
export class Unreachable extends Schema.TaggedError<Unreachable>()("CoordinationUnreachable", {
  address: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `cannot reach ${this.address}: ${this.detail}`
  }
}

/** A backend was given options it cannot work with (nothing was opened); `option` names the first bad one. */
export class InvalidOptions extends Schema.TaggedError<InvalidOptions>()("InvalidCoordinationOptions", {
  /** The backend, e.g. `"zookeeper"` or `"etcd"`. */
  backend: Schema.String,
  /** The option at fault, e.g. `root` or `endpoints[0]`. */
  option: Schema.String,
  /** The bad value, JSON-formatted. */
  value: Schema.String,
  /** What is wrong with it (and with any other bad option). */
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `invalid ${this.backend} option ${this.option} = ${this.value}: ${this.detail}`
  }
}

/** Why a coordination operation failed. */
export const ErrorReason = Schema.Union([
  NoNode,
  NodeExists,
  BadVersion,
  NotEmpty,
  NoChildrenForEphemerals,
  InvalidPath,
  SessionExpired,
  SessionClosed,
  ConnectionLoss,
  NotAuthorized,
  Unreachable,
  InvalidOptions
])
/** @see CoordinationErrorReason */
export type ErrorReason = typeof ErrorReason.Type

/** The error of every `Coordination` operation. `opIndex` names the failing operation of a `multi`. */
export class CoordinationError extends Schema.TaggedError<CoordinationError>()("CoordinationError", {
  reason: ErrorReason,
  opIndex: Schema.optional(Schema.Int)
}) {
  /** @since 0.1.0 */
  override get message() {
    return this.opIndex === undefined ? this.reason.message : `operation ${this.opIndex}: ${this.reason.message}`
  }
  /** Whether trying again may succeed. */
  get retryable(): boolean {
    return this.reason._tag === "ConnectionLoss" || this.reason._tag === "CoordinationUnreachable"
  }
}

/** Wraps a reason into a `CoordinationError`. */
export const coordinationError = (reason: ErrorReason, opIndex?: number): CoordinationError =>
  new CoordinationError(opIndex === undefined ? { reason } : { reason, opIndex })
