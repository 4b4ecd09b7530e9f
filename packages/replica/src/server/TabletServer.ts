/**
 * A tablet server: core's `ReplicaManager` over the replica machines (docs/ARCHITECTURE.md, "Replication"). It
 * hosts one `TabletLog` per replica on the `Store`, applies the coordinator's LeaderAndIsr instructions through
 * `ReplicaState` (refusing a coordinator epoch below the highest it has seen), leads through `LeaderState`
 * (appends with acks, idempotent producer stamps, the followers' fetches, the ISR changes it asks the controller
 * for) and follows through `FollowerState` (a fetch loop per followed replica).
 *
 * The shell decides nothing: each machine's commands run in order, under the replica's lock, and requests to other
 * servers are repeated after a backoff until answered or until the role that sent them ends.
 *
 * @since 0.1.0
 */
import {
  AppendTimedOut,
  type AppendResult,
  FencedEpoch,
  InvalidRequest,
  type LeaderAndIsrRequest,
  NotEnoughReplicas,
  OffsetOutOfRange,
  OptionSchemas,
  ProducerRefused,
  ReplicaError,
  type ReplicaErrorReason,
  ReplicaManager,
  type ReplicaManagerShape,
  ReplicaStorageFailed,
  ServerId,
  Store,
  type StoreShape,
  type TabletId,
  type TabletInstruction,
  UnknownTablet,
  tabletKey
} from "@strata/core"
import { Clock, Context, Deferred, Effect, Exit, Fiber, Layer, Option, Result, Schedule, Schema, Scope } from "effect"
import { follow } from "./internal/follower.js"
import * as Hosted from "./internal/hosted.js"
import * as LeaderEpochCache from "../machines/LeaderEpochCache.js"
import * as LeaderState from "../machines/LeaderState.js"
import * as ProducerState from "../machines/ProducerState.js"
import { Peers, type PeersShape } from "../wire/Peers.js"
import * as ReplicaState from "../machines/ReplicaState.js"
import * as ReplicationConfig from "../wire/ReplicationConfig.js"
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
  serverId: ServerId,
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
export interface TabletServerShape extends ReplicaManagerShape {
  /** The highest coordinator epoch this server has taken instructions under. */
  readonly coordinatorEpoch: Effect.Effect<number>
  /**
   * Tells the server its current registration (`undefined`: none, its session ended): instructions addressed to
   * another registration are refused from then on.
   */
  readonly registered: (registration: number | undefined) => Effect.Effect<void>
  /** The replica's log, for inspection (`undefined` when not hosted or not open). */
  readonly logOf: (tablet: TabletId) => Effect.Effect<TabletLog.TabletLog | undefined>
  /** The tablets hosted here. */
  readonly tablets: Effect.Effect<ReadonlyArray<TabletId>>
  /** Each hosted replica's state; a leader's high watermark and log end as its machine holds them. */
  readonly replicas: Effect.Effect<ReadonlyArray<ReplicaView>>
  /**
   * Asks the controller to move every leadership off this server (its controlled shutdown), again after the backoff
   * while it still leads some, up to 20 times; the number of tablets it still leads (0: safe to stop).
   */
  readonly controlledShutdown: Effect.Effect<number>
}

/**
 * One replica as the server holds it.
 *
 * @since 0.1.0
 */
export interface ReplicaView {
  readonly tablet: TabletId
  readonly machine: ReplicaState.State
  readonly leader?: {
    readonly leaderEpoch: number
    readonly highWatermark: number
    readonly logEndOffset: number
    /** The committed ISR as the leader knows it. */
    readonly isr: ReadonlyArray<ServerId>
  }
}

/**
 * Safety checks a broken variant may switch off: for the simulator's planted bugs only.
 *
 * @internal
 */
export interface Unsafe {
  /** A new follower truncates to its high watermark instead of asking its leader (Fluss's behaviour). */
  readonly truncateToHighWatermark?: boolean
  /** A leader advances its high watermark while its ISR is below the minimum. */
  readonly highWatermarkIgnoresMinIsr?: boolean
  /** A leader's ISR answers clear its pending change whichever proposal they answer. */
  readonly answersIgnoreProposal?: boolean
  /** A long-polled fetch is answered after the wait without checking that the replica still leads in its epoch. */
  readonly skipFetchRevalidation?: boolean
  /** A controller's log-end question and an offline LeaderAndIsr leave a role under an older epoch running. */
  readonly unfencedLogEnd?: boolean
  /** An ISR change refused because the leadership is over is taken as not committed (its change dropped). */
  readonly fencedRefusalRejects?: boolean
}

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
  readonly self: ServerId
  readonly config: ReplicationConfig.ReplicationConfig
  readonly peers: PeersShape
  readonly store: StoreShape
  readonly scope: Scope.Scope
  readonly hosted: Map<string, Hosted.Hosted>
  readonly unsafe: Unsafe
  coordinatorEpoch: number
  registration: number | undefined
  /** The sequence of the last storage report this server made. */
  storageReports: number
  /** Set as the server stops: no log opens after. */
  closed: boolean
}

