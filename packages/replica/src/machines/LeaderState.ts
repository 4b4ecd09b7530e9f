/**
 * A tablet leader's replication state as a pure function: its followers' progress, the in-sync replica set (ISR)
 * and the high watermark (HW), Kafka's `Partition` rules with KIP-966's minimum-ISR rule.
 *
 * - HW = the lowest log end offset (LEO) over the leader and the maximal ISR (the ISR with a pending change's
 *   members kept until the change is committed), never lower than before, never above the leader's LEO, and it
 *   does not advance while the committed ISR is smaller than `minInsyncReplicas`.
 * - A follower leaves the ISR when it has not caught up (fetched at the leader's log end) for `lagTimeMaxMs`,
 *   checked on `Tick`; it joins when its LEO reaches the HW and it has caught up within the current leader epoch.
 * - One ISR change is pending at a time, proposed against the tablet version the leader knows; the controller
 *   commits or rejects it (a rejected expansion names a server the controller knows dead or shutting down, KIP-841).
 *   Each proposal has an identity, and an answer clears the pending change only when it answers that proposal (an
 *   answer to an earlier one, late or retried, changes nothing: Kafka's in-flight AlterPartition check); a committed
 *   ISR is taken only under a version above the one known. A refusal saying the leadership is over leaves the change
 *   pending: an earlier try of it may have been committed, and the next leader may already count on it.
 *
 * `step(state, input)` returns the next state and the commands the leader's shell runs: checkpoint the advanced
 * HW (completing the appends waiting for it), propose an ISR change to the controller.
 *
 * @since 0.1.0
 */
import type { Models } from "@strata/core"

/**
 * A follower's progress as the leader saw it.
 *
 * @since 0.1.0
 */
export interface Follower {
  /** Its log end: the offset of its last fetch. */
  readonly logEndOffset: number
  /**
   * The last time it was caught up, in ms on the shell's Clock: a fetch at (or past) the leader's log end, or the
   * time of its previous fetch when this one reaches the log end the leader had then (Kafka's
   * `lastFetchLeaderLogEndOffset`), so a follower that fetches steadily under load is never one append short.
   */
  readonly lastCaughtUpMs: number
  /** When its previous fetch came, and the leader's log end then. */
  readonly lastFetchMs: number
  readonly lastFetchLeaderLogEndOffset: number
  /** The registration its last fetch named (KIP-903), if any. */
  readonly registration?: number | undefined
  /** Where its log starts, as its last fetch said (0 until one says). */
  readonly logStartOffset: number
}

/**
 * A pending ISR change, proposed and not yet committed.
 *
 * @since 0.1.0
 */
export type PendingChange =
  | {
      readonly _tag: "Expand"
      readonly proposal: number
      readonly server: Models.ServerId
      readonly isr: ReadonlyArray<Models.ServerId>
    }
  | {
      readonly _tag: "Shrink"
      readonly proposal: number
      readonly removed: ReadonlyArray<Models.ServerId>
      readonly isr: ReadonlyArray<Models.ServerId>
    }

/**
 * The leader's state for one tablet and one leader epoch.
 *
 * @since 0.1.0
 */
export interface State {
  readonly self: Models.ServerId
  readonly leaderEpoch: Models.Epoch
  /** Every replica, in assignment order. */
  readonly replicas: ReadonlyArray<Models.ServerId>
  readonly minInsyncReplicas: number
  readonly lagTimeMaxMs: number
  /** The committed ISR (the leader included). */
  readonly isr: ReadonlyArray<Models.ServerId>
  /** The tablet version the committed ISR is at: the version the next proposal is made against. */
  readonly version: number
  readonly pending: PendingChange | undefined
  /** The identity of the last proposal made under this leader epoch. */
  readonly lastProposal: number
  readonly logEndOffset: number
  readonly highWatermark: number
  /** The leader's log end when this epoch began: a follower must reach it to have caught up in this epoch. */
  readonly epochStartOffset: number
  readonly followers: ReadonlyMap<Models.ServerId, Follower>
  /**
   * Followers the controller refused to add as ineligible (dead, stopping, registered again: KIP-841), with the
   * registration they fetched under and when: not proposed again until they fetch under another registration or
   * `lagTimeMaxMs` has passed.
   */
  readonly refused: ReadonlyMap<Models.ServerId, { readonly registration: number | undefined; readonly atMs: number }>
}

/**
 * What the shell feeds.
 *
 * @since 0.1.0
 */
