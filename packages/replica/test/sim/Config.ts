/**
 * The shapes of a cluster simulation run: its variant (the planted bugs), configuration, fault kinds, scripted
 * faults, counts and result, and the cluster a seed draws (its size, timeouts, replication, tablets and which fault
 * families it runs).
 */
import type { Models } from "@strata/core"
import { type Executor, RebalanceConfig } from "@strata/rebalance"
import { Schema } from "effect"
import { mix32, type Prng, seeded } from "../../../../scripts/test-support/prng.js"
import * as ControllerState from "../../src/machines/ControllerState.js"
import type * as ReplicaManager from "../../src/protocol/ReplicaManager.js"
import type * as ServerStorage from "../../src/server/ServerStorage.js"
import type * as TabletServer from "../../src/server/TabletServer.js"
import type * as ReplicationConfig from "../../src/wire/ReplicationConfig.js"
import * as Mutants from "../support/mutants.js"

/** Which safety checks are deliberately broken in a run. */
export interface Variant {
  readonly name: string
  /** The tablet servers' machines with planted bugs (production's when omitted). */
  readonly machines?: TabletServer.MachinesShape
  /** The controller's machine with a planted bug (production's when omitted). */
  readonly controller?: ControllerState.StepFunction
  /** Producers draw their ids at random from a small range instead of asking the controller for one. */
  readonly randomProducerIds?: boolean
  /**
   * Which seeds run the reassignment family: about half (the default), every one (for a bug only a move shows), or
   * none (a bug about something else is then searched on the histories it was found on, in fewer seeds).
   */
  readonly reassignments?: "half" | "every" | "none"
  /** The rebalance executor with a planted bug (production's when omitted). */
  readonly executor?: Executor.StepFunction
  /** Which seeds run the rebalance family: about a third of those not moving replica sets (default), or every one. */
  readonly rebalances?: "some" | "every" | "none"
  /**
   * The fault kinds every seed draws from, for a bug only some faults show (every kind, or a swarm's few, when
   * omitted).
   */
  readonly faults?: ReadonlyArray<FaultKind>
  /**
   * Which seeds run the delete family: about a third (the default), every one (for a bug only a delete shows), or
   * none (a bug about something else is then searched on the histories it was found on).
   */
  readonly deletes?: "none" | "some" | "every"
  /**
   * Which seeds give their tablets a retention (each replica deleting its oldest batches below its high watermark
   * every few hundred virtual ms): about a third (the default), every one, or none.
   */
  readonly retention?: "none" | "some" | "every"
  /** Wraps each tablet server's storage (a planted bug of the logs); production's storage when omitted. */
  readonly storage?: (storage: ServerStorage.ServerStorageShape) => ServerStorage.ServerStorageShape
}

/** The correct system. */
export const correct: Variant = { name: "correct" }

/** The correct system with every seed running the rebalance family (3–6 tablets), none moving replica sets by hand. */
export const rebalancing: Variant = { name: "rebalancing", reassignments: "none", rebalances: "every" }

/**
 * The planted bugs some seed within the CI's seeds catches by a loss, divergence or liveness property (the ISR check,
 * a divergence between a member an election may choose and its leader, included).
 */
