// bench:replica's `log` part (issue 37): core's `Log` protocol, what Tables and Recovery use, on Strata's tablets
// (`StrataLog`) next to Kafka (`KafkaLog`), the same program on both sides, nothing but `Log.Shape` calls (and
// Tables on top for the restore).
//
// Strata: 1 coordinator + 3 tablet servers as processes on ZooKeeper (`startStrata`, bench:replica's SETTINGS: RF 3,
// min ISR 2), `StrataLog.make` on the same namespace (its client with linger 0, as KafkaLog's default). Kafka: the
// 3-broker kafka3 of scripts/services, `KafkaLog.make` with its defaults. Topics are made with
// `ensureTopic({ partitions: 12, replicationFactor: 3, config: { "min.insync.replicas": "2" } })` (Strata takes its
// min ISR from the cluster) and are used once every replica is in the ISR; they are deleted after each round.
//
// Per side, in each round:
// 1. produce: a fresh topic, LOG_RECORDS records of 1 KB (16-byte keys "key-%012d", values from a pool of 64),
//    record i to partition i % 12, in `produceBatch(records, { acks: "all" })` calls of BATCH records with IN_FLIGHT
//    calls outstanding (bench:replica's BENCH_BATCH and BENCH_IN_FLIGHT); records/s, latency per call.
// 2. consume: a fresh `consumer()` (no group, default options), every partition assigned and sought to 0, `batches`
//    read until every partition reached its highwater (which must be the count sent to it). Every record is checked
//    as it arrives: its key names a record sent to this partition and not read before, its value is that record's.
// 3. restore: a changelog of RESTORE_RECORDS records written (untimed) with `produceBatch` in calls of 10 000, 4 in
//    flight, to `<app>-restore-changelog` (compacted, as Tables makes it, with RF 3 / min ISR 2): record i is key
//    i % RESTORE_KEYS (100 000 distinct keys: each key overwritten RESTORE_RECORDS / 100 000 times, so the restore
//    applies every record but the table ends with 100 000 keys) of a `Table.make({ key: Schema.String, value:
//    Schema.String, partitions: 12 })`, in the table's encoding (JSON: 16-byte keys "key-%010d", 100-byte values
//    from a pool of 64), to partition key % 12, with the `strata-source` header Tables puts on every changelog
//    record. Then a fresh `Tables.make` (settleDelay 0, recoveryDelay 0, otherwise the defaults) on a fresh
//    `MemoryStore` (so the store costs next to nothing and the log's read path is what is timed), the table
//    registered and started (untimed); timed: `manager.onPartitionsAssigned(all 12)` until
//    `manager.waitUntilRecoveryCompleted`. Afterwards (untimed) every partition store is scanned: it must hold
//    exactly its share of the keys, each with the value of its key's last record.
// Before the rounds, one untimed produce + consume on each side (a cold JVM's first records are slow). Sides
// alternate (strata first in even rounds, kafka first in odd ones); `sync` writes dirty pages out before each timed
// phase. Figures are medians over the rounds (latency: p50/p99 over every call of every round), ratio strata/kafka.
// CPU: the servers' (Strata: the 3 tablet servers and the coordinator; Kafka: the 3 combined broker/controller
// JVMs), from /proc, and this process's (the client of both sides), per 100k records.
//
// Environment (the results file is written only with the defaults): BENCH_LOG_RECORDS (200000),
// BENCH_RESTORE_RECORDS (1000000), BENCH_LOG_ROUNDS (2).
import { Context, Effect, Exit, Layer, Logger, Schema, Scope, Stream } from "effect"
import { Log, MemoryStore, type Models, Store } from "../packages/core/src/index.js"
import * as KafkaLog from "../packages/kafka/src/KafkaLog.js"
import { StrataLog } from "../packages/replica/src/log/index.js"
import { Table, Tables } from "../packages/tables/src/index.js"
import { collectGarbage, envInt, type Figure, median, progress, randomBytes, round3 } from "./lib.js"
import {
  clientCpu,
  cpuOfAll,
  kafkaPids,
  kafkaRequire,
  keyOf,
  PARTITIONS,
  type Plan,
  type Platformatic,
  percentile,
  produceAll,
  SETTINGS,
  settleDisk
} from "./replica.js"
import { awaitTable, type StrataSide, startStrata } from "./strataCluster.js"
import { pathToFileURL } from "node:url"

