/**
 * The `Store` conformance suite: what every store backend (memory, LevelDB,
 * RocksDB) must do. An adapter's test file runs it in one line:
 *
 * ```ts
 * StoreConformance.suite("level", LevelStore.layer({ directory }))
 * ```
 *
 * Every test opens its own table name, so one layer serves the whole suite.
 *
 * @since 0.1.0
 */
import type * as Models from "../Models.js"
import * as Store from "../Store.js"
import { assert, describe, layer } from "@effect/vitest"
import type { Layer, Scope } from "effect"
import { Effect, Option, Random, Stream } from "effect"

const enc = new TextEncoder()
const dec = new TextDecoder()
const b = (s: string): Uint8Array => enc.encode(s)
const s = (u: Uint8Array): string => dec.decode(u)
const hex = (u: Uint8Array): string => Buffer.from(u).toString("hex")

/** A fresh table name per test, so a persistent backend can be reused. */
const freshId = (partition = 0): Effect.Effect<Store.Id> =>
  Effect.map(Random.nextIntBetween(0, 1_000_000_000), (n) => ({ table: `conf-${n.toString(36)}`, partition }))

const openFresh = (partition = 0): Effect.Effect<Store.PartitionStore, Store.StoreError, Store.Store | Scope.Scope> =>
  Effect.gen(function* () {
    const store = yield* Store.Store
    return yield* store.open(yield* freshId(partition))
  })

const collect = (stream: Stream.Stream<Store.Entry, Store.StoreError>) =>
  Effect.map(Stream.runCollect(stream), (entries) => entries.map(([k, v]) => [hex(k), s(v)] as const))

const failureTag = <A, R>(effect: Effect.Effect<A, Store.StoreError, R>): Effect.Effect<string, never, R> =>
  Effect.match(effect, { onFailure: (e) => e.reason._tag, onSuccess: () => "succeeded" })

