/**
 * The worker's decisions as a pure machine: `step(state, event)` returns the next state and the commands the
 * worker's shell (`Worker.make`) runs, in order. No Effect services, no clock: time comes in on events (`Started`,
 * `Tick`, and a commit's report), and the commit timer is a command (`SetTimer`).
 *
 * The shell feeds one inbox, drained by one fiber: the group's assignments and revocations, restored partitions
 * (`Ready`), each lane's progress (`Processed`, one per batch), timer ticks, commit requests and the close. A command
 * that reports back (`Drain`, `Commit`, `ReadPositions`, `StartLane` and `ReadMembership`, and any command that
 * fails, as `Failed`) ends its step, and its report is stepped before the next inbox event: so an assignment, a
 * revocation, a commit, a rewind or the close runs to its end before anything else is decided.
 *
 * Per assigned partition: assigned → its tables restoring (`AwaitReady`) → `Ready` → positions read → a lane
 * started at `max(tables' resume offset, group's committed offset or the log start)`. A revocation drains the lost
 * partitions' lanes (their fetched batches dropped), commits what they processed (with exactly once, every
 * partition: one transaction holds them all) and hands them back to the tables. A commit whose table write was
 * refused (`CommitFailed`) rewinds: every lane drained, the tables restored again, every partition not being
 * revoked restarted from what the tables hold. The close drains every lane and commits once more.
 *
 * Each started partition's lag (records from its next offset to its highwater) is set when it starts and after each
 * batch; its series is removed when it is revoked or the worker closes.
 *
 * @internal
 */
import { type Log, Models } from "@strata/core"
import { place } from "./standbys.js"

/** An error as the machine reads it: its tag and, for errors with one, its reason's tag. */
export interface Failure {
  readonly _tag: string
  readonly message: string
  readonly reason?: { readonly _tag: string } | undefined
}

/** The machine's settings. */
export interface Options {
  readonly commitIntervalMs: number
  readonly standbyReplicas: number
  readonly exactlyOnce: boolean
}

/** One assigned source partition. */
export interface Partition {
  readonly tp: Models.TopicPartition
  /** Restored and positioned: its records are processed, and its offsets committed. */
  readonly ready: boolean
  /** The lane processing it (0: none). */
  readonly lane: number
  /** The restore wait in flight (0: none): a `Ready` naming another one is stale. */
  readonly wait: number
  /** Being revoked: never started again. */
  readonly revoking: boolean
  /** Next offset to process, as its lane last reported. */
  readonly next: number
  /** The offset committed last (only what moved is committed). */
  readonly committed: number
}

/** The worker's state. */
export interface State {
  readonly options: Options
  /** Assigned partitions, by `tpKey`. */
  readonly partitions: ReadonlyMap<string, Partition>
  /** The source partitions held here as standbys (never an assigned one), by `tpKey`. */
  readonly standbys: ReadonlyMap<string, Models.TopicPartition>
  /** The last lane or wait id handed out. */
  readonly lastId: number
  /** When the timer commits next (ms). */
  readonly nextCommitAt: number
  /** Set by `Close`: nothing is assigned, started or committed after, but the close's own commit. */
  readonly closed: boolean
  readonly recordsProcessed: number
  readonly commits: number
  /** Duration of the last commit (ms). */
  readonly lastCommitMs: number
  readonly rewinds: number
}

/** Why a commit is made (the timer, a request, a revocation, the close): it says what follows its report. */
export type CommitPurpose =
  | { readonly _tag: "Timer" }
  | { readonly _tag: "Request"; readonly request: number }
  | { readonly _tag: "Revoke"; readonly tps: ReadonlyArray<Models.TopicPartition> }
  | { readonly _tag: "Close" }

/**
 * Why lanes are drained: before a revocation's or the close's commit, or for a rewind (`failed`: what the commit that
 * failed was for, which goes on once the rewind started).
 */
export type DrainPurpose =
  | Extract<CommitPurpose, { readonly _tag: "Revoke" | "Close" }>
  | { readonly _tag: "Rewind"; readonly failed: CommitPurpose }

/** Where a drained lane stopped. */
export interface DrainedLane {
  readonly tp: Models.TopicPartition
  readonly lane: number
  readonly next: number
}

