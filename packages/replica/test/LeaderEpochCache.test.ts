import { assert, describe, it } from "@effect/vitest"
import * as LeaderEpochCache from "../src/machines/LeaderEpochCache.js"
import { cacheOf, commonPrefix, history, type Log } from "./support/histories.js"

/** Runs a follower's truncation against a leader to the end, as the follower logic will: ask, then truncate. */
const truncationPoint = (leader: Log, follower: Log): { offset: number; rounds: number } => {
  const leaderCache = cacheOf(leader)
  const followerCache = cacheOf(follower)
  let ask = LeaderEpochCache.latest(followerCache)?.epoch
  if (ask === undefined) return { offset: 0, rounds: 0 }
  for (let rounds = 1; ; rounds++) {
    const answer = LeaderEpochCache.endOffsetFor(leaderCache, ask, leader.length)
    const next = LeaderEpochCache.divergence(followerCache, follower.length, answer)
    if (next._tag === "Truncate") return { offset: Math.min(next.offset, follower.length), rounds }
    if (next._tag === "Everything") return { offset: 0, rounds }
    assert.isBelow(next.epoch, ask, "each round asks for an older epoch")
    ask = next.epoch
  }
}

describe("LeaderEpochCache", () => {
  it("endOffsetFor answers with the largest epoch at or below the one asked, and where it ends", () => {
    // Epoch 2 wrote 0–4, epoch 5 wrote 5–9, epoch 6 writes from 10; the log ends at 13.
    const cache = cacheOf([2, 2, 2, 2, 2, 5, 5, 5, 5, 5, 6, 6, 6])
    assert.deepStrictEqual(LeaderEpochCache.endOffsetFor(cache, 1, 13), undefined)
    assert.deepStrictEqual(LeaderEpochCache.endOffsetFor(cache, 2, 13), { epoch: 2, endOffset: 5 })
    assert.deepStrictEqual(LeaderEpochCache.endOffsetFor(cache, 4, 13), { epoch: 2, endOffset: 5 })
    assert.deepStrictEqual(LeaderEpochCache.endOffsetFor(cache, 5, 13), { epoch: 5, endOffset: 10 })
    assert.deepStrictEqual(LeaderEpochCache.endOffsetFor(cache, 6, 13), { epoch: 6, endOffset: 13 })
    assert.deepStrictEqual(LeaderEpochCache.endOffsetFor(cache, 9, 13), { epoch: 6, endOffset: 13 })
  })

  it("the seed's scenario: A's unreplicated epoch-5 suffix goes, B's epoch-6 records are kept", () => {
    // Both hold 0–99 of epoch 4. A (epoch 5) wrote 100–110 unreplicated and died; B (epoch 6) wrote 100–105.
    const common: Log = Array.from({ length: 100 }, () => 4)
    const a: Log = [...common, ...Array.from({ length: 11 }, () => 5)]
    const b: Log = [...common, ...Array.from({ length: 6 }, () => 6)]
    // A comes back as B's follower: it asks where epoch 5 ends on B; B never had epoch 5, so it answers epoch 4,
    // ending at 100. A truncates to 100 and fetches B's 100–105.
    assert.deepStrictEqual(truncationPoint(b, a), { offset: 100, rounds: 1 })
  })

  it("a follower whose high watermark lags keeps every record the leader acknowledged (Fluss #673/#674)", () => {
    // The follower holds 0–9 of epoch 3, all acknowledged by the leader (HW 10 on the leader), but its own HW is 6.
    // Truncating to its HW would drop 6–9; the epoch cache keeps them.
    const leader: Log = [...Array.from({ length: 10 }, () => 3), 4, 4]
    const follower: Log = Array.from({ length: 10 }, () => 3)
    assert.strictEqual(truncationPoint(leader, follower).offset, 10)
  })

  it("assign keeps epochs increasing and drops entries a later epoch overwrote", () => {
    let cache = LeaderEpochCache.assign(LeaderEpochCache.empty, 1, 0)
    cache = LeaderEpochCache.assign(cache, 3, 5)
    assert.strictEqual(LeaderEpochCache.assign(cache, 2, 7), cache, "an older epoch cannot write any more")
    assert.strictEqual(LeaderEpochCache.assign(cache, 3, 9), cache, "the latest epoch already has its start")
    // The log was truncated to 4 (epoch 3's records gone) and epoch 4 writes from 4.
    assert.deepStrictEqual(LeaderEpochCache.assign(cache, 4, 4), [
      { epoch: 1, startOffset: 0 },
      { epoch: 4, startOffset: 4 }
    ])
    assert.deepStrictEqual(LeaderEpochCache.truncateFromEnd(cache, 5), [{ epoch: 1, startOffset: 0 }])
    assert.deepStrictEqual(LeaderEpochCache.truncateFromStart(cache, 7), [{ epoch: 3, startOffset: 7 }])
    assert.deepStrictEqual(LeaderEpochCache.truncateFromStart(cache, 3), [
      { epoch: 1, startOffset: 3 },
      { epoch: 3, startOffset: 5 }
    ])
  })

  it("over 5000 random histories a follower truncates to exactly the longest prefix it shares with its leader", () => {
    let diverged = 0
    let multiRound = 0
    for (let seed = 1; seed <= 5000; seed++) {
      const { logs, leader } = history(seed)
      for (let r = 0; r < logs.length; r++) {
        if (r === leader) continue
        const expected = commonPrefix(logs[leader]!, logs[r]!)
        const { offset, rounds } = truncationPoint(logs[leader]!, logs[r]!)
        assert.strictEqual(offset, expected, `seed=${seed} replica ${r}: ${JSON.stringify(logs)}`)
        if (expected < logs[r]!.length) diverged++
        if (rounds > 1) multiRound++
      }
    }
    // The histories really exercised divergence, including answers that needed another round.
    assert.isAbove(diverged, 500)
    assert.isAbove(multiRound, 50)
  })

  it("a planted bug (truncating to the answer's end offset without checking the follower's own epoch) is caught", () => {
    const buggy = (leader: Log, follower: Log): number => {
      const ask = LeaderEpochCache.latest(cacheOf(follower))?.epoch
      if (ask === undefined) return 0
      const answer = LeaderEpochCache.endOffsetFor(cacheOf(leader), ask, leader.length)
      return answer === undefined ? 0 : Math.min(answer.endOffset, follower.length)
    }
    let caught = 0
    for (let seed = 1; seed <= 2000; seed++) {
      const { logs, leader } = history(seed)
      for (let r = 0; r < logs.length; r++) {
        if (r !== leader && buggy(logs[leader]!, logs[r]!) !== commonPrefix(logs[leader]!, logs[r]!)) caught++
      }
    }
    assert.isAbove(caught, 0)
  })
})
