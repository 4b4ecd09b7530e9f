/**
 * The simulated network between the processes and the clients: cut links (both ways, or one way only), processes
 * the controllers cannot reach, slow processes, and each call's fate — delayed both ways (so reordered), maybe lost
 * before or after its target ran it, maybe duplicated, maybe given up on by its caller. A call runs on its target as
 * that process, reading its wall clock.
 */
import { Clock, Duration, Effect, Fiber } from "effect"
import { PeerUnreachable } from "../../src/wire/Peers.js"
import type { Proc, World } from "./World.js"

/** What is cut, and what is slow. */
export interface Network {
  /** Links cut both ways (`link(a, b)`). */
  readonly cuts: Set<string>
  /** Links cut one way only (`from>to`): from's requests to `to` are lost, and to's answers to from's. */
  readonly oneWay: Set<string>
  /** Processes whose every call, in and out, is slow. */
  readonly slow: Set<string>
  /**
   * Servers the controllers' own connections to are cut (Kafka's controller-to-broker channel): the controllers'
   * requests to them are lost, while their requests to a controller, and its answers, pass.
   */
  readonly unheard: Set<string>
  /** Isolated processes, each cut from everyone until a step. */
  readonly isolations: Array<{ name: string; until: number }>
  /** Cut links that heal at a step. */
  readonly linkCuts: Array<{ key: string; until: number }>
}

/** A network with every link up. */
export const make = (): Network => ({
  cuts: new Set(),
  oneWay: new Set(),
  slow: new Set(),
  unheard: new Set(),
  isolations: [],
  linkCuts: []
})

/** The key of the link between `a` and `b`, either way. */
export const link = (a: string, b: string): string => (a < b ? `${a}|${b}` : `${b}|${a}`)

/** Whether a packet from `from` reaches `to`: both running (or not processes), and no cut between them. */
export const reachable = (w: World, from: string, to: string): boolean => {
  const a = w.byName.get(from)
  const b = w.byName.get(to)
  const up = (p: Proc | undefined) => p === undefined || p.scope !== undefined
  return up(a) && up(b) && !w.network.cuts.has(link(from, to)) && !w.network.oneWay.has(`${from}>${to}`)
}

/**
 * Waits while the process `name` is paused, as a stopped process's sockets hold what it sends and what reaches it
 * until it runs again; false if it went down meanwhile.
 */
const thawed = (w: World, name: string) =>
  Effect.gen(function* () {
    const p = w.byName.get(name)
    if (p === undefined || !p.paused) return true
    const incarnation = p.incarnation
    while (p.paused && p.scope !== undefined && p.incarnation === incarnation) yield* Effect.sleep(Duration.millis(10))
    return p.scope !== undefined && p.incarnation === incarnation
  })

/** The failure of a call that did not get through. */
export const unreachable = (to: string, detail: string): PeerUnreachable => new PeerUnreachable({ target: to, detail })

/**
 * A call from `from` to `to`: delayed both ways (so reordered), maybe lost before or after `to` ran it, maybe
 * duplicated. The request travels on its own: once sent it arrives even if the sender dies meanwhile, as a
 * packet in flight does. A paused process sends once it resumes, and what reaches it waits for it: a call to
 * it is run, and an answer to it taken, late (unless the caller gave up). Sometimes the caller gives up after a
 * timeout, and the handler is interrupted wherever it is, as Effect RPC interrupts a handler whose client timed
 * out or went away.
 */
export const call = <A, E>(
  w: World,
  from: string,
  to: string,
  request: Effect.Effect<A, E>
): Effect.Effect<A, E | PeerUnreachable> =>
  Effect.gen(function* () {
    const { rng, root } = w
    const delay = () =>
      (w.faultsOn && rng.chance(0.1) ? rng.int(20, 400) : rng.int(0, 10)) +
      (w.faultsOn && (w.network.slow.has(from) || w.network.slow.has(to)) ? rng.int(50, 400) : 0)
    if (!(yield* thawed(w, from))) return yield* Effect.fail(unreachable(to, "the caller went down"))
    const packet = Effect.gen(function* () {
      yield* Effect.sleep(Duration.millis(delay()))
      if (!(yield* thawed(w, to)) || !reachable(w, from, to)) return yield* Effect.fail(unreachable(to, "no route"))
      if (w.faultsOn && rng.chance(0.01)) return yield* Effect.fail(unreachable(to, "request lost"))
      if (w.faultsOn && rng.chance(0.01)) yield* Effect.forkIn(Effect.ignore(asProcess(w, to, request)), root)
      return yield* asProcess(w, to, request)
    })
    const arrived = yield* Effect.forkIn(packet, root)
    const timeoutMs = w.faultsOn && rng.chance(0.05) ? rng.int(1, 300) : undefined
    if (timeoutMs !== undefined) {
      const answered = yield* Fiber.await(arrived).pipe(Effect.timeoutOption(Duration.millis(timeoutMs)))
      if (answered._tag === "None") {
        yield* Effect.forkIn(Fiber.interrupt(arrived), root)
        return yield* Effect.fail(unreachable(to, "timed out"))
      }
    }
    // A caller that gives up (its own timeout, its client closing) interrupts the handler, wherever it is.
    const answer = yield* Fiber.join(arrived).pipe(
      Effect.onInterrupt(() => Effect.asVoid(Effect.forkIn(Fiber.interrupt(arrived), root)))
    )
    yield* Effect.sleep(Duration.millis(delay()))
    if (!(yield* thawed(w, from)) || !reachable(w, to, from))
      return yield* Effect.fail(unreachable(to, "answer lost (no route)"))
    if (w.faultsOn && rng.chance(0.01)) return yield* Effect.fail(unreachable(to, "answer lost"))
    return answer
  })

/** The wall clock process `p` reads: the simulation's, off by its offset; sleeping is the simulation's. */
export const clockOf = (w: World, p: Proc): Clock.Clock => {
  const simClock: Clock.Clock = w.clock.test
  return {
    currentTimeMillisUnsafe: () => simClock.currentTimeMillisUnsafe() + p.clockOffsetMs,
    currentTimeMillis: Effect.sync(() => simClock.currentTimeMillisUnsafe() + p.clockOffsetMs),
    currentTimeNanosUnsafe: () => simClock.currentTimeNanosUnsafe() + BigInt(p.clockOffsetMs) * 1_000_000n,
    currentTimeNanos: Effect.sync(() => simClock.currentTimeNanosUnsafe() + BigInt(p.clockOffsetMs) * 1_000_000n),
    monotonicTimeNanosUnsafe: () => simClock.monotonicTimeNanosUnsafe(),
    monotonicTimeNanos: simClock.monotonicTimeNanos,
    sleep: (duration) => simClock.sleep(duration)
  }
}

/** Runs `effect` as process `name` (its clock), or as it is for a name that is no process (the client). */
export const asProcess = <A, E, R>(w: World, name: string, effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> => {
  const p = w.byName.get(name)
  return p === undefined ? effect : Effect.provideService(effect, Clock.Clock, clockOf(w, p))
}
