import { assert, it } from "@effect/vitest"
import { KafkaLog } from "@strata/kafka"
import { Effect } from "effect"
import { inject } from "vitest"
import { program } from "../examples/quickstart.js"

it.live("the README example reads back the record it produced", () =>
  Effect.gen(function* () {
    const topic = `quickstart-${process.pid}-${Date.now()}`
    const batch = yield* program(topic).pipe(Effect.provide(KafkaLog.layer({ brokers: [inject("kafka")] })))
    assert.strictEqual(batch?.partition, 3)
    assert.strictEqual(Buffer.from(batch!.records[0]!.key!).toString(), "order-1")
  })
)
