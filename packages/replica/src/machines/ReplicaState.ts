/**
 * The replica state machine of one tablet replica on one tablet server, as a pure function (the Fluss/Kafka
 * replica state machine, docs/ARCHITECTURE.md "Replication").
 *
 * `step(state, event)` returns the next state and the commands the tablet server's shell must execute, or an
 * `IllegalStateTransition` naming the tablet, the state and the event. No I/O: assignment and loading are two
 * separate asynchronous steps (the shell opens the tablet's log after `Assign`'s `OpenLog`, then feeds `Loaded`),
 * and a role changes only through a LeaderAndIsr whose leader epoch is higher than any this replica has seen — but
 * a replica with no role (its store failed and works again) may follow under the epoch it had seen, as a replica
 * new to the epoch does: following is safe under any epoch its leader still leads, leading is not. A `Fence` (the
 * tablet offline under a newer epoch, or the controller asking this replica's log end to elect a leader) ends a role
 * under an older epoch and raises the epoch the replica has seen, so that its log cannot grow under the old epoch.
 *
 * <!-- transitions -->
 * | from | event | to | commands |
 * |---|---|---|---|
 * | NewReplica | Loaded | OnlineReplica | — |
 * | NewReplica | Fence(epoch > own) | NewReplica | — |
 * | NewReplica | Fence(epoch = own) | NewReplica | — |
 * | NewReplica | Offline | OfflineReplica | CloseLog |
 * | NewReplica | Delete | ReplicaDeleted | CloseLog, DeleteLog |
 * | OnlineReplica | LeaderAndIsr(leader = self) | LeaderReplica | BecomeLeader |
 * | OnlineReplica | LeaderAndIsr(leader = other) | FollowerReplica | BecomeFollower |
 * | OnlineReplica | LeaderAndIsr(epoch = own) | FollowerReplica | BecomeFollower |
 * | OnlineReplica | Fence(epoch > own) | OnlineReplica | — |
 * | OnlineReplica | Fence(epoch = own) | OnlineReplica | — |
 * | OnlineReplica | Offline | OfflineReplica | CloseLog |
 * | OnlineReplica | Delete | ReplicaDeleted | CloseLog, DeleteLog |
 * | LeaderReplica | LeaderAndIsr(epoch > own, leader = self) | LeaderReplica | StopLeading, BecomeLeader |
 * | LeaderReplica | LeaderAndIsr(epoch > own, leader = other) | FollowerReplica | StopLeading, BecomeFollower |
 * | LeaderReplica | Fence(epoch > own) | OnlineReplica | StopLeading |
 * | LeaderReplica | Fence(epoch = own) | LeaderReplica | — |
 * | LeaderReplica | Offline | OfflineReplica | StopLeading, CloseLog |
 * | LeaderReplica | Delete | ReplicaDeleted | StopLeading, CloseLog, DeleteLog |
 * | FollowerReplica | LeaderAndIsr(epoch > own, leader = self) | LeaderReplica | StopFetching, BecomeLeader |
 * | FollowerReplica | LeaderAndIsr(epoch > own, leader = other) | FollowerReplica | StopFetching, BecomeFollower |
 * | FollowerReplica | Fence(epoch > own) | OnlineReplica | StopFetching |
 * | FollowerReplica | Fence(epoch = own) | FollowerReplica | — |
 * | FollowerReplica | Offline | OfflineReplica | StopFetching, CloseLog |
 * | FollowerReplica | Delete | ReplicaDeleted | StopFetching, CloseLog, DeleteLog |
 * | OfflineReplica | Fence(epoch > own) | OfflineReplica | — |
 * | OfflineReplica | Fence(epoch = own) | OfflineReplica | — |
 * | OfflineReplica | Reopen | NewReplica | OpenLog |
 * | OfflineReplica | Delete | ReplicaDeleted | DeleteLog |
 * | ReplicaDeleted | Fence(epoch > own) | ReplicaDeleted | — |
 * | ReplicaDeleted | Fence(epoch = own) | ReplicaDeleted | — |
 * <!-- /transitions -->
 *
 * Everything else is illegal: a LeaderAndIsr whose leader epoch is not above the replica's, or that names a leader
 * outside its own replica list; a role before the log is loaded; any event once deleted. An Offline replica comes
 * back through `Reopen` (its log opened again) and `Loaded`, so it is Online again before it takes a role. A replica
 * in any state but deleted can be deleted (its table was): its role ends, its log closes, its data goes.
 *
 * @since 0.1.0
 */
