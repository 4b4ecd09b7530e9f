import { assert, describe, it } from "@effect/vitest"
import { prng } from "../../../scripts/test-support/prng.js"
import * as LeaderState from "../src/machines/LeaderState.js"

const start = (overrides: Partial<Parameters<typeof LeaderState.become>[0]> = {}) =>
  LeaderState.become({
    self: 1,
    leaderEpoch: 3,
    replicas: [1, 2, 3],
    isr: [1, 2, 3],
    version: 0,
    minInsyncReplicas: 2,
    lagTimeMaxMs: 30_000,
    logEndOffset: 10,
    highWatermark: 10,
    nowMs: 0,
    ...overrides
  })

/** A planted bug: any ISR answer clears the pending change, whichever proposal it answers. */
const anyAnswerClearsPending: typeof LeaderState.step = (state, input) =>
  (input._tag === "IsrChangeCommitted" || input._tag === "IsrChangeRejected") && state.pending !== undefined
    ? LeaderState.step(state, { ...input, proposal: state.pending.proposal })
    : LeaderState.step(state, input)

const run = (
  state: LeaderState.State,
  inputs: ReadonlyArray<LeaderState.Input>,
  step: typeof LeaderState.step = LeaderState.step
) => {
  const commands: Array<LeaderState.Command> = []
  for (const input of inputs) {
    const [next, emitted] = step(state, input)
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
      { _tag: "IsrChangeCommitted", isr: [1], version: 1, proposal: 1 },
      { _tag: "Appended", logEndOffset: 20 }
    ])
    assert.deepStrictEqual(state.isr, [1])
    assert.strictEqual(state.highWatermark, 10, "a lone leader's HW stays put (KIP-966)")
    assert.isFalse(commands.some((c) => c._tag === "AdvanceHighWatermark"))
  })

  it("a follower refused as ineligible is not proposed again on every fetch; a new life of it is", () => {
    const inputs: Array<LeaderState.Input> = [
      { _tag: "FollowerFetched", server: 3, fetchOffset: 10, nowMs: 1, registration: 5 },
      { _tag: "IsrChangeRejected", proposal: 1, ineligible: { server: 3, nowMs: 2 } }
    ]
    for (let i = 0; i < 50; i++) {
      inputs.push({ _tag: "FollowerFetched", server: 3, fetchOffset: 10, nowMs: 3 + i, registration: 5 })
    }
    const s = start({ isr: [1, 2] })
    const refused = run(s, inputs)
    assert.deepStrictEqual(
      refused.commands.filter((c) => c._tag === "ProposeIsr").map((c) => c.isr),
      [[1, 2, 3]],
      "proposed once"
    )
    // A new registration (it restarted), or lagTimeMaxMs later: proposed again.
    const renewed = run(refused.state, [
      { _tag: "FollowerFetched", server: 3, fetchOffset: 10, nowMs: 60, registration: 6 }
    ])
    assert.strictEqual(renewed.commands.filter((c) => c._tag === "ProposeIsr").length, 1)
    const later = run(refused.state, [
      { _tag: "FollowerFetched", server: 3, fetchOffset: 10, nowMs: 30_002, registration: 5 }
    ])
    assert.strictEqual(later.commands.filter((c) => c._tag === "ProposeIsr").length, 1)
  })

  it("a fetch from an ended life of a follower (an older registration) changes nothing", () => {
    const { state, commands } = run(start({ isr: [1, 2], replicas: [1, 2] }), [
      { _tag: "Appended", logEndOffset: 20 },
      { _tag: "FollowerFetched", server: 2, fetchOffset: 12, nowMs: 1, registration: 8 },
      // The process that registered as 7 before it lost its session, still running: its log end is not server 2's.
      { _tag: "FollowerFetched", server: 2, fetchOffset: 20, nowMs: 2, registration: 7 }
    ])
    assert.strictEqual(state.highWatermark, 12)
    assert.strictEqual(state.followers.get(2)?.logEndOffset, 12)
    assert.strictEqual(state.followers.get(2)?.registration, 8)
    assert.deepStrictEqual(
      commands.map((c) => (c._tag === "AdvanceHighWatermark" ? c.highWatermark : -1)),
      [12]
    )
  })

  it("a follower that fetches steadily, always one append behind the log end, stays in the ISR", () => {
    // Every fetch reaches the log end the leader had at the follower's previous fetch; an append lands between them.
    const inputs: Array<LeaderState.Input> = [{ _tag: "FollowerFetched", server: 3, fetchOffset: 10, nowMs: 0 }]
    for (let i = 1; i <= 100; i++) {
      inputs.push({ _tag: "Appended", logEndOffset: 10 + i })
      inputs.push({ _tag: "FollowerFetched", server: 2, fetchOffset: 10 + i - 1, nowMs: i * 1_000 })
      inputs.push({ _tag: "FollowerFetched", server: 3, fetchOffset: 10 + i, nowMs: i * 1_000 })
      inputs.push({ _tag: "Tick", nowMs: i * 1_000 + 500 })
    }
    const { state, commands } = run(start(), inputs)
    assert.deepStrictEqual(state.isr, [1, 2, 3])
    assert.isFalse(commands.some((c) => c._tag === "ProposeIsr"))
    // One that stops reaching it (always two appends behind from now on) leaves after lagTimeMaxMs.
    const behind: Array<LeaderState.Input> = []
    for (let i = 101; i <= 140; i++) {
      behind.push({ _tag: "Appended", logEndOffset: 10 + 2 * i })
      behind.push({ _tag: "FollowerFetched", server: 2, fetchOffset: 10 + 2 * i - 4, nowMs: i * 1_000 })
      behind.push({ _tag: "FollowerFetched", server: 3, fetchOffset: 10 + 2 * i, nowMs: i * 1_000 })
      behind.push({ _tag: "Tick", nowMs: i * 1_000 + 500 })
    }
    const later = run(state, behind)
    const proposals = later.commands.filter((c) => c._tag === "ProposeIsr")
    assert.deepStrictEqual(
      proposals.map((c) => c.isr),
      [[1, 3]]
    )
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
      [{ _tag: "ProposeIsr", proposal: 1, version: 0, isr: [1, 2], registrations: [] }]
    )
    assert.deepStrictEqual(state.pending, { _tag: "Shrink", proposal: 1, removed: [3], isr: [1, 2] })
    // Until committed, 3 still counts for the HW: it stays at 10 although 1 and 2 hold 12.
    assert.strictEqual(state.highWatermark, 10)
    const [after, hw] = LeaderState.step(state, { _tag: "IsrChangeCommitted", isr: [1, 2], version: 1, proposal: 1 })
    assert.strictEqual(after.highWatermark, 12)
    assert.deepStrictEqual(hw, [{ _tag: "AdvanceHighWatermark", highWatermark: 12 }])
  })

  it("a follower rejoins once it reaches the HW within the current epoch; a rejected expansion can be retried", () => {
    const s = start({ isr: [1, 2], logEndOffset: 20, highWatermark: 20 })
    const early = run(s, [{ _tag: "FollowerFetched", server: 3, fetchOffset: 19, nowMs: 5 }])
    assert.isUndefined(early.state.pending, "below the HW and the epoch's start: not yet")
    const joined = run(early.state, [{ _tag: "FollowerFetched", server: 3, fetchOffset: 20, nowMs: 6 }])
    assert.deepStrictEqual(joined.commands, [
      { _tag: "ProposeIsr", proposal: 1, version: 0, isr: [1, 2, 3], registrations: [] }
    ])
    const rejected = run(joined.state, [
      { _tag: "IsrChangeRejected", proposal: 1 },
      { _tag: "FollowerFetched", server: 3, fetchOffset: 20, nowMs: 7 }
    ])
    assert.deepStrictEqual(rejected.commands, [
      { _tag: "ProposeIsr", proposal: 2, version: 0, isr: [1, 2, 3], registrations: [] }
    ])
  })

  it("an expansion refused because the leadership is over stays pending: the leader alone acknowledges nothing (simulator seed 2027)", () => {
    // ISR [1], minimum 1: 2 caught up and 1 proposed [1,2]; an earlier try was committed and the controller has since
    // made 2 leader (epoch 4), so the retry is fenced. 2 leads without the records 1 takes from now on.
    const s = start({ isr: [1], replicas: [1, 2], minInsyncReplicas: 1, logEndOffset: 20, highWatermark: 20 })
    const proposed = run(s, [{ _tag: "FollowerFetched", server: 2, fetchOffset: 20, nowMs: 5 }])
    assert.deepStrictEqual(
      proposed.commands.map((c) => c._tag),
      ["ProposeIsr"]
    )
    const fenced = run(proposed.state, [
      { _tag: "IsrChangeFenced", proposal: 1 },
      { _tag: "Appended", logEndOffset: 25 },
      { _tag: "Tick", nowMs: 60_000 }
    ])
    assert.strictEqual(fenced.state.highWatermark, 20, "2 still counts: the records above 20 are not acknowledged")
    assert.deepStrictEqual(fenced.commands, [], "nothing advanced, nothing proposed again")
    // What a plain refusal does instead (the controller refused the change itself): 1 alone commits.
    const refused = run(proposed.state, [
      { _tag: "IsrChangeRejected", proposal: 1 },
      { _tag: "Appended", logEndOffset: 25 }
    ])
    assert.strictEqual(refused.state.highWatermark, 25)
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
        proposal: 1,
        version: 0,
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

  it("an answer to an earlier proposal (late, or retried) leaves the pending one pending", () => {
    // P1 (expand 3, against version 0) is committed at version 1 but its answer is slow; the controller then drops 3
    // itself (version 2); 3 fetches again and the leader proposes P2 against version 2.
    const s = start({ isr: [1, 2], logEndOffset: 20, highWatermark: 20 })
    const p2 = run(s, [
      { _tag: "FollowerFetched", server: 3, fetchOffset: 20, nowMs: 5 },
      { _tag: "IsrChangeCommitted", isr: [1, 2], version: 2 },
      { _tag: "FollowerFetched", server: 3, fetchOffset: 20, nowMs: 6 },
      { _tag: "Appended", logEndOffset: 25 },
      { _tag: "FollowerFetched", server: 2, fetchOffset: 25, nowMs: 7 }
    ])
    assert.deepStrictEqual(p2.state.pending, { _tag: "Expand", proposal: 2, server: 3, isr: [1, 2, 3] })
    assert.deepStrictEqual(p2.commands.at(-1), {
      _tag: "ProposeIsr",
      proposal: 2,
      version: 2,
      isr: [1, 2, 3],
      registrations: []
    })
    // P1's answers, late: neither its commit (version 1, older than known) nor a rejection of it clears P2, so the HW
    // still counts 3 (at 20) and does not pass it.
    const late = run(p2.state, [
      { _tag: "IsrChangeCommitted", isr: [1, 2, 3], version: 1, proposal: 1 },
      { _tag: "IsrChangeRejected", proposal: 1 },
      { _tag: "FollowerFetched", server: 2, fetchOffset: 25, nowMs: 8 }
    ])
    assert.deepStrictEqual(late.state.pending, p2.state.pending)
    assert.strictEqual(late.state.highWatermark, 20)
    // The planted bug clears it, and the HW passes what 3 holds.
    const planted = run(
      p2.state,
      [
        { _tag: "IsrChangeCommitted", isr: [1, 2, 3], version: 1, proposal: 1 },
        { _tag: "FollowerFetched", server: 2, fetchOffset: 25, nowMs: 8 }
      ],
      anyAnswerClearsPending
    )
    assert.isUndefined(planted.state.pending)
    assert.strictEqual(planted.state.highWatermark, 25)
  })

  it("a committed ISR below the minimum fails the waiting appends; an older version is not taken", () => {
    const s = start({ minInsyncReplicas: 2 })
    const { state, commands } = run(s, [
      { _tag: "IsrChangeCommitted", isr: [1], version: 3 },
      { _tag: "IsrChangeCommitted", isr: [1, 2, 3], version: 2 }
    ])
    assert.deepStrictEqual(state.isr, [1])
    assert.strictEqual(state.version, 3)
    assert.deepStrictEqual(commands, [{ _tag: "IsrBelowMinimum", size: 1 }])
  })
})

