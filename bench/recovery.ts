// Changelog recovery (`@strata/tables` through `@strata/recovery`) against a bare kafkajs consumer reading the same
// changelog in the same run (docs/ARCHITECTURE.md, "Benchmarks"; issue 7).
//
// Once per run RECORDS records are produced into a fresh changelog topic named as the table's
// (`<app>-bench-changelog`, PARTITIONS partitions, created by `KafkaLog.ensureTopic` with the changelog's settings):
// record i is key i of a `Table.make({ key: Schema.String, value: Schema.String })` table, in the table's encoding
// (the JSON of the string: 16-byte keys "key-%010d", 100-byte values from a pool of VALUE_POOL), in partition
// i % PARTITIONS, with the `strata-source` header `process` puts on every changelog record. Loading goes through
// `KafkaLog.produceBatch` (acks all, calls of PRODUCE_BATCH records, PRODUCE_IN_FLIGHT at a time) and is checked
// (every partition's highwater).
//
// Then every phase reads that topic from offset 0 to its highwaters, each in its own child process (the same node
// and flags as this one), so each phase's peak RSS is its own and no phase inherits another's heap or JIT state:
// - kafkajs (the ceiling, the baseline of every figure): kafkajs 2.2.4 consumer, `eachBatch`, counting records and
//   bytes. kafkajs has no manual assignment, so it joins a fresh group (one member: all partitions, fromBeginning,
//   autoCommit off, nothing committed); the timing starts at the group join (the join itself, `joinMs`, is not
//   timed: the others join no group).
// - log: `KafkaLog.consumer()` (@platformatic/kafka underneath, the consumer `Tables` uses for its changelog channel)
//   with every partition assigned and seeked to 0, reading `batches` without applying them: the client's share.
// - memory, level, rocksdb: a fresh worker: `Tables.make` (settleDelay 0, recoveryDelay 0, otherwise the defaults:
//   streamBufferMaxsize 4096, recoveryBufferSize 1000) on a fresh store (`MemoryStore.layer()`,
//   `LevelStore.layer` / `RocksDbStore.layer` in a fresh temporary directory), the table registered, `start`ed
//   (untimed), then timed: `manager.onPartitionsAssigned(every partition)` until `manager.waitUntilRecoveryCompleted`.
//   Afterwards (untimed) SAMPLE evenly spread keys must read back their values through the table, and once the
//   worker has stopped every partition store (opened again from the same `Store`, scanned) must hold exactly its
//   share of the keys. Diagnostics kept with each run: `storeWrites` and `recordsPerWrite` (recovery's BatchApplied
//   events: one per atomic store batch), and how often the shared changelog queue was full or empty when sampled
//   (every 100 ms, on the event loop, so only between fibers' turns: read it as a hint, not a measure).
// RSS: each child samples `process.memoryUsage().rss` every 100 ms during its timed part; `peakRssMB` is the child's
// `process.resourceUsage().maxRSS` read right after the timed part (its whole life up to then: start-up + phase).
// Phases run in the order above, reversed on odd repetitions; each figure is the median of RUNS.
//
// Environment (for quick checks and profiles; the results file is written only with the defaults):
//   BENCH_RECORDS (1000000), BENCH_PARTITIONS (12), BENCH_RUNS (3), BENCH_KAFKA_BROKER (127.0.0.1:9092),
//   BENCH_PHASES (kafkajs,log,memory,level,rocksdb), BENCH_RECOVERY_BUFFER (1000: recoveryBufferSize),
//   BENCH_STREAM_BUFFER (4096: streamBufferMaxsize),
//   BENCH_CPU_PROF (a directory: each child profiles its timed part with the inspector into <phase>-<run>.cpuprofile,
//   positions mapped to the TypeScript sources), BENCH_ALLOC_PROF (likewise, a sampling allocation profile counting
//   collected objects too, <phase>-<run>.heapprofile; not together with BENCH_CPU_PROF).
import { Log, MemoryStore, type Models, Store } from "../packages/core/src/index.js"
import { execFileSync } from "node:child_process"
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { Session } from "node:inspector/promises"
import { createRequire, findSourceMap, type SourceMapping } from "node:module"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import { Context, Effect, Layer, Logger, Option, Schema, Stream } from "effect"
import { type ChildProtocol, measure as measureTimed, reportFromChild, runChild as runChildProcess } from "./child.js"
import { type BenchOutput, envInt, envString, type Figure, median, progress, randomBytes, round3 } from "./lib.js"

type KafkaLogModule = typeof import("../packages/kafka/src/KafkaLog.js")
type TablesModule = typeof import("../packages/tables/src/index.js")
type LevelStoreModule = typeof import("../packages/store-adapters/src/LevelStore.js")
type RocksDbStoreModule = typeof import("../packages/store-adapters/src/RocksDbStore.js")
type KafkaJsModule = typeof import("kafkajs")

