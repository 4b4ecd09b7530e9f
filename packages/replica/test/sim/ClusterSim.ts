/**
 * Deterministic simulation of a whole replicated cluster (TigerBeetle's VOPR: one seed draws everything). The
 * simulator runs the real parts — `TabletServer` (with `ReplicaState`, `LeaderState`, `FollowerState`, `TabletLog`
 * on a memory store each), coordinators running the election with the real `Controller` as their leader service —
 * on one memory coordination service and an in-memory network, on `TestClock`. It has no copy of their logic.
 *
 * A seed draws: 3–7 tablet servers, 1–3 coordinators, 1–3 tablets with their replication factor and minimum ISR,
 * the session timeout, how often each server flushes its writes, the controller's election rule (first in the ISR
 * or largest log end), 1–3 idempotent acks=all producers, and the
 * faults: crash (kill -9: the sessions are left to expire) and restart on the same store, power loss (a crash whose
 * store, `LossyStore`, loses every write since its last flush; with a minimum ISR of 2, the other servers having
 * just flushed, so that an acknowledged record always keeps one copy), clean stop, pause past the session timeout, session expiry, isolating a
 * process, cutting one link, and per call: delay (so reordering), loss before or after the target ran it, and
 * duplication. Half the seeds draw only a few fault kinds (swarm testing), and half of those send some records
 * acks=1; half the seeds also transfer a leadership under lag (a follower behind, another deaf to the controllers,
 * the leader shut down), half draw storage and clock faults (a slow disk, a disk failing some writes, a wall
 * clock jump, power lost on two servers at once with a minimum ISR of 3), and half churn an ISR (the leader's ISR
 * answers each held until its next proposal, a follower whose sessions expire again and again and that stalls,
 * loses power, or is added just as its leader is partitioned from the controllers with the clients). Then the faults
 * stop, everything heals, and the run must settle.
 *
 * Checked (`Checkers.ts`): no acknowledged write lost, no record twice; the prefix property across replicas, and
 * after every step across a tablet's committed ISR (each member holds its leader's log below the HW); at
 * most one leader per tablet and leader epoch; a leader's HW never decreases and never passes its log end; a tablet
 * server never applies a LeaderAndIsr below the highest coordinator epoch it has applied; an ISR never gains a
 * server that is not registered; and liveness: every tablet has a leader with its full ISR and takes an acks=all
 * append within a bound once the faults stop.
 */
import { CoordinationElection, Coordinator } from "@strata/election"
import {
  Coordination,
  type CoordinationError,
  CoordinationFaults,
  type CoordinationShape,
  Election,
  type LeaderAndIsrRequest,
  type ReplicaError,
  type Session,
  type TabletId,
  tabletKey,
  MemoryCoordination
} from "@strata/core"
import { Clock, Context, Duration, Effect, Exit, Fiber, Latch, Logger, References, Scope } from "effect"
import * as EffectResult from "effect/Result"
import { TestClock } from "effect/testing"
import { mix32, type Prng, seeded } from "../../../../scripts/test-support/prng.js"
import * as ClusterPaths from "../../src/wire/ClusterPaths.js"
import * as Controller from "../../src/server/Controller.js"
import type { LeaderEpochCache } from "../../src/machines/LeaderEpochCache.js"
import * as ControllerView from "../../src/server/ControllerView.js"
import { Peers, PeerUnreachable, type PeersShape } from "../../src/wire/Peers.js"
import * as RemotePeers from "../../src/client/RemotePeers.js"
import * as ReplicaState from "../../src/machines/ReplicaState.js"
import * as TabletClient from "../../src/client/TabletClient.js"
import * as TabletServer from "../../src/server/TabletServer.js"
import * as Checkers from "./Checkers.js"
import * as LossyStore from "./LossyStore.js"
import * as MemoryTransport from "./MemoryTransport.js"
import * as Mutants from "../support/mutants.js"
import * as ControllerState from "../../src/machines/ControllerState.js"
import * as ControllerRpc from "../../src/server/ControllerRpc.js"
import * as TabletServerRpc from "../../src/server/TabletServerRpc.js"

/** Which safety checks are deliberately broken in a run. */
export interface Variant {
  readonly name: string
  /** The tablet servers' machines with planted bugs (production's when omitted). */
  readonly machines?: TabletServer.MachinesShape
  /** The controller's machine with a planted bug (production's when omitted). */
  readonly controller?: ControllerState.StepFunction
  /** Producers draw their ids at random from a small range instead of asking the controller for one. */
  readonly randomProducerIds?: boolean
}

/** The correct system. */
export const correct: Variant = { name: "correct" }

/**
 * The planted bugs some seed within the CI's seeds catches by a loss, divergence or liveness property (the ISR check,
 * a divergence between a member an election may choose and its leader, included).
 */
export const planted: ReadonlyArray<Variant> = [
  { name: "truncate-to-hw", machines: Mutants.machinesWith(Mutants.truncateToHighWatermark) },
  { name: "hw-under-min-isr", machines: Mutants.machinesWith(Mutants.highWatermarkIgnoresMinIsr) },
  { name: "prefer-outside-isr", controller: Mutants.preferOutsideIsr(ControllerState.step) },
  { name: "random-producer-id", randomProducerIds: true },
  { name: "demoted-long-poll", machines: Mutants.machinesWith(Mutants.skipFetchRevalidation) },
  { name: "unfenced-log-end", machines: Mutants.machinesWith(Mutants.unfencedLogEnd) },
  { name: "stale-isr-answer", machines: Mutants.machinesWith(Mutants.answersIgnoreProposal) },
  { name: "isr-to-dead-server", controller: Mutants.skipIsrEligibility(ControllerState.step) },
  { name: "fenced-refusal-rejects", machines: Mutants.machinesWith(Mutants.fencedRefusalRejects) }
]

/** The kinds of fault. */
export type FaultKind =
  | "crash"
  | "power"
  | "stop"
  | "pause"
  | "expire"
  | "isolate"
  | "cut"
  | "oneway"
  | "slow"
  | "coordination"
  | "disk"
  | "shutdown"

const faultWeights: ReadonlyArray<readonly [FaultKind, number]> = [
  ["crash", 15],
  ["power", 9],
  ["stop", 7],
  ["pause", 14],
  ["expire", 10],
  ["isolate", 10],
  ["cut", 9],
  ["oneway", 8],
  ["slow", 8],
  ["coordination", 5],
  ["disk", 6],
  ["shutdown", 5]
]

/**
 * The faults a seed draws from. Half the seeds draw from every kind; the other half (swarm testing) from a few kinds
 * only, chosen by a generator of their own, so that rare combinations (a lagging replica, a slow process and a
 * leadership move at once) come up far more often than when every kind dilutes the others. Seeds of the first half
 * keep the histories they had before swarms.
 */
const faultsOf = (
  seed: number
): {
  readonly kinds: ReadonlyArray<readonly [FaultKind, number]>
  readonly swarm: boolean
  readonly acksOne: boolean
} => {
  const swarm = seeded(mix32(seed ^ 0x5a7f))
  if (!swarm.chance(0.5)) return { kinds: faultWeights, swarm: false, acksOne: false }
  const kinds = faultWeights.filter(() => swarm.chance(0.35))
  return { kinds: kinds.length > 0 ? kinds : [swarm.pick(faultWeights)], swarm: true, acksOne: swarm.chance(0.5) }
}

/** Who a scripted fault strikes: a process, the leader of a tablet when it strikes, or everyone of a kind. */
export type Target = string | { readonly leaderOf: number } | "all-servers" | "all"

/** A fault at a chosen step (scenario tests), lasting until step `until`. */
export interface Planned {
  readonly step: number
  readonly fault: FaultKind
  readonly target: Target
  readonly until: number
}

/** The cluster's shape, when a scenario fixes it instead of the seed. */
export interface Shape {
  readonly servers: number
  readonly coordinators: number
  readonly tablets: number
  readonly replicationFactor: number
  readonly minInsyncReplicas: number
  readonly sessionTimeoutMs: number
  readonly replicaLagTimeMaxMs: number
  readonly producers: number
  /** How the controller elects (`first-in-isr` unless given). */
  readonly leaderElection?: "first-in-isr" | "largest-log-end"
}

/** The shape of a run, in virtual milliseconds. */
export interface Config {
  readonly steps: number
  readonly stepMs: number
  readonly faultChance: number
  /** How long the cluster may take to settle once the faults stop. */
  readonly settleMs: number
  /** A fixed shape instead of the seed's. */
  readonly shape?: Shape
  /** Faults at chosen steps instead of random ones. */
  readonly script?: ReadonlyArray<Planned>
  /** The processes' log lines from this level on go into the trace (default: errors; `STRATA_SIM_LOG=info`). */
  readonly logLevel?: "Error" | "Warn" | "Info"
  /** The chance a server flushes its writes in a step, instead of the seed's (0.05, 0.2 or 0.5). */
  readonly flushChance?: number
}

