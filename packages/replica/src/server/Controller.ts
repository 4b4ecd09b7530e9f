/**
 * The controller: the coordinator leader's service that runs `ControllerState` (docs/ARCHITECTURE.md,
 * "Replication"). It loads the tablets from coordination, watches the tablet servers' registrations, and feeds the
 * machine one input at a time: the start, servers coming and going, and requests (tablet creation, leaders' ISR
 * changes, controlled shutdowns). It runs each step's commands in order and decides nothing:
 *
 * - `Write`: an epoch-checked coordination write (`Leadership.fenced`), a step's consecutive writes batched (up to
 *   `writeBatch` tablets an operation), each batch setting the tablet journal too; a failure is fed back as
 *   `WriteFailed`.
 * - `Send`: queued for the server, and delivered (after `Leadership.guard`) until the server answers, leaves, or
 *   answers that a newer coordinator exists; later instructions for a tablet replace queued ones.
 * - `Reply`, `Log`; `Resign` runs the `resign` effect it was given (the coordinator steps down).
 *
 * @since 0.1.0
 */
import { Coordination, type Election, Models, Retry } from "@strata/core"
import type * as ReplicaManager from "../protocol/ReplicaManager.js"
import { Cause, Clock, Context, Data, Deferred, Duration, Effect, Queue, Schedule, type Scope } from "effect"
import * as ClusterPaths from "../wire/ClusterPaths.js"
import * as ControllerState from "../machines/ControllerState.js"
import type * as ControllerMetrics from "./ControllerMetrics.js"
import * as Holdings from "./internal/holdings.js"
import * as ControllerView from "./ControllerView.js"
import * as ProducerIds from "./ProducerIds.js"
import { type ReplicaStorageReport, TabletServers, type TabletServersShape } from "../wire/Peers.js"

/**
 * The controller's channel to the tablet servers (declared with the other peer calls, in `Peers`).
 *
 * @since 0.1.0
 */
export { TabletServers, type TabletServersShape } from "../wire/Peers.js"

/**
 * The controller machine's step in context: production's `ControllerState.step` unless provided (the simulators
 * provide mutants of it, planted bugs they must catch).
 *
 * @since 0.1.0
 */
export const Machine = Context.Reference<ControllerState.StepFunction>("@strata/replica/Controller/Machine", {
  defaultValue: () => ControllerState.step
})

/**
 * The controller resigned (a write of its failed: a newer coordinator exists, or the outcome was unknown): ask the
 * current coordinator leader.
 *
 * @since 0.1.0
 */
export class ControllerResigned extends Data.TaggedError("ControllerResigned")<{ readonly coordinatorEpoch: number }> {
  /** @since 0.1.0 */
  override get message(): string {
    return `the controller of coordinator epoch ${this.coordinatorEpoch} resigned`
  }
}

/**
 * The controller's options.
 *
 * @since 0.1.0
 */
export interface ControllerOptions {
  /** The coordination namespace of the cluster (`/strata`). */
  readonly namespace: string
  readonly uncleanLeaderElection: boolean
  readonly minInsyncReplicas: number
  /** How a leader is chosen among the live ISR members (`first-in-isr`, the default, or `largest-log-end`). */
  readonly leaderElection?: "first-in-isr" | "largest-log-end"
  /** How often leadership moves back to preferred replicas (`BalanceLeaders`); 0 or unset: only when asked. */
  readonly leaderImbalanceCheckInterval?: Duration.Input
  /** The imbalance, in percent of a server's preferred tablets, above which they move back to it (10). */
  readonly leaderImbalancePercent?: number
  /** The pause between deliveries of an unanswered LeaderAndIsr, and between questions to a candidate. */
  readonly retryBackoff: Duration.Input
  /** Gives up the coordinator's leadership (the machine resigned). */
  readonly resign: Effect.Effect<void>
  /**
   * The coordinator's warm view of the tablets (`ControllerView`), which a new controller catches up and starts
   * from; without one it reads every tablet.
   */
  readonly view?: ControllerView.ControllerView
  /** The coordinator's controller metrics, if it keeps them (`ControllerMetrics`). */
  readonly metrics?: ControllerMetrics.ControllerMetrics | undefined
}

/** How many tablets one coordination write holds at most (etcd refuses transactions of over 128 operations). */
const writeBatch = 50

/** An input to the machine, and when it was queued (monotonic nanoseconds). */
interface Stamped {
  readonly input: ControllerState.Input
  readonly at: bigint
}

