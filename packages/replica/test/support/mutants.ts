/**
 * Planted bugs as mutants of the tablet server's machines (each wraps production's `Replica.step` or the follower
 * machine's start), of the controller's (each wraps `ControllerState.step`) and of a server's storage (each wraps its
 * logs): each breaks one safety rule, so the scenarios and the simulator can show that they catch it. Production code
 * carries none of them.
 */
import { Executor } from "@strata/rebalance"
import { Models } from "@strata/core"
import type * as ControllerState from "../../src/machines/ControllerState.js"
import * as FollowerState from "../../src/machines/FollowerState.js"
import * as LeaderEpochCache from "../../src/machines/LeaderEpochCache.js"
import * as Replica from "../../src/machines/Replica.js"
import type * as ServerStorage from "../../src/server/ServerStorage.js"
import type { MachinesShape } from "../../src/server/TabletServer.js"
import { Effect } from "effect"

/** A mutant: one planted bug, applied to the machines it breaks. */
export type Mutant = (machines: MachinesShape) => MachinesShape

/** Production's machines. */
export const production: MachinesShape = { replica: Replica.step, becomeFollower: FollowerState.become }

/** Production's machines with `mutants` applied. */
export const machinesWith = (...mutants: ReadonlyArray<Mutant>): MachinesShape =>
  mutants.reduce((machines, mutant) => mutant(machines), production)

/** A new follower truncates to its high watermark instead of asking its leader (Fluss's behaviour, Fluss #674). */
export const truncateToHighWatermark: Mutant = (m) => ({
  ...m,
  becomeFollower: (options) => {
    const hw = options.highWatermark
    const [state, commands] = m.becomeFollower({
      ...options,
      logEndOffset: Math.min(options.logEndOffset, hw),
      epochs: LeaderEpochCache.truncateFromEnd(options.epochs, hw)
    })
    return [state, [{ _tag: "Truncate", offset: hw }, ...commands]]
  }
})

/** A leader advances its high watermark while its ISR is below the minimum. */
export const highWatermarkIgnoresMinIsr: Mutant = (m) => ({
  ...m,
  replica: (state, input) => {
    const leader = state.leader
    if (leader === undefined) return m.replica(state, input)
    const [next, ready] = m.replica({ ...state, leader: { ...leader, minInsyncReplicas: 0 } }, input)
    return [
      next.leader === undefined
        ? next
        : { ...next, leader: { ...next.leader, minInsyncReplicas: leader.minInsyncReplicas } },
      ready
    ]
  }
})

/** A leader's ISR answers clear its pending change whichever proposal they answer (the review's defect 2). */
export const answersIgnoreProposal: Mutant = (m) => ({
  ...m,
  replica: (state, input) => {
    const pending = state.leader?.pending
    return input._tag === "IsrAnswer" && pending !== undefined
      ? m.replica(state, { ...input, proposal: pending.proposal })
      : m.replica(state, input)
  }
})

/**
 * A long-polled fetch is answered after the wait without checking that the replica still leads in its generation and
 * epoch (the review's defect 1).
 */
export const skipFetchRevalidation: Mutant = (m) => ({
  ...m,
  replica: (state, input) =>
    input._tag === "Recheck"
      ? [
          state,
          {
            commands: [],
            answer: {
              _tag: "Admitted",
              generation: input.generation,
              leaderEpoch: input.leaderEpoch,
              highWatermark: state.leader?.leaderEpoch === input.leaderEpoch ? state.leader.highWatermark : undefined
            }
          }
        ]
      : m.replica(state, input)
})

/** A controller's log-end question and an offline LeaderAndIsr leave a role under an older epoch running. */
export const unfencedLogEnd: Mutant = (m) => ({
  ...m,
  replica: (state, input) =>
    input._tag === "Fence" || (input._tag === "Instruction" && input.instruction.leaderAndIsr.leader === null)
      ? [state, { commands: [] }]
      : m.replica(state, input)
})

