/**
 * A tablet server: core's `ReplicaManager` over the replica machines (docs/ARCHITECTURE.md, "Replication"). It
 * hosts one `TabletLog` per replica on its `ServerStorage` (segment files, or a store), applies the coordinator's LeaderAndIsr instructions through
 * `ReplicaState` (refusing a coordinator epoch below the highest it has seen), leads through `LeaderState`
 * (appends with acks, idempotent producer stamps, the followers' fetches, the ISR changes it asks the controller
 * for) and follows through `FollowerState` (a fetch loop per followed replica).
 *
 * A replica whose instruction names a replication throttle (one a move adds here) fetches through the server's one
 * token bucket, filled at the smallest throttle named (`internal/throttle`); an instruction without one lifts it.
 * The server measures its health for the controller's `Holdings`: the p99 of its recent appends' latency and its ISR
 * shrinks (`internal/health`).
 *
 * The shell decides nothing: each machine's commands run in order, under the replica's lock, and requests to other
 * servers are repeated after a backoff until answered or until the role that sent them ends.
 *
 * @since 0.1.0
 */
import { Errors, Log, Models, OptionSchemas, Retry } from "@strata/core"
import * as ReplicaManager from "../protocol/ReplicaManager.js"
import {
  Clock,
  Config,
  Context,
  Deferred,
  Duration,
  Effect,
  Exit,
  Fiber,
  Layer,
  Option,
  Schedule,
  Schema,
  Scope
} from "effect"
import * as FollowerState from "../machines/FollowerState.js"
import * as Replica from "../machines/Replica.js"
import { follow } from "./internal/follower.js"
import * as Health from "./internal/health.js"
import * as Hosted from "./internal/hosted.js"
import * as Throttle from "./internal/throttle.js"
import * as LeaderEpochCache from "../machines/LeaderEpochCache.js"
import * as ProducerState from "../machines/ProducerState.js"
import { Peers, type PeersShape } from "../wire/Peers.js"
import * as ReplicaState from "../machines/ReplicaState.js"
import * as ReplicationConfig from "../wire/ReplicationConfig.js"
import * as ServerMetrics from "./ServerMetrics.js"
import * as Codec from "../wire/internal/batchCodec.js"
import * as ServerStorage from "./ServerStorage.js"
import * as TabletLog from "./TabletLog.js"

// ---------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------

/**
 * A tablet server's options.
 *
 * @since 0.1.0
 */
export const TabletServerOptions = Schema.Struct({
  serverId: Models.ServerId,
  /** The cluster's replication settings (`ReplicationConfig`; every key optional). */
  replication: ReplicationConfig.ReplicationConfig.pipe(Schema.withDecodingDefaultKey(Effect.succeed({})))
})

/**
 * The options' input.
 *
 * @since 0.1.0
 */
export type TabletServerOptions = typeof TabletServerOptions.Encoded

/**
 * The tablet server service: core's `ReplicaManager`, plus what an operator and the tests read.
 *
 * @since 0.1.0
 */
export interface TabletServerShape extends ReplicaManager.Shape {
  /** The highest coordinator epoch this server has taken instructions under. */
  readonly coordinatorEpoch: Effect.Effect<number>
  /**
   * Tells the server its current registration (`undefined`: none, its session ended): instructions addressed to
   * another registration are refused from then on.
   */
  readonly registered: (registration: number | undefined) => Effect.Effect<void>
  /** The replica's log, for inspection (`undefined` when not hosted or not open). */
  readonly logOf: (tablet: Models.TabletId) => Effect.Effect<TabletLog.TabletLog | undefined>
  /** The tablets hosted here. */
  readonly tablets: Effect.Effect<ReadonlyArray<Models.TabletId>>
  /** Each hosted replica's state; a leader's high watermark and log end as its machine holds them. */
  readonly replicas: Effect.Effect<ReadonlyArray<ReplicaView>>
  /**
   * Asks the controller to move every leadership off this server (its controlled shutdown), again after the backoff
   * while it still leads some, up to 20 times; the number of tablets it still leads (0: safe to stop).
   */
  readonly controlledShutdown: Effect.Effect<number>
  /** The registration the server acts under (`undefined`: none, its session ended or it has not registered yet). */
  readonly registration: Effect.Effect<number | undefined>
  /** Each hosted replica as the metrics see it (`ServerMetrics`). */
  readonly samples: Effect.Effect<ReadonlyArray<ServerMetrics.ReplicaSample>>
  /** Sets the server's gauges (`ServerMetrics`) from its replicas now: run before the metrics are read. */
  readonly refreshMetrics: Effect.Effect<void>
}

/**
 * One replica as the server holds it.
 *
 * @since 0.1.0
 */
export interface ReplicaView {
  readonly tablet: Models.TabletId
  readonly machine: ReplicaState.State
  readonly leader?: {
    readonly leaderEpoch: number
    readonly highWatermark: number
    readonly logEndOffset: number
    /** The committed ISR as the leader knows it. */
    readonly isr: ReadonlyArray<Models.ServerId>
  }
}

/**
 * The machines a tablet server runs: the replica machine's step and the follower machine's start. Production runs
 * `Replica.step` and `FollowerState.become`; the simulators provide mutants of them (planted bugs they must catch).
 *
 * @since 0.1.0
 */
export interface MachinesShape {
  readonly replica: Replica.StepFunction
  readonly becomeFollower: typeof FollowerState.become
}

/**
 * The machines in context (production's unless provided).
 *
 * @since 0.1.0
 */
export const Machines = Context.Reference<MachinesShape>("@strata/replica/TabletServer/Machines", {
  defaultValue: () => ({ replica: Replica.step, becomeFollower: FollowerState.become })
})

/**
 * The `TabletServer` service key.
 *
 * @since 0.1.0
 */
export class TabletServer extends Context.Service<TabletServer, TabletServerShape>()("@strata/replica/TabletServer") {}

// ---------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------

/** What every handler shares. */
interface Server {
  readonly self: Models.ServerId
  readonly config: ReplicationConfig.ReplicationConfig
  readonly peers: PeersShape
  readonly storage: ServerStorage.ServerStorageShape
  readonly scope: Scope.Scope
  readonly hosted: Map<string, Hosted.Hosted>
  readonly machines: MachinesShape
  readonly metrics: ServerMetrics.ServerMetrics
  /** The replication throttle its throttled replicas' fetches share. */
  readonly throttle: Throttle.Throttle
  /** Its append latencies and ISR shrinks, as `Holdings` tells them. */
  readonly health: Health.Health
  coordinatorEpoch: number
  registration: number | undefined
  /** The sequence of the last storage report this server made. */
  storageReports: number
  /** Set as the server stops: no log opens after. */
  closed: boolean
}