const DEFAULTS = { records: 200_000, restoreRecords: 1_000_000, rounds: 2 } as const
const VALUE_BYTES = 1000
const VALUE_POOL = 64
const RESTORE_KEYS = 100_000
const RESTORE_VALUE_CHARS = 98 // 100 bytes as JSON
const RESTORE_BATCH = 10_000
const RESTORE_IN_FLIGHT = 4
const TABLE = "restore"
const SOURCE_HEADER = "strata-source"
/** Longest a consume or a restore may take before the part fails, saying how far it got. */
const STUCK_MS = 600_000

type SideName = "strata" | "kafka"

/** One side: its log, the processes whose CPU is the servers', how to wait for a topic's ISR and drop a topic. */
interface Side {
  readonly name: SideName
  readonly log: Log.Shape
  readonly serverPids: () => ReadonlyArray<number>
  readonly awaitReplicated: (topic: string) => Promise<void>
  readonly drop: (topic: string) => Promise<void>
}

/** One timed phase: wall seconds, the servers' and this process's CPU seconds. */
interface Timed {
  readonly seconds: number
  readonly serverCpu: number
  readonly clientCpu: number
}

interface Round {
  readonly produce: Timed & { readonly latenciesMs: ReadonlyArray<number> }
  readonly consume: Timed
  readonly restore: Timed & { readonly loadSeconds: number }
}

const run = <A, E>(effect: Effect.Effect<A, E>): Promise<A> =>
  Effect.runPromise(effect.pipe(Effect.provide(Logger.layer([]))))

/** Times `f` with the servers' and this process's CPU. */
const timed = async <A>(side: Side, f: () => Promise<A>): Promise<Timed & { readonly value: A }> => {
  const pids = side.serverPids()
  const cpu0 = cpuOfAll(pids)
  const client0 = clientCpu()
  const t0 = performance.now()
  const value = await f()
  const seconds = (performance.now() - t0) / 1000
  return { value, seconds, serverCpu: cpuOfAll(pids) - cpu0, clientCpu: clientCpu() - client0 }
}

/** Fails with what `progress` says once `effect` has run for STUCK_MS. */
const unstuck = <A, E>(what: string, progressOf: () => string, effect: Effect.Effect<A, E, Scope.Scope>) =>
  effect.pipe(
    Effect.timeoutOrElse({
      duration: STUCK_MS,
      orElse: () => Effect.die(new Error(`${what}: not done after ${STUCK_MS / 1000} s (${progressOf()})`))
    })
  )

/** Records per partition when record i goes to partition i % PARTITIONS. */
const countsOf = (records: number): Array<number> =>
  Array.from({ length: PARTITIONS }, (_, p) => Math.floor((records - p + PARTITIONS - 1) / PARTITIONS))

const partitionsOf = (topic: string): Array<Models.TopicPartition> =>
  Array.from({ length: PARTITIONS }, (_, partition) => ({ topic, partition }))

/** A topic as both sides make it: 12 partitions, RF 3, min ISR 2, every replica in the ISR before it is used. */
const ensure = async (side: Side, topic: string, compacted: boolean) => {
  await run(
    side.log.ensureTopic({
      topic,
      partitions: PARTITIONS,
      compacted,
      replicationFactor: SETTINGS.replicationFactor,
      config: { "min.insync.replicas": String(SETTINGS.minInsyncReplicas) }
    })
  )
  await side.awaitReplicated(topic)
}

/** Checks the highwaters are the counts sent (and the log starts at 0). */
const checkHighwaters = async (side: Side, topic: string, expected: ReadonlyArray<number>) => {
  const offsets = await run(side.log.offsets(partitionsOf(topic)))
  if (offsets.some((o) => o.logStart !== 0 || o.highwater !== expected[o.partition])) {
    throw new Error(
      `${side.name} ${topic}: highwaters ${offsets.map((o) => `${o.logStart}-${o.highwater}`).join(",")}, expected ${expected.join(",")}`
    )
  }
}

// ---------------------------------------------------------------------------
// produce and consume
// ---------------------------------------------------------------------------

const values = randomBytes(VALUE_BYTES * VALUE_POOL, 0x5eed)
const valueOfRecord = (i: number) =>
  values.subarray((i % VALUE_POOL) * VALUE_BYTES, ((i % VALUE_POOL) + 1) * VALUE_BYTES)

