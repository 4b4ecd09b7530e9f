// The Kafka log adapter against its bare client (docs/ARCHITECTURE.md, "Benchmarks").
//
// RECORDS records (16-byte keys "key-%012d", 100-byte values, record i to partition i % PARTITIONS) are produced to
// a fresh PARTITIONS-partition topic in calls of BATCH records with up to IN_FLIGHT calls outstanding, then consumed
// back from the log start until every partition reaches its highwater. Three clients do the same work, each on its
// own fresh topic (unique name, deleted afterwards), in the same process, against the same broker:
// - adapter: `KafkaLog.make` (`@strata/kafka`): `produceBatch(records, { acks: "all" })`, then a `consumer()` with
//   all partitions assigned, reading `batches` (maxBatchRecords = BATCH).
// - bare (the baseline): the @platformatic/kafka copy the adapter loads, used directly: an idempotent `Producer`
//   (acks=all, as the adapter's) sending the same messages per call, and a `Consumer#fetch` loop without any group,
//   with the adapter's fetch sizes (maxBytes 16 MiB, partitionMaxBytes 2 MiB, maxWaitTime 250 ms) over all partitions.
// - kafkajs (a reference line only, not the baseline): kafkajs 2.2.4 with an idempotent producer
//   (maxInFlightRequests 1, acks -1) and a consumer group with eachBatch and the same fetch sizes. Its consume time
//   starts at the first batch, after the group join (the join, ~3 s of group.initial.rebalance.delay.ms, is kept in
//   the details).
// Topic creation, leader election, client start and the consumer's assignment are outside the timed parts. Between
// produce and consume the highwaters are checked (no record lost or duplicated); every consume checks the records
// and bytes read. Repetitions are interleaved (bare, adapter, kafkajs, then reversed) and each figure is the median.
//
// Environment (for quick checks; the results file is written only with the defaults):
//   BENCH_RECORDS (1000000), BENCH_BATCH (1000), BENCH_PARTITIONS (12), BENCH_IN_FLIGHT (1), BENCH_RUNS (3),
//   BENCH_CLIENTS (bare,adapter,kafkajs), BENCH_KAFKA_BROKER (127.0.0.1:9092)
import type { Log, Models } from "../packages/core/src/index.js"
import { readFileSync } from "node:fs"
import { createRequire } from "node:module"
import { pathToFileURL } from "node:url"
import { Effect, Stream } from "effect"
import * as KafkaJs from "kafkajs"
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
type KafkaModule = typeof import("../packages/kafka/src/index.js")

const DEFAULTS = {
  records: 1_000_000,
  batch: 1000,
  partitions: 12,
  inFlight: 1,
  runs: 3,
  clients: ["bare", "adapter", "kafkajs"],
  broker: "127.0.0.1:9092"
} as const
const VALUE_BYTES = 100
const KEY_BYTES = 16
const VALUE_POOL = 4099
const WARMUP_RECORDS = 50_000
/** The adapter's fetch sizes and wait (makeConsumer in packages/kafka/src/KafkaLog.ts, `maxWait` default). */
const FETCH = { maxBytes: 16 * 1024 * 1024, partitionMaxBytes: 2 * 1024 * 1024, maxWaitMs: 250 } as const

type Client = "bare" | "adapter" | "kafkajs"

interface Plan {
  readonly records: number
  readonly batch: number
  readonly partitions: number
  readonly inFlight: number
  readonly broker: string
}

interface Timing {
  readonly produceMs: number
  readonly consumeMs: number
  /** Batches delivered to the caller (stream elements, fetch responses' partitions, eachBatch calls). */
  readonly consumeBatches: number
  readonly joinMs?: number
}

// ---------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------

interface Data {
  readonly keys: ReadonlyArray<Buffer>
  readonly values: ReadonlyArray<Buffer>
}

