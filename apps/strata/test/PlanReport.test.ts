import { assert, describe, it } from "@effect/vitest"
import { Planner } from "@strata/rebalance"
import { Effect } from "effect"
import * as PlanReport from "../src/PlanReport.js"

const tablet = (bucket: number, replicas: ReadonlyArray<number>, sizeBytes?: number) => ({
  tablet: { table: "orders", bucket },
  replicas,
  leader: replicas[0]!,
  ...(sizeBytes === undefined ? {} : { sizeBytes })
})

describe("strata rebalance plan's report", () => {
  it.effect(
    "the model keeps the controller's servers (an unregistered one excluded) and tablets with their sizes",
    () =>
      Effect.gen(function* () {
        const model = PlanReport.modelOf({
          coordinatorEpoch: 3,
          servers: [{ id: 1, rack: "r1" }, { id: 2 }, { id: 4 }, { id: 3, tags: ["excluded"] }],
          tablets: [tablet(0, [1, 2], 2048), tablet(1, [2, 3], 1024)],
          sizesMissing: 0
        })
        assert.deepStrictEqual(model.servers, [
          { id: 1, rack: "r1" },
          { id: 2 },
          { id: 4 },
          { id: 3, tags: ["excluded"] }
        ])
        assert.deepStrictEqual(
          model.tablets.map((t) => [t.tablet.bucket, t.sizeBytes]),
          [
            [0, 2048],
            [1, 1024]
          ]
        )
        // Server 4 is new: one of the four replicas moves onto it, none onto server 3; the bytes goal moves the smaller.
        const plan = yield* Planner.plan(model)
        assert.strictEqual(plan.figures.replicaMoves, 1)
        assert.strictEqual(plan.moves[0]?.to, 4)
        assert.strictEqual(plan.figures.bytesMoved, 1024)
        const text = PlanReport.lines(model, plan)
        assert.match(text[0]!, /^orders:\d\t\[\d,\d\] -> \[\d,\d\]\tleader \d -> \d$/)
        const all = text.join("\n")
        assert.include(all, "replica moves 1, lower bound 1, moves/LB 1.000")
        assert.include(all, "bytes moved 1.0 KiB (1024 B)")
        assert.include(all, "not registered, given nothing new: servers 3")
        assert.notInclude(all, "have no size")
        assert.strictEqual(text[text.length - 1], "nothing was changed (a plan only)")
      })
  )

  it.effect("bytes per server before and after follow the plan's replicas; tablets without a size are counted", () =>
    Effect.gen(function* () {
      // Servers 1 and 2 hold everything, 3 is empty: one replica of each tablet goes to 3, the 4 KiB one among them.
      const model = PlanReport.modelOf({
        coordinatorEpoch: 1,
        servers: [{ id: 1 }, { id: 2 }, { id: 3 }],
        tablets: [tablet(0, [1, 2], 4096), tablet(1, [1, 2], 1024), tablet(2, [1, 2]), tablet(3, [1, 2])],
        sizesMissing: 2
      })
      const plan = yield* Planner.plan(model)
      const bytes = PlanReport.bytesOf(model, plan)!
      assert.deepStrictEqual([bytes.before.min, bytes.before.max], [0, 5120])
      assert.strictEqual(bytes.sizesMissing, 2)
      assert.strictEqual(bytes.moved, plan.figures.bytesMoved)
      // Whatever moved leaves its source and lands on 3: the bytes held in all stay 2 × 5120.
      assert.strictEqual(bytes.after.mean * 3, 2 * 5120)
      const all = PlanReport.lines(model, plan).join("\n")
      assert.include(all, "bytes per server: before min 0 B max 5.0 KiB")
      assert.include(all, "2 of 4 tablets have no size (no server told it in time): counted as 0 B")
      const json = JSON.parse(JSON.stringify(PlanReport.json(model, plan)))
      assert.strictEqual(json.sizesMissing, 2)
      assert.strictEqual(json.bytes.moved, plan.figures.bytesMoved)
      assert.deepStrictEqual(
        json.model.tablets.map((t: { readonly sizeBytes?: number }) => t.sizeBytes ?? null),
        [4096, 1024, null, null]
      )
    })
  )

  it.effect("without any size the report says the bytes were not planned, and the JSON has no bytes figures", () =>
    Effect.gen(function* () {
      const model = PlanReport.modelOf({
        coordinatorEpoch: 1,
        servers: [{ id: 1 }, { id: 2 }],
        tablets: [tablet(0, [1]), tablet(1, [1])],
        sizesMissing: 2
      })
      const plan = yield* Planner.plan(model)
      assert.include(
        PlanReport.lines(model, plan).join("\n"),
        "no tablet's size is known (2 tablets): bytes not planned"
      )
      assert.isUndefined(PlanReport.bytesOf(model, plan))
      assert.strictEqual(PlanReport.json(model, plan).bytes, null)
    })
  )
})
