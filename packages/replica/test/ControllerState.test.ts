import { Models } from "@strata/core"
import { isDeepStrictEqual } from "node:util"
import { assert, describe, it } from "@effect/vitest"
import { documentedRows } from "../../../scripts/test-support/docTable.js"
import { type Prng, seeded } from "../../../scripts/test-support/prng.js"
import * as ControllerState from "../src/machines/ControllerState.js"
import * as Mutants from "./support/mutants.js"

type State = ControllerState.State
type Input = ControllerState.Input
type Command = ControllerState.Command
type AdjustIsr = Extract<Input, { _tag: "AdjustIsr" }>
type StepFn = typeof ControllerState.step

const tid = (bucket: number): Models.TabletId => ({ table: "orders", bucket })
const key = (bucket: number) => Models.tabletKey(tid(bucket))

const up = (server: Models.ServerId): Input => ({ _tag: "ServerUp", server })
const down = (server: Models.ServerId): Input => ({ _tag: "ServerDown", server })
const shutdown = (server: Models.ServerId): Input => ({ _tag: "ControlledShutdown", requestId: 5, server })
const started = (
  coordinatorEpoch: number,
  live: ReadonlyArray<Models.ServerId>,
  tablets: ReadonlyArray<ControllerState.Tablet> = [],
  registrations?: ReadonlyArray<readonly [Models.ServerId, number]>
): Input => ({
  _tag: "Started",
  coordinatorEpoch,
  live,
  tablets,
  ...(registrations === undefined ? {} : { registrations })
})
const deleteTablets = (...buckets: ReadonlyArray<number>): Extract<Input, { _tag: "DeleteTablets" }> => ({
  _tag: "DeleteTablets",
  requestId: 6,
  tablets: buckets.map(tid)
})
const stopped = (server: Models.ServerId, buckets: ReadonlyArray<number>, registration?: number): Input => ({
  _tag: "ReplicaStopped",
  server,
  ...(registration === undefined ? {} : { registration }),
  tablets: buckets.map(tid)
})
const create = (
  ...specs: ReadonlyArray<readonly [number, ReadonlyArray<Models.ServerId>]>
): Extract<Input, { _tag: "CreateTablets" }> => ({
  _tag: "CreateTablets",
  requestId: 1,
  tablets: specs.map(([bucket, replicas]) => ({ tablet: tid(bucket), replicas }))
})

/** The tablet `bucket` of `state`. */
const tablet = (state: State, bucket: number): ControllerState.Tablet => {
  const t = state.tablets.get(key(bucket))
  if (t === undefined) throw new Error(`no tablet ${bucket}`)
  return t
}
const lai = (state: State, bucket: number) => tablet(state, bucket).leaderAndIsr

/** An ISR change request naming `bucket`'s current leader, epoch and version; `wrong` spoils a field. */
const adjust = (
  state: State,
  bucket: number,
  isr: ReadonlyArray<Models.ServerId>,
  wrong: Partial<AdjustIsr> = {}
): AdjustIsr => {
  const current = state.tablets.get(key(bucket))?.leaderAndIsr
  return {
    _tag: "AdjustIsr",
    requestId: 3,
    tablet: tid(bucket),
    leader: current?.leader ?? 1,
    leaderEpoch: current?.leaderEpoch ?? 0,
    version: current?.version ?? 0,
    isr,
    ...wrong
  }
}

/** A controller with `options` under coordinator epoch 1 with `live` registered and no tablets. */
const bootWith = (options: ControllerState.Options, live: ReadonlyArray<Models.ServerId>): State =>
  ControllerState.step(ControllerState.make(options), started(1, live))[0]
const largest = { uncleanLeaderElection: false, leaderElection: "largest-log-end" } as const
/** A candidate's answer for t0 in `state`'s election of it. */
const logEnd = (state: State, server: Models.ServerId, end: ControllerState.LogEnd | null): Input => ({
  _tag: "LogEnd",
  tablet: tid(0),
  round: state.elections.get(key(0))?.round ?? -1,
  server,
  logEnd: end
})
const asked = (commands: ReadonlyArray<Command>) => commands.flatMap((c) => (c._tag === "AskLogEnd" ? [c.server] : []))

/** A controller under coordinator epoch 1 with `live` registered and no tablets. */
const boot = (live: ReadonlyArray<Models.ServerId>, uncleanLeaderElection = false): State =>
  ControllerState.step(ControllerState.make({ uncleanLeaderElection }), started(1, live))[0]

/** Feeds `inputs` in order: the last state and the last step's commands. */
const run = (state: State, ...inputs: ReadonlyArray<Input>) => {
  let commands: ReadonlyArray<Command> = []
  for (const input of inputs) [state, commands] = ControllerState.step(state, input)
  return { state, commands }
}

const tags = (commands: ReadonlyArray<Command>) => commands.map((c) => c._tag)
const writes = (commands: ReadonlyArray<Command>) =>
  commands.flatMap((c) => (c._tag === "Write" ? [{ bucket: c.tablet.tablet.bucket, expected: c.expectedVersion }] : []))
/** The buckets each server was sent, over all its Sends; every Send must carry `coordinatorEpoch`. */
const sent = (commands: ReadonlyArray<Command>, coordinatorEpoch = 1) => {
  const by: Record<number, Array<number>> = {}
  for (const c of commands) {
    if (c._tag !== "Send") continue
    assert.strictEqual(c.coordinatorEpoch, coordinatorEpoch, `the Send to ${c.server}`)
    by[c.server] = [...(by[c.server] ?? []), ...c.tablets.map((t) => t.tablet.bucket)].sort()
  }
  return by
}
const reply = (commands: ReadonlyArray<Command>) => {
  const r = commands.find((c) => c._tag === "Reply")
  return r?._tag === "Reply" ? r.reply : undefined
}
const logs = (commands: ReadonlyArray<Command>) =>
  commands.flatMap((c) => (c._tag === "Log" ? [`${c.level}: ${c.message}`] : []))

