/**
 * The table manager (Faust's `TableManager`; docs/ARCHITECTURE.md, "How a record flows") on core's `Store`
 * and `Log`: registers tables, builds their changelog channel, hands changelog
 * partitions to recovery on assignment, and persists offsets on commit.
 *
 * Writes: `set` / `delete` land in the partition's write buffer at once (the
 * next record reads them) and their changelog records (key = table key,
 * partition = the source partition) are handed to a pipelined producer without
 * waiting for the ack. Nothing reaches the store until the source partition
 * commits: `onCommit` waits for the acks, then writes the buffered changes, the
 * changelog offset they reach and the committed source offset in **one atomic
 * store batch** — so after a crash a store always equals its changelog replayed
 * up to the persisted offset. A refused changelog record fails the commit and
 * every later write until `rewind`.
 *
 * Records of one source partition are processed one at a time, in the order
 * `process` is called, so a read-modify-write never races another record of
 * the same partition.
 *
 * Beyond Faust: pending offsets are linked to the source partition whose
 * processing wrote them, so committing a source partition flushes every
 * changelog partition it wrote to (Faust keys them by the changelog partition
 * and looks them up by the source partition, so they are lost when the two
 * differ). Each changelog record carries the source record it came from
 * (header `strata-source`), and `process` sends all writes of one source
 * record in one batch; after recovery `resumeOffset` says where to resume the
 * source so that no record is applied twice.
 *
 * With `processingGuarantee: "exactly_once"` the changelog producer is
 * transactional (Kafka Streams' EOS v2): `commit` commits the transaction with
 * the source offsets first and only then writes the stores, every restore reads
 * committed records only, and a failed commit aborts the transaction. So a
 * source record's writes reach the changelogs all together or not at all, also
 * when they span several table partitions.
 *
 * @since 0.1.0
 */
import {
  CommitFailed,
  type GroupConsumer,
  InvalidTable,
  InvalidTableManagerOptions,
  type Header,
  Log,
  type LogError,
  type LogShape,
  type Offset,
  OptionSchemas,
  type ProducerRecord,
  type RecoveryShape,
  RestoreFailed,
  Store,
  type StoreError,
  type StoreShape,
  TableAlreadyExists,
  type TableInfo,
  TableManager,
  TableManagerError,
  type TableManagerShape,
  TableRecoveryFailed,
  TablesFinalized,
  type TopicPartition,
  type TopicPartitionOffset,
  tpKey,
  UnknownTable
} from "@strata/core"
import { ChangelogRecovery } from "@strata/recovery"
import {
  Config,
  Context,
  Deferred,
  Duration,
  Effect,
  Exit,
  Layer,
  Option,
  Random,
  Schema,
  Scope,
  Semaphore,
  type Stream
} from "effect"
import * as ChangelogChannel from "./internal/changelogChannel.js"
import * as ChangelogProducer from "./internal/changelogProducer.js"
import { type Collector, CurrentCollector, make as makeCollector, type Registered } from "./internal/collector.js"
import * as PartitionWrites from "./internal/partitionWrites.js"
import type { Change } from "./internal/partitionWrites.js"
import * as RestoreTarget from "./internal/restoreTarget.js"
import * as Handles from "./internal/tableHandle.js"
import {
  ChangelogFailed,
  type Codecs,
  codecs as codecsOf,
  changelogTopicOf,
  InvalidPartition,
  PartitionNotAvailable,
  PartitionRestoreFailed,
  type TableDef,
  TableError,
  TableStoreFailed,
  validate
} from "./Table.js"

// ---------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------

/** How the worker uses its tables: `producer-only` and `client-only` hold no table state. */
export type Mode = "worker" | "producer-only" | "client-only"

/**
 * What a commit promises. `at_least_once` (the default): source records may be processed again after a crash, but
 * their table effects apply exactly once (the stores hold the source offsets with the data). `exactly_once`: the
 * changelog writes and the source offsets commit in one transaction, and restores read committed data only.
 */
export type ProcessingGuarantee = "at_least_once" | "exactly_once"

/** Options of the table manager. */
export interface TablesOptions {
  /** The app id: default changelog topics are `<app>-<table>-changelog`. */
  readonly app: string
  /** Default `worker`; in the other modes the waits return at once and `start` builds nothing. */
  readonly mode?: Mode
  /** Capacity (records) of the changelog queue all tables share (default 4096). */
  readonly streamBufferMaxsize?: number
  /** Pause at start before building channels, as Faust's (default 1 second). */
  readonly settleDelay?: Duration.Input
  /** Acks of changelog writes (default `all`; `exactly_once` always uses `all`). */
  readonly acks?: 0 | 1 | "all"
  /** Default `at_least_once`. */
  readonly processingGuarantee?: ProcessingGuarantee
  /**
   * The changelog producer's transactional id with `exactly_once` (default `<app>-` and a random suffix, new per
   * manager). A stable id lets a restarted worker fence its predecessor's open transaction at once; without one
   * that transaction is aborted by the broker's transaction timeout.
   */
  readonly transactionalId?: string
  /**
   * Values each table partition keeps of what its store holds, so a read of a recent key does not go to the store
   * (default 10000 per partition, least recently used dropped first; 0 turns it off; the memory store keeps none).
   */
  readonly cacheEntries?: number
  /** Options of the recovery the manager starts. */
  readonly recovery?: ChangelogRecovery.ChangelogRecoveryOptions
  /**
   * A changelog record a restore cannot apply (its key or value beyond the store's limits, or not decodable by its
   * table's schema): `"fail"` (default) sets its partition aside with `BadChangelogRecord` naming the offset (the
   * partition is unusable until a restore succeeds); `"dead-letter"` sends it to `<app>-dead-letters` (headers
   * `strata-dead-letter-from` and `strata-dead-letter-reason` say where from and why) and restores the rest.
   */
  readonly badRecords?: "fail" | "dead-letter"
}

