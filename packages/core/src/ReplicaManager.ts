/**
 * The `ReplicaManager` protocol: a tablet server's replicas — the replica
 * state machine's states, leader/follower changes ordered by LeaderAndIsr,
 * appends with acks and ISR/high-watermark rules, fetches by followers.
 *
 * @since 0.1.0
 */
import type { Effect } from "effect"
import { Context, Schema } from "effect"
import { FencedEpoch, IllegalStateTransition, NotLeader, OffsetOutOfRange } from "./Errors.js"
import type { Epoch, LeaderAndIsr, Offset, ServerId, TabletId } from "./Models.js"

/** The replica states of the Fluss/Kafka replica state machine. */
export const ReplicaState = Schema.Literals([
  "NewReplica",
  "OnlineReplica",
  "LeaderReplica",
  "FollowerReplica",
  "OfflineReplica",
  "ReplicaDeleted"
])
/** @see ReplicaState */
export type ReplicaState = typeof ReplicaState.Type

/** The coordinator's instruction for one tablet. */
export interface TabletAssignment {
  readonly tablet: TabletId
  /** All replicas, in assignment order. */
  readonly replicas: ReadonlyArray<ServerId>
  readonly leaderAndIsr: LeaderAndIsr
}

/** How many in-sync replicas must hold a record before an append returns. */
export type ReplicaAcks = 0 | 1 | "all"

/** The result of an append. */
export interface AppendResult {
  readonly baseOffset: Offset
  readonly lastOffset: Offset
  /** The high watermark after the append (all acks: ≥ lastOffset + 1). */
  readonly highWatermark: Offset
}

/** A follower's fetch request. */
export interface FetchRequest {
  readonly tablet: TabletId
  readonly follower: ServerId
  readonly offset: Offset
  /** The leader epoch the follower believes current. */
  readonly leaderEpoch: Epoch
  readonly maxRecords: number
}

/** Records for a follower, with the leader's high watermark and log end. */
export interface FetchResult {
  readonly records: ReadonlyArray<{ readonly offset: Offset; readonly epoch: Epoch; readonly value: Uint8Array }>
  readonly highWatermark: Offset
  readonly logEndOffset: Offset
  readonly logStartOffset: Offset
}

/** The `ReplicaManager` service shape (one per tablet server). */
export interface ReplicaManagerShape {
  readonly serverId: ServerId
  /** Applies LeaderAndIsr instructions; a stale coordinator epoch fails with `FencedEpoch`. */
  readonly becomeLeaderOrFollower: (
    coordinatorEpoch: Epoch,
    assignments: ReadonlyArray<TabletAssignment>
  ) => Effect.Effect<void, ReplicaError>
  /** Stops a replica, deleting its data when asked. */
  readonly stopReplica: (
    coordinatorEpoch: Epoch,
    tablet: TabletId,
    deleteData: boolean
  ) => Effect.Effect<void, ReplicaError>
  /** Appends records on the leader. */
  readonly append: (
    tablet: TabletId,
    records: ReadonlyArray<Uint8Array>,
    acks: ReplicaAcks
  ) => Effect.Effect<AppendResult, ReplicaError>
  /** Serves a follower's fetch on the leader (and records the follower's progress for ISR). */
  readonly fetch: (request: FetchRequest) => Effect.Effect<FetchResult, ReplicaError>
  /** The end offset of `epoch` in the leader's epoch cache (KIP-279), for follower truncation. */
  readonly endOffsetForEpoch: (tablet: TabletId, epoch: Epoch) => Effect.Effect<Offset, ReplicaError>
  readonly state: (tablet: TabletId) => Effect.Effect<ReplicaState, ReplicaError>
}

/** The `ReplicaManager` service key. */
export class ReplicaManager extends Context.Service<ReplicaManager, ReplicaManagerShape>()(
  "@strata/core/ReplicaManager"
) {}

/** The ISR is smaller than `minInsyncReplicas`: the append was refused before writing. */
export class NotEnoughReplicas extends Schema.TaggedError<NotEnoughReplicas>()("NotEnoughReplicas", {
  tablet: Schema.String,
  isr: Schema.Int,
  minIsr: Schema.Int
}) {
  /** @since 0.1.0 */
  override get message() {
    return `${this.tablet}: ${this.isr} in-sync replicas, ${this.minIsr} required`
  }
}

/** The record was written locally but the ISR shrank below the minimum before it was replicated. */
export class NotEnoughReplicasAfterAppend extends Schema.TaggedError<NotEnoughReplicasAfterAppend>()(
  "NotEnoughReplicasAfterAppend",
  { tablet: Schema.String, isr: Schema.Int, minIsr: Schema.Int }
) {
  /** @since 0.1.0 */
  override get message() {
    return `${this.tablet}: written, but only ${this.isr} in-sync replicas remain (${this.minIsr} required)`
  }
}

/** The tablet has no replica on this server. */
export class UnknownTablet extends Schema.TaggedError<UnknownTablet>()("UnknownTablet", { tablet: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `no replica of ${this.tablet} here`
  }
}

/** Why a replica operation failed. */
export const ReplicaErrorReason = Schema.Union([
  NotEnoughReplicas,
  NotEnoughReplicasAfterAppend,
  NotLeader,
  FencedEpoch,
  IllegalStateTransition,
  OffsetOutOfRange,
  UnknownTablet
])
/** @see ReplicaErrorReason */
export type ReplicaErrorReason = typeof ReplicaErrorReason.Type

/** The error of every `ReplicaManager` operation. */
export class ReplicaError extends Schema.TaggedError<ReplicaError>()("ReplicaError", { reason: ReplicaErrorReason }) {
  /** @since 0.1.0 */
  override get message() {
    return this.reason.message
  }
  /** Whether trying again (possibly elsewhere) may succeed. */
  get retryable(): boolean {
    const t = this.reason._tag
    return t === "NotEnoughReplicas" || t === "NotLeader" || t === "NotEnoughReplicasAfterAppend"
  }
}
