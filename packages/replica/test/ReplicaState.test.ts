import { Errors } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { Result } from "effect"
import { documentedRows } from "../../../scripts/test-support/docTable.js"
import { prng } from "../../../scripts/test-support/prng.js"
import * as ReplicaState from "../src/machines/ReplicaState.js"

const replica: ReplicaState.Replica = { tablet: { table: "orders", bucket: 3 }, self: 1 }
const replicas = [1, 2, 3]
const lai = (leader: number, leaderEpoch: number, isr = replicas): ReplicaState.Event => ({
  _tag: "LeaderAndIsr",
  leader,
  leaderEpoch,
  isr,
  replicas
})

/** Sample states, one per row family of the documented table. */
const samples: ReadonlyArray<readonly [string, ReplicaState.State]> = [
  ["NewReplica", { _tag: "NewReplica", lastLeaderEpoch: 4 }],
  ["OnlineReplica", { _tag: "OnlineReplica", lastLeaderEpoch: 4 }],
  ["LeaderReplica", { _tag: "LeaderReplica", leaderEpoch: 4, isr: replicas }],
  ["FollowerReplica", { _tag: "FollowerReplica", leaderEpoch: 4, leader: 2 }],
  ["OfflineReplica", { _tag: "OfflineReplica", lastLeaderEpoch: 4 }],
  ["ReplicaDeleted", { _tag: "ReplicaDeleted" }]
]
/** Labelled events; the labels of the table. */
const events: ReadonlyArray<readonly [string, ReplicaState.Event]> = [
  ["Loaded", { _tag: "Loaded" }],
  ["LeaderAndIsr(epoch > own, leader = self)", lai(1, 5)],
  ["LeaderAndIsr(epoch > own, leader = other)", lai(2, 5)],
  ["LeaderAndIsr(epoch = own)", lai(2, 4)],
  ["LeaderAndIsr(leader not a replica)", lai(9, 5)],
  ["Fence(epoch > own)", { _tag: "Fence", leaderEpoch: 5 }],
  ["Fence(epoch = own)", { _tag: "Fence", leaderEpoch: 4 }],
  ["Offline", { _tag: "Offline" }],
  ["Reopen", { _tag: "Reopen" }],
  ["Delete", { _tag: "Delete" }]
]

const describeCommands = (commands: ReadonlyArray<ReplicaState.Command>) =>
  commands.length === 0 ? "—" : commands.map((c) => c._tag).join(", ")

