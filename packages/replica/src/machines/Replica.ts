/**
 * One tablet replica on one tablet server as a single pure machine, in etcd raft's Step/Ready shape
 * (docs/ARCHITECTURE.md, "Replication"): `step(state, input)` returns the next state and a `Ready` — the commands the
 * tablet server's shell executes in order, and the answer to the request that fed the input. It composes the
 * replica's lifecycle (`ReplicaState`), the leader's replication state while it leads (`LeaderState`), the role
 * generation that makes an ended role's answers stale, the tablet version last applied, and the acks=all appends
 * waiting for the high watermark. The shell holds only the resources (the open log, the fetch fiber, the waiting
 * appends' deferreds) and decides nothing:
 *
 * - an append is a `Propose`: refused (`NotLeader`, `FencedEpoch` is not possible: appends carry no epoch,
 *   `NotEnoughReplicas`) or answered `Persist`; the shell writes the records and feeds `Persisted`, whose answer is
 *   `Done` (acknowledged now) or `Wait` (a ticket completed when the high watermark passes it);
 * - a coordinator instruction is classified here (a new role, an ISR update, a fence, or stale);
 * - the controller's answer to an ISR proposal is classified here (committed, adopted, refused, or fenced);
 * - a follower's fetch is admitted (`Lead`) and re-admitted after its long poll (`Recheck`) here;
 * - a delete of the records below an offset is a `DeleteRecords`: refused (`NotLeader`, `OffsetOutOfRange` past the
 *   HW, `NotEnoughReplicas`), or answered `Delete`; the shell moves the log start and feeds `RecordsDeleted`,
 *   answered `Done` (every in-sync replica's start is past it, and the ISR has its minimum size) or `Wait` (a ticket
 *   completed when the followers' fetches say so, failed as an append is if the ISR shrinks below its minimum).
 *
 * @since 0.1.0
 */
import { Errors, Models } from "@strata/core"
import * as ReplicaManager from "../protocol/ReplicaManager.js"
import { Result } from "effect"
import type { AdjustIsrReply } from "./ControllerState.js"
import * as LeaderState from "./LeaderState.js"
import * as ReplicaState from "./ReplicaState.js"

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

/**
 * The replication settings the machine decides by.
 *
 * @since 0.1.0
 */
export interface Config {
  readonly minInsyncReplicas: number
  readonly lagTimeMaxMs: number
}

/**
 * An acks=all append waiting for the high watermark to pass `lastOffset`.
 *
 * @since 0.1.0
 */
export interface Waiter {
  readonly ticket: number
  readonly lastOffset: number
}

/**
 * A delete waiting for every in-sync replica's log start to reach `offset`.
 *
 * @since 0.1.0
 */
export interface DeleteWaiter {
  readonly ticket: number
  readonly offset: number
}

/**
 * A replica's state.
 *
 * @since 0.1.0
 */
export interface State {
  readonly tablet: Models.TabletId
  readonly key: string
  /** The server this replica is on. */
  readonly self: Models.ServerId
  readonly config: Config
  /** Its lifecycle: new, online, leading, following, offline or deleted. */
  readonly lifecycle: ReplicaState.State
  /** Bumped on every role taken: the answers to an older role's requests are dropped. */
  readonly generation: number
  /** Every replica of the tablet, in assignment order, as the last instruction named them. */
  readonly replicas: ReadonlyArray<Models.ServerId>
  /** The tablet version (the coordinator's compare-and-set version) last applied here. */
  readonly version: number
  /** The leader's replication state while this replica leads. */
  readonly leader: LeaderState.State | undefined
  readonly waiters: ReadonlyArray<Waiter>
  readonly deletes: ReadonlyArray<DeleteWaiter>
  /** The ticket the next waiting append or delete gets. */
  readonly nextTicket: number
  /**
   * While leading: the furthest log start this leadership moved its log to, or saw it had (deletes, and starts its
   * followers reported); a follower's start past it moves the leader's log start too (`RaiseLogStart`).
   */
  readonly startSeen: number
}

/**
 * A replica of `tablet` just assigned to `self`: its log not yet open.
 *
 * @since 0.1.0
 */