import { Errors, Models } from "@strata/core"
import { Result } from "effect"

// ---------------------------------------------------------------------------
// States
// ---------------------------------------------------------------------------

/**
 * A replica's state. `lastLeaderEpoch` is the highest leader epoch it has taken a role under (`null`: none yet):
 * a LeaderAndIsr must carry a higher one.
 *
 * @since 0.1.0
 */
export type State =
  | { readonly _tag: "NewReplica"; readonly lastLeaderEpoch: Models.Epoch | null }
  | { readonly _tag: "OnlineReplica"; readonly lastLeaderEpoch: Models.Epoch | null }
  | { readonly _tag: "LeaderReplica"; readonly leaderEpoch: Models.Epoch; readonly isr: ReadonlyArray<Models.ServerId> }
  | { readonly _tag: "FollowerReplica"; readonly leaderEpoch: Models.Epoch; readonly leader: Models.ServerId }
  | { readonly _tag: "OfflineReplica"; readonly lastLeaderEpoch: Models.Epoch | null }
  | { readonly _tag: "ReplicaDeleted" }

/**
 * A replica just assigned here: its log not yet open. The shell creates it with {@link assign}.
 *
 * @since 0.1.0
 */
export const initial: State = { _tag: "NewReplica", lastLeaderEpoch: null }

/**
 * The highest leader epoch a replica in `state` has taken a role under.
 *
 * @since 0.1.0
 */
export const lastLeaderEpoch = (state: State): Models.Epoch | null => {
  switch (state._tag) {
    case "LeaderReplica":
    case "FollowerReplica":
      return state.leaderEpoch
    case "ReplicaDeleted":
      return null
    default:
      return state.lastLeaderEpoch
  }
}

// ---------------------------------------------------------------------------
// Events and commands
// ---------------------------------------------------------------------------

/**
 * What the shell feeds: `Loaded` once the log is open, the coordinator's `LeaderAndIsr` for this tablet, `Fence`
 * when the controller has taken the tablet offline under `leaderEpoch` (with no leader) or asks this replica's log end
 * to elect one, `Offline` when the replica can no longer serve (its store failed, the server is stopping it), `Reopen`
 * to open it again, `Delete` from the coordinator's stop-replica-with-delete.
 *
 * @since 0.1.0
 */
export type Event =
  | { readonly _tag: "Loaded" }
  | {
      readonly _tag: "LeaderAndIsr"
      readonly leader: Models.ServerId
      readonly leaderEpoch: Models.Epoch
      readonly isr: ReadonlyArray<Models.ServerId>
      readonly replicas: ReadonlyArray<Models.ServerId>
    }
  | { readonly _tag: "Fence"; readonly leaderEpoch: Models.Epoch }
  | { readonly _tag: "Offline" }
  | { readonly _tag: "Reopen" }
  | { readonly _tag: "Delete" }

/**
 * What the shell executes, in order, and nothing else.
 *
 * - `OpenLog`: open the tablet's log on the store (then feed `Loaded`).
 * - `BecomeLeader`: start the leader's duties for `leaderEpoch` with this ISR (the epoch cache gets an entry for
 *   the epoch at the log end; followers are tracked from now).
 * - `BecomeFollower`: fetch from `leader` under `leaderEpoch`, truncating first to where the leader's log and this
 *   one agree (the leader's end offset for this replica's last epoch, KIP-279).
 * - `StopLeading` / `StopFetching`: end the current role's work.
 * - `CloseLog` / `DeleteLog`: close the log; delete its data.
 *
 * @since 0.1.0
 */
