import { prng } from "../../../scripts/test-support/prng.js"
import { assert, describe, it } from "@effect/vitest"
import { IllegalStateTransition } from "@strata/core"
import { Result } from "effect"
import {
  Command,
  type Command as CommandT,
  describeState,
  initial,
  Input,
  type Input as InputT,
  inputTags,
  type State,
  type Step,
  step
} from "../src/CoordinatorLifecycle.js"

const id = 1

const states = {
  unstarted: initial(id),
  standby: { _tag: "Standby", serverId: id, started: true, lastEpoch: null },
  standby5: { _tag: "Standby", serverId: id, started: true, lastEpoch: 5 },
  electing: { _tag: "Electing", serverId: id, lastEpoch: null },
  electing5: { _tag: "Electing", serverId: id, lastEpoch: 5 },
  leaderInit: { _tag: "Leader", serverId: id, epoch: 3, phase: "Initialising" },
  leaderReady: { _tag: "Leader", serverId: id, epoch: 3, phase: "Ready" },
  down: { _tag: "Down", serverId: id }
} as const satisfies Record<string, State>
type StateName = keyof typeof states

const inputs = {
  Start: Input.Start,
  Campaign: Input.Campaign,
  Elected3: Input.Elected(3),
  Elected7: Input.Elected(7),
  NotLowest: Input.NotLowest,
  Fenced2: Input.Fenced(2),
  Fenced3: Input.Fenced(3),
  Fenced9: Input.Fenced(9),
  Ready: Input.LeaderServicesReady,
  Failed: Input.LeaderServicesFailed("boom"),
  SessionLost: Input.SessionLost,
  Resign: Input.Resign,
  Close: Input.Close,
  Suspended: Input.ConnectionSuspended,
  Restored: Input.ConnectionRestored
} as const satisfies Record<string, InputT>
type InputName = keyof typeof inputs

const standbyAt = (lastEpoch: number | null): State => ({ _tag: "Standby", serverId: id, started: true, lastEpoch })
const leader = (epoch: number, phase: "Initialising" | "Ready"): State => ({
  _tag: "Leader",
  serverId: id,
  epoch,
  phase
})
const down: State = { _tag: "Down", serverId: id }
const log = Command.Log
const closed = log("coordinator closed")
const becameLeader = (epoch: number): ReadonlyArray<CommandT> => [
  log(`Became coordinator leader with epoch ${epoch}`),
  Command.AcquireLeaderResources(epoch)
]

type Expected = readonly [State, ReadonlyArray<CommandT>]
const blips = (s: StateName): Partial<Record<InputName, Expected>> => ({
  Suspended: [states[s], []],
  Restored: [states[s], []]
})

