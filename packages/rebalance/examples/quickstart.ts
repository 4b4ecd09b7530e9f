/**
 * The README's example: the planner's plan when two servers join three.
 * Run it with `./dev exec tsx --conditions=@strata/source packages/rebalance/examples/quickstart.ts`.
 */
import { Planner } from "@strata/rebalance"
import { Effect } from "effect"

// Three servers in three racks hold six tablets (RF 2); two servers join, one in a new rack.
const servers = [
  { id: 1, rack: "a" },
  { id: 2, rack: "b" },
  { id: 3, rack: "c" },
  { id: 4, rack: "a" },
  { id: 5, rack: "d" }
]
const tablets = Array.from({ length: 6 }, (_, bucket) => {
  const replicas = [(bucket % 3) + 1, ((bucket + 1) % 3) + 1]
  return { tablet: { table: "orders", bucket }, replicas, leader: replicas[0]!, sizeBytes: 1_000_000 * (bucket + 1) }
})

export const program = Effect.gen(function* () {
  const plan = yield* Planner.plan({ servers, tablets })
  for (const change of plan.changes) {
    yield* Effect.log(
      `${change.tablet.table}/${change.tablet.bucket}: [${change.from}] → [${change.to}], leader ${change.leaderTo}`
    )
  }
  const f = plan.figures
  yield* Effect.log(`${f.replicaMoves} replica moves (lower bound ${f.lowerBound}), ${f.leaderMoves} leadership moves`)
  return plan
})

if (import.meta.url === `file://${process.argv[1]}`) {
  Effect.runPromise(program)
}
