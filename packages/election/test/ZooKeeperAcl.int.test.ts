import { assert, describe, it } from "@effect/vitest"
import { Coordination } from "@strata/core"
import { CoordinationConformance } from "@strata/core/testing"
import { Effect, Layer, Redacted } from "effect"
import { inject } from "vitest"
import * as CoordinationElection from "../src/CoordinationElection.js"
import * as Coordinator from "../src/Coordinator.js"
import * as ZooKeeperCoordination from "../src/ZooKeeperCoordination.js"
import { tree } from "../../../scripts/test-support/coordinationTree.js"

// Digest credentials and ACLs: every node Strata creates is writable by its own identity only.
const connectString = inject("zookeeper")
const auth = { username: "strata", password: "acl-secret" }

// Every operation of the protocol works under ACLs that let only the session's own identity in, reads included.
CoordinationConformance.suite(
  "zookeeper with digest auth, nodes readable and writable by that identity only",
  ZooKeeperCoordination.layer({ connectString, root: "/strata-acl-conformance", auth, worldReadable: false })
)

const reasonOf = <A>(effect: Effect.Effect<A, Coordination.CoordinationError>) =>
  Effect.map(Effect.flip(effect), (e) => e.reason._tag)

describe("ZooKeeperCoordination with digest auth", () => {
  it.live(
    "another session (no credentials, or other ones) can read the election's nodes but not change or delete them",
    () =>
      Effect.gen(function* () {
        const root = `/strata-acl-${Date.now()}`
        const owner = CoordinationElection.layer({ namespace: "acl" }).pipe(
          Layer.provideMerge(
            ZooKeeperCoordination.layer({
              connectString,
              root,
              auth: { ...auth, password: Redacted.make(auth.password) }
            })
          )
        )
        yield* Effect.gen(function* () {
          const coordinator = yield* Coordinator.make({ serverId: 1, address: "10.0.0.1:9123" })
          const leadership = yield* coordinator.awaitLeader
          yield* leadership.fenced([Coordination.op.create("/assignments", new TextEncoder().encode("tablet-0"))])

          for (const intruder of [
            ZooKeeperCoordination.layer({ connectString, root }),
            ZooKeeperCoordination.layer({ connectString, root, auth: { username: "strata", password: "guessed" } }),
            ZooKeeperCoordination.layer({ connectString, root, auth: { username: "mallory", password: "acl-secret" } })
          ]) {
            yield* Effect.gen(function* () {
              const session = yield* (yield* Coordination.Coordination).session()
              const nodes = yield* tree((p) => session.children(p), "/")
              assert.isAtLeast(nodes.length, 4, `the election's nodes: ${nodes.join(", ")}`)
              for (const path of nodes.filter((p) => p !== "/")) {
                assert.strictEqual(yield* reasonOf(session.delete(path)), "NotAuthorized", `delete ${path}`)
                assert.strictEqual(
                  yield* reasonOf(session.set(path, new Uint8Array([1]))),
                  "NotAuthorized",
                  `set ${path}`
                )
                yield* session.get(path) // readable by anyone (worldReadable defaults to true)
              }
              const write = yield* reasonOf(session.multi([Coordination.op.create("/acl/intruder", new Uint8Array(0))]))
              assert.strictEqual(write, "NotAuthorized")
            }).pipe(Effect.scoped, Effect.provide(intruder))
          }
          // Still the leader at the same epoch: nothing of the election was touched.
          const again = yield* coordinator.awaitLeader
          assert.strictEqual(again.epoch, leadership.epoch)
        }).pipe(Effect.scoped, Effect.provide(owner))
      })
  )

  it.live(
    "with worldReadable false another identity cannot read either; a bad option names it without its password",
    () =>
      Effect.gen(function* () {
        const root = `/strata-acl-private-${Date.now()}`
        yield* Effect.gen(function* () {
          const session = yield* (yield* Coordination.Coordination).session()
          yield* session.create("/secret", new TextEncoder().encode("x"))
        }).pipe(
          Effect.scoped,
          Effect.provide(ZooKeeperCoordination.layer({ connectString, root, auth, worldReadable: false }))
        )
        const read = yield* Effect.gen(function* () {
          const session = yield* (yield* Coordination.Coordination).session()
          return yield* reasonOf(session.get("/secret"))
        }).pipe(Effect.scoped, Effect.provide(ZooKeeperCoordination.layer({ connectString, root })))
        assert.strictEqual(read, "NotAuthorized")

        const bad = yield* Effect.flip(
          Effect.scoped(
            ZooKeeperCoordination.make({ connectString, auth: { username: "a:b", password: "p4ssw0rd-x" } })
          )
        )
        assert.strictEqual(bad.reason._tag, "InvalidCoordinationOptions")
        assert.include(bad.message, "auth.username")
        assert.notInclude(bad.message, "p4ssw0rd-x")
      })
  )
})
