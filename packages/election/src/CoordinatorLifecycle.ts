/**
 * The coordinator lifecycle as a pure state machine (docs/ARCHITECTURE.md, "Election and failover").
 *
 * `step(state, input)` returns the next state and the commands an Effect shell
 * must execute, or an `IllegalStateTransition` for a transition the machine
 * forbids. No I/O, no clock, no randomness: the shell feeds inputs (from the
 * coordination backend and the leader-resource scope) and runs the commands.
 *
 * Allowed transitions:
 *
 * - `Standby(new)  --Start-->                Standby(started)`  + RegisterStandby, Log "standby start"
 * - `Standby(started) --Campaign-->          Electing`          + CreateCandidate, Log "candidate node created"
 * - `Electing --Elected{epoch > last}-->     Leader(Initialising)` + Log "Became coordinator leader with epoch N", AcquireLeaderResources
 * - `Electing --NotLowest-->                 Standby`
 * - `Electing --Fenced{epoch}-->             Standby` (remembers the higher epoch)
 * - `Leader(Initialising) --LeaderServicesReady-->  Leader(Ready)` + Log "leader services started"
 * - `Leader(Initialising) --LeaderServicesFailed--> Standby` + ReleaseLeaderResources, RejoinElection
 * - `Leader --SessionLost-->                 Standby` + ReleaseLeaderResources, RegisterStandby, RejoinElection
 * - `Leader --Resign-->                      Standby` + ReleaseLeaderResources
 * - `Leader --Fenced{epoch >= own}-->        Standby` + ReleaseLeaderResources, RejoinElection
 * - `Standby | Leader --Close-->             Down` (a leader first releases its resources)
 * - `Standby | Electing | Leader --ConnectionSuspended | ConnectionRestored--> unchanged`: a blip shorter
 *   than the session timeout changes nothing (a leader logs it); expiry arrives as `SessionLost`.
 *
 * Everything else, and every input in `Down`, is an `IllegalStateTransition`.
 *
 * @since 0.1.0
 */
import { IllegalStateTransition } from "@strata/core"
import { Epoch, ServerId } from "@strata/core"
import { Result, Schema } from "effect"

// ---------------------------------------------------------------------------
// States
// ---------------------------------------------------------------------------

/**
 * Not leading. `started` is false until the standby registration was requested
 * (the `Start` input); `lastEpoch` is the highest coordinator epoch this node has
 * seen, so a later `Elected` must carry a strictly higher one.
 *
 * @since 0.1.0
 */
export const Standby = Schema.TaggedStruct("Standby", {
  serverId: ServerId,
  started: Schema.Boolean,
  lastEpoch: Schema.NullOr(Epoch)
})
/** @since 0.1.0 */
export type Standby = typeof Standby.Type

/**
 * A candidate node was requested; waiting for the election outcome.
 *
 * @since 0.1.0
 */
export const Electing = Schema.TaggedStruct("Electing", {
  serverId: ServerId,
  lastEpoch: Schema.NullOr(Epoch)
})
/** @since 0.1.0 */
export type Electing = typeof Electing.Type

/**
 * Leader for `epoch`. `Initialising` while leader-only resources are being
 * acquired, `Ready` once they all started.
 *
 * @since 0.1.0
 */
export const Leader = Schema.TaggedStruct("Leader", {
  serverId: ServerId,
  epoch: Epoch,
  phase: Schema.Literals(["Initialising", "Ready"])
})
/** @since 0.1.0 */
export type Leader = typeof Leader.Type

/**
 * Closed. Terminal: every input is illegal.
 *
 * @since 0.1.0
 */
export const Down = Schema.TaggedStruct("Down", {
  serverId: ServerId
})
/** @since 0.1.0 */
export type Down = typeof Down.Type

/**
 * Any coordinator lifecycle state.
 *
 * @since 0.1.0
 */
export const State = Schema.Union([Standby, Electing, Leader, Down])
/** @since 0.1.0 */
export type State = typeof State.Type

/**
 * The state a coordinator starts in: not yet registered, no epoch seen.
 *
 * @since 0.1.0
 */
export const initial = (serverId: ServerId): State => ({
  _tag: "Standby",
  serverId,
  started: false,
  lastEpoch: null
})

// ---------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------

/**
 * Inputs fed by the shell.
 *
 * @since 0.1.0
 */
export type Input =
  | { readonly _tag: "Start" }
  | { readonly _tag: "Campaign" }
  | { readonly _tag: "Elected"; readonly epoch: Epoch }
  | { readonly _tag: "NotLowest" }
  | { readonly _tag: "Fenced"; readonly epoch: Epoch }
  | { readonly _tag: "LeaderServicesReady" }
  | { readonly _tag: "LeaderServicesFailed"; readonly cause: string }
  | { readonly _tag: "SessionLost" }
  | { readonly _tag: "Resign" }
  | { readonly _tag: "Close" }
  | { readonly _tag: "ConnectionSuspended" }
  | { readonly _tag: "ConnectionRestored" }

/**
 * Constructors for {@link Input}.
 *
 * @since 0.1.0
 */