export const make = (tablet: Models.TabletId, self: Models.ServerId, config: Config): State => ({
  tablet,
  key: Models.tabletKey(tablet),
  self,
  config,
  lifecycle: ReplicaState.initial,
  generation: 0,
  replicas: [],
  version: -1,
  leader: undefined,
  waiters: [],
  deletes: [],
  nextTicket: 1,
  startSeen: 0
})

// ---------------------------------------------------------------------------
// Inputs, commands, answers
// ---------------------------------------------------------------------------

/**
 * The log's bounds as the shell read them, fed with an instruction (a new leader starts from them).
 *
 * @since 0.1.0
 */
export interface LogBounds {
  readonly logEndOffset: number
  readonly highWatermark: number
}

/**
 * What the shell feeds.
 *
 * - `Open`: the replica must serve (an instruction or a controller's question came): its log is opened if it is not.
 * - `Loaded`, `Offline`, `Reopen`, `Delete`, `Fence`: the lifecycle's events (`ReplicaState`).
 * - `StorageFailed`: a write or read of its store failed (seen by the work of `generation`, when given): the replica
 *   goes offline until the store works again.
 * - `Instruction`: the coordinator's LeaderAndIsr for the tablet, with the log's bounds and the time.
 * - `Propose`: an append with these acks; `Persisted`: the shell wrote it (`duplicate`: an idempotent retry of a
 *   written batch); `Abandon`: the append's caller stopped waiting for ticket `ticket`.
 * - `DeleteRecords`: a delete of the records below `offset` (the log starting at `logStartOffset`);
 *   `RecordsDeleted`: the shell moved the log start to `offset`.
 * - `Checkpointed`: the shell checkpointed the high watermark `highWatermark`.
 * - `Lead`: a request that only a leader (of `leaderEpoch`, when given) serves; `Recheck`: whether the replica still
 *   leads in the generation and epoch a long-polled fetch was admitted under.
 * - `FollowerFetched`, `Tick`: the leader's inputs (`LeaderState`).
 * - `IsrAnswer`: the controller's answer to proposal `proposal`, sent in generation `generation`.
 *
 * @since 0.1.0
 */
export type Input =
  | { readonly _tag: "Open" }
  | { readonly _tag: "Loaded" }
  | { readonly _tag: "Offline" }
  | { readonly _tag: "Reopen" }
  | { readonly _tag: "Delete" }
  | { readonly _tag: "Fence"; readonly leaderEpoch: Models.Epoch }
  | { readonly _tag: "StorageFailed"; readonly detail: string; readonly generation?: number | undefined }
  | {
      readonly _tag: "Instruction"
      readonly instruction: ReplicaManager.TabletInstruction
      readonly log: LogBounds
      readonly nowMs: number
    }
  | { readonly _tag: "Propose"; readonly acks: ReplicaManager.ReplicaAcks }
  | {
      readonly _tag: "Persisted"
      readonly acks: ReplicaManager.ReplicaAcks
      readonly lastOffset: number
      readonly duplicate: boolean
    }
  | { readonly _tag: "Abandon"; readonly ticket: number }
  | { readonly _tag: "DeleteRecords"; readonly offset: number; readonly logStartOffset: number }
  | { readonly _tag: "RecordsDeleted"; readonly offset: number }
  | { readonly _tag: "Checkpointed"; readonly highWatermark: number }
  | { readonly _tag: "Lead"; readonly leaderEpoch?: Models.Epoch | undefined }
  | { readonly _tag: "Recheck"; readonly generation: number; readonly leaderEpoch: Models.Epoch }
  | {
      readonly _tag: "FollowerFetched"
      readonly server: Models.ServerId
      readonly fetchOffset: number
      readonly nowMs: number
      readonly registration?: number | undefined
      readonly logStartOffset?: number | undefined
    }
  | { readonly _tag: "Tick"; readonly nowMs: number }
  | {
      readonly _tag: "IsrAnswer"
      readonly generation: number
      readonly proposal: number
      readonly reply: AdjustIsrReply
      readonly nowMs: number
    }

