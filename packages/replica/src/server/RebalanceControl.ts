/**
 * The controller as the rebalance service (`@strata/rebalance`'s `RebalanceService`) drives it: its cluster model
 * for planning and the trigger, its tablets and the servers' health for the executor's observations, and its
 * reassignments, cancels and preferred-leader elections as the executor's requests. A translation only: what to do
 * is the executor's and the controller's machines' to decide.
 *
 * @since 0.1.0
 */
import type { Models } from "@strata/core"
import type { ClusterModel, Executor, RebalanceService } from "@strata/rebalance"
import { Duration, Effect, Schedule, Stream } from "effect"
import type * as ControllerState from "../machines/ControllerState.js"
import type { ControllerShape, ReassignReply } from "./Controller.js"
import { type ControllerEndpoint, clusterModel } from "./ControllerRpc.js"

/**
 * How long the observation waits for the servers' health, and the model for their sizes.
 *
 * @since 0.1.0
 */
export interface RebalanceControlOptions {
  /** How long an observation waits for each server's health (2 seconds); one that does not answer is left out. */
  readonly healthTimeout?: Duration.Input
  /** How long the model waits for the servers' tablet sizes (5 seconds). */
  readonly sizeTimeout?: Duration.Input
}

/**
 * The `ClusterControl` of `controller`, whose servers `endpoint` reaches (without one, the model is the controller's
 * own view: its live servers without racks, servers down but holding replicas `excluded`, and no tablet sizes).
 *
 * @since 0.1.0
 */
export const make = (
  controller: ControllerShape,
  endpoint: ControllerEndpoint | undefined,
  options: RebalanceControlOptions = {}
): RebalanceService.ClusterControl => {
  const healthTimeout = options.healthTimeout ?? "2 seconds"
  const sizeTimeoutMs = Duration.toMillis(Duration.fromInputUnsafe(options.sizeTimeout ?? "5 seconds"))
  const resigned = (e: { readonly message: string }): Executor.Answer => ({ _tag: "Failed", detail: e.message })
  return {
    model:
      endpoint === undefined
        ? Effect.map(controller.state, modelOfState)
        : Effect.map(clusterModel(controller, endpoint, { sizeTimeoutMs }), (reply) => ({
            servers: reply.servers,
            tablets: reply.tablets
          })),
    observe: Effect.zipWith(controller.state, controller.serverHealth(healthTimeout), (state, health) => ({
      minInsyncReplicas: state.options.minInsyncReplicas ?? 1,
      live: state.live,
      health,
      tablets: [...state.tablets.values()]
        .filter((t) => t.state !== "DeletingTablet")
        .map(
          (t): Executor.TabletView => ({
            tablet: t.tablet,
            replicas: t.replicas,
            moving: t.reassignment?.target,
            leader: t.leaderAndIsr.leader,
            isr: t.leaderAndIsr.isr,
            online: t.state === "OnlineTablet" && t.leaderAndIsr.leader !== null
          })
        )
    })),
    reassign: (tablet, target, throttleBytesPerSec) =>
      controller.reassign(tablet, target, throttleBytesPerSec > 0 ? { throttleBytesPerSec } : {}).pipe(
        Effect.map(answerOf),
        Effect.catch((e) => Effect.succeed(resigned(e)))
      ),
    cancelReassign: (tablet) =>
      controller.cancelReassign(tablet).pipe(
        Effect.map(answerOf),
        Effect.catch((e) => Effect.succeed(resigned(e)))
      ),
    electPreferred: (tablet: Models.TabletId) =>
      controller.electPreferred([tablet]).pipe(
        Effect.as<Executor.Answer>({ _tag: "Accepted" }),
        Effect.catch((e) => Effect.succeed(resigned(e)))
      )
  }
}

/** The controller's view as a cluster model (no racks, no sizes): what `ControllerRpc.clusterModel` says without them. */
const modelOfState = (state: ControllerState.State): ClusterModel.ClusterModel => {
  const tablets = [...state.tablets.values()].filter((t) => t.state !== "DeletingTablet")
  const holders = new Set(tablets.flatMap((t) => t.reassignment?.target ?? t.replicas))
  const down = [...holders].filter((s) => !state.live.has(s)).sort((a, b) => a - b)
  return {
    servers: [
      ...[...state.live].sort((a, b) => a - b).map((id) => ({ id })),
      ...down.map((id) => ({ id, tags: ["excluded" as const] }))
    ],
    tablets: tablets.map((t) => {
      const replicas = t.reassignment?.target ?? t.replicas
      const leader = t.leaderAndIsr.leader
      return { tablet: t.tablet, replicas, leader: leader !== null && replicas.includes(leader) ? leader : null }
    })
  }
}

/** The controller's reply as the executor's answer: refused with the refusal's tag and line. */
const answerOf = (reply: ReassignReply): Executor.Answer =>
  reply._tag === "ReassignRefused"
    ? { _tag: "Refused", refusal: reply.refusal._tag, detail: reply.detail }
    : { _tag: "Accepted" }

/**
 * Emits when the controller's live servers changed (a server joined or left) and then held still for `settle`
 * (polled every `every`): the trigger's extra checks, one for servers that join one after another.
 *
 * @since 0.1.0
 */
export const serverChanges = (
  controller: ControllerShape,
  options: { readonly every?: Duration.Input; readonly settle?: Duration.Input } = {}
): Stream.Stream<void> =>
  Stream.fromEffectSchedule(
    Effect.map(controller.state, (state) => [...state.live].sort((a, b) => a - b).join(",")),
    Schedule.spaced(options.every ?? "1 second")
  ).pipe(Stream.changes, Stream.drop(1), Stream.debounce(options.settle ?? "5 seconds"), Stream.as(undefined))
