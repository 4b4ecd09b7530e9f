// Table writes (`@strata/tables`) against raw produce of the same records through the same Kafka log (docs/ARCHITECTURE.md, "Benchmarks").
//
// A table (string keys of 14 characters, string values of 98 characters: 16-byte keys and 100-byte values in the
// table's JSON encoding) with PARTITIONS partitions. Source record i is (SOURCE, i % PARTITIONS, i / PARTITIONS);
// processing it writes key i once: `tables.process(source, table.set(key, value))`, i.e. one changelog record
// (acks=all, partition = the source partition, header `strata-source`) produced in one `produceBatch`. Every
// COMMIT_EVERY records `manager.onCommit` commits every source partition, so the buffered writes, the changelog
// offsets and the source offsets reach the store (memory or level, in a fresh temporary directory) in the timed part;
// a last commit at the end is timed too.
//
// Two patterns, each against its baseline: the same changelog records (the same key, value and header bytes, the same
// partitions) produced straight through the same `KafkaLog` instance, to a fresh topic with the changelog's settings:
// - sequential: one source record after the other (SEQUENTIAL records); baseline: sequential `log.produce(record)`,
//   and as a reference sequential `log.produceBatch([record])` (what `process` sends).
// - concurrent: CONCURRENCY source records at a time (`Effect.forEach`) in chunks of COMMIT_EVERY with the commit
//   between chunks (CONCURRENT records); baseline: the same chunks of `log.produceBatch([record])` (one batch per source
//   record, what `process` sends), and as a reference the same chunks of `log.produce(record)`, which lets
//   concurrent callers share requests.
// Topic creation (leaders elected), manager start, partition assignment and recovery are outside the timed parts.
// Every run is checked afterwards: the topic holds exactly the records produced, and for table runs the table's
// partitions hold every key. Repetitions are interleaved (order reversed on odd repetitions), each figure is the
// median, after a warm-up of every variant.
//
// Environment (for quick checks; the results file is written only with the defaults):
//   BENCH_SEQUENTIAL (2000), BENCH_CONCURRENT (10000), BENCH_CONCURRENCY (64), BENCH_PARTITIONS (12),
//   BENCH_COMMIT_EVERY (1000), BENCH_RUNS (5), BENCH_KAFKA_BROKER (127.0.0.1:9092),
//   BENCH_VARIANTS (all: raw.produce, raw.produceBatch, table.memory, table.level; e.g. to profile one)
import { Log, MemoryStore, type Models } from "../packages/core/src/index.js"
import { mkdtempSync, rmSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import { Context, Effect, Layer, Logger, Schema } from "effect"
import * as KafkaLog from "../packages/kafka/src/KafkaLog.js"
import * as LevelStore from "../packages/store-adapters/src/LevelStore.js"
import { Table, Tables } from "../packages/tables/src/index.js"
import {
  type BenchOutput,
  collectGarbage,
  envInt,
  envString,
  type Figure,
  median,
  progress,
  randomBytes,
  round3
} from "./lib.js"

type Platformatic = typeof import("../packages/kafka/node_modules/@platformatic/kafka/dist/index.js")

const DEFAULTS = {
  sequential: 2000,
  concurrent: 10_000,
  concurrency: 64,
  partitions: 12,
  commitEvery: 1000,
  runs: 5,
  broker: "127.0.0.1:9092"
} as const
const KEY_CHARS = 14 // "key-%010d": 16 bytes as JSON
const VALUE_CHARS = 98 // 100 bytes as JSON
const VALUE_POOL = 4099
const WARMUP_RECORDS = 500
const SOURCE = "strata-bench-tables-source"
const SOURCE_HEADER = "strata-source"
const TABLE = "bench"
/** What `KafkaLog.ensureTopic` sets on a compacted topic (a changelog), so raw topics match the changelogs. */
const COMPACTED = [
  { name: "cleanup.policy", value: "compact,delete" },
  { name: "retention.ms", value: "-1" },
  { name: "retention.bytes", value: "-1" }
]

type Pattern = "sequential" | "concurrent"
type Variant = "raw.produce" | "raw.produceBatch" | "table.memory" | "table.level"
const VARIANTS: Record<Pattern, ReadonlyArray<Variant>> = {
  sequential: ["raw.produce", "raw.produceBatch", "table.memory", "table.level"],
  concurrent: ["raw.produceBatch", "raw.produce", "table.memory", "table.level"]
}

interface Plan {
  readonly pattern: Pattern
  readonly records: number
  readonly concurrency: number
  readonly partitions: number
  readonly commitEvery: number
}

// ---------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------

interface Data {
  readonly keys: ReadonlyArray<string>
  readonly values: ReadonlyArray<string>
  /** The keys and values as the table encodes them (JSON of the string, UTF-8). */
  readonly keyBytes: ReadonlyArray<Uint8Array>
  readonly valueBytes: ReadonlyArray<Uint8Array>
}

const encoder = new TextEncoder()
const ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

const makeData = (records: number): Data => {
  const keys = Array.from({ length: records }, (_, i) => `key-${String(i).padStart(KEY_CHARS - 4, "0")}`)
  const pool = randomBytes(VALUE_POOL * VALUE_CHARS, 0x5eed)
  const values = Array.from({ length: VALUE_POOL }, (_, v) => {
    let s = ""
    for (let j = 0; j < VALUE_CHARS; j++) s += ALPHABET[pool[v * VALUE_CHARS + j]! & 63]
    return s
  })
  const json = (s: string) => encoder.encode(JSON.stringify(s))
  return { keys, values, keyBytes: keys.map(json), valueBytes: values.map(json) }
}

const sourceOf = (plan: Plan, i: number): Models.TopicPartitionOffset => ({
  topic: SOURCE,
  partition: i % plan.partitions,
  offset: Math.floor(i / plan.partitions)
})

/** The header `process` puts on each changelog record (Tables.ts `sourceHeader`). */
const headerOf = (source: Models.TopicPartitionOffset): Log.Header => ({
  key: SOURCE_HEADER,
  value: encoder.encode(JSON.stringify([source.topic, source.partition, source.offset]))
})

/** The changelog record of source record i, as a raw producer would build it. */
const recordOf = (data: Data, plan: Plan, topic: string, i: number): Log.ProducerRecord => {
  const source = sourceOf(plan, i)
  return {
    topic,
    partition: source.partition,
    key: data.keyBytes[i]!,
    value: data.valueBytes[i % VALUE_POOL]!,
    headers: [headerOf(source)]
  }
}

/** Next offset to read of every source partition once records 0..end-1 are processed. */
const committedAt = (plan: Plan, end: number): Array<Models.TopicPartitionOffset> => {
  const out: Array<Models.TopicPartitionOffset> = []
  for (let p = 0; p < plan.partitions; p++) {
    const offset = Math.floor((end - p + plan.partitions - 1) / plan.partitions)
    if (offset > 0) out.push({ topic: SOURCE, partition: p, offset })
  }
  return out
}

// ---------------------------------------------------------------------------
// Topics (outside the timed parts)
// ---------------------------------------------------------------------------

const kafkaRequire = createRequire(new URL("../packages/kafka/package.json", import.meta.url))

let topicCount = 0
const freshName = (what: string) => `strata-bench-tables-${what}-${process.pid}-${Date.now()}-${++topicCount}`

const makeAdmin = (pk: Platformatic, broker: string) => {
  const admin = new pk.Admin({ clientId: "strata-bench-admin", bootstrapBrokers: [broker] })
  return {
    /** Creates a compacted topic and waits until every partition has a leader. */
    create: async (topic: string, partitions: number) => {
      await admin.createTopics({ topics: [topic], partitions, replicas: 1, configs: COMPACTED })
      for (let attempt = 0; ; attempt++) {
        const md = await admin.metadata({ topics: [topic], forceUpdate: true }).catch(() => undefined)
        const info = md?.topics.get(topic)
        if (info !== undefined && info.partitionsCount === partitions && info.partitions.every((p) => p.leader >= 0))
          return
        if (attempt > 100) throw new Error(`${topic}: no leaders after 10 s`)
        await new Promise((r) => setTimeout(r, 100))
      }
    },
    remove: (topic: string) => admin.deleteTopics({ topics: [topic] }).catch(() => undefined),
    close: () => admin.close()
  }
}
type Admin = ReturnType<typeof makeAdmin>

/** A topic created (leaders elected) for the life of the scope, deleted afterwards. */
const topicScoped = (admin: Admin, topic: string, partitions: number) =>
  Effect.acquireRelease(
    Effect.promise(() => admin.create(topic, partitions)),
    () => Effect.promise(() => admin.remove(topic))
  )

/** A fresh temporary directory for the life of the scope. */
const tempDirScoped = Effect.acquireRelease(
  Effect.sync(() => mkdtempSync(join(tmpdir(), "strata-bench-tables-"))),
  (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
)

/** A produce or a table run that does not leave exactly `records` records in the topic is a broken benchmark. */
const checkHighwaters = (log: Log.Shape, topic: string, plan: Plan) =>
  Effect.gen(function* () {
    const offsets = yield* log.offsets(
      Array.from({ length: plan.partitions }, (_, partition) => ({ topic, partition }))
    )
    const total = offsets.reduce((n, o) => n + o.highwater - o.logStart, 0)
    if (total !== plan.records)
      return yield* Effect.die(new Error(`${topic}: ${total} records, expected ${plan.records}`))
  })

// ---------------------------------------------------------------------------
// The timed work
// ---------------------------------------------------------------------------

/** Wall time of a run, and this process's CPU time (user + system) meanwhile: low CPU means waiting on the broker. */
interface Timing {
  readonly ms: number
  readonly cpuMs: number
}

const timed = <E>(effect: Effect.Effect<void, E>): Effect.Effect<Timing, E> =>
  Effect.suspend(() => {
    const cpu0 = process.cpuUsage()
    const t0 = performance.now()
    return Effect.map(effect, () => {
      const cpu = process.cpuUsage(cpu0)
      return { ms: performance.now() - t0, cpuMs: (cpu.user + cpu.system) / 1000 }
    })
  })

/** Runs `one(i)` for every record in the plan's pattern, with `between(end)` after each chunk of COMMIT_EVERY. */
const drive = <E1, E2>(
  plan: Plan,
  one: (i: number) => Effect.Effect<unknown, E1>,
  between: (end: number) => Effect.Effect<void, E2>
): Effect.Effect<void, E1 | E2> =>
  Effect.gen(function* () {
    for (let start = 0; start < plan.records; start += plan.commitEvery) {
      const end = Math.min(plan.records, start + plan.commitEvery)
      if (plan.pattern === "sequential") {
        for (let i = start; i < end; i++) yield* one(i)
      } else {
        const indices = Array.from({ length: end - start }, (_, k) => start + k)
        yield* Effect.forEach(indices, one, { concurrency: plan.concurrency, discard: true })
      }
      yield* between(end)
    }
  })

/** Raw produce of the changelog records to a fresh topic; returns the timed milliseconds. */
const rawRun = (log: Log.Shape, admin: Admin, data: Data, plan: Plan, how: "produce" | "produceBatch") =>
  Effect.scoped(
    Effect.gen(function* () {
      const topic = freshName("raw")
      yield* topicScoped(admin, topic, plan.partitions)
      // As the manager's start does for its changelog: the log learns the topic's partitions before timing.
      yield* log.ensureTopic({ topic, partitions: plan.partitions, compacted: true })
      const one =
        how === "produce"
          ? (i: number) => log.produce(recordOf(data, plan, topic, i), { acks: "all" })
          : (i: number) => log.produceBatch([recordOf(data, plan, topic, i)], { acks: "all" })
      const timing = yield* timed(drive(plan, one, () => Effect.void))
      yield* checkHighwaters(log, topic, plan)
      return timing
    })
  )

const tableDef = (partitions: number) =>
  Table.make({ name: TABLE, key: Schema.String, value: Schema.String, partitions })

/** Table writes with periodic commits on a fresh manager, store and changelog; returns the timed milliseconds. */
const tableRun = (log: Log.Shape, admin: Admin, data: Data, plan: Plan, store: "memory" | "level") =>
  Effect.scoped(
    Effect.gen(function* () {
      const app = freshName(store)
      const def = tableDef(plan.partitions)
      const changelog = Table.changelogTopicOf(app, def as Table.TableDef<unknown, unknown>)
      yield* topicScoped(admin, changelog, plan.partitions)
      const storeLayer =
        store === "memory" ? MemoryStore.layer() : LevelStore.layer({ directory: yield* tempDirScoped })
      const services = Context.add(yield* Layer.build(storeLayer), Log.Log, log)
      const tables = yield* Tables.make({ app, settleDelay: 0, recovery: { recoveryDelay: 0 } }).pipe(
        Effect.provide(services)
      )
      const table = yield* tables.register(def)
      yield* tables.start
      yield* tables.manager.onPartitionsAssigned(
        Array.from({ length: plan.partitions }, (_, partition) => ({ topic: SOURCE, partition }))
      )
      yield* tables.manager.waitUntilRecoveryCompleted
      const timing = yield* timed(
        drive(
          plan,
          (i) => tables.process(sourceOf(plan, i), table.set(data.keys[i]!, data.values[i % VALUE_POOL]!)),
          (end) => tables.manager.onCommit(committedAt(plan, end))
        )
      )
      yield* checkHighwaters(log, changelog, plan)
      let stored = 0
      for (let p = 0; p < plan.partitions; p++) stored += (yield* table.entries(p)).length
      if (stored !== plan.records) {
        return yield* Effect.die(new Error(`${app}: the table holds ${stored} entries, expected ${plan.records}`))
      }
      return timing
    })
  )

// ---------------------------------------------------------------------------
// Repetitions and figures
// ---------------------------------------------------------------------------

export const run = async (): Promise<BenchOutput & { readonly save: boolean }> => {
  const sequential = envInt("BENCH_SEQUENTIAL", DEFAULTS.sequential)
  const concurrent = envInt("BENCH_CONCURRENT", DEFAULTS.concurrent)
  const concurrency = envInt("BENCH_CONCURRENCY", DEFAULTS.concurrency)
  const partitions = envInt("BENCH_PARTITIONS", DEFAULTS.partitions)
  const commitEvery = envInt("BENCH_COMMIT_EVERY", DEFAULTS.commitEvery)
  const runs = envInt("BENCH_RUNS", DEFAULTS.runs)
  const broker = envString("BENCH_KAFKA_BROKER") ?? DEFAULTS.broker
  const only = envString("BENCH_VARIANTS")
    ?.split(",")
    .filter((v) => v !== "")
  const all: ReadonlyArray<string> = [...VARIANTS.sequential, ...VARIANTS.concurrent]
  for (const v of only ?? []) if (!all.includes(v)) throw new Error(`BENCH_VARIANTS: unknown variant ${v}`)
  const variantsOf = (pattern: Pattern) => VARIANTS[pattern].filter((v) => only === undefined || only.includes(v))
  const save =
    sequential === DEFAULTS.sequential &&
    concurrent === DEFAULTS.concurrent &&
    concurrency === DEFAULTS.concurrency &&
    partitions === DEFAULTS.partitions &&
    commitEvery === DEFAULTS.commitEvery &&
    runs === DEFAULTS.runs &&
    broker === DEFAULTS.broker &&
    only === undefined
  const plans: Record<Pattern, Plan> = {
    sequential: { pattern: "sequential", records: sequential, concurrency: 1, partitions, commitEvery },
    concurrent: { pattern: "concurrent", records: concurrent, concurrency, partitions, commitEvery }
  }
  progress(
    `tables: ${sequential} sequential and ${concurrent} concurrent (${concurrency} at a time) records, ` +
      `${partitions} partitions, commit every ${commitEvery}, ${runs} runs on ${broker}`
  )
  const pk = (await import(pathToFileURL(kafkaRequire.resolve("@platformatic/kafka")).href)) as Platformatic
  const data = makeData(Math.max(sequential, concurrent, WARMUP_RECORDS))
  // The raw records carry exactly the bytes the table writes.
  const codecs = Table.codecs(tableDef(partitions))
  const k0 = codecs.encodeKey(data.keys[0]!)
  const v0 = codecs.encodeValue(data.values[0]!)
  if (
    k0._tag !== "Success" ||
    v0._tag !== "Success" ||
    Buffer.compare(k0.success, data.keyBytes[0]!) !== 0 ||
    Buffer.compare(v0.success, data.valueBytes[0]!) !== 0 ||
    k0.success.length !== KEY_CHARS + 2 ||
    v0.success.length !== VALUE_CHARS + 2
  ) {
    throw new Error("the raw records do not carry the bytes the table encodes")
  }

  const admin = makeAdmin(pk, broker)
  const samples: Record<Pattern, Record<Variant, Array<Timing>>> = {
    sequential: { "raw.produce": [], "raw.produceBatch": [], "table.memory": [], "table.level": [] },
    concurrent: { "raw.produce": [], "raw.produceBatch": [], "table.memory": [], "table.level": [] }
  }
  const program = Effect.gen(function* () {
    const log = yield* KafkaLog.make({ brokers: [broker], clientId: "strata-bench-tables" })
    const once = (variant: Variant, plan: Plan) =>
      variant === "raw.produce"
        ? rawRun(log, admin, data, plan, "produce")
        : variant === "raw.produceBatch"
          ? rawRun(log, admin, data, plan, "produceBatch")
          : tableRun(log, admin, data, plan, variant === "table.memory" ? "memory" : "level")
    for (const pattern of ["sequential", "concurrent"] as const) {
      const variants = variantsOf(pattern)
      if (variants.length === 0) continue
      progress(`tables ${pattern}: warm-up (${WARMUP_RECORDS} records per variant)`)
      for (const variant of variants) yield* once(variant, { ...plans[pattern], records: WARMUP_RECORDS })
      for (let rep = 0; rep < runs; rep++) {
        for (const variant of rep % 2 === 0 ? variants : [...variants].reverse()) {
          collectGarbage()
          const t = yield* once(variant, plans[pattern])
          samples[pattern][variant].push(t)
          const rate = plans[pattern].records / (t.ms / 1000)
          progress(
            `tables ${pattern} ${variant} #${rep + 1}: ${t.ms.toFixed(0)} ms, ${rate.toFixed(0)} records/s, ` +
              `CPU ${((100 * t.cpuMs) / t.ms).toFixed(0)}%`
          )
        }
      }
    }
  }).pipe(Effect.scoped, Effect.provide(Logger.layer([])))
  try {
    await Effect.runPromise(program)
  } finally {
    await admin.close()
  }

  const rates = (pattern: Pattern, variant: Variant) =>
    samples[pattern][variant].map((t) => plans[pattern].records / (t.ms / 1000))
  /** CPU time of this process per record, in microseconds. */
  const cpuPerRecord = (pattern: Pattern, variant: Variant) =>
    samples[pattern][variant].map((t) => round3((1000 * t.cpuMs) / plans[pattern].records))
  const common = (pattern: Pattern) => ({
    records: plans[pattern].records,
    partitions,
    commitEvery,
    ...(pattern === "concurrent" ? { concurrency } : {}),
    keyBytes: KEY_CHARS + 2,
    valueBytes: VALUE_CHARS + 2,
    acks: "all",
    runs
  })
  const figure = (pattern: Pattern, variant: Variant, baselineVariant: Variant, extra: Record<string, unknown>) => {
    const value = median(rates(pattern, variant))
    const baseline = median(rates(pattern, baselineVariant))
    const out: Figure = {
      bench: `tables.${pattern}.${variant.replace(/^table\./, "set.")}`,
      value: Math.round(value),
      unit: "records/s",
      baseline: Math.round(baseline),
      ratio: round3(value / baseline),
      baselineClient: `KafkaLog ${baselineVariant.replace(/^raw\./, "")}, same records, same log`,
      ...common(pattern),
      ...extra
    }
    return out
  }
  const wanted: ReadonlyArray<readonly [Pattern, Variant, Variant, Record<string, unknown>]> = [
    ["sequential", "table.memory", "raw.produce", { store: "memory" }],
    ["sequential", "table.level", "raw.produce", { store: "level" }],
    [
      "sequential",
      "raw.produceBatch",
      "raw.produce",
      { reference: "raw log.produceBatch([record]) (what process sends) against raw log.produce(record)" }
    ],
    ["concurrent", "table.memory", "raw.produceBatch", { store: "memory" }],
    ["concurrent", "table.level", "raw.produceBatch", { store: "level" }],
    [
      "concurrent",
      "raw.produce",
      "raw.produceBatch",
      { reference: "raw log.produce (concurrent callers share requests) against raw produceBatch of one record each" }
    ]
  ]
  // A figure needs both its variant and its baseline (BENCH_VARIANTS may leave some out).
  const results: Array<Figure> = wanted
    .filter(([pattern, v, b]) => samples[pattern][v].length > 0 && samples[pattern][b].length > 0)
    .map(([pattern, v, b, extra]) => figure(pattern, v, b, extra))
  const details: Record<string, unknown> = {
    broker,
    records: `key "key-%010d", values of ${VALUE_CHARS} characters (${VALUE_POOL} distinct, round-robin), JSON-encoded by the table (${KEY_CHARS + 2}-byte keys, ${VALUE_CHARS + 2}-byte values) plus the strata-source header; source record i is partition i % ${partitions}, offset i / ${partitions}`,
    table: `Table.make({ key: Schema.String, value: Schema.String, partitions: ${partitions} }), Tables.make({ settleDelay: 0 }), all source partitions assigned, recovery completed before timing`,
    write: "tables.process(source, table.set(key, value)): one changelog record per source record, acks=all",
    commit: `manager.onCommit(every source partition) after every ${commitEvery} records and at the end, timed`,
    patterns: {
      sequential:
        "one source record after the other; baseline: sequential log.produce(record, { acks: 'all' }); reference: sequential log.produceBatch([record]) (what process sends)",
      concurrent: `Effect.forEach over each chunk of ${commitEvery} records with concurrency ${concurrency}, the commit between chunks; baseline: the same chunks of log.produceBatch([record]) (what process sends); reference: log.produce(record)`
    },
    sizing:
      "each process call is one acks=all request (~0.5-1 ms here), so the record counts are kept small enough for the suite to finish in about 2 minutes",
    cpu: "cpuMicrosPerRecord: this process's user+system CPU time during the timed part per record; the rest of the wall time is waiting on the broker",
    stores: { memory: "MemoryStore.layer()", level: "LevelStore.layer({ directory: fresh temporary directory })" },
    order: `per pattern: warm-up of ${WARMUP_RECORDS} records per variant, then ${runs} repetitions of ${VARIANTS.sequential.join(", ")} (sequential) and ${VARIANTS.concurrent.join(", ")} (concurrent), reversed on odd repetitions; fresh topic per run, deleted after`,
    samples: Object.fromEntries(
      (["sequential", "concurrent"] as const).map((pattern) => [
        pattern,
        Object.fromEntries(
          VARIANTS[pattern].map((v) => [
            v,
            { recordsPerSecond: rates(pattern, v).map(Math.round), cpuMicrosPerRecord: cpuPerRecord(pattern, v) }
          ])
        )
      ])
    ),
    peakRssMB: Math.round(process.resourceUsage().maxRSS / 1024)
  }
  return { results, details, save }
}
