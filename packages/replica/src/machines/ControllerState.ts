/**
 * The controller: the coordinator leader's view of every tablet, as a pure function (Fluss's
 * `TableBucketStateMachine` and `ReplicaStateMachine`, with Kafka's fixes: KIP-841's ISR eligibility, leader
 * election from the live ISR only unless unclean election is enabled, KIP-903's registrations, KIP-966's eligible
 * leader replicas and its recovery: when no ISR member is the life it was, every candidate is asked for its log end
 * and the one going furthest leads).
 *
 * `step(state, input)` returns the next state and the commands the coordinator's shell executes in order: write a
 * tablet's leader and ISR to coordination (the election's epoch-checked write: a deposed coordinator's write fails),
 * send LeaderAndIsr to tablet servers, reply to a request, log. The shell feeds the inputs one at a time, running a
 * step's commands before the next input; a failed write makes the controller resign (`WriteFailed` → `Resign`),
 * and a new controller starts from what coordination holds.
 *
 * Tablet states:
 *
 * <!-- transitions -->
 * | from | event | to |
 * |---|---|---|
 * | NewTablet | created, a replica live | OnlineTablet |
 * | NewTablet | created, no replica live | OfflineTablet |
 * | OnlineTablet | its leader died, a live ISR member | OnlineTablet |
 * | OnlineTablet | its leader died, no live ISR member | OfflineTablet |
 * | OfflineTablet | an ISR member came up | OnlineTablet |
 * | OfflineTablet | a replica came up, unclean election enabled | OnlineTablet |
 * | OnlineTablet | its leader died, candidates to ask | OfflineTablet |
 * | OfflineTablet | the last candidate answered | OnlineTablet |
 * | OnlineTablet | deleted | DeletingTablet |
 * | OfflineTablet | deleted | DeletingTablet |
 * <!-- /transitions -->
 *
 * A deleting tablet has no leader and takes no instruction; each replica is told to delete itself (StopReplica), a
 * server that is down when it comes back, and once every replica has, the tablet's node is removed (a table's name
 * is taken until then).
 *
 * Every leader change bumps the leader epoch; every write bumps the tablet's version (its compare-and-set version
 * in coordination), which an ISR change request must name. A replica's controller-side state follows its server:
 * `replicaState` is Online while the server is registered, Offline after.
 *
 * A reassignment (`Reassign`, see `Reassignment`) moves an online tablet's replica set in three steps, each decided
 * here and stored with the tablet, so that a controller that fails over goes on from what coordination holds: the
 * adding replicas join as followers under the next leader epoch; once every target replica is in the ISR, the target
 * becomes the tablet's replicas under the next epoch (leadership moving to the first target replica in the ISR when
 * its leader leaves); then the leaving replicas delete themselves (StopReplica, as for a deleted table). The ISR never
 * loses a member to the move before the end, when it keeps the target's (all in sync). `CancelReassign` returns the
 * tablet to its original replicas, leadership back to one of them if it moved. A move may name a replication
 * throttle, stored with it: the LeaderAndIsr instructions of its adding replicas (those that do not lead) carry it
 * while the move is under way, and none once it ends; a repeat of the move naming another throttle, or none, replaces
 * it under the same leader epoch, and a resuming controller tells a server whose holding names another throttle.
 *
 * A tablet keeps the retention its table was created with (stored with it, kept through every change): each of its
 * LeaderAndIsr instructions carries it, so every replica it has or is given applies it.
 *
 * `BalanceLeaders` moves leadership back to preferred replicas where a server's share led elsewhere is above
 * `leaderImbalancePercent`; naming tablets, it is a preferred leader election of those tablets, whatever the share.
 *
 * @since 0.1.0
 */
import { Models } from "@strata/core"
import type * as ReplicaManager from "../protocol/ReplicaManager.js"
import * as Reassignment from "./Reassignment.js"

/**
 * A tablet's state in the controller.
 *
 * @since 0.1.0
 */
export type TabletState = "NewTablet" | "OnlineTablet" | "OfflineTablet" | "DeletingTablet"

/**
 * A tablet as the controller holds it (and as coordination stores it).
 *
 * @since 0.1.0
 */
export interface Tablet {
  readonly tablet: Models.TabletId
  /** Every replica, in assignment order (the preferred leader first). */
  readonly replicas: ReadonlyArray<Models.ServerId>
  readonly state: TabletState
  readonly leaderAndIsr: Models.LeaderAndIsr
  /**
   * The registration (life) of each ISR member when the controller last wrote the tablet (KIP-903): a member
   * registered again since — restarted, perhaps without what it had not flushed — is not the member it was.
   */
  readonly registrations?: Readonly<Record<string, number>> | undefined
  /**
   * Eligible leader replicas (KIP-966): members that left the ISR while it was smaller than `minInsyncReplicas`.
   * The high watermark cannot have moved since, so they hold every acknowledged record, and are candidates when no
   * ISR member is the life it was.
   */
  readonly eligible?: ReadonlyArray<Models.ServerId> | undefined
  /** A deleting tablet's replicas that have deleted themselves. */
  readonly deleted?: ReadonlyArray<Models.ServerId> | undefined
  /** The move of its replica set under way, if one is. */
  readonly reassignment?: Reassignment.Reassignment | undefined
  /** Servers taken out of its replicas by a move (finished or cancelled) that have not yet deleted their replica. */
  readonly retired?: ReadonlyArray<Models.ServerId> | undefined
  /** Its table's retention, as the table was created with (absent: its replicas keep everything). */
  readonly retention?: ReplicaManager.Retention | undefined
}

/**
 * The controller's options.
 *
 * @since 0.1.0
 */
export interface Options {
  /** Elect a live replica outside the ISR when no ISR member is live (it may lose acknowledged records). */
  readonly uncleanLeaderElection: boolean
  /** Tablets must have at least this many replicas (default 1). */
  readonly minInsyncReplicas?: number
  /**
   * How a leader is chosen among the live ISR members: the first in assignment order (the default), or the one whose
   * log goes furthest (asked first: fewer records that were not yet acknowledged are truncated away).
   */
  readonly leaderElection?: "first-in-isr" | "largest-log-end"
  /**
   * A server's share of its preferred tablets (it is their first replica) led elsewhere, in percent, above which
   * `BalanceLeaders` moves them back to it (default 10).
   */
  readonly leaderImbalancePercent?: number
}

/**
 * The controller's state.
 *
 * @since 0.1.0
 */
export interface State {
  readonly coordinatorEpoch: Models.Epoch
  readonly options: Options
  /** Registered tablet servers. */
  readonly live: ReadonlySet<Models.ServerId>
  /** Each registered server's registration (its life), when the shell knows it. */
  readonly registrations: ReadonlyMap<Models.ServerId, number>
  /** Live servers in controlled shutdown: not electable, not eligible for an ISR. */
  readonly shuttingDown: ReadonlySet<Models.ServerId>
  readonly tablets: ReadonlyMap<string, Tablet>
  readonly uncleanElections: number
  /** Elections waiting for their candidates' log ends, by tablet key. */
  readonly elections: ReadonlyMap<string, Election>
  /** The next election's round: an answer names its round, so that one of an abandoned election is dropped. */
  readonly nextRound: number
  /** Set once the controller gave up (a write failed): it ignores every input after. */
  readonly resigned: boolean
  /**
   * The replicas whose storage failed, as their servers reported (tablet keys by server): not elected, not added to
   * an ISR, until the server reports them working again or registers again.
   */
  readonly storageFailed: ReadonlyMap<Models.ServerId, ReadonlySet<string>>
  /**
   * The sequence of the latest storage report taken for each replica (by `server tablet`): an older one arriving late
   * is dropped.
   */
  readonly storageReported: ReadonlyMap<string, number>
}

/**
 * A replica's log end as a candidate leader reports it: its latest leader epoch and where its log ends.
 *
 * @since 0.1.0
 */
export interface LogEnd {
  readonly lastEpoch: Models.Epoch | null
  readonly logEndOffset: number
}

/**
 * An election waiting for its candidates' log ends.
 *
 * - `recovery`: no ISR member is the life it was (each restarted, perhaps losing what it had not flushed), so the
 *   best log among the ISR and eligible members and every other live replica leads: every one of them must answer.
 * - `largest`: the `largest-log-end` option among live ISR members; one that cannot answer is passed over.
 *
 * @since 0.1.0
 */
export interface Election {
  readonly round: number
  readonly kind: "recovery" | "largest"
  readonly candidates: ReadonlyArray<Models.ServerId>
  readonly answers: ReadonlyMap<Models.ServerId, LogEnd | null>
}

/**
 * Why an ISR change request was refused.
 *
 * @since 0.1.0
 */
export type IsrRejection = ReplicaManager.IsrRejection