/** The complete list of allowed (state, input) pairs with the expected outcome. */
const allowed: Record<StateName, Partial<Record<InputName, Expected>>> = {
  unstarted: {
    Start: [states.standby, [Command.RegisterStandby, log("standby start")]],
    Close: [down, [closed]],
    ...blips("unstarted")
  },
  standby: {
    Campaign: [states.electing, [Command.CreateCandidate, log("candidate node created")]],
    Close: [down, [closed]],
    SessionLost: [states.standby, [log("session expired, registering as standby again"), Command.RegisterStandby]],
    ...blips("standby")
  },
  standby5: {
    Campaign: [states.electing5, [Command.CreateCandidate, log("candidate node created")]],
    Close: [down, [closed]],
    SessionLost: [states.standby5, [log("session expired, registering as standby again"), Command.RegisterStandby]],
    ...blips("standby5")
  },
  electing: {
    Elected3: [leader(3, "Initialising"), becameLeader(3)],
    Elected7: [leader(7, "Initialising"), becameLeader(7)],
    NotLowest: [standbyAt(null), [log("not the lowest candidate, standing by")]],
    Fenced2: [standbyAt(2), [log("fenced by coordinator epoch 2, standing by")]],
    Fenced3: [standbyAt(3), [log("fenced by coordinator epoch 3, standing by")]],
    Fenced9: [standbyAt(9), [log("fenced by coordinator epoch 9, standing by")]],
    SessionLost: [
      standbyAt(null),
      [log("session expired while electing, rejoining"), Command.RegisterStandby, Command.RejoinElection]
    ],
    Close: [down, [closed]],
    ...blips("electing")
  },
  electing5: {
    Elected7: [leader(7, "Initialising"), becameLeader(7)],
    NotLowest: [standbyAt(5), [log("not the lowest candidate, standing by")]],
    Fenced2: [standbyAt(5), [log("fenced by coordinator epoch 2, standing by")]],
    Fenced3: [standbyAt(5), [log("fenced by coordinator epoch 3, standing by")]],
    Fenced9: [standbyAt(9), [log("fenced by coordinator epoch 9, standing by")]],
    SessionLost: [
      standbyAt(5),
      [log("session expired while electing, rejoining"), Command.RegisterStandby, Command.RejoinElection]
    ],
    Close: [down, [closed]],
    ...blips("electing5")
  },
  leaderInit: {
    Ready: [leader(3, "Ready"), [log("leader services started")]],
    Failed: [
      standbyAt(3),
      [log("leader services failed to start: boom"), Command.ReleaseLeaderResources, Command.RejoinElection]
    ],
    SessionLost: [
      standbyAt(3),
      [
        log("coordinator leadership with epoch 3 lost: session expired"),
        Command.ReleaseLeaderResources,
        Command.RegisterStandby,
        Command.RejoinElection
      ]
    ],
    Resign: [standbyAt(3), [log("resigned coordinator leadership with epoch 3"), Command.ReleaseLeaderResources]],
    Fenced3: [
      standbyAt(3),
      [log("coordinator epoch 3 fenced by epoch 3"), Command.ReleaseLeaderResources, Command.RejoinElection]
    ],
    Fenced9: [
      standbyAt(9),
      [log("coordinator epoch 3 fenced by epoch 9"), Command.ReleaseLeaderResources, Command.RejoinElection]
    ],
    Close: [down, [Command.ReleaseLeaderResources, closed]],
    Suspended: [states.leaderInit, [log("connection suspended, leading on with epoch 3 until the session expires")]],
    Restored: [states.leaderInit, [log("connection restored, still leader with epoch 3")]]
  },
  leaderReady: {
    SessionLost: [
      standbyAt(3),
      [
        log("coordinator leadership with epoch 3 lost: session expired"),
        Command.ReleaseLeaderResources,
        Command.RegisterStandby,
        Command.RejoinElection
      ]
    ],
    Resign: [standbyAt(3), [log("resigned coordinator leadership with epoch 3"), Command.ReleaseLeaderResources]],
    Fenced3: [
      standbyAt(3),
      [log("coordinator epoch 3 fenced by epoch 3"), Command.ReleaseLeaderResources, Command.RejoinElection]
    ],
    Fenced9: [
      standbyAt(9),
      [log("coordinator epoch 3 fenced by epoch 9"), Command.ReleaseLeaderResources, Command.RejoinElection]
    ],
    Close: [down, [Command.ReleaseLeaderResources, closed]],
    Suspended: [states.leaderReady, [log("connection suspended, leading on with epoch 3 until the session expires")]],
    Restored: [states.leaderReady, [log("connection restored, still leader with epoch 3")]]
  },
  down: {}
}

const stateNames = Object.keys(states) as Array<StateName>
const inputNames = Object.keys(inputs) as Array<InputName>
const pairs = stateNames.flatMap((s) => inputNames.map((i) => [s, i] as const))