export type Command =
  | { readonly _tag: "OpenLog" }
  | { readonly _tag: "BecomeLeader"; readonly leaderEpoch: Models.Epoch; readonly isr: ReadonlyArray<Models.ServerId> }
  | { readonly _tag: "BecomeFollower"; readonly leaderEpoch: Models.Epoch; readonly leader: Models.ServerId }
  | { readonly _tag: "StopLeading" }
  | { readonly _tag: "StopFetching" }
  | { readonly _tag: "CloseLog" }
  | { readonly _tag: "DeleteLog" }

/**
 * The outcome of one step: the next state and the commands to run.
 *
 * @since 0.1.0
 */
export type Step = readonly [State, ReadonlyArray<Command>]

/**
 * A new replica of `tablet`: the initial state and the command that opens its log.
 *
 * @since 0.1.0
 */
export const assign: Step = [initial, [{ _tag: "OpenLog" }]]

// ---------------------------------------------------------------------------
// Transition function
// ---------------------------------------------------------------------------

/**
 * A readable name for a state, used in `IllegalStateTransition.from`.
 *
 * @since 0.1.0
 */
export const describeState = (state: State): string => {
  switch (state._tag) {
    case "LeaderReplica":
      return `LeaderReplica(epoch ${state.leaderEpoch})`
    case "FollowerReplica":
      return `FollowerReplica(epoch ${state.leaderEpoch}, leader ${state.leader})`
    default:
      return state._tag
  }
}

/**
 * A readable name for an event, used in `IllegalStateTransition.to`.
 *
 * @since 0.1.0
 */
export const describeEvent = (event: Event): string => {
  switch (event._tag) {
    case "LeaderAndIsr":
      return `LeaderAndIsr(leader ${event.leader}, epoch ${event.leaderEpoch})`
    case "Fence":
      return `Fence(epoch ${event.leaderEpoch})`
    default:
      return event._tag
  }
}

/** The later of a replica's last leader epoch and a fence's. */
const laterEpoch = (last: Models.Epoch | null, fence: Models.Epoch): Models.Epoch =>
  last === null || fence > last ? fence : last

/** The machine's context: which replica it tracks. */
export interface Replica {
  readonly tablet: Models.TabletId
  /** The server this replica is on. */
  readonly self: Models.ServerId
}

const ok = (state: State, commands: ReadonlyArray<Command>): Result.Result<Step, Errors.IllegalStateTransition> =>
  Result.succeed([state, commands] as const)

const illegal = (replica: Replica, state: State, event: Event): Result.Result<Step, Errors.IllegalStateTransition> =>
  Result.fail(
    new Errors.IllegalStateTransition({
      machine: "replica",
      entity: `${Models.tabletKey(replica.tablet)} on server ${replica.self}`,
      from: describeState(state),
      to: describeEvent(event)
    })
  )

/** The role a LeaderAndIsr gives this replica, with the commands that end `stop` first. */
const takeRole = (
  replica: Replica,
  event: Extract<Event, { _tag: "LeaderAndIsr" }>,
  stop: ReadonlyArray<Command>
): Step =>
  event.leader === replica.self
    ? [
        { _tag: "LeaderReplica", leaderEpoch: event.leaderEpoch, isr: event.isr },
        [...stop, { _tag: "BecomeLeader", leaderEpoch: event.leaderEpoch, isr: event.isr }]
      ]
    : [
        { _tag: "FollowerReplica", leaderEpoch: event.leaderEpoch, leader: event.leader },
        [...stop, { _tag: "BecomeFollower", leaderEpoch: event.leaderEpoch, leader: event.leader }]
      ]

/**
 * Whether a LeaderAndIsr can apply to a replica that last saw `last`: a higher epoch (or, `follow`ing from no role,
 * the epoch it had seen), a leader among the replicas.
 */
const admissible = (
  replica: Replica,
  event: Extract<Event, { _tag: "LeaderAndIsr" }>,
  last: Models.Epoch | null,
  follow = false
) =>
  (last === null ||
    event.leaderEpoch > last ||
    (follow && event.leaderEpoch === last && event.leader !== replica.self)) &&
  event.replicas.includes(replica.self) &&
  event.replicas.includes(event.leader)

