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
import { Log, Models, OptionSchemas, type Recovery, Store, TableManager } from "@strata/core"
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
  SchemaTransformation,
  Scope
} from "effect"
import * as ChangelogChannel from "./internal/changelogChannel.js"
import * as ChangelogProducer from "./internal/changelogProducer.js"
import {
  add,
  changelogPartitionsOf,
  changelogTps,
  closePartition,
  flushById,
  flushPartition,
  type Manager,
  managerError,
  openPartition,
  partitionId,
  restoreTarget,
  sourceToChangelogs,
  storeFailed
} from "./internal/manager.js"
import * as PartitionWrites from "./internal/partitionWrites.js"
import * as Processing from "./internal/processing.js"
import { type Codecs, codecs as codecsOf, changelogTopicOf, type TableDef, type TableError, validate } from "./Table.js"
import * as Handles from "./TableHandle.js"
import type { TableHandle } from "./TableHandle.js"

// ---------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------

const { DurationOption, PositiveInt } = OptionSchemas

const ModeSchema = Schema.Literals(["worker", "producer-only", "client-only"])
const GuaranteeSchema = Schema.Literals(["at_least_once", "exactly_once"])
const BadRecordsSchema = Schema.Literals(["fail", "dead-letter"])
const NonEmpty = Schema.String.check(Schema.isMinLength(1))

/** How the worker uses its tables: `producer-only` and `client-only` hold no table state. */
export type Mode = typeof ModeSchema.Type

/**
 * What a commit promises. `at_least_once` (the default): source records may be processed again after a crash, but
 * their table effects apply exactly once (the stores hold the source offsets with the data). `exactly_once`: the
 * changelog writes and the source offsets commit in one transaction, and restores read committed data only.
 */
export type ProcessingGuarantee = typeof GuaranteeSchema.Type

/**
 * The options `make` takes, checked by this one schema (a bad option fails naming it), with their defaults: its
 * `Encoded` side is what callers pass (`TablesOptions`), its `Type` side what the manager runs with.
 */
export const TablesOptionsSchema = Schema.Struct({
  /** The app id: default changelog topics are `<app>-<table>-changelog`. */
  app: NonEmpty,
  /** Default `worker`; in the other modes the waits return at once and `start` builds nothing. */
  mode: ModeSchema.pipe(Schema.withDecodingDefault(Effect.succeed<Mode>("worker"))),
  /** Capacity (records) of the changelog queue all tables share (default 4096). */
  streamBufferMaxsize: PositiveInt.pipe(Schema.withDecodingDefault(Effect.succeed(4096))),
  /** Pause at start before building channels, as Faust's (1 second); any `Duration.Input`, a number being ms. */
  settleDelay: DurationOption("nonNegative").pipe(
    Schema.withDecodingDefault(Effect.succeed<Duration.Input>("1 second"))
  ),
  /** Acks of changelog writes (default `all`; `exactly_once` always uses `all`). */
  acks: Schema.Literals([0, 1, "all"]).pipe(Schema.withDecodingDefault(Effect.succeed<0 | 1 | "all">("all"))),
  /** Default `at_least_once`. */
  processingGuarantee: GuaranteeSchema.pipe(
    Schema.withDecodingDefault(Effect.succeed<ProcessingGuarantee>("at_least_once"))
  ),
  /**
   * The changelog producer's transactional id with `exactly_once` (default `<app>-` and a random suffix, new per
   * manager). A stable id lets a restarted worker fence its predecessor's open transaction at once; without one
   * that transaction is aborted by the broker's transaction timeout.
   */
  transactionalId: Schema.optional(NonEmpty),
  /**
   * Values each table partition keeps of what its store holds, so a read of a recent key does not go to the store
   * (default 10000 per partition; when full, the oldest entry not read since eviction last passed it goes, the clock
   * approximation of least recently used; 0 turns it off; the memory store keeps none).
   */
  cacheEntries: Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)).pipe(
    Schema.withDecodingDefault(Effect.succeed(10_000))
  ),
  /**
   * A changelog record a restore cannot apply (its key or value beyond the store's limits, or not decodable by its
   * table's schema): `"fail"` (default) sets its partition aside with `BadChangelogRecord` naming the offset (the
   * partition is unusable until a restore succeeds); `"dead-letter"` sends it to `<app>-dead-letters` (headers
   * `strata-dead-letter-from` and `strata-dead-letter-reason` say where from and why) and restores the rest.
   */
  badRecords: BadRecordsSchema.pipe(Schema.withDecodingDefault(Effect.succeed<"fail" | "dead-letter">("fail"))),
  /** Options of the recovery the manager starts. */
  recovery: ChangelogRecovery.ChangelogRecoveryOptionsSchema.pipe(
    Schema.withDecodingDefault(Effect.succeed<ChangelogRecovery.ChangelogRecoveryOptions>({}))
  )
})

