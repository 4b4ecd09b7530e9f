/**
 * The faults the driver injects between steps: which kind strikes (crash, stop,
 * session expiry, a pause past the session, a short blip) and which process it
 * strikes, the leader more often than not.
 */
import type { Coordination } from "@strata/core"
import { Effect } from "effect"
import { pickWeighted } from "../../../../scripts/test-support/sim/FaultPick.js"
import * as Clock from "./Clock.js"
import type * as Prng from "./Prng.js"
import * as Process from "./Process.js"
import type { FaultKind, Proc, World } from "./World.js"

/** The kinds drawn between steps, with their weights (out of 100). */
const faultKinds: ReadonlyArray<readonly [FaultKind, number]> = [
  ["crash", 25],
  ["stop", 10],
  ["expire", 20],
  ["pause", 30],
  ["blip", 15]
]

/** Draws the kind of the next fault. */
const drawFault = (rng: Prng.Prng): FaultKind => pickWeighted(rng, faultKinds)

/** A running, unpaused process: the leader with probability 0.6 when there is one. */
const target = (w: World): Proc | undefined => {
  const candidates = w.procs.filter((p) => p.fiber !== undefined && !p.paused)
  const leaders = candidates.filter((p) => p.leading !== undefined)
  if (leaders.length > 0 && w.rng.chance(0.6)) return w.rng.pick(leaders)
  return candidates.length > 0 ? w.rng.pick(candidates) : undefined
}

/** Expires one of the process's live sessions, if it has one. */
const expireOne = (w: World, proc: Proc): Effect.Effect<void, Coordination.CoordinationError> =>
  Effect.gen(function* () {
    const sessions = yield* Effect.filter(Array.from(proc.current?.sessions ?? []), (s) =>
      Effect.map(s.state, (state) => state === "connected" || state === "suspended")
    )
    if (sessions.length === 0) return
    const s = w.rng.pick(sessions)
    Clock.log(w.clock, `FAULT expire session ${s.id} of p${proc.id}`)
    return yield* w.faults.expire(s)
  })

/** Draws a fault and strikes a process with it at `step`. */
export const inject = (w: World, step: number): Effect.Effect<void, Coordination.CoordinationError> =>
  Effect.gen(function* () {
    const kind = drawFault(w.rng)
    const proc = target(w)
    if (proc === undefined) return
    w.faultCounts[kind]++
    switch (kind) {
      case "crash":
        return yield* Process.kill(w, proc, step, true)
      case "stop":
        return yield* Process.kill(w, proc, step, false)
      case "expire":
        return yield* expireOne(w, proc)
      case "pause":
        return yield* Process.suspend(w, proc, step, w.sessionTimeoutMs + w.rng.int(100, 2000), "pause")
      case "blip":
        return yield* Process.suspend(w, proc, step, w.rng.int(1, w.sessionTimeoutMs - 2 * w.config.stepMs), "blip")
    }
  })
