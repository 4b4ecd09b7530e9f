// Store adapters against their raw drivers (docs/ARCHITECTURE.md, "Benchmarks").
//
// For each backend (memory, level, rocksdb): apply RECORDS records (16-byte keys "key-%012d", 100-byte values) in
// batches of BATCH and scan them all back, once through the adapter (`@strata/store-adapters/<backend>`) and once
// directly with the driver the adapter wraps, on the same data, in the same process. Every run gets a fresh
// temporary directory, removed afterwards. Repetitions are interleaved (raw, adapter, adapter, raw, ...) and each
// figure is the median of its repetitions, because absolute times drift on the shared 2-core machines.
//
// Fairness of the raw baselines:
// - The raw driver writes exactly the key bytes the adapter writes (its partition prefix + the user key), found by
//   letting the adapter write one record and one offset and reading the database back with the raw driver.
// - Each adapter batch persists a changelog offset (what a table does); the raw batch then carries the same extra
//   put (the adapter's offset key, a u64 value). The `.noOffsets` figures compare writes without it on both sides.
// - The raw scan reads the partition's data range with `iterator().nextv(RAW_PAGE)`, the adapter's page size.
// - Both sides use the driver with the adapter's encodings and open options, and the same value objects.
// - Memory has no driver: its baseline is a plain `Map` keyed by latin1 strings plus a sorted key array, copying
//   keys and values in on write and out on scan (the isolation the memory store promises), without Effect,
//   validation or streams. The ratio is therefore "the memory store against a hand-written equivalent".
//
// Environment (for quick checks; the results file is written only with the defaults):
//   BENCH_RECORDS (1000000), BENCH_BATCH (1000), BENCH_RUNS (3), BENCH_BACKENDS (memory,level,rocksdb)
import { Store } from "../packages/core/src/index.js"
import { createRequire } from "node:module"
import { pathToFileURL } from "node:url"
import { Context, Effect, Layer, type Scope, Stream } from "effect"
import {
  type BenchOutput,
  collectGarbage,
  envInt,
  envString,
  type Figure,
  median,
  progress,
  randomBytes,
  round3,
  withTempDir
} from "./lib.js"

type ClassicLevelModule = typeof import("../packages/store-adapters/node_modules/classic-level/index.js")
type LevelStoreModule = typeof import("../packages/store-adapters/src/LevelStore.js")
type RocksDbStoreModule = typeof import("../packages/store-adapters/src/RocksDbStore.js")
type MemoryStoreModule = typeof import("../packages/store-adapters/src/MemoryStore.js")

/** The part of `@nxtedition/rocksdb`'s RocksLevel (which ships no types) the baseline uses. */
interface RocksLevelModule {
  readonly RocksLevel: new (
    location: string,
    options: { keyEncoding: "buffer"; valueEncoding: "buffer" }
  ) => {
    open(options: Record<string, unknown>): Promise<void>
    close(): Promise<void>
    batch(): {
      put(key: Uint8Array, value: Uint8Array): void
      write(options: { sync: boolean }): Promise<void>
    }
    iterator(range: RawRange): RawIterator
    getProperty(property: string): string
  }
}

const DEFAULTS = { records: 1_000_000, batch: 1000, runs: 3, backends: ["memory", "level", "rocksdb"] } as const
const VALUE_BYTES = 100
const KEY_BYTES = 16 // "key-%012d"
const VALUE_POOL = 4099 // distinct random values, reused round-robin (a prime, so batches do not line up)
const WARMUP_RECORDS = 50_000
const TABLE = "bench"
const TOPIC = "bench-changelog"
const PROBE_OFFSET = 987_654_321
/**
 * Entries per `nextv` call of the raw scan: the adapters' page size (SCAN_CHUNK in internal/levelDb.ts). It matters:
 * @nxtedition/rocksdb scans 1M entries ~30% slower with nextv(1000) than with nextv(1024).
 */
const RAW_PAGE = 1024

type BackendName = "memory" | "level" | "rocksdb"
type Variant = "raw" | "adapter" | "raw.noOffsets" | "adapter.noOffsets"
const VARIANTS: ReadonlyArray<Variant> = ["raw", "adapter", "adapter.noOffsets", "raw.noOffsets"]

interface Timing {
  readonly writeMs: number
  /** Absent for the write-only `.noOffsets` variants. */
  readonly scanMs?: number
  /** How many chunks (stream chunks or nextv pages) the scan delivered. */
  readonly scanChunks?: number
  /** Raw runs: table files in level 0 right after the writes (the driver's own counter). */
  readonly level0Files?: number
}