/** About 8 virtual seconds of faults, then up to 30 s to settle. */
export const defaultConfig: Config = { steps: 80, stepMs: 100, faultChance: 0.15, settleMs: 30_000 }

/** Counts of what happened, to show a run exercised the system. */
export interface Stats {
  readonly servers: number
  readonly coordinators: number
  readonly acked: number
  readonly failed: number
  readonly unknown: number
  /** Records a consumer was given. */
  readonly reads: number
  readonly faults: Record<string, number>
  readonly leaderChanges: number
  readonly coordinatorEpochs: number
  /** The longest run of steps in which some created tablet had no leader in coordination. */
  readonly longestLeaderless: number
  /** Writes lost by power losses (each undone store write counts once). */
  readonly lostWrites: number
}

/** The outcome of one seed. */
export interface Result {
  readonly seed: number
  readonly variant: string
  readonly violations: ReadonlyArray<string>
  readonly trace: ReadonlyArray<string>
  readonly stats: Stats
}

const NAMESPACE = "/sim"
const paths = ClusterPaths.make(NAMESPACE)
const encoder = new TextEncoder()
const decoder = new TextDecoder()

/** One simulated process: a tablet server or a coordinator. */
interface Proc {
  readonly name: string
  readonly kind: "server" | "coordinator"
  readonly id: number
  /** The running incarnation's scope, `undefined` while down. */
  scope: Scope.Closeable | undefined
  incarnation: number
  crashed: boolean
  paused: boolean
  /** Its live sessions, so faults can cut or expire them. */
  readonly sessions: Set<Session>
  server: TabletServer.TabletServerShape | undefined
  /** The running incarnation's registration (the creation order of its node), once it has one and while it lasts. */
  registration: number | undefined
  /** How far its wall clock is off the simulation's (a clock that jumped); its timers are unaffected. */
  clockOffsetMs: number
  /** The server's LeaderAndIsr as the controller reaches it (recorded for the coordinator-epoch check). */
  serverInbox: ((request: LeaderAndIsrRequest) => Effect.Effect<void, ReplicaError>) | undefined
  controller: Controller.ControllerShape | undefined
  /** The step at which a downed or paused process comes back. */
  backAt: number | undefined
  /** In a controlled shutdown that has not stopped it yet. */
  stopping: boolean
  /** Closed while paused: every coordination operation of the process waits on it. */
  readonly gate: Latch.Latch
}

