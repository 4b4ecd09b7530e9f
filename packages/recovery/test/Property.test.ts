/**
 * Property test of changelog recovery on the memory log (issue 7): for each seeded case, recovery completes and
 * every table partition equals the replay of what its store persisted followed by what its changelog still holds.
 *
 * A case: 1–3 partitions, 0–300 records over 1–12 keys (values and tombstones), written to `<app>-t-changelog` in
 * 1–4 segments either by a real `Tables` worker (which commits once per partition, then crashes) or directly with
 * `log.produceBatch` (keys and values encoded by `Table.codecs`) plus a store holding the replay up to a persisted
 * offset, as a commit leaves it. Between segments partitions are compacted (`LogFaults.compact`: whole or below a
 * random `until`, tombstones kept or removed) and get `deleteRecords` (log start > 0). A second worker then starts
 * `Tables` (random recovery buffer and queue sizes), is assigned the partitions (at once, one at a time, or at once
 * and then — while the restore's n-th store batch is being written — a partition is revoked and reassigned or
 * assigned again, which restarts the restore midway) and waits for recovery.
 *
 * Checks, per partition:
 *  - the log holds exactly what a model of Kafka's compaction and DeleteRecords predicts (same offsets, gaps);
 *  - the table equals: the store's persisted state, then every record the log holds after the persisted offset,
 *    applied in offset order (deleted keys absent). With nothing persisted that is the log's last value per key;
 *  - when nothing was lost (every `deleteRecords` removed only records superseded later, or tombstones with no
 *    store below them; no tombstone the store had not yet seen was compacted away), it also equals the replay of
 *    the whole history: compaction and log start never change the result.
 *
 * A failure names its seed (`seed=N`) and what the case did. `STRATA_RECOVERY_SEED=N` replays one seed;
 * `STRATA_RECOVERY_CASES` sets how many run (default 1000) from `STRATA_RECOVERY_FIRST_SEED` (default 1);
 * `STRATA_RECOVERY_TRACE=1` adds the restoring worker's seeks, fetches and store writes to the failure report (and
 * prints it whole to stderr). A seed fixes the data and every choice; the interleaving of the workers' fibers is
 * deterministic for a given code base.
 */
import { Log, MemoryLog, MemoryStore, Store } from "@strata/core"
import { type Prng, seeded } from "../../../scripts/test-support/prng.js"
import { assert, describe, it } from "@effect/vitest"
import { Cause, Deferred, Effect, Exit, Layer, Logger, Result, Schema, Scope, Stream } from "effect"
import * as Table from "../../tables/src/Table.js"
import * as Tables from "../../tables/src/Tables.js"

// ---------------------------------------------------------------------------
// Knobs
// ---------------------------------------------------------------------------

const envInt = (name: string): number | undefined => {
  const raw = process.env[name]
  if (raw === undefined || raw === "") return undefined
  const n = Number(raw)
  if (!Number.isSafeInteger(n)) throw new Error(`${name} must be an integer, got ${JSON.stringify(raw)}`)
  return n
}

const replaySeed = envInt("STRATA_RECOVERY_SEED")
/**
 * Also trace the restoring worker's changelog consumer and store writes. Tracing adds Effect steps, which moves the
 * fibers' yield points: a failure that depends on an interleaving may not reproduce with it.
 */
const traceChannel = process.env.STRATA_RECOVERY_TRACE === "1"
const caseCount = envInt("STRATA_RECOVERY_CASES") ?? 1000
const firstSeed = envInt("STRATA_RECOVERY_FIRST_SEED") ?? 1
const seeds: ReadonlyArray<number> =
  replaySeed === undefined ? Array.from({ length: caseCount }, (_, i) => firstSeed + i) : [replaySeed]

// ---------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------

const app = "prop"
const def = Table.make({ name: "t", key: Schema.String, value: Schema.Int, partitions: 3 })
const topic = Table.changelogTopicOf(app, def)
const codecs = Table.codecs(def)
const sourceTopic = "src"

/** One changelog record of the model: `null` value = tombstone. */
interface Rec {
  readonly offset: number
  readonly key: string
  readonly value: number | null
}

