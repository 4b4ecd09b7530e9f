/**
 * The cluster simulator's checkers: what the run records as it goes (appends and their outcomes, replicas sampled
 * after every step, LeaderAndIsr requests applied, ISR changes committed, every tablet write the controllers
 * committed and the moves of replica sets they show) and the judgement of the final logs and moves.
 */
import { Models } from "@strata/core"
import type * as ReplicaManager from "../../src/protocol/ReplicaManager.js"
import type * as ControllerState from "../../src/machines/ControllerState.js"
import type { LeaderEpochCache } from "../../src/machines/LeaderEpochCache.js"
import * as Reassignment from "../../src/machines/Reassignment.js"
import type { ReplicaView } from "../../src/server/TabletServer.js"

/** The epoch that wrote `offset` in a log with this epoch cache (`undefined` before its first epoch). */
const epochAt = (epochs: LeaderEpochCache, offset: number): number | undefined => {
  let found: number | undefined
  for (const e of epochs) if (e.startOffset <= offset) found = e.epoch
  return found
}

/** How an append ended for its producer. */
export type Outcome =
  | { readonly _tag: "Acked"; readonly baseOffset: number }
  | { readonly _tag: "Failed"; readonly why: string }
  | { readonly _tag: "Unknown" }

/** One replica's log at the end. */
export interface FinalReplica {
  readonly server: string
  readonly hw: number
  /** Where its log starts. */
  readonly logStart: number
  readonly batches: ReadonlyArray<ReplicaManager.TabletBatch>
}

/** One tablet at the end: its leader and ISR by coordination, and every replica's log. */
export interface FinalTablet {
  readonly tablet: string
  readonly leader: string | undefined
  readonly isr: ReadonlyArray<string>
  readonly replicas: ReadonlyArray<FinalReplica>
}

/** How a `deleteRecords` call ended for its client: acknowledged with the log start it answered, or not. */
export type DeleteOutcome =
  | { readonly _tag: "Acked"; readonly logStart: number }
  | { readonly _tag: "Failed"; readonly why: string }
  | { readonly _tag: "Unknown" }

const decoder = new TextDecoder()

/** The records of a log by offset: the epoch that wrote each and its value. */
const flatten = (batches: ReadonlyArray<ReplicaManager.TabletBatch>) => {
  const out = new Map<number, { readonly epoch: number; readonly value: string }>()
  for (const b of batches) {
    b.records.forEach((r, i) => {
      out.set(b.baseOffset + i, { epoch: b.epoch, value: decoder.decode(r.value) })
    })
  }
  return out
}

/** The first few violations of each kind (a broken run repeats itself). */
interface Limited {
  readonly seen: Map<string, number>
  readonly out: Array<string>
}

const limited = (): Limited => ({ seen: new Map(), out: [] })

/** Keeps `line` unless three of its kind are kept already. */
const add = (l: Limited, kind: string, line: string): void => {
  const n = (l.seen.get(kind) ?? 0) + 1
  l.seen.set(kind, n)
  if (n <= 3) l.out.push(line)
}

/** A replica's log start, end and epoch cache as last sampled. */
interface LogEnd {
  readonly start: number
  readonly end: number
  readonly epochs: LeaderEpochCache
}

/** What one run records as it goes, and the violations found meanwhile. */
export interface Recorder {
  /** The cluster's minimum ISR. */
  readonly minIsr: number
  readonly appends: Array<{
    readonly tablet: string
    readonly values: ReadonlyArray<string>
    readonly outcome: Outcome
  }>
  /** The servers seen leading each `tablet@epoch`. */
  readonly leaders: Map<string, Set<string>>
  /** Each leader life's HW per `tablet@epoch`, as last sampled. */
  readonly highWatermarks: Map<string, number>
  /** The highest coordinator epoch each server life applied. */
  readonly applied: Map<string, number>
  readonly coordinatorEpochs: Set<number>
  /** Every `deleteRecords` call: its tablet, offset, outcome and when it ended. */
  readonly deletes: Array<{
    readonly tablet: string
    readonly offset: number
    readonly outcome: DeleteOutcome
    readonly at: number
  }>
  /** Per tablet, the highest limit a replica's retention was given: below it, records may be gone. */
  readonly retainedBelow: Map<string, number>
  /** What the consumer was given: per tablet, the value at each offset read, and when it was first read. */
  readonly reads: Map<string, Map<number, { readonly value: string; readonly at: number }>>
  /** Each server's log end and epochs per tablet, as last sampled (a stopped server's log keeps what it had). */
  readonly logEnds: Map<string, Map<string, LogEnd>>
  /** Per tablet, the running servers whose log was closed (offline) when last sampled: how far it reaches, unknown. */
  readonly closed: Map<string, Set<string>>
  readonly moves: Moves
  readonly violations: Limited
}