const produce = async (side: Side, plan: Plan, topic: string) =>
  timed(side, () =>
    produceAll(plan, (start, end) => {
      const records = new Array<Log.ProducerRecord>(end - start)
      for (let i = start; i < end; i++) {
        records[i - start] = { topic, partition: i % PARTITIONS, key: keyOf(i), value: valueOfRecord(i) }
      }
      return run(side.log.produceBatch(records, { acks: "all" }))
    })
  )

/** Record i's number from its key ("key-" and 12 digits), or -1 for any other key. */
const numberOfKey = (key: Uint8Array | null): number => {
  if (key === null || key.length !== 16) return -1
  let n = 0
  for (let j = 4; j < 16; j++) {
    const d = key[j]! - 0x30
    if (d < 0 || d > 9) return -1
    n = n * 10 + d
  }
  return n
}

/** Reads the whole topic back with a group-less consumer, checking every record; the records read. */
const consume = (side: Side, records: number, topic: string) => {
  const targets = countsOf(records)
  const read = new Array<number>(PARTITIONS).fill(0)
  const seen = new Uint8Array(records)
  let unfinished = targets.filter((n) => n > 0).length
  const program = Effect.gen(function* () {
    const consumer = yield* side.log.consumer()
    yield* consumer.assign(partitionsOf(topic))
    for (const tp of partitionsOf(topic)) yield* consumer.seek(tp, 0)
    yield* consumer.batches.pipe(
      Stream.takeWhile((b) => {
        for (const r of b.records) {
          const i = numberOfKey(r.key)
          if (i < 0 || i >= records || i % PARTITIONS !== b.partition || seen[i] === 1) {
            throw new Error(`${side.name} ${topic}/${b.partition}@${r.offset}: unexpected or repeated key`)
          }
          if (r.value === null || Buffer.compare(r.value, valueOfRecord(i)) !== 0) {
            throw new Error(`${side.name} ${topic}/${b.partition}@${r.offset}: not the value sent with key ${i}`)
          }
          seen[i] = 1
        }
        read[b.partition]! += b.records.length
        const last = b.records.at(-1)
        if (last !== undefined && last.offset + 1 === targets[b.partition]) unfinished--
        return unfinished > 0
      }),
      Stream.runDrain
    )
  })
  return timed(side, async () => {
    if (unfinished > 0) {
      await run(Effect.scoped(unstuck(`${side.name} consume`, () => `read per partition: ${read.join(",")}`, program)))
    }
    const total = read.reduce((a, b) => a + b, 0)
    if (total !== records) throw new Error(`${side.name} consume: read ${total} records, sent ${records}`)
    return total
  })
}

// ---------------------------------------------------------------------------
// restore
// ---------------------------------------------------------------------------

const ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
const encoder = new TextEncoder()
const decoder = new TextDecoder()
const restoreKey = (k: number) => `key-${String(k).padStart(10, "0")}`
const restoreValues: ReadonlyArray<Uint8Array> = (() => {
  const pool = randomBytes(VALUE_POOL * RESTORE_VALUE_CHARS, 0xbeef)
  return Array.from({ length: VALUE_POOL }, (_, v) => {
    let s = ""
    for (let j = 0; j < RESTORE_VALUE_CHARS; j++) s += ALPHABET[pool[v * RESTORE_VALUE_CHARS + j]! & 63]
    return encoder.encode(JSON.stringify(s))
  })
})()
const tableDef = Table.make({ name: TABLE, key: Schema.String, value: Schema.String, partitions: PARTITIONS })

/** Keys each partition ends with: key k (of the first min(records, RESTORE_KEYS)) is in partition k % PARTITIONS. */
const restoredCounts = (records: number) => countsOf(Math.min(records, RESTORE_KEYS))

