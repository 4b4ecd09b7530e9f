/**
 * `World`, the state record every part of the cluster simulator shares (the seed's generator, the virtual clock,
 * the cluster drawn, its processes and stores, the network, the faults in force and what the run records for the
 * checkers), and `Proc`, one simulated tablet server or coordinator.
 */
import type { Coordination } from "@strata/core"
import type { RebalanceService } from "@strata/rebalance"
import type * as ReplicaManager from "../../src/protocol/ReplicaManager.js"
import { type Effect, type Fiber, Latch, type Scope } from "effect"
import type { Prng } from "../../../../scripts/test-support/prng.js"
import * as Clock from "../../../../scripts/test-support/sim/Clock.js"
import type * as Controller from "../../src/server/Controller.js"
import type * as TabletServer from "../../src/server/TabletServer.js"
import * as ClusterPaths from "../../src/wire/ClusterPaths.js"
import type { PeersShape } from "../../src/wire/Peers.js"
import type * as Checkers from "./Checkers.js"
import type { Cluster, Config, Variant } from "./Config.js"
import type { Churn } from "./IsrChurn.js"
import type * as LossyStore from "./LossyStore.js"
import type * as Network from "./Network.js"
import type * as Rebalances from "./Rebalances.js"

/** The coordination namespace of the simulated cluster. */
export const NAMESPACE = "/sim"
/** The cluster's nodes in coordination. */
export const paths = ClusterPaths.make(NAMESPACE)

/** One simulated process: a tablet server or a coordinator. */
export interface Proc {
  readonly name: string
  readonly kind: "server" | "coordinator"
  readonly id: number
  /** The running incarnation's scope, `undefined` while down. */
  scope: Scope.Closeable | undefined
  incarnation: number
  crashed: boolean
  paused: boolean
  /** Its live sessions, so faults can cut or expire them. */
  readonly sessions: Set<Coordination.Session>
  server: TabletServer.TabletServerShape | undefined
  /** The running incarnation's registration (the creation order of its node), once it has one and while it lasts. */
  registration: number | undefined
  /** How far its wall clock is off the simulation's (a clock that jumped); its timers are unaffected. */
  clockOffsetMs: number
  /** The server's LeaderAndIsr as the controller reaches it (recorded for the coordinator-epoch check). */
  serverInbox:
    | ((request: ReplicaManager.LeaderAndIsrRequest) => Effect.Effect<void, ReplicaManager.ReplicaError>)
    | undefined
  controller: Controller.ControllerShape | undefined
  /** Its rebalance service while it leads (on seeds that run the rebalance family). */
  rebalance: RebalanceService.RebalanceServiceShape | undefined
  /** The step at which a downed or paused process comes back. */
  backAt: number | undefined
  /** In a controlled shutdown that has not stopped it yet. */
  stopping: boolean
  /** Closed while paused: every coordination operation of the process waits on it. */
  readonly gate: Latch.Latch
}

/** A process that has not started: `s<id>` for a tablet server, `c<id>` for a coordinator. */
export const makeProc = (kind: Proc["kind"], id: number): Proc => ({
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
  rebalance: undefined,
  backAt: undefined,
  stopping: false,
  gate: Latch.makeUnsafe(true)
})

/** A fault that ends by itself at a step. */
export interface Timed {
  readonly until: number
  readonly end: Effect.Effect<void>
}

/**
 * How a process reaches the others (`Peers.ts`), given to the process starter so that starting a server (whose
 * peers may stall or restart servers under ISR churn) needs no import back.
 */
export interface Wiring {
  readonly peers: (p: Proc) => PeersShape
  readonly servers: (c: Proc) => Controller.TabletServersShape
}

/** One run: its shape as drawn from the seed, its parts, and what it records for the checkers. */
export interface World {
  readonly seed: number
  readonly variant: Variant
  readonly config: Config
  /** The seed's main generator (the fault families have their own, in `cluster`). */
  readonly rng: Prng
  /** The run's scope: processes, packets and fault endings are forked in it. */
  readonly root: Scope.Scope
  /** The memory coordination every process shares, and its faults. */
  readonly base: Coordination.Shape
  readonly faults: Coordination.FaultsShape
  readonly clock: Clock.VirtualClock
  readonly cluster: Cluster
  readonly record: Checkers.Recorder
  /** A session outside every process, never faulted, that reads the cluster's nodes. */
  readonly auditor: Coordination.Session
  readonly procs: ReadonlyArray<Proc>
  readonly servers: ReadonlyArray<Proc>
  readonly coordinators: ReadonlyArray<Proc>
  readonly byName: ReadonlyMap<string, Proc>
  /** The clients' side of the network (no process of the cluster): faults can cut it off from coordination. */
  readonly clientProc: Proc
  /** Each server's store, kept across its restarts. */
  readonly stores: Map<number, LossyStore.LossyStore>
  /** A downed server's closing (and, after a crash that loses unflushed writes, its loss), awaited by its start. */
  readonly closing: Map<number, Fiber.Fiber<void>>
  readonly network: Network.Network
  readonly wiring: Wiring
  /** Off once the faults stop. */
  faultsOn: boolean
  /** The ISR churns in force, by tablet. */
  readonly churns: Map<string, Churn>
  /** Faults that end by themselves at a step. */
  readonly timed: Array<Timed>
  readonly faultCounts: Record<string, number>
  /** Writes lost by power losses. */
  lostWrites: number
  /**
   * From when the cluster is quiet, if no fault is in force then: a fault's aftermath (a session left to expire, a
   * follower that fell behind dropped from its ISR) lasts up to `aftermathMs` after it was injected or last seen in
   * force, or until the cluster settles.
   */
  calmFromMs: number
  /** The tablets a reassignment request (or its cancel) is out for, answered or not yet. */
  readonly reassigning: Set<string>
  /** The servers registered at the last step's sample. */
  registered: ReadonlySet<number>
  /** What the rebalance family records (`Rebalances.ts`). */
  readonly rebalances: Rebalances.Watch
}

/** The virtual time in milliseconds. */
export const now = (w: World): number => Clock.now(w.clock)

/** Adds a line to the run's trace, stamped with the virtual time. */
export const log = (w: World, line: string): void => Clock.log(w.clock, line)

/** How long a fault's aftermath may last: a session, a lag time, and half a second. */
export const aftermathMs = (w: World): number => w.cluster.sessionTimeoutMs + w.cluster.replicaLagTimeMaxMs + 500

/** A fault is in force now (injected or seen): the cluster is not quiet until its aftermath is over. */
export const faultSeen = (w: World): void => {
  w.calmFromMs = Math.max(w.calmFromMs, now(w) + aftermathMs(w))
}

/** Counts one fault of `kind`, injected now. */
export const count = (w: World, kind: string): void => {
  tally(w, kind)
  faultSeen(w)
}

/** Counts one event of `kind` that is no fault (a reassignment request, its answer) among the fault counts. */
export const tally = (w: World, kind: string): void => {
  w.faultCounts[kind] = (w.faultCounts[kind] ?? 0) + 1
}