const DEFAULTS = {
  records: 1_000_000,
  partitions: 12,
  runs: 3,
  broker: "127.0.0.1:9092",
  recoveryBuffer: 1000,
  streamBuffer: 4096
} as const
const PHASES = ["kafkajs", "log", "memory", "level", "rocksdb"] as const
type Phase = (typeof PHASES)[number]
type StoreKind = "memory" | "level" | "rocksdb"

const KEY_CHARS = 14 // "key-%010d": 16 bytes as JSON
const VALUE_CHARS = 98 // 100 bytes as JSON
const VALUE_POOL = 4099
const TABLE = "bench"
const SOURCE = "strata-bench-recovery-source"
const SOURCE_HEADER = "strata-source"
const PRODUCE_BATCH = 10_000
const PRODUCE_IN_FLIGHT = 4
const SAMPLE = 1000
/**
 * The baseline's fetch sizes and wait: the fastest for kafkajs of the sizes tried here (3 runs each, alternating):
 * 2 MiB / 256 KiB per partition; 8 MiB / 1 MiB (the changelog consumer's defaults) was 5–25% slower for it and its
 * own default, 10 MiB / 1 MiB, 15–30% slower (it decodes a whole fetch at once). So the ceiling is kafkajs at its
 * best; the changelog consumer runs with its own defaults.
 */
const FETCH = { maxBytes: 2 * 1024 * 1024, partitionMaxBytes: 256 * 1024, maxWaitMs: 250 } as const
const CHILD_FLAG = "--recovery-child"
/** Longest a phase's child may run (start-up, the timed part and the checks). */
const CHILD_TIMEOUT_MS = 300_000
const RESULT_PREFIX = "RECOVERY-RESULT "

// ---------------------------------------------------------------------------
// Data: the same in the parent (produce) and the children (checks)
// ---------------------------------------------------------------------------

const ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
const encoder = new TextEncoder()

const keyOf = (i: number): string => `key-${String(i).padStart(KEY_CHARS - 4, "0")}`

const makeValues = (): ReadonlyArray<string> => {
  const pool = randomBytes(VALUE_POOL * VALUE_CHARS, 0x5eed)
  return Array.from({ length: VALUE_POOL }, (_, v) => {
    let s = ""
    for (let j = 0; j < VALUE_CHARS; j++) s += ALPHABET[pool[v * VALUE_CHARS + j]! & 63]
    return s
  })
}

/** Records per partition when record i goes to partition i % partitions: the highwaters. */
const highwatersOf = (records: number, partitions: number): Array<number> =>
  Array.from({ length: partitions }, (_, p) => Math.floor((records - p + partitions - 1) / partitions))

const tableDef = (tables: TablesModule, partitions: number) =>
  tables.Table.make({ name: TABLE, key: Schema.String, value: Schema.String, partitions })

// ---------------------------------------------------------------------------
// Child processes: one phase each
// ---------------------------------------------------------------------------

interface Spec {
  readonly phase: Phase
  readonly run: number
  readonly app: string
  readonly topic: string
  readonly broker: string
  readonly records: number
  readonly partitions: number
  readonly recoveryBuffer: number
  readonly streamBuffer: number
  /** Where to write a CPU profile of the timed part, if asked. */
  readonly cpuProfile?: string
  /** Where to write an allocation profile of the timed part, if asked. */
  readonly allocProfile?: string
}

interface PhaseResult {
  readonly phase: Phase
  readonly ms: number
  /** The child's user + system CPU time during the timed part. */
  readonly cpuMs: number
  /** The CPU time of the child's main thread (the JavaScript thread) during the timed part. */
  readonly mainCpuMs: number
  readonly records: number
  readonly rssBeforeMB: number
  readonly rssSampledPeakMB: number
  readonly peakRssMB: number
  readonly extra: Record<string, number>
}

/** Where a position of transpiled code comes from, by its source map. */
const originOf = (url: string, line: number, column: number): SourceMapping | undefined => {
  const entry = findSourceMap(url)?.findEntry(line, column)
  return entry !== undefined && "originalLine" in entry ? (entry as SourceMapping) : undefined
}

/** tsx runs transpiled code: a profile's positions are mapped back to the TypeScript sources. */
const toSource = (frame: { url: string; lineNumber: number; columnNumber: number }): void => {
  const entry = frame.url.startsWith("file:") ? originOf(frame.url, frame.lineNumber, frame.columnNumber) : undefined
  if (entry !== undefined) {
    frame.lineNumber = entry.originalLine
    frame.columnNumber = entry.originalColumn
  }
}

/**
 * Profiles `f` with the in-process inspector, the timed part only: CPU into `spec.cpuProfile` (a V8 .cpuprofile),
 * or allocations into `spec.allocProfile` (a sampling .heapprofile counting objects already collected too).
 */