/** Writes the changelog (untimed by the caller's figures: its seconds are kept as a detail). */
const writeChangelog = async (side: Side, app: string, records: number) => {
  const topic = `${app}-${TABLE}-changelog`
  await ensure(side, topic, true)
  const source = `${app}-source`
  const sourceOffsets = new Array<number>(PARTITIONS).fill(0)
  const t0 = performance.now()
  await produceAll({ records, batch: RESTORE_BATCH, inFlight: RESTORE_IN_FLIGHT }, (start, end) => {
    const batch = new Array<Log.ProducerRecord>(end - start)
    for (let i = start; i < end; i++) {
      const k = i % RESTORE_KEYS
      const partition = k % PARTITIONS
      const offset = sourceOffsets[partition]!++
      batch[i - start] = {
        topic,
        partition,
        key: encoder.encode(JSON.stringify(restoreKey(k))),
        value: restoreValues[i % VALUE_POOL]!,
        headers: [{ key: SOURCE_HEADER, value: encoder.encode(JSON.stringify([source, partition, offset])) }]
      }
    }
    return run(side.log.produceBatch(batch, { acks: "all" }))
  })
  const loadSeconds = (performance.now() - t0) / 1000
  const perPartition = new Array<number>(PARTITIONS).fill(0)
  for (const p of sourceOffsets.keys()) perPartition[p] = sourceOffsets[p]!
  await checkHighwaters(side, topic, perPartition)
  return { topic, source, loadSeconds }
}

/** A fresh Tables worker on a fresh memory store restores the changelog; the store is checked afterwards. */
const restore = async (side: Side, app: string, records: number, source: string) => {
  const storeContext = await run(Effect.scoped(Layer.build(MemoryStore.layer())))
  const services = Context.add(storeContext, Log.Log, side.log)
  let stage = "starting"
  const worker = Effect.gen(function* () {
    const tables = yield* Tables.make({ app, settleDelay: 0, recovery: { recoveryDelay: 0 } }).pipe(
      Effect.provide(services)
    )
    yield* tables.register(tableDef)
    yield* tables.start
    const pids = side.serverPids()
    const cpu0 = cpuOfAll(pids)
    const client0 = clientCpu()
    const t0 = performance.now()
    stage = "restoring"
    yield* tables.manager.onPartitionsAssigned(partitionsOf(source))
    yield* tables.manager.waitUntilRecoveryCompleted
    return {
      seconds: (performance.now() - t0) / 1000,
      serverCpu: cpuOfAll(pids) - cpu0,
      clientCpu: clientCpu() - client0
    }
  })
  const result = await run(Effect.scoped(unstuck(`${side.name} restore`, () => stage, worker)))
  // Untimed, the worker stopped: every partition holds its share of the keys, each with its last record's value.
  const store = Context.get(storeContext, Store.Store)
  const expected = restoredCounts(records)
  for (let partition = 0; partition < PARTITIONS; partition++) {
    const entries = await run(
      Effect.scoped(
        Effect.flatMap(store.open({ table: TABLE, partition }), (ps) =>
          Stream.runCollect(ps.scan()).pipe(Effect.map((c) => Array.from(c)))
        )
      )
    )
    if (entries.length !== expected[partition]) {
      throw new Error(
        `${side.name} restore: partition ${partition} holds ${entries.length} keys, expected ${expected[partition]}`
      )
    }
    for (const [key, value] of entries) {
      const k = Number((JSON.parse(decoder.decode(key)) as string).slice(4))
      const last = k + RESTORE_KEYS * Math.floor((records - 1 - k) / RESTORE_KEYS)
      if (k % PARTITIONS !== partition || Buffer.compare(value, restoreValues[last % VALUE_POOL]!) !== 0) {
        throw new Error(`${side.name} restore: partition ${partition}, key ${k}: not its last record's value`)
      }
    }
  }
  return result
}

// ---------------------------------------------------------------------------
// The sides
// ---------------------------------------------------------------------------

const strataSide = async (strata: StrataSide): Promise<Side> => {
  const log = await strata.run(
    StrataLog.make({ client: { namespace: strata.namespace, linger: 0, replication: SETTINGS } })
  )
  return {
    name: "strata",
    log,
    serverPids: () => [
      ...strata.cluster.running("tablet-server").map((id) => strata.cluster.pid("tablet-server", id)!),
      strata.cluster.pid("coordinator", 101)!
    ],
    awaitReplicated: async (topic) => {
      await awaitTable(strata, topic, (t) => t.leader !== null && t.isr.length === t.replicas.length)
    },
    drop: async (topic) => {
      await strata.run(Effect.ignore(strata.client.deleteTable(topic)))
    }
  }
}