const simulate = (
  seed: number,
  variant: Variant,
  config: Config
): Effect.Effect<Result, CoordinationError, Coordination | CoordinationFaults | Scope.Scope> =>
  Effect.gen(function* () {
    const rng: Prng = seeded(seed)
    const root = yield* Effect.scope
    const base = yield* Coordination
    const faults = yield* CoordinationFaults
    const clock = yield* TestClock.testClockWith(Effect.succeed)
    const simClock: Clock.Clock = clock
    const now = () => clock.currentTimeMillisUnsafe()
    const trace: Array<string> = []
    let finished = false
    const log = (line: string) => {
      if (!finished) trace.push(`t=${now()} ${line}`)
    }
    const faultCounts: Record<string, number> = {}
    const count = (kind: string) => {
      faultCounts[kind] = (faultCounts[kind] ?? 0) + 1
    }

    // --- the cluster's shape, drawn from the seed ---------------------------------------------
    const shape = config.shape
    const serverCount = shape?.servers ?? rng.int(3, 7)
    const coordinatorCount = shape?.coordinators ?? rng.int(1, 3)
    const sessionTimeoutMs = shape?.sessionTimeoutMs ?? 100 * rng.int(5, 12)
    const replicaLagTimeMaxMs = shape?.replicaLagTimeMaxMs ?? sessionTimeoutMs * rng.int(2, 4)
    const replication = {
      replicationFactor: shape?.replicationFactor ?? Math.min(serverCount, rng.int(2, 3)),
      minInsyncReplicas: 1,
      sessionTimeoutMs,
      replicaLagTimeMaxMs,
      // Long polls as long as a leader change (up to the longest the lag time allows): a poll admitted under one
      // epoch may wake in the next.
      fetchMaxWaitMs: rng.pick([50, 200, 400, Math.floor(replicaLagTimeMaxMs / 2) - 1]),
      retryBackoffMs: 50,
      appendTimeoutMs: 2_000
    }
    const rf = replication.replicationFactor
    // Half the seeds also draw storage and clock faults, by a generator of their own: a slow disk, a disk that fails
    // some writes, a wall clock that jumps, and, with a minimum ISR of 3 (which some of them take), power lost on two
    // servers at once.
    const extraDraws = seeded(mix32(seed ^ 0x3c9e))
    const extras = shape === undefined && config.script === undefined && extraDraws.chance(0.5) ? extraDraws : undefined
    const minIsr =
      shape?.minInsyncReplicas ??
      ((drawn) => (extras !== undefined && rf >= 3 && extras.chance(0.4) ? 3 : drawn))(
        rng.chance(0.7) ? Math.min(2, rf) : 1
      )
    const config0 = { ...replication, minInsyncReplicas: minIsr }
    const tablets: Array<TabletId> = Array.from({ length: shape?.tablets ?? rng.int(1, 3) }, (_, bucket) => ({
      table: "t",
      bucket
    }))
    const record = Checkers.recorder(minIsr)
    const flushChance = config.flushChance ?? rng.pick([0.05, 0.2, 0.5])
    const drawn = faultsOf(seed)
    // Half the seeds also transfer leaderships under lag, drawn by a generator of their own.
    const transferring = seeded(mix32(seed ^ 0x7a11))
    const transfers = config.script === undefined && transferring.chance(0.5) ? transferring : undefined
    // Half the seeds also churn an ISR (late answers, a flapping follower), drawn by a generator of their own.
    const churnDraws = seeded(mix32(seed ^ 0x15c4))
    const churning = config.script === undefined && churnDraws.chance(0.5) ? churnDraws : undefined
    const faultWeightTotal = drawn.kinds.reduce((n, [, w]) => n + w, 0)
    const leaderElection =
      shape === undefined
        ? rng.pick(["first-in-isr", "largest-log-end"] as const)
        : (shape.leaderElection ?? "first-in-isr")
    let lostWrites = 0
    log(
      `seed=${seed} servers=${serverCount} coordinators=${coordinatorCount} session=${sessionTimeoutMs}ms poll=${replication.fetchMaxWaitMs}ms rf=${rf} minIsr=${minIsr} tablets=${tablets.length} flush=${flushChance} election=${leaderElection}${drawn.swarm ? ` faults=${drawn.kinds.map(([k]) => k).join(",")}${drawn.acksOne ? " acks=1 too" : ""}` : ""}${transfers === undefined ? "" : " transfers"}${churning === undefined ? "" : " churn"}${extras === undefined ? "" : " disk-and-clock"}`
    )

    const auditor = yield* base.session({ timeout: "1 hour" })
    const procs: Array<Proc> = []
    const proc = (kind: Proc["kind"], id: number): Proc => ({
      name: kind === "server" ? `s${id}` : `c${id}`,
      kind,
      id,
      scope: undefined,
      incarnation: 0,
      registration: undefined,
      clockOffsetMs: 0,
      crashed: false,
      paused: false,
      sessions: new Set(),
      server: undefined,
      serverInbox: undefined,
      controller: undefined,
      backAt: undefined,
      stopping: false,
      gate: Latch.makeUnsafe(true)
    })
    const servers = Array.from({ length: serverCount }, (_, i) => proc("server", i + 1))
    const coordinators = Array.from({ length: coordinatorCount }, (_, i) => proc("coordinator", 101 + i))
    procs.push(...servers, ...coordinators)
    const byName = new Map(procs.map((p) => [p.name, p]))
    const stores = new Map<number, LossyStore.LossyStore>()
    /** A downed server's closing (and, after a crash that loses unflushed writes, its loss), awaited by its start. */
    const closing = new Map<number, Fiber.Fiber<void>>()

    // --- the network ----------------------------------------------------------------------------
    const cuts = new Set<string>()
    const link = (a: string, b: string) => (a < b ? `${a}|${b}` : `${b}|${a}`)
    /** Links cut one way only (`from>to`): from's requests to `to` are lost, and to's answers to from's. */
    const oneWay = new Set<string>()
    /** Processes whose every call, in and out, is slow. */
    const slow = new Set<string>()
    /**
     * Servers the controllers' own connections to are cut (Kafka's controller-to-broker channel): the controllers'
     * requests to them are lost, while their requests to a controller, and its answers, pass.
     */
    const unheard = new Set<string>()
    let faultsOn = true
    const reachable = (from: string, to: string) => {
      const a = byName.get(from)
      const b = byName.get(to)
      const up = (p: Proc | undefined) => p === undefined || p.scope !== undefined
      return up(a) && up(b) && !cuts.has(link(from, to)) && !oneWay.has(`${from}>${to}`)
    }
    /**
     * Waits while the process `name` is paused, as a stopped process's sockets hold what it sends and what reaches it
     * until it runs again; false if it went down meanwhile.
     */
    const thawed = (name: string) =>
      Effect.gen(function* () {
        const p = byName.get(name)
        if (p === undefined || !p.paused) return true
        const incarnation = p.incarnation
        while (p.paused && p.scope !== undefined && p.incarnation === incarnation)
          yield* Effect.sleep(Duration.millis(10))
        return p.scope !== undefined && p.incarnation === incarnation
      })
    const unreachable = (to: string, detail: string) => new PeerUnreachable({ target: to, detail })
    /**
     * A call from `from` to `to`: delayed both ways (so reordered), maybe lost before or after `to` ran it, maybe
     * duplicated. The request travels on its own: once sent it arrives even if the sender dies meanwhile, as a
     * packet in flight does. A paused process sends once it resumes, and what reaches it waits for it: a call to
     * it is run, and an answer to it taken, late (unless the caller gave up). Sometimes the caller gives up after a
     * timeout, and the handler is interrupted wherever it is, as Effect RPC interrupts a handler whose client timed
     * out or went away.
     */
    const call = <A, E>(
      from: string,
      to: string,
      request: Effect.Effect<A, E>
    ): Effect.Effect<A, E | PeerUnreachable> =>
      Effect.gen(function* () {
        const delay = () =>
          (faultsOn && rng.chance(0.1) ? rng.int(20, 400) : rng.int(0, 10)) +
          (faultsOn && (slow.has(from) || slow.has(to)) ? rng.int(50, 400) : 0)
        if (!(yield* thawed(from))) return yield* Effect.fail(unreachable(to, "the caller went down"))
        const packet = Effect.gen(function* () {
          yield* Effect.sleep(Duration.millis(delay()))
          if (!(yield* thawed(to)) || !reachable(from, to)) return yield* Effect.fail(unreachable(to, "no route"))
          if (faultsOn && rng.chance(0.01)) return yield* Effect.fail(unreachable(to, "request lost"))
          if (faultsOn && rng.chance(0.01)) yield* Effect.forkIn(Effect.ignore(asProcess(to, request)), root)
          return yield* asProcess(to, request)
        })
        const arrived = yield* Effect.forkIn(packet, root)
        const timeoutMs = faultsOn && rng.chance(0.05) ? rng.int(1, 300) : undefined
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
        if (!(yield* thawed(from)) || !reachable(to, from))
          return yield* Effect.fail(unreachable(to, "answer lost (no route)"))
        if (faultsOn && rng.chance(0.01)) return yield* Effect.fail(unreachable(to, "answer lost"))
        return answer
      })

    /**
     * ISR churn aimed at one tablet (`churnFault`): until `untilMs`, each answer to its leader's ISR proposals is held
     * until the leader's next proposal has gone out (reordered across it), and `follower`, flapping, stalls as it is
     * added — paused for a moment, or its power lost with its expansion arriving once it registered again.
     */
    interface Churn {
      readonly tablet: string
      readonly leader: string
      readonly follower: number
      readonly untilMs: number
      readonly stall: "pause" | "power" | "lost"
      readonly draws: Prng
      /** How many proposals the leader sent for the tablet under the churn. */
      sent: number
    }
    const churns = new Map<string, Churn>()
    const churnLedBy = (p: Proc, tablet: TabletId): Churn | undefined => {
      const churn = churns.get(tabletKey(tablet))
      return churn !== undefined && churn.leader === p.name && faultsOn && now() < churn.untilMs ? churn : undefined
    }
    /** Holds the answer to proposal `proposal` until the leader sent a later one (or the churn ends). */
    const heldUntilNext = (churn: Churn, proposal: number, tablet: TabletId) =>
      Effect.gen(function* () {
        let held = false
        while (churn.sent === proposal && faultsOn && now() < churn.untilMs) {
          held = true
          yield* Effect.sleep(Duration.millis(5))
        }
        if (held && churn.sent > proposal)
          log(
            `${churn.leader}: the answer to its ISR proposal ${proposal} of ${tabletKey(tablet)} arrives after its proposal ${churn.sent}`
          )
      })
    /**
     * The leader whose expansion was just committed loses the answer, and at once its sessions and those of the
     * ISR's other members expire while the controllers' connections to them are cut until the churn ends (their own
     * requests to a controller still pass), and the clients reach neither controllers nor coordination, so they keep
     * sending to the leaders they knew. The leader retries the expansion, which the controller, having elected
     * another replica meanwhile, refuses as from a leadership that is over (issue 32's fenced-refusal history,
     * simulator seed 2027).
     */
    const deafen = (churn: Churn, isr: ReadonlyArray<number>) =>
      Effect.gen(function* () {
        const cutOff = isr
          .filter((s) => s !== churn.follower)
          .flatMap((s) => byName.get(`s${s}`) ?? [])
          .filter((q) => q.scope !== undefined)
        if (!cutOff.some((q) => q.name === churn.leader)) return
        log(
          `FAULT ${churn.leader} loses the answer to its expansion of ${churn.tablet}; ${cutOff.map((q) => q.name).join(", ")} cut off from the controllers until t=${churn.untilMs}, their sessions expired`
        )
        const deafened = coordinators.map((c) => `client>${c.name}`)
        for (const cut of deafened) oneWay.add(cut)
        for (const q of cutOff) unheard.add(q.name)
        for (const q of cutOff)
          yield* Effect.forEach([...q.sessions], (s) => Effect.ignore(faults.expire(s)), { discard: true })
        // The clients are on their side: cut off from the controllers and coordination, they keep the leaders they knew.
        yield* clientProc.gate.close
        yield* Effect.forEach([...clientProc.sessions], (s) => Effect.ignore(faults.disconnect!(s)), { discard: true })
        timed.push({
          until: Math.ceil(churn.untilMs / config.stepMs),
          end: Effect.gen(function* () {
            for (const cut of deafened) oneWay.delete(cut)
            for (const q of cutOff) unheard.delete(q.name)
            yield* clientProc.gate.open
            yield* Effect.forEach([...clientProc.sessions], (s) => Effect.ignore(faults.reconnect!(s)), {
              discard: true
            })
          })
        })
      })
    /**
     * The follower being added stalls: paused for up to half a session (its fetches held), or its power lost (with a
     * minimum ISR of 2 or more its unflushed writes too, every other server flushed first) while the expansion
     * travels, which arrives once the follower registered again (or three seconds passed).
     */
    const stallJoining = (churn: Churn) =>
      Effect.gen(function* () {
        const y = byName.get(`s${churn.follower}`)
        if (y === undefined || y.scope === undefined || y.paused || y.backAt !== undefined || y.stopping) return
        if (churn.stall === "lost") return
        if (churn.stall === "pause") {
          const ms = churn.draws.int(20, Math.floor(sessionTimeoutMs / 2))
          log(`FAULT ${y.name} stalls ${ms} ms as ${churn.leader} adds it to the ISR of ${churn.tablet}`)
          yield* pause(y)
          yield* Effect.forkIn(
            Effect.andThen(
              Effect.sleep(Duration.millis(ms)),
              Effect.suspend(() => (y.paused && y.backAt === undefined ? resume(y) : Effect.void))
            ),
            root
          )
          return
        }
        // As a power loss: unflushed writes are lost only where an acknowledged record has a flushed copy elsewhere.
        const lose = minIsr >= 2
        log(
          `FAULT power loss of ${y.name} as ${churn.leader} adds it to the ISR of ${churn.tablet}${lose ? ", unflushed writes lost" : ""}`
        )
        if (lose) for (const [id, store] of stores) if (id !== y.id) store.flush()
        // The process comes back whatever becomes of the proposal that waits for it.
        const offMs = churn.draws.int(0, 200)
        const cycle = Effect.gen(function* () {
          yield* down(y, true, lose)
          yield* Effect.sleep(Duration.millis(offMs))
          yield* start(y)
          for (let waited = 0; waited < 3_000 && y.registration === undefined; waited += 10)
            yield* Effect.sleep(Duration.millis(10))
        })
        yield* Fiber.join(yield* Effect.forkIn(cycle, root))
      })

    /** The wall clock process `p` reads: the simulation's, off by its offset; sleeping is the simulation's. */
    const clockOf = (p: Proc): Clock.Clock => ({
      currentTimeMillisUnsafe: () => simClock.currentTimeMillisUnsafe() + p.clockOffsetMs,
      currentTimeMillis: Effect.sync(() => simClock.currentTimeMillisUnsafe() + p.clockOffsetMs),
      currentTimeNanosUnsafe: () => simClock.currentTimeNanosUnsafe() + BigInt(p.clockOffsetMs) * 1_000_000n,
      currentTimeNanos: Effect.sync(() => simClock.currentTimeNanosUnsafe() + BigInt(p.clockOffsetMs) * 1_000_000n),
      monotonicTimeNanosUnsafe: () => simClock.monotonicTimeNanosUnsafe(),
      monotonicTimeNanos: simClock.monotonicTimeNanos,
      sleep: (duration) => simClock.sleep(duration)
    })
    /** Runs `effect` as process `name` (its clock), or as it is for a name that is no process (the client). */
    const asProcess = <A, E, R>(name: string, effect: Effect.Effect<A, E, R>) => {
      const p = byName.get(name)
      return p === undefined ? effect : Effect.provideService(effect, Clock.Clock, clockOf(p))
    }

    /** A process's log lines, into the trace (below errors only with `STRATA_SIM_LOG=info`). */
    const traceLogger = (p: Proc) =>
      Logger.make((o) => log(`${p.name} ${o.logLevel}: ${[o.message].flat().map(String).join(" ")}`))

    // --- coordination as each process sees it ----------------------------------------------------
    const coordinationOf = (p: Proc): CoordinationShape => ({
      backend: base.backend,
      session: (options) =>
        Effect.gen(function* () {
          // The server-side session lives in the root scope, so a crash can leave it to expire.
          const child = yield* Scope.fork(root, "sequential")
          yield* p.gate.await
          const s = yield* Scope.provide(base.session(options), child)
          p.sessions.add(s)
          yield* Effect.addFinalizer(() =>
            Effect.suspend(() => {
              p.sessions.delete(s)
              return p.crashed ? Effect.ignore(faults.disconnect!(s)) : Scope.close(child, Exit.void)
            })
          )
          return gated(p, s)
        })
    })

    /** A session whose operations wait while its process is paused (a paused process does nothing). */
    const gated = (p: Proc, s: Session): Session => {
      const wait = <A, E>(op: Effect.Effect<A, E>) => Effect.andThen(p.gate.await, op)
      return {
        ...s,
        ping: wait(s.ping),
        create: (path, data, options) => wait(s.create(path, data, options)),
        get: (path) => wait(s.get(path)),
        exists: (path) => wait(s.exists(path)),
        set: (path, data, version) => wait(s.set(path, data, version)),
        delete: (path, version) => wait(s.delete(path, version)),
        children: (path) => wait(s.children(path)),
        multi: (ops) => wait(s.multi(ops)),
        watchNode: (path) => wait(s.watchNode(path)),
        watchChildren: (path) => wait(s.watchChildren(path))
      }
    }

    // --- tablet servers -------------------------------------------------------------------------
    const controllerNow = (): Proc | undefined => {
      let best: Proc | undefined
      for (const c of coordinators) {
        if (c.controller === undefined) continue
        if (best === undefined || c.controller.coordinatorEpoch > best.controller!.coordinatorEpoch) best = c
      }
      return best
    }
    /** A call from `p` to the controller now, over the simulated network. */
    const onController = <A>(
      p: Proc,
      f: (controller: Controller.ControllerShape) => Effect.Effect<A, { readonly message: string }>
    ): Effect.Effect<A, PeerUnreachable> =>
      Effect.suspend(() => {
        const c = controllerNow()
        if (c === undefined) return Effect.fail(unreachable("controller", "none"))
        return call(p.name, c.name, f(c.controller!).pipe(Effect.mapError((e) => unreachable(c.name, e.message))))
      })
    const peersOf = (p: Proc): PeersShape => ({
      leader: (id) => {
        const target = byName.get(`s${id}`)!
        // Read at each call: a retry reaches the server's current incarnation.
        const server = Effect.suspend(() =>
          target.server === undefined ? Effect.fail(unreachable(target.name, "down")) : Effect.succeed(target.server)
        )
        return {
          // A fetch can move the leader's HW: the ISR is checked against it right there, not only at the next step.
          fetch: (request) =>
            Effect.flatMap(server, (s) =>
              call(
                p.name,
                target.name,
                Effect.tap(s.fetch(request), () => sampleIsr(request.tablet))
              )
            ),
          endOffsetForEpoch: (request) =>
            Effect.flatMap(server, (s) => call(p.name, target.name, s.endOffsetForEpoch(request)))
        }
      },
      controller: {
        adjustIsr: (request) =>
          Effect.gen(function* () {
            // Under ISR churn the request is numbered, and the follower being added may stall as it goes.
            const churn = churnLedBy(p, request.tablet)
            const proposal = churn === undefined ? 0 : ++churn.sent
            const before = yield* readTablet(request.tablet)
            const joining =
              churn !== undefined &&
              request.isr.includes(churn.follower) &&
              !before?.leaderAndIsr.isr.includes(churn.follower)
            if (churn !== undefined && joining) yield* stallJoining(churn)
            const c = controllerNow()
            if (c === undefined) return yield* Effect.fail(unreachable("controller", "none"))
            const registered = yield* registeredServers
            const reply = yield* call(
              p.name,
              c.name,
              c.controller!.adjustIsr(request).pipe(Effect.mapError((e) => unreachable(c.name, e.message)))
            )
            log(
              `${p.name} asks isr [${request.isr.join(",")}] of ${tabletKey(request.tablet)} e${request.leaderEpoch} v${request.version}: ${reply._tag === "IsrRejected" ? JSON.stringify(reply.rejection) : `v${reply.leaderAndIsr.version}`}`
            )
            if (reply._tag === "IsrAdjusted" && before !== undefined) {
              // Registered before the call or after it: the controller may have seen either.
              const after = yield* registeredServers
              const either = new Set([...registered, ...after])
              record.isrChange(tabletKey(request.tablet), before.leaderAndIsr.isr, reply.leaderAndIsr.isr, either)
            }
            if (churn !== undefined && joining && churn.stall === "lost" && reply._tag === "IsrAdjusted") {
              yield* deafen(churn, before?.leaderAndIsr.isr ?? [])
              return yield* Effect.fail(unreachable(c.name, "answer lost"))
            }
            if (churn !== undefined) yield* heldUntilNext(churn, proposal, request.tablet)
            return reply
          }),
        controlledShutdown: (server) => onController(p, (c) => c.controlledShutdown(server)),
        replicaStorage: (report) => onController(p, (c) => c.replicaStorage(report))
      }
    })

    const readTablet = (t: TabletId) =>
      auditor.get(paths.tablet(t)).pipe(
        Effect.flatMap((node) => ClusterPaths.decodeTablet(paths.tablet(t), node.data, node.stat.version)),
        Effect.option,
        Effect.map((o) => (o._tag === "Some" ? o.value : undefined))
      )
    const registeredServers = auditor.children(paths.servers).pipe(
      Effect.map((names) => new Set(names.flatMap((n) => ClusterPaths.serverIdOf(n) ?? []))),
      Effect.orElseSucceed(() => new Set<number>())
    )

    const startServer = (p: Proc) =>
      Effect.gen(function* () {
        const before = closing.get(p.id)
        if (before !== undefined) yield* Fiber.join(before)
        let store = stores.get(p.id)
        if (store === undefined) {
          store = yield* LossyStore.make(root)
          stores.set(p.id, store)
        }
        const scope = yield* Scope.fork(root, "sequential")
        p.scope = scope
        p.crashed = false
        p.incarnation++
        const incarnation = p.incarnation
        const server = yield* TabletServer.make({ serverId: p.id, replication: config0 }).pipe(
          Effect.provide(Context.add(store.context, Peers, peersOf(p))),
          Effect.provideService(TabletServer.Machines, variant.machines ?? Mutants.production),
          Effect.provideService(Clock.Clock, clockOf(p)),
          Effect.provideService(Logger.CurrentLoggers, new Set([traceLogger(p)])),
          Scope.provide(scope),
          Effect.orDie
        )
        p.server = server
        p.registration = undefined
        // What the controller reaches: the server's LeaderAndIsr, recorded for the coordinator-epoch check.
        p.serverInbox = (request) =>
          Effect.tap(server.leaderAndIsr(request), () =>
            Effect.sync(() => record.applied(p.name, incarnation, request.coordinatorEpoch))
          )
        yield* Effect.forkIn(
          ClusterPaths.keepRegistered(coordinationOf(p), paths, p.id, {
            address: p.name,
            dataAddress: p.name,
            sessionTimeout: Duration.millis(sessionTimeoutMs),
            firstEpoch: incarnation * 1000,
            retryBackoffMs: 50,
            onRegistered: (registration) =>
              Effect.andThen(
                Effect.sync(() => {
                  if (p.incarnation === incarnation) p.registration = registration
                }),
                server.registered(registration)
              )
          }),
          scope
        )
        log(`${p.name}.${incarnation} starts`)
      })

    const serversFor = (c: Proc): Controller.TabletServersShape => ({
      leaderAndIsr: (id, request) => {
        const target = byName.get(`s${id}`)!
        const inbox = target.serverInbox
        if (unheard.has(target.name)) return Effect.fail(unreachable(target.name, "the controller's connection is cut"))
        return inbox === undefined || target.scope === undefined
          ? Effect.fail(unreachable(target.name, "down"))
          : call(c.name, target.name, inbox(request))
      },
      logEnd: (id, request) => onServer(c, id, (server) => server.logEnd(request)),
      holdings: (id, request) => onServer(c, id, (server) => server.holdings(request)),
      stopReplica: (id, request) => onServer(c, id, (server) => server.stopReplica(request))
    })
    /** A call from coordinator `c` to server `id` over the simulated network (unreachable while it is down). */
    const onServer = <A>(
      c: Proc,
      id: number,
      f: (server: TabletServer.TabletServerShape) => Effect.Effect<A, ReplicaError>
    ) => {
      const target = byName.get(`s${id}`)!
      const server = target.server
      if (unheard.has(target.name)) return Effect.fail(unreachable(target.name, "the controller's connection is cut"))
      return server === undefined ? Effect.fail(unreachable(target.name, "down")) : call(c.name, target.name, f(server))
    }

    const startCoordinator = (p: Proc) =>
      Effect.gen(function* () {
        const scope = yield* Scope.fork(root, "sequential")
        p.scope = scope
        p.crashed = false
        p.incarnation++
        const coordination = coordinationOf(p)
        const resign: { run: Effect.Effect<void> } = { run: Effect.void }
        const program = Effect.gen(function* () {
          const election = yield* CoordinationElection.make({
            namespace: "sim",
            sessionTimeout: Duration.millis(sessionTimeoutMs),
            replicaLagTimeMax: Duration.millis(replication.replicaLagTimeMaxMs)
          })
          // The coordinator's warm view: standing by, it follows the journal; a controller of its starts from it.
          const view = yield* ControllerView.make({ namespace: NAMESPACE, keepWarm: { retryBackoffMs: 50 } })
          const coordinator = yield* Coordinator.make({
            serverId: p.id,
            address: p.name,
            rejoinBackoff: Duration.millis(200),
            services: [
              Coordinator.service("controller", (leadership) =>
                Effect.acquireRelease(
                  Controller.make(leadership, {
                    namespace: NAMESPACE,
                    uncleanLeaderElection: false,
                    minInsyncReplicas: minIsr,
                    leaderElection,
                    retryBackoffMs: 50,
                    resign: Effect.suspend(() => resign.run),
                    view,
                    // Leaders go back to preferred replicas often, so that the faults meet it.
                    leaderImbalanceCheckIntervalMs: 1_000,
                    leaderImbalancePercent: 0
                  }).pipe(
                    Effect.provideService(Controller.Machine, variant.controller ?? ControllerState.step),
                    Effect.provideService(Controller.TabletServers, serversFor(p)),
                    Effect.tap((c) =>
                      Effect.sync(() => {
                        p.controller = c
                        record.coordinatorEpoch(c.coordinatorEpoch)
                        log(`${p.name} controls with coordinator epoch ${c.coordinatorEpoch}`)
                      })
                    )
                  ),
                  (c) =>
                    Effect.sync(() => {
                      if (p.controller === c) p.controller = undefined
                    })
                )
              )
            ]
          }).pipe(Effect.provideService(Election, election))
          resign.run = coordinator.resign
        })
        yield* program.pipe(
          Effect.provideService(Coordination, coordination),
          Effect.provideService(Clock.Clock, clockOf(p)),
          Effect.provideService(Logger.CurrentLoggers, new Set([traceLogger(p)])),
          Scope.provide(scope),
          Effect.orDie
        )
        log(`${p.name}.${p.incarnation} starts`)
      })

    /** Records how far each of a server's logs reaches. */
    const sampleLogEnds = (p: Proc) =>
      Effect.gen(function* () {
        if (p.server === undefined) return
        for (const view of yield* p.server.replicas) {
          const tl = yield* p.server.logOf(view.tablet)
          if (tl !== undefined) record.logEnd(p.name, tabletKey(view.tablet), yield* tl.logEndOffset, yield* tl.epochs)
          else record.logClosed(p.name, tabletKey(view.tablet))
        }
      })

    /** Starts a process in a fiber of its own: the driver never waits on the clock it drives. */
    const start = (p: Proc) =>
      Effect.asVoid(Effect.forkIn(p.kind === "server" ? startServer(p) : startCoordinator(p), root))

    /** Stops a process: a crash leaves its sessions to expire, a stop closes them. */
    const down = (p: Proc, crash: boolean, lose: boolean) =>
      Effect.gen(function* () {
        const scope = p.scope
        if (scope === undefined) return
        // What its logs hold as it goes (the memory store keeps them for its next start).
        yield* sampleLogEnds(p)
        p.crashed = crash
        p.scope = undefined
        p.server = undefined
        p.registration = undefined
        p.serverInbox = undefined
        p.controller = undefined
        const store = stores.get(p.id)
        const closed = Effect.gen(function* () {
          yield* Scope.close(scope, Exit.void)
          if (!lose || store === undefined) return
          const undone = yield* store.loseUnflushed
          lostWrites += undone
          log(`${p.name} lost ${undone} unflushed writes`)
        })
        const fiber = yield* Effect.forkIn(closed, root)
        if (p.kind === "server") closing.set(p.id, fiber)
      })

    const pause = (p: Proc) =>
      Effect.gen(function* () {
        p.paused = true
        yield* p.gate.close
        yield* Effect.forEach([...p.sessions], (s) => Effect.ignore(faults.disconnect!(s)), { discard: true })
      })
    const resume = (p: Proc) =>
      Effect.gen(function* () {
        p.paused = false
        yield* p.gate.open
        yield* Effect.forEach([...p.sessions], (s) => Effect.ignore(faults.reconnect!(s)), { discard: true })
      })

    for (const p of procs) yield* start(p)

    // --- the workload ---------------------------------------------------------------------------
    // Clients are the real `TabletClient`: its directory on its own coordination session, its `RemotePeers` over Effect
    // RPC's in-memory client and server (`MemoryTransport`), every call crossing the simulated network.
    const clientProc: Proc = { ...proc("server", 0), name: "client" }
    const endpointOf = (c: Proc): ControllerRpc.ControllerEndpoint => ({
      current: Effect.sync(() => c.controller),
      servers: Effect.map(registeredServers, (ids) => [...ids].map((id) => ({ id, address: `s${id}` }))),
      replicationFactor: rf
    })
    const transport = MemoryTransport.make({
      route: (address, request) => call("client", address, request),
      server: (address) => {
        const server = byName.get(address)?.server
        return server === undefined ? undefined : TabletServerRpc.tabletServerHandlers(server)
      },
      link: (address) => {
        const server = byName.get(address)?.server
        return server === undefined ? undefined : { append: server.append, fetch: server.fetch }
      },
      coordinator: (address) => {
        const c = byName.get(address)
        if (c?.kind !== "coordinator" || c.scope === undefined) return undefined
        const handlers = ControllerRpc.controllerHandlers(endpointOf(c))
        // Planted: ids drawn at random from a small range instead of the controller's blocks.
        return variant.randomProducerIds === true
          ? { ...handlers, InitProducerId: () => Effect.succeed(rng.int(0, 3)) }
          : handlers
      }
    })
    const lingerMs = rng.pick([0, 5])
    /** A client, closed with the scope. */
    const makeClient = (deliveryTimeoutMs: number) =>
      TabletClient.make({
        namespace: NAMESPACE,
        lingerMs,
        retryBackoffMs: 50,
        requestTimeoutMs: replication.appendTimeoutMs + 1_000,
        deliveryTimeoutMs,
        replication: config0
      }).pipe(
        Effect.provideService(Coordination, coordinationOf(clientProc)),
        Effect.provideService(RemotePeers.Transport, transport),
        Effect.provideService(Logger.CurrentLoggers, new Set([traceLogger(clientProc)])),
        Effect.orDie
      )
    /** What a send's answer says of its records. */
    const outcomeOf = (
      result: EffectResult.Result<TabletClient.Sent, TabletClient.TabletClientError>
    ): Checkers.Outcome => {
      if (EffectResult.isSuccess(result)) return { _tag: "Acked", baseOffset: result.success.baseOffset }
      const reason = result.failure.reason
      return reason._tag === "DeliveryUnknown" || reason._tag === "ClientClosed"
        ? { _tag: "Unknown" }
        : { _tag: "Failed", why: reason.message }
    }
    const records = (values: ReadonlyArray<string>) =>
      values.map((v) => ({ key: null, value: encoder.encode(v), headers: [], timestamp: 0 }))

    const producers = shape?.producers ?? rng.int(1, 3)
    const producerFibers: Array<Fiber.Fiber<void>> = []
    let producing = true
    const deliveryTimeoutMs = rng.pick([1_000, 3_000, 8_000])
    for (let n = 0; n < producers; n++) {
      let next = 0
      const loop = Effect.gen(function* () {
        while (producing) {
          // A client's life: a producer id from the controller on its first send, some sends (a few at once, which
          // it batches per tablet), then it closes and another starts.
          yield* Effect.scoped(
            Effect.gen(function* () {
              const client = yield* makeClient(deliveryTimeoutMs)
              for (let rounds = rng.int(3, 30); rounds > 0 && producing; rounds--) {
                const sends = yield* Effect.forEach(Array.from({ length: rng.int(1, 3) }), () =>
                  Effect.gen(function* () {
                    const tablet = rng.pick(tablets)
                    const values = Array.from({ length: rng.int(1, 4) }, () => `p${n}-${next++}`)
                    // Some seeds send some records acks=1: acknowledged by the leader alone, they leave tails only
                    // some replicas hold, for leader changes to truncate.
                    const acks = drawn.acksOne && rng.chance(0.4) ? (1 as const) : ("all" as const)
                    return { tablet, values, acks, done: yield* client.enqueue(tablet, records(values), acks) }
                  })
                )
                for (const { tablet, values, acks, done } of sends) {
                  const outcome = outcomeOf(yield* Effect.result(done))
                  if (outcome._tag === "Failed") log(`client: a send to ${tabletKey(tablet)} failed: ${outcome.why}`)
                  // An acks=1 acknowledgement promises nothing once the leader changes: such records may be lost.
                  record.append(
                    tabletKey(tablet),
                    values,
                    acks === 1 && outcome._tag === "Acked" ? { _tag: "Unknown" } : outcome
                  )
                }
                yield* Effect.sleep(Duration.millis(rng.int(10, 80)))
              }
            })
          )
        }
      })
      producerFibers.push(yield* Effect.forkIn(loop, root))
    }

    // A consumer, through a client of its own: reads each tablet from where it got to; every record it is given is
    // recorded, and must be in the final log at its offset (nothing above a HW reaches a consumer).
    const readFrom = new Map<string, number>()
    const reader = Effect.scoped(
      Effect.gen(function* () {
        const client = yield* makeClient(1_000)
        while (producing) {
          yield* Effect.sleep(Duration.millis(rng.int(20, 120)))
          const tablet = rng.pick(tablets)
          const key = tabletKey(tablet)
          const offset = readFrom.get(key) ?? 0
          const read = yield* Effect.result(client.read(tablet, offset, rng.pick([1, 200, 100_000])))
          if (EffectResult.isFailure(read)) {
            const reason = read.failure.reason
            if (reason._tag === "ReplicaError" && reason.reason._tag === "OffsetOutOfRange") readFrom.set(key, 0)
            continue
          }
          for (const b of read.success.batches) {
            b.records.forEach((r, i) => {
              if (b.baseOffset + i >= offset) record.read(key, b.baseOffset + i, decoder.decode(r.value), now())
            })
            readFrom.set(key, Math.max(readFrom.get(key) ?? 0, b.baseOffset + b.records.length))
          }
        }
      })
    )
    producerFibers.push(yield* Effect.forkIn(reader, root))

    // --- the faults -------------------------------------------------------------------------------
    const created = yield* Effect.forkIn(
      Effect.gen(function* () {
        while (true) {
          const c = controllerNow()
          if (c !== undefined) {
            const specs = tablets.map((tablet) => ({
              tablet,
              replicas: Array.from({ length: rf }, (_, r) => ((tablet.bucket + r) % serverCount) + 1)
            }))
            const reply = yield* c.controller!.createTablets(specs).pipe(Effect.option)
            if (reply._tag === "Some" && reply.value._tag === "Created") return
          }
          yield* Effect.sleep(Duration.millis(50))
        }
      }),
      root
    )

    const sample = Effect.gen(function* () {
      for (const p of servers) yield* sampleLogEnds(p)
      for (const p of servers) {
        if (p.server === undefined) continue
        for (const view of yield* p.server.replicas) {
          const tl = yield* p.server.logOf(view.tablet)
          record.replica(p.name, p.incarnation, view, now(), tl === undefined ? [] : yield* tl.epochs)
        }
      }
      for (const tablet of tablets) yield* sampleIsr(tablet)
    })

    /**
     * The tablet's committed ISR against its leader's HW: every member that is the life it joined as (running, with
     * the registration the tablet records for it) holds the leader's log below the HW, the same epoch at every
     * offset — any of them may be elected cleanly next.
     */
    const sampleIsr = (tablet: TabletId) =>
      Effect.gen(function* () {
        const meta = yield* readTablet(tablet)
        const lai = meta?.leaderAndIsr
        if (meta === undefined || lai === undefined || lai.leader === null) return
        const leader = byName.get(`s${lai.leader}`)?.server
        if (leader === undefined) return
        const view = (yield* leader.replicas).find((v) => tabletKey(v.tablet) === tabletKey(tablet))
        if (view?.machine._tag !== "LeaderReplica" || view.leader?.leaderEpoch !== lai.leaderEpoch) return
        const leaderLog = yield* leader.logOf(tablet)
        if (leaderLog === undefined) return
        const members: Array<{ readonly server: string; readonly end: number; readonly epochs: LeaderEpochCache }> = []
        for (const s of lai.isr) {
          const m = byName.get(`s${s}`)
          if (s === lai.leader || m?.server === undefined || m.registration === undefined) continue
          if (m.registration !== meta.registrations?.[String(s)]) continue
          const log = yield* m.server.logOf(tablet)
          if (log === undefined) continue
          members.push({ server: m.name, end: yield* log.logEndOffset, epochs: yield* log.epochs })
        }
        record.isrHolds(
          tabletKey(tablet),
          `s${lai.leader}`,
          view.leader.highWatermark,
          yield* leaderLog.epochs,
          members,
          now()
        )
      })

    /** Injects one fault into `p` at `step`; it lasts until `back` where it has an end. */
    const inject = (kind: FaultKind, p: Proc, step: number, back: number) =>
      Effect.gen(function* () {
        if (p.scope === undefined || p.paused || p.backAt !== undefined) return
        count(kind)
        switch (kind) {
          case "crash":
          case "stop":
            log(`FAULT ${kind} ${p.name}, back at step ${back}`)
            p.backAt = back
            return yield* down(p, kind === "crash", false)
          case "power": {
            // Losing unflushed writes is survivable when an acknowledged record has another copy that is kept:
            // with a minimum ISR of 2 and every other server flushed now, it has.
            const lose = p.kind === "server" && minIsr >= 2
            if (lose) for (const [id, store] of stores) if (id !== p.id) store.flush()
            log(`FAULT power loss of ${p.name}${lose ? ", unflushed writes lost" : ""}, back at step ${back}`)
            p.backAt = back
            return yield* down(p, true, lose)
          }
          case "pause": {
            const until = Math.max(back, step + Math.ceil(sessionTimeoutMs / config.stepMs) + 1)
            log(`FAULT pause ${p.name} past its session, resume at step ${until}`)
            p.backAt = until
            return yield* pause(p)
          }
          case "expire":
            log(`FAULT expire the sessions of ${p.name}`)
            return yield* Effect.forEach([...p.sessions], (s) => Effect.ignore(faults.expire(s)), { discard: true })
          case "isolate":
            log(`FAULT isolate ${p.name} until step ${back}`)
            for (const q of [...procs.map((x) => x.name), "client"]) if (q !== p.name) cuts.add(link(p.name, q))
            isolations.push({ name: p.name, until: back })
            return
          case "cut": {
            const q = rng.pick(procs.filter((x) => x !== p))
            log(`FAULT cut ${p.name}|${q.name} until step ${back}`)
            cuts.add(link(p.name, q.name))
            linkCuts.push({ key: link(p.name, q.name), until: back })
            return
          }
          case "oneway": {
            const q = rng.pick(procs.filter((x) => x !== p))
            log(`FAULT cut ${p.name}>${q.name} one way until step ${back}`)
            oneWay.add(`${p.name}>${q.name}`)
            timed.push({ until: back, end: Effect.sync(() => oneWay.delete(`${p.name}>${q.name}`)) })
            return
          }
          case "disk": {
            // Its disk fills (or fails): every write of its store fails until then.
            const store = stores.get(p.id)
            if (p.kind !== "server" || store === undefined) return
            log(`FAULT ${p.name}'s disk is full until step ${back}`)
            store.failing = true
            timed.push({
              until: back,
              end: Effect.sync(() => {
                store.failing = false
              })
            })
            return
          }
          case "slow":
            log(`FAULT ${p.name} slow until step ${back}`)
            slow.add(p.name)
            timed.push({ until: back, end: Effect.sync(() => slow.delete(p.name)) })
            return
          case "coordination": {
            // Cut off from the coordination service only: its sessions disconnect and its operations wait, while it
            // runs on and reaches its peers.
            log(`FAULT ${p.name} cut off from coordination until step ${back}`)
            yield* p.gate.close
            yield* Effect.forEach([...p.sessions], (s) => Effect.ignore(faults.disconnect!(s)), { discard: true })
            const gate = p.gate
            const sessions = [...p.sessions]
            timed.push({
              until: back,
              end: Effect.suspend(() =>
                p.paused
                  ? Effect.void
                  : Effect.andThen(
                      gate.open,
                      // Only sessions its running incarnation still has: a crashed one's are left to expire.
                      Effect.forEach(
                        sessions.filter((s) => p.sessions.has(s)),
                        (s) => Effect.ignore(faults.reconnect!(s)),
                        { discard: true }
                      )
                    )
              )
            })
            return
          }
          case "shutdown": {
            // A controlled shutdown: leadership moves off the server first, then it stops cleanly.
            const server = p.server
            if (server === undefined) return
            log(`FAULT controlled shutdown of ${p.name}, back at step ${back}`)
            p.backAt = back
            p.stopping = true
            yield* Effect.forkIn(
              Effect.gen(function* () {
                const remaining = yield* server.controlledShutdown
                log(`${p.name} leads ${remaining} tablets as it stops`)
                // A process takes its time to stop once its leaderships moved: its replicas follow meanwhile.
                yield* Effect.sleep(Duration.millis(rng.int(0, 2_000)))
                if (p.server === server) yield* down(p, false, false)
                p.stopping = false
              }),
              root
            )
            return
          }
        }
      })

    /**
     * A leadership transfer under lag, aimed at one tablet (a nemesis that targets leaders): the follower the
     * controller would pick next falls behind (its link to the leader cut for a moment), another in-sync follower
     * stops hearing the controllers (cut one way from each of them), and the leader is shut down in a controlled
     * way, following its successor while it lingers. The deaf follower may be long-polling the old leader while that
     * leader truncates to its successor's log and copies new records (issue 32's first defect).
     */
    const transfer = (step: number, tr: Prng) =>
      Effect.gen(function* () {
        const tablet = tr.pick(tablets)
        const meta = yield* readTablet(tablet)
        const lai = meta?.leaderAndIsr
        if (meta === undefined || lai === undefined || lai.leader === null) return
        const leader = byName.get(`s${lai.leader}`)
        const usable = (s: number) => {
          const q = byName.get(`s${s}`)
          return q?.server !== undefined && !q.paused && q.backAt === undefined && !q.stopping
        }
        const others = meta.replicas.filter((s) => s !== lai.leader && lai.isr.includes(s) && usable(s))
        const next = others[0]
        const deaf = others.length > 1 ? others[tr.int(1, others.length - 1)] : undefined
        if (leader === undefined || !usable(leader.id) || next === undefined || deaf === undefined) return
        count("transfer")
        const back = step + tr.int(3, 20)
        log(
          `FAULT transfer ${tabletKey(tablet)} from ${leader.name}: s${next} behind, s${deaf} deaf to the controllers until step ${back}`
        )
        const behind = link(leader.name, `s${next}`)
        cuts.add(behind)
        const deafened = coordinators.map((c) => `${c.name}>s${deaf}`)
        for (const cut of deafened) oneWay.add(cut)
        timed.push({
          until: back,
          end: Effect.sync(() => {
            for (const cut of deafened) oneWay.delete(cut)
          })
        })
        yield* Effect.forkIn(
          Effect.gen(function* () {
            yield* Effect.sleep(Duration.millis(tr.int(10, 150)))
            cuts.delete(behind)
            yield* inject("shutdown", leader, step, back)
          }),
          root
        )
      })

    /**
     * ISR churn aimed at one tablet (a nemesis that targets ISR changes): for 1–3 s its leader's ISR answers come
     * late, each after the leader's next proposal (a late answer must not settle a later proposal: issue 32's second
     * defect), while one follower flaps — its sessions expire up to three times, each drop from the ISR followed by
     * its return — and stalls whenever it is being added.
     */
    const churnFault = (ch: Prng) =>
      Effect.gen(function* () {
        const tablet = ch.pick(tablets)
        const key = tabletKey(tablet)
        const meta = yield* readTablet(tablet)
        const lai = meta?.leaderAndIsr
        if (meta === undefined || lai === undefined || lai.leader === null || churns.has(key)) return
        const leader = byName.get(`s${lai.leader}`)
        const usable = (q: Proc | undefined) =>
          q?.server !== undefined && !q.paused && q.backAt === undefined && !q.stopping
        const followers = meta.replicas.filter((s) => s !== lai.leader && usable(byName.get(`s${s}`)))
        if (!usable(leader) || followers.length === 0) return
        const y = byName.get(`s${ch.pick(followers)}`)!
        const churn: Churn = {
          tablet: key,
          leader: leader!.name,
          follower: y.id,
          untilMs: now() + ch.int(1_000, 3_000),
          stall: ch.pick(["pause", "power", "lost"] as const),
          draws: ch,
          sent: 0
        }
        churns.set(key, churn)
        count("churn")
        log(
          `FAULT ISR churn of ${key} led by ${churn.leader}: ${y.name} flaps and ${{ pause: "stalls as it is added", power: "loses power as it is added", lost: "is added as its leader is cut off" }[churn.stall]}, answers late until t=${churn.untilMs}`
        )
        yield* Effect.forkIn(
          Effect.gen(function* () {
            for (let flap = 0; flap < 3 && faultsOn && now() < churn.untilMs; flap++) {
              if (y.scope !== undefined && !y.paused) {
                log(`FAULT expire the sessions of ${y.name} (ISR churn)`)
                yield* Effect.forEach([...y.sessions], (s) => Effect.ignore(faults.expire(s)), { discard: true })
              }
              yield* Effect.sleep(Duration.millis(ch.int(200, 1_000)))
            }
            yield* Effect.sleep(Duration.millis(Math.max(0, churn.untilMs - now())))
            churns.delete(key)
          }),
          root
        )
      })

    /**
     * A storage or clock fault (`extras` draws which, whom and how long): a slow disk (every write of a server's
     * store waits 20–200 ms), a disk failing one write in five, a process's wall clock jumping up to three lag times
     * either way (back where it was at the end), or, with a minimum ISR of 3, power lost on two servers at once (every
     * other server flushed first, so an acknowledged record keeps a copy).
     */
    const extraFault = (step: number, ex: Prng) =>
      Effect.gen(function* () {
        const running = servers.filter((q) => q.scope !== undefined && !q.paused && q.backAt === undefined)
        const p = ex.pick(running.length > 0 ? running : servers)
        const back = step + ex.int(3, 20)
        const kind = ex.pick(["slow-disk", "flaky-disk", "clock", "power-two"] as const)
        const store = stores.get(p.id)
        if (p.scope === undefined || p.paused || p.backAt !== undefined || store === undefined) return
        switch (kind) {
          case "slow-disk": {
            if (store.slowMs > 0) return
            store.slowMs = ex.int(20, 200)
            log(`FAULT ${p.name}'s disk slow (${store.slowMs} ms a write) until step ${back}`)
            timed.push({
              until: back,
              end: Effect.sync(() => {
                store.slowMs = 0
              })
            })
            break
          }
          case "flaky-disk": {
            if (store.failSome !== undefined) return
            log(`FAULT ${p.name}'s disk fails one write in five until step ${back}`)
            store.failSome = () => ex.chance(0.2)
            timed.push({
              until: back,
              end: Effect.sync(() => {
                store.failSome = undefined
              })
            })
            break
          }
          case "clock": {
            const jump = ex.int(-3 * replicaLagTimeMaxMs, 3 * replicaLagTimeMaxMs)
            log(`FAULT ${p.name}'s clock jumps ${jump} ms until step ${back}`)
            p.clockOffsetMs += jump
            timed.push({
              until: back,
              end: Effect.sync(() => {
                p.clockOffsetMs -= jump
              })
            })
            break
          }
          case "power-two": {
            const other = running.filter((q) => q !== p)
            if (minIsr < 3 || other.length === 0) return
            const q = ex.pick(other)
            for (const [id, s] of stores) if (id !== p.id && id !== q.id) s.flush()
            log(`FAULT power loss of ${p.name} and ${q.name} at once, unflushed writes lost, back at step ${back}`)
            for (const x of [p, q]) {
              x.backAt = back
              yield* down(x, true, true)
            }
            break
          }
        }
        count(kind)
      })

    /** A random fault, drawn from the seed. */
    const fault = (step: number) => {
      const p = rng.pick(procs)
      let roll = rng.int(1, faultWeightTotal)
      let kind: FaultKind = "crash"
      for (const [k, weight] of drawn.kinds) {
        if (roll <= weight) {
          kind = k
          break
        }
        roll -= weight
      }
      if (kind === "shutdown" && p.kind !== "server") kind = "stop"
      return inject(kind, p, step, step + rng.int(3, 20))
    }
    /** The processes a scripted fault strikes. */
    const targets = (target: Target) =>
      Effect.gen(function* () {
        if (target === "all") return procs
        if (target === "all-servers") return servers
        if (typeof target === "string") return procs.filter((p) => p.name === target)
        const meta = yield* readTablet({ table: "t", bucket: target.leaderOf })
        const leader = meta?.leaderAndIsr.leader
        return servers.filter((p) => p.id === leader)
      })
    const isolations: Array<{ name: string; until: number }> = []
    const linkCuts: Array<{ key: string; until: number }> = []
    /** Faults that end by themselves at a step. */
    const timed: Array<{ until: number; end: Effect.Effect<void> }> = []

    const heal = (step: number, all: boolean) =>
      Effect.gen(function* () {
        for (const p of procs) {
          if (p.backAt === undefined || p.stopping || (!all && p.backAt > step)) continue
          p.backAt = undefined
          if (p.paused) {
            log(`${p.name} resumes`)
            yield* resume(p)
          } else if (p.scope === undefined) yield* start(p)
        }
        for (let i = isolations.length - 1; i >= 0; i--) {
          const iso = isolations[i]!
          if (!all && iso.until > step) continue
          isolations.splice(i, 1)
          for (const q of [...procs.map((x) => x.name), "client"]) cuts.delete(link(iso.name, q))
          log(`${iso.name} reachable again`)
        }
        for (let i = linkCuts.length - 1; i >= 0; i--) {
          const c = linkCuts[i]!
          if (!all && c.until > step) continue
          linkCuts.splice(i, 1)
          cuts.delete(c.key)
        }
        for (let i = timed.length - 1; i >= 0; i--) {
          const t = timed[i]!
          if (!all && t.until > step) continue
          timed.splice(i, 1)
          yield* t.end
        }
        if (all) cuts.clear()
      })

    let runLeaderless = 0
    let lastRegistered = ""
    let longestLeaderless = 0
    for (let step = 0; step < config.steps; step++) {
      for (const planned of config.script ?? []) {
        if (planned.step !== step) continue
        for (const p of yield* targets(planned.target)) yield* inject(planned.fault, p, step, planned.until)
      }
      if (config.script === undefined && step > 5 && rng.chance(config.faultChance)) yield* fault(step)
      if (transfers !== undefined && step > 5 && transfers.chance(0.04)) yield* transfer(step, transfers)
      if (extras !== undefined && step > 5 && extras.chance(0.06)) yield* extraFault(step, extras)
      if (churning !== undefined && step > 5 && churning.chance(0.05)) yield* churnFault(churning)
      yield* heal(step, false)
      // Each server's writes become durable at a time of its own.
      for (const p of servers) if (rng.chance(flushChance)) stores.get(p.id)?.flush()
      yield* clock.adjust(Duration.millis(config.stepMs))
      yield* sample
      let leaderless = false
      for (const tablet of tablets) {
        const meta = yield* readTablet(tablet)
        if (meta !== undefined && meta.leaderAndIsr.leader === null) leaderless = true
      }
      const registered = [...(yield* registeredServers)].sort().join(",")
      if (registered !== lastRegistered) log(`registered servers: ${registered}`)
      lastRegistered = registered
      runLeaderless = leaderless ? runLeaderless + 1 : 0
      longestLeaderless = Math.max(longestLeaderless, runLeaderless)
    }

    /** Every tablet has a live leader, in that role, with every replica in its ISR and its HW at its log end. */
    const settled = Effect.gen(function* () {
      if (procs.some((p) => p.scope === undefined || p.paused || p.stopping)) return false
      for (const tablet of tablets) {
        const meta = yield* readTablet(tablet)
        if (meta === undefined || meta.leaderAndIsr.leader === null) return false
        if (meta.leaderAndIsr.isr.length !== meta.replicas.length) return false
        const leader = byName.get(`s${meta.leaderAndIsr.leader}`)?.server
        if (leader === undefined) return false
        const view = (yield* leader.replicas).find((v) => tabletKey(v.tablet) === tabletKey(tablet))
        if (view?.leader?.leaderEpoch !== meta.leaderAndIsr.leaderEpoch) return false
        if (view.leader.highWatermark !== view.leader.logEndOffset) return false
      }
      return true
    })

    // --- faults over: heal, stop producing, settle ---------------------------------------------------
    faultsOn = false
    yield* heal(config.steps, true)
    log("faults stop")
    producing = false
    /** Steps the clock until the cluster settles (and the producers ended), within the settle bound. */
    const settle = Effect.gen(function* () {
      for (let waited = 0; waited < config.settleMs; waited += config.stepMs) {
        yield* heal(config.steps, true)
        yield* clock.adjust(Duration.millis(config.stepMs))
        yield* sample
        if (producerFibers.every((f) => f.pollUnsafe() !== undefined) && (yield* settled)) return waited
      }
      return undefined
    })
    let settledAt = yield* settle
    void created

    // A final acks=all append to every tablet must succeed, within the settle bound.
    const probes: Array<string> = []
    if (settledAt !== undefined) {
      for (const tablet of tablets) {
        const value = `probe-${tabletKey(tablet)}`
        const fiber = yield* Effect.forkIn(
          Effect.scoped(
            Effect.flatMap(makeClient(100 * config.stepMs), (client) =>
              Effect.map(Effect.result(client.send(tablet, records([value]))), outcomeOf)
            )
          ),
          root
        )
        for (let i = 0; i < 110 && fiber.pollUnsafe() === undefined; i++) {
          yield* clock.adjust(Duration.millis(config.stepMs))
        }
        const exit = fiber.pollUnsafe()
        const outcome = exit !== undefined && Exit.isSuccess(exit) ? exit.value : undefined
        if (outcome?._tag === "Acked") record.append(tabletKey(tablet), [value], outcome)
        else
          probes.push(
            `${tabletKey(tablet)}: the final acks=all append was not acknowledged: ${JSON.stringify(outcome)}`
          )
      }
      // Leadership may move meanwhile (back to a preferred replica): a new leader's high watermark reaches what the
      // old one acknowledged once its followers fetch again, so the replicas are judged once settled again.
      settledAt = yield* settle
    }

    // --- judge --------------------------------------------------------------------------------------
    const finalLogs = yield* Effect.forEach(tablets, (tablet) =>
      Effect.gen(function* () {
        const meta = yield* readTablet(tablet)
        const replicas = yield* Effect.forEach(servers, (p) =>
          Effect.gen(function* () {
            const log = p.server === undefined ? undefined : yield* p.server.logOf(tablet)
            if (log === undefined) return undefined
            const view = (yield* p.server!.replicas).find((v) => tabletKey(v.tablet) === tabletKey(tablet))
            const hw = view?.leader?.highWatermark ?? (yield* log.highWatermark)
            return {
              server: p.name,
              hw,
              batches: yield* log.read(yield* log.logStartOffset, Number.MAX_SAFE_INTEGER).pipe(Effect.orDie)
            }
          })
        )
        return {
          tablet: tabletKey(tablet),
          leader: meta?.leaderAndIsr.leader === null || meta === undefined ? undefined : `s${meta.leaderAndIsr.leader}`,
          meta,
          replicas: replicas.flatMap((r) => (r === undefined ? [] : [r]))
        }
      })
    )
    finished = true
    const violations: Array<string> = [...probes]
    if (settledAt === undefined) {
      const states: Array<string> = []
      for (const p of servers) {
        if (p.server === undefined) continue
        for (const v of yield* p.server.replicas) {
          const tl = yield* p.server.logOf(v.tablet)
          const own =
            tl === undefined
              ? ""
              : ` log [${yield* tl.logStartOffset}, ${yield* tl.logEndOffset}) hw ${yield* tl.highWatermark}`
          states.push(
            `${p.name}:${tabletKey(v.tablet)}=${ReplicaState.describeState(v.machine)}${v.leader === undefined ? "" : ` hw ${v.leader.highWatermark} leo ${v.leader.logEndOffset}`}${own}`
          )
        }
      }
      violations.push(`replicas at the end: ${states.join("; ")}`)
      violations.push(
        `not settled ${config.settleMs} ms after the faults stopped: ${finalLogs
          .map((f) => `${f.tablet} leader ${f.leader ?? "none"} isr [${f.meta?.leaderAndIsr.isr.join(",") ?? "?"}]`)
          .join("; ")}`
      )
    }
    for (const p of procs) {
      if (p.scope === undefined) violations.push(`${p.name} is not running at the end`)
    }
    violations.push(...record.judge(finalLogs))
    const stats = record.stats()
    return {
      seed,
      variant: variant.name,
      violations,
      trace,
      stats: {
        servers: serverCount,
        coordinators: coordinatorCount,
        ...stats,
        longestLeaderless,
        lostWrites,
        faults: faultCounts
      }
    }
  })