const makeData = (records: number): Data => {
  const keyBytes = Buffer.allocUnsafe(records * KEY_BYTES)
  const keys = new Array<Buffer>(records)
  for (let i = 0; i < records; i++) {
    keyBytes.write(`key-${String(i).padStart(12, "0")}`, i * KEY_BYTES, "latin1")
    keys[i] = keyBytes.subarray(i * KEY_BYTES, (i + 1) * KEY_BYTES)
  }
  const pool = randomBytes(VALUE_POOL * VALUE_BYTES, 0x5eed)
  const values = Array.from({ length: VALUE_POOL }, (_, i) => pool.subarray(i * VALUE_BYTES, (i + 1) * VALUE_BYTES))
  return { keys, values }
}

const valueAt = (data: Data, i: number): Buffer => data.values[i % VALUE_POOL]!

/** Records per partition after producing `records` round-robin: the highwater each consumer must reach. */
const highwatersOf = (plan: Plan): Array<number> =>
  Array.from({ length: plan.partitions }, (_, p) =>
    Math.floor((plan.records - p + plan.partitions - 1) / plan.partitions)
  )

/** Runs `send(start, end)` for every batch, at most `inFlight` at a time, in batch order. */
const produceAll = async (plan: Plan, send: (start: number, end: number) => Promise<unknown>): Promise<void> => {
  let next = 0
  const worker = async () => {
    while (next < plan.records) {
      const start = next
      next = Math.min(plan.records, start + plan.batch)
      await send(start, next)
    }
  }
  await Promise.all(Array.from({ length: plan.inFlight }, worker))
}

/** A consume that does not return every record is a broken benchmark, not a slow one. */
const check = (what: string, plan: Plan, count: number, bytes: number) => {
  const expected = plan.records * (KEY_BYTES + VALUE_BYTES)
  if (count !== plan.records || bytes !== expected) {
    throw new Error(`${what}: read ${count} records / ${bytes} bytes, expected ${plan.records} / ${expected}`)
  }
}

// ---------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------

const kafkaRequire = createRequire(new URL("../packages/kafka/package.json", import.meta.url))

let topicCount = 0
const freshTopic = (client: Client) => `strata-bench-${client}-${process.pid}-${Date.now()}-${++topicCount}`

/** Topic administration outside the timed parts, with the bare client. */
const makeAdmin = (pk: Platformatic, broker: string) => {
  const admin = new pk.Admin({ clientId: "strata-bench-admin", bootstrapBrokers: [broker] })
  return {
    create: async (topic: string, partitions: number) => {
      await admin.createTopics({ topics: [topic], partitions, replicas: 1 })
      // Wait until every partition has a leader, so the timed part does not wait for elections.
      for (let attempt = 0; ; attempt++) {
        const md = await admin.metadata({ topics: [topic], forceUpdate: true }).catch(() => undefined)
        const info = md?.topics.get(topic)
        if (info !== undefined && info.partitionsCount === partitions && info.partitions.every((p) => p.leader >= 0))
          return
        if (attempt > 100) throw new Error(`${topic}: no leaders after 10 s`)
        await new Promise((r) => setTimeout(r, 100))
      }
    },
    /** After a produce: every partition holds exactly its share (nothing lost, nothing duplicated). */
    checkHighwaters: async (topic: string, plan: Plan) => {
      const listed = await admin.listOffsets({
        topics: [
          {
            name: topic,
            partitions: Array.from({ length: plan.partitions }, (_, partitionIndex) => ({
              partitionIndex,
              timestamp: pk.ListOffsetTimestamps.LATEST
            }))
          }
        ]
      })
      const actual = new Array<number>(plan.partitions).fill(-1)
      for (const t of listed) for (const p of t.partitions) actual[p.partitionIndex] = Number(p.offset)
      const expected = highwatersOf(plan)
      if (actual.some((h, p) => h !== expected[p])) {
        throw new Error(`${topic}: highwaters ${actual.join(",")} after producing, expected ${expected.join(",")}`)
      }
    },
    remove: (topic: string) => admin.deleteTopics({ topics: [topic] }).catch(() => undefined),
    close: () => admin.close()
  }
}

/** Runs between the timed produce and the timed consume: the highwater check. */
type AfterProduce = () => Promise<void>

