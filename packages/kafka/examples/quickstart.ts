/**
 * The README's example: produce to a changelog on Kafka and read the record back with a group-less consumer.
 * Run it with `./dev exec tsx --conditions=@strata/source packages/kafka/examples/quickstart.ts` (a broker on 9092).
 */
import { Log } from "@strata/core"
import { KafkaLog } from "@strata/kafka"
import { Effect, Stream } from "effect"

export const program = (topic: string) =>
  Effect.gen(function* () {
    const log = yield* Log.Log
    yield* log.ensureTopic({ topic, partitions: 12, compacted: true })
    const offset = yield* log.produce({ topic, partition: 3, key: Buffer.from("order-1"), value: Buffer.from("{}") })

    // A changelog consumer: no consumer group, manual assignment, seek, pause/resume.
    const consumer = yield* log.consumer({ maxBatchRecords: 1000 })
    yield* consumer.assign([{ topic, partition: 3 }])
    yield* consumer.seek({ topic, partition: 3 }, offset)
    const [batch] = yield* consumer.batches.pipe(Stream.take(1), Stream.runCollect)
    return batch
  }).pipe(Effect.scoped)

if (import.meta.url === `file://${process.argv[1]}`) {
  Effect.runPromise(
    program("app-orders-changelog").pipe(Effect.provide(KafkaLog.layer({ brokers: ["127.0.0.1:9092"] })))
  ).then((batch) => console.log(batch))
}
