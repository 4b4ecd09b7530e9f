/**
 * The embedded demo: a word-count table kept the Faust way — every update goes
 * to the partition's store and to the table's changelog — then a restart that
 * loses the local state and restores the table from its changelog.
 *
 * It runs on whatever `Store` and `Log` layers it is given; the CLI's default is
 * the in-memory pair, so it needs no servers.
 *
 * @since 0.1.0
 */
import type { LogShape, PartitionStore, StoreShape, TopicPartition } from "@strata/core"
import { Log, Store } from "@strata/core"
import { Console, Effect, type Layer, Option, Stream } from "effect"

/** Options of the demo. */
export interface DemoOptions {
  /** The text whose words are counted. */
  readonly text: string
  /** Partitions of the table (and its changelog). */
  readonly partitions: number
  /** Print progress lines. */
  readonly verbose: boolean
}

/** What the demo measured: the table before the restart, after it, and how it was restored. */
export interface DemoResult {
  readonly before: ReadonlyMap<string, number>
  readonly after: ReadonlyMap<string, number>
  readonly changelogRecords: number
  readonly replayed: ReadonlyArray<{ readonly partition: number; readonly from: number; readonly to: number }>
}

const TABLE = "word-counts"
const CHANGELOG = "strata-demo-word-counts-changelog"
const enc = new TextEncoder()
const dec = new TextDecoder()

/** FNV-1a: a stable partitioner, so the same word always lands on the same partition. */
const partitionOf = (key: string, partitions: number): number => {
  let h = 0x811c9dc5
  for (let i = 0; i < key.length; i++) {
    h ^= key.charCodeAt(i)
    h = Math.imul(h, 0x01000193)
  }
  return (h >>> 0) % partitions
}