/** The adapter: produceBatch with acks "all", then the changelog consumer's `batches` until all highwaters. */
const adapterRun = (
  { KafkaLog }: KafkaModule,
  data: Data,
  plan: Plan,
  topic: string,
  afterProduce: AfterProduce
): Promise<Timing> =>
  Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        const log = yield* KafkaLog.make({ brokers: [plan.broker] })
        const recordsOf = (start: number, end: number): Array<Log.ProducerRecord> => {
          const records = new Array<Log.ProducerRecord>(end - start)
          for (let i = start; i < end; i++) {
            records[i - start] = { topic, partition: i % plan.partitions, key: data.keys[i]!, value: valueAt(data, i) }
          }
          return records
        }
        const t0 = performance.now()
        yield* Effect.promise(() =>
          produceAll(plan, (start, end) => Effect.runPromise(log.produceBatch(recordsOf(start, end), { acks: "all" })))
        )
        yield* log.flush
        const produceMs = performance.now() - t0
        yield* Effect.promise(afterProduce)

        const tps: Array<Models.TopicPartition> = Array.from({ length: plan.partitions }, (_, partition) => ({
          topic,
          partition
        }))
        const consumer = yield* log.consumer({ maxBatchRecords: plan.batch })
        yield* consumer.assign(tps)
        const targets = highwatersOf(plan)
        let unfinished = targets.filter((h) => h > 0).length
        let count = 0
        let bytes = 0
        let batches = 0
        const t1 = performance.now()
        yield* Stream.runForEachWhile(consumer.batches, (b: Log.Batch) =>
          Effect.sync(() => {
            batches++
            for (const r of b.records) {
              count++
              bytes += (r.key?.length ?? 0) + (r.value?.length ?? 0)
            }
            const last = b.records[b.records.length - 1]
            if (last !== undefined && last.offset + 1 === targets[b.partition]) unfinished--
            return unfinished > 0
          })
        )
        const consumeMs = performance.now() - t1
        check("adapter consume", plan, count, bytes)
        return { produceMs, consumeMs, consumeBatches: batches }
      })
    )
  )

/** The baseline: the same client, used directly. */
const bareRun = async (
  pk: Platformatic,
  data: Data,
  plan: Plan,
  topic: string,
  afterProduce: AfterProduce
): Promise<Timing> => {
  const base = {
    clientId: "strata-bench-bare",
    bootstrapBrokers: [plan.broker],
    timeout: 10_000,
    retries: 3,
    retryDelay: 250
  }
  const producer = new pk.Producer({ ...base, idempotent: true, acks: -1 })
  let produceMs: number
  try {
    const t0 = performance.now()
    await produceAll(plan, (start, end) => {
      const messages = new Array<{ topic: string; partition: number; key: Buffer; value: Buffer }>(end - start)
      for (let i = start; i < end; i++) {
        messages[i - start] = { topic, partition: i % plan.partitions, key: data.keys[i]!, value: valueAt(data, i) }
      }
      return producer.send({ messages })
    })
    produceMs = performance.now() - t0
  } finally {
    await producer.close()
  }
  await afterProduce()

  const consumer = new pk.Consumer({
    ...base,
    groupId: `strata-bench-bare-${process.pid}-${topicCount}`, // required by the constructor; never joined
    maxWaitTime: FETCH.maxWaitMs,
    isolationLevel: pk.FetchIsolationLevels.READ_UNCOMMITTED
  })
  try {
    const md = await consumer.metadata({ topics: [topic], forceUpdate: true })
    const info = md.topics.get(topic)!
    const byNode = new Map<number, Array<number>>()
    info.partitions.forEach((p, i) => {
      byNode.set(p.leader, [...(byNode.get(p.leader) ?? []), i])
    })
    const targets = highwatersOf(plan)
    const positions = new Array<number>(plan.partitions).fill(0)
    let count = 0
    let bytes = 0
    let batches = 0
    const t1 = performance.now()
    while (positions.some((p, i) => p < targets[i]!)) {
      await Promise.all(
        [...byNode].map(async ([node, partitions]) => {
          const response = await consumer.fetch({
            node,
            maxWaitTime: FETCH.maxWaitMs,
            maxBytes: FETCH.maxBytes,
            topics: [
              {
                topicId: info.id,
                partitions: partitions.map((partition) => ({
                  partition,
                  fetchOffset: BigInt(positions[partition]!),
                  currentLeaderEpoch: -1,
                  lastFetchedEpoch: -1,
                  partitionMaxBytes: FETCH.partitionMaxBytes
                }))
              }
            ]
          })
          for (const t of response.responses) {
            for (const p of t.partitions) {
              if (p.errorCode !== 0)
                throw new Error(`bare fetch: error ${p.errorCode} on partition ${p.partitionIndex}`)
              const records = p.records ?? []
              if (records.length > 0) batches++
              let position = positions[p.partitionIndex]!
              for (const batch of records) {
                const first = Number(batch.firstOffset)
                for (const r of batch.records) {
                  const offset = first + r.offsetDelta
                  if (offset < position) continue
                  count++
                  bytes += (r.key?.length ?? 0) + (r.value?.length ?? 0)
                  position = offset + 1
                }
              }
              positions[p.partitionIndex] = position
            }
          }
        })
      )
    }
    const consumeMs = performance.now() - t1
    check("bare consume", plan, count, bytes)
    return { produceMs, consumeMs, consumeBatches: batches }
  } finally {
    await consumer.close(true)
  }
}

