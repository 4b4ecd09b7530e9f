import { assert, describe, it } from "@effect/vitest"
import { Planner } from "@strata/rebalance"
import { Effect } from "effect"
import * as PlanReport from "../src/PlanReport.js"

const tablet = (bucket: number, replicas: ReadonlyArray<number>, state = "OnlineTablet" as const) => ({
  tablet: { table: "orders", bucket },
  replicas,
  state,
  leader: replicas[0]!,
  leaderEpoch: 1,
  isr: replicas
})

describe("strata rebalance plan's report", () => {
  it.effect("the model lists the registered servers, and one holding replicas but not registered as excluded", () =>
    Effect.gen(function* () {
      const model = PlanReport.modelOf({
        coordinatorEpoch: 3,
        servers: [
          { id: 1, address: "a:1", rack: "r1" },
          { id: 2, address: "a:2" },
          { id: 4, address: "a:4" }
        ],
        tablets: [tablet(0, [1, 2]), tablet(1, [2, 3]), { ...tablet(2, [1, 3]), state: "DeletingTablet" as const }]
      })
      assert.deepStrictEqual(model.servers, [
        { id: 1, rack: "r1" },
        { id: 2 },
        { id: 4 },
        { id: 3, tags: ["excluded"] }
      ])
      assert.deepStrictEqual(
        model.tablets.map((t) => t.tablet.bucket),
        [0, 1]
      )
      // Server 4 is new: one of the four replicas moves onto it, none onto server 3.
      const plan = yield* Planner.plan(model)
      assert.strictEqual(plan.figures.replicaMoves, 1)
      assert.strictEqual(plan.moves[0]?.to, 4)
      const text = PlanReport.lines(model, plan)
      assert.match(text[0]!, /^orders:\d\t\[\d,\d\] -> \[\d,\d\]\tleader \d -> \d$/)
      assert.include(text.join("\n"), "replica moves 1, lower bound 1, moves/LB 1.000")
      assert.include(text.join("\n"), "not registered, given nothing new: servers 3")
      assert.strictEqual(text[text.length - 1], "nothing was changed (a plan only)")
    })
  )
})