/** Queues an input for the machine. */
const offer = (c: Running, input: ControllerState.Input): Effect.Effect<boolean> =>
  Effect.flatMap(Clock.monotonicTimeNanos, (at) => Queue.offer(c.inbox, { input, at }))

/** Takes the machine's next input, observing how long it waited. */
const take = (c: Running): Effect.Effect<ControllerState.Input> =>
  Effect.flatMap(Queue.take(c.inbox), ({ input, at }) =>
    c.metrics === undefined
      ? Effect.succeed(input)
      : Effect.flatMap(Clock.monotonicTimeNanos, (now) => Effect.as(c.metrics!.queued(Number(now - at) / 1e9), input))
  )

/** A command that writes coordination: a tablet's new state, or its removal. */
type Writing = Extract<ControllerState.Command, { readonly _tag: "Write" | "Remove" }>

const isWriting = (c: ControllerState.Command | undefined): c is Writing => c?._tag === "Write" || c?._tag === "Remove"

/** The tablet a writing command is about. */
const idOf = (w: Writing): Models.TabletId => (w._tag === "Remove" ? w.tablet : w.tablet.tablet)

/**
 * A running controller.
 *
 * @since 0.1.0
 */
export interface ControllerShape {
  readonly coordinatorEpoch: number
  /** Creates tablets with their assignments, each keeping the retention given with it (its table's). */
  readonly createTablets: (
    tablets: Extract<ControllerState.Input, { readonly _tag: "CreateTablets" }>["tablets"]
  ) => Effect.Effect<ControllerState.Reply, ControllerResigned>
  readonly adjustIsr: (
    request: ControllerState.AdjustIsrRequest
  ) => Effect.Effect<ControllerState.AdjustIsrReply, ControllerResigned>
  /**
   * Deletes tablets: they lead no more, and each replica deletes itself (a server that is down when it is back);
   * their nodes go once every replica has. The number of these tablets the controller knows.
   */
  readonly deleteTablets: (tablets: ReadonlyArray<Models.TabletId>) => Effect.Effect<number, ControllerResigned>
  /**
   * Moves a tablet's replicas to `target` (see `Reassignment`): the tablet as written when the move began (or as it
   * is, for a repeat), or why it was refused. `options.throttleBytesPerSec` caps how fast the adding replicas copy;
   * a repeat of the move under way naming another throttle, or none, makes that the move's.
   */
  readonly reassign: (
    tablet: Models.TabletId,
    target: ReadonlyArray<Models.ServerId>,
    options?: ReassignOptions
  ) => Effect.Effect<ReassignReply, ControllerResigned>
  /** Ends a tablet's move, back on its original replicas: the tablet as written, or why it was refused. */
  readonly cancelReassign: (tablet: Models.TabletId) => Effect.Effect<ReassignReply, ControllerResigned>
  /** Moves leadership back to preferred replicas now; the number of tablets moved. */
  readonly balanceLeaders: Effect.Effect<number, ControllerResigned>
  /**
   * Preferred leader election for `tablets`: each whose preferred replica (its first) is live, in its ISR as the life
   * it joined with and electable leads, whatever the leader imbalance (tablets unknown, or led by it already, are
   * passed over); the number of tablets moved.
   */
  readonly electPreferred: (tablets: ReadonlyArray<Models.TabletId>) => Effect.Effect<number, ControllerResigned>
  /**
   * Each live server's health (`ReplicaManager.ServerHealth`: its recent p99 append latency and its ISR shrinks), as
   * its answer to `Holdings` within `timeout` tells it: every live server asked at once; one that fails, does not
   * answer in time, or keeps no health is left out.
   */
  readonly serverHealth: (
    timeout: Duration.Input
  ) => Effect.Effect<ReadonlyMap<Models.ServerId, ReplicaManager.ServerHealth>>
  /** Moves leadership off `server`; the number of tablets it still leads. */
  readonly controlledShutdown: (server: Models.ServerId) => Effect.Effect<number, ControllerResigned>
  /** Takes a server's report that its replicas of some tablets failed their storage, or work again. */
  readonly replicaStorage: (report: ReplicaStorageReport) => Effect.Effect<void, ControllerResigned>
  /** A producer id no producer of the cluster has had (Kafka's InitProducerId). */
  readonly initProducerId: Effect.Effect<number, ControllerResigned | Coordination.CoordinationError>
  /** The machine's state now. */
  readonly state: Effect.Effect<ControllerState.State>
  /** How it started: the tablets it started with, how many it read from coordination, whether it read them all. */
  readonly resumed: { readonly tablets: number; readonly read: number; readonly full: boolean }
}