const profiled = async <A>(spec: Spec, f: () => Promise<A>): Promise<A> => {
  if (spec.cpuProfile === undefined && spec.allocProfile === undefined) return f()
  const session = new Session()
  session.connect()
  if (spec.cpuProfile !== undefined) {
    await session.post("Profiler.enable")
    await session.post("Profiler.start")
  } else {
    // Also counts what garbage collection freed meanwhile: the allocation rate, not what is left.
    const sampling = {
      samplingInterval: 16_384,
      includeObjectsCollectedByMajorGC: true,
      includeObjectsCollectedByMinorGC: true
    }
    await session.post("HeapProfiler.enable")
    await session.post("HeapProfiler.startSampling", sampling)
  }
  try {
    return await f()
  } finally {
    if (spec.cpuProfile !== undefined) {
      const { profile } = await session.post("Profiler.stop")
      for (const node of profile.nodes) toSource(node.callFrame)
      writeFileSync(spec.cpuProfile, JSON.stringify(profile))
    } else if (spec.allocProfile !== undefined) {
      const { profile } = await session.post("HeapProfiler.stopSampling")
      const visit = (node: (typeof profile)["head"]): void => {
        toSource(node.callFrame)
        for (const child of node.children) visit(child)
      }
      visit(profile.head)
      writeFileSync(spec.allocProfile, JSON.stringify(profile))
    }
    session.disconnect()
  }
}

/** Wall and CPU time and RSS of a timed part, profiled when the spec asks. */
const measure = <A>(spec: Spec, f: () => Promise<A>, onSample?: () => void) =>
  measureTimed(() => profiled(spec, f), onSample)

const kafkajsPhase = async (spec: Spec): Promise<PhaseResult> => {
  const KafkaJs: KafkaJsModule = await import("kafkajs")
  const kafka = new KafkaJs.Kafka({
    clientId: "strata-bench-recovery-kafkajs",
    brokers: [spec.broker],
    logLevel: KafkaJs.logLevel.NOTHING
  })
  const consumer = kafka.consumer({
    groupId: `strata-bench-recovery-kafkajs-${process.pid}-${Date.now()}`,
    maxBytes: FETCH.maxBytes,
    maxBytesPerPartition: FETCH.partitionMaxBytes,
    maxWaitTimeInMs: FETCH.maxWaitMs,
    minBytes: 1
  })
  await consumer.connect()
  try {
    await consumer.subscribe({ topics: [spec.topic], fromBeginning: true })
    const targets = highwatersOf(spec.records, spec.partitions)
    let unfinished = targets.filter((h) => h > 0).length
    let count = 0
    let bytes = 0
    let joinedAt: number | undefined
    let firstBatchAt: number | undefined
    consumer.on(consumer.events.GROUP_JOIN, () => {
      joinedAt ??= performance.now()
    })
    let resolveDone!: (at: number) => void
    const done = new Promise<number>((r) => {
      resolveDone = r
    })
    const started = performance.now()
    const m = await measure(spec, async () => {
      await consumer.run({
        autoCommit: false,
        eachBatchAutoResolve: true,
        eachBatch: async ({ batch }) => {
          firstBatchAt ??= performance.now()
          for (const msg of batch.messages) {
            count++
            bytes += (msg.key?.length ?? 0) + (msg.value?.length ?? 0)
          }
          const last = batch.messages[batch.messages.length - 1]
          if (last !== undefined && Number(last.offset) + 1 === targets[batch.partition]) {
            if (--unfinished === 0) resolveDone(performance.now())
          }
        }
      })
      return done
    })
    const from = joinedAt ?? firstBatchAt ?? started
    const end = m.value
    const expected = spec.records * (KEY_CHARS + 2 + VALUE_CHARS + 2)
    if (count !== spec.records || bytes !== expected) {
      throw new Error(`kafkajs: read ${count} records / ${bytes} bytes, expected ${spec.records} / ${expected}`)
    }
    // The timed part starts at the join: the join's share of the CPU time is small (waiting on the broker).
    return {
      phase: spec.phase,
      ms: end - from,
      cpuMs: m.cpuMs,
      mainCpuMs: m.mainCpuMs,
      records: count,
      rssBeforeMB: m.rssBeforeMB,
      rssSampledPeakMB: m.rssSampledPeakMB,
      peakRssMB: m.peakRssMB,
      extra: { joinMs: Math.round(from - started) }
    }
  } finally {
    await consumer.disconnect()
  }
}

const partitionsOf = (spec: Spec, topic: string): Array<Models.TopicPartition> =>
  Array.from({ length: spec.partitions }, (_, partition) => ({ topic, partition }))

