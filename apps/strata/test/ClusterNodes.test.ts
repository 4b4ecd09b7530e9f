/**
 * The cluster's processes as `strata tablet-server` and `strata coordinator` compose them, in one process on memory
 * coordination: a tablet server started with the id of a running one never acts for it, a server whose controller is
 * gone says so as it stops, and the controller refuses table names that are not `[A-Za-z0-9._-]+`.
 */
import { Coordination, MemoryCoordination, type Models } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { CoordinationElection } from "@strata/election"
import { ClusterPaths, Controller, LocalCluster, ServerStorage, TabletClient, TabletServerNode } from "@strata/replica"
import { Array as Arr, Duration, Effect, Exit, Fiber, Layer, Logger, Schedule, Scope } from "effect"

const replication = { sessionTimeout: 1_000, replicaLagTimeMax: 3_000, retryBackoff: 20 }

/** Every log line, as text, into `lines`. */
const capture = (lines: Array<string>) =>
  Logger.layer([Logger.make((o) => lines.push(Arr.ensure(o.message).map(String).join(" ")))])

/** Waits until `check` holds (every 5 ms). */
const eventually = (check: () => boolean) =>
  Effect.suspend(() => (check() ? Effect.void : Effect.fail("not yet" as const))).pipe(
    Effect.retry({ schedule: Schedule.spaced(Duration.millis(5)) })
  )

/** Tablet servers that are never reached. */
const nobody: Controller.TabletServersShape = {
  leaderAndIsr: () => Effect.void,
  logEnd: () => Effect.succeed({ lastEpoch: null, logEndOffset: 0 }),
  holdings: () => Effect.succeed({ tablets: [] }),
  stopReplica: () => Effect.void
}

/** A controller under a leadership of its own, on the memory coordination in context. */
const controllerOn = (namespace: string) =>
  Effect.gen(function* () {
    const election = yield* CoordinationElection.make({
      namespace: namespace.slice(1),
      sessionTimeout: "2 seconds",
      replicaLagTimeMax: "6 seconds"
    })
    const leadership = yield* election.campaign({ serverId: 101, address: "a" })
    return yield* Controller.make(leadership, {
      namespace,
      uncleanLeaderElection: false,
      minInsyncReplicas: 1,
      retryBackoff: 10,
      resign: Effect.void
    }).pipe(Effect.provideService(Controller.TabletServers, nobody))
  })

describe("a tablet server started with the id of a running one", () => {
  it.live(
    "never acts for it: stopped while it waits, it runs no controlled shutdown; left waiting, it fails with DuplicateServerId naming the holder; the running server keeps its leaderships and ISRs",
    () => {
      const lines: Array<string> = []
      return Effect.gen(function* () {
        const cluster = yield* LocalCluster.LocalClusterService
        const coordination = yield* Coordination.Coordination
        const created = yield* cluster.createTable("dup", { buckets: 3, replicationFactor: 3 })
        const tablets = created.map((t) => t.tablet)
        for (const t of tablets) {
          yield* cluster.awaitTablet(t, (x) => x.leaderAndIsr.leader !== null && x.leaderAndIsr.isr.length === 3)
        }
        const leadersAndIsrs = Effect.map(
          Effect.forEach(tablets, (t) => cluster.tablet(t)),
          (all) => all.map((t) => [t.leaderAndIsr.leader, t.leaderAndIsr.leaderEpoch, [...t.leaderAndIsr.isr]])
        )
        const before = yield* leadersAndIsrs
        assert.isTrue(
          before.some(([leader]) => leader === 1),
          "server 1 leads a tablet"
        )
        const auditor = yield* coordination.session()
        const holder = JSON.parse(
          new TextDecoder().decode((yield* auditor.get(ClusterPaths.make("/strata").server(1))).data)
        ).address as string

        const store = yield* Layer.build(ServerStorage.layerMemory)
        const duplicate = TabletServerNode.make({ serverId: 1, replication }).pipe(Effect.provide(store))
        const shutdownLines = () => lines.filter((l) => /tablet server 1: (controlled shutdown|stopping)/.test(l))
        lines.length = 0

        // Stopped (SIGTERM) while it waits for the id: nothing is done for server 1.
        const stopped = yield* Scope.make()
        const waiting = yield* Effect.forkChild(Scope.provide(duplicate, stopped))
        yield* eventually(() => lines.some((l) => l.includes("is registered by another session")))
        yield* Fiber.interrupt(waiting)
        yield* Scope.close(stopped, Exit.void)
        assert.deepStrictEqual(shutdownLines(), [])
        assert.deepStrictEqual(yield* leadersAndIsrs, before)

        // Left waiting, it gives up with DuplicateServerId naming the id and where the other server is.
        lines.length = 0
        const exit = yield* Effect.exit(Effect.scoped(duplicate))
        assert.isTrue(Exit.isFailure(exit), "the duplicate started")
        if (Exit.isFailure(exit)) {
          const error = exit.cause.reasons.find((r) => r._tag === "Fail")?.error as { _tag: string; message: string }
          assert.strictEqual(error?._tag, "DuplicateServerId", String(exit.cause))
          assert.include(error.message, "server id 1")
          assert.include(error.message, holder)
        }
        assert.deepStrictEqual(shutdownLines(), [])
        assert.deepStrictEqual(yield* leadersAndIsrs, before)
      }).pipe(
        Effect.scoped,
        Effect.provide(
          LocalCluster.layer({ servers: 3, transport: "tcp", replication }).pipe(
            Layer.provideMerge(MemoryCoordination.layer())
          )
        ),
        Effect.provide(capture(lines))
      )
    },
    60_000
  )
})

