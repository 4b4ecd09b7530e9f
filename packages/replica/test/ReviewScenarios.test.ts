/**
 * The review's scenarios (issue 32), each played exactly as written on tablet servers with the test as their
 * controller (`support/servers.ts`), each with the planted bug that brings its loss back.
 */
import { MemoryCoordination } from "@strata/core"
import type * as ReplicaManager from "../src/protocol/ReplicaManager.js"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Random } from "effect"
import * as LocalCluster from "../src/node/LocalCluster.js"
import * as TabletClient from "../src/client/TabletClient.js"
import type * as TabletServer from "../src/server/TabletServer.js"
import * as Mutants from "./support/mutants.js"
import { eventually, make, records } from "./support/servers.js"

const tablet = { table: "t", bucket: 0 }
// Long polls that only an append ends, and no ISR shrink while the scenario plays.
const replication = { minInsyncReplicas: 1, fetchMaxWait: 20_000, retryBackoff: 10, replicaLagTimeMax: 60_000 }

describe("review scenarios", () => {
  /**
   * Defect 1. L leads epoch 1; F has copied L's unacknowledged tail [5,8) and long-polls L at 8; M (lagging at 5)
   * leads epoch 2 and writes [5,10); L becomes M's follower, truncates to 5 and copies M's records, and that append
   * wakes F's poll. Answered, F would append M's [8,10) after L's stale [5,8), and the end-offset exchange of epoch 2
   * would find nothing to truncate: F and M diverge. L must refuse the woken poll (it no longer leads epoch 1).
   */
  const demotedLongPoll = (machines: TabletServer.MachinesShape) =>
    Effect.gen(function* () {
      const servers = yield* make(replication)
      const [L, F, M] = [1, 2, 3]
      for (const id of [L, F, M]) yield* servers.start(id, machines)
      const fetchesOf = (from: number, to: number, offset?: number) =>
        servers.links.fetches.filter(
          (f) => f.from === from && f.to === to && (offset === undefined || f.offset === offset)
        ).length
      yield* servers.instruct([L, F, M], tablet, [L, F, M], { leader: L, leaderEpoch: 1, isr: [L, F, M] })
      yield* servers.server(L).append({ tablet, records: records("a", 0, 5), acks: "all" })
      servers.links.cut.add(`${M}>${L}`)
      yield* servers.server(L).append({ tablet, records: records("a", 5, 8), acks: 1 })
      // F holds [0,8) and its poll at 8 is waiting on L.
      yield* eventually(Effect.sync(() => fetchesOf(F, L, 8) > 0))
      assert.strictEqual((yield* servers.logValues(F, tablet)).length, 8)
      assert.strictEqual((yield* servers.logValues(M, tablet)).length, 5)
      yield* servers.instruct([M], tablet, [L, F, M], { leader: M, leaderEpoch: 2, isr: [L, F, M] })
      yield* servers.server(M).append({ tablet, records: records("m", 5, 8), acks: 1 })
      yield* servers.server(M).append({ tablet, records: records("m", 8, 10), acks: 1 })
      const before = fetchesOf(F, L)
      yield* servers.instruct([L], tablet, [L, F, M], { leader: M, leaderEpoch: 2, isr: [L, F, M] })
      yield* eventually(Effect.map(servers.logValues(L, tablet), (v) => v.length === 10))
      // F's woken poll has been answered (or refused) and F has fetched again.
      yield* eventually(Effect.sync(() => fetchesOf(F, L) > before))
      yield* servers.instruct([F], tablet, [L, F, M], { leader: M, leaderEpoch: 2, isr: [L, F, M] })
      yield* eventually(Effect.sync(() => fetchesOf(F, M, 10) > 0))
      return { f: yield* servers.logValues(F, tablet), m: yield* servers.logValues(M, tablet) }
    }).pipe(Effect.scoped)

  it.live("defect 1: a long poll woken after its leader was demoted is refused; F ends with M's log", () =>
    Effect.gen(function* () {
      const { f, m } = yield* demotedLongPoll(Mutants.production)
      assert.deepStrictEqual(m, ["a0", "a1", "a2", "a3", "a4", "m5", "m6", "m7", "m8", "m9"])
      assert.deepStrictEqual(f, m)
    })
  )

  it.live("defect 1, planted (answering the woken poll unchecked): F diverges from its leader", () =>
    Effect.gen(function* () {
      const { f, m } = yield* demotedLongPoll(Mutants.machinesWith(Mutants.skipFetchRevalidation))
      assert.notDeepEqual(f, m)
      assert.deepStrictEqual(f.slice(5, 8), ["a5", "a6", "a7"])
    })
  )

  it.live("a fetch whose last fetched epoch ends earlier on the leader is answered Diverging", () =>
    Effect.gen(function* () {
      const servers = yield* make(replication)
      yield* servers.start(1)
      yield* servers.instruct([1], tablet, [1], { leader: 1, leaderEpoch: 1, isr: [1] })
      yield* servers.server(1).append({ tablet, records: records("a", 0, 5), acks: 1 })
      yield* servers.instruct([1], tablet, [1], { leader: 1, leaderEpoch: 3, isr: [1] })
      yield* servers.server(1).append({ tablet, records: records("b", 5, 7), acks: 1 })
      const fetch = (offset: number, lastFetchedEpoch: number | undefined) =>
        servers.server(1).fetch({
          tablet,
          follower: 2,
          leaderEpoch: 3,
          offset,
          ...(lastFetchedEpoch === undefined ? {} : { lastFetchedEpoch }),
          maxBytes: 1 << 20
        })
      // Epoch 1 ends at 5 here: a follower past 5 in epoch 1 diverges.
      assert.deepStrictEqual(yield* fetch(8, 1), { _tag: "Diverging", leaderEpoch: 3, epoch: 1, endOffset: 5 })
      // An epoch this log never had (2): the largest below it is 1, ending at 5.
      assert.deepStrictEqual(yield* fetch(6, 2), { _tag: "Diverging", leaderEpoch: 3, epoch: 1, endOffset: 5 })
      // An epoch past the leader's: it answers its own latest, ending at its log end.
      assert.deepStrictEqual(yield* fetch(7, 9), { _tag: "Diverging", leaderEpoch: 3, epoch: 3, endOffset: 7 })
      // Agreeing fetches are answered with batches.
      assert.strictEqual((yield* fetch(5, 1))._tag, "Batches")
      assert.strictEqual((yield* fetch(6, 3))._tag, "Batches")
      assert.strictEqual((yield* fetch(0, undefined))._tag, "Batches")
    }).pipe(Effect.scoped)
  )

  /**
   * Defect 2. L leads with ISR [L,M] at version 10, min ISR 2. F catches up and L proposes P1 (expand F, against
   * version 10); the controller commits it as version 11 but its answer is slow. The controller then drops F itself
   * (version 12); F fetches again and L proposes P2 (expand F, against 12), counting F in the HW while it is
   * pending. F falls behind at 3; P1's late answer arrives; L appends up to 7 and M copies it; P2 is committed
   * (version 13). Every ISR member must hold everything below the HW: a leader whose stale answer cleared P2 has
   * advanced its HW to 7 over [L,M] and now has F, at 3, in its ISR.
   */
  const staleIsrAnswer = (machines: TabletServer.MachinesShape) =>
    Effect.gen(function* () {
      const servers = yield* make({ ...replication, minInsyncReplicas: 2, fetchMaxWait: 20 })
      const [L, F, M] = [1, 2, 3]
      for (const id of [L, F, M]) yield* servers.start(id, machines)
      const proposals: Array<{
        request: ReplicaManager.AdjustIsrRequest
        answer: Deferred.Deferred<ReplicaManager.AdjustIsrReply>
      }> = []
      servers.links.adjustIsr = (request) =>
        Effect.suspend(() => {
          const answer = Deferred.makeUnsafe<ReplicaManager.AdjustIsrReply>()
          proposals.push({ request, answer })
          return Deferred.await(answer)
        })
      const committed = (isr: ReadonlyArray<number>, version: number): ReplicaManager.AdjustIsrReply => ({
        _tag: "IsrAdjusted",
        leaderAndIsr: { leader: L, leaderEpoch: 1, isr, version, coordinatorEpoch: 1 }
      })
      const leaderView = Effect.map(servers.server(L).replicas, (r) => r[0]?.leader)
      yield* servers.instruct([L, F, M], tablet, [L, F, M], { leader: L, leaderEpoch: 1, isr: [L, M], version: 10 })
      yield* servers.server(L).append({ tablet, records: records("a", 0, 3), acks: "all" })
      yield* eventually(Effect.sync(() => proposals.length === 1))
      const p1 = proposals[0]!
      assert.deepStrictEqual([p1.request.isr, p1.request.version], [[L, M, F], 10])
      // The controller drops F itself; F fetches again and L proposes P2.
      yield* servers.instruct([L], tablet, [L, F, M], { leader: L, leaderEpoch: 1, isr: [L, M], version: 12 })
      yield* eventually(Effect.sync(() => proposals.length === 2))
      const p2 = proposals[1]!
      assert.deepStrictEqual([p2.request.isr, p2.request.version], [[L, M, F], 12])
      servers.links.cut.add(`${F}>${L}`)
      yield* Deferred.succeed(p1.answer, committed([L, M, F], 11))
      yield* servers.server(L).append({ tablet, records: records("a", 3, 7), acks: 1 })
      // M has copied everything and L has seen it fetch at 7 (a second fetch there: the first was handled).
      const fetchesAt7 = () => servers.links.fetches.filter((f) => f.from === M && f.to === L && f.offset === 7).length
      yield* eventually(Effect.sync(() => fetchesAt7() >= 2))
      yield* Deferred.succeed(p2.answer, committed([L, M, F], 13))
      yield* eventually(Effect.map(leaderView, (l) => l?.isr.includes(F) === true))
      const leader = (yield* leaderView)!
      const held = (yield* servers.logValues(F, tablet)).length
      const outcome = { highWatermark: leader.highWatermark, isr: leader.isr, fHolds: held }
      // F comes back and catches up: then the HW passes 3.
      servers.links.cut.delete(`${F}>${L}`)
      yield* eventually(Effect.map(leaderView, (l) => l?.highWatermark === 7))
      return outcome
    }).pipe(Effect.scoped)

  it.live("defect 2: a late answer to an earlier ISR proposal leaves the pending one pending", () =>
    Effect.gen(function* () {
      const { highWatermark, isr, fHolds } = yield* staleIsrAnswer(Mutants.production)
      assert.deepStrictEqual(isr, [1, 3, 2])
      assert.isAtMost(highWatermark, fHolds, "every ISR member holds everything below the HW")
    })
  )

  it.live("defect 2, planted (any answer clears the pending change): an ISR member holds less than the HW", () =>
    Effect.gen(function* () {
      const { highWatermark, fHolds } = yield* staleIsrAnswer(Mutants.machinesWith(Mutants.answersIgnoreProposal))
      assert.isAbove(highWatermark, fHolds)
    })
  )

  /**
   * Defect 3. Two clients whose random draws are the same. With a random producer id both would stamp their first
   * batch (epoch 0, sequence 0, one record) with the same id, and the tablet would answer the second `Duplicate`
   * with the first's offsets: acknowledged, never written. The controller hands out ids, so both are written.
   */
  it.live("defect 3: two clients drawing the same random numbers both have their first record written", () =>
    Effect.gen(function* () {
      const cluster = yield* LocalCluster.make({
        servers: 2,
        transport: "tcp",
        replication: { replicationFactor: 2, minInsyncReplicas: 1, retryBackoff: 20, fetchMaxWait: 50 }
      })
      yield* cluster.createTable("ids", { buckets: 1 })
      const ids = { table: "ids", bucket: 0 }
      yield* cluster.awaitTablet(ids, (t) => t.leaderAndIsr.leader !== null)
      const client = TabletClient.make({ retryBackoff: 20 }).pipe(Random.withSeed(7))
      const a = yield* client
      const b = yield* client
      const sentA = yield* a.send(ids, records("a", 0, 1))
      const sentB = yield* b.send(ids, records("b", 0, 1))
      assert.notStrictEqual(sentB.baseOffset, sentA.baseOffset)
      const read = yield* a.read(ids, 0)
      assert.deepStrictEqual(
        read.batches.flatMap((batch) => batch.records.map((r) => new TextDecoder().decode(r.value))),
        ["a0", "b0"]
      )
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )
})