/**
 * What the machine is fed.
 *
 * - From the inbox: `Started`, `Assigned` / `Revoked` (the group's events), `Ready` / `ReadyFailed` (a restore wait
 *   ended), `Processed` / `LaneFailed` (a lane's batch), `Tick` (the timer), `CommitRequested`, `Close`, `Settled`
 *   (the close's barrier), `Failed` (a stream of the group failed).
 * - As reports of the step's last command: `Drained`, `Positions`, `StartFailed`, `Committed` / `CommitFailed`,
 *   `Membership` / `MembershipFailed`, `Failed`.
 */
export type Event<E extends Failure> =
  | { readonly _tag: "Started"; readonly now: number }
  | { readonly _tag: "Assigned"; readonly tps: ReadonlyArray<Models.TopicPartition> }
  | { readonly _tag: "Revoked"; readonly tps: ReadonlyArray<Models.TopicPartition> }
  | { readonly _tag: "Ready"; readonly tp: Models.TopicPartition; readonly wait: number }
  | { readonly _tag: "ReadyFailed"; readonly tp: Models.TopicPartition; readonly wait: number; readonly error: E }
  | {
      readonly _tag: "Positions"
      readonly tp: Models.TopicPartition
      readonly wait: number
      /** Where the tables say to resume (none: they hold nothing of it). */
      readonly resume: number | undefined
      /** The group's committed offset, if any. */
      readonly committed: number | undefined
      /** The partition's log start, if known. */
      readonly logStart: number | undefined
      /** The partition's highwater, if known: its lag is set from it. */
      readonly highwater: number | undefined
    }
  | { readonly _tag: "StartFailed"; readonly tp: Models.TopicPartition; readonly error: E }
  | {
      readonly _tag: "Processed"
      readonly tp: Models.TopicPartition
      readonly lane: number
      readonly next: number
      readonly records: number
      /** The partition's highwater when the batch was fetched. */
      readonly highwater: number
    }
  | { readonly _tag: "LaneFailed"; readonly tp: Models.TopicPartition; readonly lane: number; readonly error: E }
  | { readonly _tag: "Drained"; readonly lanes: ReadonlyArray<DrainedLane>; readonly purpose: DrainPurpose }
  | { readonly _tag: "Tick"; readonly now: number }
  | { readonly _tag: "CommitRequested"; readonly request: number }
  | {
      readonly _tag: "Committed"
      readonly offsets: ReadonlyArray<Models.TopicPartitionOffset>
      readonly startedAt: number
      readonly at: number
      readonly purpose: CommitPurpose
    }
  | { readonly _tag: "CommitFailed"; readonly error: E; readonly at: number; readonly purpose: CommitPurpose }
  | { readonly _tag: "Membership"; readonly membership: Log.GroupMembership }
  | { readonly _tag: "MembershipFailed"; readonly error: E }
  | { readonly _tag: "Failed"; readonly error: E }
  | { readonly _tag: "Close" }
  | { readonly _tag: "Settled" }

/** How a commit request ends. */
export type Outcome<E extends Failure> =
  | { readonly _tag: "Done" }
  | { readonly _tag: "Closed" }
  | { readonly _tag: "Failed"; readonly error: E }

/**
 * What the shell runs.
 *
 * - `Pause`: pauses partitions in the group consumer. `AssignTables`: the tables take active partitions.
 * - `AwaitReady`: waits (in the background) for a partition's tables, then feeds `Ready` or `ReadyFailed`;
 *   `CancelWaits` drops waits.
 * - `ReadPositions`: reads where the tables say to resume, the group's committed offset, the log start and the
 *   highwater (`Positions`). `StartLane`: seeks the partition, starts a lane processing its batches from `from`, resumes it.
 * - `Drain`: ends lanes (`discard`: their queued batches dropped first) and waits for them (`Drained`).
 * - `Commit`: commits through the tables (`Committed` or `CommitFailed`). `RewindTables`: the tables rewind.
 * - `RevokeTables`: the tables let partitions go. `AssignStandbys`: the tables take standby partitions.
 *   `ReadMembership`: reads the group's membership (`Membership`).
 * - `SetTimer`: the next `Tick` comes after `delayMs` (replacing the pending one).
 * - `Reply`: ends a commit request. `Settle`: feeds `Settled` behind the events already in the inbox.
 *   `Closed`: the close is done. `Fail`: the worker failed (its `join` fails).
 * - `Log`. `Metric`: a commit's duration observed (seconds), a rewind counted, or a partition's lag set (records
 *   from its next offset to its highwater). `RemoveMetric`: the lag series of partitions no longer held removed.
 */