const fail = (reason: ReplicaManager.ErrorReason) => Effect.fail(new ReplicaManager.ReplicaError({ reason }))
const storageFailed = (h: Hosted.Hosted) => (e: TabletLog.TabletLogError) =>
  new ReplicaManager.ReplicaError({
    reason: new ReplicaManager.ReplicaStorageFailed({ tablet: h.key, detail: e.message })
  })

// ---------------------------------------------------------------------------
// Running the replica machine
// ---------------------------------------------------------------------------

/**
 * Feeds the replica machine one input and runs the commands of its `Ready`, in order; returns its answer. The
 * caller holds the replica's lock.
 */
const feed = (
  server: Server,
  h: Hosted.Hosted,
  input: Replica.Input
): Effect.Effect<Replica.Answer | undefined, ReplicaManager.ReplicaError> =>
  Effect.suspend(() => {
    const before = h.state.leader
    const [next, ready] = server.machines.replica(h.state, input)
    h.state = next
    const after = next.leader
    const changed =
      before !== undefined &&
      after !== undefined &&
      before.isr !== after.isr &&
      before.leaderEpoch === after.leaderEpoch
    if (changed && ServerMetrics.isrChange(before.isr, after.isr).shrunk) server.health.shrunk()
    const counted = changed ? server.metrics.isrChanged(before.isr, after.isr) : Effect.void
    return ready.commands.length === 0
      ? Effect.as(counted, ready.answer)
      : Effect.as(Effect.andThen(counted, run(server, h, ready.commands)), ready.answer)
  })

/** Feeds an input whose refusal is the request's error; the answer otherwise. */
const feedOrFail = (server: Server, h: Hosted.Hosted, input: Replica.Input) =>
  Effect.flatMap(feed(server, h, input), (answer) =>
    answer?._tag === "Refused" ? fail(answer.reason) : Effect.succeed(answer)
  )

/** Feeds an input that only moves the leader's state: a failure of its commands is logged. */
const feedLogged = (server: Server, h: Hosted.Hosted, input: Replica.Input): Effect.Effect<void> =>
  feed(server, h, input).pipe(
    Effect.asVoid,
    Effect.catch((e) => Effect.logWarning(`server ${server.self}: ${h.key}: ${e.message}`))
  )

/** Asks the machine a leader's question (it changes nothing): admitted, or the request's error. */
const admitted = (server: Server, h: Hosted.Hosted, input: Extract<Replica.Input, { _tag: "Lead" | "Recheck" }>) =>
  Effect.suspend(() => {
    const answer = server.machines.replica(h.state, input)[1].answer
    if (answer?._tag === "Refused") return fail(answer.reason)
    const log = h.log
    if (answer?._tag !== "Admitted" || log === undefined) return fail(Replica.notLeader(h.state))
    return Effect.succeed({ ...answer, log })
  })

/** Runs the machine's commands in order. */
const run = (server: Server, h: Hosted.Hosted, commands: ReadonlyArray<Replica.Command>) =>
  Effect.forEach(commands, (command) => runCommand(server, h, command), { discard: true })

const runCommand = (
  server: Server,
  h: Hosted.Hosted,
  command: Replica.Command
): Effect.Effect<void, ReplicaManager.ReplicaError> => {
  switch (command._tag) {
    case "OpenLog":
      return openLog(server, h)
    case "CloseLog":
      return Effect.suspend(() => {
        const scope = h.logScope
        h.log = undefined
        h.logScope = undefined
        return scope === undefined ? Effect.void : Scope.close(scope, Exit.void)
      })
    case "DeleteLog":
      return dropLog(server, h.tablet)
    case "StartFollowing":
      return startFollowing(server, h, command)
    case "StopFollowing":
      return Effect.suspend(() => {
        const fiber = h.fetcher
        h.fetcher = undefined
        return fiber === undefined ? Effect.void : Fiber.interrupt(fiber)
      })
    case "Checkpoint":
      return checkpoint(server, h, command.highWatermark)
    case "Complete":
      return Effect.forEach(command.tickets, (t) => settle(h, t, Exit.succeed(command.highWatermark)), {
        discard: true
      })
    case "Fail": {
      const error = new ReplicaManager.ReplicaError({ reason: command.reason })
      return Effect.forEach(command.tickets, (t) => settle(h, t, Exit.fail(error)), { discard: true })
    }
    case "Wake":
      return Hosted.signal(h)
    case "RaiseLogStart":
      return raiseLogStart(server, h, command.offset)
    case "ProposeIsr":
      return Effect.asVoid(Effect.forkIn(proposeIsr(server, h, command), server.scope))
    case "StoreFailed":
      return Effect.suspend(() =>
        Effect.logWarning(
          `server ${server.self}: ${h.key}: its log's storage (${server.storage.backend}, ${server.storage.locate(h.tablet)}) failed: ${command.detail}; the replica is offline until its storage takes writes again`
        )
      )
    case "ResumeStorage":
      return Effect.suspend(() =>
        h.resuming !== undefined || server.closed
          ? Effect.void
          : Effect.asVoid(
              Effect.tap(Effect.forkIn(resumeStorage(server, h), server.scope), (fiber) =>
                Effect.sync(() => {
                  h.resuming = fiber
                })
              )
            )
      )
    case "ReportStorageBack":
      return Effect.suspend(() =>
        h.resuming !== undefined
          ? Effect.void
          : Effect.asVoid(
              Effect.tap(
                Effect.forkIn(
                  reportStorage(server, h, false, () => h.state.lifecycle._tag === "OnlineReplica").pipe(
                    Effect.ensuring(
                      Effect.sync(() => {
                        h.resuming = undefined
                      })
                    )
                  ),
                  server.scope
                ),
                (fiber) =>
                  Effect.sync(() => {
                    h.resuming = fiber
                  })
              )
            )
      )
    case "Log": {
      const line = `server ${server.self}: ${command.message}`
      return command.level === "Info" ? Effect.logInfo(line) : Effect.logWarning(line)
    }
  }
}

/** Completes the waiting append of `ticket`, if its caller still waits. */
const settle = (h: Hosted.Hosted, ticket: number, exit: Exit.Exit<number, ReplicaManager.ReplicaError>) =>
  Effect.suspend(() => {
    const done = h.tickets.get(ticket)
    if (done === undefined) return Effect.void
    h.tickets.delete(ticket)
    return Deferred.done(done, exit)
  })

/**
 * Checkpoints the high watermark, then feeds `Checkpointed` (releasing the appends it covers). The checkpoint only
 * shortens a restart's catch-up, but storage that fails it takes no writes: the replica goes offline.
 */
