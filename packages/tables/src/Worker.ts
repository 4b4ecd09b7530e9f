/**
 * The worker (Faust's app with its `@app.agent`s, Kafka Streams' `KafkaStreams`): joins a consumer group for its
 * agents' source topics, hands assignments and revocations to the `Tables` manager, runs the agents per record in
 * source-partition order (partitions in parallel), and commits every `commitInterval` and on shutdown.
 *
 * A partition starts once its tables are restored (per-partition readiness), from where the tables say to resume
 * (`Tables.resumeOffset`), so no record is applied twice. A commit persists every table partition (acks in, one
 * atomic store batch each) and then commits the source offsets to the group. When a commit fails (a changelog
 * record was refused) the worker rewinds: the tables forget what is not in a store and restore again, and every
 * partition resumes from what the stores and changelogs hold.
 *
 * What to do is decided by a pure machine (`internal/workerState.ts`): one inbox, drained by one fiber, feeds it
 * the group's events, restored partitions, the lanes' progress, timer ticks, commit requests and the close; this
 * module runs the commands each step returns and decides nothing. Records never go through the inbox: the group's
 * batches go straight to their partition's lane (a bounded queue and the fiber processing it), which reports once
 * per batch.
 *
 * @since 0.1.0
 */
import { Log, Models, OptionSchemas, type TableManager } from "@strata/core"
import {
  Cause,
  Clock,
  type Context,
  Data,
  Deferred,
  Duration,
  Effect,
  Exit,
  Fiber,
  Metric,
  Option,
  Queue,
  Result,
  Schema,
  type Scope,
  Stream
} from "effect"
import * as WorkerState from "./internal/workerState.js"
import { TableError } from "./Table.js"
import { Tables, type TablesShape } from "./Tables.js"

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
  readonly process?: (record: Log.Record) => Effect.Effect<void, E, R>
  /**
   * Runs for each fetched batch of one partition instead, as one `Tables.process` (of the batch's last record):
   * the batch's writes are one unit, sent together.
   */
  readonly processBatch?: (records: ReadonlyArray<Log.Record>) => Effect.Effect<void, E, R>
}

/** Defines an agent (exactly one of `process` and `processBatch`). */
export const agent = <E, R>(definition: Agent<E, R>): Agent<E, R> => definition