interface Plan {
  readonly records: number
  readonly batch: number
  /** Write the offset with each batch, and scan afterwards. */
  readonly offsets: boolean
}

// ---------------------------------------------------------------------------
// Data: the same key and value objects for every run
// ---------------------------------------------------------------------------

interface Data {
  readonly records: number
  /** User keys "key-%012d": views of one buffer, as plain `Uint8Array`s (what callers of the protocol pass). */
  readonly keys: ReadonlyArray<Uint8Array>
  readonly values: ReadonlyArray<Uint8Array>
}

const makeData = (records: number): Data => {
  const keyBytes = Buffer.allocUnsafe(records * KEY_BYTES)
  const keys = new Array<Uint8Array>(records)
  for (let i = 0; i < records; i++) {
    keyBytes.write(`key-${String(i).padStart(12, "0")}`, i * KEY_BYTES, "latin1")
    keys[i] = new Uint8Array(keyBytes.buffer, keyBytes.byteOffset + i * KEY_BYTES, KEY_BYTES)
  }
  const pool = randomBytes(VALUE_POOL * VALUE_BYTES, 0x5eed)
  const values = Array.from({ length: VALUE_POOL }, (_, i) => pool.subarray(i * VALUE_BYTES, (i + 1) * VALUE_BYTES))
  return { records, keys, values }
}

const valueAt = (data: Data, i: number): Uint8Array => data.values[i % VALUE_POOL]!

/** The keys as the adapter stores them (prefix + user key), built once, outside the timed part. */
const prefixedKeys = (data: Data, prefix: Uint8Array): ReadonlyArray<Buffer> => {
  const size = prefix.length + KEY_BYTES
  const all = Buffer.allocUnsafe(data.records * size)
  const out = new Array<Buffer>(data.records)
  for (let i = 0; i < data.records; i++) {
    all.set(prefix, i * size)
    all.set(data.keys[i]!, i * size + prefix.length)
    out[i] = all.subarray(i * size, (i + 1) * size)
  }
  return out
}

const equalBytes = (a: Uint8Array, b: Uint8Array): boolean => a.length === b.length && Buffer.compare(a, b) === 0

// ---------------------------------------------------------------------------
// Adapters (through the package's subpath exports) and drivers (the copies the adapters load)
// ---------------------------------------------------------------------------

/** Resolves like code inside @strata/store-adapters does: its own subpath exports and its own driver copies. */
const adapterRequire = createRequire(new URL("../packages/store-adapters/package.json", import.meta.url))
const importFromAdapters = (specifier: string): Promise<unknown> =>
  import(pathToFileURL(adapterRequire.resolve(specifier)).href)

type MakeStore = (directory: string) => Effect.Effect<Store.Shape, Store.StoreError, Scope.Scope>

interface RawPut {
  readonly type: "put"
  readonly key: Uint8Array
  readonly value: Uint8Array
}
interface RawRange {
  readonly gte: Uint8Array
  readonly lt: Uint8Array
}
interface RawIterator {
  nextv(size: number): Promise<Array<[Uint8Array, Uint8Array]>>
  close(): Promise<void>
}
/** The abstract-level surface both drivers share, opened the way the adapter opens it. */
interface RawDb {
  batch(ops: Array<RawPut>): Promise<void>
  /** Table files in level 0: many of them mean overlapping flushes, compaction work and write slowdowns. */
  level0Files(): number
  iterator(range: RawRange): RawIterator
  close(): Promise<void>
}

interface DiskBackend {
  readonly name: "level" | "rocksdb"
  readonly adapter: MakeStore
  readonly openRaw: (directory: string) => Promise<RawDb>
  /** The options both sides open the database with, for the results file. */
  readonly openOptions: Record<string, unknown>
}

