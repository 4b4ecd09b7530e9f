/**
 * The table manager's state (`Manager`: what `Tables.make` builds and every manager function shares) and its
 * table partitions' lifecycle: registering a table, opening a partition's store, persisting its buffered changes,
 * closing it, and the restore target recovery writes into.
 *
 * @internal
 */
import { type Log, type Models, Recovery, type Store, TableManager } from "@strata/core"
import type { ChangelogRecovery } from "@strata/recovery"
import { type Deferred, type Duration, Effect, Exit, Scope, type Semaphore } from "effect"
import { TableError, TableStoreFailed, validate } from "../Table.js"
import type * as ChangelogChannel from "./changelogChannel.js"
import type { ChangelogProducer } from "./changelogProducer.js"
import type { Registered } from "./collector.js"
import * as PartitionWrites from "./partitionWrites.js"
import * as RestoreTarget from "./restoreTarget.js"

/** The changelog partitions written while processing one source partition. */
export interface SourceLink {
  readonly tp: Models.TopicPartition
  /** Changelog partitions written while processing this source partition: `<table>|<partition>`. */
  readonly changelogs: Set<string>
}

/** A running table manager: what its functions share. */
export interface Manager {
  readonly app: string
  /** `worker` mode: the manager holds table state (the other modes build nothing). */
  readonly holdsState: boolean
  readonly exactlyOnce: boolean
  /** Capacity (records) of the changelog queue all tables share. */
  readonly capacity: number
  readonly settleDelay: Duration.Duration
  /** Values each partition caches of its store (0 for the memory store). */
  readonly cacheEntries: number
  readonly badRecords: "fail" | "dead-letter"
  readonly recoveryOptions: ChangelogRecovery.ChangelogRecoveryOptions
  readonly store: Store.Shape
  readonly log: Log.Shape
  /** Everything the manager opens later (partition stores, the producer, recovery) lives in this scope. */
  readonly scope: Scope.Scope
  readonly producer: ChangelogProducer
  /** Registered tables by name, and by changelog topic. */
  readonly tables: Map<string, Registered>
  readonly byChangelog: Map<string, Registered>
  /** Per source partition (`tpKey`), the changelog partitions its processing wrote since the last commit. */
  readonly links: Map<string, SourceLink>
  /** Partitions written outside `process` (no source partition to wait for): flushed by the next commit. */
  readonly unlinked: Set<string>
  /** Highest source offset (next to read) replayed from changelog headers, by source partition. */
  readonly replayed: Map<string, number>
  /** Records of one source partition are processed one at a time, in the order `process` is called. */
  readonly sourceLocks: Map<string, Semaphore.Semaphore>
  /** Completed once the tables are registered and the channel built (at once when no state is held). */
  readonly registered: Deferred.Deferred<void>
  finalized: boolean
  stopping: boolean
  stopped: boolean
  recovery: Recovery.Shape | undefined
  channel: ChangelogChannel.ChangelogChannel | undefined
  recoveryScope: Scope.Closeable | undefined
}

/** A table manager error with `reason`. */
export const managerError = (reason: TableManager.TableManagerError["reason"]) =>
  new TableManager.TableManagerError({ reason })

/** A table error with `reason`. */
export const tableError = (reason: TableError["reason"]) => new TableError({ reason })

/** A store failure of `table`, as a table error. */
export const storeFailed = (table: string) => (cause: Store.StoreError) =>
  tableError(new TableStoreFailed({ table, cause }))

/** The id of a table partition in links: `<table>|<partition>`. */
export const partitionId = (table: Registered, partition: number): string => `${table.info.name}|${partition}`

/** Every changelog partition of a table. */
export const changelogPartitionsOf = (table: Registered): Array<Models.TopicPartition> =>
  Array.from({ length: table.info.partitions }, (_, partition) => ({ topic: table.info.changelogTopic, partition }))

/** The changelog partitions of a list of table partitions. */
export const changelogTps = (list: ReadonlyArray<{ readonly table: Registered; readonly partition: number }>) =>
  list.map(({ table, partition }) => ({ topic: table.info.changelogTopic, partition }))

/** Adds a table (checked, unique by name and by changelog topic) before the manager is finalized. */
export const add = (m: Manager, info: TableManager.TableInfo) =>
  Effect.gen(function* () {
    const invalid = validate(info)
    if (invalid !== undefined) {
      return yield* Effect.fail(managerError(new TableManager.InvalidTable({ name: info.name, detail: invalid })))
    }
    if (m.finalized) return yield* Effect.fail(managerError(new TableManager.TablesFinalized({ name: info.name })))
    if (m.tables.has(info.name))
      return yield* Effect.fail(managerError(new TableManager.TableAlreadyExists({ name: info.name })))
    const other = m.byChangelog.get(info.changelogTopic)
    if (other !== undefined) {
      return yield* Effect.fail(
        managerError(
          new TableManager.InvalidTable({
            name: info.name,
            detail: `its changelog topic ${info.changelogTopic} is already table ${other.info.name}'s`
          })
        )
      )
    }
    const table: Registered = { info, partitions: new Map(), codecs: undefined }
    m.tables.set(info.name, table)
    m.byChangelog.set(info.changelogTopic, table)
    return table
  })

