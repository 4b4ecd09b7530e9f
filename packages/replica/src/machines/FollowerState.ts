/**
 * A tablet follower's fetch protocol as a pure function (KIP-101 / KIP-279 / KIP-320): on becoming follower, ask the
 * leader where this replica's latest epoch ends, truncate the divergent suffix (`LeaderEpochCache.divergence`, in
 * rounds), then fetch from the log end. Every fetch names the epoch of the log's last batch, and a leader whose log
 * does not hold it up to the fetch offset answers `Diverging`: the follower truncates from that answer the same way. Never truncate to the local high
 * watermark; refuse answers from a leader epoch other than the one this follower follows.
 *
 * `step(state, input)` returns the next state and the commands the follower's shell runs against its `TabletLog`
 * and the leader.
 *
 * @since 0.1.0
 */
import type { Models } from "@strata/core"
import type * as ReplicaManager from "../protocol/ReplicaManager.js"
import * as LeaderEpochCache from "./LeaderEpochCache.js"

/**
 * Where the follower is: finding where its log and the leader's agree, or fetching.
 *
 * @since 0.1.0
 */
export type Phase =
  | { readonly _tag: "Truncating"; readonly asked: Models.Epoch }
  | { readonly _tag: "Fetching"; readonly offset: number }

/**
 * The follower's state under one leader epoch; the log's end and epochs as last reported by the shell.
 *
 * @since 0.1.0
 */
export interface State {
  readonly leader: Models.ServerId
  readonly leaderEpoch: Models.Epoch
  readonly phase: Phase
  readonly logStartOffset: number
  readonly logEndOffset: number
  readonly epochs: LeaderEpochCache.LeaderEpochCache
  readonly highWatermark: number
}

/**
 * What the shell feeds: the leader's answers.
 *
 * @since 0.1.0
 */
export type Input =
  | {
      readonly _tag: "EndOffsetAnswered"
      readonly leaderEpoch: Models.Epoch
      readonly answer: { readonly epoch: Models.Epoch; readonly endOffset: number } | undefined
    }
  | {
      readonly _tag: "Fetched"
      readonly leaderEpoch: Models.Epoch
      readonly batches: ReadonlyArray<ReplicaManager.TabletBatch>
      readonly highWatermark: number
      /** Where the leader's log starts: records it deleted (retention, a delete) go here too. */
      readonly logStartOffset: number
    }
  /** The leader has no records at the fetched offset: its log starts at `logStartOffset`, past this one's end. */
  | { readonly _tag: "OutOfRange"; readonly leaderEpoch: Models.Epoch; readonly logStartOffset: number }
  /**
   * The leader's log does not hold the fetch's last fetched epoch up to the fetch offset: `answer` is where the
   * largest epoch it has at or below it ends (`undefined`: it has none), as an end-offset question would answer.
   */
  | {
      readonly _tag: "Diverging"
      readonly leaderEpoch: Models.Epoch
      readonly answer: { readonly epoch: Models.Epoch; readonly endOffset: number } | undefined
    }

/**
 * What the shell runs, in order.
 *
 * - `AskEndOffset`: ask the leader where `epoch` ends in its log (then feed `EndOffsetAnswered`).
 * - `Truncate`: truncate the local log to end at `offset`.
 * - `ResetTo`: empty the local log and start it at `offset` (the leader's log starts past this one, or the logs agree
 *   only below where this one starts).
 * - `DeleteBefore`: move the local log's start to `offset` (the leader's start moved past it), below its HW.
 * - `Append`: append the leader's batches as they are.
 * - `CheckpointHighWatermark`: the follower's HW moved.
 * - `Fetch`: fetch from `offset` under the followed leader epoch, naming the epoch of the log's last batch and
 *   where the log starts (then feed `Fetched`, `OutOfRange` or `Diverging`).
 *
 * @since 0.1.0
 */
export type Command =
  | { readonly _tag: "AskEndOffset"; readonly epoch: Models.Epoch }
  | { readonly _tag: "Truncate"; readonly offset: number }
  | { readonly _tag: "ResetTo"; readonly offset: number }
  | { readonly _tag: "DeleteBefore"; readonly offset: number }
  | { readonly _tag: "Append"; readonly batches: ReadonlyArray<ReplicaManager.TabletBatch> }
  | { readonly _tag: "CheckpointHighWatermark"; readonly highWatermark: number }
  | {
      readonly _tag: "Fetch"
      readonly offset: number
      readonly lastFetchedEpoch: Models.Epoch | undefined
      readonly logStartOffset: number
    }

/**
 * The outcome of one step.
 *
 * @since 0.1.0
 */
export type Step = readonly [State, ReadonlyArray<Command>]

/** The follower starts fetching from its log end: no truncation needed. */
const fetchFrom = (state: State, commands: Array<Command>): Step => [
  { ...state, phase: { _tag: "Fetching", offset: state.logEndOffset } },
  [...commands, fetchCommand(state.logEndOffset, state.epochs, state.logStartOffset)]
]

/** A fetch from `offset` of a log whose epochs are `epochs` and which starts at `logStartOffset`. */
const fetchCommand = (offset: number, epochs: LeaderEpochCache.LeaderEpochCache, logStartOffset: number): Command => ({
  _tag: "Fetch",
  offset,
  lastFetchedEpoch: LeaderEpochCache.latest(epochs)?.epoch,
  logStartOffset
})

/** Asks where the follower's latest epoch ends on the leader, or fetches when it has none. */
const startTruncation = (state: State, commands: Array<Command>): Step => {
  const latest = LeaderEpochCache.latest(state.epochs)
  if (latest === undefined) return fetchFrom(state, commands)
  return [
    { ...state, phase: { _tag: "Truncating", asked: latest.epoch } },
    [...commands, { _tag: "AskEndOffset", epoch: latest.epoch }]
  ]
}