describe("ControllerStateState.step", () => {
  it("CreateTablets: the first live replica leads the live ISR; written, then sent, then answered", () => {
    const { state, commands } = run(boot([1, 2, 3]), create([0, [4, 2, 1]], [1, [4, 5]], [2, [3]]))
    assert.deepStrictEqual(lai(state, 0), { leader: 2, leaderEpoch: 0, isr: [2, 1], coordinatorEpoch: 1, version: 0 })
    assert.deepStrictEqual(lai(state, 1), {
      leader: null,
      leaderEpoch: 0,
      isr: [4, 5],
      coordinatorEpoch: 1,
      version: 0
    })
    assert.deepStrictEqual(lai(state, 2), { leader: 3, leaderEpoch: 0, isr: [3], coordinatorEpoch: 1, version: 0 })
    assert.deepStrictEqual(
      [0, 1, 2].map((b) => tablet(state, b).state),
      ["OnlineTablet", "OfflineTablet", "OnlineTablet"]
    )
    assert.deepStrictEqual(tags(commands), ["Write", "Write", "Write", "Send", "Send", "Send", "Reply"])
    assert.deepStrictEqual(
      writes(commands),
      [0, 1, 2].map((bucket) => ({ bucket, expected: null }))
    )
    assert.deepStrictEqual(sent(commands), { 1: [0], 2: [0], 3: [2] })
    assert.deepStrictEqual(reply(commands), { _tag: "Created", tablets: [0, 1, 2].map((b) => tablet(state, b)) })

    // An existing tablet is left as it is; only the new one is created.
    const again = run(state, create([0, [1]], [3, [1, 5]]))
    assert.deepStrictEqual(tablet(again.state, 0), tablet(state, 0))
    assert.deepStrictEqual(writes(again.commands), [{ bucket: 3, expected: null }])
    assert.deepStrictEqual(sent(again.commands), { 1: [3] })
    assert.deepStrictEqual(reply(again.commands), { _tag: "Created", tablets: [tablet(again.state, 3)] })

    // A server in controlled shutdown neither leads a new tablet nor joins its ISR.
    const stopping = run(boot([1, 2]), shutdown(2), create([0, [2, 1]])).state
    assert.deepStrictEqual(lai(stopping, 0), { leader: 1, leaderEpoch: 0, isr: [1], coordinatorEpoch: 1, version: 0 })
  })

  it("ServerDown: a dead leader's successor is the first live ISR member in assignment order; the last member stays", () => {
    let s = run(boot([1, 2, 3]), create([0, [1, 2, 3, 4]])).state
    s = run(s, adjust(s, 0, [1, 3, 2])).state // the ISR's order is not the assignment's
    const leaderDied = run(s, down(1))
    assert.deepStrictEqual(lai(leaderDied.state, 0), {
      leader: 2,
      leaderEpoch: 1,
      isr: [3, 2],
      coordinatorEpoch: 1,
      version: 2
    })
    assert.deepStrictEqual(tags(leaderDied.commands), ["Write", "Send", "Send"])
    assert.deepStrictEqual(writes(leaderDied.commands), [{ bucket: 0, expected: 1 }])
    assert.deepStrictEqual(sent(leaderDied.commands), { 2: [0], 3: [0] })

    const followerDied = run(leaderDied.state, down(3))
    assert.deepStrictEqual(lai(followerDied.state, 0), {
      leader: 2,
      leaderEpoch: 1,
      isr: [2],
      coordinatorEpoch: 1,
      version: 3
    })
    assert.deepStrictEqual(writes(followerDied.commands), [{ bucket: 0, expected: 2 }])

    // A replica outside the ISR coming and going changes nothing.
    const outside = run(followerDied.state, up(4), down(4))
    assert.deepStrictEqual(outside.commands, [])
    assert.deepStrictEqual(tablet(outside.state, 0), tablet(followerDied.state, 0))

    const lastDied = run(outside.state, down(2))
    assert.strictEqual(tablet(lastDied.state, 0).state, "OfflineTablet")
    assert.deepStrictEqual(lai(lastDied.state, 0), {
      leader: null,
      leaderEpoch: 2,
      isr: [2],
      coordinatorEpoch: 1,
      version: 4
    })
    assert.deepStrictEqual(tags(lastDied.commands), ["Write", "Log"])
    assert.deepStrictEqual(writes(lastDied.commands), [{ bucket: 0, expected: 3 }])
    assert.match(logs(lastDied.commands)[0]!, /^warn: orders\/0: /)
  })

  /** t0 [1, 2] and t2 [1] offline with ISR [1]; t1 [2, 3] led by 3; servers 1 and 2 down, 3 up. */
  const bothDown = (unclean: boolean) =>
    run(boot([1, 2, 3], unclean), create([0, [1, 2]], [1, [2, 3]], [2, [1]]), down(2), down(1)).state

  it("ServerUp: an ISR member takes its offline tablets; the returning server hears all its tablets, others the changes", () => {
    const s = bothDown(false)
    assert.deepStrictEqual(
      [0, 1, 2].map((b) => lai(s, b).leader),
      [null, 3, null]
    )
    const outsider = run(s, up(2)) // not in t0's ISR: t0 stays offline
    assert.strictEqual(tablet(outsider.state, 0).state, "OfflineTablet")
    assert.deepStrictEqual(tags(outsider.commands), ["Send"])
    assert.deepStrictEqual(sent(outsider.commands), { 2: [0, 1] })
    assert.strictEqual(outsider.state.uncleanElections, 0)

    const member = run(outsider.state, up(1))
    assert.deepStrictEqual(lai(member.state, 0), {
      leader: 1,
      leaderEpoch: 2,
      isr: [1],
      coordinatorEpoch: 1,
      version: 3
    })
    assert.deepStrictEqual(lai(member.state, 2), {
      leader: 1,
      leaderEpoch: 2,
      isr: [1],
      coordinatorEpoch: 1,
      version: 2
    })
    assert.strictEqual(tablet(member.state, 0).state, "OnlineTablet")
    assert.deepStrictEqual(writes(member.commands), [
      { bucket: 0, expected: 2 },
      { bucket: 2, expected: 1 }
    ])
    assert.deepStrictEqual(sent(member.commands), { 1: [0, 2], 2: [0] }, "3 holds only the unchanged t1")
  })

  it("ServerUp with unclean leader election: a replica outside the ISR takes the tablet, counted and logged", () => {
    const { state, commands } = run(bothDown(true), up(2))
    assert.deepStrictEqual(lai(state, 0), { leader: 2, leaderEpoch: 2, isr: [2], coordinatorEpoch: 1, version: 3 })
    assert.strictEqual(tablet(state, 0).state, "OnlineTablet")
    assert.strictEqual(state.uncleanElections, 1)
    assert.deepStrictEqual(sent(commands), { 2: [0, 1] })
    const warned = logs(commands)
    assert.strictEqual(warned.length, 1)
    assert.match(warned[0]!, /^warn: .*unclean/)
  })

  it("a replica whose storage failed loses leadership and its ISR place, is not preferred or added, until it works", () => {
    const s0 = run(boot([1, 2, 3]), create([0, [1, 2, 3]])).state
    assert.strictEqual(lai(s0, 0).leader, 1)
    const storage = (server: number, failed: boolean): Input => ({
      _tag: "ReplicaStorage",
      server,
      tablets: [tid(0)],
      failed
    })
    const failed = run(s0, storage(1, true))
    assert.deepStrictEqual([lai(failed.state, 0).leader, lai(failed.state, 0).isr], [2, [2, 3]])
    assert.strictEqual(lai(failed.state, 0).leaderEpoch, lai(s0, 0).leaderEpoch + 1)
    // The preferred leader is 1, but it cannot write: balancing leaves the tablet where it is.
    const balanced = run(failed.state, { _tag: "BalanceLeaders", requestId: 4 })
    assert.strictEqual(lai(balanced.state, 0).leader, 2)
    // Its leader asks to add it back: refused, saying why.
    const back = run(failed.state, adjust(failed.state, 0, [2, 3, 1]))
    assert.deepStrictEqual(reply(back.commands), {
      _tag: "IsrRejected",
      rejection: { _tag: "IneligibleReplica", server: 1, why: "its storage failed" }
    })
    // It works again: the leader leads on under a new epoch, which every replica hears; 1 may rejoin.
    const works = run(failed.state, storage(1, false))
    assert.deepStrictEqual(sent(works.commands), { 1: [0], 2: [0], 3: [0] })
    assert.deepStrictEqual(
      [lai(works.state, 0).leader, lai(works.state, 0).leaderEpoch],
      [2, lai(failed.state, 0).leaderEpoch + 1]
    )
    const rejoined = run(works.state, adjust(works.state, 0, [2, 3, 1]))
    assert.deepStrictEqual(lai(rejoined.state, 0).isr, [2, 3, 1])
    // A follower's failure takes it out of the ISR only.
    const follower = run(s0, storage(3, true))
    assert.deepStrictEqual([lai(follower.state, 0).leader, lai(follower.state, 0).isr], [1, [1, 2]])
  })

  it("a storage report older than one taken (a late or repeated copy) is dropped: it cannot undo a recovery", () => {
    const s0 = run(boot([1, 2, 3]), create([0, [1, 2, 3]])).state
    const report = (failed: boolean, sequence: number): Input => ({
      _tag: "ReplicaStorage",
      server: 3,
      tablets: [tid(0)],
      failed,
      sequence
    })
    const failed = run(s0, report(true, 1)).state
    const works = run(failed, report(false, 2)).state
    const late = ControllerState.step(works, report(true, 1))
    assert.strictEqual(late[0], works)
    assert.deepStrictEqual(late[1], [])
    // So its leader may add it back.
    const rejoined = run(works, adjust(works, 0, [1, 2, 3]))
    assert.deepStrictEqual(lai(rejoined.state, 0).isr, [1, 2, 3])
  })

  it("KIP-966: when the last ISR member dies, a live eligible member leads; a restarted one does not", () => {
    const booted = ControllerState.step(
      ControllerState.make({ uncleanLeaderElection: false, minInsyncReplicas: 2 }),
      started(
        1,
        [1, 2, 3],
        [],
        [
          [1, 10],
          [2, 11],
          [3, 12]
        ]
      )
    )[0]
    const s0 = run(booted, create([0, [1, 2]]))
    // 2 leaves the ISR while it is at its minimum: the HW stops, so 2 holds everything acknowledged.
    const shrunk = run(s0.state, adjust(s0.state, 0, [1])).state
    assert.deepStrictEqual(tablet(shrunk, 0).eligible, [2])
    const failedOver = run(shrunk, down(1)).state
    assert.deepStrictEqual(
      [lai(failedOver, 0).leader, lai(failedOver, 0).isr, tablet(failedOver, 0).state],
      [2, [2], "OnlineTablet"]
    )
    // Restarted since it left (a new registration), it may have lost what it had not flushed: not elected alone.
    const restarted = run(shrunk, down(2), { _tag: "ServerUp", server: 2, registration: 77 }, down(1)).state
    assert.deepStrictEqual([lai(restarted, 0).leader, tablet(restarted, 0).state], [null, "OfflineTablet"])
  })

  it("AdjustIsr: a stale or malformed request is rejected without a write; KIP-841 guards additions", () => {
    const s0 = run(boot([1, 2, 3, 4]), create([0, [1, 2, 3, 5]])).state
    const shrunk = run(s0, adjust(s0, 0, [1]))
    const adjusted = { leader: 1, leaderEpoch: 0, isr: [1], coordinatorEpoch: 1, version: 1 }
    assert.deepStrictEqual(shrunk.commands, [
      { _tag: "Write", tablet: tablet(shrunk.state, 0), expectedVersion: 0 },
      { _tag: "Reply", requestId: 3, reply: { _tag: "IsrAdjusted", leaderAndIsr: adjusted } }
    ])
    assert.deepStrictEqual(lai(shrunk.state, 0), adjusted)

    const s = shrunk.state
    const stopping = run(s, shutdown(3)).state
    // InvalidIsr's detail is prose: only its tag is compared.
    const cases: ReadonlyArray<readonly [State, Input, ControllerState.IsrRejection | "InvalidIsr"]> = [
      [s, adjust(s, 9, [1]), { _tag: "UnknownTablet" }],
      [s, adjust(s, 0, [1, 2], { leaderEpoch: 1 }), { _tag: "FencedLeaderEpoch", current: 0 }],
      [s, adjust(s, 0, [2, 1], { leader: 2 }), { _tag: "NotLeader", leader: 1 }],
      [s, adjust(s, 0, [1, 2], { version: 0 }), { _tag: "InvalidVersion", current: 1, leaderAndIsr: adjusted }],
      [s, adjust(s, 0, [2, 3]), "InvalidIsr"],
      [s, adjust(s, 0, [1, 4]), "InvalidIsr"],
      [s, adjust(s, 0, [1, 2, 2]), "InvalidIsr"],
      [s, adjust(s, 0, [1, 5]), { _tag: "IneligibleReplica", server: 5, why: "offline" }],
      [stopping, adjust(stopping, 0, [1, 2, 3]), { _tag: "IneligibleReplica", server: 3, why: "shutting down" }]
    ]
    for (const [state, input, rejection] of cases) {
      const [next, commands] = ControllerState.step(state, input)
      const label = JSON.stringify(input)
      assert.strictEqual(next, state, label)
      assert.deepStrictEqual(tags(commands), ["Reply"], label)
      const r = reply(commands)
      if (rejection === "InvalidIsr")
        assert.strictEqual(r?._tag === "IsrRejected" && r.rejection._tag, rejection, label)
      else assert.deepStrictEqual(r, { _tag: "IsrRejected", rejection }, label)
    }

    // A retry of the committed change (its answer lost) is answered again, without a write.
    const repeated = ControllerState.step(s, adjust(s, 0, [1], { version: 0 }))
    assert.strictEqual(repeated[0], s)
    assert.deepStrictEqual(reply(repeated[1]), { _tag: "IsrAdjusted", leaderAndIsr: adjusted })
    const grown = run(s, adjust(s, 0, [1, 2, 3]))
    assert.deepStrictEqual(tags(grown.commands), ["Write", "Reply"], "no Sends to the followers")
    assert.deepStrictEqual(lai(grown.state, 0), { ...adjusted, isr: [1, 2, 3], version: 2 })
    // Removing members is always allowed, whatever became of them.
    const removed = run(grown.state, adjust(grown.state, 0, [1, 3]))
    assert.deepStrictEqual(lai(removed.state, 0).isr, [1, 3])
  })

  /** t0 [1, 2], t1 [2, 1], t2 [1], t3 [1, 3] with ISR [1]: all led by their first replica. */
  const fourTablets = (unclean: boolean) => {
    const s = run(boot([1, 2, 3], unclean), create([0, [1, 2]], [1, [2, 1]], [2, [1]], [3, [1, 3]])).state
    return run(s, adjust(s, 3, [1])).state
  }

  for (const unclean of [false, true]) {
    it(`ControlledShutdown (unclean election ${unclean}): leadership moves to a live ISR member, the server leaves the ISRs`, () => {
      const { state, commands } = run(fourTablets(unclean), shutdown(1))
      assert.deepStrictEqual(lai(state, 0), { leader: 2, leaderEpoch: 1, isr: [2], coordinatorEpoch: 1, version: 1 })
      assert.deepStrictEqual(lai(state, 1), { leader: 2, leaderEpoch: 0, isr: [2], coordinatorEpoch: 1, version: 1 })
      assert.deepStrictEqual(
        [2, 3].map((b) => lai(state, b).leader),
        [1, 1],
        "no other ISR member: 1 keeps them, even when an unclean election could move t3"
      )
      assert.deepStrictEqual(writes(commands), [
        { bucket: 0, expected: 0 },
        { bucket: 1, expected: 0 }
      ])
      assert.deepStrictEqual(commands.at(-1), {
        _tag: "Reply",
        requestId: 5,
        reply: { _tag: "ShutdownProgress", remainingLeaders: 2 }
      })
      assert.deepStrictEqual(tags(commands).slice(0, 2), ["Write", "Write"])

      // 1 is not eligible to rejoin an ISR, nor electable, even uncleanly.
      const rejoin = reply(run(state, adjust(state, 0, [2, 1])).commands)
      assert.deepStrictEqual(rejoin, {
        _tag: "IsrRejected",
        rejection: { _tag: "IneligibleReplica", server: 1, why: "shutting down" }
      })
      const orphaned = run(state, down(2)).state
      assert.deepStrictEqual(
        [0, 1].map((b) => [tablet(orphaned, b).state, lai(orphaned, b).leader]),
        [
          ["OfflineTablet", null],
          ["OfflineTablet", null]
        ]
      )

      // Once t3 has another ISR member, asking again moves it.
      const retried = run(state, adjust(state, 3, [1, 3]))
      const again = run(retried.state, shutdown(1))
      assert.deepStrictEqual(lai(again.state, 3), {
        leader: 3,
        leaderEpoch: 1,
        isr: [3],
        coordinatorEpoch: 1,
        version: 3
      })
      assert.deepStrictEqual(reply(again.commands), { _tag: "ShutdownProgress", remainingLeaders: 1 })
    })
  }

  it("ControlledShutdown of a server that is not live: nothing left to move", () => {
    const s = fourTablets(false)
    const [next, commands] = ControllerState.step(s, shutdown(9))
    assert.strictEqual(next, s)
    assert.deepStrictEqual(commands, [
      { _tag: "Reply", requestId: 5, reply: { _tag: "ShutdownProgress", remainingLeaders: 0 } }
    ])
  })

  it("WriteFailed: the controller resigns and ignores everything after", () => {
    const s = fourTablets(true)
    const [resigned, commands] = ControllerState.step(s, { _tag: "WriteFailed", tablet: tid(0), detail: "fenced" })
    assert.isTrue(resigned.resigned)
    assert.deepStrictEqual(tags(commands), ["Resign"])
    assert.match(commands[0]?._tag === "Resign" ? commands[0].reason : "", /orders\/0.*fenced/)
    const later: ReadonlyArray<Input> = [
      down(1),
      up(4),
      shutdown(2),
      create([7, [1]]),
      adjust(resigned, 0, [1]),
      started(2, [1, 2, 3], [...s.tablets.values()]),
      { _tag: "WriteFailed", tablet: tid(0), detail: "again" }
    ]
    for (const input of later) assert.deepStrictEqual(ControllerState.step(resigned, input), [resigned, []], input._tag)
    assert.strictEqual(ControllerState.step(resigned, down(1))[0], resigned)
  })

  it("Started: dead leaders are replaced, dead followers leave, the changes are sent and every live server asked what it holds", () => {
    const stored = (
      bucket: number,
      replicas: ReadonlyArray<Models.ServerId>,
      leader: Models.ServerId | null,
      isr: ReadonlyArray<Models.ServerId>
    ): ControllerState.Tablet => ({
      tablet: tid(bucket),
      replicas,
      state: leader === null ? "OfflineTablet" : "OnlineTablet",
      leaderAndIsr: { leader, leaderEpoch: 4, isr, coordinatorEpoch: 6, version: 9 }
    })
    const tablets = [
      stored(0, [3, 1, 2], 3, [3, 1, 2]), // dead leader: 1 takes over, 3 leaves
      stored(1, [1, 3], 1, [1, 3]), // dead follower leaves
      stored(2, [3, 2], 3, [3]), // no live ISR member: offline
      stored(3, [2, 1], 2, [2, 1]), // untouched
      stored(4, [2], null, [2]) // offline, its ISR member is back
    ]
    const { state, commands } = run(ControllerState.make({ uncleanLeaderElection: false }), started(7, [1, 2], tablets))
    const at = (leader: Models.ServerId | null, leaderEpoch: number, isr: ReadonlyArray<Models.ServerId>) => ({
      leader,
      leaderEpoch,
      isr,
      coordinatorEpoch: 7,
      version: 10
    })
    assert.strictEqual(state.coordinatorEpoch, 7)
    assert.deepStrictEqual(
      [0, 1, 2, 4].map((b) => lai(state, b)),
      [at(1, 5, [1, 2]), at(1, 4, [1]), at(null, 5, [3]), at(2, 5, [2])]
    )
    assert.deepStrictEqual(
      [0, 1, 2, 3, 4].map((b) => tablet(state, b).state),
      ["OnlineTablet", "OnlineTablet", "OfflineTablet", "OnlineTablet", "OnlineTablet"]
    )
    assert.strictEqual(tablet(state, 3), tablets[3])
    assert.deepStrictEqual(
      writes(commands),
      [0, 1, 2, 4].map((bucket) => ({ bucket, expected: 9 }))
    )
    // The tablets it changed go out at once; t3, unchanged, only to a server whose holdings fall behind.
    assert.deepStrictEqual(sent(commands, 7), { 1: [0, 1], 2: [0, 2, 4] })
    assert.deepStrictEqual(
      commands.flatMap((c) => (c._tag === "AskHoldings" ? [[c.server, c.coordinatorEpoch]] : [])),
      [
        [1, 7],
        [2, 7]
      ]
    )
    assert.isTrue(
      logs(commands).some((l) => l.startsWith("info: ") && l.includes("7")),
      logs(commands).join("\n")
    )
  })

  it("Holdings: a resuming controller instructs a server only where what it holds falls behind", () => {
    const stored = (
      bucket: number,
      replicas: ReadonlyArray<Models.ServerId>,
      leader: Models.ServerId
    ): ControllerState.Tablet => ({
      tablet: tid(bucket),
      replicas,
      state: "OnlineTablet",
      leaderAndIsr: { leader, leaderEpoch: 4, isr: [...replicas], coordinatorEpoch: 6, version: 9 },
      registrations: Object.fromEntries(replicas.map((s) => [String(s), 100 + s]))
    })
    const tablets = [stored(0, [1, 2], 1), stored(1, [2, 1], 2), stored(2, [1, 2], 1), stored(3, [2, 1], 2)]
    const registrations = [[1, 101] as const, [2, 102] as const]
    const [state, first] = ControllerState.step(
      ControllerState.make({ uncleanLeaderElection: false }),
      started(7, [1, 2], tablets, registrations)
    )
    assert.deepStrictEqual(sent(first, 7), {}, "nothing changed: nothing sent before the answers")
    assert.deepStrictEqual(
      first.flatMap((c) => (c._tag === "AskHoldings" ? [[c.server, c.registration]] : [])),
      [
        [1, 101],
        [2, 102]
      ]
    )
    const holding = (bucket: number, leaderEpoch: number | null, version: number) => ({
      tablet: tid(bucket),
      leaderEpoch,
      version
    })
    const holdings = (
      server: Models.ServerId,
      list: ReadonlyArray<ReturnType<typeof holding>> | null,
      registration = 100 + server
    ): Input => ({
      _tag: "Holdings",
      server,
      registration,
      holdings: list
    })
    // Server 1: t0 current (it leads, version 9); t1 current as a follower even at an older version (followers hear no
    // ISR changes); t2 a leader an ISR change behind; t3 missing.
    const [, one] = ControllerState.step(state, holdings(1, [holding(0, 4, 9), holding(1, 4, 3), holding(2, 4, 8)]))
    assert.deepStrictEqual(sent(one, 7), { 1: [2, 3] })
    // Server 2: an older leader epoch of t0, a replica that never took a role (no epoch) for t1.
    const [, two] = ControllerState.step(
      state,
      holdings(2, [holding(0, 3, 9), holding(1, null, -1), holding(2, 4, 9), holding(3, 4, 9)])
    )
    assert.deepStrictEqual(sent(two, 7), { 2: [0, 1] })
    // Everything up to date: nothing; not asked (the question failed): everything it holds.
    const all = [0, 1, 2, 3].map((b) => holding(b, 4, 9))
    assert.deepStrictEqual(ControllerState.step(state, holdings(2, all))[1], [])
    assert.deepStrictEqual(sent(ControllerState.step(state, holdings(2, null))[1], 7), { 2: [0, 1, 2, 3] })
    // An answer of another registration (the server restarted since) or of a server gone is dropped.
    assert.deepStrictEqual(ControllerState.step(state, holdings(2, null, 999))[1], [])
    assert.deepStrictEqual(ControllerState.step(ControllerState.step(state, down(2))[0], holdings(2, null))[1], [])
  })

  it("a server in controlled shutdown is not elected, even as the last live member of an ISR", () => {
    // 2 stops before t0 exists; t0 is created offline with ISR [2, 3] (all its replicas); 3 comes up and leads.
    const { state } = run(boot([2]), shutdown(2), create([0, [2, 3]]), up(3))
    assert.deepStrictEqual([lai(state, 0).leader, lai(state, 0).leaderEpoch], [3, 1])
    const [after] = ControllerState.step(state, down(3))
    assert.deepStrictEqual(
      [tablet(after, 0).state, lai(after, 0).leader],
      ["OfflineTablet", null],
      `2 is shutting down, so t0 has no electable ISR member; got ${JSON.stringify(tablet(after, 0))}`
    )
  })
})

// ---------------------------------------------------------------------------
// The documented transition table
// ---------------------------------------------------------------------------

/** One scenario per documented row, by `from | event`: a state holding t0 (or not yet) and the row's event. */
const scenarios: Record<string, () => readonly [State, Input]> = {
  "NewTablet | created, a replica live": () => [boot([1]), create([0, [2, 1]])],
  "NewTablet | created, no replica live": () => [boot([1]), create([0, [2, 3]])],
  "OnlineTablet | its leader died, a live ISR member": () => [run(boot([1, 2]), create([0, [1, 2]])).state, down(1)],
  // 2 is live but outside the ISR, and unclean election is off.
  "OnlineTablet | its leader died, no live ISR member": () => [
    run(boot([1]), create([0, [1, 2]]), up(2)).state,
    down(1)
  ],
  "OfflineTablet | an ISR member came up": () => [run(boot([1, 2]), create([0, [1]]), down(1)).state, up(1)],
  "OfflineTablet | a replica came up, unclean election enabled": () => [
    run(boot([1], true), create([0, [1, 2]]), down(1)).state,
    up(2)
  ],
  "OnlineTablet | its leader died, candidates to ask": () => [
    run(bootWith(largest, [1, 2, 3]), create([0, [1, 2, 3]])).state,
    down(1)
  ],
  "OfflineTablet | the last candidate answered": () => {
    const { state } = run(bootWith(largest, [1, 2, 3]), create([0, [1, 2, 3]]), down(1))
    const { state: one } = run(state, logEnd(state, 2, { lastEpoch: 0, logEndOffset: 5 }))
    return [one, logEnd(one, 3, { lastEpoch: 0, logEndOffset: 9 })]
  },
  "OnlineTablet | deleted": () => [run(boot([1, 2]), create([0, [1, 2]])).state, deleteTablets(0)],
  "OfflineTablet | deleted": () => [run(boot([1, 2]), create([0, [1]]), down(1)).state, deleteTablets(0)]
}

const rows = documentedRows(new URL("../src/machines/ControllerState.ts", import.meta.url)).map((line) => {
  const [from = "", event = "", to = ""] = line
    .split("|")
    .slice(1, -1)
    .map((cell) => cell.trim())
  return { line, from, event, to, scenario: `${from} | ${event}` }
})

describe("ControllerState table deletion", () => {
  /** The buckets each server is told to delete, over all the StopReplica commands. */
  const stops = (commands: ReadonlyArray<Command>) => {
    const by: Record<number, Array<number>> = {}
    for (const c of commands) {
      if (c._tag !== "StopReplica") continue
      by[c.server] = [...(by[c.server] ?? []), ...c.tablets.map((t) => t.bucket)].sort()
    }
    return by
  }
  const removed = (commands: ReadonlyArray<Command>) =>
    commands.flatMap((c) => (c._tag === "Remove" ? [[c.tablet.bucket, c.expectedVersion]] : []))

  it("deleting tablets: no leader, every live replica told to delete itself, the nodes removed once all have", () => {
    const { state: created } = run(boot([1, 2, 3]), create([0, [1, 2, 3]], [1, [2, 3, 1]]))
    const { state, commands } = run(created, deleteTablets(0, 1, 9))
    assert.deepStrictEqual(reply(commands), { _tag: "Deleting", tablets: 2 })
    for (const b of [0, 1]) {
      assert.strictEqual(tablet(state, b).state, "DeletingTablet")
      assert.isNull(lai(state, b).leader)
      assert.strictEqual(lai(state, b).leaderEpoch, lai(created, b).leaderEpoch + 1)
    }
    assert.deepStrictEqual(writes(commands), [
      { bucket: 0, expected: 0 },
      { bucket: 1, expected: 0 }
    ])
    assert.deepStrictEqual(sent(commands), {}, "no LeaderAndIsr for a deleting tablet")
    assert.deepStrictEqual(stops(commands), { 1: [0, 1], 2: [0, 1], 3: [0, 1] })
    // Asked again: nothing new is written.
    assert.deepStrictEqual(writes(run(state, deleteTablets(0)).commands), [])

    const { state: two } = run(state, stopped(1, [0, 1]), stopped(2, [0, 1]))
    assert.deepStrictEqual(tablet(two, 0).deleted, [1, 2])
    const last = run(two, stopped(3, [0, 1]))
    assert.deepStrictEqual(removed(last.commands), [
      [0, 3],
      [1, 3]
    ])
    assert.isFalse(last.state.tablets.has(key(0)))
    assert.isFalse(last.state.tablets.has(key(1)))
    assert.deepStrictEqual(writes(last.commands), [])
  })

  it("a server down during the deletion is told when it is back; its answer is needed; a stale answer is dropped", () => {
    const { state } = run(
      boot([1, 2, 3]),
      { _tag: "ServerUp", server: 4, registration: 40 },
      create([0, [1, 4]]),
      down(4),
      deleteTablets(0)
    )
    const { state: one, commands } = run(state, stopped(1, [0]))
    assert.deepStrictEqual(removed(commands), [], "server 4 still holds its replica")
    // The answer of a server that is not live, or of another registration, changes nothing.
    assert.strictEqual(ControllerState.step(one, stopped(4, [0], 40))[0], one)
    const back = run(one, { _tag: "ServerUp", server: 4, registration: 41 })
    assert.deepStrictEqual(stops(back.commands), { 4: [0] })
    assert.deepStrictEqual(sent(back.commands), {})
    assert.strictEqual(ControllerState.step(back.state, stopped(4, [0], 40))[0], back.state)
    const done = run(back.state, stopped(4, [0], 41))
    assert.deepStrictEqual(removed(done.commands).length, 1)
    assert.isFalse(done.state.tablets.has(key(0)))
  })

  it("a deleting tablet is never elected, takes no ISR change, and a new controller resumes its deletion", () => {
    const { state } = run(boot([1, 2, 3]), create([0, [1, 2, 3]]), deleteTablets(0))
    const moved = run(state, down(1), up(1), { _tag: "BalanceLeaders" })
    assert.isNull(lai(moved.state, 0).leader)
    assert.deepStrictEqual(writes(moved.commands), [])
    const rejected = reply(run(state, adjust(state, 0, [1, 2])).commands)
    assert.strictEqual(rejected?._tag, "IsrRejected")
    const { state: partly } = run(state, stopped(2, [0]))
    const resumed = run(
      ControllerState.make({ uncleanLeaderElection: false }),
      started(3, [1, 2, 3], [tablet(partly, 0)])
    )
    assert.deepStrictEqual(stops(resumed.commands), { 1: [0], 3: [0] })
    assert.deepStrictEqual(sent(resumed.commands, 3), {})
    assert.deepStrictEqual(writes(resumed.commands), [])
  })
})