/** The worker's options, decoded by `WorkerOptions` in `make`. */
export const WorkerOptions = Schema.Struct({
  /** The consumer group the worker joins. */
  groupId: Schema.String.check(Schema.isMinLength(1)),
  /** How often the worker commits (1 second). */
  commitInterval: OptionSchemas.DurationOption("positive").pipe(
    Schema.withDecodingDefault(Effect.succeed<Duration.Input>("1 second"))
  ),
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
/** What `make` takes (see `WorkerOptions`): `commitInterval` as any `Duration.Input`, a number being milliseconds. */
export type WorkerOptions = typeof WorkerOptions.Encoded

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
export type WorkerError =
  | InvalidWorkerOptions
  | AgentFailed
  | WorkerClosed
  | Log.LogError
  | TableManager.TableManagerError

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
  readonly lag: ReadonlyArray<Models.TopicPartitionOffset>
  /** The source partitions whose tables this worker holds as standby replicas, sorted. */
  readonly standbys: ReadonlyArray<Models.TopicPartition>
}

/** A running worker. */
export interface WorkerShape {
  /** Commits now: every table partition persisted, then the source offsets committed to the group. */
  readonly commit: Effect.Effect<void, WorkerError>
  /** Counts, last commit duration and lag. */
  readonly metrics: Effect.Effect<WorkerMetrics, Log.LogError>
  /** The partitions being processed now (assigned and restored). */
  readonly processing: Effect.Effect<ReadonlyArray<Models.TopicPartition>>
  /** Fails when the worker stopped on an error (an agent failed, the group or a commit broke for good). */
  readonly join: Effect.Effect<never, WorkerError>
}

/**
 * The worker's Effect metrics: `strata_worker_records_processed_total`, `strata_worker_commit_duration_seconds`
 * (histogram of every commit), `strata_worker_rewinds_total`, and `strata_worker_lag_records` (gauge, attributes
 * `topic` and `partition`: per partition the worker processes, the records from its next offset to the highwater
 * its consumer last saw; set when the partition starts and after each batch, removed when the partition is revoked
 * or the worker stops).
 */
export const metrics = {
  /** Source records processed. */
  records: Metric.counter("strata_worker_records_processed_total", {
    description: "Source records the worker's agents processed"
  }),
  /** How long each commit took, in seconds. */
  commitDuration: Metric.histogram("strata_worker_commit_duration_seconds", {
    description: "Seconds each commit took (tables persisted, then source offsets committed)",
    boundaries: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
  }),
  /** Rewinds after a failed commit. */
  rewinds: Metric.counter("strata_worker_rewinds_total", {
    description: "Times the worker rewound to what its stores and changelogs hold after a failed commit"
  }),
  /** Per partition processed (attributes `topic`, `partition`): records from its next offset to its highwater. */
  lag: Metric.gauge("strata_worker_lag_records", {
    description: "Records of a source partition from the worker's next offset to the partition's highwater"
  })
}

/** The lag gauge of one partition. */
const lagOf = (tp: Models.TopicPartition) =>
  Metric.withAttributes(metrics.lag, { topic: tp.topic, partition: String(tp.partition) })

/** One partition's lane: its fetched batches, processed in order by its fiber. */
interface Lane {
  /** The machine's id of the lane: its reports name it. */
  readonly id: number
  readonly tp: Models.TopicPartition
  readonly batches: Queue.Queue<Log.Batch, Cause.Done>
  /** Next offset to process; records below it are skipped. */
  next: number
  fiber: Fiber.Fiber<void> | undefined
}

type Event = WorkerState.Event<WorkerError>
type Command = WorkerState.Command<WorkerError>

/** A running worker: what its shell's functions share. Only `feed` changes `state`. */
interface Running<E, R> {
  readonly groupId: string
  readonly tables: TablesShape
  readonly log: Log.Shape
  readonly group: Log.GroupConsumer
  readonly context: Context.Context<R>
  /** Per topic, its agents, and those of them that run per record. */
  readonly agentsOf: ReadonlyMap<string, ReadonlyArray<Agent<E, R>>>
  readonly recordAgentsOf: ReadonlyMap<string, ReadonlyArray<Agent<E, R>>>
  readonly hasRecordAgents: boolean
  readonly hasBatchAgents: boolean
  /** Fetched batches a lane holds before the fetcher waits. */
  readonly partitionBuffer: number
  readonly scope: Scope.Scope
  /** The machine's events, taken one at a time. */
  readonly inbox: Queue.Queue<Event>
  readonly failed: Deferred.Deferred<never, WorkerError>
  /** The lanes running, by `tpKey`: the group's batches go to them. */
  readonly lanes: Map<string, Lane>
  /** Restore waits in flight, by `tpKey`. */
  readonly waits: Map<string, Fiber.Fiber<void>>
  timer: Fiber.Fiber<void> | undefined
  /** Commit requests waiting for the machine's reply, by request id. */
  readonly replies: Map<number, Deferred.Deferred<void, WorkerError>>
  nextRequest: number
  /** Completed when the close is done (or the machine stopped). */
  readonly closing: Deferred.Deferred<void>
  state: WorkerState.State
  /** The inbox's fiber ended: nothing is decided any more. */
  stopped: boolean
}

/** Checks the options and the agents; the decoded options. */
const validate = <E, R>(options: WorkerOptions, agents: ReadonlyArray<Agent<E, R>>) =>
  Effect.gen(function* () {
    // Every bad option named with its value; an option the schema does not know (a typo) is one of them.
    const o = yield* OptionSchemas.decodeOptions(WorkerOptions, { exact: true })(options).pipe(
      Effect.mapError((bad) => {
        const b = OptionSchemas.summary(bad)
        return new InvalidWorkerOptions({ detail: `${b.option} = ${b.value}: ${b.detail}` })
      })
    )
    if (agents.length === 0) return yield* Effect.fail(new InvalidWorkerOptions({ detail: "no agents" }))
    for (const a of agents) {
      if ((a.process === undefined) === (a.processBatch === undefined)) {
        return yield* Effect.fail(
          new InvalidWorkerOptions({ detail: `agent ${a.name} needs exactly one of process and processBatch` })
        )
      }
      if (a.topics.length === 0) {
        return yield* Effect.fail(new InvalidWorkerOptions({ detail: `agent ${a.name}: no topics` }))
      }
    }
    return o
  })

/**
 * Starts a worker in the scope, on the `Tables` manager and `Log` in context: the manager is started, the group
 * joined, and the agents run until the scope closes (which stops processing, commits, and leaves the group).
 */
export const make = <E, R>(
  options: WorkerOptions,
  agents: ReadonlyArray<Agent<E, R>>
): Effect.Effect<WorkerShape, WorkerError, Tables | Log.Log | Scope.Scope | R> =>
  Effect.gen(function* () {
    const o = yield* validate(options, agents)
    const tables = yield* Tables
    const log: Log.Shape = yield* Log.Log
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
    const w: Running<E, R> = {
      groupId: o.groupId,
      tables,
      log,
      group,
      context: yield* Effect.context<R>(),
      agentsOf,
      recordAgentsOf: new Map(
        topics.map((t) => [t, (agentsOf.get(t) ?? []).filter((a) => a.process !== undefined)] as const)
      ),
      hasRecordAgents: agents.some((a) => a.process !== undefined),
      hasBatchAgents: agents.some((a) => a.processBatch !== undefined),
      partitionBuffer: o.partitionBuffer ?? 4,
      scope: yield* Effect.scope,
      inbox: yield* Queue.unbounded<Event>(),
      failed: yield* Deferred.make<never, WorkerError>(),
      lanes: new Map(),
      waits: new Map(),
      timer: undefined,
      replies: new Map(),
      nextRequest: 0,
      closing: yield* Deferred.make<void>(),
      state: WorkerState.make({
        commitIntervalMs: Duration.toMillis(o.commitInterval),
        standbyReplicas: o.standbyReplicas ?? 1,
        exactlyOnce
      }),
      stopped: false
    }
    yield* start(w)
    return shapeOf(w)
  })

/**
 * Runs the worker: the inbox's fiber, then the group's events and batches; on shutdown the close stops taking
 * records, finishes what each partition took and commits once more.
 */
const start = <E, R>(w: Running<E, R>) =>
  Effect.gen(function* () {
    yield* Effect.forkScoped(runInbox(w))
    yield* Queue.offer(w.inbox, { _tag: "Started", now: yield* Clock.currentTimeMillis })
    const failed = (error: Log.LogError) => Queue.offer(w.inbox, { _tag: "Failed", error })
    yield* w.group.events.pipe(
      Stream.runForEach((event) =>
        Queue.offer(w.inbox, { _tag: event._tag === "Assigned" ? "Assigned" : "Revoked", tps: event.partitions })
      ),
      Effect.catch(failed),
      Effect.forkScoped
    )
    yield* w.group.batches.pipe(
      Stream.runForEach((batch) =>
        Effect.suspend(() => {
          const lane = w.lanes.get(Models.tpKey(batch))
          // A batch of a partition not (yet) processed here: dropped; the partition is sought when it starts.
          if (lane === undefined || batch.records.length === 0) return Effect.void
          return Queue.offer(lane.batches, batch)
        })
      ),
      Effect.catch(failed),
      Effect.forkScoped
    )
    yield* Effect.addFinalizer(() =>
      Effect.suspend(() =>
        w.stopped ? Effect.void : Effect.andThen(Queue.offer(w.inbox, { _tag: "Close" }), Deferred.await(w.closing))
      )
    )
  })

/**
 * Takes the inbox's events one at a time. A defect leaves the machine's state unknown: the worker fails with it,
 * and whatever waits for the machine is let go.
 */
const runInbox = <E, R>(w: Running<E, R>): Effect.Effect<void> =>
  Effect.forever(Effect.flatMap(Queue.take(w.inbox), (event) => feed(w, event))).pipe(
    Effect.catchCause((cause) =>
      Cause.hasInterruptsOnly(cause) ? Effect.failCause(cause) : Deferred.failCause(w.failed, cause)
    ),
    Effect.ensuring(abandon(w))
  )

/**
 * The machine stopped: commit requests fail, the close is done, the lag series go, and the lanes end once their
 * batches are done.
 */
const abandon = <E, R>(w: Running<E, R>) =>
  Effect.gen(function* () {
    w.stopped = true
    for (const p of w.state.partitions.values()) yield* Metric.remove(lagOf(p.tp))
    const waiting = [...w.replies.values()]
    w.replies.clear()
    for (const reply of waiting) yield* Deferred.fail(reply, new WorkerClosed({ groupId: w.groupId }))
    for (const lane of w.lanes.values()) yield* Queue.end(lane.batches)
    yield* Deferred.succeed(w.closing, undefined)
  })

/** Steps the machine with `event` and runs its commands; a command's report is stepped next. */
const feed = <E, R>(w: Running<E, R>, event: Event): Effect.Effect<void> =>
  Effect.suspend(() => {
    const [next, commands] = WorkerState.step(w.state, event)
    w.state = next
    if (commands.length === 0) return Effect.void
    return Effect.flatMap(runAll(w, commands), (report) => (report === undefined ? Effect.void : feed(w, report)))
  })

/** Runs one step's commands in order, up to the first that reports back (which ends the step). */
const runAll = <E, R>(w: Running<E, R>, commands: ReadonlyArray<Command>) =>
  Effect.gen(function* () {
    for (const command of commands) {
      const report = yield* run(w, command)
      if (report !== undefined) return report
    }
    return undefined
  })

/** Runs one command; what it reports back, if anything. */
const run = <E, R>(w: Running<E, R>, c: Command): Effect.Effect<Event | undefined> => {
  switch (c._tag) {
    case "Pause":
      return silent(w.group.pause(c.tps))
    case "AssignTables":
      return failureOf(w.tables.assign({ active: c.tps }))
    case "AwaitReady":
      return silent(awaitReady(w, c.tp, c.wait))
    case "CancelWaits":
      return silent(cancelWaits(w, c.tps))
    case "ReadPositions":
      return readPositions(w, c.tp, c.wait)
    case "StartLane":
      return startLane(w, c.tp, c.lane, c.from)
    case "Drain":
      return drain(w, c)
    case "Commit":
      return commit(w, c.offsets, c.purpose)
    case "RewindTables":
      return silent(w.tables.rewind)
    case "RevokeTables":
      return failureOf(w.tables.manager.onPartitionsRevoked(c.tps))
    case "AssignStandbys":
      return failureOf(w.tables.assign({ active: [], standby: c.tps }))
    case "ReadMembership":
      return Effect.match(w.group.membership, {
        onSuccess: (membership): Event => ({ _tag: "Membership", membership }),
        onFailure: (error): Event => ({ _tag: "MembershipFailed", error })
      })
    case "SetTimer":
      return silent(setTimer(w, c.delayMs))
    case "Reply":
      return silent(reply(w, c.request, c.outcome))
    case "Settle":
      return silent(Queue.offer(w.inbox, { _tag: "Settled" }))
    case "Closed":
      return silent(Deferred.succeed(w.closing, undefined))
    case "Fail":
      return silent(Deferred.fail(w.failed, c.error))
    case "Log":
      return silent(
        c.level === "warn"
          ? Effect.logWarning(c.message)
          : c.level === "info"
            ? Effect.logInfo(c.message)
            : Effect.logDebug(c.message)
      )
    case "Metric":
      return silent(observe(c))
    case "RemoveMetric":
      return silent(Effect.forEach(c.tps, (tp) => Metric.remove(lagOf(tp)), { discard: true }))
  }
}

/** Updates the metric a `Metric` command names. */
const observe = (c: Extract<Command, { readonly _tag: "Metric" }>): Effect.Effect<void> => {
  switch (c.metric) {
    case "rewinds":
      return Metric.update(metrics.rewinds, c.value)
    case "commitDuration":
      return Metric.update(metrics.commitDuration, c.value)
    case "lag":
      return Metric.update(lagOf(c.tp), c.value)
  }
}

/** A command that reports nothing. */
const silent = <A>(effect: Effect.Effect<A>): Effect.Effect<Event | undefined> => Effect.as(effect, undefined)

/** A command that reports only its failure (as `Failed`). */
const failureOf = <A>(effect: Effect.Effect<A, WorkerError>): Effect.Effect<Event | undefined> =>
  Effect.match(effect, { onSuccess: () => undefined, onFailure: (error): Event => ({ _tag: "Failed", error }) })

/** Waits in the background for a partition's tables (replacing a wait for it), then feeds how it ended. */
const awaitReady = <E, R>(w: Running<E, R>, tp: Models.TopicPartition, wait: number) =>
  Effect.gen(function* () {
    yield* cancelWaits(w, [tp])
    const fiber = yield* w.tables.waitUntilReady([tp]).pipe(
      Effect.matchEffect({
        onSuccess: () => Queue.offer(w.inbox, { _tag: "Ready", tp, wait }),
        onFailure: (error) => Queue.offer(w.inbox, { _tag: "ReadyFailed", tp, wait, error })
      }),
      Effect.asVoid,
      Effect.forkIn(w.scope)
    )
    w.waits.set(Models.tpKey(tp), fiber)
  })

const cancelWaits = <E, R>(w: Running<E, R>, tps: ReadonlyArray<Models.TopicPartition>) =>
  Effect.forEach(
    tps,
    (tp) => {
      const fiber = w.waits.get(Models.tpKey(tp))
      w.waits.delete(Models.tpKey(tp))
      return fiber === undefined ? Effect.void : Fiber.interrupt(fiber)
    },
    { discard: true }
  )

/** Reads where the tables say to resume a partition, the group's committed offset, the log start and highwater. */
const readPositions = <E, R>(w: Running<E, R>, tp: Models.TopicPartition, wait: number): Effect.Effect<Event> =>
  Effect.gen(function* () {
    const resume = yield* w.tables.resumeOffset(tp).pipe(Effect.orDie)
    const [committed] = yield* w.group.committed([tp])
    const [bounds] = yield* w.log.offsets([tp])
    return {
      _tag: "Positions",
      tp,
      wait,
      resume: Option.getOrUndefined(resume),
      committed: committed?.offset,
      logStart: bounds?.logStart,
      highwater: bounds?.highwater
    } as const
  }).pipe(Effect.catch((error) => Effect.succeed<Event>({ _tag: "StartFailed", tp, error })))

/** Seeks a partition to `from`, starts its lane there and resumes it in the group. */
const startLane = <E, R>(w: Running<E, R>, tp: Models.TopicPartition, id: number, from: number) =>
  Effect.gen(function* () {
    yield* w.group.seek(tp, from)
    const lane: Lane = {
      id,
      tp,
      batches: yield* Queue.bounded<Log.Batch, Cause.Done>(w.partitionBuffer),
      next: from,
      fiber: undefined
    }
    w.lanes.set(Models.tpKey(tp), lane)
    lane.fiber = yield* Effect.forkDetach(runLane(w, lane))
    yield* w.group.resume([tp])
    return undefined
  }).pipe(Effect.catch((error) => Effect.succeed<Event>({ _tag: "StartFailed", tp, error })))

/** Ends lanes (their queued batches dropped first with `discard`), waits for them, and reports where they stopped. */
const drain = <E, R>(w: Running<E, R>, c: Extract<Command, { readonly _tag: "Drain" }>): Effect.Effect<Event> =>
  Effect.gen(function* () {
    const lanes: Array<Lane> = []
    for (const tp of c.tps) {
      const lane = w.lanes.get(Models.tpKey(tp))
      if (lane === undefined) continue
      w.lanes.delete(Models.tpKey(tp))
      lanes.push(lane)
    }
    if (c.discard) for (const lane of lanes) yield* Effect.ignore(Queue.clear(lane.batches))
    for (const lane of lanes) yield* Queue.end(lane.batches)
    for (const lane of lanes) if (lane.fiber !== undefined) yield* Effect.ignore(Fiber.join(lane.fiber))
    // What a lane left (it stopped early) goes: an offer waiting for room in its buffer is let go.
    for (const lane of lanes) yield* Effect.ignore(Queue.clear(lane.batches))
    return {
      _tag: "Drained",
      lanes: lanes.map((lane) => ({ tp: lane.tp, lane: lane.id, next: lane.next })),
      purpose: c.purpose
    } as const
  })

/** Commits through the tables (see `Tables.commit`), timed. */
const commit = <E, R>(
  w: Running<E, R>,
  offsets: ReadonlyArray<Models.TopicPartitionOffset>,
  purpose: WorkerState.CommitPurpose
): Effect.Effect<Event> =>
  Effect.gen(function* () {
    const startedAt = yield* Clock.currentTimeMillis
    const result = yield* Effect.result(w.tables.commit(w.group, offsets))
    const at = yield* Clock.currentTimeMillis
    return Result.isSuccess(result)
      ? ({ _tag: "Committed", offsets, startedAt, at, purpose } as const)
      : ({ _tag: "CommitFailed", error: result.failure, at, purpose } as const)
  })

/** The next `Tick` comes after `delayMs`, replacing the pending one. */
const setTimer = <E, R>(w: Running<E, R>, delayMs: number) =>
  Effect.gen(function* () {
    if (w.timer !== undefined) yield* Fiber.interrupt(w.timer)
    w.timer = yield* Effect.sleep(Duration.millis(delayMs)).pipe(
      Effect.andThen(Clock.currentTimeMillis),
      Effect.flatMap((now) => Queue.offer(w.inbox, { _tag: "Tick", now })),
      Effect.asVoid,
      Effect.forkIn(w.scope)
    )
  })

/** Ends a commit request. */
const reply = <E, R>(w: Running<E, R>, request: number, outcome: WorkerState.Outcome<WorkerError>) =>
  Effect.suspend(() => {
    const waiting = w.replies.get(request)
    w.replies.delete(request)
    if (waiting === undefined) return Effect.void
    switch (outcome._tag) {
      case "Done":
        return Deferred.succeed(waiting, undefined)
      case "Closed":
        return Deferred.fail(waiting, new WorkerClosed({ groupId: w.groupId }))
      case "Failed":
        return Deferred.fail(waiting, outcome.error)
    }
  })

// ---------------------------------------------------------------------------
// Lanes
// ---------------------------------------------------------------------------

/**
 * Runs the record agents over a batch of one partition as one `processBatch`. A failure is tagged with the agent
 * and the record it failed on (tracked as the batch goes, not wrapped per record).
 */
const runRecords = <E, R>(w: Running<E, R>, records: ReadonlyArray<Log.Record>) => {
  const list = w.recordAgentsOf.get(records[0]!.topic) ?? []
  // The agent and record being run, for the error (two variables: no object per record).
  let atAgent: Agent<E, R> | undefined
  let atRecord: Log.Record | undefined
  const one =
    list.length === 1
      ? (record: Log.Record) => {
          atAgent = list[0]!
          atRecord = record
          return list[0]!.process!(record)
        }
      : (record: Log.Record) =>
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
  return w.tables.processBatch(records, one).pipe(
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

/** Runs the batch agents over a batch of one partition; a failure names the agent and the batch's last record. */
const runBatch = <E, R>(w: Running<E, R>, records: ReadonlyArray<Log.Record>) =>
  Effect.forEach(
    w.agentsOf.get(records[0]!.topic) ?? [],
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

/**
 * Processes one partition's batches in order until its queue ends, reporting each batch (`Processed`). A table error
 * while processing (a write refused by the changelog, say) stops the partition's records until the next commit fails
 * and rewinds; it names the record it stopped at. Its batches are taken and dropped until then (the rewind seeks it
 * again): a full buffer nobody takes from would hold up every partition's. Any other failure is reported
 * (`LaneFailed`): the worker fails.
 */
const runLane = <E, R>(w: Running<E, R>, lane: Lane): Effect.Effect<void> =>
  Effect.gen(function* () {
    while (true) {
      const taken = yield* Effect.exit(Queue.take(lane.batches))
      if (Exit.isFailure(taken)) return
      const fresh = taken.value.records.filter((record) => record.offset >= lane.next)
      if (fresh.length === 0) continue
      const last = fresh[fresh.length - 1]!
      if (w.hasRecordAgents) {
        // One record after the other, each seeing the writes before it; the batch's writes go out in one send.
        yield* runRecords(w, fresh).pipe(Effect.provideContext(w.context))
        lane.next = last.offset + 1
      }
      if (w.hasBatchAgents) {
        yield* w.tables.process(last, runBatch(w, fresh)).pipe(Effect.provideContext(w.context))
        lane.next = last.offset + 1
      }
      yield* Metric.update(metrics.records, fresh.length)
      yield* Queue.offer(w.inbox, {
        _tag: "Processed",
        tp: lane.tp,
        lane: lane.id,
        next: lane.next,
        records: fresh.length,
        highwater: taken.value.highwater
      })
    }
  }).pipe(
    Effect.catchTag("TableError", (e) =>
      e.reason._tag === "ChangelogFailed"
        ? Effect.andThen(
            Effect.logWarning(
              `worker: ${lane.tp.topic}/${lane.tp.partition}@${lane.next} waits for a rewind: ${e.message}`
            ),
            Effect.ignore(Effect.forever(Queue.take(lane.batches)))
          )
        : Effect.fail(
            new AgentFailed({
              agent: "(tables)",
              topic: lane.tp.topic,
              partition: lane.tp.partition,
              offset: lane.next,
              cause: e
            })
          )
    ),
    Effect.catch((error) => Queue.offer(w.inbox, { _tag: "LaneFailed", tp: lane.tp, lane: lane.id, error })),
    Effect.asVoid
  )

// ---------------------------------------------------------------------------
// The worker as its users see it
// ---------------------------------------------------------------------------

/** The running worker as its users see it: commit requests go to the machine, the rest reads its state. */
const shapeOf = <E, R>(w: Running<E, R>): WorkerShape => ({
  commit: Effect.suspend(() => {
    if (w.stopped || w.state.closed) return Effect.fail(new WorkerClosed({ groupId: w.groupId }))
    const request = w.nextRequest++
    const done = Deferred.makeUnsafe<void, WorkerError>()
    w.replies.set(request, done)
    return Effect.andThen(Queue.offer(w.inbox, { _tag: "CommitRequested", request }), Deferred.await(done))
  }),
  metrics: Effect.gen(function* () {
    const ready = [...w.state.partitions.values()].filter((p) => p.ready)
    const highwaters = ready.length === 0 ? [] : yield* w.log.offsets(ready.map((p) => p.tp))
    const s = w.state
    const lag = highwaters.map((h) => ({
      topic: h.topic,
      partition: h.partition,
      offset: Math.max(0, h.highwater - (s.partitions.get(Models.tpKey(h))?.next ?? h.highwater))
    }))
    return {
      recordsProcessed: s.recordsProcessed,
      commits: s.commits,
      lastCommitMs: s.lastCommitMs,
      rewinds: s.rewinds,
      lag,
      standbys: [...s.standbys.values()].sort(Models.tpCompare)
    }
  }),
  processing: Effect.sync(() => [...w.state.partitions.values()].filter((p) => p.ready).map((p) => p.tp)),
  join: Deferred.await(w.failed)
})
