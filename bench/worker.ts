// Processing through tables (`@strata/tables`' Worker) against a bare consume → produce loop on the same client, in
// the same run (docs/ARCHITECTURE.md, "Benchmarks"; issue 16).
//
// Once per run RECORDS source records are produced into a fresh topic of PARTITIONS partitions: record i has the key
// "key-%010d" of key (i * 7919) mod KEYS (KEYS distinct keys, each in the partition the default partitioner gives it,
// murmur2 of the key bytes) and a 100-byte value. Every phase counts the records per key, from offset 0 to the
// highwaters, producing each new count to a fresh compacted topic with acks=all and committing about every second
// (flush, then commit). Each phase runs in its own child process (the same node and flags as this one):
// - bare (the ceiling, the baseline of every figure): the @platformatic/kafka copy the adapter loads, used directly: a
//   `Consumer` in a fresh group (`consume`, autocommit off, from the earliest offset), counts in a `Map`, what the
//   stream hands over produced in `Producer({ idempotent: true, acks: -1 }).send` calls of at most 1000 records (one
//   request in flight, as KafkaLog sends), and every second: every send acknowledged, then `consumer.commit` of the next offsets.
// - memory, level, rocksdb: `Worker.make({ groupId, commitInterval: 1000 })` with one agent counting into
//   `Table.make({ key: Schema.String, value: Schema.Int })` through `table.update`, on `Tables.make({ settleDelay: 0 })`
//   and a fresh store (`MemoryStore.layer()`, `LevelStore.layer` / `RocksDbStore.layer` in a fresh temporary
//   directory), with `KafkaLog` underneath; a `process` agent, run per record.
// - memory-batch: as memory, with a `processBatch` agent instead: each fetched batch counted per key first, then one
//   `table.update` per key (the source's keys do not repeat within a partition's batch, so its changelog records are
//   the same as memory's).
// - kstreams-memory, kstreams-rocksdb, kstreams-eos (the Worker's peers: memory and memory-batch, rocksdb,
//   memory-eos): Kafka Streams 4.4.0's `count()` (bench/kstreams/src/main/java/strata/bench/Count.java, a JVM of its
//   own): the source grouped by key (no repartition) and counted into an in-memory store / the DSL's default RocksDB
//   store, its changelog at the brokers' default replication with acks=all, commit.interval.ms 1000, one stream
//   thread, processing.guarantee at_least_once (exactly_once_v2 for kstreams-eos, in-memory store),
//   statestore.cache.max.bytes at Kafka Streams' own default (10 MiB: a key's last change per commit reaches the
//   changelog; the source's keys hardly repeat within a second, so it holds back few changes). It asks for a commit
//   once it has seen every source record and is done when its group's committed offsets (read stable) reach the
//   highwaters; it reports its own time, CPU (the JVM's; "main": the stream thread's) and peak RSS (VmHWM), and
//   writes its store's counts to a file this bench checks. Built on first use with Maven
//   (`mvn -q -B -f bench/kstreams/pom.xml compile dependency:copy-dependencies`, output in bench/kstreams/target,
//   rebuilt when pom.xml or Count.java is newer).
// Timed in all: from the first record handed to the counting code until every partition is processed to its
// highwater and a last commit returned (the group join before it is not timed, nor the close after it: the worker's
// scope, Kafka Streams' close and the bare loop's consumer close all come after the clock stops; the bare loop's
// fetch stream is closed before it). Checked afterwards, untimed: the counts (the bare loop's Map; the worker's
// table, every partition scanned; Kafka Streams' store) equal the input's, key by key. CPU and RSS as in
// bench/recovery.ts (each child's own). Phases run in the order below, reversed on odd repetitions.
//
// Environment (the results file is written only with the defaults):
//   BENCH_RECORDS (1000000), BENCH_KEYS (100000), BENCH_PARTITIONS (12), BENCH_RUNS (3),
//   BENCH_KAFKA_BROKER (127.0.0.1:9092), BENCH_PHASES (bare,memory,level,rocksdb,memory-eos,memory-batch,
//   kstreams-memory,kstreams-rocksdb,kstreams-eos; memory-eos is the memory store with processingGuarantee
//   exactly_once),
//   BENCH_KSTREAMS (1; 0 drops the kstreams phases, for a machine without Java and Maven),
//   BENCH_KSTREAMS_CACHE_BYTES (10485760, Kafka Streams' own default statestore.cache.max.bytes, what its users run:
//   a key's changes within a commit reach the changelog once; 0 sends every change, as the Worker does)
import { Log, MemoryStore } from "../packages/core/src/index.js"
import { spawnSync } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import { Context, Effect, Exit, Layer, Logger, Option, Schema, Scope } from "effect"
import { type ChildProtocol, type Measured, measure, reportFromChild, runChild, runProgram } from "./child.js"
import { type BenchOutput, envInt, envString, type Figure, median, progress, randomBytes, round3 } from "./lib.js"

