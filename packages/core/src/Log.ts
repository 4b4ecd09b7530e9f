/**
 * The `Log` protocol: the changelog transport, with Kafka's semantics.
 *
 * A topic has partitions; each partition is a log of records with increasing
 * offsets from its log start up to (not including) its highwater — dense, but
 * for the gaps compaction leaves in a compacted topic.
 * Changelog consumers use manual assignment, seek and pause/resume; source
 * consumers join a group and see their assignments come and go.
 *
 * @since 0.1.0
 */
import * as Errors from "./Errors.js"
import * as Models from "./Models.js"
import type { Duration, Effect, Scope, Stream } from "effect"
import { Context, Schema } from "effect"

/** How many replicas must have a record before `produce` returns. */
export type Acks = 0 | 1 | "all"

/** What `ensureTopic` creates (or checks). */
export interface TopicSpec {
  readonly topic: string
  readonly partitions: number
  /** `cleanup.policy=compact` (the default for changelogs). */
  readonly compacted?: boolean
  readonly replicationFactor?: number
  /** Extra topic configs passed to the broker as they are. */
  readonly config?: { readonly [key: string]: string }
}

/** A record header. */
export interface Header {
  readonly key: string
  readonly value: Uint8Array
}

/** A record to produce. A `null` value is a tombstone (a delete in a compacted topic). */
export interface ProducerRecord {
  readonly topic: string
  readonly partition: number
  readonly key: Uint8Array | null
  readonly value: Uint8Array | null
  readonly headers?: ReadonlyArray<Header>
  /** Milliseconds since the epoch; the log assigns one when absent. */
  readonly timestamp?: number
}

/** A record read from the log. */
export interface Record {
  readonly topic: string
  readonly partition: number
  readonly offset: Models.Offset
  readonly key: Uint8Array | null
  readonly value: Uint8Array | null
  readonly headers: ReadonlyArray<Header>
  readonly timestamp: number
}

/** Records fetched from one partition, in offset order, with the partition's highwater at fetch time. */
export interface Batch {
  readonly topic: string
  readonly partition: number
  readonly records: ReadonlyArray<Record>
  readonly highwater: Models.Offset
}

/** Log start (earliest offset still stored) and highwater (next offset) of a partition. */
export interface PartitionOffsets {
  readonly topic: string
  readonly partition: number
  readonly logStart: Models.Offset
  readonly highwater: Models.Offset
}

/** Options of `produce`. */
export interface ProduceOptions {
  readonly acks?: Acks
}

/** Options of `Log.producer`. */
export interface ProducerOptions {
  /** Acks of every send (default `"all"`). */
  readonly acks?: Acks
}

/**
 * A pipelined producer (Kafka's `send` with its future). `send` checks the records, queues them and returns at once
 * (waiting only while the producer's buffer is full) with an effect that waits for their offsets. Within a
 * partition, records are appended in the order sent.
 *
 * The first failure is sticky: once a send fails, every send still queued behind it fails with the same error and
 * appends nothing, and so does every later `send`. So no partition ever holds a record of this producer sent after
 * one of its records that the log refused. Across partitions there is no such promise: one request to several
 * partitions may be appended to some and refused by others (Kafka's produce is atomic per partition only). A caller
 * that saw a failure starts again from what the log holds, with a new producer.
 */
export interface Producer {
  /**
   * Queues records; fails at once (appending nothing of this call) for an invalid record or after an earlier
   * failure. The returned effect gives the offsets in the order given (`-1` each with acks 0).
   */
  readonly send: (
    records: ReadonlyArray<ProducerRecord>
  ) => Effect.Effect<Effect.Effect<ReadonlyArray<number>, LogError>, LogError>
  /** Waits until every record sent so far is acknowledged; fails with the producer's failure, if it has one. */
  readonly flush: Effect.Effect<void, LogError>
  /** The failure that stopped this producer, if any. */
  readonly failure: Effect.Effect<LogError | undefined>
}

