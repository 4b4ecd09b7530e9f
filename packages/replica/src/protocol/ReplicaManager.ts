/**
 * The `ReplicaManager` protocol: what a tablet server answers for the replicas it hosts — the coordinator's
 * LeaderAndIsr instructions (fenced by the coordinator epoch), clients' appends with acks and idempotent producer
 * stamps, clients' reads up to the high watermark, and followers' fetches and end-offset questions (fenced by the
 * leader epoch). The requests and answers are Schemas, so a transport can carry them as they are.
 *
 * @since 0.1.0
 */
import { Errors, Log, Models } from "@strata/core"
import type { Effect } from "effect"
import { Context, Schema } from "effect"

const Count = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))
const BytesPerSecond = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))

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

/** One record of a tablet. */
export const TabletRecord = Schema.Struct({
  key: Schema.NullOr(Schema.Uint8Array),
  value: Schema.Uint8Array,
  headers: Schema.Array(Schema.Struct({ key: Schema.String, value: Schema.Uint8Array })),
  timestamp: Schema.Number
}).annotate({ identifier: "TabletRecord" })
/** @see TabletRecord */
export type TabletRecord = typeof TabletRecord.Type

/**
 * An idempotent producer's stamp on a batch: its id, its producer epoch, and the sequence number of the batch's
 * first record (sequences count records from 0 in each producer epoch, per tablet).
 */
export const ProducerStamp = Schema.Struct({ id: Count, epoch: Count, sequence: Count }).annotate({
  identifier: "ProducerStamp"
})
/** @see ProducerStamp */
export type ProducerStamp = typeof ProducerStamp.Type

/** Records as one tablet log holds them: dense offsets from `baseOffset`, written under leader epoch `epoch`. */
export const TabletBatch = Schema.Struct({
  baseOffset: Models.Offset,
  epoch: Models.Epoch,
  records: Schema.Array(TabletRecord),
  producer: Schema.optional(ProducerStamp)
}).annotate({ identifier: "TabletBatch" })
/** @see TabletBatch */
export type TabletBatch = typeof TabletBatch.Type

/**
 * A table's retention: how long (`ms`, by the newest record of a whole segment) and how much (`bytes`, of a replica's
 * log) each replica keeps; absent keys keep everything. Only records below the high watermark are ever deleted.
 */
export const Retention = Schema.Struct({
  ms: Schema.optional(Schema.Int.check(Schema.isGreaterThan(0))),
  bytes: Schema.optional(Schema.Int.check(Schema.isGreaterThan(0)))
}).annotate({ identifier: "Retention" })
/** @see Retention */
export type Retention = typeof Retention.Type

/**
 * One tablet's part of a LeaderAndIsr request: its replicas in assignment order and its leader and ISR.
 * `throttleBytesPerSec`: the replication throttle this server's replica fetches under, set while a move adds the
 * replica (Kafka's reassignment throttle); absent, it fetches unthrottled. `retention`: its table's (absent: keep
 * everything).
 */
export const TabletInstruction = Schema.Struct({
  tablet: Models.TabletId,
  replicas: Schema.Array(Models.ServerId),
  leaderAndIsr: Models.LeaderAndIsr,
  throttleBytesPerSec: Schema.optional(BytesPerSecond),
  retention: Schema.optional(Retention)
}).annotate({ identifier: "TabletInstruction" })
/** @see TabletInstruction */
export type TabletInstruction = typeof TabletInstruction.Type

/**
 * The coordinator's instructions to one tablet server. `registration`: the registration (life) of the server they
 * are for; a server registered otherwise — a restart of it, or not registered yet — refuses them (KIP-380).
 */
export const LeaderAndIsrRequest = Schema.Struct({
  coordinatorEpoch: Models.Epoch,
  registration: Schema.optional(Schema.Int),
  tablets: Schema.Array(TabletInstruction)
}).annotate({ identifier: "LeaderAndIsrRequest" })
/** @see LeaderAndIsrRequest */
export type LeaderAndIsrRequest = typeof LeaderAndIsrRequest.Type

