/**
 * The leader-epoch cache of one tablet replica (Kafka's KIP-101 / KIP-279), as pure functions over an immutable
 * value: for each leader epoch that wrote to the log, the offset its first record has. A `TabletLog` persists it in
 * the same atomic batch as the records it covers.
 *
 * It answers the one question truncation needs: where does epoch `e` end in this log (`endOffsetFor`)? A follower
 * asks its leader that for its own latest epoch and truncates to where the two logs stop agreeing
 * (`divergence`) — never to its local high watermark, which can sit below records the leader acknowledged.
 *
 * @since 0.1.0
 */
import type { Models } from "@strata/core"

/**
 * One entry: epoch `epoch` wrote from `startOffset` on.
 *
 * @since 0.1.0
 */
export interface Entry {
  readonly epoch: Models.Epoch
  readonly startOffset: Models.Offset
}

/**
 * The cache: entries with strictly increasing epochs and non-decreasing start offsets.
 *
 * @since 0.1.0
 */
export type LeaderEpochCache = ReadonlyArray<Entry>

/**
 * The empty cache.
 *
 * @since 0.1.0
 */
export const empty: LeaderEpochCache = []

/**
 * The latest entry, if any.
 *
 * @since 0.1.0
 */
export const latest = (cache: LeaderEpochCache): Entry | undefined => cache[cache.length - 1]

/**
 * Records that `epoch` writes from `startOffset` on (a leader starting its epoch at its log end, or a follower
 * appending the first batch of an epoch it had not seen). An epoch already latest is left as it is; an older one
 * is ignored (it cannot write any more). Entries of lower epochs that claim offsets at or past `startOffset` are
 * dropped: those offsets were truncated away before this epoch wrote them again.
 *
 * @since 0.1.0
 */
export const assign = (cache: LeaderEpochCache, epoch: Models.Epoch, startOffset: Models.Offset): LeaderEpochCache => {
  const last = latest(cache)
  if (last !== undefined && epoch <= last.epoch) return cache
  const kept = cache.filter((e) => e.startOffset < startOffset)
  return [...kept, { epoch, startOffset }]
}

/**
 * Where an epoch ends in a log whose end is `logEndOffset` (KIP-279): the largest epoch at or below `requested`
 * that this log has, and the offset one past its last record (the next epoch's start, or the log end for the
 * latest epoch). `undefined` when the log has no epoch at or below `requested`.
 *
 * @since 0.1.0
 */
export const endOffsetFor = (
  cache: LeaderEpochCache,
  requested: Models.Epoch,
  logEndOffset: Models.Offset
): { readonly epoch: Models.Epoch; readonly endOffset: Models.Offset } | undefined => {
  let found = -1
  for (let i = 0; i < cache.length; i++) if (cache[i]!.epoch <= requested) found = i
  if (found < 0) return undefined
  const next = cache[found + 1]
  return { epoch: cache[found]!.epoch, endOffset: next === undefined ? logEndOffset : next.startOffset }
}

/**
 * The cache after the log was truncated to end at `endOffset`: entries starting at or past it go.
 *
 * @since 0.1.0
 */
export const truncateFromEnd = (cache: LeaderEpochCache, endOffset: Models.Offset): LeaderEpochCache =>
  cache.filter((e) => e.startOffset < endOffset)

/**
 * The cache after the log's start moved to `startOffset` (retention, or a snapshot): entries wholly below it go,
 * and the entry that covers it starts there.
 *
 * @since 0.1.0
 */
export const truncateFromStart = (cache: LeaderEpochCache, startOffset: Models.Offset): LeaderEpochCache => {
  let covering = -1
  for (let i = 0; i < cache.length; i++) if (cache[i]!.startOffset <= startOffset) covering = i
  if (covering < 0) return cache
  return [
    { epoch: cache[covering]!.epoch, startOffset: Math.max(cache[covering]!.startOffset, startOffset) },
    ...cache.slice(covering + 1)
  ]
}

/**
 * What a follower does with its leader's answer to "where does epoch `e` end in your log?" (the leader's
 * `endOffsetFor`, asked first for the follower's latest epoch).
 *
 * @since 0.1.0
 */
export type Divergence =
  /** Truncate the log to end at `offset` (a no-op when it already ends there), then fetch from it. */
  | { readonly _tag: "Truncate"; readonly offset: Models.Offset }
  /** The follower's largest epoch at or below the answer's is older than it: ask again for that epoch. */
  | { readonly _tag: "AskAgain"; readonly epoch: Models.Epoch }
  /** The two logs share no epoch: nothing the follower holds is provably the leader's. */
  | { readonly _tag: "Everything" }

/**
 * The next step of a follower's truncation (KIP-279), from the leader's answer:
 * - the follower has the epoch the leader named: truncate to where that epoch ends first, on either log;
 * - its largest epoch at or below the named one is older: ask again for that one (each round asks for an older
 *   epoch, so this ends);
 * - the leader had no epoch at or below the one asked, or the follower has none at or below the answer:
 *   `Everything`.
 *
 * Nothing here looks at a high watermark: a follower's HW can sit below records the leader acknowledged, and
 * truncating to it would lose them (Fluss #673, #674).
 *
 * @since 0.1.0
 */
export const divergence = (
  follower: LeaderEpochCache,
  followerLogEnd: Models.Offset,
  answer: { readonly epoch: Models.Epoch; readonly endOffset: Models.Offset } | undefined
): Divergence => {
  if (answer === undefined) return { _tag: "Everything" }
  const own = endOffsetFor(follower, answer.epoch, followerLogEnd)
  if (own === undefined) return { _tag: "Everything" }
  if (own.epoch !== answer.epoch) return { _tag: "AskAgain", epoch: own.epoch }
  return { _tag: "Truncate", offset: Math.min(answer.endOffset, own.endOffset) }
}
