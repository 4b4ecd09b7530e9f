/**
 * The `Election` protocol: campaign for leadership of a namespace, observe the
 * current leader, and act only with the epoch (fencing token) won.
 *
 * Leadership is a scoped resource: closing the scope resigns. A leader learns
 * that it lost leadership through `Leadership.lost`, and every write it makes
 * through `Leadership.fenced` is rejected once a newer epoch exists. Side
 * effects outside coordination (requests to tablet servers, to users' systems)
 * check `Leadership.guard` first: past the local leadership deadline (the last
 * time the session was proven alive, plus the session timeout, minus a safety
 * margin) the leader must not act until its session is proven alive again.
 *
 * @since 0.1.0
 */
import * as Coordination from "./Coordination.js"
import * as Errors from "./Errors.js"
import type * as Models from "./Models.js"
import type { Effect, Option, Scope, Stream } from "effect"
import { Context, Schema } from "effect"

/** Why a leadership ended. */
export type LeadershipEnd =
  | { readonly _tag: "Resigned" }
  | { readonly _tag: "SessionLost" }
  | { readonly _tag: "Fenced"; readonly epoch: Models.Epoch }

/** Won leadership. Valid until `lost` completes or its scope closes. */
export interface Leadership {
  /** The epoch won: the fencing token every leader action carries. */
  readonly epoch: Models.Epoch
  readonly info: Models.LeaderInfo
  /**
   * How long this election took, in milliseconds: from the moment this
   * candidate saw the previous leader go (its predecessor's watch firing) to
   * its own leader registration. It leaves out how long the old leader's
   * session took to expire, which dominates a failover after a crash (that is
   * `bench:failover`'s kill-to-new-leader time). `undefined` when there was no
   * previous leader to replace.
   */
  readonly electionDurationMs: number | undefined
  /**
   * The connection state of the session holding this leadership: the current
   * state, then every change. `suspended` is a blip the leadership survives
   * while the session lives; `expired`/`closed` end it (see `lost`).
   */
  readonly connection: Stream.Stream<Coordination.SessionState>
  /** Completes when this leadership ends, saying why. */
  readonly lost: Effect.Effect<LeadershipEnd>
  /**
   * The local leadership deadline, in milliseconds on Effect's Clock: the last
   * time the session was proven alive (a request the server answered was sent
   * then), plus the session timeout, minus a safety margin. The server cannot
   * have expired the session before it; after it, it may have.
   */
  readonly deadline: Effect.Effect<number>
  /** Whether this leadership holds here and now: not lost, and the deadline not passed. */
  readonly isLeader: Effect.Effect<boolean>
  /**
   * Succeeds while `isLeader`; fails with `FencedEpoch` once the leadership is
   * lost and with `LeadershipLapsed` past the deadline (until the session is
   * proven alive again). Run it right before every side effect outside coordination.
   */
  readonly guard: Effect.Effect<void, ElectionError>
  /**
   * Whether the leadership is proven (true) or lapsed past its deadline
   * (false): the current value, then every change; ends when it is lost.
   */
  readonly proven: Stream.Stream<boolean>
  /**
   * Applies coordination operations atomically after checking, in the same
   * transaction, that this epoch is still current (`FencedEpoch` otherwise).
   */
  readonly fenced: (
    ops: ReadonlyArray<Coordination.Op>
  ) => Effect.Effect<ReadonlyArray<Coordination.OpResult>, ElectionError>
}

/** What a candidate announces about itself. */
export interface Candidate {
  readonly serverId: number
  readonly address: string
}

/** The `Election` service shape. */
export interface Shape {
  /** The current leader, if any. */
  readonly leader: Effect.Effect<Option.Option<Models.LeaderInfo>, ElectionError>
  /** The leader now, then every change (a new leader, or none). */
  readonly changes: Stream.Stream<Option.Option<Models.LeaderInfo>, ElectionError>
  /** Waits until elected; the leadership lasts until `lost` or the scope closes (which resigns). */
  readonly campaign: (candidate: Candidate) => Effect.Effect<Leadership, ElectionError, Scope.Scope>
}

/** The `Election` service key. */
export class Election extends Context.Service<Election, Shape>()("@strata/core/Election") {}

/** The coordination backend failed underneath the election. */
export class CoordinationFailed extends Schema.TaggedError<CoordinationFailed>()("ElectionCoordinationFailed", {
  cause: Coordination.CoordinationError
}) {
  /** @since 0.1.0 */
  override get message() {
    return `election: ${this.cause.message}`
  }
}

/** The election was configured with options that cannot work together. */
export class InvalidOptions extends Schema.TaggedError<InvalidOptions>()("InvalidElectionOptions", {
  /** The option at fault. */
  option: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `election: invalid option ${this.option}: ${this.detail}`
  }
}

/**
 * The leadership's deadline passed without its session being proven alive: the
 * server may have expired it, so the leader must not act until a request to
 * the server succeeds again.
 */
export class LeadershipLapsed extends Schema.TaggedError<LeadershipLapsed>()("LeadershipLapsed", {
  epoch: Schema.Int,
  /** The deadline that passed, in milliseconds on Effect's Clock. */
  deadline: Schema.Number
}) {
  /** @since 0.1.0 */
  override get message() {
    return `election: the leadership of epoch ${this.epoch} lapsed at ${new Date(this.deadline).toISOString()}: its session was not proven alive since`
  }
}

/** A coordination node the election relies on holds data it cannot read; `path` names it. */
export class CorruptData extends Schema.TaggedError<CorruptData>()("CorruptElectionData", {
  path: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `election: ${this.path} holds unreadable data: ${this.detail}`
  }
}

/** Another live session already registered this server id. */
export class DuplicateServerId extends Schema.TaggedError<DuplicateServerId>()("DuplicateServerId", {
  serverId: Schema.Int,
  /** The session that holds the registration. */
  owner: Schema.String,
  /** The registration's path. */
  path: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `election: server id ${this.serverId} is already registered at ${this.path} by the live session ${this.owner}`
  }
}

/** Why an election operation failed. */
export const ErrorReason = Schema.Union([
  Errors.FencedEpoch,
  CoordinationFailed,
  InvalidOptions,
  LeadershipLapsed,
  CorruptData,
  DuplicateServerId
])
/** @see ElectionErrorReason */
export type ErrorReason = typeof ErrorReason.Type

/** The error of every `Election` operation. */
export class ElectionError extends Schema.TaggedError<ElectionError>()("ElectionError", {
  reason: ErrorReason
}) {
  /** @since 0.1.0 */
  override get message() {
    return this.reason.message
  }
  /** Whether trying again may succeed. */
  get retryable(): boolean {
    return this.reason._tag === "ElectionCoordinationFailed" && this.reason.cause.retryable
  }
}
