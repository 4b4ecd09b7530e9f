/**
 * Core's `Recovery` on a changelog source and a restore target (docs/ARCHITECTURE.md,
 * "Restore"; Faust's `Recovery`, its hangs fixed). After each assignment:
 *
 * 1. wait `recoveryDelay`, flush the tables' buffers and the producer;
 * 2. per active changelog partition read the log start, the highwater and the
 *    store's persisted offset; a store that claims more than its changelog holds
 *    fails with `ConsistencyError` (or, configured, is wiped and restored);
 * 3. seek to `max(persisted + 1, log start)` and apply records in atomic store
 *    batches of `recoveryBufferSize` until every active partition reaches the
 *    highwater captured at the start — judged by the consumer's position, so
 *    transaction markers and compacted gaps at the end never hang it; each
 *    partition is ready (and `waitUntilReady` returns for it) as soon as it
 *    caught up; the next batch is taken and built while one is written (two
 *    in flight at most, a partition's batches in order), so a store writing
 *    off the main thread overlaps with fetching and decoding;
 * 4. log "Worker ready", complete `waitUntilCompleted`, and keep the standby
 *    partitions tailing in batches of `standbyBufferSize`.
 *
 * A partition whose restore fails (its store is ahead of its changelog, a record
 * cannot be restored, its store fails) is set aside: its `waitUntilReady` fails
 * with the reason, the target marks it unusable, the other partitions go on, and
 * `waitUntilCompleted` fails once they are done. It is tried again when it is
 * assigned again.
 *
 * A new assignment while restoring suspends the run and starts over from the
 * stores' persisted offsets: finished partitions are not restored again (until
 * revoked), unfinished ones continue where they were. A standby promoted to active
 * replays only its lag. Progress (a table and an ETA from a moving average of
 * the apply rate, available after the first batch) is logged every
 * `statsInterval`, published as events and as metrics; a partition with no
 * record for `eventTimeout`, or no batch applied for `flushTimeout`, is reported
 * as a classified stall.
 *
 * @since 0.1.0
 */
import { type Log, Models, OptionSchemas, Recovery } from "@strata/core"
import { Clock, Deferred, Duration, Effect, Fiber, Metric, Option, PubSub, Schema, type Scope, Stream } from "effect"

const { DurationOption, decodeOptions, PositiveInt, summary } = OptionSchemas

/**
 * The options `make` takes, checked by this one schema (the table manager checks its `recovery` option with it),
 * with the durations' defaults. Durations are any `Duration.Input` (a number is milliseconds), finite.
 */
export const ChangelogRecoveryOptionsSchema = Schema.Struct({
  /** Pause before restoring, so a burst of rebalances settles (0, none). */
  recoveryDelay: DurationOption("nonNegative").pipe(Schema.withDecodingDefault(Effect.succeed<Duration.Input>(0))),
  /** Records applied per store batch for active partitions (default 1000). */
  recoveryBufferSize: Schema.optional(PositiveInt),
  /** Records applied per store batch for standby partitions (default 1000). */
  standbyBufferSize: Schema.optional(PositiveInt),
  /**
   * A store whose persisted offset is beyond its changelog's highwater: `"fail"` with `ConsistencyError` (default,
   * as Faust), or `"wipe"` the partition's store and restore it from the changelog.
   */
  onInconsistency: Schema.optional(Schema.Literals(["fail", "wipe"])),
  /** How often progress is logged and published (5 seconds). */
  statsInterval: DurationOption("positive").pipe(
    Schema.withDecodingDefault(Effect.succeed<Duration.Input>("5 seconds"))
  ),
  /** A restoring partition with no record for this long is reported stalled (30 seconds). */
  eventTimeout: DurationOption("positive").pipe(
    Schema.withDecodingDefault(Effect.succeed<Duration.Input>("30 seconds"))
  ),
  /** No batch applied for this long while restoring is reported stalled (120 seconds). */
  flushTimeout: DurationOption("positive").pipe(
    Schema.withDecodingDefault(Effect.succeed<Duration.Input>("120 seconds"))
  )
})