/** Tablet `bucket` led by `leader` at epoch 4 with `isr`; its preferred replica is `replicas[0]`. */
const stored = (
  bucket: number,
  replicas: ReadonlyArray<Models.ServerId>,
  leader: Models.ServerId,
  isr: ReadonlyArray<Models.ServerId>
): ControllerState.Tablet => ({
  tablet: tid(bucket),
  replicas,
  state: "OnlineTablet",
  leaderAndIsr: { leader, leaderEpoch: 4, isr, coordinatorEpoch: 1, version: 3 },
  registrations: Object.fromEntries(isr.map((s) => [String(s), 10 + s]))
})

describe("ControllerState preferred leaders", () => {
  const boot = (tablets: ReadonlyArray<ControllerState.Tablet>, options: Partial<ControllerState.Options> = {}) =>
    ControllerState.step(
      ControllerState.make({ uncleanLeaderElection: false, ...options }),
      started(2, [1, 2, 3], tablets, [
        [1, 11],
        [2, 12],
        [3, 13]
      ])
    )[0]
  const balance: Input = { _tag: "BalanceLeaders", requestId: 8 }

  it("leadership goes back to the preferred replica where it is in the ISR as the life it joined with; the ISR stays", () => {
    const state = boot([
      stored(0, [1, 2, 3], 2, [2, 3, 1]), // moves to 1
      stored(1, [1, 2, 3], 2, [2, 3]), // 1 not in the ISR: stays
      stored(2, [1, 3, 2], 1, [1, 3, 2]), // led by 1 already
      stored(3, [2, 1, 3], 2, [2, 1, 3]) // prefers 2, led by 2
    ])
    const { state: after, commands } = run(state, balance)
    assert.deepStrictEqual(lai(after, 0), {
      leader: 1,
      leaderEpoch: 5,
      isr: [2, 3, 1],
      coordinatorEpoch: 2,
      version: 4
    })
    for (const b of [1, 2, 3]) assert.strictEqual(tablet(after, b), tablet(state, b), `t${b} untouched`)
    assert.deepStrictEqual(writes(commands), [{ bucket: 0, expected: 3 }])
    assert.deepStrictEqual(sent(commands, 2), { 1: [0], 2: [0], 3: [0] })
    assert.deepStrictEqual(reply(commands), { _tag: "LeadersBalanced", moved: 1 })
    // Again: nothing left to move.
    const again = run(after, balance)
    assert.deepStrictEqual(writes(again.commands), [])
    assert.deepStrictEqual(reply(again.commands), { _tag: "LeadersBalanced", moved: 0 })
  })

  it("no move for a restarted preferred replica, one stopping, an offline tablet, or an imbalance within the threshold", () => {
    const tablets = [stored(0, [1, 2], 2, [2, 1]), stored(1, [3, 2], 2, [2, 3]), stored(2, [1, 2], 2, [2, 1])]
    // 1 registered again since it joined the ISRs (it may have lost what it had not flushed): it left them, and
    // leads neither t0 nor t2 until a leader's ISR change takes it back; t1 goes back to 3.
    const restarted = run(boot(tablets), down(1), { _tag: "ServerUp", server: 1, registration: 99 }, balance)
    assert.deepStrictEqual(reply(restarted.commands), { _tag: "LeadersBalanced", moved: 1 })
    assert.deepStrictEqual(
      [0, 1, 2].map((b) => lai(restarted.state, b).leader),
      [2, 3, 2]
    )
    // 3 in controlled shutdown.
    const stopping = run(boot(tablets), shutdown(3), balance)
    assert.strictEqual(lai(stopping.state, 1).leader, 2)
    // Threshold 60%: 1 prefers t0 and t2, both led elsewhere (100%) → moved; with 100% nothing moves.
    assert.deepStrictEqual(reply(run(boot(tablets, { leaderImbalancePercent: 60 }), balance).commands), {
      _tag: "LeadersBalanced",
      moved: 3
    })
    assert.deepStrictEqual(reply(run(boot(tablets, { leaderImbalancePercent: 100 }), balance).commands), {
      _tag: "LeadersBalanced",
      moved: 0
    })
    // An offline tablet is left to the election that waits for its ISR.
    const offline = run(boot([stored(0, [1, 2], 2, [2])]), down(2), up(1), balance)
    assert.strictEqual(tablet(offline.state, 0).state, "OfflineTablet")
  })
})

describe("ControllerState transition table", () => {
  it("every documented row has a scenario, and every scenario a row", () => {
    assert.isAbove(rows.length, 0)
    assert.deepStrictEqual(rows.map((r) => r.scenario).sort(), Object.keys(scenarios).sort())
  })

  for (const row of rows) {
    it(row.line, () => {
      const scenario = scenarios[row.scenario]
      assert.isDefined(scenario, `no scenario for ${row.scenario}`)
      if (scenario === undefined) return
      const [before, event] = scenario()
      const was = before.tablets.get(key(0))
      assert.strictEqual(was?.state ?? "NewTablet", row.from)
      const [after] = ControllerState.step(before, event)
      const now = tablet(after, 0)
      assert.strictEqual(now.state, row.to)
      if (row.to === "DeletingTablet") assert.isNull(now.leaderAndIsr.leader, "a deleting tablet has no leader")
      else if (was !== undefined) {
        assert.notStrictEqual(now.leaderAndIsr.leader, was.leaderAndIsr.leader, "a new leader")
      }
    })
  }
})

// ---------------------------------------------------------------------------
// Seeded runs against the invariants
// ---------------------------------------------------------------------------

type LogEnd = ControllerState.LogEnd
type Tablet = ControllerState.Tablet
type Election = ControllerState.Election

/** What the test itself knows of the servers and the elections, from the inputs alone. */
interface Model {
  live: Set<Models.ServerId>
  stopping: Set<Models.ServerId>
  /** Each server's registration as the controller was told it (kept after the server leaves, as told last). */
  lives: Map<Models.ServerId, number>
  epoch: number
  readonly unclean: boolean
  readonly min: number
  /** The answers each election took, by `tablet#round`: the latest of each candidate. */
  readonly answers: Map<string, Map<Models.ServerId, LogEnd | null>>
  /** The replicas (`server tablet`) whose storage their server reported failed, and has not reported working. */
  storageFailed: Set<string>
}

interface Tally {
  leaderChanges: number
  offline: number
  accepted: number
  rejected: number
  ineligible: number
  unclean: number
  /** Creations refused (fewer replicas than minInsyncReplicas, or a tablet twice). */
  refused: number
  /** Tablets written with eligible members. */
  eligible: number
  /** Writes of a tablet whose ISR held a member registered again since it was recorded. */
  newLives: number
  asks: number
  recoveries: number
  largest: number
  /** Answers of another round or from a server that is not a candidate. */
  staleAnswers: number
  /** Holdings answers fed. */
  holdings: number
  /** Tablets moved back to their preferred replica. */
  balanced: number
  /** Deleting tablets after a DeleteTablets; tablets removed for good. */
  deleting: number
  removed: number
  /** Moves begun, finished on their target, cancelled; move requests refused. */
  moves: number
  moved: number
  cancelled: number
  moveRefused: number
  /** Moves whose throttle a repeat changed. */
  rethrottled: number
}
const tally = (): Tally => ({
  leaderChanges: 0,
  offline: 0,
  accepted: 0,
  rejected: 0,
  ineligible: 0,
  unclean: 0,
  refused: 0,
  eligible: 0,
  newLives: 0,
  asks: 0,
  recoveries: 0,
  largest: 0,
  staleAnswers: 0,
  holdings: 0,
  balanced: 0,
  deleting: 0,
  removed: 0,
  moves: 0,
  moved: 0,
  cancelled: 0,
  moveRefused: 0,
  rethrottled: 0
})

/**
 * The retention the seeded runs create bucket `bucket` with (none for every third), drawing nothing from the PRNG: a
 * tablet keeps it through whatever happens to it.
 */
const retentionFor = (bucket: number): ControllerState.Tablet["retention"] =>
  bucket % 3 === 0 ? undefined : bucket % 3 === 1 ? { ms: 1_000 * (bucket + 1) } : { ms: 60_000, bytes: 4_096 * bucket }

/** The registration of `server` coming up at step `n` (-1: the boot): later steps, larger numbers. */
const life = (n: number, server: Models.ServerId) => 1000 + n * 10 + server

/** An answer to one of the pending elections: mostly a waiting candidate's, else one the controller must drop. */
const answer = (r: Prng, state: State, servers: ReadonlyArray<Models.ServerId>): Input => {
  const [k, e] = r.pick([...state.elections])
  const tablet = state.tablets.get(k)?.tablet ?? tid(-1)
  const end = (): LogEnd => ({ lastEpoch: r.chance(0.1) ? null : r.int(0, 2), logEndOffset: r.int(0, 20) })
  const waiting = e.candidates.filter((s) => !e.answers.has(s))
  const roll = r.next()
  // A candidate leaving while it is asked.
  if (roll < 0.06) return down(r.pick(e.candidates))
  if (roll < 0.75 && waiting.length > 0)
    return { _tag: "LogEnd", tablet, round: e.round, server: r.pick(waiting), logEnd: r.chance(0.1) ? null : end() }
  if (roll < 0.88) {
    // An earlier round's answer, or one of a round not begun.
    const round = r.chance(0.5) ? e.round - r.int(1, 3) : state.nextRound + r.int(0, 2)
    return { _tag: "LogEnd", tablet, round, server: r.pick(e.candidates), logEnd: end() }
  }
  const strangers = servers.filter((s) => !e.candidates.includes(s))
  return {
    _tag: "LogEnd",
    tablet,
    round: e.round,
    server: strangers.length > 0 ? r.pick(strangers) : 99,
    logEnd: end()
  }
}

/**
 * A move request: mostly a target of live servers for a tablet that is online, often the leader's leaving or the
 * replication factor changing; sometimes a server twice, one down, or one unknown; sometimes a cancel.
 */
const moveRequest = (
  r: Prng,
  state: State,
  servers: ReadonlyArray<Models.ServerId>,
  buckets: number,
  n: number
): Input => {
  const moving = [...state.tablets.values()].filter((t) => t.reassignment !== undefined)
  if (moving.length > 0 && r.chance(0.15)) {
    // A repeat of a move under way, naming a throttle (or none).
    const t = r.pick(moving)
    const throttle = r.chance(0.3) ? undefined : r.pick([1_000, 5_000])
    return {
      _tag: "Reassign",
      requestId: n,
      tablet: t.tablet,
      target: t.reassignment?.target ?? [],
      ...(throttle === undefined ? {} : { throttleBytesPerSec: throttle })
    }
  }
  if (moving.length > 0 && r.chance(0.5)) return { _tag: "CancelReassign", requestId: n, tablet: r.pick(moving).tablet }
  const bucket = r.int(0, buckets)
  if (r.chance(0.1)) return { _tag: "CancelReassign", requestId: n, tablet: tid(bucket) }
  const pool = r.chance(0.85) ? servers.filter((s) => state.live.has(s) && !state.shuttingDown.has(s)) : [...servers]
  const size = Math.min(pool.length, r.int(1, 4))
  const target: Array<Models.ServerId> = []
  const left = [...pool]
  for (let i = 0; i < size; i++) target.push(left.splice(r.int(0, left.length - 1), 1)[0]!)
  if (r.chance(0.05) && target.length > 0) target.push(target[0]!)
  if (r.chance(0.03)) target.push(42)
  // Often a throttle, sometimes one that is not a rate.
  const throttle = r.chance(0.4) ? r.pick([1_000, 5_000, 5_000, 0]) : undefined
  return {
    _tag: "Reassign",
    requestId: n,
    tablet: tid(bucket),
    target,
    ...(throttle === undefined ? {} : { throttleBytesPerSec: throttle })
  }
}