/** One move of a tablet's replica set, as the controllers' committed writes show it. */
export interface Move {
  readonly tablet: string
  readonly original: ReadonlyArray<number>
  readonly target: ReadonlyArray<number>
  /** The ISR's size when the move began. */
  readonly startIsr: number
  /** When its first write was seen. */
  readonly at: number
  /** How it ended: its target became the replicas, or its original stayed them; `undefined` while it runs. */
  outcome: "completed" | "cancelled" | undefined
}

/** The moves the run saw: each tablet's last committed write, the moves under way, every move, and the checks. */
export interface Moves {
  readonly last: Map<string, ControllerState.Tablet>
  readonly open: Map<string, Move>
  readonly all: Array<Move>
  /** The samples of a moving tablet's ISR taken while no fault was in force (each one checked). */
  quietSamples: number
}

/** A fresh recorder for one run; `minIsr` is the cluster's minimum ISR. */
export const recorder = (minIsr: number): Recorder => ({
  minIsr,
  appends: [],
  leaders: new Map(),
  highWatermarks: new Map(),
  applied: new Map(),
  coordinatorEpochs: new Set(),
  deletes: [],
  retainedBelow: new Map(),
  reads: new Map(),
  logEnds: new Map(),
  closed: new Map(),
  moves: { last: new Map(), open: new Map(), all: [], quietSamples: 0 },
  violations: limited()
})

/** A replica's log start, end and epoch cache, sampled. */
export const logEnd = (
  r: Recorder,
  server: string,
  tablet: string,
  start: number,
  end: number,
  epochs: LeaderEpochCache
): void => {
  const ends = r.logEnds.get(tablet) ?? new Map<string, LogEnd>()
  ends.set(server, { start, end, epochs })
  r.logEnds.set(tablet, ends)
  r.closed.get(tablet)?.delete(server)
}

/**
 * A running server's replica whose log is closed (offline after a store failure): it may have copied more since
 * its last sample, so it is neither counted nor ruled out as a holder until its log is read again.
 */
export const logClosed = (r: Recorder, server: string, tablet: string): void => {
  const set = r.closed.get(tablet) ?? new Set<string>()
  set.add(server)
  r.closed.set(tablet, set)
}

/** An append's records and how it ended for its producer. */
export const append = (r: Recorder, tablet: string, values: ReadonlyArray<string>, outcome: Outcome): void => {
  r.appends.push({ tablet, values, outcome })
}

/** A `deleteRecords` call that ended: an acknowledged one answers a log start at or past its offset. */
export const deleted = (r: Recorder, tablet: string, offset: number, outcome: DeleteOutcome, at: number): void => {
  r.deletes.push({ tablet, offset, outcome, at })
  if (outcome._tag === "Acked" && outcome.logStart < offset)
    add(
      r.violations,
      "delete",
      `t=${at} ${tablet}: a delete before ${offset} was acknowledged with the log starting at ${outcome.logStart}`
    )
}

/** A replica's log was asked to apply its retention below `limit` (its high watermark then). */
export const retaining = (r: Recorder, tablet: string, limit: number): void => {
  r.retainedBelow.set(tablet, Math.max(r.retainedBelow.get(tablet) ?? 0, limit))
}

/**
 * Below which offset a tablet's records may be gone: the highest any `deleteRecords` call asked for, whatever its
 * outcome (a call that failed or timed out may still have moved some replica's start), or any retention was given as
 * its limit.
 */