/** Options of the changelog recovery, as `make` takes them (see `ChangelogRecoveryOptionsSchema`). */
export type ChangelogRecoveryOptions = typeof ChangelogRecoveryOptionsSchema.Encoded

/** `make` was given options its schema refuses; `detail` names each bad option. */
export class InvalidRecoveryOptions extends Schema.TaggedError<InvalidRecoveryOptions>()("InvalidRecoveryOptions", {
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `changelog recovery: invalid options: ${this.detail}`
  }
}

/** Recovery metrics (attribute `topic`). */
export const metrics = {
  /** Records applied from changelogs. */
  recordsApplied: Metric.counter("strata_recovery_records_applied_total", {
    description: "Changelog records applied to table stores by recovery",
    incremental: true
  }),
  /** Records still to restore before the active partitions are ready. */
  remaining: Metric.gauge("strata_recovery_remaining_records", {
    description: "Changelog records left to restore in active partitions"
  }),
  /** Changelog records set aside (dead-lettered) because they could not be restored. */
  recordsSkipped: Metric.counter("strata_recovery_records_skipped_total", {
    description: "Changelog records recovery could not restore and set aside",
    incremental: true
  })
} as const

interface Progress {
  readonly tp: Models.TopicPartition
  readonly standby: boolean
  /** The highwater captured at the start (actives); standbys follow the live highwater. */
  highwater: Models.Offset
  /** The next offset to apply. */
  offset: Models.Offset
  ready: boolean
  lastEventAt: number
}

/**
 * Batches applied at once. Two: while one is written, the next is built (LevelDB writes off the main thread,
 * RocksDB on it); more did not help.
 */
const IN_FLIGHT = 2

const restoreFailed = (tp: Models.TopicPartition, detail: string) =>
  new Recovery.RecoveryError({
    reason: new Recovery.RestoreFailed({ topic: tp.topic, partition: tp.partition, detail })
  })

const pad = (text: string, width: number) => (text.length >= width ? text : text + " ".repeat(width - text.length))

/** Progress as the table the log shows: topic, partition, highwater, offset, remaining. */
export const formatStats = (stats: Recovery.Stats): string => {
  const rows = [
    ["topic", "partition", "highwater", "offset", "remaining"],
    ...stats.partitions.map((p) => [
      p.topic + (p.standby ? " (standby)" : ""),
      String(p.partition),
      String(p.highwater),
      String(p.offset),
      String(p.remaining)
    ])
  ]
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)))
  const eta = stats.etaMs === undefined ? "unknown until the first batch" : `${Math.ceil(stats.etaMs / 1000)} s`
  return [
    ...rows.map((r) =>
      r
        .map((cell, i) => pad(cell, widths[i]!))
        .join("  ")
        .trimEnd()
    ),
    `remaining ${stats.remaining} records, ETA ${eta}`
  ].join("\n")
}

/** A recovery: what its functions share. `progress` and the rest change as runs start and records are applied. */
interface Run {
  readonly source: Recovery.ChangelogSource
  readonly target: Recovery.RestoreTarget
  readonly delay: Duration.Duration
  readonly bufferSize: number
  readonly standbyBufferSize: number
  readonly statsInterval: Duration.Duration
  readonly eventTimeoutMs: number
  readonly flushTimeoutMs: number
  readonly wipe: boolean
  readonly scope: Scope.Scope
  readonly events: PubSub.PubSub<Recovery.Event>
  active: ReadonlyArray<Models.TopicPartition>
  standby: ReadonlyArray<Models.TopicPartition>
  progress: Map<string, Progress>
  /**
   * Actives restored to their highwater and still assigned: a later run does not restore them again (their tables
   * hold writes newer than the changelog's committed records, which a second restore would overwrite).
   */
  readonly caughtUp: Set<string>
  completed: Deferred.Deferred<void, Recovery.RecoveryError>
  /** Per active partition, completed when it caught up in the current run. */
  readiness: Map<string, Deferred.Deferred<void, Recovery.RecoveryError>>
  running: Fiber.Fiber<void> | undefined
  /** Moving average of the apply rate, records per millisecond (undefined until the first batch). */
  rate: number | undefined
  lastFlushAt: number
  readonly stalled: Set<string>
  /** Partitions whose restore failed, and why: set aside until assigned again. */
  readonly failures: Map<string, Recovery.ErrorReason>
}

