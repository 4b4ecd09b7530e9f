/**
 * The table manager (Faust's `TableManager`; docs/ARCHITECTURE.md, "How a record flows") on core's `Store`
 * and `Log`: registers tables, builds their changelog channel, hands changelog
 * partitions to recovery on assignment, and persists offsets on commit.
 *
 * Writes: `set` / `delete` produce a changelog record (key = table key,
 * partition = the source partition) and keep the change in a write-behind
 * buffer that reads see at once. Nothing reaches the store until the source
 * partition commits: `onCommit` writes the buffered changes, the changelog
 * offset they reach and the committed source offset in **one atomic store
 * batch** — so after a crash a store always equals its changelog replayed up to
 * the persisted offset. A lower pending offset never replaces a higher one.
 *
 * Beyond Faust: pending offsets are linked to the source partition whose
 * processing wrote them, so committing a source partition flushes every
 * changelog partition it wrote to (Faust keys them by the changelog partition
 * and looks them up by the source partition, so they are lost when the two
 * differ). Each changelog record carries the source record it came from
 * (header `strata-source`), and `process` produces all writes of one source
 * record in one batch; after recovery `resumeOffset` says where to resume the
 * source so that no record is applied twice.
 *
 * @since 0.1.0
 */
import {
  type ChangelogSource,
  del,
  type Header,
  InvalidTable,
  InvalidTableManagerOptions,
  Log,
  type LogConsumer,
  type LogError,
  type LogRecord,
  type LogShape,
  type Offset,
  type PartitionStore,
  type ProducerRecord,
  put,
  type RecoveryShape,
  RestoreFailed,
  type RestoreTarget,
  Store,
  type StoreError,
  type StoreOp,
  type StoreShape,
  StoreValidation,
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
  type Cause,
  Config,
  Context,
  Deferred,
  Duration,
  Effect,
  Exit,
  Fiber,
  Layer,
  Option,
  Queue,
  Result,
  Schema,
  Scope,
  Semaphore,
  Stream
} from "effect"
import { advance } from "./internal/offsets.js"
import {
  ChangelogFailed,
  type Codecs,
  codecs as codecsOf,
  changelogTopicOf,
  InvalidPartition,
  keyPartition,
  PartitionNotAvailable,
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
  /** Acks of changelog writes (default `all`). */
  readonly acks?: 0 | 1 | "all"
  /** Options of the recovery the manager starts. */
  readonly recovery?: ChangelogRecovery.ChangelogRecoveryOptions
}

/** The settings `config` reads, validated with Schema (a bad value fails naming its key). */
export const TablesSettings = Schema.Struct({
  app: Schema.String.check(Schema.isMinLength(1)),
  mode: Schema.optional(Schema.Literals(["worker", "producer-only", "client-only"])),
  streamBufferMaxsize: Schema.optional(Schema.Int.check(Schema.isGreaterThan(0))),
  settleDelayMs: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))),
  acks: Schema.optional(Schema.Literals(["0", "1", "all"])),
  recoveryDelayMs: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))),
  recoveryBufferSize: Schema.optional(Schema.Int.check(Schema.isGreaterThan(0))),
  onInconsistency: Schema.optional(Schema.Literals(["fail", "wipe"]))
})

/**
 * The manager's options from configuration under `path` (default `tables`): `app`, `mode`,
 * `streamBufferMaxsize`, `settleDelayMs`, `acks`, `recoveryDelayMs`, `recoveryBufferSize`, `onInconsistency`.
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
    recovery: {
      ...(s.recoveryDelayMs === undefined ? {} : { recoveryDelay: Duration.millis(s.recoveryDelayMs) }),
      ...(s.recoveryBufferSize === undefined ? {} : { recoveryBufferSize: s.recoveryBufferSize }),
      ...(s.onInconsistency === undefined ? {} : { onInconsistency: s.onInconsistency })
    }
  }))

const invalidOption = (option: string, detail: string) =>
  new TableManagerError({ reason: new InvalidTableManagerOptions({ option, detail }) })

/** Checks options given in code (configuration is checked by `config`). */
const checkOptions = (options: TablesOptions): TableManagerError | undefined => {
  if (options.app.length === 0) return invalidOption("app", "must not be empty")
  const size = options.streamBufferMaxsize
  if (size !== undefined && (!Number.isSafeInteger(size) || size < 1)) {
    return invalidOption("streamBufferMaxsize", `must be a positive integer, got ${size}`)
  }
  if (options.settleDelay !== undefined && Option.isNone(Duration.fromInput(options.settleDelay))) {
    return invalidOption("settleDelay", `not a duration: ${String(options.settleDelay)}`)
  }
  for (const name of ["recoveryBufferSize", "standbyBufferSize"] as const) {
    const buffer = options.recovery?.[name]
    if (buffer !== undefined && (!Number.isSafeInteger(buffer) || buffer < 1)) {
      return invalidOption(`recovery.${name}`, `must be a positive integer, got ${buffer}`)
    }
  }
  return undefined
}

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
  /** Every entry of a partition, in key-byte order (including the worker's uncommitted writes). */
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
   * Runs `effect` as the processing of one source record: its writes go to the source record's partition,
   * are produced in one batch carrying the source offset, and are linked to the source partition for `onCommit`.
   */
  readonly process: <A, E, R>(
    source: TopicPartitionOffset,
    effect: Effect.Effect<A, E, R>
  ) => Effect.Effect<A, E | TableError, R>
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