/** The settings `config` reads, validated with Schema (a bad value fails naming its key). */
export const TablesSettings = Schema.Struct({
  app: Schema.String.check(Schema.isMinLength(1)),
  mode: Schema.optional(Schema.Literals(["worker", "producer-only", "client-only"])),
  streamBufferMaxsize: Schema.optional(Schema.Int.check(Schema.isGreaterThan(0))),
  settleDelayMs: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))),
  acks: Schema.optional(Schema.Literals(["0", "1", "all"])),
  processingGuarantee: Schema.optional(Schema.Literals(["at_least_once", "exactly_once"])),
  transactionalId: Schema.optional(Schema.String.check(Schema.isMinLength(1))),
  recoveryDelayMs: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))),
  recoveryBufferSize: Schema.optional(Schema.Int.check(Schema.isGreaterThan(0))),
  onInconsistency: Schema.optional(Schema.Literals(["fail", "wipe"])),
  badRecords: Schema.optional(Schema.Literals(["fail", "dead-letter"]))
})

/**
 * The manager's options from configuration under `path` (default `tables`): `app`, `mode`,
 * `streamBufferMaxsize`, `settleDelayMs`, `acks`, `processingGuarantee`, `transactionalId`, `recoveryDelayMs`,
 * `recoveryBufferSize`, `onInconsistency`, `badRecords`.
 */
export const config = (path = "tables"): Config.Config<TablesOptions> =>
  Config.map(Config.schema(TablesSettings, path), (s) => ({
    app: s.app,
    ...(s.mode === undefined ? {} : { mode: s.mode }),
    ...(s.streamBufferMaxsize === undefined ? {} : { streamBufferMaxsize: s.streamBufferMaxsize }),
    ...(s.settleDelayMs === undefined ? {} : { settleDelay: Duration.millis(s.settleDelayMs) }),
    ...(s.acks === undefined
      ? {}
      : { acks: s.acks === "all" ? ("all" as const) : s.acks === "1" ? (1 as const) : (0 as const) }),
    ...(s.processingGuarantee === undefined ? {} : { processingGuarantee: s.processingGuarantee }),
    ...(s.transactionalId === undefined ? {} : { transactionalId: s.transactionalId }),
    ...(s.badRecords === undefined ? {} : { badRecords: s.badRecords }),
    recovery: {
      ...(s.recoveryDelayMs === undefined ? {} : { recoveryDelay: Duration.millis(s.recoveryDelayMs) }),
      ...(s.recoveryBufferSize === undefined ? {} : { recoveryBufferSize: s.recoveryBufferSize }),
      ...(s.onInconsistency === undefined ? {} : { onInconsistency: s.onInconsistency })
    }
  }))

const { AnyDurationInput, PositiveInt } = OptionSchemas

/** The options `make` takes, checked by this one schema (a bad option fails naming it). */
export const TablesOptionsSchema = Schema.Struct({
  app: Schema.String.check(Schema.isMinLength(1)),
  mode: Schema.optional(Schema.Literals(["worker", "producer-only", "client-only"])),
  streamBufferMaxsize: Schema.optional(PositiveInt),
  settleDelay: Schema.optional(AnyDurationInput),
  acks: Schema.optional(Schema.Literals([0, 1, "all"])),
  processingGuarantee: Schema.optional(Schema.Literals(["at_least_once", "exactly_once"])),
  transactionalId: Schema.optional(Schema.String.check(Schema.isMinLength(1))),
  cacheEntries: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))),
  badRecords: Schema.optional(Schema.Literals(["fail", "dead-letter"])),
  recovery: Schema.optional(ChangelogRecovery.ChangelogRecoveryOptionsSchema)
})

/** Checks options given in code (configuration is checked by `config`); the error names each bad option. */
const decodeOptions = (options: TablesOptions): Effect.Effect<TablesOptions, TableManagerError> =>
  OptionSchemas.decodeOptions(TablesOptionsSchema, { exact: true })(options).pipe(
    Effect.as(options),
    Effect.mapError((bad) => {
      const { option, value, detail } = OptionSchemas.summary(bad)
      return new TableManagerError({
        reason: new InvalidTableManagerOptions({ option, detail: `${detail} (got ${value})` })
      })
    })
  )

// ---------------------------------------------------------------------------
// Table handles
// ---------------------------------------------------------------------------

/** Where a read or write goes: an explicit partition, else the current source record's, else the key's hash. */
export interface PartitionOption {
  readonly partition?: number
}