const kafkaSide = async (
  brokers: ReadonlyArray<string>,
  scope: Scope.Scope
): Promise<Side & { close: () => Promise<void> }> => {
  const pk = (await import(pathToFileURL(kafkaRequire.resolve("@platformatic/kafka")).href)) as Platformatic
  const admin = new pk.Admin({ clientId: "strata-bench-replica-log-admin", bootstrapBrokers: [...brokers] })
  const log = await run(
    KafkaLog.make({ brokers: [...brokers] as [string, ...Array<string>], clientId: "strata-bench-replica-log" }).pipe(
      Effect.provideService(Scope.Scope, scope)
    )
  )
  return {
    name: "kafka",
    log,
    serverPids: kafkaPids,
    awaitReplicated: async (topic) => {
      for (let attempt = 0; ; attempt++) {
        const md = await admin.metadata({ topics: [topic], forceUpdate: true }).catch(() => undefined)
        if (md?.topics.get(topic)?.partitions.every((p) => p.leader >= 0 && p.isr.length === 3)) return
        if (attempt > 300) throw new Error(`${topic}: not fully replicated after 30 s`)
        await new Promise((r) => setTimeout(r, 100))
      }
    },
    drop: async (topic) => {
      await admin.deleteTopics({ topics: [topic] }).catch(() => undefined)
    },
    close: () => admin.close()
  }
}

// ---------------------------------------------------------------------------
// The part
// ---------------------------------------------------------------------------

/** One round of one side: produce, consume, restore, each topic dropped afterwards. */
const roundOf = async (side: Side, plan: Plan, restoreRecords: number, label: string): Promise<Round> => {
  const topic = `strata-bench-log-${label}-${side.name}-${process.pid}-${Date.now()}`
  await ensure(side, topic, false)
  settleDisk()
  const produced = await produce(side, plan, topic)
  await checkHighwaters(side, topic, countsOf(plan.records))
  settleDisk()
  const consumed = await consume(side, plan.records, topic)
  await side.drop(topic)
  const app = `strata-bench-log-${label}-${side.name}-${process.pid}-${Date.now()}`
  const changelog = await writeChangelog(side, app, restoreRecords)
  settleDisk()
  const restored = await restore(side, app, restoreRecords, changelog.source)
  await side.drop(changelog.topic)
  return {
    produce: { ...produced, latenciesMs: produced.value },
    consume: consumed,
    restore: { ...restored, loadSeconds: changelog.loadSeconds }
  }
}

/** The untimed warm-up of a side: one produce and one consume. */
const warmUp = async (side: Side, plan: Plan) => {
  const topic = `strata-bench-log-warmup-${side.name}-${process.pid}-${Date.now()}`
  await ensure(side, topic, false)
  const p = await produce(side, plan, topic)
  const c = await consume(side, plan.records, topic)
  await side.drop(topic)
  progress(
    `log warm-up ${side.name}: produce ${Math.round(plan.records / p.seconds)} records/s, consume ${Math.round(plan.records / c.seconds)} records/s`
  )
}

const per100k = (cpu: number, records: number) => (cpu * 100_000) / records

/**
 * The `log` part of bench:replica: `StrataLog` on a 3-server Strata cluster next to `KafkaLog` on the 3-broker Kafka,
 * produce, consume and a Tables restore through core's `Log` protocol (see this file's header). `plan` gives the
 * calls' size and concurrency (its record count is bench:replica's own: this part reads BENCH_LOG_RECORDS).
 */
