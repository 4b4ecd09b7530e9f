/**
 * The embedded demo: a `Worker` counts the words of a source topic into a
 * `Table` (every update goes to the table's changelog and, on commit, to its
 * store), stops, and restarts — on a fresh store, or on the same directory —
 * and the table is restored from its store and changelog by recovery.
 *
 * It runs on whatever `Store` and `Log` layers it is given; the CLI's default is
 * the in-memory pair, so it needs no servers.
 *
 * @since 0.1.0
 */
import { Log, type Models, Store } from "@strata/core"
import { Table, Tables, Worker } from "@strata/tables"
import { Console, Effect, type Layer, Option, Schedule, Schema } from "effect"

/** Options of the demo. */
export interface DemoOptions {
  /** The text whose words are counted. */
  readonly text: string
  /** Partitions of the source topic, the table and its changelog. */
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
  /** Where the restarted worker resumes each source partition: past every record already counted. */
  readonly resume: ReadonlyArray<{ readonly partition: number; readonly offset: number }>
}

const TABLE = "word-counts"

/**
 * The demo's topics. Their names carry the partition count, so runs with other `--partitions` on the same broker
 * never meet a topic of the wrong size.
 */
const topicsOf = (partitions: number) => {
  const app = `strata-demo-${partitions}p`
  return { app, source: `strata-demo-words-${partitions}p`, changelog: `${app}-${TABLE}-changelog` }
}
const enc = new TextEncoder()

