/**
 * The README's Worker example: an agent counts the words of a source topic into a table; the worker joins the
 * consumer group, restores the table, processes every partition and commits every second.
 * Run it with `./dev exec tsx --conditions=@strata/source packages/tables/examples/worker.ts`.
 */
import { Log, MemoryLog, MemoryStore } from "@strata/core"
import { Table, Tables, Worker } from "@strata/tables"
import { Effect, Layer, Option, Schedule, Schema } from "effect"

/** word → count, partitioned like the `words` source topic. */
const counts = Table.make({ name: "word-counts", key: Schema.String, value: Schema.Int, partitions: 4 })
const decoder = new TextDecoder()

/** The service: a worker with one agent, running until its scope closes (then it commits what it processed). */
export const wordCount = Effect.gen(function* () {
  const tables = yield* Tables.Tables
  const table = yield* tables.register(counts)
  const worker = yield* Worker.make({ groupId: "word-count", commitInterval: 1000 }, [
    Worker.agent({
      name: "count-words",
      topics: ["words"],
      process: (record) =>
        Effect.asVoid(table.update(decoder.decode(record.value!), (n) => Option.getOrElse(n, () => 0) + 1))
    })
  ])
  return { worker, table }
})

/** Writes some words to the source topic, runs the worker until it caught up, and reads the counts back. */
export const program = Effect.gen(function* () {
  const log = yield* Log.Log
  yield* log.ensureTopic({ topic: "words", partitions: 4 })
  const words = "to be or not to be that is the question".split(" ")
  yield* log.produceBatch(
    words.map((word) => {
      const key = Buffer.from(word)
      return { topic: "words", partition: Table.keyPartition(key, 4), key, value: key }
    })
  )
  const { worker, table } = yield* wordCount
  // Wait until every partition is processed to its end (a real service would run until told to stop).
  yield* Effect.repeat(worker.metrics, {
    until: (m) => m.recordsProcessed === words.length && m.lag.length === 4 && m.lag.every((l) => l.offset === 0),
    schedule: Schedule.spaced("10 millis")
  })
  const all: Array<readonly [string, number]> = []
  for (let p = 0; p < 4; p++) all.push(...(yield* table.entries(p)))
  return all.sort(([a], [b]) => (a < b ? -1 : 1))
}).pipe(Effect.scoped)

/** The embedded default: memory store and log. Swap in LevelStore/RocksDbStore and KafkaLog layers. */
export const layer = Tables.layer({ app: "word-count", settleDelay: 0 }).pipe(
  Layer.provideMerge(Layer.mergeAll(MemoryStore.layer(), MemoryLog.layer()))
)

if (import.meta.url === `file://${process.argv[1]}`) {
  Effect.runPromise(program.pipe(Effect.provide(layer))).then((entries) => console.log(entries))
}
