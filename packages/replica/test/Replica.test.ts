import type { Models } from "@strata/core"
import type * as ReplicaManager from "../src/protocol/ReplicaManager.js"
import { assert, describe, it } from "@effect/vitest"
import * as Replica from "../src/machines/Replica.js"

const tablet = { table: "t", bucket: 0 }
const self: Models.ServerId = 1

/** Feeds `inputs` in order; the final state, every command, and each input's answer. */
const run = (state: Replica.State, inputs: ReadonlyArray<Replica.Input>) => {
  const commands: Array<Replica.Command> = []
  const answers: Array<Replica.Answer | undefined> = []
  for (const input of inputs) {
    const [next, ready] = Replica.step(state, input)
    state = next
    commands.push(...ready.commands)
    answers.push(ready.answer)
  }
  return { state, commands, answers }
}

const instruction = (
  leader: Models.ServerId | null,
  leaderEpoch: number,
  isr: ReadonlyArray<Models.ServerId>,
  version: number
): Replica.Input => {
  const i: ReplicaManager.TabletInstruction = {
    tablet,
    replicas: [1, 2, 3],
    leaderAndIsr: { leader, leaderEpoch, isr, coordinatorEpoch: 1, version }
  }
  return { _tag: "Instruction", instruction: i, log: { logEndOffset: 10, highWatermark: 10 }, nowMs: 0 }
}

/** A replica of server 1, loaded, leading epoch 1 with ISR [1,2] at version 5, minimum ISR 2. */
const leading = () =>
  run(Replica.make(tablet, self, { minInsyncReplicas: 2, lagTimeMaxMs: 1000 }), [
    { _tag: "Open" },
    { _tag: "Loaded" },
    instruction(1, 1, [1, 2], 5)
  ])

const tags = (commands: ReadonlyArray<Replica.Command>) => commands.map((c) => c._tag)