const randomInput = (
  r: Prng,
  state: State,
  model: Model,
  servers: ReadonlyArray<Models.ServerId>,
  buckets: number,
  n: number
): Input => {
  if (state.elections.size > 0 && r.chance(0.7)) return answer(r, state, servers)
  // A replica of a deleting tablet answers that it deleted itself (sometimes as another life, or a stranger).
  const deleting = [...state.tablets.values()].filter((t) => t.state === "DeletingTablet")
  if (deleting.length > 0 && r.chance(0.25)) {
    const t = r.pick(deleting)
    const server = r.chance(0.9) ? r.pick(t.replicas) : r.pick(servers)
    const registration = r.chance(0.9) ? state.registrations.get(server) : life(n, server)
    return {
      _tag: "ReplicaStopped",
      server,
      ...(registration === undefined ? {} : { registration }),
      tablets: [t.tablet, ...(r.chance(0.3) ? [r.pick([...state.tablets.values()]).tablet] : [])]
    }
  }
  // A server a move took out answers that it deleted its replica.
  const retiring = [...state.tablets.values()].filter((t) => (t.retired ?? []).length > 0)
  if (retiring.length > 0 && r.chance(0.2)) {
    const t = r.pick(retiring)
    const server = r.pick(t.retired ?? [])
    const registration = r.chance(0.9) ? state.registrations.get(server) : life(n, server)
    return {
      _tag: "ReplicaStopped",
      server,
      ...(registration === undefined ? {} : { registration }),
      tablets: [t.tablet]
    }
  }
  if (r.chance(0.05)) return moveRequest(r, state, servers, buckets, n)
  if (r.chance(0.015))
    return { ...deleteTablets(...Array.from({ length: r.int(1, 2) }, () => r.int(0, buckets))), requestId: n }
  const roll = r.next()
  const server = r.pick(servers)
  if (r.chance(0.02)) {
    // A server's report on a replica's storage (usually one it holds; sometimes as another life).
    const all = [...state.tablets.values()]
    const t = all.length > 0 && r.chance(0.9) ? r.pick(all) : undefined
    const about = t !== undefined && r.chance(0.8) ? r.pick(t.replicas) : server
    const registration = r.chance(0.9) ? state.registrations.get(about) : life(n, about)
    return {
      _tag: "ReplicaStorage",
      server: about,
      ...(registration === undefined ? {} : { registration }),
      tablets: [t?.tablet ?? tid(buckets)],
      failed: r.chance(0.4)
    }
  }
  // A server coming up is usually a new life; sometimes the shell does not know its registration.
  if (roll < 0.2) {
    // Mostly one that is down: it comes back.
    const downs = servers.filter((s) => !state.live.has(s))
    const back = downs.length > 0 && r.chance(0.7) ? r.pick(downs) : server
    return r.chance(0.85) ? { _tag: "ServerUp", server: back, registration: life(n, back) } : up(back)
  }
  if (roll < 0.38) {
    // Often a leader (its tablets elect again) or a candidate being asked.
    const leaders = [...state.tablets.values()].flatMap((t) =>
      t.leaderAndIsr.leader === null ? [] : [t.leaderAndIsr.leader]
    )
    const asked = [...state.elections.values()].flatMap((e) => e.candidates)
    const targets = [...leaders, ...asked]
    return down(targets.length > 0 && r.chance(0.5) ? r.pick(targets) : server)
  }
  if (roll < 0.46) return { _tag: "ControlledShutdown", requestId: n, server }
  if (roll < 0.56) {
    // Sometimes on servers that are down (the tablet starts offline, its ISR every replica).
    const downFirst = r.chance(0.3)
    const spec = (): readonly [number, ReadonlyArray<Models.ServerId>] => {
      const pool = downFirst
        ? [...servers.filter((s) => !state.live.has(s)), ...servers.filter((s) => state.live.has(s))]
        : [...servers]
      const count = r.int(1, Math.min(4, servers.length))
      const replicas = Array.from(
        { length: count },
        () => pool.splice(downFirst ? 0 : r.int(0, pool.length - 1), 1)[0]!
      )
      return [r.int(0, buckets - 1), replicas]
    }
    const c = create(...Array.from({ length: r.int(1, 2) }, spec))
    const tablets = c.tablets.map((t) => ({ ...t, retention: retentionFor(t.tablet.bucket) }))
    return { ...c, tablets, requestId: n }
  }
  if (roll < 0.92) {
    // Bucket `buckets` is never created: an unknown tablet.
    const bucket = r.int(0, buckets)
    const t = state.tablets.get(key(bucket))
    const leader = t?.leaderAndIsr.leader ?? r.pick(servers)
    // Often every electable replica (the followers caught up), else some replicas.
    const all = r.chance(0.5)
    const others = (t?.replicas ?? servers).filter((s) => s !== leader)
    const isr = [
      leader,
      ...others.filter((s) => (all ? state.live.has(s) && !state.shuttingDown.has(s) : r.chance(0.5)))
    ]
    const plausible = { ...adjust(state, bucket, isr, { leader }), requestId: n }
    if (r.chance(0.7)) return plausible
    const spoilt: ReadonlyArray<Partial<AdjustIsr>> = [
      { leaderEpoch: plausible.leaderEpoch + r.pick([-1, 1]) },
      { version: plausible.version + r.pick([-1, 1]) },
      { leader: r.pick(servers) },
      { isr: [...isr, r.pick(servers)] },
      { isr: isr.slice(1) },
      { isr: [...isr, 99] }
    ]
    return { ...plausible, ...r.pick(spoilt) }
  }
  if (roll < 0.965) {
    // Now and then a preferred leader election of some tablets (an unknown one among them, one named twice).
    if (r.chance(0.7)) return { _tag: "BalanceLeaders", requestId: n }
    // Mostly tablets led elsewhere than by their preferred replica.
    const elsewhere = [...state.tablets.values()].filter((t) => t.leaderAndIsr.leader !== t.replicas[0])
    const named = Array.from({ length: r.int(1, 3) }, () =>
      elsewhere.length > 0 && r.chance(0.8) ? r.pick(elsewhere).tablet : tid(r.int(0, buckets))
    )
    return { _tag: "BalanceLeaders", requestId: n, tablets: r.chance(0.2) ? [...named, ...named] : named }
  }
  if (roll < 0.98) {
    // A server's holdings after a new controller asked: some tablets as the controller has them, some behind; or
    // no answer; sometimes of another registration.
    const holdings = [...state.tablets.values()].flatMap((t) => {
      if (!t.replicas.includes(server) || r.chance(0.2)) return []
      const lai = t.leaderAndIsr
      const epoch = r.chance(0.7) ? lai.leaderEpoch : r.chance(0.5) ? null : lai.leaderEpoch - r.int(1, 2)
      // The throttle its fetches are under: mostly the move's, when the move names one.
      const move = t.reassignment?.throttleBytesPerSec
      const throttle = r.chance(0.7) ? move : r.chance(0.4) ? undefined : r.pick([1_000, 5_000])
      return [
        {
          tablet: t.tablet,
          leaderEpoch: epoch,
          version: lai.version - (r.chance(0.7) ? 0 : r.int(1, 3)),
          ...(throttle === undefined ? {} : { throttleBytesPerSec: throttle })
        }
      ]
    })
    const registration = r.chance(0.9) ? state.registrations.get(server) : life(n, server)
    return {
      _tag: "Holdings",
      server,
      ...(registration === undefined ? {} : { registration }),
      holdings: r.chance(0.15) ? null : holdings
    }
  }
  // A new coordinator, with what coordination holds: the tablets, the servers registered now and their
  // registrations (one that was down, or restarted while no controller ran, registered anew).
  const live = servers.filter(() => r.chance(0.7))
  const registrations = live.map((s): readonly [Models.ServerId, number] => {
    const known = model.lives.get(s)
    const same = known !== undefined && r.chance(model.live.has(s) ? 0.85 : 0.15)
    return [s, same ? known : life(n, s)]
  })
  return started(
    state.coordinatorEpoch + 1,
    live,
    [...state.tablets.values()],
    r.chance(0.9) ? registrations : undefined
  )
}

/** The throttle `server`'s replica of `t` is to fetch under: the move's, for an adding replica that does not lead. */
const throttleOn = (t: Tablet, server: Models.ServerId): number | undefined => {
  const move = t.reassignment
  if (move === undefined || !move.target.includes(server) || move.original.includes(server)) return undefined
  return t.leaderAndIsr.leader === server ? undefined : move.throttleBytesPerSec
}

/** The model after `input`, fed to the controller at `before`. */
const follow = (model: Model, before: State, input: Input) => {
  if (input._tag === "ServerUp" && !model.live.has(input.server)) {
    model.live.add(input.server)
    if (input.registration !== undefined) model.lives.set(input.server, input.registration)
    for (const f of [...model.storageFailed]) if (f.startsWith(`${input.server} `)) model.storageFailed.delete(f)
  }
  if (
    input._tag === "ReplicaStorage" &&
    model.live.has(input.server) &&
    (input.registration === undefined || input.registration === model.lives.get(input.server))
  ) {
    for (const t of input.tablets) {
      // A failure of a replica the tablet does not have there (a late report of a deleted one) marks nothing.
      const hosted = before.tablets.get(Models.tabletKey(t))?.replicas.includes(input.server) === true
      if (input.failed && hosted) model.storageFailed.add(`${input.server} ${Models.tabletKey(t)}`)
      else if (!input.failed) model.storageFailed.delete(`${input.server} ${Models.tabletKey(t)}`)
    }
  }
  if (
    input._tag === "ReplicaStopped" &&
    model.live.has(input.server) &&
    input.registration === model.lives.get(input.server)
  ) {
    // A replica deleted (retired by a move, or of a deleting tablet) takes its storage failure with it.
    for (const id of input.tablets) {
      const t = before.tablets.get(Models.tabletKey(id))
      const deleting =
        t?.state === "DeletingTablet" && t.replicas.includes(input.server) && !(t.deleted ?? []).includes(input.server)
      if (deleting || (t?.retired ?? []).includes(input.server))
        model.storageFailed.delete(`${input.server} ${Models.tabletKey(id)}`)
    }
  }
  if (input._tag === "ServerDown") {
    model.live.delete(input.server)
    model.stopping.delete(input.server)
  }
  if (input._tag === "ControlledShutdown" && model.live.has(input.server)) model.stopping.add(input.server)
  if (input._tag === "Started") {
    model.storageFailed = new Set()
    model.live = new Set(input.live)
    model.stopping = new Set()
    model.lives = new Map(input.registrations ?? [])
    model.epoch = input.coordinatorEpoch
  }
  if (input._tag === "LogEnd") {
    // A candidate's answer to its election's round counts, except a recovery's `null` (it is asked again).
    const e = before.elections.get(Models.tabletKey(input.tablet))
    if (e === undefined || e.round !== input.round || !e.candidates.includes(input.server)) return
    if (input.logEnd === null && e.kind === "recovery") return
    const at = `${Models.tabletKey(input.tablet)}#${e.round}`
    model.answers.set(at, new Map(model.answers.get(at)).set(input.server, input.logEnd))
  }
}

const sorted = (s: Iterable<Models.ServerId>) => [...s].sort((a, b) => a - b)

/** The replica whose answer goes furthest: the later epoch (none before any), then the longer log, then the earlier. */
const furthestOf = (t: Tablet, answers: ReadonlyMap<Models.ServerId, LogEnd | null>): Models.ServerId | undefined => {
  const ranked = t.replicas.flatMap((server, i) => {
    const end = answers.get(server)
    return end === undefined || end === null
      ? []
      : [{ server, i, epoch: end.lastEpoch ?? -1, offset: end.logEndOffset }]
  })
  ranked.sort((a, b) => b.epoch - a.epoch || b.offset - a.offset || a.i - b.i)
  return ranked[0]?.server
}