const loadLevel = async (): Promise<DiskBackend> => {
  const LevelStore = (await importFromAdapters("@strata/store-adapters/level")) as LevelStoreModule
  const { ClassicLevel } = adapterRequire("classic-level") as ClassicLevelModule
  // LevelStore.make: new ClassicLevel(dir, { keyEncoding: "buffer", valueEncoding: "buffer" }), open with
  // createIfMissing, a 64 MiB write buffer, compression off and classic-level's other defaults; chained batches with
  // sync false; 256 KiB iterator pages. The raw baseline does the same: the best raw usage of the driver.
  const openOptions = { createIfMissing: true, writeBufferSize: 64 * 1024 * 1024, compression: false }
  return {
    name: "level",
    adapter: (directory) => LevelStore.make({ directory }),
    openOptions,
    openRaw: async (directory) => {
      const db = new ClassicLevel<Uint8Array, Uint8Array>(directory, { keyEncoding: "buffer", valueEncoding: "buffer" })
      await db.open(openOptions)
      return {
        batch: (ops) => {
          const batch = db.batch()
          for (const op of ops) batch.put(op.key, op.value)
          return batch.write({ sync: false })
        },
        level0Files: () => Number(db.getProperty("leveldb.num-files-at-level0")),
        iterator: (range) => db.iterator({ ...range, highWaterMarkBytes: 256 * 1024 }),
        close: () => db.close()
      }
    }
  }
}

const loadRocksDb = async (): Promise<DiskBackend> => {
  const RocksDbStore = (await importFromAdapters("@strata/store-adapters/rocksdb")) as RocksDbStoreModule
  const { RocksLevel } = adapterRequire("@nxtedition/rocksdb") as RocksLevelModule
  // RocksDbStore.make opens with createIfMissing, infoLogLevel "warn", table and WAL compression off, the binding's
  // defaults otherwise, and writes chained batches with sync false. The raw baseline does the same.
  const openOptions = { createIfMissing: true, infoLogLevel: "warn", compression: false, walCompression: false }
  return {
    name: "rocksdb",
    adapter: (directory) => RocksDbStore.make({ directory }),
    openOptions,
    openRaw: async (directory) => {
      const db = new RocksLevel(directory, { keyEncoding: "buffer", valueEncoding: "buffer" })
      await db.open(openOptions)
      return {
        batch: (ops) => {
          const batch = db.batch()
          for (const op of ops) batch.put(op.key, op.value)
          return batch.write({ sync: false })
        },
        level0Files: () => Number(db.getProperty("rocksdb.num-files-at-level0")),
        iterator: (range) => db.iterator(range),
        close: () => db.close()
      }
    }
  }
}

const loadMemory = async (): Promise<MakeStore> => {
  const MemoryStore = (await importFromAdapters("@strata/store-adapters/memory")) as MemoryStoreModule
  return () => Effect.map(Layer.build(MemoryStore.layer()), Context.get(Store.Store))
}

// ---------------------------------------------------------------------------
// The timed work
// ---------------------------------------------------------------------------

const offsetsOf = (end: number) => [{ topic: TOPIC, partition: 0, offset: end - 1 }]

/** Writes every record through a partition store, then (with offsets) scans them back as a stream consumer would. */
const adapterRun = (makeStore: MakeStore, directory: string, data: Data, plan: Plan): Promise<Timing> =>
  Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        const store = yield* makeStore(directory)
        const partition = yield* store.open({ table: TABLE, partition: 0 })
        const t0 = performance.now()
        for (let start = 0; start < plan.records; start += plan.batch) {
          const end = Math.min(plan.records, start + plan.batch)
          const ops: Array<Store.Op> = []
          for (let i = start; i < end; i++) ops.push({ _tag: "put", key: data.keys[i]!, value: valueAt(data, i) })
          yield* partition.write(ops, plan.offsets ? { offsets: offsetsOf(end) } : undefined)
        }
        const writeMs = performance.now() - t0
        if (!plan.offsets) return { writeMs }
        let count = 0
        let bytes = 0
        let chunks = 0
        let first: Uint8Array | undefined
        const t1 = performance.now()
        yield* Stream.runForEachArray(partition.scan(), (entries) =>
          Effect.sync(() => {
            chunks++
            first ??= entries[0][0]
            for (const [key, value] of entries) {
              count++
              bytes += key.length + value.length
            }
          })
        )
        const scanMs = performance.now() - t1
        check("adapter scan", count, bytes, plan.records * (KEY_BYTES + VALUE_BYTES), first, data.keys[0]!)
        return { writeMs, scanMs, scanChunks: chunks }
      })
    )
  )

/** The offset put the adapter adds to each batch: its meta key and a u64 big-endian value. */
interface Layout {
  readonly prefix: Uint8Array
  readonly offsetKey: Uint8Array
  readonly offsetValueBytes: number
  readonly entries: ReadonlyArray<{ readonly key: string; readonly value: string }>
}