/**
 * A move's options (`ControllerShape.reassign`).
 *
 * @since 0.1.0
 */
export interface ReassignOptions {
  /** The most bytes a second each server copies for the replicas the move adds (a whole number ≥ 1; absent: no cap). */
  readonly throttleBytesPerSec?: number | undefined
}

/**
 * The controller's answer to a reassignment or its cancel.
 *
 * @since 0.1.0
 */
export type ReassignReply = Extract<
  ControllerState.Reply,
  { readonly _tag: "Reassigning" | "ReassignCancelled" | "ReassignRefused" }
>

/** A reply to a move request as the move's reply (no other can come: the machine answers each input in kind). */
const asReassignReply = (reply: ControllerState.Reply): ReassignReply =>
  reply._tag === "Reassigning" || reply._tag === "ReassignCancelled" || reply._tag === "ReassignRefused"
    ? reply
    : { _tag: "ReassignRefused", refusal: { _tag: "UnknownTablet" }, detail: `unexpected answer ${reply._tag}` }

type Pending = Deferred.Deferred<ControllerState.Reply, ControllerResigned>

/** What one server is to hear of one tablet: its latest instruction, or that its replica is to be deleted. */
type Queued =
  | { readonly _tag: "Instruct"; readonly instruction: ReplicaManager.TabletInstruction }
  | { readonly _tag: "Delete"; readonly tablet: Models.TabletId }

/** One server's queued instructions, latest per tablet. */
interface Outbox {
  readonly pending: Map<string, Queued>
  wake: Deferred.Deferred<void>
  live: boolean
  /** The server's registration the instructions are for, when known. */
  registration: number | undefined
}

/** A running controller: what its shell's functions share. Only `feed` changes `state`. */
interface Running {
  readonly leadership: Election.Leadership
  readonly options: ControllerOptions
  readonly epoch: number
  readonly paths: ClusterPaths.ClusterPaths
  readonly session: Coordination.Session
  readonly scope: Scope.Scope
  readonly servers: TabletServersShape
  readonly producerIds: ProducerIds.ProducerIds
  /** The machine's step (production's unless the context provides a mutant). */
  readonly machine: ControllerState.StepFunction
  readonly metrics: ControllerMetrics.ControllerMetrics | undefined
  /** The machine's inputs, taken one at a time. */
  readonly inbox: Queue.Queue<Stamped>
  /** Requests waiting for the machine's reply, by request id. */
  readonly replies: Map<number, Pending>
  readonly outboxes: Map<Models.ServerId, Outbox>
  state: ControllerState.State
  /** The tablet journal as last written, and its node's version. */
  journal: { readonly journal: ClusterPaths.Journal; readonly version: number }
  nextRequest: number
  closed: boolean
}

/**
 * Runs the controller for `leadership` until the scope closes. The machine starts from what coordination holds.
 *
 * @since 0.1.0
 */
export const make = (
  leadership: Election.Leadership,
  options: ControllerOptions
): Effect.Effect<
  ControllerShape,
  Coordination.CoordinationError | ClusterPaths.CorruptClusterData,
  Scope.Scope | Coordination.Coordination | TabletServers
