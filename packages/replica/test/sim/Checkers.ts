/**
 * The cluster simulator's checkers: what the run records as it goes (appends and their outcomes, replicas sampled
 * after every step, LeaderAndIsr requests applied, ISR changes committed) and the judgement of the final logs.
 */
import type { TabletBatch } from "@strata/core"
import { tabletKey } from "@strata/core"
import type { LeaderEpochCache } from "../../src/machines/LeaderEpochCache.js"
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
  readonly batches: ReadonlyArray<TabletBatch>
}

/** One tablet at the end: its leader by coordination, and every replica's log. */
export interface FinalTablet {
  readonly tablet: string
  readonly leader: string | undefined
  readonly replicas: ReadonlyArray<FinalReplica>
}

const decoder = new TextDecoder()

/** The records of a log by offset: the epoch that wrote each and its value. */
const flatten = (batches: ReadonlyArray<TabletBatch>) => {
  const out = new Map<number, { readonly epoch: number; readonly value: string }>()
  for (const b of batches) {
    b.records.forEach((r, i) => {
      out.set(b.baseOffset + i, { epoch: b.epoch, value: decoder.decode(r.value) })
    })
  }
  return out
}

/** Keeps the first few violations of each kind (a broken run repeats itself). */
const limited = () => {
  const seen = new Map<string, number>()
  const out: Array<string> = []
  return {
    add: (kind: string, line: string) => {
      const n = (seen.get(kind) ?? 0) + 1
      seen.set(kind, n)
      if (n <= 3) out.push(line)
    },
    lines: () => out
  }
}

