/**
 * A tablet server's answers to the controller: instructions addressed to another life of the server are refused
 * (KIP-380), `logEnd` tells a candidate's log end, opening the log when no instruction has yet, `holdings` tells what
 * it holds and the server's health, and `stopReplica` deletes a replica's data whether or not it is hosted now. A
 * replica whose instruction names a replication throttle copies at most that fast.
 */
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Metric } from "effect"
import { TestClock } from "effect/testing"
import type * as ReplicaManager from "../src/protocol/ReplicaManager.js"
import * as Throttle from "../src/server/internal/throttle.js"
import { eventually, make, records } from "./support/servers.js"

const tablet = { table: "t", bucket: 0 }
const replication = { minInsyncReplicas: 1, fetchMaxWait: 20, retryBackoff: 10, replicaLagTimeMax: 60_000 }
const instruction = (leaderEpoch: number) => ({
  tablet,
  replicas: [1],
  leaderAndIsr: { leader: 1, leaderEpoch, isr: [1], coordinatorEpoch: 1, version: leaderEpoch }
})

describe("TabletServer", () => {
  it.live("instructions for another registration are refused with FencedEpoch, naming it, and change nothing", () =>
    Effect.gen(function* () {
      const servers = yield* make(replication)
      const server = yield* servers.start(1)
      // Not registered yet: an instruction for a registration (the server's last life) is not for it.
      const early = yield* Effect.flip(
        server.leaderAndIsr({ coordinatorEpoch: 1, registration: 7, tablets: [instruction(0)] })
      )
      assert.strictEqual(early.reason._tag, "FencedEpoch")
      assert.include(early.message, "registration of server 1 (not registered)")
      assert.deepStrictEqual(yield* server.tablets, [])
      yield* server.registered(8)
      const stale = yield* Effect.flip(
        server.leaderAndIsr({ coordinatorEpoch: 1, registration: 7, tablets: [instruction(0)] })
      )
      assert.include(stale.message, "epoch 7 is fenced, the current epoch is 8")
      assert.deepStrictEqual(yield* server.tablets, [])
      // Its own registration, or none named (a controller that does not track them): applied.
      yield* server.leaderAndIsr({ coordinatorEpoch: 1, registration: 8, tablets: [instruction(0)] })
      assert.strictEqual(yield* server.replicaState(tablet), "LeaderReplica")
      yield* server.leaderAndIsr({ coordinatorEpoch: 1, tablets: [instruction(1)] })
      const view = (yield* server.replicas)[0]
      assert.strictEqual(view?.leader?.leaderEpoch, 1)
      // Its session ended: nothing is for it until it registers again.
      yield* server.registered(undefined)
      const ended = yield* Effect.flip(
        server.leaderAndIsr({ coordinatorEpoch: 1, registration: 8, tablets: [instruction(2)] })
      )
      assert.strictEqual(ended.reason._tag, "FencedEpoch")
    }).pipe(Effect.scoped)
  )

  it.live("a LeaderAndIsr interrupted while it opens the log leaves the replica able to take the next one", () =>
    Effect.gen(function* () {
      const servers = yield* make(replication)
      const server = yield* servers.start(1)
      const hold = { server: 1, reached: yield* Deferred.make<void>(), release: yield* Deferred.make<void>() }
      servers.links.storeHold = hold
      // Its caller gives up (Effect RPC interrupts a handler whose client timed out or went away) with the partition
      // open and the log half-loaded.
      const handler = yield* Effect.forkChild(server.leaderAndIsr({ coordinatorEpoch: 1, tablets: [instruction(0)] }))
      yield* Deferred.await(hold.reached)
      const interrupted = yield* Effect.forkChild(Fiber.interrupt(handler))
      yield* Deferred.succeed(hold.release, undefined)
      yield* Fiber.join(interrupted)
      yield* server.leaderAndIsr({ coordinatorEpoch: 1, tablets: [instruction(1)] })
      assert.strictEqual(yield* server.replicaState(tablet), "LeaderReplica")
      assert.strictEqual((yield* server.replicas)[0]?.leader?.leaderEpoch, 1)
      yield* server.append({ tablet, records: records("v", 0, 2), acks: 1 })
      assert.deepStrictEqual(yield* server.logEnd({ tablet }), { lastEpoch: 1, logEndOffset: 2 })
    }).pipe(Effect.scoped)
  )

  it.live("a LeaderAndIsr interrupted at any point leaves the replica in its old role or its new one, whole", () =>
    Effect.gen(function* () {
      const follower = (leaderEpoch: number) => ({
        tablet,
        replicas: [1, 2],
        leaderAndIsr: { leader: 2, leaderEpoch, isr: [1, 2], coordinatorEpoch: 1, version: leaderEpoch }
      })
      const leader = (leaderEpoch: number) => ({
        tablet,
        replicas: [1, 2],
        leaderAndIsr: { leader: 1, leaderEpoch, isr: [1, 2], coordinatorEpoch: 1, version: leaderEpoch }
      })
      for (let steps = 0; steps < 60; steps++) {
        yield* Effect.gen(function* () {
          const servers = yield* make(replication)
          const server = yield* servers.start(1)
          yield* server.leaderAndIsr({ coordinatorEpoch: 1, tablets: [follower(1)] })
          const handler = yield* Effect.forkChild(server.leaderAndIsr({ coordinatorEpoch: 1, tablets: [leader(2)] }))
          for (let i = 0; i < steps; i++) yield* Effect.yieldNow
          yield* Fiber.interrupt(handler)
          const state = yield* server.replicaState(tablet)
          const view = (yield* server.replicas)[0]
          // Leading means leader state in the epoch led; anything else means none.
          assert.strictEqual(view?.leader !== undefined, state === "LeaderReplica", `after ${steps} steps: ${state}`)
          // And the next instruction applies whatever happened.
          yield* server.leaderAndIsr({ coordinatorEpoch: 1, tablets: [leader(3)] })
          assert.strictEqual(yield* server.replicaState(tablet), "LeaderReplica", `after ${steps} steps`)
          assert.strictEqual((yield* server.replicas)[0]?.leader?.leaderEpoch, 3, `after ${steps} steps`)
        }).pipe(Effect.scoped)
      }
    })
  )

  it.live("a replica whose store fails goes offline, tells the controller, and comes back once writes succeed", () =>
    Effect.gen(function* () {
      const servers = yield* make({ ...replication, replicaLagTimeMax: 60_000 })
      const [L, F] = [1, 2]
      for (const id of [L, F]) yield* servers.start(id)
      const both = { leader: L, leaderEpoch: 1, isr: [L, F] }
      yield* servers.instruct([L, F], tablet, [L, F], both)
      yield* servers.server(L).append({ tablet, records: records("a", 0, 3), acks: 1 })
      yield* eventually(Effect.map(servers.logValues(F, tablet), (v) => v.length === 3))
      const reports = (server: number, failed: boolean) =>
        servers.links.storageReports.filter((r) => r.server === server && r.failed === failed).length
      // The leader's disk fills: the append is refused (retryably), the replica goes offline and says so.
      servers.links.failingStores.add(L)
      const refused = yield* Effect.flip(servers.server(L).append({ tablet, records: records("a", 3, 4), acks: 1 }))
      assert.strictEqual(refused.reason._tag, "ReplicaStorageFailed")
      assert.isTrue(refused.retryable)
      assert.strictEqual(yield* servers.server(L).replicaState(tablet), "OfflineReplica")
      yield* eventually(Effect.sync(() => reports(L, true) > 0))
      // The other's disk fills too: it fails the first write of its leadership (its HW checkpoint).
      servers.links.failingStores.add(F)
      yield* servers.instruct([F], tablet, [L, F], { leader: F, leaderEpoch: 2, isr: [F] })
      yield* eventually(Effect.sync(() => reports(F, true) > 0))
      assert.strictEqual(yield* servers.server(F).replicaState(tablet), "OfflineReplica")
      const refusedToo = yield* Effect.flip(servers.server(F).append({ tablet, records: records("f", 3, 4), acks: 1 }))
      assert.isTrue(refusedToo.retryable, refusedToo.message)
      // Space again: each tries its store again, finds it takes writes, and says so; nothing it held is lost.
      servers.links.failingStores.clear()
      yield* eventually(Effect.sync(() => reports(L, false) > 0 && reports(F, false) > 0))
      assert.strictEqual(yield* servers.server(L).replicaState(tablet), "OnlineReplica")
      yield* servers.instruct([L, F], tablet, [L, F], { leader: F, leaderEpoch: 3, isr: [F, L] })
      yield* servers.server(F).append({ tablet, records: records("f", 3, 5), acks: 1 })
      yield* eventually(Effect.map(servers.logValues(L, tablet), (v) => v.length === 5))
      assert.deepStrictEqual(yield* servers.logValues(L, tablet), ["a0", "a1", "a2", "f3", "f4"])
    }).pipe(Effect.scoped)
  )

  it.live("logEnd opens a log no instruction has opened, and reports its latest epoch and log end", () =>
    Effect.gen(function* () {
      const servers = yield* make(replication)
      const server = yield* servers.start(1)
      // Nothing here of the tablet: answered empty, and nothing is created for it.
      assert.deepStrictEqual(yield* server.logEnd({ tablet }), { lastEpoch: null, logEndOffset: 0 })
      assert.deepStrictEqual(yield* server.tablets, [])
      yield* server.leaderAndIsr({ coordinatorEpoch: 1, tablets: [instruction(3)] })
      yield* server.append({ tablet, records: records("v", 0, 5), acks: 1 })
      assert.deepStrictEqual(yield* server.logEnd({ tablet }), { lastEpoch: 3, logEndOffset: 5 })
      // After a restart on the same store, before any instruction: what the store kept.
      yield* servers.stop(1)
      const again = yield* servers.start(1)
      assert.deepStrictEqual(yield* again.logEnd({ tablet }), { lastEpoch: 3, logEndOffset: 5 })
      assert.strictEqual(yield* again.replicaState(tablet), "OnlineReplica")
      // Instructions still apply to the replica it opened.
      yield* again.leaderAndIsr({ coordinatorEpoch: 1, tablets: [instruction(4)] })
      assert.strictEqual(yield* again.replicaState(tablet), "LeaderReplica")
      // Deleted, it is not created again by a late question.
      yield* again.stopReplica({ coordinatorEpoch: 1, tablets: [tablet] })
      assert.deepStrictEqual(yield* again.logEnd({ tablet }), { lastEpoch: null, logEndOffset: 0 })
      assert.deepStrictEqual(yield* again.tablets, [])
    }).pipe(Effect.scoped)
  )

  it.live("a store that fails again while its recovery is still being reported is tried again, not left offline", () =>
    Effect.gen(function* () {
      const servers = yield* make({ ...replication, replicaLagTimeMax: 60_000 })
      const server = yield* servers.start(1)
      const tries = (failed: boolean) => servers.links.storageTries.filter((r) => r.failed === failed).length
      yield* servers.instruct([1], tablet, [1], { leader: 1, leaderEpoch: 1, isr: [1] })
      servers.links.failingStores.add(1)
      yield* Effect.flip(server.append({ tablet, records: records("a", 0, 1), acks: 1 }))
      yield* eventually(Effect.sync(() => tries(true) > 0))
      // The store takes writes again, but the controller does not hear so (the answers are lost, retried)...
      servers.links.storageUnheard = true
      servers.links.failingStores.clear()
      yield* eventually(Effect.sync(() => tries(false) > 0))
      assert.strictEqual(yield* server.replicaState(tablet), "OnlineReplica")
      // ...and it fails again before that is heard: leading again, its first append fails.
      servers.links.failingStores.add(1)
      yield* servers.instruct([1], tablet, [1], { leader: 1, leaderEpoch: 2, isr: [1] })
      yield* Effect.flip(server.append({ tablet, records: records("a", 0, 1), acks: 1 }))
      assert.strictEqual(yield* server.replicaState(tablet), "OfflineReplica")
      const failedBefore = tries(true)
      servers.links.storageUnheard = false
      servers.links.failingStores.clear()
      // The new failure is told, the store tried again, and its coming back told: the replica is online again.
      const recovered = Effect.map(
        server.replicaState(tablet),
        (state) =>
          state === "OnlineReplica" &&
          tries(true) > failedBefore &&
          servers.links.storageReports.at(-1)?.failed === false
      )
      yield* eventually(recovered).pipe(Effect.timeout("10 seconds"), Effect.ignore)
      assert.isAbove(tries(true), failedBefore, "the second failure was never reported")
      assert.strictEqual(yield* server.replicaState(tablet), "OnlineReplica")
      assert.isFalse(servers.links.storageReports.at(-1)?.failed)
    }).pipe(Effect.scoped)
  )

  it.live(
    "a log-end question under a newer epoch ends the leadership first: nothing is acknowledged past the answer",
    () =>
      Effect.gen(function* () {
        const servers = yield* make(replication)
        const server = yield* servers.start(1)
        // Leading epoch 1 with ISR [1,2] and a minimum of one: an acks=all append waits for server 2, which never
        // fetches (its session ended; the controller took the tablet offline and asks for log ends to elect).
        const pair = {
          tablet,
          replicas: [1, 2],
          leaderAndIsr: { leader: 1, leaderEpoch: 1, isr: [1, 2], coordinatorEpoch: 1, version: 1 }
        }
        yield* server.leaderAndIsr({ coordinatorEpoch: 1, tablets: [pair] })
        yield* server.append({ tablet, records: records("v", 0, 3), acks: 1 })
        const waiting = yield* Effect.forkChild(server.append({ tablet, records: records("w", 0, 2), acks: "all" }))
        yield* eventually(Effect.map(server.logEnd({ tablet }), (end) => end.logEndOffset === 5))
        // A controller older than the last seen is refused and changes nothing.
        yield* server.holdings({ coordinatorEpoch: 2 })
        const stale = yield* Effect.flip(server.logEnd({ tablet, fence: { leaderEpoch: 2, coordinatorEpoch: 1 } }))
        assert.strictEqual(stale.reason._tag, "FencedEpoch")
        assert.strictEqual(yield* server.replicaState(tablet), "LeaderReplica")
        const answer = yield* server.logEnd({ tablet, fence: { leaderEpoch: 2, coordinatorEpoch: 2 } })
        assert.deepStrictEqual(answer, { lastEpoch: 1, logEndOffset: 5 })
        // The waiting append is refused, not acknowledged later; a new one is refused; the log stays as answered.
        const refused = yield* Fiber.join(waiting).pipe(Effect.timeout("5 seconds"), Effect.flip)
        assert.strictEqual(refused._tag === "ReplicaError" ? refused.reason._tag : refused._tag, "NotLeader")
        assert.strictEqual(yield* server.replicaState(tablet), "OnlineReplica")
        const late = yield* Effect.flip(server.append({ tablet, records: records("x", 0, 1), acks: 1 }))
        assert.strictEqual(late.reason._tag, "NotLeader")
        assert.deepStrictEqual(yield* server.logEnd({ tablet }), answer)
        // The next leader epoch applies as usual.
        yield* server.leaderAndIsr({
          coordinatorEpoch: 2,
          tablets: [{ ...pair, leaderAndIsr: { ...pair.leaderAndIsr, leaderEpoch: 3, isr: [1], version: 3 } }]
        })
        assert.strictEqual(yield* server.replicaState(tablet), "LeaderReplica")
        // A tablet taken offline (no leader) under a newer epoch ends the role the same way.
        yield* server.leaderAndIsr({
          coordinatorEpoch: 2,
          tablets: [{ ...pair, leaderAndIsr: { ...pair.leaderAndIsr, leader: null, leaderEpoch: 4, version: 4 } }]
        })
        assert.strictEqual(yield* server.replicaState(tablet), "OnlineReplica")
        assert.strictEqual(
          (yield* Effect.flip(server.append({ tablet, records: records("y", 0, 1), acks: 1 }))).reason._tag,
          "NotLeader"
        )
      }).pipe(Effect.scoped)
  )

  it.live("a request reaching a stopped server fails and leaves no log open behind it", () =>
    Effect.gen(function* () {
      const servers = yield* make(replication)
      const stopped = yield* servers.start(1)
      yield* servers.stop(1)
      // A late question (sent before the stop, arriving after) must not lock the store for the next start.
      const late = yield* Effect.flip(stopped.logEnd({ tablet: { table: "t", bucket: 9 } }))
      assert.strictEqual(late.reason._tag, "ReplicaStorageFailed")
      assert.include(late.message, "the server has stopped")
      const next = yield* servers.start(1)
      assert.deepStrictEqual(yield* next.logEnd({ tablet: { table: "t", bucket: 9 } }), {
        lastEpoch: null,
        logEndOffset: 0
      })
    }).pipe(Effect.scoped)
  )

  it.live(
    "stopReplica deletes a leading replica and one left on disk by an earlier run; holdings tell what is held",
    () =>
      Effect.gen(function* () {
        const servers = yield* make(replication)
        const server = yield* servers.start(1)
        const other = { table: "t", bucket: 1 }
        yield* server.leaderAndIsr({
          coordinatorEpoch: 1,
          tablets: [instruction(2), { ...instruction(4), tablet: other }]
        })
        yield* server.append({ tablet, records: records("v", 0, 5), acks: 1 })
        yield* server.append({ tablet: other, records: records("w", 0, 3), acks: 1 })
        assert.deepStrictEqual(
          (yield* server.holdings({ coordinatorEpoch: 2 })).tablets.map((h) => [
            h.tablet.bucket,
            h.leaderEpoch,
            h.version
          ]),
          [
            [0, 2, 2],
            [1, 4, 4]
          ]
        )
        // A controller of an older epoch than the last seen (2) is refused, and nothing is deleted.
        const stale = yield* Effect.flip(server.stopReplica({ coordinatorEpoch: 1, tablets: [tablet] }))
        assert.strictEqual(stale.reason._tag, "FencedEpoch")
        yield* server.stopReplica({ coordinatorEpoch: 2, tablets: [tablet] })
        assert.deepStrictEqual(yield* server.tablets, [other])
        assert.strictEqual((yield* Effect.flip(server.replicaState(tablet))).reason._tag, "UnknownTablet")
        // Asked again (its answer was lost): nothing left to do, no error.
        yield* server.stopReplica({ coordinatorEpoch: 2, tablets: [tablet] })
        // After a restart the other replica is on disk but not hosted: deleted all the same.
        yield* servers.stop(1)
        const again = yield* servers.start(1)
        assert.deepStrictEqual((yield* again.holdings({ coordinatorEpoch: 2 })).tablets, [])
        yield* again.stopReplica({ coordinatorEpoch: 2, tablets: [other] })
        assert.deepStrictEqual(yield* again.logEnd({ tablet: other }), { lastEpoch: null, logEndOffset: 0 })
        assert.deepStrictEqual(yield* again.logEnd({ tablet }), { lastEpoch: null, logEndOffset: 0 })
      }).pipe(Effect.scoped)
  )

  it.effect(
    "a follower under a replication throttle copies at most rate × elapsed + one bucket, steadily; lifted, it copies the rest",
    () =>
      Effect.gen(function* () {
        const servers = yield* make({ ...replication, fetchMaxWait: 50 })
        const [L, F] = [1, 2]
        for (const id of [L, F]) yield* servers.start(id)
        // 100 batches of 10 records of 100 value bytes: 100 000 record bytes on the leader.
        const value = new Uint8Array(100).fill(7)
        yield* servers.instruct([L], tablet, [L, F], { leader: L, leaderEpoch: 1, isr: [L], version: 1 })
        for (let i = 0; i < 100; i++) {
          const batch = Array.from({ length: 10 }, () => ({ key: null, value, headers: [], timestamp: 0 }))
          yield* servers.server(L).append({ tablet, records: batch, acks: 1 })
        }
        const total = 100 * 10 * value.byteLength
        const rate = 10_000
        const follow = (version: number, throttleBytesPerSec?: number) =>
          servers.server(F).leaderAndIsr({
            coordinatorEpoch: 1,
            tablets: [
              {
                tablet,
                replicas: [L, F],
                leaderAndIsr: { leader: L, leaderEpoch: 1, isr: [L], coordinatorEpoch: 1, version },
                ...(throttleBytesPerSec === undefined ? {} : { throttleBytesPerSec })
              }
            ]
          })
        const copied = Effect.map(servers.logValues(F, tablet), (v) => v.length * value.byteLength)
        const gauge = Effect.flatMap(servers.server(F).refreshMetrics, () =>
          Effect.map(Metric.snapshot, (all) => {
            const found = all.find(
              (m) => m.id === "strata_server_replication_throttle_bytes_per_second" && m.attributes?.server === "2"
            )
            return (found?.state as { readonly value?: number } | undefined)?.value
          })
        )
        yield* follow(1, rate)
        assert.strictEqual(yield* gauge, rate)
        assert.strictEqual(
          (yield* servers.server(F).holdings({ coordinatorEpoch: 1 })).tablets[0]?.throttleBytesPerSec,
          rate
        )
        // Virtual time in steps of 100 ms: never more than the rate allows since the start, plus one bucket.
        const bucket = Throttle.capacity(rate)
        for (let step = 1; step <= 50; step++) {
          yield* TestClock.adjust("100 millis")
          const bytes = yield* copied
          assert.isAtMost(bytes, rate * (step / 10) + bucket, `after ${step * 100} ms`)
        }
        // And it does copy, near the rate: over 5 s at least half of what the rate allows.
        const after5s = yield* copied
        assert.isAtLeast(after5s, (rate * 5) / 2)
        assert.isBelow(after5s, total)
        // The next instruction names no throttle (the move ended): the rest comes at once.
        yield* follow(2)
        assert.strictEqual(yield* gauge, 0)
        yield* TestClock.adjust("500 millis")
        assert.strictEqual(yield* copied, total)
        assert.isUndefined((yield* servers.server(F).holdings({ coordinatorEpoch: 1 })).tablets[0]?.throttleBytesPerSec)
      }).pipe(Effect.scoped, Effect.provideService(Metric.MetricRegistry, new Map()))
  )

  it.effect(
    "a table's retention: leader and follower each delete what it lets go below their high watermark, every check interval; a tablet without one keeps everything",
    () =>
      Effect.gen(function* () {
        const servers = yield* make({ ...replication, retentionCheckInterval: 1_000 })
        const [L, F] = [1, 2]
        for (const id of [L, F]) yield* servers.start(id)
        const kept = { table: "kept", bucket: 0 }
        const instruct = (to: number, t: typeof tablet, retention?: ReplicaManager.Retention) =>
          servers.server(to).leaderAndIsr({
            coordinatorEpoch: 1,
            tablets: [
              {
                tablet: t,
                replicas: [L, F],
                leaderAndIsr: { leader: L, leaderEpoch: 1, isr: [L], coordinatorEpoch: 1, version: 1 },
                ...(retention === undefined ? {} : { retention })
              }
            ]
          })
        for (const to of [L, F]) {
          yield* instruct(to, tablet, { ms: 10_000 })
          yield* instruct(to, kept)
        }
        // Five batches at 0 s, five at 5 s (their records stamped with the time they are written).
        const write = (at: number) =>
          Effect.forEach(
            [tablet, kept],
            (t) =>
              Effect.forEach(
                Array.from({ length: 5 }, (_, i) => i),
                (i) =>
                  servers.server(L).append({
                    tablet: t,
                    records: records(`${at}`, i * 10, i * 10 + 10).map((r) => ({ ...r, timestamp: at })),
                    acks: 1
                  }),
                { discard: true }
              ),
            { discard: true }
          )
        yield* write(0)
        yield* TestClock.adjust("5 seconds")
        yield* write(5_000)
        const starts = (t: typeof tablet) =>
          Effect.forEach([L, F], (id) =>
            Effect.flatMap(servers.server(id).logOf(t), (log) =>
              log === undefined ? Effect.succeed(-1) : log.logStartOffset
            )
          )
        // The follower caught up (and heard the high watermark); nothing is 10 s old yet.
        yield* eventually(Effect.map(servers.logValues(F, tablet), (v) => v.length === 100))
        assert.deepStrictEqual(yield* starts(tablet), [0, 0])
        // At 11 s the first five batches are more than 10 s old: they go on both, at the next check.
        yield* TestClock.adjust("6 seconds")
        assert.deepStrictEqual(yield* starts(tablet), [50, 50])
        const below = yield* Effect.flip(servers.server(L).read({ tablet, offset: 49, maxBytes: 1_000_000 }))
        assert.include(below.message, "49")
        // At 16 s the rest: everything below the high watermark (the store-backed log keeps no active segment).
        yield* TestClock.adjust("5 seconds")
        assert.deepStrictEqual(yield* starts(tablet), [100, 100])
        assert.deepStrictEqual(yield* starts(kept), [0, 0])
        // The log goes on from there.
        const next = yield* servers.server(L).append({ tablet, records: records("later", 0, 1), acks: 1 })
        assert.strictEqual(next.baseOffset, 100)
      }).pipe(Effect.scoped)
  )

  it.live(
    "a delete moves the leader's log start and is answered once its ISR follower's has moved too: a new leader starts there",
    () =>
      Effect.gen(function* () {
        const servers = yield* make(replication)
        const [L, F] = [1, 2]
        for (const id of [L, F]) yield* servers.start(id)
        const instruct = (to: number, leader: number, leaderEpoch: number, version: number) =>
          servers.server(to).leaderAndIsr({
            coordinatorEpoch: 1,
            tablets: [
              {
                tablet,
                replicas: [L, F],
                leaderAndIsr: { leader, leaderEpoch, isr: [L, F], coordinatorEpoch: 1, version }
              }
            ]
          })
        for (const to of [L, F]) yield* instruct(to, L, 1, 1)
        for (let i = 0; i < 10; i++) {
          yield* servers.server(L).append({ tablet, records: records("r", i * 10, i * 10 + 10), acks: "all" })
        }
        const startOf = (id: number) =>
          Effect.flatMap(servers.server(id).logOf(tablet), (log) =>
            log === undefined ? Effect.succeed(-1) : log.logStartOffset
          )
        // Past the high watermark: refused, naming it; on the follower: NotLeader.
        const past = yield* Effect.flip(servers.server(L).deleteRecords({ tablet, offset: 101 }))
        assert.strictEqual(past.reason._tag, "OffsetOutOfRange")
        const onFollower = yield* Effect.flip(servers.server(F).deleteRecords({ tablet, offset: 10 }))
        assert.strictEqual(onFollower.reason._tag, "NotLeader")
        // Inside a batch: the start is that offset, on the leader and (before the answer) on the follower.
        const answer = yield* servers.server(L).deleteRecords({ tablet, offset: 45 })
        assert.deepStrictEqual(answer, { logStartOffset: 45 })
        assert.deepStrictEqual([yield* startOf(L), yield* startOf(F)], [45, 45])
        const below = yield* Effect.flip(servers.server(L).read({ tablet, offset: 44, maxBytes: 1_000_000 }))
        assert.include(below.message, "44")
        // Below the start again: nothing more goes.
        assert.deepStrictEqual(yield* servers.server(L).deleteRecords({ tablet, offset: 20 }), { logStartOffset: 45 })
        // The follower leads next: what was deleted does not come back.
        for (const to of [L, F]) yield* instruct(to, F, 2, 2)
        const read = yield* servers.server(F).read({ tablet, offset: 45, maxBytes: 1_000_000 })
        assert.strictEqual(read.logStartOffset, 45)
        assert.strictEqual(read.batches[0]?.baseOffset, 45)
        assert.strictEqual(
          yield* Effect.flip(servers.server(F).read({ tablet, offset: 44, maxBytes: 1_000 })).pipe(
            Effect.map((e) => e.reason._tag)
          ),
          "OffsetOutOfRange"
        )
      }).pipe(Effect.scoped)
  )

  it.effect(
    "the Holdings answer carries the server's health: its appends' p99 over the last minute and its ISR shrinks",
    () =>
      Effect.gen(function* () {
        const servers = yield* make({ ...replication, sessionTimeout: 500, replicaLagTimeMax: 1_000 })
        const [L, F] = [1, 2]
        for (const id of [L, F]) yield* servers.start(id)
        // The test is the controller: it commits every ISR change the leader asks for.
        servers.links.adjustIsr = (request) =>
          Effect.succeed<ReplicaManager.AdjustIsrReply>({
            _tag: "IsrAdjusted",
            leaderAndIsr: {
              leader: request.leader,
              leaderEpoch: request.leaderEpoch,
              isr: request.isr,
              coordinatorEpoch: 1,
              version: request.version + 1
            }
          })
        const health = Effect.map(servers.server(L).holdings({ coordinatorEpoch: 1 }), (h) => h.health)
        yield* servers.instruct([L, F], tablet, [L, F], { leader: L, leaderEpoch: 1, isr: [L, F], version: 1 })
        assert.deepStrictEqual(yield* health, { isrShrinks: 0 })
        // Ten appends answered at once (no time passes on the test clock)...
        for (let i = 0; i < 10; i++)
          yield* servers.server(L).append({ tablet, records: records("a", i, i + 1), acks: 1 })
        assert.deepStrictEqual(yield* health, { appendLatencyP99Ms: 0, isrShrinks: 0 })
        // ...and one acks=all append that waits for the follower, cut off: it is answered once the leader drops it from
        // the ISR (replicaLagTimeMax), the ISR's one shrink.
        servers.links.cut.add(`${F}>${L}`)
        const slow = yield* Effect.forkChild(
          servers.server(L).append({ tablet, records: records("b", 0, 1), acks: "all" })
        )
        for (let i = 0; i < 30 && slow.pollUnsafe() === undefined; i++) yield* TestClock.adjust("100 millis")
        yield* Fiber.join(slow)
        const after = yield* health
        assert.strictEqual(after?.isrShrinks, 1)
        assert.isAtLeast(after?.appendLatencyP99Ms ?? 0, 1_000, "the p99 of 11 appends is the slowest one's latency")
        // A minute without appends: no latency to tell; the shrinks stay counted.
        yield* TestClock.adjust("61 seconds")
        assert.deepStrictEqual(yield* health, { isrShrinks: 1 })
      }).pipe(Effect.scoped)
  )
})