/**
 * What the shell executes, in order, and nothing else.
 *
 * - `OpenLog` (then feed `Loaded`), `CloseLog`, `DeleteLog`.
 * - `StartFollowing`: run the fetch loop of generation `generation` from `leader` under `leaderEpoch`;
 *   `StopFollowing`: interrupt it.
 * - `Checkpoint`: write the high watermark to the log (then feed `Checkpointed`; a store that fails it is
 *   `StorageFailed`).
 * - `Complete` / `Fail`: answer the waiting appends and deletes of these tickets.
 * - `Wake`: wake the fetches waiting for the log end or the high watermark to move.
 * - `RaiseLogStart`: move the log start to `offset` (below the HW), if it starts before: a follower's log starts
 *   there, so an earlier leader deleted what is below it (a delete, or retention), and it must not be served again
 *   (a leader chosen by a recovery election, from outside the ISR that took the delete, may not have moved its own).
 * - `ProposeIsr`: ask the controller for an ISR change until answered or the generation ends (feed `IsrAnswer`).
 * - `StoreFailed`: say (naming the store) that it failed with `detail` and the replica is offline.
 * - `ResumeStorage`: tell the controller the store failed, and try it again until it takes a write.
 * - `ReportStorageBack`: tell the controller the store works again (its earlier report may have been lost).
 * - `Log`: one line.
 *
 * @since 0.1.0
 */
export type Command =
  | { readonly _tag: "OpenLog" }
  | { readonly _tag: "CloseLog" }
  | { readonly _tag: "DeleteLog" }
  | {
      readonly _tag: "StartFollowing"
      readonly generation: number
      readonly leader: Models.ServerId
      readonly leaderEpoch: Models.Epoch
    }
  | { readonly _tag: "StopFollowing" }
  | { readonly _tag: "Checkpoint"; readonly highWatermark: number }
  | { readonly _tag: "Complete"; readonly tickets: ReadonlyArray<number>; readonly highWatermark: number }
  | { readonly _tag: "Fail"; readonly tickets: ReadonlyArray<number>; readonly reason: ReplicaManager.ErrorReason }
  | { readonly _tag: "Wake" }
  | { readonly _tag: "RaiseLogStart"; readonly offset: number }
  | {
      readonly _tag: "ProposeIsr"
      readonly generation: number
      readonly leaderEpoch: Models.Epoch
      readonly proposal: number
      readonly version: number
      readonly isr: ReadonlyArray<Models.ServerId>
      readonly registrations: ReadonlyArray<readonly [Models.ServerId, number]>
    }
  | { readonly _tag: "StoreFailed"; readonly detail: string }
  | { readonly _tag: "ResumeStorage" }
  | { readonly _tag: "ReportStorageBack" }
  | { readonly _tag: "Log"; readonly level: "Info" | "Warning"; readonly message: string }

/**
 * The answer to the request that fed the input.
 *
 * - `Refused`: the request fails with `reason`.
 * - `Admitted`: a leader's request may go on, in `generation` under `leaderEpoch` (`highWatermark`: the leader's).
 * - `Persist`: write the append under `leaderEpoch`, then feed `Persisted`.
 * - `Delete`: move the log start to the delete's offset, then feed `RecordsDeleted`.
 * - `Done`: the append (or delete) is acknowledged with this high watermark; `Wait`: it is once ticket `ticket`
 *   completes.
 *
 * @since 0.1.0
 */
export type Answer =
  | { readonly _tag: "Refused"; readonly reason: ReplicaManager.ErrorReason }
  | {
      readonly _tag: "Admitted"
      readonly generation: number
      readonly leaderEpoch: Models.Epoch
      readonly highWatermark: number | undefined
    }
  | { readonly _tag: "Persist"; readonly leaderEpoch: Models.Epoch }
  | { readonly _tag: "Delete"; readonly leaderEpoch: Models.Epoch }
  | { readonly _tag: "Done"; readonly highWatermark: number }
  | { readonly _tag: "Wait"; readonly ticket: number; readonly highWatermark: number }

/**
 * One step's output.
 *
 * @since 0.1.0
 */
export interface Ready {
  readonly commands: ReadonlyArray<Command>
  readonly answer?: Answer | undefined
}

/**
 * The outcome of one step.
 *
 * @since 0.1.0
 */
export type Step = readonly [State, Ready]

