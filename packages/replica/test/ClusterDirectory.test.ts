import { assert, describe, it } from "@effect/vitest"
import { CoordinationElection } from "@strata/election"
import { Coordination } from "@strata/core"
import { Effect, Exit, Scope } from "effect"
import * as ClusterDirectory from "../src/ClusterDirectory.js"
import * as ClusterPaths from "../src/ClusterPaths.js"
import { eventually } from "./support/servers.js"

describe("ClusterDirectory", () => {
  it.live("finds servers by their registrations and the controller by the election, as they change", () =>
    Effect.gen(function* () {
      const coordination = yield* Coordination
      const paths = ClusterPaths.make("/dir")
      const election = yield* CoordinationElection.make({
        namespace: "dir",
        sessionTimeout: "2 seconds",
        replicaLagTimeMax: "6 seconds"
      })
      const directory = yield* ClusterDirectory.make(paths, election, { retryBackoffMs: 10 })
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
    }).pipe(Effect.scoped, Effect.provide(Coordination.layerMemory()))
  )
})
