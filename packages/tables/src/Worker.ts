/**
 * The worker (Faust's app with its `@app.agent`s, Kafka Streams' `KafkaStreams`): joins a consumer group for its
 * agents' source topics, hands assignments and revocations to the `Tables` manager, runs the agents per record in
 * source-partition order (partitions in parallel), and commits every `commitIntervalMs` and on shutdown.
 *
 * A partition starts once its tables are restored (per-partition readiness), from where the tables say to resume
 * (`Tables.resumeOffset`), so no record is applied twice. A commit persists every table partition (acks in, one
 * atomic store batch each) and then commits the source offsets to the group. When a commit fails (a changelog
 * record was refused) the worker rewinds: the tables forget what is not in a store and restore again, and every
 * partition resumes from what the stores and changelogs hold.
 *
 * @since 0.1.0
 */
import {
  type LogError,
  type LogRecord,
  type LogShape,
  Log,
  type TableManagerError,
  type TopicPartition,
  type TopicPartitionOffset,
  tpCompare,
  tpKey
} from "@strata/core"
import {
  Cause,
  Clock,
  Data,
  Deferred,
  Duration,
  Effect,
  Exit,
  Fiber,
  Metric,
  Option,
  Queue,
  Schema,
  type Scope,
  Semaphore,
  Stream
} from "effect"
import { place } from "./internal/standbys.js"
import { TableError } from "./Table.js"
import { Tables } from "./Tables.js"

// ---------------------------------------------------------------------------
// Agents and options
// ---------------------------------------------------------------------------

/** An agent: what the worker runs for the records of its source topics. */
export interface Agent<E = never, R = never> {
  readonly name: string
  readonly topics: ReadonlyArray<string>
  /**
   * Runs for each record, in offset order within its partition, as `Tables.process` of that record: its table
   * writes go to the record's partition and are visible to the next record at once.
   */
  readonly process?: (record: LogRecord) => Effect.Effect<void, E, R>
  /**
   * Runs for each fetched batch of one partition instead, as one `Tables.process` (of the batch's last record):
   * the batch's writes are one unit, sent together.
   */
  readonly processBatch?: (records: ReadonlyArray<LogRecord>) => Effect.Effect<void, E, R>
}

/** Defines an agent (exactly one of `process` and `processBatch`). */
export const agent = <E, R>(definition: Agent<E, R>): Agent<E, R> => definition

/** The worker's options, decoded by `WorkerOptions` in `make`. */
export const WorkerOptions = Schema.Struct({
  /** The consumer group the worker joins. */
  groupId: Schema.String.check(Schema.isMinLength(1)),
  /** How often the worker commits, in milliseconds (default 1000). */
  commitIntervalMs: Schema.optional(Schema.Int.check(Schema.isGreaterThan(0))),
  /** Most records a fetched batch carries (default 1000). */
  maxBatchRecords: Schema.optional(Schema.Int.check(Schema.isGreaterThan(0))),
  /** Fetched batches waiting per partition before the fetcher waits (default 4). */
  partitionBuffer: Schema.optional(Schema.Int.check(Schema.isGreaterThan(0))),
  /**
   * Standby replicas of each partition's tables kept on other members (default 1; 0: none). The worker places them
   * from the group's membership (the `standbyReplicas` members after a partition's owner, in member id order) and
   * keeps them tailing their changelogs, so the member that takes a partition over replays only the lag.
   */
  standbyReplicas: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)))
})
/** @see WorkerOptions */
export type WorkerOptions = typeof WorkerOptions.Type

/** The worker's options are invalid. */
export class InvalidWorkerOptions extends Schema.TaggedError<InvalidWorkerOptions>()("InvalidWorkerOptions", {
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `worker: invalid options: ${this.detail}`
  }
}

/** An agent failed on a record; the worker stopped. */
export class AgentFailed extends Data.TaggedError("AgentFailed")<{
  readonly agent: string
  readonly topic: string
  readonly partition: number
  readonly offset: number
  readonly cause: unknown
}> {
  /** @since 0.1.0 */
  override get message() {
    return `agent ${this.agent} failed on ${this.topic}/${this.partition}@${this.offset}: ${String(this.cause)}`
  }
}