const checkpoint = (
  server: Server,
  h: Hosted.Hosted,
  highWatermark: number
): Effect.Effect<void, ReplicaManager.ReplicaError> =>
  Effect.gen(function* () {
    if (h.log !== undefined) {
      const checkpointed = yield* Effect.result(h.log.checkpointHighWatermark(highWatermark))
      if (checkpointed._tag === "Failure") return yield* logFailed(server, h, checkpointed.failure)
    }
    yield* feed(server, h, { _tag: "Checkpointed", highWatermark })
  })

/** Moves the leader's log start up to `offset` (a follower's), unless it starts there or past it already. */
const raiseLogStart = (server: Server, h: Hosted.Hosted, offset: number): Effect.Effect<void> =>
  Effect.gen(function* () {
    const log = h.log
    if (log === undefined || (yield* log.logStartOffset) >= offset) return
    const moved = yield* Effect.result(log.deleteBefore(offset))
    if (moved._tag === "Failure") return yield* logFailed(server, h, moved.failure)
    yield* Effect.logInfo(`server ${server.self}: ${h.key}: log start moved to ${offset}, where a follower's starts`)
  })

/**
 * A log operation failed: its storage (the replica goes offline, `StorageFailed`), or anything else (logged).
 * Under the replica's lock.
 */
const logFailed = (server: Server, h: Hosted.Hosted, e: TabletLog.TabletLogError): Effect.Effect<void> =>
  TabletLog.isStorageFailure(e)
    ? feedLogged(server, h, { _tag: "StorageFailed", detail: e.message })
    : Effect.logWarning(`server ${server.self}: ${h.key}: ${e.message}`)

/** Starts the fetch loop of a follower's generation. */
const startFollowing = (
  server: Server,
  h: Hosted.Hosted,
  command: Extract<Replica.Command, { _tag: "StartFollowing" }>
): Effect.Effect<void> =>
  Effect.gen(function* () {
    h.fetcher = yield* Effect.forkIn(
      follow(h, command.generation, {
        self: server.self,
        registration: () => server.registration,
        leader: server.peers.leader(command.leader),
        leaderId: command.leader,
        leaderEpoch: command.leaderEpoch,
        fetchMaxBytes: server.config.fetchMaxBytes,
        throttle: server.throttle,
        retryBackoff: server.config.retryBackoff,
        become: server.machines.becomeFollower,
        // The follower's own storage failed: offline (from outside the follower, which that stops).
        storageFailed: (generation, detail) =>
          Effect.asVoid(
            Effect.forkIn(
              Hosted.locked(h, feedLogged(server, h, { _tag: "StorageFailed", detail, generation })),
              server.scope
            )
          )
      }),
      server.scope
    )
  })

/**
 * Tells the controller the replica's storage failed (or works again), until it is heard or that is moot. Each report
 * takes the server's next sequence (its retries keep it), so a late copy of an earlier one cannot undo it.
 */
const reportStorage = (server: Server, h: Hosted.Hosted, failed: boolean, still: () => boolean) =>
  Effect.suspend(() => {
    const sequence = ++server.storageReports
    return Retry.retry(
      Effect.suspend(() =>
        server.peers.controller.replicaStorage({
          server: server.self,
          registration: server.registration,
          tablets: [h.tablet],
          failed,
          sequence
        })
      ),
      {
        schedule: Schedule.spaced(server.config.retryBackoff),
        while: still,
        tell: {
          what: () =>
            `server ${server.self}: ${h.key}: telling the controller its storage ${failed ? "failed" : "works again"}`
        }
      }
    ).pipe(Effect.ignore)
  })

/** The longest pause between two tries of failed storage. */
const storageRetryMaxMs = 30_000

/** One try of failed storage, under the replica's lock: the log opened again must take a write. */
const tryStore = (server: Server, h: Hosted.Hosted) =>
  Effect.gen(function* () {
    if (h.state.lifecycle._tag === "ReplicaDeleted") return "deleted" as const
    // Offline still, or opened again meanwhile by an instruction: either way the storage must take a write.
    const tried = yield* Effect.result(
      Effect.gen(function* () {
        yield* feedOrFail(server, h, { _tag: "Open" })
        const log = h.log
        if (log === undefined)
          return yield* fail(new ReplicaManager.ReplicaStorageFailed({ tablet: h.key, detail: "not open" }))
        yield* log.probe.pipe(Effect.mapError(storageFailed(h)))
      })
    )
    if (tried._tag === "Success") return "back" as const
    // The try moved the machine on (Reopen) before it failed.
    const now = (h.state.lifecycle as ReplicaState.State)._tag
    if (now !== "OfflineReplica" && now !== "ReplicaDeleted") yield* Effect.ignore(feed(server, h, { _tag: "Offline" }))
    return "failing" as const
  })

/**
 * Reports the failure, then tries the storage again after a backoff that doubles (up to 30 s; storage that fails again
 * within 30 s of coming back starts from its last pause, doubled): the log is opened again
 * and must take a write (`TabletLog.probe`). Once it does, the replica is online (instructions give it a role) and
 * the controller hears so. An instruction may open the log again meanwhile: the storage must still take the write.
 * Ends when the replica is deleted.
 */
const resumeStorage = (server: Server, h: Hosted.Hosted): Effect.Effect<void> =>
  Effect.gen(function* () {
    yield* reportStorage(server, h, true, () => h.state.lifecycle._tag === "OfflineReplica")
    const failedAt = yield* Clock.currentTimeMillis
    const back = h.storageBack
    const first =
      back !== undefined && failedAt - back.at < storageRetryMaxMs
        ? Math.min(back.delay * 2, storageRetryMaxMs)
        : Duration.toMillis(server.config.retryBackoff)
    // The first try after `first`, each next one after twice the last pause, up to the most.
    yield* Effect.sleep(first)
    let tries = 0
    const outcome = yield* Hosted.locked(h, tryStore(server, h)).pipe(
      Effect.tap(() =>
        Effect.sync(() => {
          tries++
        })
      ),
      Effect.flatMap((o) => (o === "failing" ? Effect.fail(o) : Effect.succeed(o))),
      Retry.retry({ schedule: Retry.backoff(Math.min(first * 2, storageRetryMaxMs), storageRetryMaxMs) }),
      // Retried for as long as it fails: only the replica's deletion or the server's end stops it.
      Effect.orDie
    )
    const delay = Math.min(first * 2 ** (tries - 1), storageRetryMaxMs)
    if (outcome === "back") {
      h.storageBack = { at: yield* Clock.currentTimeMillis, delay }
      yield* Effect.logInfo(`server ${server.self}: ${h.key}: its storage takes writes again; the replica is online`)
      // Told until heard, unless it fails again meanwhile (then that is told instead, below).
      yield* reportStorage(server, h, false, () => {
        const m = h.state.lifecycle._tag
        return m !== "ReplicaDeleted" && m !== "OfflineReplica"
      })
    }
  }).pipe(
    Effect.ensuring(
      // Storage that failed again while this ran (its report of coming back still unheard) is tried again from the
      // start: nothing else would, and the replica would stay offline.
      Effect.suspend(() => {
        h.resuming = undefined
        if (h.state.lifecycle._tag !== "OfflineReplica" || server.closed) return Effect.void
        return Effect.asVoid(
          Effect.tap(Effect.forkIn(resumeStorage(server, h), server.scope), (fiber) =>
            Effect.sync(() => {
              h.resuming = fiber
            })
          )
        )
      })
    )
  )

