import { assert, describe, it } from "@effect/vitest"
import { type Acks, LogIoError, logError } from "@strata/core"
import { Deferred, Effect, Exit, Fiber } from "effect"
import * as SendQueue from "../src/internal/sendQueue.js"

const boom = logError(new LogIoError({ operation: "produce", detail: "boom", retryable: true }))

/** A queue over a fake request sender that records each request and fails the ones asked to. */
const fixture = (options: { readonly maxBatchRecords?: number; readonly bufferRecords?: number } = {}) =>
  Effect.gen(function* () {
    const requests: Array<ReadonlyArray<string>> = []
    const gates: Array<Deferred.Deferred<void>> = []
    const failing = new Set<number>()
    let next = 0
    const queue = yield* SendQueue.make<string>({
      lingerMs: 0,
      maxBatchRecords: options.maxBatchRecords ?? 100,
      bufferRecords: options.bufferRecords ?? 1000,
      send: (records: ReadonlyArray<string>, _acks: Acks) =>
        Effect.gen(function* () {
          const n = requests.push(records) - 1
          const gate = gates[n]
          if (gate !== undefined) yield* Deferred.await(gate)
          if (failing.has(n)) return yield* Effect.fail(boom)
          const base = next
          next += records.length
          return records.map((_, i) => base + i)
        })
    })
    return { queue, requests, gates, failing }
  })

describe("SendQueue", () => {
  it("callsPerRequest takes whole calls up to the limit, and a larger call alone", () => {
    assert.strictEqual(SendQueue.callsPerRequest([3, 3, 3], 7), 2)
    assert.strictEqual(SendQueue.callsPerRequest([9, 1], 7), 1)
    assert.strictEqual(SendQueue.callsPerRequest([1, 9], 7), 1)
    assert.strictEqual(SendQueue.callsPerRequest([], 7), 0)
  })

  it.effect("calls waiting behind a request share the next one, in order", () =>
    Effect.gen(function* () {
      const { queue, requests, gates } = yield* fixture()
      gates[0] = yield* Deferred.make<void>()
      const a = yield* queue.enqueue(["a"], "all")
      yield* Effect.yieldNow
      const b = yield* queue.enqueue(["b1", "b2"], "all")
      const c = yield* queue.enqueue(["c"], "all")
      yield* Deferred.succeed(gates[0]!, undefined)
      assert.deepStrictEqual(yield* Deferred.await(a), [0])
      assert.deepStrictEqual(yield* Deferred.await(b), [1, 2])
      assert.deepStrictEqual(yield* Deferred.await(c), [3])
      assert.deepStrictEqual(requests, [["a"], ["b1", "b2", "c"]])
    })
  )

  it.effect("a failed request stops its owners: their queued calls fail unsent, other owners go on", () =>
    Effect.gen(function* () {
      const { queue, requests, gates, failing } = yield* fixture({ maxBatchRecords: 1 })
      const mine: SendQueue.Owner = { failure: undefined }
      const other: SendQueue.Owner = { failure: undefined }
      gates[0] = yield* Deferred.make<void>()
      failing.add(0)
      const first = yield* queue.enqueue(["m1"], "all", mine)
      yield* Effect.yieldNow
      const second = yield* queue.enqueue(["m2"], "all", mine)
      const theirs = yield* queue.enqueue(["o1"], "all", other)
      yield* Deferred.succeed(gates[0]!, undefined)
      assert.strictEqual((yield* Effect.flip(Deferred.await(first))).message, boom.message)
      assert.strictEqual((yield* Effect.flip(Deferred.await(second))).message, boom.message)
      assert.deepStrictEqual(yield* Deferred.await(theirs), [0])
      assert.strictEqual(mine.failure?.message, boom.message)
      assert.strictEqual(other.failure, undefined)
      assert.deepStrictEqual(requests, [["m1"], ["o1"]], "m2 was never sent")
    })
  )

  it.effect("enqueue waits for buffer room; flush waits for every call", () =>
    Effect.gen(function* () {
      const { queue, gates } = yield* fixture({ bufferRecords: 3 })
      gates[0] = yield* Deferred.make<void>()
      const a = yield* queue.enqueue(["a", "b", "c"], 1)
      const blocked = yield* Effect.forkChild(queue.enqueue(["d"], 1))
      yield* Effect.yieldNow
      assert.isUndefined(blocked.pollUnsafe(), "no room until the first call is done")
      const flushed = yield* Effect.forkChild(queue.flush)
      yield* Deferred.succeed(gates[0]!, undefined)
      const d = yield* Fiber.join(blocked)
      yield* Fiber.join(flushed)
      assert.isTrue(Exit.isSuccess(yield* Deferred.await(a).pipe(Effect.exit)))
      assert.deepStrictEqual(yield* Deferred.await(d), [3])
    })
  )
})