/** Builds the recovery; its background restore runs in the scope. */
export const make = (
  source: Recovery.ChangelogSource,
  target: Recovery.RestoreTarget,
  options: ChangelogRecoveryOptions = {}
): Effect.Effect<Recovery.Shape, InvalidRecoveryOptions, Scope.Scope> =>
  Effect.gen(function* () {
    const o = yield* decodeOptions(ChangelogRecoveryOptionsSchema, { exact: true })(options).pipe(
      Effect.mapError((bad) => {
        const { option, value, detail } = summary(bad)
        return new InvalidRecoveryOptions({ detail: `${option} = ${value}: ${detail}` })
      })
    )
    const completed = yield* Deferred.make<void, Recovery.RecoveryError>()
    yield* Deferred.succeed(completed, undefined)
    const r: Run = {
      source,
      target,
      delay: o.recoveryDelay,
      bufferSize: o.recoveryBufferSize ?? 1000,
      standbyBufferSize: o.standbyBufferSize ?? 1000,
      statsInterval: o.statsInterval,
      eventTimeoutMs: Duration.toMillis(o.eventTimeout),
      flushTimeoutMs: Duration.toMillis(o.flushTimeout),
      wipe: o.onInconsistency === "wipe",
      scope: yield* Effect.scope,
      events: yield* PubSub.unbounded<Recovery.Event>(),
      active: [],
      standby: [],
      progress: new Map(),
      caughtUp: new Set(),
      completed,
      readiness: new Map(),
      running: undefined,
      rate: undefined,
      lastFlushAt: 0,
      stalled: new Set(),
      failures: new Map()
    }
    yield* Effect.addFinalizer(() => (r.running === undefined ? Effect.void : Fiber.interrupt(r.running)))
    return shapeOf(r)
  })

const publish = (r: Run, event: Recovery.Event) => PubSub.publish(r.events, event)

const statsNow = (r: Run): Recovery.Stats => {
  const partitions: Array<Recovery.PartitionProgress> = [...r.progress.values()].map((p) => ({
    topic: p.tp.topic,
    partition: p.tp.partition,
    highwater: p.highwater,
    offset: p.offset,
    remaining: Math.max(0, p.highwater - p.offset),
    standby: p.standby
  }))
  const remaining = partitions.filter((p) => !p.standby).reduce((n, p) => n + p.remaining, 0)
  return {
    partitions,
    remaining,
    etaMs: r.rate === undefined || r.rate <= 0 ? undefined : Math.round(remaining / r.rate)
  }
}

/** Sets a partition aside: it stops, its waiters fail with the reason, and the target marks it unusable. */
const failPartition = (r: Run, tp: Models.TopicPartition, reason: Recovery.ErrorReason) =>
  Effect.gen(function* () {
    const key = Models.tpKey(tp)
    r.failures.set(key, reason)
    r.progress.delete(key)
    yield* r.source.pause([tp])
    yield* r.target.failed(tp, reason)
    const waiting = r.readiness.get(key)
    if (waiting !== undefined) yield* Deferred.fail(waiting, new Recovery.RecoveryError({ reason }))
    yield* Effect.logError(`recovery of ${key} failed: ${reason.message}`)
    yield* publish(r, { _tag: "PartitionFailed", topic: tp.topic, partition: tp.partition, reason })
  })

/**
 * The highwater of `tp` once it is past `persisted`, or as it stays: a broker can answer with a high watermark that
 * lags a write it already acknowledged (a new connection, right after the produce), while a changelog that was
 * recreated or truncated stays below. Read again for up to a second before judging the store ahead of it.
 */