/**
 * What the shell feeds, one at a time.
 *
 * - `Started`: this coordinator became leader under `coordinatorEpoch`, with what coordination holds.
 * - `ServerUp` / `ServerDown`: a tablet server registered, or its registration went (its session ended).
 * - `CreateTablets`: new tablets with their assignments (and their table's retention, if it has one).
 * - `AdjustIsr`: a leader asks to change its tablet's ISR (`version`: the tablet version it knows).
 * - `ControlledShutdown`: a server asks to stop; leadership moves off it first.
 * - `WriteFailed`: a write of the previous step failed (fenced, or its outcome unknown).
 * - `LogEnd`: a candidate's answer to `AskLogEnd` (`null`: it could not be asked).
 * - `DeleteTablets`: tablets to delete (their table is); unknown ones are passed over.
 * - `ReplicaStopped`: a server, as the registration it was addressed as, deleted its replicas of these tablets.
 * - `BalanceLeaders`: the periodic check of preferred leaders (the shell's timer, or an operator's request): each live
 *   server whose preferred tablets are led elsewhere above `leaderImbalancePercent` leads those it is in the ISR of
 *   again (Kafka's preferred replica election).
 * - `Holdings`: a server's answer to `AskHoldings`, for the registration it was asked as (`null`: it could not be
 *   asked).
 * - `Reassign`: move a tablet's replicas to `target` (a repeat of the move under way, or of the replicas it has, is
 *   answered as accepted and changes nothing).
 * - `CancelReassign`: end a tablet's move, back on its original replicas.
 *
 * @since 0.1.0
 */
export type Input =
  | {
      readonly _tag: "Started"
      readonly coordinatorEpoch: Models.Epoch
      readonly live: ReadonlyArray<Models.ServerId>
      readonly tablets: ReadonlyArray<Tablet>
      /** The live servers' registrations. */
      readonly registrations?: ReadonlyArray<readonly [Models.ServerId, number]>
    }
  | { readonly _tag: "ServerUp"; readonly server: Models.ServerId; readonly registration?: number }
  | { readonly _tag: "ServerDown"; readonly server: Models.ServerId }
  | {
      readonly _tag: "ReplicaStorage"
      readonly server: Models.ServerId
      readonly registration?: number
      readonly tablets: ReadonlyArray<Models.TabletId>
      /** `true`: their storage failed and they are offline; `false`: it takes writes again. */
      readonly failed: boolean
      /** The report's place among the server's reports (each new report takes the next). */
      readonly sequence?: number
    }
  | {
      readonly _tag: "CreateTablets"
      readonly requestId: number
      readonly tablets: ReadonlyArray<{
        readonly tablet: Models.TabletId
        readonly replicas: ReadonlyArray<Models.ServerId>
        readonly retention?: ReplicaManager.Retention | undefined
      }>
    }
  | ({ readonly _tag: "AdjustIsr"; readonly requestId: number } & ReplicaManager.AdjustIsrRequest)
  | { readonly _tag: "ControlledShutdown"; readonly requestId: number; readonly server: Models.ServerId }
  | { readonly _tag: "WriteFailed"; readonly tablet: Models.TabletId; readonly detail: string }
  | {
      readonly _tag: "BalanceLeaders"
      readonly requestId?: number
      /**
       * The tablets to give their preferred replica as leader whatever the imbalance (preferred leader election);
       * absent: every server whose preferred tablets are led elsewhere above `leaderImbalancePercent`.
       */
      readonly tablets?: ReadonlyArray<Models.TabletId> | undefined
    }
  | { readonly _tag: "DeleteTablets"; readonly requestId: number; readonly tablets: ReadonlyArray<Models.TabletId> }
  | {
      readonly _tag: "ReplicaStopped"
      readonly server: Models.ServerId
      readonly registration?: number
      readonly tablets: ReadonlyArray<Models.TabletId>
    }
  | {
      readonly _tag: "Holdings"
      readonly server: Models.ServerId
      readonly registration?: number
      readonly holdings: ReadonlyArray<ReplicaManager.Holding> | null
    }
  | {
      readonly _tag: "LogEnd"
      readonly tablet: Models.TabletId
      readonly round: number
      readonly server: Models.ServerId
      readonly logEnd: LogEnd | null
    }
  | {
      readonly _tag: "Reassign"
      readonly requestId: number
      readonly tablet: Models.TabletId
      readonly target: ReadonlyArray<Models.ServerId>
      /** The move's replication throttle, in bytes a second (absent: unthrottled); see `Reassignment`. */
      readonly throttleBytesPerSec?: number | undefined
    }
  | { readonly _tag: "CancelReassign"; readonly requestId: number; readonly tablet: Models.TabletId }

/**
 * One tablet's instruction in a LeaderAndIsr request.
 *
 * @since 0.1.0
 */
export interface TabletInstruction {
  readonly tablet: Models.TabletId
  readonly replicas: ReadonlyArray<Models.ServerId>
  readonly leaderAndIsr: Models.LeaderAndIsr
  /**
   * The replication throttle the server's replica fetches under, in bytes a second: set for an adding replica of a
   * move that names one (`Reassignment.throttleOf`), absent otherwise.
   */
  readonly throttleBytesPerSec?: number
  /** The tablet's retention, when its table has one. */
  readonly retention?: ReplicaManager.Retention
}

/**
 * A request's reply.
 *
 * @since 0.1.0
 */
export type Reply =
  | { readonly _tag: "Created"; readonly tablets: ReadonlyArray<Tablet> }
  | { readonly _tag: "CreateRefused"; readonly detail: string }
  | ReplicaManager.AdjustIsrReply
  | { readonly _tag: "ShutdownProgress"; readonly remainingLeaders: number }
  | { readonly _tag: "LeadersBalanced"; readonly moved: number }
  | { readonly _tag: "Deleting"; readonly tablets: number }
  | { readonly _tag: "Reassigning"; readonly tablet: Tablet }
  | { readonly _tag: "ReassignCancelled"; readonly tablet: Tablet }
  | { readonly _tag: "ReassignRefused"; readonly refusal: Reassignment.Refusal; readonly detail: string }

/**
 * A leader's ISR change request, as a tablet server sends it.
 *
 * @since 0.1.0
 */
export type AdjustIsrRequest = ReplicaManager.AdjustIsrRequest

/**
 * The controller's answer to an ISR change request.
 *
 * @since 0.1.0
 */
export type AdjustIsrReply = ReplicaManager.AdjustIsrReply

/**
 * What the shell runs, in order.
 *
 * - `Write`: store the tablet in coordination, fenced by the coordinator epoch; `expectedVersion` `null` creates
 *   it. A failure is fed back as `WriteFailed`, and the step's later commands are not run.
 * - `Send`: a LeaderAndIsr request to one server, carrying the coordinator epoch and the server's registration
 *   when known (so that another life of the server refuses it) (delivered until the server
 *   answers or leaves).
 * - `StopReplica`: tell one server (as its registration, under the coordinator epoch) to delete its replicas of these
 *   tablets, delivered until it answers (fed back as `ReplicaStopped`) or leaves.
 * - `Remove`: delete the tablet's node (fenced, at `expectedVersion`), every replica having deleted itself.
 * - `Reply`: answer request `requestId`.
 * - `AskLogEnd`: ask a candidate leader for its log end, under the coordinator epoch and the leader epoch the tablet
 *   is offline at (the candidate ends any role under an older one first, so its answer stays true); the answer is
 *   fed back as `LogEnd` (after the backoff when it could not be asked).
 * - `AskHoldings`: ask a server (as its registration, under the coordinator epoch) what it holds; the answer is fed
 *   back as `Holdings` (`null` after the backoff when it could not be asked).
 * - `Log`: one greppable line.
 * - `Resign`: give up the controller (the coordinator steps down).
 *
 * @since 0.1.0
 */
export type Command =
  | { readonly _tag: "Write"; readonly tablet: Tablet; readonly expectedVersion: number | null }
  | {
      readonly _tag: "Send"
      readonly server: Models.ServerId
      readonly registration?: number
      readonly coordinatorEpoch: Models.Epoch
      readonly tablets: ReadonlyArray<TabletInstruction>
    }
  | {
      readonly _tag: "StopReplica"
      readonly server: Models.ServerId
      readonly registration?: number
      readonly coordinatorEpoch: Models.Epoch
      readonly tablets: ReadonlyArray<Models.TabletId>
    }
  | { readonly _tag: "Remove"; readonly tablet: Models.TabletId; readonly expectedVersion: number }
  | { readonly _tag: "Reply"; readonly requestId: number; readonly reply: Reply }
  | {
      readonly _tag: "AskLogEnd"
      readonly server: Models.ServerId
      readonly tablet: Models.TabletId
      readonly round: number
      readonly leaderEpoch: Models.Epoch
      readonly coordinatorEpoch: Models.Epoch
    }
  | {
      readonly _tag: "AskHoldings"
      readonly server: Models.ServerId
      readonly registration?: number
      readonly coordinatorEpoch: Models.Epoch
    }
  | { readonly _tag: "Log"; readonly level: "info" | "warn"; readonly message: string }
  | { readonly _tag: "Resign"; readonly reason: string }

/**
 * The outcome of one step.
 *
 * @since 0.1.0
 */
export type Step = readonly [State, ReadonlyArray<Command>]

/**
 * A controller before `Started`.
 *
 * @since 0.1.0
 */
export const make = (options: Options): State => ({
  coordinatorEpoch: 0,
  options,
  live: new Set(),
  registrations: new Map(),
  storageFailed: new Map(),
  storageReported: new Map(),
  shuttingDown: new Set(),
  tablets: new Map(),
  uncleanElections: 0,
  elections: new Map(),
  nextRound: 0,
  resigned: false
})

/**
 * The controller's view of one replica.
 *
 * @since 0.1.0
 */
