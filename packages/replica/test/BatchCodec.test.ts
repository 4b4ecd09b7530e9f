import { assert, describe, it } from "@effect/vitest"
import { mix32, seeded } from "../../../scripts/test-support/prng.js"
import * as ServerMetrics from "../src/server/ServerMetrics.js"
import * as Codec from "../src/wire/internal/batchCodec.js"

const encoder = new TextEncoder()

const records: ReadonlyArray<Codec.TabletRecord> = [
  { key: null, value: encoder.encode("first"), headers: [], timestamp: 1 },
  {
    key: encoder.encode("k"),
    value: encoder.encode("second value"),
    headers: [
      { key: "trace", value: encoder.encode("abc") },
      { key: "empty", value: new Uint8Array(0) }
    ],
    timestamp: 2
  },
  { key: new Uint8Array(0), value: new Uint8Array(0), headers: [], timestamp: 3 }
]

describe("batchCodec's stored batches", () => {
  it("read back without decoding: fields, count and record bytes at once, records when asked, the same bytes to send", () => {
    const producer = { id: 7, epoch: 2, sequence: 40 }
    const bytes = Codec.encodeBatch(3, records, producer)
    const batch = Codec.storedBatch(100, bytes)
    assert(typeof batch !== "string", String(batch))
    assert.strictEqual(batch.baseOffset, 100)
    assert.strictEqual(batch.epoch, 3)
    assert.deepStrictEqual(batch.producer, producer)
    assert.strictEqual(Codec.countOf(batch), 3)
    assert.strictEqual(Codec.recordBytesOf(batch), ServerMetrics.recordBytes(records))
    // Sent on as the very bytes it was read as, not encoded again.
    assert.strictEqual(Codec.bytesOf(batch), bytes)
    assert.deepStrictEqual(
      batch.records.map((r) => ({ ...r, headers: [...r.headers] })),
      records.map((r) => ({ ...r, headers: [...r.headers] }))
    )
    // Decoded once: asked again, the same array.
    assert.strictEqual(batch.records, batch.records)
    // A batch made some other way is counted and encoded from its records.
    const plain = { baseOffset: 0, epoch: 1, records }
    assert.strictEqual(Codec.countOf(plain), 3)
    assert.strictEqual(Codec.recordBytesOf(plain), undefined)
    const unstamped = Codec.storedBatch(0, Codec.bytesOf(plain))
    assert(typeof unstamped !== "string")
    assert.strictEqual(unstamped.producer, undefined)
  })

  it("an adopted request's bytes take the leader's header once, in place; later encodings copy, leaving them be", () => {
    const producer = { id: 7, epoch: 2, sequence: 40 }
    const onWire = Buffer.from(Codec.encodeBatch(0, records, producer))
    const decoded = Codec.decodeBatch(0, onWire)
    assert(typeof decoded !== "string", String(decoded))
    Codec.adopt(decoded.records)
    const stored = Codec.encodeBatch(5, decoded.records, producer)
    // The request's own bytes, with the leader's epoch written over the client's.
    assert.strictEqual(stored, onWire)
    const asStored = Codec.storedBatch(0, stored)
    assert(typeof asStored !== "string")
    assert.strictEqual(asStored.epoch, 5)
    assert.deepStrictEqual(asStored.producer, producer)
    // Encoded again under another epoch: a copy; what was stored keeps its header.
    const again = Codec.encodeBatch(6, decoded.records, producer)
    assert.notStrictEqual(again, stored)
    assert.strictEqual(new DataView(stored.buffer, stored.byteOffset).getUint32(0), 5)
    assert.strictEqual(new DataView(again.buffer, again.byteOffset).getUint32(0), 6)
    // A header of another length (no stamp on the wire, one to store) is never written over the bytes.
    const unstamped = Buffer.from(Codec.encodeBatch(0, records))
    const plain = Codec.decodeBatch(0, unstamped)
    assert(typeof plain !== "string")
    Codec.adopt(plain.records)
    const stamped = Codec.encodeBatch(5, plain.records, producer)
    assert.notStrictEqual(stamped, unstamped)
    assert.strictEqual(new DataView(unstamped.buffer, unstamped.byteOffset).getUint32(0), 0)
    // Records not adopted are never written over.
    const kept = Buffer.from(Codec.encodeBatch(0, records, producer))
    const other = Codec.decodeBatch(0, kept)
    assert(typeof other !== "string")
    assert.notStrictEqual(Codec.encodeBatch(5, other.records, producer), kept)
    assert.strictEqual(new DataView(kept.buffer, kept.byteOffset).getUint32(0), 0)
  })

  it("header keys round-trip, however many distinct ones and however long (past what is kept decoded)", () => {
    const many: ReadonlyArray<Codec.TabletRecord> = Array.from({ length: 100 }, (_, i) => ({
      key: null,
      value: encoder.encode(`v${i}`),
      headers: [
        { key: `key-${i}-${"x".repeat(i)}`, value: encoder.encode(String(i)) },
        { key: "strata-source", value: new Uint8Array(0) },
        { key: "ключ-é", value: Uint8Array.of(i) }
      ],
      timestamp: i
    }))
    for (let round = 0; round < 2; round++) {
      const decoded = Codec.decodeBatch(0, Codec.encodeBatch(1, many))
      assert(typeof decoded !== "string")
      assert.deepStrictEqual(
        decoded.records.map((r) => r.headers.map((h) => [h.key, [...h.value]])),
        many.map((r) => r.headers.map((h) => [h.key, [...h.value]]))
      )
    }
  })

  it("refuses exactly the bytes decodeBatch refuses: every cut, and damaged lengths", () => {
    const whole = Codec.encodeBatch(1, records, { id: 1, epoch: 0, sequence: 0 })
    const cases: Array<Uint8Array> = []
    for (let n = 0; n <= whole.length; n++) cases.push(whole.slice(0, n))
    cases.push(Uint8Array.of(...whole, 0))
    const rng = seeded(mix32(0xbadc0de))
    for (let i = 0; i < 500; i++) {
      const damaged = whole.slice()
      damaged[rng.int(0, damaged.length - 1)] = rng.int(0, 255)
      cases.push(damaged)
    }
    let refused = 0
    for (const bytes of cases) {
      const decoded = Codec.decodeBatch(5, bytes)
      const stored = Codec.storedBatch(5, bytes)
      assert.strictEqual(typeof stored === "string", typeof decoded === "string", `${bytes.length} bytes: ${decoded}`)
      if (typeof decoded === "string") refused++
      else if (typeof stored !== "string") assert.strictEqual(Codec.countOf(stored), decoded.records.length)
    }
    assert.isAbove(refused, whole.length)
  })
})