type Platformatic = typeof import("../packages/kafka/node_modules/@platformatic/kafka/dist/index.js")
type KafkaLogModule = typeof import("../packages/kafka/src/KafkaLog.js")
type TablesModule = typeof import("../packages/tables/src/index.js")

const DEFAULTS = { records: 1_000_000, keys: 100_000, partitions: 12, runs: 3, broker: "127.0.0.1:9092" } as const
const PHASES = [
  "bare",
  "memory",
  "level",
  "rocksdb",
  "memory-eos",
  "memory-batch",
  "kstreams-memory",
  "kstreams-rocksdb",
  "kstreams-eos"
] as const
type Phase = (typeof PHASES)[number]
type WorkerPhase = "memory" | "level" | "rocksdb" | "memory-eos" | "memory-batch"
type KstreamsPhase = "kstreams-memory" | "kstreams-rocksdb" | "kstreams-eos"
/** Each Kafka Streams phase: its store, its processing guarantee and the Worker phases it is the peer of. */
const KSTREAMS: Record<
  KstreamsPhase,
  { readonly store: "memory" | "rocksdb"; readonly guarantee: string; readonly peers: ReadonlyArray<WorkerPhase> }
> = {
  "kstreams-memory": { store: "memory", guarantee: "at_least_once", peers: ["memory", "memory-batch"] },
  "kstreams-rocksdb": { store: "rocksdb", guarantee: "at_least_once", peers: ["rocksdb"] },
  "kstreams-eos": { store: "memory", guarantee: "exactly_once_v2", peers: ["memory-eos"] }
}
const isKstreams = (phase: Phase): phase is KstreamsPhase => phase in KSTREAMS
/** The Kafka Streams version of bench/kstreams/pom.xml (the brokers' version, scripts/services). */
const KSTREAMS_VERSION = "4.4.0"
const COMMIT_MS = 1000
/** Records the bare loop puts in one produce request: KafkaLog's default `maxBatchRecords`. */
const SEND_RECORDS = 1000
const KEY_CHARS = 14
const VALUE_BYTES = 100
const CHILD: ChildProtocol = { flag: "--worker-child", prefix: "WORKER-RESULT ", timeoutMs: 600_000 }

const kafkaRequire = createRequire(new URL("../packages/kafka/package.json", import.meta.url))
const loadPlatformatic = async (): Promise<Platformatic> =>
  (await import(pathToFileURL(kafkaRequire.resolve("@platformatic/kafka")).href)) as Platformatic

const keyOf = (k: number): string => `key-${String(k).padStart(KEY_CHARS - 4, "0")}`
const keyIndexOf = (i: number, keys: number): number => (i * 7919) % keys

/** The counts the input must give: key → number of records. */
const expectedCounts = (records: number, keys: number): Map<string, number> => {
  const out = new Map<string, number>()
  for (let i = 0; i < records; i++) {
    const key = keyOf(keyIndexOf(i, keys))
    out.set(key, (out.get(key) ?? 0) + 1)
  }
  return out
}

/** The first difference between two count maps, if any. */
const differs = (got: ReadonlyMap<string, number>, want: ReadonlyMap<string, number>): string | undefined => {
  if (got.size !== want.size) return `${got.size} keys, expected ${want.size}`
  for (const [k, v] of want) if (got.get(k) !== v) return `${k}: ${got.get(k)}, expected ${v}`
  return undefined
}

interface Spec {
  readonly phase: Phase
  readonly run: number
  readonly source: string
  readonly broker: string
  readonly records: number
  readonly keys: number
  readonly partitions: number
}

