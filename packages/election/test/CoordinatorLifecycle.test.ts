import { Errors } from "@strata/core"
import { documentedRows } from "../../../scripts/test-support/docTable.js"
import { prng } from "../../../scripts/test-support/prng.js"
import { assert, describe, it } from "@effect/vitest"
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
  CampaignFailed: Input.CampaignFailed("boom"),
  CampaignRefused: Input.CampaignRefused("NoAuth"),
  Fenced2: Input.Fenced(2),
  Fenced3: Input.Fenced(3),
  Fenced9: Input.Fenced(9),
  Ready: Input.LeaderServicesReady,
  Failed: Input.LeaderServicesFailed("boom"),
  SessionLost: Input.SessionLost,
  Lapsed: Input.Lapsed,
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
/** Back to Standby: the campaign closed, another one after the backoff (services released first if `release`). */
const rejoined = (message: string, release = true): ReadonlyArray<CommandT> => [
  log(message),
  ...(release ? [Command.ReleaseLeaderResources] : []),
  Command.CloseCampaign,
  Command.ScheduleCampaign("backoff")
]

type Expected = readonly [State, ReadonlyArray<CommandT>]

/** Stopped by itself: the coordination refused its identity. */
const refused: Expected = [
  { _tag: "Down", serverId: id, refused: "NoAuth" },
  [Command.CloseCampaign, log("coordinator stopped: the coordination refused its identity: NoAuth")]
]

/** The outcomes of a leader of epoch 3 in either phase. */
const asLeader = (self: State): Partial<Record<InputName, Expected>> => ({
  SessionLost: [standbyAt(3), rejoined("coordinator leadership with epoch 3 lost: session expired")],
  Lapsed: [
    standbyAt(3),
    rejoined(
      "coordinator leadership with epoch 3 lapsed: its session was not proven alive before the deadline, stepping down"
    )
  ],
  Resign: [standbyAt(3), rejoined("resigned coordinator leadership with epoch 3")],
  Fenced3: [standbyAt(3), rejoined("coordinator epoch 3 fenced by epoch 3")],
  Fenced9: [standbyAt(9), rejoined("coordinator epoch 3 fenced by epoch 9")],
  Close: [down, [Command.ReleaseLeaderResources, Command.CloseCampaign, closed]],
  Suspended: [self, [log("connection suspended, leading on with epoch 3 while the deadline holds")]],
  Restored: [self, [log("connection restored, still leader with epoch 3")]]
})

