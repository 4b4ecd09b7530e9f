import type { Log } from "@strata/core"
import { createRecordsBatch, type MessageRecord } from "@platformatic/kafka"
import { assert, describe, it } from "@effect/vitest"
import * as RecordSize from "../src/internal/recordSize.js"

const bytes = (n: number) => new Uint8Array(n).fill(7)

/** The record as the client encodes it (the same mapping as KafkaLog's `sendVia`). */
const message = (r: Log.ProducerRecord): MessageRecord => ({
  topic: r.topic,
  partition: r.partition,
  ...(r.key === null ? {} : { key: Buffer.from(r.key) }),
  value: (r.value === null ? null : Buffer.from(r.value)) as Buffer,
  ...(r.headers === undefined
    ? {}
    : { headers: new Map(r.headers.map((h) => [Buffer.from(h.key), Buffer.from(h.value)] as const)) }),
  timestamp: BigInt(r.timestamp ?? 1_700_000_000_000)
})

const record = (key: number | null, value: number | null, headers = 0, timestamp?: number): Log.ProducerRecord => ({
  topic: "t",
  partition: 0,
  key: key === null ? null : bytes(key),
  value: value === null ? null : bytes(value),
  ...(headers === 0
    ? {}
    : { headers: Array.from({ length: headers }, (_, i) => ({ key: `h-${i}-é`, value: bytes(i * 40) })) }),
  ...(timestamp === undefined ? {} : { timestamp })
})

describe("RecordSize", () => {
  // Sizes around the varint boundaries (63/64, 8191/8192, 1048575/1048576 for zigzag lengths).
  const sizes = [null, 0, 1, 63, 64, 100, 8191, 8192, 100_000, 1_048_575, 1_048_576]

  it("loneBatchBytes is the size of the record batch the client builds for the record alone", () => {
    for (const key of [null, 16, 200]) {
      for (const value of sizes) {
        for (const headers of [0, 1, 3]) {
          const r = record(key, value, headers)
          assert.strictEqual(
            RecordSize.loneBatchBytes(r),
            createRecordsBatch([message(r)]).length,
            `key ${key}, value ${value}, ${headers} headers`
          )
        }
      }
    }
  })

  it("recordBound is never below what a record adds to a batch, whatever its timestamp delta", () => {
    const records = sizes.flatMap((value, i) => [
      record(16, value, i % 3, 1_700_000_000_000 + i * 2 ** 30),
      record(null, value, 0, 1_700_000_000_000 - i * 1000)
    ])
    const bound = records.reduce((n, r) => n + RecordSize.recordBound(r), RecordSize.BATCH_OVERHEAD)
    assert.isAtMost(createRecordsBatch(records.map(message)).length, bound)
    for (const r of records)
      assert.isAtMost(RecordSize.loneBatchBytes(r), RecordSize.BATCH_OVERHEAD + RecordSize.recordBound(r))
  })

  it("requestSize keeps each partition's batch within its topic's limit, partitions and topics apart", () => {
    const size = RecordSize.requestSize((topic) => (topic === "small" ? 1000 : 10_000))
    const r = (topic: string, partition: number, n: number): Log.ProducerRecord => ({
      topic,
      partition,
      key: null,
      value: bytes(n)
    })
    size.reset()
    assert.isTrue(size.add(r("small", 0, 500)))
    assert.isFalse(size.add(r("small", 0, 500)), "a second 500 bytes overflows small/0")
    assert.isTrue(size.add(r("small", 1, 500)), "small/1 has its own batch")
    assert.isTrue(size.add(r("big", 0, 5000)))
    assert.isTrue(size.add(r("big", 0, 4000)))
    assert.isFalse(size.add(r("big", 0, 1000)))
    size.reset()
    assert.isTrue(size.add(r("small", 0, 500)), "a new request starts empty")
  })
})