> =>
  Effect.gen(function* () {
    const began = yield* Clock.monotonicTimeNanos
    const paths = ClusterPaths.make(options.namespace)
    const session = yield* (yield* Coordination.Coordination).session()
    yield* createRoots(session, paths)
    const registered = yield* registrations(session, paths, yield* session.children(paths.servers))
    const view = options.view ?? (yield* ControllerView.make({ namespace: options.namespace }))
    const synced = yield* view.sync(session)
    if (synced.journal === undefined) {
      return yield* new ClusterPaths.CorruptClusterData({
        path: paths.changes,
        detail: "the tablet journal is missing"
      })
    }
    const c: Running = {
      leadership,
      options,
      epoch: leadership.epoch,
      paths,
      session,
      scope: yield* Effect.scope,
      servers: yield* TabletServers,
      // The blocks of ids this controller hands out; its successor reserves its own.
      producerIds: yield* ProducerIds.make({ path: paths.producerIds }).pipe(Effect.orDie),
      machine: yield* Machine,
      inbox: yield* Queue.unbounded<Stamped>(),
      metrics: options.metrics,
      replies: new Map(),
      outboxes: new Map(),
      state: ControllerState.make({
        uncleanLeaderElection: options.uncleanLeaderElection,
        minInsyncReplicas: options.minInsyncReplicas,
        ...(options.leaderElection === undefined ? {} : { leaderElection: options.leaderElection }),
        ...(options.leaderImbalancePercent === undefined
          ? {}
          : { leaderImbalancePercent: options.leaderImbalancePercent })
      }),
      journal: synced.journal,
      nextRequest: 0,
      closed: false
    }
    yield* Effect.addFinalizer(() =>
      Effect.suspend(() => {
        c.closed = true
        return abandon(c)
      })
    )
    yield* Effect.logInfo(
      `controller of coordinator epoch ${c.epoch}: ${synced.full ? "read all" : "caught up on"} ${synced.read} of ${synced.tablets.length} tablets (journal entry ${c.journal.journal.seq})`
    )
    yield* start(c, registered, synced.tablets)
    if (options.metrics !== undefined) {
      const loaded = Number((yield* Clock.monotonicTimeNanos) - began) / 1e9
      yield* options.metrics.tookOver((leadership.electionDurationMs ?? 0) / 1000 + loaded)
    }
    return shapeOf(c, { tablets: synced.tablets.length, read: synced.read, full: synced.full })
  })

/** Creates the cluster's root nodes where they are missing: the registrations, the tablets and their journal. */
const createRoots = (session: Coordination.Session, paths: ClusterPaths.ClusterPaths) =>
  Effect.forEach(
    [
      [paths.servers, new Uint8Array()],
      [paths.tablets, new Uint8Array()],
      [paths.changes, ClusterPaths.encodeJournal(ClusterPaths.emptyJournal)]
    ] as const,
    ([path, data]) =>
      session.create(path, data, { createParents: true }).pipe(
        Effect.catchIf(
          (e) => e.reason._tag === "NodeExists",
          () => Effect.void
        )
      ),
    { discard: true }
  )

/**
 * Feeds the machine its start (the live servers and the tablets it resumes from), then runs: the server watch, the
 * leader-imbalance timer, and the loop taking one input at a time. A defect in a step leaves the machine's state
 * unknown: the controller resigns rather than go on without it.
 */
const start = (
  c: Running,
  registered: ReadonlyMap<Models.ServerId, number>,
  tablets: ReadonlyArray<ControllerState.Tablet>
) =>
  Effect.gen(function* () {
    yield* feed(c, {
      _tag: "Started",
      coordinatorEpoch: c.epoch,
      live: [...registered.keys()],
      tablets,
      registrations: [...registered]
    })
    yield* Effect.forkScoped(
      watchServers(c, registered).pipe(
        Retry.retry({ schedule: Schedule.spaced(c.options.retryBackoff) }),
        Effect.catchCause((cause) => Effect.logError("controller: the server watch ended", cause))
      )
    )
    const interval = Duration.fromInputUnsafe(c.options.leaderImbalanceCheckInterval ?? 0)
    if (Duration.isGreaterThan(interval, Duration.zero)) {
      yield* Effect.forkScoped(
        Effect.sleep(interval).pipe(Effect.andThen(offer(c, { _tag: "BalanceLeaders" })), Effect.forever)
      )
    }
    yield* Effect.forkScoped(
      Effect.forever(Effect.flatMap(take(c), (input) => feed(c, input))).pipe(
        Effect.catchCause((cause) =>
          Cause.hasInterruptsOnly(cause)
            ? Effect.failCause(cause)
            : Effect.logError("controller: a step failed", cause).pipe(
                Effect.andThen(
                  Effect.suspend(() => {
                    c.state = { ...c.state, resigned: true }
                    return run(c, [{ _tag: "Resign", reason: `a step failed: ${Cause.pretty(cause)}` }])
                  })
                )
              )
        )
      )
    )
  })

/** Fails every request still waiting: this controller will not answer them. */
const abandon = (c: Running) =>
  Effect.suspend(() => {
    const waiting = [...c.replies.values()]
    c.replies.clear()
    const resigned = new ControllerResigned({ coordinatorEpoch: c.epoch })
    return Effect.forEach(waiting, (reply) => Deferred.fail(reply, resigned), { discard: true })
  })

