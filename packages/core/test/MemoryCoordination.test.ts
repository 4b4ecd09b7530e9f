import { Coordination, MemoryCoordination } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { CoordinationConformance } from "@strata/core/testing"
import { Deferred, Duration, Effect, Exit, Fiber, Option, Result, Scope, Stream } from "effect"
import { TestClock } from "effect/testing"

CoordinationConformance.suite("memory", MemoryCoordination.layer())
CoordinationConformance.suspensionSuite("memory", MemoryCoordination.layer())

const empty = new Uint8Array(0)
const bytes = (s: string) => new TextEncoder().encode(s)

const reasonOf = <A>(self: Effect.Effect<A, Coordination.CoordinationError>) =>
  Effect.map(Effect.result(self), (r) => (Result.isFailure(r) ? r.failure.reason._tag : "success"))

const memory = Effect.provide(MemoryCoordination.layer())

/** Whether an effect is still pending after the scheduler has run everything ready. */
const isPending = <A, E>(self: Effect.Effect<A, E>) =>
  Effect.gen(function* () {
    const fiber = yield* Effect.forkChild(self)
    for (let i = 0; i < 5; i++) yield* Effect.yieldNow
    const pending = fiber.pollUnsafe() === undefined
    yield* Fiber.interrupt(fiber)
    return pending
  })

/** Collects a session's states until a final one, signalling once subscribed. */
const collectStates = (changes: Stream.Stream<Coordination.SessionState>) =>
  Effect.gen(function* () {
    const subscribed = yield* Deferred.make<void>()
    const fiber = yield* changes.pipe(
      Stream.tap(() => Deferred.succeed(subscribed, undefined)),
      Stream.runCollect,
      Effect.forkChild
    )
    yield* Deferred.await(subscribed)
    return fiber
  })

