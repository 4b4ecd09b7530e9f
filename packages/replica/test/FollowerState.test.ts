import { assert, describe, it } from "@effect/vitest"
import type { Batch } from "../src/wire/internal/batchCodec.js"
import * as FollowerState from "../src/machines/FollowerState.js"
import * as LeaderEpochCache from "../src/machines/LeaderEpochCache.js"
import { cacheOf, commonPrefix, history, type Log } from "./support/histories.js"

/** A leader's batches from `offset`, one batch per epoch run (records carry their offset as the value). */
const batchesFrom = (log: Log, offset: number): ReadonlyArray<Batch> => {
  const out: Array<Batch> = []
  for (let o = offset; o < log.length; ) {
    const epoch = log[o]!
    let end = o
    while (end < log.length && log[end] === epoch) end++
    const records = Array.from({ length: end - o }, (_, i) => ({
      key: null,
      value: Uint8Array.of(o + i),
      headers: [],
      timestamp: 0
    }))
    out.push({ baseOffset: o, epoch, records })
    o = end
  }
  return out
}

/**
 * Runs a follower against a leader until it fetches at the leader's end: the shell's part played by the test
 * (answering from the leader's log, applying the commands to the follower's). Returns the follower's log and the
 * lowest offset any truncation went to.
 */
const follow = (leader: Log, start: Log, leaderEpoch: number, options: { readonly fetchFirst?: boolean } = {}) => {
  let log = [...start]
  let lowest = log.length
  let [state, commands] = FollowerState.become({
    leader: 1,
    leaderEpoch,
    logStartOffset: 0,
    logEndOffset: log.length,
    epochs: cacheOf(log),
    highWatermark: 0
  })
  if (options.fetchFirst === true) {
    // A follower that believes its log agrees with the leader's (as one whose old leader answered a long poll with
    // another leader's records would): only the fetch's last fetched epoch can bring it back in line.
    state = { ...state, phase: { _tag: "Fetching", offset: log.length } }
    commands = [
      {
        _tag: "Fetch",
        offset: log.length,
        lastFetchedEpoch: LeaderEpochCache.latest(cacheOf(log))?.epoch,
        logStartOffset: 0
      }
    ]
  }
  for (let rounds = 0; rounds < 100; rounds++) {
    let input: FollowerState.Input | undefined
    for (const c of commands) {
      switch (c._tag) {
        case "Truncate":
          log = log.slice(0, c.offset)
          lowest = Math.min(lowest, c.offset)
          break
        case "Append":
          for (const b of c.batches) for (const _ of b.records) log.push(b.epoch)
          break
        case "AskEndOffset":
          input = {
            _tag: "EndOffsetAnswered",
            leaderEpoch,
            answer: LeaderEpochCache.endOffsetFor(cacheOf(leader), c.epoch, leader.length)
          }
          break
        case "Fetch": {
          // The leader's check (TabletServer.fetch): its log must hold the last fetched epoch up to the offset.
          const held =
            c.lastFetchedEpoch === undefined
              ? undefined
              : LeaderEpochCache.endOffsetFor(cacheOf(leader), c.lastFetchedEpoch, leader.length)
          if (
            c.lastFetchedEpoch !== undefined &&
            (held === undefined || held.epoch < c.lastFetchedEpoch || held.endOffset < c.offset)
          ) {
            input = { _tag: "Diverging", leaderEpoch, answer: held }
            break
          }
          if (c.offset === leader.length) return { log, lowest, state }
          input = {
            _tag: "Fetched",
            leaderEpoch,
            batches: batchesFrom(leader, c.offset),
            highWatermark: leader.length,
            logStartOffset: 0
          }
          break
        }
      }
    }
    if (input === undefined) throw new Error("the follower stopped without fetching")
    ;[state, commands] = FollowerState.step(state, input)
  }
  throw new Error("the follower did not catch up in 100 rounds")
}

