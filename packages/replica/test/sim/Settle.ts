/**
 * The end of the faults and the liveness bound: every fault ends, the producers stop, and the clock steps until the
 * cluster settles — every process running, every tablet led by a live leader in that role with every replica in
 * its ISR and its HW at its log end, no tablet moving, every replica a move took out deleted and every running
 * server hosting exactly the tablets it is assigned — within the settle bound; then, on a seed that moves replica
 * sets, a move or two in the quiet cluster, each settled in turn.
 */
import { Models } from "@strata/core"
import { Effect } from "effect"
import * as Clock from "../../../../scripts/test-support/sim/Clock.js"
import * as Audit from "./Audit.js"
import * as Faults from "./Faults.js"
import * as Reassignments from "./Reassignments.js"
import * as Rebalances from "./Rebalances.js"
import * as Workload from "./Workload.js"
import { log, now, type World } from "./World.js"

/**
 * Every tablet has a live leader, in that role, with every replica in its ISR and its HW at its log end; no tablet
 * moves, and the replicas are where coordination assigns them.
 */
const settled = (w: World) =>
  Effect.gen(function* () {
    if (w.procs.some((p) => p.scope === undefined || p.paused || p.stopping)) return false
    for (const tablet of w.cluster.tablets) {
      const meta = yield* Audit.readTablet(w, tablet)
      if (meta === undefined || meta.leaderAndIsr.leader === null) return false
      if (meta.leaderAndIsr.isr.length !== meta.replicas.length) return false
      const leader = w.byName.get(`s${meta.leaderAndIsr.leader}`)?.server
      if (leader === undefined) return false
      const view = (yield* leader.replicas).find((v) => Models.tabletKey(v.tablet) === Models.tabletKey(tablet))
      if (view?.leader?.leaderEpoch !== meta.leaderAndIsr.leaderEpoch) return false
      if (view.leader.highWatermark !== view.leader.logEndOffset) return false
    }
    return w.reassigning.size === 0 && (yield* Audit.misplaced(w)).length === 0
  })

/** The faults stop: every one ends now, and the producers and the consumer finish. */
export const stopFaults = (w: World, wl: Workload.Workload) =>
  Effect.gen(function* () {
    w.faultsOn = false
    yield* Faults.heal(w, w.config.steps, true)
    log(w, "faults stop")
    wl.producing = false
  })

/**
 * Steps the clock until the cluster settles and the producers ended, within the settle bound: how long it took,
 * or `undefined` if it did not.
 */
export const settle = (w: World, wl: Workload.Workload) =>
  Effect.gen(function* () {
    const { config } = w
    for (let waited = 0; waited < config.settleMs; waited += config.stepMs) {
      yield* Faults.heal(w, config.steps, true)
      yield* Clock.tick(w.clock)
      yield* Audit.sample(w)
      yield* Reassignments.sample(w)
      yield* Rebalances.sample(w)
      if (Workload.ended(wl) && (yield* settled(w))) {
        // Settled: whatever the faults left behind is over.
        w.calmFromMs = Math.min(w.calmFromMs, now(w))
        return waited
      }
    }
    return undefined
  })

/**
 * On a seed that moves replica sets, once settled: one or two moves in the quiet cluster, each settled in turn (so
 * the checker of quiet times samples each from its start to its end); when the last settled, or `undefined` if one
 * did not.
 */
export const quietMoves = (w: World, wl: Workload.Workload) =>
  Effect.gen(function* () {
    const mv = w.cluster.moves
    let settledAt: number | undefined = 0
    for (let n = mv === undefined ? 0 : mv.int(1, 2); n > 0 && settledAt !== undefined; n--) {
      if (yield* Reassignments.quietMove(w, mv!)) settledAt = yield* settle(w, wl)
    }
    return settledAt
  })