describe("CoordinatorLifecycle.step", () => {
  it("the sample inputs cover every input tag", () => {
    const covered = new Set(Object.values(inputs).map((i) => i._tag))
    assert.deepStrictEqual([...covered].sort(), [...inputTags].sort())
  })

  describe("allowed transitions", () => {
    const allowedPairs = pairs.filter(([s, i]) => allowed[s][i] !== undefined)
    it.each(allowedPairs)("%s --%s--> expected state and commands", (s, i) => {
      const result = step(states[s], inputs[i])
      assert.isTrue(Result.isSuccess(result), `${s} --${i}--> should be allowed`)
      assert.deepStrictEqual(Result.getOrThrow(result), allowed[s][i])
    })
  })

  describe("forbidden transitions", () => {
    const forbiddenPairs = pairs.filter(([s, i]) => allowed[s][i] === undefined)
    it("the table has both kinds", () => {
      assert.isAbove(forbiddenPairs.length, 50)
      assert.strictEqual(
        forbiddenPairs.length + pairs.filter(([s, i]) => allowed[s][i] !== undefined).length,
        stateNames.length * inputNames.length
      )
      assert.strictEqual(pairs.length, 120)
    })
    it.each(forbiddenPairs)("%s --%s--> IllegalStateTransition", (s, i) => {
      const result = step(states[s], inputs[i])
      assert.isTrue(Result.isFailure(result), `${s} --${i}--> should be forbidden`)
      const error = Result.merge(result)
      assert.instanceOf(error, IllegalStateTransition)
      if (!(error instanceof IllegalStateTransition)) return
      assert.strictEqual(error.machine, "coordinator")
      assert.strictEqual(error.entity, "1")
      assert.strictEqual(error.from, describeState(states[s]))
      assert.include(error.to, `via ${inputs[i]._tag}`)
      assert.include(error.message, "illegal transition")
    })
  })

  it("names from and to precisely", () => {
    const error = Result.merge(step(states.electing5, Input.Elected(3)))
    assert.instanceOf(error, IllegalStateTransition)
    if (!(error instanceof IllegalStateTransition)) return
    assert.strictEqual(error.from, "Electing")
    assert.strictEqual(error.to, "Leader(epoch 3) via Elected")
    const ready = Result.merge(step(states.leaderReady, Input.LeaderServicesReady))
    assert.instanceOf(ready, IllegalStateTransition)
    if (!(ready instanceof IllegalStateTransition)) return
    assert.strictEqual(ready.from, "Leader(epoch 3, Ready)")
    assert.strictEqual(ready.to, "Leader(Ready) via LeaderServicesReady")
  })

  it("a full lifecycle emits the greppable log lines in order", () => {
    const script: ReadonlyArray<InputT> = [
      Input.Start,
      Input.Campaign,
      Input.Elected(1),
      Input.LeaderServicesReady,
      Input.ConnectionSuspended,
      Input.ConnectionRestored,
      Input.Close
    ]
    let state = initial(id)
    const commands: Array<CommandT> = []
    for (const input of script) {
      const [next, emitted] = Result.getOrThrow(step(state, input))
      state = next
      commands.push(...emitted)
    }
    assert.deepStrictEqual(state, down)
    assert.deepStrictEqual(
      commands.flatMap((c) => (c._tag === "Log" ? [c.message] : [])),
      [
        "standby start",
        "candidate node created",
        "Became coordinator leader with epoch 1",
        "leader services started",
        "connection suspended, leading on with epoch 1 until the session expires",
        "connection restored, still leader with epoch 1",
        "coordinator closed"
      ]
    )
  })

  it("a connection blip within the session changes nothing for a leader (it only logs it)", () => {
    let state: State = states.leaderReady
    for (const input of [Input.ConnectionSuspended, Input.ConnectionRestored]) {
      const [next, emitted]: Step = Result.getOrThrow(step(state, input))
      assert.deepStrictEqual(
        emitted.map((c) => c._tag),
        ["Log"]
      )
      state = next
    }
    assert.strictEqual(state, states.leaderReady)
  })

  it("a failure while initialising releases and rejoins, and the next election needs a higher epoch", () => {
    const [afterFail, cmds] = Result.getOrThrow(step(states.leaderInit, Input.LeaderServicesFailed("rpc down")))
    assert.deepStrictEqual(cmds.slice(1), [Command.ReleaseLeaderResources, Command.RejoinElection])
    const [electing] = Result.getOrThrow(step(afterFail, Input.Campaign))
    assert.isTrue(Result.isFailure(step(electing, Input.Elected(3))))
    assert.isTrue(Result.isSuccess(step(electing, Input.Elected(4))))
  })
})

// ---------------------------------------------------------------------------
// Seeded random walks
// ---------------------------------------------------------------------------