/**
 * One transition of a replica. Pure and total: every `(state, event)` pair either yields the next state and
 * commands, or an `IllegalStateTransition` naming the replica, `from` and `to`.
 *
 * @since 0.1.0
 */
export const step = (
  replica: Replica,
  state: State,
  event: Event
): Result.Result<Step, Errors.IllegalStateTransition> => {
  switch (state._tag) {
    case "NewReplica":
      if (event._tag === "Loaded") return ok({ _tag: "OnlineReplica", lastLeaderEpoch: state.lastLeaderEpoch }, [])
      if (event._tag === "Offline") {
        return ok({ _tag: "OfflineReplica", lastLeaderEpoch: state.lastLeaderEpoch }, [{ _tag: "CloseLog" }])
      }
      if (event._tag === "Delete") return ok({ _tag: "ReplicaDeleted" }, [{ _tag: "CloseLog" }, { _tag: "DeleteLog" }])
      if (event._tag === "Fence") {
        return ok({ _tag: "NewReplica", lastLeaderEpoch: laterEpoch(state.lastLeaderEpoch, event.leaderEpoch) }, [])
      }
      return illegal(replica, state, event)
    case "OnlineReplica":
      switch (event._tag) {
        case "LeaderAndIsr":
          return admissible(replica, event, state.lastLeaderEpoch, true)
            ? Result.succeed(takeRole(replica, event, []))
            : illegal(replica, state, event)
        case "Fence":
          return ok(
            { _tag: "OnlineReplica", lastLeaderEpoch: laterEpoch(state.lastLeaderEpoch, event.leaderEpoch) },
            []
          )
        case "Offline":
          return ok({ _tag: "OfflineReplica", lastLeaderEpoch: state.lastLeaderEpoch }, [{ _tag: "CloseLog" }])
        case "Delete":
          return ok({ _tag: "ReplicaDeleted" }, [{ _tag: "CloseLog" }, { _tag: "DeleteLog" }])
        default:
          return illegal(replica, state, event)
      }
    case "LeaderReplica":
    case "FollowerReplica": {
      const stop: Command = state._tag === "LeaderReplica" ? { _tag: "StopLeading" } : { _tag: "StopFetching" }
      switch (event._tag) {
        case "LeaderAndIsr":
          // The current role's work ends first, even for a leader re-elected under a newer epoch: that epoch starts
          // afresh (its entry in the epoch cache, its followers' progress).
          return admissible(replica, event, state.leaderEpoch)
            ? Result.succeed(takeRole(replica, event, [stop]))
            : illegal(replica, state, event)
        case "Fence":
          // A role under an older epoch ends: nothing more is appended, acknowledged or copied under it. A fence
          // at or below the role's epoch is stale.
          return event.leaderEpoch > state.leaderEpoch
            ? ok({ _tag: "OnlineReplica", lastLeaderEpoch: event.leaderEpoch }, [stop])
            : ok(state, [])
        case "Offline":
          return ok({ _tag: "OfflineReplica", lastLeaderEpoch: state.leaderEpoch }, [stop, { _tag: "CloseLog" }])
        case "Delete":
          return ok({ _tag: "ReplicaDeleted" }, [stop, { _tag: "CloseLog" }, { _tag: "DeleteLog" }])
        default:
          return illegal(replica, state, event)
      }
    }
    case "OfflineReplica":
      if (event._tag === "Delete") return ok({ _tag: "ReplicaDeleted" }, [{ _tag: "DeleteLog" }])
      if (event._tag === "Fence") {
        return ok({ _tag: "OfflineReplica", lastLeaderEpoch: laterEpoch(state.lastLeaderEpoch, event.leaderEpoch) }, [])
      }
      return event._tag === "Reopen"
        ? ok({ _tag: "NewReplica", lastLeaderEpoch: state.lastLeaderEpoch }, [{ _tag: "OpenLog" }])
        : illegal(replica, state, event)
    case "ReplicaDeleted":
      return event._tag === "Fence" ? ok(state, []) : illegal(replica, state, event)
  }
}