/** What the model expects a partition of the log to hold. */
interface PartitionModel {
  readonly partition: number
  /** The whole history written, offset = index. */
  readonly history: Array<Rec>
  /** How many records of the history were written so far: the highwater. */
  written: number
  /** The records still held, in offset order. */
  held: Array<Rec>
  logStart: number
  /** The persisted changelog offset of the store (-1: nothing persisted). */
  readonly persisted: number
  /** Whether a record the table needs was removed (then only the first check applies, see the header). */
  lossy: boolean
}

type State = ReadonlyMap<string, number>

/** Applies records in order: a value sets the key, a tombstone deletes it. */
const replay = (from: State, records: ReadonlyArray<Rec>): State => {
  const out = new Map(from)
  for (const r of records) {
    if (r.value === null) out.delete(r.key)
    else out.set(r.key, r.value)
  }
  return out
}

/** A state as the entries a table lists: in key-byte order (the keys' JSON is ASCII). */
const entriesOf = (state: State): Array<readonly [string, number]> =>
  [...state.entries()].sort(([a], [b]) => {
    const x = JSON.stringify(a)
    const y = JSON.stringify(b)
    return x < y ? -1 : x > y ? 1 : 0
  })

/** Kafka's cleaner on the model: below `until`, drop what a later record of the key supersedes (and old tombstones). */
const compactModel = (m: PartitionModel, until: number, removeTombstones: boolean): void => {
  const latest = new Map<string, number>()
  for (const r of m.held) if (r.offset < until) latest.set(r.key, r.offset)
  const last = m.written - 1
  m.held = m.held.filter((r) => {
    if (r.offset >= until) return true
    if (latest.get(r.key)! > r.offset) return false
    if (removeTombstones && r.value === null && r.offset !== last) {
      // The store may still hold the key (persisted before the tombstone): the delete is lost for it.
      if (r.offset > m.persisted && m.persisted >= 0) m.lossy = true
      return false
    }
    return true
  })
}

/** The highest log start below which deleting loses nothing: every record removed is superseded later. */
const safeDeleteLimit = (m: PartitionModel): number => {
  const highwater = m.written
  let best = m.logStart
  for (let d = m.logStart + 1; d <= highwater; d++) {
    const ok = m.held.every(
      (r) =>
        r.offset >= d ||
        r.offset <= m.persisted ||
        m.held.some((later) => later.key === r.key && later.offset >= d) ||
        (r.value === null && m.persisted < 0)
    )
    if (!ok) break
    best = d
  }
  return best
}

const deleteModel = (m: PartitionModel, offset: number): void => {
  if (offset > safeDeleteLimit(m)) m.lossy = true
  m.held = m.held.filter((r) => r.offset >= offset)
  m.logStart = Math.max(m.logStart, offset)
}

// ---------------------------------------------------------------------------
// Running a case
// ---------------------------------------------------------------------------

const ok = <A, E>(r: Result.Result<A, E>): A => Result.getOrThrow(r)
const encodeKey = (key: string) => ok(codecs.encodeKey(key))
const decodeKey = (bytes: Uint8Array | null) => (bytes === null ? "(no key)" : ok(codecs.decodeKey(bytes)))
const decodeValue = (bytes: Uint8Array | null) => (bytes === null ? null : ok(codecs.decodeValue(bytes)))

/** What the case did, printed on failure. */
type Trace = Array<string>

/** Counters over all cases, printed at the end. */
const stats = { cases: 0, worker: 0, persisted: 0, gaps: 0, logStartMoved: 0, lossless: 0, records: 0 }

/** The store a committed worker leaves: the replay up to `persisted`, with that changelog offset. */
const persistDirectly = (store: Store.Shape, m: PartitionModel) =>
  Effect.gen(function* () {
    if (m.persisted < 0) return
    const state = replay(new Map(), m.history.slice(0, m.persisted + 1))
    const ops = [...state].map(([k, v]) => Store.put(encodeKey(k), ok(codecs.encodeValue(v))))
    const s = yield* store.open({ table: def.name, partition: m.partition })
    yield* s.write(ops, { offsets: [{ topic, partition: m.partition, offset: m.persisted }] })
  }).pipe(Effect.scoped)