/**
 * The machine as the shell runs it: production's {@link step}; the simulators run mutants of it.
 *
 * @since 0.1.0
 */
export type StepFunction = (state: State, input: Input) => Step

const none: Ready = { commands: [] }
const answer = (a: Answer, commands: ReadonlyArray<Command> = []): Ready => ({ commands, answer: a })
const refused = (reason: ReplicaManager.ErrorReason, commands: ReadonlyArray<Command> = []): Ready =>
  answer({ _tag: "Refused", reason }, commands)

// ---------------------------------------------------------------------------
// Queries
// ---------------------------------------------------------------------------

/**
 * The error of a request this replica cannot serve as leader: it names the leader it follows, if any.
 *
 * @since 0.1.0
 */
export const notLeader = (state: State): Errors.NotLeader =>
  new Errors.NotLeader({
    resource: state.key,
    leader: state.lifecycle._tag === "FollowerReplica" ? state.lifecycle.leader : null
  })

/**
 * What a LeaderAndIsr instruction is to a replica in this state.
 *
 * - `Step`: a higher leader epoch (or the first): the lifecycle takes it.
 * - `IsrUpdate`: this replica leads the instruction's epoch and the tablet version is newer: the controller changed
 *   the ISR (a member died or is stopping).
 * - `Fence`: the tablet is offline (no leader) under a newer epoch: any role under an older one ends.
 * - `Stale`: nothing new (a repeat, an older epoch or version).
 *
 * @since 0.1.0
 */
export const classify = (
  state: State,
  instruction: ReplicaManager.TabletInstruction
): "Step" | "IsrUpdate" | "Fence" | "Stale" => {
  const last = ReplicaState.lastLeaderEpoch(state.lifecycle)
  const lai = instruction.leaderAndIsr
  if (lai.leader === null) return last === null || lai.leaderEpoch > last ? "Fence" : "Stale"
  if (last === null || lai.leaderEpoch > last) return "Step"
  // No role (its store failed and works again): it follows again under the epoch it had seen.
  if (lai.leaderEpoch === last && lai.leader !== state.self && state.lifecycle._tag === "OnlineReplica") return "Step"
  if (lai.leaderEpoch === last && lai.leader === state.self && lai.version > state.version) return "IsrUpdate"
  return "Stale"
}

// ---------------------------------------------------------------------------
// The leader's part
// ---------------------------------------------------------------------------

/** The waiters the high watermark `hw` has passed, completed. */
const release = (state: State, hw: number): Step => {
  const done = state.waiters.filter((w) => w.lastOffset < hw)
  if (done.length === 0) return [state, none]
  return [
    { ...state, waiters: state.waiters.filter((w) => w.lastOffset >= hw) },
    { commands: [{ _tag: "Complete", tickets: done.map((w) => w.ticket), highWatermark: hw }] }
  ]
}

/** Every waiting append and delete failed with `reason`. */
const failAll = (state: State, reason: ReplicaManager.ErrorReason): [State, Array<Command>] => {
  const tickets = [...state.waiters.map((w) => w.ticket), ...state.deletes.map((d) => d.ticket)]
  return tickets.length === 0
    ? [state, []]
    : [{ ...state, waiters: [], deletes: [] }, [{ _tag: "Fail", tickets, reason }]]
}

/**
 * Whether a delete before `offset` is done: every in-sync replica's log start has reached it, and the ISR has its
 * minimum size (as an acks=all append needs), so that the start is held by that many replicas, not by a leader left
 * alone in its ISR that may lose it.
 */
const deleteHeld = (state: State, leader: LeaderState.State, offset: number): boolean =>
  leader.isr.length >= state.config.minInsyncReplicas && LeaderState.lowWatermark(leader) >= offset

/** The deletes every in-sync replica's log start has reached, completed. */
const releaseDeletes = (state: State): [State, Array<Command>] => {
  if (state.deletes.length === 0 || state.leader === undefined) return [state, []]
  if (state.leader.isr.length < state.config.minInsyncReplicas) return [state, []]
  const low = LeaderState.lowWatermark(state.leader)
  const done = state.deletes.filter((d) => d.offset <= low)
  if (done.length === 0) return [state, []]
  return [
    { ...state, deletes: state.deletes.filter((d) => d.offset > low) },
    [{ _tag: "Complete", tickets: done.map((d) => d.ticket), highWatermark: state.leader.highWatermark }]
  ]
}

