import { assert, describe, it } from "@effect/vitest"
import { prng } from "../../../scripts/test-support/prng.js"
import * as LeaderState from "../src/LeaderState.js"

const start = (overrides: Partial<Parameters<typeof LeaderState.become>[0]> = {}) =>
  LeaderState.become({
    self: 1,
    leaderEpoch: 3,
    replicas: [1, 2, 3],
    isr: [1, 2, 3],
    minInsyncReplicas: 2,
    lagTimeMaxMs: 30_000,
    logEndOffset: 10,
    highWatermark: 10,
    nowMs: 0,
    ...overrides
  })

const run = (state: LeaderState.State, inputs: ReadonlyArray<LeaderState.Input>) => {
  const commands: Array<LeaderState.Command> = []
  for (const input of inputs) {
    const [next, emitted] = LeaderState.step(state, input)
    state = next
    commands.push(...emitted)
  }
  return { state, commands }
}

describe("LeaderState", () => {
  it("the HW is the lowest log end over the ISR, and moves only forward", () => {
    const { state, commands } = run(start(), [
      { _tag: "Appended", logEndOffset: 15 },
      { _tag: "FollowerFetched", server: 2, fetchOffset: 13, nowMs: 1 },
      { _tag: "FollowerFetched", server: 3, fetchOffset: 12, nowMs: 1 },
      { _tag: "FollowerFetched", server: 3, fetchOffset: 15, nowMs: 2 },
      { _tag: "FollowerFetched", server: 2, fetchOffset: 15, nowMs: 2 }
    ])
    assert.strictEqual(state.highWatermark, 15)
    assert.deepStrictEqual(
      commands.map((c) => (c._tag === "AdvanceHighWatermark" ? c.highWatermark : -1)),
      [12, 13, 15]
    )
  })

  it("below minInsyncReplicas the HW does not advance, even when every remaining member has the records", () => {
    const { state, commands } = run(start({ isr: [1, 2], replicas: [1, 2, 3], minInsyncReplicas: 2 }), [
      { _tag: "Tick", nowMs: 40_000 }, // 2 never fetched: it leaves the ISR
      { _tag: "IsrChangeCommitted", isr: [1] },
      { _tag: "Appended", logEndOffset: 20 }
    ])
    assert.deepStrictEqual(state.isr, [1])
    assert.strictEqual(state.highWatermark, 10, "a lone leader's HW stays put (KIP-966)")
    assert.isFalse(commands.some((c) => c._tag === "AdvanceHighWatermark"))
  })

  it("a lagging follower leaves the ISR after lagTimeMaxMs; one change is pending at a time", () => {
    const s = start()
    const { state, commands } = run(s, [
      { _tag: "Appended", logEndOffset: 12 },
      { _tag: "FollowerFetched", server: 2, fetchOffset: 12, nowMs: 29_000 },
      { _tag: "Tick", nowMs: 30_001 },
      { _tag: "Tick", nowMs: 60_000 }
    ])
    assert.deepStrictEqual(
      commands.filter((c) => c._tag === "ProposeIsr"),
      [{ _tag: "ProposeIsr", isr: [1, 2], registrations: [] }]
    )
    assert.deepStrictEqual(state.pending, { _tag: "Shrink", removed: [3], isr: [1, 2] })
    // Until committed, 3 still counts for the HW: it stays at 10 although 1 and 2 hold 12.
    assert.strictEqual(state.highWatermark, 10)
    const [after, hw] = LeaderState.step(state, { _tag: "IsrChangeCommitted", isr: [1, 2] })
    assert.strictEqual(after.highWatermark, 12)
    assert.deepStrictEqual(hw, [{ _tag: "AdvanceHighWatermark", highWatermark: 12 }])
  })

  it("a follower rejoins once it reaches the HW within the current epoch; a rejected expansion can be retried", () => {
    const s = start({ isr: [1, 2], logEndOffset: 20, highWatermark: 20 })
    const early = run(s, [{ _tag: "FollowerFetched", server: 3, fetchOffset: 19, nowMs: 5 }])
    assert.isUndefined(early.state.pending, "below the HW and the epoch's start: not yet")
    const joined = run(early.state, [{ _tag: "FollowerFetched", server: 3, fetchOffset: 20, nowMs: 6 }])
    assert.deepStrictEqual(joined.commands, [{ _tag: "ProposeIsr", isr: [1, 2, 3], registrations: [] }])
    const rejected = run(joined.state, [
      { _tag: "IsrChangeRejected" },
      { _tag: "FollowerFetched", server: 3, fetchOffset: 20, nowMs: 7 }
    ])
    assert.deepStrictEqual(rejected.commands, [{ _tag: "ProposeIsr", isr: [1, 2, 3], registrations: [] }])
  })

  it("a proposal names the registrations its followers last fetched under (KIP-903)", () => {
    const s = start({ isr: [1, 2], logEndOffset: 20, highWatermark: 20 })
    const { commands } = run(s, [
      { _tag: "FollowerFetched", server: 2, fetchOffset: 20, nowMs: 5, registration: 40 },
      { _tag: "FollowerFetched", server: 3, fetchOffset: 20, nowMs: 6, registration: 41 }
    ])
    assert.deepStrictEqual(commands, [
      {
        _tag: "ProposeIsr",
        isr: [1, 2, 3],
        registrations: [
          [2, 40],
          [3, 41]
        ]
      }
    ])
    // A fetch naming no registration keeps the one known.
    const [kept] = LeaderState.step(s, {
      _tag: "FollowerFetched",
      server: 2,
      fetchOffset: 20,
      nowMs: 5,
      registration: 40
    })
    const [after] = LeaderState.step(kept, { _tag: "FollowerFetched", server: 2, fetchOffset: 20, nowMs: 6 })
    assert.strictEqual(after.followers.get(2)?.registration, 40)
  })
})

