import { Log } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber } from "effect"
import * as SendQueue from "../src/internal/sendQueue.js"

const boom = Log.logError(new Log.IoError({ operation: "produce", detail: "boom", retryable: true }))

/** A request measure where a record's size is its length, and a request holds at most `max` of it. */
const lengths = (max: number): SendQueue.RequestSize<string> => {
  let total = 0
  return {
    reset: () => {
      total = 0
    },
    add: (r) => {
      if (total + r.length > max) return false
      total += r.length
      return true
    }
  }
}

/** A queue over a fake request sender that records each request and fails the ones asked to. */
const fixture = (
  options: { readonly maxBatchRecords?: number; readonly bufferRecords?: number; readonly maxBytes?: number } = {}
) =>
  Effect.gen(function* () {
    const requests: Array<ReadonlyArray<string>> = []
    const gates: Array<Deferred.Deferred<void>> = []
    const failing = new Set<number>()
    let next = 0
    const queue = yield* SendQueue.make<string>({
      lingerMs: 0,
      maxBatchRecords: options.maxBatchRecords ?? 100,
      bufferRecords: options.bufferRecords ?? 1000,
      size: () => lengths(options.maxBytes ?? 1_000_000),
      send: (records: ReadonlyArray<string>, _acks: Log.Acks) =>
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
  const calls = (...sizes: ReadonlyArray<number>) =>
    sizes.map((n) => ({ records: Array.from({ length: n }, () => "x"), sent: 0 }))

  it("nextRequest takes whole calls up to the record limit, and a larger call alone", () => {
    const roomy = lengths(1000)
    assert.deepStrictEqual(SendQueue.nextRequest(calls(3, 3, 3), 7, roomy), { calls: 2, end: undefined })
    assert.deepStrictEqual(SendQueue.nextRequest(calls(9, 1), 7, roomy), { calls: 1, end: undefined })
    assert.deepStrictEqual(SendQueue.nextRequest(calls(1, 9), 7, roomy), { calls: 1, end: undefined })
    assert.deepStrictEqual(SendQueue.nextRequest(calls(), 7, roomy), { calls: 0, end: undefined })
  })

  it("nextRequest keeps a request within the byte limit: a call that does not fit waits, one too large is split", () => {
    const call = (...records: ReadonlyArray<string>) => ({ records, sent: 0 })
    // 6 + 6 > 10: the second call goes in the next request, whole.
    assert.deepStrictEqual(SendQueue.nextRequest([call("aaa", "bbb"), call("cccccc")], 100, lengths(10)), {
      calls: 1,
      end: undefined
    })
    // A first call over the limit goes in parts: its records up to the limit now.
    assert.deepStrictEqual(SendQueue.nextRequest([call("aaaa", "bbbb", "cccc"), call("d")], 100, lengths(10)), {
      calls: 1,
      end: 2
    })
    // The rest of a split call, then the calls after it, as they fit.
    assert.deepStrictEqual(
      SendQueue.nextRequest(
        [{ records: ["aaaa", "bbbb", "cccc"], sent: 2 }, call("d"), call("eeeeee")],
        100,
        lengths(10)
      ),
      { calls: 2, end: undefined }
    )
    // A record over the limit alone still goes (alone), so the queue always moves.
    assert.deepStrictEqual(SendQueue.nextRequest([call("aaaaaaaaaaaa", "b")], 100, lengths(10)), { calls: 1, end: 1 })
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

  it.effect(
    "concurrent calls over the byte limit go in requests that fit; a split call's offsets come whole, in order",
    () =>
      Effect.gen(function* () {
        const { queue, requests, gates } = yield* fixture({ maxBytes: 10 })
        gates[0] = yield* Deferred.make<void>()
        const a = yield* queue.enqueue(["aaaaaa"], "all")
        yield* Effect.yieldNow
        const b = yield* queue.enqueue(["bbbbbb"], "all")
        const c = yield* queue.enqueue(["c1111", "c2222", "c3333"], "all")
        const d = yield* queue.enqueue(["dd"], "all")
        yield* Deferred.succeed(gates[0]!, undefined)
        assert.deepStrictEqual(yield* Deferred.await(a), [0])
        assert.deepStrictEqual(yield* Deferred.await(b), [1])
        assert.deepStrictEqual(yield* Deferred.await(c), [2, 3, 4])
        assert.deepStrictEqual(yield* Deferred.await(d), [5])
        assert.deepStrictEqual(requests, [["aaaaaa"], ["bbbbbb"], ["c1111", "c2222"], ["c3333", "dd"]])
      })
  )

  it.effect("a split call fails when a later part fails; its owner stops", () =>
    Effect.gen(function* () {
      const { queue, requests, failing } = yield* fixture({ maxBytes: 10 })
      failing.add(1)
      const owner: SendQueue.Owner = { failure: undefined }
      const split = yield* queue.enqueue(["a1111", "a2222", "a3333"], "all", owner)
      assert.strictEqual((yield* Effect.flip(Deferred.await(split))).message, boom.message)
      assert.strictEqual(owner.failure?.message, boom.message)
      assert.deepStrictEqual(requests, [["a1111", "a2222"], ["a3333"]])
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
