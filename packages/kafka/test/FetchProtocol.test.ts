import type { Log } from "@strata/core"
import {
  compressionsAlgorithms,
  createRecordsBatch,
  type MessageRecord,
  Reader,
  readRecordsBatches
} from "@platformatic/kafka"
import { describe, expect, it } from "vitest"
import { type Prng, seeded } from "../../../scripts/test-support/prng.js"
import { type DecodeTarget, RecordBatchError, RecordBatchReader } from "../src/internal/fetchProtocol.js"

const TOPIC = "t"
const PARTITION = 3
const CODECS = (["none", "gzip", "snappy", "lz4", "zstd"] as const).filter((c) => compressionsAlgorithms[c].available)

const bytesOf = (random: Prng, max: number): Buffer =>
  Buffer.from(Array.from({ length: random.int(0, max) }, () => random.int(0, 255)))

/** One encoded batch at `baseOffset`: random keys, values, headers (names with non-ASCII text) and timestamps. */
const batchOf = (random: Prng, baseOffset: number, control: boolean): { bytes: Buffer; count: number } => {
  const count = random.int(1, 40)
  const start = random.int(0, 2 ** 40)
  const messages: Array<MessageRecord> = Array.from({ length: count }, () => {
    const headers = new Map<Buffer, Buffer>()
    for (let h = random.int(0, 3); h > 0; h--)
      headers.set(Buffer.from(random.pick(["strata-source", "ü-name", "x", ""])), bytesOf(random, 20))
    return {
      topic: TOPIC,
      // Null keys and values are written as length -1.
      ...(random.chance(0.1) ? {} : { key: bytesOf(random, 30) }),
      value: (random.chance(0.1) ? null : bytesOf(random, 300)) as Buffer,
      headers,
      // Deltas of either sign, some beyond 32 bits.
      timestamp: BigInt(start + random.int(-(2 ** 34), 2 ** 34))
    }
  })
  const bytes = createRecordsBatch(messages, { compression: random.pick(CODECS) }).buffer
  // The client writes base offset 0; place the batch where the test wants it.
  bytes.writeBigInt64BE(BigInt(baseOffset), 0)
  if (control) bytes.writeInt16BE(bytes.readInt16BE(21) | 0x20, 21)
  return { bytes, count }
}

/** The client's own decoder, as `LogRecord`s: the reference. */
const reference = (data: Buffer, from: number): Array<Log.Record> =>
  readRecordsBatches(Reader.from(data)).flatMap((b) =>
    (b.attributes & 0x20) !== 0
      ? []
      : b.records
          .map((r) => ({
            topic: TOPIC,
            partition: PARTITION,
            offset: Number(b.firstOffset) + r.offsetDelta,
            key: r.key === null ? null : new Uint8Array(r.key),
            value: r.value === null ? null : new Uint8Array(r.value),
            headers: r.headers.map(([k, v]) => ({ key: k?.toString("utf8") ?? "", value: new Uint8Array(v ?? []) })),
            timestamp: Number(b.firstTimestamp + r.timestampDelta)
          }))
          .filter((r) => r.offset >= from)
  )

const plain = (records: ReadonlyArray<Log.Record>) =>
  records.map((r) => ({
    ...r,
    key: r.key === null ? null : new Uint8Array(r.key),
    value: r.value === null ? null : new Uint8Array(r.value),
    headers: r.headers.map((h) => ({ key: h.key, value: new Uint8Array(h.value) }))
  }))

/** Reads every chunk of a fetch with one reader, appending them to `chunks`; returns the reader's end offset. */
const decodeRecordBatches = (data: Uint8Array, target: DecodeTarget, chunks: Array<Array<Log.Record>>): number => {
  const reader = new RecordBatchReader(data, target)
  for (let chunk = reader.next(); chunk !== undefined; chunk = reader.next()) chunks.push(chunk)
  return reader.end
}