/** A fresh recorder for one run; `minIsr` is the cluster's minimum ISR. */
export const recorder = (minIsr: number) => {
  const appends: Array<{ readonly tablet: string; readonly values: ReadonlyArray<string>; readonly outcome: Outcome }> =
    []
  const leaders = new Map<string, Set<string>>()
  const highWatermarks = new Map<string, number>()
  const applied = new Map<string, number>()
  const coordinatorEpochs = new Set<number>()
  /** What the consumer was given: per tablet, the value at each offset read, and when it was first read. */
  const reads = new Map<string, Map<number, { readonly value: string; readonly at: number }>>()
  /** Each server's log end and epochs per tablet, as last sampled (a stopped server's log keeps what it had). */
  const logEnds = new Map<string, Map<string, { readonly end: number; readonly epochs: LeaderEpochCache }>>()
  /** Per tablet, the running servers whose log was closed (offline) when last sampled: how far it reaches, unknown. */
  const closed = new Map<string, Set<string>>()
  const violations = limited()

  return {
    /** A replica's log end and epoch cache, sampled. */
    logEnd: (server: string, tablet: string, end: number, epochs: LeaderEpochCache) => {
      const ends = logEnds.get(tablet) ?? new Map<string, { readonly end: number; readonly epochs: LeaderEpochCache }>()
      ends.set(server, { end, epochs })
      logEnds.set(tablet, ends)
      closed.get(tablet)?.delete(server)
    },

    /**
     * A running server's replica whose log is closed (offline after a store failure): it may have copied more since
     * its last sample, so it is neither counted nor ruled out as a holder until its log is read again.
     */
    logClosed: (server: string, tablet: string) => {
      const set = closed.get(tablet) ?? new Set<string>()
      set.add(server)
      closed.set(tablet, set)
    },

    append: (tablet: string, values: ReadonlyArray<string>, outcome: Outcome) => {
      appends.push({ tablet, values, outcome })
    },

    /** A record a consumer was given; read again, it must be the same record. */
    read: (tablet: string, offset: number, value: string, at: number) => {
      const seen = reads.get(tablet) ?? new Map<number, { readonly value: string; readonly at: number }>()
      reads.set(tablet, seen)
      const before = seen.get(offset)
      if (before === undefined) seen.set(offset, { value, at })
      else if (before.value !== value) {
        violations.add(
          "read",
          `t=${at} ${tablet}: a consumer read ${value} at offset ${offset}, where it read ${before.value} at t=${before.at}`
        )
      }
    },

    /**
     * A replica sampled after a step (`epochs`: its log's epoch cache): one leader per (tablet, epoch); a leader's HW
     * only forward, within its log, and held by `minIsr` replicas.
     */
    replica: (server: string, incarnation: number, view: ReplicaView, at: number, epochs: LeaderEpochCache) => {
      const l = view.leader
      if (view.machine._tag !== "LeaderReplica" || l === undefined) return
      const key = `${tabletKey(view.tablet)}@${l.leaderEpoch}`
      const who = leaders.get(key) ?? new Set<string>()
      who.add(server)
      leaders.set(key, who)
      if (who.size > 1) violations.add("leaders", `t=${at} two leaders of ${key}: ${[...who].join(", ")}`)
      if (l.highWatermark > l.logEndOffset) {
        violations.add("hw", `t=${at} ${server}: ${key} HW ${l.highWatermark} past its log end ${l.logEndOffset}`)
      }
      const hwKey = `${server}.${incarnation}|${key}`
      const before = highWatermarks.get(hwKey)
      // KIP-966: a HW counts only records at least minInsyncReplicas replicas hold (checked as it advances): a
      // holder's log reaches the HW and its record below it was written in the same epoch as the leader's.
      const last = l.highWatermark - 1
      const unknown = closed.get(tabletKey(view.tablet)) ?? new Set<string>()
      const holders = [...(logEnds.get(tabletKey(view.tablet)) ?? [])].filter(
        ([s, e]) =>
          !unknown.has(s) && e.end >= l.highWatermark && (last < 0 || epochAt(e.epochs, last) === epochAt(epochs, last))
      )
      if (before !== undefined && l.highWatermark > before && holders.length + unknown.size < minIsr) {
        violations.add(
          "min-isr",
          `t=${at} ${server}: ${key} HW ${l.highWatermark} is held by ${holders.length} replicas, fewer than ${minIsr}`
        )
      }
      if (before !== undefined && l.highWatermark < before) {
        violations.add("hw", `t=${at} ${server}: ${key} HW went back from ${before} to ${l.highWatermark}`)
      }
      highWatermarks.set(hwKey, l.highWatermark)
    },

    /**
     * A tablet's committed ISR members (each the life it joined as) against its leader's HW: each holds every offset
     * below it, written in the same epoch as the leader's record there (so the same record: one leader per epoch).
     * Any of them may be elected cleanly next; one that does not hold the leader's log would lose what was
     * acknowledged.
     */
    isrHolds: (
      tablet: string,
      leader: string,
      hw: number,
      leaderEpochs: LeaderEpochCache,
      members: ReadonlyArray<{ readonly server: string; readonly end: number; readonly epochs: LeaderEpochCache }>,
      at: number
    ) => {
      for (const m of members) {
        if (m.end < hw) {
          violations.add(
            "isr-holds",
            `t=${at} ${tablet}: ISR member ${m.server} has no record at offset ${m.end}, below the HW ${hw} of its leader ${leader}`
          )
          continue
        }
        // The epoch at an offset changes only where a cache entry starts: comparing there compares every offset.
        const starts = [...leaderEpochs, ...m.epochs].map((e) => e.startOffset).filter((o) => o < hw)
        const differs = starts.sort((a, b) => a - b).find((o) => epochAt(m.epochs, o) !== epochAt(leaderEpochs, o))
        if (differs !== undefined) {
          violations.add(
            "isr-holds",
            `t=${at} ${tablet}: ISR member ${m.server} and its leader ${leader} differ at offset ${differs} below the HW ${hw} (epoch ${epochAt(m.epochs, differs)} vs ${epochAt(leaderEpochs, differs)})`
          )
        }
      }
    },

    /** A LeaderAndIsr a tablet server applied: never below the highest coordinator epoch it applied before. */
    applied: (server: string, incarnation: number, coordinatorEpoch: number) => {
      const key = `${server}.${incarnation}`
      const highest = applied.get(key) ?? 0
      if (coordinatorEpoch < highest) {
        violations.add(
          "coordinator-epoch",
          `${key} applied a LeaderAndIsr of coordinator epoch ${coordinatorEpoch} after one of ${highest}`
        )
      }
      applied.set(key, Math.max(highest, coordinatorEpoch))
    },

    /** A committed ISR change: every server it adds was registered (live) when the leader asked (KIP-841). */
    isrChange: (
      tablet: string,
      before: ReadonlyArray<number>,
      after: ReadonlyArray<number>,
      registered: ReadonlySet<number>
    ) => {
      for (const s of after) {
        if (!before.includes(s) && !registered.has(s)) {
          violations.add("isr", `${tablet}: the ISR gained server ${s}, which was not registered`)
        }
      }
    },

    coordinatorEpoch: (epoch: number) => {
      coordinatorEpochs.add(epoch)
    },

    /** The end: nothing acknowledged lost, nothing twice, replicas agree below their common HW. */
    judge: (tablets: ReadonlyArray<FinalTablet>): ReadonlyArray<string> => {
      const out = limited()
      for (const t of tablets) {
        const leader = t.replicas.find((r) => r.server === t.leader)
        if (leader === undefined) {
          // Nothing to judge against is itself a failure when something was acknowledged.
          if (appends.some((a) => a.tablet === t.tablet && a.outcome._tag === "Acked")) {
            out.add("lost", `${t.tablet}: no leader at the end: every acknowledged record is lost to its readers`)
          }
          continue
        }
        const log = flatten(leader.batches)
        for (const [offset, r] of reads.get(t.tablet) ?? []) {
          const at = log.get(offset)
          if (at === undefined || offset >= leader.hw || at.value !== r.value) {
            out.add(
              "read",
              `${t.tablet}: a consumer read ${r.value} at offset ${offset} (t=${r.at}), which is not committed there at the end (the leader has ${at?.value ?? "nothing"}, HW ${leader.hw})`
            )
          }
        }
        const counts = new Map<string, number>()
        for (const { value } of log.values()) counts.set(value, (counts.get(value) ?? 0) + 1)
        for (const [value, n] of counts) if (n > 1) out.add("dup", `${t.tablet}: ${value} is in the log ${n} times`)
        for (const a of appends) {
          if (a.tablet !== t.tablet || a.outcome._tag !== "Acked") continue
          const base = a.outcome.baseOffset
          a.values.forEach((value, i) => {
            const at = log.get(base + i)
            if (at === undefined || base + i >= leader.hw || at.value !== value) {
              out.add(
                "lost",
                `${t.tablet}: acknowledged ${value} at offset ${base + i} is lost (the leader ${t.leader} has ${at?.value ?? "nothing"} there, HW ${leader.hw})`
              )
            }
          })
        }
        for (let i = 0; i < t.replicas.length; i++) {
          for (let j = i + 1; j < t.replicas.length; j++) {
            const a = t.replicas[i]!
            const b = t.replicas[j]!
            const la = flatten(a.batches)
            const lb = flatten(b.batches)
            const upTo = Math.min(a.hw, b.hw)
            // Below both HWs both hold every offset from where both logs start.
            const from = Math.max(a.batches[0]?.baseOffset ?? upTo, b.batches[0]?.baseOffset ?? upTo)
            for (let o = from; o < upTo; o++) {
              const x = la.get(o)
              const y = lb.get(o)
              if (x === undefined || y === undefined) {
                out.add(
                  "prefix",
                  `${t.tablet}: ${x === undefined ? a.server : b.server} has no record at offset ${o}, below the HWs of ${a.server} and ${b.server} (${a.hw}, ${b.hw})`
                )
                break
              }
              if (x.value !== y.value || x.epoch !== y.epoch) {
                out.add(
                  "prefix",
                  `${t.tablet}: ${a.server} and ${b.server} differ at offset ${o} below their HWs (${a.hw}, ${b.hw}): ${x.value}@${x.epoch} vs ${y.value}@${y.epoch}`
                )
                break
              }
            }
          }
        }
      }
      return [...violations.lines(), ...out.lines()]
    },

    stats: () => ({
      acked: appends.filter((a) => a.outcome._tag === "Acked").length,
      failed: appends.filter((a) => a.outcome._tag === "Failed").length,
      unknown: appends.filter((a) => a.outcome._tag === "Unknown").length,
      reads: [...reads.values()].reduce((n, m) => n + m.size, 0),
      leaderChanges: leaders.size,
      coordinatorEpochs: coordinatorEpochs.size
    })
  }
}
