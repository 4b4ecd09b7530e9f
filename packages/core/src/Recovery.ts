/**
 * The `Recovery` protocol: restore table partitions from their changelogs
 * after every rebalance, keep standbys tailing, and report progress and stalls.
 *
 * @since 0.1.0
 */
import type * as Log from "./Log.js"
import * as Models from "./Models.js"
import type { Effect, Option, Stream } from "effect"
import { Context, Schema } from "effect"

/** Progress of one changelog partition. */
export interface PartitionProgress {
  readonly topic: string
  readonly partition: number
  readonly highwater: Models.Offset
  /** The next offset to apply. */
  readonly offset: Models.Offset
  readonly remaining: number
  readonly standby: boolean
}

/** A snapshot of recovery's progress. */
export interface Stats {
  readonly partitions: ReadonlyArray<PartitionProgress>
  readonly remaining: number
  /** Estimated milliseconds left (EWMA of the apply rate), once one batch was applied. */
  readonly etaMs: number | undefined
}

/** Why recovery reports a stall: what it was waiting for. */
export type StallKind = "no-fetch" | "paused" | "only-markers-left" | "no-flush" | "no-event"

/** What recovery announces. */
export type Event =
  | {
      readonly _tag: "Started"
      readonly active: ReadonlyArray<Models.TopicPartition>
      readonly standby: ReadonlyArray<Models.TopicPartition>
    }
  | { readonly _tag: "Progress"; readonly stats: Stats }
  | {
      readonly _tag: "BatchApplied"
      readonly topic: string
      readonly partition: number
      readonly records: number
      /** The next offset to apply after this batch. */
      readonly offset: Models.Offset
      readonly standby: boolean
    }
  | { readonly _tag: "PartitionReady"; readonly topic: string; readonly partition: number }
  | {
      /** A partition's restore failed: it is not restored or tailed (and not usable) until it is assigned again. */
      readonly _tag: "PartitionFailed"
      readonly topic: string
      readonly partition: number
      readonly reason: ErrorReason
    }
  | {
      /** A changelog record the target could not restore was set aside (dead-lettered) and skipped. */
      readonly _tag: "RecordSkipped"
      readonly topic: string
      readonly partition: number
      readonly offset: Models.Offset
      readonly detail: string
    }
  | {
      readonly _tag: "Stalled"
      readonly kind: StallKind
      readonly topic: string
      readonly partition: number
      readonly forMs: number
    }
  | { readonly _tag: "Completed" }

/** The `Recovery` service shape. */
export interface Shape {
  /** Restores `active` partitions (then tails `standby` ones) after a rebalance. */
  readonly assign: (assignment: {
    readonly active: ReadonlyArray<Models.TopicPartition>
    readonly standby: ReadonlyArray<Models.TopicPartition>
  }) => Effect.Effect<void, RecoveryError>
  /** Stops restoring or tailing partitions the worker lost. */
  readonly revoke: (tps: ReadonlyArray<Models.TopicPartition>) => Effect.Effect<void, RecoveryError>
  readonly stats: Effect.Effect<Stats>
  readonly events: Stream.Stream<Event>
  /** Returns when every active partition has reached its highwater. */
  readonly waitUntilCompleted: Effect.Effect<void, RecoveryError>
  /** Returns when these active partitions have reached their highwater (others may still be restoring). */
  readonly waitUntilReady: (tps: ReadonlyArray<Models.TopicPartition>) => Effect.Effect<void, RecoveryError>
}

/**
 * Where recovery reads changelogs from: the table manager's changelog channel —
 * one consumer for every changelog partition, feeding one bounded queue shared
 * by all tables. Partitions start paused; recovery seeks and resumes the ones it
 * restores.
 */
