import { assert, describe, it } from "@effect/vitest"
import { Result, Schema } from "effect"
import { murmur2, partitionOf } from "../src/internal/murmur2.js"
import { advance } from "../src/internal/offsets.js"
import * as Table from "../src/Table.js"

const bytes = (s: string) => new TextEncoder().encode(s)

describe("Table codecs", () => {
  const Order = Schema.Struct({ id: Schema.String, qty: Schema.Int, at: Schema.Date })
  const orders = Table.make({ name: "orders", key: Schema.String, value: Order, partitions: 3 })
  const codecs = Table.codecs(orders)

  it("keys and values round-trip through their Schema's JSON encoding", () => {
    const value = { id: "o-1", qty: 2, at: new Date("2026-11-30T00:00:00Z") }
    const encoded = Result.getOrThrow(codecs.encodeValue(value))
    assert.strictEqual(new TextDecoder().decode(encoded), '{"id":"o-1","qty":2,"at":"2026-11-30T00:00:00.000Z"}')
    assert.deepStrictEqual(Result.getOrThrow(codecs.decodeValue(encoded)), value)
    assert.strictEqual(new TextDecoder().decode(Result.getOrThrow(codecs.encodeKey("o-1"))), '"o-1"')
  })

  it("a value that does not fit is refused naming the table, the part and the problem", () => {
    const bad = codecs.encodeValue({ id: "o-1", qty: 1.5, at: new Date(0) })
    assert.isTrue(Result.isFailure(bad))
    if (Result.isFailure(bad)) {
      assert.strictEqual(bad.failure.table, "orders")
      assert.strictEqual(bad.failure.part, "value")
      assert.match(bad.failure.message, /table orders: cannot encode the value: .*int/i)
    }
  })

  it("bytes that are not JSON, or not the schema, are refused on read", () => {
    const notJson = codecs.decodeValue(bytes("{oops"))
    assert.isTrue(Result.isFailure(notJson) && /not JSON/.test(notJson.failure.message))
    const wrong = codecs.decodeKey(bytes("42"))
    assert.isTrue(Result.isFailure(wrong) && wrong.failure.direction === "decode" && wrong.failure.part === "key")
  })

  it("definitions are validated: name, partitions, changelog topic", () => {
    assert.isUndefined(Table.validate(orders))
    assert.match(Table.validate({ ...orders, name: "a/b" }) ?? "", /name must match/)
    assert.match(Table.validate({ ...orders, partitions: 1.5 }) ?? "", /positive integer, got 1.5/)
    assert.match(Table.validate({ ...orders, changelogTopic: "bad topic" }) ?? "", /changelog topic/)
    assert.strictEqual(Table.changelogTopicOf("shop", orders), "shop-orders-changelog")
    assert.strictEqual(Table.global({ name: "g", key: Schema.String, value: Order, partitions: 1 }).kind, "global")
  })
})

describe("Table codecs: a key's id", () => {
  it("encodeKeyWithId gives encodeKey's bytes and their latin1 text, for ASCII and other keys of every kind", () => {
    const latin1 = (b: Uint8Array) => Buffer.from(b).toString("latin1")
    const check = <K>(key: Schema.Codec<K, unknown>, keys: ReadonlyArray<K>) => {
      const c = Table.codecs(Table.make({ name: "t", key, value: Schema.Int, partitions: 1 }))
      for (const k of keys) {
        const { bytes, id } = Result.getOrThrow(c.encodeKeyWithId(k))
        assert.deepStrictEqual(Buffer.from(bytes), Buffer.from(Result.getOrThrow(c.encodeKey(k))))
        assert.strictEqual(id, latin1(bytes))
      }
    }
    check(Schema.String, ["plain", "", 'with "quotes"', "naïve ✓", "😀", "\ud800 lone", "é"])
    check(Schema.Int, [0, -7, 123456789])
    check(Schema.Struct({ id: Schema.String, n: Schema.Number }), [
      { id: "a", n: 1 },
      { id: "ü", n: 2.5 }
    ])
    // Different keys never share an id, whatever their characters.
    const c = Table.codecs(Table.make({ name: "t", key: Schema.String, value: Schema.Int, partitions: 1 }))
    const ids = ["é", "Ã©", '"Ã©"'].map((k) => Result.getOrThrow(c.encodeKeyWithId(k)).id)
    assert.strictEqual(new Set(ids).size, 3)
  })
})