/** Asks the controller for an ISR change until it answers, unless the generation ends first; feeds back its answer. */
const proposeIsr = (
  server: Server,
  h: Hosted.Hosted,
  command: Extract<Replica.Command, { _tag: "ProposeIsr" }>
): Effect.Effect<void> =>
  Effect.gen(function* () {
    const { generation, isr, proposal, registrations } = command
    // Offline (or moved on) before the request left: there is no leader to answer.
    if (h.state.generation !== generation || h.state.leader === undefined) return
    yield* Effect.logInfo(`server ${server.self}: ${h.key}: asking the controller for ISR [${isr.join(",")}]`)
    const reply = yield* Retry.retry(
      server.peers.controller.adjustIsr({
        tablet: h.tablet,
        leader: server.self,
        leaderEpoch: command.leaderEpoch,
        version: command.version,
        isr,
        ...(registrations.length === 0 ? {} : { registrations })
      }),
      {
        schedule: Schedule.spaced(server.config.retryBackoff),
        while: () => h.state.generation === generation,
        tell: { what: () => `server ${server.self}: ${h.key}: proposing ISR [${isr.join(",")}]` }
      }
    )
    const nowMs = yield* Clock.currentTimeMillis
    yield* Hosted.locked(h, feedLogged(server, h, { _tag: "IsrAnswer", generation, proposal, reply, nowMs }))
  }).pipe(Effect.ignore)

/** Deletes `tablet`'s log (closed first: an open one is locked). */
const dropLog = (server: Server, tablet: Models.TabletId): Effect.Effect<void, ReplicaManager.ReplicaError> =>
  server.storage.drop(tablet).pipe(
    Effect.mapError(
      (e) =>
        new ReplicaManager.ReplicaError({
          reason: new ReplicaManager.ReplicaStorageFailed({ tablet: Models.tabletKey(tablet), detail: e.message })
        })
    )
  )

/** Opens the replica's log, then feeds the machine `Loaded`. */
const openLog = (server: Server, h: Hosted.Hosted): Effect.Effect<void, ReplicaManager.ReplicaError> =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const opened = yield* Effect.exit(Scope.provide(server.storage.open(h.tablet), scope))
    if (Exit.isFailure(opened)) {
      yield* Scope.close(scope, Exit.void)
      const detail = Option.match(Exit.findErrorOption(opened), {
        onNone: () => "the log could not be opened",
        onSome: (e) => e.message
      })
      return yield* fail(new ReplicaManager.ReplicaStorageFailed({ tablet: h.key, detail }))
    }
    // A request that arrived as the server stopped must not leave a log open (its storage locked) behind it.
    if (server.closed) {
      yield* Scope.close(scope, Exit.void)
      return yield* fail(new ReplicaManager.ReplicaStorageFailed({ tablet: h.key, detail: "the server has stopped" }))
    }
    h.log = opened.value
    h.logScope = scope
    yield* feedOrFail(server, h, { _tag: "Loaded" })
  })

// ---------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------

/** The replica of `tablet`, hosted here from now on if it was not. */
const hostedOrNew = (server: Server, tablet: Models.TabletId) => {
  const key = Models.tabletKey(tablet)
  let h = server.hosted.get(key)
  if (h === undefined) {
    h = Hosted.make(tablet, server.self, {
      minInsyncReplicas: server.config.minInsyncReplicas,
      lagTimeMaxMs: Duration.toMillis(server.config.replicaLagTimeMax)
    })
    server.hosted.set(key, h)
  }
  return h
}

/**
 * Applies one tablet's instruction: a new replica's log is opened first. The replication throttle and the retention
 * it names (or their absence) are the replica's from then on, even when the machine finds nothing new in it (a
 * throttle changes under the same leader epoch).
 */
const apply = (server: Server, instruction: ReplicaManager.TabletInstruction) =>
  Effect.gen(function* () {
    const h = hostedOrNew(server, instruction.tablet)
    yield* Hosted.locked(
      h,
      Effect.gen(function* () {
        yield* feedOrFail(server, h, { _tag: "Open" })
        const log = h.log
        const bounds =
          log === undefined
            ? { logEndOffset: 0, highWatermark: 0 }
            : { logEndOffset: yield* log.logEndOffset, highWatermark: yield* log.highWatermark }
        const nowMs = yield* Clock.currentTimeMillis
        yield* feedOrFail(server, h, { _tag: "Instruction", instruction, log: bounds, nowMs })
        server.throttle.set(h.key, instruction.throttleBytesPerSec)
        h.retention = instruction.retention
      })
    )
  })

/** The replica of `tablet`, or `UnknownTablet`. */
const hostedOf = (server: Server, tablet: Models.TabletId) =>
  Effect.suspend(() => {
    const h = server.hosted.get(Models.tabletKey(tablet))
    return h === undefined
      ? fail(new ReplicaManager.UnknownTablet({ tablet: Models.tabletKey(tablet) }))
      : Effect.succeed(h)
  })

/** The append's error for a refused producer stamp or a failed log. */
const appendError = (h: Hosted.Hosted, e: TabletLog.TabletLogError) => {
  const r = e.reason
  if (r._tag !== "ProducerRefused") return storageFailed(h)(e)
  return new ReplicaManager.ReplicaError({
    reason: new ReplicaManager.ProducerRefused({
      tablet: h.key,
      producer: r.producer,
      kind: r.verdict._tag,
      detail: ProducerState.describeRefusal(r.verdict)
    })
  })
}

/**
 * Waits for `ticket` (an acks=all append's or a delete's) up to the append timeout, failing with `timedOut`; a caller
 * that stops waiting (timed out, interrupted) gives its ticket back.
 */