const settledHighwater = (r: Run, tp: Models.TopicPartition, persisted: number, first: number) =>
  Effect.gen(function* () {
    let highwater = first
    for (let attempt = 0; attempt < 10 && persisted >= highwater; attempt++) {
      yield* Effect.sleep("100 millis")
      const [o] = yield* r.source.offsets([tp]).pipe(Effect.mapError((e) => restoreFailed(tp, e.message)))
      if (o !== undefined) highwater = o.highwater
    }
    return highwater
  })

/**
 * Reads offsets and the persisted position of `tps`, checks consistency and seeks; returns their progress. A
 * partition that cannot be restored is set aside (`failPartition`); one set aside before and fine now is usable
 * again.
 */
const prepare = (r: Run, tps: ReadonlyArray<Models.TopicPartition>, isStandby: boolean, now: number) =>
  Effect.gen(function* () {
    if (tps.length === 0) return [] as Array<Progress>
    const offsets = yield* r.source.offsets(tps).pipe(Effect.mapError((e) => restoreFailed(tps[0]!, e.message)))
    const out: Array<Progress> = []
    for (const o of offsets) {
      const tp = { topic: o.topic, partition: o.partition }
      const persisted = yield* Effect.result(r.target.persistedOffset(tp))
      if (persisted._tag === "Failure") {
        yield* failPartition(r, tp, persisted.failure)
        continue
      }
      let from = Option.match(persisted.success, { onNone: () => 0, onSome: (p) => p + 1 })
      const highwater =
        Option.isSome(persisted.success) && persisted.success.value >= o.highwater
          ? yield* settledHighwater(r, tp, persisted.success.value, o.highwater)
          : o.highwater
      if (Option.isSome(persisted.success) && persisted.success.value >= highwater) {
        if (!r.wipe) {
          yield* failPartition(
            r,
            tp,
            new Recovery.ConsistencyError({
              topic: o.topic,
              partition: o.partition,
              persisted: persisted.success.value,
              highwater
            })
          )
          continue
        }
        yield* Effect.logWarning(
          `${Models.tpKey(tp)}: persisted offset ${persisted.success.value} is beyond the changelog highwater ${highwater}; wiping the store and restoring it`
        )
        yield* r.target.wipe(tp).pipe(Effect.mapError((reason) => new Recovery.RecoveryError({ reason })))
        from = 0
      }
      const start = Math.max(from, o.logStart)
      yield* r.source.seek(tp, start).pipe(Effect.mapError((e) => restoreFailed(tp, e.message)))
      if (r.failures.delete(Models.tpKey(tp))) yield* r.target.failed(tp, undefined)
      out.push({
        tp,
        standby: isStandby,
        highwater,
        offset: start,
        ready: !isStandby && start >= highwater,
        lastEventAt: now
      })
    }
    return out
  })

const markReady = (r: Run, p: Progress) =>
  Effect.gen(function* () {
    p.ready = true
    if (!p.standby) r.caughtUp.add(Models.tpKey(p.tp))
    yield* r.source.pause([p.tp])
    const waiting = r.readiness.get(Models.tpKey(p.tp))
    if (waiting !== undefined) yield* Deferred.succeed(waiting, undefined)
    yield* publish(r, { _tag: "PartitionReady", topic: p.tp.topic, partition: p.tp.partition })
  })