export const replicaState = (
  state: State,
  tablet: Models.TabletId,
  server: Models.ServerId
): "Online" | "Offline" | "None" => {
  const t = state.tablets.get(Models.tabletKey(tablet))
  if (t === undefined || !t.replicas.includes(server)) return "None"
  return state.live.has(server) ? "Online" : "Offline"
}

/** A step's changes, collected: the tablets written (with the version they replace) and the commands after them. */
interface Changes {
  readonly tablets: Map<string, Tablet>
  readonly writes: Array<Command>
  /** Tablets whose new state every live replica must hear. */
  readonly notify: Array<Tablet>
  readonly after: Array<Command>
  /** Tablets deleted for good: their nodes go, after the writes. */
  readonly removes: Array<Command>
  readonly elections: Map<string, Election>
  nextRound: number
  unclean: number
}

const changes = (state: State): Changes => ({
  tablets: new Map(state.tablets),
  writes: [],
  notify: [],
  after: [],
  removes: [],
  elections: new Map(state.elections),
  nextRound: state.nextRound,
  unclean: 0
})

/** How `put` records a tablet beyond its new state. */
interface PutOptions {
  /** Every live replica hears the new state (default); an accepted ISR change is told to its leader only. */
  readonly notify?: boolean
  /** Members recorded as they are registered now although they were in the ISR before: a leader just elected. */
  readonly confirmed?: ReadonlyArray<Models.ServerId>
  /** The eligible members, when the change decides them (a recovery); else they follow from the ISR change. */
  readonly eligible?: ReadonlyArray<Models.ServerId>
}

/**
 * Records a tablet's new state: its write, and the LeaderAndIsr every live replica gets once it is written. An ISR
 * member keeps the registration it joined with — a restart since is noticed, however many writes later — except the
 * `confirmed`: they, and members new to the ISR, are recorded as they are registered now.
 */
const put = (state: State, c: Changes, before: Tablet | undefined, next: Tablet, options: PutOptions = {}) => {
  const confirmed = options.confirmed ?? []
  const registrations: Record<string, number> = {}
  for (const s of next.leaderAndIsr.isr) {
    const kept = before?.leaderAndIsr.isr.includes(s) && !confirmed.includes(s)
    const life = kept
      ? (before?.registrations?.[String(s)] ?? state.registrations.get(s))
      : (state.registrations.get(s) ?? before?.registrations?.[String(s)])
    if (life !== undefined) registrations[String(s)] = life
  }
  // An eligible member keeps the life it left the ISR as: one that restarted since may have lost what it held.
  const eligible = options.eligible ?? eligibleAfter(state, before, next)
  for (const s of eligible) {
    const life = before?.registrations?.[String(s)]
    if (life !== undefined && registrations[String(s)] === undefined) registrations[String(s)] = life
  }
  // A tablet written twice in a step (an ISR change that finishes a move) is one write: a transaction changes a node
  // once (etcd refuses two changes of a key in one).
  const key = Models.tabletKey(next.tablet)
  const earlier = c.writes.findIndex((w) => w._tag === "Write" && Models.tabletKey(w.tablet.tablet) === key)
  const replaced = c.writes[earlier]
  const expectedVersion =
    replaced?._tag === "Write" ? replaced.expectedVersion : before === undefined ? null : before.leaderAndIsr.version
  if (earlier >= 0) c.writes.splice(earlier, 1)
  const stored: Tablet = {
    ...next,
    registrations,
    eligible,
    leaderAndIsr: {
      ...next.leaderAndIsr,
      coordinatorEpoch: state.coordinatorEpoch,
      version: expectedVersion === null ? 0 : expectedVersion + 1
    }
  }
  c.tablets.set(key, stored)
  c.writes.push({ _tag: "Write", tablet: stored, expectedVersion })
  if (options.notify ?? true) c.notify.push(stored)
  return stored
}

/**
 * One LeaderAndIsr request per live server, for the tablets (their latest state) it holds a replica of; `only`
 * limits them to one server.
 */
const sends = (state: State, tablets: ReadonlyArray<Tablet>, only?: Models.ServerId): Array<Command> => {
  const latest = new Map(tablets.map((t) => [Models.tabletKey(t.tablet), t]))
  const by = new Map<Models.ServerId, Array<TabletInstruction>>()
  for (const t of latest.values()) {
    if (t.state === "DeletingTablet") continue
    for (const r of t.replicas) {
      if (!state.live.has(r) || (only !== undefined && r !== only)) continue
      const list = by.get(r) ?? []
      list.push(instructionFor(t, r))
      by.set(r, list)
    }
  }
  return [...by].map(([server, list]): Command => {
    const registration = state.registrations.get(server)
    return {
      _tag: "Send",
      server,
      ...(registration === undefined ? {} : { registration }),
      coordinatorEpoch: state.coordinatorEpoch,
      tablets: list
    }
  })
}

/**
 * `t`'s instruction to `server`: its replicas, leader and ISR, the throttle its replica fetches under, and its
 * retention.
 */
const instructionFor = (t: Tablet, server: Models.ServerId): TabletInstruction => {
  const throttle = Reassignment.throttleOf(t.reassignment, server, t.leaderAndIsr.leader)
  return {
    tablet: t.tablet,
    replicas: t.replicas,
    leaderAndIsr: t.leaderAndIsr,
    ...(throttle === undefined ? {} : { throttleBytesPerSec: throttle }),
    ...(t.retention === undefined ? {} : { retention: t.retention })
  }
}

/**
 * The eligible members after an ISR change: none while the ISR holds `minInsyncReplicas` (the high watermark may move
 * past what the others hold), else those before and the members that just left it.
 */
const eligibleAfter = (state: State, before: Tablet | undefined, next: Tablet): ReadonlyArray<Models.ServerId> => {
  const isr = next.leaderAndIsr.isr
  if (isr.length >= (state.options.minInsyncReplicas ?? 1)) return []
  const left = before?.leaderAndIsr.isr.filter((s) => !isr.includes(s)) ?? []
  return next.replicas.filter((r) => !isr.includes(r) && (left.includes(r) || (before?.eligible ?? []).includes(r)))
}

/**
 * The step's result: the writes, then the LeaderAndIsr requests (`extra` too), then the rest. Every move the step
 * made ready (each target replica in the ISR) finishes in it.
 */
const finish = (state: State, c: Changes, extra: ReadonlyArray<Command> = []): Step => {
  for (const t of [...c.tablets.values()]) if (t.reassignment !== undefined) advance(state, c, t)
  const next: State = {
    ...state,
    tablets: c.tablets,
    elections: c.elections,
    nextRound: c.nextRound,
    uncleanElections: state.uncleanElections + c.unclean
  }
  // Each tablet to be heard is sent as it ends the step.
  const notify = c.notify.flatMap((t) => next.tablets.get(Models.tabletKey(t.tablet)) ?? [])
  return [next, [...c.writes, ...c.removes, ...sends(next, notify), ...extra, ...c.after]]
}

const electable = (state: State, server: Models.ServerId) => state.live.has(server) && !state.shuttingDown.has(server)

/** Whether `server`'s replica of `t` reported its storage failed. */
const storageFailedOn = (state: State, server: Models.ServerId, t: Tablet) =>
  state.storageFailed.get(server)?.has(Models.tabletKey(t.tablet)) === true

/** Whether `server` may lead `t` or join its ISR: live, not stopping, its replica's storage working. */
const usable = (state: State, t: Tablet, server: Models.ServerId) =>
  electable(state, server) && !storageFailedOn(state, server, t)

/** Whether ISR member `s` of `t` registered again since it was written into the ISR (a new life). */
const newLife = (state: State, t: Tablet, s: Models.ServerId) => {
  const recorded = t.registrations?.[String(s)]
  const current = state.registrations.get(s)
  return recorded !== undefined && current !== undefined && recorded !== current
}

/** What an election comes to: a leader, candidates to ask first, or none (the tablet waits, offline). */
type Choice =
  | {
      readonly _tag: "Leader"
      readonly leader: Models.ServerId
      readonly isr: ReadonlyArray<Models.ServerId>
      readonly unclean: boolean
      /** Set when the choice ends a recovery: the leader's log is the tablet's from now on. */
      readonly eligible?: ReadonlyArray<Models.ServerId>
    }
  | { readonly _tag: "Ask"; readonly kind: Election["kind"]; readonly candidates: ReadonlyArray<Models.ServerId> }

/**
 * A new leader for `t` without `gone` (a dead or stopping leader):
 *
 * - a live ISR member that is the life it was and not stopping: the first in assignment order, or with the
 *   `largest-log-end` option the one whose log goes furthest (asked first when there are several);
 * - else a live eligible member (KIP-966) that is the life it was;
 * - else, when every ISR and eligible member is live, the one whose log goes furthest among them and every other live
 *   replica (asked first when there are several): each of them is a new life and may have lost what it had not
 *   flushed;
 * - else (unclean election enabled) the first live replica that is not stopping.
 *
 * `undefined`: none; the tablet goes Offline, keeping its ISR, until its candidates return.
 */
