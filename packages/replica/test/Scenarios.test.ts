/**
 * The named failure scenarios of the issue, each played exactly as written:
 * - the seed's: A (epoch 5) wrote 100–110 unreplicated and died; B (epoch 6) wrote 100–105; A returns as follower;
 * - Fluss #674: the new leader's HW is below the old leader's; nothing acknowledged may be truncated away (and the
 *   planted bug, truncating to the HW, loses acknowledged records here);
 * - Fluss #2708: the ISR must not shrink before a dead leader's session ends: the config refuses it, and a leader
 *   cut off past its session is replaced with no tablet left leaderless;
 * - Fluss #644: after a full-cluster restart, one leader per tablet.
 * The first two run tablet servers with the test as their controller (`support/servers.ts`); the last two run the
 * whole-cluster simulator with scripted faults.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as ReplicationConfig from "../src/wire/ReplicationConfig.js"
import type * as TabletServer from "../src/server/TabletServer.js"
import * as Mutants from "./support/mutants.js"
import * as Sim from "./sim/ClusterSim.js"
import { eventually, make, records } from "./support/servers.js"

const tablet = { table: "t", bucket: 0 }
const replication = { minInsyncReplicas: 1, fetchMaxWait: 20, retryBackoff: 10, replicaLagTimeMax: 60_000 }
const range = (prefix: string, from: number, to: number) =>
  Array.from({ length: to - from }, (_, i) => `${prefix}${from + i}`)

describe("named scenarios", () => {
  it.live("the seed's: A returns as follower, truncates to 100 and holds B's 100–105; nothing acked lost", () =>
    Effect.gen(function* () {
      const servers = yield* make(replication)
      const [A, B] = [1, 2]
      yield* servers.start(A)
      yield* servers.start(B)
      yield* servers.instruct([A, B], tablet, [A, B], { leader: A, leaderEpoch: 5, isr: [A, B] })
      // 0–99 acknowledged by both (acks=all), then B stops fetching.
      yield* servers.server(A).append({ tablet, records: records("a", 0, 100), acks: "all" })
      yield* eventually(Effect.map(servers.logValues(B, tablet), (v) => v.length === 100))
      servers.links.cut.add(`${B}>${A}`)
      // A writes 100–110 that nobody else gets (acks=1), and dies.
      yield* servers.server(A).append({ tablet, records: records("a", 100, 111), acks: 1 })
      yield* servers.stop(A)
      // B leads epoch 6 and writes 100–105.
      yield* servers.instruct([B], tablet, [A, B], { leader: B, leaderEpoch: 6, isr: [B] })
      yield* servers.server(B).append({ tablet, records: records("b", 100, 106), acks: "all" })
      // A comes back on its store as B's follower.
      yield* servers.start(A)
      yield* servers.instruct([A], tablet, [A, B], { leader: B, leaderEpoch: 6, isr: [B] })
      const expected = [...range("a", 0, 100), ...range("b", 100, 106)]
      yield* eventually(Effect.map(servers.logValues(A, tablet), (v) => v.length === 106))
      assert.deepStrictEqual(yield* servers.logValues(A, tablet), expected)
      assert.deepStrictEqual(yield* servers.logValues(B, tablet), expected)
      const epochs = yield* (yield* servers.server(A).logOf(tablet))!.epochs
      assert.deepStrictEqual(epochs, [
        { epoch: 5, startOffset: 0 },
        { epoch: 6, startOffset: 100 }
      ])
    }).pipe(Effect.scoped)
  )

  /**
   * Fluss #674. A leads epoch 1 with B and C in its ISR; 0–49 are acknowledged (on all three), but B and C only
   * heard an older HW (10). A dies; B leads epoch 2 with its HW at 10. C, becoming B's follower, asks B where
   * epoch 1 ends (50) and keeps its 50 records; its fetches from B then fail and B dies too; C leads epoch 3. The
   * acknowledged 0–49 must all be on C. Truncating to the HW instead (the planted bug) cuts them to 10.
   */
  const fluss674 = (machines: TabletServer.MachinesShape) =>
    Effect.gen(function* () {
      const servers = yield* make({ ...replication, minInsyncReplicas: 2 })
      const [A, B, C] = [1, 2, 3]
      for (const id of [A, B, C]) yield* servers.start(id, machines)
      servers.links.staleHighWatermark.set(B, 10)
      servers.links.staleHighWatermark.set(C, 10)
      yield* servers.instruct([A, B, C], tablet, [A, B, C], { leader: A, leaderEpoch: 1, isr: [A, B, C] })
      const acked = yield* servers.server(A).append({ tablet, records: records("r", 0, 50), acks: "all" })
      assert.strictEqual(acked.lastOffset, 49)
      yield* eventually(Effect.map(servers.server(A).replicas, (r) => r[0]?.leader?.highWatermark === 50))
      // B and C have all 50 records and have heard HW 10 (the stale answers), not 50.
      const followerHw = (id: number) =>
        Effect.flatMap(servers.server(id).logOf(tablet), (log) =>
          log === undefined ? Effect.succeed(false) : Effect.map(log.highWatermark, (hw) => hw === 10)
        )
      yield* eventually(Effect.zipWith(followerHw(B), followerHw(C), (b, c) => b && c))
      yield* servers.stop(A)
      yield* servers.instruct([B], tablet, [A, B, C], { leader: B, leaderEpoch: 2, isr: [B, C] })
      const leading = (yield* servers.server(B).replicas)[0]?.leader
      assert.strictEqual(leading?.leaderEpoch, 2, "B leads epoch 2")
      assert.strictEqual(leading?.highWatermark, 10, "the new leader's HW starts below the old leader's 50")
      // C follows B: it may ask where epoch 1 ends, but its fetches fail.
      servers.links.cut.add(`${C}>${B}#fetch`)
      const fetchesBefore = servers.links.fetches.length
      yield* servers.instruct([C], tablet, [A, B, C], { leader: B, leaderEpoch: 2, isr: [B, C] })
      // C has settled what to keep (its truncation, if any, is done) once it fetches from B.
      yield* eventually(
        Effect.sync(() => servers.links.fetches.slice(fetchesBefore).some((f) => f.from === C && f.to === B))
      )
      yield* servers.stop(B)
      servers.links.cut.add(`${C}>${B}`)
      yield* servers.instruct([C], tablet, [A, B, C], { leader: C, leaderEpoch: 3, isr: [C] })
      return yield* servers.logValues(C, tablet)
    }).pipe(Effect.scoped)

  it.live("Fluss #674: the new leader's HW is below the old leader's, and nothing acknowledged is truncated away", () =>
    Effect.gen(function* () {
      assert.deepStrictEqual(yield* fluss674(Mutants.production), range("r", 0, 50))
      // The planted bug (Fluss's truncation to the HW) loses acknowledged records in the same scenario.
      assert.deepStrictEqual(yield* fluss674(Mutants.machinesWith(Mutants.truncateToHighWatermark)), range("r", 0, 10))
    })
  )

  it.effect("Fluss #2708: a session timeout at or above replicaLagTimeMax is refused", () =>
    Effect.gen(function* () {
      const e = yield* Effect.flip(ReplicationConfig.decode({ sessionTimeout: 30_000, replicaLagTimeMax: 10_000 }))
      assert.strictEqual(e.option, "replicaLagTimeMax")
    })
  )

  const shape: Sim.Shape = {
    servers: 3,
    coordinators: 2,
    tablets: 3,
    replicationFactor: 3,
    minInsyncReplicas: 2,
    sessionTimeoutMs: 1_000,
    replicaLagTimeMaxMs: 3_000,
    producers: 2
  }

  it.effect("Fluss #2708: a leader cut off past its session is replaced before its ISR shrinks; never leaderless", () =>
    Effect.gen(function* () {
      const result = yield* Sim.run(1, Sim.correct, {
        ...Sim.defaultConfig,
        shape,
        script: [{ step: 20, fault: "pause", target: { leaderOf: 0 }, until: 60 }]
      })
      assert.deepStrictEqual(result.violations, [], Sim.describeFailure(result))
      assert.strictEqual(result.stats.faults.pause, 1)
      assert.strictEqual(result.stats.longestLeaderless, 0)
      assert.isAbove(result.stats.leaderChanges, 3, "the paused leader's tablet changed leader")
    })
  )

  it.effect(
    "KIP-966: the leader dies, then its last ISR member loses its unflushed writes: the eligible replica's log leads, nothing acknowledged lost",
    () =>
      Effect.gen(function* () {
        // Two servers, one tablet on both, minimum ISR 2. s1 leads; s2 never flushes. s1 is killed (its store
        // intact), s2 takes over alone (no append can be acknowledged), then loses power and with it every write it
        // ever made. s2 returns first: a new life with an empty log, not elected. When s1 returns, both are asked for
        // their log ends, and s1's, the longer, leads.
        const result = yield* Sim.run(3, Sim.correct, {
          ...Sim.defaultConfig,
          flushChance: 0,
          logLevel: "Warn",
          shape: { ...shape, servers: 2, coordinators: 1, tablets: 1, replicationFactor: 2 },
          script: [
            { step: 20, fault: "crash", target: "s1", until: 50 },
            { step: 34, fault: "power", target: "s2", until: 40 }
          ]
        })
        assert.deepStrictEqual(result.violations, [], Sim.describeFailure(result))
        assert.isAbove(result.stats.lostWrites, 10, "s2 lost what it held")
        assert.isAbove(result.stats.acked, 10)
        const elected = result.trace.find((l) => l.includes("leads, its log going furthest"))
        assert.isDefined(elected, Sim.describeFailure(result))
        assert.include(elected, "server 1 leads")
      })
  )

  it.effect("Fluss #644: after a full-cluster restart, one leader per tablet and nothing acknowledged lost", () =>
    Effect.gen(function* () {
      const result = yield* Sim.run(2, Sim.correct, {
        ...Sim.defaultConfig,
        shape,
        script: [
          { step: 30, fault: "crash", target: "all", until: 34 },
          { step: 50, fault: "crash", target: "all-servers", until: 51 }
        ]
      })
      assert.deepStrictEqual(result.violations, [], Sim.describeFailure(result))
      assert.strictEqual(result.stats.faults.crash, 3 + 2 + 3)
      assert.isAbove(result.stats.acked, 20)
    })
  )
})
