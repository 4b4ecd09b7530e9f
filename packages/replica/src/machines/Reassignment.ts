/**
 * A move of one tablet's replica set (Kafka's KIP-455 reassignment, in the seed's three steps), as the controller's
 * machine stores and judges it. Pure: `ControllerState` drives it.
 *
 * While a tablet moves it keeps its `original` replica set and its `target`; its replicas are the target's followed
 * by the original's leaving ones, so the adding replicas are followers of the leader and copy its log. Once every
 * target replica is in the ISR, one write makes the target the tablet's replicas under the next leader epoch — led
 * by its leader when it stays, else by the first target replica in the ISR — and the leaving replicas are told to
 * delete themselves (they are `retired` until they have). A cancel returns the tablet to its original replicas the
 * same way, the adding ones retired.
 *
 * A move may name a replication throttle (Kafka's reassignment throttle): while it is under way, the adding replicas
 * other than the leader copy the leader's log at most that fast (`throttleOf`); it goes with the move.
 *
 * @since 0.1.0
 */
import { Models } from "@strata/core"
import { Schema } from "effect"

/**
 * A tablet's move under way, stored with the tablet.
 *
 * @since 0.1.0
 */
export interface Reassignment {
  /** The replicas the tablet had when the move began (it returns to them when the move is cancelled). */
  readonly original: ReadonlyArray<Models.ServerId>
  /** The replicas it ends with, in assignment order (the first is the preferred leader). */
  readonly target: ReadonlyArray<Models.ServerId>
  /**
   * The most bytes a second the adding replicas' follower fetches copy, on each of their servers (absent:
   * unthrottled).
   */
  readonly throttleBytesPerSec?: number | undefined
}

/**
 * Why a reassignment (or its cancel) was refused.
 *
 * @since 0.1.0
 */
export const Refusal = Schema.Union([
  Schema.TaggedStruct("UnknownTablet", {}),
  Schema.TaggedStruct("TabletDeleting", {}),
  Schema.TaggedStruct("TabletOffline", {}),
  Schema.TaggedStruct("EmptyTarget", {}),
  Schema.TaggedStruct("DuplicateServer", { server: Models.ServerId }),
  Schema.TaggedStruct("UnknownServer", { server: Models.ServerId }),
  Schema.TaggedStruct("DeadServer", { server: Models.ServerId }),
  Schema.TaggedStruct("ShuttingDown", { server: Models.ServerId }),
  Schema.TaggedStruct("StillRetiring", { server: Models.ServerId }),
  Schema.TaggedStruct("ReplicationFactor", { replicas: Schema.Int, minInsyncReplicas: Schema.Int }),
  Schema.TaggedStruct("AlreadyMoving", { target: Schema.Array(Models.ServerId) }),
  Schema.TaggedStruct("NotMoving", {}),
  Schema.TaggedStruct("NoOriginalInSync", {}),
  Schema.TaggedStruct("OriginalUnderMinIsr", {
    inSync: Schema.Array(Models.ServerId),
    minInsyncReplicas: Schema.Int
  }),
  Schema.TaggedStruct("ElectionPending", {}),
  Schema.TaggedStruct("InvalidThrottle", { throttleBytesPerSec: Schema.Number })
])

/**
 * A refusal's type.
 *
 * @since 0.1.0
 */
export type Refusal = typeof Refusal.Type

/**
 * A refusal as one line naming what was wrong.
 *
 * @since 0.1.0
 */
export const describeRefusal = (tablet: string, refusal: Refusal): string => {
  switch (refusal._tag) {
    case "UnknownTablet":
      return `no tablet ${tablet}`
    case "TabletDeleting":
      return `${tablet} is being deleted`
    case "TabletOffline":
      return `${tablet} is offline: no leader for new replicas to copy from`
    case "EmptyTarget":
      return `${tablet}: the target replica set is empty`
    case "DuplicateServer":
      return `${tablet}: server ${refusal.server} is named twice in the target replica set`
    case "UnknownServer":
      return `${tablet}: server ${refusal.server} is not a server of the cluster`
    case "DeadServer":
      return `${tablet}: server ${refusal.server} is not registered (down)`
    case "ShuttingDown":
      return `${tablet}: server ${refusal.server} is shutting down`
    case "StillRetiring":
      return `${tablet}: server ${refusal.server} has not yet deleted the replica it held before`
    case "ReplicationFactor":
      return `${tablet}: ${refusal.replicas} target replicas, minInsyncReplicas is ${refusal.minInsyncReplicas}: no append could be acknowledged`
    case "AlreadyMoving":
      return `${tablet} is already moving to [${refusal.target.join(",")}]: cancel that move first`
    case "NotMoving":
      return `${tablet} is not moving`
    case "NoOriginalInSync":
      return `${tablet}: no replica of its original set is in sync to lead; cancelling would lose acknowledged records (let the move finish)`
    case "OriginalUnderMinIsr":
      return `${tablet}: only [${refusal.inSync.join(",")}] of its original replicas are in sync, fewer than minInsyncReplicas ${refusal.minInsyncReplicas}, and an adding replica in the ISR holds the acknowledged records: cancelling would drop a copy they count on (let the move finish)`
    case "ElectionPending":
      return `${tablet}: an election is under way; try again once it has a leader`
    case "InvalidThrottle":
      return `${tablet}: the replication throttle must be a whole number of bytes a second ≥ 1, not ${refusal.throttleBytesPerSec}`
  }
}