describe("a tablet server stopping", () => {
  it.live("after its controller is gone, says its controlled shutdown could not reach the controller", () => {
    const lines: Array<string> = []
    return Effect.gen(function* () {
      const store = yield* Layer.build(ServerStorage.layerMemory)
      const scope = yield* Scope.make()
      yield* TabletServerNode.make({ serverId: 5, namespace: "/alone", replication }).pipe(
        Effect.provide(store),
        Scope.provide(scope)
      )
      yield* Scope.close(scope, Exit.void)
      const line = lines.find((l) => l.includes("tablet server 5: controlled shutdown"))
      assert.isDefined(line, lines.join("\n"))
      assert.include(line, "could not reach the controller")
      assert.notInclude(lines.join("\n"), "-1")
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()), Effect.provide(capture(lines)))
  })
})

describe("table names", () => {
  const bad = ["..", ".", "a/b", "", "x".repeat(250), "with space", "ünï"]

  it.live("the controller refuses a name that is not [A-Za-z0-9._-]+ (or is . or ..), naming it and the rule", () =>
    Effect.gen(function* () {
      const controller = yield* controllerOn("/names")
      for (const table of bad) {
        const reply = yield* controller.createTablets([{ tablet: { table, bucket: 0 }, replicas: [1] }])
        assert.strictEqual(reply._tag, "CreateRefused", `${JSON.stringify(table)}: ${JSON.stringify(reply)}`)
        if (reply._tag === "CreateRefused") {
          assert.include(reply.detail, JSON.stringify(table))
          assert.include(reply.detail, "[A-Za-z0-9._-]")
        }
      }
      assert.strictEqual((yield* controller.state).tablets.size, 0)
      const good = yield* controller.createTablets([{ tablet: { table: "Orders_v2.eu-1", bucket: 0 }, replicas: [1] }])
      assert.strictEqual(good._tag, "Created")
      const longest = yield* controller.createTablets([
        { tablet: { table: "y".repeat(249), bucket: 0 }, replicas: [1] }
      ])
      assert.strictEqual(longest._tag, "Created")
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )

  it.live("a client refuses such a name before it sends anything, naming it and the rule", () =>
    Effect.gen(function* () {
      // No coordinator runs: a name sent would wait for one until the delivery timeout.
      const client = yield* TabletClient.make({ namespace: "/nobody", deliveryTimeout: 60_000, replication })
      for (const table of ["..", "a/b"]) {
        const error = yield* Effect.flip(client.createTable(table, { buckets: 1 }))
        assert.strictEqual(error.reason._tag, "CreateTableRefused", error.message)
        assert.include(error.message, JSON.stringify(table))
        assert.include(error.message, "[A-Za-z0-9._-]")
      }
    }).pipe(
      Effect.scoped,
      Effect.provide(MemoryCoordination.layer()),
      // A bound on the test only: the refusal is at once.
      Effect.timeoutOrElse({ duration: "20 seconds", orElse: () => Effect.fail(new Error("the name was sent")) })
    )
  )
})

describe("the controller", () => {
  it.live("logs why it refused an ISR change with IneligibleReplica", () =>
    Effect.gen(function* () {
      const lines: Array<string> = []
      const coordination = yield* Coordination.Coordination
      const paths = ClusterPaths.make("/refusal")
      // Server 1 lives; server 2 never registered.
      const server1 = yield* coordination.session()
      yield* ClusterPaths.register(server1, paths, 1, { address: "127.0.0.1:7001", registrationEpoch: 0 })
      const controller = yield* controllerOn("/refusal")
      const tablet = { table: "t", bucket: 0 }
      const created = yield* controller.createTablets([{ tablet, replicas: [1, 2] as ReadonlyArray<Models.ServerId> }])
      if (created._tag !== "Created") return assert.fail(JSON.stringify(created))
      const t = created.tablets[0]!
      assert.strictEqual(t.leaderAndIsr.leader, 1)
      const reply = yield* controller
        .adjustIsr({
          tablet,
          leader: 1,
          leaderEpoch: t.leaderAndIsr.leaderEpoch,
          version: t.leaderAndIsr.version,
          isr: [1, 2]
        })
        .pipe(Effect.provide(capture(lines)))
      assert.deepStrictEqual(reply, {
        _tag: "IsrRejected",
        rejection: { _tag: "IneligibleReplica", server: 2, why: "offline" }
      })
      const line = lines.find((l) => l.includes("refused"))
      assert.isDefined(line, lines.join("\n"))
      assert.include(line, "IneligibleReplica")
      assert.include(line, "server 2 is ineligible: offline")
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )
})