/** A registered table. Reads see the worker's own uncommitted writes. */
export interface TableHandle<K, V> {
  readonly info: TableInfo
  readonly get: (key: K, options?: PartitionOption) => Effect.Effect<Option.Option<V>, TableError>
  readonly has: (key: K, options?: PartitionOption) => Effect.Effect<boolean, TableError>
  readonly set: (key: K, value: V, options?: PartitionOption) => Effect.Effect<void, TableError>
  readonly delete: (key: K, options?: PartitionOption) => Effect.Effect<void, TableError>
  /** Reads, applies `f` to the current value (if any) and writes the result. */
  readonly update: (
    key: K,
    f: (current: Option.Option<V>) => V,
    options?: PartitionOption
  ) => Effect.Effect<V, TableError>
  /**
   * Every entry of a partition, in key-byte order (including the worker's uncommitted writes), as of one moment: a
   * commit running meanwhile waits for the store scan, so its values are read from either the buffer or the store.
   */
  readonly entries: (partition: number) => Effect.Effect<ReadonlyArray<readonly [K, V]>, TableError>
  /** `entries` as a stream. */
  readonly scan: (partition: number) => Stream.Stream<readonly [K, V], TableError>
}

// ---------------------------------------------------------------------------
// Service
// ---------------------------------------------------------------------------

/** The table manager. */
export interface TablesShape {
  /** Core's `TableManager` protocol (also provided under its own key by the layer). */
  readonly manager: TableManagerShape
  /** What `commit` promises (the `processingGuarantee` option). */
  readonly processingGuarantee: ProcessingGuarantee
  /**
   * Commits processed source records: `at_least_once` persists every table partition they wrote (acks in, one
   * atomic store batch each), then commits the offsets to the group (a refusal is logged: the stores hold them);
   * `exactly_once` commits the changelog transaction with the offsets, then persists the stores. A failure is a
   * `CommitFailed`: nothing of the failed part is persisted, and `rewind` starts again from what is.
   */
  readonly commit: (
    group: GroupConsumer,
    offsets: ReadonlyArray<TopicPartitionOffset>
  ) => Effect.Effect<void, TableManagerError>
  /** Registers a table definition and returns its handle. */
  readonly register: <K, V>(def: TableDef<K, V>) => Effect.Effect<TableHandle<K, V>, TableManagerError>
  /**
   * Starts the manager: after `settleDelay` it finalizes the tables, ensures their changelog topics, builds
   * the changelog channel (one consumer, one shared bounded queue), pauses every changelog partition and
   * starts recovery. If `stop` ran first it builds and starts nothing.
   */
  readonly start: Effect.Effect<void, TableManagerError | LogError>
  /** Stops in order: changelog fetcher, recovery, then each table (stores closed). Idempotent. */
  readonly stop: Effect.Effect<void>
  /**
   * Runs `effect` as the processing of one source record: its writes go to the source record's partition, are
   * visible to the next record at once, are sent in one batch carrying the source offset (acks are awaited by the
   * commit), and are linked to the source partition for `onCommit`. Calls for one source partition run one at a
   * time, in the order made.
   */
  readonly process: <A, E, R>(
    source: TopicPartitionOffset,
    effect: Effect.Effect<A, E, R>
  ) => Effect.Effect<A, E | TableError, R>
  /**
   * Runs `f` for each source record of one source partition, in order, as `process` would (each record's writes
   * visible to the next, each changelog record naming its source record), and sends all their writes in one batch
   * at the end: nothing of the batch is sent if `f` fails on any record.
   */
  readonly processBatch: <S extends TopicPartitionOffset, E, R>(
    sources: ReadonlyArray<S>,
    f: (source: S) => Effect.Effect<void, E, R>
  ) => Effect.Effect<void, E | TableError, R>
  /**
   * After a failed commit: forgets every write not yet in a store, replaces the producer and restores every open
   * partition again from its store and changelog. Then `resumeOffset` says where to resume each source partition.
   */
  readonly rewind: Effect.Effect<void>
  /**
   * Where to resume consuming a source partition so no record is applied twice: one past the last source
   * offset whose writes are in the tables (committed, or replayed from the changelog by recovery).
   */
  readonly resumeOffset: (source: TopicPartition) => Effect.Effect<Option.Option<Offset>, TableError>
  /** The changelog topics of the registered tables. */
  readonly changelogTopics: Effect.Effect<ReadonlySet<string>>
  /** The shared changelog queue's capacity and current size (records). */
  readonly changelogQueue: Effect.Effect<{ readonly capacity: number; readonly size: number }>
  /** The recovery the manager started, once started: its `events` and `stats` show the progress. */
  readonly recovery: Effect.Effect<Option.Option<RecoveryShape>>
  /**
   * Source partitions assigned to this worker: `active` ones are restored then processed, `standby` ones are
   * restored and kept tailing their changelogs (not writable) so a promotion replays only the lag.
   * `manager.onPartitionsAssigned(tps)` is `assign({ active: tps })`.
   */
  readonly assign: (assignment: {
    readonly active: ReadonlyArray<TopicPartition>
    readonly standby?: ReadonlyArray<TopicPartition>
  }) => Effect.Effect<void, TableManagerError>
  /** Returns once the tables of these source partitions are restored (others may still be restoring). */
  readonly waitUntilReady: (tps: ReadonlyArray<TopicPartition>) => Effect.Effect<void, TableManagerError>
}

/** The `Tables` service key; its layer also provides core's `TableManager`. */
export class Tables extends Context.Service<Tables, TablesShape>()("@strata/tables/Tables") {}