export const Input = {
  Start: { _tag: "Start" } as Input,
  Campaign: { _tag: "Campaign" } as Input,
  Elected: (epoch: Epoch): Input => ({ _tag: "Elected", epoch }),
  NotLowest: { _tag: "NotLowest" } as Input,
  Fenced: (epoch: Epoch): Input => ({ _tag: "Fenced", epoch }),
  LeaderServicesReady: { _tag: "LeaderServicesReady" } as Input,
  LeaderServicesFailed: (cause: string): Input => ({ _tag: "LeaderServicesFailed", cause }),
  SessionLost: { _tag: "SessionLost" } as Input,
  Resign: { _tag: "Resign" } as Input,
  Close: { _tag: "Close" } as Input,
  ConnectionSuspended: { _tag: "ConnectionSuspended" } as Input,
  ConnectionRestored: { _tag: "ConnectionRestored" } as Input
} as const

/**
 * Every input tag, for exhaustive tables.
 *
 * @since 0.1.0
 */
export const inputTags: ReadonlyArray<Input["_tag"]> = [
  "Start",
  "Campaign",
  "Elected",
  "NotLowest",
  "Fenced",
  "LeaderServicesReady",
  "LeaderServicesFailed",
  "SessionLost",
  "Resign",
  "Close",
  "ConnectionSuspended",
  "ConnectionRestored"
]

// ---------------------------------------------------------------------------
// Commands
// ---------------------------------------------------------------------------

/**
 * Commands the shell executes, in order.
 *
 * - `RegisterStandby`: create the ephemeral `/<ns>/coordinators/ids/<serverId>` node.
 * - `CreateCandidate`: create an ephemeral-sequential candidate and find out whether it is lowest.
 * - `AcquireLeaderResources`: open the leader-only resources in one scope, fenced with `epoch`.
 * - `ReleaseLeaderResources`: close that scope (reverse order of acquisition) and give up leadership.
 * - `RejoinElection`: feed `Campaign` again once the node is back in Standby.
 * - `Log`: a user-greppable log line.
 *
 * @since 0.1.0
 */
export type Command =
  | { readonly _tag: "RegisterStandby" }
  | { readonly _tag: "CreateCandidate" }
  | { readonly _tag: "AcquireLeaderResources"; readonly epoch: Epoch }
  | { readonly _tag: "ReleaseLeaderResources" }
  | { readonly _tag: "RejoinElection" }
  | { readonly _tag: "Log"; readonly message: string }

/**
 * Constructors for {@link Command}.
 *
 * @since 0.1.0
 */
export const Command = {
  RegisterStandby: { _tag: "RegisterStandby" } as Command,
  CreateCandidate: { _tag: "CreateCandidate" } as Command,
  AcquireLeaderResources: (epoch: Epoch): Command => ({ _tag: "AcquireLeaderResources", epoch }),
  ReleaseLeaderResources: { _tag: "ReleaseLeaderResources" } as Command,
  RejoinElection: { _tag: "RejoinElection" } as Command,
  Log: (message: string): Command => ({ _tag: "Log", message })
} as const

// ---------------------------------------------------------------------------
// Transition function
// ---------------------------------------------------------------------------

/**
 * The outcome of one step: the next state and the commands to run.
 *
 * @since 0.1.0
 */
export type Step = readonly [State, ReadonlyArray<Command>]

/**
 * A readable name for a state, used in `IllegalStateTransition.from`.
 *
 * @since 0.1.0
 */
export const describeState = (state: State): string => {
  switch (state._tag) {
    case "Standby":
      return state.started ? "Standby" : "Standby(unstarted)"
    case "Electing":
      return "Electing"
    case "Leader":
      return `Leader(epoch ${state.epoch}, ${state.phase})`
    case "Down":
      return "Down"
  }
}

/** The state an input asks for, named for `IllegalStateTransition.to`. */
const target = (state: State, input: Input): string => {
  switch (input._tag) {
    case "Start":
      return "Standby via Start"
    case "Campaign":
      return "Electing via Campaign"
    case "Elected":
      return `Leader(epoch ${input.epoch}) via Elected`
    case "NotLowest":
      return "Standby via NotLowest"
    case "Fenced":
      return `Standby via Fenced(epoch ${input.epoch})`
    case "LeaderServicesReady":
      return "Leader(Ready) via LeaderServicesReady"
    case "LeaderServicesFailed":
      return "Standby via LeaderServicesFailed"
    case "SessionLost":
      return "Standby via SessionLost"
    case "Resign":
      return "Standby via Resign"
    case "Close":
      return "Down via Close"
    case "ConnectionSuspended":
      return `${describeState(state)} via ConnectionSuspended`
    case "ConnectionRestored":
      return `${describeState(state)} via ConnectionRestored`
  }
}

const ok = (state: State, commands: ReadonlyArray<Command>): Result.Result<Step, IllegalStateTransition> =>
  Result.succeed([state, commands] as const)

const illegal = (state: State, input: Input): Result.Result<Step, IllegalStateTransition> =>
  Result.fail(
    new IllegalStateTransition({
      machine: "coordinator",
      entity: String(state.serverId),
      from: describeState(state),
      to: target(state, input)
    })
  )