interface PhaseResult {
  readonly phase: Phase
  readonly ms: number
  readonly cpuMs: number
  readonly mainCpuMs: number
  readonly peakRssMB: number
  readonly extra: Record<string, number>
}

const resultOf = (spec: Spec, m: Measured<number>, extra: Record<string, number>): PhaseResult => ({
  phase: spec.phase,
  // From the first record counted (the group join before it is not timed).
  ms: m.ms - m.value,
  cpuMs: m.cpuMs,
  mainCpuMs: m.mainCpuMs,
  peakRssMB: m.peakRssMB,
  extra
})

// ---------------------------------------------------------------------------
// The ceiling: a bare consume → produce loop on @platformatic/kafka
// ---------------------------------------------------------------------------

const barePhase = async (spec: Spec): Promise<PhaseResult> => {
  const pk = await loadPlatformatic()
  const base = {
    clientId: "strata-bench-worker-bare",
    bootstrapBrokers: [spec.broker],
    timeout: 10_000,
    retries: 3,
    retryDelay: 250
  }
  const out = `${spec.source}-bare-${spec.run}`
  const admin = new pk.Admin(base)
  await admin.createTopics({
    topics: [out],
    partitions: spec.partitions,
    replicas: 1,
    configs: [{ name: "cleanup.policy", value: "compact" }]
  })
  const producer = new pk.Producer({ ...base, idempotent: true, acks: -1 })
  const consumer = new pk.Consumer({ ...base, groupId: `strata-bench-worker-bare-${process.pid}-${spec.run}` })
  const counts = new Map<string, number>()
  const targets = await highwaters(admin, spec)
  let unfinished = targets.filter((h) => h > 0).length
  const next = new Array<number>(spec.partitions).fill(0)
  try {
    const m = await measure(async () => {
      const t0 = performance.now()
      let firstAt: number | undefined
      const stream = await consumer.consume({
        topics: [spec.source],
        mode: pk.MessagesStreamModes.EARLIEST,
        autocommit: false
      })
      let sending: Promise<unknown> = Promise.resolve()
      let failed: unknown
      const commit = async () => {
        await sending
        const offsets = next.flatMap((offset, partition) =>
          offset > 0 ? [{ topic: spec.source, partition, offset: BigInt(offset), leaderEpoch: -1 }] : []
        )
        if (offsets.length > 0) await consumer.commit({ offsets })
      }
      const ticker = setInterval(() => {
        commit().catch((e: unknown) => {
          failed = e
        })
      }, COMMIT_MS)
      try {
        await new Promise<void>((resolveDone, reject) => {
          stream.on("error", reject)
          stream.on("readable", () => {
            const messages: Array<{ topic: string; partition: number; key: Buffer; value: Buffer }> = []
            let m: { key: Buffer; partition: number; offset: bigint } | null
            // biome-ignore lint/suspicious/noAssignInExpressions: the usual Readable drain loop
            while ((m = stream.read()) !== null) {
              firstAt ??= performance.now()
              const key = m.key.toString("latin1")
              const n = (counts.get(key) ?? 0) + 1
              counts.set(key, n)
              messages.push({ topic: out, partition: m.partition, key: m.key, value: Buffer.from(String(n)) })
              const offset = Number(m.offset) + 1
              next[m.partition] = offset
              if (offset === targets[m.partition]) unfinished--
            }
            // At most SEND_RECORDS records a request, as KafkaLog sends (a whole fetch would exceed the broker's limit).
            for (let at = 0; at < messages.length; at += SEND_RECORDS) {
              const chunk = messages.slice(at, at + SEND_RECORDS)
              sending = sending.then(() => producer.send({ messages: chunk }))
            }
            if (unfinished === 0) resolveDone()
          })
        })
        await commit()
        if (failed !== undefined) throw failed
      } finally {
        clearInterval(ticker)
        await stream.close()
      }
      return (firstAt ?? t0) - t0
    })
    const wrong = differs(counts, expectedCounts(spec.records, spec.keys))
    if (wrong !== undefined) throw new Error(`bare: counts differ: ${wrong}`)
    return resultOf(spec, m, {})
  } finally {
    await consumer.close(true).catch(() => undefined)
    await producer.close().catch(() => undefined)
    await admin.deleteTopics({ topics: [out] }).catch(() => undefined)
    await admin.close().catch(() => undefined)
  }
}

