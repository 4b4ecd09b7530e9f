/**
 * Where standby replicas go: a pure function of the group's membership, so every member computes the same layout
 * from the same view without talking to the others.
 *
 * Members are ordered by id. The partitions a member holds active get their standbys on the `replicas` members
 * after it in that order, wrapping around (capped at members − 1, so a member never stands by for itself).
 *
 * @internal
 */
import { type Log, Models } from "@strata/core"

const byMemberId = (a: { readonly memberId: string }, b: { readonly memberId: string }): number =>
  a.memberId < b.memberId ? -1 : a.memberId > b.memberId ? 1 : 0

/**
 * The standby partitions of `membership.memberId`: every partition held active by one of the `replicas` members
 * before it in memberId order (cyclic), never one it holds itself, sorted. A member not in the membership, a lone
 * member or `replicas` ≤ 0 gets none.
 */
export const place = (membership: Log.GroupMembership, replicas: number): ReadonlyArray<Models.TopicPartition> => {
  const members = [...membership.members].sort(byMemberId)
  const n = members.length
  const self = members.findIndex((m) => m.memberId === membership.memberId)
  const k = Math.min(Number.isFinite(replicas) ? Math.floor(replicas) : 0, n - 1)
  if (self < 0 || k <= 0) return []
  // During a rebalance a partition may still be listed under two members: one held here is never a standby.
  const own = new Set(members[self]!.partitions.map(Models.tpKey))
  const out = new Map<string, Models.TopicPartition>()
  for (let d = 1; d <= k; d++) {
    // The member `d` places before this one: its partitions have their d-th standby here.
    const owner = members[(self - d + n) % n]!
    for (const tp of owner.partitions) {
      const key = Models.tpKey(tp)
      if (!own.has(key)) out.set(key, { topic: tp.topic, partition: tp.partition })
    }
  }
  return [...out.values()].sort(Models.tpCompare)
}