/** The first invariant one step broke, as `[rule, detail]`. */
const check = (
  before: State,
  input: Input,
  next: State,
  commands: ReadonlyArray<Command>,
  model: Model,
  counts: Tally
): readonly [string, string] | undefined => {
  if (!isDeepStrictEqual(sorted(next.live), sorted(model.live))) return ["live set", `${sorted(next.live)}`]
  if (!isDeepStrictEqual(sorted(next.shuttingDown), sorted(model.stopping)))
    return ["shutting-down set", `${sorted(next.shuttingDown)}`]
  const byServer = (m: ReadonlyMap<Models.ServerId, number>) => [...m].sort((a, b) => a[0] - b[0])
  if (!isDeepStrictEqual(byServer(next.registrations), byServer(model.lives)))
    return ["registrations as told", JSON.stringify(byServer(next.registrations))]
  const electable = (s: Models.ServerId) => model.live.has(s) && !model.stopping.has(s)
  const previous =
    input._tag === "Started" ? new Map(input.tablets.map((t) => [Models.tabletKey(t.tablet), t])) : before.tablets
  const writes = commands.flatMap((c) => (c._tag === "Write" ? [Models.tabletKey(c.tablet.tablet)] : []))
  const twice = writes.find((k, i) => writes.indexOf(k) !== i)
  if (twice !== undefined) {
    const each = commands.flatMap((c) =>
      c._tag === "Write" && Models.tabletKey(c.tablet.tablet) === twice ? [JSON.stringify(c.tablet.leaderAndIsr)] : []
    )
    return ["one write per tablet", `${twice}: ${each.join(", then ")}`]
  }
  const written = new Set<string>()
  let lastWrite = -1
  let firstSend = commands.length
  for (const [i, c] of commands.entries()) {
    if (c._tag === "Write") {
      const k = Models.tabletKey(c.tablet.tablet)
      const was = previous.get(k)?.leaderAndIsr.version
      written.add(k)
      lastWrite = i
      if (c.expectedVersion !== (was ?? null)) return ["expected version", `${k}: ${c.expectedVersion}, was ${was}`]
      if (c.tablet.leaderAndIsr.version !== (was === undefined ? 0 : was + 1))
        return ["version + 1", `${k}: ${was} → ${c.tablet.leaderAndIsr.version}`]
      if (!isDeepStrictEqual(c.tablet, next.tablets.get(k))) return ["written = state", k]
    }
    if (c._tag === "Send") {
      firstSend = Math.min(firstSend, i)
      if (c.coordinatorEpoch !== model.epoch || next.coordinatorEpoch !== model.epoch)
        return ["send epoch", `${c.coordinatorEpoch}, controller at ${model.epoch}`]
      if (!model.live.has(c.server)) return ["send to a live server", `${c.server}`]
      for (const ins of c.tablets) {
        const t = next.tablets.get(Models.tabletKey(ins.tablet))
        if (t === undefined || !t.replicas.includes(c.server))
          return ["send to a replica", `${c.server} for ${Models.tabletKey(ins.tablet)}`]
        if (!isDeepStrictEqual(ins.leaderAndIsr, t.leaderAndIsr))
          return ["send the latest", Models.tabletKey(ins.tablet)]
        if (ins.throttleBytesPerSec !== throttleOn(t, c.server))
          return ["an adding replica's instruction carries the move's throttle, no other one does", JSON.stringify(ins)]
        if (!isDeepStrictEqual(ins.retention, t.retention))
          return ["an instruction carries its tablet's retention", JSON.stringify(ins)]
        if (t.state === "DeletingTablet") return ["no instruction for a deleting tablet", Models.tabletKey(ins.tablet)]
      }
    }
    if (c._tag === "AskLogEnd") {
      counts.asks++
      const e = next.elections.get(Models.tabletKey(c.tablet))
      if (!model.live.has(c.server) || e === undefined || e.round !== c.round || !e.candidates.includes(c.server))
        return ["AskLogEnd: a live candidate of the pending round", `${JSON.stringify(c)}, ${JSON.stringify(e)}`]
      // The candidate is fenced at the epoch the tablet is offline at, so its answer cannot grow afterwards.
      const t = next.tablets.get(Models.tabletKey(c.tablet))
      if (
        t?.state !== "OfflineTablet" ||
        c.leaderEpoch !== t.leaderAndIsr.leaderEpoch ||
        c.coordinatorEpoch !== model.epoch
      )
        return ["AskLogEnd: under the offline epoch and the coordinator epoch", `${JSON.stringify(c)}`]
    }
  }
  if (lastWrite > firstSend) return ["writes before sends", commands.map((c) => c._tag).join(",")]
  const moved = checkMoves(before, input, next, commands, model, previous, counts)
  if (moved !== undefined) return moved

  // Elections: pending only while their tablet is offline; a new one has a new round and asks every candidate.
  for (const [k, e] of next.elections) {
    if (next.tablets.get(k)?.state !== "OfflineTablet")
      return ["an election is pending only while its tablet is offline", `${k}: ${next.tablets.get(k)?.state}`]
    if (before.elections.get(k)?.round === e.round && input._tag !== "Started") continue
    const askedNow = commands.flatMap((c) =>
      c._tag === "AskLogEnd" && Models.tabletKey(c.tablet) === k && c.round === e.round ? [c.server] : []
    )
    if (
      e.round < before.nextRound ||
      e.answers.size > 0 ||
      e.candidates.length < 2 ||
      !e.candidates.every(electable) ||
      !isDeepStrictEqual(sorted(askedNow), sorted(e.candidates))
    )
      return ["a new election: a new round, every candidate electable and asked", `${k}: ${JSON.stringify(e)}`]
  }
  const uncleanLogged = new Set(
    commands.flatMap((c) =>
      c._tag === "Log" && c.message.includes(": unclean leader election") ? [c.message.split(":")[0]] : []
    )
  )
  if (uncleanLogged.size !== next.uncleanElections - before.uncleanElections)
    return ["unclean elections counted and logged", `${next.uncleanElections - before.uncleanElections}`]

  // The election this answer ends, and the leader its answers choose (when electable; else it is elected again).
  let ended: { readonly k: string; readonly e: Election; readonly winner: Models.ServerId | undefined } | undefined
  if (input._tag === "LogEnd") {
    const k = Models.tabletKey(input.tablet)
    const e = before.elections.get(k)
    const t = before.tablets.get(k)
    if (e === undefined || t === undefined || e.round !== input.round || !e.candidates.includes(input.server)) {
      counts.staleAnswers++
      if (next !== before || commands.length > 0)
        return ["a stale or stranger's answer changes nothing", JSON.stringify(commands)]
    } else if (input.logEnd === null && e.kind === "recovery") {
      const again: Command = {
        _tag: "AskLogEnd",
        server: input.server,
        tablet: input.tablet,
        round: e.round,
        leaderEpoch: t.leaderAndIsr.leaderEpoch,
        coordinatorEpoch: before.coordinatorEpoch
      }
      if (next !== before || !isDeepStrictEqual(commands, [again]))
        return ["a recovery asks an unanswered candidate again", JSON.stringify(commands)]
    } else {
      const answers = model.answers.get(`${k}#${e.round}`) ?? new Map<Models.ServerId, LogEnd | null>()
      if (answers.size < e.candidates.length) {
        if (written.size > 0 || next.elections.get(k)?.answers.size !== answers.size)
          return ["an answer before the last waits", `${k}: ${JSON.stringify(commands)}`]
      } else {
        const winner = furthestOf(t, answers) ?? e.candidates.find(electable)
        // One whose storage failed does not lead, however far its log goes.
        const usable = (s: Models.ServerId) => electable(s) && !model.storageFailed.has(`${s} ${k}`)
        ended = { k, e, winner: winner !== undefined && usable(winner) ? winner : undefined }
        if (next.elections.get(k)?.round === e.round) return ["the last answer ends the election", k]
        if (ended.winner !== undefined && !written.has(k))
          return ["the furthest log leads", `${k}: no write, answers ${JSON.stringify([...answers])}`]
      }
    }
  }

  if (input._tag === "BalanceLeaders") {
    for (const k of written) {
      const p = previous.get(k)
      const t = next.tablets.get(k)!
      const preferred = t.replicas[0]!
      const recorded = p?.registrations?.[String(preferred)]
      // A life the shell never told is taken as the one recorded (as everywhere else).
      const current = model.lives.get(preferred)
      const sameLife = recorded === undefined || current === undefined || current === recorded
      if (
        p === undefined ||
        p.state !== "OnlineTablet" ||
        t.leaderAndIsr.leader !== preferred ||
        p.leaderAndIsr.leader === preferred ||
        !p.leaderAndIsr.isr.includes(preferred) ||
        !electable(preferred) ||
        !sameLife ||
        !isDeepStrictEqual(t.leaderAndIsr.isr, p.leaderAndIsr.isr) ||
        t.leaderAndIsr.leaderEpoch !== p.leaderAndIsr.leaderEpoch + 1
      )
        return [
          "BalanceLeaders: an online tablet's preferred replica, in its ISR as the same life, leads",
          `${k}: ${JSON.stringify(p)} → ${JSON.stringify(t)}; lives ${JSON.stringify([...model.lives])}`
        ]
      counts.balanced++
    }
  }
  if (input._tag === "Holdings") {
    counts.holdings++
    if (next !== before) return ["a Holdings answer changes no state", JSON.stringify(commands)]
    const current = model.live.has(input.server) && model.lives.get(input.server) === input.registration
    const told = new Set(
      commands.flatMap((c) => (c._tag === "Send" ? c.tablets.map((t) => Models.tabletKey(t.tablet)) : []))
    )
    for (const [k, t] of next.tablets) {
      if (!current || !t.replicas.includes(input.server) || t.state === "DeletingTablet") {
        if (told.has(k)) return ["Holdings: told only its current replicas, none being deleted", k]
        continue
      }
      const held = input.holdings?.find((h) => Models.tabletKey(h.tablet) === k)
      const lai = t.leaderAndIsr
      const throttle = throttleOn(t, input.server)
      const upToDate =
        held !== undefined &&
        held.leaderEpoch === lai.leaderEpoch &&
        (lai.leader !== input.server || held.version >= lai.version) &&
        held.throttleBytesPerSec === throttle
      const pointless = held !== undefined && lai.leader === null
      const due = input.holdings === null || (!upToDate && !pointless)
      if (due !== told.has(k)) return ["Holdings: told exactly where it falls behind", `${k}: due ${due}`]
    }
  }

  // Deletion: a deleting tablet stays deleting with no leader until every replica said it deleted itself (a live one,
  // as its current registration), and its node goes then, with nothing else.
  const removes = commands.flatMap((c) => (c._tag === "Remove" ? [Models.tabletKey(c.tablet)] : []))
  for (const k of previous.keys()) {
    const p = previous.get(k)!
    const gone = !next.tablets.has(k)
    if (gone !== removes.includes(k)) return ["a tablet leaves the state exactly when its node is removed", k]
    if (!gone) {
      const t = next.tablets.get(k)!
      if (p.state === "DeletingTablet" && t.state !== "DeletingTablet") return ["deleting stays deleting", k]
      if (t.state === "DeletingTablet" && t.leaderAndIsr.leader !== null) return ["a deleting tablet has no leader", k]
      continue
    }
    const answered =
      input._tag === "ReplicaStopped" &&
      model.live.has(input.server) &&
      model.lives.get(input.server) === input.registration &&
      input.tablets.some((id) => Models.tabletKey(id) === k)
    const all = p.replicas.every((s) => (p.deleted ?? []).includes(s) || (answered && s === input.server))
    if (p.state !== "DeletingTablet" || !answered || !all) return ["removed only once every replica deleted itself", k]
    counts.removed++
  }
  for (const c of commands) {
    if (c._tag !== "StopReplica") continue
    if (!model.live.has(c.server)) return ["StopReplica to a live server", `${c.server}`]
    for (const id of c.tablets) {
      const t = next.tablets.get(Models.tabletKey(id))
      const deleting =
        t?.state === "DeletingTablet" && t.replicas.includes(c.server) && !(t.deleted ?? []).includes(c.server)
      if (!deleting && !(t?.retired ?? []).includes(c.server))
        return ["StopReplica for a replica still to delete", `${c.server}: ${Models.tabletKey(id)}`]
    }
  }
  if (input._tag === "DeleteTablets")
    counts.deleting += [...next.tablets.values()].filter((t) => t.state === "DeletingTablet").length
  for (const [k, t] of next.tablets) {
    const p = previous.get(k)
    if (!written.has(k)) {
      if (!isDeepStrictEqual(t, p)) return ["no change without a write", k]
      continue
    }
    const now = t.leaderAndIsr
    const isr = now.isr
    if (isr.length === 0 || new Set(isr).size !== isr.length || isr.some((s) => !t.replicas.includes(s)))
      return ["ISR ⊆ replicas, non-empty, no duplicates", `${k}: ${isr} of ${t.replicas}`]
    if (now.leader !== null && !isr.includes(now.leader)) return ["leader ∈ ISR", `${k}: ${now.leader}, ${isr}`]
    if ((t.state === "OnlineTablet") !== (now.leader !== null)) return ["online ⇔ a leader", `${k}: ${t.state}`]
    if (now.leader !== null && !model.live.has(now.leader)) return ["the leader is live", `${k}: ${now.leader}`]
    const eligible = t.eligible ?? []
    if (eligible.length > 0) counts.eligible++
    if (
      eligible.some((s) => isr.includes(s) || !t.replicas.includes(s)) ||
      (eligible.length > 0 && isr.length >= model.min)
    )
      return ["eligible: replicas outside the ISR, only below the minimum", `${k}: ${eligible}, ISR ${isr}`]
    const electable = t.replicas.filter((s) => model.live.has(s) && !model.stopping.has(s))
    const was = p?.leaderAndIsr
    if (p === undefined || was === undefined) {
      const leader = electable[0] ?? null
      const expected = { leader, leaderEpoch: 0, isr: leader === null ? t.replicas : electable, version: 0 }
      if (!isDeepStrictEqual({ ...now, coordinatorEpoch: undefined }, { ...expected, coordinatorEpoch: undefined }))
        return ["creation", `${k}: ${JSON.stringify(now)}`]
      for (const s of isr)
        if (model.lives.has(s) && t.registrations?.[String(s)] !== model.lives.get(s))
          return ["a member joins the ISR as registered now", `${k}: ${s} created as ${t.registrations?.[String(s)]}`]
      continue
    }
    // The life each member of the previous ISR was recorded as, and whether it registered again since.
    const recorded = (s: Models.ServerId) => p.registrations?.[String(s)]
    const renewed = (s: Models.ServerId) => {
      const then = recorded(s)
      const current = model.lives.get(s)
      return then !== undefined && current !== undefined && then !== current
    }
    if (was.isr.some(renewed)) counts.newLives++
    const changed = now.leader !== was.leader
    // A leader elected again as a new life of itself (a restart while no controller ran) takes a new epoch too.
    const elected = now.leader !== null && (changed || renewed(now.leader))
    // A replica whose storage works again takes a role only under a new epoch: its tablet's leader leads on under one.
    const bumped =
      input._tag === "ReplicaStorage" && !input.failed && input.tablets.some((id) => Models.tabletKey(id) === k)
    // A tablet's replica set changed by a move: every replica takes it under a new epoch (not a throttle change).
    const reshaped =
      t.state !== "DeletingTablet" &&
      (!isDeepStrictEqual(t.replicas, p.replicas) ||
        !isDeepStrictEqual(t.reassignment?.original, p.reassignment?.original) ||
        !isDeepStrictEqual(t.reassignment?.target, p.reassignment?.target))
    if (
      now.leaderEpoch !==
      was.leaderEpoch + (changed || elected || reshaped || (bumped && now.leader !== null) ? 1 : 0)
    )
      return [
        "epoch + 1 on a new leader (or a new life of it) only",
        `${k}: ${was.leader}@${was.leaderEpoch} → ${now.leader}@${now.leaderEpoch}`
      ]
    // A member just let into the ISR by this change may lead the move it completes.
    const joined = input._tag === "AdjustIsr" ? input.isr : []
    const candidates = [...new Set([...t.replicas, ...p.replicas])].filter(
      (s) => was.isr.includes(s) || joined.includes(s) || (p.eligible ?? []).includes(s)
    )
    const unclean = uncleanLogged.has(k)
    if (unclean && !model.unclean) return ["no unclean election unless enabled", k]
    if (changed) {
      counts.leaderChanges++
      if (now.leader === null) counts.offline++
    }
    if (elected && now.leader !== null) {
      if (model.stopping.has(now.leader))
        return ["a stopping server is not electable", `${k}: ${now.leader} elected, ISR was ${was.isr}`]
      if (model.storageFailed.has(`${now.leader} ${k}`))
        return ["a replica whose storage failed is not electable", `${k}: ${now.leader} elected`]
      // A recovery (every ISR member a new life, perhaps without what it had not flushed) may take any live replica.
      const recovery = was.isr.length > 0 && was.isr.every(renewed)
      if (!unclean && !recovery && !candidates.includes(now.leader))
        return ["clean election from the ISR (or the eligible)", `${k}: ${now.leader} not in ${candidates}`]
      // Unasked, a new life leads only as the one candidate there is (its log is the best there is).
      const asked = ended?.k === k && ended.winner === now.leader
      const sole = candidates.length === 1 && candidates[0] === now.leader
      if (!asked && !unclean && !sole && renewed(now.leader))
        return [
          "a leader elected unasked is the life it was",
          `${k}: ${now.leader} recorded as ${recorded(now.leader)}, now ${model.lives.get(now.leader)}, candidates ${candidates}`
        ]
    }
    if (ended?.k === k && ended.winner !== undefined) {
      const { e, winner } = ended
      if (now.leader !== winner || !e.candidates.includes(winner))
        return [
          "the furthest log leads",
          `${k}: ${now.leader} elected, ${winner} goes furthest: ${JSON.stringify([...(model.answers.get(`${k}#${e.round}`) ?? [])])}`
        ]
      if (e.kind === "recovery") {
        counts.recoveries++
        if (!isDeepStrictEqual(isr, [winner]) || eligible.length > 0)
          return ["a recovery's leader is its ISR alone", `${k}: ISR ${isr}, eligible ${eligible}`]
      } else {
        counts.largest++
        const stays = was.isr.filter((s) => s === winner || (electable.includes(s) && !renewed(s)))
        if (!isDeepStrictEqual(isr, stays))
          return ["the largest log's ISR keeps its electable members", `${k}: ${isr}, expected ${stays}`]
      }
    }
    // An ISR member keeps the life it joined with; a new member, or the leader just elected, joins as it is now.
    for (const s of isr) {
      const life = t.registrations?.[String(s)]
      if (was.isr.includes(s) && !(elected && s === now.leader)) {
        const then = recorded(s)
        if (then !== undefined && life !== then)
          return ["an ISR member keeps the registration it joined with", `${k}: ${s} as ${then}, now ${life}`]
      } else if (model.lives.has(s) && life !== model.lives.get(s))
        return ["a member joins the ISR as registered now", `${k}: ${s} as ${life}, is ${model.lives.get(s)}`]
    }
    // KIP-966: eligible members left the ISR while it was below the minimum, and stay eligible while it is; a
    // recovery's or an unclean election's leader alone holds the tablet's log after it.
    const left = was.isr.filter((s) => !isr.includes(s))
    const mayStay = [...left, ...(p.eligible ?? [])].filter((s) => !isr.includes(s))
    if (eligible.some((s) => !mayStay.includes(s)))
      return ["eligible: only members that left the ISR", `${k}: ${eligible}, ISR was ${was.isr}`]
    const reset = unclean || (ended?.k === k && ended.winner !== undefined && ended.e.kind === "recovery")
    if (!reset && isr.length < model.min && mayStay.some((s) => !eligible.includes(s)))
      return ["a member leaving an ISR below the minimum stays eligible", `${k}: ${eligible}, from ${mayStay}`]
    const gained = isr.find((s) => !was.isr.includes(s) && !electable.includes(s))
    if (gained !== undefined) return ["KIP-841: no ineligible ISR member added", `${k}: ${gained} joined ${was.isr}`]
    const failedJoined = isr.find((s) => !was.isr.includes(s) && model.storageFailed.has(`${s} ${k}`))
    if (failedJoined !== undefined)
      return ["no replica whose storage failed joins an ISR", `${k}: ${failedJoined} joined ${was.isr}`]
  }
  // A leader is the life it was elected as: a restart since takes the leadership from it.
  for (const [k, t] of next.tablets) {
    if (!isDeepStrictEqual(t.retention, retentionFor(t.tablet.bucket)))
      return ["a tablet keeps the retention it was created with", `${k}: ${JSON.stringify(t.retention)}`]
  }
  for (const [k, t] of next.tablets) {
    const leader = t.leaderAndIsr.leader
    if (leader === null) continue
    const recorded = t.registrations?.[String(leader)]
    const current = model.lives.get(leader)
    if (recorded !== undefined && current !== undefined && recorded !== current)
      return ["a leader is the life it was elected as", `${k}: ${leader} as ${recorded}, now ${current}`]
  }
  if (input._tag === "CreateTablets") {
    const keys = new Set(input.tablets.map((s) => Models.tabletKey(s.tablet)))
    const refuse = keys.size < input.tablets.length || input.tablets.some((s) => s.replicas.length < model.min)
    if ((reply(commands)?._tag === "CreateRefused") !== refuse)
      return ["refused: a tablet twice, or fewer replicas than minInsyncReplicas", JSON.stringify(commands)]
    if (refuse) {
      counts.refused++
      if (next !== before || commands.length !== 1) return ["a refusal changes nothing", JSON.stringify(commands)]
    }
  }
  if (input._tag === "AdjustIsr") {
    const r = reply(commands)
    if (r?._tag === "IsrRejected") {
      counts.rejected++
      if (r.rejection._tag === "IneligibleReplica") counts.ineligible++
      if (commands.length !== 1 || next !== before) return ["a rejection changes nothing", JSON.stringify(commands)]
    } else {
      counts.accepted++
      // A repeat of the committed ISR (a retry whose answer was lost) is answered without a write.
      if (written.size === 0) {
        if (next !== before || commands.length !== 1) return ["a repeat is answered and changes nothing", ""]
      } else {
        // The change that brings a move's last target into the ISR finishes it: every new replica hears that.
        const k = Models.tabletKey(input.tablet)
        const finished =
          before.tablets.get(k)?.reassignment !== undefined && next.tablets.get(k)?.reassignment === undefined
        if (written.size !== 1 || (firstSend < commands.length && !finished))
          return ["an accepted change: one write, no sends (but for a move it finishes)", ""]
      }
    }
  }
  counts.unclean += next.uncleanElections - before.uncleanElections
  return undefined
}

/**
 * Moves: a moving tablet's replicas are its target then its leaving ones; a move begins only on a request for an
 * online tablet, its leader and ISR unchanged; it ends on its target with every target replica in sync (its ISR the
 * target's) or, on a cancel, on its original replicas led by one that was in sync; a retired replica is out of the
 * replicas and leaves the list only on its own answer; a refusal changes nothing.
 */
const checkMoves = (
  before: State,
  input: Input,
  next: State,
  commands: ReadonlyArray<Command>,
  model: Model,
  previous: ReadonlyMap<string, Tablet>,
  counts: Tally
): readonly [string, string] | undefined => {
  const same = (a: ReadonlyArray<Models.ServerId>, b: ReadonlyArray<Models.ServerId>) =>
    isDeepStrictEqual(sorted(a), sorted(b))
  for (const [k, t] of next.tablets) {
    const p = previous.get(k)
    const r = t.reassignment
    const retired = t.retired ?? []
    if (
      r !== undefined &&
      !isDeepStrictEqual(t.replicas, [...r.target, ...r.original.filter((s) => !r.target.includes(s))])
    )
      return ["a moving tablet's replicas: its target, then its leaving ones", `${k}: ${JSON.stringify(t)}`]
    if (retired.some((s) => t.replicas.includes(s))) return ["a retired replica is out of the replicas", k]
    if (p === undefined || t.state === "DeletingTablet") continue
    const request = (tag: Input["_tag"]) =>
      input._tag === tag && "tablet" in input && Models.tabletKey(input.tablet as Models.TabletId) === k
    if (r !== undefined && p.reassignment === undefined) {
      counts.moves++
      if (!request("Reassign") || p.state !== "OnlineTablet") return ["a move begins only when asked, online", k]
      if (!same(r.original, p.replicas)) return ["a move starts from the replicas the tablet has", k]
    }
    if (
      r !== undefined &&
      p.reassignment !== undefined &&
      (!isDeepStrictEqual(r.original, p.reassignment.original) || !isDeepStrictEqual(r.target, p.reassignment.target))
    )
      return ["a move keeps its target", k]
    // Its throttle changes only when a repeat of it names another (or none), the leader epoch staying.
    const asked = input._tag === "Reassign" && request("Reassign") ? input.throttleBytesPerSec : undefined
    if (
      r !== undefined &&
      p.reassignment !== undefined &&
      r.throttleBytesPerSec !== p.reassignment.throttleBytesPerSec
    ) {
      counts.rethrottled++
      if (!request("Reassign") || r.throttleBytesPerSec !== asked)
        return ["a move's throttle is the one its last request named", k]
    }
    if (r !== undefined && p.reassignment === undefined && r.throttleBytesPerSec !== asked)
      return ["a move starts with the throttle its request named", k]
    // The move this step ended: one under way, or one begun and finished at once (nothing to copy).
    const instant =
      input._tag === "Reassign" && request("Reassign") && !isDeepStrictEqual(t.replicas, p.replicas)
        ? { original: p.replicas, target: input.target }
        : undefined
    const was = p.reassignment ?? instant
    if (was !== undefined && r === undefined) {
      const lai = t.leaderAndIsr
      const joined = input._tag === "AdjustIsr" ? input.isr : []
      // In sync before, let in by this change, or the leader this step elected (its own checks judge that election).
      const elected = lai.leader !== p.leaderAndIsr.leader ? lai.leader : null
      const inSync = (s: Models.ServerId) => p.leaderAndIsr.isr.includes(s) || joined.includes(s) || s === elected
      if (isDeepStrictEqual(t.replicas, was.target) && !request("CancelReassign")) {
        counts.moved++
        if (
          !was.target.every(inSync) ||
          !same(lai.isr, was.target) ||
          lai.leader === null ||
          !was.target.includes(lai.leader)
        )
          return ["a move finishes with every target in sync, led by one of them", `${k}: ${JSON.stringify(t)}`]
      } else if (isDeepStrictEqual(t.replicas, was.original) && request("CancelReassign")) {
        counts.cancelled++
        if (
          lai.leader === null ||
          !was.original.includes(lai.leader) ||
          !lai.isr.every((s) => p.leaderAndIsr.isr.includes(s))
        )
          return ["a cancel goes back to the original replicas, led by one in sync", `${k}: ${JSON.stringify(t)}`]
      } else return ["a move ends on its target or, cancelled, on its original replicas", `${k}: ${JSON.stringify(t)}`]
    }
    const gone = (p.retired ?? []).filter((s) => !retired.includes(s))
    const answered = (s: Models.ServerId) =>
      input._tag === "ReplicaStopped" &&
      input.server === s &&
      model.live.has(s) &&
      model.lives.get(s) === input.registration
    if (gone.some((s) => !answered(s))) return ["a retired replica leaves the list on its own answer only", k]
  }
  if (input._tag === "Reassign" || input._tag === "CancelReassign") {
    // A repeat of the move under way (which may change its throttle): its target was judged when it began.
    const under = before.tablets.get(Models.tabletKey(input.tablet))?.reassignment
    const repeat = input._tag === "Reassign" && under !== undefined && isDeepStrictEqual(under.target, input.target)
    const r = reply(commands)
    if (r?._tag === "ReassignRefused") {
      counts.moveRefused++
      if (next !== before || commands.length !== 1) return ["a refused move changes nothing", JSON.stringify(commands)]
    } else if (input._tag === "Reassign" && next !== before && !repeat) {
      const target = input.target
      const fine =
        new Set(target).size === target.length &&
        target.length >= model.min &&
        target.every((s) => model.live.has(s) && !model.stopping.has(s))
      if (!fine) return ["a move to a server twice, down or stopping, or too few, is refused", JSON.stringify(r)]
    }
  }
  return undefined
}

