/**
 * The shapes of a simulation run (its variant, configuration, fault kinds and
 * result) and `World`, the state record every part of the simulator shares:
 * the seeded PRNG, the clock, the network, the processes and what the run
 * records for the checkers.
 */
import type { Coordination } from "@strata/core"
import type { Fiber, Latch, Scope } from "effect"
import * as Election from "../../src/internal/election.js"
import type * as Checkers from "./Checkers.js"
import type * as Clock from "./Clock.js"
import type * as Network from "./Network.js"
import type * as Prng from "./Prng.js"

/** Which safety checks are deliberately broken in a run. */
export interface Variant {
  readonly name: string
  /** The receiver accepts every request, whatever its epoch. */
  readonly receiverSkipsEpochCheck?: boolean
  /** Broken variants of the election recipe itself. */
  readonly unsafe?: Election.Unsafe
}

/** The namespace every process's election runs in. */
export const namespace = "sim"
/** The election's nodes. */
export const paths = Election.pathsOf(namespace)

/** The correct system: every check on. */
export const correct: Variant = { name: "correct" }

/**
 * How the coordination service treats a write from a session that has already
 * ended on the server but whose client has not noticed yet (a process resuming
 * from a long pause writes before its keep-alive reports the loss):
 * - `zookeeper-like`: every operation is tied to the session and fails;
 * - `etcd-like`: writes that create no ephemeral node are not tied to the lease,
 *   so they reach the store and only a compare in the transaction can stop them.
 */
export type Backend = "zookeeper-like" | "etcd-like"

/** The shape of a run. Durations are virtual milliseconds on the `TestClock`; ranges are drawn per seed. */
export interface Config {
  /** Fault-injection points; the clock advances `stepMs` after each. */
  readonly steps: number
  readonly stepMs: number
  /** The session timeout, drawn from [min, max] in whole steps. */
  readonly sessionTimeoutMs: readonly [number, number]
  /** How often a leader sends a request and makes a fenced write, drawn from [min, max]. */
  readonly writeEveryMs: readonly [number, number]
  /** Probability of a fault at each step. */
  readonly faultChance: number
  /**
   * Probabilities of a fault just before each coordination operation of a process, so faults also land between
   * the steps of a campaign or a write: its session expires, it pauses past its session, or it yields to the
   * other fibers (an interleaving point).
   */
  readonly opFaults: { readonly expire: number; readonly pause: number; readonly yield: number }
  /** Longest network delay of a request. */
  readonly maxDelayMs: number
  /** The backends a seed is drawn from. */
  readonly backends: ReadonlyArray<Backend>
}

/** The default run: 6 virtual seconds, sessions of 0.6–1.5 s, about six faults, either backend. */
export const defaultConfig: Config = {
  steps: 60,
  stepMs: 100,
  sessionTimeoutMs: [600, 1500],
  writeEveryMs: [50, 250],
  faultChance: 0.1,
  opFaults: { expire: 0.004, pause: 0.004, yield: 0.25 },
  maxDelayMs: 2000,
  backends: ["zookeeper-like", "etcd-like"]
}

/** The kinds of fault the driver injects. */
export type FaultKind = "crash" | "stop" | "expire" | "pause" | "blip" | "op-expire" | "op-pause"

/** A count of zero for every fault kind. */
export const noFaults = (): Record<FaultKind, number> => ({
  crash: 0,
  stop: 0,
  expire: 0,
  pause: 0,
  blip: 0,
  "op-expire": 0,
  "op-pause": 0
})

/** Counts of what happened in a run, to show the faults really exercised the system. */
export interface Stats {
  readonly processes: number
  readonly wins: number
  readonly faults: Readonly<Record<FaultKind, number>>
  readonly accepted: number
  readonly rejected: number
  readonly fencedApplied: number
  readonly fencedRejected: number
  /** No live process led at the end although every fault was over (also reported as a violation). */
  readonly leaderless: boolean
}

/** The outcome of one seed. */
export interface Result {
  readonly seed: number
  readonly variant: string
  readonly backend: Backend
  readonly violations: ReadonlyArray<string>
  readonly trace: ReadonlyArray<string>
  readonly stats: Stats
}

/** One life of a process, from start to crash or stop. */
export interface Incarnation {
  readonly number: number
  /** Set by a crash: the sessions are left to the server instead of being closed. */
  crashed: boolean
  /** The live sessions this incarnation opened (the server-side handles the faults need). */
  readonly sessions: Set<Coordination.Session>
  /** The term the latest campaign won, set when its leader node is registered. */
  term: number | undefined
  /** The session that won that term. */
  session: string | undefined
}

/** A simulated coordinator process. */
export interface Proc {
  readonly id: number
  /** Closed while the process is paused: every action of the process waits on it. */
  readonly gate: Latch.Latch
  paused: boolean
  incarnations: number
  current: Incarnation | undefined
  fiber: Fiber.Fiber<never> | undefined
  /** What the process believes it leads. */
  leading: { readonly epoch: number; readonly term: number } | undefined
}

/** One run: its shape as drawn from the seed, its parts, and what it records for the checkers. */
export interface World {
  readonly seed: number
  readonly variant: Variant
  readonly config: Config
  readonly rng: Prng.Prng
  readonly backend: Backend
  readonly sessionTimeoutMs: number
  readonly writeEveryMs: number
  /** The run's scope: processes, deliveries and resumptions are forked in it. */
  readonly scope: Scope.Scope
  /** The memory coordination every process shares, and its faults. */
  readonly coordination: Coordination.Shape
  readonly faults: Coordination.FaultsShape
  readonly clock: Clock.Clock
  readonly network: Network.Network
  /** A session outside every process, never faulted, used to set up and read the log. */
  readonly auditor: Coordination.Session
  readonly procs: ReadonlyArray<Proc>
  /** Off once the run settles before the checks. */
  faultsOn: boolean
  /** The leader registrations, in order: one term each. */
  readonly wins: Array<Checkers.Win>
  readonly epochWrites: Array<Checkers.EpochWrite>
  readonly faultCounts: Record<FaultKind, number>
  fencedApplied: number
  fencedRejected: number
  /** Terms begun so far. */
  terms: number
}
