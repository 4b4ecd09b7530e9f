import { Coordination, MemoryCoordination } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { CoordinationElection } from "@strata/election"
import { Effect, Exit, Scope } from "effect"
import * as ClusterDirectory from "../src/client/ClusterDirectory.js"
import * as ClusterPaths from "../src/wire/ClusterPaths.js"
import { eventually } from "./support/servers.js"

describe("ClusterDirectory", () => {
  it.live("finds servers by their registrations and the controller by the election, as they change", () =>
    Effect.gen(function* () {
      const coordination = yield* Coordination.Coordination
      const paths = ClusterPaths.make("/dir")
      const election = yield* CoordinationElection.make({
        namespace: "dir",
        sessionTimeout: "2 seconds",
        replicaLagTimeMax: "6 seconds"
      })
      const directory = yield* ClusterDirectory.make(paths, election, { retryBackoff: 10 })
      const missing = yield* Effect.flip(directory.locate(1))
      assert.include(missing.message, "server 1 unreachable: not registered")
      const nobody = yield* Effect.flip(directory.controller)
      assert.include(nobody.message, "no coordinator leads")

      const first = yield* Scope.make()
      const session = yield* Scope.provide(coordination.session(), first)
      yield* ClusterPaths.register(session, paths, 1, { address: "127.0.0.1:7001", registrationEpoch: 1 })
      yield* eventually(Effect.map(Effect.option(directory.locate(1)), (a) => a._tag === "Some"))
      assert.strictEqual(yield* directory.locate(1), "127.0.0.1:7001")
      yield* election.campaign({ serverId: 101, address: "127.0.0.1:7101" })
      yield* eventually(Effect.map(Effect.option(directory.controller), (a) => a._tag === "Some"))
      assert.strictEqual(yield* directory.controller, "127.0.0.1:7101")

      // The server's session ends: it is not found any more; registered again elsewhere, it is found there.
      yield* Scope.close(first, Exit.void)
      yield* eventually(Effect.map(Effect.option(directory.locate(1)), (a) => a._tag === "None"))
      const again = yield* coordination.session()
      yield* ClusterPaths.register(again, paths, 1, { address: "127.0.0.1:7002", registrationEpoch: 2 })
      yield* eventually(
        Effect.map(Effect.option(directory.locate(1)), (a) => a._tag === "Some" && a.value === "127.0.0.1:7002")
      )
      assert.strictEqual(yield* directory.locate(1), "127.0.0.1:7002")
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )

  it.live("a directory whose session ends opens another and goes on finding servers", () =>
    Effect.gen(function* () {
      const coordination = yield* Coordination.Coordination
      const faults = yield* Coordination.Faults
      const paths = ClusterPaths.make("/dir")
      const election = yield* CoordinationElection.make({
        namespace: "dir",
        sessionTimeout: "2 seconds",
        replicaLagTimeMax: "6 seconds"
      })
      // The directory's own sessions, to end them.
      const opened: Array<Coordination.Session> = []
      const directory = yield* ClusterDirectory.make(paths, election, { retryBackoff: 10 }).pipe(
        Effect.provideService(Coordination.Coordination, {
          ...coordination,
          session: (options) => Effect.tap(coordination.session(options), (s) => Effect.sync(() => opened.push(s)))
        })
      )
      const servers = yield* coordination.session()
      yield* ClusterPaths.register(servers, paths, 1, { address: "127.0.0.1:7001", registrationEpoch: 1 })
      yield* eventually(Effect.map(Effect.option(directory.locate(1)), (a) => a._tag === "Some"))

      // Its session expires (a process paused past its timeout); a server registers after that.
      assert.strictEqual(opened.length, 1)
      yield* faults.expire(opened[0]!)
      yield* ClusterPaths.register(servers, paths, 2, { address: "127.0.0.1:7002", registrationEpoch: 1 })
      yield* eventually(Effect.map(Effect.option(directory.locate(2)), (a) => a._tag === "Some"))
      assert.strictEqual(yield* directory.locate(2), "127.0.0.1:7002")
      assert.strictEqual(yield* directory.locate(1), "127.0.0.1:7001")
      assert.isAbove(opened.length, 1, "a new session")
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )
})
