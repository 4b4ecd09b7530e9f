/**
 * The warm controller view: a new controller reads only the tablets written since its coordinator's view last
 * caught up (the journal, written atomically with the tablets), all of them when the view fell behind the journal's
 * reach or has none, and a journal that cannot be read is refused naming its path.
 */
import { Coordination, MemoryCoordination, type Models } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { CoordinationElection } from "@strata/election"
import { Effect, Exit, Scope } from "effect"
import * as ClusterPaths from "../src/wire/ClusterPaths.js"
import * as Controller from "../src/server/Controller.js"
import * as ControllerView from "../src/server/ControllerView.js"
import { eventually } from "./support/servers.js"

const namespace = "/view"

/** Tablet servers that are never reached: these tablets have no live replica. */
const nobody: Controller.TabletServersShape = {
  leaderAndIsr: () => Effect.void,
  logEnd: () => Effect.succeed({ lastEpoch: null, logEndOffset: 0 }),
  holdings: () => Effect.succeed({ tablets: [] }),
  stopReplica: () => Effect.void
}

const specs = (table: string, count: number) =>
  Array.from({ length: count }, (_, bucket) => ({
    tablet: { table, bucket },
    replicas: [1, 2] as ReadonlyArray<Models.ServerId>
  }))

describe("ControllerView", () => {
  it.live("a new controller starts from the warm view, reading only what was written since it caught up", () =>
    Effect.gen(function* () {
      const election = yield* CoordinationElection.make({
        namespace: "view",
        sessionTimeout: "2 seconds",
        replicaLagTimeMax: "6 seconds"
      })
      const warm = yield* ControllerView.make({ namespace, keepWarm: { retryBackoff: 10 } })
      /** A controller under a new leadership in its own scope, started from `view` (a cold one when not given). */
      const control = (view?: ControllerView.ControllerView) =>
        Effect.gen(function* () {
          const scope = yield* Scope.make()
          const leadership = yield* Scope.provide(election.campaign({ serverId: 1, address: "a" }), scope)
          const controller = yield* Controller.make(leadership, {
            namespace,
            uncleanLeaderElection: false,
            minInsyncReplicas: 1,
            retryBackoff: 10,
            resign: Effect.void,
            ...(view === undefined ? {} : { view })
          }).pipe(Effect.provideService(Controller.TabletServers, nobody), Scope.provide(scope))
          return { controller, close: Scope.close(scope, Exit.void) }
        })

      const first = yield* control(warm)
      assert.deepStrictEqual(first.controller.resumed, { tablets: 0, read: 0, full: true })
      // 300 tablets in one request: six writes of 50, each with its journal entry.
      const created = yield* first.controller.createTablets(specs("orders", 300))
      assert.strictEqual(created._tag, "Created")
      yield* eventually(Effect.map(warm.stats, (s) => s.seq === 6 && s.tablets === 300))
      const caughtUp = yield* warm.stats
      // The late table is kept a minute: its retention is stored with each tablet.
      const minute = { ms: 60_000 }
      yield* first.controller.createTablets(specs("late", 4).map((spec) => ({ ...spec, retention: minute })))
      yield* first.close

      // The standby's view read each tablet about once while the first controller wrote; taking over reads the four
      // written since (or none, if the watch was quicker).
      assert.isAtMost(caughtUp.tabletReads, 2 * 300)
      const second = yield* control(warm)
      assert.strictEqual(second.controller.resumed.tablets, 304)
      assert.isFalse(second.controller.resumed.full)
      assert.isAtMost(second.controller.resumed.read, 4)
      const resumed = (yield* second.controller.state).tablets
      assert.strictEqual(resumed.size, 304)
      // The new controller has each tablet's retention as it was created: the late table's, none for the others.
      const late = [...resumed.values()].filter((t) => t.tablet.table === "late")
      assert.deepStrictEqual(
        late.map((t) => t.retention),
        [minute, minute, minute, minute]
      )
      assert.isTrue([...resumed.values()].every((t) => t.tablet.table === "late" || t.retention === undefined))
      // A cold start reads every tablet.
      const cold = yield* ControllerView.make({ namespace })
      const session = yield* (yield* Coordination.Coordination).session()
      const all = yield* cold.sync(session)
      assert.deepStrictEqual([all.tablets.length, all.read, all.full], [304, 304, true])
      assert.strictEqual(all.tablets.filter((t) => t.retention?.ms === 60_000).length, 4)

      // More writes than the journal keeps while a view does not watch: it reads everything again.
      yield* second.controller.createTablets(specs("bulk", ClusterPaths.journalLimit + 50))
      const behind = yield* cold.sync(session)
      assert.isTrue(behind.full)
      assert.strictEqual(behind.tablets.length, 304 + ClusterPaths.journalLimit + 50)
      // Within its reach, only the tablets written since.
      yield* second.controller.createTablets(specs("more", 7))
      const near = yield* cold.sync(session)
      assert.deepStrictEqual(
        [near.full, near.read, near.tablets.length],
        [false, 7, 304 + ClusterPaths.journalLimit + 57]
      )
      // What every view holds is what coordination holds.
      const sorted = (s: ControllerView.Synced) => s.tablets.map((t) => JSON.stringify(t)).sort()
      assert.deepStrictEqual(sorted(yield* warm.sync(session)), sorted(near))
      yield* second.close
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )

  it.live("a journal that is not one is refused, naming its path; nothing is written", () =>
    Effect.gen(function* () {
      const session = yield* (yield* Coordination.Coordination).session()
      const paths = ClusterPaths.make(namespace)
      yield* session.create(paths.changes, new TextEncoder().encode("{not json"), { createParents: true })
      const view = yield* ControllerView.make({ namespace })
      const error = yield* Effect.flip(view.sync(session))
      assert.strictEqual(error._tag, "CorruptClusterData")
      assert.include(error.message, paths.changes)
      assert.strictEqual(new TextDecoder().decode((yield* session.get(paths.changes)).data), "{not json")
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )

  it("the journal keeps its latest entries within its limit and tells what was written since a sequence number", () => {
    let journal = ClusterPaths.emptyJournal
    for (let i = 0; i < 30; i++) journal = ClusterPaths.journalAppend(journal, [`t:${i}`, `u:${i}`])
    assert.strictEqual(journal.seq, 30)
    assert.deepStrictEqual(ClusterPaths.journalSince(journal, 30), [])
    assert.deepStrictEqual(ClusterPaths.journalSince(journal, 28), ["t:28", "u:28", "t:29", "u:29"])
    assert.strictEqual(ClusterPaths.journalSince(journal, 31), undefined, "a sequence number the journal never had")
    for (let i = 30; i < 30 + ClusterPaths.journalLimit; i++) journal = ClusterPaths.journalAppend(journal, [`t:${i}`])
    const kept = journal.recent.reduce((n, [, names]) => n + names.length, 0)
    assert.isAtMost(kept, ClusterPaths.journalLimit)
    assert.strictEqual(ClusterPaths.journalSince(journal, 28), undefined, "beyond its reach")
    const oldest = journal.recent[0]![0]
    assert.deepStrictEqual(ClusterPaths.journalSince(journal, oldest - 1)?.length, kept)
  })
})