export type Command<E extends Failure> =
  | { readonly _tag: "Pause"; readonly tps: ReadonlyArray<Models.TopicPartition> }
  | { readonly _tag: "AssignTables"; readonly tps: ReadonlyArray<Models.TopicPartition> }
  | { readonly _tag: "AwaitReady"; readonly tp: Models.TopicPartition; readonly wait: number }
  | { readonly _tag: "CancelWaits"; readonly tps: ReadonlyArray<Models.TopicPartition> }
  | { readonly _tag: "ReadPositions"; readonly tp: Models.TopicPartition; readonly wait: number }
  | { readonly _tag: "StartLane"; readonly tp: Models.TopicPartition; readonly lane: number; readonly from: number }
  | {
      readonly _tag: "Drain"
      readonly tps: ReadonlyArray<Models.TopicPartition>
      readonly discard: boolean
      readonly purpose: DrainPurpose
    }
  | {
      readonly _tag: "Commit"
      readonly offsets: ReadonlyArray<Models.TopicPartitionOffset>
      readonly purpose: CommitPurpose
    }
  | { readonly _tag: "RewindTables" }
  | { readonly _tag: "RevokeTables"; readonly tps: ReadonlyArray<Models.TopicPartition> }
  | { readonly _tag: "AssignStandbys"; readonly tps: ReadonlyArray<Models.TopicPartition> }
  | { readonly _tag: "ReadMembership" }
  | { readonly _tag: "SetTimer"; readonly delayMs: number }
  | { readonly _tag: "Reply"; readonly request: number; readonly outcome: Outcome<E> }
  | { readonly _tag: "Settle" }
  | { readonly _tag: "Closed" }
  | { readonly _tag: "Fail"; readonly error: E }
  | { readonly _tag: "Log"; readonly level: "debug" | "info" | "warn"; readonly message: string }
  | { readonly _tag: "Metric"; readonly metric: "commitDuration" | "rewinds"; readonly value: number }
  | { readonly _tag: "Metric"; readonly metric: "lag"; readonly tp: Models.TopicPartition; readonly value: number }
  | { readonly _tag: "RemoveMetric"; readonly metric: "lag"; readonly tps: ReadonlyArray<Models.TopicPartition> }

/** One step's outcome: the next state and the commands to run. */
export type Step<E extends Failure> = readonly [State, ReadonlyArray<Command<E>>]

/** The state of a worker that has nothing assigned yet. */
export const make = (options: Options): State => ({
  options,
  partitions: new Map(),
  standbys: new Map(),
  lastId: 0,
  nextCommitAt: 0,
  closed: false,
  recordsProcessed: 0,
  commits: 0,
  lastCommitMs: 0,
  rewinds: 0
})