/** The table partitions of the tables (not global ones) matching source partitions, each once. */
export const sourceToChangelogs = (m: Manager, tps: ReadonlyArray<Models.TopicPartition>) => {
  const out: Array<{ table: Registered; partition: number }> = []
  const seen = new Set<string>()
  for (const table of m.tables.values()) {
    if (table.info.kind !== "table") continue
    for (const tp of tps) {
      const id = partitionId(table, tp.partition)
      if (tp.partition < table.info.partitions && !seen.has(id)) {
        seen.add(id)
        out.push({ table, partition: tp.partition })
      }
    }
  }
  return out
}

/** Opens a table partition's store (idempotent); sets whether it is a standby replica. */
export const openPartition = (m: Manager, table: Registered, partition: number, standby = false) =>
  Effect.gen(function* () {
    const open = table.partitions.get(partition)
    if (open !== undefined) {
      open.standby = standby
      return
    }
    const child = yield* Scope.fork(m.scope, "sequential")
    const opened = yield* m.store
      .open({ table: table.info.name, partition })
      .pipe(Scope.provide(child), Effect.mapError(storeFailed(table.info.name)))
    table.partitions.set(partition, PartitionWrites.make(opened, child, standby, m.cacheEntries))
  })

/** Closes a table partition's store, if open (its uncommitted changes stay in the changelog only). */
export const closePartition = (table: Registered, partition: number) =>
  Effect.gen(function* () {
    const w = table.partitions.get(partition)
    if (w === undefined) return
    table.partitions.delete(partition)
    yield* Scope.close(w.scope, Exit.void)
  })

const commitFailed = (
  table: Registered,
  partition: number,
  e: Log.LogError | Store.StoreError | PartitionWrites.ChangelogBehindStore
) => managerError(new TableManager.CommitFailed({ table: table.info.name, partition, detail: e.message }))

/** Persists a partition's buffered changes (their acks in) with its changelog and source offsets (plus `extra`). */
export const flushPartition = (
  table: Registered,
  w: PartitionWrites.PartitionWrites,
  partition: number,
  extra: ReadonlyArray<Models.TopicPartitionOffset>
) =>
  PartitionWrites.flush(w, { topic: table.info.changelogTopic, partition }, extra).pipe(
    Effect.mapError((e) => commitFailed(table, partition, e))
  )

/** Persists the partition `<table>|<partition>` names, if it is open. */
export const flushById = (m: Manager, id: string, extra: ReadonlyArray<Models.TopicPartitionOffset>) =>
  Effect.suspend(() => {
    const [name, p] = id.split("|") as [string, string]
    const table = m.tables.get(name)
    const w = table?.partitions.get(Number(p))
    return table === undefined || w === undefined ? Effect.void : flushPartition(table, w, Number(p), extra)
  })

/** Persists every buffered change and waits for every ack (with exactly once: nothing to do). */
const flushAll = (m: Manager) =>
  Effect.gen(function* () {
    // With exactly_once a write reaches a store only after its transaction committed: nothing to flush here.
    if (m.exactlyOnce) return
    for (const table of m.tables.values()) {
      for (const [partition, w] of table.partitions) yield* flushPartition(table, w, partition, [])
    }
    yield* m.producer.flush
    yield* m.log.flush
  })

/** The restore target over the manager's open partitions. */
export const restoreTarget = (m: Manager) =>
  RestoreTarget.make({
    partitionOf: (tp) => m.byChangelog.get(tp.topic)?.partitions.get(tp.partition),
    codecsOf: (tp) => m.byChangelog.get(tp.topic)?.codecs,
    limits: m.store.limits,
    badRecords: m.badRecords,
    deadLetter: RestoreTarget.deadLetters(m.log, `${m.app}-dead-letters`),
    replayed: m.replayed,
    // Buffered changes reach the stores with their offsets, so recovery reads current persisted offsets.
    flushAll: flushAll(m).pipe(
      Effect.mapError(
        (e) =>
          new Recovery.RestoreFailed({
            topic: "(tables)",
            partition: 0,
            detail: `flushing before recovery: ${e.message}`
          })
      )
    )
  })