const awaitTicket = (
  server: Server,
  h: Hosted.Hosted,
  ticket: number,
  done: Deferred.Deferred<number, ReplicaManager.ReplicaError>,
  timedOut: (timeoutMs: number) => ReplicaManager.ErrorReason
) => {
  const timeoutMs = Duration.toMillis(server.config.appendTimeout)
  return Deferred.await(done).pipe(
    Effect.timeoutOption(timeoutMs),
    Effect.flatMap(
      Option.match({
        onNone: () => fail(timedOut(timeoutMs)),
        onSome: Effect.succeed
      })
    ),
    Effect.onExit((exit) =>
      Exit.isSuccess(exit) || !h.tickets.has(ticket)
        ? Effect.void
        : Effect.andThen(
            Effect.sync(() => h.tickets.delete(ticket)),
            Hosted.locked(h, feedLogged(server, h, { _tag: "Abandon", ticket }))
          )
    )
  )
}

/**
 * A client's delete of the records below an offset, on the leader: the machine admits it, the log start moves, and
 * the answer waits (as an acks=all append does) until every in-sync replica's start has reached the offset.
 */
const deleteRecords =
  (server: Server): ReplicaManager.Shape["deleteRecords"] =>
  (request) =>
    Effect.gen(function* () {
      const h = yield* hostedOf(server, request.tablet)
      const outcome = yield* Hosted.locked(
        h,
        Effect.gen(function* () {
          const log = h.log
          const start = log === undefined ? 0 : yield* log.logStartOffset
          const admitted = yield* feedOrFail(server, h, {
            _tag: "DeleteRecords",
            offset: request.offset,
            logStartOffset: start
          })
          if (admitted?._tag !== "Delete" || log === undefined) return yield* fail(Replica.notLeader(h.state))
          yield* log.deleteBefore(request.offset).pipe(
            Effect.tapError((e) =>
              TabletLog.isStorageFailure(e)
                ? feedLogged(server, h, { _tag: "StorageFailed", detail: e.message })
                : Effect.void
            ),
            Effect.mapError(storageFailed(h))
          )
          const deleted = yield* feedOrFail(server, h, { _tag: "RecordsDeleted", offset: request.offset })
          if (deleted?._tag !== "Wait") return { log }
          const done = Deferred.makeUnsafe<number, ReplicaManager.ReplicaError>()
          h.tickets.set(deleted.ticket, done)
          return { log, ticket: deleted.ticket, done }
        })
      )
      if (outcome.done !== undefined) {
        yield* awaitTicket(
          server,
          h,
          outcome.ticket,
          outcome.done,
          (timeoutMs) => new ReplicaManager.DeleteTimedOut({ tablet: h.key, offset: request.offset, timeoutMs })
        )
      }
      return { logStartOffset: yield* outcome.log.logStartOffset }
    }).pipe(
      Effect.withSpan("strata.tablet.deleteRecords", {
        attributes: { "strata.tablet": Models.tabletKey(request.tablet), "strata.offset": request.offset }
      })
    )

/** Writes an append the machine admitted and feeds it back: acknowledged now, or a ticket to wait on. */
const persist = (server: Server, h: Hosted.Hosted, request: ReplicaManager.AppendRequest) =>
  Effect.gen(function* () {
    const proposed = yield* feedOrFail(server, h, { _tag: "Propose", acks: request.acks })
    const log = h.log
    if (proposed?._tag !== "Persist" || log === undefined) return yield* fail(Replica.notLeader(h.state))
    const written = yield* log.append(proposed.leaderEpoch, request.records, request.producer).pipe(
      Effect.tapError((e) =>
        TabletLog.isStorageFailure(e)
          ? feedLogged(server, h, { _tag: "StorageFailed", detail: e.message })
          : Effect.void
      ),
      Effect.mapError((e) => appendError(h, e))
    )
    const duplicate = written.duplicate === true
    const answer = yield* feedOrFail(server, h, {
      _tag: "Persisted",
      acks: request.acks,
      lastOffset: written.lastOffset,
      duplicate
    })
    const result = (highWatermark: number): ReplicaManager.AppendResult => ({
      baseOffset: written.baseOffset,
      lastOffset: written.lastOffset,
      highWatermark,
      duplicate
    })
    if (answer?._tag !== "Wait") return { result: result(answer?._tag === "Done" ? answer.highWatermark : 0) }
    const done = Deferred.makeUnsafe<number, ReplicaManager.ReplicaError>()
    h.tickets.set(answer.ticket, done)
    return { result: result(answer.highWatermark), ticket: answer.ticket, done }
  })

const append =
  (server: Server): ReplicaManager.Shape["append"] =>
  (request) =>
    Effect.gen(function* () {
      if (request.records.length === 0)
        return yield* fail(new Log.InvalidRequest({ detail: "an append of no records" }))
      const h = yield* hostedOf(server, request.tablet)
      const started = yield* Clock.currentTimeNanos
      const outcome = yield* Hosted.locked(h, persist(server, h, request))
      const served = Effect.flatMap(Clock.currentTimeNanos, (now) => {
        const seconds = Number(now - started) / 1e9
        server.health.appended(Number(now / 1_000_000n), seconds * 1000)
        return server.metrics.appended(request.records.length, ServerMetrics.recordBytes(request.records), seconds)
      })
      if (outcome.done === undefined) return yield* Effect.as(served, outcome.result)
      const hw = yield* awaitTicket(
        server,
        h,
        outcome.ticket,
        outcome.done,
        (timeoutMs) =>
          new ReplicaManager.AppendTimedOut({ tablet: h.key, lastOffset: outcome.result.lastOffset, timeoutMs })
      )
      yield* served
      return { ...outcome.result, highWatermark: hw }
    }).pipe(
      Effect.withSpan("strata.tablet.append", {
        attributes: {
          "strata.tablet": Models.tabletKey(request.tablet),
          "strata.records": request.records.length,
          "strata.acks": request.acks
        }
      })
    )

/**
 * A client's read on the leader. One at the high watermark with nothing to return waits, when it asks to
 * (`maxWaitMs`, at most `fetchMaxWait`), on the replica's `changed` as a caught-up follower's fetch does: each time
 * the log end or the high watermark moves it looks again (leadership checked again, so a replica that stopped leading
 * meanwhile answers `NotLeader`), and once the wait is over it answers empty. The waiter is interruptible throughout:
 * a caller that goes ends it.
 */