const encodeOffset = (layout: Layout, offset: number): Uint8Array => {
  const out = Buffer.alloc(layout.offsetValueBytes)
  out.writeBigUInt64BE(BigInt(offset), layout.offsetValueBytes - 8)
  return out
}

/** The same batches and scan, straight on the driver, with the keys the adapter would write. */
const rawRun = async (
  backend: DiskBackend,
  directory: string,
  data: Data,
  keys: ReadonlyArray<Uint8Array>,
  layout: Layout,
  plan: Plan
): Promise<Timing> => {
  const db = await backend.openRaw(directory)
  try {
    const t0 = performance.now()
    for (let start = 0; start < plan.records; start += plan.batch) {
      const end = Math.min(plan.records, start + plan.batch)
      const ops: Array<RawPut> = []
      for (let i = start; i < end; i++) ops.push({ type: "put", key: keys[i]!, value: valueAt(data, i) })
      if (plan.offsets) ops.push({ type: "put", key: layout.offsetKey, value: encodeOffset(layout, end - 1) })
      await db.batch(ops)
    }
    const writeMs = performance.now() - t0
    const level0Files = db.level0Files()
    if (!plan.offsets) return { writeMs, level0Files }
    let count = 0
    let bytes = 0
    let chunks = 0
    let first: Uint8Array | undefined
    const t1 = performance.now()
    // The partition's data range: prefix (inclusive) up to prefix + 0xFF, where its metadata starts.
    const it = db.iterator({ gte: layout.prefix, lt: Buffer.concat([layout.prefix, Buffer.of(0xff)]) })
    try {
      for (;;) {
        const entries = await it.nextv(RAW_PAGE)
        if (entries.length === 0) break
        chunks++
        first ??= entries[0]![0]
        for (const [key, value] of entries) {
          count++
          bytes += key.length + value.length
        }
      }
    } finally {
      await it.close()
    }
    const scanMs = performance.now() - t1
    const keyBytes = layout.prefix.length + KEY_BYTES
    check("raw scan", count, bytes, plan.records * (keyBytes + VALUE_BYTES), first, keys[0]!)
    return { writeMs, scanMs, scanChunks: chunks, level0Files }
  } finally {
    await db.close()
  }
}

/** The memory baseline: a Map keyed by latin1 strings (byte order = string order) and a lazily sorted key array. */
const memoryBaselineRun = (data: Data, plan: Plan): Timing => {
  const entries = new Map<string, readonly [Uint8Array, Uint8Array]>()
  const offsets = new Map<string, number>()
  let sorted: Array<string> | undefined
  const latin1 = (b: Uint8Array) => Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString("latin1")
  const t0 = performance.now()
  for (let start = 0; start < plan.records; start += plan.batch) {
    const end = Math.min(plan.records, start + plan.batch)
    const ops: Array<Store.Op> = []
    for (let i = start; i < end; i++) ops.push({ _tag: "put", key: data.keys[i]!, value: valueAt(data, i) })
    for (const op of ops) {
      if (op._tag !== "put") continue
      const k = latin1(op.key)
      if (!entries.has(k)) sorted = undefined
      entries.set(k, [op.key.slice(), op.value.slice()])
    }
    if (plan.offsets) offsets.set(`${TOPIC}/0`, end - 1)
  }
  const writeMs = performance.now() - t0
  if (!plan.offsets) return { writeMs }
  let count = 0
  let bytes = 0
  let first: Uint8Array | undefined
  const t1 = performance.now()
  sorted ??= Array.from(entries.keys()).sort()
  for (const k of sorted) {
    const [key, value] = entries.get(k)!
    const out = [key.slice(), value.slice()] as const
    first ??= out[0]
    count++
    bytes += out[0].length + out[1].length
  }
  const scanMs = performance.now() - t1
  check("memory baseline scan", count, bytes, plan.records * (KEY_BYTES + VALUE_BYTES), first, data.keys[0]!)
  return { writeMs, scanMs, scanChunks: 1 }
}

/** A scan that does not return every record is a broken benchmark, not a slow one. */
const check = (
  what: string,
  count: number,
  bytes: number,
  expectedBytes: number,
  first: Uint8Array | undefined,
  expectedFirst: Uint8Array
) => {
  if (bytes !== expectedBytes || first === undefined || !equalBytes(first, expectedFirst)) {
    throw new Error(`${what}: read ${count} records / ${bytes} bytes (expected ${expectedBytes} bytes), wrong data`)
  }
}