/**
 * A replica becoming follower of `leader` under `leaderEpoch`, with its log as it is: it first asks where its
 * latest epoch ends on the leader.
 *
 * @since 0.1.0
 */
export const become = (options: {
  readonly leader: Models.ServerId
  readonly leaderEpoch: Models.Epoch
  readonly logStartOffset: number
  readonly logEndOffset: number
  readonly epochs: LeaderEpochCache.LeaderEpochCache
  readonly highWatermark: number
}): Step =>
  startTruncation(
    {
      leader: options.leader,
      leaderEpoch: options.leaderEpoch,
      phase: { _tag: "Fetching", offset: options.logEndOffset },
      logStartOffset: options.logStartOffset,
      logEndOffset: options.logEndOffset,
      epochs: options.epochs,
      highWatermark: options.highWatermark
    },
    []
  )

/** The log after truncating it to end at `offset`. */
const truncated = (state: State, offset: number): State => ({
  ...state,
  logEndOffset: Math.min(state.logEndOffset, offset),
  epochs: LeaderEpochCache.truncateFromEnd(state.epochs, offset),
  highWatermark: Math.min(state.highWatermark, offset)
})

/** The log emptied and started at `offset`, and the fetch from there. */
const resetAt = (state: State, offset: number): Step =>
  fetchFrom(
    { ...state, logStartOffset: offset, logEndOffset: offset, epochs: LeaderEpochCache.empty, highWatermark: offset },
    [{ _tag: "ResetTo", offset }]
  )

/**
 * Where the leader says an epoch of this log ends (`answer`): ask about an earlier epoch, or truncate where the logs
 * agree and fetch from there.
 */
const resolve = (
  state: State,
  answer: { readonly epoch: Models.Epoch; readonly endOffset: number } | undefined
): Step => {
  const next = LeaderEpochCache.divergence(state.epochs, state.logEndOffset, answer)
  switch (next._tag) {
    case "AskAgain":
      return [
        { ...state, phase: { _tag: "Truncating", asked: next.epoch } },
        [{ _tag: "AskEndOffset", epoch: next.epoch }]
      ]
    case "Truncate": {
      // The logs agree only below this log's start (a leader that never had, or lost, records this replica later
      // deleted): a truncation cannot go there, so start over at that offset, as a Kafka follower truncates fully.
      if (next.offset < state.logStartOffset) return resetAt(state, next.offset)
      const commands: Array<Command> =
        next.offset < state.logEndOffset ? [{ _tag: "Truncate", offset: next.offset }] : []
      return fetchFrom(truncated(state, next.offset), commands)
    }
    case "Everything": {
      // Nothing here is provably the leader's: keep nothing, and fetch from this log's start.
      const commands: Array<Command> =
        state.logStartOffset < state.logEndOffset ? [{ _tag: "Truncate", offset: state.logStartOffset }] : []
      return fetchFrom(truncated(state, state.logStartOffset), commands)
    }
  }
}

/**
 * One step of the follower. Answers under another leader epoch than the followed one are dropped (a stale leader,
 * or one that moved on: the coordinator's next LeaderAndIsr will say).
 *
 * @since 0.1.0
 */
export const step = (state: State, input: Input): Step => {
  if (input.leaderEpoch !== state.leaderEpoch) return [state, []]
  switch (input._tag) {
    case "EndOffsetAnswered":
      return state.phase._tag === "Truncating" ? resolve(state, input.answer) : [state, []]
    case "Diverging":
      return state.phase._tag === "Fetching" ? resolve(state, input.answer) : [state, []]
    case "Fetched": {
      if (state.phase._tag !== "Fetching") return [state, []]
      const batches = input.batches.filter((b) => b.baseOffset + b.records.length > state.logEndOffset)
      const first = batches[0]
      // An answer that does not continue this log (an older fetch's, or a leader that truncated meanwhile): find
      // where the logs agree again.
      if (first !== undefined && first.baseOffset !== state.logEndOffset) return startTruncation(state, [])
      let epochs = state.epochs
      let end = state.logEndOffset
      for (const b of batches) {
        epochs = LeaderEpochCache.assign(epochs, b.epoch, b.baseOffset)
        end = b.baseOffset + b.records.length
      }
      const hw = Math.max(state.highWatermark, Math.min(input.highWatermark, end))
      // The leader's start moves this log's too (as a Kafka follower's does), so that what it deleted cannot come
      // back when this replica leads; never past this replica's HW.
      const start = Math.max(state.logStartOffset, Math.min(input.logStartOffset, hw))
      const commands: Array<Command> = []
      if (batches.length > 0) commands.push({ _tag: "Append", batches })
      if (hw !== state.highWatermark) commands.push({ _tag: "CheckpointHighWatermark", highWatermark: hw })
      if (start !== state.logStartOffset) commands.push({ _tag: "DeleteBefore", offset: start })
      commands.push(fetchCommand(end, epochs, start))
      return [
        {
          ...state,
          logStartOffset: start,
          logEndOffset: end,
          epochs: start === state.logStartOffset ? epochs : LeaderEpochCache.truncateFromStart(epochs, start),
          highWatermark: hw,
          phase: { _tag: "Fetching", offset: end }
        },
        commands
      ]
    }
    case "OutOfRange": {
      if (input.logStartOffset <= state.logEndOffset) return startTruncation(state, [])
      // The leader's log starts past this one's end: start over from there (the records before it are gone).
      return resetAt(state, input.logStartOffset)
    }
  }
}