/** Options of `Log.transactionalProducer`. */
export interface TransactionalProducerOptions {
  /**
   * Names the producer across restarts (Kafka's `transactional.id`): opening a producer with the id of another
   * fences that one (its open transaction is aborted and its later calls fail).
   */
  readonly transactionalId: string
}

/** What `TransactionalProducer.commit` commits besides the records sent: source offsets of a group member. */
export interface TransactionOffsets {
  /** The member whose group the offsets are committed for; refused when it is no longer in the group. */
  readonly group: GroupConsumer
  /** The next offset to read for each source partition. */
  readonly offsets: ReadonlyArray<Models.TopicPartitionOffset>
}

/**
 * A producer whose sends form transactions (Kafka's transactional producer, EOS v2): the records sent since the
 * last commit or abort, and the source offsets given to `commit`, become visible together or not at all. A
 * `read_committed` consumer never sees the records of an aborted transaction, nor those of an open one. Sends are
 * pipelined as `LogProducer.send`'s, with the same sticky first failure; after a failure only `abort` (or closing
 * the producer, which aborts what is open) is left.
 */
export interface TransactionalProducer {
  /** Queues records in the current transaction (begun by the first send after a commit or abort). */
  readonly send: Producer["send"]
  /** Waits for every record sent, then commits them with the source offsets. Fails (committing nothing) if any failed. */
  readonly commit: (offsets: TransactionOffsets) => Effect.Effect<void, LogError>
  /** Aborts the open transaction, if any: nothing it sent is ever visible to a `read_committed` consumer. */
  readonly abort: Effect.Effect<void, LogError>
}

/** Which records a consumer reads: everything appended, or only committed transactions' (and non-transactional) records. */
export type IsolationLevel = "read_uncommitted" | "read_committed"

/** Options of `Log.offsets`. */
export interface OffsetsOptions {
  /** With `"read_committed"` the highwater is the last stable offset: below any open transaction (default uncommitted). */
  readonly isolation?: IsolationLevel
}

/** Options of a consumer. */
export interface ConsumerOptions {
  /** Which records to read (default `"read_uncommitted"`). */
  readonly isolation?: IsolationLevel
  /** Most records one batch may carry (default 1000). */
  readonly maxBatchRecords?: number
  /** How long a fetch waits for new records before yielding nothing (the stream keeps waiting). */
  readonly maxWait?: Duration.Input
}

/**
 * A changelog consumer: no group, manual assignment. Its `batches` stream pulls
 * only when the caller pulls (a slow caller stops the fetching), never delivers
 * records of a paused or unassigned partition after `pause`/`unassign` return,
 * and fails with `OffsetOutOfRange` rather than silently resetting a position.
 */
export interface Consumer {
  /** Adds partitions; each starts at its log start unless sought. */
  readonly assign: (tps: ReadonlyArray<Models.TopicPartition>) => Effect.Effect<void, LogError>
  /** Removes partitions (their positions are forgotten). */
  readonly unassign: (tps: ReadonlyArray<Models.TopicPartition>) => Effect.Effect<void, LogError>
  /** The partitions assigned now. */
  readonly assignment: Effect.Effect<ReadonlyArray<Models.TopicPartition>>
  /** Sets the next offset to read; out-of-range offsets fail when sought or fetched. */
  readonly seek: (tp: Models.TopicPartition, offset: Models.Offset) => Effect.Effect<void, LogError>
  /** The next offset to be read from an assigned partition. */
  readonly position: (tp: Models.TopicPartition) => Effect.Effect<Models.Offset, LogError>
  /** Stops delivering records of these partitions until resumed. */
  readonly pause: (tps: ReadonlyArray<Models.TopicPartition>) => Effect.Effect<void>
  /** Delivers again from where each partition stopped. */
  readonly resume: (tps: ReadonlyArray<Models.TopicPartition>) => Effect.Effect<void>
  /** The paused partitions. */
  readonly paused: Effect.Effect<ReadonlyArray<Models.TopicPartition>>
  /** Fetched batches, one partition each, pulled on demand; never ends on its own. */
  readonly batches: Stream.Stream<Batch, LogError>
}