// ---------------------------------------------------------------------------
// Implementation
// ---------------------------------------------------------------------------

interface SourceLink {
  readonly tp: TopicPartition
  /** Changelog partitions written while processing this source partition: `<table>|<partition>`. */
  readonly changelogs: Set<string>
}

/** Recovery's default `recoveryBufferSize` and `standbyBufferSize`. */
const DEFAULT_RESTORE_BATCH = 1000

const managerError = (reason: TableManagerError["reason"]) => new TableManagerError({ reason })
const tableError = (reason: TableError["reason"]) => new TableError({ reason })
const storeFailed = (table: string) => (cause: StoreError) => tableError(new TableStoreFailed({ table, cause }))

/** The highest offset among `offsets[i]` for the given indexes (`-1` when none is known). */
/** A partition one send writes: its changes in order and their indexes in the send. */
interface Target {
  readonly table: Registered
  readonly partition: number
  readonly w: PartitionWrites.PartitionWrites
  readonly changes: Array<Change>
  readonly indexes: Array<number>
}

/** The fixed order partitions' permits are taken in: by table name, then partition. */
const compareTargets = (a: Target, b: Target): number =>
  a.table.info.name < b.table.info.name ? -1 : a.table.info.name > b.table.info.name ? 1 : a.partition - b.partition

/** A collector's changelog records, each naming the source record that wrote it (one header per source record). */
const changelogRecords = (collector: Collector): Array<ProducerRecord> => {
  let lastSource: TopicPartitionOffset | undefined
  let headers: ReadonlyArray<Header> = []
  let prefixOf: TopicPartitionOffset | undefined
  let prefix = ""
  return collector.writes.map((w) => {
    if (w.source !== lastSource) {
      lastSource = w.source
      if (w.source === undefined) headers = []
      else {
        if (prefixOf === undefined || prefixOf.partition !== w.source.partition || prefixOf.topic !== w.source.topic) {
          prefixOf = w.source
          prefix = RestoreTarget.sourceHeaderPrefix(w.source)
        }
        headers = [RestoreTarget.sourceHeaderAt(prefix, w.source.offset)]
      }
    }
    return {
      topic: w.table.info.changelogTopic,
      partition: w.partition,
      key: w.change.key,
      value: w.change.value,
      headers
    }
  })
}

const highestOf = (offsets: ReadonlyArray<number>, indexes: ReadonlyArray<number>): number => {
  let max = -1
  for (const i of indexes) {
    const o = offsets[i] ?? -1
    if (o > max) max = o
  }
  return max
}

