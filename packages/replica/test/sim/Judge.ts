/**
 * The run's judgement once it settled (or failed to): the final logs against what was recorded (`Checkers.ts`),
 * the liveness failures (not settled within the bound, with every replica's state then; a process not running;
 * a probe not acknowledged; a tablet still moving, a replica a move took out not deleted, a server hosting a
 * tablet it is not assigned; a move neither completed nor cancelled), and the run's counts (the moves' among the
 * faults').
 */
import { Models } from "@strata/core"
import { Effect } from "effect"
import * as ReplicaState from "../../src/machines/ReplicaState.js"
import * as Audit from "./Audit.js"
import * as Checkers from "./Checkers.js"
import type { Result } from "./Config.js"
import * as Rebalances from "./Rebalances.js"
import type { World } from "./World.js"

/** Every running server's replicas at the end: state, leader HW and log end, its own log's range and HW. */
const replicaStates = (w: World) =>
  Effect.gen(function* () {
    const states: Array<string> = []
    for (const p of w.servers) {
      if (p.server === undefined) continue
      for (const v of yield* p.server.replicas) {
        const tl = yield* p.server.logOf(v.tablet)
        const own =
          tl === undefined
            ? ""
            : ` log [${yield* tl.logStartOffset}, ${yield* tl.logEndOffset}) hw ${yield* tl.highWatermark}`
        states.push(
          `${p.name}:${Models.tabletKey(v.tablet)}=${ReplicaState.describeState(v.machine)}${v.leader === undefined ? "" : ` hw ${v.leader.highWatermark} leo ${v.leader.logEndOffset}`}${own}`
        )
      }
    }
    return states
  })

/**
 * Judges the run: `settledAt` is when it settled (`undefined` if it did not), `probes` the probes' failures,
 * `longestLeaderless` the longest leaderless stretch seen. The trace ends here.
 */
export const judge = (
  w: World,
  settledAt: number | undefined,
  probes: ReadonlyArray<string>,
  longestLeaderless: number
) =>
  Effect.gen(function* () {
    const finalLogs = yield* Audit.finalLogs(w)
    w.clock.finished = true
    const violations: Array<string> = [...probes]
    if (settledAt === undefined) {
      violations.push(`replicas at the end: ${(yield* replicaStates(w)).join("; ")}`)
      violations.push(
        `not settled ${w.config.settleMs} ms after the faults stopped: ${finalLogs
          .map((f) => `${f.tablet} leader ${f.leader ?? "none"} isr [${f.meta?.leaderAndIsr.isr.join(",") ?? "?"}]`)
          .join("; ")}`
      )
    }
    for (const p of w.procs) {
      if (p.scope === undefined) violations.push(`${p.name} is not running at the end`)
    }
    violations.push(...(yield* Audit.misplaced(w)), ...Checkers.judgeMoves(w.record), ...Rebalances.judge(w))
    violations.push(...Checkers.judge(w.record, finalLogs))
    const stats = Checkers.stats(w.record)
    return {
      seed: w.seed,
      variant: w.variant.name,
      violations,
      trace: w.clock.trace,
      stats: {
        servers: w.cluster.serverCount,
        coordinators: w.cluster.coordinatorCount,
        ...stats,
        longestLeaderless,
        lostWrites: w.lostWrites,
        faults: { ...w.faultCounts, ...Checkers.moveStats(w.record), ...Checkers.deleteStats(w.record) }
      }
    } satisfies Result
  })
