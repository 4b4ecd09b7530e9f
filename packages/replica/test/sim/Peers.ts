/**
 * How the simulated processes reach each other over the network: a tablet server's peers (the other servers'
 * fetches and end-offset questions, and the controller now in charge, its ISR requests passing through the ISR
 * churn when one is aimed at them) and a controller's tablet servers (each server's LeaderAndIsr and questions,
 * lost while the controllers' connection to it is cut).
 */
import { Models } from "@strata/core"
import type * as ReplicaManager from "../../src/protocol/ReplicaManager.js"
import { Effect } from "effect"
import type * as Controller from "../../src/server/Controller.js"
import type * as TabletServer from "../../src/server/TabletServer.js"
import type { PeersShape, PeerUnreachable } from "../../src/wire/Peers.js"
import * as Audit from "./Audit.js"
import * as Checkers from "./Checkers.js"
import * as IsrChurn from "./IsrChurn.js"
import { call, unreachable } from "./Network.js"
import { log, type Proc, type World } from "./World.js"

/** The coordinator whose controller has the highest coordinator epoch, if any controls. */
export const controllerNow = (w: World): Proc | undefined => {
  let best: Proc | undefined
  for (const c of w.coordinators) {
    if (c.controller === undefined) continue
    if (best === undefined || c.controller.coordinatorEpoch > best.controller!.coordinatorEpoch) best = c
  }
  return best
}

/** A call from `p` to the controller now, over the simulated network. */
const onController = <A>(
  w: World,
  p: Proc,
  f: (controller: Controller.ControllerShape) => Effect.Effect<A, { readonly message: string }>
): Effect.Effect<A, PeerUnreachable> =>
  Effect.suspend(() => {
    const c = controllerNow(w)
    if (c === undefined) return Effect.fail(unreachable("controller", "none"))
    return call(w, p.name, c.name, f(c.controller!).pipe(Effect.mapError((e) => unreachable(c.name, e.message))))
  })

/** The peers of tablet server `p`. */
export const peersOf = (w: World, p: Proc): PeersShape => ({
  leader: (id) => {
    const target = w.byName.get(`s${id}`)!
    // Read at each call: a retry reaches the server's current incarnation.
    const server = Effect.suspend(() =>
      target.server === undefined ? Effect.fail(unreachable(target.name, "down")) : Effect.succeed(target.server)
    )
    return {
      // A fetch can move the leader's HW: the ISR is checked against it right there, not only at the next step.
      fetch: (request) =>
        Effect.flatMap(server, (s) =>
          call(
            w,
            p.name,
            target.name,
            Effect.tap(s.fetch(request), () => Audit.sampleIsr(w, request.tablet))
          )
        ),
      endOffsetForEpoch: (request) =>
        Effect.flatMap(server, (s) => call(w, p.name, target.name, s.endOffsetForEpoch(request)))
    }
  },
  controller: {
    adjustIsr: (request) =>
      Effect.gen(function* () {
        // Under ISR churn the request is numbered, and the follower being added may stall as it goes.
        const churn = IsrChurn.churnLedBy(w, p, request.tablet)
        const proposal = churn === undefined ? 0 : ++churn.sent
        const before = yield* Audit.readTablet(w, request.tablet)
        const joining =
          churn !== undefined &&
          request.isr.includes(churn.follower) &&
          !before?.leaderAndIsr.isr.includes(churn.follower)
        if (churn !== undefined && joining) yield* IsrChurn.stallJoining(w, churn)
        const c = controllerNow(w)
        if (c === undefined) return yield* Effect.fail(unreachable("controller", "none"))
        const registered = yield* Audit.registeredServers(w)
        const reply = yield* call(
          w,
          p.name,
          c.name,
          c.controller!.adjustIsr(request).pipe(Effect.mapError((e) => unreachable(c.name, e.message)))
        )
        log(
          w,
          `${p.name} asks isr [${request.isr.join(",")}] of ${Models.tabletKey(request.tablet)} e${request.leaderEpoch} v${request.version}: ${reply._tag === "IsrRejected" ? JSON.stringify(reply.rejection) : `v${reply.leaderAndIsr.version}`}`
        )
        if (reply._tag === "IsrAdjusted" && before !== undefined) {
          // Registered before the call or after it: the controller may have seen either.
          const after = yield* Audit.registeredServers(w)
          const either = new Set([...registered, ...after])
          Checkers.isrChange(
            w.record,
            Models.tabletKey(request.tablet),
            before.leaderAndIsr.isr,
            reply.leaderAndIsr.isr,
            either
          )
        }
        if (churn !== undefined && joining && churn.stall === "lost" && reply._tag === "IsrAdjusted") {
          yield* IsrChurn.deafen(w, churn, before?.leaderAndIsr.isr ?? [])
          return yield* Effect.fail(unreachable(c.name, "answer lost"))
        }
        if (churn !== undefined) yield* IsrChurn.heldUntilNext(w, churn, proposal, request.tablet)
        return reply
      }),
    controlledShutdown: (server) => onController(w, p, (c) => c.controlledShutdown(server)),
    replicaStorage: (report) => onController(w, p, (c) => c.replicaStorage(report))
  }
})

/** A call from coordinator `c` to server `id` over the simulated network (unreachable while it is down). */
const onServer = <A>(
  w: World,
  c: Proc,
  id: number,
  f: (server: TabletServer.TabletServerShape) => Effect.Effect<A, ReplicaManager.ReplicaError>
) => {
  const target = w.byName.get(`s${id}`)!
  const server = target.server
  if (w.network.unheard.has(target.name))
    return Effect.fail(unreachable(target.name, "the controller's connection is cut"))
  return server === undefined ? Effect.fail(unreachable(target.name, "down")) : call(w, c.name, target.name, f(server))
}

/** The tablet servers as coordinator `c`'s controller reaches them. */
export const serversFor = (w: World, c: Proc): Controller.TabletServersShape => ({
  leaderAndIsr: (id, request) => {
    const target = w.byName.get(`s${id}`)!
    const inbox = target.serverInbox
    if (w.network.unheard.has(target.name))
      return Effect.fail(unreachable(target.name, "the controller's connection is cut"))
    return inbox === undefined || target.scope === undefined
      ? Effect.fail(unreachable(target.name, "down"))
      : call(w, c.name, target.name, inbox(request))
  },
  logEnd: (id, request) => onServer(w, c, id, (server) => server.logEnd(request)),
  holdings: (id, request) => onServer(w, c, id, (server) => server.holdings(request)),
  stopReplica: (id, request) => onServer(w, c, id, (server) => server.stopReplica(request))
})