/** Steps the machine with `input` and runs its commands (a server that left stops hearing what was queued). */
const feed = (c: Running, input: ControllerState.Input): Effect.Effect<void> =>
  Effect.andThen(
    input._tag === "ServerUp"
      ? Effect.logInfo(`server ${input.server} registered (registration ${input.registration})`)
      : input._tag === "ServerDown"
        ? Effect.logInfo(`server ${input.server} left`)
        : Effect.void,
    Effect.suspend(() => {
      if (input._tag === "ServerDown") {
        const box = c.outboxes.get(input.server)
        if (box !== undefined) {
          box.live = false
          box.pending.clear()
        }
      }
      const before = c.state
      const [next, commands] = c.machine(before, input)
      c.state = next
      return c.metrics === undefined
        ? run(c, commands)
        : Effect.andThen(c.metrics.stepped(before, commands), run(c, commands))
    })
  ).pipe(
    Effect.withSpan("strata.controller.step", {
      attributes: { "strata.input": input._tag, "strata.coordinator_epoch": c.epoch }
    })
  )

/** Runs one step's commands in order; a failed write is fed back at once and ends the step. */
const run = (c: Running, commands: ReadonlyArray<ControllerState.Command>): Effect.Effect<void> =>
  Effect.gen(function* () {
    for (let i = 0; i < commands.length; i++) {
      const command = commands[i]!
      switch (command._tag) {
        case "Write":
        case "Remove": {
          const batch: Array<Writing> = [command]
          while (batch.length < writeBatch && isWriting(commands[i + 1])) batch.push(commands[++i] as Writing)
          const failed = yield* write(c, batch)
          if (failed !== undefined)
            return yield* feed(c, { _tag: "WriteFailed", tablet: idOf(command), detail: failed })
          break
        }
        case "Send":
          yield* enqueue(
            c,
            command.server,
            command.registration,
            command.tablets.map((t) => ({ _tag: "Instruct", instruction: t }))
          )
          break
        case "StopReplica":
          yield* enqueue(
            c,
            command.server,
            command.registration,
            command.tablets.map((tablet) => ({ _tag: "Delete", tablet }))
          )
          break
        case "Reply": {
          const reply = c.replies.get(command.requestId)
          c.replies.delete(command.requestId)
          if (reply !== undefined) yield* Deferred.succeed(reply, command.reply)
          break
        }
        case "AskLogEnd":
          yield* Effect.forkIn(askLogEnd(c, command), c.scope)
          break
        case "AskHoldings":
          yield* Effect.forkIn(askHoldings(c, command), c.scope)
          break
        case "Log":
          yield* command.level === "warn" ? Effect.logWarning(command.message) : Effect.logInfo(command.message)
          break
        case "Resign": {
          yield* Effect.logWarning(`controller resigns: ${command.reason}`)
          for (const box of c.outboxes.values()) box.live = false
          yield* abandon(c)
          yield* c.options.resign
          break
        }
      }
    }
  })

/**
 * Writes tablets in one fenced operation with the journal's next entry naming them; what failed, if it did.
 */
const write = (c: Running, batch: ReadonlyArray<Writing>) =>
  Effect.suspend(() => {
    const ops = batch.map((w): Coordination.Op => {
      if (w._tag === "Remove") return { _tag: "delete", path: c.paths.tablet(w.tablet), version: w.expectedVersion }
      const path = c.paths.tablet(w.tablet.tablet)
      const data = ClusterPaths.encodeTablet(w.tablet)
      return w.expectedVersion === null
        ? { _tag: "create", path, data }
        : { _tag: "set", path, data, version: w.expectedVersion }
    })
    const next = ClusterPaths.journalAppend(
      c.journal.journal,
      batch.map((w) => ClusterPaths.nodeName(idOf(w)))
    )
    const data = ClusterPaths.encodeJournal(next)
    return c.leadership.fenced([...ops, { _tag: "set", path: c.paths.changes, data, version: c.journal.version }]).pipe(
      Effect.as(undefined),
      Effect.tap(() =>
        Effect.sync(() => {
          c.journal = { journal: next, version: c.journal.version + 1 }
        })
      ),
      Effect.catch((e) => Effect.succeed(e.message))
    )
  })