const elect = (state: State, t: Tablet, gone: Models.ServerId | undefined): Choice | undefined => {
  const out = (s: Models.ServerId) => s === gone || newLife(state, t, s)
  const isr = t.leaderAndIsr.isr.filter((s) => !out(s))
  const inIsr = t.replicas.filter((r) => isr.includes(r) && usable(state, t, r))
  const first = inIsr[0]
  if (first !== undefined) {
    if (state.options.leaderElection === "largest-log-end" && inIsr.length > 1) {
      return { _tag: "Ask", kind: "largest", candidates: inIsr }
    }
    return { _tag: "Leader", leader: first, isr: isr.filter((s) => state.live.has(s) || s === first), unclean: false }
  }
  // KIP-966: an eligible member left the ISR while it was below its minimum, so the HW has not moved past it; one
  // that is live and the life it was holds every acknowledged record.
  const fromElr = t.replicas.find((r) => (t.eligible ?? []).includes(r) && !out(r) && usable(state, t, r))
  if (fromElr !== undefined) return { _tag: "Leader", leader: fromElr, isr: [fromElr], unclean: false }
  const candidates = t.replicas.filter((r) => t.leaderAndIsr.isr.includes(r) || (t.eligible ?? []).includes(r))
  if (candidates.length > 0 && candidates.every((r) => usable(state, t, r))) {
    // Each of them restarted and may have lost what it had not flushed, while a replica outside them may still hold
    // it: every live replica is asked too, and the furthest log leads.
    const asked = t.replicas.filter((r) => candidates.includes(r) || (r !== gone && usable(state, t, r)))
    const only = asked.length === 1 ? asked[0] : undefined
    return only === undefined
      ? { _tag: "Ask", kind: "recovery", candidates: asked }
      : { _tag: "Leader", leader: only, isr: [only], unclean: false, eligible: [] }
  }
  if (!state.options.uncleanLeaderElection) return undefined
  const any = t.replicas.find((r) => r !== gone && usable(state, t, r))
  return any === undefined ? undefined : { _tag: "Leader", leader: any, isr: [any], unclean: true, eligible: [] }
}

/** Whether two elections ask the same candidates the same way. */
const sameElection = (e: Election | undefined, kind: Election["kind"], candidates: ReadonlyArray<Models.ServerId>) =>
  e !== undefined &&
  e.kind === kind &&
  e.candidates.length === candidates.length &&
  e.candidates.every((s, i) => candidates[i] === s)

/**
 * `t` goes (or stays) Offline; the epoch still moves on, so that the old leader's followers stop taking its answers.
 */
const takeOffline = (state: State, c: Changes, t: Tablet, why: string) => {
  if (t.state === "OfflineTablet") return
  put(state, c, t, {
    ...t,
    state: "OfflineTablet",
    leaderAndIsr: { ...t.leaderAndIsr, leader: null, leaderEpoch: t.leaderAndIsr.leaderEpoch + 1 }
  })
  c.after.push({ _tag: "Log", level: "warn", message: `${Models.tabletKey(t.tablet)}: ${why}, offline` })
}

/** `t` led by the choice's leader under the next leader epoch. */
const lead = (state: State, c: Changes, t: Tablet, chosen: Extract<Choice, { _tag: "Leader" }>) => {
  const epoch = t.leaderAndIsr.leaderEpoch + 1
  c.elections.delete(Models.tabletKey(t.tablet))
  put(
    state,
    c,
    t,
    {
      ...t,
      state: "OnlineTablet",
      leaderAndIsr: { ...t.leaderAndIsr, leader: chosen.leader, leaderEpoch: epoch, isr: chosen.isr }
    },
    { confirmed: [chosen.leader], ...(chosen.eligible === undefined ? {} : { eligible: chosen.eligible }) }
  )
  if (chosen.unclean) {
    c.unclean++
    c.after.push({
      _tag: "Log",
      level: "warn",
      message: `${Models.tabletKey(t.tablet)}: unclean leader election of server ${chosen.leader} at epoch ${epoch}`
    })
  }
}

/** Moves `t`'s leadership off `gone` (or gives it a leader when it has none). */
const reelect = (state: State, c: Changes, t: Tablet, gone: Models.ServerId | undefined) => {
  const key = Models.tabletKey(t.tablet)
  const chosen = elect(state, t, gone)
  if (chosen?._tag === "Leader") return lead(state, c, t, chosen)
  if (chosen === undefined) {
    c.elections.delete(key)
    return takeOffline(state, c, t, "no live in-sync replica")
  }
  // Asking first: offline meanwhile. The same election already asking goes on.
  const current = c.tablets.get(key) ?? t
  if (current.state !== "OfflineTablet") takeOffline(state, c, current, `asking ${chosen.candidates.length} candidates`)
  if (sameElection(c.elections.get(key), chosen.kind, chosen.candidates)) return
  const round = c.nextRound++
  c.elections.set(key, { round, kind: chosen.kind, candidates: chosen.candidates, answers: new Map() })
  const offline = c.tablets.get(key) ?? t
  for (const server of chosen.candidates) c.after.push(askLogEnd(state, offline, server, round))
}

/** The question to `server` for offline tablet `t`'s election `round`. */
const askLogEnd = (state: State, t: Tablet, server: Models.ServerId, round: number): Command => ({
  _tag: "AskLogEnd",
  server,
  tablet: t.tablet,
  round,
  leaderEpoch: t.leaderAndIsr.leaderEpoch,
  coordinatorEpoch: state.coordinatorEpoch
})

/** The answer that goes furthest: the later epoch, then the longer log, then the earlier in assignment order. */
const furthest = (t: Tablet, answers: ReadonlyMap<Models.ServerId, LogEnd | null>): Models.ServerId | undefined => {
  let best: { readonly server: Models.ServerId; readonly end: LogEnd } | undefined
  for (const server of t.replicas) {
    const end = answers.get(server)
    if (end === undefined || end === null) continue
    const epoch = end.lastEpoch ?? -1
    const bestEpoch = best?.end.lastEpoch ?? -1
    if (best === undefined || epoch > bestEpoch || (epoch === bestEpoch && end.logEndOffset > best.end.logEndOffset)) {
      best = { server, end }
    }
  }
  return best?.server
}

/** A candidate's answer; the last one decides the election. */
const answered = (state: State, input: Extract<Input, { _tag: "LogEnd" }>): Step => {
  const key = Models.tabletKey(input.tablet)
  const e = state.elections.get(key)
  const t = state.tablets.get(key)
  if (e === undefined || t === undefined || e.round !== input.round || !e.candidates.includes(input.server)) {
    return [state, []]
  }
  // A recovery needs every candidate's answer: ask again (the shell waits its backoff before it feeds a failure).
  if (input.logEnd === null && e.kind === "recovery") return [state, [askLogEnd(state, t, input.server, e.round)]]
  const answers = new Map(e.answers).set(input.server, input.logEnd)
  const c = changes(state)
  if (answers.size < e.candidates.length) {
    c.elections.set(key, { ...e, answers })
    return finish(state, c)
  }
  c.elections.delete(key)
  const winner = furthest(t, answers) ?? e.candidates.find((s) => usable(state, t, s))
  if (winner === undefined || !usable(state, t, winner)) {
    reelect(state, c, t, undefined)
    return finish(state, c)
  }
  const stays = (s: Models.ServerId) =>
    s === winner || (state.live.has(s) && !state.shuttingDown.has(s) && !newLife(state, t, s))
  const isr = e.kind === "recovery" ? [winner] : t.leaderAndIsr.isr.filter(stays)
  const eligible = e.kind === "recovery" ? { eligible: [] } : {}
  lead(state, c, t, { _tag: "Leader", leader: winner, isr, unclean: false, ...eligible })
  const told = [...answers].map(
    ([s, end]) => `${s}: ${end === null ? "no answer" : `${end.lastEpoch}/${end.logEndOffset}`}`
  )
  c.after.push({
    _tag: "Log",
    level: e.kind === "recovery" ? "warn" : "info",
    message: `${key}: server ${winner} leads, its log going furthest (${told.join(", ")})`
  })
  return finish(state, c)
}

/**
 * A candidate left while a recovery asked: the recovery waits for it again. (A `largest` election passes it over
 * when its question fails.)
 */
const candidateGone = (state: State, c: Changes, server: Models.ServerId) => {
  for (const [key, e] of state.elections) {
    const t = c.tablets.get(key)
    if (e.kind === "recovery" && e.candidates.includes(server) && t !== undefined) reelect(state, c, t, undefined)
  }
}

/** Takes the `out` followers out of `t`'s ISR; the leader always stays. */
const dropFromIsr = (state: State, c: Changes, t: Tablet, out: (server: Models.ServerId) => boolean) => {
  const isr = t.leaderAndIsr.isr
  const kept = isr.filter((s) => s === t.leaderAndIsr.leader || !out(s))
  if (kept.length === isr.length || kept.length === 0) return
  put(state, c, t, { ...t, leaderAndIsr: { ...t.leaderAndIsr, isr: kept } })
}

/**
 * Every tablet with a replica on `server`, once it left or while it stops: leadership moves, the ISR shrinks. An
 * offline tablet keeps its ISR: its members are the candidates it waits for.
 */