/**
 * The replicas a move adds.
 *
 * @since 0.1.0
 */
export const adding = (r: Reassignment): ReadonlyArray<Models.ServerId> =>
  r.target.filter((s) => !r.original.includes(s))

/**
 * The replicas a move removes.
 *
 * @since 0.1.0
 */
export const removing = (r: Reassignment): ReadonlyArray<Models.ServerId> =>
  r.original.filter((s) => !r.target.includes(s))

/**
 * The replication throttle `server`'s replica of a tablet moving as `r` and led by `leader` fetches under: the move's,
 * for an adding replica that does not lead; `undefined` for every other (and when the move names none).
 *
 * @since 0.1.0
 */
export const throttleOf = (
  r: Reassignment | undefined,
  server: Models.ServerId,
  leader: Models.ServerId | null
): number | undefined =>
  r?.throttleBytesPerSec === undefined || server === leader || r.original.includes(server) || !r.target.includes(server)
    ? undefined
    : r.throttleBytesPerSec

/**
 * Whether `throttle` is one a move can name: absent, or a whole number of bytes a second ≥ 1.
 *
 * @since 0.1.0
 */
export const validThrottle = (throttle: number | undefined): boolean =>
  throttle === undefined || (Number.isSafeInteger(throttle) && throttle >= 1)

/**
 * A moving tablet's replicas: the target's, then the original's leaving ones.
 *
 * @since 0.1.0
 */
export const replicasDuring = (r: Reassignment): ReadonlyArray<Models.ServerId> => [...r.target, ...removing(r)]

/**
 * Whether two replica lists are the same, in the same order.
 *
 * @since 0.1.0
 */
export const sameReplicas = (a: ReadonlyArray<Models.ServerId>, b: ReadonlyArray<Models.ServerId>): boolean =>
  a.length === b.length && a.every((s, i) => b[i] === s)

/**
 * What the controller knows of the servers, as a target is judged against it.
 *
 * @since 0.1.0
 */
export interface Servers {
  /** Registered now. */
  readonly live: ReadonlySet<Models.ServerId>
  /** Registered now or before, or holding some tablet's replica. */
  readonly known: (server: Models.ServerId) => boolean
  readonly shuttingDown: ReadonlySet<Models.ServerId>
  readonly minInsyncReplicas: number
}

/**
 * Why `target` cannot be a tablet's replica set, if it cannot: empty, a server twice, too few for
 * `minInsyncReplicas`, or a server that is unknown, down, shutting down, or still deleting what it held of the
 * tablet (`retired`). A server the tablet already has is judged too: the move must be able to finish.
 *
 * @since 0.1.0
 */
export const refuseTarget = (
  servers: Servers,
  target: ReadonlyArray<Models.ServerId>,
  retired: ReadonlyArray<Models.ServerId>
): Refusal | undefined => {
  if (target.length === 0) return { _tag: "EmptyTarget" }
  const twice = target.find((s, i) => target.indexOf(s) !== i)
  if (twice !== undefined) return { _tag: "DuplicateServer", server: twice }
  for (const s of target) {
    if (!servers.known(s)) return { _tag: "UnknownServer", server: s }
    if (!servers.live.has(s)) return { _tag: "DeadServer", server: s }
    if (servers.shuttingDown.has(s)) return { _tag: "ShuttingDown", server: s }
    if (retired.includes(s)) return { _tag: "StillRetiring", server: s }
  }
  if (target.length < servers.minInsyncReplicas) {
    return { _tag: "ReplicationFactor", replicas: target.length, minInsyncReplicas: servers.minInsyncReplicas }
  }
  return undefined
}