/** Applies one partition's records (in offset order) and advances its progress. */
const applyRecords = (r: Run, p: Progress, records: ReadonlyArray<Log.Record>, now: number) =>
  Effect.gen(function* () {
    // Records come in offset order: when the first and last are wanted, all are (the usual case, no copy).
    const wanted = (rec: Log.Record) => rec.offset >= p.offset && (p.standby || rec.offset < p.highwater)
    const fresh =
      records.length > 0 && wanted(records[0]!) && wanted(records[records.length - 1]!)
        ? records
        : records.filter(wanted)
    p.lastEventAt = now
    r.stalled.delete(Models.tpKey(p.tp))
    if (fresh.length === 0) return
    const startedAt = yield* Clock.currentTimeMillis
    const applied = yield* r.target.apply(p.tp, fresh)
    for (const skipped of applied.skipped) {
      yield* Effect.logWarning(
        `recovery of ${Models.tpKey(p.tp)}: offset ${skipped.offset} set aside (dead-lettered): ${skipped.detail}`
      )
      yield* publish(r, { _tag: "RecordSkipped", topic: p.tp.topic, partition: p.tp.partition, ...skipped })
    }
    if (applied.skipped.length > 0) {
      yield* Metric.update(Metric.withAttributes(metrics.recordsSkipped, { topic: p.tp.topic }), applied.skipped.length)
    }
    const endedAt = yield* Clock.currentTimeMillis
    r.lastFlushAt = endedAt
    const sample = fresh.length / Math.max(1, endedAt - startedAt)
    r.rate = r.rate === undefined ? sample : 0.8 * r.rate + 0.2 * sample
    p.offset = fresh[fresh.length - 1]!.offset + 1
    if (p.standby && p.offset > p.highwater) p.highwater = p.offset
    yield* Metric.update(Metric.withAttributes(metrics.recordsApplied, { topic: p.tp.topic }), fresh.length)
    yield* publish(r, {
      _tag: "BatchApplied",
      topic: p.tp.topic,
      partition: p.tp.partition,
      records: fresh.length,
      offset: p.offset,
      standby: p.standby
    })
  })

/** Reports a partition waiting too long, saying what it waits for. */
const checkStalls = (r: Run, now: number) =>
  Effect.gen(function* () {
    const restoring = [...r.progress.values()].filter((p) => !p.standby && !p.ready)
    if (restoring.length === 0) return
    const report = (p: Progress, kind: Recovery.StallKind, forMs: number) =>
      Effect.gen(function* () {
        const key = `${Models.tpKey(p.tp)}:${kind}`
        if (r.stalled.has(key)) return
        r.stalled.add(key)
        yield* Effect.logWarning(
          `recovery of ${Models.tpKey(p.tp)} stalled (${kind}) for ${forMs} ms at offset ${p.offset} of ${p.highwater}`
        )
        yield* publish(r, { _tag: "Stalled", kind, topic: p.tp.topic, partition: p.tp.partition, forMs })
      })
    for (const p of restoring) {
      const quiet = now - p.lastEventAt
      if (quiet < r.eventTimeoutMs) continue
      const fetching = yield* r.source.fetching(p.tp)
      const position = yield* r.source.position(p.tp).pipe(Effect.orElseSucceed(() => p.offset))
      const kind: Recovery.StallKind = !fetching ? "paused" : position >= p.highwater ? "only-markers-left" : "no-fetch"
      yield* report(p, kind, quiet)
    }
    if (now - r.lastFlushAt >= r.flushTimeoutMs) yield* report(restoring[0]!, "no-flush", now - r.lastFlushAt)
  })

/** Actives whose consumer position passed the highwater without a record (markers, compacted tail) are ready. */
const checkPositions = (r: Run) =>
  Effect.gen(function* () {
    for (const p of r.progress.values()) {
      if (p.standby || p.ready) continue
      const position = yield* r.source.position(p.tp).pipe(Effect.orElseSucceed(() => p.offset))
      if (position >= p.highwater) {
        p.offset = Math.max(p.offset, p.highwater)
        yield* markReady(r, p)
      }
    }
  })

/**
 * One run: after the delay and a flush, prepares the actives (those caught up in an earlier run kept) and the
 * standbys, restores the actives to their highwater, completes `done` (or fails it with a partition's reason), then
 * keeps the standbys tailing their changelogs.
 */