// ---------------------------------------------------------------------------
// Layout discovery: what the adapter writes, read back with the raw driver
// ---------------------------------------------------------------------------

const hex = (b: Uint8Array) => Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString("hex")

const discoverLayout = (backend: DiskBackend, data: Data): Promise<Layout> =>
  withTempDir(`${backend.name}-layout`, async (directory) => {
    const key = data.keys[0]!
    const value = valueAt(data, 0)
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const store = yield* backend.adapter(directory)
          const partition = yield* store.open({ table: TABLE, partition: 0 })
          yield* partition.write([{ _tag: "put", key, value }], { offsets: offsetsOf(PROBE_OFFSET + 1) })
        })
      )
    )
    const db = await backend.openRaw(directory)
    const all: Array<[Uint8Array, Uint8Array]> = []
    try {
      const it = db.iterator({ gte: Buffer.alloc(0), lt: Buffer.alloc(64, 0xff) })
      try {
        for (let page = await it.nextv(1000); page.length > 0; page = await it.nextv(1000)) all.push(...page)
      } finally {
        await it.close()
      }
    } finally {
      await db.close()
    }
    const dataEntry = all.find(([k, v]) => equalBytes(v, value) && equalBytes(k.subarray(k.length - key.length), key))
    const offsetEntry = all.find(
      ([, v]) => v.length >= 8 && Buffer.from(v).readBigUInt64BE(v.length - 8) === BigInt(PROBE_OFFSET)
    )
    if (dataEntry === undefined || offsetEntry === undefined) {
      throw new Error(
        `${backend.name}: cannot find the probe record and offset among ${all.length} entries: ${JSON.stringify(all.map(([k, v]) => [hex(k), hex(v)]))}`
      )
    }
    return {
      prefix: Uint8Array.from(dataEntry[0].subarray(0, dataEntry[0].length - key.length)),
      offsetKey: Uint8Array.from(offsetEntry[0]),
      offsetValueBytes: offsetEntry[1].length,
      entries: all.map(([k, v]) => ({
        key: hex(k),
        value: v.length > 16 ? `${hex(v.subarray(0, 8))}…(${v.length} B)` : hex(v)
      }))
    }
  })

// ---------------------------------------------------------------------------
// Repetitions and figures
// ---------------------------------------------------------------------------

/** Variant order of repetition `rep`: forward on even repetitions, backward on odd ones (raw, a, a, raw, raw, ...). */
const orderOf = (rep: number): ReadonlyArray<Variant> => (rep % 2 === 0 ? VARIANTS : [...VARIANTS].reverse())

const planOf = (variant: Variant, records: number, batch: number): Plan => ({
  records,
  batch,
  offsets: !variant.endsWith(".noOffsets")
})

type Samples = Record<Variant, Array<Timing>>

const measure = async (
  name: BackendName,
  runs: number,
  batch: number,
  data: Data,
  run: (variant: Variant, plan: Plan) => Promise<Timing>
): Promise<Samples> => {
  const samples: Samples = { raw: [], adapter: [], "raw.noOffsets": [], "adapter.noOffsets": [] }
  progress(`${name}: warm-up (${WARMUP_RECORDS} records per variant)`)
  for (const variant of VARIANTS) await run(variant, planOf(variant, Math.min(WARMUP_RECORDS, data.records), batch))
  for (let rep = 0; rep < runs; rep++) {
    for (const variant of orderOf(rep)) {
      collectGarbage()
      const timing = await run(variant, planOf(variant, data.records, batch))
      samples[variant].push(timing)
      const scan = timing.scanMs === undefined ? "" : `, scan ${timing.scanMs.toFixed(0)} ms`
      const l0 = timing.level0Files === undefined ? "" : `, ${timing.level0Files} level-0 files after writes`
      progress(`${name} ${variant} #${rep + 1}: write ${timing.writeMs.toFixed(0)} ms${scan}${l0}`)
    }
  }
  return samples
}