const read =
  (server: Server): ReplicaManager.Shape["read"] =>
  (request) =>
    Effect.gen(function* () {
      const h = yield* hostedOf(server, request.tablet)
      const waitMs = Math.min(request.maxWaitMs ?? 0, Duration.toMillis(server.config.fetchMaxWait))
      const until = waitMs > 0 ? (yield* Clock.currentTimeMillis) + waitMs : 0
      while (true) {
        // `changed` taken under the lock with the leadership: a move of the HW after it wakes the wait below.
        const { highWatermark, log, changed } = yield* Hosted.locked(
          h,
          Effect.map(admitted(server, h, { _tag: "Lead" }), (a) => ({ ...a, changed: h.changed }))
        )
        const hw = highWatermark ?? (yield* log.highWatermark)
        const start = yield* log.logStartOffset
        const end = yield* log.logEndOffset
        const limit = request.uncommitted === true ? end : hw
        const bounds = { logStartOffset: start, logEndOffset: end, highWatermark: hw }
        if (request.offset < start || request.offset > end) {
          return yield* fail(
            new Errors.OffsetOutOfRange({
              topic: request.tablet.table,
              partition: request.tablet.bucket,
              offset: request.offset,
              logStart: start,
              highwater: end
            })
          )
        }
        if (request.offset >= limit) {
          const left = until - (yield* Clock.currentTimeMillis)
          if (left <= 0) return { batches: [], ...bounds }
          yield* Deferred.await(changed).pipe(Effect.timeoutOption(left))
          continue
        }
        const batches = yield* log.read(request.offset, request.maxBytes).pipe(Effect.mapError(storageFailed(h)))
        const cut = batches.flatMap((b) => {
          const count = Codec.countOf(b)
          const keep = Math.min(count, limit - b.baseOffset)
          if (keep <= 0) return []
          return keep === count ? [b] : [{ ...b, records: b.records.slice(0, keep) }]
        })
        yield* server.metrics.read(batchBytes(cut))
        return { batches: cut, ...bounds }
      }
    })

/** The record bytes of batches, as the metrics count them (a batch read from the log counted without decoding it). */
const batchBytes = (batches: ReadonlyArray<ReplicaManager.TabletBatch>): number => {
  let bytes = 0
  for (const b of batches) bytes += Codec.recordBytesOf(b) ?? ServerMetrics.recordBytes(b.records)
  return bytes
}

/**
 * Whether a follower whose last batch has `lastFetchedEpoch` and which fetches from `offset` diverges from this log:
 * the log must hold that epoch up to `offset` (KIP-320). Answers where that epoch (or the largest below it) ends.
 */
const divergence = (log: TabletLog.TabletLog, offset: number, lastFetchedEpoch: number | undefined) =>
  Effect.gen(function* () {
    if (lastFetchedEpoch === undefined) return undefined
    const answer = yield* log.endOffsetForEpoch(lastFetchedEpoch)
    if (answer !== undefined && answer.epoch === lastFetchedEpoch && answer.endOffset >= offset) return undefined
    return { epoch: answer?.epoch ?? null, endOffset: answer?.endOffset ?? (yield* log.logStartOffset) }
  })

/** A follower's fetch as the leader first sees it: out of range, diverging, or in range (its progress taken). */
const admitFetch = (server: Server, h: Hosted.Hosted, request: ReplicaManager.FetchRequest, nowMs: number) =>
  Effect.gen(function* () {
    const { generation, leaderEpoch, log } = yield* admitted(server, h, {
      _tag: "Lead",
      leaderEpoch: request.leaderEpoch
    })
    const start = yield* log.logStartOffset
    const end = yield* log.logEndOffset
    if (request.offset < start) return { _tag: "OutOfRange" as const, start }
    const diverging = yield* divergence(log, request.offset, request.lastFetchedEpoch).pipe(
      Effect.mapError(storageFailed(h))
    )
    if (diverging !== undefined) return { _tag: "Diverging" as const, ...diverging }
    if (request.offset > end) return { _tag: "OutOfRange" as const, start }
    yield* feedLogged(server, h, {
      _tag: "FollowerFetched",
      server: request.follower,
      fetchOffset: request.offset,
      nowMs,
      registration: request.registration,
      logStartOffset: request.logStartOffset
    })
    return { _tag: "InRange" as const, end, changed: h.changed, log, generation, leaderEpoch }
  })

const fetch =
  (server: Server): ReplicaManager.Shape["fetch"] =>
  (request) =>
    Effect.gen(function* () {
      const h = yield* hostedOf(server, request.tablet)
      const started = yield* Clock.currentTimeNanos
      const nowMs = yield* Clock.currentTimeMillis
      const seen = yield* Hosted.locked(h, admitFetch(server, h, request, nowMs))
      if (seen._tag === "OutOfRange") {
        return { _tag: "OutOfRange" as const, leaderEpoch: request.leaderEpoch, logStartOffset: seen.start }
      }
      if (seen._tag === "Diverging") {
        return {
          _tag: "Diverging" as const,
          leaderEpoch: request.leaderEpoch,
          epoch: seen.epoch,
          endOffset: seen.endOffset
        }
      }
      // Caught up: wait for an append (or a HW move) up to fetchMaxWait before answering. The replica may stop
      // leading meanwhile (and truncate, and copy another leader's records): the answer is given only if it leads in
      // the same generation and epoch before and after the read.
      const recheck = { _tag: "Recheck", generation: seen.generation, leaderEpoch: seen.leaderEpoch } as const
      if (request.offset === seen.end) {
        yield* Deferred.await(seen.changed).pipe(Effect.timeoutOption(server.config.fetchMaxWait))
        yield* admitted(server, h, recheck)
      }
      const batches = yield* seen.log.read(request.offset, request.maxBytes).pipe(Effect.mapError(storageFailed(h)))
      const after = yield* admitted(server, h, recheck)
      yield* server.metrics.fetched(batchBytes(batches), Number((yield* Clock.currentTimeNanos) - started) / 1e9)
      return {
        _tag: "Batches" as const,
        leaderEpoch: seen.leaderEpoch,
        batches,
        highWatermark: after.highWatermark ?? (yield* seen.log.highWatermark),
        logStartOffset: yield* seen.log.logStartOffset
      }
    }).pipe(
      Effect.withSpan("strata.tablet.fetch", {
        attributes: {
          "strata.tablet": Models.tabletKey(request.tablet),
          "strata.follower": request.follower,
          "strata.offset": request.offset
        }
      })
    )

const endOffsetForEpoch =
  (server: Server): ReplicaManager.Shape["endOffsetForEpoch"] =>
  (request) =>
    Effect.gen(function* () {
      const h = yield* hostedOf(server, request.tablet)
      const { leaderEpoch, log } = yield* Hosted.locked(
        h,
        admitted(server, h, { _tag: "Lead", leaderEpoch: request.leaderEpoch })
      )
      const answer = yield* log.endOffsetForEpoch(request.epoch)
      return { leaderEpoch, answer: answer ?? null }
    })

/**
 * A replica's latest epoch and log end, its log opened if it is not (a restart before any instruction). A tablet this
 * server does not host and has no data of (never assigned here, or deleted) is answered empty and left uncreated.
 */