const highwaters = async (admin: InstanceType<Platformatic["Admin"]>, spec: Spec): Promise<Array<number>> => {
  const listed = await admin.listOffsets({
    topics: [
      {
        name: spec.source,
        partitions: Array.from({ length: spec.partitions }, (_, partitionIndex) => ({
          partitionIndex,
          timestamp: -1n
        }))
      }
    ]
  })
  const out = new Array<number>(spec.partitions).fill(0)
  for (const t of listed) for (const p of t.partitions) out[p.partitionIndex] = Number(p.offset)
  return out
}

// ---------------------------------------------------------------------------
// The worker on a store
// ---------------------------------------------------------------------------

const workerPhase = async (spec: Spec, phase: WorkerPhase): Promise<PhaseResult> => {
  const kind = phase === "memory-eos" || phase === "memory-batch" ? "memory" : phase
  const processingGuarantee = phase === "memory-eos" ? "exactly_once" : "at_least_once"
  const KafkaLog: KafkaLogModule = await import("../packages/kafka/src/KafkaLog.js")
  const tablesModule: TablesModule = await import("../packages/tables/src/index.js")
  const { Table, Tables, Worker } = tablesModule
  const directory = kind === "memory" ? undefined : mkdtempSync(join(tmpdir(), `strata-bench-worker-${kind}-`))
  const storeLayer =
    kind === "memory"
      ? MemoryStore.layer()
      : kind === "level"
        ? (await import("../packages/store-adapters/src/LevelStore.js")).layer({ directory: directory! })
        : (await import("../packages/store-adapters/src/RocksDbStore.js")).layer({ directory: directory! })
  const counts = Table.make({ name: "counts", key: Schema.String, value: Schema.Int, partitions: spec.partitions })
  const decoder = new TextDecoder()
  try {
    const program = Effect.gen(function* () {
      const log: Log.Shape = yield* KafkaLog.make({ brokers: [spec.broker], clientId: `strata-bench-worker-${kind}` })
      const services = Context.add(yield* Layer.build(storeLayer), Log.Log, log)
      const app = `${spec.source}-${phase}-${spec.run}`
      const context = yield* Effect.context<never>()
      // The worker's scope is closed after the timing: its close (a last commit, leaving the group) is not timed, as
      // Kafka Streams' close is not.
      const scope = yield* Scope.make()
      let firstAt: number | undefined
      const run = Effect.gen(function* () {
        const t0 = performance.now()
        const tables = yield* Tables.make({ app, settleDelay: 0, processingGuarantee })
        const table = yield* tables.register(counts)
        const worker = yield* Worker.make({ groupId: app, commitInterval: COMMIT_MS }, [
          phase === "memory-batch"
            ? Worker.agent({
                name: "count",
                topics: [spec.source],
                // A batch's records counted per key first, then one update per key.
                processBatch: (records) =>
                  Effect.suspend(() => {
                    firstAt ??= performance.now()
                    const seen = new Map<string, number>()
                    for (const r of records) {
                      const key = decoder.decode(r.key!)
                      seen.set(key, (seen.get(key) ?? 0) + 1)
                    }
                    return Effect.forEach(
                      seen,
                      ([key, n]) => table.update(key, (c) => Option.getOrElse(c, () => 0) + n),
                      { discard: true }
                    )
                  })
              })
            : Worker.agent({
                name: "count",
                topics: [spec.source],
                process: (record) => {
                  firstAt ??= performance.now()
                  return Effect.asVoid(
                    table.update(decoder.decode(record.key!), (n) => Option.getOrElse(n, () => 0) + 1)
                  )
                }
              })
        ]).pipe(Effect.provideService(Tables.Tables, tables))
        // Done when every partition reached its highwater; then one last commit.
        while (true) {
          const m = yield* worker.metrics
          if (
            m.recordsProcessed >= spec.records &&
            m.lag.length === spec.partitions &&
            m.lag.every((l) => l.offset === 0)
          )
            break
          yield* Effect.raceFirst(Effect.sleep("20 millis"), worker.join)
        }
        yield* worker.commit
        const metrics = yield* worker.metrics
        return { t0, table, commits: metrics.commits, lastCommitMs: metrics.lastCommitMs }
      }).pipe(Scope.provide(scope), Effect.provide(services))
      let done: Effect.Success<typeof run> | undefined
      const m = yield* Effect.promise(() =>
        measure(async () => {
          const r = await Effect.runPromiseWith(context)(run)
          done = r
          return (firstAt ?? r.t0) - r.t0
        })
      )
      // Untimed: the counts, every partition scanned, then the worker closed.
      const got = new Map<string, number>()
      for (let p = 0; p < spec.partitions; p++) for (const [k, v] of yield* done!.table.entries(p)) got.set(k, v)
      yield* Scope.close(scope, Exit.void)
      return { m, checked: { got, commits: done!.commits, lastCommitMs: done!.lastCommitMs } }
    }).pipe(Effect.scoped, Effect.provide(Logger.layer([])))
    const { m, checked } = await Effect.runPromise(program)
    const wrong = differs(checked.got, expectedCounts(spec.records, spec.keys))
    if (wrong !== undefined) throw new Error(`${kind}: counts differ: ${wrong}`)
    return resultOf(spec, m, { commits: checked.commits, lastCommitMs: checked.lastCommitMs })
  } finally {
    if (directory !== undefined) rmSync(directory, { recursive: true, force: true })
  }
}