const figures = (
  name: BackendName,
  samples: Samples,
  common: Record<string, unknown>
): { results: Array<Figure>; detail: Record<string, unknown> } => {
  const rate = (records: number, ms: number) => records / (ms / 1000)
  const records = common.records as number
  const writeRates = (v: Variant) => samples[v].map((t) => rate(records, t.writeMs))
  const scanRates = (v: Variant) => samples[v].flatMap((t) => (t.scanMs === undefined ? [] : [rate(records, t.scanMs)]))
  const figure = (bench: string, value: number, baseline: number): Figure => ({
    bench,
    value: Math.round(value),
    unit: "records/s",
    baseline: Math.round(baseline),
    ratio: round3(value / baseline),
    ...common,
    runs: samples.adapter.length
  })
  const results = [
    figure(`store.${name}.write`, median(writeRates("adapter")), median(writeRates("raw"))),
    figure(`store.${name}.scan`, median(scanRates("adapter")), median(scanRates("raw"))),
    figure(
      `store.${name}.write.noOffsets`,
      median(writeRates("adapter.noOffsets")),
      median(writeRates("raw.noOffsets"))
    )
  ]
  const detail = Object.fromEntries(
    VARIANTS.map((v) => [
      v,
      {
        writeRecordsPerSecond: writeRates(v).map(Math.round),
        scanRecordsPerSecond: scanRates(v).map(Math.round),
        scanChunks: samples[v].flatMap((t) => (t.scanChunks === undefined ? [] : [t.scanChunks])),
        level0FilesAfterWrites: samples[v].flatMap((t) => (t.level0Files === undefined ? [] : [t.level0Files]))
      }
    ])
  )
  return { results, detail }
}

// ---------------------------------------------------------------------------
// Entry
// ---------------------------------------------------------------------------

export const run = async (): Promise<BenchOutput & { readonly save: boolean }> => {
  const records = envInt("BENCH_RECORDS", DEFAULTS.records)
  const batch = envInt("BENCH_BATCH", DEFAULTS.batch)
  const runs = envInt("BENCH_RUNS", DEFAULTS.runs)
  const backends = (envString("BENCH_BACKENDS") ?? DEFAULTS.backends.join(",")).split(",").filter((b) => b !== "")
  for (const b of backends) {
    if (!DEFAULTS.backends.includes(b as BackendName)) throw new Error(`BENCH_BACKENDS: unknown backend ${b}`)
  }
  const save =
    records === DEFAULTS.records &&
    batch === DEFAULTS.batch &&
    runs === DEFAULTS.runs &&
    backends.join(",") === DEFAULTS.backends.join(",")
  const common = { records, batch, valueBytes: VALUE_BYTES, node: process.version }

  progress(`store: ${records} records, batches of ${batch}, ${VALUE_BYTES}-byte values, ${runs} runs, ${backends}`)
  const data = makeData(records)
  const results: Array<Figure> = []
  const details: Record<string, unknown> = {
    keys: `"key-%012d" (${KEY_BYTES} bytes), plain Uint8Array views`,
    values: `${VALUE_BYTES} random bytes, ${VALUE_POOL} distinct values reused round-robin`,
    order: `per repetition ${VARIANTS.join(", ")}, reversed on odd repetitions; ${WARMUP_RECORDS}-record warm-up first`,
    figure: "median over runs; .write and .scan with one persisted offset per batch on both sides"
  }

  for (const name of backends as ReadonlyArray<BackendName>) {
    if (name === "memory") {
      const makeStore = await loadMemory()
      const samples = await measure(name, runs, batch, data, (variant, plan) =>
        variant.startsWith("raw")
          ? Promise.resolve(memoryBaselineRun(data, plan))
          : adapterRun(makeStore, "", data, plan)
      )
      const { results: figs, detail } = figures(name, samples, common)
      results.push(...figs)
      details.memory = {
        baseline: "Map<latin1 string, [key copy, value copy]> + lazily sorted key array; copies out on scan",
        samples: detail
      }
    } else {
      const backend = name === "level" ? await loadLevel() : await loadRocksDb()
      const layout = await discoverLayout(backend, data)
      const keys = prefixedKeys(data, layout.prefix)
      const samples = await measure(name, runs, batch, data, (variant, plan) =>
        withTempDir(`${name}-${variant}`, (directory) =>
          variant.startsWith("raw")
            ? rawRun(backend, directory, data, keys, layout, plan)
            : adapterRun(backend.adapter, directory, data, plan)
        )
      )
      const { results: figs, detail } = figures(name, samples, common)
      results.push(...figs)
      details[name] = {
        openOptions: backend.openOptions,
        layout: { prefix: hex(layout.prefix), offsetKey: hex(layout.offsetKey), probeEntries: layout.entries },
        samples: detail
      }
    }
    collectGarbage()
  }
  details.peakRssMB = Math.round(process.resourceUsage().maxRSS / 1024)
  return { results, details, save }
}
