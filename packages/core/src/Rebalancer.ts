/**
 * The `Rebalancer` protocol: decide when the tablet distribution is uneven,
 * plan the fewest moves that fix it, and execute them progressively.
 *
 * @since 0.1.0
 */
import type * as Models from "./Models.js"
import type { Effect, Stream } from "effect"
import { Context, Schema } from "effect"

/** Why a rebalance started. */
export type Trigger =
  | { readonly _tag: "ServerJoined"; readonly serverId: Models.ServerId }
  | { readonly _tag: "Imbalance"; readonly coefficientOfVariation: number }
  | { readonly _tag: "Manual" }

/** Moving one replica of a tablet from one server to another. */
export interface Move {
  readonly tablet: Models.TabletId
  readonly from: Models.ServerId
  readonly to: Models.ServerId
  /** Bytes (or records) to copy: what the planner minimises. */
  readonly size: number
}

/** A rebalance plan, deterministic for the same input. */
export interface Plan {
  readonly id: string
  readonly trigger: Trigger
  readonly moves: ReadonlyArray<Move>
  /** The tight lower bound on the number of moves, to judge the plan against. */
  readonly lowerBound: number
  readonly cvBefore: number
  readonly cvAfter: number
}

/** Where an executing plan stands. */
export interface Progress {
  readonly planId: string
  readonly state: "running" | "paused" | "completed" | "rolled-back"
  readonly batch: number
  readonly batches: number
  readonly movesDone: number
  readonly movesTotal: number
}

/** The `Rebalancer` service shape. */
export interface Shape {
  /** Plans and starts a rebalance now (`POST /rebalance`). */
  readonly trigger: Effect.Effect<Plan, RebalanceError>
  /** The running or last plan's progress. */
  readonly progress: Effect.Effect<Progress | undefined>
  readonly changes: Stream.Stream<Progress>
  /** Pauses after the current batch. */
  readonly pause: Effect.Effect<void, RebalanceError>
  readonly resume: Effect.Effect<void, RebalanceError>
}

/** The `Rebalancer` service key. */
export class Rebalancer extends Context.Service<Rebalancer, Shape>()("@strata/core/Rebalancer") {}

/** No plan satisfies the constraints (too few servers or racks for the replication factor). */
export class PlanInfeasible extends Schema.TaggedError<PlanInfeasible>()("PlanInfeasible", { detail: Schema.String }) {
  /** @since 0.1.0 */
  override get message() {
    return `no feasible rebalance plan: ${this.detail}`
  }
}

/** A cluster model or planner options the planner cannot read: `field` names what is wrong (`tablets[3].replicas[1]`, `options.goals[0]`). */
export class InvalidModel extends Schema.TaggedError<InvalidModel>()("InvalidModel", {
  field: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `invalid planner input: ${this.field}: ${this.detail}`
  }
}

/** A rebalance is already running. */
export class InProgress extends Schema.TaggedError<InProgress>()("RebalanceInProgress", {
  planId: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `rebalance ${this.planId} is already in progress`
  }
}

/** A batch failed its stability gate and was rolled back. */
export class BatchRolledBack extends Schema.TaggedError<BatchRolledBack>()("BatchRolledBack", {
  planId: Schema.String,
  batch: Schema.Int,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message() {
    return `rebalance ${this.planId} batch ${this.batch} rolled back: ${this.detail}`
  }
}

/** Why a rebalance operation failed. */
export const ErrorReason = Schema.Union([PlanInfeasible, InvalidModel, InProgress, BatchRolledBack])
/** @see RebalanceErrorReason */
export type ErrorReason = typeof ErrorReason.Type

/** The error of every `Rebalancer` operation. */
export class RebalanceError extends Schema.TaggedError<RebalanceError>()("RebalanceError", {
  reason: ErrorReason
}) {
  /** @since 0.1.0 */
  override get message() {
    return this.reason.message
  }
}