const deletedBelow = (r: Recorder, tablet: string): number =>
  r.deletes.reduce((max, d) => (d.tablet === tablet ? Math.max(max, d.offset) : max), r.retainedBelow.get(tablet) ?? 0)

/** A record a consumer was given; read again, it must be the same record. */
export const read = (r: Recorder, tablet: string, offset: number, value: string, at: number): void => {
  const seen = r.reads.get(tablet) ?? new Map<number, { readonly value: string; readonly at: number }>()
  r.reads.set(tablet, seen)
  const before = seen.get(offset)
  if (before === undefined) seen.set(offset, { value, at })
  else if (before.value !== value) {
    add(
      r.violations,
      "read",
      `t=${at} ${tablet}: a consumer read ${value} at offset ${offset}, where it read ${before.value} at t=${before.at}`
    )
  }
}

/**
 * A replica sampled after a step (`log`: where its log starts, and its epoch cache): one leader per (tablet, epoch);
 * a leader's HW only forward, within its log, and held by `minIsr` replicas.
 */
export const replica = (
  r: Recorder,
  server: string,
  incarnation: number,
  view: ReplicaView,
  at: number,
  log: { readonly start: number; readonly epochs: LeaderEpochCache }
): void => {
  const epochs = log.epochs
  const l = view.leader
  if (view.machine._tag !== "LeaderReplica" || l === undefined) return
  const key = `${Models.tabletKey(view.tablet)}@${l.leaderEpoch}`
  const who = r.leaders.get(key) ?? new Set<string>()
  who.add(server)
  r.leaders.set(key, who)
  if (who.size > 1) add(r.violations, "leaders", `t=${at} two leaders of ${key}: ${[...who].join(", ")}`)
  if (l.highWatermark > l.logEndOffset) {
    add(r.violations, "hw", `t=${at} ${server}: ${key} HW ${l.highWatermark} past its log end ${l.logEndOffset}`)
  }
  const hwKey = `${server}.${incarnation}|${key}`
  const before = r.highWatermarks.get(hwKey)
  // KIP-966: a HW counts only records at least minInsyncReplicas replicas hold (checked as it advances): a
  // holder's log reaches the HW and its record below it was written in the same epoch as the leader's (unless a
  // delete took that record from either log: then there is no record to hold).
  const last = l.highWatermark - 1
  const unknown = r.closed.get(Models.tabletKey(view.tablet)) ?? new Set<string>()
  const holders = [...(r.logEnds.get(Models.tabletKey(view.tablet)) ?? [])].filter(
    ([s, e]) =>
      !unknown.has(s) &&
      e.end >= l.highWatermark &&
      (last < Math.max(log.start, e.start) || epochAt(e.epochs, last) === epochAt(epochs, last))
  )
  if (before !== undefined && l.highWatermark > before && holders.length + unknown.size < r.minIsr) {
    add(
      r.violations,
      "min-isr",
      `t=${at} ${server}: ${key} HW ${l.highWatermark} is held by ${holders.length} replicas, fewer than ${r.minIsr}`
    )
  }
  if (before !== undefined && l.highWatermark < before) {
    add(r.violations, "hw", `t=${at} ${server}: ${key} HW went back from ${before} to ${l.highWatermark}`)
  }
  r.highWatermarks.set(hwKey, l.highWatermark)
}

/**
 * A tablet's committed ISR members (each the life it joined as) against its leader's HW: each holds every offset
 * below it, written in the same epoch as the leader's record there (so the same record: one leader per epoch).
 * Any of them may be elected cleanly next; one that does not hold the leader's log would lose what was
 * acknowledged.
 */