export type Input =
  | { readonly _tag: "Appended"; readonly logEndOffset: number }
  | {
      readonly _tag: "FollowerFetched"
      readonly server: Models.ServerId
      readonly fetchOffset: number
      readonly nowMs: number
      readonly registration?: number | undefined
      readonly logStartOffset?: number | undefined
    }
  | { readonly _tag: "Tick"; readonly nowMs: number }
  /** The controller committed `isr` at `version` (its answer to `proposal`, or a LeaderAndIsr). */
  | {
      readonly _tag: "IsrChangeCommitted"
      readonly isr: ReadonlyArray<Models.ServerId>
      readonly version: number
      readonly proposal?: number | undefined
    }
  /** The controller refused `proposal`; `ineligible`: the server it named as not eligible to join, at `nowMs`. */
  | {
      readonly _tag: "IsrChangeRejected"
      readonly proposal: number
      readonly ineligible?: { readonly server: Models.ServerId; readonly nowMs: number } | undefined
    }
  /**
   * The controller refused `proposal` because this leadership is over (a later leader epoch, another leader, the
   * tablet gone). An earlier try of the same proposal may have been committed before the leader changed, so the
   * change stays pending: the HW keeps counting its maximal ISR and nothing more is proposed until the next
   * LeaderAndIsr ends this state (Kafka keeps an AlterPartition in flight on FENCED_LEADER_EPOCH).
   */
  | { readonly _tag: "IsrChangeFenced"; readonly proposal: number }

/**
 * What the shell runs.
 *
 * @since 0.1.0
 */
export type Command =
  | { readonly _tag: "AdvanceHighWatermark"; readonly highWatermark: number }
  | {
      readonly _tag: "ProposeIsr"
      /** The proposal's identity: its answer is fed back with it. */
      readonly proposal: number
      /** The tablet version it is made against. */
      readonly version: number
      readonly isr: ReadonlyArray<Models.ServerId>
      /** The registrations the followers in `isr` fetched under, where known: the controller checks them. */
      readonly registrations: ReadonlyArray<readonly [Models.ServerId, number]>
    }
  /** A committed ISR of `size` is below the minimum: the appends waiting for the HW fail. */
  | { readonly _tag: "IsrBelowMinimum"; readonly size: number }

/**
 * The outcome of one step.
 *
 * @since 0.1.0
 */
export type Step = readonly [State, ReadonlyArray<Command>]

/**
 * The state of a replica that has just become leader of `leaderEpoch`: every other ISR member is taken as caught
 * up as of `nowMs` (it gets a full `lagTimeMaxMs` to fetch), and the HW starts at the checkpoint.
 *
 * @since 0.1.0
 */
export const become = (options: {
  readonly self: Models.ServerId
  readonly leaderEpoch: Models.Epoch
  readonly replicas: ReadonlyArray<Models.ServerId>
  readonly isr: ReadonlyArray<Models.ServerId>
  /** The tablet version of the LeaderAndIsr that made it leader. */
  readonly version: number
  readonly minInsyncReplicas: number
  readonly lagTimeMaxMs: number
  readonly logEndOffset: number
  readonly highWatermark: number
  readonly nowMs: number
}): State => ({
  self: options.self,
  leaderEpoch: options.leaderEpoch,
  replicas: options.replicas,
  minInsyncReplicas: options.minInsyncReplicas,
  lagTimeMaxMs: options.lagTimeMaxMs,
  isr: options.isr,
  version: options.version,
  pending: undefined,
  lastProposal: 0,
  refused: new Map(),
  logEndOffset: options.logEndOffset,
  highWatermark: Math.min(options.highWatermark, options.logEndOffset),
  epochStartOffset: options.logEndOffset,
  followers: new Map(
    options.replicas
      .filter((r) => r !== options.self)
      .map((r) => {
        const since = options.isr.includes(r) ? options.nowMs : 0
        return [
          r,
          {
            logEndOffset: 0,
            lastCaughtUpMs: since,
            lastFetchMs: since,
            lastFetchLeaderLogEndOffset: options.isr.includes(r) ? options.logEndOffset : Number.POSITIVE_INFINITY,
            logStartOffset: 0
          }
        ] as const
      })
  )
})

/**
 * The lowest log start over the other members of the maximal ISR, as their fetches said (`+Infinity` when the leader
 * is alone): a delete below it is done on every replica an election may choose.
 *
 * @since 0.1.0
 */
export const lowWatermark = (state: State): number => {
  let low = Number.POSITIVE_INFINITY
  for (const s of maximalIsr(state)) {
    if (s === state.self) continue
    low = Math.min(low, state.followers.get(s)?.logStartOffset ?? 0)
  }
  return low
}

/**
 * The ISR the HW counts: the committed ISR plus a pending expansion's server (a pending shrink's servers are still
 * in the committed ISR until the controller commits it).
 *
 * @since 0.1.0
 */
export const maximalIsr = (state: State): ReadonlyArray<Models.ServerId> =>
  state.pending?._tag === "Expand" && !state.isr.includes(state.pending.server)
    ? [...state.isr, state.pending.server]
    : state.isr

const logEndOf = (state: State, server: Models.ServerId): number =>
  server === state.self ? state.logEndOffset : (state.followers.get(server)?.logEndOffset ?? 0)

/** The HW the state allows, and the command to checkpoint it when it moved. */
const withHighWatermark = (state: State, commands: Array<Command>): Step => {
  if (state.isr.length < state.minInsyncReplicas) return [state, commands]
  const candidate = Math.min(...maximalIsr(state).map((s) => logEndOf(state, s)), state.logEndOffset)
  if (candidate <= state.highWatermark) return [state, commands]
  return [
    { ...state, highWatermark: candidate },
    [...commands, { _tag: "AdvanceHighWatermark", highWatermark: candidate }]
  ]
}