describe("Table codecs: checking bytes without decoding", () => {
  it("checkKey / checkValue accept exactly what decoding accepts, on the fast paths and off them", () => {
    const bytes = (text: string) => new TextEncoder().encode(text)
    const inputs = [
      bytes(`"plain"`),
      bytes(`"naïve ✓"`),
      bytes(`"with \\"escaped\\" quotes"`),
      bytes(`"a"b"`),
      bytes(`"tab	here"`),
      bytes(`"unterminated`),
      bytes(`""`),
      bytes(`"`),
      new Uint8Array([0x22, 0xc3, 0x28, 0x22]),
      bytes("42"),
      bytes("-7"),
      bytes("007"),
      bytes("-"),
      bytes("1.5"),
      bytes("12345678901234567890"),
      bytes("-0"),
      bytes("999999999999999"),
      bytes("{not json"),
      bytes(`{"a":1}`),
      new Uint8Array([])
    ]
    for (const schema of [Schema.String, Schema.Int, Schema.Struct({ a: Schema.Int })] as const) {
      const c = Table.codecs(
        Table.make({
          name: "t",
          key: schema as Schema.Codec<unknown>,
          value: schema as Schema.Codec<unknown>,
          partitions: 1
        })
      )
      for (const input of inputs) {
        const decodes = Result.isSuccess(c.decodeKey(input))
        const shown = new TextDecoder().decode(input)
        assert.strictEqual(c.checkKey(input) === undefined, decodes, `key ${shown}`)
        assert.strictEqual(c.checkValue(input) === undefined, Result.isSuccess(c.decodeValue(input)), `value ${shown}`)
        // The fast paths give what the JSON text and the schema give.
        const slow = Schema.decodeUnknownResult(schema as Schema.Codec<unknown>)
        let parsed: unknown
        let parses = true
        try {
          parsed = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(input))
        } catch {
          parses = false
        }
        const expectedValue = parses ? slow(parsed) : undefined
        const got = c.decodeValue(input)
        assert.strictEqual(Result.isSuccess(got), expectedValue !== undefined && Result.isSuccess(expectedValue), shown)
        if (Result.isSuccess(got) && expectedValue !== undefined && Result.isSuccess(expectedValue)) {
          assert.deepStrictEqual(got.success, expectedValue.success, shown)
          const encoded = c.encodeValue(got.success)
          assert.isTrue(Result.isSuccess(encoded))
          if (Result.isSuccess(encoded)) {
            assert.strictEqual(Buffer.from(encoded.success).toString(), JSON.stringify(got.success), shown)
          }
        }
      }
    }
  })
})

describe("key partitioning", () => {
  it("murmur2 matches Kafka's own test vectors (UtilsTest.testMurmur2)", () => {
    const vectors: ReadonlyArray<readonly [string, number]> = [
      ["21", -973932308],
      ["foobar", -790332482],
      ["a-little-bit-long-string", -985981536],
      ["a-little-bit-longer-string", -1486304829],
      ["lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971],
      ["abc", 479470107]
    ]
    for (const [input, expected] of vectors) assert.strictEqual(murmur2(bytes(input)), expected, input)
  })

  it("partitions are murmur2's positive value modulo the count, as Kafka's default partitioner", () => {
    assert.strictEqual(partitionOf(bytes("21"), 7), (-973932308 & 0x7fffffff) % 7)
    for (let i = 0; i < 200; i++) {
      const p = partitionOf(bytes(`key-${i}`), 12)
      assert.isTrue(p >= 0 && p < 12)
    }
  })
})

describe("persist-offset-on-commit", () => {
  it("a lower offset never replaces a higher one: 30 → 29 keeps 30, 30 → 31 takes 31", () => {
    assert.strictEqual(advance(30, 29), 30)
    assert.strictEqual(advance(30, 31), 31)
    assert.strictEqual(advance(undefined, 5), 5)
    assert.strictEqual(advance(7, -1), 7, "an unknown offset (acks 0) changes nothing")
  })
})
