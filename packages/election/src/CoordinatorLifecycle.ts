/**
 * The coordinator lifecycle as a pure state machine (docs/ARCHITECTURE.md, "Election and failover").
 *
 * `step(state, input)` returns the next state and the commands an Effect shell
 * must execute, or an `IllegalStateTransition` for a transition the machine
 * forbids. No I/O, no clock, no randomness: the shell feeds inputs (from the
 * election, the leader services and its own timer) and runs exactly the
 * commands, deciding nothing itself.
 *
 * The transitions (checked against `step` by the lifecycle tests; `last` is the
 * highest epoch the coordinator has seen, `own` a leader's epoch):
 *
 * <!-- transitions -->
 * | from | input | to | commands |
 * |---|---|---|---|
 * | Standby(unstarted) | Start | Standby | Log, ScheduleCampaign(now) |
 * | Standby | Campaign | Electing | CreateCandidate |
 * | Standby | Close | Down | CancelCampaign, Log |
 * | Electing | Elected(epoch > last) | Leader(Initialising) | Log, AcquireLeaderResources(epoch) |
 * | Electing | Elected(epoch <= last) | Standby | Log, CloseCampaign, ScheduleCampaign(backoff) |
 * | Electing | CampaignFailed | Standby | Log, CloseCampaign, ScheduleCampaign(backoff) |
 * | Electing | CampaignRefused | Down | CloseCampaign, Log |
 * | Electing | Close | Down | CloseCampaign, Log |
 * | Leader(Initialising) | LeaderServicesReady | Leader(Ready) | Log |
 * | Leader(Initialising) | LeaderServicesFailed | Standby | Log, ReleaseLeaderResources, CloseCampaign, ScheduleCampaign(backoff) |
 * | Leader | SessionLost | Standby | Log, ReleaseLeaderResources, CloseCampaign, ScheduleCampaign(backoff) |
 * | Leader | Fenced(epoch >= own) | Standby | Log, ReleaseLeaderResources, CloseCampaign, ScheduleCampaign(backoff) |
 * | Leader | Lapsed | Standby | Log, ReleaseLeaderResources, CloseCampaign, ScheduleCampaign(backoff) |
 * | Leader | Resign | Standby | Log, ReleaseLeaderResources, CloseCampaign, ScheduleCampaign(backoff) |
 * | Leader | ConnectionSuspended | Leader | Log |
 * | Leader | ConnectionRestored | Leader | Log |
 * | Leader | Close | Down | ReleaseLeaderResources, CloseCampaign, Log |
 * <!-- /transitions -->
 *
 * Everything else, and every input in `Down`, is an `IllegalStateTransition`.
 * A leader whose session was not proven alive by its deadline (`Lapsed`) steps
 * down: it may have been expired by the server, so it stops acting at once and
 * campaigns again. A connection blip shorter than that changes nothing (the
 * leader logs it); an expiry arrives as `SessionLost`.
 *
 * @since 0.1.0
 */
import { Errors, Models } from "@strata/core"
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
  serverId: Models.ServerId,
  started: Schema.Boolean,
  lastEpoch: Schema.NullOr(Models.Epoch)
})
/** @since 0.1.0 */
export type Standby = typeof Standby.Type

/**
 * A candidate node was requested; waiting for the election outcome.
 *
 * @since 0.1.0
 */
export const Electing = Schema.TaggedStruct("Electing", {
  serverId: Models.ServerId,
  lastEpoch: Schema.NullOr(Models.Epoch)
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
  serverId: Models.ServerId,
  epoch: Models.Epoch,
  phase: Schema.Literals(["Initialising", "Ready"])
})
/** @since 0.1.0 */
export type Leader = typeof Leader.Type

/**
 * Closed. Terminal: every input is illegal. `refused` says why when the coordination refused this coordinator's
 * identity (it stopped by itself rather than campaign in vain).
 *
 * @since 0.1.0
 */