/** Steps the leader state (if this replica leads) and turns its commands into the replica's. */
const stepLeader = (state: State, input: LeaderState.Input): [State, Array<Command>] => {
  if (state.leader === undefined) return [state, []]
  const [leader, leaderCommands] = LeaderState.step(state.leader, input)
  let next: State = { ...state, leader }
  const commands: Array<Command> = []
  for (const c of leaderCommands) {
    switch (c._tag) {
      case "AdvanceHighWatermark":
        commands.push({ _tag: "Checkpoint", highWatermark: c.highWatermark })
        break
      case "ProposeIsr":
        commands.push({
          _tag: "ProposeIsr",
          generation: next.generation,
          leaderEpoch: leader.leaderEpoch,
          proposal: c.proposal,
          version: c.version,
          isr: c.isr,
          registrations: c.registrations
        })
        break
      case "IsrBelowMinimum": {
        const [failed, failing] = failAll(
          next,
          new ReplicaManager.NotEnoughReplicasAfterAppend({
            tablet: state.key,
            isr: c.size,
            minIsr: state.config.minInsyncReplicas
          })
        )
        next = failed
        commands.push(...failing)
        break
      }
    }
  }
  const [released, releasing] = releaseDeletes(next)
  return [released, [...commands, ...releasing]]
}

/** The ISR the controller committed at `version` (answering `proposal`, or in a LeaderAndIsr). */
const isrCommitted = (
  state: State,
  isr: ReadonlyArray<Models.ServerId>,
  version: number,
  proposal?: number
): [State, Array<Command>] =>
  stepLeader(
    { ...state, version: Math.max(state.version, version) },
    { _tag: "IsrChangeCommitted", isr, version, proposal }
  )

/** Takes the controller's answer to an ISR proposal of this generation. */
const isrAnswer = (state: State, input: Extract<Input, { _tag: "IsrAnswer" }>): Step => {
  if (input.generation !== state.generation) return [state, none]
  const reply = input.reply
  if (reply._tag === "IsrAdjusted") {
    const lai = reply.leaderAndIsr
    const [next, commands] = isrCommitted(state, lai.isr, lai.version, input.proposal)
    const log: Command = {
      _tag: "Log",
      level: "Info",
      message: `${state.key}: ISR now [${lai.isr.join(",")}] (version ${lai.version})`
    }
    return [next, { commands: [log, ...commands] }]
  }
  const r = reply.rejection
  const epoch = state.leader?.leaderEpoch
  // The leadership is over: an earlier try may have been committed, so the change stays pending.
  const fenced =
    r._tag === "FencedLeaderEpoch" ||
    r._tag === "NotLeader" ||
    r._tag === "UnknownTablet" ||
    (r._tag === "InvalidVersion" && r.leaderAndIsr.leaderEpoch !== epoch)
  if (fenced) {
    const [next, commands] = stepLeader(state, { _tag: "IsrChangeFenced", proposal: input.proposal })
    const log: Command = {
      _tag: "Log",
      level: "Info",
      message: `${state.key}: an ISR proposal was refused (${r._tag}): this leadership is over; the change stays pending until the next LeaderAndIsr`
    }
    return [next, { commands: [log, ...commands] }]
  }
  // A stale version: the controller changed the ISR meanwhile; take its state, then propose again if need be.
  const [adopted, adopting] =
    r._tag === "InvalidVersion" ? isrCommitted(state, r.leaderAndIsr.isr, r.leaderAndIsr.version) : [state, []]
  const ineligible = r._tag === "IneligibleReplica" ? { server: r.server, nowMs: input.nowMs } : undefined
  const [next, commands] = stepLeader(adopted, { _tag: "IsrChangeRejected", proposal: input.proposal, ineligible })
  return [next, { commands: [...adopting, ...commands] }]
}