/** A change of a group member's assignment. */
export type GroupEvent =
  | { readonly _tag: "Assigned"; readonly partitions: ReadonlyArray<Models.TopicPartition> }
  | { readonly _tag: "Revoked"; readonly partitions: ReadonlyArray<Models.TopicPartition> }

/** Options of a group consumer. */
export interface GroupConsumerOptions extends ConsumerOptions {
  readonly groupId: string
  readonly topics: ReadonlyArray<string>
}

/** One member of a consumer group and the partitions the group gave it. */
export interface GroupMemberInfo {
  readonly memberId: string
  readonly partitions: ReadonlyArray<Models.TopicPartition>
}

/** The group as one member sees it: its own id and every member (itself included) with its partitions, by id. */
export interface GroupMembership {
  readonly memberId: string
  readonly members: ReadonlyArray<GroupMemberInfo>
}

/**
 * A source-topic consumer in a consumer group. Partitions are assigned by the
 * group; every change is announced on `events` (revocations before the matching
 * assignments). A newly assigned partition starts at its committed offset, or at
 * its log start when nothing was committed.
 */
export interface GroupConsumer {
  readonly events: Stream.Stream<GroupEvent, LogError>
  readonly assignment: Effect.Effect<ReadonlyArray<Models.TopicPartition>>
  readonly batches: Stream.Stream<Batch, LogError>
  readonly pause: (tps: ReadonlyArray<Models.TopicPartition>) => Effect.Effect<void>
  readonly resume: (tps: ReadonlyArray<Models.TopicPartition>) => Effect.Effect<void>
  /** Sets the next offset to read of an assigned partition (a worker rewinds with it after a failed commit). */
  readonly seek: (tp: Models.TopicPartition, offset: Models.Offset) => Effect.Effect<void, LogError>
  /** The next offset to be read from an assigned partition. */
  readonly position: (tp: Models.TopicPartition) => Effect.Effect<Models.Offset, LogError>
  /** Commits the next offset to read for each partition. */
  readonly commit: (offsets: ReadonlyArray<Models.TopicPartitionOffset>) => Effect.Effect<void, LogError>
  /** The group's committed offsets (absent partitions have none). */
  readonly committed: (
    tps: ReadonlyArray<Models.TopicPartition>
  ) => Effect.Effect<ReadonlyArray<Models.TopicPartitionOffset>, LogError>
  /**
   * The group's members and their partitions as the group knows them now (a worker places standby replicas from
   * it). During a rebalance it may lag the members' own views; it settles with the group.
   */
  readonly membership: Effect.Effect<GroupMembership, LogError>
}

/** The `Log` service shape. */
export interface Shape {
  /** The backend's name, e.g. `"memory"` or `"kafka"`. */
  readonly backend: string
  /** Creates the topic, or checks that it exists with the same partition count (`TopicMismatch` if not). */
  readonly ensureTopic: (spec: TopicSpec) => Effect.Effect<void, LogError>
  /** Appends one record and returns its offset (`-1` with acks 0, when the offset is unknown). */
  readonly produce: (record: ProducerRecord, options?: ProduceOptions) => Effect.Effect<number, LogError>
  /** Appends many records; offsets are returned in the order given. */
  readonly produceBatch: (
    records: ReadonlyArray<ProducerRecord>,
    options?: ProduceOptions
  ) => Effect.Effect<ReadonlyArray<number>, LogError>
  /** Waits until everything produced so far is acknowledged. */
  readonly flush: Effect.Effect<void, LogError>
  /** A pipelined producer, closed with its scope (closing waits for what it sent). */
  readonly producer: (options?: ProducerOptions) => Effect.Effect<Producer, LogError, Scope.Scope>
  /** A transactional producer, closed with its scope (closing aborts an open transaction). */
  readonly transactionalProducer: (
    options: TransactionalProducerOptions
  ) => Effect.Effect<TransactionalProducer, LogError, Scope.Scope>
  /** Log start and highwater of many partitions in one round trip. */
  readonly offsets: (
    tps: ReadonlyArray<Models.TopicPartition>,
    options?: OffsetsOptions
  ) => Effect.Effect<ReadonlyArray<PartitionOffsets>, LogError>
  /** Deletes every record below `offset` (Kafka's DeleteRecords): the log start moves up. */
  readonly deleteRecords: (tp: Models.TopicPartition, offset: Models.Offset) => Effect.Effect<void, LogError>
  /** A changelog consumer, closed with its scope. */
  readonly consumer: (options?: ConsumerOptions) => Effect.Effect<Consumer, LogError, Scope.Scope>
  /** A group member, leaving the group when its scope closes. */
  readonly groupConsumer: (options: GroupConsumerOptions) => Effect.Effect<GroupConsumer, LogError, Scope.Scope>
}