export const Down = Schema.TaggedStruct("Down", {
  serverId: Models.ServerId,
  refused: Schema.optional(Schema.String)
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
export const initial = (serverId: Models.ServerId): State => ({
  _tag: "Standby",
  serverId,
  started: false,
  lastEpoch: null
})

// ---------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------

/**
 * Inputs fed by the shell: `Start` and `Close` from the owner, `Campaign` from
 * the shell's timer, `Elected` / `CampaignFailed` / `CampaignRefused` (the coordination refused this process's
 * identity: its credentials, or their permissions) from the campaign,
 * `SessionLost` / `Fenced` / `Resign` from the leadership's end (or the owner's
 * `resign`), `Lapsed` from the leadership's deadline, `ConnectionSuspended` /
 * `ConnectionRestored` from its session, `LeaderServicesReady` /
 * `LeaderServicesFailed` from the leader services.
 *
 * @since 0.1.0
 */
export type Input =
  | { readonly _tag: "Start" }
  | { readonly _tag: "Campaign" }
  | { readonly _tag: "Elected"; readonly epoch: Models.Epoch }
  | { readonly _tag: "CampaignFailed"; readonly cause: string }
  | { readonly _tag: "CampaignRefused"; readonly cause: string }
  | { readonly _tag: "LeaderServicesReady" }
  | { readonly _tag: "LeaderServicesFailed"; readonly cause: string }
  | { readonly _tag: "SessionLost" }
  | { readonly _tag: "Fenced"; readonly epoch: Models.Epoch }
  | { readonly _tag: "Lapsed" }
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
  Elected: (epoch: Models.Epoch): Input => ({ _tag: "Elected", epoch }),
  CampaignFailed: (cause: string): Input => ({ _tag: "CampaignFailed", cause }),
  CampaignRefused: (cause: string): Input => ({ _tag: "CampaignRefused", cause }),
  LeaderServicesReady: { _tag: "LeaderServicesReady" } as Input,
  LeaderServicesFailed: (cause: string): Input => ({ _tag: "LeaderServicesFailed", cause }),
  SessionLost: { _tag: "SessionLost" } as Input,
  Fenced: (epoch: Models.Epoch): Input => ({ _tag: "Fenced", epoch }),
  Lapsed: { _tag: "Lapsed" } as Input,
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
  "CampaignFailed",
  "CampaignRefused",
  "LeaderServicesReady",
  "LeaderServicesFailed",
  "SessionLost",
  "Fenced",
  "Lapsed",
  "Resign",
  "Close",
  "ConnectionSuspended",
  "ConnectionRestored"
]

// ---------------------------------------------------------------------------
// Commands
// ---------------------------------------------------------------------------

/**
 * Commands the shell executes, in order, and nothing else.
 *
 * - `ScheduleCampaign`: feed `Campaign` at once (`now`) or after the rejoin backoff.
 * - `CancelCampaign`: drop a scheduled `Campaign`.
 * - `CreateCandidate`: start a campaign (its session registers the server id and creates the candidate node).
 * - `AcquireLeaderResources`: open the leader-only resources in one scope, with the leadership of `epoch`.
 * - `ReleaseLeaderResources`: close that scope (reverse order of acquisition).
 * - `CloseCampaign`: end the campaign: its session closes, and its registration, candidate and leader nodes go.
 * - `Log`: a user-greppable log line.
 *
 * @since 0.1.0
 */
export type Command =
  | { readonly _tag: "ScheduleCampaign"; readonly after: "now" | "backoff" }
  | { readonly _tag: "CancelCampaign" }
  | { readonly _tag: "CreateCandidate" }
  | { readonly _tag: "AcquireLeaderResources"; readonly epoch: Models.Epoch }
  | { readonly _tag: "ReleaseLeaderResources" }
  | { readonly _tag: "CloseCampaign" }
  | { readonly _tag: "Log"; readonly message: string }

/**
 * Constructors for {@link Command}.
 *
 * @since 0.1.0
 */
export const Command = {
  ScheduleCampaign: (after: "now" | "backoff"): Command => ({ _tag: "ScheduleCampaign", after }),
  CancelCampaign: { _tag: "CancelCampaign" } as Command,
  CreateCandidate: { _tag: "CreateCandidate" } as Command,
  AcquireLeaderResources: (epoch: Models.Epoch): Command => ({ _tag: "AcquireLeaderResources", epoch }),
  ReleaseLeaderResources: { _tag: "ReleaseLeaderResources" } as Command,
  CloseCampaign: { _tag: "CloseCampaign" } as Command,
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
    case "Close":
      return "Down via Close"
    case "CampaignRefused":
      return "Down via CampaignRefused"
    case "LeaderServicesReady":
      return "Leader(Ready) via LeaderServicesReady"
    case "ConnectionSuspended":
    case "ConnectionRestored":
      return `${describeState(state)} via ${input._tag}`
    case "Fenced":
      return `Standby via Fenced(epoch ${input.epoch})`
    default:
      return `Standby via ${input._tag}`
  }
}

const ok = (state: State, commands: ReadonlyArray<Command>): Result.Result<Step, Errors.IllegalStateTransition> =>
  Result.succeed([state, commands] as const)

const illegal = (state: State, input: Input): Result.Result<Step, Errors.IllegalStateTransition> =>
  Result.fail(
    new Errors.IllegalStateTransition({
      machine: "coordinator",
      entity: String(state.serverId),
      from: describeState(state),
      to: target(state, input)
    })
  )

const standby = (serverId: Models.ServerId, lastEpoch: Models.Epoch | null): State => ({
  _tag: "Standby",
  serverId,
  started: true,
  lastEpoch
})

const maxEpoch = (a: Models.Epoch | null, b: Models.Epoch): Models.Epoch => (a === null || b > a ? b : a)