/** Admits a leader's request (under `leaderEpoch` when given), or refuses it. */
const lead = (state: State, leaderEpoch: Models.Epoch | undefined): Ready => {
  const leader = state.leader
  if (leader === undefined || state.lifecycle._tag !== "LeaderReplica") return refused(notLeader(state))
  if (leaderEpoch !== undefined && leaderEpoch < leader.leaderEpoch) {
    return refused(new Errors.FencedEpoch({ resource: state.key, current: leader.leaderEpoch, attempted: leaderEpoch }))
  }
  // A follower ahead of this leader's epoch knows of a newer leader: this one is not it.
  if (leaderEpoch !== undefined && leaderEpoch > leader.leaderEpoch) return refused(notLeader(state))
  return answer({
    _tag: "Admitted",
    generation: state.generation,
    leaderEpoch: leader.leaderEpoch,
    highWatermark: leader.highWatermark
  })
}

/** An append: refused, or to be written under the leader's epoch. */
const propose = (state: State, acks: ReplicaManager.ReplicaAcks): Ready => {
  const leading = lead(state, undefined)
  if (leading.answer?._tag !== "Admitted") return leading
  const isr = state.leader!.isr.length
  const min = state.config.minInsyncReplicas
  if (acks === "all" && isr < min)
    return refused(new ReplicaManager.NotEnoughReplicas({ tablet: state.key, isr, minIsr: min }))
  return answer({ _tag: "Persist", leaderEpoch: leading.answer.leaderEpoch })
}

/** A written append: the leader's log end moves; acknowledged now, or once the high watermark passes it. */
const persisted = (state: State, input: Extract<Input, { _tag: "Persisted" }>): Step => {
  const [next, commands] = input.duplicate
    ? [state, []]
    : stepLeader(state, { _tag: "Appended", logEndOffset: input.lastOffset + 1 })
  if (!input.duplicate) commands.push({ _tag: "Wake" })
  const hw = next.leader?.highWatermark ?? 0
  if (input.acks !== "all" || hw > input.lastOffset) {
    return [next, answer({ _tag: "Done", highWatermark: hw }, commands)]
  }
  const ticket = next.nextTicket
  return [
    { ...next, nextTicket: ticket + 1, waiters: [...next.waiters, { ticket, lastOffset: input.lastOffset }] },
    answer({ _tag: "Wait", ticket, highWatermark: hw }, commands)
  ]
}

/** A delete of the records below `offset`: refused, or to be done under the leader's epoch. */
const deleteRecords = (state: State, input: Extract<Input, { _tag: "DeleteRecords" }>): Ready => {
  const leading = lead(state, undefined)
  if (leading.answer?._tag !== "Admitted") return leading
  const isr = state.leader!.isr.length
  const min = state.config.minInsyncReplicas
  if (isr < min) return refused(new ReplicaManager.NotEnoughReplicas({ tablet: state.key, isr, minIsr: min }))
  const hw = state.leader!.highWatermark
  if (input.offset > hw) {
    return refused(
      new Errors.OffsetOutOfRange({
        topic: state.tablet.table,
        partition: state.tablet.bucket,
        offset: input.offset,
        logStart: input.logStartOffset,
        highwater: hw
      })
    )
  }
  return answer({ _tag: "Delete", leaderEpoch: leading.answer.leaderEpoch })
}

/**
 * The leader's log start moved to `offset`: acknowledged once every in-sync replica's has, the ISR at its minimum
 * size. Waiting fetches are woken, so followers learn the new start from their next answer instead of after their
 * long poll.
 */
const recordsDeleted = (state: State, input: Extract<Input, { _tag: "RecordsDeleted" }>): Step => {
  const leader = state.leader
  if (leader === undefined || state.lifecycle._tag !== "LeaderReplica") return [state, refused(notLeader(state))]
  const min = state.config.minInsyncReplicas
  if (leader.isr.length < min) {
    const reason = new ReplicaManager.NotEnoughReplicasAfterAppend({
      tablet: state.key,
      isr: leader.isr.length,
      minIsr: min
    })
    return [state, refused(reason)]
  }
  const seen = { ...state, startSeen: Math.max(state.startSeen, input.offset) }
  if (deleteHeld(state, leader, input.offset)) {
    return [seen, answer({ _tag: "Done", highWatermark: leader.highWatermark })]
  }
  const ticket = state.nextTicket
  return [
    { ...seen, nextTicket: ticket + 1, deletes: [...state.deletes, { ticket, offset: input.offset }] },
    answer({ _tag: "Wait", ticket, highWatermark: leader.highWatermark }, [{ _tag: "Wake" }])
  ]
}