/** The `Log` service key. */
export class Log extends Context.Service<Log, Shape>()("@strata/core/Log") {}

/** Options of `LogFaults.compact`. */
export interface CompactOptions {
  /**
   * Cleans only the records below this offset (default: the highwater, the whole
   * partition), as Kafka's cleaner never cleans past the first uncleanable
   * offset (its active segment): a record stays when its key's later records
   * are all at or past `until`.
   */
  readonly until?: Models.Offset
  /**
   * Also removes tombstones that are their key's latest cleaned record, as the
   * cleaner does once `delete.retention.ms` has passed (default `false`: kept).
   * The partition's last record is never removed (it is in the active segment).
   */
  readonly removeTombstones?: boolean
}

/**
 * Fault injection for a log backend, used by tests: what the broker can do to
 * a partition behind the consumers' backs.
 */
export interface FaultsShape {
  /**
   * Compacts a partition of a compacted topic as Kafka's log cleaner does:
   * removes every record (below `until`) whose key has a later record, keeping
   * the latest per key; records with no key are kept. The remaining records
   * keep their offsets (gaps); log start and highwater do not move; a consumer
   * positioned on a removed offset gets the next remaining record. Fails with
   * `InvalidRequest` for a topic not created with `compacted: true`. Returns
   * the removed offsets.
   */
  readonly compact: (
    tp: Models.TopicPartition,
    options?: CompactOptions
  ) => Effect.Effect<ReadonlyArray<Models.Offset>, LogError>
  /** The records a partition holds now, in offset order (with the gaps compaction left). */
  readonly records: (tp: Models.TopicPartition) => Effect.Effect<ReadonlyArray<Record>, LogError>
  /**
   * Makes the next `count` appends that touch a partition of `topic` fail with a retryable `LogIoError`, appending
   * nothing of that call (a broker that lost its leader, say). Applies to `produce`, `produceBatch` and producers.
   */
  readonly failAppends: (topic: string, count: number) => Effect.Effect<void>
}

/** The `LogFaults` service key. */
export class Faults extends Context.Service<Faults, FaultsShape>()("@strata/core/LogFaults") {}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/** The topic does not exist. */
export class UnknownTopic extends Schema.TaggedError<UnknownTopic>()("UnknownTopic", { topic: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `topic ${this.topic} does not exist`
  }
}

/** The partition does not exist in an existing topic. */
export class UnknownPartition extends Schema.TaggedError<UnknownPartition>()("UnknownPartition", {
  topic: Schema.String,
  partition: Schema.Int,
  partitions: Schema.Int
}) {
  /** @since 0.1.0 */
  override get message() {
    return `partition ${this.partition} does not exist in topic ${this.topic} (it has ${this.partitions})`
  }
}

/** `ensureTopic` found the topic with a different partition count. */
export class TopicMismatch extends Schema.TaggedError<TopicMismatch>()("TopicMismatch", {
  topic: Models.Topic,
  expectedPartitions: Schema.Int,
  actualPartitions: Schema.Int
}) {
  /** @since 0.1.0 */
  override get message() {
    return `topic ${this.topic} exists with ${this.actualPartitions} partitions, expected ${this.expectedPartitions}`
  }
}