/** Queues what `server` (as `registration`) is to hear, latest per tablet, and wakes its delivery. */
const enqueue = (
  c: Running,
  server: Models.ServerId,
  registration: number | undefined,
  queued: ReadonlyArray<Queued>
) =>
  Effect.gen(function* () {
    const box = yield* outboxOf(c, server)
    box.live = true
    box.registration = registration
    for (const q of queued)
      box.pending.set(Models.tabletKey(q._tag === "Instruct" ? q.instruction.tablet : q.tablet), q)
    yield* Deferred.succeed(box.wake, undefined)
  })

/** `server`'s outbox, made (with its delivery running) on first use. */
const outboxOf = (c: Running, server: Models.ServerId) =>
  Effect.gen(function* () {
    const known = c.outboxes.get(server)
    if (known !== undefined) return known
    const box: Outbox = { pending: new Map(), wake: Deferred.makeUnsafe(), live: true, registration: undefined }
    c.outboxes.set(server, box)
    yield* Effect.forkIn(deliver(c, server, box), c.scope)
    return box
  })

/**
 * Delivers one server's queued instructions (LeaderAndIsr, then StopReplica: one server's requests go one at a
 * time, so a deletion is never overtaken by an older instruction) until it answers, leaves, or a newer coordinator
 * exists. A deletion answered is fed back as `ReplicaStopped`.
 */
const deliver = (c: Running, server: Models.ServerId, box: Outbox): Effect.Effect<never> =>
  Effect.gen(function* () {
    yield* Deferred.await(box.wake)
    box.wake = Deferred.makeUnsafe()
    const queued = [...box.pending.values()]
    box.pending.clear()
    if (!box.live || queued.length === 0) return
    const registration = box.registration
    const tablets = queued.flatMap((q) => (q._tag === "Instruct" ? [q.instruction] : []))
    const deletions = queued.flatMap((q) => (q._tag === "Delete" ? [q.tablet] : []))
    const outcome = yield* send(c, server, registration, tablets, deletions)
    if (outcome === "delivered" && deletions.length > 0) {
      yield* offer(c, {
        _tag: "ReplicaStopped",
        server,
        ...(registration === undefined ? {} : { registration }),
        tablets: deletions
      })
    }
    if (outcome !== "again" || !box.live) return
    // Not delivered: put back what nothing later replaced, and go again.
    for (const q of queued) {
      const key = Models.tabletKey(q._tag === "Instruct" ? q.instruction.tablet : q.tablet)
      if (!box.pending.has(key)) box.pending.set(key, q)
    }
    yield* Deferred.succeed(box.wake, undefined)
  }).pipe(Effect.forever)

/**
 * Sends `server` its instructions and deletions once (after `Leadership.guard`): `delivered`, `over` when it knows a
 * newer coordinator, `again` after a backoff when it did not take them (its registration read again when it
 * answered for another life).
 */
const send = (
  c: Running,
  server: Models.ServerId,
  registration: number | undefined,
  tablets: ReadonlyArray<ReplicaManager.TabletInstruction>,
  deletions: ReadonlyArray<Models.TabletId>
): Effect.Effect<"delivered" | "over" | "again"> => {
  const addressed = { coordinatorEpoch: c.epoch, ...(registration === undefined ? {} : { registration }) }
  return c.leadership.guard.pipe(
    Effect.andThen(tablets.length === 0 ? Effect.void : c.servers.leaderAndIsr(server, { ...addressed, tablets })),
    Effect.andThen(
      deletions.length === 0 ? Effect.void : c.servers.stopReplica(server, { ...addressed, tablets: deletions })
    ),
    Effect.as<"delivered" | "over" | "again">("delivered"),
    Effect.catch((e) => {
      // A newer coordinator: this one's instructions are over.
      if (e._tag === "ReplicaError" && e.reason._tag === "FencedEpoch" && e.reason.resource === "coordinator") {
        return Effect.as(Effect.logWarning(`server ${server} knows a newer coordinator: ${e.message}`), "over" as const)
      }
      // Another registration: the server is between lives, or it registered again and the watch has not told
      // (yet): its registration is read again.
      const between = e._tag === "ReplicaError" && e.reason._tag === "FencedEpoch"
      return Effect.as(
        Effect.andThen(between ? recheck(c, server, registration) : Effect.void, Effect.sleep(c.options.retryBackoff)),
        "again" as const
      )
    }),
    // A defect of the transport must not end this server's deliveries.
    Effect.catchCause((cause) =>
      Cause.hasInterruptsOnly(cause) && c.closed
        ? Effect.failCause(cause)
        : Effect.logError(`delivering to server ${server}`, cause).pipe(
            Effect.andThen(Effect.sleep(c.options.retryBackoff)),
            Effect.as("again" as const)
          )
    )
  )
}

