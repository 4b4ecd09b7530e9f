/**
 * The `strata` command line: subcommands compose Strata's layers from flags.
 *
 * @since 0.1.0
 */
import { Store } from "@strata/core"
import { Console, Effect, Schema } from "effect"
import { Command, Flag } from "effect/cli"
import * as Demo from "./Demo.js"

const demo = Command.make(
  "demo",
  {
    partitions: Flag.Int("partitions").pipe(
      Flag.withDescription("Partitions of the demo table and its changelog (1–1024)"),
      Flag.withSchema(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 1024 }))),
      Flag.withDefault(4)
    ),
    text: Flag.String("text").pipe(
      Flag.withDescription("Text whose words are counted"),
      Flag.withDefault(Demo.defaultText)
    )
  },
  Effect.fn(function* ({ partitions, text }) {
    const result = yield* Demo.run({ partitions, text, verbose: true }, Store.layerMemory()).pipe(
      Effect.provide(Demo.layerMemory)
    )
    if (!Demo.sameTable(result.before, result.after)) {
      return yield* Effect.fail(new Error("the restored table differs from the table before the restart"))
    }
    yield* Console.log(`OK: all ${result.after.size} words restored from ${result.changelogRecords} changelog records`)
  })
).pipe(Command.withDescription("Run a table on the embedded default (memory store and log), restart it, restore it"))

/** The root command. */
export const strata = Command.make("strata").pipe(
  Command.withDescription("Partitioned, replicated, stateful services in TypeScript"),
  Command.withSubcommands([demo])
)

/** Runs the CLI with the given arguments. */
export const run = Command.run(strata, { version: "0.1.0" })
