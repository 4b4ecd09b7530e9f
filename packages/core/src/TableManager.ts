/**
 * The `TableManager` protocol (Faust's TableManager): registers tables, owns
 * their changelog channels, persists offsets on commit and reacts to the
 * worker's partition assignments by handing changelog partitions to recovery.
 *
 * @since 0.1.0
 */
import type * as Models from "./Models.js"
import * as Recovery from "./Recovery.js"
import type { Effect } from "effect"
import { Context, Schema } from "effect"

/** A partitioned table, or a global one that every worker holds in full. */
export type TableKind = "table" | "global"

/** What the manager knows of a registered table. */
export interface TableInfo {
  readonly name: string
  readonly kind: TableKind
  readonly partitions: number
  /** The changelog topic (default `<app>-<name>-changelog`). */
  readonly changelogTopic: string
}

/** The `TableManager` service shape. */
export interface Shape {
  /** Registers a table: `TableAlreadyExists` for a taken name, `TablesFinalized` once channels are built. */
  readonly add: (table: TableInfo) => Effect.Effect<void, TableManagerError>
  /** The registered tables, in registration order. */
  readonly tables: Effect.Effect<ReadonlyArray<TableInfo>>
  /** The table a changelog topic belongs to. */
  readonly tableOfChangelog: (topic: string) => Effect.Effect<TableInfo, TableManagerError>
  /** Called when the worker's source partitions are revoked. */
  readonly onPartitionsRevoked: (tps: ReadonlyArray<Models.TopicPartition>) => Effect.Effect<void, TableManagerError>
  /** Called when source partitions are assigned: starts recovery of the matching changelog partitions. */
  readonly onPartitionsAssigned: (tps: ReadonlyArray<Models.TopicPartition>) => Effect.Effect<void, TableManagerError>
  /** Persists the pending changelog offsets covered by a source-offset commit. */
  readonly onCommit: (offsets: ReadonlyArray<Models.TopicPartitionOffset>) => Effect.Effect<void, TableManagerError>
  /** Returns once tables are registered and channels built (at once in producer-only mode). */
  readonly waitUntilTablesRegistered: Effect.Effect<void>
  /** Returns once recovery of the current assignment completed (at once in producer-only mode). */
  readonly waitUntilRecoveryCompleted: Effect.Effect<void, TableManagerError>
}

/** The `TableManager` service key. */
export class TableManager extends Context.Service<TableManager, Shape>()("@strata/core/TableManager") {}

/** A table with this name is already registered. */
export class TableAlreadyExists extends Schema.TaggedError<TableAlreadyExists>()("TableAlreadyExists", {
  name: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `a table named ${this.name} is already registered`
  }
}

/** Tables cannot be added once the manager has built its changelog channels. */
export class TablesFinalized extends Schema.TaggedError<TablesFinalized>()("TablesFinalized", { name: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `too late to add table ${this.name}: tables are finalized once the manager starts`
  }
}

/** No table has this name or changelog topic. */
export class UnknownTable extends Schema.TaggedError<UnknownTable>()("UnknownTable", { name: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `no table named ${this.name}`
  }
}

/** A table's definition is invalid (name, partitions, codecs). */
export class InvalidTable extends Schema.TaggedError<InvalidTable>()("InvalidTable", {
  name: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `table ${this.name}: ${this.detail}`
  }
}

/** The table manager's options are invalid. */
export class InvalidOptions extends Schema.TaggedError<InvalidOptions>()("InvalidTableManagerOptions", {
  option: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `table manager: invalid option ${this.option}: ${this.detail}`
  }
}

/** Recovery of the tables failed; `reason` says why (a `ConsistencyError`, `RestoreFailed`, `BadChangelogRecord`). */
export class TableRecoveryFailed extends Schema.TaggedError<TableRecoveryFailed>()("TableRecoveryFailed", {
  reason: Recovery.ErrorReason
}) {
  /** @since 0.1.0 */
  override get message() {
    return `table recovery failed: ${this.reason.message}`
  }
}

/**
 * A commit could not persist a table partition: a changelog record it covers was refused, or the store write failed.
 * Nothing of that partition's buffered changes was persisted; the worker rewinds (`Tables.rewind`) and resumes from
 * what the stores and changelogs hold.
 */
export class CommitFailed extends Schema.TaggedError<CommitFailed>()("CommitFailed", {
  table: Schema.String,
  partition: Schema.Int,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `commit of table ${this.table} partition ${this.partition} failed: ${this.detail}`
  }
}

/** Why a table-manager operation failed. */
export const ErrorReason = Schema.Union([
  TableAlreadyExists,
  TablesFinalized,
  UnknownTable,
  InvalidTable,
  InvalidOptions,
  TableRecoveryFailed,
  CommitFailed
])
/** @see TableManagerErrorReason */
export type ErrorReason = typeof ErrorReason.Type

/** The error of every `TableManager` operation. */
export class TableManagerError extends Schema.TaggedError<TableManagerError>()("TableManagerError", {
  reason: ErrorReason
}) {
  /** @since 0.1.0 */
  override get message() {
    return this.reason.message
  }
}