/**
 * The coordinator's instruction to delete this server's replicas of `tablets` (their table was deleted): each stops
 * its role and its data is dropped, whether or not the server hosts it now (a replica left on disk by an earlier run
 * goes too). Fenced and addressed as `LeaderAndIsrRequest` is.
 */
export const StopReplicaRequest = Schema.Struct({
  coordinatorEpoch: Models.Epoch,
  registration: Schema.optional(Schema.Int),
  tablets: Schema.Array(Models.TabletId)
}).annotate({ identifier: "StopReplicaRequest" })
/** @see StopReplicaRequest */
export type StopReplicaRequest = typeof StopReplicaRequest.Type

/** How many in-sync replicas must hold a record before an append returns (0: none, not even the leader's ack). */
export const ReplicaAcks = Schema.Union([Schema.Literal(0), Schema.Literal(1), Schema.Literal("all")])
/** @see ReplicaAcks */
export type ReplicaAcks = typeof ReplicaAcks.Type

/** A client's append to a tablet's leader. */
export const AppendRequest = Schema.Struct({
  tablet: Models.TabletId,
  records: Schema.Array(TabletRecord),
  acks: ReplicaAcks,
  producer: Schema.optional(ProducerStamp)
}).annotate({ identifier: "AppendRequest" })
/** @see AppendRequest */
export type AppendRequest = typeof AppendRequest.Type

/** Where an append's records are; `duplicate`: a retry of a batch already written, answered with its offsets. */
export const AppendResult = Schema.Struct({
  baseOffset: Models.Offset,
  lastOffset: Models.Offset,
  highWatermark: Models.Offset,
  duplicate: Schema.Boolean
}).annotate({ identifier: "AppendResult" })
/** @see AppendResult */
export type AppendResult = typeof AppendResult.Type

/**
 * A client's read from a tablet's leader: up to the high watermark unless `uncommitted`. `maxWaitMs`: a read at the
 * high watermark (nothing to return) waits up to this long for it to move, answering as soon as records commit, or
 * empty once the wait is over; the leader waits no longer than its `fetchMaxWait`. Absent (or 0), it answers at once.
 * A server's own-log read (`ReadLog`) never waits.
 */
export const ReadRequest = Schema.Struct({
  tablet: Models.TabletId,
  offset: Models.Offset,
  maxBytes: Count,
  uncommitted: Schema.optional(Schema.Boolean),
  maxWaitMs: Schema.optional(Count)
}).annotate({ identifier: "ReadRequest" })
/** @see ReadRequest */
export type ReadRequest = typeof ReadRequest.Type

/** Batches from the read offset, with the log's bounds. */
export const ReadResult = Schema.Struct({
  batches: Schema.Array(TabletBatch),
  highWatermark: Models.Offset,
  logStartOffset: Models.Offset,
  logEndOffset: Models.Offset
}).annotate({ identifier: "ReadResult" })
/** @see ReadResult */
export type ReadResult = typeof ReadResult.Type

/** A follower's fetch, under the leader epoch it follows. */
export const FetchRequest = Schema.Struct({
  tablet: Models.TabletId,
  follower: Models.ServerId,
  /** The follower's current registration: an ISR expansion names it, so that one for an ended life is refused. */
  registration: Schema.optional(Schema.Int),
  leaderEpoch: Models.Epoch,
  offset: Models.Offset,
  /**
   * The epoch of the last batch in the follower's log (omitted when it holds none): the leader answers `Diverging`
   * when its own log does not hold that epoch up to `offset` (KIP-320 / KIP-595).
   */
  lastFetchedEpoch: Schema.optional(Models.Epoch),
  maxBytes: Count,
  /** Where the follower's log starts: a delete waits until every ISR member's start has passed it. */
  logStartOffset: Schema.optional(Models.Offset)
}).annotate({ identifier: "FetchRequest" })
/** @see FetchRequest */
export type FetchRequest = typeof FetchRequest.Type