const logPhase = async (spec: Spec): Promise<PhaseResult> => {
  const KafkaLog: KafkaLogModule = await import("../packages/kafka/src/KafkaLog.js")
  const program = Effect.gen(function* () {
    const log = yield* KafkaLog.make({ brokers: [spec.broker], clientId: "strata-bench-recovery-log" })
    const consumer = yield* log.consumer()
    const tps = partitionsOf(spec, spec.topic)
    yield* consumer.assign(tps)
    for (const tp of tps) yield* consumer.seek(tp, 0)
    const targets = highwatersOf(spec.records, spec.partitions)
    let unfinished = targets.filter((h) => h > 0).length
    let count = 0
    let bytes = 0
    let batches = 0
    const read = consumer.batches.pipe(
      Stream.takeWhile((b) => {
        batches++
        for (const r of b.records) {
          count++
          bytes += (r.key?.length ?? 0) + (r.value?.length ?? 0)
        }
        const last = b.records[b.records.length - 1]
        if (last !== undefined && last.offset + 1 === targets[b.partition]) unfinished--
        return unfinished > 0
      }),
      Stream.runDrain
    )
    const context = yield* Effect.context<never>()
    const m = yield* Effect.promise(() => measure(spec, () => Effect.runPromiseWith(context)(read)))
    const expected = spec.records * (KEY_CHARS + 2 + VALUE_CHARS + 2)
    if (count !== spec.records || bytes !== expected) {
      return yield* Effect.die(
        new Error(`log: read ${count} records / ${bytes} bytes, expected ${spec.records} / ${expected}`)
      )
    }
    return { m, count, batches }
  }).pipe(Effect.scoped, Effect.provide(Logger.layer([])))
  const { m, count, batches } = await Effect.runPromise(program)
  return {
    phase: spec.phase,
    ms: m.ms,
    cpuMs: m.cpuMs,
    mainCpuMs: m.mainCpuMs,
    records: count,
    rssBeforeMB: m.rssBeforeMB,
    rssSampledPeakMB: m.rssSampledPeakMB,
    peakRssMB: m.peakRssMB,
    extra: { batches }
  }
}