export const isrHolds = (
  r: Recorder,
  tablet: string,
  leader: { readonly server: string; readonly start: number; readonly epochs: LeaderEpochCache },
  hw: number,
  members: ReadonlyArray<{
    readonly server: string
    readonly start: number
    readonly end: number
    readonly epochs: LeaderEpochCache
  }>,
  at: number
): void => {
  const leaderEpochs = leader.epochs
  for (const m of members) {
    // Below the leader's log start there is nothing to hold (a delete took it).
    if (m.end < hw && leader.start < hw) {
      add(
        r.violations,
        "isr-holds",
        `t=${at} ${tablet}: ISR member ${m.server} has no record at offset ${m.end}, below the HW ${hw} of its leader ${leader.server}`
      )
      continue
    }
    // The epoch at an offset changes only where a cache entry starts: comparing there (and where the later of the
    // two logs starts, below which a delete took the records) compares every offset both hold.
    const from = Math.max(leader.start, m.start)
    const starts = [from, ...[...leaderEpochs, ...m.epochs].map((e) => e.startOffset)].filter(
      (o) => o >= from && o < hw
    )
    const differs = starts.sort((a, b) => a - b).find((o) => epochAt(m.epochs, o) !== epochAt(leaderEpochs, o))
    if (differs !== undefined) {
      add(
        r.violations,
        "isr-holds",
        `t=${at} ${tablet}: ISR member ${m.server} and its leader ${leader.server} differ at offset ${differs} below the HW ${hw} (epoch ${epochAt(m.epochs, differs)} vs ${epochAt(leaderEpochs, differs)})`
      )
    }
  }
}

/** A LeaderAndIsr a tablet server applied: never below the highest coordinator epoch it applied before. */
export const applied = (r: Recorder, server: string, incarnation: number, coordinatorEpoch: number): void => {
  const key = `${server}.${incarnation}`
  const highest = r.applied.get(key) ?? 0
  if (coordinatorEpoch < highest) {
    add(
      r.violations,
      "coordinator-epoch",
      `${key} applied a LeaderAndIsr of coordinator epoch ${coordinatorEpoch} after one of ${highest}`
    )
  }
  r.applied.set(key, Math.max(highest, coordinatorEpoch))
}

/** A committed ISR change: every server it adds was registered (live) when the leader asked (KIP-841). */
export const isrChange = (
  r: Recorder,
  tablet: string,
  before: ReadonlyArray<number>,
  after: ReadonlyArray<number>,
  registered: ReadonlySet<number>
): void => {
  for (const s of after) {
    if (!before.includes(s) && !registered.has(s)) {
      add(r.violations, "isr", `${tablet}: the ISR gained server ${s}, which was not registered`)
    }
  }
}

/** A coordinator epoch a controller started with. */
export const coordinatorEpoch = (r: Recorder, epoch: number): void => {
  r.coordinatorEpochs.add(epoch)
}

/**
 * Against its leader's final log: what a consumer read is committed there, nothing twice, nothing acked lost (below
 * where a delete may have cut the log, a record may be gone, but one still there must be the same).
 */
const judgeLeaderLog = (r: Recorder, out: Limited, t: FinalTablet, leader: FinalReplica): void => {
  const log = flatten(leader.batches)
  const gone = deletedBelow(r, t.tablet)
  for (const [offset, read] of r.reads.get(t.tablet) ?? []) {
    const at = log.get(offset)
    if (at === undefined && offset < gone) continue
    if (at === undefined || offset >= leader.hw || at.value !== read.value) {
      add(
        out,
        "read",
        `${t.tablet}: a consumer read ${read.value} at offset ${offset} (t=${read.at}), which is not committed there at the end (the leader has ${at?.value ?? "nothing"}, HW ${leader.hw})`
      )
    }
  }
  const counts = new Map<string, number>()
  for (const { value } of log.values()) counts.set(value, (counts.get(value) ?? 0) + 1)
  for (const [value, n] of counts) if (n > 1) add(out, "dup", `${t.tablet}: ${value} is in the log ${n} times`)
  for (const a of r.appends) {
    if (a.tablet !== t.tablet || a.outcome._tag !== "Acked") continue
    const base = a.outcome.baseOffset
    a.values.forEach((value, i) => {
      const at = log.get(base + i)
      if (at === undefined && base + i < gone) return
      if (at === undefined || base + i >= leader.hw || at.value !== value) {
        add(
          out,
          "lost",
          `${t.tablet}: acknowledged ${value} at offset ${base + i} is lost (the leader ${t.leader} has ${at?.value ?? "nothing"} there, HW ${leader.hw})`
        )
      }
    })
  }
}

/**
 * An acknowledged delete holds: the final leader's log, and every final ISR member's (any of which may lead next),
 * starts at or past it, so what it deleted cannot be read again.
 */