const words = (text: string): Array<string> => text.toLowerCase().match(/[\p{L}\p{N}']+/gu) ?? []

/** Reads a whole partition store as word → count. */
const readTable = (stores: ReadonlyArray<PartitionStore>) =>
  Effect.gen(function* () {
    const table = new Map<string, number>()
    for (const st of stores) {
      yield* Stream.runForEach(st.scan(), ([k, v]) =>
        Effect.sync(() => table.set(dec.decode(k), Number(dec.decode(v))))
      )
    }
    return table
  })

const openAll = (store: StoreShape, partitions: number) =>
  Effect.forEach(
    Array.from({ length: partitions }, (_, p) => p),
    (partition) => store.open({ table: TABLE, partition })
  )

/** Counts the words: store write + changelog record per update; commits offsets for half the partitions. */
const writePhase = (store: StoreShape, log: LogShape, options: DemoOptions) =>
  Effect.scoped(
    Effect.gen(function* () {
      // Start from an empty table, whatever an earlier run left in a persistent store.
      for (let partition = 0; partition < options.partitions; partition++)
        yield* store.drop({ table: TABLE, partition })
      const stores = yield* openAll(store, options.partitions)
      const lastOffset = new Map<number, number>()
      for (const word of words(options.text)) {
        const partition = partitionOf(word, options.partitions)
        const st = stores[partition]!
        const key = enc.encode(word)
        const current = Option.match(yield* st.get(key), { onNone: () => 0, onSome: (v) => Number(dec.decode(v)) })
        const value = enc.encode(String(current + 1))
        const offset = yield* log.produce({ topic: CHANGELOG, partition, key, value }, { acks: "all" })
        yield* st.put(key, value)
        lastOffset.set(partition, offset)
      }
      // A commit persists the changelog offset of what the store holds — here for the even partitions only,
      // so the restart below shows both a full and a partial replay when the store survives.
      for (const [partition, offset] of lastOffset) {
        if (partition % 2 === 0) yield* stores[partition]!.setPersistedOffset({ topic: CHANGELOG, partition }, offset)
      }
      return yield* readTable(stores)
    })
  )

/**
 * Restores every partition from the changelog: from the persisted offset + 1
 * (or the log start) up to the highwater, writing each batch together with the
 * offset it reaches.
 */
const restorePhase = (store: StoreShape, log: LogShape, options: DemoOptions) =>
  Effect.scoped(
    Effect.gen(function* () {
      const stores = yield* openAll(store, options.partitions)
      const tps: Array<TopicPartition> = stores.map((_, partition) => ({ topic: CHANGELOG, partition }))
      const offsets = yield* log.offsets(tps)
      const consumer = yield* log.consumer({ maxBatchRecords: 500 })
      yield* consumer.assign(tps)
      const pending = new Set<number>()
      const replayed: Array<{ partition: number; from: number; to: number }> = []
      for (const o of offsets) {
        const persisted = yield* stores[o.partition]!.persistedOffset({ topic: CHANGELOG, partition: o.partition })
        const from = Math.max(Option.match(persisted, { onNone: () => 0, onSome: (p) => p + 1 }), o.logStart)
        yield* consumer.seek({ topic: CHANGELOG, partition: o.partition }, from)
        replayed.push({ partition: o.partition, from, to: o.highwater })
        if (from < o.highwater) pending.add(o.partition)
        else yield* consumer.pause([{ topic: CHANGELOG, partition: o.partition }])
      }
      const target = new Map(offsets.map((o) => [o.partition, o.highwater]))
      if (pending.size > 0) {
        yield* consumer.batches.pipe(
          Stream.mapEffect((batch) =>
            Effect.gen(function* () {
              const last = batch.records[batch.records.length - 1]
              if (last === undefined) return
              const ops = batch.records.map((r) =>
                r.value === null
                  ? { _tag: "delete" as const, key: r.key! }
                  : { _tag: "put" as const, key: r.key!, value: r.value }
              )
              yield* stores[batch.partition]!.write(ops, {
                offsets: [{ topic: CHANGELOG, partition: batch.partition, offset: last.offset }]
              })
              if (last.offset + 1 >= target.get(batch.partition)!) {
                pending.delete(batch.partition)
                yield* consumer.pause([{ topic: CHANGELOG, partition: batch.partition }])
              }
            })
          ),
          Stream.takeUntil(() => pending.size === 0),
          Stream.runDrain
        )
      }
      return { table: yield* readTable(stores), replayed }
    })
  )

/**
 * Runs the demo on the `Log` in context. The worker runs on the `before` store
 * layer, stops (closing it), and restarts on the `after` layer: the same
 * directory for a persistent store, a fresh memory store to lose all state.
 */
export const run = <E1, E2>(
  options: DemoOptions,
  stores: { readonly before: Layer.Layer<Store, E1>; readonly after: Layer.Layer<Store, E2> }
) =>
  Effect.gen(function* () {
    const log = yield* Log
    const say = (line: string) => (options.verbose ? Console.log(line) : Effect.void)

    yield* log.ensureTopic({ topic: CHANGELOG, partitions: options.partitions, compacted: true })
    // A changelog left by an earlier run (on a real broker) is truncated: the demo starts from an empty table.
    const tps = Array.from({ length: options.partitions }, (_, partition) => ({ topic: CHANGELOG, partition }))
    for (const o of yield* log.offsets(tps)) {
      if (o.highwater > o.logStart) yield* log.deleteRecords(o, o.highwater)
    }
    const before = yield* Effect.gen(function* () {
      const store = yield* Store
      yield* say(
        `Created table ${TABLE} (${options.partitions} partitions, store: ${store.backend}, changelog: ${CHANGELOG} on ${log.backend})`
      )
      return yield* writePhase(store, log, options)
    }).pipe(Effect.provide(stores.before))
    const hw = yield* log.offsets(
      Array.from({ length: options.partitions }, (_, partition) => ({ topic: CHANGELOG, partition }))
    )
    const changelogRecords = hw.reduce((n, o) => n + o.highwater - o.logStart, 0)
    yield* say(
      `Wrote ${words(options.text).length} updates: ${before.size} distinct words, ${changelogRecords} changelog records`
    )

    yield* say("Restarting the worker: the table's store is reopened and restored from its changelog")
    const restarted = yield* Effect.gen(function* () {
      return yield* restorePhase(yield* Store, log, options)
    }).pipe(Effect.provide(stores.after))
    for (const r of restarted.replayed) {
      yield* say(
        `  partition ${r.partition}: replayed ${r.to - r.from} records, from offset ${r.from} up to the highwater ${r.to}`
      )
    }
    const result: DemoResult = { before, after: restarted.table, changelogRecords, replayed: restarted.replayed }
    const top = [...result.after].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).slice(0, 5)
    yield* say(`Top words after restart: ${top.map(([w, n]) => `${w}=${n}`).join(", ")}`)
    return result
  })

/** Whether the restored table equals the table before the restart. */
export const sameTable = (a: ReadonlyMap<string, number>, b: ReadonlyMap<string, number>): boolean =>
  a.size === b.size && [...a].every(([k, v]) => b.get(k) === v)

/** The default text: the opening of the Faust article's subject, as counting material. */
export const defaultText =
  "A table is a distributed in-memory dictionary backed by a changelog topic. " +
  "Every change to the table is written to the changelog, and the changelog is what " +
  "a worker reads to restore the table after a restart or a rebalance. " +
  "The table lives in the store; the truth lives in the log."