const restore = (
  r: Run,
  actives: ReadonlyArray<Models.TopicPartition>,
  standbys: ReadonlyArray<Models.TopicPartition>,
  done: Deferred.Deferred<void, Recovery.RecoveryError>
) =>
  Effect.gen(function* () {
    if (Duration.isGreaterThan(r.delay, Duration.zero)) yield* Effect.sleep(r.delay)
    yield* r.target.flush.pipe(Effect.mapError((reason) => new Recovery.RecoveryError({ reason })))
    yield* publish(r, { _tag: "Started", active: actives, standby: standbys })
    const now = yield* Clock.currentTimeMillis
    r.lastFlushAt = now
    const kept = actives.flatMap((tp) => {
      const earlier = r.progress.get(Models.tpKey(tp))
      return r.caughtUp.has(Models.tpKey(tp)) && earlier !== undefined && !earlier.standby ? [earlier] : []
    })
    const keptKeys = new Set(kept.map((p) => Models.tpKey(p.tp)))
    const fresh = actives.filter((tp) => !keptKeys.has(Models.tpKey(tp)))
    const prepared = [...kept, ...(yield* prepare(r, fresh, false, now)), ...(yield* prepare(r, standbys, true, now))]
    r.progress = new Map(prepared.map((p) => [Models.tpKey(p.tp), p]))
    for (const p of prepared) if (p.ready) yield* markReady(r, p)
    const restoring = prepared.filter((p) => !p.ready && !p.standby)
    if (restoring.length > 0) yield* r.source.resume(restoring.map((p) => p.tp))
    const initial = statsNow(r)
    yield* Metric.update(metrics.remaining, initial.remaining)
    if (initial.remaining > 0) yield* Effect.logInfo(`recovery starting\n${formatStats(initial)}`)
    yield* publish(r, { _tag: "Progress", stats: initial })
    const ticker = yield* Effect.forkScoped(tick(r))
    yield* applyPhase(r, actives, false).pipe(
      Effect.withSpan("strata.recovery.restore", {
        attributes: {
          "strata.partitions": actives.length,
          "strata.standbys": standbys.length,
          "strata.records": initial.remaining
        }
      })
    )
    yield* Fiber.interrupt(ticker)
    yield* publish(r, { _tag: "Progress", stats: statsNow(r) })
    // Every other partition is restored; one set aside fails the run with its reason.
    const failed = actives.flatMap((tp) => {
      const reason = r.failures.get(Models.tpKey(tp))
      return reason === undefined ? [] : [reason]
    })
    if (failed.length > 0) {
      yield* Deferred.fail(done, new Recovery.RecoveryError({ reason: failed[0]! }))
    } else {
      yield* publish(r, { _tag: "Completed" })
      yield* Effect.logInfo("Worker ready")
      yield* Deferred.succeed(done, undefined)
    }
    // Standbys keep tailing their changelogs for as long as they are assigned.
    const tailing = [...r.progress.values()].filter((p) => p.standby)
    if (tailing.length > 0) {
      yield* r.source.resume(tailing.map((p) => p.tp))
      yield* applyPhase(r, actives, true)
    }
  }).pipe(
    Effect.scoped,
    Effect.catch((error) =>
      Effect.gen(function* () {
        for (const waiting of r.readiness.values()) yield* Deferred.fail(waiting, error)
        yield* Deferred.fail(done, error)
      })
    ),
    Effect.annotateLogs({ component: "recovery" })
  )

/** Progress, stalls and the consumer positions, on a timer beside the apply loop. */
const tick = (r: Run): Effect.Effect<never> =>
  Effect.gen(function* () {
    while (true) {
      yield* Effect.sleep(r.statsInterval)
      const stats = statsNow(r)
      yield* Metric.update(metrics.remaining, stats.remaining)
      if (stats.remaining > 0) yield* Effect.logInfo(`recovery progress\n${formatStats(stats)}`)
      yield* publish(r, { _tag: "Progress", stats })
      yield* checkStalls(r, yield* Clock.currentTimeMillis)
    }
  })

/** Batches in flight in an apply phase: each one's fiber, and the partitions it brings to their highwater. */
interface InFlight {
  readonly fiber: Fiber.Fiber<void, Recovery.RecoveryError>
  readonly finishing: Set<string>
}

/**
 * Takes records and applies them until every active is ready (or, for the standbys' phase, for as long as the run
 * lasts). Batches are applied while the next one is taken and prepared: a store writing off the main thread
 * (LevelDB) writes one batch while the next is built. At most `IN_FLIGHT` batches are in flight, so memory stays
 * bounded by `IN_FLIGHT + 1` buffers; a partition's batches are applied in order because each waits for that
 * partition's batch before it.
 */