const judgeDeletes = (r: Recorder, out: Limited, t: FinalTablet): void => {
  const acked = r.deletes.filter((d) => d.tablet === t.tablet && d.outcome._tag === "Acked")
  const highest = acked.reduce((max, d) => (d.offset > max.offset ? d : max), { offset: 0, at: 0 })
  if (highest.offset === 0) return
  for (const replica of t.replicas) {
    if (replica.server !== t.leader && !t.isr.includes(replica.server)) continue
    if (replica.logStart < highest.offset)
      add(
        out,
        "delete",
        `${t.tablet}: ${replica.server === t.leader ? "the leader" : "ISR member"} ${replica.server}'s log starts at ${replica.logStart}, below the acknowledged delete before ${highest.offset} (t=${highest.at}): deleted records are readable again`
      )
  }
}

/** Two replicas agree below both their HWs: each holds every offset from where both logs start, the same record. */
const judgePrefix = (out: Limited, tablet: string, a: FinalReplica, b: FinalReplica): void => {
  const la = flatten(a.batches)
  const lb = flatten(b.batches)
  const upTo = Math.min(a.hw, b.hw)
  const from = Math.max(a.logStart, b.logStart)
  for (let o = from; o < upTo; o++) {
    const x = la.get(o)
    const y = lb.get(o)
    if (x === undefined || y === undefined) {
      add(
        out,
        "prefix",
        `${tablet}: ${x === undefined ? a.server : b.server} has no record at offset ${o}, below the HWs of ${a.server} and ${b.server} (${a.hw}, ${b.hw})`
      )
      return
    }
    if (x.value !== y.value || x.epoch !== y.epoch) {
      add(
        out,
        "prefix",
        `${tablet}: ${a.server} and ${b.server} differ at offset ${o} below their HWs (${a.hw}, ${b.hw}): ${x.value}@${x.epoch} vs ${y.value}@${y.epoch}`
      )
      return
    }
  }
}

const list = (servers: ReadonlyArray<number>) => `[${servers.join(",")}]`

/** A move ends with the tablet's `replicas`: its target (completed) or its original (cancelled), nothing else. */
const endMove = (r: Recorder, move: Move, replicas: ReadonlyArray<number>, at: number): void => {
  if (Reassignment.sameReplicas(replicas, move.target)) move.outcome = "completed"
  else if (Reassignment.sameReplicas(replicas, move.original)) move.outcome = "cancelled"
  else
    add(
      r.violations,
      "move",
      `t=${at} ${move.tablet}: the move from ${list(move.original)} to ${list(move.target)} ended on ${list(replicas)}, neither its target nor its original`
    )
  r.moves.open.delete(move.tablet)
}

/**
 * A tablet write a controller committed (every one, in version order): a write that stores a move begins it (from
 * the replicas the tablet had), the write that drops it ends it (`endMove`), and one that changes the replicas with
 * no move stored before or after is a move begun and finished at once (nothing to add, every target in the ISR).
 */
export const tabletWritten = (r: Recorder, t: ControllerState.Tablet, at: number): void => {
  const key = Models.tabletKey(t.tablet)
  const m = r.moves
  const before = m.last.get(key)
  if (before !== undefined && t.leaderAndIsr.version <= before.leaderAndIsr.version) return
  m.last.set(key, t)
  if (before === undefined) return
  const open = m.open.get(key)
  const now = t.reassignment
  if (now === undefined) {
    if (open !== undefined) endMove(r, open, t.replicas, at)
    else if (!Reassignment.sameReplicas(before.replicas, t.replicas)) {
      const move = {
        tablet: key,
        original: before.replicas,
        target: t.replicas,
        startIsr: before.leaderAndIsr.isr.length
      }
      m.all.push({ ...move, at, outcome: "completed" })
    }
    return
  }
  if (
    open !== undefined &&
    Reassignment.sameReplicas(open.original, now.original) &&
    Reassignment.sameReplicas(open.target, now.target)
  )
    return
  if (open !== undefined) endMove(r, open, before.replicas, at)
  if (!Reassignment.sameReplicas(now.original, before.replicas))
    add(
      r.violations,
      "move",
      `t=${at} ${key}: a move from ${list(now.original)} began while the replicas were ${list(before.replicas)}`
    )
  const move: Move = {
    tablet: key,
    original: now.original,
    target: now.target,
    startIsr: before.leaderAndIsr.isr.length,
    at,
    outcome: undefined
  }
  m.open.set(key, move)
  m.all.push(move)
}