/** The kafkajs reference: idempotent producer, then a group consumer with eachBatch. */
const kafkajsRun = async (data: Data, plan: Plan, topic: string, afterProduce: AfterProduce): Promise<Timing> => {
  const kafka = new KafkaJs.Kafka({
    clientId: "strata-bench-kafkajs",
    brokers: [plan.broker],
    logLevel: KafkaJs.logLevel.NOTHING
  })
  const producer = kafka.producer({
    idempotent: true,
    maxInFlightRequests: 1,
    createPartitioner: KafkaJs.Partitioners.DefaultPartitioner
  })
  await producer.connect()
  let produceMs: number
  try {
    const t0 = performance.now()
    await produceAll(plan, (start, end) => {
      const messages = new Array<{ partition: number; key: Buffer; value: Buffer }>(end - start)
      for (let i = start; i < end; i++) {
        messages[i - start] = { partition: i % plan.partitions, key: data.keys[i]!, value: valueAt(data, i) }
      }
      return producer.send({ topic, acks: -1, messages })
    })
    produceMs = performance.now() - t0
  } finally {
    await producer.disconnect()
  }
  await afterProduce()

  const consumer = kafka.consumer({
    groupId: `strata-bench-kafkajs-${process.pid}-${topicCount}`,
    maxBytes: FETCH.maxBytes,
    maxBytesPerPartition: FETCH.partitionMaxBytes,
    maxWaitTimeInMs: FETCH.maxWaitMs,
    minBytes: 1
  })
  await consumer.connect()
  try {
    await consumer.subscribe({ topics: [topic], fromBeginning: true })
    const targets = highwatersOf(plan)
    let unfinished = targets.filter((h) => h > 0).length
    let count = 0
    let bytes = 0
    let batches = 0
    let firstBatchAt: number | undefined
    let joinedAt: number | undefined
    consumer.on(consumer.events.GROUP_JOIN, () => {
      joinedAt ??= performance.now()
    })
    let resolveDone!: (at: number) => void
    const done = new Promise<number>((resolve) => {
      resolveDone = resolve
    })
    const started = performance.now()
    await consumer.run({
      autoCommit: false,
      eachBatchAutoResolve: true,
      eachBatch: async ({ batch }) => {
        firstBatchAt ??= performance.now()
        batches++
        for (const m of batch.messages) {
          count++
          bytes += (m.key?.length ?? 0) + (m.value?.length ?? 0)
        }
        const last = batch.messages[batch.messages.length - 1]
        if (last !== undefined && Number(last.offset) + 1 === targets[batch.partition]) {
          if (--unfinished === 0) resolveDone(performance.now())
        }
      }
    })
    const end = await done
    check("kafkajs consume", plan, count, bytes)
    return {
      produceMs,
      consumeMs: end - (joinedAt ?? firstBatchAt!),
      consumeBatches: batches,
      joinMs: (joinedAt ?? firstBatchAt!) - started
    }
  } finally {
    await consumer.disconnect()
  }
}