/** The worker's scope closed: it commits no more. */
export class WorkerClosed extends Data.TaggedError("WorkerClosed")<{ readonly groupId: string }> {
  /** @since 0.1.0 */
  override get message() {
    return `the worker of group ${this.groupId} is closed`
  }
}

/** Why the worker stopped or could not start. */
export type WorkerError = InvalidWorkerOptions | AgentFailed | WorkerClosed | LogError | TableManagerError

// ---------------------------------------------------------------------------
// The worker
// ---------------------------------------------------------------------------

/** What the worker has done so far. */
export interface WorkerMetrics {
  readonly recordsProcessed: number
  readonly commits: number
  /** Duration of the last commit, in milliseconds. */
  readonly lastCommitMs: number
  readonly rewinds: number
  /** Per assigned partition: the highwater minus the next offset to process. */
  readonly lag: ReadonlyArray<TopicPartitionOffset>
  /** The source partitions whose tables this worker holds as standby replicas, sorted. */
  readonly standbys: ReadonlyArray<TopicPartition>
}

/** A running worker. */
export interface WorkerShape {
  /** Commits now: every table partition persisted, then the source offsets committed to the group. */
  readonly commit: Effect.Effect<void, WorkerError>
  /** Counts, last commit duration and lag. */
  readonly metrics: Effect.Effect<WorkerMetrics, LogError>
  /** The partitions being processed now (assigned and restored). */
  readonly processing: Effect.Effect<ReadonlyArray<TopicPartition>>
  /** Fails when the worker stopped on an error (an agent failed, the group or a commit broke for good). */
  readonly join: Effect.Effect<never, WorkerError>
}

const metrics = {
  records: Metric.counter("strata_worker_records_processed_total", {
    description: "Source records the worker's agents processed"
  }),
  commitDuration: Metric.gauge("strata_worker_commit_duration_ms", {
    description: "How long the last commit took (tables persisted, then source offsets committed)"
  }),
  rewinds: Metric.counter("strata_worker_rewinds_total", {
    description: "Times the worker rewound to what its stores and changelogs hold after a failed commit"
  })
}

/** One assigned source partition and its processing fiber. */
interface Running {
  readonly tp: TopicPartition
  /** Next offset to process; records below it are skipped. */
  next: number
  /** The offset committed last (to commit only what moved). */
  committed: number
  ready: boolean
  readonly batches: Queue.Queue<ReadonlyArray<LogRecord>, Cause.Done>
  fiber: Fiber.Fiber<void, WorkerError> | undefined
  /** Completed when the partition is revoked: a start still waiting for its tables gives up. */
  readonly gone: Deferred.Deferred<void>
}

/**
 * Starts a worker in the scope, on the `Tables` manager and `Log` in context: the manager is started, the group
 * joined, and the agents run until the scope closes (which stops processing, commits, and leaves the group).
 */
