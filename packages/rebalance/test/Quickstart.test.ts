import { assert, it } from "@effect/vitest"
import { Effect } from "effect"
import { program } from "../examples/quickstart.js"

it.effect("the README example plans the two new servers onto exact balance with the fewest moves", () =>
  Effect.gen(function* () {
    const plan = yield* program
    // 12 replicas on 5 servers: 2 or 3 each; the three old servers held 4 each, so 4 moves at least.
    assert.strictEqual(plan.figures.lowerBound, 4)
    assert.strictEqual(plan.figures.replicaMoves, 4)
    assert.strictEqual(plan.figures.replicas.after.max - plan.figures.replicas.after.min, 1)
    assert.strictEqual(plan.figures.leaders.after.max - plan.figures.leaders.after.min, 1)
    for (const change of plan.changes) assert.strictEqual(change.to[0], change.leaderTo)
  })
)