// ---------------------------------------------------------------------------
// Kafka Streams' count(), a JVM started by the parent
// ---------------------------------------------------------------------------

const KSTREAMS_DIR = fileURLToPath(new URL("kstreams/", import.meta.url))
const KSTREAMS_SOURCES = ["pom.xml", "src/main/java/strata/bench/Count.java"]
const KSTREAMS_STAMP = join(KSTREAMS_DIR, "target", ".built")
const KSTREAMS_PREFIX = "KSTREAMS-RESULT "

/** Builds bench/kstreams with Maven unless its last build is newer than its sources. */
const buildKstreams = (): void => {
  const mtime = (file: string) => statSync(file, { throwIfNoEntry: false })?.mtimeMs
  const built = mtime(KSTREAMS_STAMP)
  if (built !== undefined && KSTREAMS_SOURCES.every((f) => mtime(join(KSTREAMS_DIR, f))! <= built)) return
  for (const tool of ["java", "mvn"]) {
    const probe = spawnSync(tool, ["-version"], { stdio: "ignore" })
    if (probe.error !== undefined || probe.status !== 0)
      throw new Error(`kstreams phases: no working ${tool} on PATH (BENCH_KSTREAMS=0 leaves them out)`)
  }
  progress("worker: building bench/kstreams with Maven")
  // A fresh lib/: jars of an earlier version must not stay on the class path.
  rmSync(join(KSTREAMS_DIR, "target"), { recursive: true, force: true })
  const mvn = spawnSync(
    "mvn",
    ["-q", "-B", "-f", join(KSTREAMS_DIR, "pom.xml"), "compile", "dependency:copy-dependencies"],
    { encoding: "utf8", maxBuffer: 64 * 2 ** 20 }
  )
  if (mvn.error !== undefined || mvn.status !== 0) {
    const tail = `${mvn.stdout ?? ""}${mvn.stderr ?? ""}`.split("\n").slice(-30).join("\n")
    throw new Error(`kstreams phases: the Maven build failed (BENCH_KSTREAMS=0 leaves them out):\n${tail}`)
  }
  writeFileSync(KSTREAMS_STAMP, "")
}

/** What Count.java prints. */
interface KstreamsResult {
  readonly ms: number
  readonly joinMs: number
  readonly cpuMs: number
  readonly mainCpuMs: number
  readonly peakRssMB: number
  readonly commits: number
}

/** One Kafka Streams phase: Count.java in a JVM of its own, then its counts checked against the input's. */
/** Kafka Streams' own default `statestore.cache.max.bytes` (10 MiB). */
const KSTREAMS_DEFAULT_CACHE_BYTES = 10 * 1024 * 1024