const applyPhase = (r: Run, actives: ReadonlyArray<Models.TopicPartition>, standbyPhase: boolean) =>
  Effect.gen(function* () {
    const poll = Duration.millis(Math.max(50, Math.min(1000, Duration.toMillis(r.statsInterval) / 5)))
    const inflight: Array<InFlight> = []
    /** Per partition, completed when its last batch handed over is applied. */
    const tails = new Map<string, Deferred.Deferred<void, Recovery.RecoveryError>>()
    const settleOldest = Effect.suspend(() => {
      const f = inflight.shift()
      return f === undefined ? Effect.void : Fiber.join(f.fiber)
    })
    while (true) {
      const pending = [...r.progress.values()].filter((p) => (standbyPhase ? p.standby : !p.standby && !p.ready))
      if (!standbyPhase && pending.length === 0) {
        if (inflight.length === 0) return
        yield* settleOldest
        continue
      }
      // Take only while records are still to come once the batches in flight land; otherwise wait for them.
      if (
        inflight.length > 0 &&
        !standbyPhase &&
        pending.every((p) => inflight.some((f) => f.finishing.has(Models.tpKey(p.tp))))
      ) {
        yield* settleOldest
        continue
      }
      const taken = yield* r.source.take(standbyPhase ? r.standbyBufferSize : r.bufferSize).pipe(
        Effect.timeoutOption(poll),
        Effect.mapError((e) => restoreFailed(pending[0]?.tp ?? actives[0]!, e.message))
      )
      const at = yield* Clock.currentTimeMillis
      if (Option.isNone(taken)) {
        while (inflight.length > 0) yield* settleOldest
        if (!standbyPhase) yield* checkPositions(r)
        continue
      }
      const byPartition = groupByPartition(taken.value)
      // The partitions this batch brings to their highwater.
      const finishing = new Set<string>()
      for (const [key, list] of byPartition) {
        const p = r.progress.get(key)
        if (p !== undefined && !p.standby && list[list.length - 1]!.offset + 1 >= p.highwater) finishing.add(key)
      }
      if (inflight.length >= IN_FLIGHT) yield* settleOldest
      inflight.push({ fiber: yield* applyBatch(r, byPartition, tails, at), finishing })
    }
  })

/** Groups records by partition along runs of consecutive records of one partition (chunks arrive whole). */
const groupByPartition = (records: Iterable<Log.Record>): Map<string, Array<Log.Record>> => {
  const byPartition = new Map<string, Array<Log.Record>>()
  let run: Array<Log.Record> | undefined
  let runTopic = ""
  let runPartition = -1
  for (const rec of records) {
    if (run === undefined || rec.partition !== runPartition || rec.topic !== runTopic) {
      runTopic = rec.topic
      runPartition = rec.partition
      const key = Models.tpKey(rec)
      run = byPartition.get(key)
      if (run === undefined) {
        run = []
        byPartition.set(key, run)
      }
    }
    run.push(rec)
  }
  return byPartition
}

/**
 * Applies one taken batch in a fiber of its own: its partitions side by side (their stores write independently),
 * each after that partition's batch before it (`tails`).
 */
const applyBatch = (
  r: Run,
  byPartition: ReadonlyMap<string, Array<Log.Record>>,
  tails: Map<string, Deferred.Deferred<void, Recovery.RecoveryError>>,
  at: number
) =>
  Effect.gen(function* () {
    const steps: Array<
      readonly [
        string,
        Array<Log.Record>,
        Deferred.Deferred<void, Recovery.RecoveryError> | undefined,
        Deferred.Deferred<void, Recovery.RecoveryError>
      ]
    > = []
    for (const [key, list] of byPartition) {
      const done = yield* Deferred.make<void, Recovery.RecoveryError>()
      steps.push([key, list, tails.get(key), done])
      tails.set(key, done)
    }
    return yield* Effect.forEach(
      steps,
      ([key, list, before, done]) =>
        Effect.gen(function* () {
          if (before !== undefined) yield* Deferred.await(before)
          const p = r.progress.get(key)
          // Records of partitions not restored here (fetched before a pause or a revoke) are skipped.
          if (p === undefined || (p.ready && !p.standby)) return
          const applied = yield* Effect.result(applyRecords(r, p, list, at))
          if (applied._tag === "Failure") return yield* failPartition(r, p.tp, applied.failure)
          if (!p.standby && p.offset >= p.highwater) yield* markReady(r, p)
        }).pipe(
          Effect.onExit((exit) =>
            Deferred.done(done, exit).pipe(
              Effect.andThen(
                Effect.sync(() => {
                  if (tails.get(key) === done) tails.delete(key)
                })
              )
            )
          )
        ),
      { concurrency: "unbounded", discard: true }
    ).pipe(
      Effect.andThen(Effect.suspend(() => Metric.update(metrics.remaining, statsNow(r).remaining))),
      Effect.forkScoped
    )
  })

