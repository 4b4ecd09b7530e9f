/**
 * A watch whose session ends while the watch's own read is under way must end too (the session's end has passed,
 * and nothing would tell it later).
 *
 * An etcd watch the server cancels: the watcher's stream drops, it reconnects from its last revision, and etcd
 * refuses that revision because it was compacted meanwhile (a long-waiting standby after a compaction). The watch
 * must fail with a retryable lost connection, so its reader reads again; it must not throw from the client's
 * emitter or wait forever.
 */
import { Coordination } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Option, Scope } from "effect"
import { Etcd3 } from "etcd3"
import { inject } from "vitest"
import { startProxy } from "../../../scripts/test-support/tcpProxy.js"
import * as EtcdCoordination from "../src/EtcdCoordination.js"

/** A proxy to the test's etcd, closed with the scope. */
const etcdProxy = Effect.acquireRelease(
  Effect.promise(() => startProxy(inject("etcd"))),
  (p) => Effect.promise(() => p.close())
)

describe("EtcdCoordination watches", () => {
  it.live(
    "a watch etcd cancels after a compaction fails with a retryable lost connection",
    () =>
      Effect.gen(function* () {
        const proxy = yield* etcdProxy
        const direct = yield* Effect.acquireRelease(
          Effect.sync(() => new Etcd3({ hosts: [`http://${inject("etcd")}`] })),
          (c) => Effect.sync(() => c.close())
        )
        const root = `/strata-watch-test/${Date.now().toString(36)}`
        const outcome = yield* Effect.gen(function* () {
          const coordination = yield* Coordination.Coordination
          const s = yield* coordination.session({ timeout: "10 seconds" })
          yield* s.create("/watched", new Uint8Array(0))
          const watch = yield* s.watchNode("/watched")
          assert.isTrue(Option.isSome(watch.value))
          // Move the store on and compact it past the watch's start, then cut the watcher's stream.
          for (let i = 0; i < 5; i++) yield* Effect.promise(() => direct.put(`${root}-other`).value(String(i)))
          const latest = yield* Effect.promise(() => direct.get(`${root}-other`).exec())
          yield* Effect.promise(() => direct.kv.compact({ revision: latest.header.revision, physical: true }))
          proxy.dropAll()
          return yield* Effect.exit(watch.changed).pipe(Effect.timeout("20 seconds"))
        }).pipe(Effect.provide(EtcdCoordination.layer({ endpoints: [`http://${proxy.address}`], root })), Effect.scoped)
        assert.isTrue(Exit.isFailure(outcome), "the watch reported its end")
        if (Exit.isFailure(outcome)) {
          const error = outcome.cause.reasons.find((r) => r._tag === "Fail")
          assert.isDefined(error)
          if (error?._tag === "Fail") {
            assert.strictEqual(error.error.reason._tag, "ConnectionLoss", error.error.message)
            assert.isTrue(error.error.retryable)
            assert.include(error.error.message, "watch")
          }
        }
      }).pipe(Effect.scoped),
    60_000
  )

  it.live(
    "a watch whose session closes while its read is under way ends with the session",
    () =>
      Effect.gen(function* () {
        const proxy = yield* etcdProxy
        const root = `/strata-watch-test/${Date.now().toString(36)}-closed`
        const outcome = yield* Effect.gen(function* () {
          const coordination = yield* Coordination.Coordination
          const sessionScope = yield* Scope.make()
          const s = yield* coordination.session({ timeout: "10 seconds" }).pipe(Scope.provide(sessionScope))
          yield* s.create("/watched", new Uint8Array(0))
          // The watch's read cannot be answered while the proxy holds every byte.
          proxy.stall()
          const watching = yield* Effect.forkChild(Effect.flatMap(s.watchNode("/watched"), (watch) => watch.changed))
          yield* Effect.yieldNow
          assert.isUndefined(watching.pollUnsafe(), "the watch is still reading")
          // The session ends (its end says so at once; its lease's revoke waits for the proxy), then the read is
          // answered.
          const closing = yield* Effect.forkChild(Scope.close(sessionScope, Exit.void))
          yield* Effect.yieldNow
          proxy.resume()
          yield* Fiber.join(closing)
          return yield* Fiber.await(watching).pipe(Effect.timeout("20 seconds"))
        }).pipe(Effect.provide(EtcdCoordination.layer({ endpoints: [`http://${proxy.address}`], root })), Effect.scoped)
        assert.isTrue(Exit.isFailure(outcome), "the watch ended")
        if (Exit.isFailure(outcome)) {
          const error = outcome.cause.reasons.find((r) => r._tag === "Fail")
          assert.isDefined(error, "with a failure")
          if (error?._tag === "Fail") assert.strictEqual(error.error.reason._tag, "SessionClosed", error.error.message)
        }
      }).pipe(Effect.scoped),
    60_000
  )
})