/** Back to Standby and campaigning again after the backoff: the campaign ended, `release` first if leading. */
const rejoin = (
  serverId: Models.ServerId,
  lastEpoch: Models.Epoch | null,
  message: string,
  release: boolean
): Result.Result<Step, Errors.IllegalStateTransition> =>
  ok(standby(serverId, lastEpoch), [
    Command.Log(message),
    ...(release ? [Command.ReleaseLeaderResources] : []),
    Command.CloseCampaign,
    Command.ScheduleCampaign("backoff")
  ])

const closed = Command.Log("coordinator closed")

/**
 * One transition of the coordinator lifecycle. Pure and total: every
 * `(state, input)` pair either yields the next state and commands, or an
 * `IllegalStateTransition` naming `from` and `to`.
 *
 * @since 0.1.0
 */
export const step = (state: State, input: Input): Result.Result<Step, Errors.IllegalStateTransition> => {
  switch (state._tag) {
    case "Standby": {
      switch (input._tag) {
        case "Start":
          return state.started
            ? illegal(state, input)
            : ok({ ...state, started: true }, [Command.Log("standby start"), Command.ScheduleCampaign("now")])
        case "Campaign":
          return state.started
            ? ok({ _tag: "Electing", serverId: state.serverId, lastEpoch: state.lastEpoch }, [Command.CreateCandidate])
            : illegal(state, input)
        case "Close":
          return ok({ _tag: "Down", serverId: state.serverId }, [Command.CancelCampaign, closed])
        default:
          return illegal(state, input)
      }
    }
    case "Electing": {
      switch (input._tag) {
        case "Elected":
          // An epoch that does not grow (its node deleted or reset under the election) is given up, never led with.
          return state.lastEpoch !== null && input.epoch <= state.lastEpoch
            ? rejoin(
                state.serverId,
                state.lastEpoch,
                `won epoch ${input.epoch}, not above the epoch ${state.lastEpoch} already seen: giving it up`,
                false
              )
            : ok({ _tag: "Leader", serverId: state.serverId, epoch: input.epoch, phase: "Initialising" }, [
                Command.Log(`Became coordinator leader with epoch ${input.epoch}`),
                Command.AcquireLeaderResources(input.epoch)
              ])
        case "CampaignFailed":
          return rejoin(state.serverId, state.lastEpoch, `campaign failed: ${input.cause}`, false)
        case "CampaignRefused":
          // Campaigning again would be refused again: the coordinator stops, and its owner says why.
          return ok({ _tag: "Down", serverId: state.serverId, refused: input.cause }, [
            Command.CloseCampaign,
            Command.Log(`coordinator stopped: the coordination refused its identity: ${input.cause}`)
          ])
        case "Close":
          return ok({ _tag: "Down", serverId: state.serverId }, [Command.CloseCampaign, closed])
        default:
          return illegal(state, input)
      }
    }
    case "Leader": {
      const { serverId, epoch } = state
      switch (input._tag) {
        case "LeaderServicesReady":
          return state.phase === "Initialising"
            ? ok({ ...state, phase: "Ready" }, [Command.Log("leader services started")])
            : illegal(state, input)
        case "LeaderServicesFailed":
          return state.phase === "Initialising"
            ? rejoin(serverId, epoch, `leader services failed to start: ${input.cause}`, true)
            : illegal(state, input)
        case "SessionLost":
          return rejoin(serverId, epoch, `coordinator leadership with epoch ${epoch} lost: session expired`, true)
        case "Fenced":
          // A newer epoch, or the epoch node rewritten or removed under the same number: either way this
          // leadership's fencing token no longer holds. A lower epoch cannot fence it.
          return input.epoch >= epoch
            ? rejoin(
                serverId,
                maxEpoch(epoch, input.epoch),
                `coordinator epoch ${epoch} fenced by epoch ${input.epoch}`,
                true
              )
            : illegal(state, input)
        case "Lapsed":
          return rejoin(
            serverId,
            epoch,
            `coordinator leadership with epoch ${epoch} lapsed: its session was not proven alive before the deadline, stepping down`,
            true
          )
        case "Resign":
          return rejoin(serverId, epoch, `resigned coordinator leadership with epoch ${epoch}`, true)
        case "Close":
          return ok({ _tag: "Down", serverId }, [Command.ReleaseLeaderResources, Command.CloseCampaign, closed])
        // A blip: the leader leads on while its deadline holds (its writes stay fenced by the epoch).
        case "ConnectionSuspended":
          return ok(state, [
            Command.Log(`connection suspended, leading on with epoch ${epoch} while the deadline holds`)
          ])
        case "ConnectionRestored":
          return ok(state, [Command.Log(`connection restored, still leader with epoch ${epoch}`)])
        default:
          return illegal(state, input)
      }
    }
    case "Down":
      return illegal(state, input)
  }
}