const SOURCE_HEADER = "strata-source"
const encoder = new TextEncoder()
const decoder = new TextDecoder()

/** The value of a record's `strata-source` header, if it has one. */
const sourceHeaderOf = (headers: ReadonlyArray<Header>): Uint8Array | undefined => {
  for (const h of headers) if (h.key === SOURCE_HEADER) return h.value
  return undefined
}

/** The source record a `strata-source` header's text names (`["topic",partition,offset]`), if it is one. */
const parseSource = (text: string): TopicPartitionOffset | undefined => {
  try {
    const [topic, partition, offset] = JSON.parse(text) as [unknown, unknown, unknown]
    return typeof topic === "string" && Number.isSafeInteger(partition) && Number.isSafeInteger(offset)
      ? { topic, partition: partition as number, offset: offset as number }
      : undefined
  } catch {
    return undefined
  }
}

/** Longest run of offset digits read from bytes: 15 decimal digits always fit a safe integer. */
const MAX_DIGITS = 15

/** In a header ending `,<digits>]`, the index of that comma; -1 for any other shape. */
const sourceOffsetComma = (v: Uint8Array): number => {
  const close = v.length - 1
  if (close < 2 || v[close] !== 0x5d) return -1
  let i = close - 1
  while (i >= 0 && close - i <= MAX_DIGITS && v[i]! >= 0x30 && v[i]! <= 0x39) i--
  return i >= 0 && i < close - 1 && v[i] === 0x2c ? i : -1
}

/** The decimal number written in `v[from, to)` (ASCII digits only, checked by `sourceOffsetComma`). */
const digitsAt = (v: Uint8Array, from: number, to: number): number => {
  let n = 0
  for (let i = from; i < to; i++) n = n * 10 + (v[i]! - 0x30)
  return n
}

/** Whether `a` and `b` (both at least `length` long) agree on their first `length` bytes. */
const samePrefix = (a: Uint8Array, b: Uint8Array, length: number): boolean => {
  if (a === b) return true
  for (let i = 0; i < length; i++) if (a[i] !== b[i]) return false
  return true
}

/** Records fetched from one partition, with the channel generation they were received in. */
interface Chunk {
  readonly generation: number
  readonly records: ReadonlyArray<LogRecord>
  /** Queue room the chunk holds (records), given back when it is fully taken or dropped. */
  readonly room: number
}

interface Change {
  readonly key: Uint8Array
  readonly value: Uint8Array | null
  /** The changelog offset of the change, once produced (-1 when unknown, with acks 0). */
  readonly offset?: number
}

interface PartitionState {
  readonly store: PartitionStore
  readonly scope: Scope.Closeable
  /** Changes produced to the changelog, not yet in the store, by key (base64). */
  readonly dirty: Map<string, Change>
  /** The highest changelog offset produced, not yet persisted. */
  pending: number | undefined
  /** Per source partition, one past the last source record whose writes are buffered here. */
  readonly sources: Map<string, TopicPartitionOffset>
  /**
   * Writers hold one permit from before their produce until their changes are buffered; a flush holds them all,
   * so it never persists an offset ahead of a change still in flight, nor loses a change buffered meanwhile.
   */
  readonly lock: Semaphore.Semaphore
  /** A standby replica: restored and tailed, not written (until promoted). */
  standby: boolean
}

const EXCLUSIVE = 1 << 30

interface Registered {
  readonly info: TableInfo
  readonly partitions: Map<number, PartitionState>
}