describe("Replica", () => {
  it("opens its log, loads, and takes the role an instruction gives, starting a new generation", () => {
    const { state, commands } = leading()
    assert.deepStrictEqual(tags(commands), ["OpenLog", "Log"])
    assert.strictEqual(state.lifecycle._tag, "LeaderReplica")
    assert.strictEqual(state.generation, 1)
    assert.strictEqual(state.version, 5)
    assert.strictEqual(state.leader?.highWatermark, 10)
    const follower = run(state, [instruction(2, 2, [1, 2], 6)])
    assert.deepStrictEqual(tags(follower.commands), ["Log", "StartFollowing"])
    assert.deepStrictEqual(follower.commands[1], { _tag: "StartFollowing", generation: 2, leader: 2, leaderEpoch: 2 })
  })

  it("refuses an append it cannot take, and asks the shell to persist one it can", () => {
    const { state } = leading()
    const follower = run(Replica.make(tablet, self, { minInsyncReplicas: 2, lagTimeMaxMs: 1000 }), [
      { _tag: "Open" },
      { _tag: "Loaded" },
      instruction(2, 1, [1, 2], 5),
      { _tag: "Propose", acks: "all" }
    ])
    const refusal = follower.answers.at(-1)
    assert.strictEqual(refusal?._tag === "Refused" && refusal.reason._tag, "NotLeader")
    assert.deepStrictEqual(run(state, [{ _tag: "Propose", acks: "all" }]).answers, [
      { _tag: "Persist", leaderEpoch: 1 }
    ])
    // The controller shrank the ISR to the leader alone: acks=all is refused, acks=1 is not.
    const shrunk = run(state, [
      instruction(1, 1, [1], 6),
      { _tag: "Propose", acks: "all" },
      { _tag: "Propose", acks: 1 }
    ])
    const [, all, one] = shrunk.answers
    assert.strictEqual(all?._tag === "Refused" && all.reason._tag, "NotEnoughReplicas")
    assert.deepStrictEqual(one, { _tag: "Persist", leaderEpoch: 1 })
  })

  it("an acks=all append waits for the HW, which moves only once checkpointed", () => {
    const { state } = leading()
    const written = run(state, [
      { _tag: "Propose", acks: "all" },
      { _tag: "Persisted", acks: "all", lastOffset: 14, duplicate: false }
    ])
    const wait = written.answers[1]
    assert.deepStrictEqual(wait, { _tag: "Wait", ticket: 1, highWatermark: 10 })
    assert.deepStrictEqual(tags(written.commands), ["Wake"])
    const fetched = run(written.state, [{ _tag: "FollowerFetched", server: 2, fetchOffset: 15, nowMs: 1 }])
    assert.deepStrictEqual(fetched.commands, [{ _tag: "Checkpoint", highWatermark: 15 }])
    assert.strictEqual(fetched.state.waiters.length, 1)
    const released = run(fetched.state, [{ _tag: "Checkpointed", highWatermark: 15 }])
    assert.deepStrictEqual(released.commands, [{ _tag: "Complete", tickets: [1], highWatermark: 15 }, { _tag: "Wake" }])
    assert.strictEqual(released.state.waiters.length, 0)
  })

  it("a delete is refused past the HW, done on the leader, and answered once every ISR member's start is past it", () => {
    const { state } = leading()
    const past = run(state, [{ _tag: "DeleteRecords", offset: 11, logStartOffset: 0 }]).answers[0]
    assert.strictEqual(past?._tag === "Refused" && past.reason._tag, "OffsetOutOfRange")
    assert.strictEqual(past?._tag === "Refused" && past.reason._tag === "OffsetOutOfRange" && past.reason.highwater, 10)
    const deleted = run(state, [
      { _tag: "DeleteRecords", offset: 6, logStartOffset: 0 },
      { _tag: "RecordsDeleted", offset: 6 }
    ])
    assert.deepStrictEqual(deleted.answers, [
      { _tag: "Delete", leaderEpoch: 1 },
      { _tag: "Wait", ticket: 1, highWatermark: 10 }
    ])
    // A waiting delete wakes the followers' long polls, so they learn the new start at once.
    assert.include(tags(deleted.commands), "Wake")
    // The follower's fetches say where its log starts: below the offset nothing completes, at it the delete does.
    const below = run(deleted.state, [
      { _tag: "FollowerFetched", server: 2, fetchOffset: 10, nowMs: 1, logStartOffset: 5 }
    ])
    assert.notInclude(tags(below.commands), "Complete")
    const reached = run(below.state, [
      { _tag: "FollowerFetched", server: 2, fetchOffset: 10, nowMs: 2, logStartOffset: 6 }
    ])
    assert.deepStrictEqual(reached.commands, [{ _tag: "Complete", tickets: [1], highWatermark: 10 }])
    assert.strictEqual(reached.state.deletes.length, 0)
    // Once the follower is past it, another delete below its start is answered at once.
    const again = run(reached.state, [{ _tag: "RecordsDeleted", offset: 4 }])
    assert.deepStrictEqual(again.answers, [{ _tag: "Done", highWatermark: 10 }])
    // A leader that stops leading fails its waiting deletes.
    const ended = run(deleted.state, [instruction(2, 2, [1, 2], 6)])
    const failed = ended.commands.find((c) => c._tag === "Fail")
    assert.deepStrictEqual(failed?._tag === "Fail" && failed.tickets, [1])
    // A follower asked to delete refuses, naming its leader.
    const follower = run(ended.state, [{ _tag: "DeleteRecords", offset: 2, logStartOffset: 0 }]).answers[0]
    assert.strictEqual(follower?._tag === "Refused" && follower.reason._tag, "NotLeader")
  })

  it("a follower whose log starts past the leader's moves the leader's start there, up to the HW, once", () => {
    const { state } = leading()
    // The follower's log starts at 8 (an earlier leader deleted below it): the leader's start moves to 8.
    const raised = run(state, [{ _tag: "FollowerFetched", server: 2, fetchOffset: 10, nowMs: 1, logStartOffset: 8 }])
    assert.deepStrictEqual(
      raised.commands.filter((c) => c._tag === "RaiseLogStart"),
      [{ _tag: "RaiseLogStart", offset: 8 }]
    )
    // Told again, nothing more; past the HW, only up to it.
    const again = run(raised.state, [
      { _tag: "FollowerFetched", server: 2, fetchOffset: 10, nowMs: 2, logStartOffset: 8 },
      { _tag: "FollowerFetched", server: 2, fetchOffset: 10, nowMs: 3, logStartOffset: 30 }
    ])
    assert.deepStrictEqual(
      again.commands.filter((c) => c._tag === "RaiseLogStart"),
      [{ _tag: "RaiseLogStart", offset: 10 }]
    )
    // A start the leader's own delete set, reported back, moves nothing.
    const deleted = run(state, [
      { _tag: "DeleteRecords", offset: 6, logStartOffset: 0 },
      { _tag: "RecordsDeleted", offset: 6 },
      { _tag: "FollowerFetched", server: 2, fetchOffset: 10, nowMs: 1, logStartOffset: 6 }
    ])
    assert.notInclude(tags(deleted.commands), "RaiseLogStart")
  })

  it("a delete needs the ISR at its minimum size, as an acks=all append does", () => {
    const { state } = leading()
    const waiting = run(state, [
      { _tag: "Persisted", acks: "all", lastOffset: 12, duplicate: false },
      { _tag: "DeleteRecords", offset: 6, logStartOffset: 0 },
      { _tag: "RecordsDeleted", offset: 6 }
    ])
    assert.deepStrictEqual(waiting.answers[2], { _tag: "Wait", ticket: 2, highWatermark: 10 })
    // The ISR shrinks to the leader alone: neither the append nor the delete is held by two replicas, and the
    // leader's own start may be lost with its unflushed writes, so both fail.
    const shrunk = run(waiting.state, [instruction(1, 1, [1], 6)])
    const failed = shrunk.commands.find((c) => c._tag === "Fail")
    assert.strictEqual(failed?._tag === "Fail" && failed.reason._tag, "NotEnoughReplicasAfterAppend")
    assert.deepStrictEqual(failed?._tag === "Fail" && failed.tickets, [1, 2])
    assert.notInclude(tags(shrunk.commands), "Complete")
    assert.strictEqual(shrunk.state.deletes.length, 0)
    // Alone in its ISR, the leader refuses a delete, and one whose ISR shrank meanwhile fails when it is written.
    const refusedAlone = run(shrunk.state, [{ _tag: "DeleteRecords", offset: 6, logStartOffset: 0 }]).answers[0]
    assert.strictEqual(refusedAlone?._tag === "Refused" && refusedAlone.reason._tag, "NotEnoughReplicas")
    const written = run(shrunk.state, [{ _tag: "RecordsDeleted", offset: 6 }]).answers[0]
    assert.strictEqual(written?._tag === "Refused" && written.reason._tag, "NotEnoughReplicasAfterAppend")
  })

  it("a leadership that ends fails its waiting appends, naming the new leader", () => {
    const { state } = leading()
    const waiting = run(state, [{ _tag: "Persisted", acks: "all", lastOffset: 12, duplicate: false }]).state
    const { commands } = run(waiting, [instruction(3, 2, [2, 3], 6)])
    const failed = commands.find((c) => c._tag === "Fail")
    assert.strictEqual(failed?._tag === "Fail" && failed.reason._tag, "NotLeader")
    assert.deepStrictEqual(failed?._tag === "Fail" && failed.tickets, [1])
    assert.strictEqual(failed?._tag === "Fail" && failed.reason._tag === "NotLeader" && failed.reason.leader, 3)
  })

  it("an ISR answer of an ended generation changes nothing; a fenced refusal keeps the change pending", () => {
    const { state } = leading()
    // Server 3 catches up: the leader proposes adding it.
    const proposed = run(state, [{ _tag: "FollowerFetched", server: 3, fetchOffset: 10, nowMs: 1 }])
    const propose = proposed.commands.find((c) => c._tag === "ProposeIsr")
    assert.deepStrictEqual(propose, {
      _tag: "ProposeIsr",
      generation: 1,
      leaderEpoch: 1,
      proposal: 1,
      version: 5,
      isr: [1, 2, 3],
      registrations: []
    })
    const committed = {
      _tag: "IsrAdjusted",
      leaderAndIsr: { leader: 1, leaderEpoch: 1, isr: [1, 2, 3], coordinatorEpoch: 1, version: 6 }
    } as const
    const stale = run(proposed.state, [{ _tag: "IsrAnswer", generation: 0, proposal: 1, reply: committed, nowMs: 2 }])
    assert.strictEqual(stale.state, proposed.state)
    const fenced = run(proposed.state, [
      {
        _tag: "IsrAnswer",
        generation: 1,
        proposal: 1,
        reply: { _tag: "IsrRejected", rejection: { _tag: "FencedLeaderEpoch", current: 2 } },
        nowMs: 2
      }
    ])
    assert.strictEqual(fenced.state.leader?.pending?.proposal, 1)
    const taken = run(proposed.state, [{ _tag: "IsrAnswer", generation: 1, proposal: 1, reply: committed, nowMs: 2 }])
    assert.deepStrictEqual(taken.state.leader?.isr, [1, 2, 3])
    assert.isUndefined(taken.state.leader?.pending)
    assert.strictEqual(taken.state.version, 6)
  })

  it("a long-polled fetch is answered only in the generation and epoch it was admitted under", () => {
    const { state } = leading()
    const admitted = run(state, [{ _tag: "Lead", leaderEpoch: 1 }]).answers[0]
    assert.deepStrictEqual(admitted, { _tag: "Admitted", generation: 1, leaderEpoch: 1, highWatermark: 10 })
    const older = run(state, [{ _tag: "Lead", leaderEpoch: 0 }]).answers[0]
    assert.strictEqual(older?._tag === "Refused" && older.reason._tag, "FencedEpoch")
    const again = run(state, [instruction(1, 2, [1, 2], 6)]).state
    const recheck = run(again, [{ _tag: "Recheck", generation: 1, leaderEpoch: 1 }]).answers[0]
    assert.strictEqual(recheck?._tag === "Refused" && recheck.reason._tag, "NotLeader")
  })

  it("a store failure takes a serving replica offline once; a fence under a newer epoch ends the role", () => {
    const { state } = leading()
    const failed = run(state, [{ _tag: "StorageFailed", detail: "disk full" }])
    assert.deepStrictEqual(tags(failed.commands), ["StoreFailed", "CloseLog", "ResumeStorage"])
    assert.strictEqual(failed.state.lifecycle._tag, "OfflineReplica")
    assert.deepStrictEqual(run(failed.state, [{ _tag: "StorageFailed", detail: "again" }]).commands, [])
    // An ended generation's failure is not this one's.
    assert.deepStrictEqual(run(state, [{ _tag: "StorageFailed", detail: "old", generation: 0 }]).commands, [])
    const fenced = run(state, [instruction(null, 3, [1, 2], 7)])
    assert.strictEqual(fenced.state.lifecycle._tag, "OnlineReplica")
    assert.isUndefined(fenced.state.leader)
  })
})
