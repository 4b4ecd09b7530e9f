/**
 * What the simulator records and the pure checkers that judge a run: safety
 * (one leader per epoch, no stale epoch accepted, no act past a deadline, a
 * fenced log in epoch and term order, no process dead by itself) and liveness
 * (a live leader once the faults are over). Each checker takes plain records
 * and returns the violations it found, one line each; an empty array means the
 * property held.
 */
import { Cause, Exit } from "effect"

/** A won leadership: the leader node registered by one campaign session (a term). */
export interface Win {
  /** The term's number, in the order the leader nodes were registered. */
  readonly term: number
  readonly process: number
  readonly incarnation: number
  readonly session: string
  /** The epoch the winner announced in its leader node. */
  readonly epoch: number
  readonly at: number
}

/** A request from a leader to the receiver (a tablet server), carrying the leader's epoch. */
export interface Request {
  /** The session that won the sender's leadership. */
  readonly session: string
  readonly term: number
  readonly epoch: number
  readonly process: number
  /** The leader's n-th request in its term. */
  readonly n: number
  readonly sentAt: number
}

/** A request as the receiver handled it. */
export interface Delivery {
  readonly request: Request
  readonly accepted: boolean
  readonly at: number
}

/** A successful write of the epoch node: its new value and the store order of the write. */
export interface EpochWrite {
  readonly epoch: number
  readonly order: number
}

/** A coordinator write applied through `Leadership.fenced`: a sequential node under the log. */
export interface FencedEntry {
  readonly path: string
  /** The store order of its creation (ZooKeeper czxid). */
  readonly order: number
  /** The epoch and term the writer claimed. */
  readonly epoch: number
  readonly term: number
  readonly process: number
  /** When the writer issued it. */
  readonly at: number
}

const termName = (w: Win): string => `term ${w.term} (p${w.process}.${w.incarnation} ${w.session} at t=${w.at})`

/** At most one leader per epoch, and every leader's epoch is higher than its predecessor's. */
export const checkLeaders = (wins: ReadonlyArray<Win>): Array<string> => {
  const violations: Array<string> = []
  const byEpoch = new Map<number, Win>()
  let previous: Win | undefined
  for (const w of wins) {
    const first = byEpoch.get(w.epoch)
    if (first !== undefined) {
      violations.push(`two leaders in epoch ${w.epoch}: ${termName(first)} and ${termName(w)}`)
    } else byEpoch.set(w.epoch, w)
    if (previous !== undefined && w.epoch <= previous.epoch) {
      violations.push(
        `epoch did not grow: ${termName(previous)} had ${previous.epoch}, then ${termName(w)} had ${w.epoch}`
      )
    }
    previous = w
  }
  return violations
}

/**
 * No request accepted with a stale epoch: every accepted request carries an
 * epoch at least as high as every request accepted before it, and comes from a
 * term no older than theirs (terms are the ground truth, independent of epochs).
 */
export const checkReceiver = (deliveries: ReadonlyArray<Delivery>): Array<string> => {
  const violations: Array<string> = []
  let highest: Request | undefined
  let latestTerm: Request | undefined
  for (const d of deliveries) {
    if (!d.accepted) continue
    const r = d.request
    if (highest !== undefined && r.epoch < highest.epoch) {
      violations.push(
        `receiver accepted a stale epoch at t=${d.at}: epoch ${r.epoch} from p${r.process} (term ${r.term}, sent t=${r.sentAt}) after epoch ${highest.epoch} from p${highest.process}`
      )
    }
    if (latestTerm !== undefined && r.term < latestTerm.term) {
      violations.push(
        `receiver accepted a superseded term at t=${d.at}: term ${r.term} (epoch ${r.epoch}, p${r.process}, sent t=${r.sentAt}) after term ${latestTerm.term} (epoch ${latestTerm.epoch}, p${latestTerm.process})`
      )
    }
    if (highest === undefined || r.epoch > highest.epoch) highest = r
    if (latestTerm === undefined || r.term > latestTerm.term) latestTerm = r
  }
  return violations
}

