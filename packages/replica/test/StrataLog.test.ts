import { assert, describe, it } from "@effect/vitest"
import { type Log, MemoryCoordination } from "@strata/core"
import { LogConformance } from "@strata/core/testing"
import { Effect, Layer } from "effect"
import * as TabletClient from "../src/client/TabletClient.js"
import * as LocalCluster from "../src/node/LocalCluster.js"
import * as StrataLog from "../src/log/StrataLog.js"
import { quickReplication } from "./support/servers.js"

// Core's Log conformance on a cluster of three tablet servers talking over loopback TCP, as separate processes do,
// with the capabilities the Strata log declares.
const cluster = LocalCluster.layer({
  servers: 3,
  transport: "tcp",
  replication: { sessionTimeout: 2_000, replicaLagTimeMax: 6_000 }
})
const log = StrataLog.layer({ client: { linger: 1 } }).pipe(
  Layer.provideMerge(cluster),
  Layer.provide(MemoryCoordination.layer())
)

LogConformance.suite("strata", log, { capabilities: StrataLog.capabilities, timeout: "20 seconds" })

describe("StrataLog retention", () => {
  it.live(
    "a topic's retention.ms and retention.bytes become its table's retention, shown in the metadata; a value that is not one is refused naming it",
    () =>
      Effect.gen(function* () {
        const local = yield* LocalCluster.make({ servers: 3, replication: quickReplication, transport: "tcp" })
        const strata = yield* StrataLog.make({ client: { linger: 1 } })
        const client = yield* TabletClient.make({ replication: quickReplication })
        const retentionOf = (table: string) =>
          Effect.map(client.metadata(table), (m) => m.tablets.map((t) => t.retention ?? null))

        // Kafka's names, strings of digits; -1 is unlimited (none); other configs are passed over.
        yield* strata.ensureTopic({
          topic: "kept",
          partitions: 2,
          config: { "retention.ms": "86400000", "retention.bytes": "-1", "cleanup.policy": "delete" }
        })
        assert.deepStrictEqual(yield* retentionOf("kept"), [{ ms: 86_400_000 }, { ms: 86_400_000 }])
        yield* strata.ensureTopic({
          topic: "both",
          partitions: 1,
          config: { "retention.ms": "1000", "retention.bytes": "1048576" }
        })
        assert.deepStrictEqual(yield* retentionOf("both"), [{ ms: 1_000, bytes: 1_048_576 }])
        yield* strata.ensureTopic({ topic: "plain", partitions: 1, config: { "retention.ms": "-1" } })
        assert.deepStrictEqual(yield* retentionOf("plain"), [null])

        for (const [key, value] of [
          ["retention.ms", "0"],
          ["retention.ms", "1.5"],
          ["retention.bytes", "-2"],
          ["retention.bytes", "lots"],
          ["retention.ms", ""],
          ["retention.ms", "99999999999999999999"]
        ] as const) {
          const error = yield* Effect.flip(
            strata.ensureTopic({ topic: "bad", partitions: 1, config: { [key]: value } })
          )
          assert.strictEqual(error.reason._tag, "InvalidRequest", `${key}=${value}`)
          assert.include(error.message, `${key}=${JSON.stringify(value)}`)
        }
        assert.deepStrictEqual(yield* retentionOf("bad"), [], "nothing was created")

        // LocalCluster's create takes it too: the controller's tablet keeps it, the client's metadata shows it.
        const created = yield* local.createTable("local", { buckets: 1, retentionMs: 5_000, retentionBytes: 4_096 })
        assert.deepStrictEqual(
          created.map((t) => t.retention),
          [{ ms: 5_000, bytes: 4_096 }]
        )
        assert.deepStrictEqual(yield* retentionOf("local"), [{ ms: 5_000, bytes: 4_096 }])
        const refused = yield* Effect.flip(local.createTable("zero", { buckets: 1, retentionMs: 0 }))
        assert.strictEqual(refused.reason._tag, "CreateTableRefused")
        assert.include(refused.message, "retention.ms must be a whole number ≥ 1, not 0")
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer())),
    60_000
  )
})

describe("StrataLog produce checks", () => {
  it.live(
    "a produce call with one bad record appends none of it, wherever the bad one is, over two topics",
    () =>
      Effect.gen(function* () {
        yield* LocalCluster.make({ servers: 3, replication: quickReplication, transport: "tcp" })
        const strata = yield* StrataLog.make({ client: { linger: 1 }, maxRecordBytes: 100 })
        yield* strata.ensureTopic({ topic: "left", partitions: 2 })
        yield* strata.ensureTopic({ topic: "right", partitions: 1 })
        const text = new TextEncoder()
        const good = (topic: string, partition: number, i: number): Log.ProducerRecord => ({
          topic,
          partition,
          key: text.encode(`k${i}`),
          value: text.encode(`v${i}`)
        })
        const ends = Effect.map(
          strata.offsets([
            { topic: "left", partition: 0 },
            { topic: "left", partition: 1 },
            { topic: "right", partition: 0 }
          ]),
          (list) => list.map((o) => o.highwater)
        )
        const bad: ReadonlyArray<readonly [string, Log.ProducerRecord]> = [
          ["UnknownPartition", good("left", 2, 99)],
          ["UnknownPartition", good("right", -1, 99)],
          ["RecordTooLarge", { ...good("right", 0, 99), value: new Uint8Array(101) }],
          [
            "InvalidRequest",
            { ...good("left", 1, 99), headers: [{ key: "strata.tombstone", value: new Uint8Array(0) }] }
          ]
        ]
        for (const [tag, record] of bad) {
          for (const at of [0, 3, 6]) {
            const records = Array.from({ length: 6 }, (_, i) => good(i % 2 === 0 ? "left" : "right", 0, i))
            records.splice(at, 0, record)
            const error = yield* Effect.flip(strata.produceBatch(records))
            assert.strictEqual(error.reason._tag, tag, `${tag} at ${at}`)
            assert.deepStrictEqual(yield* ends, [0, 0, 0], `${tag} at ${at}: nothing appended`)
          }
        }
        // The same records without the bad one are all appended, each topic's in order.
        const offsets = yield* strata.produceBatch(
          Array.from({ length: 6 }, (_, i) => good(i % 2 === 0 ? "left" : "right", 0, i))
        )
        assert.deepStrictEqual(offsets, [0, 0, 1, 1, 2, 2])
        assert.deepStrictEqual(yield* ends, [3, 0, 3])
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer())),
    60_000
  )
})
