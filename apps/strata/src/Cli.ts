/**
 * The `strata` command line: subcommands compose Strata's layers from flags.
 *
 * @since 0.1.0
 */
import { join } from "node:path"
import { Log, Store, type StoreError } from "@strata/core"
import * as LevelStore from "@strata/store-adapters/level"
import * as RocksDbStore from "@strata/store-adapters/rocksdb"
import { Console, Effect, type Layer, Option, Schema } from "effect"
import { Command, Flag } from "effect/cli"
import * as Demo from "./Demo.js"

/** The store layers of one worker run and of its restart. */
const demoStores = (
  store: "memory" | "level" | "rocksdb",
  directory: string
): { readonly before: Layer.Layer<Store, StoreError>; readonly after: Layer.Layer<Store, StoreError> } => {
  switch (store) {
    case "memory":
      return { before: Store.layerMemory(), after: Store.layerMemory() }
    case "level":
      return { before: LevelStore.layer({ directory }), after: LevelStore.layer({ directory }) }
    case "rocksdb":
      return { before: RocksDbStore.layer({ directory }), after: RocksDbStore.layer({ directory }) }
  }
}

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
    ),
    store: Flag.Literals("store", ["memory", "level", "rocksdb"]).pipe(
      Flag.withDescription(
        "Where the table's partitions live: memory loses them on restart, level and rocksdb keep them"
      ),
      Flag.withDefault("memory")
    ),
    dataDir: Flag.String("data-dir").pipe(
      Flag.withDescription("Directory of a level or rocksdb store (default .strata-data/demo-<store>)"),
      Flag.optional
    )
  },
  Effect.fn(function* ({ partitions, text, store, dataDir }) {
    const directory = Option.getOrElse(dataDir, () => join(".strata-data", `demo-${store}`))
    if (store !== "memory") yield* Console.log(`Store directory: ${directory}`)
    const result = yield* Demo.run({ partitions, text, verbose: true }, demoStores(store, directory)).pipe(
      Effect.provide(Log.layerMemory())
    )
    if (!Demo.sameTable(result.before, result.after)) {
      return yield* Effect.fail(new Error("the restored table differs from the table before the restart"))
    }
    yield* Console.log(`OK: all ${result.after.size} words restored from ${result.changelogRecords} changelog records`)
  })
).pipe(
  Command.withDescription(
    "Run a table (memory log; memory, level or rocksdb store), restart the worker, restore the table from its changelog"
  )
)

/** The root command. */
export const strata = Command.make("strata").pipe(
  Command.withDescription("Partitioned, replicated, stateful services in TypeScript"),
  Command.withSubcommands([demo])
)

/** Runs the CLI with the given arguments. */
export const run = Command.run(strata, { version: "0.1.0" })
