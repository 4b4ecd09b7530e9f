import { assert, it } from "@effect/vitest"
import { Effect, Logger, Option } from "effect"
import { program } from "../examples/restore.js"

it.live("the recovery README example restores the active partition and the standby from the changelog", () =>
  Effect.gen(function* () {
    const { events, active, standby, resume } = yield* program.pipe(Effect.provide(Logger.layer([])))
    // 1000 source records per partition over 100 words, 7 coprime with 100: every word counted exactly 10 times.
    for (const entries of [active, standby]) {
      assert.strictEqual(entries.length, 100)
      assert.isTrue(entries.every(([, n]) => n === 10))
    }
    assert.deepStrictEqual(resume, Option.some(1000))
    assert.strictEqual(events[0], "Started")
    const ready = events.indexOf("PartitionReady")
    assert.isTrue(ready > 0 && ready < events.indexOf("Completed"), events.join(","))
    // The standby is restored after the actives complete.
    assert.strictEqual(events[events.length - 1], "BatchApplied")
  })
)