/** Starts a new run for the current assignment, interrupting the one before; its waiters follow the new run. */
const restart = (r: Run) =>
  Effect.gen(function* () {
    if (r.running !== undefined) {
      yield* Fiber.interrupt(r.running)
      // Suspended: everything is paused until the new run seeks and resumes what it restores.
      yield* r.source.pause([...r.progress.values()].map((p) => p.tp))
    }
    const done = yield* Deferred.make<void, Recovery.RecoveryError>()
    // Waiters of an earlier, interrupted run follow the new one.
    if (!(yield* Deferred.isDone(r.completed))) yield* Deferred.completeWith(r.completed, Deferred.await(done))
    r.completed = done
    const previous = r.readiness
    r.readiness = new Map()
    for (const tp of r.active) {
      const waiting = yield* Deferred.make<void, Recovery.RecoveryError>()
      r.readiness.set(Models.tpKey(tp), waiting)
      const earlier = previous.get(Models.tpKey(tp))
      if (earlier !== undefined && !(yield* Deferred.isDone(earlier))) {
        yield* Deferred.completeWith(earlier, Deferred.await(waiting))
      }
    }
    r.running = yield* restore(r, r.active, r.standby, done).pipe(Effect.asVoid, Effect.forkIn(r.scope))
  })

const without = (tps: ReadonlyArray<Models.TopicPartition>, gone: ReadonlySet<string>) =>
  tps.filter((tp) => !gone.has(Models.tpKey(tp)))

/** The recovery as the table manager sees it. */
const shapeOf = (r: Run): Recovery.Shape => ({
  assign: (assignment) =>
    Effect.suspend(() => {
      const promoted = new Set(assignment.active.map(Models.tpKey))
      const known = new Set(r.active.map(Models.tpKey))
      r.active = [...r.active, ...assignment.active.filter((tp) => !known.has(Models.tpKey(tp)))]
      // A standby promoted to active leaves the standbys; it replays only its lag from its persisted offset.
      const keptStandby = without(r.standby, promoted)
      const knownStandby = new Set([...keptStandby.map(Models.tpKey), ...r.active.map(Models.tpKey)])
      r.standby = [...keptStandby, ...assignment.standby.filter((tp) => !knownStandby.has(Models.tpKey(tp)))]
      return restart(r)
    }),
  revoke: (tps) =>
    Effect.suspend(() => {
      const gone = new Set(tps.map(Models.tpKey))
      for (const key of gone) {
        r.caughtUp.delete(key)
        r.failures.delete(key)
      }
      r.active = without(r.active, gone)
      r.standby = without(r.standby, gone)
      return Effect.andThen(r.source.pause(tps), restart(r))
    }),
  stats: Effect.sync(() => statsNow(r)),
  events: Stream.fromPubSub(r.events),
  waitUntilCompleted: Effect.suspend(() => Deferred.await(r.completed)),
  waitUntilReady: (tps) =>
    Effect.suspend(() =>
      Effect.forEach(
        tps,
        (tp) => {
          const waiting = r.readiness.get(Models.tpKey(tp))
          return waiting === undefined ? Effect.void : Deferred.await(waiting)
        },
        { discard: true }
      )
    )
})