/**
 * The leader's answer to a fetch: batches from the offset (with its HW), `OutOfRange` when the offset is not in its
 * log (below its start: the follower starts over there; past its end: the follower finds where they agree), or
 * `Diverging` when the follower's last fetched epoch ends in the leader's log at `endOffset`, before the fetch
 * offset (`epoch`: the largest epoch the leader has at or below it): the follower truncates there first.
 */
export const FetchResult = Schema.Union([
  Schema.TaggedStruct("Batches", {
    leaderEpoch: Models.Epoch,
    batches: Schema.Array(TabletBatch),
    highWatermark: Models.Offset,
    logStartOffset: Models.Offset
  }),
  Schema.TaggedStruct("OutOfRange", { leaderEpoch: Models.Epoch, logStartOffset: Models.Offset }),
  Schema.TaggedStruct("Diverging", {
    leaderEpoch: Models.Epoch,
    epoch: Schema.NullOr(Models.Epoch),
    endOffset: Models.Offset
  })
]).annotate({ identifier: "FetchResult" })
/** @see FetchResult */
export type FetchResult = typeof FetchResult.Type

/**
 * A client's delete of every record of `tablet` below `offset` (Kafka's DeleteRecords), on its leader: `offset` at
 * most the high watermark (`OffsetOutOfRange` past it), one at or below the log start deletes nothing more. The
 * leader moves its log start, and answers once every in-sync replica's start has reached `offset` (they take it
 * from their next fetch), or fails `DeleteTimedOut` after the append timeout.
 */
export const DeleteRecordsRequest = Schema.Struct({
  tablet: Models.TabletId,
  offset: Models.Offset
}).annotate({ identifier: "DeleteRecordsRequest" })
/** @see DeleteRecordsRequest */
export type DeleteRecordsRequest = typeof DeleteRecordsRequest.Type

/** The leader's log start after a delete (the lowest start over its in-sync replicas is at least the offset). */
export const DeleteRecordsResult = Schema.Struct({
  logStartOffset: Models.Offset
}).annotate({ identifier: "DeleteRecordsResult" })
/** @see DeleteRecordsResult */
export type DeleteRecordsResult = typeof DeleteRecordsResult.Type

/** A follower's question: where does `epoch` end in the leader's log (KIP-279)? */
export const EndOffsetRequest = Schema.Struct({
  tablet: Models.TabletId,
  leaderEpoch: Models.Epoch,
  epoch: Models.Epoch
}).annotate({ identifier: "EndOffsetRequest" })
/** @see EndOffsetRequest */
export type EndOffsetRequest = typeof EndOffsetRequest.Type

/** The largest epoch at or below the one asked and where it ends; `null` when the log has none. */
export const EndOffsetResult = Schema.Struct({
  leaderEpoch: Models.Epoch,
  answer: Schema.NullOr(Schema.Struct({ epoch: Models.Epoch, endOffset: Models.Offset }))
}).annotate({ identifier: "EndOffsetResult" })
/** @see EndOffsetResult */
export type EndOffsetResult = typeof EndOffsetResult.Type

/**
 * The controller's question to a candidate leader: how far does your log of `tablet` go? The controller asks while the
 * tablet is offline under `fence.leaderEpoch`, fenced as `leaderAndIsr` is by `fence.coordinatorEpoch`: the replica
 * first ends any role it has under an older leader epoch, so the log end it answers cannot grow under that epoch
 * afterwards (a leader whose session ended while it ran would otherwise go on acknowledging records the election
 * does not see). Without `fence` the question only looks (tools, tests).
 */
export const LogEndRequest = Schema.Struct({
  tablet: Models.TabletId,
  fence: Schema.optional(Schema.Struct({ leaderEpoch: Models.Epoch, coordinatorEpoch: Models.Epoch }))
}).annotate({ identifier: "LogEndRequest" })
/** @see LogEndRequest */
export type LogEndRequest = typeof LogEndRequest.Type