/** One seeded run of 60 random inputs under options drawn from the seed; the first broken invariant. */
const drive = (seed: number, step: StepFn = ControllerState.step, counts = tally()) => {
  const r = seeded(seed)
  const servers = Array.from({ length: r.int(3, 7) }, (_, i) => i + 1)
  const min = r.pick([1, 1, 2, 2, 3])
  const model: Model = {
    live: new Set(),
    stopping: new Set(),
    lives: new Map(),
    epoch: 1,
    unclean: r.chance(0.5),
    min,
    answers: new Map(),
    storageFailed: new Set()
  }
  const options: ControllerState.Options = {
    uncleanLeaderElection: model.unclean,
    // The default minimum is 1.
    ...(min === 1 && r.chance(0.5) ? {} : { minInsyncReplicas: min }),
    ...(r.chance(0.5) ? { leaderElection: "largest-log-end" as const } : {}),
    ...(r.chance(0.5) ? { leaderImbalancePercent: r.pick([0, 10, 50]) } : {})
  }
  const live = servers.filter(() => r.chance(0.7))
  const boot = started(
    1,
    live,
    [],
    live.map((s) => [s, life(-1, s)] as const)
  )
  const initial = ControllerState.make(options)
  follow(model, initial, boot)
  let state = step(initial, boot)[0]
  const buckets = r.int(2, 5)
  for (let n = 0; n < 60; n++) {
    const input = randomInput(r, state, model, servers, buckets, n)
    const [next, commands] = step(state, input)
    follow(model, state, input)
    const broken = check(state, input, next, commands, model, counts)
    if (broken !== undefined)
      return { rule: broken[0], message: `seed=${seed} step ${n} ${JSON.stringify(input)}: ${broken.join(": ")}` }
    state = next
  }
  return undefined
}

/** The seeds' failures, the first of each rule; `until`: stop at the first seed breaking that rule. */
const failures = (step: StepFn = ControllerState.step, counts = tally(), until?: string) => {
  const first = new Map<string, string>()
  for (let seed = 1; seed <= 1000; seed++) {
    const f = drive(seed, step, counts)
    if (f !== undefined && !first.has(f.rule)) first.set(f.rule, f.message)
    if (until !== undefined && first.has(until)) break
  }
  return first
}

/** The unchanged machine's 1000 runs, once for the tests that read them. */
let clean: { readonly broken: ReadonlyMap<string, string>; readonly counts: Tally } | undefined
const cleanRuns = () => {
  if (clean === undefined) {
    const counts = tally()
    clean = { broken: failures(ControllerState.step, counts), counts }
  }
  return clean
}

describe("ControllerState seeded runs", () => {
  it("1000 seeds × 60 inputs keep versions, epochs, ISRs, registrations, elections and sends sound", () => {
    const { broken } = cleanRuns()
    assert.strictEqual(broken.size, 0, [...broken.values()].join("\n"))
  })

  it("the runs are not vacuous: leaders change, tablets go offline, ISR changes are accepted and rejected, elections ask", () => {
    const { counts } = cleanRuns()
    // A preferred replica back in the ISR of a tablet led elsewhere needs a longer history: fewer of those.
    // A deletion ends only once every replica answered: fewer of those too.
    // Moves finish or are cancelled only after their requests meet an online tablet (and ISR changes): fewer too.
    const least: Partial<Record<keyof Tally, number>> = {
      balanced: 50,
      removed: 30,
      moved: 20,
      cancelled: 20,
      rethrottled: 10
    }
    for (const [name, n] of Object.entries(counts))
      assert.isAbove(n, least[name as keyof Tally] ?? 100, `${name}: ${JSON.stringify(counts)}`)
  })

  it("a planted bug (ISR additions not checked for eligibility) is caught", () => {
    const everyone = new Set([1, 2, 3, 4, 5, 6, 7])
    const buggy: StepFn = (state, input) => {
      if (input._tag !== "AdjustIsr") return ControllerState.step(state, input)
      const lax: State = { ...state, live: everyone, shuttingDown: new Set() }
      const [next, commands] = ControllerState.step(lax, input)
      return [next === lax ? state : { ...next, live: state.live, shuttingDown: state.shuttingDown }, commands]
    }
    const rule = "KIP-841: no ineligible ISR member added"
    const broken = failures(buggy, tally(), rule)
    assert.isTrue(broken.has(rule), [...broken.keys()].join(", "))
  })

  it("a planted bug (a resuming controller takes any holding of the right epoch as current) is caught", () => {
    const lenient: StepFn = (state, input) =>
      ControllerState.step(
        state,
        input._tag === "Holdings" && input.holdings !== null
          ? { ...input, holdings: input.holdings.map((h) => ({ ...h, version: Number.MAX_SAFE_INTEGER })) }
          : input
      )
    const rule = "Holdings: told exactly where it falls behind"
    const broken = failures(lenient, tally(), rule)
    assert.isTrue(broken.has(rule), [...broken.keys()].join(", "))
  })

  it("a planted bug (leadership moved to a preferred replica outside the ISR) is caught", () => {
    const outside: StepFn = Mutants.preferOutsideIsr(ControllerState.step)
    const rule = "BalanceLeaders: an online tablet's preferred replica, in its ISR as the same life, leads"
    const broken = failures(outside, tally(), rule)
    assert.isTrue(broken.has(rule), [...broken.keys()].join(", "))
  })

  it("a planted bug (a tablet removed on its first replica's answer) is caught", () => {
    const hasty: StepFn = (state, input) => {
      if (input._tag !== "ReplicaStopped") return ControllerState.step(state, input)
      const tablets = new Map(state.tablets)
      for (const id of input.tablets) {
        const t = tablets.get(Models.tabletKey(id))
        if (t?.state === "DeletingTablet")
          tablets.set(Models.tabletKey(id), { ...t, deleted: t.replicas.filter((s) => s !== input.server) })
      }
      return ControllerState.step({ ...state, tablets }, input)
    }
    const rule = "removed only once every replica deleted itself"
    const broken = failures(hasty, tally(), rule)
    assert.isTrue(broken.has(rule), [...broken.keys()].join(", "))
  })

  it("a planted bug (a move finished before its new replicas are in sync) is caught", () => {
    // The machine is fed the tablet as if every target replica were in its ISR already.
    const hasty: StepFn = (state, input) => {
      const k = input._tag === "Reassign" ? Models.tabletKey(input.tablet) : undefined
      const t = k === undefined ? undefined : state.tablets.get(k)
      if (input._tag !== "Reassign" || k === undefined || t === undefined) return ControllerState.step(state, input)
      const isr = [...new Set([...t.leaderAndIsr.isr, ...input.target])]
      const synced = { ...t, leaderAndIsr: { ...t.leaderAndIsr, isr } }
      const hurried = ControllerState.step({ ...state, tablets: new Map(state.tablets).set(k, synced) }, input)
      return hurried[1].some((c) => c._tag === "Write") ? hurried : ControllerState.step(state, input)
    }
    const rule = "a move finishes with every target in sync, led by one of them"
    const broken = failures(hasty, tally(), rule)
    assert.isTrue(broken.has(rule), [...broken.keys()].join(", "))
  })

  it("a planted bug (log ends misread: offsets negated, so the shortest log leads) is caught", () => {
    const misread: StepFn = (state, input) =>
      ControllerState.step(
        state,
        input._tag === "LogEnd" && input.logEnd !== null
          ? { ...input, logEnd: { ...input.logEnd, logEndOffset: -input.logEnd.logEndOffset } }
          : input
      )
    const rule = "the furthest log leads"
    const broken = failures(misread, tally(), rule)
    assert.isTrue(broken.has(rule), [...broken.keys()].join(", "))
  })
})

describe("ControllerState registrations (KIP-903)", () => {
  const t0 = { table: "orders", bucket: 0 }
  const lai = (leader: number, isr: ReadonlyArray<number>) => ({
    leader,
    leaderEpoch: 4,
    isr,
    coordinatorEpoch: 1,
    version: 7
  })
  const stored = (leader: number, isr: ReadonlyArray<number>, registrations: Record<string, number>) => ({
    tablet: t0,
    replicas: [1, 2, 3],
    state: "OnlineTablet" as const,
    leaderAndIsr: lai(leader, isr),
    registrations
  })
  const fresh = ControllerState.make({ uncleanLeaderElection: false })
  /** A new controller's start with these servers' registrations (all live) and one stored tablet. */
  const startWith = (registrations: Record<number, number>, tablet: ReturnType<typeof stored>) =>
    ControllerState.step(fresh, {
      _tag: "Started",
      coordinatorEpoch: 2,
      live: Object.keys(registrations).map(Number),
      registrations: Object.entries(registrations).map(([s, r]) => [Number(s), r] as const),
      tablets: [tablet]
    })

  it("a leader registered again while no controller ran is replaced by an ISR member that is not", () => {
    const [state, commands] = startWith({ 1: 50, 2: 11, 3: 12 }, stored(1, [1, 2, 3], { "1": 10, "2": 11, "3": 12 }))
    const t = state.tablets.get("orders/0")!
    assert.strictEqual(t.leaderAndIsr.leader, 2)
    assert.strictEqual(t.leaderAndIsr.leaderEpoch, 5)
    assert.deepStrictEqual(t.leaderAndIsr.isr, [2, 3])
    assert.deepStrictEqual(t.registrations, { "2": 11, "3": 12 })
    assert.strictEqual(commands[0]?._tag, "Write")
  })

  it("a follower registered again leaves the ISR; the same life keeps its place", () => {
    const [started] = startWith({ 1: 10, 2: 11 }, stored(1, [1, 2, 3], { "1": 10, "2": 11, "3": 12 }))
    // Server 3 was down at the start (kept out of the ISR), then comes back: no change for the ISR it is not in.
    assert.deepStrictEqual(started.tablets.get("orders/0")!.leaderAndIsr.isr, [1, 2])
    const [same] = startWith({ 1: 10, 2: 11, 3: 12 }, stored(1, [1, 2, 3], { "1": 10, "2": 11, "3": 12 }))
    assert.deepStrictEqual(same.tablets.get("orders/0")!.leaderAndIsr.isr, [1, 2, 3])
    const [renewed] = startWith({ 1: 10, 2: 11, 3: 99 }, stored(1, [1, 2, 3], { "1": 10, "2": 11, "3": 12 }))
    const t = renewed.tablets.get("orders/0")!
    assert.deepStrictEqual([t.leaderAndIsr.leader, t.leaderAndIsr.leaderEpoch, t.leaderAndIsr.isr], [1, 4, [1, 2]])
  })

  it("when the only ISR member is a new life, every live replica is asked; the furthest leads, as its life now", () => {
    const [asking, commands] = startWith({ 1: 50, 2: 60 }, stored(1, [1], { "1": 10 }))
    // Server 1 may have lost what it had not flushed; server 2, outside the ISR, may hold it still.
    const asks = commands.flatMap((c) => (c._tag === "AskLogEnd" ? [[c.server, c.round] as const] : []))
    assert.deepStrictEqual(
      asks.map(([server]) => server),
      [1, 2]
    )
    assert.strictEqual(asking.tablets.get("orders/0")!.state, "OfflineTablet")
    const answer = (state: ControllerState.State, server: Models.ServerId, logEndOffset: number) =>
      ControllerState.step(state, {
        _tag: "LogEnd",
        tablet: t0,
        round: asks[0]![1],
        server,
        logEnd: { lastEpoch: 4, logEndOffset }
      })[0]
    const further = (one: number, two: number) => answer(answer(asking, 1, one), 2, two).tablets.get("orders/0")!
    const byTwo = further(10, 12)
    assert.deepStrictEqual([byTwo.leaderAndIsr.leader, byTwo.leaderAndIsr.isr, byTwo.state], [2, [2], "OnlineTablet"])
    assert.deepStrictEqual(byTwo.registrations, { "2": 60 })
    const byOne = further(12, 10)
    assert.deepStrictEqual([byOne.leaderAndIsr.leader, byOne.leaderAndIsr.isr, byOne.state], [1, [1], "OnlineTablet"])
    assert.deepStrictEqual(byOne.registrations, { "1": 50 })
  })

  it("an expansion naming a registration its server no longer has is refused; the current one is recorded", () => {
    const [state] = startWith({ 1: 10, 2: 11, 3: 12 }, stored(1, [1, 2], { "1": 10, "2": 11 }))
    const ask = (registration: number): Input => ({
      _tag: "AdjustIsr",
      requestId: 9,
      tablet: t0,
      leader: 1,
      leaderEpoch: 4,
      version: 7,
      isr: [1, 2, 3],
      registrations: [
        [2, 11],
        [3, registration]
      ]
    })
    const [same, refused] = ControllerState.step(state, ask(5))
    assert.strictEqual(same, state)
    assert.deepStrictEqual(refused, [
      {
        _tag: "Reply",
        requestId: 9,
        reply: { _tag: "IsrRejected", rejection: { _tag: "IneligibleReplica", server: 3, why: "registered again" } }
      }
    ])
    const [joined] = ControllerState.step(state, ask(12))
    assert.deepStrictEqual(joined.tablets.get("orders/0")!.registrations, { "1": 10, "2": 11, "3": 12 })
  })

  it("an ISR member keeps the registration it joined with through later writes: a restart is still noticed", () => {
    // 1 (the leader) is down, 2 restarted (60, not 11): no candidate yet, the tablet goes offline, 2 still as 11.
    const [offline] = startWith({ 2: 60 }, stored(1, [1, 2], { "1": 10, "2": 11 }))
    const t = offline.tablets.get("orders/0")!
    assert.deepStrictEqual([t.state, t.registrations], ["OfflineTablet", { "1": 10, "2": 11 }])
    // 1 returns, restarted too: both are asked, 2 is not taken for the life it was.
    const [asking, commands] = ControllerState.step(offline, { _tag: "ServerUp", server: 1, registration: 70 })
    assert.deepStrictEqual(
      commands.flatMap((c) => (c._tag === "AskLogEnd" ? [c.server] : [])),
      [1, 2]
    )
    assert.strictEqual(asking.tablets.get("orders/0")!.state, "OfflineTablet")
  })
})