/**
 * Every fenced write was applied while its epoch was the epoch node's current
 * value, and fenced writes, in store order, never go back to an older term.
 * `initialEpoch` is the epoch node's value before its first recorded write.
 */
export const checkFencedLog = (
  entries: ReadonlyArray<FencedEntry>,
  epochWrites: ReadonlyArray<EpochWrite>,
  initialEpoch = 0
): Array<string> => {
  const violations: Array<string> = []
  const writes = [...epochWrites].sort((a, b) => a.order - b.order)
  const sorted = [...entries].sort((a, b) => a.order - b.order)
  let w = 0
  let current = initialEpoch
  let latest: FencedEntry | undefined
  for (const e of sorted) {
    while (w < writes.length && (writes[w]?.order ?? Number.POSITIVE_INFINITY) < e.order) {
      current = writes[w]?.epoch ?? current
      w++
    }
    if (e.epoch !== current) {
      violations.push(
        `fenced write ${e.path} (order ${e.order}) from p${e.process} at t=${e.at} claims epoch ${e.epoch} while the epoch node held ${current}`
      )
    }
    if (latest !== undefined && e.term < latest.term) {
      violations.push(
        `fenced write ${e.path} from p${e.process} at t=${e.at} (term ${e.term}) applied after ${latest.path} of the newer term ${latest.term}`
      )
    }
    if (latest === undefined || e.term > latest.term) latest = e
  }
  return violations
}

/**
 * No leader acts after its session may have expired: a request sent at or after the moment the server expires the
 * sender's session on its own (the session's timeout after its connection was cut, unless it came back in time)
 * is a violation, whatever the sender believed. `expiries` maps a session to that moment.
 */
export const checkDeadlines = (
  requests: ReadonlyArray<Request>,
  expiries: ReadonlyMap<string, number>
): Array<string> => {
  const violations: Array<string> = []
  for (const r of requests) {
    const expiry = expiries.get(r.session)
    if (expiry !== undefined && r.sentAt >= expiry) {
      violations.push(
        `p${r.process} acted at t=${r.sentAt} after its session ${r.session} expired at t=${expiry}: request e${r.epoch} #${r.n} (term ${r.term})`
      )
    }
  }
  return violations
}

/** A process as the run ended: its id and, when its incarnation ended by itself, how. */
export interface ProcessEnd {
  readonly process: number
  /** Set when the process's fiber is over although nothing killed it (its shell died). */
  readonly exit: Exit.Exit<unknown, unknown> | undefined
}

/** No process died by itself: an incarnation ends only when a fault kills it. */
export const checkProcesses = (ends: ReadonlyArray<ProcessEnd>): Array<string> => {
  const violations: Array<string> = []
  for (const { process, exit } of ends) {
    if (exit !== undefined)
      violations.push(`p${process} died: ${Cause.pretty(Exit.isFailure(exit) ? exit.cause : Cause.empty)}`)
  }
  return violations
}

/** A process running and unpaused at the end, and whether it believes it leads. */
export interface LiveProcess {
  readonly id: number
  readonly leads: boolean
}

/** Whether no live process leads (there are live ones, but no leader node or none of them believes it leads). */
export const isLeaderless = (live: ReadonlyArray<LiveProcess>, leaderRegistered: boolean): boolean =>
  live.length > 0 && (!leaderRegistered || !live.some((p) => p.leads))

/** Liveness: `settledMs` after the last fault, with every fault over, a live process leads. */
export const checkLiveness = (
  live: ReadonlyArray<LiveProcess>,
  leaderRegistered: boolean,
  settledMs: number
): Array<string> =>
  isLeaderless(live, leaderRegistered)
    ? [`no live process leads ${settledMs} ms after the last fault (live: ${live.map((p) => `p${p.id}`).join(", ")})`]
    : []