/** A replica's log end and the latest leader epoch in its log (`null`: it holds no batch of any epoch). */
export const LogEndResult = Schema.Struct({
  lastEpoch: Schema.NullOr(Models.Epoch),
  logEndOffset: Models.Offset
}).annotate({ identifier: "LogEndResult" })
/** @see LogEndResult */
export type LogEndResult = typeof LogEndResult.Type

/**
 * A new controller's question to a tablet server, under its coordinator epoch (fencing the previous controller's
 * instructions from then on) and addressed to one registration of the server: which tablets do you hold, and under
 * which leader epoch and tablet version? It then instructs the server only where the answer falls behind.
 */
export const HoldingsRequest = Schema.Struct({
  coordinatorEpoch: Models.Epoch,
  registration: Schema.optional(Schema.Int)
}).annotate({ identifier: "HoldingsRequest" })
/** @see HoldingsRequest */
export type HoldingsRequest = typeof HoldingsRequest.Type

/**
 * One replica a tablet server holds, as its last LeaderAndIsr left it: the leader epoch its machine took (`null`:
 * none yet) and the tablet version it applied; `sizeBytes`, while its log is open: the bytes of the batches the log
 * holds (`TabletLog.sizeBytes`, exact); `throttleBytesPerSec`: the replication throttle its fetches are under, if any.
 */
export const Holding = Schema.Struct({
  tablet: Models.TabletId,
  leaderEpoch: Schema.NullOr(Models.Epoch),
  version: Schema.Int,
  sizeBytes: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))),
  throttleBytesPerSec: Schema.optional(BytesPerSecond)
}).annotate({ identifier: "Holding" })
/** @see Holding */
export type Holding = typeof Holding.Type

/**
 * A tablet server's health, as it measured it: `appendLatencyP99Ms`, the 99th percentile of its appends as leader
 * (from arrival to answer, in milliseconds) over a recent window (absent when it served none in the window), and
 * `isrShrinks`, the committed ISR changes that removed members on tablets it leads since it started (what
 * `strata_server_isr_shrinks_total` counts).
 */
export const ServerHealth = Schema.Struct({
  appendLatencyP99Ms: Schema.optional(Schema.Finite.check(Schema.isGreaterThanOrEqualTo(0))),
  isrShrinks: Count
}).annotate({ identifier: "ServerHealth" })
/** @see ServerHealth */
export type ServerHealth = typeof ServerHealth.Type

/** A tablet server's answer to `HoldingsRequest`: its replicas, and its health (absent from a server that keeps none). */
export const HoldingsResult = Schema.Struct({
  tablets: Schema.Array(Holding),
  health: Schema.optional(ServerHealth)
}).annotate({ identifier: "HoldingsResult" })
/** @see HoldingsResult */
export type HoldingsResult = typeof HoldingsResult.Type

/**
 * A leader's request to change its tablet's ISR (`version`: the tablet version it knows). `registrations`: the
 * registrations its followers fetched under (KIP-903), so that a member added under a life that has ended is refused.
 */
export const AdjustIsrRequest = Schema.Struct({
  tablet: Models.TabletId,
  leader: Models.ServerId,
  leaderEpoch: Models.Epoch,
  version: Count,
  isr: Schema.Array(Models.ServerId),
  registrations: Schema.optional(Schema.Array(Schema.Tuple([Models.ServerId, Schema.Int])))
}).annotate({ identifier: "AdjustIsrRequest" })
/** @see AdjustIsrRequest */
export type AdjustIsrRequest = typeof AdjustIsrRequest.Type

/**
 * Why the controller refused an ISR change. `InvalidVersion` carries the tablet's current state, for the leader to
 * adopt; `IneligibleReplica` names a server that may not join (KIP-841, KIP-903).
 */