/** A partition was used by a consumer that does not have it assigned. */
export class NotAssigned extends Schema.TaggedError<NotAssigned>()("NotAssigned", {
  topic: Models.Topic,
  partition: Models.Partition
}) {
  /** @since 0.1.0 */
  override get message() {
    return `${this.topic}/${this.partition} is not assigned to this consumer`
  }
}

/** A topic spec, record or option was invalid. */
export class InvalidRequest extends Schema.TaggedError<InvalidRequest>()("InvalidRequest", { detail: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `invalid request: ${this.detail}`
  }
}

/** A record is larger than the log accepts. */
export class RecordTooLarge extends Schema.TaggedError<RecordTooLarge>()("RecordTooLarge", {
  topic: Schema.String,
  /** The record's partition, when the limit is the partition's (Kafka's topic `max.message.bytes`). */
  partition: Schema.optional(Schema.Int),
  size: Schema.Int,
  max: Schema.Int
}) {
  /** @since 0.1.0 */
  override get message() {
    const where = this.partition === undefined ? this.topic : `${this.topic}/${this.partition}`
    return `a record of ${this.size} bytes for ${where} exceeds the limit of ${this.max} bytes`
  }
}

/** The brokers could not be reached (after retries). */
export class BrokerUnreachable extends Schema.TaggedError<BrokerUnreachable>()("BrokerUnreachable", {
  brokers: Schema.Array(Schema.String),
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `cannot reach brokers ${this.brokers.join(", ")}: ${this.detail}`
  }
}

/**
 * The brokers refused the client's credentials (a SASL mechanism, user or password they do not accept), or the TLS
 * handshake failed (a certificate that does not verify, a server name it does not name). Not retried: the same
 * credentials fail again. `detail` never holds a password or a key.
 *
 * @since 0.1.0
 */
export class AuthenticationFailed extends Schema.TaggedError<AuthenticationFailed>()("AuthenticationFailed", {
  brokers: Schema.Array(Schema.String),
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `authentication with brokers ${this.brokers.join(", ")} failed: ${this.detail}`
  }
}

/** The consumer or producer was used after its scope closed. */
export class Closed extends Schema.TaggedError<Closed>()("LogClosed", { what: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `${this.what} is closed`
  }
}

/** A transactional producer or group member was superseded: a newer one holds its id or its partitions. */
export class Fenced extends Schema.TaggedError<Fenced>()("Fenced", { detail: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `fenced: ${this.detail}`
  }
}

/** Any other transport failure. */
export class IoError extends Schema.TaggedError<IoError>()("LogIoError", {
  operation: Schema.String,
  detail: Schema.String,
  retryable: Schema.Boolean
}) {
  /** @since 0.1.0 */
  override get message() {
    return `log ${this.operation} failed: ${this.detail}`
  }
}

/**
 * The backend does not offer the operation (its capabilities say so): `operation` names it, `backend` the log.
 *
 * @since 0.1.0
 */
export class Unsupported extends Schema.TaggedError<Unsupported>()("Unsupported", {
  operation: Schema.String,
  backend: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `the ${this.backend} log does not offer ${this.operation}`
  }
}

/** Why a log operation failed. */
export const ErrorReason = Schema.Union([
  UnknownTopic,
  UnknownPartition,
  TopicMismatch,
  NotAssigned,
  Errors.OffsetOutOfRange,
  InvalidRequest,
  RecordTooLarge,
  BrokerUnreachable,
  AuthenticationFailed,
  Closed,
  Fenced,
  IoError,
  Unsupported
])
/** @see LogErrorReason */
export type ErrorReason = typeof ErrorReason.Type

/** The error of every `Log` operation. */
export class LogError extends Schema.TaggedError<LogError>()("LogError", { reason: ErrorReason }) {
  /** @since 0.1.0 */
  override get message() {
    return this.reason.message
  }
  /** Whether trying again may succeed. */
  get retryable(): boolean {
    return this.reason._tag === "BrokerUnreachable" || (this.reason._tag === "LogIoError" && this.reason.retryable)
  }
}

/** Wraps a reason into a `LogError`. */
export const logError = (reason: ErrorReason): LogError => new LogError({ reason })