/** Compacts and deletes at random after a segment, on the log and on the model alike. */
const disturb = (rng: Prng, log: Log.Shape, faults: Log.FaultsShape, m: PartitionModel, trace: Trace) =>
  Effect.gen(function* () {
    const tp = { topic, partition: m.partition }
    const highwater = m.written
    if (rng.chance(0.6)) {
      const until = rng.chance(0.5) ? highwater : rng.int(m.logStart, highwater)
      const removeTombstones = rng.chance(0.4)
      yield* faults.compact(tp, { until, removeTombstones })
      compactModel(m, until, removeTombstones)
      trace.push(`p${m.partition}: compact until ${until}${removeTombstones ? ", tombstones removed" : ""}`)
    }
    if (rng.chance(0.3)) {
      const limit = rng.chance(0.7) ? safeDeleteLimit(m) : highwater
      const offset = rng.int(m.logStart, limit)
      yield* log.deleteRecords(tp, offset)
      deleteModel(m, offset)
      trace.push(`p${m.partition}: deleteRecords ${offset}`)
    }
  })

/** Runs `effect`, then adds a line to the trace (without an extra step, so the scheduling stays the same). */
const noting = <A, E>(effect: Effect.Effect<A, E>, trace: Trace, line: (a: A) => string): Effect.Effect<A, E> =>
  Effect.map(effect, (a) => {
    trace.push(line(a))
    return a
  })

const showTps = (tps: ReadonlyArray<{ readonly partition: number }>) => tps.map((tp) => `p${tp.partition}`).join(",")

/** The log, with the restoring worker's consumer calls and fetched batches written to the trace. */
const tracedLog = (log: Log.Shape, trace: Trace): Log.Shape => ({
  ...log,
  consumer: (options) =>
    Effect.map(log.consumer(options), (c) => ({
      ...c,
      seek: (tp, offset) => noting(c.seek(tp, offset), trace, () => `  consumer: seek p${tp.partition} ${offset}`),
      pause: (tps) => noting(c.pause(tps), trace, () => `  consumer: pause ${showTps(tps)}`),
      resume: (tps) => noting(c.resume(tps), trace, () => `  consumer: resume ${showTps(tps)}`),
      batches: c.batches.pipe(
        Stream.map((b) => {
          trace.push(`  consumer: fetched p${b.partition} ${b.records.map((r) => r.offset).join(" ")}`)
          return b
        })
      )
    }))
})

/** The store, with every batch written to the trace. */
const tracedStore = (store: Store.Shape, trace: Trace): Store.Shape => ({
  ...store,
  open: (id) =>
    Effect.map(store.open(id), (s) => ({
      ...s,
      write: (ops, options) =>
        noting(
          s.write(ops, options),
          trace,
          () =>
            `  store p${id.partition}: ${ops.map((o) => `${o._tag} ${decodeKey(o.key)}`).join(", ")} offsets ${JSON.stringify(options?.offsets ?? [])}`
        )
    }))
})

/** Splits `n` records into `segments` contiguous [start, end) ranges. */
const cuts = (rng: Prng, n: number, segments: number): Array<readonly [number, number]> => {
  const points = Array.from({ length: segments - 1 }, () => rng.int(0, n)).sort((a, b) => a - b)
  const bounds = [0, ...points, n]
  return Array.from({ length: segments }, (_, i) => [bounds[i]!, bounds[i + 1]!] as const)
}