const standby = (serverId: ServerId, lastEpoch: Epoch | null): State => ({
  _tag: "Standby",
  serverId,
  started: true,
  lastEpoch
})

const maxEpoch = (a: Epoch | null, b: Epoch): Epoch => (a === null || b > a ? b : a)

/**
 * One transition of the coordinator lifecycle. Pure and total: every
 * `(state, input)` pair either yields the next state and commands, or an
 * `IllegalStateTransition` naming `from` and `to`.
 *
 * @since 0.1.0
 */
export const step = (state: State, input: Input): Result.Result<Step, IllegalStateTransition> => {
  switch (state._tag) {
    case "Standby": {
      switch (input._tag) {
        case "Start":
          return state.started
            ? illegal(state, input)
            : ok({ ...state, started: true }, [Command.RegisterStandby, Command.Log("standby start")])
        case "Campaign":
          return state.started
            ? ok({ _tag: "Electing", serverId: state.serverId, lastEpoch: state.lastEpoch }, [
                Command.CreateCandidate,
                Command.Log("candidate node created")
              ])
            : illegal(state, input)
        case "Close":
          return ok({ _tag: "Down", serverId: state.serverId }, [Command.Log("coordinator closed")])
        case "SessionLost":
          // The standby registration died with the session: register again.
          return state.started
            ? ok(state, [Command.Log("session expired, registering as standby again"), Command.RegisterStandby])
            : illegal(state, input)
        case "ConnectionSuspended":
        case "ConnectionRestored":
          return ok(state, [])
        default:
          return illegal(state, input)
      }
    }
    case "Electing": {
      switch (input._tag) {
        case "Elected":
          return state.lastEpoch !== null && input.epoch <= state.lastEpoch
            ? illegal(state, input)
            : ok({ _tag: "Leader", serverId: state.serverId, epoch: input.epoch, phase: "Initialising" }, [
                Command.Log(`Became coordinator leader with epoch ${input.epoch}`),
                Command.AcquireLeaderResources(input.epoch)
              ])
        case "NotLowest":
          return ok(standby(state.serverId, state.lastEpoch), [Command.Log("not the lowest candidate, standing by")])
        case "Fenced":
          return ok(standby(state.serverId, maxEpoch(state.lastEpoch, input.epoch)), [
            Command.Log(`fenced by coordinator epoch ${input.epoch}, standing by`)
          ])
        case "SessionLost":
          // The candidate node died with the session: register and campaign again.
          return ok(standby(state.serverId, state.lastEpoch), [
            Command.Log("session expired while electing, rejoining"),
            Command.RegisterStandby,
            Command.RejoinElection
          ])
        case "Close":
          return ok({ _tag: "Down", serverId: state.serverId }, [Command.Log("coordinator closed")])
        case "ConnectionSuspended":
        case "ConnectionRestored":
          return ok(state, [])
        default:
          return illegal(state, input)
      }
    }
    case "Leader": {
      switch (input._tag) {
        case "LeaderServicesReady":
          return state.phase === "Initialising"
            ? ok({ ...state, phase: "Ready" }, [Command.Log("leader services started")])
            : illegal(state, input)
        case "LeaderServicesFailed":
          return state.phase === "Initialising"
            ? ok(standby(state.serverId, state.epoch), [
                Command.Log(`leader services failed to start: ${input.cause}`),
                Command.ReleaseLeaderResources,
                Command.RejoinElection
              ])
            : illegal(state, input)
        case "SessionLost":
          return ok(standby(state.serverId, state.epoch), [
            Command.Log(`coordinator leadership with epoch ${state.epoch} lost: session expired`),
            Command.ReleaseLeaderResources,
            Command.RegisterStandby,
            Command.RejoinElection
          ])
        case "Resign":
          return ok(standby(state.serverId, state.epoch), [
            Command.Log(`resigned coordinator leadership with epoch ${state.epoch}`),
            Command.ReleaseLeaderResources
          ])
        case "Fenced":
          // A newer epoch, or the epoch node rewritten or removed under the same number: either way this
          // leadership's fencing token no longer holds. A lower epoch cannot fence it.
          return input.epoch >= state.epoch
            ? ok(standby(state.serverId, input.epoch), [
                Command.Log(`coordinator epoch ${state.epoch} fenced by epoch ${input.epoch}`),
                Command.ReleaseLeaderResources,
                Command.RejoinElection
              ])
            : illegal(state, input)
        case "Close":
          return ok({ _tag: "Down", serverId: state.serverId }, [
            Command.ReleaseLeaderResources,
            Command.Log("coordinator closed")
          ])
        // A blip: the leader leads on while its session lives (its writes stay fenced by the epoch).
        case "ConnectionSuspended":
          return ok(state, [
            Command.Log(`connection suspended, leading on with epoch ${state.epoch} until the session expires`)
          ])
        case "ConnectionRestored":
          return ok(state, [Command.Log(`connection restored, still leader with epoch ${state.epoch}`)])
        default:
          return illegal(state, input)
      }
    }
    case "Down":
      return illegal(state, input)
  }
}