const storePhase = async (spec: Spec, kind: StoreKind): Promise<PhaseResult> => {
  const KafkaLog: KafkaLogModule = await import("../packages/kafka/src/KafkaLog.js")
  const tablesModule: TablesModule = await import("../packages/tables/src/index.js")
  const { Tables } = tablesModule
  const directory = kind === "memory" ? undefined : mkdtempSync(join(tmpdir(), `strata-bench-recovery-${kind}-`))
  try {
    const storeLayer =
      kind === "memory"
        ? MemoryStore.layer()
        : kind === "level"
          ? ((await import("../packages/store-adapters/src/LevelStore.js")) as LevelStoreModule).layer({
              directory: directory!
            })
          : ((await import("../packages/store-adapters/src/RocksDbStore.js")) as RocksDbStoreModule).layer({
              directory: directory!
            })
    const values = makeValues()
    /** A fresh worker on the store: start, then the timed restore, then a sample of values read back. */
    const restoreWith = (services: Context.Context<Store.Store | Log.Log>) =>
      Effect.gen(function* () {
        const tables = yield* Tables.make({
          app: spec.app,
          settleDelay: 0,
          streamBufferMaxsize: spec.streamBuffer,
          recovery: { recoveryDelay: 0, recoveryBufferSize: spec.recoveryBuffer }
        }).pipe(Effect.provide(services))
        const table = yield* tables.register(tableDef(tablesModule, spec.partitions))
        if (table.info.changelogTopic !== spec.topic) {
          return yield* Effect.die(
            new Error(`the table's changelog is ${table.info.changelogTopic}, not ${spec.topic}`)
          )
        }
        const s0 = performance.now()
        yield* tables.start
        const startMs = performance.now() - s0
        // Diagnostics: the store batches recovery applies (its BatchApplied events), and how full the shared changelog
        // queue is every 100 ms (full: the apply side is the bottleneck; empty: the client side is).
        const recovery = yield* tables.recovery
        let writes = 0
        let applied = 0
        if (Option.isSome(recovery)) {
          yield* recovery.value.events.pipe(
            Stream.runForEach((e) =>
              Effect.sync(() => {
                if (e._tag === "BatchApplied") {
                  writes++
                  applied += e.records
                }
              })
            ),
            Effect.forkScoped
          )
          yield* Effect.sleep("100 millis") // the subscription is in place before the timed part
        }
        const queue = { samples: 0, full: 0, empty: 0 }
        const sampleQueue = () => {
          const q = Effect.runSync(tables.changelogQueue)
          queue.samples++
          if (q.size >= q.capacity) queue.full++
          else if (q.size === 0) queue.empty++
        }
        const restore = Effect.andThen(
          tables.manager.onPartitionsAssigned(partitionsOf(spec, SOURCE)),
          tables.manager.waitUntilRecoveryCompleted
        )
        const context = yield* Effect.context<never>()
        const m = yield* Effect.promise(() => measure(spec, () => Effect.runPromiseWith(context)(restore), sampleQueue))
        const diagnostics = {
          storeWrites: writes,
          recordsPerWrite: writes === 0 ? 0 : Math.round(applied / writes),
          queueFullPct: queue.samples === 0 ? 0 : Math.round((100 * queue.full) / queue.samples),
          queueEmptyPct: queue.samples === 0 ? 0 : Math.round((100 * queue.empty) / queue.samples)
        }
        // Untimed: a sample of keys read back through the table hold their values.
        const v0 = performance.now()
        const step = Math.max(1, Math.floor(spec.records / SAMPLE))
        let sampled = 0
        for (let i = 0; i < spec.records; i += step) {
          const got = yield* table.get(keyOf(i), { partition: i % spec.partitions })
          const want = values[i % VALUE_POOL]!
          if (Option.getOrUndefined(got) !== want) {
            return yield* Effect.die(new Error(`${kind}: key ${keyOf(i)} holds ${String(got)}, expected ${want}`))
          }
          sampled++
        }
        const verifyMs = performance.now() - v0
        return { m, startMs, verifyMs, sampled, diagnostics }
      }).pipe(Effect.scoped)
    const program = Effect.gen(function* () {
      const log = yield* KafkaLog.make({ brokers: [spec.broker], clientId: `strata-bench-recovery-${kind}` })
      const services = Context.add(yield* Layer.build(storeLayer), Log.Log, log)
      // The worker lives in its own scope; the store outlives it, so its partitions can be counted afterwards.
      const worker = yield* restoreWith(services)
      // Untimed: every partition store holds exactly its share of the keys.
      const c0 = performance.now()
      const store = Context.get(services, Store.Store)
      const counts = highwatersOf(spec.records, spec.partitions)
      for (let partition = 0; partition < spec.partitions; partition++) {
        const stored = yield* Effect.scoped(
          Effect.flatMap(store.open({ table: TABLE, partition }), (ps) => Stream.runCount(ps.scan()))
        )
        if (stored !== counts[partition]) {
          return yield* Effect.die(
            new Error(`${kind}: partition ${partition} holds ${stored} keys, expected ${counts[partition]}`)
          )
        }
      }
      return { ...worker, verifyMs: worker.verifyMs + (performance.now() - c0) }
    }).pipe(Effect.scoped, Effect.provide(Logger.layer([])))
    const { m, startMs, verifyMs, sampled, diagnostics } = await Effect.runPromise(program)
    return {
      phase: spec.phase,
      ms: m.ms,
      cpuMs: m.cpuMs,
      mainCpuMs: m.mainCpuMs,
      records: spec.records,
      rssBeforeMB: m.rssBeforeMB,
      rssSampledPeakMB: m.rssSampledPeakMB,
      peakRssMB: m.peakRssMB,
      extra: { startMs: Math.round(startMs), verifyMs: Math.round(verifyMs), sampledKeys: sampled, ...diagnostics }
    }
  } finally {
    if (directory !== undefined) rmSync(directory, { recursive: true, force: true })
  }
}

const CHILD: ChildProtocol = { flag: CHILD_FLAG, prefix: RESULT_PREFIX, timeoutMs: CHILD_TIMEOUT_MS }

const childMain = async (spec: Spec): Promise<void> => {
  const result =
    spec.phase === "kafkajs"
      ? await kafkajsPhase(spec)
      : spec.phase === "log"
        ? await logPhase(spec)
        : await storePhase(spec, spec.phase)
  reportFromChild(CHILD, result)
}

/** Runs one phase in a child process with this process's node and flags. */
const runChild = (spec: Spec): Promise<PhaseResult> =>
  runChildProcess<Spec, PhaseResult>(fileURLToPath(import.meta.url), CHILD, spec)

// ---------------------------------------------------------------------------
// The parent: produce once, run the phases, make the figures
// ---------------------------------------------------------------------------

interface Plan {
  readonly records: number
  readonly partitions: number
  readonly broker: string
}