describe("ReplicaState.step", () => {
  it("the transition table in the module comment is the machine's", () => {
    const rows: Array<string> = []
    for (const [from, state] of samples) {
      for (const [label, event] of events) {
        const result = ReplicaState.step(replica, state, event)
        if (Result.isFailure(result)) continue
        const [next, commands] = result.success
        // An Online replica's first role has no own epoch to compare with: its label drops the condition.
        const shown = from === "OnlineReplica" ? label.replace("epoch > own, ", "") : label
        rows.push(`| ${from} | ${shown} | ${next._tag} | ${describeCommands(commands)} |`)
      }
    }
    const documented = documentedRows(new URL("../src/machines/ReplicaState.ts", import.meta.url))
    assert.isAbove(documented.length, 10)
    assert.deepStrictEqual(documented, rows, `the table should read:\n${rows.join("\n")}`)
  })

  it("a role needs the log loaded, and a strictly higher leader epoch", () => {
    const refused = ReplicaState.step(replica, ReplicaState.initial, lai(1, 1))
    assert.isTrue(Result.isFailure(refused))
    const error = Result.merge(refused)
    assert.instanceOf(error, Errors.IllegalStateTransition)
    if (!(error instanceof Errors.IllegalStateTransition)) return
    assert.strictEqual(error.machine, "replica")
    assert.strictEqual(error.entity, "orders/3 on server 1")
    assert.strictEqual(error.from, "NewReplica")
    assert.strictEqual(error.to, "LeaderAndIsr(leader 1, epoch 1)")

    const [online] = Result.getOrThrow(ReplicaState.step(replica, ReplicaState.initial, { _tag: "Loaded" }))
    const [leader, becomeLeader] = Result.getOrThrow(ReplicaState.step(replica, online, lai(1, 3)))
    assert.deepStrictEqual(becomeLeader, [{ _tag: "BecomeLeader", leaderEpoch: 3, isr: replicas }])
    assert.isTrue(Result.isFailure(ReplicaState.step(replica, leader, lai(2, 3))), "the same epoch")
    assert.isTrue(Result.isFailure(ReplicaState.step(replica, leader, lai(2, 2))), "an older epoch")
    const [follower, commands] = Result.getOrThrow(ReplicaState.step(replica, leader, lai(2, 4)))
    assert.deepStrictEqual(follower, { _tag: "FollowerReplica", leaderEpoch: 4, leader: 2 })
    assert.deepStrictEqual(commands, [{ _tag: "StopLeading" }, { _tag: "BecomeFollower", leaderEpoch: 4, leader: 2 }])
  })

  it("an offline replica comes back through its log's reopening and keeps the epoch it had seen", () => {
    const leader: ReplicaState.State = { _tag: "LeaderReplica", leaderEpoch: 7, isr: replicas }
    const [offline, stop] = Result.getOrThrow(ReplicaState.step(replica, leader, { _tag: "Offline" }))
    assert.deepStrictEqual(stop, [{ _tag: "StopLeading" }, { _tag: "CloseLog" }])
    const [reopened, open] = Result.getOrThrow(ReplicaState.step(replica, offline, { _tag: "Reopen" }))
    assert.deepStrictEqual(open, [{ _tag: "OpenLog" }])
    const [online] = Result.getOrThrow(ReplicaState.step(replica, reopened, { _tag: "Loaded" }))
    assert.isTrue(Result.isFailure(ReplicaState.step(replica, online, lai(1, 7))), "it led epoch 7: not again")
    // Following under the epoch it had seen is safe (its leader fences it if it no longer leads).
    const [follower] = Result.getOrThrow(ReplicaState.step(replica, online, lai(2, 7)))
    assert.deepStrictEqual(follower, { _tag: "FollowerReplica", leaderEpoch: 7, leader: 2 })
    assert.isTrue(Result.isSuccess(ReplicaState.step(replica, online, lai(2, 8))))
  })
})

// ---------------------------------------------------------------------------
// Seeded random walks
// ---------------------------------------------------------------------------

const randomEvent = (next: () => number): ReplicaState.Event => {
  const roll = next()
  const epoch = Math.floor(next() * 10)
  if (roll < 0.15) return { _tag: "Loaded" }
  if (roll < 0.6) return lai(1 + Math.floor(next() * 4), epoch)
  if (roll < 0.7) return { _tag: "Fence", leaderEpoch: epoch }
  if (roll < 0.85) return { _tag: "Offline" }
  if (roll < 0.97) return { _tag: "Reopen" }
  return { _tag: "Delete" }
}

type StepFn = typeof ReplicaState.step

