/**
 * A tablet server's health as it answers `Holdings` (`ReplicaManager.ServerHealth`): the latencies of its last 1024
 * appends as leader with when each was answered, in a ring (two array writes an append), their p99 taken over those
 * of the last minute when asked; and its count of ISR shrinks.
 *
 * @internal
 */
import type * as ReplicaManager from "../../protocol/ReplicaManager.js"

/** How many appends the ring keeps. */
export const ringSize = 1024

/** How far back, in ms, an append still counts towards the p99. */
export const windowMs = 60_000

/** A server's health record. */
export interface Health {
  /** An append answered at `atMs` (wall clock) after `latencyMs`. */
  readonly appended: (atMs: number, latencyMs: number) => void
  /** A committed ISR change removed members of a tablet the server leads. */
  readonly shrunk: () => void
  /** The health at `nowMs`: the p99 of the appends of the window (absent when there was none), and the shrinks. */
  readonly at: (nowMs: number) => ReplicaManager.ServerHealth
}

/**
 * The nearest-rank 99th percentile of `values` (`undefined` when there are none).
 */
export const p99 = (values: ReadonlyArray<number>): number | undefined => {
  if (values.length === 0) return undefined
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.ceil(0.99 * sorted.length) - 1]
}

/** A health record with no append and no shrink. */
export const make = (): Health => {
  const latencies = new Float64Array(ringSize)
  const times = new Float64Array(ringSize)
  let count = 0
  let next = 0
  let shrinks = 0
  return {
    appended: (atMs, latencyMs) => {
      latencies[next] = latencyMs
      times[next] = atMs
      next = (next + 1) % ringSize
      if (count < ringSize) count++
    },
    shrunk: () => {
      shrinks++
    },
    at: (nowMs) => {
      const recent: Array<number> = []
      for (let i = 0; i < count; i++) if ((times[i] ?? 0) >= nowMs - windowMs) recent.push(latencies[i] ?? 0)
      const p = p99(recent)
      return p === undefined ? { isrShrinks: shrinks } : { appendLatencyP99Ms: p, isrShrinks: shrinks }
    }
  }
}