describe("FollowerState", () => {
  it("over 5000 random histories a follower ends with the leader's log, keeping every record it shared", () => {
    let truncated = 0
    for (let seed = 1; seed <= 5000; seed++) {
      const { logs, leader, epoch } = history(seed)
      for (let r = 0; r < logs.length; r++) {
        if (r === leader) continue
        const shared = commonPrefix(logs[leader]!, logs[r]!)
        const result = follow(logs[leader]!, logs[r]!, epoch)
        assert.deepStrictEqual(result.log, logs[leader], `seed=${seed} replica ${r}`)
        assert.strictEqual(result.lowest, shared, `seed=${seed} replica ${r}: truncated below what it shared`)
        assert.deepStrictEqual(result.state.epochs, cacheOf(logs[leader]!))
        if (shared < logs[r]!.length) truncated++
      }
    }
    assert.isAbove(truncated, 500)
  })

  it("over 5000 random histories a follower that fetches before asking is brought in line by Diverging answers", () => {
    let diverged = 0
    for (let seed = 1; seed <= 5000; seed++) {
      const { logs, leader, epoch } = history(seed)
      for (let r = 0; r < logs.length; r++) {
        if (r === leader) continue
        const shared = commonPrefix(logs[leader]!, logs[r]!)
        const result = follow(logs[leader]!, logs[r]!, epoch, { fetchFirst: true })
        assert.deepStrictEqual(result.log, logs[leader], `seed=${seed} replica ${r}`)
        assert.strictEqual(result.lowest, shared, `seed=${seed} replica ${r}: truncated below what it shared`)
        if (shared < logs[r]!.length) diverged++
      }
    }
    assert.isAbove(diverged, 500)
  })

  it("answers from another leader epoch are dropped", () => {
    const [state] = FollowerState.become({
      leader: 2,
      leaderEpoch: 6,
      logStartOffset: 0,
      logEndOffset: 3,
      epochs: [{ epoch: 5, startOffset: 0 }],
      highWatermark: 3
    })
    const stale = FollowerState.step(state, { _tag: "EndOffsetAnswered", leaderEpoch: 5, answer: undefined })
    assert.deepStrictEqual(stale, [state, []])
  })

  it("when the logs agree only below where its own log starts, it starts over there instead of truncating", () => {
    // Its log [220, 240) of epoch 2; the leader's epoch 2 ends at 210 (a leader that never had what this one kept).
    const [asking, asked] = FollowerState.become({
      leader: 2,
      leaderEpoch: 3,
      logStartOffset: 220,
      logEndOffset: 240,
      epochs: [{ epoch: 2, startOffset: 220 }],
      highWatermark: 230
    })
    assert.deepStrictEqual(asked, [{ _tag: "AskEndOffset", epoch: 2 }])
    const [reset, commands] = FollowerState.step(asking, {
      _tag: "EndOffsetAnswered",
      leaderEpoch: 3,
      answer: { epoch: 2, endOffset: 210 }
    })
    assert.deepStrictEqual(commands, [
      { _tag: "ResetTo", offset: 210 },
      { _tag: "Fetch", offset: 210, lastFetchedEpoch: undefined, logStartOffset: 210 }
    ])
    assert.strictEqual(reset.logStartOffset, 210)
    assert.strictEqual(reset.logEndOffset, 210)
    assert.strictEqual(reset.highWatermark, 210)
    assert.deepStrictEqual(reset.epochs, [])
  })

  it("below the leader's log start it starts over from there; its HW never passes its own log end", () => {
    const [state] = FollowerState.become({
      leader: 2,
      leaderEpoch: 6,
      logStartOffset: 0,
      logEndOffset: 0,
      epochs: [],
      highWatermark: 0
    })
    const [reset, commands] = FollowerState.step(state, { _tag: "OutOfRange", leaderEpoch: 6, logStartOffset: 40 })
    assert.deepStrictEqual(commands, [
      { _tag: "ResetTo", offset: 40 },
      { _tag: "Fetch", offset: 40, lastFetchedEpoch: undefined, logStartOffset: 40 }
    ])
    const batch: Batch = {
      baseOffset: 40,
      epoch: 6,
      records: [{ key: null, value: Uint8Array.of(1), headers: [], timestamp: 0 }]
    }
    const [after, next] = FollowerState.step(reset, {
      _tag: "Fetched",
      leaderEpoch: 6,
      batches: [batch],
      highWatermark: 90,
      logStartOffset: 40
    })
    assert.strictEqual(after.highWatermark, 41)
    assert.deepStrictEqual(
      next.map((c) => c._tag),
      ["Append", "CheckpointHighWatermark", "Fetch"]
    )
  })

  it("takes the leader's log start from its answers, never past its own HW, never back", () => {
    const record = { key: null, value: Uint8Array.of(1), headers: [], timestamp: 0 }
    const [state] = FollowerState.become({
      leader: 2,
      leaderEpoch: 3,
      logStartOffset: 0,
      logEndOffset: 10,
      epochs: [{ epoch: 3, startOffset: 0 }],
      highWatermark: 4
    })
    const fetching: FollowerState.State = { ...state, phase: { _tag: "Fetching", offset: 10 } }
    const answer = (logStartOffset: number, highWatermark: number, batches: ReadonlyArray<Batch> = []) =>
      ({ _tag: "Fetched", leaderEpoch: 3, batches, highWatermark, logStartOffset }) as const
    // The leader deleted up to 8, and its HW is 12: this replica's HW becomes 10 (its end), its start 8.
    const [moved, commands] = FollowerState.step(fetching, answer(8, 12))
    assert.deepStrictEqual(commands, [
      { _tag: "CheckpointHighWatermark", highWatermark: 10 },
      { _tag: "DeleteBefore", offset: 8 },
      { _tag: "Fetch", offset: 10, lastFetchedEpoch: 3, logStartOffset: 8 }
    ])
    assert.strictEqual(moved.logStartOffset, 8)
    // A start past this replica's HW is taken only up to the HW.
    const [capped, capCommands] = FollowerState.step(
      { ...fetching, highWatermark: 4 },
      answer(9, 4, [{ baseOffset: 10, epoch: 3, records: [record] }])
    )
    assert.strictEqual(capped.logStartOffset, 4)
    assert.deepStrictEqual(
      capCommands.map((c) => c._tag),
      ["Append", "DeleteBefore", "Fetch"]
    )
    // An older answer naming an earlier start moves nothing back.
    const [same, none] = FollowerState.step(moved, answer(2, 12))
    assert.strictEqual(same.logStartOffset, 8)
    assert.deepStrictEqual(
      none.map((c) => c._tag),
      ["Fetch"]
    )
  })
})