/** The registrations the followers among `isr` last fetched under. */
const registrationsOf = (
  state: State,
  isr: ReadonlyArray<Models.ServerId>
): Array<readonly [Models.ServerId, number]> =>
  isr.flatMap((s) => {
    const r = state.followers.get(s)?.registration
    return r === undefined ? [] : [[s, r] as const]
  })

/** Makes `change` the pending change (under the next proposal identity) and proposes its ISR. */
const propose = (
  state: State,
  change:
    | Omit<Extract<PendingChange, { _tag: "Expand" }>, "proposal">
    | Omit<Extract<PendingChange, { _tag: "Shrink" }>, "proposal">,
  commands: Array<Command>
): Step => {
  const proposal = state.lastProposal + 1
  return [
    { ...state, pending: { ...change, proposal }, lastProposal: proposal },
    [
      ...commands,
      {
        _tag: "ProposeIsr",
        proposal,
        version: state.version,
        isr: change.isr,
        registrations: registrationsOf(state, change.isr)
      }
    ]
  ]
}

/** Proposes adding `server` when it qualifies and nothing is pending. */
const maybeExpand = (state: State, server: Models.ServerId, nowMs: number, commands: Array<Command>): Step => {
  const f = state.followers.get(server)
  if (state.pending !== undefined || state.isr.includes(server) || f === undefined) return [state, commands]
  if (f.logEndOffset < state.highWatermark || f.logEndOffset < state.epochStartOffset) return [state, commands]
  const refused = state.refused.get(server)
  if (refused !== undefined && refused.registration === f.registration && nowMs - refused.atMs < state.lagTimeMaxMs) {
    return [state, commands]
  }
  return propose(state, { _tag: "Expand", server, isr: [...state.isr, server] }, commands)
}

/** Whether an answer to `proposal` settles the pending change. */
const answersPending = (state: State, proposal: number | undefined) =>
  state.pending !== undefined && state.pending.proposal === proposal

/**
 * One step of the leader's state. Pure: time is the input's `nowMs`.
 *
 * @since 0.1.0
 */
export const step = (state: State, input: Input): Step => {
  switch (input._tag) {
    case "Appended":
      return withHighWatermark({ ...state, logEndOffset: Math.max(state.logEndOffset, input.logEndOffset) }, [])
    case "FollowerFetched": {
      const before = state.followers.get(input.server)
      if (before === undefined) return [state, []]
      // A fetch under a registration older than one already seen comes from an ended life of the server (KIP-903).
      if (
        input.registration !== undefined &&
        before.registration !== undefined &&
        input.registration < before.registration
      ) {
        return [state, []]
      }
      const lastCaughtUpMs =
        input.fetchOffset >= state.logEndOffset
          ? input.nowMs
          : input.fetchOffset >= before.lastFetchLeaderLogEndOffset
            ? Math.max(before.lastCaughtUpMs, before.lastFetchMs)
            : before.lastCaughtUpMs
      const followers = new Map(state.followers)
      followers.set(input.server, {
        logEndOffset: Math.min(input.fetchOffset, state.logEndOffset),
        lastCaughtUpMs,
        lastFetchMs: input.nowMs,
        lastFetchLeaderLogEndOffset: state.logEndOffset,
        registration: input.registration ?? before.registration,
        logStartOffset: input.logStartOffset ?? before.logStartOffset
      })
      const [next, commands] = withHighWatermark({ ...state, followers }, [])
      return maybeExpand(next, input.server, input.nowMs, [...commands])
    }
    case "Tick": {
      if (state.pending !== undefined) return [state, []]
      const removed = state.isr.filter(
        (s) => s !== state.self && input.nowMs - (state.followers.get(s)?.lastCaughtUpMs ?? 0) > state.lagTimeMaxMs
      )
      if (removed.length === 0) return [state, []]
      return propose(state, { _tag: "Shrink", removed, isr: state.isr.filter((s) => !removed.includes(s)) }, [])
    }
    case "IsrChangeCommitted": {
      // Known already (this version or a later one): a pending change against a later version stays pending.
      if (input.version <= state.version) {
        return answersPending(state, input.proposal) ? [{ ...state, pending: undefined }, []] : [state, []]
      }
      // Any pending change was made against an older version: the controller refuses it, so it is settled too.
      const [next, commands] = withHighWatermark(
        { ...state, isr: input.isr, version: input.version, pending: undefined },
        []
      )
      return input.isr.length < state.minInsyncReplicas
        ? [next, [...commands, { _tag: "IsrBelowMinimum", size: input.isr.length }]]
        : [next, commands]
    }
    case "IsrChangeRejected": {
      if (!answersPending(state, input.proposal)) return [state, []]
      const ineligible = input.ineligible
      if (ineligible === undefined) return [{ ...state, pending: undefined }, []]
      const refused = new Map(state.refused).set(ineligible.server, {
        registration: state.followers.get(ineligible.server)?.registration,
        atMs: ineligible.nowMs
      })
      return [{ ...state, pending: undefined, refused }, []]
    }
    case "IsrChangeFenced":
      return [state, []]
  }
}