export const planted: ReadonlyArray<Variant> = [
  ...(
    [
      { name: "truncate-to-hw", machines: Mutants.machinesWith(Mutants.truncateToHighWatermark) },
      { name: "hw-under-min-isr", machines: Mutants.machinesWith(Mutants.highWatermarkIgnoresMinIsr) },
      { name: "prefer-outside-isr", controller: Mutants.preferOutsideIsr(ControllerState.step) },
      { name: "random-producer-id", randomProducerIds: true },
      {
        name: "demoted-long-poll",
        machines: Mutants.machinesWith(Mutants.skipFetchRevalidation),
        reassignments: "none"
      },
      // A role left running under an older epoch shows once a leader's session ends: searched among the faults that end
      // sessions and cut links (about one seed in 400 catches it; one in 1350 among every kind).
      {
        name: "unfenced-log-end",
        machines: Mutants.machinesWith(Mutants.unfencedLogEnd),
        faults: ["expire", "isolate", "cut"]
      },
      { name: "stale-isr-answer", machines: Mutants.machinesWith(Mutants.answersIgnoreProposal) },
      { name: "isr-to-dead-server", controller: Mutants.skipIsrEligibility(ControllerState.step) },
      {
        name: "fenced-refusal-rejects",
        machines: Mutants.machinesWith(Mutants.fencedRefusalRejects),
        reassignments: "none"
      },
      { name: "remove-before-isr", controller: Mutants.removeBeforeIsr(ControllerState.step), reassignments: "every" },
      { name: "gate-ignored", executor: Mutants.gateIgnored, reassignments: "none", rebalances: "every" },
      { name: "rollback-skipped", executor: Mutants.rollbackSkipped, reassignments: "none", rebalances: "every" }
    ] satisfies ReadonlyArray<Variant>
  ).map((v): Variant => ({ deletes: "none", retention: "none", ...v })),
  // A log whose retention deletes past the high watermark it is given: records not yet committed go from the
  // leader, its followers start over from its new log start, and what is acknowledged next is on no replica.
  {
    name: "retain-past-hw",
    storage: Mutants.retainPastLimit,
    retention: "every",
    deletes: "none",
    reassignments: "none",
    rebalances: "none"
  },
  // A delete answered before the followers' starts reached it shows when a follower that had not yet moved its start
  // leads next: searched among the faults that end a leader's life while its followers lag.
  {
    name: "delete-unwaited",
    machines: Mutants.machinesWith(Mutants.deleteUnwaited),
    deletes: "every",
    reassignments: "none",
    rebalances: "none",
    faults: ["crash", "power", "stop", "pause", "slow", "isolate", "oneway"],
    retention: "none"
  },
  // A delete held by a leader left alone in its ISR shows when that leader loses its unflushed writes and leads
  // again: searched among power losses and the faults that shrink an ISR without ending the leader's life.
  {
    name: "delete-alone",
    machines: Mutants.machinesWith(Mutants.deleteIgnoresMinIsr),
    deletes: "every",
    reassignments: "none",
    rebalances: "none",
    faults: ["power", "pause", "isolate"],
    retention: "none"
  },
  // A leader chosen by a recovery election from outside the ISR that took a delete, not taking its followers' later
  // starts: searched among the faults that make every ISR member a new life.
  {
    name: "start-not-raised",
    machines: Mutants.machinesWith(Mutants.startNotRaised),
    deletes: "every",
    reassignments: "none",
    rebalances: "none",
    faults: ["pause", "crash", "expire", "stop"],
    retention: "none"
  }
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

/** The fault kinds a seed draws from, and whether it is a swarm seed that also sends some records acks=1. */
export interface FaultMix {
  readonly kinds: ReadonlyArray<readonly [FaultKind, number]>
  readonly swarm: boolean
  readonly acksOne: boolean
}

/**
 * The faults a seed draws from. Half the seeds draw from every kind; the other half (swarm testing) from a few kinds
 * only, chosen by a generator of their own, so that rare combinations (a lagging replica, a slow process and a
 * leadership move at once) come up far more often than when every kind dilutes the others. Seeds of the first half
 * keep the histories they had before swarms.
 */
const faultsOf = (seed: number, only: ReadonlyArray<FaultKind> | undefined): FaultMix => {
  const swarm = seeded(mix32(seed ^ 0x5a7f))
  if (only !== undefined)
    return { kinds: faultWeights.filter(([kind]) => only.includes(kind)), swarm: true, acksOne: swarm.chance(0.5) }
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

/**
 * The replication settings every server, controller and client of a run gets (`ReplicationConfig`'s keys; each
 * duration a number of virtual milliseconds).
 */
export interface Replication {
  readonly replicationFactor: number
  readonly minInsyncReplicas: number
  readonly sessionTimeout: number
  readonly replicaLagTimeMax: number
  readonly fetchMaxWait: number
  readonly retryBackoff: number
  readonly appendTimeout: number
  /** How often a server applies its tablets' retention (the retention family's seeds only). */
  readonly retentionCheckInterval?: number
}

/** The cluster a seed draws (or a scenario's shape fixes), and the fault families it runs. */
export interface Cluster {
  readonly serverCount: number
  readonly coordinatorCount: number
  readonly sessionTimeoutMs: number
  readonly replicaLagTimeMaxMs: number
  /** The replication every server, controller and client runs with. */
  readonly replication: Replication
  readonly rf: number
  readonly minIsr: number
  readonly tablets: ReadonlyArray<Models.TabletId>
  readonly flushChance: number
  readonly leaderElection: "first-in-isr" | "largest-log-end"
  /** The process and network faults the seed draws from. */
  readonly faultMix: FaultMix
  /** The leadership-transfer family's own generator, when the seed runs it. */
  readonly transfers: Prng | undefined
  /** The storage-and-clock family's own generator, when the seed runs it. */
  readonly extras: Prng | undefined
  /** The ISR-churn family's own generator, when the seed runs it. */
  readonly churning: Prng | undefined
  /** The reassignment family's own generator, when the seed runs it. */
  readonly moves: Prng | undefined
  /** The rebalance family's own generator, when the seed runs it. */
  readonly rebalancing: Prng | undefined
  /** The settings its rebalances run with, when it does. */
  readonly rebalanceSettings: RebalanceConfig.RebalanceConfig | undefined
  /** The delete family's own generator (`deleteRecords` calls while producing), when the seed runs it. */
  readonly deleting: Prng | undefined
  /** The retention its tablets are created with, when the seed runs the retention family. */
  readonly retention: ReplicaManager.Retention | undefined
}

/**
 * Draws the cluster from the seed's main generator `rng`, in a fixed order (3–7 servers, 1–3 coordinators, the
 * session and lag timeouts, the replication factor, the long-poll wait, the minimum ISR, 1–3 tablets, the flush
 * chance, the election rule); each fault family that half the seeds run draws from a generator of its own (the
 * reassignment family on every seed or none as `reassignments` says; the delete family on a third of the seeds or
 * every one as `deletes` says).
 */
export const drawCluster = (
  seed: number,
  rng: Prng,
  config: Config,
  reassignments: Variant["reassignments"] = "half",
  rebalances: Variant["rebalances"] = "some",
  faults?: Variant["faults"],
  deletes: Variant["deletes"] = "some",
  retaining: Variant["retention"] = "some"
): Cluster => {
  const shape = config.shape
  const serverCount = shape?.servers ?? rng.int(3, 7)
  const coordinatorCount = shape?.coordinators ?? rng.int(1, 3)
  const sessionTimeoutMs = shape?.sessionTimeoutMs ?? 100 * rng.int(5, 12)
  const replicaLagTimeMaxMs = shape?.replicaLagTimeMaxMs ?? sessionTimeoutMs * rng.int(2, 4)
  const replicationFactor = shape?.replicationFactor ?? Math.min(serverCount, rng.int(2, 3))
  // Long polls as long as a leader change (up to the longest the lag time allows): a poll admitted under one
  // epoch may wake in the next.
  const fetchMaxWaitMs = rng.pick([50, 200, 400, Math.floor(replicaLagTimeMaxMs / 2) - 1])
  const rf = replicationFactor
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
  // A third of the seeds give their tablets a retention, drawn by its own generator: a few hundred bytes a replica
  // (a handful of the workload's batches), now and then an age as well, applied every 100–500 virtual ms.
  const retentionDraws = seeded(mix32(seed ^ 0x2e7a))
  const retention: ReplicaManager.Retention | undefined =
    config.script === undefined && retaining !== "none" && (retaining === "every" || retentionDraws.chance(0.35))
      ? {
          bytes: retentionDraws.int(150, 800),
          ...(retentionDraws.chance(0.3) ? { ms: 100 * retentionDraws.int(5, 30) } : {})
        }
      : undefined
  const replication = {
    replicationFactor,
    minInsyncReplicas: minIsr,
    sessionTimeout: sessionTimeoutMs,
    replicaLagTimeMax: replicaLagTimeMaxMs,
    fetchMaxWait: fetchMaxWaitMs,
    retryBackoff: 50,
    appendTimeout: 2_000,
    ...(retention === undefined ? {} : { retentionCheckInterval: 100 * retentionDraws.int(1, 5) })
  } satisfies Replication & ReplicationConfig.ReplicationConfigInput
  // A seed that runs every family's rebalances gets more tablets to move (one draw either way).
  const tabletCount = shape?.tablets ?? (rebalances === "every" ? rng.int(3, 6) : rng.int(1, 3))
  const tablets: Array<Models.TabletId> = Array.from({ length: tabletCount }, (_, bucket) => ({
    table: "t",
    bucket
  }))
  const flushChance = config.flushChance ?? rng.pick([0.05, 0.2, 0.5])
  const faultMix = faultsOf(seed, faults)
  // Half the seeds also transfer leaderships under lag, drawn by a generator of their own.
  const transferring = seeded(mix32(seed ^ 0x7a11))
  const transfers = config.script === undefined && transferring.chance(0.5) ? transferring : undefined
  // Half the seeds also churn an ISR (late answers, a flapping follower), drawn by a generator of their own.
  const churnDraws = seeded(mix32(seed ^ 0x15c4))
  const churning = config.script === undefined && churnDraws.chance(0.5) ? churnDraws : undefined
  // Half the seeds also move replica sets (reassignments), drawn by a generator of their own.
  const moveDraws = seeded(mix32(seed ^ 0x6e0b))
  const moves =
    config.script === undefined && reassignments !== "none" && (reassignments === "every" || moveDraws.chance(0.5))
      ? moveDraws
      : undefined
  // A third of the seeds that do not move replica sets by hand run the rebalance service, drawn by its own generator.
  const rebalanceDraws = seeded(mix32(seed ^ 0x4eba))
  const rebalancing =
    config.script === undefined &&
    moves === undefined &&
    rebalances !== "none" &&
    (rebalances === "every" || rebalanceDraws.chance(0.35))
      ? rebalanceDraws
      : undefined
  const rebalanceSettings = rebalancing === undefined ? undefined : drawRebalanceSettings(rebalancing)
  // A third of the seeds also delete records below their tablets' HWs while producing, drawn by its own generator.
  const deleteDraws = seeded(mix32(seed ^ 0x0de1))
  const deleting =
    config.script === undefined && deletes !== "none" && (deletes === "every" || deleteDraws.chance(0.35))
      ? deleteDraws
      : undefined
  const leaderElection =
    shape === undefined
      ? rng.pick(["first-in-isr", "largest-log-end"] as const)
      : (shape.leaderElection ?? "first-in-isr")
  return {
    serverCount,
    coordinatorCount,
    sessionTimeoutMs,
    replicaLagTimeMaxMs,
    replication,
    rf,
    minIsr,
    tablets,
    flushChance,
    leaderElection,
    faultMix,
    transfers,
    extras,
    churning,
    moves,
    rebalancing,
    rebalanceSettings,
    deleting,
    retention
  }
}

/** The settings a seed's rebalances run with: short windows, and limits and a trigger drawn by `rb`. */
const drawRebalanceSettings = (rb: Prng): RebalanceConfig.RebalanceConfig =>
  Schema.decodeUnknownSync(RebalanceConfig.RebalanceConfig)({
    enabled: rb.chance(0.6),
    checkInterval: 1_000,
    cooldown: rb.pick([0, 500, 2_000]),
    triggerThreshold: 0.1,
    batchRatio: rb.pick([0.34, 0.5, 1]),
    maxConcurrentMigrations: rb.int(1, 2),
    maxClusterMigrations: rb.int(1, 3),
    throttleBytesPerSec: rb.pick([0, 0, 2_048]),
    moveTimeout: rb.pick([1_500, 4_000]),
    gateWindow: rb.pick([200, 400]),
    // The simulated network's delays are virtual and long: the latency gate is the unit tests' to judge; a seed in
    // four keeps it, at three times the baseline.
    gateLatencyFactor: rb.chance(0.25) ? 3 : 1_000
  })

/** The run's first trace line: the seed and what it drew. */
export const describeCluster = (seed: number, c: Cluster): string => {
  const mix = c.faultMix
  const swarm = mix.swarm ? ` faults=${mix.kinds.map(([k]) => k).join(",")}${mix.acksOne ? " acks=1 too" : ""}` : ""
  return `seed=${seed} servers=${c.serverCount} coordinators=${c.coordinatorCount} session=${c.sessionTimeoutMs}ms poll=${c.replication.fetchMaxWait}ms rf=${c.rf} minIsr=${c.minIsr} tablets=${c.tablets.length} flush=${c.flushChance} election=${c.leaderElection}${swarm}${c.transfers === undefined ? "" : " transfers"}${c.churning === undefined ? "" : " churn"}${c.moves === undefined ? "" : " reassignments"}${c.rebalanceSettings === undefined ? "" : ` rebalances(batch=${c.rebalanceSettings.batchRatio} c=${c.rebalanceSettings.maxConcurrentMigrations} cap=${c.rebalanceSettings.maxClusterMigrations} trigger=${c.rebalanceSettings.enabled})`}${c.extras === undefined ? "" : " disk-and-clock"}${c.deleting === undefined ? "" : " deletes"}${c.retention === undefined ? "" : ` retention=${JSON.stringify(c.retention)}`}`
}