const logEnd =
  (server: Server): ReplicaManager.Shape["logEnd"] =>
  (request) =>
    Effect.gen(function* () {
      const fence = request.fence
      if (fence !== undefined) yield* admitController(server, fence)
      const hosted = server.hosted.has(Models.tabletKey(request.tablet))
      const h = hostedOrNew(server, request.tablet)
      return yield* Hosted.locked(
        h,
        Effect.gen(function* () {
          yield* feedOrFail(server, h, { _tag: "Open" })
          // The answer must stay true: no role under an older epoch may append, acknowledge or copy past it.
          if (fence !== undefined) yield* feedOrFail(server, h, { _tag: "Fence", leaderEpoch: fence.leaderEpoch })
          const log = h.log
          if (log === undefined)
            return yield* fail(new ReplicaManager.ReplicaStorageFailed({ tablet: h.key, detail: "not open" }))
          const epochs = yield* log.epochs
          const answer = {
            lastEpoch: LeaderEpochCache.latest(epochs)?.epoch ?? null,
            logEndOffset: yield* log.logEndOffset
          }
          if (
            !hosted &&
            answer.lastEpoch === null &&
            answer.logEndOffset === 0 &&
            h.state.lifecycle._tag === "OnlineReplica"
          ) {
            yield* feedOrFail(server, h, { _tag: "Delete" })
            if (server.hosted.get(h.key) === h) server.hosted.delete(h.key)
          }
          return answer
        })
      )
    })

/**
 * Takes a controller's request: refused under a coordinator epoch below the highest seen, or when addressed to
 * another registration (life) of this server; else its coordinator epoch is the highest seen from now on.
 */
const admitController = (
  server: Server,
  request: { readonly coordinatorEpoch: number; readonly registration?: number | undefined }
) =>
  Effect.suspend(() => {
    if (request.coordinatorEpoch < server.coordinatorEpoch) {
      return fail(
        new Errors.FencedEpoch({
          resource: "coordinator",
          current: server.coordinatorEpoch,
          attempted: request.coordinatorEpoch
        })
      )
    }
    if (request.registration !== undefined && request.registration !== server.registration) {
      // Meant for another life of this server (its last one, or its next, not registered yet).
      return fail(
        new Errors.FencedEpoch({
          resource: `registration of server ${server.self}${server.registration === undefined ? " (not registered)" : ""}`,
          current: server.registration ?? 0,
          attempted: request.registration
        })
      )
    }
    server.coordinatorEpoch = Math.max(server.coordinatorEpoch, request.coordinatorEpoch)
    return Effect.void
  })

/**
 * Deletes this server's replica of `tablet`: a hosted one through its machine (its role ends, its log closes, its
 * data goes), and its stored log in any case: a replica left on disk by an earlier run is not hosted.
 */
const deleteReplica = (server: Server, tablet: Models.TabletId) =>
  Effect.gen(function* () {
    const key = Models.tabletKey(tablet)
    const h = server.hosted.get(key)
    server.throttle.set(key, undefined)
    if (h !== undefined) {
      yield* Hosted.locked(h, feedOrFail(server, h, { _tag: "Delete" }))
      if (server.hosted.get(key) === h) server.hosted.delete(key)
      yield* Hosted.signal(h)
    } else yield* dropLog(server, tablet)
    yield* Effect.logInfo(`server ${server.self}: ${key}: replica deleted`)
  })

const stopReplica =
  (server: Server): ReplicaManager.Shape["stopReplica"] =>
  (request) =>
    Effect.andThen(
      admitController(server, request),
      Effect.forEach(request.tablets, (tablet) => deleteReplica(server, tablet), { discard: true })
    )

const holdings =
  (server: Server): ReplicaManager.Shape["holdings"] =>
  (request) =>
    Effect.gen(function* () {
      yield* admitController(server, request)
      return {
        // A replica in no role (its log not open, or closed after a failure) holds no epoch: it is instructed again.
        tablets: yield* Effect.forEach([...server.hosted.values()], ({ key, state, log }) =>
          Effect.map(log === undefined ? Effect.succeed(undefined) : log.sizeBytes, (sizeBytes) => {
            const throttle = server.throttle.of(key)
            return {
              tablet: state.tablet,
              leaderEpoch:
                state.lifecycle._tag === "LeaderReplica" || state.lifecycle._tag === "FollowerReplica"
                  ? ReplicaState.lastLeaderEpoch(state.lifecycle)
                  : null,
              version: state.version,
              ...(sizeBytes === undefined ? {} : { sizeBytes }),
              ...(throttle === undefined ? {} : { throttleBytesPerSec: throttle })
            }
          })
        ),
        health: server.health.at(yield* Clock.currentTimeMillis)
      }
    })

const leaderAndIsr =
  (server: Server): ReplicaManager.Shape["leaderAndIsr"] =>
  (request: ReplicaManager.LeaderAndIsrRequest) =>
    Effect.gen(function* () {
      yield* admitController(server, request)
      // One tablet's failure (its storage, an instruction its machine refuses) does not hold up the others.
      yield* Effect.forEach(
        request.tablets,
        (instruction) =>
          apply(server, instruction).pipe(
            Effect.catch((e) =>
              Effect.logWarning(`server ${server.self}: ${Models.tabletKey(instruction.tablet)}: ${e.message}`)
            )
          ),
        { discard: true }
      )
    })

const controlledShutdown = (server: Server): Effect.Effect<number> =>
  server.peers.controller.controlledShutdown(server.self).pipe(
    Effect.flatMap((remaining) => (remaining === 0 ? Effect.succeed(0) : Effect.fail(remaining))),
    Retry.retry({ schedule: Schedule.spaced(server.config.retryBackoff), times: 20 }),
    Effect.catch((e) => Effect.succeed(typeof e === "number" ? e : -1))
  )

/**
 * Every half of `replicaLagTimeMax`: every leader checks its followers' lag, and every log forgets the producers
 * idle for `producerIdExpiration`.
 */
const tick = (server: Server) =>
  Effect.gen(function* () {
    const nowMs = yield* Clock.currentTimeMillis
    yield* Effect.forEach(
      [...server.hosted.values()],
      (h) =>
        Hosted.locked(h, feedLogged(server, h, { _tag: "Tick", nowMs })).pipe(
          Effect.andThen(
            Effect.suspend(() =>
              h.log === undefined
                ? Effect.void
                : h.log
                    .expireProducers(Duration.toMillis(server.config.producerIdExpiration))
                    .pipe(Effect.catch((e) => Hosted.locked(h, logFailed(server, h, e))))
            )
          )
        ),
      { discard: true }
    )
  }).pipe(Effect.repeat(Schedule.spaced(Math.floor(Duration.toMillis(server.config.replicaLagTimeMax) / 2))))