/** Steps the machine with one event. */
export const step = <E extends Failure>(s: State, event: Event<E>): Step<E> => {
  switch (event._tag) {
    case "Processed":
      return processed(s, event)
    case "Started":
      return [{ ...s, nextCommitAt: event.now + s.options.commitIntervalMs }, [timer(s.options.commitIntervalMs)]]
    case "Assigned":
      return s.closed ? [s, []] : assigned(s, event.tps)
    case "Revoked":
      return s.closed ? [s, []] : revoked(s, event.tps)
    case "Ready":
      return ready(s, event.tp, event.wait)
    case "ReadyFailed":
      return readyFailed(s, event)
    case "Positions":
      return positioned(s, event)
    case "StartFailed":
      return startFailed(s, event.tp, event.error)
    case "LaneFailed":
    case "Failed":
      return [s, [{ _tag: "Fail", error: event.error }]]
    case "Drained":
      return drained(s, event.lanes, event.purpose)
    case "Tick":
      return tick(s, event.now)
    case "CommitRequested":
      return s.closed
        ? [s, [{ _tag: "Reply", request: event.request, outcome: { _tag: "Closed" } }]]
        : [s, [commitOf([...s.partitions.values()], { _tag: "Request", request: event.request })]]
    case "Committed":
      return committed(s, event)
    case "CommitFailed":
      return commitFailed(s, event.error, event.at, event.purpose)
    case "Membership":
      return s.closed ? [s, []] : placeStandbys(s, event.membership)
    case "MembershipFailed":
      return [s, [log("warn", `worker: reading the group's membership failed: ${event.error.message}`)]]
    case "Close":
      return close(s)
    case "Settled":
      return [s, [{ _tag: "Closed" }]]
  }
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const log = (level: "debug" | "info" | "warn", message: string) => ({ _tag: "Log", level, message }) as const

const timer = (delayMs: number) => ({ _tag: "SetTimer", delayMs }) as const

const name = (tp: Models.TopicPartition) => `${tp.topic}/${tp.partition}`

/** A partition's lag: the records from its next offset to its highwater. */
const lagOf = (tp: Models.TopicPartition, next: number, highwater: number) =>
  ({ _tag: "Metric", metric: "lag", tp, value: Math.max(0, highwater - next) }) as const

/** The lag series of partitions this worker holds no longer (nothing when there are none). */
const removeLag = <E extends Failure>(tps: ReadonlyArray<Models.TopicPartition>): ReadonlyArray<Command<E>> =>
  tps.length === 0 ? [] : [{ _tag: "RemoveMetric", metric: "lag", tps }]

/** `s` with some partitions replaced (or removed: `undefined`). */
const withPartitions = (s: State, changes: ReadonlyArray<readonly [string, Partition | undefined]>): State => {
  if (changes.length === 0) return s
  const partitions = new Map(s.partitions)
  for (const [key, p] of changes) {
    if (p === undefined) partitions.delete(key)
    else partitions.set(key, p)
  }
  return { ...s, partitions }
}

/** Reads the group's membership to place standbys again (nothing when none are kept). */
const membershipRead = <E extends Failure>(s: State): ReadonlyArray<Command<E>> =>
  s.options.standbyReplicas === 0 ? [] : [{ _tag: "ReadMembership" }]

/** A commit of what these partitions processed since their last commit (ready ones only). */
const commitOf = <E extends Failure>(list: ReadonlyArray<Partition>, purpose: CommitPurpose): Command<E> => {
  const offsets = list
    .filter((p) => p.ready && p.next > p.committed)
    .map((p) => ({ topic: p.tp.topic, partition: p.tp.partition, offset: p.next }))
  return { _tag: "Commit", offsets, purpose }
}

/** Whether a commit failed because a table write was refused (a rewind recovers from it). */
const isRefused = (e: Failure) => e._tag === "TableManagerError" && e.reason?._tag === "CommitFailed"

/** Whether the group no longer assigns the partition to this member. */
const isNotAssigned = (e: Failure) => e._tag === "LogError" && e.reason?._tag === "NotAssigned"

// ---------------------------------------------------------------------------
// Assignments
// ---------------------------------------------------------------------------

/** Partitions assigned: paused, handed to the tables, and started each once its tables are restored. */
const assigned = <E extends Failure>(s: State, tps: ReadonlyArray<Models.TopicPartition>): Step<E> => {
  let lastId = s.lastId
  const standbys = new Map(s.standbys)
  const waits: Array<Command<E>> = []
  const changes = tps.map((tp): readonly [string, Partition] => {
    const wait = ++lastId
    // A standby assigned active here is promoted by the tables' assign: it replays only its lag.
    standbys.delete(Models.tpKey(tp))
    waits.push({ _tag: "AwaitReady", tp, wait })
    return [Models.tpKey(tp), { tp, ready: false, lane: 0, wait, revoking: false, next: 0, committed: 0 }]
  })
  const next = { ...withPartitions(s, changes), lastId, standbys }
  return [next, [{ _tag: "Pause", tps }, { _tag: "AssignTables", tps }, ...waits, ...membershipRead<E>(next)]]
}

/** A partition's tables are restored: where to start is read next. */
const ready = <E extends Failure>(s: State, tp: Models.TopicPartition, wait: number): Step<E> => {
  const p = s.partitions.get(Models.tpKey(tp))
  if (s.closed || p === undefined || p.wait !== wait || p.revoking) return [s, []]
  return [s, [{ _tag: "ReadPositions", tp, wait }]]
}

const readyFailed = <E extends Failure>(
  s: State,
  event: { readonly tp: Models.TopicPartition; readonly wait: number; readonly error: E }
): Step<E> => {
  const p = s.partitions.get(Models.tpKey(event.tp))
  if (p === undefined || p.wait !== event.wait) return [s, []]
  return [withPartitions(s, [[Models.tpKey(event.tp), { ...p, wait: 0 }]]), [{ _tag: "Fail", error: event.error }]]
}

/**
 * Starts a restored partition where the tables or the group say, whichever is further (the group's offset is ahead
 * when the last records wrote nothing, and with exactly once when a crash came between the transaction and the
 * stores), else at the log start. Never at the consumer's position: batches fetched before the partition was ready
 * were dropped, so the position may be past records nobody processed.
 */
const positioned = <E extends Failure>(s: State, event: Extract<Event<E>, { readonly _tag: "Positions" }>): Step<E> => {
  const key = Models.tpKey(event.tp)
  const p = s.partitions.get(key)
  if (s.closed || p === undefined || p.wait !== event.wait || p.revoking) return [s, []]
  const base = event.committed ?? event.logStart ?? 0
  const from = event.resume === undefined ? base : Math.max(event.resume, base)
  const lane = s.lastId + 1
  const started: Partition = { ...p, wait: 0, ready: true, lane, next: from, committed: from }
  return [
    { ...withPartitions(s, [[key, started]]), lastId: lane },
    [
      log("info", `worker: ${name(p.tp)} starts at ${from} (tables ${event.resume ?? -1}, group ${base})`),
      { _tag: "StartLane", tp: p.tp, lane, from },
      ...(event.highwater === undefined ? [] : [lagOf(p.tp, from, event.highwater)])
    ]
  ]
}

/** Reading a partition's positions or seeking it failed: revoked meanwhile (left to its revocation), or a failure. */
const startFailed = <E extends Failure>(s: State, tp: Models.TopicPartition, error: E): Step<E> => {
  const key = Models.tpKey(tp)
  const p = s.partitions.get(key)
  const stopped = p === undefined ? s : withPartitions(s, [[key, { ...p, ready: false, lane: 0, wait: 0 }]])
  return isNotAssigned(error)
    ? [stopped, [log("debug", `worker: ${name(tp)} was revoked before it started`)]]
    : [stopped, [{ _tag: "Fail", error }]]
}

/**
 * Partitions revoked: their restore waits dropped, their lanes drained (batches fetched but not started are dropped:
 * the group has given the partitions to another member already); the commit follows the drain.
 */
const revoked = <E extends Failure>(s: State, tps: ReadonlyArray<Models.TopicPartition>): Step<E> => {
  const changes: Array<readonly [string, Partition]> = []
  const waiting: Array<Models.TopicPartition> = []
  for (const tp of tps) {
    const p = s.partitions.get(Models.tpKey(tp))
    if (p === undefined) continue
    if (p.wait !== 0) waiting.push(p.tp)
    changes.push([Models.tpKey(tp), { ...p, revoking: true, wait: 0 }])
  }
  const commands: Array<Command<E>> = []
  if (waiting.length > 0) commands.push({ _tag: "CancelWaits", tps: waiting })
  commands.push({ _tag: "Drain", tps: changes.map(([, p]) => p.tp), discard: true, purpose: { _tag: "Revoke", tps } })
  return [withPartitions(s, changes), commands]
}

/**
 * The revocation's end: the lost partitions go (their lag series too), the tables let them go, standbys are placed
 * again.
 */
const finishRevoke = <E extends Failure>(
  s: State,
  tps: ReadonlyArray<Models.TopicPartition>,
  before: ReadonlyArray<Command<E>>
): Step<E> => {
  const lost = tps.filter((tp) => s.partitions.get(Models.tpKey(tp))?.revoking === true)
  const next = withPartitions(
    s,
    lost.map((tp) => [Models.tpKey(tp), undefined] as const)
  )
  return [next, [...before, ...removeLag<E>(lost), { _tag: "RevokeTables", tps }, ...membershipRead<E>(next)]]
}

// ---------------------------------------------------------------------------
// Lanes, drains and commits
// ---------------------------------------------------------------------------

/**
 * A lane processed a batch: counted, its partition's next offset moves and its lag is set from the batch's highwater
 * (a drained lane's report only counts).
 */
const processed = <E extends Failure>(s: State, event: Extract<Event<E>, { readonly _tag: "Processed" }>): Step<E> => {
  const recordsProcessed = s.recordsProcessed + event.records
  const key = Models.tpKey(event.tp)
  const p = s.partitions.get(key)
  if (p === undefined || p.lane !== event.lane) return [{ ...s, recordsProcessed }, []]
  return [
    { ...withPartitions(s, [[key, { ...p, next: event.next }]]), recordsProcessed },
    [lagOf(p.tp, event.next, event.highwater)]
  ]
}

/** Lanes drained: their partitions' next offsets are final; what the drain was for goes on. */
const drained = <E extends Failure>(s: State, lanes: ReadonlyArray<DrainedLane>, purpose: DrainPurpose): Step<E> => {
  const changes: Array<readonly [string, Partition]> = []
  for (const l of lanes) {
    const p = s.partitions.get(Models.tpKey(l.tp))
    if (p !== undefined && p.lane === l.lane) changes.push([Models.tpKey(l.tp), { ...p, next: l.next, lane: 0 }])
  }
  const next = withPartitions(s, changes)
  const all = [...next.partitions.values()]
  switch (purpose._tag) {
    case "Revoke": {
      // With exactly once one transaction holds every partition's writes: all of them commit (or rewind) now.
      const lost = all.filter((p) => p.revoking)
      return [next, [commitOf(next.options.exactlyOnce ? all : lost, purpose)]]
    }
    case "Close":
      return [next, [commitOf(all, purpose)]]
    case "Rewind":
      return rewound(next, purpose.failed)
  }
}

/** The timer: commits once the interval since the last timer commit passed, else waits for the rest. */
const tick = <E extends Failure>(s: State, now: number): Step<E> => {
  if (s.closed) return [s, []]
  if (now < s.nextCommitAt) return [s, [timer(s.nextCommitAt - now)]]
  return [s, [commitOf([...s.partitions.values()], { _tag: "Timer" })]]
}

/** A commit went through: offsets recorded, counted, and what it was for goes on. */
const committed = <E extends Failure>(s: State, event: Extract<Event<E>, { readonly _tag: "Committed" }>): Step<E> => {
  const changes: Array<readonly [string, Partition]> = []
  for (const o of event.offsets) {
    const p = s.partitions.get(Models.tpKey(o))
    if (p !== undefined) changes.push([Models.tpKey(o), { ...p, committed: o.offset }])
  }
  const lastCommitMs = event.at - event.startedAt
  const next: State = { ...withPartitions(s, changes), commits: s.commits + 1, lastCommitMs }
  const metric: Command<E> = { _tag: "Metric", metric: "commitDuration", value: lastCommitMs / 1000 }
  const purpose = event.purpose
  switch (purpose._tag) {
    case "Timer": {
      const interval = s.options.commitIntervalMs
      const timed = { ...next, nextCommitAt: event.at + interval }
      return [timed, [metric, timer(interval), ...membershipRead<E>(timed)]]
    }
    case "Request":
      return [next, [metric, { _tag: "Reply", request: purpose.request, outcome: { _tag: "Done" } }]]
    case "Revoke":
      return finishRevoke(next, purpose.tps, [metric])
    case "Close":
      return [next, [metric, { _tag: "Settle" }]]
  }
}

/**
 * A commit failed: the close only logs it; a refused table write rewinds; any other failure ends a request with it
 * and fails the worker otherwise (the timer stops).
 */
const commitFailed = <E extends Failure>(s: State, error: E, at: number, purpose: CommitPurpose): Step<E> => {
  if (purpose._tag === "Close")
    return [s, [log("warn", `worker: the last commit failed: ${error.message}`), { _tag: "Settle" }]]
  if (isRefused(error)) {
    const timed = purpose._tag === "Timer" ? { ...s, nextCommitAt: at + s.options.commitIntervalMs } : s
    const [next, commands] = rewind<E>(timed, purpose)
    const rearm = purpose._tag === "Timer" ? [timer(s.options.commitIntervalMs)] : []
    return [next, [log("warn", `worker: ${error.message}; rewinding`), ...rearm, ...commands]]
  }
  if (purpose._tag === "Request") {
    return [s, [{ _tag: "Reply", request: purpose.request, outcome: { _tag: "Failed", error } }]]
  }
  return [s, [{ _tag: "Fail", error }]]
}

/** After a failed commit: every partition stops (its lane drained); the tables restore again after the drain. */
const rewind = <E extends Failure>(s: State, failed: CommitPurpose): Step<E> => {
  const tps = [...s.partitions.values()].map((p) => p.tp)
  return [
    { ...s, rewinds: s.rewinds + 1 },
    [
      { _tag: "Metric", metric: "rewinds", value: 1 },
      { _tag: "Pause", tps },
      { _tag: "Drain", tps, discard: false, purpose: { _tag: "Rewind", failed } }
    ]
  ]
}

/**
 * The rewind's lanes are drained: the tables rewind, every partition not being revoked waits for its tables again
 * (then starts from what they hold), and what the failed commit was for goes on.
 */
const rewound = <E extends Failure>(s: State, failed: CommitPurpose): Step<E> => {
  let lastId = s.lastId
  const waits: Array<Command<E>> = []
  const changes = [...s.partitions].map(([key, p]): readonly [string, Partition] => {
    if (p.revoking) return [key, { ...p, ready: false, lane: 0 }]
    const wait = ++lastId
    waits.push({ _tag: "AwaitReady", tp: p.tp, wait })
    return [key, { ...p, ready: false, lane: 0, wait }]
  })
  const next = { ...withPartitions(s, changes), lastId }
  const commands: Array<Command<E>> = [{ _tag: "RewindTables" }, ...waits]
  switch (failed._tag) {
    case "Request":
      return [next, [...commands, { _tag: "Reply", request: failed.request, outcome: { _tag: "Done" } }]]
    case "Revoke":
      return finishRevoke(next, failed.tps, commands)
    default:
      return [next, commands]
  }
}

/**
 * The close: every lag series removed (a stopping worker holds no partition), restore waits dropped, every lane
 * drained, then one last commit (see `drained`).
 */
const close = <E extends Failure>(s: State): Step<E> => {
  if (s.closed) return [s, [{ _tag: "Settle" }]]
  const all = [...s.partitions.values()]
  const waiting = all.filter((p) => p.wait !== 0).map((p) => p.tp)
  const changes = all.filter((p) => p.wait !== 0).map((p) => [Models.tpKey(p.tp), { ...p, wait: 0 }] as const)
  const commands: Array<Command<E>> = [...removeLag<E>(all.map((p) => p.tp))]
  if (waiting.length > 0) commands.push({ _tag: "CancelWaits", tps: waiting })
  commands.push({ _tag: "Drain", tps: all.map((p) => p.tp), discard: false, purpose: { _tag: "Close" } })
  return [{ ...withPartitions(s, changes), closed: true }, commands]
}

// ---------------------------------------------------------------------------
// Standbys
// ---------------------------------------------------------------------------

/**
 * Places this member's standbys from the group's membership: new ones are handed to the tables (restored, then
 * tailing their changelogs), ones no longer placed here are let go. Nothing changes while the group's view of this
 * member differs from the partitions the worker holds (a rebalance in flight): the next event or tick places them.
 */
const placeStandbys = <E extends Failure>(s: State, membership: Log.GroupMembership): Step<E> => {
  if (s.options.standbyReplicas === 0) return [s, []]
  const own = membership.members.find((m) => m.memberId === membership.memberId)
  if (
    own === undefined ||
    own.partitions.length !== s.partitions.size ||
    !own.partitions.every((tp) => s.partitions.has(Models.tpKey(tp))) ||
    membership.members.every((m) => m.partitions.length === 0)
  ) {
    return [s, []]
  }
  const wanted = new Map<string, Models.TopicPartition>()
  for (const tp of place(membership, s.options.standbyReplicas)) {
    if (!s.partitions.has(Models.tpKey(tp))) wanted.set(Models.tpKey(tp), tp)
  }
  const added = [...wanted].filter(([k]) => !s.standbys.has(k)).map(([, tp]) => tp)
  const removed = [...s.standbys].filter(([k]) => !wanted.has(k)).map(([, tp]) => tp)
  const standbys = new Map(s.standbys)
  const commands: Array<Command<E>> = []
  if (removed.length > 0) {
    commands.push({ _tag: "RevokeTables", tps: removed })
    for (const tp of removed) standbys.delete(Models.tpKey(tp))
  }
  if (added.length > 0) {
    commands.push({ _tag: "AssignStandbys", tps: added })
    for (const tp of added) standbys.set(Models.tpKey(tp), tp)
  }
  return [{ ...s, standbys }, commands]
}