/**
 * A follower's fetch: the leader's state steps, and a follower whose log starts past every start this leadership
 * has seen (up to the HW) moves the leader's start there too.
 */
const followerFetched = (state: State, input: Extract<Input, { _tag: "FollowerFetched" }>): Step => {
  const [next, commands] = stepLeader(state, {
    _tag: "FollowerFetched",
    server: input.server,
    fetchOffset: input.fetchOffset,
    nowMs: input.nowMs,
    registration: input.registration,
    logStartOffset: input.logStartOffset
  })
  const raise = Math.min(input.logStartOffset ?? 0, next.leader?.highWatermark ?? 0)
  if (next.leader === undefined || raise <= next.startSeen) return [next, { commands }]
  return [{ ...next, startSeen: raise }, { commands: [...commands, { _tag: "RaiseLogStart", offset: raise }] }]
}

// ---------------------------------------------------------------------------
// The lifecycle's part
// ---------------------------------------------------------------------------

/** Runs a lifecycle event and turns its commands into the replica's. */
const stepLifecycle = (
  state: State,
  event: ReplicaState.Event,
  instruction?: {
    readonly instruction: ReplicaManager.TabletInstruction
    readonly log: LogBounds
    readonly nowMs: number
  }
): Step => {
  const stepped = ReplicaState.step({ tablet: state.tablet, self: state.self }, state.lifecycle, event)
  if (Result.isFailure(stepped)) return [state, refused(stepped.failure)]
  const [lifecycle, lifecycleCommands] = stepped.success
  let next: State = { ...state, lifecycle }
  const commands: Array<Command> = []
  for (const c of lifecycleCommands) {
    switch (c._tag) {
      case "OpenLog":
      case "CloseLog":
      case "DeleteLog":
        commands.push(c)
        break
      case "StopLeading": {
        const [failed, failing] = failAll({ ...next, leader: undefined }, notLeader(next))
        next = failed
        commands.push(...failing)
        break
      }
      case "StopFetching":
        commands.push({ _tag: "StopFollowing" })
        break
      case "BecomeLeader": {
        const generation = next.generation + 1
        const version = instruction?.instruction.leaderAndIsr.version ?? next.version
        const log = instruction?.log ?? { logEndOffset: 0, highWatermark: 0 }
        const leader = LeaderState.become({
          self: next.self,
          leaderEpoch: c.leaderEpoch,
          replicas: next.replicas,
          isr: c.isr,
          version,
          minInsyncReplicas: next.config.minInsyncReplicas,
          lagTimeMaxMs: next.config.lagTimeMaxMs,
          logEndOffset: log.logEndOffset,
          highWatermark: log.highWatermark,
          nowMs: instruction?.nowMs ?? 0
        })
        next = { ...next, generation, version, leader, startSeen: 0 }
        commands.push({
          _tag: "Log",
          level: "Info",
          message: `${next.key}: leading under leader epoch ${c.leaderEpoch}, ISR [${c.isr.join(",")}]`
        })
        // A leader alone in its ISR with a minimum of one commits what it has at once.
        const [appended, appending] = stepLeader(next, { _tag: "Appended", logEndOffset: log.logEndOffset })
        next = appended
        commands.push(...appending)
        break
      }
      case "BecomeFollower": {
        const generation = next.generation + 1
        next = { ...next, generation, version: instruction?.instruction.leaderAndIsr.version ?? next.version }
        commands.push(
          {
            _tag: "Log",
            level: "Info",
            message: `${next.key}: following server ${c.leader} under leader epoch ${c.leaderEpoch}`
          },
          { _tag: "StartFollowing", generation, leader: c.leader, leaderEpoch: c.leaderEpoch }
        )
        break
      }
    }
  }
  return [next, { commands }]
}

