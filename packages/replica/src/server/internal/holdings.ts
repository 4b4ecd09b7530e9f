/**
 * The controller's `Holdings` question to the tablet servers outside its machine: for the cluster model's replica
 * sizes (`ControllerRpc`) and the servers' health (`ControllerShape.serverHealth`, `ControllerRpc.serverHealth`).
 *
 * @internal
 */
import type { Models } from "@strata/core"
import { type Duration, Effect, Option } from "effect"
import type * as ControllerState from "../../machines/ControllerState.js"
import type * as ReplicaManager from "../../protocol/ReplicaManager.js"
import type { TabletServersShape } from "../../wire/Peers.js"

/**
 * The servers' answers to `Holdings` (asked under the controller's epoch and each server's registration as it knows
 * them), by server: every server asked at once, one that fails or has not answered within `timeout` left out.
 */
export const holdingsOf = (
  servers: TabletServersShape | undefined,
  state: ControllerState.State,
  asked: ReadonlyArray<Models.ServerId>,
  timeout: Duration.Duration
): Effect.Effect<ReadonlyMap<Models.ServerId, ReplicaManager.HoldingsResult>> =>
  servers === undefined
    ? Effect.succeed(new Map())
    : Effect.map(
        Effect.forEach(
          asked,
          (id) => {
            const registration = state.registrations.get(id)
            const request = {
              coordinatorEpoch: state.coordinatorEpoch,
              ...(registration === undefined ? {} : { registration })
            }
            return servers.holdings(id, request).pipe(
              Effect.timeoutOption(timeout),
              Effect.map(Option.map((held) => [id, held] as const)),
              Effect.catch(() => Effect.succeed(Option.none()))
            )
          },
          { concurrency: "unbounded" }
        ),
        (answers) => new Map(answers.flatMap((a) => (Option.isSome(a) ? [a.value] : [])))
      )

/**
 * Each live server's health as its answer to `Holdings` tells it: every server of `state.live` asked at once
 * (`holdingsOf`), one that fails, has not answered within `timeout`, or keeps no health left out.
 */
export const serverHealth = (
  servers: TabletServersShape | undefined,
  state: ControllerState.State,
  timeout: Duration.Duration
): Effect.Effect<ReadonlyMap<Models.ServerId, ReplicaManager.ServerHealth>> =>
  Effect.map(holdingsOf(servers, state, [...state.live], timeout), (answers) => {
    const out = new Map<Models.ServerId, ReplicaManager.ServerHealth>()
    for (const [id, held] of answers) if (held.health !== undefined) out.set(id, held.health)
    return out
  })