/** Walks the machine on random events; returns the first broken property. */
const walk = (seed: number, length: number, step: StepFn = ReplicaState.step): string | undefined => {
  const next = prng(seed)
  let state = ReplicaState.initial
  let highest = -1
  let role: "leading" | "fetching" | undefined
  // The replica starts as `assign` made it: its log being opened.
  let logOpen = ReplicaState.assign[1].some((c) => c._tag === "OpenLog")
  for (let n = 0; n < length; n++) {
    const event = randomEvent(next)
    const result = step(replica, state, event)
    if (Result.isFailure(result)) {
      if (!(result.failure instanceof Errors.IllegalStateTransition)) return `step ${n}: not an IllegalStateTransition`
      continue
    }
    if (state._tag === "ReplicaDeleted" && (event._tag !== "Fence" || result.success[1].length > 0))
      return `step ${n}: a deleted replica accepted ${event._tag}`
    const [after, commands] = result.success
    if (event._tag === "Fence") {
      // Fenced: no role under an epoch below the fence's, and none under an older epoch goes on.
      if (role !== undefined && highest < event.leaderEpoch && !commands.some((c) => c._tag.startsWith("Stop")))
        return `step ${n}: a role under epoch ${highest} went on after a fence at ${event.leaderEpoch}`
      highest = Math.max(highest, event.leaderEpoch)
    }
    for (const c of commands) {
      switch (c._tag) {
        case "OpenLog":
          if (logOpen) return `step ${n}: opened twice`
          logOpen = true
          break
        case "CloseLog":
          if (!logOpen) return `step ${n}: closed a closed log`
          if (role !== undefined) return `step ${n}: closed the log while ${role}`
          logOpen = false
          break
        case "BecomeLeader":
        case "BecomeFollower":
          if (role !== undefined) return `step ${n}: a new role while ${role}`
          // A role only under a new epoch, except following again, from no role, under the epoch last seen.
          if (
            c.leaderEpoch < highest ||
            (c.leaderEpoch === highest && (c._tag === "BecomeLeader" || state._tag !== "OnlineReplica"))
          ) {
            return `step ${n}: a role under epoch ${c.leaderEpoch} after ${highest}`
          }
          highest = c.leaderEpoch
          role = c._tag === "BecomeLeader" ? "leading" : "fetching"
          break
        case "StopLeading":
          if (role !== "leading") return `step ${n}: stopped leading while ${role ?? "idle"}`
          role = undefined
          break
        case "StopFetching":
          if (role !== "fetching") return `step ${n}: stopped fetching while ${role ?? "idle"}`
          role = undefined
          break
        case "DeleteLog":
          if (logOpen) return `step ${n}: deleted an open log`
      }
    }
    const expected =
      after._tag === "LeaderReplica" ? "leading" : after._tag === "FollowerReplica" ? "fetching" : undefined
    if (role !== expected) return `step ${n}: ${after._tag} with role ${role ?? "none"}`
    state = after
  }
  return undefined
}

describe("ReplicaState random walks", () => {
  it("1000 seeded walks keep the safety properties", () => {
    for (let seed = 1; seed <= 1000; seed++) {
      const failure = walk(seed, 300)
      assert.isUndefined(failure, `seed=${seed}: ${failure}`)
    }
  })

  it("walks reach both roles (the checker is not vacuous)", () => {
    let leaders = 0
    let followers = 0
    for (let seed = 1; seed <= 200; seed++) {
      const next = prng(seed)
      let state = ReplicaState.initial
      for (let n = 0; n < 300; n++) {
        const r = ReplicaState.step(replica, state, randomEvent(next))
        if (Result.isSuccess(r)) state = r.success[0]
        if (state._tag === "LeaderReplica") leaders++
        if (state._tag === "FollowerReplica") followers++
      }
    }
    assert.isAbove(leaders, 100)
    assert.isAbove(followers, 100)
  })

  it("a planted bug (a role under any epoch) is caught by the checker", () => {
    const buggy: StepFn = (r, state, event) =>
      event._tag === "LeaderAndIsr" && (state._tag === "LeaderReplica" || state._tag === "FollowerReplica")
        ? ReplicaState.step(r, { _tag: "OnlineReplica", lastLeaderEpoch: null }, event).pipe(
            Result.map(
              ([next, commands]) =>
                [
                  next,
                  [{ _tag: state._tag === "LeaderReplica" ? "StopLeading" : "StopFetching" } as const, ...commands]
                ] as const
            )
          )
        : ReplicaState.step(r, state, event)
    const caught = Array.from({ length: 200 }, (_, i) => walk(i + 1, 300, buggy)).filter((f) => f !== undefined)
    assert.isTrue(
      caught.some((f) => f.includes("a role under epoch")),
      JSON.stringify(caught.slice(0, 3))
    )
  })
})
