import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { Planner } from "../src/index.js"

const tablet = (bucket: number, replicas: ReadonlyArray<number>, sizeBytes = 0) => ({
  tablet: { table: "t", bucket },
  replicas,
  leader: replicas[0]!,
  sizeBytes
})

/** The reason of a failed plan: its tag and message. */
const refused = (model: unknown, options?: Planner.Options) =>
  Effect.flip(Planner.plan(model, options)).pipe(Effect.map((e) => ({ tag: e.reason._tag, message: e.message })))

describe("Planner: bad input", () => {
  it.effect("a model that is not one is InvalidModel naming the field", () =>
    Effect.gen(function* () {
      const servers = [{ id: 1 }, { id: 2 }]
      const cases: ReadonlyArray<readonly [unknown, string]> = [
        [{ servers, tablets: [tablet(0, [1, 3])] }, "tablets[0].replicas[1]"],
        [{ servers, tablets: [tablet(0, [1, 1])] }, "tablets[0].replicas[1]"],
        [{ servers: [{ id: 1 }, { id: 1 }], tablets: [] }, "servers[1].id"],
        [{ servers, tablets: [tablet(0, [1]), tablet(0, [2])] }, "tablets[1].tablet"],
        [{ servers, tablets: [{ ...tablet(0, [1]), leader: 2 }] }, "tablets[0].leader"],
        [{ servers, tablets: [tablet(0, [])] }, "tablets[0].replicas"],
        [{ servers: [{ id: -1 }], tablets: [] }, "servers[0].id"],
        [{ servers: [{ id: 1, tags: ["gone"] }], tablets: [] }, "servers[0].tags[0]"],
        [{ servers, tablets: [{ ...tablet(0, [1]), sizeBytes: -5 }] }, "tablets[0].sizeBytes"],
        [{ servers }, "tablets"]
      ]
      for (const [model, field] of cases) {
        const r = yield* refused(model)
        assert.strictEqual(r.tag, "InvalidModel", JSON.stringify(model))
        assert.include(r.message, `invalid planner input: ${field}:`, JSON.stringify(model))
      }
      const goals = yield* refused({ servers, tablets: [] }, { goals: ["speed" as Planner.Goal] })
      assert.strictEqual(goals.tag, "InvalidModel")
      assert.include(goals.message, "options.goals[0]")
    })
  )

  it.effect("a tablet no placement can hold is PlanInfeasible naming it", () =>
    Effect.gen(function* () {
      const r = yield* refused({
        servers: [{ id: 1 }, { id: 2, tags: ["draining"] }],
        tablets: [tablet(0, [1]), tablet(7, [1, 2])]
      })
      assert.strictEqual(r.tag, "PlanInfeasible")
      assert.include(r.message, "tablet t/7")
    })
  )
})

describe("Planner: the hard rules and goals", () => {
  it.effect("a draining server ends empty, its replicas spread over the others", () =>
    Effect.gen(function* () {
      const servers = [{ id: 1 }, { id: 2 }, { id: 3 }, { id: 4, tags: ["draining" as const] }]
      const tablets = Array.from({ length: 6 }, (_, b) => tablet(b, [(b % 3) + 1, 4]))
      const plan = yield* Planner.plan({ servers, tablets })
      assert.strictEqual(plan.figures.replicaMoves, 6)
      assert.strictEqual(plan.figures.lowerBound, 6)
      for (const c of plan.changes) assert.notInclude(c.to, 4)
      assert.deepStrictEqual([plan.figures.replicas.after.min, plan.figures.replicas.after.max], [4, 4])
    })
  )

  it.effect("an excluded server takes no new replica; a rack never holds two of a tablet's", () =>
    Effect.gen(function* () {
      const servers = [
        { id: 1, rack: "a" },
        { id: 2, rack: "a" },
        { id: 3, rack: "b" },
        { id: 4, rack: "b", tags: ["excluded" as const] }
      ]
      // Both replicas of every tablet on rack a: each must move one to rack b, where only server 3 may take it.
      const tablets = Array.from({ length: 4 }, (_, b) => tablet(b, [1, 2]))
      const plan = yield* Planner.plan({ servers, tablets })
      for (const c of plan.changes) {
        assert.include(c.to, 3)
        assert.notInclude(c.to, 4)
      }
      assert.strictEqual(plan.figures.replicaMoves, 4)
      // Server 3 holds 4 of 8 replicas where 2 is the balanced count: 2 above it, which the rules force.
      assert.strictEqual(plan.figures.replicasAboveTarget, 2)
    })
  )

  it.effect("the smallest tablets move, onto the server with the fewest bytes, when moves tie", () =>
    Effect.gen(function* () {
      const servers = [{ id: 1 }, { id: 2 }, { id: 3 }]
      const tablets = [tablet(0, [1], 500), tablet(1, [1], 10), tablet(2, [1], 900), tablet(3, [2], 0)]
      const plan = yield* Planner.plan({ servers, tablets }, { goals: ["replica-count", "bytes"] })
      // 4 replicas on 3 servers: server 1 sheds one of its three, the smallest (tablet 1), to server 3.
      assert.strictEqual(plan.figures.replicaMoves, 1)
      assert.deepStrictEqual(
        plan.moves.map((m) => [m.tablet.bucket, m.from, m.to]),
        [[1, 1, 3]]
      )
      assert.strictEqual(plan.figures.bytesMoved, 10)
    })
  )

  it.effect("without the replica-count goal only the hard rules move anything; the same model, the same plan", () =>
    Effect.gen(function* () {
      const servers = [{ id: 1 }, { id: 2 }, { id: 3, tags: ["draining" as const] }]
      const tablets = [tablet(0, [1]), tablet(1, [1]), tablet(2, [3])]
      const plan = yield* Planner.plan({ servers, tablets }, { goals: ["leader"] })
      assert.strictEqual(plan.figures.replicaMoves, 1)
      assert.deepStrictEqual(plan.moves[0]?.to, 2)
      const again = yield* Planner.plan({ servers, tablets }, { goals: ["leader"] })
      assert.deepStrictEqual(again, plan)
    })
  )

  it.effect("a balanced cluster needs no move", () =>
    Effect.gen(function* () {
      const servers = [{ id: 1 }, { id: 2 }, { id: 3 }]
      const tablets = [tablet(0, [1, 2]), tablet(1, [2, 3]), tablet(2, [3, 1])]
      const plan = yield* Planner.plan({ servers, tablets })
      assert.deepStrictEqual(plan.changes, [])
      assert.strictEqual(plan.figures.lowerBound, 0)
      assert.strictEqual(plan.figures.movesPerLowerBound, 1)
    })
  )
})