/**
 * Reads `server`'s registration again after it refused instructions addressed to `addressed`: when it registered
 * again (or left) without the watch telling, the machine hears it as the watch would have said it.
 */
const recheck = (c: Running, server: Models.ServerId, addressed: number | undefined) =>
  Effect.gen(function* () {
    const stat = yield* c.session.exists(c.paths.server(server))
    const now = stat._tag === "Some" ? stat.value.createdOrder : undefined
    if (now === addressed || c.state.registrations.get(server) !== addressed) return
    yield* Effect.logInfo(
      `server ${server} refused instructions for registration ${addressed}: it is registered ${now === undefined ? "no more" : `as ${now}`}`
    )
    yield* offer(c, { _tag: "ServerDown", server })
    if (now !== undefined) yield* offer(c, { _tag: "ServerUp", server, registration: now })
  }).pipe(Effect.ignore)

/** Asks a candidate its log end under the offline epoch; the answer comes back as an input (none after a backoff). */
const askLogEnd = (c: Running, command: Extract<ControllerState.Command, { readonly _tag: "AskLogEnd" }>) => {
  const { server, tablet, round, leaderEpoch, coordinatorEpoch } = command
  return c.leadership.guard.pipe(
    Effect.andThen(c.servers.logEnd(server, { tablet, fence: { leaderEpoch, coordinatorEpoch } })),
    Effect.map((end): ControllerState.LogEnd | null => end),
    Effect.catchCause(() => Effect.as(Effect.sleep(c.options.retryBackoff), null)),
    Effect.flatMap((logEnd) => offer(c, { _tag: "LogEnd", tablet, round, server, logEnd }))
  )
}

/**
 * Asks a server what it holds; the answer comes back as an input, a failed question after the backoff as no answer
 * (the server is then told everything). A server that knows a newer coordinator is not told anything by this one.
 */
const askHoldings = (c: Running, command: Extract<ControllerState.Command, { readonly _tag: "AskHoldings" }>) => {
  const { server, registration, coordinatorEpoch } = command
  const request = { coordinatorEpoch, ...(registration === undefined ? {} : { registration }) }
  const holdings = (tablets: Extract<ControllerState.Input, { readonly _tag: "Holdings" }>["holdings"]) =>
    ({
      _tag: "Holdings",
      server,
      ...(registration === undefined ? {} : { registration }),
      holdings: tablets
    }) satisfies ControllerState.Input
  return c.leadership.guard.pipe(
    Effect.andThen(c.servers.holdings(server, request)),
    Effect.map((result) => holdings(result.tablets)),
    Effect.catchCause(() => Effect.as(Effect.sleep(c.options.retryBackoff), holdings(null))),
    Effect.flatMap((input) => offer(c, input))
  )
}

/**
 * The registered servers, each with the creation order of its registration: a server registered again (a
 * restart, an expired session) is a new life even when the watch never saw it missing.
 */
const registrations = (session: Coordination.Session, paths: ClusterPaths.ClusterPaths, names: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    const out = new Map<Models.ServerId, number>()
    for (const name of names) {
      const id = ClusterPaths.serverIdOf(name)
      if (id === undefined) continue
      const stat = yield* session.exists(paths.server(id))
      if (stat._tag === "Some") out.set(id, stat.value.createdOrder)
    }
    return out
  })

/**
 * Live servers: a watch on the registrations, turned into ServerUp / ServerDown inputs (a new life of a server is
 * both: it leaves the ISRs it was in, whatever its log lost, and hears its tablets again).
 */
const watchServers = (
  c: Running,
  known: ReadonlyMap<Models.ServerId, number>
): Effect.Effect<void, Coordination.CoordinationError> =>
  Effect.gen(function* () {
    const watch = yield* c.session.watchChildren(c.paths.servers)
    const now = yield* registrations(c.session, c.paths, watch.value)
    for (const [s, order] of known) {
      if (now.get(s) !== order) yield* offer(c, { _tag: "ServerDown", server: s })
    }
    for (const [s, order] of now) {
      if (known.get(s) !== order) yield* offer(c, { _tag: "ServerUp", server: s, registration: order })
    }
    yield* watch.changed
    return yield* watchServers(c, now)
  })