describe("ControllerState eligible leader replicas and recovery (KIP-966)", () => {
  const min2 = { uncleanLeaderElection: false, minInsyncReplicas: 2 }
  const life = (server: Models.ServerId, registration: number): Input => ({ _tag: "ServerUp", server, registration })
  /** t0 on [1, 2] with minimum ISR 2; 1 leads, registered as lives 10 and 20. */
  const pair = () =>
    run(
      ControllerState.make(min2),
      {
        _tag: "Started",
        coordinatorEpoch: 1,
        live: [1, 2],
        registrations: [
          [1, 10],
          [2, 20]
        ],
        tablets: []
      },
      create([0, [1, 2]])
    ).state

  it("a member leaving an ISR below the minimum stays eligible; one leaving while the minimum holds does not", () => {
    const { state } = run(pair(), down(1))
    assert.deepStrictEqual([lai(state, 0).leader, lai(state, 0).isr, tablet(state, 0).eligible], [2, [2], [1]])
    const three = run(bootWith(min2, [1, 2, 3]), create([0, [1, 2, 3]]), down(3)).state
    assert.deepStrictEqual([lai(three, 0).isr, tablet(three, 0).eligible], [[1, 2], []])
  })

  it("with no ISR member the life it was, every ISR and eligible member is asked, and the furthest log leads", () => {
    // 1 dies (eligible), then 2 (the last ISR member); both come back as new lives.
    const { state: offline } = run(pair(), down(1), down(2), life(2, 21))
    assert.strictEqual(tablet(offline, 0).state, "OfflineTablet")
    assert.strictEqual(offline.elections.size, 0, "1, an eligible member, is not back: nothing is asked yet")
    const [back, commands] = ControllerState.step(offline, life(1, 11))
    assert.deepStrictEqual(asked(commands).sort(), [1, 2])
    // 2 lost what it had not flushed: 1's log goes further and 1 leads alone.
    const { state: one } = run(back, logEnd(back, 2, { lastEpoch: 0, logEndOffset: 7 }))
    assert.strictEqual(tablet(one, 0).state, "OfflineTablet", "waits for every candidate")
    const [elected, done] = ControllerState.step(one, logEnd(one, 1, { lastEpoch: 0, logEndOffset: 10 }))
    const t = tablet(elected, 0)
    assert.deepStrictEqual(
      [t.state, t.leaderAndIsr.leader, t.leaderAndIsr.isr, t.eligible],
      ["OnlineTablet", 1, [1], []]
    )
    assert.strictEqual(elected.elections.size, 0)
    assert.deepStrictEqual(tags(done).slice(0, 1), ["Write"])
    assert.isTrue(
      logs(done).some((l) => l.includes("server 1 leads")),
      logs(done).join("\n")
    )
  })

  it("a later epoch beats a longer log; an unanswered question is asked again; a stale round is ignored", () => {
    const { state } = run(pair(), down(1), down(2), life(2, 21), life(1, 11))
    const round = state.elections.get(key(0))!.round
    const [again, retry] = ControllerState.step(state, logEnd(state, 1, null))
    const offline = state.tablets.get(key(0))!
    assert.strictEqual(offline.state, "OfflineTablet")
    assert.deepStrictEqual(retry, [
      {
        _tag: "AskLogEnd",
        server: 1,
        tablet: tid(0),
        round,
        leaderEpoch: offline.leaderAndIsr.leaderEpoch,
        coordinatorEpoch: state.coordinatorEpoch
      }
    ])
    assert.strictEqual(again, state)
    const stale: Input = {
      _tag: "LogEnd",
      tablet: tid(0),
      round: round - 1,
      server: 1,
      logEnd: { lastEpoch: 9, logEndOffset: 99 }
    }
    assert.deepStrictEqual(ControllerState.step(state, stale), [state, []])
    const { state: elected } = run(
      state,
      logEnd(state, 1, { lastEpoch: 0, logEndOffset: 30 }),
      logEnd(state, 2, { lastEpoch: 1, logEndOffset: 12 })
    )
    assert.strictEqual(lai(elected, 0).leader, 2)
  })

  it("a candidate leaving during a recovery stops it; its return starts a new round", () => {
    const { state } = run(pair(), down(1), down(2), life(2, 21), life(1, 11))
    const round = state.elections.get(key(0))!.round
    const { state: gone, commands: left } = run(state, down(1))
    assert.deepStrictEqual(writes(left), [], "the offline tablet keeps its ISR: no write, no leader")
    assert.deepStrictEqual(lai(gone, 0).isr, [2])
    assert.strictEqual(gone.elections.size, 0)
    assert.strictEqual(tablet(gone, 0).state, "OfflineTablet")
    const [back, commands] = ControllerState.step(gone, life(1, 12))
    assert.deepStrictEqual(asked(commands).sort(), [1, 2])
    assert.isAbove(back.elections.get(key(0))!.round, round)
    const late: Input = { _tag: "LogEnd", tablet: tid(0), round, server: 2, logEnd: { lastEpoch: 0, logEndOffset: 1 } }
    assert.deepStrictEqual(ControllerState.step(back, late), [back, []])
  })

  it("largest-log-end: the live ISR members are asked; the furthest leads, one that cannot answer is passed over", () => {
    const { state: asking, commands } = run(bootWith(largest, [1, 2, 3]), create([0, [1, 2, 3]]), down(1))
    assert.deepStrictEqual(asked(commands), [2, 3])
    assert.deepStrictEqual(
      [tablet(asking, 0).state, lai(asking, 0).leader, lai(asking, 0).leaderEpoch],
      ["OfflineTablet", null, 1]
    )
    const { state: elected } = run(
      asking,
      logEnd(asking, 2, { lastEpoch: 0, logEndOffset: 5 }),
      logEnd(asking, 3, { lastEpoch: 0, logEndOffset: 9 })
    )
    assert.deepStrictEqual([lai(elected, 0).leader, lai(elected, 0).leaderEpoch, lai(elected, 0).isr], [3, 2, [2, 3]])
    const { state: passed } = run(asking, logEnd(asking, 3, null), logEnd(asking, 2, { lastEpoch: 0, logEndOffset: 5 }))
    assert.strictEqual(lai(passed, 0).leader, 2)
    // One live ISR member: no question.
    const { state: single, commands: direct } = run(bootWith(largest, [1, 2]), create([0, [1, 2]]), down(1))
    assert.deepStrictEqual([asked(direct), lai(single, 0).leader], [[], 2])
  })
})

describe("ControllerState reassignment", () => {
  type Reply = ControllerState.Reply
  const reassign = (bucket: number, target: ReadonlyArray<Models.ServerId>): Input => ({
    _tag: "Reassign",
    requestId: 8,
    tablet: tid(bucket),
    target
  })
  const cancel = (bucket: number): Input => ({ _tag: "CancelReassign", requestId: 9, tablet: tid(bucket) })
  const refusal = (commands: ReadonlyArray<Command>) => {
    const r: Reply | undefined = reply(commands)
    return r?._tag === "ReassignRefused" ? r.refusal._tag : r?._tag
  }
  const stops = (commands: ReadonlyArray<Command>) =>
    commands.flatMap((c) => (c._tag === "StopReplica" ? [[c.server, c.tablets.map((t) => t.bucket)] as const] : []))
  /** Five live servers and tablet 0 on [1,2,3], every replica in sync. */
  const moving = (target: ReadonlyArray<Models.ServerId>) =>
    run(boot([1, 2, 3, 4, 5]), create([0, [1, 2, 3]]), reassign(0, target))

  it("a move adds its replicas as followers under the next epoch; the ISR and leader stay until every target is in sync", () => {
    const { state, commands } = moving([1, 4, 5])
    const t = tablet(state, 0)
    assert.deepStrictEqual(t.replicas, [1, 4, 5, 2, 3])
    assert.deepStrictEqual(t.reassignment, { original: [1, 2, 3], target: [1, 4, 5] })
    assert.deepStrictEqual([t.leaderAndIsr.leader, t.leaderAndIsr.leaderEpoch, t.leaderAndIsr.isr], [1, 1, [1, 2, 3]])
    assert.deepStrictEqual(writes(commands), [{ bucket: 0, expected: 0 }])
    assert.deepStrictEqual(sent(commands), { 1: [0], 2: [0], 3: [0], 4: [0], 5: [0] })
    assert.strictEqual(reply(commands)?._tag, "Reassigning")
    // Server 4 catches up: the move waits for server 5.
    const { state: one, commands: c1 } = run(state, adjust(state, 0, [1, 2, 3, 4]))
    assert.deepStrictEqual(tablet(one, 0).reassignment?.target, [1, 4, 5])
    assert.deepStrictEqual(tags(c1), ["Write", "Reply"])
    // Server 5 too: one write makes the target the replicas, its ISR the target's; 2 and 3 delete their replicas.
    const { state: done, commands: c2 } = run(one, adjust(one, 0, [1, 2, 3, 4, 5]))
    const d = tablet(done, 0)
    assert.deepStrictEqual([d.replicas, d.reassignment, d.retired], [[1, 4, 5], undefined, [2, 3]])
    assert.deepStrictEqual([d.leaderAndIsr.leader, d.leaderAndIsr.leaderEpoch, d.leaderAndIsr.isr], [1, 2, [1, 4, 5]])
    assert.deepStrictEqual(writes(c2), [{ bucket: 0, expected: 2 }])
    assert.deepStrictEqual(sent(c2), { 1: [0], 4: [0], 5: [0] })
    assert.deepStrictEqual(stops(c2), [
      [2, [0]],
      [3, [0]]
    ])
    assert.strictEqual(reply(c2)?._tag, "IsrAdjusted")
    // Each retired replica's answer takes it off the list.
    const { state: cleaned } = run(done, stopped(2, [0]), stopped(3, [0]))
    assert.strictEqual(tablet(cleaned, 0).retired, undefined)
  })

  it("a leader that leaves hands over to the first target replica in the ISR, in the move's last write", () => {
    const { state } = moving([4, 5, 2])
    const { state: done } = run(state, adjust(state, 0, [1, 2, 3, 4, 5]))
    const d = tablet(done, 0)
    assert.deepStrictEqual(
      [d.replicas, d.leaderAndIsr.leader, d.leaderAndIsr.isr, d.retired],
      [[4, 5, 2], 4, [2, 4, 5], [1, 3]]
    )
  })

  it("a repeat is answered without a write; a move to the replicas the tablet has, or in another order, needs no copy", () => {
    const { state } = moving([1, 4, 5])
    const { state: same, commands } = run(state, reassign(0, [1, 4, 5]))
    assert.strictEqual(same, state)
    assert.deepStrictEqual(tags(commands), ["Reply"])
    const { state: reordered, commands: c2 } = run(boot([1, 2, 3]), create([0, [1, 2, 3]]), reassign(0, [3, 1, 2]))
    assert.deepStrictEqual([tablet(reordered, 0).replicas, tablet(reordered, 0).reassignment], [[3, 1, 2], undefined])
    assert.deepStrictEqual(writes(c2), [{ bucket: 0, expected: 0 }])
  })

  it("refusals name what was wrong and change nothing", () => {
    const base = run(
      boot([1, 2, 3, 4, 5]),
      create([0, [1, 2, 3]]),
      create([1, [1, 2, 3]]),
      shutdown(5),
      { _tag: "ServerUp", server: 9, registration: 3 },
      down(9)
    ).state
    const min2 = run(
      bootWith({ uncleanLeaderElection: false, minInsyncReplicas: 2 }, [1, 2, 3]),
      create([0, [1, 2, 3]])
    ).state
    const cases: ReadonlyArray<readonly [State, Input, string]> = [
      [base, reassign(7, [1, 2, 3]), "UnknownTablet"],
      [base, reassign(0, []), "EmptyTarget"],
      [base, reassign(0, [1, 4, 4]), "DuplicateServer"],
      [base, reassign(0, [1, 4, 42]), "UnknownServer"],
      [base, reassign(0, [1, 4, 9]), "DeadServer"],
      [base, reassign(0, [1, 4, 5]), "ShuttingDown"],
      [min2, reassign(0, [3]), "ReplicationFactor"],
      [run(base, reassign(0, [1, 2, 4])).state, reassign(0, [1, 3, 4]), "AlreadyMoving"],
      [base, cancel(0), "NotMoving"],
      [run(base, deleteTablets(1)).state, reassign(1, [1, 2, 4]), "TabletDeleting"],
      [run(base, down(1), down(2), down(3)).state, reassign(0, [4]), "TabletOffline"]
    ]
    for (const [state, input, expected] of cases) {
      const { state: after, commands } = run(state, input)
      assert.strictEqual(refusal(commands), expected, JSON.stringify(input))
      assert.strictEqual(after, state)
      const r = reply(commands)
      assert.isTrue(r?._tag === "ReassignRefused" && r.detail.includes("orders/"), JSON.stringify(r))
    }
  })

  it("a cancel returns the tablet to its original replicas; the adding ones delete theirs", () => {
    const { state } = moving([1, 4, 5])
    const { state: one } = run(state, adjust(state, 0, [1, 2, 3, 4]))
    const { state: back, commands } = run(one, cancel(0))
    const t = tablet(back, 0)
    assert.deepStrictEqual([t.replicas, t.reassignment, t.retired], [[1, 2, 3], undefined, [4, 5]])
    assert.deepStrictEqual([t.leaderAndIsr.leader, t.leaderAndIsr.leaderEpoch, t.leaderAndIsr.isr], [1, 2, [1, 2, 3]])
    assert.deepStrictEqual(sent(commands), { 1: [0], 2: [0], 3: [0] })
    assert.deepStrictEqual(stops(commands), [
      [4, [0]],
      [5, [0]]
    ])
    assert.strictEqual(reply(commands)?._tag, "ReassignCancelled")
  })

  it("a cancel moves leadership back when an adding replica leads; with no original replica in sync it is refused", () => {
    const { state } = moving([4, 5, 6].filter((s) => s <= 5).concat([2]))
    // Target [4,5,2]: 4 joins, the leader and 3 die: 2 leads (first in ISR in assignment order is 4).
    const { state: led } = run(state, adjust(state, 0, [1, 2, 3, 4]), down(1))
    assert.strictEqual(lai(led, 0).leader, 4)
    const { state: back } = run(led, cancel(0))
    assert.deepStrictEqual([tablet(back, 0).replicas, lai(back, 0).leader, lai(back, 0).isr], [[1, 2, 3], 2, [2, 3]])
    const { state: alone, commands } = run(led, down(2), down(3), cancel(0))
    assert.strictEqual(refusal(commands), "NoOriginalInSync")
    assert.strictEqual(tablet(alone, 0).reassignment?.target.join(","), "4,5,2")
  })

  it("a cancel that would drop an in-sync adding replica, fewer than minInsyncReplicas originals in sync, is refused", () => {
    const booted = bootWith({ uncleanLeaderElection: false, minInsyncReplicas: 3 }, [1, 2, 3, 4, 5])
    const { state } = run(booted, create([0, [1, 2, 3]]), reassign(0, [1, 4, 5]))
    // Server 4 joins the ISR (the move waits for 5): every original is in sync, so a cancel may drop 4.
    const { state: joined } = run(state, adjust(state, 0, [1, 2, 3, 4]))
    assert.strictEqual(reply(run(joined, cancel(0)).commands)?._tag, "ReassignCancelled")
    // Server 3 leaves the ISR: records acknowledged since are on 1, 2 and 4 only; dropping 4 would leave two copies.
    const { state: shrunk } = run(joined, adjust(joined, 0, [1, 2, 4]))
    const { state: after, commands } = run(shrunk, cancel(0))
    assert.strictEqual(refusal(commands), "OriginalUnderMinIsr")
    assert.strictEqual(after, shrunk)
    const r = reply(commands)
    assert.isTrue(r?._tag === "ReassignRefused" && r.detail.includes("let the move finish"), JSON.stringify(r))
  })

  it("a controller that takes over finishes a move that is ready, and waits on one that is not", () => {
    const { state } = moving([1, 4, 5])
    const { state: ready } = run(state, adjust(state, 0, [1, 2, 3, 4]))
    const stored = tablet(ready, 0)
    const halfway = ControllerState.step(
      ControllerState.make({ uncleanLeaderElection: false }),
      started(2, [1, 2, 3, 4, 5], [stored])
    )
    assert.deepStrictEqual(halfway[0].tablets.get(key(0))?.reassignment?.target, [1, 4, 5])
    const all: ControllerState.Tablet = { ...stored, leaderAndIsr: { ...stored.leaderAndIsr, isr: [1, 2, 3, 4, 5] } }
    const [next, commands] = ControllerState.step(
      ControllerState.make({ uncleanLeaderElection: false }),
      started(2, [1, 2, 3, 4, 5], [all])
    )
    const t = next.tablets.get(key(0))!
    assert.deepStrictEqual(
      [t.replicas, t.leaderAndIsr.isr, t.retired],
      [
        [1, 4, 5],
        [1, 4, 5],
        [2, 3]
      ]
    )
    assert.deepStrictEqual(stops(commands), [
      [2, [0]],
      [3, [0]]
    ])
  })

  it("a replica whose storage failed, retired and deleted, may be given again and join the ISR (simulator seed 952)", () => {
    const failed: Input = {
      _tag: "ReplicaStorage",
      server: 2,
      registration: 2,
      tablets: [tid(0)],
      failed: true,
      sequence: 1
    }
    const lives = (s: Models.ServerId): Input => ({ _tag: "ServerUp", server: s, registration: s })
    const { state } = run(
      ControllerState.make({ uncleanLeaderElection: false }),
      started(1, []),
      lives(1),
      lives(2),
      lives(3),
      create([0, [3, 2]]),
      failed,
      reassign(0, [3, 1])
    )
    const { state: moved } = run(state, adjust(state, 0, [3, 1]))
    assert.deepStrictEqual(tablet(moved, 0).retired, [2])
    // A late copy of a failure report, newer than any taken, arriving after the replica was deleted (seed 946).
    const { state: back } = run(moved, stopped(2, [0], 2), { ...failed, sequence: 2 }, reassign(0, [3, 2]))
    const { state: joined, commands } = run(back, adjust(back, 0, [3, 1, 2]))
    assert.strictEqual(reply(commands)?._tag, "IsrAdjusted")
    assert.deepStrictEqual(
      [tablet(joined, 0).replicas, lai(joined, 0).isr],
      [
        [3, 2],
        [3, 2]
      ]
    )
  })

  it("a retired replica on a server that is down is deleted when it is back; deleting a moving tablet deletes every replica", () => {
    const { state } = moving([1, 4, 5])
    const { state: without3 } = run(state, down(3))
    const { state: done } = run(without3, adjust(without3, 0, [1, 2, 4, 5]))
    assert.deepStrictEqual(tablet(done, 0).retired, [2, 3])
    const { commands } = run(done, { _tag: "ServerUp", server: 3, registration: 77 })
    assert.deepStrictEqual(stops(commands), [[3, [0]]])
    const { state: gone } = run(state, deleteTablets(0))
    const g = tablet(gone, 0)
    assert.deepStrictEqual([g.state, g.replicas, g.reassignment], ["DeletingTablet", [1, 4, 5, 2, 3], undefined])
  })
})

