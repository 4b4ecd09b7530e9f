/**
 * The README's example: count words into a `Table`, commit, and read the counts back.
 * Run it with `./dev exec tsx --conditions=@strata/source packages/tables/examples/quickstart.ts`.
 */
import { MemoryLog, MemoryStore } from "@strata/core"
import { Table, Tables } from "@strata/tables"
import { Effect, Layer, Option, Schema } from "effect"

/** word → count, partitioned like the `words` source topic (4 partitions). */
const counts = Table.make({ name: "word-counts", key: Schema.String, value: Schema.Int, partitions: 4 })

export const program = Effect.gen(function* () {
  const tables = yield* Tables.Tables
  const table = yield* tables.register(counts)
  yield* tables.start
  // The worker was assigned source partition 2: its table partition is restored from the changelog first.
  yield* tables.manager.onPartitionsAssigned([{ topic: "words", partition: 2 }])
  yield* tables.manager.waitUntilRecoveryCompleted

  // Processing source records: each update goes to the changelog (acks all) and to the table's buffer.
  const words = ["to", "be", "or", "not", "to", "be"]
  for (const [offset, word] of words.entries()) {
    yield* tables.process(
      { topic: "words", partition: 2, offset },
      table.update(word, (n) => Option.getOrElse(n, () => 0) + 1)
    )
  }
  // Committing the source partition writes the buffered counts and both offsets to the store in one batch.
  yield* tables.manager.onCommit([{ topic: "words", partition: 2, offset: words.length }])
  return yield* table.entries(2)
}).pipe(Effect.scoped)

/** The embedded default: memory store and log. Swap in LevelStore/RocksDbStore and KafkaLog layers. */
export const layer = Tables.layer({ app: "quickstart", settleDelay: 0 }).pipe(
  Layer.provideMerge(Layer.mergeAll(MemoryStore.layer(), MemoryLog.layer()))
)

if (import.meta.url === `file://${process.argv[1]}`) {
  Effect.runPromise(program.pipe(Effect.provide(layer))).then((entries) => console.log(entries))
}