const moveOff = (state: State, c: Changes, server: Models.ServerId, clean: boolean) => {
  for (const t of state.tablets.values()) {
    if (!t.replicas.includes(server) || t.state === "DeletingTablet") continue
    if (t.leaderAndIsr.leader === server) {
      // A stopping server keeps a tablet only another unclean election could take from it.
      const chosen = clean ? elect(state, t, server) : undefined
      if (!clean || (chosen !== undefined && (chosen._tag === "Ask" || !chosen.unclean))) reelect(state, c, t, server)
    } else if (t.state !== "OfflineTablet") dropFromIsr(state, c, t, (s) => s === server)
  }
}

const validateIsr = (
  state: State,
  input: Extract<Input, { _tag: "AdjustIsr" }>,
  t: Tablet | undefined
): IsrRejection | undefined => {
  if (t === undefined) return { _tag: "UnknownTablet" }
  const current = t.leaderAndIsr
  if (input.leaderEpoch !== current.leaderEpoch) return { _tag: "FencedLeaderEpoch", current: current.leaderEpoch }
  if (input.leader !== current.leader) return { _tag: "NotLeader", leader: current.leader }
  if (input.version !== current.version) {
    return { _tag: "InvalidVersion", current: current.version, leaderAndIsr: current }
  }
  if (!input.isr.includes(input.leader)) return { _tag: "InvalidIsr", detail: "the ISR must hold its leader" }
  const stranger = input.isr.find((s) => !t.replicas.includes(s))
  if (stranger !== undefined) return { _tag: "InvalidIsr", detail: `server ${stranger} holds no replica` }
  if (new Set(input.isr).size !== input.isr.length) return { _tag: "InvalidIsr", detail: "a server twice" }
  for (const s of input.isr) {
    if (current.isr.includes(s)) continue
    if (!state.live.has(s)) return { _tag: "IneligibleReplica", server: s, why: "offline" }
    if (state.shuttingDown.has(s)) return { _tag: "IneligibleReplica", server: s, why: "shutting down" }
    if (storageFailedOn(state, s, t)) return { _tag: "IneligibleReplica", server: s, why: "its storage failed" }
    const fetchedAs = input.registrations?.find(([id]) => id === s)?.[1]
    const registered = state.registrations.get(s)
    if (fetchedAs !== undefined && registered !== undefined && fetchedAs !== registered) {
      return { _tag: "IneligibleReplica", server: s, why: "registered again" }
    }
  }
  return undefined
}

/** Whether an ISR change asks for the ISR the tablet already has, under its current leader and epoch. */
const isRepeat = (input: Extract<Input, { _tag: "AdjustIsr" }>, current: Models.LeaderAndIsr) =>
  input.version !== current.version &&
  input.leader === current.leader &&
  input.leaderEpoch === current.leaderEpoch &&
  input.isr.length === current.isr.length &&
  input.isr.every((s) => current.isr.includes(s))

/** Why tablets cannot be created as asked (nothing is created then), if they cannot. */
const refuseCreate = (
  state: State,
  specs: Extract<Input, { _tag: "CreateTablets" }>["tablets"]
): string | undefined => {
  const min = state.options.minInsyncReplicas ?? 1
  const seen = new Set<string>()
  for (const spec of specs) {
    const key = Models.tabletKey(spec.tablet)
    if (seen.has(key)) return `${key} is asked for twice`
    seen.add(key)
    if (spec.replicas.length < min) {
      return `${key}: ${spec.replicas.length} replicas, minInsyncReplicas is ${min}: no append could be acknowledged`
    }
    if (new Set(spec.replicas).size !== spec.replicas.length) return `${key}: a server holds two of its replicas`
    for (const [name, value] of [
      ["retention.ms", spec.retention?.ms],
      ["retention.bytes", spec.retention?.bytes]
    ] as const) {
      if (value !== undefined && !(Number.isSafeInteger(value) && value >= 1)) {
        return `${key}: ${name} must be a whole number ≥ 1, not ${value}`
      }
    }
  }
  return undefined
}

/**
 * Moves leadership back to preferred replicas (the first in assignment order): for every live server whose preferred
 * tablets are led elsewhere above the imbalance threshold, each such online tablet with no election pending whose ISR
 * holds the server as the life it joined with, it leads under the next epoch, its ISR unchanged (an ISR member holds
 * every acknowledged record). The number of tablets moved.
 */
const balanceLeaders = (state: State, c: Changes): number => {
  const preferred = new Map<Models.ServerId, Array<Tablet>>()
  for (const t of state.tablets.values()) {
    const first = t.replicas[0]
    if (first === undefined) continue
    const list = preferred.get(first) ?? []
    list.push(t)
    preferred.set(first, list)
  }
  const threshold = state.options.leaderImbalancePercent ?? 10
  let moved = 0
  for (const [server, tablets] of preferred) {
    if (!electable(state, server)) continue
    const elsewhere = tablets.filter((t) => t.leaderAndIsr.leader !== server)
    if (elsewhere.length === 0 || (elsewhere.length * 100) / tablets.length <= threshold) continue
    for (const t of elsewhere) {
      if (!preferredCanLead(state, c, t, server)) continue
      lead(state, c, t, { _tag: "Leader", leader: server, isr: t.leaderAndIsr.isr, unclean: false })
      moved++
    }
  }
  return moved
}

/**
 * Whether `server`, `t`'s preferred replica, may take its leadership now: the tablet is online with no election
 * pending, and `server` is electable and in its ISR as the life it joined with, its storage working.
 */
const preferredCanLead = (state: State, c: Changes, t: Tablet, server: Models.ServerId) =>
  electable(state, server) &&
  t.state === "OnlineTablet" &&
  t.leaderAndIsr.isr.includes(server) &&
  !newLife(state, t, server) &&
  !storageFailedOn(state, server, t) &&
  !c.elections.has(Models.tabletKey(t.tablet))

/**
 * Preferred leader election for the named tablets: each whose preferred replica (its first) does not lead and may
 * (`preferredCanLead`) leads under the next epoch, its ISR unchanged, whatever `leaderImbalancePercent` says. A tablet
 * the controller does not know, or named twice, is passed over. The number of tablets moved.
 */
const electPreferred = (state: State, c: Changes, tablets: ReadonlyArray<Models.TabletId>): number => {
  let moved = 0
  const seen = new Set<string>()
  for (const id of tablets) {
    const key = Models.tabletKey(id)
    if (seen.has(key)) continue
    seen.add(key)
    const t = c.tablets.get(key)
    const server = t?.replicas[0]
    if (t === undefined || server === undefined || t.leaderAndIsr.leader === server) continue
    if (!preferredCanLead(state, c, t, server)) continue
    lead(state, c, t, { _tag: "Leader", leader: server, isr: t.leaderAndIsr.isr, unclean: false })
    moved++
  }
  return moved
}

/** Whether `server` is to delete its replica of `t`: the tablet is being deleted, or a move took the replica out. */
const toDelete = (t: Tablet, server: Models.ServerId) =>
  (t.state === "DeletingTablet" && t.replicas.includes(server) && !(t.deleted ?? []).includes(server)) ||
  (t.retired ?? []).includes(server)

/**
 * The StopReplica `server` gets for the tablets it is to delete its replica of (`only`: of these), if any; a server
 * that is down is told when it is back.
 */
const stopReplicas = (state: State, server: Models.ServerId, only?: ReadonlyArray<Tablet>): Array<Command> => {
  if (!state.live.has(server)) return []
  const tablets = (only ?? [...state.tablets.values()]).flatMap((t) => (toDelete(t, server) ? [t.tablet] : []))
  if (tablets.length === 0) return []
  const registration = state.registrations.get(server)
  return [
    {
      _tag: "StopReplica",
      server,
      ...(registration === undefined ? {} : { registration }),
      coordinatorEpoch: state.coordinatorEpoch,
      tablets
    }
  ]
}

/** The question a new controller asks a live server about what it holds. */
const askHoldings = (state: State, server: Models.ServerId): Command => {
  const registration = state.registrations.get(server)
  return {
    _tag: "AskHoldings",
    server,
    ...(registration === undefined ? {} : { registration }),
    coordinatorEpoch: state.coordinatorEpoch
  }
}

/**
 * Whether `server`'s replica of `t`, as its holdings tell, missed an instruction: it is not there, holds another
 * leader epoch, leads with an older tablet version (a follower is not told of ISR changes), or fetches under another
 * replication throttle than the move's (a throttle changes without a new leader epoch). Retention is not compared
 * (holdings do not tell it): a table's is set when it is created and comes with every instruction of its tablets.
 */
const fallsBehind = (t: Tablet, server: Models.ServerId, holdings: ReadonlyMap<string, ReplicaManager.Holding>) => {
  const held = holdings.get(Models.tabletKey(t.tablet))
  const lai = t.leaderAndIsr
  if (held === undefined || held.leaderEpoch !== lai.leaderEpoch) return lai.leader !== null || held === undefined
  if (lai.leader !== null && held.throttleBytesPerSec !== Reassignment.throttleOf(t.reassignment, server, lai.leader))
    return true
  return lai.leader === server && held.version < lai.version
}

const remainingLeaders = (tablets: ReadonlyMap<string, Tablet>, server: Models.ServerId) =>
  [...tablets.values()].filter((t) => t.leaderAndIsr.leader === server).length