const kstreamsPhase = async (spec: Spec, phase: KstreamsPhase, cacheBytes: number): Promise<PhaseResult> => {
  const directory = mkdtempSync(join(tmpdir(), "strata-bench-worker-kstreams-"))
  const countsFile = join(directory, "counts.tsv")
  try {
    const args = {
      broker: spec.broker,
      source: spec.source,
      app: `${spec.source}-${phase}-${spec.run}`,
      store: KSTREAMS[phase].store,
      guarantee: KSTREAMS[phase].guarantee,
      partitions: spec.partitions,
      records: spec.records,
      stateDir: join(directory, "state"),
      countsFile,
      cacheBytes,
      threads: 1
    }
    const classPath = `${join(KSTREAMS_DIR, "target", "classes")}:${join(KSTREAMS_DIR, "target", "lib", "*")}`
    const jvm = [
      "-Xmx1g",
      "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
      // Warnings that say nothing here: a processing exception handler for a global thread there is none of, a
      // state directory under /tmp, and the admin's offsets read while an exactly-once commit is still open.
      "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.streams.StreamsConfig=error",
      "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.streams.processor.internals.StateDirectory=error",
      "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.clients.admin.internals.ListConsumerGroupOffsetsHandler=error",
      "-cp",
      classPath,
      "strata.bench.Count"
    ]
    const r = await runProgram<KstreamsResult>(
      `${phase} (the JVM)`,
      "java",
      [...jvm, ...Object.entries(args).map(([k, v]) => `${k}=${v}`)],
      { prefix: KSTREAMS_PREFIX, timeoutMs: CHILD.timeoutMs }
    )
    const got = new Map<string, number>()
    for (const row of readFileSync(countsFile, "utf8").split("\n")) {
      if (row === "") continue
      const tab = row.indexOf("\t")
      got.set(row.slice(0, tab), Number(row.slice(tab + 1)))
    }
    const wrong = differs(got, expectedCounts(spec.records, spec.keys))
    if (wrong !== undefined) throw new Error(`${phase}: counts differ: ${wrong}`)
    return {
      phase,
      ms: r.ms,
      cpuMs: r.cpuMs,
      mainCpuMs: r.mainCpuMs,
      peakRssMB: r.peakRssMB,
      extra: { commits: r.commits, joinMs: Math.round(r.joinMs) }
    }
  } finally {
    rmSync(directory, { recursive: true, force: true })
  }
}

// ---------------------------------------------------------------------------
// The parent
// ---------------------------------------------------------------------------

/** Produces the source records once: key i's partition by murmur2 as Kafka's default partitioner. */
const load = (KafkaLog: KafkaLogModule, tablesModule: TablesModule, spec: Omit<Spec, "phase" | "run">) =>
  Effect.gen(function* () {
    const log = yield* KafkaLog.make({ brokers: [spec.broker], clientId: "strata-bench-worker-load" })
    yield* log.ensureTopic({ topic: spec.source, partitions: spec.partitions })
    const value = randomBytes(VALUE_BYTES, 0x5eed)
    const keys = Array.from({ length: spec.keys }, (_, k) => Buffer.from(keyOf(k), "latin1"))
    const partitionOf = keys.map((key) => tablesModule.Table.keyPartition(key, spec.partitions))
    const batch = 10_000
    const pending: Array<Effect.Effect<ReadonlyArray<number>, unknown>> = []
    const producer = yield* log.producer()
    for (let start = 0; start < spec.records; start += batch) {
      const records = []
      for (let i = start; i < Math.min(spec.records, start + batch); i++) {
        const k = keyIndexOf(i, spec.keys)
        records.push({ topic: spec.source, partition: partitionOf[k]!, key: keys[k]!, value })
      }
      pending.push(yield* producer.send(records))
    }
    yield* Effect.all(pending)
  }).pipe(Effect.scoped)