const fail = (reason: ReplicaErrorReason) => Effect.fail(new ReplicaError({ reason }))
const storageFailed = (h: Hosted.Hosted) => (e: TabletLog.TabletLogError) =>
  new ReplicaError({ reason: new ReplicaStorageFailed({ tablet: h.key, detail: e.message }) })

/** The store partition a tablet's log lives in. */
export const storeIdOf = (tablet: TabletId) => ({ table: `tablet.${tablet.table}`, partition: tablet.bucket })

/** Runs the leader machine's commands: checkpoint the HW (releasing the appends it covers), propose an ISR. */
const runLeader = (
  server: Server,
  h: Hosted.Hosted,
  commands: ReadonlyArray<LeaderState.Command>
): Effect.Effect<void> =>
  Effect.forEach(
    commands,
    (command) => {
      switch (command._tag) {
        case "AdvanceHighWatermark":
          return Effect.gen(function* () {
            // The checkpoint only shortens a restart's catch-up, but a store that fails it takes no writes: the
            // replica goes offline.
            if (h.log !== undefined) {
              const checkpointed = yield* Effect.result(h.log.checkpointHighWatermark(command.highWatermark))
              if (checkpointed._tag === "Failure") return yield* logFailed(server, h, checkpointed.failure)
            }
            yield* Hosted.release(h, command.highWatermark)
            yield* Hosted.signal(h)
          })
        case "ProposeIsr":
          return Effect.asVoid(Effect.forkIn(proposeIsr(server, h, h.role, command), server.scope))
        case "IsrBelowMinimum":
          return Hosted.failWaiters(h, Hosted.tooFewAfterAppend(h, command.size, server.config.minInsyncReplicas))
      }
    },
    { discard: true }
  )

/**
 * A log operation failed: its storage (the replica goes offline, `storageOffline`), or anything else (logged).
 * Under the replica's lock.
 */
const logFailed = (server: Server, h: Hosted.Hosted, e: TabletLog.TabletLogError): Effect.Effect<void> =>
  TabletLog.isStorageFailure(e)
    ? storageOffline(server, h, e.message)
    : Effect.logWarning(`server ${server.self}: ${h.key}: ${e.message}`)

/**
 * The replica's store failed (full, failing, unreadable): the replica goes offline — it stops leading or following
 * and its log closes — and the server tells the controller, which moves its leadership and takes it out of the ISR
 * (Kafka's handling of a failed log directory). A fiber then tries the store again, backing off, until it takes a
 * write, and tells the controller it works again. Under the replica's lock.
 */
const storageOffline = (server: Server, h: Hosted.Hosted, detail: string): Effect.Effect<void> =>
  Effect.gen(function* () {
    const m = h.machine._tag
    if (m === "OfflineReplica" || m === "ReplicaDeleted" || m === "NewReplica") return
    const { table, partition } = storeIdOf(h.tablet)
    yield* Effect.logWarning(
      `server ${server.self}: ${h.key}: its ${server.store.backend} store (partition ${table}/${partition}) failed: ${detail}; the replica is offline until its store takes writes again`
    )
    yield* Effect.ignore(stepReplica(server, h, { _tag: "Offline" }, undefined))
    if (h.resuming === undefined && !server.closed) {
      h.resuming = yield* Effect.forkIn(resumeStorage(server, h), server.scope)
    }
  })

/**
 * Tells the controller the replica's storage failed (or works again), until it is heard or that is moot. Each report
 * takes the server's next sequence (its retries keep it), so a late copy of an earlier one cannot undo it.
 */
const reportStorage = (server: Server, h: Hosted.Hosted, failed: boolean, still: () => boolean) =>
  Effect.suspend(() => {
    const sequence = ++server.storageReports
    return Hosted.retryTelling(
      Effect.suspend(() =>
        server.peers.controller.replicaStorage({
          server: server.self,
          registration: server.registration,
          tablets: [h.tablet],
          failed,
          sequence
        })
      ),
      server.config.retryBackoffMs,
      () => `server ${server.self}: ${h.key}: telling the controller its storage ${failed ? "failed" : "works again"}`,
      still
    ).pipe(Effect.ignore)
  })

/** The longest pause between two tries of a failed store. */
const storageRetryMaxMs = 30_000

/**
 * Reports the failure, then tries the store again after a backoff that doubles (up to 30 s; a store that fails again
 * within 30 s of coming back starts from its last pause, doubled): the log is opened again
 * and must take a write (its HW checkpoint). Once it does, the replica is online (instructions give it a role) and
 * the controller hears so. An instruction may open the log again meanwhile: the store must still take the write.
 * Ends when the replica is deleted.
 */