/**
 * A server's report that its replicas of some tablets failed their storage (or work again). Failed: each leaves the
 * tablets' ISRs and, where it leads, leadership moves (Kafka's handling of a failed log directory); working again:
 * each tablet's leader leads on under the next leader epoch, so the replica, which takes a role only under an epoch
 * it has not seen, follows again and may rejoin the ISR. A report from another life of the server, or older than one
 * taken (a late or repeated copy: it would undo what came after it), is dropped; so is a failure of a replica the
 * tablet no longer has there (a late report of one a move retired and the server deleted: the mark would outlive it,
 * and a replica given again there could never join the ISR).
 */
const replicaStorage = (state: State, input: Extract<Input, { _tag: "ReplicaStorage" }>): Step => {
  const registered = state.registrations.get(input.server)
  if (!state.live.has(input.server) || (input.registration !== undefined && input.registration !== registered)) {
    return [state, []]
  }
  const sequence = input.sequence
  const storageReported = new Map(state.storageReported)
  const tablets = input.tablets.filter((id) => {
    if (sequence === undefined) return true
    const replica = `${input.server} ${Models.tabletKey(id)}`
    const taken = storageReported.get(replica)
    if (taken !== undefined && sequence <= taken) return false
    storageReported.set(replica, sequence)
    return true
  })
  if (tablets.length === 0) return [state, []]
  const marks = new Set(state.storageFailed.get(input.server) ?? [])
  for (const id of tablets) {
    const key = Models.tabletKey(id)
    if (!input.failed) marks.delete(key)
    else if (state.tablets.get(key)?.replicas.includes(input.server) === true) marks.add(key)
  }
  const storageFailed = new Map(state.storageFailed)
  if (marks.size === 0) storageFailed.delete(input.server)
  else storageFailed.set(input.server, marks)
  const next: State = { ...state, storageFailed, storageReported }
  const c = changes(next)
  for (const id of tablets) {
    const t = c.tablets.get(Models.tabletKey(id))
    if (t === undefined || !t.replicas.includes(input.server) || t.state === "DeletingTablet") continue
    if (!input.failed) {
      // A replica takes a role only under a new leader epoch: the tablet's leader leads on under the next one, and
      // every replica (this one too) hears it.
      const leader = t.leaderAndIsr.leader
      if (t.state === "OfflineTablet" || leader === null) reelect(next, c, t, undefined)
      else lead(next, c, t, { _tag: "Leader", leader, isr: t.leaderAndIsr.isr, unclean: false })
      continue
    }
    if (t.leaderAndIsr.leader === input.server) reelect(next, c, t, input.server)
    else if (t.state !== "OfflineTablet") dropFromIsr(next, c, t, (s) => s === input.server)
  }
  c.after.push({
    _tag: "Log",
    level: input.failed ? "warn" : "info",
    message: `server ${input.server}: the storage of ${tablets.map(Models.tabletKey).join(", ")} ${input.failed ? "failed: offline there" : "works again"}`
  })
  return finish(next, c)
}

/**
 * The machine as the shell runs it: production's {@link step}; the simulators run mutants of it.
 *
 * @since 0.1.0
 */
export type StepFunction = (state: State, input: Input) => Step

/**
 * One step of the controller. Pure: every decision is here, the shell only runs the commands.
 *
 * @since 0.1.0
 */
export const step: StepFunction = (state, input) => {
  if (state.resigned) return [state, []]
  switch (input._tag) {
    case "Started":
      return start(state, input)
    case "ServerUp":
      return serverUp(state, input)
    case "ServerDown":
      return serverDown(state, input)
    case "ReplicaStorage":
      return replicaStorage(state, input)
    case "CreateTablets":
      return createTablets(state, input)
    case "AdjustIsr":
      return adjustIsr(state, input)
    case "ControlledShutdown":
      return controlledShutdown(state, input)
    case "LogEnd":
      return answered(state, input)
    case "DeleteTablets":
      return deleteTablets(state, input)
    case "ReplicaStopped":
      return replicaStopped(state, input)
    case "BalanceLeaders":
      return balanceLeadersStep(state, input)
    case "Holdings":
      return holdings(state, input)
    case "WriteFailed":
      return writeFailed(state, input)
    case "Reassign":
      return reassign(state, input)
    case "CancelReassign":
      return cancelReassign(state, input)
  }
}

/**
 * The controller starts: its machine takes the live servers and the tablets, re-elects where a leader is gone or
 * registered again, drops gone members, and asks every live server what it holds.
 */
const start = (state: State, input: Extract<Input, { readonly _tag: "Started" }>): Step => {
  const started: State = {
    ...state,
    coordinatorEpoch: input.coordinatorEpoch,
    live: new Set(input.live),
    registrations: new Map(input.registrations ?? []),
    storageFailed: new Map(),
    storageReported: new Map(),
    shuttingDown: new Set(),
    tablets: new Map(input.tablets.map((t) => [Models.tabletKey(t.tablet), t])),
    elections: new Map()
  }
  const c = changes(started)
  for (const t of started.tablets.values()) {
    if (t.state === "DeletingTablet") continue
    const leader = t.leaderAndIsr.leader
    // A leader registered again since it was elected (restarted while no controller ran) is not the leader
    // it was: another ISR member takes over when there is one.
    const renewed = leader !== null && started.live.has(leader) && newLife(started, t, leader)
    if (renewed) reelect(started, c, t, undefined)
    else if (leader === null || !started.live.has(leader)) reelect(started, c, t, leader ?? undefined)
    else dropFromIsr(started, c, t, (s) => !started.live.has(s) || newLife(started, t, s))
  }
  // Every live server hears what changed here; what it holds of the rest it is asked, and told only where it falls
  // behind (a previous controller's instruction that never reached it).
  for (const server of started.live) c.after.push(askHoldings(started, server), ...stopReplicas(started, server))
  c.after.push({
    _tag: "Log",
    level: "info",
    message: `controller started with coordinator epoch ${input.coordinatorEpoch}: ${started.tablets.size} tablets, ${started.live.size} live servers`
  })
  return finish(started, c)
}

/**
 * A server registered (again): its storage is judged anew, offline tablets it holds elect, a new life leaves the ISRs
 * it was in, and it hears every tablet it holds.
 */
const serverUp = (state: State, input: Extract<Input, { readonly _tag: "ServerUp" }>): Step => {
  if (state.live.has(input.server)) return [state, []]
  const registrations = new Map(state.registrations)
  if (input.registration !== undefined) registrations.set(input.server, input.registration)
  // A new life of the server: its storage is judged again (it reports what still fails).
  const storageFailed = new Map(state.storageFailed)
  storageFailed.delete(input.server)
  const storageReported = new Map(
    [...state.storageReported].filter(([replica]) => !replica.startsWith(`${input.server} `))
  )
  const up: State = {
    ...state,
    live: new Set([...state.live, input.server]),
    registrations,
    storageFailed,
    storageReported
  }
  const c = changes(up)
  const unchanged: Array<Tablet> = []
  for (const t of up.tablets.values()) {
    if (!t.replicas.includes(input.server) || t.state === "DeletingTablet") continue
    if (t.state === "OfflineTablet") reelect(up, c, t, undefined)
    else if (t.leaderAndIsr.leader !== input.server && newLife(up, t, input.server)) {
      dropFromIsr(up, c, t, (s) => s === input.server)
    }
    if (c.tablets.get(Models.tabletKey(t.tablet)) === t) unchanged.push(t)
  }
  // Every live replica hears what changed; the returning server also hears every other tablet it holds, and
  // deletes its replicas of the tablets being deleted.
  return finish(up, c, [...sends(up, unchanged, input.server), ...stopReplicas(up, input.server)])
}

/** A server left: its leaderships move, it leaves the ISRs, and an election asking it stops waiting for it. */
const serverDown = (state: State, input: Extract<Input, { readonly _tag: "ServerDown" }>): Step => {
  if (!state.live.has(input.server)) return [state, []]
  const live = new Set(state.live)
  live.delete(input.server)
  const shuttingDown = new Set(state.shuttingDown)
  shuttingDown.delete(input.server)
  const down: State = { ...state, live, shuttingDown }
  const c = changes(down)
  moveOff(down, c, input.server, false)
  candidateGone(down, c, input.server)
  return finish(down, c)
}

/**
 * Creates tablets (each led by its first live replica, keeping the retention it is given when that names a limit),
 * unless the request is refused whole.
 */
const createTablets = (state: State, input: Extract<Input, { readonly _tag: "CreateTablets" }>): Step => {
  const refused = refuseCreate(state, input.tablets)
  if (refused !== undefined) {
    const reply: Reply = { _tag: "CreateRefused", detail: refused }
    return [state, [{ _tag: "Reply", requestId: input.requestId, reply }]]
  }
  const c = changes(state)
  const created: Array<Tablet> = []
  for (const spec of input.tablets) {
    if (c.tablets.has(Models.tabletKey(spec.tablet))) continue
    const live = spec.replicas.filter((r) => electable(state, r))
    const leader = live[0] ?? null
    const retention = retentionOf(spec.retention)
    created.push(
      put(state, c, undefined, {
        tablet: spec.tablet,
        replicas: spec.replicas,
        state: leader === null ? "OfflineTablet" : "OnlineTablet",
        leaderAndIsr: {
          leader,
          leaderEpoch: 0,
          isr: leader === null ? [...spec.replicas] : live,
          coordinatorEpoch: state.coordinatorEpoch,
          version: 0
        },
        ...(retention === undefined ? {} : { retention })
      })
    )
  }
  c.after.push({ _tag: "Reply", requestId: input.requestId, reply: { _tag: "Created", tablets: created } })
  return finish(state, c)
}