/**
 * A moving tablet's ISR (`isr` members in coordination now), sampled while no fault is in force (`quiet`): never
 * fewer members than when the move began, or than its target has when the move shrinks the replica set.
 */
export const movingIsr = (r: Recorder, tablet: string, isr: ReadonlyArray<number>, quiet: boolean, at: number) => {
  const move = r.moves.open.get(tablet)
  if (move === undefined || !quiet) return
  r.moves.quietSamples++
  const floor = Math.min(move.startIsr, move.target.length)
  if (isr.length < floor)
    add(
      r.violations,
      "move-isr",
      `t=${at} ${tablet}: moving from ${list(move.original)} to ${list(move.target)}, its ISR ${list(isr)} is below the ${floor} members it had as the move began, with no fault in force`
    )
}

/** A reassignment request answered wrongly (a bad request accepted, or refused for another reason). */
export const wrongAnswer = (r: Recorder, line: string): void => add(r.violations, "refusal", line)

/** The moves at the end: each one completed or was cancelled. */
export const judgeMoves = (r: Recorder): ReadonlyArray<string> =>
  [...r.moves.open.values()].map(
    (m) =>
      `${m.tablet}: the move from ${list(m.original)} to ${list(m.target)} (begun t=${m.at}) neither completed nor was cancelled`
  )

/** The moves' counts: begun (at once or not), completed, cancelled, and the quiet ISR samples checked. */
export const moveStats = (r: Recorder): Record<string, number> => ({
  "move-begun": r.moves.all.length,
  "move-completed": r.moves.all.filter((m) => m.outcome === "completed").length,
  "move-cancelled": r.moves.all.filter((m) => m.outcome === "cancelled").length,
  "move-quiet-isr-samples": r.moves.quietSamples
})

/** The end: nothing acknowledged lost, nothing twice, replicas agree below their common HW. */
export const judge = (r: Recorder, tablets: ReadonlyArray<FinalTablet>): ReadonlyArray<string> => {
  const out = limited()
  for (const t of tablets) {
    const leader = t.replicas.find((x) => x.server === t.leader)
    if (leader === undefined) {
      // Nothing to judge against is itself a failure when something was acknowledged.
      if (r.appends.some((a) => a.tablet === t.tablet && a.outcome._tag === "Acked")) {
        add(out, "lost", `${t.tablet}: no leader at the end: every acknowledged record is lost to its readers`)
      }
      continue
    }
    judgeLeaderLog(r, out, t, leader)
    judgeDeletes(r, out, t)
    for (let i = 0; i < t.replicas.length; i++) {
      for (let j = i + 1; j < t.replicas.length; j++) judgePrefix(out, t.tablet, t.replicas[i]!, t.replicas[j]!)
    }
  }
  return [...r.violations.out, ...out.out]
}

/** The delete family's counts: calls by outcome (`delete-acked`, `delete-failed`, `delete-unknown`). */
export const deleteStats = (r: Recorder): Record<string, number> => {
  const counts: Record<string, number> = {}
  for (const d of r.deletes) {
    const key = `delete-${d.outcome._tag.toLowerCase()}`
    counts[key] = (counts[key] ?? 0) + 1
  }
  return counts
}

/** The run's counts: appends by outcome, records read, leader epochs and coordinator epochs seen. */
export const stats = (r: Recorder) => ({
  acked: r.appends.filter((a) => a.outcome._tag === "Acked").length,
  failed: r.appends.filter((a) => a.outcome._tag === "Failed").length,
  unknown: r.appends.filter((a) => a.outcome._tag === "Unknown").length,
  reads: [...r.reads.values()].reduce((n, m) => n + m.size, 0),
  leaderChanges: r.leaders.size,
  coordinatorEpochs: r.coordinatorEpochs.size
})