/** Produces the changelog records (the table's encoding and header) and checks the highwaters. */
const load = (KafkaLog: KafkaLogModule, tablesModule: TablesModule, plan: Plan, topic: string) =>
  Effect.gen(function* () {
    const values = makeValues()
    // The records carry exactly the bytes the table encodes.
    const codecs = tablesModule.Table.codecs(tableDef(tablesModule, plan.partitions))
    const valueBytes = values.map((v) => {
      const e = codecs.encodeValue(v)
      if (e._tag !== "Success" || e.success.length !== VALUE_CHARS + 2) throw new Error("value encoding")
      return e.success
    })
    const k0 = codecs.encodeKey(keyOf(0))
    if (k0._tag !== "Success" || Buffer.compare(k0.success, encoder.encode(JSON.stringify(keyOf(0)))) !== 0) {
      throw new Error("the records do not carry the bytes the table encodes")
    }
    const log = yield* KafkaLog.make({ brokers: [plan.broker], clientId: "strata-bench-recovery-load" })
    yield* log.ensureTopic({ topic, partitions: plan.partitions, compacted: true })
    const calls = Math.ceil(plan.records / PRODUCE_BATCH)
    const t0 = performance.now()
    yield* Effect.forEach(
      Array.from({ length: calls }, (_, c) => c),
      (c) => {
        const start = c * PRODUCE_BATCH
        const end = Math.min(plan.records, start + PRODUCE_BATCH)
        const records = new Array<Log.ProducerRecord>(end - start)
        for (let i = start; i < end; i++) {
          const partition = i % plan.partitions
          const offset = Math.floor(i / plan.partitions)
          records[i - start] = {
            topic,
            partition,
            key: encoder.encode(JSON.stringify(keyOf(i))),
            value: valueBytes[i % VALUE_POOL]!,
            headers: [{ key: SOURCE_HEADER, value: encoder.encode(JSON.stringify([SOURCE, partition, offset])) }]
          }
        }
        // acks all: the idempotent producer, so a send retried while the new topic's partitions come up is not
        // appended twice (acks 1 right after ensureTopic appended up to 3 copies here); as fast as acks 1 here.
        return log.produceBatch(records, { acks: "all" })
      },
      { concurrency: PRODUCE_IN_FLIGHT, discard: true }
    )
    const produceMs = performance.now() - t0
    const offsets = yield* log.offsets(
      Array.from({ length: plan.partitions }, (_, partition) => ({ topic, partition }))
    )
    const expected = highwatersOf(plan.records, plan.partitions)
    if (offsets.some((o) => o.logStart !== 0 || o.highwater !== expected[o.partition])) {
      return yield* Effect.die(
        new Error(`${topic}: highwaters ${offsets.map((o) => o.highwater).join(",")}, expected ${expected.join(",")}`)
      )
    }
    return produceMs
  }).pipe(Effect.scoped, Effect.provide(Logger.layer([])))

/** The commit measured, and whether packages/ had uncommitted changes (recovery and tables change often). */
const codeVersion = (): string => {
  try {
    const git = (...args: Array<string>) =>
      execFileSync("git", args, { cwd: fileURLToPath(new URL("..", import.meta.url)), encoding: "utf8" }).trim()
    const dirty = git("status", "--porcelain", "--", "packages") !== ""
    return `${git("rev-parse", "--short", "HEAD")}${dirty ? " + uncommitted changes in packages/" : ""}`
  } catch {
    return "unknown"
  }
}

