/**
 * A plan cut into what the executor runs: batches, and within a batch the waves in which its moves may start.
 *
 * - **Batches**: the changes that move replicas (their `from` and `to` sets differ), N of them, in batches of at
 *   most ⌈batchRatio × N⌉ (at least 1) each; the leadership-only changes (same replicas, another leader or order)
 *   in a last batch of their own, so leadership moves after every replica move. The changes are dealt out greedily
 *   so each batch spreads its load over the servers: the changes touching the busiest servers first, each into the
 *   batch with room where its servers are least loaded.
 * - **Waves**: a change is one move taking one unit of time; a wave is the set of moves running together, with no
 *   server touched by more than `maxConcurrentMigrations` of them and no more than `maxClusterMigrations` in all.
 *   Greedy list scheduling: each wave takes the moves touching the servers with the most moves left first.
 * - **Lower bound**: a batch needs at least max over servers of ⌈moves touching it / c⌉ waves (and ⌈moves / C⌉
 *   for the cluster cap C); `schedule` reports the waves against the sum of the batches' bounds.
 *
 * A move touches every server it adds a replica to and every server it removes one from; a leadership-only change
 * touches its old and new leader. Pure: the same changes and settings give the same batches and waves.
 *
 * @since 0.1.0
 */
import { Models } from "@strata/core"
import type { Change } from "./Planner.js"
import type { RebalanceConfig } from "./RebalanceConfig.js"

/** The settings batches and waves obey (decoded by `RebalanceConfig`: a ratio in (0, 1], limits ≥ 1). */
export type Limits = Pick<RebalanceConfig, "batchRatio" | "maxConcurrentMigrations" | "maxClusterMigrations">

/** A batch: replica moves, or the leadership-only changes that come last. */
export interface Batch {
  readonly kind: "replicas" | "leadership"
  readonly changes: ReadonlyArray<Change>
}

/** A batch with its waves and its lower bound on the waves it needs. */
export interface ScheduledBatch extends Batch {
  readonly waves: ReadonlyArray<ReadonlyArray<Change>>
  readonly lowerBound: number
}

/** Batches with their waves, and the figures: total waves against the sum of the batches' lower bounds. */
export interface Schedule {
  readonly batches: ReadonlyArray<ScheduledBatch>
  readonly waves: number
  readonly lowerBound: number
  /** `waves / lowerBound` (1 when both are 0). */
  readonly wavesPerLowerBound: number
}

/** Whether `change` moves replicas (its replica sets before and after differ). */
export const movesReplicas = (change: Change): boolean =>
  change.from.length !== change.to.length || change.to.some((s) => !change.from.includes(s))

/**
 * The servers `change` touches: those it adds a replica to and those it removes one from; for a leadership-only
 * change, its old and new leader.
 */
export const touched = (change: Change): ReadonlyArray<Models.ServerId> => {
  if (!movesReplicas(change)) {
    const leaders = change.leaderFrom === null ? [change.leaderTo] : [change.leaderFrom, change.leaderTo]
    return [...new Set(leaders)]
  }
  const added = change.to.filter((s) => !change.from.includes(s))
  const removed = change.from.filter((s) => !change.to.includes(s))
  return [...added, ...removed]
}

const positive = (n: number): number => Math.max(1, Math.floor(n))

const loadsOf = (changes: ReadonlyArray<Change>): Map<Models.ServerId, number> => {
  const loads = new Map<Models.ServerId, number>()
  for (const c of changes) for (const s of touched(c)) loads.set(s, (loads.get(s) ?? 0) + 1)
  return loads
}

/** Busiest first: by the most moves left on a touched server, then their sum, then size, then tablet. */
const byLoad = (
  changes: ReadonlyArray<Change>,
  loads: ReadonlyMap<Models.ServerId, number>,
  sizeOf: (change: Change) => number
): Array<Change> => {
  const key = (c: Change) => {
    const ls = touched(c).map((s) => loads.get(s) ?? 0)
    return {
      max: Math.max(0, ...ls),
      sum: ls.reduce((a, b) => a + b, 0),
      size: sizeOf(c),
      id: Models.tabletKey(c.tablet)
    }
  }
  const keyed = changes.map((c) => ({ c, k: key(c) }))
  keyed.sort(
    (a, b) =>
      b.k.max - a.k.max || b.k.sum - a.k.sum || b.k.size - a.k.size || (a.k.id < b.k.id ? -1 : a.k.id > b.k.id ? 1 : 0)
  )
  return keyed.map((x) => x.c)
}

/**
 * `changes` cut into batches: the replica-moving ones in batches of at most ⌈batchRatio × N⌉, each spreading its
 * load over the servers, then the leadership-only ones in a last batch. `sizeOf` (bytes; 0 by default) breaks ties
 * towards batches moving fewer bytes.
 *
 * @since 0.1.0
 */
