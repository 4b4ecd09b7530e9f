/**
 * The `Election` protocol: campaign for leadership of a namespace, observe the
 * current leader, and act only with the epoch (fencing token) won.
 *
 * Leadership is a scoped resource: closing the scope resigns. A leader learns
 * that it lost leadership through `Leadership.lost`, and every write it makes
 * through `Leadership.fenced` is rejected once a newer epoch exists.
 *
 * @since 0.1.0
 */
import type { Effect, Option, Scope, Stream } from "effect"
import { Context, Schema } from "effect"
import { CoordinationError, type Op, type OpResult, type SessionState } from "./Coordination.js"
import { FencedEpoch } from "./Errors.js"
import type { Epoch, LeaderInfo } from "./Models.js"

/** Why a leadership ended. */
export type LeadershipEnd =
  | { readonly _tag: "Resigned" }
  | { readonly _tag: "SessionLost" }
  | { readonly _tag: "Fenced"; readonly epoch: Epoch }

/** Won leadership. Valid until `lost` completes or its scope closes. */
export interface Leadership {
  /** The epoch won: the fencing token every leader action carries. */
  readonly epoch: Epoch
  readonly info: LeaderInfo
  /**
   * How long the leadership was vacant before this one, in milliseconds: from
   * the moment this candidate saw the previous leader go to its own leader
   * registration. `undefined` when there was no previous leader to replace.
   */
  readonly failoverDurationMs: number | undefined
  /**
   * The connection state of the session holding this leadership: the current
   * state, then every change. `suspended` is a blip the leadership survives
   * while the session lives; `expired`/`closed` end it (see `lost`).
   */
  readonly connection: Stream.Stream<SessionState>
  /** Completes when this leadership ends, saying why. */
  readonly lost: Effect.Effect<LeadershipEnd>
  /**
   * Applies coordination operations atomically after checking, in the same
   * transaction, that this epoch is still current (`FencedEpoch` otherwise).
   */
  readonly fenced: (ops: ReadonlyArray<Op>) => Effect.Effect<ReadonlyArray<OpResult>, ElectionError>
}

/** What a candidate announces about itself. */
export interface Candidate {
  readonly serverId: number
  readonly address: string
}

/** The `Election` service shape. */
export interface ElectionShape {
  /** The current leader, if any. */
  readonly leader: Effect.Effect<Option.Option<LeaderInfo>, ElectionError>
  /** The leader now, then every change (a new leader, or none). */
  readonly changes: Stream.Stream<Option.Option<LeaderInfo>, ElectionError>
  /** Waits until elected; the leadership lasts until `lost` or the scope closes (which resigns). */
  readonly campaign: (candidate: Candidate) => Effect.Effect<Leadership, ElectionError, Scope.Scope>
}

/** The `Election` service key. */
export class Election extends Context.Service<Election, ElectionShape>()("@strata/core/Election") {}

/** The coordination backend failed underneath the election. */
export class ElectionCoordinationFailed extends Schema.TaggedError<ElectionCoordinationFailed>()(
  "ElectionCoordinationFailed",
  { cause: CoordinationError }
) {
  /** @since 0.1.0 */
  override get message() {
    return `election: ${this.cause.message}`
  }
}

/** The election was configured with options that cannot work together. */
export class InvalidElectionOptions extends Schema.TaggedError<InvalidElectionOptions>()("InvalidElectionOptions", {
  /** The option at fault. */
  option: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `election: invalid option ${this.option}: ${this.detail}`
  }
}

/** Why an election operation failed. */
export const ElectionErrorReason = Schema.Union([FencedEpoch, ElectionCoordinationFailed, InvalidElectionOptions])
/** @see ElectionErrorReason */
export type ElectionErrorReason = typeof ElectionErrorReason.Type

/** The error of every `Election` operation. */
export class ElectionError extends Schema.TaggedError<ElectionError>()("ElectionError", {
  reason: ElectionErrorReason
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