const stepImpl: StepFn = step

const randomInput = (next: () => number): InputT => {
  // Close ends a walk, so it is rare; every other tag is equally likely.
  if (next() < 0.01) return Input.Close
  const open = inputTags.filter((t) => t !== "Close")
  const tag = open[Math.floor(next() * open.length)] ?? "Start"
  const epoch = Math.floor(next() * 12)
  switch (tag) {
    case "Elected":
      return Input.Elected(epoch)
    case "Fenced":
      return Input.Fenced(epoch)
    case "LeaderServicesFailed":
      return Input.LeaderServicesFailed("random failure")
    default:
      return { _tag: tag }
  }
}

type StepFn = typeof step

const walk = (seed: number, length: number, step: StepFn = stepImpl): string | undefined => {
  const next = prng(seed)
  let state = initial(id)
  let lastLeaderEpoch = -1
  let resourcesHeld = false
  for (let n = 0; n < length; n++) {
    const input = randomInput(next)
    const result = step(state, input)
    if (state._tag === "Down" && Result.isSuccess(result)) return `step ${n}: Down accepted ${input._tag}`
    if (Result.isFailure(result)) {
      if (!(result.failure instanceof IllegalStateTransition)) return `step ${n}: unexpected error`
      continue
    }
    const [after, commands] = result.success
    if (after._tag === "Leader") {
      const sameLeader = state._tag === "Leader" && state.epoch === after.epoch
      if (!sameLeader) {
        if (input._tag !== "Elected" || input.epoch !== after.epoch) {
          return `step ${n}: became Leader(${after.epoch}) on ${input._tag}`
        }
        if (after.epoch <= lastLeaderEpoch) {
          return `step ${n}: leader epoch ${after.epoch} after ${lastLeaderEpoch}`
        }
        lastLeaderEpoch = after.epoch
      }
    }
    for (const command of commands) {
      if (command._tag === "AcquireLeaderResources") {
        if (resourcesHeld) return `step ${n}: acquired twice`
        if (command.epoch !== lastLeaderEpoch) return `step ${n}: acquired for a stale epoch`
        resourcesHeld = true
      }
      if (command._tag === "ReleaseLeaderResources") {
        if (!resourcesHeld) return `step ${n}: released nothing`
        resourcesHeld = false
      }
    }
    if (resourcesHeld !== (after._tag === "Leader")) return `step ${n}: resources held only while Leader`
    state = after
  }
  return undefined
}

describe("CoordinatorLifecycle random walks", () => {
  it("1000 seeded walks keep the safety properties", () => {
    for (let seed = 1; seed <= 1000; seed++) {
      const failure = walk(seed, 200)
      assert.isUndefined(failure, `seed=${seed}: ${failure}`)
    }
  })

  it("walks that follow the happy path do reach Leader (the checker is not vacuous)", () => {
    let reached = 0
    for (let seed = 1; seed <= 200; seed++) {
      const next = prng(seed)
      let state = initial(id)
      for (let n = 0; n < 2000; n++) {
        const result = step(state, randomInput(next))
        if (Result.isSuccess(result)) state = result.success[0]
        if (state._tag === "Leader") {
          reached++
          break
        }
      }
    }
    assert.isAbove(reached, 80)
  })

  it("a planted bug (no epoch check on Elected) is caught by the checker", () => {
    const buggy: StepFn = (state, input) =>
      state._tag === "Electing" && input._tag === "Elected"
        ? Result.succeed([
            { _tag: "Leader", serverId: state.serverId, epoch: input.epoch, phase: "Initialising" },
            [Command.AcquireLeaderResources(input.epoch)]
          ])
        : step(state, input)
    const caught = Array.from({ length: 200 }, (_, i) => walk(i + 1, 200, buggy)).filter((f) => f !== undefined)
    assert.isAbove(caught.length, 0)
    assert.isTrue(caught.some((f) => f.includes("leader epoch")))
  })

  it("Down is terminal for every input", () => {
    for (const input of Object.values(inputs)) {
      assert.isTrue(Result.isFailure(step(states.down, input)), input._tag)
    }
  })
})