/** A delete answered as soon as the leader moved its own log start, not once every in-sync replica's had. */
export const deleteUnwaited: Mutant = (m) => ({
  ...m,
  replica: (state, input) => {
    const [next, ready] = m.replica(state, input)
    const waiting = ready.answer
    if (input._tag !== "RecordsDeleted" || waiting?._tag !== "Wait") return [next, ready]
    return [
      { ...next, deletes: next.deletes.filter((d) => d.ticket !== waiting.ticket) },
      { ...ready, answer: { _tag: "Done", highWatermark: waiting.highWatermark } }
    ]
  }
})

/** A delete admitted and answered whatever the ISR's size, as if the minimum ISR were 1. */
export const deleteIgnoresMinIsr: Mutant = (m) => ({
  ...m,
  replica: (state, input) => {
    if (input._tag !== "DeleteRecords" && input._tag !== "RecordsDeleted") return m.replica(state, input)
    const [next, ready] = m.replica({ ...state, config: { ...state.config, minInsyncReplicas: 1 } }, input)
    return [{ ...next, config: state.config }, ready]
  }
})

/** A leader that never takes a follower's later log start (the deletes an earlier leader made can come back). */
export const startNotRaised: Mutant = (m) => ({
  ...m,
  replica: (state, input) => {
    const [next, ready] = m.replica(state, input)
    if (!ready.commands.some((c) => c._tag === "RaiseLogStart")) return [next, ready]
    return [next, { ...ready, commands: ready.commands.filter((c) => c._tag !== "RaiseLogStart") }]
  }
})

/**
 * A storage whose logs' retention ignores the limit it is given (the replica's high watermark) and deletes up to the
 * log end: records not yet committed can go.
 */
export const retainPastLimit = (storage: ServerStorage.ServerStorageShape): ServerStorage.ServerStorageShape => ({
  ...storage,
  open: (tablet) =>
    Effect.map(storage.open(tablet), (log) => ({
      ...log,
      retain: (retention, _limit, nowMs) => Effect.flatMap(log.logEndOffset, (end) => log.retain(retention, end, nowMs))
    }))
})

/** An ISR change refused because the leadership is over is taken as not committed (its change dropped). */
export const fencedRefusalRejects: Mutant = (m) => ({
  ...m,
  replica: (state, input) => {
    if (input._tag !== "IsrAnswer" || input.reply._tag !== "IsrRejected") return m.replica(state, input)
    const r = input.reply.rejection
    const fenced =
      r._tag === "FencedLeaderEpoch" ||
      r._tag === "NotLeader" ||
      r._tag === "UnknownTablet" ||
      (r._tag === "InvalidVersion" && r.leaderAndIsr.leaderEpoch !== state.leader?.leaderEpoch)
    return fenced
      ? m.replica(state, {
          ...input,
          reply: { _tag: "IsrRejected", rejection: { _tag: "InvalidIsr", detail: r._tag } }
        })
      : m.replica(state, input)
  }
})

/** A mutant of the controller machine: one planted bug. */
export type ControllerMutant = (step: ControllerState.StepFunction) => ControllerState.StepFunction

/**
 * The controller accepts ISR expansions to dead, stopping or re-registered servers, and to replicas whose storage
 * failed (KIP-841's eligibility check skipped): the expansion is judged as if every server it names were eligible.
 */
export const skipIsrEligibility: ControllerMutant = (step) => (state, input) => {
  if (input._tag !== "AdjustIsr") return step(state, input)
  const named = new Set(input.isr)
  const eligible: ControllerState.State = {
    ...state,
    live: new Set([...state.live, ...named]),
    shuttingDown: new Set([...state.shuttingDown].filter((s) => !named.has(s))),
    storageFailed: new Map([...state.storageFailed].filter(([s]) => !named.has(s)))
  }
  const { registrations: _, ...unchecked } = input
  const [next, commands] = step(eligible, unchecked)
  return [{ ...next, live: state.live, shuttingDown: state.shuttingDown, storageFailed: state.storageFailed }, commands]
}

