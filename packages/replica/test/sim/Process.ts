/**
 * The simulated processes' lives: a tablet server (the real `TabletServer` on its lossy store, registering
 * itself) or a coordinator (the real `Coordinator` running the election with the real `Controller` as its leader
 * service) starts in a scope of its own; it goes down by a crash (its sessions left to expire, maybe its unflushed
 * writes lost) or a clean stop, and pauses and resumes (its coordination waiting, its sessions cut meanwhile).
 */
import { Coordination, Election, Models } from "@strata/core"
import { CoordinationElection, Coordinator } from "@strata/election"
import { Clock, Context, Duration, Effect, Exit, Fiber, Logger, Scope } from "effect"
import * as ControllerState from "../../src/machines/ControllerState.js"
import * as Controller from "../../src/server/Controller.js"
import * as Rebalances from "./Rebalances.js"
import * as ControllerView from "../../src/server/ControllerView.js"
import * as ServerStorage from "../../src/server/ServerStorage.js"
import * as TabletServer from "../../src/server/TabletServer.js"
import * as ClusterPaths from "../../src/wire/ClusterPaths.js"
import { Peers } from "../../src/wire/Peers.js"
import * as Mutants from "../support/mutants.js"
import * as Audit from "./Audit.js"
import * as Checkers from "./Checkers.js"
import * as LossyStore from "./LossyStore.js"
import { clockOf } from "./Network.js"
import { coordinationOf } from "./ProcessCoordination.js"
import { log, NAMESPACE, paths, type Proc, type World } from "./World.js"

/** A process's log lines, into the trace (below errors only with `STRATA_SIM_LOG=info`). */
export const traceLogger = (w: World, p: Proc) =>
  Logger.make((o) => log(w, `${p.name} ${o.logLevel}: ${[o.message].flat().map(String).join(" ")}`))

/**
 * A server's storage whose logs tell the checkers every retention they are asked for: below the limit one is given
 * (its replica's high watermark), a record may be gone.
 */
const recordingRetention = (w: World, storage: ServerStorage.ServerStorageShape): ServerStorage.ServerStorageShape => ({
  ...storage,
  open: (tablet) =>
    Effect.map(storage.open(tablet), (log) => ({
      ...log,
      retain: (retention, limit, nowMs) =>
        Effect.andThen(
          Effect.sync(() => Checkers.retaining(w.record, Models.tabletKey(tablet), limit)),
          log.retain(retention, limit, nowMs)
        )
    }))
})