/** A retention with only the limits it names (`undefined`: it names none, and everything is kept). */
const retentionOf = (r: ReplicaManager.Retention | undefined): ReplicaManager.Retention | undefined => {
  if (r === undefined || (r.ms === undefined && r.bytes === undefined)) return undefined
  return { ...(r.ms === undefined ? {} : { ms: r.ms }), ...(r.bytes === undefined ? {} : { bytes: r.bytes }) }
}

/** A leader's ISR change: committed, answered again when it repeats a committed one, or rejected. */
const adjustIsr = (state: State, input: Extract<Input, { readonly _tag: "AdjustIsr" }>): Step => {
  const t = state.tablets.get(Models.tabletKey(input.tablet))
  // A retry of a change already committed (its answer was lost): answer it again, write nothing.
  if (t !== undefined && isRepeat(input, t.leaderAndIsr)) {
    const reply: Reply = { _tag: "IsrAdjusted", leaderAndIsr: t.leaderAndIsr }
    return [state, [{ _tag: "Reply", requestId: input.requestId, reply }]]
  }
  const rejection = validateIsr(state, input, t)
  if (rejection !== undefined || t === undefined) {
    const reply: Reply = { _tag: "IsrRejected", rejection: rejection ?? { _tag: "UnknownTablet" } }
    return [state, [{ _tag: "Reply", requestId: input.requestId, reply }]]
  }
  const c = changes(state)
  // The leader learns from the reply; the followers need not hear of it.
  const stored = put(state, c, t, { ...t, leaderAndIsr: { ...t.leaderAndIsr, isr: input.isr } }, { notify: false })
  c.after.push({
    _tag: "Reply",
    requestId: input.requestId,
    reply: { _tag: "IsrAdjusted", leaderAndIsr: stored.leaderAndIsr }
  })
  return finish(state, c)
}

/** A server is stopping: its leaderships move off it; the reply says how many it still leads. */
const controlledShutdown = (state: State, input: Extract<Input, { readonly _tag: "ControlledShutdown" }>): Step => {
  if (!state.live.has(input.server)) {
    const reply: Reply = { _tag: "ShutdownProgress", remainingLeaders: 0 }
    return [state, [{ _tag: "Reply", requestId: input.requestId, reply }]]
  }
  const stopping: State = { ...state, shuttingDown: new Set([...state.shuttingDown, input.server]) }
  const c = changes(stopping)
  moveOff(stopping, c, input.server, true)
  c.after.push({
    _tag: "Reply",
    requestId: input.requestId,
    reply: { _tag: "ShutdownProgress", remainingLeaders: remainingLeaders(c.tablets, input.server) }
  })
  return finish(stopping, c)
}

/** Deletes tablets: they lead no more, and every live replica is told to delete itself. */
const deleteTablets = (state: State, input: Extract<Input, { readonly _tag: "DeleteTablets" }>): Step => {
  const c = changes(state)
  let deleting = 0
  for (const id of input.tablets) {
    const t = c.tablets.get(Models.tabletKey(id))
    if (t === undefined) continue
    deleting++
    if (t.state === "DeletingTablet") continue
    c.elections.delete(Models.tabletKey(id))
    put(
      state,
      c,
      t,
      {
        ...t,
        // A move ends: every replica it added or was to remove, and every one it retired, deletes itself too.
        replicas: [...t.replicas, ...(t.retired ?? []).filter((s) => !t.replicas.includes(s))],
        reassignment: undefined,
        retired: undefined,
        state: "DeletingTablet",
        deleted: [],
        // Its leader, if it had one, leads no more: the epoch moves on, as when it goes offline.
        leaderAndIsr: {
          ...t.leaderAndIsr,
          leader: null,
          leaderEpoch: t.leaderAndIsr.leaderEpoch + (t.leaderAndIsr.leader === null ? 0 : 1)
        }
      },
      { notify: false }
    )
  }
  const next = finish(state, c)
  const stops = [...next[0].live].flatMap((server) => stopReplicas(next[0], server))
  const reply: Reply = { _tag: "Deleting", tablets: deleting }
  return [next[0], [...next[1], ...stops, { _tag: "Reply", requestId: input.requestId, reply }]]
}

/**
 * A server deleted its replicas: a move's retired replica is off the tablet's list; a deleting tablet every replica of
 * which is deleted goes.
 */
const replicaStopped = (state: State, input: Extract<Input, { readonly _tag: "ReplicaStopped" }>): Step => {
  if (!state.live.has(input.server) || input.registration !== state.registrations.get(input.server)) {
    return [state, []]
  }
  // A deleted replica's storage failure goes with it: a replica the server is given again is judged afresh.
  const marks = new Set(state.storageFailed.get(input.server) ?? [])
  for (const id of input.tablets) {
    const t = state.tablets.get(Models.tabletKey(id))
    if (t !== undefined && toDelete(t, input.server)) marks.delete(Models.tabletKey(id))
  }
  const storageFailed = new Map(state.storageFailed)
  if (marks.size === 0) storageFailed.delete(input.server)
  else storageFailed.set(input.server, marks)
  return stopped({ ...state, storageFailed }, input)
}

/** The retired and deleting replicas `input` says are deleted, recorded. */
const stopped = (state: State, input: Extract<Input, { readonly _tag: "ReplicaStopped" }>): Step => {
  const c = changes(state)
  for (const id of input.tablets) {
    const t = c.tablets.get(Models.tabletKey(id))
    if (t !== undefined && t.state !== "DeletingTablet" && (t.retired ?? []).includes(input.server)) {
      const retired = (t.retired ?? []).filter((s) => s !== input.server)
      put(state, c, t, { ...t, retired: retired.length === 0 ? undefined : retired }, { notify: false })
      continue
    }
    if (t?.state !== "DeletingTablet" || !t.replicas.includes(input.server)) continue
    if (t.deleted?.includes(input.server)) continue
    const deleted = [...(t.deleted ?? []), input.server]
    if (t.replicas.every((r) => deleted.includes(r))) {
      c.tablets.delete(Models.tabletKey(id))
      c.removes.push({ _tag: "Remove", tablet: id, expectedVersion: t.leaderAndIsr.version })
      c.after.push({ _tag: "Log", level: "info", message: `${Models.tabletKey(id)}: deleted` })
    } else put(state, c, t, { ...t, deleted }, { notify: false })
  }
  return finish(state, c)
}

/** Moves leaderships back to preferred replicas: the named tablets' whatever the imbalance, else every server's above it. */
const balanceLeadersStep = (state: State, input: Extract<Input, { readonly _tag: "BalanceLeaders" }>): Step => {
  const c = changes(state)
  const moved = input.tablets === undefined ? balanceLeaders(state, c) : electPreferred(state, c, input.tablets)
  if (moved > 0)
    c.after.push({ _tag: "Log", level: "info", message: `${moved} tablets led by their preferred replica again` })
  if (input.requestId !== undefined) {
    c.after.push({ _tag: "Reply", requestId: input.requestId, reply: { _tag: "LeadersBalanced", moved } })
  }
  return finish(state, c)
}

/**
 * A server's answer to what it holds: it is told every tablet where it falls behind (everything without an answer).
 */
const holdings = (state: State, input: Extract<Input, { readonly _tag: "Holdings" }>): Step => {
  const registration = state.registrations.get(input.server)
  if (!state.live.has(input.server) || input.registration !== registration) return [state, []]
  const held = input.holdings === null ? null : new Map(input.holdings.map((h) => [Models.tabletKey(h.tablet), h]))
  const behind = [...state.tablets.values()].filter(
    (t) =>
      t.replicas.includes(input.server) &&
      t.state !== "DeletingTablet" &&
      (held === null || fallsBehind(t, input.server, held))
  )
  return [state, sends(state, behind, input.server)]
}

/** WriteFailed */
const writeFailed = (state: State, input: Extract<Input, { readonly _tag: "WriteFailed" }>): Step => {
  return [
    { ...state, resigned: true },
    [{ _tag: "Resign", reason: `writing ${Models.tabletKey(input.tablet)} failed: ${input.detail}` }]
  ]
}

/** Whether the controller knows `server`: registered now or before, or holding some tablet's replica. */
const knownServer = (state: State, server: Models.ServerId) =>
  state.live.has(server) ||
  state.registrations.has(server) ||
  [...state.tablets.values()].some((t) => t.replicas.includes(server) || (t.retired ?? []).includes(server))

/** A move request refused: the state unchanged, the reply naming why. */
const refuse = (
  state: State,
  input: { readonly requestId: number; readonly tablet: Models.TabletId },
  refusal: Reassignment.Refusal
): Step => [
  state,
  [
    {
      _tag: "Reply",
      requestId: input.requestId,
      reply: {
        _tag: "ReassignRefused",
        refusal,
        detail: Reassignment.describeRefusal(Models.tabletKey(input.tablet), refusal)
      }
    }
  ]
]

/**
 * A tablet's replicas and ISR changed under the next leader epoch, led by `leader` (its leader unless it moves); every
 * replica of the new set hears it, and each server that is out of it and live is told to delete its replica.
 */