const resumeStorage = (server: Server, h: Hosted.Hosted): Effect.Effect<void> =>
  Effect.gen(function* () {
    yield* reportStorage(server, h, true, () => h.machine._tag === "OfflineReplica")
    const failedAt = yield* Clock.currentTimeMillis
    const back = h.storageBack
    let delay =
      back !== undefined && failedAt - back.at < storageRetryMaxMs
        ? Math.min(back.delay * 2, storageRetryMaxMs)
        : server.config.retryBackoffMs
    while (true) {
      yield* Effect.sleep(delay)
      const outcome = yield* Hosted.locked(
        h,
        Effect.gen(function* () {
          if (h.machine._tag === "ReplicaDeleted") return "deleted"
          // Offline still, or opened again meanwhile by an instruction: either way the store must take a write.
          const tried = yield* Effect.result(
            Effect.gen(function* () {
              if (h.machine._tag === "OfflineReplica") yield* stepReplica(server, h, { _tag: "Reopen" }, undefined)
              const log = h.log
              if (log === undefined) return yield* fail(new ReplicaStorageFailed({ tablet: h.key, detail: "not open" }))
              yield* log.checkpointHighWatermark(yield* log.highWatermark).pipe(Effect.mapError(storageFailed(h)))
            })
          )
          if (tried._tag === "Success") return "back"
          // The try moved the machine on (Reopen) before it failed.
          const now = h.machine as ReplicaState.State
          if (now._tag !== "OfflineReplica" && now._tag !== "ReplicaDeleted") {
            yield* Effect.ignore(stepReplica(server, h, { _tag: "Offline" }, undefined))
          }
          return "failing"
        })
      )
      if (outcome === "failing") {
        delay = Math.min(delay * 2, storageRetryMaxMs)
        continue
      }
      if (outcome === "back") {
        h.storageBack = { at: yield* Clock.currentTimeMillis, delay }
        yield* Effect.logInfo(`server ${server.self}: ${h.key}: its store takes writes again; the replica is online`)
        // Told until heard, unless it fails again meanwhile (then that is told instead, below).
        yield* reportStorage(
          server,
          h,
          false,
          () => h.machine._tag !== "ReplicaDeleted" && h.machine._tag !== "OfflineReplica"
        )
      }
      break
    }
  }).pipe(
    Effect.ensuring(
      // A store that failed again while this ran (its report of coming back still unheard) is tried again from the
      // start: nothing else would, and the replica would stay offline.
      Effect.suspend(() => {
        h.resuming = undefined
        if (h.machine._tag !== "OfflineReplica" || server.closed) return Effect.void
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

/** Steps the leader machine (if it still leads) and runs its commands. */
const stepLeader = (server: Server, h: Hosted.Hosted, input: LeaderState.Input): Effect.Effect<void> =>
  Effect.suspend(() => {
    if (h.leader === undefined) return Effect.void
    const [next, commands] = LeaderState.step(h.leader, input)
    h.leader = next
    return runLeader(server, h, commands)
  })

/** The ISR the controller committed at `version` (answering `proposal`, or in a LeaderAndIsr): the leader steps it. */
const isrCommitted = (
  server: Server,
  h: Hosted.Hosted,
  isr: ReadonlyArray<ServerId>,
  version: number,
  proposal?: number
): Effect.Effect<void> =>
  Effect.suspend(() => {
    h.version = Math.max(h.version, version)
    return stepLeader(server, h, { _tag: "IsrChangeCommitted", isr, version, proposal })
  })

/** Asks the controller for an ISR change until it answers, unless the role ends first; feeds back its answer. */
const proposeIsr = (
  server: Server,
  h: Hosted.Hosted,
  role: number,
  command: Extract<LeaderState.Command, { _tag: "ProposeIsr" }>
): Effect.Effect<void> =>
  Effect.gen(function* () {
    const leader = h.leader
    if (leader === undefined) return
    const { isr, proposal, registrations } = command
    yield* Effect.logInfo(`server ${server.self}: ${h.key}: asking the controller for ISR [${isr.join(",")}]`)
    const reply = yield* Hosted.retryTelling(
      server.peers.controller.adjustIsr({
        tablet: h.tablet,
        leader: server.self,
        leaderEpoch: leader.leaderEpoch,
        version: command.version,
        isr,
        ...(registrations.length === 0 ? {} : { registrations })
      }),
      server.config.retryBackoffMs,
      () => `server ${server.self}: ${h.key}: proposing ISR [${isr.join(",")}]`,
      () => h.role === role
    )
    const answeredAt = yield* Clock.currentTimeMillis
    yield* Hosted.locked(
      h,
      Effect.suspend(() => {
        if (h.role !== role) return Effect.void
        if (reply._tag === "IsrAdjusted") {
          return Effect.andThen(
            Effect.logInfo(
              `server ${server.self}: ${h.key}: ISR now [${reply.leaderAndIsr.isr.join(",")}] (version ${reply.leaderAndIsr.version})`
            ),
            isrCommitted(server, h, reply.leaderAndIsr.isr, reply.leaderAndIsr.version, proposal)
          )
        }
        // A stale version: the controller changed the ISR meanwhile; take its state, then propose again if need be.
        const r = reply.rejection
        const adopt =
          r._tag === "InvalidVersion" && r.leaderAndIsr.leaderEpoch === h.leader?.leaderEpoch
            ? isrCommitted(server, h, r.leaderAndIsr.isr, r.leaderAndIsr.version)
            : Effect.void
        // The leadership is over: an earlier try may have been committed, so the change stays pending.
        const fenced =
          r._tag === "FencedLeaderEpoch" ||
          r._tag === "NotLeader" ||
          r._tag === "UnknownTablet" ||
          (r._tag === "InvalidVersion" && r.leaderAndIsr.leaderEpoch !== h.leader?.leaderEpoch)
        if (fenced && server.unsafe.fencedRefusalRejects !== true) {
          return Effect.andThen(
            Effect.logInfo(
              `server ${server.self}: ${h.key}: ISR [${isr.join(",")}] refused (${r._tag}): this leadership is over; the change stays pending until the next LeaderAndIsr`
            ),
            stepLeader(server, h, { _tag: "IsrChangeFenced", proposal })
          )
        }
        const ineligible = r._tag === "IneligibleReplica" ? { server: r.server, nowMs: answeredAt } : undefined
        return Effect.andThen(adopt, stepLeader(server, h, { _tag: "IsrChangeRejected", proposal, ineligible }))
      })
    )
  }).pipe(Effect.ignore)

/** Runs the replica machine's commands, in order. */
const runReplica = (
  server: Server,
  h: Hosted.Hosted,
  instruction: TabletInstruction | undefined,
  commands: ReadonlyArray<ReplicaState.Command>
): Effect.Effect<void, ReplicaError> =>
  Effect.forEach(
    commands,
    (command): Effect.Effect<void, ReplicaError> => {
      switch (command._tag) {
        case "OpenLog":
          return openLog(server, h)
        case "BecomeLeader":
          return Effect.gen(function* () {
            h.role++
            const log = h.log!
            h.leader = LeaderState.become({
              self: server.self,
              leaderEpoch: command.leaderEpoch,
              replicas: h.replicas,
              isr: command.isr,
              version: instruction?.leaderAndIsr.version ?? h.version,
              minInsyncReplicas: server.config.minInsyncReplicas,
              lagTimeMaxMs: server.config.replicaLagTimeMaxMs,
              logEndOffset: yield* log.logEndOffset,
              highWatermark: yield* log.highWatermark,
              nowMs: yield* Clock.currentTimeMillis,
              ignoreMinIsr: server.unsafe.highWatermarkIgnoresMinIsr === true,
              anyAnswerClearsPending: server.unsafe.answersIgnoreProposal === true
            })
            if (instruction !== undefined) h.version = instruction.leaderAndIsr.version
            yield* Effect.logInfo(
              `server ${server.self}: ${h.key}: leading under leader epoch ${command.leaderEpoch}, ISR [${command.isr.join(",")}]`
            )
            // A leader alone in its ISR with a minimum of one commits what it has at once.
            yield* stepLeader(server, h, { _tag: "Appended", logEndOffset: yield* log.logEndOffset })
          })
        case "BecomeFollower":
          return Effect.gen(function* () {
            h.role++
            if (instruction !== undefined) h.version = instruction.leaderAndIsr.version
            yield* Effect.logInfo(
              `server ${server.self}: ${h.key}: following server ${command.leader} under leader epoch ${command.leaderEpoch}`
            )
            h.fetcher = yield* Effect.forkIn(
              follow(h, h.role, {
                self: server.self,
                registration: () => server.registration,
                leader: server.peers.leader(command.leader),
                leaderId: command.leader,
                leaderEpoch: command.leaderEpoch,
                fetchMaxBytes: server.config.fetchMaxBytes,
                retryBackoffMs: server.config.retryBackoffMs,
                truncateToHighWatermark: server.unsafe.truncateToHighWatermark === true,
                // The follower's own store failed: offline (from outside the follower, which that stops).
                storageFailed: (role, detail) =>
                  Effect.asVoid(
                    Effect.forkIn(
                      Hosted.locked(
                        h,
                        Effect.suspend(() => (h.role === role ? storageOffline(server, h, detail) : Effect.void))
                      ),
                      server.scope
                    )
                  )
              }),
              server.scope
            )
          })
        case "StopLeading":
          return Effect.suspend(() => {
            h.leader = undefined
            return Hosted.failWaiters(h, Hosted.notLeader(h))
          })
        case "StopFetching":
          return Effect.suspend(() => {
            const fiber = h.fetcher
            h.fetcher = undefined
            return fiber === undefined ? Effect.void : Fiber.interrupt(fiber)
          })
        case "CloseLog":
          return Effect.suspend(() => {
            const scope = h.logScope
            h.log = undefined
            h.logScope = undefined
            return scope === undefined ? Effect.void : Scope.close(scope, Exit.void)
          })
        case "DeleteLog":
          return dropLog(server, h.tablet)
      }
    },
    { discard: true }
  )

/** Drops the store partition of `tablet`'s log (closed first: an open one is locked). */
const dropLog = (server: Server, tablet: TabletId): Effect.Effect<void, ReplicaError> =>
  server.store
    .drop(storeIdOf(tablet))
    .pipe(
      Effect.mapError(
        (e) => new ReplicaError({ reason: new ReplicaStorageFailed({ tablet: tabletKey(tablet), detail: e.message }) })
      )
    )

/** Opens the replica's log, then feeds the machine `Loaded`. */
const openLog = (server: Server, h: Hosted.Hosted): Effect.Effect<void, ReplicaError> =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const opened = yield* Effect.exit(
      Effect.flatMap(Scope.provide(server.store.open(storeIdOf(h.tablet)), scope), (store) =>
        TabletLog.make(store, h.tablet)
      )
    )
    if (Exit.isFailure(opened)) {
      yield* Scope.close(scope, Exit.void)
      const detail = Option.match(Exit.findErrorOption(opened), {
        onNone: () => "the log could not be opened",
        onSome: (e) => e.message
      })
      return yield* fail(new ReplicaStorageFailed({ tablet: h.key, detail }))
    }
    // A request that arrived as the server stopped must not leave a log open (its store locked) behind it.
    if (server.closed) {
      yield* Scope.close(scope, Exit.void)
      return yield* fail(new ReplicaStorageFailed({ tablet: h.key, detail: "the server has stopped" }))
    }
    h.log = opened.value
    h.logScope = scope
    yield* stepReplica(server, h, { _tag: "Loaded" }, undefined)
  })

/** Steps the replica machine and runs its commands; an illegal event fails with the machine's error. */
const stepReplica = (
  server: Server,
  h: Hosted.Hosted,
  event: ReplicaState.Event,
  instruction: TabletInstruction | undefined
): Effect.Effect<void, ReplicaError> =>
  Effect.suspend(() => {
    const stepped = ReplicaState.step({ tablet: h.tablet, self: server.self }, h.machine, event)
    if (Result.isFailure(stepped)) return fail(stepped.failure)
    const [next, commands] = stepped.success
    h.machine = next
    return runReplica(server, h, instruction, commands)
  })

/** Applies one tablet's instruction: a new replica is opened first; an instruction with nothing new is dropped. */
/** The replica of `tablet`, hosted here from now on if it was not. */
const hostedOrNew = (server: Server, tablet: TabletId) => {
  const key = tabletKey(tablet)
  let h = server.hosted.get(key)
  if (h === undefined) {
    h = Hosted.make(tablet)
    server.hosted.set(key, h)
  }
  return h
}

/** Opens the replica's log if it is not open (new, or offline after a storage failure); under its lock. */
const ensureOpen = (server: Server, h: Hosted.Hosted) =>
  Effect.gen(function* () {
    if (h.machine._tag === "NewReplica") yield* openLog(server, h)
    if (h.machine._tag === "OfflineReplica") yield* stepReplica(server, h, { _tag: "Reopen" }, undefined)
  })

const apply = (server: Server, instruction: TabletInstruction) =>
  Effect.gen(function* () {
    const hosted = hostedOrNew(server, instruction.tablet)
    yield* Hosted.locked(
      hosted,
      Effect.gen(function* () {
        hosted.replicas = instruction.replicas
        yield* ensureOpen(server, hosted)
        const lai = instruction.leaderAndIsr
        switch (Hosted.classify(hosted, server.self, instruction)) {
          case "Step":
            return yield* stepReplica(
              server,
              hosted,
              {
                _tag: "LeaderAndIsr",
                leader: lai.leader!,
                leaderEpoch: lai.leaderEpoch,
                isr: lai.isr,
                replicas: instruction.replicas
              },
              instruction
            )
          case "IsrUpdate":
            return yield* isrCommitted(server, hosted, lai.isr, lai.version)
          case "Fence":
            if (server.unsafe.unfencedLogEnd === true) return
            return yield* stepReplica(server, hosted, { _tag: "Fence", leaderEpoch: lai.leaderEpoch }, instruction)
          case "Stale":
            // Told to lead again the epoch it lost going offline: it leads only under a new one, which the
            // controller gives on hearing that its store works again (that report may have been lost).
            if (
              hosted.machine._tag === "OnlineReplica" &&
              lai.leader === server.self &&
              lai.leaderEpoch === hosted.machine.lastLeaderEpoch &&
              hosted.resuming === undefined
            ) {
              hosted.resuming = yield* Effect.forkIn(
                reportStorage(server, hosted, false, () => hosted.machine._tag === "OnlineReplica").pipe(
                  Effect.ensuring(
                    Effect.sync(() => {
                      hosted.resuming = undefined
                    })
                  )
                ),
                server.scope
              )
            }
            return
        }
      })
    )
  })

/** The replica of `tablet`, or `UnknownTablet`. */
const hostedOf = (server: Server, tablet: TabletId) =>
  Effect.suspend(() => {
    const h = server.hosted.get(tabletKey(tablet))
    return h === undefined ? fail(new UnknownTablet({ tablet: tabletKey(tablet) })) : Effect.succeed(h)
  })

/** The replica's log and leader state when it leads `epoch` (any epoch when omitted), or the error to answer. */
const leading = (h: Hosted.Hosted, epoch?: number) => {
  const leader = h.leader
  const log = h.log
  if (leader === undefined || log === undefined || h.machine._tag !== "LeaderReplica") {
    return Effect.fail(Hosted.notLeader(h))
  }
  if (epoch !== undefined && epoch < leader.leaderEpoch) {
    return fail(new FencedEpoch({ resource: h.key, current: leader.leaderEpoch, attempted: epoch }))
  }
  // A follower ahead of this leader's epoch knows of a newer leader: this one is not it.
  if (epoch !== undefined && epoch > leader.leaderEpoch) return Effect.fail(Hosted.notLeader(h))
  return Effect.succeed({ leader, log })
}

/** The append's error for a refused producer stamp or a failed log. */
const appendError = (h: Hosted.Hosted, e: TabletLog.TabletLogError) => {
  const r = e.reason
  if (r._tag !== "ProducerRefused") return storageFailed(h)(e)
  return new ReplicaError({
    reason: new ProducerRefused({
      tablet: h.key,
      producer: r.producer,
      kind: r.verdict._tag,
      detail: ProducerState.describeRefusal(r.verdict)
    })
  })
}

const append =
  (server: Server): ReplicaManagerShape["append"] =>
  (request) =>
    Effect.gen(function* () {
      if (request.records.length === 0) return yield* fail(new InvalidRequest({ detail: "an append of no records" }))
      const h = yield* hostedOf(server, request.tablet)
      const min = server.config.minInsyncReplicas
      const outcome = yield* Hosted.locked(
        h,
        Effect.gen(function* () {
          const { leader, log } = yield* leading(h)
          if (request.acks === "all" && leader.isr.length < min) {
            return yield* fail(new NotEnoughReplicas({ tablet: h.key, isr: leader.isr.length, minIsr: min }))
          }
          const written = yield* log.append(leader.leaderEpoch, request.records, request.producer).pipe(
            Effect.tapError((e) =>
              TabletLog.isStorageFailure(e) ? storageOffline(server, h, e.message) : Effect.void
            ),
            Effect.mapError((e) => appendError(h, e))
          )
          if (written.duplicate !== true) {
            yield* stepLeader(server, h, { _tag: "Appended", logEndOffset: written.lastOffset + 1 })
            yield* Hosted.signal(h)
          }
          const hw = h.leader?.highWatermark ?? 0
          const result: AppendResult = {
            baseOffset: written.baseOffset,
            lastOffset: written.lastOffset,
            highWatermark: hw,
            duplicate: written.duplicate === true
          }
          if (request.acks !== "all" || hw > written.lastOffset) return { result, waiter: undefined }
          const waiter: Hosted.Waiter = { lastOffset: written.lastOffset, done: Deferred.makeUnsafe() }
          h.waiters.push(waiter)
          return { result, waiter }
        })
      )
      if (outcome.waiter === undefined) return outcome.result
      const timeoutMs = server.config.appendTimeoutMs
      const hw = yield* Deferred.await(outcome.waiter.done).pipe(
        Effect.timeoutOption(timeoutMs),
        Effect.flatMap(
          Option.match({
            onNone: () => fail(new AppendTimedOut({ tablet: h.key, lastOffset: outcome.result.lastOffset, timeoutMs })),
            onSome: Effect.succeed
          })
        )
      )
      return { ...outcome.result, highWatermark: hw }
    })

const read =
  (server: Server): ReplicaManagerShape["read"] =>
  (request) =>
    Effect.gen(function* () {
      const h = yield* hostedOf(server, request.tablet)
      const { leader, log } = yield* Hosted.locked(
        h,
        Effect.suspend(() => leading(h))
      )
      const hw = leader.highWatermark
      const start = yield* log.logStartOffset
      const end = yield* log.logEndOffset
      const limit = request.uncommitted === true ? end : hw
      const bounds = { logStartOffset: start, logEndOffset: end, highWatermark: hw }
      if (request.offset < start || request.offset > end) {
        return yield* fail(
          new OffsetOutOfRange({
            topic: request.tablet.table,
            partition: request.tablet.bucket,
            offset: request.offset,
            logStart: start,
            highwater: end
          })
        )
      }
      if (request.offset >= limit) return { batches: [], ...bounds }
      const batches = yield* log.read(request.offset, request.maxBytes).pipe(Effect.mapError(storageFailed(h)))
      const cut = batches.flatMap((b) => {
        const keep = Math.min(b.records.length, limit - b.baseOffset)
        if (keep <= 0) return []
        return keep === b.records.length ? [b] : [{ ...b, records: b.records.slice(0, keep) }]
      })
      return { batches: cut, ...bounds }
    })

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

/** Fails `NotLeader` unless the replica still leads in the role and epoch a fetch was admitted under. */
const stillLeading = (h: Hosted.Hosted, role: number, epoch: number, unsafe: Unsafe) =>
  Effect.suspend(() =>
    unsafe.skipFetchRevalidation === true || (h.role === role && h.leader?.leaderEpoch === epoch)
      ? Effect.void
      : Effect.fail(Hosted.notLeader(h))
  )

const fetch =
  (server: Server): ReplicaManagerShape["fetch"] =>
  (request) =>
    Effect.gen(function* () {
      const h = yield* hostedOf(server, request.tablet)
      const nowMs = yield* Clock.currentTimeMillis
      const seen = yield* Hosted.locked(
        h,
        Effect.gen(function* () {
          const { leader, log } = yield* leading(h, request.leaderEpoch)
          const start = yield* log.logStartOffset
          const end = yield* log.logEndOffset
          if (request.offset < start) return { _tag: "OutOfRange" as const, start }
          const diverging = yield* divergence(log, request.offset, request.lastFetchedEpoch).pipe(
            Effect.mapError(storageFailed(h))
          )
          if (diverging !== undefined) return { _tag: "Diverging" as const, ...diverging }
          if (request.offset > end) return { _tag: "OutOfRange" as const, start }
          yield* stepLeader(server, h, {
            _tag: "FollowerFetched",
            server: request.follower,
            fetchOffset: request.offset,
            nowMs,
            registration: request.registration
          })
          return { _tag: "InRange" as const, end, changed: h.changed, log, role: h.role, epoch: leader.leaderEpoch }
        })
      )
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
      // Caught up: wait for an append (or a HW move) up to fetchMaxWaitMs before answering. The replica may stop
      // leading meanwhile (and truncate, and copy another leader's records): the answer is given only if it leads in
      // the same role and epoch before and after the read.
      if (request.offset === seen.end) {
        yield* Deferred.await(seen.changed).pipe(Effect.timeoutOption(server.config.fetchMaxWaitMs))
        yield* stillLeading(h, seen.role, seen.epoch, server.unsafe)
      }
      const batches = yield* seen.log.read(request.offset, request.maxBytes).pipe(Effect.mapError(storageFailed(h)))
      yield* stillLeading(h, seen.role, seen.epoch, server.unsafe)
      return {
        _tag: "Batches" as const,
        leaderEpoch: seen.epoch,
        batches,
        highWatermark: h.leader?.leaderEpoch === seen.epoch ? h.leader.highWatermark : yield* seen.log.highWatermark,
        logStartOffset: yield* seen.log.logStartOffset
      }
    })

const endOffsetForEpoch =
  (server: Server): ReplicaManagerShape["endOffsetForEpoch"] =>
  (request) =>
    Effect.gen(function* () {
      const h = yield* hostedOf(server, request.tablet)
      const { leader, log } = yield* Hosted.locked(
        h,
        Effect.suspend(() => leading(h, request.leaderEpoch))
      )
      const answer = yield* log.endOffsetForEpoch(request.epoch)
      return { leaderEpoch: leader.leaderEpoch, answer: answer ?? null }
    })

/**
 * A replica's latest epoch and log end, its log opened if it is not (a restart before any instruction). A tablet this
 * server does not host and has no data of (never assigned here, or deleted) is answered empty and left uncreated.
 */
const logEnd =
  (server: Server): ReplicaManagerShape["logEnd"] =>
  (request) =>
    Effect.gen(function* () {
      const fence = request.fence
      if (fence !== undefined) yield* admitController(server, fence)
      const hosted = server.hosted.has(tabletKey(request.tablet))
      const h = hostedOrNew(server, request.tablet)
      return yield* Hosted.locked(
        h,
        Effect.gen(function* () {
          yield* ensureOpen(server, h)
          // The answer must stay true: no role under an older epoch may append, acknowledge or copy past it.
          if (fence !== undefined && server.unsafe.unfencedLogEnd !== true) {
            yield* stepReplica(server, h, { _tag: "Fence", leaderEpoch: fence.leaderEpoch }, undefined)
          }
          const log = h.log
          if (log === undefined) return yield* fail(new ReplicaStorageFailed({ tablet: h.key, detail: "not open" }))
          const epochs = yield* log.epochs
          const answer = {
            lastEpoch: LeaderEpochCache.latest(epochs)?.epoch ?? null,
            logEndOffset: yield* log.logEndOffset
          }
          if (!hosted && answer.lastEpoch === null && answer.logEndOffset === 0 && h.machine._tag === "OnlineReplica") {
            yield* stepReplica(server, h, { _tag: "Delete" }, undefined)
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
        new FencedEpoch({
          resource: "coordinator",
          current: server.coordinatorEpoch,
          attempted: request.coordinatorEpoch
        })
      )
    }
    if (request.registration !== undefined && request.registration !== server.registration) {
      // Meant for another life of this server (its last one, or its next, not registered yet).
      return fail(
        new FencedEpoch({
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
 * data goes), and the store partition in any case: a replica left on disk by an earlier run is not hosted.
 */
const deleteReplica = (server: Server, tablet: TabletId) =>
  Effect.gen(function* () {
    const key = tabletKey(tablet)
    const h = server.hosted.get(key)
    if (h !== undefined) {
      yield* Hosted.locked(
        h,
        h.machine._tag === "ReplicaDeleted" ? Effect.void : stepReplica(server, h, { _tag: "Delete" }, undefined)
      )
      if (server.hosted.get(key) === h) server.hosted.delete(key)
      yield* Hosted.signal(h)
    } else yield* dropLog(server, tablet)
    yield* Effect.logInfo(`server ${server.self}: ${key}: replica deleted`)
  })

const stopReplica =
  (server: Server): ReplicaManagerShape["stopReplica"] =>
  (request) =>
    Effect.andThen(
      admitController(server, request),
      Effect.forEach(request.tablets, (tablet) => deleteReplica(server, tablet), { discard: true })
    )

const holdings =
  (server: Server): ReplicaManagerShape["holdings"] =>
  (request) =>
    Effect.gen(function* () {
      yield* admitController(server, request)
      return {
        // A replica in no role (its log not open, or closed after a failure) holds no epoch: it is instructed again.
        tablets: [...server.hosted.values()].map((h) => ({
          tablet: h.tablet,
          leaderEpoch:
            h.machine._tag === "LeaderReplica" || h.machine._tag === "FollowerReplica"
              ? ReplicaState.lastLeaderEpoch(h.machine)
              : null,
          version: h.version
        }))
      }
    })

const leaderAndIsr =
  (server: Server): ReplicaManagerShape["leaderAndIsr"] =>
  (request: LeaderAndIsrRequest) =>
    Effect.gen(function* () {
      yield* admitController(server, request)
      // One tablet's failure (its store, an instruction its machine refuses) does not hold up the others.
      yield* Effect.forEach(
        request.tablets,
        (instruction) =>
          apply(server, instruction).pipe(
            Effect.catch((e) =>
              Effect.logWarning(`server ${server.self}: ${tabletKey(instruction.tablet)}: ${e.message}`)
            )
          ),
        { discard: true }
      )
    })

const controlledShutdown = (server: Server): Effect.Effect<number> =>
  server.peers.controller.controlledShutdown(server.self).pipe(
    Effect.flatMap((remaining) => (remaining === 0 ? Effect.succeed(0) : Effect.fail(remaining))),
    Effect.retry({ schedule: Schedule.spaced(server.config.retryBackoffMs), times: 20 }),
    Effect.catch((e) => Effect.succeed(typeof e === "number" ? e : -1))
  )

/**
 * Every half of `replicaLagTimeMaxMs`: every leader checks its followers' lag, and every log forgets the producers
 * idle for `producerIdExpirationMs`.
 */
const tick = (server: Server) =>
  Effect.gen(function* () {
    const nowMs = yield* Clock.currentTimeMillis
    yield* Effect.forEach(
      [...server.hosted.values()],
      (h) =>
        Hosted.locked(h, stepLeader(server, h, { _tag: "Tick", nowMs })).pipe(
          Effect.andThen(
            Effect.suspend(() =>
              h.log === undefined
                ? Effect.void
                : h.log
                    .expireProducers(server.config.producerIdExpirationMs)
                    .pipe(Effect.catch((e) => Hosted.locked(h, logFailed(server, h, e))))
            )
          )
        ),
      { discard: true }
    )
  }).pipe(Effect.repeat(Schedule.spaced(Math.floor(server.config.replicaLagTimeMaxMs / 2))))

/**
 * Starts a tablet server on the `Store` and `Peers` of its context; it stops (closing every log) with the scope.
 *
 * @since 0.1.0
 */
export const make = (
  options: TabletServerOptions,
  unsafe: Unsafe = {}
): Effect.Effect<TabletServerShape, ReplicationConfig.InvalidReplicaOptions, Scope.Scope | Store | Peers> =>
  Effect.gen(function* () {
    const o = yield* OptionSchemas.decodeOptions(TabletServerOptions, { exact: true })(options).pipe(
      Effect.mapError(ReplicationConfig.invalidOptions)
    )
    const scope = yield* Effect.scope
    const server: Server = {
      self: o.serverId,
      config: o.replication,
      peers: yield* Peers,
      store: yield* Store,
      scope,
      hosted: new Map(),
      unsafe,
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
    return {
      serverId: server.self,
      leaderAndIsr: leaderAndIsr(server),
      append: append(server),
      read: read(server),
      fetch: fetch(server),
      endOffsetForEpoch: endOffsetForEpoch(server),
      logEnd: logEnd(server),
      holdings: holdings(server),
      stopReplica: stopReplica(server),
      replicaState: (tablet) => Effect.map(hostedOf(server, tablet), (h) => h.machine._tag),
      coordinatorEpoch: Effect.sync(() => server.coordinatorEpoch),
      registered: (registration) =>
        Effect.sync(() => {
          server.registration = registration
        }),
      controlledShutdown: controlledShutdown(server),
      logOf: (tablet) => Effect.sync(() => server.hosted.get(tabletKey(tablet))?.log),
      tablets: Effect.sync(() => [...server.hosted.values()].map((h) => h.tablet)),
      replicas: Effect.sync(() =>
        [...server.hosted.values()].map((h): ReplicaView => {
          const view = { tablet: h.tablet, machine: h.machine }
          const l = h.leader
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
): Layer.Layer<TabletServer | ReplicaManager, ReplicationConfig.InvalidReplicaOptions, Store | Peers> =>
  Layer.effectContext(
    Effect.map(make(options), (server) => Context.make(TabletServer, server).pipe(Context.add(ReplicaManager, server)))
  )