/**
 * Every `retentionCheckInterval`, each replica whose table has a retention deletes what it lets go below the high
 * watermark its log checkpointed (never a record a leader has not committed, nor one a follower has not seen
 * committed), under the replica's lock.
 */
const retainAll = (server: Server) =>
  Effect.gen(function* () {
    const nowMs = yield* Clock.currentTimeMillis
    yield* Effect.forEach([...server.hosted.values()], (h) => Hosted.locked(h, retainOne(server, h, nowMs)), {
      discard: true
    })
  }).pipe(Effect.repeat(Schedule.spaced(server.config.retentionCheckInterval)))

/** One replica's retention (nothing without one, or with its log closed); a failed log is the replica's failure. */
const retainOne = (server: Server, h: Hosted.Hosted, nowMs: number): Effect.Effect<void> =>
  Effect.gen(function* () {
    const { log, retention } = h
    if (log === undefined || retention === undefined) return
    const before = yield* log.logStartOffset
    const after = yield* log.retain(retention, yield* log.highWatermark, nowMs)
    if (after > before)
      yield* Effect.logInfo(`server ${server.self}: ${h.key}: retention moved the log start from ${before} to ${after}`)
  }).pipe(Effect.catch((e) => logFailed(server, h, e)))

/** Each hosted replica as the metrics see it: a leader's figures from its machine, a follower's from its log. */
const samples = (server: Server): Effect.Effect<ReadonlyArray<ServerMetrics.ReplicaSample>> =>
  Effect.suspend(() => Effect.forEach([...server.hosted.values()], sampleOf))

/** One hosted replica as the metrics see it. */
const sampleOf = (h: Hosted.Hosted): Effect.Effect<ServerMetrics.ReplicaSample> =>
  Effect.gen(function* () {
    const { state, log } = h
    const base = { tablet: h.tablet, replicas: state.replicas.length, online: log !== undefined }
    const leader = state.leader
    if (leader !== undefined) {
      const producers = log === undefined ? 0 : (yield* log.producers).size
      return {
        ...base,
        isr: leader.isr.length,
        highWatermark: leader.highWatermark,
        logEndOffset: leader.logEndOffset,
        producers
      }
    }
    if (log === undefined) return base
    return { ...base, highWatermark: yield* log.highWatermark, logEndOffset: yield* log.logEndOffset }
  })

/**
 * Starts a tablet server on the `ServerStorage` and `Peers` of its context; it stops (closing every log) with the scope.
 *
 * @since 0.1.0
 */
export const make = (
  options: TabletServerOptions
): Effect.Effect<
  TabletServerShape,
  ReplicationConfig.InvalidReplicaOptions,
  Scope.Scope | ServerStorage.ServerStorage | Peers
> =>
  Effect.gen(function* () {
    const o = yield* OptionSchemas.decodeOptions(TabletServerOptions, { exact: true })(options).pipe(
      Effect.mapError(ReplicationConfig.invalidOptions)
    )
    const scope = yield* Effect.scope
    const server: Server = {
      self: o.serverId,
      config: o.replication,
      peers: yield* Peers,
      storage: yield* ServerStorage.ServerStorage,
      scope,
      hosted: new Map(),
      machines: yield* Machines,
      metrics: ServerMetrics.make(o.serverId),
      throttle: Throttle.make(),
      health: Health.make(),
      coordinatorEpoch: 0,
      registration: undefined,
      storageReports: 0,
      closed: false
    }
    yield* Effect.addFinalizer(() =>
      Effect.suspend(() => {
        server.closed = true
        return Effect.forEach(
          [...server.hosted.values()],
          (h) => (h.logScope === undefined ? Effect.void : Scope.close(h.logScope, Exit.void)),
          { discard: true }
        )
      })
    )
    yield* Effect.forkIn(tick(server), scope)
    yield* Effect.forkIn(retainAll(server), scope)
    return {
      serverId: server.self,
      leaderAndIsr: leaderAndIsr(server),
      append: append(server),
      read: read(server),
      deleteRecords: deleteRecords(server),
      fetch: fetch(server),
      endOffsetForEpoch: endOffsetForEpoch(server),
      logEnd: logEnd(server),
      holdings: holdings(server),
      stopReplica: stopReplica(server),
      replicaState: (tablet) => Effect.map(hostedOf(server, tablet), (h) => h.state.lifecycle._tag),
      coordinatorEpoch: Effect.sync(() => server.coordinatorEpoch),
      registered: (registration) =>
        Effect.sync(() => {
          server.registration = registration
        }),
      controlledShutdown: controlledShutdown(server),
      registration: Effect.sync(() => server.registration),
      samples: samples(server),
      refreshMetrics: Effect.flatMap(samples(server), (all) =>
        server.metrics.refresh(all, server.config.minInsyncReplicas, server.throttle.rate() ?? 0)
      ),
      logOf: (tablet) => Effect.sync(() => server.hosted.get(Models.tabletKey(tablet))?.log),
      tablets: Effect.sync(() => [...server.hosted.values()].map((h) => h.tablet)),
      replicas: Effect.sync(() =>
        [...server.hosted.values()].map(({ state }): ReplicaView => {
          const view = { tablet: state.tablet, machine: state.lifecycle }
          const l = state.leader
          return l === undefined
            ? view
            : {
                ...view,
                leader: {
                  leaderEpoch: l.leaderEpoch,
                  highWatermark: l.highWatermark,
                  logEndOffset: l.logEndOffset,
                  isr: l.isr
                }
              }
        })
      )
    }
  })

/**
 * The tablet server, as itself and as core's `ReplicaManager`.
 *
 * @since 0.1.0
 */
export const layer = (
  options: TabletServerOptions
): Layer.Layer<
  TabletServer | ReplicaManager.ReplicaManager,
  ReplicationConfig.InvalidReplicaOptions,
  ServerStorage.ServerStorage | Peers
> =>
  Layer.effectContext(
    Effect.map(make(options), (server) =>
      Context.make(TabletServer, server).pipe(Context.add(ReplicaManager.ReplicaManager, server))
    )
  )

/**
 * Like `layer`, with the options read from configuration.
 *
 * @since 0.1.0
 */
export const layerConfig = (
  config: Config.Wrap<TabletServerOptions>
): Layer.Layer<
  TabletServer | ReplicaManager.ReplicaManager,
  ReplicationConfig.InvalidReplicaOptions | Config.ConfigError,
  ServerStorage.ServerStorage | Peers
> => Layer.unwrap(Effect.map(Config.unwrap(config), layer))