/**
 * The controller moves leadership back to a preferred replica that is outside the ISR: the balance is judged as if
 * every tablet's preferred replica were in its ISR (those it moves lead with it added, the others keep their ISR).
 */
export const preferOutsideIsr: ControllerMutant = (step) => (state, input) => {
  if (input._tag !== "BalanceLeaders") return step(state, input)
  const faked = new Map<string, ControllerState.Tablet>()
  const tablets = new Map(
    [...state.tablets].map(([key, t]) => {
      const preferred = t.replicas[0]
      if (preferred === undefined || t.leaderAndIsr.isr.includes(preferred)) return [key, t] as const
      const f = { ...t, leaderAndIsr: { ...t.leaderAndIsr, isr: [...t.leaderAndIsr.isr, preferred] } }
      faked.set(key, f)
      return [key, f] as const
    })
  )
  const [next, commands] = step({ ...state, tablets }, input)
  // The tablets it did not move keep their real ISR.
  const restored = new Map(
    [...next.tablets].map(([key, t]) => [key, faked.get(key) === t ? state.tablets.get(key)! : t] as const)
  )
  return [{ ...next, tablets: restored }, commands]
}

/**
 * The controller finishes a move without waiting for the adding replicas to be in the ISR: a `Reassign` is judged as
 * if every target replica were in the tablet's ISR already, so the move ends in the step that begins it — the
 * leaving replicas deleted (leadership moving to a new replica when the leader leaves) while the new ones hold
 * nothing. A refused request leaves the state as it was.
 */
export const removeBeforeIsr: ControllerMutant = (step) => (state, input) => {
  if (input._tag !== "Reassign") return step(state, input)
  const key = Models.tabletKey(input.tablet)
  const t = state.tablets.get(key)
  if (t === undefined) return step(state, input)
  const isr = [...t.leaderAndIsr.isr, ...input.target.filter((s) => !t.leaderAndIsr.isr.includes(s))]
  const faked: ControllerState.State = {
    ...state,
    tablets: new Map(state.tablets).set(key, { ...t, leaderAndIsr: { ...t.leaderAndIsr, isr } })
  }
  const [next, commands] = step(faked, input)
  return [next === faked ? state : next, commands]
}

/**
 * Planted bugs of the executor the family must catch: the gate ignored (every observation made to look healthy to
 * the machine), and a failed gate's rollback skipped (the rebalance pauses with the batch's moves left running).
 */
export const gateIgnored: Executor.StepFunction = (state, input) =>
  Executor.step(
    state,
    input._tag === "Observe"
      ? {
          ...input,
          cluster: {
            ...input.cluster,
            live: new Set([...input.cluster.live, ...(state.baseline?.live ?? [])]),
            health: new Map(),
            tablets: input.cluster.tablets.map((t) => ({
              ...t,
              online: true,
              isr: t.replicas
            }))
          }
        }
      : input
  )

/** See {@link gateIgnored}. */
export const rollbackSkipped: Executor.StepFunction = (state, input) => {
  const [next, commands] = Executor.step(state, input)
  if (next.phase !== "rolling-back" || state.phase === "rolling-back") return [next, commands]
  const kept: Executor.State = {
    ...next,
    phase: "paused",
    moves: next.moves.map((m) =>
      m.after !== "rollback"
        ? m
        : m.status === "cancelling"
          ? { ...m, status: "moving", after: undefined }
          : { ...m, status: "done", after: undefined, from: m.to, to: m.from }
    )
  }
  return [
    kept,
    [
      ...commands.filter((c) => c._tag !== "CancelReassign" && c._tag !== "Reassign" && c._tag !== "Persist"),
      { _tag: "Persist", state: kept },
      { _tag: "Ended", outcome: "paused" }
    ]
  ]
}