/** Runs one seed on a fresh memory coordination and `TestClock`, logs below warnings silenced. */
export const run = (seed: number, variant: Variant = correct, config: Config = defaultConfig): Effect.Effect<Result> =>
  Effect.scoped(simulate(seed, variant, config)).pipe(
    Effect.provide(MemoryCoordination.layer()),
    Effect.provide(TestClock.layer()),
    Effect.provideService(
      References.MinimumLogLevel,
      config.logLevel ?? (process.env.STRATA_SIM_LOG === "info" ? "Info" : "Error")
    ),
    Effect.orDie
  )

/** A failed seed as the test prints it: the violations, the key events, and the command that replays it. */
export const describeFailure = (result: Result, lines = 60): string =>
  [
    `seed=${result.seed} variant=${result.variant}: ${result.violations.length} violation(s)`,
    ...result.violations.slice(0, 10).map((v) => `  ${v}`),
    `trace (last ${Math.min(lines, result.trace.length)} of ${result.trace.length} lines):`,
    ...result.trace.slice(-lines).map((l) => `  ${l}`),
    `replay: STRATA_SIM_SEED=${result.seed}${result.variant === correct.name ? "" : ` STRATA_SIM_VARIANT=${result.variant}`} ./dev exec vitest run --project unit packages/replica/test/ClusterSimulation.test.ts`
  ].join("\n")