/** Builds the table manager on the `Store` and `Log` in context; `stop` runs when the scope closes. */
export const make = (
  options: TablesOptions
): Effect.Effect<TablesShape, TableManagerError, Store | Log | Scope.Scope> =>
  Effect.gen(function* () {
    yield* decodeOptions(options)
    const store: StoreShape = yield* Store
    const log: LogShape = yield* Log
    // Everything the manager opens later (partition stores, the producer, recovery) lives in this scope, made now:
    // whatever the caller adds to its own scope after `make` (a worker's last commit, say) closes before it.
    const scope = yield* Scope.fork(yield* Effect.scope, "sequential")
    const mode: Mode = options.mode ?? "worker"
    const holdsState = mode === "worker"
    const capacity = Math.max(1, options.streamBufferMaxsize ?? 4096)
    const settleDelay = Duration.fromInputUnsafe(options.settleDelay ?? "1 second")
    const acks = options.acks ?? "all"
    const guarantee: ProcessingGuarantee = options.processingGuarantee ?? "at_least_once"
    const exactlyOnce = guarantee === "exactly_once"
    const transactionalId =
      options.transactionalId ??
      `${options.app}-${(yield* Random.nextIntBetween(0, 2 ** 31 - 1)).toString(36)}${(yield* Random.nextIntBetween(0, 2 ** 31 - 1)).toString(36)}`

    const tables = new Map<string, Registered>()
    const byChangelog = new Map<string, Registered>()
    const links = new Map<string, SourceLink>()
    /** Partitions written outside `process` (no source partition to wait for): flushed by the next commit. */
    const unlinked = new Set<string>()
    /** Highest source offset (next to read) replayed from changelog headers, by source partition. */
    const replayed = new Map<string, number>()
    /** Records of one source partition are processed one at a time, in the order `process` is called. */
    const sourceLocks = new Map<string, Semaphore.Semaphore>()
    let finalized = false
    let stopping = false
    let stopped = false
    let recovery: RecoveryShape | undefined
    let channel: ChangelogChannel.ChangelogChannel | undefined
    let recoveryScope: Scope.Closeable | undefined
    const registered = yield* Deferred.make<void>()
    if (!holdsState) yield* Deferred.succeed(registered, undefined)

    // --- the producer -------------------------------------------------------

    const producer = ChangelogProducer.make(log, scope, { exactlyOnce, acks, transactionalId })

    // --- partitions -------------------------------------------------------

    /** The open partition `partition` of a table, or why it cannot be used here. */
    const lookupPartition = (table: Registered, partition: number): PartitionWrites.PartitionWrites | TableError => {
      if (!Number.isSafeInteger(partition) || partition < 0 || partition >= table.info.partitions) {
        return tableError(
          new InvalidPartition({ table: table.info.name, partition, partitions: table.info.partitions })
        )
      }
      const w = table.partitions.get(partition)
      if (w === undefined) {
        return tableError(
          new PartitionNotAvailable({ table: table.info.name, partition, detail: "not assigned to this worker" })
        )
      }
      return w.failure === undefined
        ? w
        : tableError(new PartitionRestoreFailed({ table: table.info.name, partition, reason: w.failure }))
    }

    /** Opens a table partition's store (idempotent); sets whether it is a standby replica. */
    const openPartition = (table: Registered, partition: number, standby = false) =>
      Effect.gen(function* () {
        const open = table.partitions.get(partition)
        if (open !== undefined) {
          open.standby = standby
          return
        }
        const child = yield* Scope.fork(scope, "sequential")
        const opened = yield* store
          .open({ table: table.info.name, partition })
          .pipe(Scope.provide(child), Effect.mapError(storeFailed(table.info.name)))
        // The memory store is a map already: caching its values would only double the memory.
        const cacheEntries = store.backend === "memory" ? 0 : (options.cacheEntries ?? 10_000)
        table.partitions.set(partition, PartitionWrites.make(opened, child, standby, cacheEntries))
      })

    const commitFailed = (
      table: Registered,
      partition: number,
      e: LogError | StoreError | PartitionWrites.ChangelogBehindStore
    ) => managerError(new CommitFailed({ table: table.info.name, partition, detail: e.message }))

    /** Persists a partition's buffered changes (their acks in) with its changelog and source offsets (plus `extra`). */
    const flushPartition = (
      table: Registered,
      w: PartitionWrites.PartitionWrites,
      partition: number,
      extra: ReadonlyArray<TopicPartitionOffset>
    ) =>
      PartitionWrites.flush(w, { topic: table.info.changelogTopic, partition }, extra).pipe(
        Effect.mapError((e) => commitFailed(table, partition, e))
      )

    const closePartition = (table: Registered, partition: number) =>
      Effect.gen(function* () {
        const w = table.partitions.get(partition)
        if (w === undefined) return
        table.partitions.delete(partition)
        yield* Scope.close(w.scope, Exit.void)
      })

    // --- registration -----------------------------------------------------

    const add = (info: TableInfo) =>
      Effect.gen(function* () {
        const invalid = validate(info)
        if (invalid !== undefined) {
          return yield* Effect.fail(managerError(new InvalidTable({ name: info.name, detail: invalid })))
        }
        if (finalized) return yield* Effect.fail(managerError(new TablesFinalized({ name: info.name })))
        if (tables.has(info.name)) return yield* Effect.fail(managerError(new TableAlreadyExists({ name: info.name })))
        const other = byChangelog.get(info.changelogTopic)
        if (other !== undefined) {
          return yield* Effect.fail(
            managerError(
              new InvalidTable({
                name: info.name,
                detail: `its changelog topic ${info.changelogTopic} is already table ${other.info.name}'s`
              })
            )
          )
        }
        const table: Registered = { info, partitions: new Map(), codecs: undefined }
        tables.set(info.name, table)
        byChangelog.set(info.changelogTopic, table)
        return table
      })

    // --- writes -----------------------------------------------------------

    const linkOf = (source: TopicPartitionOffset) => {
      const key = tpKey(source)
      let found = links.get(key)
      if (found === undefined) {
        found = { tp: { topic: source.topic, partition: source.partition }, changelogs: new Set() }
        links.set(key, found)
      }
      return found
    }

    /**
     * Hands a collector's writes to the producer in one send and buffers them at once, holding one permit on every
     * partition written (taken in a fixed order); the acks are awaited by the next flush.
     */
    const sendCollector = (collector: Collector): Effect.Effect<void, TableError> =>
      Effect.suspend(() => {
        if (collector.writes.length === 0) return Effect.void
        // The partitions written, by their write state now, each with its writes' indexes in the send.
        const targets = new Map<PartitionWrites.PartitionWrites, Target>()
        for (let i = 0; i < collector.writes.length; i++) {
          const write = collector.writes[i]!
          const w = write.table.partitions.get(write.partition)
          if (w === undefined) continue
          let target = targets.get(w)
          if (target === undefined) {
            target = { table: write.table, partition: write.partition, w, changes: [], indexes: [] }
            targets.set(w, target)
          }
          target.changes.push(write.change)
          target.indexes.push(i)
        }
        const send = sendAndBuffer(collector, targets)
        if (targets.size === 1) return PartitionWrites.shared(targets.keys().next().value!, send)
        return [...targets.values()]
          .sort((a, b) => compareTargets(b, a))
          .reduce<Effect.Effect<void, TableError>>((inner, { w }) => PartitionWrites.shared(w, inner), send)
      })

    const sendAndBuffer = (collector: Collector, targets: ReadonlyMap<PartitionWrites.PartitionWrites, Target>) =>
      Effect.gen(function* () {
        const acked = yield* producer
          .send(changelogRecords(collector))
          .pipe(
            Effect.mapError((cause) =>
              tableError(new ChangelogFailed({ table: collector.writes[0]!.table.info.name, cause }))
            )
          )
        const link = collector.source === undefined ? undefined : linkOf(collector.source)
        for (const target of targets.values()) {
          // The partition was revoked while the record was processed: the changelog has the write, the next owner
          // replays it.
          if (target.table.partitions.get(target.partition) !== target.w) continue
          PartitionWrites.buffer(
            target.w,
            target.changes,
            Effect.map(acked, (offsets) => highestOf(offsets, target.indexes)),
            collector.source
          )
          const id = `${target.table.info.name}|${target.partition}`
          if (link === undefined) unlinked.add(id)
          else link.changelogs.add(id)
        }
      })

    const sourceLock = (source: TopicPartition) => {
      const key = tpKey(source)
      let lock = sourceLocks.get(key)
      if (lock === undefined) {
        lock = Semaphore.makeUnsafe(1)
        sourceLocks.set(key, lock)
      }
      return lock
    }

    const process: TablesShape["process"] = (source, effect) =>
      Semaphore.withPermit(
        sourceLock(source),
        producer.gated(
          Effect.gen(function* () {
            const collector = makeCollector(source)
            const a = yield* Effect.provideService(effect, CurrentCollector, collector)
            yield* sendCollector(collector)
            return a
          })
        )
      )

    const processBatch: TablesShape["processBatch"] = (sources, f) =>
      Effect.suspend(() => {
        const first = sources[0]
        if (first === undefined) return Effect.void
        return Semaphore.withPermit(
          sourceLock(first),
          producer.gated(
            Effect.suspend(() => {
              // One collector for the batch, provided once; it names the record being processed.
              const collector = makeCollector(undefined)
              // forEach calls its function as each step starts: the collector names that step's record.
              const each = Effect.forEach(
                sources,
                (source) => {
                  collector.source = source
                  return f(source)
                },
                { discard: true }
              )
              return Effect.andThen(Effect.provideService(each, CurrentCollector, collector), sendCollector(collector))
            })
          )
        )
      })

    // --- recovery -----------------------------------------------------------

    const changelogPartitionsOf = (table: Registered): Array<TopicPartition> =>
      Array.from({ length: table.info.partitions }, (_, partition) => ({ topic: table.info.changelogTopic, partition }))

    const flushAll = Effect.gen(function* () {
      // With exactly_once a write reaches a store only after its transaction committed: nothing to flush here.
      if (exactlyOnce) return
      for (const table of tables.values()) {
        for (const [partition, w] of table.partitions) yield* flushPartition(table, w, partition, [])
      }
      yield* producer.flush
      yield* log.flush
    })

    const target = RestoreTarget.make({
      partitionOf: (tp) => byChangelog.get(tp.topic)?.partitions.get(tp.partition),
      codecsOf: (tp) => byChangelog.get(tp.topic)?.codecs,
      limits: store.limits,
      badRecords: options.badRecords ?? "fail",
      deadLetter: RestoreTarget.deadLetters(log, `${options.app}-dead-letters`),
      replayed,
      // Buffered changes reach the stores with their offsets, so recovery reads current persisted offsets.
      flushAll: flushAll.pipe(
        Effect.mapError(
          (e) =>
            new RestoreFailed({ topic: "(tables)", partition: 0, detail: `flushing before recovery: ${e.message}` })
        )
      )
    })

    // --- lifecycle ----------------------------------------------------------

    const start: TablesShape["start"] = Effect.gen(function* () {
      if (stopping || finalized || !holdsState) return
      if (Duration.isGreaterThan(settleDelay, Duration.zero)) yield* Effect.sleep(settleDelay)
      if (stopping) return
      finalized = true
      const all = [...tables.values()]
      for (const table of all) {
        yield* log.ensureTopic({ topic: table.info.changelogTopic, partitions: table.info.partitions, compacted: true })
      }
      const built = yield* Scope.fork(scope, "sequential")
      recoveryScope = built
      // Fetched records come in chunks as large as a restore batch, so a `recoveryBufferSize` above 1000 gives larger
      // store batches when a fetch holds that many of a partition (the consumer's own chunks of 1000 capped them).
      const chunk = Math.max(
        options.recovery?.recoveryBufferSize ?? DEFAULT_RESTORE_BATCH,
        options.recovery?.standbyBufferSize ?? DEFAULT_RESTORE_BATCH
      )
      // Recovery owns the changelog partitions: every one starts paused.
      channel = yield* ChangelogChannel.make(log, all.flatMap(changelogPartitionsOf), {
        capacity,
        chunk,
        isolation: exactlyOnce ? "read_committed" : "read_uncommitted"
      }).pipe(Scope.provide(built))
      // The options were checked with the manager's.
      const started = yield* ChangelogRecovery.make(channel.source, target, options.recovery).pipe(
        Scope.provide(built),
        Effect.orDie
      )
      recovery = started
      // Global tables: every worker holds and restores every partition.
      const globals = all.filter((t) => t.info.kind === "global")
      for (const table of globals) {
        for (let p = 0; p < table.info.partitions; p++) yield* openPartition(table, p).pipe(Effect.orDie)
      }
      if (globals.length > 0) {
        yield* started.assign({ active: globals.flatMap(changelogPartitionsOf), standby: [] }).pipe(Effect.orDie)
      }
      yield* Deferred.succeed(registered, undefined)
    })

    const stop: TablesShape["stop"] = Effect.gen(function* () {
      stopping = true
      if (stopped) return
      stopped = true
      // 1. The changelog channel's fetcher, then recovery and the channel's consumer.
      if (channel !== undefined) yield* channel.stopFetching
      if (recoveryScope !== undefined) yield* Scope.close(recoveryScope, Exit.void)
      recovery = undefined
      // 2. The producer: what it sent is acknowledged or failed.
      yield* producer.close
      // 3. Each table: its partition stores closed (uncommitted changes stay in the changelog only).
      for (const table of tables.values()) {
        for (const partition of [...table.partitions.keys()]) yield* closePartition(table, partition)
      }
      yield* Effect.logDebug("tables stopped")
    })
    yield* Effect.addFinalizer(() => stop)

    // --- core's TableManager protocol ----------------------------------------

    const tableOf = (topic: string) =>
      Effect.suspend(() => {
        const table = byChangelog.get(topic)
        return table === undefined
          ? Effect.fail(managerError(new UnknownTable({ name: topic })))
          : Effect.succeed(table.info)
      })

    const sourceToChangelogs = (tps: ReadonlyArray<TopicPartition>) => {
      const out: Array<{ table: Registered; partition: number }> = []
      const seen = new Set<string>()
      for (const table of tables.values()) {
        if (table.info.kind !== "table") continue
        for (const tp of tps) {
          const id = `${table.info.name}|${tp.partition}`
          if (tp.partition < table.info.partitions && !seen.has(id)) {
            seen.add(id)
            out.push({ table, partition: tp.partition })
          }
        }
      }
      return out
    }

    const asManagerError = (e: TableError | StoreError) =>
      managerError(new InvalidTable({ name: "(manager)", detail: e.message }))

    const flushById = (id: string, extra: ReadonlyArray<TopicPartitionOffset>) =>
      Effect.suspend(() => {
        const [name, p] = id.split("|") as [string, string]
        const table = tables.get(name)
        const w = table?.partitions.get(Number(p))
        return table === undefined || w === undefined ? Effect.void : flushPartition(table, w, Number(p), extra)
      })

    const onCommit: TableManagerShape["onCommit"] = (offsets) =>
      Effect.gen(function* () {
        for (const committed of offsets) {
          const link = links.get(tpKey(committed))
          if (link === undefined) continue
          // The source offset goes in the same atomic batch as the data and the changelog offset.
          for (const id of link.changelogs) yield* flushById(id, [committed])
          links.delete(tpKey(committed))
        }
        // Writes made outside any source record are persisted with the next commit.
        for (const id of [...unlinked]) {
          yield* flushById(id, [])
          unlinked.delete(id)
        }
      })

    /** The transaction refused or failed: nothing of it is visible, and nothing of it reaches a store. */
    const transactionFailed = (e: LogError) =>
      managerError(new CommitFailed({ table: "(transaction)", partition: -1, detail: e.message }))

    const commit: TablesShape["commit"] = (group, offsets) =>
      Effect.gen(function* () {
        if (!exactlyOnce) {
          yield* onCommit(offsets)
          if (offsets.length === 0) return
          // A member that just lost a partition may be refused: the stores hold the offsets all the same.
          yield* group
            .commit(offsets)
            .pipe(Effect.catch((e) => Effect.logWarning(`tables: the group refused a commit: ${e.message}`)))
          return
        }
        // The transaction commits the data with the offsets; then the stores take what it committed.
        yield* producer
          .commitTransaction(group, offsets, onCommit(offsets))
          .pipe(Effect.mapError((e) => (e._tag === "LogError" ? transactionFailed(e) : e)))
      })

    const changelogTps = (list: ReadonlyArray<{ table: Registered; partition: number }>) =>
      list.map(({ table, partition }) => ({ topic: table.info.changelogTopic, partition }))

    const assign: TablesShape["assign"] = (assignment) =>
      Effect.gen(function* () {
        if (!holdsState) return
        const actives = sourceToChangelogs(assignment.active)
        const activeIds = new Set(actives.map(({ table, partition }) => `${table.info.name}|${partition}`))
        // A partition active here (from this call or an earlier one) is never demoted to a standby.
        const standbys = sourceToChangelogs(assignment.standby ?? []).filter(
          ({ table, partition }) =>
            !activeIds.has(`${table.info.name}|${partition}`) && table.partitions.get(partition)?.standby !== false
        )
        for (const { table, partition } of actives) yield* openPartition(table, partition, false)
        for (const { table, partition } of standbys) yield* openPartition(table, partition, true)
        if (recovery !== undefined && actives.length + standbys.length > 0) {
          yield* recovery.assign({ active: changelogTps(actives), standby: changelogTps(standbys) }).pipe(Effect.orDie)
        }
      }).pipe(Effect.mapError(asManagerError))

    const onPartitionsAssigned: TableManagerShape["onPartitionsAssigned"] = (tps) => assign({ active: tps })

    const waitUntilReady: TablesShape["waitUntilReady"] = (tps) =>
      Effect.suspend(() =>
        recovery === undefined || !holdsState
          ? Effect.void
          : recovery
              .waitUntilReady(changelogTps(sourceToChangelogs(tps)))
              .pipe(Effect.mapError((e) => managerError(new TableRecoveryFailed({ reason: e.reason }))))
      )

    /** Runs `effect` once no record of these source partitions is being processed, and none starts meanwhile. */
    const withSourcesIdle = <A, E>(tps: ReadonlyArray<TopicPartition>, effect: Effect.Effect<A, E>) =>
      [...new Map(tps.map((tp) => [tpKey(tp), tp] as const))]
        .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
        .reduce<Effect.Effect<A, E>>((inner, [, tp]) => Semaphore.withPermit(sourceLock(tp), inner), effect)

    const onPartitionsRevoked: TableManagerShape["onPartitionsRevoked"] = (tps) => withSourcesIdle(tps, revokeIdle(tps))

    const revokeIdle = (tps: ReadonlyArray<TopicPartition>) =>
      Effect.gen(function* () {
        if (!holdsState) return
        const revoked = sourceToChangelogs(tps)
        if (recovery !== undefined && revoked.length > 0) {
          yield* recovery
            .revoke(revoked.map(({ table, partition }) => ({ topic: table.info.changelogTopic, partition })))
            .pipe(Effect.orDie)
        }
        for (const tp of tps) links.delete(tpKey(tp))
        for (const { table, partition } of revoked) {
          const w = table.partitions.get(partition)
          // What was sent is flushed with its changelog offset (the store stays equal to a changelog prefix). With
          // exactly_once what is still buffered was not committed: it is dropped with its transaction.
          if (w !== undefined) {
            if (exactlyOnce) PartitionWrites.discard(w)
            else yield* flushPartition(table, w, partition, [])
          }
          yield* closePartition(table, partition)
        }
      })

    const rewind: TablesShape["rewind"] = Effect.gen(function* () {
      if (!holdsState) return
      // Every write not in a store is forgotten; the changelogs hold what was acknowledged.
      for (const table of tables.values()) for (const w of table.partitions.values()) PartitionWrites.discard(w)
      links.clear()
      unlinked.clear()
      yield* producer.close
      if (recovery === undefined) return
      const active: Array<TopicPartition> = []
      const standby: Array<TopicPartition> = []
      for (const table of tables.values()) {
        for (const [partition, w] of table.partitions) {
          ;(w.standby ? standby : active).push({ topic: table.info.changelogTopic, partition })
        }
      }
      // Restored again from what the stores persisted: recovery replays the changelog records past it.
      yield* recovery.revoke([...active, ...standby]).pipe(Effect.orDie)
      yield* recovery.assign({ active, standby }).pipe(Effect.orDie)
    })

    const manager: TableManagerShape = {
      add: (info) => Effect.asVoid(add(info)),
      tables: Effect.sync(() => [...tables.values()].map((t) => t.info)),
      tableOfChangelog: tableOf,
      onPartitionsRevoked,
      onPartitionsAssigned,
      onCommit,
      waitUntilTablesRegistered: Deferred.await(registered),
      waitUntilRecoveryCompleted: Effect.suspend(() =>
        !holdsState || recovery === undefined
          ? Effect.void
          : recovery.waitUntilCompleted.pipe(
              Effect.mapError((e) => managerError(new TableRecoveryFailed({ reason: e.reason })))
            )
      )
    }

    const register: TablesShape["register"] = <K, V>(def: TableDef<K, V>) =>
      Effect.gen(function* () {
        const invalid = validate(def as TableDef<unknown, unknown>)
        if (invalid !== undefined)
          return yield* Effect.fail(managerError(new InvalidTable({ name: def.name, detail: invalid })))
        const codecs = codecsOf(def)
        const info: TableInfo = {
          name: def.name,
          kind: def.kind,
          partitions: def.partitions,
          changelogTopic: changelogTopicOf(options.app, def as TableDef<unknown, unknown>)
        }
        const table = yield* add(info)
        table.codecs = codecs as Codecs<unknown, unknown>
        return Handles.make(table, codecs, { lookupPartition, sendCollector, limits: store.limits })
      })

    const resumeOffset: TablesShape["resumeOffset"] = (tp) =>
      Effect.gen(function* () {
        let best = replayed.get(tpKey(tp))
        for (const table of tables.values()) {
          for (const w of table.partitions.values()) {
            const persisted = yield* w.store.persistedOffset(tp).pipe(Effect.mapError(storeFailed(table.info.name)))
            if (Option.isSome(persisted) && (best === undefined || persisted.value > best)) best = persisted.value
          }
        }
        return Option.fromNullishOr(best)
      })

    return {
      manager,
      processingGuarantee: guarantee,
      commit,
      register,
      start,
      stop,
      process,
      processBatch,
      rewind,
      resumeOffset,
      changelogTopics: Effect.sync(() => new Set(byChangelog.keys())),
      changelogQueue: Effect.suspend(() =>
        channel === undefined
          ? Effect.succeed({ capacity, size: 0 })
          : Effect.map(channel.size, (size) => ({ capacity, size }))
      ),
      recovery: Effect.sync(() => Option.fromNullishOr(recovery)),
      assign,
      waitUntilReady
    } satisfies TablesShape
  })

/** The table manager as a layer providing `Tables` and core's `TableManager`. */
export const layer = (options: TablesOptions): Layer.Layer<Tables | TableManager, TableManagerError, Store | Log> =>
  Layer.effectContext(
    Effect.map(make(options), (service) =>
      Context.make(Tables, service).pipe(Context.add(TableManager, service.manager))
    )
  )

/** Like `layer`, with the options read from configuration and validated (a bad value names its key). */
export const layerConfig = (
  options: Config.Config<TablesOptions> = config()
): Layer.Layer<Tables | TableManager, TableManagerError | Config.ConfigError, Store | Log> =>
  Layer.unwrap(Effect.map(options, layer))