interface SourceLink {
  readonly tp: TopicPartition
  /** Changelog partitions written while processing this source partition: `<table>|<partition>`. */
  readonly changelogs: Set<string>
}

/** The writes of one `process` call, in order, and a view for reading them back. */
interface Collector {
  readonly source: TopicPartitionOffset | undefined
  readonly writes: Array<{ readonly table: Registered; readonly partition: number; readonly change: Change }>
  readonly view: Map<string, Change>
}

/** The source record being processed, if any (set by `process`). */
const CurrentCollector = Context.Reference<Collector | undefined>("@strata/tables/Tables/CurrentCollector", {
  defaultValue: () => undefined
})

/** Recovery's default `recoveryBufferSize` and `standbyBufferSize`. */
const DEFAULT_RESTORE_BATCH = 1000

const keyId = (key: Uint8Array): string => Buffer.from(key).toString("base64")
const managerError = (reason: TableManagerError["reason"]) => new TableManagerError({ reason })

const compareBytes = (a: Uint8Array, b: Uint8Array): number => Buffer.compare(a, b)

/** Builds the table manager on the `Store` and `Log` in context; `stop` runs when the scope closes. */
export const make = (
  options: TablesOptions
): Effect.Effect<TablesShape, TableManagerError, Store | Log | Scope.Scope> =>
  Effect.gen(function* () {
    const invalid = checkOptions(options)
    if (invalid !== undefined) return yield* Effect.fail(invalid)
    const store: StoreShape = yield* Store
    const log: LogShape = yield* Log
    const scope = yield* Effect.scope
    const mode: Mode = options.mode ?? "worker"
    const holdsState = mode === "worker"
    const capacity = Math.max(1, options.streamBufferMaxsize ?? 4096)
    const settleDelay = Duration.fromInputUnsafe(options.settleDelay ?? "1 second")
    const acks = options.acks ?? "all"

    const tables = new Map<string, Registered>()
    const byChangelog = new Map<string, Registered>()
    const links = new Map<string, SourceLink>()
    /** Partitions written outside `process` (no source partition to wait for): flushed by the next commit. */
    const unlinked = new Set<string>()
    /** Highest source offset (next to read) replayed from changelog headers, by source partition. */
    const replayed = new Map<string, number>()
    let finalized = false
    let stopping = false
    let stopped = false
    let recovery: RecoveryShape | undefined
    let consumer: LogConsumer | undefined
    let fetcher: Fiber.Fiber<unknown, unknown> | undefined
    let recoveryScope: Scope.Closeable | undefined
    /**
     * Chunks fetched for recovery, tagged with the channel's generation when the fetcher received them. The queue is
     * bounded in records, not chunks: the fetcher takes room for a chunk's records before offering it (backpressure).
     */
    const queue = yield* Queue.unbounded<Chunk, LogError>()
    const room = Semaphore.makeUnsafe(capacity)
    let held = 0
    /** The part of a chunk `take` could not hand out yet. */
    let leftover: { readonly chunk: Chunk; readonly from: number } | undefined
    const giveBack = (chunk: Chunk) =>
      Effect.suspend(() => {
        held -= chunk.room
        return Semaphore.release(room, chunk.room)
      })
    /**
     * Bumped by every seek and resume: records received before are stale (their positions were overwritten), also
     * the ones a fetcher blocked on the full queue pushes after the queue was cleared.
     */
    let generation = 0
    const registered = yield* Deferred.make<void>()
    if (!holdsState) yield* Deferred.succeed(registered, undefined)

    const tableError = (reason: TableError["reason"]) => new TableError({ reason })
    const storeFailed = (table: string) => (cause: StoreError) => tableError(new TableStoreFailed({ table, cause }))

    // --- partitions -------------------------------------------------------

    const partitionState = (table: Registered, partition: number) =>
      Effect.suspend(() => {
        if (!Number.isSafeInteger(partition) || partition < 0 || partition >= table.info.partitions) {
          return Effect.fail(
            tableError(new InvalidPartition({ table: table.info.name, partition, partitions: table.info.partitions }))
          )
        }
        const state = table.partitions.get(partition)
        return state === undefined
          ? Effect.fail(
              tableError(
                new PartitionNotAvailable({
                  table: table.info.name,
                  partition,
                  detail: "not assigned to this worker"
                })
              )
            )
          : Effect.succeed(state)
      })

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
        table.partitions.set(partition, {
          lock: Semaphore.makeUnsafe(EXCLUSIVE),
          standby,
          store: opened,
          scope: child,
          dirty: new Map(),
          pending: undefined,
          sources: new Map()
        })
      })

    /** Writes a partition's buffered changes and pending offset (plus `extra` offsets) in one batch. */
    const flushPartition = (
      table: Registered,
      state: PartitionState,
      partition: number,
      extra: ReadonlyArray<TopicPartitionOffset>
    ) =>
      Semaphore.withPermits(
        state.lock,
        EXCLUSIVE
      )(
        Effect.gen(function* () {
          if (state.dirty.size === 0 && state.pending === undefined && extra.length === 0) return
          const ops: Array<StoreOp> = []
          for (const change of state.dirty.values())
            ops.push(change.value === null ? del(change.key) : put(change.key, change.value))
          // The source offsets of every buffered write go with it: the store then says where to resume each source.
          const sources = new Map(state.sources)
          for (const o of extra) {
            const seen = sources.get(tpKey(o))
            if (seen === undefined || o.offset > seen.offset) sources.set(tpKey(o), o)
          }
          const offsets: Array<TopicPartitionOffset> = [...sources.values()]
          if (state.pending !== undefined) {
            offsets.push({ topic: table.info.changelogTopic, partition, offset: state.pending })
          }
          yield* state.store.write(ops, { offsets }).pipe(Effect.mapError(storeFailed(table.info.name)))
          state.dirty.clear()
          state.pending = undefined
          state.sources.clear()
        })
      )

    const closePartition = (table: Registered, partition: number) =>
      Effect.gen(function* () {
        const state = table.partitions.get(partition)
        if (state === undefined) return
        table.partitions.delete(partition)
        yield* Scope.close(state.scope, Exit.void)
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
        const table: Registered = { info, partitions: new Map() }
        tables.set(info.name, table)
        byChangelog.set(info.changelogTopic, table)
        return table
      })

    // --- writes -----------------------------------------------------------

    const sourceHeader = (source: TopicPartitionOffset): Header => ({
      key: SOURCE_HEADER,
      value: encoder.encode(JSON.stringify([source.topic, source.partition, source.offset]))
    })

    /** Produces a collector's writes in one batch, then applies them to the buffers and links them. */
    const commitCollector = (collector: Collector): Effect.Effect<void, TableError> =>
      Effect.suspend(() => {
        if (collector.writes.length === 0) return Effect.void
        // One shared permit on every partition written, taken in a fixed order, held until the changes are buffered.
        const locks = new Map<string, Semaphore.Semaphore>()
        for (const w of collector.writes) {
          const state = w.table.partitions.get(w.partition)
          if (state !== undefined) locks.set(`${w.table.info.name}|${w.partition}`, state.lock)
        }
        return [...locks.entries()]
          .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
          .reduce<Effect.Effect<void, TableError>>(
            (inner, [, lock]) => Semaphore.withPermits(lock, 1)(inner),
            produceAndBuffer(collector)
          )
      })

    const produceAndBuffer = (collector: Collector) =>
      Effect.gen(function* () {
        const headers = collector.source === undefined ? [] : [sourceHeader(collector.source)]
        const records: Array<ProducerRecord> = collector.writes.map((w) => ({
          topic: w.table.info.changelogTopic,
          partition: w.partition,
          key: w.change.key,
          value: w.change.value,
          headers
        }))
        const offsets = yield* log
          .produceBatch(records, { acks })
          .pipe(
            Effect.mapError((cause) =>
              tableError(new ChangelogFailed({ table: collector.writes[0]!.table.info.name, cause }))
            )
          )
        const link =
          collector.source === undefined
            ? undefined
            : (() => {
                const key = tpKey(collector.source)
                let found = links.get(key)
                if (found === undefined) {
                  found = {
                    tp: { topic: collector.source.topic, partition: collector.source.partition },
                    changelogs: new Set()
                  }
                  links.set(key, found)
                }
                return found
              })()
        for (const [i, w] of collector.writes.entries()) {
          const state = w.table.partitions.get(w.partition)
          // The partition was revoked while the record was processed: the changelog has the write, the next owner replays it.
          if (state === undefined) continue
          const offset = offsets[i] ?? -1
          // Concurrent writers can finish out of order: the change with the higher changelog offset wins, as in a replay.
          const id = keyId(w.change.key)
          const buffered = state.dirty.get(id)
          if (buffered === undefined || offset < 0 || (buffered.offset ?? -1) <= offset) {
            state.dirty.set(id, { ...w.change, offset })
          }
          // A lower offset never replaces a higher one.
          state.pending = advance(state.pending, offset)
          if (collector.source !== undefined) {
            const next = { ...collector.source, offset: collector.source.offset + 1 }
            const seen = state.sources.get(tpKey(next))
            if (seen === undefined || next.offset > seen.offset) state.sources.set(tpKey(next), next)
          }
          if (link === undefined) unlinked.add(`${w.table.info.name}|${w.partition}`)
          else link.changelogs.add(`${w.table.info.name}|${w.partition}`)
        }
      })

    const process: TablesShape["process"] = (source, effect) =>
      Effect.gen(function* () {
        const collector: Collector = { source, writes: [], view: new Map() }
        const a = yield* Effect.provideService(effect, CurrentCollector, collector)
        yield* commitCollector(collector)
        return a
      })

    // --- handles ----------------------------------------------------------

    const handleOf = <K, V>(table: Registered, codecs: Codecs<K, V>): TableHandle<K, V> => {
      const name = table.info.name
      const partitions = table.info.partitions
      const encodeKey = (key: K) => {
        const r = codecs.encodeKey(key)
        return Result.isFailure(r) ? Effect.fail(tableError(r.failure)) : Effect.succeed(r.success)
      }
      const decodeValue = (bytes: Uint8Array) => {
        const r = codecs.decodeValue(bytes)
        return Result.isFailure(r) ? Effect.fail(tableError(r.failure)) : Effect.succeed(r.success)
      }
      const resolve = (
        encodedKey: Uint8Array,
        options: PartitionOption | undefined,
        collector: Collector | undefined
      ) =>
        options?.partition ??
        (collector?.source !== undefined && table.info.kind === "table"
          ? collector.source.partition
          : keyPartition(encodedKey, partitions))

      const readRaw = (key: K, options?: PartitionOption) =>
        Effect.gen(function* () {
          const collector = yield* CurrentCollector
          const k = yield* encodeKey(key)
          const partition = resolve(k, options, collector)
          const state = yield* partitionState(table, partition)
          const id = `${name}|${partition}|${keyId(k)}`
          const own = collector?.view.get(id)
          if (own !== undefined) return Option.fromNullishOr(own.value)
          const dirty = state.dirty.get(keyId(k))
          if (dirty !== undefined) return Option.fromNullishOr(dirty.value)
          return yield* state.store.get(k).pipe(Effect.mapError(storeFailed(name)))
        })

      const get = (key: K, options?: PartitionOption) =>
        Effect.flatMap(readRaw(key, options), (raw) =>
          Option.isNone(raw) ? Effect.succeed(Option.none<V>()) : Effect.map(decodeValue(raw.value), Option.some)
        )

      const write = (key: K, value: Option.Option<V>, options?: PartitionOption) =>
        Effect.gen(function* () {
          const k = yield* encodeKey(key)
          let v: Uint8Array | null = null
          if (Option.isSome(value)) {
            const r = codecs.encodeValue(value.value)
            if (Result.isFailure(r)) return yield* Effect.fail(tableError(r.failure))
            v = r.success
          }
          const current = yield* CurrentCollector
          const partition = resolve(k, options, current)
          const target = yield* partitionState(table, partition)
          if (target.standby) {
            return yield* Effect.fail(
              tableError(
                new PartitionNotAvailable({ table: name, partition, detail: "a standby replica here: not writable" })
              )
            )
          }
          const collector: Collector = current ?? { source: undefined, writes: [], view: new Map() }
          const change: Change = { key: k, value: v }
          collector.writes.push({ table, partition, change })
          collector.view.set(`${name}|${partition}|${keyId(k)}`, change)
          // Outside `process`, a write is produced (and buffered) on its own.
          if (current === undefined) yield* commitCollector(collector)
        })

      const handle: TableHandle<K, V> = {
        info: table.info,
        get,
        has: (key, options) => Effect.map(readRaw(key, options), Option.isSome),
        set: (key, value, options) => write(key, Option.some(value), options),
        delete: (key, options) => write(key, Option.none(), options),
        update: (key, f, options) =>
          Effect.gen(function* () {
            const next = f(yield* get(key, options))
            yield* write(key, Option.some(next), options)
            return next
          }),
        entries: (partition) =>
          Effect.gen(function* () {
            const state = yield* partitionState(table, partition)
            const merged = new Map<string, Change>()
            const stored = yield* Stream.runCollect(state.store.scan()).pipe(Effect.mapError(storeFailed(name)))
            for (const [k, v] of stored) merged.set(keyId(k), { key: k, value: v })
            for (const [id, change] of state.dirty) merged.set(id, change)
            const collector = yield* CurrentCollector
            if (collector !== undefined) {
              for (const w of collector.writes) {
                if (w.table === table && w.partition === partition) merged.set(keyId(w.change.key), w.change)
              }
            }
            const live: Array<{ readonly key: Uint8Array; readonly value: Uint8Array }> = []
            for (const c of merged.values()) if (c.value !== null) live.push({ key: c.key, value: c.value })
            live.sort((a, b) => compareBytes(a.key, b.key))
            const out: Array<readonly [K, V]> = []
            for (const c of live) {
              const k = codecs.decodeKey(c.key)
              if (Result.isFailure(k)) return yield* Effect.fail(tableError(k.failure))
              out.push([k.success, yield* decodeValue(c.value)] as const)
            }
            return out
          }),
        scan: (partition) => Stream.unwrap(Effect.map(handle.entries(partition), Stream.fromIterable))
      }
      return handle
    }

    // --- the changelog channel and recovery --------------------------------

    const changelogPartitionsOf = (table: Registered): Array<TopicPartition> =>
      Array.from({ length: table.info.partitions }, (_, partition) => ({ topic: table.info.changelogTopic, partition }))

    const requireConsumer = Effect.suspend(() =>
      consumer === undefined
        ? Effect.die(new Error("the changelog channel is not built: call start first"))
        : Effect.succeed(consumer)
    )

    /** Drops every queued chunk (and a partly taken one), giving their room back. */
    const dropQueued = Effect.gen(function* () {
      if (leftover !== undefined) {
        const { chunk } = leftover
        leftover = undefined
        yield* giveBack(chunk)
      }
      const dropped = yield* Queue.clear(queue).pipe(Effect.orElseSucceed(() => [] as Array<Chunk>))
      for (const chunk of dropped) yield* giveBack(chunk)
    })

    /** The channel recovery reads: one consumer for all changelogs feeding the shared bounded queue. */
    const source: ChangelogSource = {
      offsets: (tps) => log.offsets(tps),
      seek: (tp, offset) =>
        Effect.flatMap(requireConsumer, (c) =>
          Effect.tap(c.seek(tp, offset), () =>
            Effect.sync(() => {
              generation++
            })
          )
        ),
      resume: (tps) =>
        Effect.gen(function* () {
          const c = yield* requireConsumer
          // Records fetched before (from positions now overwritten by a seek) are dropped: the queue clears on resume.
          generation++
          yield* dropQueued
          yield* c.resume(tps)
        }),
      pause: (tps) => Effect.flatMap(requireConsumer, (c) => c.pause(tps)),
      take: (max) =>
        Effect.gen(function* () {
          const out: Array<LogRecord> = []
          // Wait for one chunk, then add what is already queued, up to `max` records. Only whole chunks join a
          // take already started: a chunk that does not fit waits for the next take rather than being split, so a
          // partition's store gets one large batch instead of a large one and a small one (a write costs the store
          // per batch as well as per record: 480 records per write on average became about 950).
          let next: { chunk: Chunk; from: number } | undefined = leftover
          leftover = undefined
          if (next === undefined) next = { chunk: yield* Queue.take(queue), from: 0 }
          while (next !== undefined) {
            const { chunk, from } = next
            if (chunk.generation !== generation) {
              yield* giveBack(chunk)
            } else {
              if (out.length > 0 && chunk.records.length - from > max - out.length) {
                leftover = next
                break
              }
              const n = Math.min(chunk.records.length - from, max - out.length)
              for (let i = from; i < from + n; i++) out.push(chunk.records[i]!)
              if (from + n < chunk.records.length) {
                leftover = { chunk, from: from + n }
                break
              }
              yield* giveBack(chunk)
            }
            if (out.length >= max) break
            const polled = yield* Queue.poll(queue)
            next = Option.isSome(polled) ? { chunk: polled.value, from: 0 } : undefined
          }
          return out
        }),
      position: (tp) => Effect.flatMap(requireConsumer, (c) => c.position(tp)),
      fetching: (tp) =>
        Effect.flatMap(requireConsumer, (c) =>
          Effect.map(c.paused, (paused) => !paused.some((p) => p.topic === tp.topic && p.partition === tp.partition))
        ).pipe(Effect.orElseSucceed(() => false))
    }

    const restoreFailed = (tp: TopicPartition, detail: string) =>
      new RestoreFailed({ topic: tp.topic, partition: tp.partition, detail })

    const stateFor = (tp: TopicPartition) =>
      Effect.suspend(() => {
        const table = byChangelog.get(tp.topic)
        const state = table?.partitions.get(tp.partition)
        return table === undefined || state === undefined
          ? Effect.fail(restoreFailed(tp, "the changelog partition's table partition is not open here"))
          : Effect.succeed({ table, state })
      })

    /** Applies changelog records to a partition's store with their offset (and the source offsets they carry). */
    const applyRecords = (tp: TopicPartition, state: PartitionState, records: ReadonlyArray<LogRecord>) =>
      Effect.gen(function* () {
        if (records.length === 0) return
        const ops: Array<StoreOp> = new Array(records.length)
        let n = 0
        // Per source partition (the header's `["topic",partition,` prefix), the highest source offset seen: the
        // offset is read from the header's bytes and the prefix decoded only when it differs from the previous one.
        const highest = new Map<string, number>()
        let lastPrefix: Uint8Array | undefined
        let lastPrefixLength = -1
        let lastPrefixText = ""
        for (const r of records) {
          if (r.key === null) continue
          ops[n++] = r.value === null ? del(r.key) : put(r.key, r.value)
          // The buffered change of a key, if any, is older than the changelog record: drop it.
          if (state.dirty.size > 0) state.dirty.delete(keyId(r.key))
          const header = sourceHeaderOf(r.headers)
          if (header === undefined) continue
          const comma = sourceOffsetComma(header)
          let prefix: string
          let offset: number
          if (comma < 0) {
            // Not the usual shape: the general path.
            const text = decoder.decode(header)
            const at = text.lastIndexOf(",")
            offset = Number(text.slice(at + 1, -1))
            prefix = text.slice(0, at + 1)
          } else {
            offset = digitsAt(header, comma + 1, header.length - 1)
            if (
              lastPrefix === undefined ||
              lastPrefixLength !== comma + 1 ||
              !samePrefix(lastPrefix, header, comma + 1)
            ) {
              lastPrefix = header
              lastPrefixLength = comma + 1
              lastPrefixText = decoder.decode(header.subarray(0, comma + 1))
            }
            prefix = lastPrefixText
          }
          if (Number.isSafeInteger(offset) && offset > (highest.get(prefix) ?? -1)) highest.set(prefix, offset)
        }
        ops.length = n
        const sources: Array<TopicPartitionOffset> = []
        for (const [prefix, offset] of highest) {
          const from = parseSource(`${prefix}${offset}]`)
          // A header naming no valid source (not written by `process`) is ignored, not a reason to fail the restore.
          if (from === undefined || StoreValidation.checkOffsets([from]) !== undefined) continue
          const key = tpKey(from)
          const seen = Math.max(replayed.get(key) ?? 0, from.offset + 1)
          replayed.set(key, seen)
          sources.push({ topic: from.topic, partition: from.partition, offset: seen })
        }
        const last = records[records.length - 1]!.offset
        yield* state.store
          .write(ops, { offsets: [{ topic: tp.topic, partition: tp.partition, offset: last }, ...sources] })
          .pipe(Effect.mapError((e) => restoreFailed(tp, e.message)))
      })

    /** What recovery restores into: the open partition stores. */
    const target: RestoreTarget = {
      persistedOffset: (tp) =>
        Effect.flatMap(stateFor(tp), ({ state }) =>
          state.store.persistedOffset(tp).pipe(Effect.mapError((e) => restoreFailed(tp, e.message)))
        ),
      apply: (tp, records) =>
        Effect.flatMap(stateFor(tp), ({ state }) =>
          Semaphore.withPermits(state.lock, EXCLUSIVE)(applyRecords(tp, state, records))
        ),
      wipe: (tp) =>
        Effect.flatMap(stateFor(tp), ({ state }) =>
          Effect.gen(function* () {
            state.dirty.clear()
            state.pending = undefined
            state.sources.clear()
            yield* state.store.clear.pipe(Effect.mapError((e) => restoreFailed(tp, e.message)))
          })
        ),
      flush: Effect.gen(function* () {
        // Buffered changes reach the stores with their offsets, so recovery reads current persisted offsets.
        for (const table of tables.values()) {
          for (const [partition, state] of table.partitions) yield* flushPartition(table, state, partition, [])
        }
        yield* log.flush
      }).pipe(
        Effect.mapError(
          (e) =>
            new RestoreFailed({ topic: "(tables)", partition: 0, detail: `flushing before recovery: ${e.message}` })
        )
      )
    }

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
      const c = yield* log.consumer({ maxBatchRecords: chunk }).pipe(Scope.provide(built))
      consumer = c
      const tps = all.flatMap(changelogPartitionsOf)
      yield* c.assign(tps)
      // Recovery owns the changelog partitions: every one starts paused.
      yield* c.pause(tps)
      fetcher = yield* c.batches.pipe(
        Stream.runForEach((batch) =>
          Effect.gen(function* () {
            if (batch.records.length === 0) return
            const at = generation
            // Room for the chunk's records (a chunk larger than the whole queue takes all of it).
            const needed = Math.min(batch.records.length, capacity)
            yield* Semaphore.take(room, needed)
            held += needed
            yield* Queue.offer(queue, { generation: at, records: batch.records, room: needed })
          })
        ),
        Effect.catchCause((cause: Cause.Cause<LogError>) => Queue.failCause(queue, cause)),
        Effect.forkIn(built)
      )
      const started = yield* ChangelogRecovery.make(source, target, options.recovery).pipe(Scope.provide(built))
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
      // 1. The changelog fetcher.
      if (fetcher !== undefined) yield* Fiber.interrupt(fetcher)
      // 2. Recovery (and the channel's consumer).
      if (recoveryScope !== undefined) yield* Scope.close(recoveryScope, Exit.void)
      recovery = undefined
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
        const state = table?.partitions.get(Number(p))
        return table === undefined || state === undefined ? Effect.void : flushPartition(table, state, Number(p), extra)
      })

    const onCommit: TableManagerShape["onCommit"] = (offsets) =>
      Effect.gen(function* () {
        for (const committed of offsets) {
          const link = links.get(tpKey(committed))
          if (link === undefined) continue
          links.delete(tpKey(committed))
          // The source offset goes in the same atomic batch as the data and the changelog offset.
          for (const id of link.changelogs) yield* flushById(id, [committed])
        }
        // Writes made outside any source record are persisted with the next commit.
        const loose = [...unlinked]
        unlinked.clear()
        for (const id of loose) yield* flushById(id, [])
      }).pipe(Effect.mapError(asManagerError))

    const changelogTps = (list: ReadonlyArray<{ table: Registered; partition: number }>) =>
      list.map(({ table, partition }) => ({ topic: table.info.changelogTopic, partition }))

    const assign: TablesShape["assign"] = (assignment) =>
      Effect.gen(function* () {
        if (!holdsState) return
        const actives = sourceToChangelogs(assignment.active)
        const activeIds = new Set(actives.map(({ table, partition }) => `${table.info.name}|${partition}`))
        const standbys = sourceToChangelogs(assignment.standby ?? []).filter(
          ({ table, partition }) => !activeIds.has(`${table.info.name}|${partition}`)
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
              .pipe(Effect.mapError((e) => managerError(new TableRecoveryFailed({ detail: e.message }))))
      )

    const onPartitionsRevoked: TableManagerShape["onPartitionsRevoked"] = (tps) =>
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
          const state = table.partitions.get(partition)
          // What was produced is flushed with its changelog offset (the store stays equal to a changelog prefix).
          if (state !== undefined) yield* flushPartition(table, state, partition, [])
          yield* closePartition(table, partition)
        }
      }).pipe(Effect.mapError(asManagerError))

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
              Effect.mapError((e) => managerError(new TableRecoveryFailed({ detail: e.message })))
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
        return handleOf(table, codecs)
      })

    const resumeOffset: TablesShape["resumeOffset"] = (tp) =>
      Effect.gen(function* () {
        let best = replayed.get(tpKey(tp))
        for (const table of tables.values()) {
          for (const state of table.partitions.values()) {
            const persisted = yield* state.store.persistedOffset(tp).pipe(Effect.mapError(storeFailed(table.info.name)))
            if (Option.isSome(persisted) && (best === undefined || persisted.value > best)) best = persisted.value
          }
        }
        return Option.fromNullishOr(best)
      })

    return {
      manager,
      register,
      start,
      stop,
      process,
      resumeOffset,
      changelogTopics: Effect.sync(() => new Set(byChangelog.keys())),
      changelogQueue: Effect.sync(() => ({ capacity, size: held })),
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
