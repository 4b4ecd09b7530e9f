/**
 * The cluster simulator's checkers: what the run records as it goes (appends and their outcomes, replicas sampled
 * after every step, LeaderAndIsr requests applied, ISR changes committed) and the judgement of the final logs.
 */
import type { TabletBatch } from "@strata/core"
import { tabletKey } from "@strata/core"
import type { ReplicaView } from "../../src/TabletServer.js"

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
  /** Each server's log end per tablet, as last sampled (a stopped server's log keeps what it had). */
  const logEnds = new Map<string, Map<string, number>>()
  const violations = limited()

  return {
    /** A replica's log end, sampled. */
    logEnd: (server: string, tablet: string, end: number) => {
      const ends = logEnds.get(tablet) ?? new Map<string, number>()
      ends.set(server, end)
      logEnds.set(tablet, ends)
    },

    append: (tablet: string, values: ReadonlyArray<string>, outcome: Outcome) => {
      appends.push({ tablet, values, outcome })
    },

    /** A replica sampled after a step: one leader per (tablet, epoch); a leader's HW only forward, within its log. */
    replica: (server: string, incarnation: number, view: ReplicaView, at: number) => {
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
      // KIP-966: a HW counts only records at least minInsyncReplicas replicas hold (checked as it advances).
      const holders = [...(logEnds.get(tabletKey(view.tablet))?.values() ?? [])].filter((e) => e >= l.highWatermark)
      if (before !== undefined && l.highWatermark > before && holders.length < minIsr) {
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
        if (leader === undefined) continue
        const log = flatten(leader.batches)
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
            for (let o = 0; o < upTo; o++) {
              const x = la.get(o)
              const y = lb.get(o)
              if (x === undefined || y === undefined) continue
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
      leaderChanges: leaders.size,
      coordinatorEpochs: coordinatorEpochs.size
    })
  }
}
