/**
 * The README's example of core's `Log` on a cluster's tablets, against a cluster of real processes (start one with
 * `./dev strata cluster up`). Run it with `./dev exec tsx --conditions=@strata/source packages/replica/examples/strataLog.ts`.
 */
import { Log } from "@strata/core"
import * as ZooKeeperCoordination from "@strata/election/zookeeper"
import { StrataLog } from "@strata/replica/log"
import { Effect, Layer, Option, Stream } from "effect"

/** Produces `count` orders to a 3-partition topic (a table of 3 tablets), then reads every partition back. */
export const program = (count: number) =>
  Effect.gen(function* () {
    const log = yield* Log.Log
    const topic = "orders"
    yield* log.ensureTopic({ topic, partitions: 3 })
    const ends = yield* log.offsets([0, 1, 2].map((partition) => ({ topic, partition })))

    // acks=all (the default): acknowledged once every in-sync replica holds them.
    const orders = Array.from({ length: count }, (_, i) => ({
      topic,
      partition: i % 3,
      key: new TextEncoder().encode(`order-${i}`),
      value: new TextEncoder().encode(JSON.stringify({ qty: i }))
    }))
    yield* log.produceBatch(orders)

    // A changelog consumer: manual assignment, each partition read from where it ended before the batch.
    const consumer = yield* log.consumer({ maxBatchRecords: 1000 })
    yield* consumer.assign(ends.map(({ topic, partition }) => ({ topic, partition })))
    for (const end of ends) yield* consumer.seek(end, end.highwater)
    const read = yield* consumer.batches.pipe(
      Stream.scan(
        () => 0,
        (n, batch) => n + batch.records.length
      ),
      Stream.takeUntil((n) => n >= count),
      Stream.runLast
    )
    return Option.getOrElse(read, () => 0)
  }).pipe(Effect.scoped)

/** The log on a cluster whose coordination is ZooKeeper at `connectString`, in `namespace` (`/strata`). */
export const layer = (connectString: string, namespace = "/strata") =>
  StrataLog.layer({ client: { namespace } }).pipe(Layer.provide(ZooKeeperCoordination.layer({ connectString })))

if (import.meta.url === `file://${process.argv[1]}`) {
  const namespace = process.env.STRATA_NAMESPACE ?? "/strata"
  Effect.runPromise(program(10_000).pipe(Effect.provide(layer("127.0.0.1:2181", namespace)))).then((read) =>
    console.log(`produced and read back ${read} orders`)
  )
}