export const IsrRejection = Schema.Union([
  Schema.TaggedStruct("UnknownTablet", {}),
  Schema.TaggedStruct("NotLeader", { leader: Schema.NullOr(Models.ServerId) }),
  Schema.TaggedStruct("FencedLeaderEpoch", { current: Models.Epoch }),
  Schema.TaggedStruct("InvalidVersion", { current: Count, leaderAndIsr: Models.LeaderAndIsr }),
  Schema.TaggedStruct("InvalidIsr", { detail: Schema.String }),
  Schema.TaggedStruct("IneligibleReplica", {
    server: Models.ServerId,
    why: Schema.Literals(["offline", "shutting down", "registered again", "its storage failed"])
  })
]).annotate({ identifier: "IsrRejection" })
/** @see IsrRejection */
export type IsrRejection = typeof IsrRejection.Type

/** The controller's answer to an ISR change: the committed state, or why not. */
export const AdjustIsrReply = Schema.Union([
  Schema.TaggedStruct("IsrAdjusted", { leaderAndIsr: Models.LeaderAndIsr }),
  Schema.TaggedStruct("IsrRejected", { rejection: IsrRejection })
]).annotate({ identifier: "AdjustIsrReply" })
/** @see AdjustIsrReply */
export type AdjustIsrReply = typeof AdjustIsrReply.Type

/** The `ReplicaManager` service shape (one per tablet server). */
export interface Shape {
  readonly serverId: Models.ServerId
  /**
   * Applies the coordinator's instructions; a coordinator epoch below the highest seen, or a registration that is not
   * this server's current one, fails with `FencedEpoch`.
   */
  readonly leaderAndIsr: (request: LeaderAndIsrRequest) => Effect.Effect<void, ReplicaError>
  /** Appends on the tablet's leader, returning once the records are held as `acks` asks. */
  readonly append: (request: AppendRequest) => Effect.Effect<AppendResult, ReplicaError>
  /** Reads from the tablet's leader. */
  readonly read: (request: ReadRequest) => Effect.Effect<ReadResult, ReplicaError>
  /** Deletes the records below an offset on the tablet's leader, once its in-sync replicas have too. */
  readonly deleteRecords: (request: DeleteRecordsRequest) => Effect.Effect<DeleteRecordsResult, ReplicaError>
  /** Serves a follower's fetch on the leader, recording the follower's progress. */
  readonly fetch: (request: FetchRequest) => Effect.Effect<FetchResult, ReplicaError>
  /** Answers a follower's end-offset question on the leader. */
  readonly endOffsetForEpoch: (request: EndOffsetRequest) => Effect.Effect<EndOffsetResult, ReplicaError>
  /**
   * This server's log of `tablet` as its store holds it (opening it if no instruction has yet); with a fence, after
   * ending any role under a leader epoch older than the fence's.
   */
  readonly logEnd: (request: LogEndRequest) => Effect.Effect<LogEndResult, ReplicaError>
  /** Deletes this server's replicas of the request's tablets (fenced as `leaderAndIsr` is). */
  readonly stopReplica: (request: StopReplicaRequest) => Effect.Effect<void, ReplicaError>
  /**
   * What this server holds, for a new controller that resumes, and each replica's size for the cluster model
   * (fenced and addressed as `leaderAndIsr` is; the coordinator epoch is taken as the newest from then on).
   */
  readonly holdings: (request: HoldingsRequest) => Effect.Effect<HoldingsResult, ReplicaError>
  /** The state of this server's replica of `tablet`. */
  readonly replicaState: (tablet: Models.TabletId) => Effect.Effect<ReplicaState, ReplicaError>
}

/** The `ReplicaManager` service key. */
export class ReplicaManager extends Context.Service<ReplicaManager, Shape>()("@strata/replica/ReplicaManager") {}

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

/**
 * The records were written (or deleted, for a `DeleteRecords`) on the leader, but the ISR shrank below the minimum
 * before enough replicas had done the same.
 */