describe("ControllerState replication throttle of a move", () => {
  const reassign = (bucket: number, target: ReadonlyArray<Models.ServerId>, throttleBytesPerSec?: number): Input => ({
    _tag: "Reassign",
    requestId: 8,
    tablet: tid(bucket),
    target,
    ...(throttleBytesPerSec === undefined ? {} : { throttleBytesPerSec })
  })
  /** The throttle each instruction sent carries, by `server/bucket` (`null`: none). */
  const throttles = (commands: ReadonlyArray<Command>) => {
    const by: Record<string, number | null> = {}
    for (const c of commands) {
      if (c._tag !== "Send") continue
      for (const t of c.tablets) by[`${c.server}/${t.tablet.bucket}`] = t.throttleBytesPerSec ?? null
    }
    return by
  }
  const refusal = (commands: ReadonlyArray<Command>) => {
    const r = reply(commands)
    return r?._tag === "ReassignRefused" ? r.refusal._tag : r?._tag
  }
  /** Five live servers, tablet 0 on [1,2,3] moving to `target` under `throttle`, tablet 1 on [1,4,5] in sync. */
  const moving = (target: ReadonlyArray<Models.ServerId>, throttle?: number) =>
    run(boot([1, 2, 3, 4, 5]), create([0, [1, 2, 3]], [1, [1, 4, 5]]), reassign(0, target, throttle))

  it("the move stores its throttle; the instructions of its adding replicas carry it, no other instruction does", () => {
    const { state, commands } = moving([1, 4, 5], 1_000)
    assert.deepStrictEqual(tablet(state, 0).reassignment, {
      original: [1, 2, 3],
      target: [1, 4, 5],
      throttleBytesPerSec: 1_000
    })
    assert.deepStrictEqual(throttles(commands), { "1/0": null, "2/0": null, "3/0": null, "4/0": 1_000, "5/0": 1_000 })
    const r = reply(commands)
    assert.strictEqual(r?._tag === "Reassigning" ? r.tablet.reassignment?.throttleBytesPerSec : undefined, 1_000)
    // Server 4 comes back: it hears both its tablets, the throttle on the moving one only.
    const { commands: back } = run(state, down(4), up(4))
    assert.deepStrictEqual(Object.fromEntries(Object.entries(throttles(back)).filter(([k]) => k.startsWith("4/"))), {
      "4/0": 1_000,
      "4/1": null
    })
    // A leader that leaves is not throttled (it does not fetch): 4 and 5 are.
    const { commands: leaving } = moving([4, 5, 2], 2_000)
    assert.deepStrictEqual(throttles(leaving), { "1/0": null, "2/0": null, "3/0": null, "4/0": 2_000, "5/0": 2_000 })
    // Without a throttle no instruction carries one.
    const { state: free, commands: unthrottled } = moving([1, 4, 5])
    assert.isTrue(Object.values(throttles(unthrottled)).every((t) => t === null))
    assert.deepStrictEqual(tablet(free, 0).reassignment, { original: [1, 2, 3], target: [1, 4, 5] })
  })

  it("the throttle ends with the move, finished or cancelled: the next instructions carry none", () => {
    const { state } = moving([1, 4, 5], 1_000)
    const { state: one } = run(state, adjust(state, 0, [1, 2, 3, 4]))
    assert.strictEqual(tablet(one, 0).reassignment?.throttleBytesPerSec, 1_000)
    const { state: done, commands } = run(one, adjust(one, 0, [1, 2, 3, 4, 5]))
    assert.isUndefined(tablet(done, 0).reassignment)
    assert.deepStrictEqual(throttles(commands), { "1/0": null, "4/0": null, "5/0": null })
    const { state: back, commands: cancelled } = run(state, { _tag: "CancelReassign", requestId: 9, tablet: tid(0) })
    assert.isUndefined(tablet(back, 0).reassignment)
    assert.deepStrictEqual(throttles(cancelled), { "1/0": null, "2/0": null, "3/0": null })
  })

  it("a repeat naming another throttle, or none, makes it the move's under the same leader epoch; the same one writes nothing", () => {
    const { state } = moving([1, 4, 5], 1_000)
    const same = run(state, reassign(0, [1, 4, 5], 1_000))
    assert.strictEqual(same.state, state)
    assert.deepStrictEqual(tags(same.commands), ["Reply"])
    const faster = run(state, reassign(0, [1, 4, 5], 5_000))
    const t = tablet(faster.state, 0)
    assert.strictEqual(t.reassignment?.throttleBytesPerSec, 5_000)
    assert.strictEqual(t.leaderAndIsr.leaderEpoch, lai(state, 0).leaderEpoch)
    assert.deepStrictEqual(writes(faster.commands), [{ bucket: 0, expected: lai(state, 0).version }])
    assert.deepStrictEqual(throttles(faster.commands), {
      "1/0": null,
      "2/0": null,
      "3/0": null,
      "4/0": 5_000,
      "5/0": 5_000
    })
    const r = reply(faster.commands)
    assert.strictEqual(r?._tag === "Reassigning" ? r.tablet.reassignment?.throttleBytesPerSec : undefined, 5_000)
    const lifted = run(faster.state, reassign(0, [1, 4, 5]))
    assert.deepStrictEqual(tablet(lifted.state, 0).reassignment, { original: [1, 2, 3], target: [1, 4, 5] })
    assert.isTrue(Object.values(throttles(lifted.commands)).every((x) => x === null))
    // Another target is still refused, whatever the throttle.
    assert.strictEqual(refusal(run(state, reassign(0, [1, 4, 2], 5_000)).commands), "AlreadyMoving")
  })

  it("a throttle that is not a whole number of bytes a second ≥ 1 is refused, naming it", () => {
    const base = run(boot([1, 2, 3, 4, 5]), create([0, [1, 2, 3]])).state
    for (const bad of [0, -5, 1.5, Number.NaN]) {
      const { state, commands } = run(base, reassign(0, [1, 4, 5], bad))
      assert.strictEqual(state, base)
      assert.strictEqual(refusal(commands), "InvalidThrottle", String(bad))
    }
  })

  it("a resuming controller tells an adding replica whose holding names another throttle than the move's", () => {
    const { state } = moving([1, 4, 5], 1_000)
    const t = tablet(state, 0)
    const holding = (throttleBytesPerSec?: number): Input => ({
      _tag: "Holdings",
      server: 4,
      holdings: [
        {
          tablet: tid(0),
          leaderEpoch: t.leaderAndIsr.leaderEpoch,
          version: t.leaderAndIsr.version,
          ...(throttleBytesPerSec === undefined ? {} : { throttleBytesPerSec })
        },
        { tablet: tid(1), leaderEpoch: lai(state, 1).leaderEpoch, version: lai(state, 1).version }
      ]
    })
    assert.deepStrictEqual(run(state, holding(1_000)).commands, [])
    assert.deepStrictEqual(throttles(run(state, holding()).commands), { "4/0": 1_000 })
    assert.deepStrictEqual(throttles(run(state, holding(9)).commands), { "4/0": 1_000 })
    // Once the move is over, a replica still throttled is told so too.
    const { state: done } = run(state, adjust(state, 0, [1, 2, 3, 4, 5]))
    const over: Input = {
      _tag: "Holdings",
      server: 4,
      holdings: [
        {
          tablet: tid(0),
          leaderEpoch: lai(done, 0).leaderEpoch,
          version: lai(done, 0).version,
          throttleBytesPerSec: 1_000
        }
      ]
    }
    assert.deepStrictEqual(throttles(run(done, over).commands), { "4/0": null, "4/1": null })
  })
})

describe("ControllerState preferred leader election of named tablets", () => {
  // Threshold 100%: the imbalance alone moves nothing.
  const boot = (tablets: ReadonlyArray<ControllerState.Tablet>) =>
    ControllerState.step(
      ControllerState.make({ uncleanLeaderElection: false, leaderImbalancePercent: 100 }),
      started(2, [1, 2, 3], tablets, [
        [1, 11],
        [2, 12],
        [3, 13]
      ])
    )[0]
  const elect = (...buckets: ReadonlyArray<number>): Input => ({
    _tag: "BalanceLeaders",
    requestId: 8,
    tablets: buckets.map(tid)
  })
  const tablets = [
    stored(0, [1, 2, 3], 2, [2, 3, 1]), // named: 1 leads
    stored(1, [1, 2, 3], 2, [2, 3, 1]), // not named: stays
    stored(2, [1, 2, 3], 2, [2, 3]), // named, 1 not in the ISR: stays
    stored(3, [3, 1, 2], 3, [3, 1, 2]) // named, led by its preferred replica already
  ]

  it("each named tablet's preferred replica leads whatever the imbalance; the others, unknown ones and led ones are passed over", () => {
    const state = boot(tablets)
    assert.deepStrictEqual(reply(run(state, { _tag: "BalanceLeaders", requestId: 8 }).commands), {
      _tag: "LeadersBalanced",
      moved: 0
    })
    const { state: after, commands } = run(state, elect(0, 2, 3, 9, 0))
    assert.deepStrictEqual(lai(after, 0), {
      leader: 1,
      leaderEpoch: 5,
      isr: [2, 3, 1],
      coordinatorEpoch: 2,
      version: 4
    })
    for (const b of [1, 2, 3]) assert.strictEqual(tablet(after, b), tablet(state, b), `t${b} untouched`)
    assert.deepStrictEqual(writes(commands), [{ bucket: 0, expected: 3 }])
    assert.deepStrictEqual(sent(commands, 2), { 1: [0], 2: [0], 3: [0] })
    assert.deepStrictEqual(reply(commands), { _tag: "LeadersBalanced", moved: 1 })
    assert.deepStrictEqual(reply(run(after, elect(0)).commands), { _tag: "LeadersBalanced", moved: 0 })
    assert.deepStrictEqual(reply(run(state, elect()).commands), { _tag: "LeadersBalanced", moved: 0 })
  })

  it("a preferred replica restarted, stopping, whose storage failed, or of an offline tablet or one electing does not lead", () => {
    const restarted = run(boot(tablets), down(1), { _tag: "ServerUp", server: 1, registration: 99 }, elect(0))
    assert.deepStrictEqual(reply(restarted.commands), { _tag: "LeadersBalanced", moved: 0 })
    assert.strictEqual(lai(restarted.state, 0).leader, 2)
    const stopping = run(boot(tablets), shutdown(1), elect(0))
    assert.deepStrictEqual(reply(stopping.commands), { _tag: "LeadersBalanced", moved: 0 })
    const failed: Input = { _tag: "ReplicaStorage", server: 1, tablets: [tid(0)], failed: true }
    assert.deepStrictEqual(reply(run(boot(tablets), failed, elect(0)).commands), { _tag: "LeadersBalanced", moved: 0 })
    const offline = run(boot([stored(0, [1, 2], 2, [2])]), down(2), up(1), elect(0))
    assert.strictEqual(tablet(offline.state, 0).state, "OfflineTablet")
    assert.deepStrictEqual(reply(offline.commands), { _tag: "LeadersBalanced", moved: 0 })
    const electing = ControllerState.step(
      ControllerState.make({ uncleanLeaderElection: false, leaderElection: "largest-log-end" }),
      started(
        2,
        [1, 2, 3],
        [stored(0, [1, 2, 3], 2, [2, 3, 1])],
        [
          [1, 11],
          [2, 12],
          [3, 13]
        ]
      )
    )[0]
    const asking = run(electing, down(2))
    assert.isTrue(asking.state.elections.has(key(0)))
    assert.deepStrictEqual(reply(run(asking.state, elect(0)).commands), { _tag: "LeadersBalanced", moved: 0 })
  })
})

describe("ControllerState retention of a table", () => {
  const week = { ms: 604_800_000, bytes: 1_073_741_824 }
  /** `create`, each tablet with `retention`. */
  const createRetained = (
    retention: ControllerState.Tablet["retention"],
    ...specs: ReadonlyArray<readonly [number, ReadonlyArray<Models.ServerId>]>
  ): Input => {
    const c = create(...specs)
    return { ...c, tablets: c.tablets.map((t) => ({ ...t, retention })) }
  }
  /** The retention each instruction sent carries, by `server/bucket` (`null`: none). */
  const retentions = (commands: ReadonlyArray<Command>) => {
    const by: Record<string, ControllerState.Tablet["retention"] | null> = {}
    for (const c of commands) {
      if (c._tag !== "Send") continue
      for (const t of c.tablets) by[`${c.server}/${t.tablet.bucket}`] = t.retention ?? null
    }
    return by
  }
  const written = (commands: ReadonlyArray<Command>) =>
    commands.flatMap((c) => (c._tag === "Write" ? [c.tablet.retention ?? null] : []))
  /** Five live servers; tablet 0 on [1,2,3] kept a week or a GiB, tablet 1 on [1,4,5] without retention. */
  const base = () => run(boot([1, 2, 3, 4, 5]), createRetained(week, [0, [1, 2, 3]]), create([1, [1, 4, 5]]))

  it("the retention given at create is stored, written and in every instruction of the tablet's replicas", () => {
    const { state, commands } = run(boot([1, 2, 3]), createRetained(week, [0, [1, 2, 3]], [1, [2, 3]]))
    assert.deepStrictEqual(tablet(state, 0).retention, week)
    assert.deepStrictEqual(written(commands), [week, week])
    assert.deepStrictEqual(retentions(commands), { "1/0": week, "2/0": week, "3/0": week, "2/1": week, "3/1": week })
    const r = reply(commands)
    assert.deepStrictEqual(r?._tag === "Created" ? r.tablets.map((t) => t.retention) : undefined, [week, week])
    // One limit only: the other is not there.
    const time = run(boot([1]), createRetained({ ms: 1_000 }, [0, [1]]))
    assert.deepStrictEqual(tablet(time.state, 0).retention, { ms: 1_000 })
    assert.deepStrictEqual(retentions(time.commands), { "1/0": { ms: 1_000 } })
    // None given, or one naming no limit: no retention anywhere.
    for (const none of [undefined, {}]) {
      const plain = run(boot([1, 2]), createRetained(none, [0, [1, 2]]))
      assert.isFalse("retention" in tablet(plain.state, 0))
      assert.deepStrictEqual(retentions(plain.commands), { "1/0": null, "2/0": null })
    }
  })

  it("every later instruction carries it: a new leader, a server back, a leader balanced back, storage working again", () => {
    const { state } = base()
    const leaderGone = run(state, down(1))
    assert.deepStrictEqual(retentions(leaderGone.commands), {
      "2/0": week,
      "3/0": week,
      "4/1": null,
      "5/1": null
    })
    const back = run(leaderGone.state, up(1))
    assert.deepStrictEqual(retentions(back.commands), { "1/0": week, "1/1": null })
    const balanced = run(back.state, adjust(back.state, 0, [2, 3, 1]), { _tag: "BalanceLeaders", requestId: 4 })
    assert.strictEqual(lai(balanced.state, 0).leader, 1)
    assert.deepStrictEqual(retentions(balanced.commands), { "1/0": week, "2/0": week, "3/0": week })
    const healed = run(
      state,
      { _tag: "ReplicaStorage", server: 2, tablets: [tid(0)], failed: true },
      { _tag: "ReplicaStorage", server: 2, tablets: [tid(0)], failed: false }
    )
    assert.deepStrictEqual(retentions(healed.commands), { "1/0": week, "2/0": week, "3/0": week })
    assert.deepStrictEqual(tablet(healed.state, 0).retention, week)
  })

  it("survives a move: the adding replicas' instructions carry it, and the tablet keeps it once moved or cancelled", () => {
    const { state } = base()
    const reassign: Input = { _tag: "Reassign", requestId: 8, tablet: tid(0), target: [1, 4, 5] }
    const moving = run(state, reassign)
    assert.deepStrictEqual(written(moving.commands), [week])
    assert.deepStrictEqual(retentions(moving.commands), {
      "1/0": week,
      "2/0": week,
      "3/0": week,
      "4/0": week,
      "5/0": week
    })
    const r = reply(moving.commands)
    assert.deepStrictEqual(r?._tag === "Reassigning" ? r.tablet.retention : undefined, week)
    const done = run(moving.state, adjust(moving.state, 0, [1, 2, 3, 4, 5]))
    assert.deepStrictEqual(tablet(done.state, 0).replicas, [1, 4, 5])
    assert.deepStrictEqual(tablet(done.state, 0).retention, week)
    assert.deepStrictEqual(retentions(done.commands), { "1/0": week, "4/0": week, "5/0": week })
    const cancelled = run(moving.state, { _tag: "CancelReassign", requestId: 9, tablet: tid(0) })
    assert.deepStrictEqual(tablet(cancelled.state, 0).retention, week)
    assert.deepStrictEqual(retentions(cancelled.commands), { "1/0": week, "2/0": week, "3/0": week })
    // The tablet without retention moves without one.
    const plain = run(state, { _tag: "Reassign", requestId: 8, tablet: tid(1), target: [1, 2, 3] })
    assert.isTrue(Object.values(retentions(plain.commands)).every((x) => x === null))
  })

  it("is kept while the tablet is deleted, and through a controller failover: the new one's instructions carry it", () => {
    const { state } = base()
    const deleting = run(state, deleteTablets(0))
    assert.deepStrictEqual(written(deleting.commands), [week])
    assert.strictEqual(tablet(deleting.state, 0).state, "DeletingTablet")
    assert.deepStrictEqual(tablet(deleting.state, 0).retention, week)
    // A new controller resumes from the tablets as they were written (coordination's copy): server 1 is gone, so
    // tablet 0 gets a new leader; a server whose holdings miss tablet 0 is told it again.
    const resumed = ControllerState.step(
      ControllerState.make({ uncleanLeaderElection: false }),
      started(2, [2, 3, 4, 5], [...state.tablets.values()])
    )
    assert.deepStrictEqual(tablet(resumed[0], 0).retention, week)
    assert.deepStrictEqual(retentions(resumed[1]), { "2/0": week, "3/0": week, "4/1": null, "5/1": null })
    const told = ControllerState.step(resumed[0], { _tag: "Holdings", server: 3, holdings: [] })
    assert.deepStrictEqual(retentions(told[1]), { "3/0": week })
  })

  it("a retention that is not a whole number ≥ 1 is refused, naming it; nothing is created", () => {
    const booted = boot([1, 2, 3])
    for (const [bad, named] of [
      [{ ms: 0 }, "retention.ms"],
      [{ ms: 1.5 }, "retention.ms"],
      [{ ms: 1_000, bytes: -1 }, "retention.bytes"],
      [{ bytes: Number.NaN }, "retention.bytes"]
    ] as const) {
      const { state, commands } = run(booted, createRetained(bad, [0, [1, 2, 3]]))
      assert.strictEqual(state, booted)
      const r = reply(commands)
      assert.strictEqual(r?._tag, "CreateRefused")
      assert.include(r?._tag === "CreateRefused" ? r.detail : "", `${key(0)}: ${named} must be a whole number ≥ 1`)
    }
  })
})