// ---------------------------------------------------------------------------
// Seeded runs against the safety properties
// ---------------------------------------------------------------------------

type StepFn = typeof LeaderState.step

/** A proposal on its way to the controller, or a controller answer / LeaderAndIsr on its way back. */
type InFlight =
  | {
      readonly _tag: "Proposal"
      readonly proposal: number
      readonly version: number
      readonly isr: ReadonlyArray<number>
    }
  | { readonly _tag: "Answer"; readonly input: LeaderState.Input }

/**
 * Drives a leader with random appends, fetches and ticks against a model controller that commits a proposal only
 * against its current version (and otherwise answers with its state, as `InvalidVersion` does), drops ISR members
 * itself, and delivers its answers and LeaderAndIsr updates late, out of order and sometimes twice. Returns the
 * first broken rule. The rules: the HW only moves forward, within the leader's log, over at least
 * `minInsyncReplicas` copies; and every member of the controller's committed ISR holds everything below the HW.
 */
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
    version: 0,
    minInsyncReplicas: minIsr,
    lagTimeMaxMs: 1000,
    logEndOffset: 0,
    highWatermark: 0,
    nowMs: 0
  })
  // The controller's committed state, and what is on the wire between it and the leader.
  let controller = { isr: replicas as ReadonlyArray<number>, version: 0 }
  const wire: Array<InFlight> = []
  // What each replica really holds (its log end), independent of what the leader believes.
  const held = new Map<number, number>(replicas.map((r) => [r, 0]))
  const deliverLater = (input: LeaderState.Input) => {
    wire.push({ _tag: "Answer", input })
    if (next() < 0.1) wire.push({ _tag: "Answer", input }) // a retried request answered twice
  }
  let now = 0
  for (let n = 0; n < 400; n++) {
    now += int(0, 300)
    const roll = next()
    let input: LeaderState.Input | undefined
    if (roll < 0.25) {
      held.set(1, held.get(1)! + int(1, 5))
      input = { _tag: "Appended", logEndOffset: held.get(1)! }
    } else if (roll < 0.6) {
      const f = replicas[int(1, replicas.length - 1)]
      if (f === undefined) continue
      // A follower fetches from its own log end, after copying some of what the leader has.
      held.set(f, int(held.get(f)!, held.get(1)!))
      input = { _tag: "FollowerFetched", server: f, fetchOffset: held.get(f)!, nowMs: now }
    } else if (roll < 0.7) input = { _tag: "Tick", nowMs: now }
    else if (roll < 0.85 && wire.length > 0) {
      // The wire delivers one message, not necessarily the oldest.
      const [m] = wire.splice(int(0, wire.length - 1), 1)
      if (m === undefined) continue
      if (m._tag === "Answer") input = m.input
      else if (m.version === controller.version) {
        controller = { isr: m.isr, version: controller.version + 1 }
        deliverLater({ _tag: "IsrChangeCommitted", ...controller, proposal: m.proposal })
      } else {
        deliverLater({ _tag: "IsrChangeCommitted", ...controller })
        deliverLater({ _tag: "IsrChangeRejected", proposal: m.proposal })
      }
    } else if (roll < 0.9 && controller.isr.length > 1) {
      // The controller drops a follower itself (it died, or is stopping) and tells the leader.
      const dropped = controller.isr.filter((r) => r !== 1)[int(0, controller.isr.length - 2)]
      controller = { isr: controller.isr.filter((r) => r !== dropped), version: controller.version + 1 }
      deliverLater({ _tag: "IsrChangeCommitted", ...controller })
    }
    if (input !== undefined) {
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
        if (c._tag === "ProposeIsr") {
          if (before.pending !== undefined) return `step ${n}: a second pending ISR change`
          wire.push({ _tag: "Proposal", proposal: c.proposal, version: c.version, isr: c.isr })
        }
      }
      if (after.highWatermark < before.highWatermark) return `step ${n}: HW went back`
      if (!after.isr.includes(1)) return `step ${n}: the leader left its own ISR`
      state = after
    }
    const short = controller.isr.find((r) => held.get(r)! < state.highWatermark)
    if (short !== undefined) {
      return `step ${n}: ISR member ${short} (version ${controller.version}) holds ${held.get(short)} < HW ${state.highWatermark}`
    }
  }
  return undefined
}

describe("LeaderState seeded runs", () => {
  it("2000 seeded runs against a late, reordering controller: the HW is held by every ISR member and minISR copies", () => {
    const seen = { committed: 0, stale: 0 }
    for (let seed = 1; seed <= 2000; seed++) {
      const failure = drive(seed, (state, input) => {
        if (input._tag === "IsrChangeCommitted") {
          if (input.version > state.version) seen.committed++
          else seen.stale++
        }
        return LeaderState.step(state, input)
      })
      assert.isUndefined(failure, `seed=${seed}: ${failure}`)
    }
    // The runs commit changes and deliver late answers, or they prove nothing about them.
    assert.isAbove(seen.committed, 2000)
    assert.isAbove(seen.stale, 2000)
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

  it("a planted bug (any ISR answer clears the pending change) is caught by an ISR member below the HW", () => {
    const buggy: StepFn = anyAnswerClearsPending
    const caught = Array.from({ length: 2000 }, (_, i) => drive(i + 1, buggy)).filter((f) => f !== undefined)
    assert.isTrue(
      caught.some((f) => f.includes("holds") && f.includes("< HW")),
      JSON.stringify(caught.slice(0, 2))
    )
  })
})
