/**
 * RemotePeers' connection pool: callers arriving together share one connection; a caller whose wait is cut short
 * (its timeout) leaves the connection to be made for the callers after it; a failed connection is not kept; retire
 * closes one.
 */
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Scope } from "effect"
import * as ConnectionPool from "../src/client/internal/connectionPool.js"
import { PeerUnreachable } from "../src/wire/Peers.js"

/** A pool whose connections wait for `gate` before they are made (`started` once one is under way); counts attempts and closes. */
const gated = Effect.gen(function* () {
  const scope = yield* Scope.make()
  const gate = yield* Deferred.make<void>()
  const started = yield* Deferred.make<void>()
  const counts = { attempts: 0, closed: 0, failNext: 0 }
  const pool = ConnectionPool.make<string>(scope, (address, entryScope) =>
    Effect.gen(function* () {
      counts.attempts++
      yield* Deferred.succeed(started, undefined)
      yield* Deferred.await(gate)
      if (counts.failNext > 0) {
        counts.failNext--
        return yield* Effect.fail(new PeerUnreachable({ target: address, detail: "refused" }))
      }
      yield* Scope.addFinalizer(
        entryScope,
        Effect.sync(() => {
          counts.closed++
        })
      )
      return `connection to ${address} #${counts.attempts}`
    })
  )
  return { scope, gate, started, counts, pool }
})

describe("ConnectionPool", () => {
  it.live("a caller that gives up while the connection is being made leaves it made for the next caller", () =>
    Effect.gen(function* () {
      const { gate, started, counts, pool } = yield* gated
      const first = yield* Effect.forkChild(pool.get("a:1"))
      yield* Deferred.await(started)
      // The first caller's wait ends (its request timeout, say) before the connection is made.
      yield* Fiber.interrupt(first)
      const second = yield* Effect.forkChild(pool.get("a:1"))
      yield* Deferred.succeed(gate, undefined)
      const exit = yield* Fiber.await(second).pipe(Effect.timeoutOption("2 seconds"))
      assert.isTrue(exit._tag === "Some" && Exit.isSuccess(exit.value), "the second caller got the connection")
      assert.deepStrictEqual(exit._tag === "Some" ? exit.value : undefined, Exit.succeed("connection to a:1 #1"))
      assert.strictEqual(counts.attempts, 1, "one connection made for both")
    })
  )

  it.effect("callers arriving together share one connection", () =>
    Effect.gen(function* () {
      const { gate, counts, pool } = yield* gated
      const callers = yield* Effect.forkChild(
        Effect.all([pool.get("a:1"), pool.get("a:1"), pool.get("b:2")], { concurrency: "unbounded" })
      )
      yield* Deferred.succeed(gate, undefined)
      const got = yield* Fiber.join(callers)
      assert.deepStrictEqual(got, ["connection to a:1 #1", "connection to a:1 #1", "connection to b:2 #2"])
      assert.strictEqual(counts.attempts, 2)
    })
  )

  it.effect("a failed connection is not kept: the next call tries again", () =>
    Effect.gen(function* () {
      const { gate, counts, pool } = yield* gated
      counts.failNext = 1
      yield* Deferred.succeed(gate, undefined)
      const failed = yield* Effect.exit(pool.get("a:1"))
      assert.isTrue(Exit.isFailure(failed))
      assert.strictEqual(yield* pool.get("a:1"), "connection to a:1 #2")
    })
  )

  it.effect(
    "retire closes the connection, and the next call makes a new one; closing the pool's scope closes all",
    () =>
      Effect.gen(function* () {
        const { scope, gate, counts, pool } = yield* gated
        yield* Deferred.succeed(gate, undefined)
        assert.strictEqual(yield* pool.get("a:1"), "connection to a:1 #1")
        yield* pool.retire("a:1")
        assert.strictEqual(counts.closed, 1)
        assert.strictEqual(yield* pool.get("a:1"), "connection to a:1 #2")
        yield* pool.get("b:2")
        yield* Scope.close(scope, Exit.void)
        assert.strictEqual(counts.closed, 3)
      })
  )
})