describe("RecordBatchReader", () => {
  it("decodes what the client's decoder decodes, over 300 generated fetches", () => {
    for (let seed = 1; seed <= 300; seed++) {
      const random = seeded(seed)
      let offset = random.pick([0, 7, 2 ** 33 + 5, 2 ** 52])
      const batches: Array<Buffer> = []
      const ends: Array<number> = []
      for (let b = random.int(1, 5); b > 0; b--) {
        offset += random.int(0, 3) // compaction gaps between batches
        const { bytes, count } = batchOf(random, offset, random.chance(0.15))
        offset += count
        batches.push(bytes)
        ends.push(offset)
      }
      const all = Buffer.concat(batches)
      // A fetch may end inside a batch: that batch is left for the next fetch.
      const cut = random.chance(0.3) ? random.int(0, all.length - 1) : all.length
      const data = all.subarray(0, cut)
      let whole = 0
      let wholeBytes = 0
      while (whole < batches.length && wholeBytes + batches[whole]!.length <= cut)
        wholeBytes += batches[whole++]!.length
      const first = Number(all.readBigInt64BE(0))
      const from = first + random.int(0, 10)
      const chunkSize = random.int(1, 50)
      const chunks: Array<Array<Log.Record>> = []
      const end = decodeRecordBatches(data, { topic: TOPIC, partition: PARTITION, from, chunkSize }, chunks)

      expect(end, `seed ${seed}`).toBe(whole === 0 ? from : Math.max(from, ends[whole - 1]!))
      expect(plain(chunks.flat()), `seed ${seed}`).toEqual(reference(all.subarray(0, wholeBytes), from))
      expect(
        chunks.every((c) => c.length > 0 && c.length <= chunkSize),
        `seed ${seed}`
      ).toBe(true)
      expect(
        chunks.slice(0, -1).every((c) => c.length === chunkSize),
        `seed ${seed}`
      ).toBe(true)

      // Two readers of the fetch, asked in turns (as the consumer serves partitions), decode the same records:
      // each keeps its own place, in plain and in decompressed batches alike.
      const target = { topic: TOPIC, partition: PARTITION, from }
      const readers = [
        new RecordBatchReader(data, { ...target, chunkSize }),
        new RecordBatchReader(data, { ...target, chunkSize: random.int(1, 50) })
      ]
      const read: Array<Array<Log.Record>> = [[], []]
      const done = [false, false]
      for (let turn = 0; !(done[0] && done[1]); turn++) {
        const i = turn % 2
        if (done[i]) continue
        const chunk = readers[i]!.next()
        if (chunk === undefined) done[i] = true
        else read[i]!.push(...chunk)
      }
      expect(plain(read[0]!), `seed ${seed}`).toEqual(plain(chunks.flat()))
      expect(plain(read[1]!), `seed ${seed}`).toEqual(plain(chunks.flat()))
      expect(new RecordBatchReader(data, { ...target, chunkSize }).hasRecords, `seed ${seed}`).toBe(chunks.length > 0)
    }
  })

  it("moves past a fetch holding only control batches", () => {
    const random = seeded(42)
    const { bytes, count } = batchOf(random, 100, true)
    const chunks: Array<Array<Log.Record>> = []
    const end = decodeRecordBatches(bytes, { topic: TOPIC, partition: PARTITION, from: 100, chunkSize: 10 }, chunks)
    expect(chunks).toEqual([])
    expect(end).toBe(100 + count)
    const reader = new RecordBatchReader(bytes, { topic: TOPIC, partition: PARTITION, from: 100, chunkSize: 10 })
    expect(reader.hasRecords).toBe(false)
    expect(reader.next()).toBeUndefined()
  })

  it("names the topic, partition and offset of a batch in an unsupported format", () => {
    const { bytes } = batchOf(seeded(7), 12, false)
    bytes[16] = 1 // magic 1: the pre-0.11 message format
    const decode = () => decodeRecordBatches(bytes, { topic: TOPIC, partition: PARTITION, from: 0, chunkSize: 10 }, [])
    expect(decode).toThrow(RecordBatchError)
    expect(decode).toThrow("t/3 offset 12: message format v1 is not supported")
  })
})