/** The coordinator's instruction for the tablet. */
const instruct = (state: State, input: Extract<Input, { _tag: "Instruction" }>): Step => {
  const instruction = input.instruction
  const withReplicas: State = { ...state, replicas: instruction.replicas }
  const lai = instruction.leaderAndIsr
  switch (classify(withReplicas, instruction)) {
    case "Step":
      return stepLifecycle(
        withReplicas,
        {
          _tag: "LeaderAndIsr",
          leader: lai.leader!,
          leaderEpoch: lai.leaderEpoch,
          isr: lai.isr,
          replicas: instruction.replicas
        },
        input
      )
    case "IsrUpdate": {
      const [next, commands] = isrCommitted(withReplicas, lai.isr, lai.version)
      return [next, { commands }]
    }
    case "Fence":
      return stepLifecycle(withReplicas, { _tag: "Fence", leaderEpoch: lai.leaderEpoch })
    case "Stale": {
      // Told to lead again the epoch it lost going offline: it leads only under a new one, which the controller
      // gives on hearing that its store works again (that report may have been lost).
      const lifecycle = withReplicas.lifecycle
      const askAgain =
        lifecycle._tag === "OnlineReplica" && lai.leader === state.self && lai.leaderEpoch === lifecycle.lastLeaderEpoch
      return [withReplicas, askAgain ? { commands: [{ _tag: "ReportStorageBack" }] } : none]
    }
  }
}

/** The replica's store failed: it goes offline (unless it has no role to lose) and the store is tried again. */
const storageFailed = (state: State, detail: string): Step => {
  const m = state.lifecycle._tag
  if (m === "OfflineReplica" || m === "ReplicaDeleted" || m === "NewReplica") return [state, none]
  const [next, ready] = stepLifecycle(state, { _tag: "Offline" })
  return [next, { commands: [{ _tag: "StoreFailed", detail }, ...ready.commands, { _tag: "ResumeStorage" }] }]
}

// ---------------------------------------------------------------------------
// Step
// ---------------------------------------------------------------------------

const fromLeader = ([state, commands]: [State, Array<Command>]): Step => [state, { commands }]

/**
 * One step of the replica. Pure: time comes in on the inputs.
 *
 * @since 0.1.0
 */
export const step: StepFunction = (state, input) => {
  switch (input._tag) {
    case "Open":
      if (state.lifecycle._tag === "NewReplica") return [state, { commands: [{ _tag: "OpenLog" }] }]
      if (state.lifecycle._tag === "OfflineReplica") return stepLifecycle(state, { _tag: "Reopen" })
      return [state, none]
    case "Delete":
      // Deleted already: nothing more to do.
      return state.lifecycle._tag === "ReplicaDeleted" ? [state, none] : stepLifecycle(state, input)
    case "Loaded":
    case "Offline":
    case "Reopen":
    case "Fence":
      return stepLifecycle(state, input)
    case "StorageFailed":
      // A failure seen by an ended role's work (its fetch loop) is that role's: the replica has moved on.
      return input.generation !== undefined && input.generation !== state.generation
        ? [state, none]
        : storageFailed(state, input.detail)
    case "Instruction":
      return instruct(state, input)
    case "Propose":
      return [state, propose(state, input.acks)]
    case "Persisted":
      return persisted(state, input)
    case "Abandon":
      return [
        {
          ...state,
          waiters: state.waiters.filter((w) => w.ticket !== input.ticket),
          deletes: state.deletes.filter((d) => d.ticket !== input.ticket)
        },
        none
      ]
    case "DeleteRecords":
      return [state, deleteRecords(state, input)]
    case "RecordsDeleted":
      return recordsDeleted(state, input)
    case "Checkpointed": {
      const [next, released] = release(state, input.highWatermark)
      return [next, { commands: [...released.commands, { _tag: "Wake" }] }]
    }
    case "Lead":
      return [state, lead(state, input.leaderEpoch)]
    case "Recheck":
      return [
        state,
        state.generation === input.generation && state.leader?.leaderEpoch === input.leaderEpoch
          ? answer({
              _tag: "Admitted",
              generation: state.generation,
              leaderEpoch: input.leaderEpoch,
              highWatermark: state.leader.highWatermark
            })
          : refused(notLeader(state))
      ]
    case "FollowerFetched":
      return followerFetched(state, input)
    case "Tick":
      return fromLeader(stepLeader(state, input))
    case "IsrAnswer":
      return isrAnswer(state, input)
  }
}