/** Options of the table manager (see `TablesOptionsSchema` for each one and its default). */
export type TablesOptions = typeof TablesOptionsSchema.Encoded

/** Configuration text as a `Duration.Input`: a number of milliseconds (`"1000"`), else the text (`"1 second"`). */
const durationOfText = (text: string): Duration.Input => {
  const millis = Number(text)
  return text.trim() !== "" && Number.isFinite(millis) ? millis : (text as Duration.Input)
}

/** A duration setting: configuration text read as `durationOfText` does, then checked as the option is. */
const DurationSetting = (bound: "positive" | "nonNegative") =>
  Schema.String.pipe(
    Schema.decodeTo(
      DurationOption(bound),
      SchemaTransformation.transform({ decode: durationOfText, encode: (input: Duration.Input) => String(input) })
    )
  )

/** The settings `config` reads, validated with Schema (a bad value fails naming its key). */
export const TablesSettings = Schema.Struct({
  app: NonEmpty,
  mode: Schema.optional(ModeSchema),
  streamBufferMaxsize: Schema.optional(PositiveInt),
  settleDelay: Schema.optional(DurationSetting("nonNegative")),
  acks: Schema.optional(Schema.Literals(["0", "1", "all"])),
  processingGuarantee: Schema.optional(GuaranteeSchema),
  transactionalId: Schema.optional(NonEmpty),
  recoveryDelay: Schema.optional(DurationSetting("nonNegative")),
  recoveryBufferSize: Schema.optional(PositiveInt),
  onInconsistency: Schema.optional(Schema.Literals(["fail", "wipe"])),
  badRecords: Schema.optional(BadRecordsSchema)
})

/**
 * The manager's options from configuration under `path` (default `tables`): `app`, `mode`,
 * `streamBufferMaxsize`, `settleDelay`, `acks`, `processingGuarantee`, `transactionalId`, `recoveryDelay`,
 * `recoveryBufferSize`, `onInconsistency`, `badRecords`. A duration is a number of milliseconds (`1000`) or a
 * duration (`1 second`).
 */
export const config = (path = "tables"): Config.Config<TablesOptions> =>
  Config.map(Config.schema(TablesSettings, path), (s) => ({
    app: s.app,
    ...(s.mode === undefined ? {} : { mode: s.mode }),
    ...(s.streamBufferMaxsize === undefined ? {} : { streamBufferMaxsize: s.streamBufferMaxsize }),
    ...(s.settleDelay === undefined ? {} : { settleDelay: s.settleDelay }),
    ...(s.acks === undefined
      ? {}
      : { acks: s.acks === "all" ? ("all" as const) : s.acks === "1" ? (1 as const) : (0 as const) }),
    ...(s.processingGuarantee === undefined ? {} : { processingGuarantee: s.processingGuarantee }),
    ...(s.transactionalId === undefined ? {} : { transactionalId: s.transactionalId }),
    ...(s.badRecords === undefined ? {} : { badRecords: s.badRecords }),
    recovery: {
      ...(s.recoveryDelay === undefined ? {} : { recoveryDelay: s.recoveryDelay }),
      ...(s.recoveryBufferSize === undefined ? {} : { recoveryBufferSize: s.recoveryBufferSize }),
      ...(s.onInconsistency === undefined ? {} : { onInconsistency: s.onInconsistency })
    }
  }))

