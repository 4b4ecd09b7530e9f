/**
 * The simulated network: a leader's requests reach the receiver (a tablet
 * server that refuses a stale epoch) after a random delay, and a session's
 * connection can be cut and restored. A client whose connection is cut hears
 * nothing from the server; the server expires the session on its own a
 * session timeout after the cut unless the connection comes back in time.
 */
import type { Coordination } from "@strata/core"
import { Duration, Effect, Latch, type Scope } from "effect"
import type * as Checkers from "./Checkers.js"
import * as Clock from "./Clock.js"
import type * as Prng from "./Prng.js"

/** The network and the receiver at its far end. */
export interface Network {
  readonly clock: Clock.Clock
  readonly rng: Prng.Prng
  /** Where delayed deliveries run. */
  readonly scope: Scope.Scope
  readonly maxDelayMs: number
  /** The planted bug: the receiver accepts every request, whatever its epoch. */
  readonly receiverSkipsEpochCheck: boolean
  readonly cut: NonNullable<Coordination.FaultsShape["disconnect"]>
  readonly restore: NonNullable<Coordination.FaultsShape["reconnect"]>
  /**
   * When the server expires each cut session on its own (the ground truth the deadline checker judges by): its
   * timeout after its connection was cut, forgotten when it is restored in time.
   */
  readonly expiries: Map<string, number>
  /**
   * The sessions whose connection is cut. Their client does not hear from the server: it learns that the session
   * expired meanwhile only once it has reconnected.
   */
  readonly cutOff: Set<string>
  /** Per session, open while its connection is up. */
  readonly links: Map<string, Latch.Latch>
  /** The highest epoch the receiver has seen. */
  highest: number
  readonly deliveries: Array<Checkers.Delivery>
  readonly sent: Array<Checkers.Request>
}

const required = <K extends "disconnect" | "reconnect">(
  faults: Coordination.FaultsShape,
  key: K
): NonNullable<Coordination.FaultsShape[K]> => {
  const f = faults[key]
  if (f === undefined) throw new Error(`the coordination backend cannot ${key} a session`)
  return f
}

/** A network with every connection up, on a backend that can cut and restore them. */
export const make = (options: {
  readonly clock: Clock.Clock
  readonly rng: Prng.Prng
  readonly scope: Scope.Scope
  readonly maxDelayMs: number
  readonly receiverSkipsEpochCheck: boolean
  readonly faults: Coordination.FaultsShape
}): Network => ({
  clock: options.clock,
  rng: options.rng,
  scope: options.scope,
  maxDelayMs: options.maxDelayMs,
  receiverSkipsEpochCheck: options.receiverSkipsEpochCheck,
  cut: required(options.faults, "disconnect"),
  restore: required(options.faults, "reconnect"),
  expiries: new Map(),
  cutOff: new Set(),
  links: new Map(),
  highest: 0,
  deliveries: [],
  sent: []
})

/** The latch that is open while the session's connection is up. */
export const linkOf = (n: Network, s: Coordination.Session): Latch.Latch => {
  let link = n.links.get(s.id)
  if (link === undefined) {
    link = Latch.makeUnsafe(true)
    n.links.set(s.id, link)
  }
  return link
}

/** Whether the session's connection is cut. */
export const isCutOff = (n: Network, s: Coordination.Session): boolean => n.cutOff.has(s.id)

/** Cuts the session's connection; the server will expire it a session timeout from now. */
export const disconnect = (n: Network, s: Coordination.Session): Effect.Effect<void, Coordination.CoordinationError> =>
  Effect.flatMap(s.state, (state) => {
    if (state === "connected" && !n.expiries.has(s.id)) {
      n.expiries.set(s.id, Clock.now(n.clock) + Duration.toMillis(s.timeout))
    }
    n.cutOff.add(s.id)
    return Effect.andThen(linkOf(n, s).close, n.cut(s))
  })

/** Restores the session's connection; a session still alive on the server is no longer due to expire. */
export const reconnect = (n: Network, s: Coordination.Session): Effect.Effect<void, Coordination.CoordinationError> =>
  Effect.gen(function* () {
    yield* n.restore(s)
    if ((yield* s.state) === "connected") n.expiries.delete(s.id)
    n.cutOff.delete(s.id)
    yield* linkOf(n, s).open
  })

/** The receiver handles a request: it accepts one whose epoch is at least the highest it has seen. */
const deliver = (n: Network, request: Checkers.Request) =>
  Effect.sync(() => {
    const accepted = n.receiverSkipsEpochCheck || request.epoch >= n.highest
    n.highest = Math.max(n.highest, request.epoch)
    n.deliveries.push({ request, accepted, at: Clock.now(n.clock) })
    Clock.log(
      n.clock,
      `receiver ${accepted ? "accepts" : "rejects"} p${request.process} e${request.epoch} #${request.n} (term ${request.term})`
    )
  })

/** Sends a request to the receiver: usually within 30 ms, sometimes up to `maxDelayMs` late. */
export const send = (n: Network, request: Checkers.Request) => {
  const delay = n.rng.chance(0.3) ? n.rng.int(0, n.maxDelayMs) : n.rng.int(0, 30)
  Clock.log(
    n.clock,
    `p${request.process} sends e${request.epoch} #${request.n} (term ${request.term}), delay ${delay}ms`
  )
  n.sent.push(request)
  return Effect.forkIn(Effect.andThen(Effect.sleep(Duration.millis(delay)), deliver(n, request)), n.scope)
}