export const run = async (): Promise<BenchOutput & { readonly save: boolean }> => {
  const plan: Plan = {
    records: envInt("BENCH_RECORDS", DEFAULTS.records),
    partitions: envInt("BENCH_PARTITIONS", DEFAULTS.partitions),
    broker: envString("BENCH_KAFKA_BROKER") ?? DEFAULTS.broker
  }
  const runs = envInt("BENCH_RUNS", DEFAULTS.runs)
  const recoveryBuffer = envInt("BENCH_RECOVERY_BUFFER", DEFAULTS.recoveryBuffer)
  const streamBuffer = envInt("BENCH_STREAM_BUFFER", DEFAULTS.streamBuffer)
  const phasesEnv = envString("BENCH_PHASES")
  const phases = (phasesEnv ?? PHASES.join(",")).split(",").filter((p) => p !== "")
  for (const p of phases) {
    if (!(PHASES as ReadonlyArray<string>).includes(p)) throw new Error(`BENCH_PHASES: unknown phase ${p}`)
  }
  const dirOf = (name: string) => {
    const raw = envString(name)
    if (raw === undefined || raw === "") return undefined
    mkdirSync(resolve(raw), { recursive: true })
    return resolve(raw)
  }
  const cpuProfDir = dirOf("BENCH_CPU_PROF")
  const allocProfDir = dirOf("BENCH_ALLOC_PROF")
  const save =
    plan.records === DEFAULTS.records &&
    plan.partitions === DEFAULTS.partitions &&
    plan.broker === DEFAULTS.broker &&
    runs === DEFAULTS.runs &&
    recoveryBuffer === DEFAULTS.recoveryBuffer &&
    streamBuffer === DEFAULTS.streamBuffer &&
    phasesEnv === undefined &&
    cpuProfDir === undefined &&
    allocProfDir === undefined

  const KafkaLog: KafkaLogModule = await import("../packages/kafka/src/KafkaLog.js")
  const tablesModule: TablesModule = await import("../packages/tables/src/index.js")
  const KafkaJs: KafkaJsModule = await import("kafkajs")
  const kafkajsVersion = (createRequire(import.meta.url)("kafkajs/package.json") as { version: string }).version
  const app = `strata-bench-recovery-${process.pid}-${Date.now()}`
  const topic = tablesModule.Table.changelogTopicOf(
    app,
    tableDef(tablesModule, plan.partitions) as Parameters<typeof tablesModule.Table.changelogTopicOf>[1]
  )
  progress(
    `recovery: ${plan.records} records, ${plan.partitions} partitions, ${runs} run(s) of ${phases.join(", ")} on ` +
      `${plan.broker}${cpuProfDir === undefined ? "" : `, CPU profiles in ${cpuProfDir}`}`
  )
  const samples = new Map<Phase, Array<PhaseResult>>(PHASES.map((p) => [p, []]))
  const admin = new KafkaJs.Kafka({
    clientId: "strata-bench-recovery-admin",
    brokers: [plan.broker],
    logLevel: KafkaJs.logLevel.NOTHING
  }).admin()
  await admin.connect()
  let produceMs: number
  try {
    progress(`recovery: producing into ${topic}`)
    produceMs = await Effect.runPromise(load(KafkaLog, tablesModule, plan, topic))
    progress(
      `recovery: produced in ${produceMs.toFixed(0)} ms (${Math.round(plan.records / (produceMs / 1000))} records/s)`
    )
    for (let rep = 0; rep < runs; rep++) {
      for (const phase of (rep % 2 === 0 ? phases : [...phases].reverse()) as ReadonlyArray<Phase>) {
        const spec: Spec = {
          phase,
          run: rep + 1,
          app,
          topic,
          broker: plan.broker,
          records: plan.records,
          partitions: plan.partitions,
          recoveryBuffer,
          streamBuffer,
          ...(cpuProfDir === undefined ? {} : { cpuProfile: join(cpuProfDir, `${phase}-${rep + 1}.cpuprofile`) }),
          ...(allocProfDir === undefined ? {} : { allocProfile: join(allocProfDir, `${phase}-${rep + 1}.heapprofile`) })
        }
        const r = await runChild(spec)
        samples.get(phase)!.push(r)
        const extra = Object.entries(r.extra)
          .map(([k, v]) => `${k} ${v}`)
          .join(", ")
        progress(
          `recovery ${phase} #${rep + 1}: ${r.ms.toFixed(0)} ms, ${Math.round(r.records / (r.ms / 1000))} records/s, ` +
            `CPU ${((100 * r.cpuMs) / r.ms).toFixed(0)}% (main thread ${((100 * r.mainCpuMs) / r.ms).toFixed(0)}%), RSS ${r.rssBeforeMB} -> ${r.rssSampledPeakMB} MB ` +
            `(peak ${r.peakRssMB} MB); ${extra}`
        )
      }
    }
  } finally {
    await admin.deleteTopics({ topics: [topic] }).catch(() => undefined)
    await admin.disconnect()
  }

  const rates = (phase: Phase) => (samples.get(phase) ?? []).map((r) => r.records / (r.ms / 1000))
  const peak = (phase: Phase) => median((samples.get(phase) ?? []).map((r) => r.peakRssMB))
  const cpuPerRecord = (phase: Phase) => median((samples.get(phase) ?? []).map((r) => (1000 * r.cpuMs) / r.records))
  const mainCpuPerRecord = (phase: Phase) =>
    median((samples.get(phase) ?? []).map((r) => (1000 * r.mainCpuMs) / r.records))
  const baseline = median(rates("kafkajs"))
  const logRate = median(rates("log"))
  const common = {
    records: plan.records,
    partitions: plan.partitions,
    keyBytes: KEY_CHARS + 2,
    valueBytes: VALUE_CHARS + 2,
    runs,
    baselineClient: `kafkajs ${kafkajsVersion} consumer (eachBatch, read only), same topic, same run`,
    baselinePeakRssMB: peak("kafkajs")
  }
  const results: Array<Figure> = []
  if (samples.get("kafkajs")!.length > 0) {
    const figure = (bench: string, phase: Phase, extra: Record<string, unknown>): Figure => {
      const value = median(rates(phase))
      return {
        bench,
        value: Math.round(value),
        unit: "records/s",
        baseline: Math.round(baseline),
        ratio: round3(value / baseline),
        ...common,
        peakRssMB: peak(phase),
        cpuMicrosPerRecord: round3(cpuPerRecord(phase)),
        mainThreadCpuMicrosPerRecord: round3(mainCpuPerRecord(phase)),
        ...extra
      }
    }
    if (samples.get("log")!.length > 0) {
      results.push(figure("recovery.log.read", "log", { client: "KafkaLog.consumer().batches, nothing applied" }))
    }
    for (const store of ["memory", "level", "rocksdb"] as const) {
      if (samples.get(store)!.length === 0) continue
      results.push(
        figure(`recovery.${store}`, store, {
          store,
          ...(samples.get("log")!.length > 0 ? { ratioToLogRead: round3(median(rates(store)) / logRate) } : {}),
          recoveryBufferSize: recoveryBuffer,
          streamBufferMaxsize: streamBuffer
        })
      )
    }
  }
  const details: Record<string, unknown> = {
    code: codeVersion(),
    broker: plan.broker,
    topic: "fresh changelog topic <app>-bench-changelog (KafkaLog.ensureTopic compacted), deleted afterwards",
    records: `key "key-%010d" and values of ${VALUE_CHARS} characters (${VALUE_POOL} distinct, round-robin), JSON-encoded as Table.codecs does (${KEY_CHARS + 2}-byte keys, ${VALUE_CHARS + 2}-byte values), header strata-source ["${SOURCE}", p, offset] as process writes; record i to partition i % ${plan.partitions}`,
    load: `KafkaLog.produceBatch acks all (idempotent: acks 1 duplicated records retried right after topic creation), calls of ${PRODUCE_BATCH} records, ${PRODUCE_IN_FLIGHT} in flight: ${Math.round(plan.records / (produceMs / 1000))} records/s (not a figure)`,
    phases: {
      kafkajs: `kafkajs ${kafkajsVersion} consumer, fresh group (kafkajs has no manual assignment; one member gets every partition), fromBeginning, autoCommit off, eachBatch counting records and bytes; timed from the group join to the last highwater (join not timed); fetch maxBytes ${FETCH.maxBytes}, maxBytesPerPartition ${FETCH.partitionMaxBytes}, maxWait ${FETCH.maxWaitMs} ms`,
      log: "KafkaLog.make + consumer(): every partition assigned, seek 0, batches counted until every highwater (no queue, no apply)",
      stores: `fresh Tables.make({ settleDelay: 0, streamBufferMaxsize: ${streamBuffer}, recovery: { recoveryDelay: 0, recoveryBufferSize: ${recoveryBuffer} } }) on a fresh store, table registered, start untimed; timed: manager.onPartitionsAssigned(all ${plan.partitions}) until manager.waitUntilRecoveryCompleted`
    },
    stores: {
      memory: "MemoryStore.layer()",
      level: "LevelStore.layer({ directory: fresh temporary directory })",
      rocksdb: "RocksDbStore.layer({ directory: fresh temporary directory })"
    },
    diagnostics:
      "storeWrites / recordsPerWrite: recovery's BatchApplied events (one per atomic store batch); queueFullPct / queueEmptyPct: the shared changelog queue (Tables.changelogQueue) sampled every 100 ms on the event loop (between fibers' turns only, a hint)",
    verify: `untimed, after each restore: ${SAMPLE} evenly spread keys read back through table.get; after the worker stops, every partition store opened again from the same Store and scanned: exactly its share of the keys`,
    rss: "each phase in its own child process (same node and flags); peakRssMB = the child's process.resourceUsage().maxRSS read at the end of the timed part (start-up + phase); rssSampledPeakMB = max of process.memoryUsage().rss sampled every 100 ms in the timed part; rssBeforeMB = rss when the timed part starts",
    cpu: "cpuMicrosPerRecord: the child's user+system CPU time in the timed part per record (every thread: JavaScript, GC, libuv pool, the store's own threads); mainThreadCpuMicrosPerRecord: the same for the JavaScript thread alone (process.threadCpuUsage), steadier than wall time on a shared machine",
    order: `per repetition ${phases.join(", ")}, reversed on odd repetitions; every phase reads the same topic, produced once`,
    samples: Object.fromEntries(
      [...samples]
        .filter(([, list]) => list.length > 0)
        .map(([phase, list]) => [
          phase,
          list.map((r) => ({
            recordsPerSecond: Math.round(r.records / (r.ms / 1000)),
            ms: Math.round(r.ms),
            cpuMicrosPerRecord: round3((1000 * r.cpuMs) / r.records),
            mainThreadCpuMicrosPerRecord: round3((1000 * r.mainCpuMs) / r.records),
            rssBeforeMB: r.rssBeforeMB,
            rssSampledPeakMB: r.rssSampledPeakMB,
            peakRssMB: r.peakRssMB,
            ...r.extra
          }))
        ])
    )
  }
  return { results, details, save }
}

// Run as a child: one phase, its result on stdout.
if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const at = process.argv.indexOf(CHILD_FLAG)
  const raw = at < 0 ? undefined : process.argv[at + 1]
  if (raw === undefined) {
    process.stderr.write(`bench/recovery.ts runs from bench/run.ts (./dev bench:recovery)\n`)
    process.exitCode = 2
  } else {
    childMain(JSON.parse(raw) as Spec).catch((error: unknown) => {
      process.stderr.write(`${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`)
      process.exit(1)
    })
  }
}
