/**
 * The `strata` command line: subcommands compose Strata's layers from flags.
 *
 * @since 0.1.0
 */
import { join } from "node:path"
import { Log, type LogError, Store, type StoreError } from "@strata/core"
import { KafkaLog } from "@strata/kafka"
import * as LevelStore from "@strata/store-adapters/level"
import * as RocksDbStore from "@strata/store-adapters/rocksdb"
import { Console, Effect, type Layer, Option, Schema } from "effect"
import { Command, Flag } from "effect/cli"
import * as Coordinators from "./Coordinators.js"
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
    log: Flag.Literals("log", ["memory", "kafka"]).pipe(
      Flag.withDescription("Where the changelog lives: in memory, or on a Kafka cluster (see --brokers)"),
      Flag.withDefault("memory")
    ),
    brokers: Flag.String("brokers").pipe(
      Flag.withDescription("Kafka bootstrap brokers, comma-separated host:port (with --log kafka)"),
      Flag.withDefault("127.0.0.1:9092")
    ),
    dataDir: Flag.String("data-dir").pipe(
      Flag.withDescription("Directory of a level or rocksdb store (default .strata-data/demo-<store>)"),
      Flag.optional
    )
  },
  Effect.fn(function* ({ partitions, text, store, log, brokers, dataDir }) {
    const directory = Option.getOrElse(dataDir, () => join(".strata-data", `demo-${store}`))
    if (store !== "memory") yield* Console.log(`Store directory: ${directory}`)
    const [first = "", ...rest] = brokers.split(",").map((b) => b.trim())
    const logLayer: Layer.Layer<Log, LogError> =
      log === "memory" ? Log.layerMemory() : KafkaLog.layer({ brokers: [first, ...rest] })
    const result = yield* Demo.run({ partitions, text, verbose: true }, demoStores(store, directory)).pipe(
      Effect.provide(logLayer)
    )
    if (!Demo.sameTable(result.before, result.after)) {
      return yield* Effect.fail(new Error("the restored table differs from the table before the restart"))
    }
    yield* Console.log(`OK: all ${result.after.size} words restored from ${result.changelogRecords} changelog records`)
  })
).pipe(
  Command.withDescription(
    "Run a table (memory or Kafka changelog; memory, level or rocksdb store), restart the worker, restore it from its changelog"
  )
)

const coordinators = Command.make(
  "coordinators",
  {},
  Effect.fn(function* () {
    const result = yield* Coordinators.run(true).pipe(Effect.provide(Coordinators.layerMemory))
    if (result.second.epoch <= result.first.epoch || result.staleWrite !== "FencedEpoch") {
      return yield* Effect.fail(new Error("the takeover did not fence the old leader"))
    }
    yield* Console.log(
      `OK: server ${result.second.serverId} leads with epoch ${result.second.epoch} > ${result.first.epoch}; the old leader is fenced`
    )
  })
).pipe(
  Command.withDescription(
    "Three coordinators elect a leader on the embedded memory coordination; the leader is killed and another takes over with a higher epoch"
  )
)

/** The root command. */
export const strata = Command.make("strata").pipe(
  Command.withDescription("Partitioned, replicated, stateful services in TypeScript"),
  Command.withSubcommands([demo, coordinators])
)

/** Runs the CLI with the given arguments. */
export const run = Command.run(strata, { version: "0.1.0" })