export const logPart = async (
  plan: Plan,
  zookeeper: string,
  brokers: ReadonlyArray<string>
): Promise<{
  readonly figures: ReadonlyArray<Figure>
  readonly details: Record<string, unknown>
  /** Whether this part ran with its defaults (the results file is kept only then). */
  readonly defaults: boolean
}> => {
  const logPlan: Plan = { ...plan, records: envInt("BENCH_LOG_RECORDS", DEFAULTS.records) }
  const restoreRecords = envInt("BENCH_RESTORE_RECORDS", DEFAULTS.restoreRecords)
  const rounds = envInt("BENCH_LOG_ROUNDS", DEFAULTS.rounds)
  const strata = await startStrata("log", 3, zookeeper, SETTINGS)
  const scope = await Effect.runPromise(Scope.make())
  const s: Array<Round> = []
  const k: Array<Round> = []
  try {
    const sides = { strata: await strataSide(strata), kafka: await kafkaSide(brokers, scope) }
    try {
      await warmUp(sides.strata, logPlan)
      await warmUp(sides.kafka, logPlan)
      for (let r = 0; r < rounds; r++) {
        const order: ReadonlyArray<SideName> = r % 2 === 0 ? ["strata", "kafka"] : ["kafka", "strata"]
        for (const name of order) {
          collectGarbage()
          const round = await roundOf(sides[name], logPlan, restoreRecords, `r${r}`)
          ;(name === "strata" ? s : k).push(round)
          progress(
            `log ${name} round ${r + 1}/${rounds}: produce ${Math.round(logPlan.records / round.produce.seconds)} records/s (p99 ${round3(percentile(round.produce.latenciesMs, 99))} ms), consume ${Math.round(logPlan.records / round.consume.seconds)} records/s, restore ${Math.round(restoreRecords / round.restore.seconds)} records/s (server CPU ${round3(round.produce.serverCpu)} / ${round3(round.consume.serverCpu)} / ${round3(round.restore.serverCpu)} s)`
          )
        }
      }
    } finally {
      await sides.kafka.close()
    }
  } finally {
    await Effect.runPromise(Scope.close(scope, Exit.void))
    await strata.close()
  }
  const figures: Array<Figure> = []
  const ratioFigure = (bench: string, unit: string, sv: number, kv: number): Figure => ({
    bench: `replica.log.${bench}`,
    value: round3(sv),
    unit,
    baseline: round3(kv),
    ratio: round3(sv / kv)
  })
  const phases = [
    ["produce", logPlan.records],
    ["consume", logPlan.records],
    ["restore", restoreRecords]
  ] as const
  for (const [phase, records] of phases) {
    const rate = (rs: ReadonlyArray<Round>) => median(rs.map((r) => records / r[phase].seconds))
    figures.push(ratioFigure(`${phase}.records_per_s`, "records/s", rate(s), rate(k)))
    if (phase === "produce") {
      const lat = (rs: ReadonlyArray<Round>, p: number) =>
        percentile(
          rs.flatMap((r) => r.produce.latenciesMs),
          p
        )
      figures.push(
        ratioFigure("produce.p50_ms", `ms per call (${logPlan.batch} records)`, lat(s, 50), lat(k, 50)),
        ratioFigure("produce.p99_ms", `ms per call (${logPlan.batch} records)`, lat(s, 99), lat(k, 99))
      )
    }
    const cpu = (rs: ReadonlyArray<Round>, of: "serverCpu" | "clientCpu") =>
      median(rs.map((r) => per100k(r[phase][of], records)))
    figures.push(
      ratioFigure(
        `${phase}.server_cpu_s_per_100k`,
        "CPU s per 100k records (servers)",
        cpu(s, "serverCpu"),
        cpu(k, "serverCpu")
      ),
      ratioFigure(
        `${phase}.client_cpu_s_per_100k`,
        "CPU s per 100k records (client)",
        cpu(s, "clientCpu"),
        cpu(k, "clientCpu")
      )
    )
  }
  const detail = (rs: ReadonlyArray<Round>) =>
    rs.map((r) => ({
      produce: {
        seconds: round3(r.produce.seconds),
        serverCpu: round3(r.produce.serverCpu),
        clientCpu: round3(r.produce.clientCpu)
      },
      consume: {
        seconds: round3(r.consume.seconds),
        serverCpu: round3(r.consume.serverCpu),
        clientCpu: round3(r.consume.clientCpu)
      },
      restore: {
        seconds: round3(r.restore.seconds),
        serverCpu: round3(r.restore.serverCpu),
        clientCpu: round3(r.restore.clientCpu),
        changelogWriteSeconds: round3(r.restore.loadSeconds)
      }
    }))
  return {
    figures,
    details: {
      log: {
        records: logPlan.records,
        recordBytes: VALUE_BYTES + 16,
        batch: logPlan.batch,
        inFlight: logPlan.inFlight,
        restoreRecords,
        restoreKeys: RESTORE_KEYS,
        rounds,
        strata: detail(s),
        kafka: detail(k)
      }
    },
    defaults:
      logPlan.records === DEFAULTS.records && restoreRecords === DEFAULTS.restoreRecords && rounds === DEFAULTS.rounds
  }
}
