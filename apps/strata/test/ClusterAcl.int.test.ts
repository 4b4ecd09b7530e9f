/**
 * A cluster whose processes authenticate to ZooKeeper (`coordinationUsername`, `$STRATA_COORDINATION_PASSWORD`):
 * its nodes are writable by that identity only, so a session without the credentials cannot delete or change them,
 * a tablet server without them cannot register and a coordinator without them stops; the password appears in no
 * process's log or command output.
 */
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Coordination } from "@strata/core"
import * as ZooKeeperCoordination from "@strata/election/zookeeper"
import { Effect } from "effect"
import { inject } from "vitest"
import { cli as runCli, clusterEnv } from "./support/cliRun.js"
import { cliProcesses, zooKeeperCluster } from "./support/clusterTest.js"
import { tree } from "../../../scripts/test-support/coordinationTree.js"

const processes = cliProcesses()
const PASSWORD = "zk-digest-pass-7f3a"
const credentials = { coordinationUsername: "strata-cluster", coordinationPassword: PASSWORD }

describe("a cluster on ZooKeeper with digest credentials", () => {
  it.live(
    "its nodes refuse a session without the credentials, a tablet server without them cannot register, a coordinator without them stops, and no output holds the password",
    () =>
      Effect.gen(function* () {
        const { cluster, namespace, directory } = yield* zooKeeperCluster(processes, "acl", credentials)
        yield* Effect.addFinalizer((exit) =>
          exit._tag === "Failure" ? Effect.logError(cluster.logTails(30)) : Effect.void
        )
        yield* cluster.start("coordinator", 101)
        yield* Effect.forEach([1, 2], (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
        const env = {
          ...clusterEnv(namespace),
          STRATA_COORDINATION_USERNAME: credentials.coordinationUsername,
          STRATA_COORDINATION_PASSWORD: PASSWORD
        }
        const run = (args: ReadonlyArray<string>, e: Record<string, string>) =>
          Effect.promise(() => runCli(processes.runner(), args, e).exited)
        const created = yield* run(["tablets", "create", "orders", "--tablets", "2", "--rf", "2"], env)
        assert.strictEqual(created.code, 0, created.stderr)
        const status = yield* run(["cluster", "status"], env)
        assert.strictEqual(status.code, 0, status.stderr)

        // A session without the credentials reads the cluster's nodes but cannot delete or change any.
        const nodes = yield* Effect.gen(function* () {
          const session = yield* (yield* Coordination.Coordination).session()
          const all = yield* tree((p) => session.children(p), namespace)
          for (const path of all) {
            // Deleting a node is its parent's ACL's to allow: the namespace's own node sits under ZooKeeper's open
            // root, so only its having children keeps it (NotEmpty).
            const deleted = yield* Effect.flip(session.delete(path))
            assert.strictEqual(deleted.reason._tag, path === namespace ? "NotEmpty" : "NotAuthorized", `delete ${path}`)
            const set = yield* Effect.flip(session.set(path, new Uint8Array([1])))
            assert.strictEqual(set.reason._tag, "NotAuthorized", `set ${path}`)
          }
          return all
        }).pipe(Effect.scoped, Effect.provide(ZooKeeperCoordination.layer({ connectString: inject("zookeeper") })))
        assert.isAtLeast(nodes.length, 8, nodes.join(", "))

        // A tablet server without them cannot register: one line, a non-zero exit.
        const { STRATA_COORDINATION_USERNAME: _u, STRATA_COORDINATION_PASSWORD: _p, ...bare } = env
        const intruder = yield* run(["tablet-server", "--id", "9", "--data", join(directory, "intruder")], bare)
        assert.notStrictEqual(intruder.code, 0)
        assert.match(intruder.stderr, /not authorized/i)
        // Nor a coordinator: it stops by itself, with one line, rather than campaign in vain.
        const rogue = yield* run(["coordinator", "--id", "109"], bare)
        assert.notStrictEqual(rogue.code, 0)
        assert.match(rogue.stderr, /not authorized .*coordinationUsername/i)
        assert.lengthOf(rogue.stderr.trim().split("\n"), 1)

        // The cluster is intact, and the password is nowhere in what its processes and commands printed.
        const described = yield* run(["tablets", "describe", "orders"], env)
        assert.strictEqual(described.code, 0, described.stderr)
        assert.match(described.stdout, /orders:1/)
        const printed = [
          cluster.log("coordinator", 101),
          cluster.log("tablet-server", 1),
          cluster.log("tablet-server", 2),
          ...[created, status, intruder, rogue, described].map((r) => r.stdout + r.stderr)
        ].join("\n")
        assert.notInclude(printed, PASSWORD)
      }).pipe(Effect.scoped)
  )
})