export class NotEnoughReplicasAfterAppend extends Schema.TaggedError<NotEnoughReplicasAfterAppend>()(
  "NotEnoughReplicasAfterAppend",
  { tablet: Schema.String, isr: Schema.Int, minIsr: Schema.Int }
) {
  /** @since 0.1.0 */
  override get message() {
    return `${this.tablet}: done on the leader, but only ${this.isr} in-sync replicas remain (${this.minIsr} required)`
  }
}

/** The records were written on the leader but not replicated as asked within the append timeout. */
export class AppendTimedOut extends Schema.TaggedError<AppendTimedOut>()("AppendTimedOut", {
  tablet: Schema.String,
  lastOffset: Models.Offset,
  timeoutMs: Schema.Int
}) {
  /** @since 0.1.0 */
  override get message() {
    return `${this.tablet}: offsets up to ${this.lastOffset} not replicated within ${this.timeoutMs} ms`
  }
}

/** The leader deleted the records, but not every in-sync replica had within the append timeout. */
export class DeleteTimedOut extends Schema.TaggedError<DeleteTimedOut>()("DeleteTimedOut", {
  tablet: Schema.String,
  offset: Models.Offset,
  timeoutMs: Schema.Int
}) {
  /** @since 0.1.0 */
  override get message() {
    return `${this.tablet}: records below ${this.offset} deleted on the leader, not on every in-sync replica within ${this.timeoutMs} ms`
  }
}

/** The leader refused an idempotent producer's batch: out of order, from an older producer epoch, or unknown. */
export class ProducerRefused extends Schema.TaggedError<ProducerRefused>()("ProducerRefused", {
  tablet: Schema.String,
  producer: Schema.Number,
  kind: Schema.Literals(["OutOfOrder", "Fenced", "UnknownProducer"]),
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `${this.tablet}: producer ${this.producer}: ${this.detail}`
  }
}

/** The tablet has no replica on this server. */
export class UnknownTablet extends Schema.TaggedError<UnknownTablet>()("UnknownTablet", { tablet: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `no replica of ${this.tablet} here`
  }
}

/** The replica's storage failed or holds data it cannot read. */
export class ReplicaStorageFailed extends Schema.TaggedError<ReplicaStorageFailed>()("ReplicaStorageFailed", {
  tablet: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `${this.tablet}: ${this.detail}`
  }
}

/** Why a replica operation failed. */
export const ErrorReason = Schema.Union([
  NotEnoughReplicas,
  NotEnoughReplicasAfterAppend,
  AppendTimedOut,
  DeleteTimedOut,
  ProducerRefused,
  Errors.NotLeader,
  Errors.FencedEpoch,
  Errors.IllegalStateTransition,
  Errors.OffsetOutOfRange,
  UnknownTablet,
  ReplicaStorageFailed,
  Log.InvalidRequest
])
/** @see ReplicaErrorReason */
export type ErrorReason = typeof ErrorReason.Type

/** The error of every `ReplicaManager` operation. */
export class ReplicaError extends Schema.TaggedError<ReplicaError>()("ReplicaError", { reason: ErrorReason }) {
  /** @since 0.1.0 */
  override get message() {
    return this.reason.message
  }
  /**
   * Whether sending the request again (after a metadata refresh, possibly to another server) may succeed. An
   * idempotent producer's retry of a written-but-unconfirmed append never duplicates it.
   */
  get retryable(): boolean {
    switch (this.reason._tag) {
      case "NotEnoughReplicas":
      case "NotEnoughReplicasAfterAppend":
      case "AppendTimedOut":
      case "DeleteTimedOut":
      case "NotLeader":
      case "FencedEpoch":
      case "UnknownTablet":
      // The replica's storage failed: it goes offline and leadership moves; the retry finds the new leader.
      case "ReplicaStorageFailed":
        return true
      default:
        return false
    }
  }
}