// ---------------------------------------------------------------------------
// Seeded runs against the safety properties
// ---------------------------------------------------------------------------

type StepFn = typeof LeaderState.step

/** Drives a leader with random appends, fetches, ticks and controller answers; returns the first broken rule. */
const drive = (seed: number, step: StepFn = LeaderState.step): string | undefined => {
  const next = prng(seed)
  const int = (lo: number, hi: number) => lo + Math.floor(next() * (hi - lo + 1))
  const replicas = [1, 2, 3, 4, 5].slice(0, int(2, 5))
  const minIsr = int(1, replicas.length)
  let state = LeaderState.become({
    self: 1,
    leaderEpoch: 1,
    replicas,
    isr: replicas,
    minInsyncReplicas: minIsr,
    lagTimeMaxMs: 1000,
    logEndOffset: 0,
    highWatermark: 0,
    nowMs: 0
  })
  // What each replica really holds (its log end), independent of what the leader believes.
  const held = new Map<number, number>(replicas.map((r) => [r, 0]))
  let now = 0
  for (let n = 0; n < 400; n++) {
    now += int(0, 300)
    const roll = next()
    let input: LeaderState.Input
    if (roll < 0.3) {
      held.set(1, held.get(1)! + int(1, 5))
      input = { _tag: "Appended", logEndOffset: held.get(1)! }
    } else if (roll < 0.75) {
      const f = replicas[int(1, replicas.length - 1)]
      if (f === undefined) continue
      // A follower fetches from its own log end, after copying some of what the leader has.
      held.set(f, int(held.get(f)!, held.get(1)!))
      input = { _tag: "FollowerFetched", server: f, fetchOffset: held.get(f)!, nowMs: now }
    } else if (roll < 0.9) input = { _tag: "Tick", nowMs: now }
    else if (state.pending !== undefined) {
      input = next() < 0.8 ? { _tag: "IsrChangeCommitted", isr: state.pending.isr } : { _tag: "IsrChangeRejected" }
    } else continue
    const before = state
    const [after, commands] = step(state, input)
    for (const c of commands) {
      if (c._tag === "AdvanceHighWatermark") {
        if (c.highWatermark <= before.highWatermark)
          return `step ${n}: HW went from ${before.highWatermark} to ${c.highWatermark}`
        if (c.highWatermark > held.get(1)!) return `step ${n}: HW ${c.highWatermark} above the leader's log end`
        const holders = replicas.filter((r) => held.get(r)! >= c.highWatermark).length
        if (holders < minIsr)
          return `step ${n}: HW ${c.highWatermark} with only ${holders} replicas holding it (min ${minIsr})`
      }
      if (c._tag === "ProposeIsr" && before.pending !== undefined) return `step ${n}: a second pending ISR change`
    }
    if (after.highWatermark < before.highWatermark) return `step ${n}: HW went back`
    if (!after.isr.includes(1)) return `step ${n}: the leader left its own ISR`
    state = after
  }
  return undefined
}

describe("LeaderState seeded runs", () => {
  it("2000 seeded runs: the HW only moves forward, within the leader's log, over at least minInsyncReplicas copies", () => {
    for (let seed = 1; seed <= 2000; seed++) {
      const failure = drive(seed)
      assert.isUndefined(failure, `seed=${seed}: ${failure}`)
    }
  })

  it("a planted bug (the HW advancing under minInsyncReplicas) is caught", () => {
    const buggy: StepFn = (state, input) => {
      const [next, commands] = LeaderState.step({ ...state, minInsyncReplicas: 1 }, input)
      return [{ ...next, minInsyncReplicas: state.minInsyncReplicas }, commands]
    }
    const caught = Array.from({ length: 2000 }, (_, i) => drive(i + 1, buggy)).filter((f) => f !== undefined)
    assert.isTrue(
      caught.some((f) => f.includes("replicas holding it")),
      JSON.stringify(caught.slice(0, 2))
    )
  })
})