/** Runs the conformance suite against a `Store` layer. */
export const suite = (name: string, storeLayer: Layer.Layer<Store.Store, unknown>): void => {
  describe(`Store conformance: ${name}`, () => {
    layer(storeLayer, { excludeTestServices: true, timeout: "60 seconds" })((it) => {
      it.effect("put, get, delete and getMany", () =>
        Effect.gen(function* () {
          const st = yield* openFresh()
          assert.isTrue(Option.isNone(yield* st.get(b("a"))))
          yield* st.put(b("a"), b("1"))
          yield* st.put(b("b"), b("2"))
          yield* st.put(b("a"), b("3"))
          assert.strictEqual(s(Option.getOrThrow(yield* st.get(b("a")))), "3")
          yield* st.delete(b("b"))
          yield* st.delete(b("never-there"))
          const many = yield* st.getMany([b("b"), b("a"), b("zz")])
          assert.deepStrictEqual(
            many.map((o) => Option.map(o, s)),
            [Option.none(), Option.some("3"), Option.none()]
          )
        })
      )

      it.effect("empty values are stored and distinct from absent keys", () =>
        Effect.gen(function* () {
          const st = yield* openFresh()
          yield* st.put(b("k"), new Uint8Array(0))
          const got = yield* st.get(b("k"))
          assert.isTrue(Option.isSome(got))
          assert.strictEqual(Option.getOrThrow(got).length, 0)
        })
      )

      it.effect("stored bytes do not change when the caller's buffers do", () =>
        Effect.gen(function* () {
          const st = yield* openFresh()
          const key = b("key")
          const value = b("value")
          yield* st.put(key, value)
          value[0] = 0x58
          key[0] = 0x58
          assert.strictEqual(s(Option.getOrThrow(yield* st.get(b("key")))), "value")
          const read = Option.getOrThrow(yield* st.get(b("key")))
          read[0] = 0x59
          assert.strictEqual(s(Option.getOrThrow(yield* st.get(b("key")))), "value")
        })
      )

      it.effect("a write batch applies puts and deletes in order", () =>
        Effect.gen(function* () {
          const st = yield* openFresh()
          yield* st.write([
            Store.put(b("a"), b("1")),
            Store.put(b("b"), b("2")),
            Store.del(b("a")),
            Store.put(b("c"), b("3")),
            Store.put(b("c"), b("4"))
          ])
          assert.deepStrictEqual(yield* collect(st.scan()), [
            [hex(b("b")), "2"],
            [hex(b("c")), "4"]
          ])
        })
      )

      it.effect("a batch with one bad operation writes nothing and keeps what was stored", () =>
        Effect.gen(function* () {
          const st = yield* openFresh()
          yield* st.write([Store.put(b("keep"), b("old"))], { offsets: [{ topic: "t", partition: 0, offset: 5 }] })
          const tag = yield* failureTag(
            st.write(
              [Store.put(b("keep"), b("new")), Store.put(b("x"), b("1")), Store.put(new Uint8Array(0), b("bad"))],
              {
                offsets: [{ topic: "t", partition: 0, offset: 9 }]
              }
            )
          )
          assert.strictEqual(tag, "InvalidKey")
          assert.deepStrictEqual(yield* collect(st.scan()), [[hex(b("keep")), "old"]])
          assert.deepStrictEqual(yield* st.persistedOffset({ topic: "t", partition: 0 }), Option.some(5))
        })
      )

      it.effect("persisted offsets are written with the batch, per topic-partition", () =>
        Effect.gen(function* () {
          const st = yield* openFresh()
          const tp0 = { topic: "orders-changelog", partition: 0 }
          const tp1 = { topic: "orders-changelog", partition: 1 }
          assert.isTrue(Option.isNone(yield* st.persistedOffset(tp0)))
          yield* st.write([Store.put(b("a"), b("1"))], { offsets: [{ ...tp0, offset: 10 }] })
          yield* st.write([Store.put(b("b"), b("2"))], {
            offsets: [
              { ...tp0, offset: 11 },
              { ...tp1, offset: 3 }
            ]
          })
          yield* st.setPersistedOffset(tp1, 4)
          assert.deepStrictEqual(yield* st.persistedOffset(tp0), Option.some(11))
          assert.deepStrictEqual(yield* st.persistedOffset(tp1), Option.some(4))
          const all = [...(yield* st.persistedOffsets)].sort((x, y) => x.partition - y.partition)
          assert.deepStrictEqual(all, [
            { ...tp0, offset: 11 },
            { ...tp1, offset: 4 }
          ])
          // Metadata never shows up among the entries.
          assert.deepStrictEqual(
            (yield* collect(st.scan())).map(([k]) => k),
            [hex(b("a")), hex(b("b"))]
          )
          assert.deepStrictEqual(
            (yield* collect(st.scan({ reverse: true }))).map(([k]) => k),
            [hex(b("b")), hex(b("a"))]
          )
        })
      )

      it.effect("data and offsets survive close and reopen", () =>
        Effect.gen(function* () {
          const store = yield* Store.Store
          const id = yield* freshId(3)
          const tp = { topic: "c", partition: 3 }
          yield* Effect.scoped(
            Effect.gen(function* () {
              const st = yield* store.open(id)
              yield* st.write([Store.put(b("k1"), b("v1")), Store.put(b("k2"), b("v2"))], {
                offsets: [{ ...tp, offset: 41 }]
              })
            })
          )
          const st = yield* store.open(id)
          assert.deepStrictEqual(yield* collect(st.scan()), [
            [hex(b("k1")), "v1"],
            [hex(b("k2")), "v2"]
          ])
          assert.deepStrictEqual(yield* st.persistedOffset(tp), Option.some(41))
        })
      )

      it.effect("scans order keys bytewise, unsigned", () =>
        Effect.gen(function* () {
          const st = yield* openFresh()
          const keys = [[0x02], [0x01, 0x00], [0x01], [0x80], [0x7f], [0xfe, 0xff], [0xfe], [0x01, 0xff]]
          yield* st.write(keys.map((k) => Store.put(Uint8Array.from(k), b(Buffer.from(k).toString("hex")))))
          const got = (yield* collect(st.scan())).map(([k]) => k)
          assert.deepStrictEqual(got, ["01", "0100", "01ff", "02", "7f", "80", "fe", "feff"])
        })
      )

      it.effect("scan bounds, reverse and limit", () =>
        Effect.gen(function* () {
          const st = yield* openFresh()
          yield* st.write(["a", "b", "c", "d", "e"].map((k) => Store.put(b(k), b(k.toUpperCase()))))
          const keys = (r: Parameters<Store.PartitionStore["scan"]>[0]) =>
            Effect.map(collect(st.scan(r)), (es) => es.map(([k]) => Buffer.from(k, "hex").toString()))
          assert.deepStrictEqual(yield* keys({ gte: b("b"), lt: b("d") }), ["b", "c"])
          assert.deepStrictEqual(yield* keys({ gt: b("b"), lte: b("d") }), ["c", "d"])
          assert.deepStrictEqual(yield* keys({ gt: b("bb") }), ["c", "d", "e"])
          assert.deepStrictEqual(yield* keys({ lt: b("a") }), [])
          assert.deepStrictEqual(yield* keys({ gte: b("d"), lte: b("b") }), [])
          assert.deepStrictEqual(yield* keys({ reverse: true }), ["e", "d", "c", "b", "a"])
          assert.deepStrictEqual(yield* keys({ reverse: true, lt: b("d"), limit: 2 }), ["c", "b"])
          assert.deepStrictEqual(yield* keys({ gte: b("b"), limit: 1 }), ["b"])
          assert.deepStrictEqual(yield* keys({ limit: 0 }), [])
        })
      )

      it.effect("prefix scans, including prefixes that end in 0xFF", () =>
        Effect.gen(function* () {
          const st = yield* openFresh()
          const ks = [[0x61], [0x61, 0x62], [0x61, 0xff], [0x61, 0xff, 0x01], [0x62], [0x61, 0xfe, 0xff]]
          yield* st.write(ks.map((k) => Store.put(Uint8Array.from(k), b("v"))))
          const prefixed = (p: Array<number>, reverse = false) =>
            Effect.map(collect(st.scanPrefix(Uint8Array.from(p), { reverse })), (es) => es.map(([k]) => k))
          assert.deepStrictEqual(yield* prefixed([0x61]), ["61", "6162", "61feff", "61ff", "61ff01"])
          assert.deepStrictEqual(yield* prefixed([0x61, 0xff]), ["61ff", "61ff01"])
          assert.deepStrictEqual(yield* prefixed([0x61, 0xfe]), ["61feff"])
          assert.deepStrictEqual(yield* prefixed([0x61], true), ["61ff01", "61ff", "61feff", "6162", "61"])
          assert.deepStrictEqual(yield* prefixed([0x63]), [])
        })
      )

      it.effect("a scan sees the store as it was when the scan started", () =>
        Effect.gen(function* () {
          const st = yield* openFresh()
          yield* st.write(["k1", "k2", "k3"].map((k) => Store.put(b(k), b("old"))))
          const seen: Array<string> = []
          yield* st.scan().pipe(
            Stream.runForEach(([k, v]) =>
              Effect.gen(function* () {
                seen.push(`${s(k)}=${s(v)}`)
                if (seen.length === 1) {
                  yield* st.write([Store.put(b("k2"), b("new")), Store.put(b("k4"), b("new")), Store.del(b("k3"))])
                }
              })
            )
          )
          assert.deepStrictEqual(seen, ["k1=old", "k2=old", "k3=old"])
          assert.deepStrictEqual(Option.map(yield* st.get(b("k2")), s), Option.some("new"))
        })
      )

      it.effect("stopping a scan early leaves the store usable", () =>
        Effect.gen(function* () {
          const store = yield* Store.Store
          const id = yield* freshId()
          yield* Effect.scoped(
            Effect.gen(function* () {
              const st = yield* store.open(id)
              const ops = Array.from({ length: 2000 }, (_, i) =>
                Store.put(b(`k${String(i).padStart(5, "0")}`), b(`${i}`))
              )
              yield* st.write(ops)
              const first = yield* Stream.runCollect(st.scan().pipe(Stream.take(3)))
              assert.deepStrictEqual(
                first.map(([k]) => s(k)),
                ["k00000", "k00001", "k00002"]
              )
              yield* st.put(b("after"), b("x"))
            })
          )
          // The store closed cleanly with the abandoned scan, and opens again.
          const st = yield* store.open(id)
          assert.deepStrictEqual(Option.map(yield* st.get(b("after")), s), Option.some("x"))
        })
      )

      it.effect("many keys in batches come back complete and sorted", () =>
        Effect.gen(function* () {
          const st = yield* openFresh()
          const n = 20_000
          const order = Array.from({ length: n }, (_, i) => (i * 7919) % n)
          for (let i = 0; i < n; i += 1000) {
            yield* st.write(
              order.slice(i, i + 1000).map((k) => Store.put(b(`key-${String(k).padStart(6, "0")}`), b(`v${k}`)))
            )
          }
          const all = yield* Stream.runCollect(st.scan())
          assert.strictEqual(all.length, n)
          for (let i = 0; i < n; i++) {
            assert.strictEqual(s(all[i]![0]), `key-${String(i).padStart(6, "0")}`)
            assert.strictEqual(s(all[i]![1]), `v${i}`)
          }
        })
      )

      it.effect("bad keys and values get typed errors", () =>
        Effect.gen(function* () {
          const store = yield* Store.Store
          const st = yield* openFresh()
          yield* st.put(b("present"), b("safe"))
          assert.strictEqual(yield* failureTag(st.put(new Uint8Array(0), b("v"))), "InvalidKey")
          assert.strictEqual(yield* failureTag(st.put(Uint8Array.from([0xff, 0x01]), b("v"))), "InvalidKey")
          assert.strictEqual(yield* failureTag(st.get(Uint8Array.from([0xff]))), "InvalidKey")
          assert.strictEqual(yield* failureTag(st.put("text" as unknown as Uint8Array, b("v"))), "InvalidKey")
          assert.strictEqual(yield* failureTag(st.put(b("k"), 42 as unknown as Uint8Array)), "InvalidValue")
          assert.strictEqual(
            yield* failureTag(st.put(new Uint8Array(store.limits.maxKeyBytes + 1).fill(0x61), b("v"))),
            "InvalidKey"
          )
          assert.strictEqual(
            yield* failureTag(st.put(b("present"), new Uint8Array(store.limits.maxValueBytes + 1))),
            "InvalidValue"
          )
          assert.deepStrictEqual(Option.map(yield* st.get(b("present")), s), Option.some("safe"))
        })
      )

      it.effect("invalid offsets get typed errors and write nothing", () =>
        Effect.gen(function* () {
          const st = yield* openFresh()
          const tp = { topic: "t", partition: 0 }
          yield* st.setPersistedOffset(tp, 3)
          for (const bad of [
            { ...tp, offset: -1 },
            { ...tp, offset: 1.5 },
            { ...tp, offset: Number.MAX_SAFE_INTEGER + 2 },
            { topic: "", partition: 0, offset: 1 },
            { topic: "t", partition: -1, offset: 1 },
            { topic: "t", partition: 2 ** 32, offset: 1 }
          ]) {
            assert.strictEqual(
              yield* failureTag(st.write([Store.put(b("k"), b("v"))], { offsets: [bad] })),
              "InvalidValue"
            )
          }
          assert.strictEqual(yield* failureTag(st.setPersistedOffset(tp, -5)), "InvalidValue")
          assert.deepStrictEqual(yield* st.persistedOffset(tp), Option.some(3))
          assert.isTrue(Option.isNone(yield* st.get(b("k"))))
          // The largest safe offset round-trips exactly.
          yield* st.setPersistedOffset(tp, Number.MAX_SAFE_INTEGER)
          assert.deepStrictEqual(yield* st.persistedOffset(tp), Option.some(Number.MAX_SAFE_INTEGER))
        })
      )

      it.effect("invalid topic-partitions get typed errors on every offset operation, never another's offset", () =>
        Effect.gen(function* () {
          const st = yield* openFresh()
          const tp = { topic: "t", partition: 0 }
          yield* st.setPersistedOffset(tp, 7)
          // A partition number the backend would read as 0 (NaN, 0.4) must not answer with partition 0's offset.
          const partitions: Array<unknown> = [
            Number.NaN,
            0.4,
            -1,
            -0.5,
            2 ** 31,
            Number.POSITIVE_INFINITY,
            "0",
            undefined
          ]
          const topics: Array<unknown> = ["", "a/b", "x".repeat(250), 42, undefined]
          const bad = [
            ...partitions.map((partition) => ({ topic: "t", partition }) as unknown as Models.TopicPartition),
            ...topics.map((topic) => ({ topic, partition: 0 }) as unknown as Models.TopicPartition)
          ]
          for (const wrong of bad) {
            const what = `${String(wrong.topic)}/${String(wrong.partition)}`
            assert.strictEqual(yield* failureTag(st.persistedOffset(wrong)), "InvalidValue", `persistedOffset(${what})`)
            assert.strictEqual(yield* failureTag(st.setPersistedOffset(wrong, 1)), "InvalidValue", `set ${what}`)
            assert.strictEqual(
              yield* failureTag(st.write([Store.put(b("k"), b("v"))], { offsets: [{ ...wrong, offset: 1 }] })),
              "InvalidValue",
              `write ${what}`
            )
          }
          const error = yield* Effect.flip(st.persistedOffset({ topic: "t", partition: Number.NaN }))
          assert.include(error.message, "partition")
          assert.include(error.message, "NaN")
          assert.deepStrictEqual(yield* st.persistedOffset(tp), Option.some(7))
          assert.deepStrictEqual(yield* st.persistedOffsets, [{ ...tp, offset: 7 }])
          assert.isTrue(Option.isNone(yield* st.get(b("k"))))
        })
      )

      it.effect("invalid scan limits get typed errors", () =>
        Effect.gen(function* () {
          const st = yield* openFresh()
          yield* st.write(["a", "b", "c"].map((k) => Store.put(b(k), b("v"))))
          for (const limit of [Number.NaN, -1, 1.5, Number.POSITIVE_INFINITY, "2"] as Array<unknown>) {
            const what = String(limit)
            assert.strictEqual(
              yield* failureTag(Stream.runDrain(st.scan({ limit: limit as number }))),
              "InvalidKey",
              `scan limit ${what}`
            )
            assert.strictEqual(
              yield* failureTag(Stream.runDrain(st.scanPrefix(b("a"), { limit: limit as number }))),
              "InvalidKey",
              `scanPrefix limit ${what}`
            )
          }
          assert.deepStrictEqual((yield* collect(st.scan({ limit: 2 }))).length, 2)
          assert.deepStrictEqual(yield* collect(st.scan({ limit: 0 })), [])
        })
      )

      it.effect("invalid store ids get typed errors", () =>
        Effect.gen(function* () {
          const store = yield* Store.Store
          for (const id of [
            { table: "", partition: 0 },
            { table: "x".repeat(256), partition: 0 },
            { table: "t", partition: -1 },
            { table: "t", partition: 0.5 },
            { table: "t", partition: 2 ** 31 }
          ]) {
            assert.strictEqual(yield* failureTag(Effect.scoped(store.open(id))), "InvalidStoreId")
            assert.strictEqual(yield* failureTag(store.drop(id)), "InvalidStoreId")
          }
          yield* Effect.scoped(store.open({ table: "é".repeat(127), partition: 2 ** 31 - 1 }))
        })
      )

      it.effect("a partition store is owned by one opener at a time", () =>
        Effect.gen(function* () {
          const store = yield* Store.Store
          const id = yield* freshId()
          yield* Effect.scoped(
            Effect.gen(function* () {
              yield* store.open(id)
              assert.strictEqual(yield* failureTag(Effect.scoped(store.open(id))), "StoreLocked")
              assert.strictEqual(yield* failureTag(store.drop(id)), "StoreLocked")
            })
          )
          yield* Effect.scoped(store.open(id))
        })
      )

      it.effect("use after close fails with StoreClosed", () =>
        Effect.gen(function* () {
          const st = yield* Effect.scoped(openFresh())
          assert.strictEqual(yield* failureTag(st.get(b("a"))), "StoreClosed")
          assert.strictEqual(yield* failureTag(st.put(b("a"), b("1"))), "StoreClosed")
          assert.strictEqual(yield* failureTag(st.persistedOffset({ topic: "t", partition: 0 })), "StoreClosed")
          assert.strictEqual(yield* failureTag(Stream.runDrain(st.scan())), "StoreClosed")
        })
      )

      it.effect("partitions and tables are independent; drop and clear remove everything", () =>
        Effect.gen(function* () {
          const store = yield* Store.Store
          const id0 = yield* freshId(0)
          const id1 = { ...id0, partition: 1 }
          const other = { table: `${id0.table}-other`, partition: 0 }
          const tp = { topic: "t", partition: 0 }
          yield* Effect.scoped(
            Effect.gen(function* () {
              const a = yield* store.open(id0)
              const c = yield* store.open(id1)
              const d = yield* store.open(other)
              yield* a.write([Store.put(b("k"), b("a"))], { offsets: [{ ...tp, offset: 1 }] })
              yield* c.write([Store.put(b("k"), b("c"))])
              yield* d.write([Store.put(b("k"), b("d"))])
              assert.deepStrictEqual(Option.map(yield* c.get(b("k")), s), Option.some("c"))
              assert.isTrue(Option.isNone(yield* c.persistedOffset(tp)))
              yield* d.clear
              assert.deepStrictEqual(yield* collect(d.scan()), [])
              assert.deepStrictEqual(Option.map(yield* a.get(b("k")), s), Option.some("a"))
            })
          )
          yield* store.drop(id0)
          yield* Effect.scoped(
            Effect.gen(function* () {
              const a = yield* store.open(id0)
              assert.deepStrictEqual(yield* collect(a.scan()), [])
              assert.isTrue(Option.isNone(yield* a.persistedOffset(tp)))
              const c = yield* store.open(id1)
              assert.deepStrictEqual(Option.map(yield* c.get(b("k")), s), Option.some("c"))
            })
          )
          yield* store.drop(id1)
          yield* store.drop(other)
          yield* store.drop({ table: `${id0.table}-never`, partition: 0 })
        })
      )
    })
  })
}