const runCase = (seed: number, trace: Trace) =>
  Effect.gen(function* () {
    const rng = seeded(seed)
    const log = yield* Log.Log
    const faults = yield* Log.Faults
    const store = yield* Store.Store
    const partitions = rng.int(1, 3)
    const keys = rng.int(1, 12)
    const tombstones = rng.pick([0, 0.1, 0.3])
    const total = rng.chance(0.2) ? rng.int(0, 10) : rng.int(0, 300)
    const viaWorker = rng.chance(0.15)
    const models: Array<PartitionModel> = []
    const histories: Array<Array<Rec>> = Array.from({ length: partitions }, () => [])
    for (let i = 0; i < total; i++) {
      const h = histories[rng.int(0, partitions - 1)]!
      h.push({
        offset: h.length,
        key: `k${rng.int(0, keys - 1)}`,
        value: rng.chance(tombstones) ? null : rng.int(0, 999)
      })
    }
    for (let p = 0; p < partitions; p++) {
      const history = histories[p]!
      const persisted = history.length > 0 && rng.chance(0.5) ? rng.int(-1, history.length - 1) : -1
      models.push({ partition: p, history, written: 0, held: [], logStart: 0, persisted, lossy: false })
    }
    const segments = rng.int(1, 4)
    const plan = models.map((m) => cuts(rng, m.history.length, segments))
    const tableDef = { ...def, partitions }
    trace.push(
      `${partitions} partition(s), ${keys} key(s), tombstones ${tombstones}, ${segments} segment(s), written ${viaWorker ? "by a Tables worker" : "with produceBatch"}`,
      ...models.map(
        (m) =>
          `p${m.partition}: ${m.history.length} record(s), persisted ${m.persisted}: ${m.history
            .map((r) => `${r.key}=${r.value ?? "∅"}`)
            .join(" ")}`
      )
    )

    // --- the first worker (or the test itself) writes the changelog, the log is compacted and trimmed ---------
    const first = yield* Scope.make()
    let write: (m: PartitionModel, from: number, to: number) => Effect.Effect<void, unknown>
    if (viaWorker) {
      const a = yield* Tables.make({ app, settleDelay: 0 }).pipe(Scope.provide(first))
      const ta = yield* a.register(tableDef)
      yield* a.start
      yield* a.manager.onPartitionsAssigned(models.map((m) => ({ topic: sourceTopic, partition: m.partition })))
      yield* a.manager.waitUntilRecoveryCompleted
      write = (m, from, to) =>
        Effect.gen(function* () {
          for (let i = from; i < to; i++) {
            const r = m.history[i]!
            const source = { topic: sourceTopic, partition: m.partition, offset: i }
            yield* a.process(source, r.value === null ? ta.delete(r.key) : ta.set(r.key, r.value))
            if (i === m.persisted) yield* a.manager.onCommit([{ ...source, offset: i + 1 }])
          }
        })
    } else {
      yield* log.ensureTopic({ topic, partitions, compacted: true })
      write = (m, from, to) => {
        const records: Array<Log.ProducerRecord> = m.history.slice(from, to).map((r) => ({
          topic,
          partition: m.partition,
          key: encodeKey(r.key),
          value: r.value === null ? null : ok(codecs.encodeValue(r.value))
        }))
        return records.length === 0 ? Effect.void : Effect.asVoid(log.produceBatch(records))
      }
    }
    for (let s = 0; s < segments; s++) {
      for (const m of models) {
        const [from, to] = plan[m.partition]![s]!
        yield* write(m, from, to)
        m.held.push(...m.history.slice(from, to))
        m.written = to
      }
      for (const m of models) yield* disturb(rng, log, faults, m, trace)
    }
    // The first worker crashes: what it did not commit is in the changelog only.
    yield* Scope.close(first, Exit.void)
    if (!viaWorker) for (const m of models) yield* persistDirectly(store, m)

    // --- the log holds what the model says ------------------------------------------------------------------
    for (const m of models) {
      const tp = { topic, partition: m.partition }
      const held = (yield* faults.records(tp)).map((r) => ({
        offset: r.offset,
        key: decodeKey(r.key),
        value: decodeValue(r.value)
      }))
      assert.deepStrictEqual(held, m.held, `p${m.partition}: the log holds what compaction should leave`)
      const [offsets] = yield* log.offsets([tp])
      assert.deepStrictEqual([offsets!.logStart, offsets!.highwater], [m.logStart, m.history.length])
    }

    // --- the second worker restores the partitions ------------------------------------------------------------
    const recoveryBufferSize = rng.pick([1, 2, 7, 64, 1000])
    const streamBufferMaxsize = rng.pick([1, 3, 16, 4096])
    const style = rng.pick(["at once", "one at a time", "rebalanced midway"] as const)
    // "rebalanced midway": the restore's `hold`-th store batch is written, then the restore stops there until a
    // rebalance (a revoke and reassign, or another assignment) interrupts and restarts it.
    const hold = style === "rebalanced midway" ? rng.int(1, 12) : 0
    const reached = yield* Deferred.make<void>()
    const stuck = yield* Deferred.make<void>()
    let writes = 0
    /** Only the first run holds a batch: once the rebalance is on its way, writes pass. */
    let armed = hold > 0
    const holding: Store.Shape = {
      ...store,
      open: (id) =>
        Effect.map(store.open(id), (s) => ({
          ...s,
          write: (ops, options) =>
            Effect.andThen(s.write(ops, options), () =>
              armed && ++writes === hold
                ? Effect.andThen(Deferred.succeed(reached, undefined), Deferred.await(stuck))
                : Effect.void
            )
        }))
    }
    const b = yield* Tables.make({ app, settleDelay: 0, streamBufferMaxsize, recovery: { recoveryBufferSize } }).pipe(
      Effect.provideService(Store.Store, traceChannel ? tracedStore(holding, trace) : holding),
      traceChannel ? Effect.provideService(Log.Log, tracedLog(log, trace)) : (x) => x
    )
    const tb = yield* b.register(tableDef)
    yield* b.start
    const sources = models.map((m) => ({ topic: sourceTopic, partition: m.partition }))
    trace.push(`restore: buffer ${recoveryBufferSize}, queue ${streamBufferMaxsize}, assigned ${style}`)
    if (style === "one at a time") {
      for (const tp of sources) yield* b.manager.onPartitionsAssigned([tp])
    } else {
      yield* b.manager.onPartitionsAssigned(sources)
    }
    if (style === "rebalanced midway") {
      // Wait for the held batch, or for the end if the restore writes fewer batches.
      yield* Effect.raceFirst(Deferred.await(reached), b.manager.waitUntilRecoveryCompleted)
      armed = false
      const tp = rng.pick(sources)
      const revoke = rng.chance(0.5)
      trace.push(
        `store batch ${hold} ${writes >= hold ? "held" : "never came"}: ${revoke ? "revoke and reassign" : "assign again"} p${tp.partition}`
      )
      if (revoke) yield* b.manager.onPartitionsRevoked([tp])
      yield* b.manager.onPartitionsAssigned([tp])
    }
    yield* b.manager.waitUntilRecoveryCompleted

    let lossless = true
    for (const m of models) {
      const persistedState = replay(new Map(), m.history.slice(0, m.persisted + 1))
      const expected = replay(
        persistedState,
        m.held.filter((r) => r.offset > m.persisted)
      )
      const actual = yield* tb.entries(m.partition)
      assert.deepStrictEqual(actual, entriesOf(expected), `p${m.partition}: persisted state + held records`)
      if (!m.lossy) {
        assert.deepStrictEqual(
          entriesOf(expected),
          entriesOf(replay(new Map(), m.history)),
          `p${m.partition}: nothing was lost, so the table is the whole history replayed`
        )
      }
      lossless &&= !m.lossy
    }

    stats.cases++
    if (viaWorker) stats.worker++
    if (models.some((m) => m.persisted >= 0)) stats.persisted++
    if (models.some((m) => m.held.length < m.history.length - m.logStart)) stats.gaps++
    if (models.some((m) => m.logStart > 0)) stats.logStartMoved++
    if (lossless) stats.lossless++
    stats.records += total
  }).pipe(Effect.scoped, Effect.provide(Layer.mergeAll(MemoryStore.layer(), MemoryLog.layer(), Logger.layer([]))))

describe("changelog recovery: property", () => {
  it.live(
    `recovery completes and each table equals its store + changelog replayed (${seeds.length} case(s))`,
    () =>
      Effect.gen(function* () {
        const started = Date.now()
        for (const seed of seeds) {
          const trace: Trace = []
          const exit = yield* Effect.exit(runCase(seed, trace).pipe(Effect.timeout("10 seconds")))
          if (Exit.isFailure(exit)) {
            // Long traces are cut in assertion messages: the whole one goes to stderr.
            if (traceChannel) process.stderr.write(`seed=${seed}\n${trace.join("\n")}\n`)
            assert.fail(
              `seed=${seed} (replay: STRATA_RECOVERY_SEED=${seed})\n${trace.join("\n")}\n${Cause.pretty(exit.cause)}`
            )
          }
        }
        console.log(`recovery property: ${JSON.stringify(stats)} in ${Date.now() - started} ms`)
      }),
    { timeout: Math.max(30_000, seeds.length * 60) }
  )
})
