/**
 * The fault tests' checker: what every replica holds, read from the replicas themselves (each tablet server's own
 * log through the `ReadLog` admin RPC, not the processes' reports), against what the producers were told.
 *
 * - lost: a record acknowledged at acks=all missing from the leader's log at its offset, or from an ISR member's;
 * - duplicates: a record (every value is unique) at two offsets of one log;
 * - divergent: two ISR members holding different records below the leader's high watermark (the prefix property);
 * - epoch conflicts: two replicas whose logs start a leader epoch at different offsets (two leaders of one epoch).
 */
import { Models } from "@strata/core"
import type { TabletClient } from "@strata/replica"
import { Effect } from "effect"

/** An acknowledged send: its tablet, its first offset, its records' values in order. */
export interface Acked {
  readonly tablet: Models.TabletId
  readonly baseOffset: number
  readonly values: ReadonlyArray<string>
}

/** What the checker found. */
export interface Report {
  readonly tablets: number
  readonly records: number
  readonly acked: number
  readonly lost: ReadonlyArray<string>
  readonly duplicates: ReadonlyArray<string>
  readonly divergent: ReadonlyArray<string>
  readonly epochConflicts: ReadonlyArray<string>
}

const decoder = new TextDecoder()

interface ReplicaLog {
  readonly server: number
  /** The value at each offset from the log's start. */
  readonly values: Map<number, string>
  /** Each leader epoch's first offset in this log. */
  readonly epochStarts: Map<number, number>
  readonly highWatermark: number
  readonly logEndOffset: number
}

/** A replica's whole log, read page by page from its own server. */
const readReplica = (client: TabletClient.TabletClientShape, server: number, tablet: Models.TabletId) =>
  Effect.gen(function* () {
    const values = new Map<number, string>()
    const epochStarts = new Map<number, number>()
    let offset = 0
    let highWatermark = 0
    let logEndOffset = 0
    while (true) {
      const page = yield* client.remote.server(server).readLog({ tablet, offset, maxBytes: 1_048_576 })
      highWatermark = page.highWatermark
      logEndOffset = page.logEndOffset
      if (offset < page.logStartOffset) offset = page.logStartOffset
      if (page.batches.length === 0) break
      for (const batch of page.batches) {
        if (!epochStarts.has(batch.epoch)) epochStarts.set(batch.epoch, batch.baseOffset)
        batch.records.forEach((r, i) => {
          values.set(batch.baseOffset + i, decoder.decode(r.value))
        })
        offset = batch.baseOffset + batch.records.length
      }
      if (offset >= logEndOffset) break
    }
    return { server, values, epochStarts, highWatermark, logEndOffset } satisfies ReplicaLog
  })

/** Checks every tablet of `table` against the acknowledged sends. */
export const check = (client: TabletClient.TabletClientShape, table: string, acked: ReadonlyArray<Acked>) =>
  Effect.gen(function* () {
    const metadata = yield* client.metadata(table)
    const lost: Array<string> = []
    const duplicates: Array<string> = []
    const divergent: Array<string> = []
    const epochConflicts: Array<string> = []
    let records = 0
    const byTablet = new Map<string, Array<Acked>>()
    for (const a of acked) {
      const key = Models.tabletKey(a.tablet)
      byTablet.set(key, [...(byTablet.get(key) ?? []), a])
    }
    for (const t of metadata.tablets) {
      const key = Models.tabletKey(t.tablet)
      const logs = yield* Effect.forEach(t.replicas, (server) => readReplica(client, server, t.tablet))
      const leader = logs.find((l) => l.server === t.leader)
      const isr = logs.filter((l) => t.isr.includes(l.server))
      records += leader?.values.size ?? 0
      for (const log of logs) {
        const seen = new Map<string, number>()
        for (const [offset, value] of log.values) {
          const before = seen.get(value)
          if (before !== undefined) duplicates.push(`${key} server ${log.server}: ${value} at ${before} and ${offset}`)
          seen.set(value, offset)
        }
      }
      for (const a of byTablet.get(key) ?? []) {
        a.values.forEach((value, i) => {
          const offset = a.baseOffset + i
          for (const log of isr) {
            const held = log.values.get(offset)
            if (held !== value) {
              lost.push(`${key}@${offset}: acked ${value}, server ${log.server} holds ${held ?? "nothing"}`)
            }
          }
        })
      }
      const hw = leader?.highWatermark ?? 0
      for (const log of isr) {
        if (leader === undefined || log === leader) continue
        for (let offset = 0; offset < hw; offset++) {
          if (log.values.get(offset) !== leader.values.get(offset)) {
            divergent.push(
              `${key}@${offset} (below the HW ${hw}): leader ${leader.server} holds ${leader.values.get(offset)}, server ${log.server} holds ${log.values.get(offset)}`
            )
            break
          }
        }
      }
      const starts = new Map<number, { readonly server: number; readonly offset: number }>()
      for (const log of logs) {
        for (const [epoch, offset] of log.epochStarts) {
          const other = starts.get(epoch)
          // A replica may have been truncated or reset past an epoch's start: only an epoch both logs hold from
          // their start compares, so compare where both logs begin at or before it.
          if (other === undefined) starts.set(epoch, { server: log.server, offset })
          else if (other.offset !== offset && log.values.has(Math.min(offset, other.offset))) {
            const otherLog = logs.find((l) => l.server === other.server)
            if (otherLog?.values.has(Math.min(offset, other.offset)) === true) {
              epochConflicts.push(
                `${key} epoch ${epoch}: starts at ${other.offset} on server ${other.server}, at ${offset} on server ${log.server}`
              )
            }
          }
        }
      }
    }
    return {
      tablets: metadata.tablets.length,
      records,
      acked: acked.reduce((n, a) => n + a.values.length, 0),
      lost,
      duplicates,
      divergent,
      epochConflicts
    } satisfies Report
  })
