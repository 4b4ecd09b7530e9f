/**
 * A rebalance's status as an operator reads it (`strata rebalance status|start|pause|resume|cancel`): what runs, how
 * far it is, why it waits or paused, and what the trigger will do next — the lines that answer the seed's
 * troubleshooting rows ("never triggers", "stuck", "latency spikes during migration").
 *
 * @since 0.1.0
 */
import type { RebalanceService } from "@strata/rebalance"

const fmt = (x: number): string => String(Number(x.toFixed(4)))

/** A span of milliseconds as `1h 2m`, `3m 4s` or `5.6s`. */
const span = (ms: number): string => {
  const s = Math.max(0, ms) / 1000
  if (s < 60) return `${s.toFixed(1)}s`
  const m = Math.floor(s / 60)
  if (m < 60) return `${m}m ${Math.floor(s % 60)}s`
  return `${Math.floor(m / 60)}h ${m % 60}m`
}

const phaseWords: Readonly<Record<string, string>> = {
  measuring: "measuring its baseline (append latency, ISR shrinks) before the first batch",
  running: "running",
  gating: "waiting at the stability gate before the next batch",
  "rolling-back": "rolling its batch back (the stability gate failed)",
  paused: "paused",
  cancelling: "cancelling (moves under way go back)",
  completed: "completed",
  cancelled: "cancelled"
}

/**
 * The status as lines.
 *
 * @since 0.1.0
 */
export const lines = (status: RebalanceService.Status): ReadonlyArray<string> => {
  const out: Array<string> = []
  const r = status.rebalance
  if (r === undefined) out.push("no rebalance has run under this controller's namespace")
  else {
    const age = (r.endedAtMs ?? status.nowMs) - r.startedAtMs
    out.push(
      `rebalance ${r.id} (${r.reason}): ${phaseWords[r.phase] ?? r.phase}, batch ${r.batch} of ${r.batches}, ${span(age)} ${r.endedAtMs === undefined ? "so far" : "in all"}`
    )
    out.push(
      `  moves: ${r.movesDone} done of ${r.movesTotal}, ${r.movesActive} under way, ${r.movesCancelled} cancelled, ${r.movesSkipped} skipped; ${r.bytesMoved} bytes moved`
    )
    out.push(
      `  imbalance: ${fmt(r.imbalanceBefore)} before, ${fmt(r.imbalancePlanned)} planned${status.imbalanceAfter === undefined ? "" : `, ${fmt(status.imbalanceAfter)} after`}`
    )
    out.push(`  stability gate: ${r.gateFailures} failures, ${r.rollbacks} batches rolled back`)
    if (r.detail !== undefined) out.push(`  why: ${r.detail}`)
    for (const m of r.active.slice(0, 20))
      out.push(
        `  under way: ${m.tablet} → [${m.to.join(",")}] ${m.status}, attempt ${m.attempts}${m.sinceMs === undefined ? "" : `, for ${span(status.nowMs - m.sinceMs)}`}`
      )
    if (r.active.length > 20) out.push(`  … and ${r.active.length - 20} more under way`)
  }
  const t = status.trigger
  const parts = [
    t.enabled ? "enabled" : "disabled (rebalance starts only by hand)",
    `threshold ${fmt(t.threshold)}`,
    t.lastImbalance === undefined ? "no check yet" : `last imbalance ${fmt(t.lastImbalance)}`,
    t.armed ? "armed" : `disarmed until the imbalance falls below ${fmt(t.threshold / 2)} or the servers change`,
    t.cooldownUntilMs === undefined ? undefined : `cooling down for ${span(t.cooldownUntilMs - status.nowMs)}`,
    `checks every ${span(t.checkIntervalMs)} and when a server joins`
  ]
  out.push(`trigger: ${parts.filter((p) => p !== undefined).join(", ")}`)
  return out
}