export const run = async (): Promise<BenchOutput & { readonly save: boolean }> => {
  const records = envInt("BENCH_RECORDS", DEFAULTS.records)
  const keys = envInt("BENCH_KEYS", DEFAULTS.keys)
  const partitions = envInt("BENCH_PARTITIONS", DEFAULTS.partitions)
  const runs = envInt("BENCH_RUNS", DEFAULTS.runs)
  const broker = envString("BENCH_KAFKA_BROKER") ?? DEFAULTS.broker
  const phasesEnv = envString("BENCH_PHASES")
  const kstreamsEnv = envString("BENCH_KSTREAMS")
  if (kstreamsEnv !== undefined && kstreamsEnv !== "0" && kstreamsEnv !== "1")
    throw new Error(`BENCH_KSTREAMS must be 0 or 1, got ${JSON.stringify(kstreamsEnv)}`)
  const cacheEnv = envString("BENCH_KSTREAMS_CACHE_BYTES")
  const cacheBytes = cacheEnv === undefined || cacheEnv === "" ? KSTREAMS_DEFAULT_CACHE_BYTES : Number(cacheEnv)
  if (!Number.isSafeInteger(cacheBytes) || cacheBytes < 0)
    throw new Error(`BENCH_KSTREAMS_CACHE_BYTES must be a whole number of bytes, got ${JSON.stringify(cacheEnv)}`)
  const phases = (phasesEnv ?? PHASES.join(","))
    .split(",")
    .filter((p) => p !== "" && !(kstreamsEnv === "0" && isKstreams(p as Phase))) as Array<Phase>
  for (const p of phases) if (!PHASES.includes(p)) throw new Error(`BENCH_PHASES: unknown phase ${p}`)
  const save =
    records === DEFAULTS.records &&
    keys === DEFAULTS.keys &&
    partitions === DEFAULTS.partitions &&
    runs === DEFAULTS.runs &&
    broker === DEFAULTS.broker &&
    phasesEnv === undefined &&
    kstreamsEnv !== "0" &&
    cacheBytes === KSTREAMS_DEFAULT_CACHE_BYTES
  if (phases.some(isKstreams)) buildKstreams()

  const KafkaLog: KafkaLogModule = await import("../packages/kafka/src/KafkaLog.js")
  const tablesModule: TablesModule = await import("../packages/tables/src/index.js")
  const source = `strata-bench-worker-${process.pid}-${Date.now()}`
  const plan = { source, broker, records, keys, partitions }
  progress(`worker: ${records} records, ${keys} keys, ${partitions} partitions, ${runs} run(s) of ${phases.join(", ")}`)
  const t0 = performance.now()
  await Effect.runPromise(load(KafkaLog, tablesModule, plan).pipe(Effect.provide(Logger.layer([]))))
  progress(`worker: produced the source in ${Math.round(performance.now() - t0)} ms`)

  const samples = new Map<Phase, Array<PhaseResult>>(PHASES.map((p) => [p, []]))
  try {
    for (let rep = 0; rep < runs; rep++) {
      for (const phase of rep % 2 === 0 ? phases : [...phases].reverse()) {
        const spec: Spec = { ...plan, phase, run: rep + 1 }
        const r = isKstreams(phase)
          ? await kstreamsPhase(spec, phase, cacheBytes)
          : await runChild<Spec, PhaseResult>(fileURLToPath(import.meta.url), CHILD, spec)
        samples.get(phase)!.push(r)
        progress(
          `worker ${phase} #${rep + 1}: ${Math.round(records / (r.ms / 1000))} records/s, ` +
            `CPU ${((1000 * r.cpuMs) / records).toFixed(2)} µs/record (main ${((1000 * r.mainCpuMs) / records).toFixed(2)}), ` +
            `peak RSS ${r.peakRssMB} MB ${JSON.stringify(r.extra)}`
        )
      }
    }
  } finally {
    const pk = await loadPlatformatic()
    const admin = new pk.Admin({ clientId: "strata-bench-worker-admin", bootstrapBrokers: [broker] })
    const all = await admin.listTopics().catch(() => [] as Array<string>)
    await admin.deleteTopics({ topics: all.filter((t) => t.startsWith(source)) }).catch(() => undefined)
    await admin.close().catch(() => undefined)
  }

  const rate = (phase: Phase) => median(samples.get(phase)!.map((r) => records / (r.ms / 1000)))
  const per = (phase: Phase, f: (r: PhaseResult) => number) => median(samples.get(phase)!.map(f))
  const baseline = rate("bare")
  const pkVersion = (
    JSON.parse(
      readFileSync(new URL("../packages/kafka/node_modules/@platformatic/kafka/package.json", import.meta.url), "utf8")
    ) as { version: string }
  ).version
  // A Worker phase's Kafka Streams peer, when it ran.
  const peerOf = (phase: Phase): KstreamsPhase | undefined =>
    (Object.keys(KSTREAMS) as Array<KstreamsPhase>).find(
      (k) => (KSTREAMS[k].peers as ReadonlyArray<Phase>).includes(phase) && samples.get(k)!.length > 0
    )
  const figure = (phase: Phase): Figure => {
    const peer = peerOf(phase)
    return {
      bench:
        phase === "bare"
          ? "worker.bare"
          : isKstreams(phase)
            ? `worker.kstreams.${phase.slice("kstreams-".length)}`
            : `worker.count.${phase}`,
      value: Math.round(rate(phase)),
      unit: "records/s",
      ...(phase === "bare" || samples.get("bare")!.length === 0
        ? {}
        : { baseline: Math.round(baseline), ratio: round3(rate(phase) / baseline) }),
      baselineClient: `@platformatic/kafka ${pkVersion} consume → produce loop, same run`,
      ...(peer === undefined
        ? {}
        : {
            kafkaStreams: Math.round(rate(peer)),
            // The Worker's records/s over Kafka Streams' on the same store and guarantee, medians of the same run.
            ratioToKafkaStreams: round3(rate(phase) / rate(peer)),
            kafkaStreamsClient: `Kafka Streams ${KSTREAMS_VERSION} count() (${peer}), same run`
          }),
      ...(isKstreams(phase)
        ? { processingGuarantee: KSTREAMS[phase].guarantee, statestoreCacheMaxBytes: cacheBytes }
        : {}),
      records,
      keys,
      partitions,
      runs,
      acks: "all",
      commitIntervalMs: COMMIT_MS,
      cpuMicrosPerRecord: round3(per(phase, (r) => (1000 * r.cpuMs) / records)),
      mainThreadCpuMicrosPerRecord: round3(per(phase, (r) => (1000 * r.mainCpuMs) / records)),
      peakRssMB: per(phase, (r) => r.peakRssMB)
    }
  }
  const results = phases.map(figure)
  return {
    results,
    save,
    details: {
      source: `fresh topic, ${partitions} partitions; record i: key "key-%010d" of (i * 7919) mod ${keys}, partition murmur2(key) mod ${partitions}, ${VALUE_BYTES}-byte value`,
      bare: "Consumer.consume (fresh group, earliest, autocommit off); counts in a Map; what each readable event hands over produced in idempotent Producer.send calls of at most 1000 records, chained (one in flight); every second: sends awaited, then consumer.commit; output: a fresh compacted topic",
      worker:
        "Tables.make({ settleDelay: 0 }) + Worker.make({ commitInterval: 1000 }) with one agent: table.update(key, n => n + 1) on Table.make({ key: Schema.String, value: Schema.Int }); KafkaLog defaults",
      kstreams: `Kafka Streams ${KSTREAMS_VERSION} (bench/kstreams, a JVM with -Xmx1g): stream(source).processValues(note the record).groupByKey().count(Materialized in-memory / default RocksDB); commit.interval.ms 1000, num.stream.threads 1, statestore.cache.max.bytes ${cacheBytes}, replication.factor -1 (the brokers' default), producer acks=all; a commit asked for once every record was seen; done when the group's committed offsets (requireStable) reach the highwaters; CPU: the JVM's from start() (main: the stream thread's); RSS: VmHWM`,
      timed:
        "from the first record handed to the counting code to the last commit after every partition reached its highwater; each phase in its own child process",
      checked: "untimed: every key's count equals the input's (the worker's table: every partition scanned)",
      samples: Object.fromEntries(
        [...samples]
          .filter(([, list]) => list.length > 0)
          .map(([p, list]) => [p, list.map((r) => ({ ms: Math.round(r.ms), ...r.extra }))])
      )
    }
  }
}

// Run as a child: one phase, its result on stdout.
if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const at = process.argv.indexOf(CHILD.flag)
  const raw = at < 0 ? undefined : process.argv[at + 1]
  if (raw === undefined) {
    process.stderr.write("bench/worker.ts runs from bench/run.ts (./dev bench:worker)\n")
    process.exitCode = 2
  } else {
    const spec = JSON.parse(raw) as Spec
    const phase = spec.phase
    ;(phase === "bare"
      ? barePhase(spec)
      : isKstreams(phase)
        ? Promise.reject(new Error(`${phase} runs in the parent, not in a child`))
        : workerPhase(spec, phase)
    )
      .then((result) => reportFromChild(CHILD, result))
      .catch((error: unknown) => {
        process.stderr.write(`${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`)
        process.exit(1)
      })
  }
}