describe("MemoryCoordination on the TestClock", () => {
  it.effect("sessions take their timeout from the options, 10 seconds by default", () =>
    Effect.gen(function* () {
      const coordination = yield* Coordination.Coordination
      assert.strictEqual(coordination.backend, "memory")
      const s = yield* coordination.session()
      assert.strictEqual(Duration.toMillis(s.timeout), 10_000)
      const t = yield* coordination.session({ timeout: "4 seconds" })
      assert.strictEqual(Duration.toMillis(t.timeout), 4_000)
      assert.notStrictEqual(s.id, t.id)
    }).pipe(memory)
  )

  it.effect("the default session timeout can be configured", () =>
    Effect.gen(function* () {
      const s = yield* (yield* Coordination.Coordination).session()
      assert.strictEqual(Duration.toMillis(s.timeout), 3_000)
    }).pipe(Effect.provide(MemoryCoordination.layer({ defaultSessionTimeout: "3 seconds" })))
  )

  it.effect("a connected session never expires, however long time passes", () =>
    Effect.gen(function* () {
      const s = yield* (yield* Coordination.Coordination).session({ timeout: "1 second" })
      yield* s.create("/e", empty, { mode: "ephemeral" })
      yield* TestClock.adjust("1 hour")
      assert.strictEqual(yield* s.state, "connected")
      assert.isTrue(Option.isSome(yield* s.exists("/e")))
    }).pipe(memory)
  )

  it.effect("disconnect then reconnect before the timeout keeps the ephemeral nodes", () =>
    Effect.gen(function* () {
      const coordination = yield* Coordination.Coordination
      const faults = yield* Coordination.Faults
      const s = yield* coordination.session({ timeout: "10 seconds" })
      const other = yield* coordination.session()
      yield* s.create("/e", bytes("mine"), { mode: "ephemeral" })
      const watch = yield* other.watchNode("/e")

      yield* faults.disconnect!(s)
      assert.strictEqual(yield* s.state, "suspended")
      assert.strictEqual(yield* reasonOf(s.get("/e")), "ConnectionLoss")
      assert.strictEqual(yield* reasonOf(s.create("/x", empty)), "ConnectionLoss")
      yield* TestClock.adjust("9999 millis")
      assert.strictEqual(yield* s.state, "suspended")
      assert.isTrue(Option.isSome(yield* other.exists("/e")), "the server keeps the ephemeral node")

      yield* faults.reconnect!(s)
      assert.strictEqual(yield* s.state, "connected")
      yield* TestClock.adjust("1 minute")
      assert.strictEqual(yield* s.state, "connected", "the countdown stopped")
      const n = yield* s.get("/e")
      assert.strictEqual(n.stat.ephemeralOwner, s.id)
      assert.isTrue(yield* isPending(watch.changed), "the other session's watch did not fire")
    }).pipe(memory)
  )

  it.effect("disconnect and advance past the timeout expires the session and deletes its ephemeral nodes", () =>
    Effect.gen(function* () {
      const coordination = yield* Coordination.Coordination
      const faults = yield* Coordination.Faults
      const s = yield* coordination.session({ timeout: "10 seconds" })
      const other = yield* coordination.session()
      yield* s.create("/e", empty, { mode: "ephemeral" })
      yield* s.create("/kept", empty)
      const othersWatch = yield* other.watchNode("/e")
      const ownWatch = yield* s.watchNode("/kept")

      yield* faults.disconnect!(s)
      yield* TestClock.adjust("10 seconds")
      assert.strictEqual(yield* s.state, "expired")
      assert.isTrue(Option.isNone(yield* other.exists("/e")))
      assert.isTrue(Option.isSome(yield* other.exists("/kept")))
      assert.deepStrictEqual(yield* othersWatch.changed, { _tag: "NodeDeleted", path: "/e" })
      assert.strictEqual(yield* reasonOf(ownWatch.changed), "SessionExpired")
      assert.strictEqual(yield* reasonOf(s.get("/kept")), "SessionExpired")

      // reconnecting too late finds the session expired
      yield* faults.reconnect!(s)
      assert.strictEqual(yield* s.state, "expired")
      assert.strictEqual(yield* reasonOf(s.exists("/kept")), "SessionExpired")
    }).pipe(memory)
  )

  it.effect("every disconnect restarts the countdown", () =>
    Effect.gen(function* () {
      const faults = yield* Coordination.Faults
      const s = yield* (yield* Coordination.Coordination).session({ timeout: "10 seconds" })
      yield* faults.disconnect!(s)
      yield* TestClock.adjust("6 seconds")
      yield* faults.reconnect!(s)
      yield* faults.disconnect!(s)
      yield* TestClock.adjust("6 seconds")
      assert.strictEqual(yield* s.state, "suspended")
      yield* TestClock.adjust("4 seconds")
      assert.strictEqual(yield* s.state, "expired")
    }).pipe(memory)
  )

  it.effect("state transitions are seen on changes, which ends after expired", () =>
    Effect.gen(function* () {
      const faults = yield* Coordination.Faults
      const s = yield* (yield* Coordination.Coordination).session({ timeout: "5 seconds" })
      const states = yield* collectStates(s.changes)
      yield* faults.disconnect!(s)
      yield* TestClock.adjust("1 second")
      yield* faults.reconnect!(s)
      yield* faults.disconnect!(s)
      yield* TestClock.adjust("5 seconds")
      assert.deepStrictEqual(yield* Fiber.join(states), ["connected", "suspended", "connected", "suspended", "expired"])
      // a late subscriber sees the final state and ends
      assert.deepStrictEqual(yield* Stream.runCollect(s.changes), ["expired"])
    }).pipe(memory)
  )

  it.effect("closing the session's scope reports closed on changes", () =>
    Effect.gen(function* () {
      const coordination = yield* Coordination.Coordination
      const scope = yield* Scope.make()
      const s = yield* coordination.session().pipe(Scope.provide(scope))
      const states = yield* collectStates(s.changes)
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(yield* Fiber.join(states), ["connected", "closed"])
      assert.strictEqual(yield* reasonOf(s.get("/")), "SessionClosed")
    }).pipe(memory)
  )

  it.effect("closing a suspended session deletes its ephemeral nodes and stops the countdown", () =>
    Effect.gen(function* () {
      const coordination = yield* Coordination.Coordination
      const faults = yield* Coordination.Faults
      const other = yield* coordination.session()
      const scope = yield* Scope.make()
      const s = yield* coordination.session().pipe(Scope.provide(scope))
      yield* s.create("/e", empty, { mode: "ephemeral" })
      yield* faults.disconnect!(s)
      yield* Scope.close(scope, Exit.void)
      assert.strictEqual(yield* s.state, "closed")
      assert.isTrue(Option.isNone(yield* other.exists("/e")))
      yield* TestClock.adjust("1 minute")
      assert.strictEqual(yield* s.state, "closed", "closed stays closed")
    }).pipe(memory)
  )

  it.effect("watch events that happen while suspended are delivered on reconnect", () =>
    Effect.gen(function* () {
      const coordination = yield* Coordination.Coordination
      const faults = yield* Coordination.Faults
      const s = yield* coordination.session()
      const other = yield* coordination.session()
      yield* other.create("/x", empty)
      const watch = yield* s.watchNode("/x")
      yield* faults.disconnect!(s)
      yield* other.set("/x", bytes("changed"))
      assert.isTrue(yield* isPending(watch.changed), "not delivered while suspended")
      yield* faults.reconnect!(s)
      assert.deepStrictEqual(yield* watch.changed, { _tag: "NodeDataChanged", path: "/x" })
    }).pipe(memory)
  )

  it.effect("expiry fails watches whose events were held back while suspended", () =>
    Effect.gen(function* () {
      const coordination = yield* Coordination.Coordination
      const faults = yield* Coordination.Faults
      const s = yield* coordination.session({ timeout: "2 seconds" })
      const other = yield* coordination.session()
      yield* other.create("/x", empty)
      const watch = yield* s.watchNode("/x")
      yield* faults.disconnect!(s)
      yield* other.set("/x", bytes("changed"))
      yield* TestClock.adjust("2 seconds")
      assert.strictEqual(yield* reasonOf(watch.changed), "SessionExpired")
    }).pipe(memory)
  )

  it.effect("sequence numbers come from the parent's childrenVersion, like ZooKeeper", () =>
    Effect.gen(function* () {
      const s = yield* (yield* Coordination.Coordination).session()
      yield* s.create("/q", empty)
      assert.strictEqual(yield* s.create("/q/a-", empty, { mode: "persistent-sequential" }), "/q/a-0000000000")
      yield* s.create("/q/plain", empty)
      yield* s.delete("/q/plain")
      assert.strictEqual(yield* s.create("/q/b-", empty, { mode: "ephemeral-sequential" }), "/q/b-0000000003")
      const results = yield* s.multi([
        Coordination.op.create("/q/c-", empty, "persistent-sequential"),
        Coordination.op.create("/q/c-", empty, "persistent-sequential")
      ])
      assert.deepStrictEqual(results, [
        { _tag: "create", path: "/q/c-0000000004" },
        { _tag: "create", path: "/q/c-0000000005" }
      ])
      // a trailing slash makes the number the whole name, as in ZooKeeper
      assert.strictEqual(yield* s.create("/q/", empty, { mode: "persistent-sequential" }), "/q/0000000006")
    }).pipe(memory)
  )

  it.effect("all writes of one multi share one order number", () =>
    Effect.gen(function* () {
      const s = yield* (yield* Coordination.Coordination).session()
      yield* s.multi([Coordination.op.create("/a", empty), Coordination.op.create("/b", empty)])
      const a = (yield* s.get("/a")).stat
      const b = (yield* s.get("/b")).stat
      assert.strictEqual(a.createdOrder, b.createdOrder)
      yield* s.create("/c", empty)
      assert.isTrue((yield* s.get("/c")).stat.createdOrder > a.createdOrder)
    }).pipe(memory)
  )

  it.effect("the root cannot be deleted or created, but can hold data", () =>
    Effect.gen(function* () {
      const s = yield* (yield* Coordination.Coordination).session()
      assert.strictEqual(yield* reasonOf(s.delete("/")), "InvalidPath")
      assert.strictEqual(yield* reasonOf(s.create("/", empty)), "NodeExists")
      yield* s.set("/", bytes("root"))
      assert.strictEqual(new TextDecoder().decode((yield* s.get("/")).data), "root")
    }).pipe(memory)
  )

  it.effect("a session closed twice or expired after closing stays closed", () =>
    Effect.gen(function* () {
      const coordination = yield* Coordination.Coordination
      const faults = yield* Coordination.Faults
      const scope = yield* Scope.make()
      const s = yield* coordination.session().pipe(Scope.provide(scope))
      yield* Scope.close(scope, Exit.void)
      yield* faults.expire(s)
      yield* faults.disconnect!(s)
      yield* faults.reconnect!(s)
      assert.strictEqual(yield* s.state, "closed")
    }).pipe(memory)
  )
})