const reshape = (
  state: State,
  c: Changes,
  t: Tablet,
  next: Pick<Tablet, "replicas" | "reassignment" | "retired">,
  leader: Models.ServerId,
  isr: ReadonlyArray<Models.ServerId>
) => {
  // One epoch past the step's start: a leader elected earlier in the step takes the new replicas in the same write.
  const leaderEpoch = Math.max(
    t.leaderAndIsr.leaderEpoch,
    (state.tablets.get(Models.tabletKey(t.tablet)) ?? t).leaderAndIsr.leaderEpoch + 1
  )
  const stored = put(
    state,
    c,
    t,
    { ...t, ...next, leaderAndIsr: { ...t.leaderAndIsr, leader, leaderEpoch, isr } },
    { confirmed: leader === t.leaderAndIsr.leader ? [] : [leader] }
  )
  for (const server of stored.retired ?? []) c.after.push(...stopReplicas(state, server, [stored]))
  return stored
}

/**
 * Starts moving a tablet's replicas to `target`: the adding replicas join as followers under the next leader epoch
 * (the move finishes at once when none is added), fetching under the request's replication throttle if it names one.
 * A repeat is answered with the tablet as it is; a repeat naming another throttle (or none) than the move's makes it
 * the move's throttle, written and told to the replicas without a new leader epoch.
 */
const reassign = (state: State, input: Extract<Input, { readonly _tag: "Reassign" }>): Step => {
  const key = Models.tabletKey(input.tablet)
  const t = state.tablets.get(key)
  const refused = (refusal: Reassignment.Refusal) => refuse(state, input, refusal)
  const throttle = input.throttleBytesPerSec
  if (!Reassignment.validThrottle(throttle)) {
    return refused({ _tag: "InvalidThrottle", throttleBytesPerSec: throttle ?? 0 })
  }
  if (t === undefined) return refused({ _tag: "UnknownTablet" })
  if (t.state === "DeletingTablet") return refused({ _tag: "TabletDeleting" })
  const moving = t.reassignment
  const accepted = (tablet: Tablet): Step => [
    state,
    [{ _tag: "Reply", requestId: input.requestId, reply: { _tag: "Reassigning", tablet } }]
  ]
  if (moving !== undefined) {
    if (!Reassignment.sameReplicas(moving.target, input.target)) {
      return refused({ _tag: "AlreadyMoving", target: moving.target })
    }
    return moving.throttleBytesPerSec === throttle ? accepted(t) : rethrottle(state, input, t, moving)
  }
  if (Reassignment.sameReplicas(t.replicas, input.target)) return accepted(t)
  const refusal = Reassignment.refuseTarget(
    {
      live: state.live,
      known: (s) => knownServer(state, s),
      shuttingDown: state.shuttingDown,
      minInsyncReplicas: state.options.minInsyncReplicas ?? 1
    },
    input.target,
    t.retired ?? []
  )
  if (refusal !== undefined) return refused(refusal)
  const leader = t.leaderAndIsr.leader
  if (t.state !== "OnlineTablet" || leader === null) return refused({ _tag: "TabletOffline" })
  if (state.elections.has(key)) return refused({ _tag: "ElectionPending" })
  const c = changes(state)
  const reassignment: Reassignment.Reassignment = {
    original: t.replicas,
    target: input.target,
    ...(throttle === undefined ? {} : { throttleBytesPerSec: throttle })
  }
  reshape(
    state,
    c,
    t,
    { replicas: Reassignment.replicasDuring(reassignment), reassignment, retired: t.retired },
    leader,
    t.leaderAndIsr.isr
  )
  c.after.push({
    _tag: "Log",
    level: "info",
    message: `${key}: moving from [${t.replicas.join(",")}] to [${input.target.join(",")}]${throttle === undefined ? "" : `, the new replicas copying at most ${throttle} bytes/s`}`
  })
  const step = finish(state, c)
  const now = step[0].tablets.get(key) ?? t
  return [
    step[0],
    [...step[1], { _tag: "Reply", requestId: input.requestId, reply: { _tag: "Reassigning", tablet: now } }]
  ]
}

/**
 * A move under way takes the repeat's throttle (`undefined`: none): written under the same leader epoch, and told to
 * every live replica (the adding ones apply it to their fetches).
 */
const rethrottle = (
  state: State,
  input: Extract<Input, { readonly _tag: "Reassign" }>,
  t: Tablet,
  moving: Reassignment.Reassignment
): Step => {
  const throttle = input.throttleBytesPerSec
  const c = changes(state)
  const { throttleBytesPerSec: _, ...rest } = moving
  const reassignment: Reassignment.Reassignment =
    throttle === undefined ? rest : { ...rest, throttleBytesPerSec: throttle }
  const stored = put(state, c, t, { ...t, reassignment })
  c.after.push({
    _tag: "Log",
    level: "info",
    message: `${Models.tabletKey(t.tablet)}: the move to [${moving.target.join(",")}] copies ${throttle === undefined ? "unthrottled" : `at most ${throttle} bytes/s`}`
  })
  const [next, commands] = finish(state, c)
  const now = next.tablets.get(Models.tabletKey(t.tablet)) ?? stored
  return [
    next,
    [...commands, { _tag: "Reply", requestId: input.requestId, reply: { _tag: "Reassigning", tablet: now } }]
  ]
}

/**
 * A move's last step, once every target replica is in the ISR of the online tablet: the target becomes its replicas
 * and the ISR the target's members, under the next leader epoch, led by its leader if it stays and else by the first
 * target replica in the ISR that can lead (it holds every acknowledged record); the leaving replicas are retired and
 * told to delete themselves. Waits (nothing written) while that is not so.
 */
const advance = (state: State, c: Changes, t: Tablet) => {
  const r = t.reassignment
  const leader = t.leaderAndIsr.leader
  if (r === undefined || t.state !== "OnlineTablet" || leader === null) return
  if (c.elections.has(Models.tabletKey(t.tablet))) return
  const isr = t.leaderAndIsr.isr
  if (!r.target.every((s) => isr.includes(s))) return
  const next = r.target.includes(leader)
    ? leader
    : r.target.find((s) => isr.includes(s) && usable(state, t, s) && !newLife(state, t, s))
  if (next === undefined) return
  const leaving = Reassignment.removing(r)
  reshape(
    state,
    c,
    t,
    {
      replicas: r.target,
      reassignment: undefined,
      retired: union(t.retired ?? [], leaving)
    },
    next,
    isr.filter((s) => r.target.includes(s))
  )
  c.after.push({
    _tag: "Log",
    level: "info",
    message: `${Models.tabletKey(t.tablet)}: moved to [${r.target.join(",")}], led by server ${next}${leaving.length === 0 ? "" : `; [${leaving.join(",")}] delete their replicas`}`
  })
}

/**
 * Ends a tablet's move, back on its original replicas under the next leader epoch: the adding replicas leave the ISR
 * and are retired; leadership moves back to the first original replica in the ISR when an adding one leads. Refused
 * when no original replica is in sync to lead (the move must finish: the others may lack acknowledged records), or
 * while the tablet is offline or electing.
 */
const cancelReassign = (state: State, input: Extract<Input, { readonly _tag: "CancelReassign" }>): Step => {
  const key = Models.tabletKey(input.tablet)
  const t = state.tablets.get(key)
  const refused = (refusal: Reassignment.Refusal) => refuse(state, input, refusal)
  if (t === undefined) return refused({ _tag: "UnknownTablet" })
  const r = t.reassignment
  if (r === undefined) return refused({ _tag: "NotMoving" })
  const current = t.leaderAndIsr.leader
  if (t.state !== "OnlineTablet" || current === null) return refused({ _tag: "TabletOffline" })
  if (state.elections.has(key)) return refused({ _tag: "ElectionPending" })
  const isr = t.leaderAndIsr.isr.filter((s) => r.original.includes(s))
  const leader = r.original.includes(current)
    ? current
    : r.original.find((s) => isr.includes(s) && usable(state, t, s) && !newLife(state, t, s))
  if (leader === undefined) return refused({ _tag: "NoOriginalInSync" })
  const added = Reassignment.adding(r)
  // An adding replica in the ISR holds every acknowledged record: it may be dropped only if the original replicas
  // in sync are still at least minInsyncReplicas (a copy for each the acknowledgement counted on).
  const minIsr = state.options.minInsyncReplicas ?? 1
  if (t.leaderAndIsr.isr.some((s) => added.includes(s)) && isr.length < minIsr)
    return refused({ _tag: "OriginalUnderMinIsr", inSync: isr, minInsyncReplicas: minIsr })
  const c = changes(state)
  const stored = reshape(
    state,
    c,
    t,
    { replicas: r.original, reassignment: undefined, retired: union(t.retired ?? [], added) },
    leader,
    isr
  )
  c.after.push(
    {
      _tag: "Log",
      level: "info",
      message: `${key}: move to [${r.target.join(",")}] cancelled, back on [${r.original.join(",")}] led by server ${leader}`
    },
    { _tag: "Reply", requestId: input.requestId, reply: { _tag: "ReassignCancelled", tablet: stored } }
  )
  return finish(state, c)
}

/** `a` and then the members of `b` it lacks. */
const union = (a: ReadonlyArray<Models.ServerId>, b: ReadonlyArray<Models.ServerId>) => [
  ...a,
  ...b.filter((s) => !a.includes(s))
]