/** Decodes the options once, defaults applied (configuration is checked by `config`); the error names each bad one. */
const decodeOptions = (
  options: TablesOptions
): Effect.Effect<typeof TablesOptionsSchema.Type, TableManager.TableManagerError> =>
  OptionSchemas.decodeOptions(TablesOptionsSchema, { exact: true })(options).pipe(
    Effect.mapError((bad) => {
      const { option, value, detail } = OptionSchemas.summary(bad)
      return new TableManager.TableManagerError({
        reason: new TableManager.InvalidOptions({ option, detail: `${detail} (got ${value})` })
      })
    })
  )

// ---------------------------------------------------------------------------
// Service
// ---------------------------------------------------------------------------

/** A registered table's handle, and where its reads and writes go (declared in `TableHandle.ts`). */
export type { PartitionOption, TableHandle } from "./TableHandle.js"

/** The table manager. */
export interface TablesShape {
  /** Core's `TableManager` protocol (also provided under its own key by the layer). */
  readonly manager: TableManager.Shape
  /** What `commit` promises (the `processingGuarantee` option). */
  readonly processingGuarantee: ProcessingGuarantee
  /**
   * Commits processed source records: `at_least_once` persists every table partition they wrote (acks in, one
   * atomic store batch each), then commits the offsets to the group (a refusal is logged: the stores hold them);
   * `exactly_once` commits the changelog transaction with the offsets, then persists the stores. A failure is a
   * `CommitFailed`: nothing of the failed part is persisted, and `rewind` starts again from what is.
   */
  readonly commit: (
    group: Log.GroupConsumer,
    offsets: ReadonlyArray<Models.TopicPartitionOffset>
  ) => Effect.Effect<void, TableManager.TableManagerError>
  /** Registers a table definition and returns its handle. */
  readonly register: <K, V>(def: TableDef<K, V>) => Effect.Effect<TableHandle<K, V>, TableManager.TableManagerError>
  /**
   * Starts the manager: after `settleDelay` it finalizes the tables, ensures their changelog topics, builds
   * the changelog channel (one consumer, one shared bounded queue), pauses every changelog partition and
   * starts recovery. If `stop` ran first it builds and starts nothing.
   */
  readonly start: Effect.Effect<void, TableManager.TableManagerError | Log.LogError>
  /** Stops in order: changelog fetcher, recovery, then each table (stores closed). Idempotent. */
  readonly stop: Effect.Effect<void>
  /**
   * Runs `effect` as the processing of one source record: its writes go to the source record's partition, are
   * visible to the next record at once, are sent in one batch carrying the source offset (acks are awaited by the
   * commit), and are linked to the source partition for `onCommit`. Calls for one source partition run one at a
   * time, in the order made.
   */
  readonly process: <A, E, R>(
    source: Models.TopicPartitionOffset,
    effect: Effect.Effect<A, E, R>
  ) => Effect.Effect<A, E | TableError, R>
  /**
   * Runs `f` for each source record of one source partition, in order, as `process` would (each record's writes
   * visible to the next, each changelog record naming its source record), and sends all their writes in one batch
   * at the end: nothing of the batch is sent if `f` fails on any record.
   */
  readonly processBatch: <S extends Models.TopicPartitionOffset, E, R>(
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
  readonly resumeOffset: (source: Models.TopicPartition) => Effect.Effect<Option.Option<Models.Offset>, TableError>
  /** The changelog topics of the registered tables. */
  readonly changelogTopics: Effect.Effect<ReadonlySet<string>>
  /** The shared changelog queue's capacity and current size (records). */
  readonly changelogQueue: Effect.Effect<{ readonly capacity: number; readonly size: number }>
  /** The recovery the manager started, once started: its `events` and `stats` show the progress. */
  readonly recovery: Effect.Effect<Option.Option<Recovery.Shape>>
  /**
   * Source partitions assigned to this worker: `active` ones are restored then processed, `standby` ones are
   * restored and kept tailing their changelogs (not writable) so a promotion replays only the lag.
   * `manager.onPartitionsAssigned(tps)` is `assign({ active: tps })`.
   */
  readonly assign: (assignment: {
    readonly active: ReadonlyArray<Models.TopicPartition>
    readonly standby?: ReadonlyArray<Models.TopicPartition>
  }) => Effect.Effect<void, TableManager.TableManagerError>
  /** Returns once the tables of these source partitions are restored (others may still be restoring). */
  readonly waitUntilReady: (
    tps: ReadonlyArray<Models.TopicPartition>
  ) => Effect.Effect<void, TableManager.TableManagerError>
}

/** The `Tables` service key; its layer also provides core's `TableManager`. */
export class Tables extends Context.Service<Tables, TablesShape>()("@strata/tables/Tables") {}

// ---------------------------------------------------------------------------
// Implementation
// ---------------------------------------------------------------------------

/** Recovery's default `recoveryBufferSize` and `standbyBufferSize`. */
const DEFAULT_RESTORE_BATCH = 1000

/** Builds the table manager on the `Store` and `Log` in context; `stop` runs when the scope closes. */
export const make = (
  options: TablesOptions
): Effect.Effect<TablesShape, TableManager.TableManagerError, Store.Store | Log.Log | Scope.Scope> =>
  Effect.gen(function* () {
    const o = yield* decodeOptions(options)
    const store: Store.Shape = yield* Store.Store
    const log: Log.Shape = yield* Log.Log
    // Everything the manager opens later (partition stores, the producer, recovery) lives in this scope, made now:
    // whatever the caller adds to its own scope after `make` (a worker's last commit, say) closes before it.
    const scope = yield* Scope.fork(yield* Effect.scope, "sequential")
    const exactlyOnce = o.processingGuarantee === "exactly_once"
    const transactionalId =
      o.transactionalId ??
      `${o.app}-${(yield* Random.nextIntBetween(0, 2 ** 31 - 1)).toString(36)}${(yield* Random.nextIntBetween(0, 2 ** 31 - 1)).toString(36)}`
    const m: Manager = {
      app: o.app,
      holdsState: o.mode === "worker",
      exactlyOnce,
      capacity: o.streamBufferMaxsize,
      settleDelay: o.settleDelay,
      // The memory store is a map already: caching its values would only double the memory.
      cacheEntries: store.backend === "memory" ? 0 : o.cacheEntries,
      badRecords: o.badRecords,
      // Decoded already (durations as `Duration`s, which recovery's schema takes as they are).
      recoveryOptions: o.recovery,
      store,
      log,
      scope,
      producer: ChangelogProducer.make(log, scope, { exactlyOnce, acks: o.acks, transactionalId }),
      tables: new Map(),
      byChangelog: new Map(),
      links: new Map(),
      unlinked: new Set(),
      replayed: new Map(),
      sourceLocks: new Map(),
      registered: yield* Deferred.make<void>(),
      finalized: false,
      stopping: false,
      stopped: false,
      recovery: undefined,
      channel: undefined,
      recoveryScope: undefined
    }
    if (!m.holdsState) yield* Deferred.succeed(m.registered, undefined)
    yield* Effect.addFinalizer(() => stop(m))
    return shapeOf(m, o.processingGuarantee)
  })

/** The running manager as its users see it. */
const shapeOf = (m: Manager, guarantee: ProcessingGuarantee): TablesShape => ({
  manager: managerOf(m),
  processingGuarantee: guarantee,
  commit: (group, offsets) => commit(m, group, offsets),
  register: (def) => register(m, def),
  start: start(m),
  stop: stop(m),
  process: (source, effect) => Processing.process(m, source, effect),
  processBatch: (sources, f) => Processing.processBatch(m, sources, f),
  rewind: rewind(m),
  resumeOffset: (tp) => resumeOffset(m, tp),
  changelogTopics: Effect.sync(() => new Set(m.byChangelog.keys())),
  changelogQueue: Effect.suspend(() =>
    m.channel === undefined
      ? Effect.succeed({ capacity: m.capacity, size: 0 })
      : Effect.map(m.channel.size, (size) => ({ capacity: m.capacity, size }))
  ),
  recovery: Effect.sync(() => Option.fromNullishOr(m.recovery)),
  assign: (assignment) => assign(m, assignment),
  waitUntilReady: (tps) => waitUntilReady(m, tps)
})

/** Core's `TableManager` protocol over the manager. */
const managerOf = (m: Manager): TableManager.Shape => ({
  add: (info) => Effect.asVoid(add(m, info)),
  tables: Effect.sync(() => [...m.tables.values()].map((t) => t.info)),
  tableOfChangelog: (topic) =>
    Effect.suspend(() => {
      const table = m.byChangelog.get(topic)
      return table === undefined
        ? Effect.fail(managerError(new TableManager.UnknownTable({ name: topic })))
        : Effect.succeed(table.info)
    }),
  onPartitionsRevoked: (tps) => Processing.withSourcesIdle(m, tps, revokeIdle(m, tps)),
  onPartitionsAssigned: (tps) => assign(m, { active: tps }),
  onCommit: (offsets) => onCommit(m, offsets),
  waitUntilTablesRegistered: Deferred.await(m.registered),
  waitUntilRecoveryCompleted: Effect.suspend(() =>
    !m.holdsState || m.recovery === undefined
      ? Effect.void
      : m.recovery.waitUntilCompleted.pipe(
          Effect.mapError((e) => managerError(new TableManager.TableRecoveryFailed({ reason: e.reason })))
        )
  )
})

/** Registers a table definition and builds its handle. */
const register = <K, V>(m: Manager, def: TableDef<K, V>) =>
  Effect.gen(function* () {
    const invalid = validate(def as TableDef<unknown, unknown>)
    if (invalid !== undefined)
      return yield* Effect.fail(managerError(new TableManager.InvalidTable({ name: def.name, detail: invalid })))
    const codecs = codecsOf(def)
    const info: TableManager.TableInfo = {
      name: def.name,
      kind: def.kind,
      partitions: def.partitions,
      changelogTopic: changelogTopicOf(m.app, def as TableDef<unknown, unknown>)
    }
    const table = yield* add(m, info)
    table.codecs = codecs as Codecs<unknown, unknown>
    return Handles.make(table, codecs, {
      sendCollector: (collector) => Processing.sendCollector(m, collector),
      limits: m.store.limits
    })
  })

// --- lifecycle ----------------------------------------------------------------

/**
 * After the settle delay: finalizes the tables, ensures their changelog topics, builds the changelog channel and
 * starts recovery (global tables' partitions assigned to it at once).
 */
const start = (m: Manager): TablesShape["start"] =>
  Effect.gen(function* () {
    if (m.stopping || m.finalized || !m.holdsState) return
    if (Duration.isGreaterThan(m.settleDelay, Duration.zero)) yield* Effect.sleep(m.settleDelay)
    if (m.stopping) return
    m.finalized = true
    const all = [...m.tables.values()]
    for (const table of all) {
      yield* m.log.ensureTopic({ topic: table.info.changelogTopic, partitions: table.info.partitions, compacted: true })
    }
    const built = yield* Scope.fork(m.scope, "sequential")
    m.recoveryScope = built
    // Fetched records come in chunks as large as a restore batch, so a `recoveryBufferSize` above 1000 gives larger
    // store batches when a fetch holds that many of a partition (the consumer's own chunks of 1000 capped them).
    const chunk = Math.max(
      m.recoveryOptions.recoveryBufferSize ?? DEFAULT_RESTORE_BATCH,
      m.recoveryOptions.standbyBufferSize ?? DEFAULT_RESTORE_BATCH
    )
    // Recovery owns the changelog partitions: every one starts paused.
    const channel = yield* ChangelogChannel.make(m.log, all.flatMap(changelogPartitionsOf), {
      capacity: m.capacity,
      chunk,
      isolation: m.exactlyOnce ? "read_committed" : "read_uncommitted"
    }).pipe(Scope.provide(built))
    m.channel = channel
    // The options were checked with the manager's.
    const started = yield* ChangelogRecovery.make(channel.source, restoreTarget(m), m.recoveryOptions).pipe(
      Scope.provide(built),
      Effect.orDie
    )
    m.recovery = started
    // Global tables: every worker holds and restores every partition.
    const globals = all.filter((t) => t.info.kind === "global")
    for (const table of globals) {
      for (let p = 0; p < table.info.partitions; p++) yield* openPartition(m, table, p).pipe(Effect.orDie)
    }
    if (globals.length > 0) {
      yield* started.assign({ active: globals.flatMap(changelogPartitionsOf), standby: [] }).pipe(Effect.orDie)
    }
    yield* Deferred.succeed(m.registered, undefined)
  })

/** Stops in order: the changelog fetcher, recovery, the producer, then each table's stores. Idempotent. */
const stop = (m: Manager): TablesShape["stop"] =>
  Effect.gen(function* () {
    m.stopping = true
    if (m.stopped) return
    m.stopped = true
    // 1. The changelog channel's fetcher, then recovery and the channel's consumer.
    if (m.channel !== undefined) yield* m.channel.stopFetching
    if (m.recoveryScope !== undefined) yield* Scope.close(m.recoveryScope, Exit.void)
    m.recovery = undefined
    // 2. The producer: what it sent is acknowledged or failed.
    yield* m.producer.close
    // 3. Each table: its partition stores closed (uncommitted changes stay in the changelog only).
    for (const table of m.tables.values()) {
      for (const partition of [...table.partitions.keys()]) yield* closePartition(table, partition)
    }
    yield* Effect.logDebug("tables stopped")
  })

// --- commits --------------------------------------------------------------------

const asManagerError = (e: TableError | Store.StoreError) =>
  managerError(new TableManager.InvalidTable({ name: "(manager)", detail: e.message }))

/** Persists every partition the committed source partitions wrote (each with its source offset), then the unlinked. */
const onCommit = (m: Manager, offsets: ReadonlyArray<Models.TopicPartitionOffset>) =>
  Effect.gen(function* () {
    for (const committed of offsets) {
      const link = m.links.get(Models.tpKey(committed))
      if (link === undefined) continue
      // The source offset goes in the same atomic batch as the data and the changelog offset.
      for (const id of link.changelogs) yield* flushById(m, id, [committed])
      m.links.delete(Models.tpKey(committed))
    }
    // Writes made outside any source record are persisted with the next commit.
    for (const id of [...m.unlinked]) {
      yield* flushById(m, id, [])
      m.unlinked.delete(id)
    }
  })

/** The transaction refused or failed: nothing of it is visible, and nothing of it reaches a store. */
const transactionFailed = (e: Log.LogError) =>
  managerError(new TableManager.CommitFailed({ table: "(transaction)", partition: -1, detail: e.message }))

/** Commits processed source records (see `TablesShape.commit`). */
const commit = (m: Manager, group: Log.GroupConsumer, offsets: ReadonlyArray<Models.TopicPartitionOffset>) =>
  Effect.gen(function* () {
    if (!m.exactlyOnce) {
      yield* onCommit(m, offsets)
      if (offsets.length === 0) return
      // A member that just lost a partition may be refused: the stores hold the offsets all the same.
      yield* group
        .commit(offsets)
        .pipe(Effect.catch((e) => Effect.logWarning(`tables: the group refused a commit: ${e.message}`)))
      return
    }
    // The transaction commits the data with the offsets; then the stores take what it committed.
    yield* m.producer
      .commitTransaction(group, offsets, onCommit(m, offsets))
      .pipe(Effect.mapError((e) => (e._tag === "LogError" ? transactionFailed(e) : e)))
  })

// --- assignments ----------------------------------------------------------------

/** Opens the table partitions of assigned source partitions (active or standby) and hands them to recovery. */
const assign = (
  m: Manager,
  assignment: Parameters<TablesShape["assign"]>[0]
): Effect.Effect<void, TableManager.TableManagerError> =>
  Effect.gen(function* () {
    if (!m.holdsState) return
    const actives = sourceToChangelogs(m, assignment.active)
    const activeIds = new Set(actives.map(({ table, partition }) => partitionId(table, partition)))
    // A partition active here (from this call or an earlier one) is never demoted to a standby.
    const standbys = sourceToChangelogs(m, assignment.standby ?? []).filter(
      ({ table, partition }) =>
        !activeIds.has(partitionId(table, partition)) && table.partitions.get(partition)?.standby !== false
    )
    for (const { table, partition } of actives) yield* openPartition(m, table, partition, false)
    for (const { table, partition } of standbys) yield* openPartition(m, table, partition, true)
    if (m.recovery !== undefined && actives.length + standbys.length > 0) {
      yield* m.recovery.assign({ active: changelogTps(actives), standby: changelogTps(standbys) }).pipe(Effect.orDie)
    }
  }).pipe(Effect.mapError(asManagerError))

/** Returns once the tables of these source partitions are restored. */
const waitUntilReady = (m: Manager, tps: ReadonlyArray<Models.TopicPartition>) =>
  Effect.suspend(() =>
    m.recovery === undefined || !m.holdsState
      ? Effect.void
      : m.recovery
          .waitUntilReady(changelogTps(sourceToChangelogs(m, tps)))
          .pipe(Effect.mapError((e) => managerError(new TableManager.TableRecoveryFailed({ reason: e.reason }))))
  )

/** Lets revoked source partitions' tables go (no record of them is being processed): persisted, then closed. */
const revokeIdle = (m: Manager, tps: ReadonlyArray<Models.TopicPartition>) =>
  Effect.gen(function* () {
    if (!m.holdsState) return
    const revoked = sourceToChangelogs(m, tps)
    if (m.recovery !== undefined && revoked.length > 0)
      yield* m.recovery.revoke(changelogTps(revoked)).pipe(Effect.orDie)
    for (const tp of tps) m.links.delete(Models.tpKey(tp))
    for (const { table, partition } of revoked) {
      const w = table.partitions.get(partition)
      // What was sent is flushed with its changelog offset (the store stays equal to a changelog prefix). With
      // exactly_once what is still buffered was not committed: it is dropped with its transaction.
      if (w !== undefined) {
        if (m.exactlyOnce) PartitionWrites.discard(w)
        else yield* flushPartition(table, w, partition, [])
      }
      yield* closePartition(table, partition)
    }
  })

/** After a failed commit: forgets what no store holds, replaces the producer and restores every open partition. */
const rewind = (m: Manager): TablesShape["rewind"] =>
  Effect.gen(function* () {
    if (!m.holdsState) return
    // Every write not in a store is forgotten; the changelogs hold what was acknowledged.
    for (const table of m.tables.values()) for (const w of table.partitions.values()) PartitionWrites.discard(w)
    m.links.clear()
    m.unlinked.clear()
    yield* m.producer.close
    if (m.recovery === undefined) return
    const active: Array<Models.TopicPartition> = []
    const standby: Array<Models.TopicPartition> = []
    for (const table of m.tables.values()) {
      for (const [partition, w] of table.partitions) {
        ;(w.standby ? standby : active).push({ topic: table.info.changelogTopic, partition })
      }
    }
    // Restored again from what the stores persisted: recovery replays the changelog records past it.
    yield* m.recovery.revoke([...active, ...standby]).pipe(Effect.orDie)
    yield* m.recovery.assign({ active, standby }).pipe(Effect.orDie)
  })

/** One past the last source offset of `tp` whose writes are in the tables (stores or replayed changelog). */
const resumeOffset = (m: Manager, tp: Models.TopicPartition) =>
  Effect.gen(function* () {
    let best = m.replayed.get(Models.tpKey(tp))
    for (const table of m.tables.values()) {
      for (const w of table.partitions.values()) {
        const persisted = yield* w.store.persistedOffset(tp).pipe(Effect.mapError(storeFailed(table.info.name)))
        if (Option.isSome(persisted) && (best === undefined || persisted.value > best)) best = persisted.value
      }
    }
    return Option.fromNullishOr(best)
  })

/** The table manager as a layer providing `Tables` and core's `TableManager`. */
export const layer = (
  options: TablesOptions
): Layer.Layer<Tables | TableManager.TableManager, TableManager.TableManagerError, Store.Store | Log.Log> =>
  Layer.effectContext(
    Effect.map(make(options), (service) =>
      Context.make(Tables, service).pipe(Context.add(TableManager.TableManager, service.manager))
    )
  )

/** Like `layer`, with the options read from configuration and validated (a bad value names its key). */
export const layerConfig = (
  options: Config.Config<TablesOptions> = config()
): Layer.Layer<
  Tables | TableManager.TableManager,
  TableManager.TableManagerError | Config.ConfigError,
  Store.Store | Log.Log
> => Layer.unwrap(Effect.map(options, layer))