/** Starts tablet server `p` on its store (made at its first start), once its previous life has closed. */
const startServer = (w: World, p: Proc) =>
  Effect.gen(function* () {
    const before = w.closing.get(p.id)
    if (before !== undefined) yield* Fiber.join(before)
    let store = w.stores.get(p.id)
    if (store === undefined) {
      store = yield* LossyStore.make(w.root)
      w.stores.set(p.id, store)
    }
    const scope = yield* Scope.fork(w.root, "sequential")
    p.scope = scope
    p.crashed = false
    p.incarnation++
    const incarnation = p.incarnation
    const server = yield* TabletServer.make({ serverId: p.id, replication: w.cluster.replication }).pipe(
      Effect.provideServiceEffect(
        ServerStorage.ServerStorage,
        Effect.map(ServerStorage.makeStore, (storage) => recordingRetention(w, w.variant.storage?.(storage) ?? storage))
      ),
      Effect.provide(Context.add(store.context, Peers, w.wiring.peers(p))),
      Effect.provideService(TabletServer.Machines, w.variant.machines ?? Mutants.production),
      Effect.provideService(Clock.Clock, clockOf(w, p)),
      Effect.provideService(Logger.CurrentLoggers, new Set([traceLogger(w, p)])),
      Scope.provide(scope),
      Effect.orDie
    )
    p.server = server
    p.registration = undefined
    // What the controller reaches: the server's LeaderAndIsr, recorded for the coordinator-epoch check.
    p.serverInbox = (request) =>
      Effect.tap(server.leaderAndIsr(request), () =>
        Effect.sync(() => Checkers.applied(w.record, p.name, incarnation, request.coordinatorEpoch))
      )
    yield* Effect.forkIn(
      ClusterPaths.keepRegistered(coordinationOf(w, p), paths, p.id, {
        address: p.name,
        dataAddress: p.name,
        sessionTimeout: Duration.millis(w.cluster.sessionTimeoutMs),
        firstEpoch: incarnation * 1000,
        retryBackoff: 50,
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
    log(w, `${p.name}.${incarnation} starts`)
  })

/** The controller coordinator `p` runs while it leads, recorded as `p.controller` while it lasts. */
const controllerService = (w: World, p: Proc, view: ControllerView.ControllerView, resign: Effect.Effect<void>) =>
  Coordinator.service("controller", (leadership) =>
    Effect.acquireRelease(
      Controller.make(leadership, {
        namespace: NAMESPACE,
        uncleanLeaderElection: false,
        minInsyncReplicas: w.cluster.minIsr,
        leaderElection: w.cluster.leaderElection,
        retryBackoff: 50,
        resign,
        view,
        // Leaders go back to preferred replicas often, so that the faults meet it.
        leaderImbalanceCheckInterval: 1_000,
        leaderImbalancePercent: 0
      }).pipe(
        Effect.provideService(Controller.Machine, w.variant.controller ?? ControllerState.step),
        Effect.provideService(Controller.TabletServers, w.wiring.servers(p)),
        Effect.tap((c) =>
          Effect.sync(() => {
            p.controller = c
            Checkers.coordinatorEpoch(w.record, c.coordinatorEpoch)
            log(w, `${p.name} controls with coordinator epoch ${c.coordinatorEpoch}`)
          })
        )
      ),
      (c) =>
        Effect.sync(() => {
          if (p.controller === c) p.controller = undefined
        })
    )
  )

/** Starts coordinator `p`: its own election, its warm controller view and a `Coordinator` running the controller. */
const startCoordinator = (w: World, p: Proc) =>
  Effect.gen(function* () {
    const scope = yield* Scope.fork(w.root, "sequential")
    p.scope = scope
    p.crashed = false
    p.incarnation++
    const coordination = coordinationOf(w, p)
    const resign: { run: Effect.Effect<void> } = { run: Effect.void }
    const program = Effect.gen(function* () {
      const election = yield* CoordinationElection.make({
        namespace: "sim",
        sessionTimeout: Duration.millis(w.cluster.sessionTimeoutMs),
        replicaLagTimeMax: Duration.millis(w.cluster.replicaLagTimeMaxMs)
      })
      // The coordinator's warm view: standing by, it follows the journal; a controller of its starts from it.
      const view = yield* ControllerView.make({ namespace: NAMESPACE, keepWarm: { retryBackoff: 50 } })
      const coordinator = yield* Coordinator.make({
        serverId: p.id,
        address: p.name,
        rejoinBackoff: Duration.millis(200),
        services: [
          controllerService(
            w,
            p,
            view,
            Effect.suspend(() => resign.run)
          ),
          ...(w.cluster.rebalanceSettings === undefined ? [] : [Rebalances.service(w, p, w.cluster.rebalanceSettings)])
        ]
      }).pipe(Effect.provideService(Election.Election, election))
      resign.run = coordinator.resign
    })
    yield* program.pipe(
      Effect.provideService(Coordination.Coordination, coordination),
      Effect.provideService(Clock.Clock, clockOf(w, p)),
      Effect.provideService(Logger.CurrentLoggers, new Set([traceLogger(w, p)])),
      Scope.provide(scope),
      Effect.orDie
    )
    log(w, `${p.name}.${p.incarnation} starts`)
  })

/** Starts a process in a fiber of its own: the driver never waits on the clock it drives. */
export const start = (w: World, p: Proc) =>
  Effect.asVoid(Effect.forkIn(p.kind === "server" ? startServer(w, p) : startCoordinator(w, p), w.root))

/** Stops a process: a crash leaves its sessions to expire, a stop closes them; `lose` undoes its unflushed writes. */
export const down = (w: World, p: Proc, crash: boolean, lose: boolean) =>
  Effect.gen(function* () {
    const scope = p.scope
    if (scope === undefined) return
    // What its logs hold as it goes (the memory store keeps them for its next start).
    yield* Audit.sampleLogEnds(w, p)
    p.crashed = crash
    p.scope = undefined
    p.server = undefined
    p.registration = undefined
    p.serverInbox = undefined
    p.controller = undefined
    const store = w.stores.get(p.id)
    const closed = Effect.gen(function* () {
      yield* Scope.close(scope, Exit.void)
      if (!lose || store === undefined) return
      const undone = yield* store.loseUnflushed
      w.lostWrites += undone
      log(w, `${p.name} lost ${undone} unflushed writes`)
    })
    const fiber = yield* Effect.forkIn(closed, w.root)
    if (p.kind === "server") w.closing.set(p.id, fiber)
  })

/** Pauses a process: its coordination waits and its sessions' connections are cut. */
export const pause = (w: World, p: Proc) =>
  Effect.gen(function* () {
    p.paused = true
    yield* p.gate.close
    yield* Effect.forEach([...p.sessions], (s) => Effect.ignore(w.faults.disconnect!(s)), { discard: true })
  })

/** Resumes a paused process: its coordination goes on and its sessions reconnect. */
export const resume = (w: World, p: Proc) =>
  Effect.gen(function* () {
    p.paused = false
    yield* p.gate.open
    yield* Effect.forEach([...p.sessions], (s) => Effect.ignore(w.faults.reconnect!(s)), { discard: true })
  })