/** Puts a request to the machine and waits for its reply (refused once the controller resigned or closed). */
const ask = (c: Running, input: (requestId: number) => ControllerState.Input) =>
  Effect.gen(function* () {
    if (c.state.resigned || c.closed) return yield* new ControllerResigned({ coordinatorEpoch: c.epoch })
    const requestId = c.nextRequest++
    const reply: Pending = yield* Deferred.make<ControllerState.Reply, ControllerResigned>()
    c.replies.set(requestId, reply)
    yield* offer(c, input(requestId))
    return yield* Deferred.await(reply)
  })

/** The running controller as its users see it. */
const shapeOf = (c: Running, resumed: ControllerShape["resumed"]): ControllerShape => ({
  coordinatorEpoch: c.epoch,
  // Every client's tables come through here: a name coordination paths and stores cannot hold is refused.
  createTablets: (specs) =>
    Effect.suspend(() => {
      const bad = specs.map((s) => ClusterPaths.invalidTableName(s.tablet.table)).find((e) => e !== undefined)
      return bad === undefined
        ? ask(c, (requestId) => ({ _tag: "CreateTablets", requestId, tablets: specs }))
        : Effect.succeed<ControllerState.Reply>({ _tag: "CreateRefused", detail: bad.message })
    }),
  adjustIsr: (request) =>
    Effect.map(
      ask(c, (requestId) => ({ _tag: "AdjustIsr", requestId, ...request })),
      (reply): ControllerState.AdjustIsrReply =>
        reply._tag === "IsrAdjusted" || reply._tag === "IsrRejected"
          ? reply
          : { _tag: "IsrRejected", rejection: { _tag: "UnknownTablet" } }
    ).pipe(
      Effect.tap((reply) =>
        reply._tag === "IsrRejected"
          ? Effect.logInfo(
              `${Models.tabletKey(request.tablet)}: ISR change to [${request.isr.join(",")}] from server ${request.leader} (leader epoch ${request.leaderEpoch}, version ${request.version}) refused: ${reply.rejection._tag}${reply.rejection._tag === "IneligibleReplica" ? ` (server ${reply.rejection.server} is ineligible: ${reply.rejection.why})` : ""}`
            )
          : Effect.void
      )
    ),
  deleteTablets: (tablets) =>
    Effect.map(
      ask(c, (requestId) => ({ _tag: "DeleteTablets", requestId, tablets })),
      (reply) => (reply._tag === "Deleting" ? reply.tablets : 0)
    ),
  reassign: (tablet, target, options) =>
    Effect.map(
      ask(c, (requestId) => ({
        _tag: "Reassign",
        requestId,
        tablet,
        target,
        ...(options?.throttleBytesPerSec === undefined ? {} : { throttleBytesPerSec: options.throttleBytesPerSec })
      })),
      asReassignReply
    ),
  cancelReassign: (tablet) =>
    Effect.map(
      ask(c, (requestId) => ({ _tag: "CancelReassign", requestId, tablet })),
      asReassignReply
    ),
  balanceLeaders: Effect.map(
    ask(c, (requestId) => ({ _tag: "BalanceLeaders", requestId })),
    (reply) => (reply._tag === "LeadersBalanced" ? reply.moved : 0)
  ),
  electPreferred: (tablets) =>
    Effect.map(
      ask(c, (requestId) => ({ _tag: "BalanceLeaders", requestId, tablets })),
      (reply) => (reply._tag === "LeadersBalanced" ? reply.moved : 0)
    ),
  serverHealth: (timeout) =>
    Effect.suspend(() => Holdings.serverHealth(c.servers, c.state, Duration.fromInputUnsafe(timeout))),
  controlledShutdown: (server) =>
    Effect.map(
      ask(c, (requestId) => ({ _tag: "ControlledShutdown", requestId, server })),
      (reply) => (reply._tag === "ShutdownProgress" ? reply.remainingLeaders : 0)
    ),
  replicaStorage: (report) =>
    Effect.suspend(() =>
      c.state.resigned || c.closed
        ? Effect.fail(new ControllerResigned({ coordinatorEpoch: c.epoch }))
        : Effect.asVoid(
            offer(c, {
              _tag: "ReplicaStorage",
              server: report.server,
              ...(report.registration === undefined ? {} : { registration: report.registration }),
              tablets: report.tablets,
              failed: report.failed,
              sequence: report.sequence
            })
          )
    ),
  initProducerId: c.producerIds.next(c.session),
  state: Effect.sync(() => c.state),
  resumed
})
