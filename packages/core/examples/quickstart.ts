/**
 * The README's example: write a table entry the Faust way — changelog first,
 * then the store, with the changelog offset persisted in the same atomic batch.
 * Run it with `./dev exec tsx --conditions=@strata/source packages/core/examples/quickstart.ts`.
 */
import { Log, MemoryLog, MemoryStore, Store } from "@strata/core"
import { Effect, Layer, Option } from "effect"

const enc = new TextEncoder()
const dec = new TextDecoder()

export const program = Effect.gen(function* () {
  const log = yield* Log.Log
  const store = yield* Store.Store
  const topic = "greetings-changelog"
  yield* log.ensureTopic({ topic, partitions: 1, compacted: true })

  const greetings = yield* store.open({ table: "greetings", partition: 0 })
  const key = enc.encode("hello")
  const value = enc.encode("world")
  const offset = yield* log.produce({ topic, partition: 0, key, value }, { acks: "all" })
  yield* greetings.write([Store.put(key, value)], { offsets: [{ topic, partition: 0, offset }] })

  const stored = Option.map(yield* greetings.get(key), (v) => dec.decode(v))
  const persisted = yield* greetings.persistedOffset({ topic, partition: 0 })
  return { stored, persisted }
}).pipe(Effect.scoped)

/** The embedded default: both protocols in memory. Swap either layer for a real backend. */
export const layer = Layer.mergeAll(MemoryStore.layer(), MemoryLog.layer())

if (import.meta.url === `file://${process.argv[1]}`) {
  Effect.runPromise(program.pipe(Effect.provide(layer))).then((r) => console.log(r))
}