export const make = <E, R>(
  options: WorkerOptions,
  agents: ReadonlyArray<Agent<E, R>>
): Effect.Effect<WorkerShape, WorkerError, Tables | Log | Scope.Scope | R> =>
  Effect.gen(function* () {
    const o = yield* Schema.decodeUnknownEffect(WorkerOptions)(options, { errors: "all" }).pipe(
      Effect.mapError((issue) => new InvalidWorkerOptions({ detail: issue.message }))
    )
    if (agents.length === 0) return yield* Effect.fail(new InvalidWorkerOptions({ detail: "no agents" }))
    for (const a of agents) {
      if ((a.process === undefined) === (a.processBatch === undefined)) {
        return yield* Effect.fail(
          new InvalidWorkerOptions({ detail: `agent ${a.name} needs exactly one of process and processBatch` })
        )
      }
      if (a.topics.length === 0)
        return yield* Effect.fail(new InvalidWorkerOptions({ detail: `agent ${a.name}: no topics` }))
    }
    const tables = yield* Tables
    const log: LogShape = yield* Log
    const context = yield* Effect.context<R>()
    const commitInterval = Duration.millis(o.commitIntervalMs ?? 1000)
    const topics = [...new Set(agents.flatMap((a) => a.topics))]
    const agentsOf = new Map(topics.map((t) => [t, agents.filter((a) => a.topics.includes(t))] as const))

    yield* tables.start
    const exactlyOnce = tables.processingGuarantee === "exactly_once"
    const group = yield* log.groupConsumer({
      groupId: o.groupId,
      topics,
      // With exactly_once the sources are read committed too (they may be another worker's transactional output).
      isolation: exactlyOnce ? "read_committed" : "read_uncommitted",
      ...(o.maxBatchRecords === undefined ? {} : { maxBatchRecords: o.maxBatchRecords })
    })

    const failed = yield* Deferred.make<never, WorkerError>()
    const running = new Map<string, Running>()
    /** Commits, rewinds and rebalances take turns. */
    const turn = Semaphore.makeUnsafe(1)
    let recordsProcessed = 0
    let commits = 0
    let lastCommitMs = 0
    let rewinds = 0

    // --- processing ---------------------------------------------------------

    /** Per topic, the record agents' `process`: run in turn for each record. */
    const recordAgentsOf = new Map(
      topics.map((t) => [t, (agentsOf.get(t) ?? []).filter((a) => a.process !== undefined)] as const)
    )

    /**
     * Runs the record agents over a batch of one partition as one `processBatch`. A failure is tagged with the agent
     * and the record it failed on (tracked as the batch goes, not wrapped per record).
     */
    const runRecords = (records: ReadonlyArray<LogRecord>) => {
      const list = recordAgentsOf.get(records[0]!.topic) ?? []
      // The agent and record being run, for the error (two variables: no object per record).
      let atAgent: Agent<E, R> | undefined
      let atRecord: LogRecord | undefined
      const one =
        list.length === 1
          ? (record: LogRecord) => {
              atAgent = list[0]!
              atRecord = record
              return list[0]!.process!(record)
            }
          : (record: LogRecord) =>
              Effect.forEach(
                list,
                (a) =>
                  Effect.suspend(() => {
                    atAgent = a
                    atRecord = record
                    return a.process!(record)
                  }),
                { discard: true }
              )
      return tables.processBatch(records, one).pipe(
        Effect.mapError((cause): TableError | AgentFailed => {
          if (cause instanceof TableError) return cause
          const record = atRecord ?? records[0]!
          return new AgentFailed({
            agent: atAgent?.name ?? "(none)",
            topic: record.topic,
            partition: record.partition,
            offset: record.offset,
            cause
          })
        })
      )
    }

    const runBatch = (records: ReadonlyArray<LogRecord>) =>
      Effect.forEach(
        agentsOf.get(records[0]!.topic) ?? [],
        (a) =>
          a.processBatch === undefined
            ? Effect.void
            : a.processBatch(records).pipe(
                Effect.mapError((cause) => {
                  const last = records[records.length - 1]!
                  return new AgentFailed({
                    agent: a.name,
                    topic: last.topic,
                    partition: last.partition,
                    offset: last.offset,
                    cause
                  })
                })
              ),
        { discard: true }
      )

    const newBuffer = Queue.bounded<ReadonlyArray<LogRecord>, Cause.Done>(o.partitionBuffer ?? 4)

    const hasBatchAgents = agents.some((a) => a.processBatch !== undefined)
    const hasRecordAgents = agents.some((a) => a.process !== undefined)

    /** Processes one partition's batches in order until its queue ends. */
    const partitionLoop = (r: Running): Effect.Effect<void, WorkerError> =>
      Effect.gen(function* () {
        while (true) {
          const taken = yield* Effect.exit(Queue.take(r.batches))
          if (Exit.isFailure(taken)) return
          const fresh = taken.value.filter((record) => record.offset >= r.next)
          if (fresh.length === 0) continue
          if (hasRecordAgents) {
            // One record after the other, each seeing the writes before it; the batch's writes go out in one send.
            yield* runRecords(fresh).pipe(Effect.provideContext(context))
            r.next = fresh[fresh.length - 1]!.offset + 1
          }
          if (hasBatchAgents) {
            const last = fresh[fresh.length - 1]!
            yield* tables.process(last, runBatch(fresh)).pipe(Effect.provideContext(context))
            r.next = last.offset + 1
          }
          recordsProcessed += fresh.length
          yield* Metric.update(metrics.records, fresh.length)
        }
      }).pipe(
        // A table error while processing (a write refused by the changelog, say) stops the partition's records until
        // the next commit fails and rewinds; it names the record it stopped at. Its batches are taken and dropped
        // until then (the rewind seeks it again): a full buffer nobody takes from would hold up every partition's.
        Effect.catchTag("TableError", (e) =>
          e.reason._tag === "ChangelogFailed"
            ? Effect.andThen(
                Effect.logWarning(`worker: ${r.tp.topic}/${r.tp.partition}@${r.next} waits for a rewind: ${e.message}`),
                Effect.ignore(Effect.forever(Queue.take(r.batches)))
              )
            : Effect.fail(
                new AgentFailed({
                  agent: "(tables)",
                  topic: r.tp.topic,
                  partition: r.tp.partition,
                  offset: r.next,
                  cause: e
                })
              )
        )
      )

    /** Stops a partition's fiber once the batches it has are processed. */
    const drain = (r: Running) =>
      Effect.gen(function* () {
        yield* Queue.end(r.batches)
        if (r.fiber !== undefined) yield* Effect.ignore(Fiber.join(r.fiber))
        r.fiber = undefined
        // What the fiber left (it stopped early) goes: an offer waiting for room in this buffer is let go.
        yield* Effect.ignore(Queue.clear(r.batches))
      })

    /** The group's committed offset of a partition, else its log start. */
    const committedOrStart = (tp: TopicPartition) =>
      Effect.gen(function* () {
        const [committed] = yield* group.committed([tp])
        if (committed !== undefined) return committed.offset
        const [bounds] = yield* log.offsets([tp])
        return bounds?.logStart ?? 0
      })

    /** Whether the partition's tables are restored (false: it was revoked first). */
    const restored = (r: Running) =>
      Effect.raceFirst(Effect.as(tables.waitUntilReady([r.tp]), true), Effect.as(Deferred.await(r.gone), false))

    /**
     * Positions a restored partition where its tables say to resume and starts its fiber (the caller holds the
     * turn). A partition revoked meanwhile (gone from `running`, or unassigned from the consumer before its
     * revocation reached the worker) is left alone: its revocation cleans up.
     */
    const begin = (r: Running) =>
      Effect.gen(function* () {
        if (running.get(tpKey(r.tp)) !== r) return
        const resume = yield* tables.resumeOffset(r.tp).pipe(Effect.orDie)
        // Resume from where the tables or the group say, whichever is further (the group's offset is ahead when the
        // last records wrote nothing, and with exactly_once when a crash came between the transaction and the
        // stores), else from the log start. Never from the consumer's position: batches fetched before the partition
        // was ready were dropped, so the position may be past records nobody processed.
        const base = yield* committedOrStart(r.tp)
        const from = Option.isSome(resume) ? Math.max(resume.value, base) : base
        yield* Effect.logInfo(
          `worker: ${r.tp.topic}/${r.tp.partition} starts at ${from} (tables ${Option.getOrElse(resume, () => -1)}, group ${base})`
        )
        yield* group.seek(r.tp, from)
        r.next = from
        r.committed = from
        r.ready = true
        r.fiber = yield* Effect.forkDetach(partitionLoop(r).pipe(Effect.tapError((e) => Deferred.fail(failed, e))))
        yield* group.resume([r.tp])
      }).pipe(
        Effect.catchIf(
          (e) => e._tag === "LogError" && e.reason._tag === "NotAssigned",
          () => Effect.logDebug(`worker: ${r.tp.topic}/${r.tp.partition} was revoked before it started`)
        )
      )

    /** Waits for the partition's tables (holding nothing), then starts it in turn. */
    const startPartition = (r: Running) =>
      Effect.flatMap(restored(r), (ready) => (ready ? Semaphore.withPermit(turn, begin(r)) : Effect.void))

    const assigned = (tps: ReadonlyArray<TopicPartition>) =>
      Effect.gen(function* () {
        yield* group.pause(tps)
        for (const tp of tps) {
          running.set(tpKey(tp), {
            tp,
            next: 0,
            committed: 0,
            ready: false,
            batches: yield* newBuffer,
            fiber: undefined,
            gone: yield* Deferred.make<void>()
          })
        }
        yield* tables.assign({ active: tps })
        // A standby assigned active here was promoted by that assign: it replays only its lag.
        for (const tp of tps) standbys.delete(tpKey(tp))
        yield* Effect.forEach(tps, (tp) => Effect.forkDetach(startAndReport(running.get(tpKey(tp))!)), {
          discard: true
        })
        yield* placeStandbys
      })

    const startAndReport = (r: Running) => startPartition(r).pipe(Effect.tapError((e) => Deferred.fail(failed, e)))

    const revoked = (tps: ReadonlyArray<TopicPartition>) =>
      Effect.gen(function* () {
        const lost = tps.flatMap((tp) => {
          const r = running.get(tpKey(tp))
          return r === undefined ? [] : [r]
        })
        // Finish the batch in hand, persist what was processed, then let the partitions go. Batches fetched but not
        // started are dropped: the group has given the partitions to another member already.
        for (const r of lost) yield* Deferred.succeed(r.gone, undefined)
        for (const r of lost) yield* Effect.ignore(Queue.clear(r.batches))
        for (const r of lost) yield* drain(r)
        // With exactly_once one transaction holds every partition's writes: all of them commit (or rewind) now.
        yield* commitOrRewind(exactlyOnce ? [...running.values()] : lost)
        for (const r of lost) running.delete(tpKey(r.tp))
        yield* tables.manager.onPartitionsRevoked(tps)
        yield* placeStandbys
      })

    // --- commits ------------------------------------------------------------

    /** Commits these partitions through the tables (see `Tables.commit`: stores and group, or the transaction). */
    const commitNow = (list: ReadonlyArray<Running>) =>
      Effect.gen(function* () {
        const started = yield* Clock.currentTimeMillis
        const offsets = list
          .filter((r) => r.ready && r.next > r.committed)
          .map((r) => ({ topic: r.tp.topic, partition: r.tp.partition, offset: r.next }))
        yield* tables.commit(group, offsets)
        for (const o of offsets) {
          const r = running.get(tpKey(o))
          if (r !== undefined) r.committed = o.offset
        }
        commits++
        lastCommitMs = (yield* Clock.currentTimeMillis) - started
        yield* Metric.update(metrics.commitDuration, lastCommitMs)
      })

    /** After a failed commit: every partition stops, the tables restore again, and processing resumes from them. */
    const rewind = Effect.gen(function* () {
      rewinds++
      yield* Metric.update(metrics.rewinds, 1)
      const all = [...running.values()]
      yield* group.pause(all.map((r) => r.tp))
      for (const r of all) {
        yield* drain(r)
        r.ready = false
      }
      yield* tables.rewind
      for (const r of all) {
        // A partition being revoked is not started again: its revocation lets it go.
        if (yield* Deferred.isDone(r.gone)) continue
        const fresh: Running = { ...r, batches: yield* newBuffer, fiber: undefined }
        running.set(tpKey(r.tp), fresh)
        // The turn is held here (a commit rewinds): wait for the tables, then start.
        if (yield* restored(fresh)) yield* begin(fresh)
      }
    })

    /** Commits these partitions; a failed commit rewinds (the caller holds the turn). */
    const commitOrRewind = (list: ReadonlyArray<Running>) =>
      commitNow(list).pipe(
        Effect.catch((e) =>
          e._tag === "TableManagerError" && e.reason._tag === "CommitFailed"
            ? Effect.andThen(Effect.logWarning(`worker: ${e.message}; rewinding`), rewind)
            : Effect.fail(e)
        )
      )

    /** Set by the finalizer once it holds the turn: a commit after it fails with `WorkerClosed`. */
    let closed = false
    const commit: WorkerShape["commit"] = Semaphore.withPermit(
      turn,
      Effect.suspend(
        (): Effect.Effect<void, WorkerError> =>
          closed ? Effect.fail(new WorkerClosed({ groupId: o.groupId })) : commitOrRewind([...running.values()])
      )
    )

    // --- standbys ------------------------------------------------------------

    const standbyReplicas = o.standbyReplicas ?? 1
    /** The source partitions held here as standbys (never one in `running`). */
    const standbys = new Map<string, TopicPartition>()
    const sortedStandbys = () => [...standbys.values()].sort(tpCompare)

    /**
     * Places this member's standbys from the group's membership (the caller holds the turn): new ones are opened and
     * tail their changelogs, ones no longer placed here are closed. Nothing changes while the group's view of this
     * member differs from the partitions the worker handled (a rebalance in flight), nor when the read fails: the
     * next event or tick places them again.
     */
    const placeStandbys: Effect.Effect<void, TableManagerError> =
      standbyReplicas === 0
        ? Effect.void
        : Effect.gen(function* () {
            const membership = yield* Effect.catch(group.membership, (e) =>
              Effect.as(Effect.logWarning(`worker: reading the group's membership failed: ${e.message}`), undefined)
            )
            if (membership === undefined) return
            const own = membership.members.find((m) => m.memberId === membership.memberId)
            if (
              own === undefined ||
              own.partitions.length !== running.size ||
              !own.partitions.every((tp) => running.has(tpKey(tp))) ||
              membership.members.every((m) => m.partitions.length === 0)
            ) {
              return
            }
            const wanted = new Map<string, TopicPartition>()
            for (const tp of place(membership, standbyReplicas)) if (!running.has(tpKey(tp))) wanted.set(tpKey(tp), tp)
            const added = [...wanted].filter(([k]) => !standbys.has(k)).map(([, tp]) => tp)
            const removed = [...standbys].filter(([k]) => !wanted.has(k)).map(([, tp]) => tp)
            if (removed.length > 0) {
              yield* tables.manager.onPartitionsRevoked(removed)
              for (const tp of removed) standbys.delete(tpKey(tp))
            }
            if (added.length > 0) {
              yield* tables.assign({ active: [], standby: added })
              for (const tp of added) standbys.set(tpKey(tp), tp)
            }
          })

    // A membership change that brings this member no event (another member joined or left without moving its
    // partitions) is followed on a timer.
    if (standbyReplicas > 0) {
      yield* Effect.sleep(commitInterval).pipe(
        Effect.andThen(Semaphore.withPermit(turn, placeStandbys)),
        Effect.forever,
        Effect.tapError((e) => Deferred.fail(failed, e)),
        Effect.forkScoped
      )
    }

    // --- the loops ----------------------------------------------------------

    yield* group.events.pipe(
      Stream.runForEach((event) =>
        Semaphore.withPermit(turn, event._tag === "Assigned" ? assigned(event.partitions) : revoked(event.partitions))
      ),
      Effect.tapError((e) => Deferred.fail(failed, e)),
      Effect.forkScoped
    )

    yield* group.batches.pipe(
      Stream.runForEach((batch) =>
        Effect.suspend(() => {
          const r = running.get(tpKey(batch))
          // A batch of a partition not (yet) processed here: dropped; the partition is sought when it starts.
          if (r === undefined || !r.ready || batch.records.length === 0) return Effect.void
          return Queue.offer(r.batches, batch.records)
        })
      ),
      Effect.tapError((e) => Deferred.fail(failed, e)),
      Effect.forkScoped
    )

    yield* Effect.sleep(commitInterval).pipe(
      Effect.andThen(commit),
      Effect.forever,
      // Closing: the finalizer made the last commit.
      Effect.catchTag("WorkerClosed", () => Effect.void),
      Effect.tapError((e) => Deferred.fail(failed, e)),
      Effect.forkScoped
    )

    // On shutdown: stop taking records, finish what each partition took, commit once more.
    yield* Effect.addFinalizer(() =>
      Semaphore.withPermit(
        turn,
        Effect.gen(function* () {
          closed = true
          const all = [...running.values()]
          for (const r of all) yield* drain(r)
          yield* commitNow(all)
        })
      ).pipe(Effect.catchCause((cause) => Effect.logWarning(`worker: the last commit failed: ${Cause.pretty(cause)}`)))
    )

    const shape: WorkerShape = {
      commit,
      metrics: Effect.gen(function* () {
        const ready = [...running.values()].filter((r) => r.ready)
        const highwaters = ready.length === 0 ? [] : yield* log.offsets(ready.map((r) => r.tp))
        const lag = highwaters.map((h) => ({
          topic: h.topic,
          partition: h.partition,
          offset: Math.max(0, h.highwater - (running.get(tpKey(h))?.next ?? h.highwater))
        }))
        return { recordsProcessed, commits, lastCommitMs, rewinds, lag, standbys: sortedStandbys() }
      }),
      processing: Effect.sync(() => [...running.values()].filter((r) => r.ready).map((r) => r.tp)),
      join: Deferred.await(failed)
    }
    return shape
  })
