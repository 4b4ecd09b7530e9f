/**
 * The README's example: a partition store on LevelDB whose records and
 * changelog offset land in one atomic batch.
 * Run it with `./dev exec tsx --conditions=@strata/source packages/store-adapters/examples/quickstart.ts`.
 */
import { Store } from "@strata/core"
import * as LevelStore from "@strata/store-adapters/level"
import { Effect, Option } from "effect"

export const program = Effect.gen(function* () {
  const store = yield* Store.Store
  const orders = yield* store.open({ table: "orders", partition: 3 }) // closed with the scope
  const tp = { topic: "app-orders-changelog", partition: 3 }
  // The records and the changelog offset they cover land in one atomic batch.
  yield* orders.write([Store.put(Buffer.from("order-1"), Buffer.from('{"qty":2}'))], {
    offsets: [{ ...tp, offset: 41 }]
  })
  return yield* orders.persistedOffset(tp) // Option.some(41), also after a crash and restart
}).pipe(Effect.scoped)

if (import.meta.url === `file://${process.argv[1]}`) {
  Effect.runPromise(program.pipe(Effect.provide(LevelStore.layer({ directory: ".strata-data/worker-1" })))).then(
    (offset) => console.log(Option.getOrUndefined(offset))
  )
}