const words = (text: string): Array<string> => text.toLowerCase().match(/[\p{L}\p{N}']+/gu) ?? []

const tpsOf = (topic: string, partitions: number): Array<Models.TopicPartition> =>
  Array.from({ length: partitions }, (_, partition) => ({ topic, partition }))

/** The word-count table: word → count, partitioned like the source topic. */
const countsTable = (partitions: number) =>
  Table.make({ name: TABLE, key: Schema.String, value: Schema.Int, partitions })

/** Every entry of every partition of the table. */
const readTable = (table: Tables.TableHandle<string, number>, partitions: number) =>
  Effect.gen(function* () {
    const out = new Map<string, number>()
    for (let p = 0; p < partitions; p++) for (const [w, n] of yield* table.entries(p)) out.set(w, n)
    return out
  })

/**
 * One worker run: a `Worker` with one agent counting the words of the source topic into the table, on a table
 * manager over the `Store` in context. It joins the demo's group, restores the table, counts every word from where
 * the tables say to resume, and stops (committing) once every partition is processed to its end.
 */
const worker = (options: DemoOptions, say: (line: string) => Effect.Effect<void>) =>
  Effect.scoped(
    Effect.gen(function* () {
      const { app, source } = topicsOf(options.partitions)
      const tables = yield* Tables.make({ app, settleDelay: 0 })
      const counts = yield* tables.register(countsTable(options.partitions))
      const decoder = new TextDecoder()
      const running = yield* Worker.make({ groupId: app, commitInterval: "1 second" }, [
        Worker.agent({
          name: "count-words",
          topics: [source],
          process: (record) =>
            Effect.asVoid(
              counts.update(decoder.decode(record.value ?? new Uint8Array()), (n) => Option.getOrElse(n, () => 0) + 1)
            )
        })
      ]).pipe(Effect.provideService(Tables.Tables, tables))
      // Every partition processed to its end (the worker's own lag), or the worker failed.
      const metrics = yield* Effect.raceFirst(
        Effect.repeat(running.metrics, {
          until: (m) => m.lag.length === options.partitions && m.lag.every((l) => l.offset === 0),
          schedule: Schedule.spaced("10 millis")
        }),
        running.join
      )
      yield* say(`Worker caught up: ${metrics.recordsProcessed} words counted, committing on stop`)
      const resume = yield* Effect.forEach(tpsOf(source, options.partitions), (tp) =>
        Effect.map(tables.resumeOffset(tp), (o) => ({ partition: tp.partition, offset: Option.getOrElse(o, () => 0) }))
      )
      return { table: yield* readTable(counts, options.partitions), resume }
    })
  )

/** For each changelog partition: what a restore replays (persisted offset + 1, or the log start, to the highwater). */
const replayPlan = (store: Store.Shape, log: Log.Shape, partitions: number) =>
  Effect.gen(function* () {
    const offsets = yield* log.offsets(tpsOf(topicsOf(partitions).changelog, partitions))
    return yield* Effect.forEach(offsets, (o) =>
      Effect.scoped(
        Effect.gen(function* () {
          const st = yield* store.open({ table: TABLE, partition: o.partition })
          const persisted = yield* st.persistedOffset(o)
          const from = Math.max(Option.match(persisted, { onNone: () => 0, onSome: (p) => p + 1 }), o.logStart)
          return { partition: o.partition, from, to: o.highwater }
        })
      )
    )
  })

/**
 * Runs the demo on the `Log` in context. The worker runs on the `before` store
 * layer, stops (closing it), and restarts on the `after` layer: the same
 * directory for a persistent store, a fresh memory store to lose all state.
 */
export const run = <E1, E2>(
  options: DemoOptions,
  stores: { readonly before: Layer.Layer<Store.Store, E1>; readonly after: Layer.Layer<Store.Store, E2> }
) =>
  Effect.gen(function* () {
    const log = yield* Log.Log
    const say = (line: string) => (options.verbose ? Console.log(line) : Effect.void)
    const { source, changelog } = topicsOf(options.partitions)

    // Topics left by an earlier run (on a real broker) are truncated: the demo starts from an empty table.
    for (const topic of [source, changelog]) {
      yield* log.ensureTopic({ topic, partitions: options.partitions, compacted: topic === changelog })
      for (const o of yield* log.offsets(tpsOf(topic, options.partitions))) {
        if (o.highwater > o.logStart) yield* log.deleteRecords(o, o.highwater)
      }
    }
    const all = words(options.text)
    yield* log.produceBatch(
      all.map((word) => {
        const key = enc.encode(word)
        return { topic: source, partition: Table.keyPartition(key, options.partitions), key, value: key }
      }),
      { acks: "all" }
    )

    const before = yield* Effect.gen(function* () {
      const store = yield* Store.Store
      // Start from an empty table, whatever an earlier run left in a persistent store.
      for (let partition = 0; partition < options.partitions; partition++)
        yield* store.drop({ table: TABLE, partition })
      yield* say(
        `Counting ${all.length} words from ${source} into table ${TABLE} (${options.partitions} partitions, store: ${store.backend}, changelog: ${changelog} on ${log.backend})`
      )
      return (yield* worker(options, say)).table
    }).pipe(Effect.provide(stores.before))
    const hw = yield* log.offsets(tpsOf(changelog, options.partitions))
    const changelogRecords = hw.reduce((n, o) => n + o.highwater - o.logStart, 0)
    yield* say(`Counted ${all.length} words: ${before.size} distinct words, ${changelogRecords} changelog records`)

    yield* say("Restarting the worker: the table's store is reopened and restored from its changelog")
    const restarted = yield* Effect.gen(function* () {
      const replayed = yield* replayPlan(yield* Store.Store, log, options.partitions)
      const { table, resume } = yield* worker(options, say)
      return { table, replayed, resume }
    }).pipe(Effect.provide(stores.after))
    for (const r of restarted.replayed) {
      yield* say(
        `  partition ${r.partition}: replayed ${r.to - r.from} records, from offset ${r.from} up to the highwater ${r.to}`
      )
    }
    yield* say(
      `Source resumes at ${restarted.resume.map((r) => `${r.partition}@${r.offset}`).join(", ")}: no word is counted twice`
    )
    const result: DemoResult = {
      before,
      after: restarted.table,
      changelogRecords,
      replayed: restarted.replayed,
      resume: restarted.resume
    }
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