// ---------------------------------------------------------------------------
// Repetitions and figures
// ---------------------------------------------------------------------------

const orderOf = (clients: ReadonlyArray<Client>, rep: number): ReadonlyArray<Client> =>
  rep % 2 === 0 ? clients : [...clients].reverse()

export const run = async (): Promise<BenchOutput & { readonly save: boolean }> => {
  const plan: Plan = {
    records: envInt("BENCH_RECORDS", DEFAULTS.records),
    batch: envInt("BENCH_BATCH", DEFAULTS.batch),
    partitions: envInt("BENCH_PARTITIONS", DEFAULTS.partitions),
    inFlight: envInt("BENCH_IN_FLIGHT", DEFAULTS.inFlight),
    broker: envString("BENCH_KAFKA_BROKER") ?? DEFAULTS.broker
  }
  const runs = envInt("BENCH_RUNS", DEFAULTS.runs)
  const clients = (envString("BENCH_CLIENTS") ?? DEFAULTS.clients.join(",")).split(",").filter((c) => c !== "")
  for (const c of clients) {
    if (!DEFAULTS.clients.includes(c as Client)) throw new Error(`BENCH_CLIENTS: unknown client ${c}`)
  }
  if (!clients.includes("bare") || !clients.includes("adapter"))
    throw new Error("BENCH_CLIENTS must include bare and adapter")
  const save =
    plan.records === DEFAULTS.records &&
    plan.batch === DEFAULTS.batch &&
    plan.partitions === DEFAULTS.partitions &&
    plan.inFlight === DEFAULTS.inFlight &&
    plan.broker === DEFAULTS.broker &&
    runs === DEFAULTS.runs &&
    clients.join(",") === DEFAULTS.clients.join(",")

  const pk = (await import(pathToFileURL(kafkaRequire.resolve("@platformatic/kafka")).href)) as Platformatic
  // Resolved like code inside the workspace: @strata/kafka's own export (source condition) and its client copy.
  const adapter = (await import(pathToFileURL(kafkaRequire.resolve("@strata/kafka")).href)) as KafkaModule
  const pkVersion = (
    JSON.parse(
      readFileSync(new URL("../packages/kafka/node_modules/@platformatic/kafka/package.json", import.meta.url), "utf8")
    ) as { version: string }
  ).version
  const kafkajsVersion = (createRequire(import.meta.url)("kafkajs/package.json") as { version: string }).version
  progress(
    `kafka: ${plan.records} records, ${plan.partitions} partitions, batches of ${plan.batch}, ${plan.inFlight} in ` +
      `flight, ${runs} runs, ${clients} on ${plan.broker}`
  )
  const data = makeData(plan.records)
  const admin = makeAdmin(pk, plan.broker)
  const samples: Record<Client, Array<Timing>> = { bare: [], adapter: [], kafkajs: [] }
  try {
    const once = async (client: Client, p: Plan): Promise<Timing> => {
      const topic = freshTopic(client)
      await admin.create(topic, p.partitions)
      const afterProduce = () => admin.checkHighwaters(topic, p)
      try {
        return client === "adapter"
          ? await adapterRun(adapter, data, p, topic, afterProduce)
          : client === "bare"
            ? await bareRun(pk, data, p, topic, afterProduce)
            : await kafkajsRun(data, p, topic, afterProduce)
      } finally {
        await admin.remove(topic)
      }
    }
    const warm: Plan = { ...plan, records: Math.min(WARMUP_RECORDS, plan.records) }
    progress(`kafka: warm-up (${warm.records} records per client)`)
    for (const client of clients as ReadonlyArray<Client>) await once(client, warm)
    for (let rep = 0; rep < runs; rep++) {
      for (const client of orderOf(clients as ReadonlyArray<Client>, rep)) {
        collectGarbage()
        const t = await once(client, plan)
        samples[client].push(t)
        const join = t.joinMs === undefined ? "" : ` (group join ${t.joinMs.toFixed(0)} ms, not timed)`
        progress(
          `kafka ${client} #${rep + 1}: produce ${t.produceMs.toFixed(0)} ms, consume ${t.consumeMs.toFixed(0)} ms` +
            ` in ${t.consumeBatches} batches${join}`
        )
      }
    }
  } finally {
    await admin.close()
  }

  const rate = (ms: number) => plan.records / (ms / 1000)
  const produceRates = (c: Client) => samples[c].map((t) => rate(t.produceMs))
  const consumeRates = (c: Client) => samples[c].map((t) => rate(t.consumeMs))
  const common = {
    records: plan.records,
    partitions: plan.partitions,
    batch: plan.batch,
    inFlight: plan.inFlight,
    keyBytes: KEY_BYTES,
    valueBytes: VALUE_BYTES,
    node: process.version
  }
  const figure = (bench: string, value: number, baseline: number, extra: Record<string, unknown>): Figure => ({
    bench,
    value: Math.round(value),
    unit: "records/s",
    baseline: Math.round(baseline),
    ratio: round3(value / baseline),
    ...common,
    runs: samples.adapter.length,
    ...extra
  })
  const bareProduce = median(produceRates("bare"))
  const bareConsume = median(consumeRates("bare"))
  const results: Array<Figure> = [
    figure("kafka.produce", median(produceRates("adapter")), bareProduce, {
      baselineClient: `@platformatic/kafka ${pkVersion}`
    }),
    figure("kafka.consume", median(consumeRates("adapter")), bareConsume, {
      baselineClient: `@platformatic/kafka ${pkVersion}`
    })
  ]
  if (samples.kafkajs.length > 0) {
    const reference = { reference: `kafkajs ${kafkajsVersion}, not the baseline` }
    results.push(
      figure("kafka.kafkajs.produce", median(produceRates("kafkajs")), bareProduce, reference),
      figure("kafka.kafkajs.consume", median(consumeRates("kafkajs")), bareConsume, {
        ...reference,
        timing: "from the group join (join excluded)"
      })
    )
  }
  const details: Record<string, unknown> = {
    broker: plan.broker,
    records: `key "key-%012d" (${KEY_BYTES} bytes), ${VALUE_BYTES}-byte value (${VALUE_POOL} distinct, round-robin), record i to partition i % ${plan.partitions}`,
    produce: `calls of ${plan.batch} records, up to ${plan.inFlight} calls outstanding; acks=all through an idempotent producer on every side (one request in flight per connection)`,
    consume: `from offset 0 of every partition until all highwaters; fetch maxBytes ${FETCH.maxBytes}, partitionMaxBytes ${FETCH.partitionMaxBytes}, maxWait ${FETCH.maxWaitMs} ms`,
    clients: {
      adapter: "KafkaLog.make produceBatch(acks all) + consumer({ maxBatchRecords: batch }).batches",
      bare: `@platformatic/kafka ${pkVersion} (packages/kafka's copy): Producer({ idempotent: true }).send + Consumer#fetch loop, no group`,
      kafkajs: `kafkajs ${kafkajsVersion}: producer({ idempotent: true, maxInFlightRequests: 1 }).send(acks -1) + group consumer eachBatch; reference only`
    },
    order: `per repetition ${clients.join(", ")}, reversed on odd repetitions; fresh topic per run, deleted after; ${WARMUP_RECORDS}-record warm-up first `,
    samples: Object.fromEntries(
      clients.map((c) => [
        c,
        {
          produceRecordsPerSecond: produceRates(c as Client).map(Math.round),
          consumeRecordsPerSecond: consumeRates(c as Client).map(Math.round),
          consumeBatches: samples[c as Client].map((t) => t.consumeBatches),
          ...(c === "kafkajs" ? { groupJoinMs: samples.kafkajs.map((t) => Math.round(t.joinMs ?? 0)) } : {})
        }
      ])
    ),
    peakRssMB: Math.round(process.resourceUsage().maxRSS / 1024)
  }
  return { results, details, save }
}
