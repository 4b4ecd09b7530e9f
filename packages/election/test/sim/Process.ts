/**
 * The simulated coordinator processes: an incarnation runs its own election and
 * a real `Coordinator` (the lifecycle machine and shell) with the leader
 * service; the faults start, kill (`kill -9` or a clean stop) and pause them. A
 * paused process stops at its gate, its connections cut, and resumes with its
 * timers overdue, learning of what happened meanwhile only once reconnected.
 */
import { Coordination, Election as CoreElection } from "@strata/core"
import { Duration, Effect, Fiber, Latch, Scope } from "effect"
import * as Coordinator from "../../src/Coordinator.js"
import * as Election from "../../src/internal/election.js"
import * as Clock from "./Clock.js"
import * as Network from "./Network.js"
import { coordinationOf } from "./ProcessCoordination.js"
import * as Workload from "./Workload.js"
import { type Incarnation, namespace, type Proc, type World } from "./World.js"

/** `count` processes, numbered from 1, none started. */
export const makeProcs = (count: number): Array<Proc> => {
  const procs: Array<Proc> = []
  for (let id = 1; id <= count; id++) {
    procs.push({
      id,
      gate: Latch.makeUnsafe(true),
      paused: false,
      incarnations: 0,
      current: undefined,
      fiber: undefined,
      leading: undefined
    })
  }
  return procs
}

/**
 * Before every coordination operation of a process: maybe a fault (its session expires, or it pauses past its
 * session) or an interleaving point, then a wait while the process is paused.
 */
const faultPoint = (
  w: World,
  proc: Proc,
  inc: Incarnation,
  s: Coordination.Session,
  name: string
): Effect.Effect<void, Coordination.CoordinationError> =>
  Effect.suspend(() => {
    if (!w.faultsOn) return proc.gate.await
    const roll = w.rng.next()
    const { expire, pause, yield: interleave } = w.config.opFaults
    let fault: Effect.Effect<void, Coordination.CoordinationError> = Effect.void
    if (roll < expire) {
      w.faultCounts["op-expire"]++
      Clock.log(w.clock, `FAULT expire session ${s.id} of p${proc.id} before its ${name}`)
      fault = w.faults.expire(s)
    } else if (roll < expire + pause && !proc.paused && proc.current === inc) {
      w.faultCounts["op-pause"]++
      fault = suspend(w, proc, w.clock.step, w.sessionTimeoutMs + w.rng.int(100, 2000), `pause before its ${name}`)
    } else if (roll < expire + pause + interleave) fault = Effect.yieldNow
    return Effect.andThen(fault, proc.gate.await)
  })

/**
 * One incarnation of a process: its own election and a `Coordinator` (the real lifecycle machine and shell)
 * running the leader service. A shell that dies ends the incarnation with its defect, which the run reports.
 */
const runProcess = (w: World, proc: Proc): Effect.Effect<never> =>
  Effect.scoped(
    Effect.gen(function* () {
      proc.incarnations++
      const inc: Incarnation = {
        number: proc.incarnations,
        crashed: false,
        sessions: new Set(),
        term: undefined,
        session: undefined
      }
      proc.current = inc
      Clock.log(w.clock, `p${proc.id}.${inc.number} starts`)
      const host = yield* Scope.fork(w.scope, "sequential")
      const coordination = coordinationOf(w, proc, inc, host, (s, name) => faultPoint(w, proc, inc, s, name))
      const election = yield* Election.make(
        { namespace, sessionTimeout: Duration.millis(w.sessionTimeoutMs) },
        w.variant.unsafe ?? {}
      ).pipe(Effect.provideService(Coordination.Coordination, coordination), Effect.orDie)
      const coordinator = yield* Coordinator.make({
        serverId: proc.id,
        address: `p${proc.id}`,
        rejoinBackoff: Duration.millis(w.rng.int(20, 200)),
        services: [Workload.leaderService(w, proc, inc)]
      }).pipe(Effect.provideService(CoreElection.Election, election), Effect.orDie)
      yield* coordinator.join
      return yield* Effect.never
    })
  )

/** Starts the process's next incarnation. */
export const start = (w: World, proc: Proc): Effect.Effect<void> =>
  Effect.map(Effect.andThen(proc.gate.open, Effect.forkIn(runProcess(w, proc), w.scope)), (fiber) => {
    proc.fiber = fiber
  })

/**
 * Ends the process's incarnation: a crash (`kill -9`) stops it at once and leaves its sessions, cut off, to
 * expire; a stop closes them. It restarts a few steps later.
 */
export const kill = (
  w: World,
  proc: Proc,
  step: number,
  crash: boolean
): Effect.Effect<void, Coordination.CoordinationError> =>
  Effect.gen(function* () {
    const fiber = proc.fiber
    const inc = proc.current
    if (fiber === undefined || inc === undefined) return
    if (crash) {
      // kill -9 stops the process at once: nothing of it runs after this point.
      inc.crashed = true
      yield* proc.gate.close
      for (const s of Array.from(inc.sessions)) yield* Network.disconnect(w.network, s)
    }
    proc.fiber = undefined
    yield* Fiber.interrupt(fiber)
    proc.leading = undefined
    const restart = step + w.rng.int(3, 25)
    Clock.log(
      w.clock,
      `FAULT ${crash ? "crash (kill -9)" : "stop"} p${proc.id}.${inc.number}, restart at step ${restart}`
    )
    Clock.later(w.clock, restart, start(w, proc))
  })

/**
 * Pauses the process for `ms` (`kind` names the fault in the trace): it stops at its gate and its connections
 * are cut. When it resumes, its overdue timers run first and its connections come back a moment later.
 */
export const suspend = (
  w: World,
  proc: Proc,
  step: number,
  ms: number,
  kind: string
): Effect.Effect<void, Coordination.CoordinationError> =>
  Effect.gen(function* () {
    const inc = proc.current
    if (inc === undefined) return
    proc.paused = true
    yield* proc.gate.close
    const sessions = Array.from(inc.sessions)
    for (const s of sessions) yield* Network.disconnect(w.network, s)
    const resume = step + Clock.stepsFor(w.clock, ms)
    Clock.log(
      w.clock,
      `FAULT ${kind} of p${proc.id}.${inc.number} (${proc.leading === undefined ? "candidate" : `leader e${proc.leading.epoch}`}) until step ${resume}`
    )
    Clock.later(w.clock, resume, resumeLater(w, proc, inc, sessions))
  })

/** A paused process resumes: its gate opens, and its connections are restored `lag` ms later. */
const resumeLater = (w: World, proc: Proc, inc: Incarnation, sessions: ReadonlyArray<Coordination.Session>) =>
  Effect.gen(function* () {
    proc.paused = false
    yield* proc.gate.open
    // Its overdue timers run first: the client learns what happened meanwhile only when it has reconnected,
    // a moment later.
    const lag = w.rng.int(1, 50)
    Clock.log(w.clock, `p${proc.id}.${inc.number} resumes, reconnecting in ${lag}ms`)
    yield* Effect.forkIn(
      Effect.andThen(
        Effect.sleep(Duration.millis(lag)),
        // A process crashed meanwhile stays cut off.
        Effect.suspend(() =>
          inc.crashed
            ? Effect.void
            : Effect.forEach(sessions, (s) => Network.reconnect(w.network, s), { discard: true })
        )
      ),
      w.scope
    )
  })