/** The complete list of allowed (state, input) pairs with the expected outcome. */
const allowed: Record<StateName, Partial<Record<InputName, Expected>>> = {
  unstarted: {
    Start: [states.standby, [log("standby start"), Command.ScheduleCampaign("now")]],
    Close: [down, [Command.CancelCampaign, closed]]
  },
  standby: {
    Campaign: [states.electing, [Command.CreateCandidate]],
    Close: [down, [Command.CancelCampaign, closed]]
  },
  standby5: {
    Campaign: [states.electing5, [Command.CreateCandidate]],
    Close: [down, [Command.CancelCampaign, closed]]
  },
  electing: {
    Elected3: [leader(3, "Initialising"), becameLeader(3)],
    Elected7: [leader(7, "Initialising"), becameLeader(7)],
    CampaignFailed: [standbyAt(null), rejoined("campaign failed: boom", false)],
    CampaignRefused: refused,
    Close: [down, [Command.CloseCampaign, closed]]
  },
  electing5: {
    Elected3: [standbyAt(5), rejoined("won epoch 3, not above the epoch 5 already seen: giving it up", false)],
    Elected7: [leader(7, "Initialising"), becameLeader(7)],
    CampaignFailed: [standbyAt(5), rejoined("campaign failed: boom", false)],
    CampaignRefused: refused,
    Close: [down, [Command.CloseCampaign, closed]]
  },
  leaderInit: {
    Ready: [leader(3, "Ready"), [log("leader services started")]],
    Failed: [standbyAt(3), rejoined("leader services failed to start: boom")],
    ...asLeader(states.leaderInit)
  },
  leaderReady: asLeader(states.leaderReady),
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
      assert.strictEqual(pairs.length, 136)
    })
    it.each(forbiddenPairs)("%s --%s--> IllegalStateTransition", (s, i) => {
      const result = step(states[s], inputs[i])
      assert.isTrue(Result.isFailure(result), `${s} --${i}--> should be forbidden`)
      const error = Result.merge(result)
      assert.instanceOf(error, Errors.IllegalStateTransition)
      if (!(error instanceof Errors.IllegalStateTransition)) return
      assert.strictEqual(error.machine, "coordinator")
      assert.strictEqual(error.entity, "1")
      assert.strictEqual(error.from, describeState(states[s]))
      assert.include(error.to, `via ${inputs[i]._tag}`)
      assert.include(error.message, "illegal transition")
    })
  })

  it("names from and to precisely", () => {
    const error = Result.merge(step(states.standby, Input.Elected(3)))
    assert.instanceOf(error, Errors.IllegalStateTransition)
    if (!(error instanceof Errors.IllegalStateTransition)) return
    assert.strictEqual(error.from, "Standby")
    assert.strictEqual(error.to, "Leader(epoch 3) via Elected")
    const ready = Result.merge(step(states.leaderReady, Input.LeaderServicesReady))
    assert.instanceOf(ready, Errors.IllegalStateTransition)
    if (!(ready instanceof Errors.IllegalStateTransition)) return
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
        "Became coordinator leader with epoch 1",
        "leader services started",
        "connection suspended, leading on with epoch 1 while the deadline holds",
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

  it("a failure while initialising releases and rejoins, and an epoch that does not grow is given up", () => {
    const [afterFail, cmds] = Result.getOrThrow(step(states.leaderInit, Input.LeaderServicesFailed("rpc down")))
    assert.deepStrictEqual(cmds.slice(1), [
      Command.ReleaseLeaderResources,
      Command.CloseCampaign,
      Command.ScheduleCampaign("backoff")
    ])
    const [electing] = Result.getOrThrow(step(afterFail, Input.Campaign))
    const [gaveUp, gaveUpCommands] = Result.getOrThrow(step(electing, Input.Elected(3)))
    assert.deepStrictEqual(gaveUp, standbyAt(3))
    assert.isFalse(gaveUpCommands.some((c) => c._tag === "AcquireLeaderResources"))
    assert.deepStrictEqual(Result.getOrThrow(step(electing, Input.Elected(4)))[0], leader(4, "Initialising"))
  })

  it("the transition table in the module comment is the machine's", () => {
    // Sample states and labelled inputs (a condition in the label picks the sample epoch).
    const families: ReadonlyArray<readonly [family: string, members: ReadonlyArray<readonly [string, State]>]> = [
      [
        "Standby",
        [
          ["Standby(unstarted)", states.unstarted],
          ["Standby", states.standby5]
        ]
      ],
      ["Electing", [["Electing", states.electing5]]],
      [
        "Leader",
        [
          ["Leader(Initialising)", leader(5, "Initialising")],
          ["Leader(Ready)", leader(5, "Ready")]
        ]
      ]
    ]
    const labelled: ReadonlyArray<readonly [string, InputT]> = [
      ["Start", Input.Start],
      ["Campaign", Input.Campaign],
      ["Elected(epoch > last)", Input.Elected(7)],
      ["Elected(epoch <= last)", Input.Elected(5)],
      ["CampaignFailed", Input.CampaignFailed("x")],
      ["CampaignRefused", Input.CampaignRefused("x")],
      ["LeaderServicesReady", Input.LeaderServicesReady],
      ["LeaderServicesFailed", Input.LeaderServicesFailed("x")],
      ["SessionLost", Input.SessionLost],
      ["Fenced(epoch >= own)", Input.Fenced(9)],
      ["Fenced(epoch < own)", Input.Fenced(2)],
      ["Lapsed", Input.Lapsed],
      ["Resign", Input.Resign],
      ["ConnectionSuspended", Input.ConnectionSuspended],
      ["ConnectionRestored", Input.ConnectionRestored],
      ["Close", Input.Close]
    ]
    const nameOf = (s: State) => (s._tag === "Leader" ? `Leader(${s.phase})` : describeState(s))
    const row = (label: string, state: State, input: string, self: string) => {
      const result = step(state, labelled.find(([l]) => l === input)![1])
      if (Result.isFailure(result)) return undefined
      const [next, commands] = result.success
      const to = nameOf(next) === nameOf(state) ? self : nameOf(next)
      const shown = commands.map((c) =>
        c._tag === "ScheduleCampaign"
          ? `ScheduleCampaign(${c.after})`
          : c._tag === "AcquireLeaderResources"
            ? "AcquireLeaderResources(epoch)"
            : c._tag
      )
      return `| ${label} | ${input} | ${to} | ${shown.join(", ")} |`
    }
    const expected: Array<string> = []
    for (const [family, members] of families) {
      for (const [input] of labelled) {
        // A row every member has alike is the family's; otherwise each member's own.
        const own = members.map(([label, state]) => row(label, state, input, label))
        const shared = members.map(([, state]) => row(family, state, input, family))
        if (members.length > 1 && shared.every((r) => r !== undefined && r === shared[0])) expected.push(shared[0]!)
        else for (const r of own) if (r !== undefined) expected.push(r)
      }
    }
    const documented = documentedRows(new URL("../src/CoordinatorLifecycle.ts", import.meta.url))
    assert.deepStrictEqual(documented, expected, `the table should read:\n${expected.join("\n")}`)
  })
})

// ---------------------------------------------------------------------------
// Seeded random walks
// ---------------------------------------------------------------------------

const stepImpl: StepFn = step

const randomInput = (next: () => number): InputT => {
  // Close and CampaignRefused end a walk, so they are rare; every other tag is equally likely.
  if (next() < 0.01) return Input.Close
  if (next() < 0.005) return Input.CampaignRefused("random refusal")
  const open = inputTags.filter((t) => t !== "Close" && t !== "CampaignRefused")
  const tag = open[Math.floor(next() * open.length)] ?? "Start"
  const epoch = Math.floor(next() * 12)
  switch (tag) {
    case "Elected":
      return Input.Elected(epoch)
    case "Fenced":
      return Input.Fenced(epoch)
    case "LeaderServicesFailed":
      return Input.LeaderServicesFailed("random failure")
    case "CampaignFailed":
      return Input.CampaignFailed("random failure")
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
      if (!(result.failure instanceof Errors.IllegalStateTransition)) return `step ${n}: unexpected error`
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