export const batches = (
  changes: ReadonlyArray<Change>,
  limits: Pick<Limits, "batchRatio">,
  sizeOf: (change: Change) => number = () => 0
): ReadonlyArray<Batch> => {
  const moving = changes.filter(movesReplicas)
  const leadership = changes.filter((c) => !movesReplicas(c))
  const out: Array<Batch> = []
  if (moving.length > 0) {
    const size = positive(Math.ceil(limits.batchRatio * moving.length))
    const count = Math.ceil(moving.length / size)
    const cut = Array.from({ length: count }, () => ({
      changes: [] as Array<Change>,
      loads: new Map<Models.ServerId, number>(),
      bytes: 0
    }))
    for (const c of byLoad(moving, loadsOf(moving), sizeOf)) {
      const servers = touched(c)
      let best = -1
      let bestKey: ReadonlyArray<number> = []
      cut.forEach((b, i) => {
        if (b.changes.length >= size) return
        const ls = servers.map((s) => b.loads.get(s) ?? 0)
        const k = [Math.max(0, ...ls), ls.reduce((a, x) => a + x, 0), b.changes.length, b.bytes]
        if (best < 0 || less(k, bestKey)) {
          best = i
          bestKey = k
        }
      })
      const b = cut[best]!
      b.changes.push(c)
      b.bytes += sizeOf(c)
      for (const s of servers) b.loads.set(s, (b.loads.get(s) ?? 0) + 1)
    }
    for (const b of cut) out.push({ kind: "replicas", changes: b.changes })
  }
  if (leadership.length > 0) out.push({ kind: "leadership", changes: leadership })
  return out
}

/** Lexicographic `a < b`. */
const less = (a: ReadonlyArray<number>, b: ReadonlyArray<number>): boolean => {
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return a[i]! < b[i]!
  return false
}

/**
 * The waves of `batch`: each a set of moves that may run at once (no server touched by more than
 * `maxConcurrentMigrations`, at most `maxClusterMigrations` in all), every change in exactly one; the moves
 * touching the servers with the most moves left go first.
 *
 * @since 0.1.0
 */
export const waves = (
  batch: ReadonlyArray<Change>,
  limits: Pick<Limits, "maxConcurrentMigrations" | "maxClusterMigrations">,
  sizeOf: (change: Change) => number = () => 0
): ReadonlyArray<ReadonlyArray<Change>> => {
  const perServer = positive(limits.maxConcurrentMigrations)
  const cluster = positive(limits.maxClusterMigrations)
  let left: ReadonlyArray<Change> = batch
  const out: Array<Array<Change>> = []
  while (left.length > 0) {
    const wave: Array<Change> = []
    const busy = new Map<Models.ServerId, number>()
    const later: Array<Change> = []
    for (const c of byLoad(left, loadsOf(left), sizeOf)) {
      const servers = touched(c)
      if (wave.length < cluster && servers.every((s) => (busy.get(s) ?? 0) < perServer)) {
        wave.push(c)
        for (const s of servers) busy.set(s, (busy.get(s) ?? 0) + 1)
      } else later.push(c)
    }
    out.push(wave)
    left = later
  }
  return out
}

/**
 * The fewest unit-time waves `changes` can run in: max over servers of ⌈moves touching it / c⌉ (the issue's
 * bound, t = 1), and at least ⌈moves / C⌉ for the cluster cap C.
 *
 * @since 0.1.0
 */
export const makespanLowerBound = (
  changes: ReadonlyArray<Change>,
  limits: Pick<Limits, "maxConcurrentMigrations" | "maxClusterMigrations">
): number => {
  const c = positive(limits.maxConcurrentMigrations)
  let bound = Math.ceil(changes.length / positive(limits.maxClusterMigrations))
  for (const n of loadsOf(changes).values()) bound = Math.max(bound, Math.ceil(n / c))
  return bound
}

/**
 * The plan's changes as the executor runs them: the batches, each with its waves and lower bound, and the total
 * waves against the sum of the bounds.
 *
 * @since 0.1.0
 */
export const schedule = (
  changes: ReadonlyArray<Change>,
  limits: Limits,
  sizeOf: (change: Change) => number = () => 0
): Schedule => {
  const scheduled = batches(changes, limits, sizeOf).map(
    (b): ScheduledBatch => ({
      ...b,
      waves: waves(b.changes, limits, sizeOf),
      lowerBound: makespanLowerBound(b.changes, limits)
    })
  )
  const total = scheduled.reduce((n, b) => n + b.waves.length, 0)
  const bound = scheduled.reduce((n, b) => n + b.lowerBound, 0)
  return {
    batches: scheduled,
    waves: total,
    lowerBound: bound,
    wavesPerLowerBound: bound === 0 ? 1 : total / bound
  }
}