export interface ChangelogSource {
  /** Log start and highwater of changelog partitions. */
  readonly offsets: (
    tps: ReadonlyArray<Models.TopicPartition>
  ) => Effect.Effect<ReadonlyArray<Log.PartitionOffsets>, Log.LogError>
  /** Positions a partition at `offset` (the next record to read). */
  readonly seek: (tp: Models.TopicPartition, offset: Models.Offset) => Effect.Effect<void, Log.LogError>
  /**
   * The next offset the consumer will fetch: past transaction markers and compacted gaps, so a partition whose
   * last offsets hold no records is still seen to reach its highwater.
   */
  readonly position: (tp: Models.TopicPartition) => Effect.Effect<Models.Offset, Log.LogError>
  /** Whether the channel is fetching this partition (not paused). */
  readonly fetching: (tp: Models.TopicPartition) => Effect.Effect<boolean>
  /** Starts fetching partitions (and clears the shared queue of records fetched before). */
  readonly resume: (tps: ReadonlyArray<Models.TopicPartition>) => Effect.Effect<void>
  /** Stops fetching partitions. */
  readonly pause: (tps: ReadonlyArray<Models.TopicPartition>) => Effect.Effect<void>
  /** Up to `max` records from the shared queue, waiting for at least one. */
  readonly take: (max: number) => Effect.Effect<ReadonlyArray<Log.Record>, Log.LogError>
}

/** What recovery restores into: the tables' partition stores, as the table manager holds them. */
export interface RestoreTarget {
  /** The changelog offset a partition's store persisted (`None`: nothing yet). */
  readonly persistedOffset: (tp: Models.TopicPartition) => Effect.Effect<Option.Option<Models.Offset>, RestoreFailed>
  /**
   * Applies changelog records of one partition, in offset order, with the offset of the last, atomically. A record
   * the target cannot take (a key or value its store refuses, bytes its table cannot decode) fails the batch with
   * `BadChangelogRecord`, or, if the target sets such records aside, is skipped and reported in `skipped`.
   */
  readonly apply: (
    tp: Models.TopicPartition,
    records: ReadonlyArray<Log.Record>
  ) => Effect.Effect<ApplyResult, RestoreFailed | BadChangelogRecord>
  /** Marks a partition unusable because its restore failed (`undefined`: usable again, it restored). */
  readonly failed: (tp: Models.TopicPartition, reason: ErrorReason | undefined) => Effect.Effect<void>
  /** Empties a partition's store (to restore it from scratch). */
  readonly wipe: (tp: Models.TopicPartition) => Effect.Effect<void, RestoreFailed>
  /** Flushes the tables' write buffers and the producer, so persisted offsets are current before reading them. */
  readonly flush: Effect.Effect<void, RestoreFailed>
}

/** What applying a batch did besides writing it: the records set aside. */
export interface ApplyResult {
  readonly skipped: ReadonlyArray<{ readonly offset: Models.Offset; readonly detail: string }>
}

/** The `Recovery` service key. */
export class Recovery extends Context.Service<Recovery, Shape>()("@strata/core/Recovery") {}

/** A store claims an offset beyond its changelog's highwater: the two disagree. */
export class ConsistencyError extends Schema.TaggedError<ConsistencyError>()("ConsistencyError", {
  topic: Models.Topic,
  partition: Models.Partition,
  persisted: Schema.Int,
  highwater: Schema.Int
}) {
  /** @since 0.1.0 */
  override get message() {
    return `${this.topic}/${this.partition}: persisted offset ${this.persisted} is beyond the changelog highwater ${this.highwater}`
  }
}

/** Restoring failed while reading the changelog or writing the store. */
export class RestoreFailed extends Schema.TaggedError<RestoreFailed>()("RestoreFailed", {
  topic: Models.Topic,
  partition: Models.Partition,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `restoring ${this.topic}/${this.partition} failed: ${this.detail}`
  }
}

/** A changelog record that cannot be restored: its store refuses it, or its table cannot decode it. */
export class BadChangelogRecord extends Schema.TaggedError<BadChangelogRecord>()("BadChangelogRecord", {
  topic: Models.Topic,
  partition: Models.Partition,
  offset: Schema.Int,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `${this.topic}/${this.partition} offset ${this.offset} cannot be restored: ${this.detail}`
  }
}

/** Why recovery failed. */
export const ErrorReason = Schema.Union([ConsistencyError, RestoreFailed, BadChangelogRecord])
/** @see RecoveryErrorReason */
export type ErrorReason = typeof ErrorReason.Type

/** The error of every `Recovery` operation. */
export class RecoveryError extends Schema.TaggedError<RecoveryError>()("RecoveryError", {
  reason: ErrorReason
}) {
  /** @since 0.1.0 */
  override get message() {
    return this.reason.message
  }
}
