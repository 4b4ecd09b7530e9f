import { MemoryStore, Store } from "@strata/core"
import { mkdtempSync, rmSync } from "node:fs"
import { appendFile, readdir, readFile, rm, stat, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { TestClock } from "effect/testing"
import { afterAll } from "vitest"
import * as SegmentLog from "../src/server/SegmentLog.js"
import * as Format from "../src/server/internal/segmentFormat.js"
import * as Segments from "../src/server/internal/segments.js"
import * as TabletLog from "../src/server/TabletLog.js"
import * as Codec from "../src/wire/internal/batchCodec.js"

const tablet = { table: "orders", bucket: 3 }
const enc = new TextEncoder()
const dec = new TextDecoder()
/** A record of `size` value bytes whose value starts with `text`. */
const record = (text: string, size = 0): TabletLog.TabletRecord => {
  const value = new Uint8Array(Math.max(size, text.length))
  value.set(enc.encode(text))
  return { key: enc.encode(`k-${text}`), value, headers: [], timestamp: 1_700_000_000_000 }
}
const records = (from: number, to: number, size = 0) =>
  Array.from({ length: to - from + 1 }, (_, i) => record(String(from + i), size))
/** `offset@epoch:value` of every record read. */
const texts = (batches: ReadonlyArray<TabletLog.Batch>) =>
  batches.flatMap((b) =>
    b.records.map((r, i) => `${b.baseOffset + i}@${b.epoch}:${dec.decode(r.value).replace(/\0+$/, "")}`)
  )
const range = (from: number, to: number, epoch: number) =>
  Array.from({ length: to - from }, (_, i) => `${from + i}@${epoch}:${from + i}`)

const root = mkdtempSync(join(tmpdir(), "strata-segment-log-"))
afterAll(() => rmSync(root, { recursive: true, force: true }))
let fresh = 0
const directoryFor = () => join(root, `log-${++fresh}`)

/** Opens the log in `directory` in a scope of its own. */
const open = (directory: string, options: Partial<SegmentLog.SegmentLogOptionsInput> = {}) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const log = yield* Scope.provide(SegmentLog.make({ directory, tablet, ...options }), scope)
    return { log, close: Scope.close(scope, Exit.void) }
  })

/** The directory's files of one kind (`log`, `index`, `snapshot`), by offset, with their sizes. */
const files = (directory: string, extension: string) =>
  Effect.promise(async () => {
    const names = (await readdir(directory)).filter((f) => f.endsWith(`.${extension}`)).sort()
    return Promise.all(
      names.map(async (name) => ({
        name,
        offset: Number(name.slice(0, 20)),
        size: (await stat(join(directory, name))).size
      }))
    )
  })

/** The frames of a segment file: position, base offset and size of each. */
const framesOf = (path: string) =>
  Effect.promise(async () => {
    const bytes = new Uint8Array(await readFile(path))
    const out: Array<{ position: number; baseOffset: number; bytes: number }> = []
    for (let at = 0; at < bytes.length; ) {
      const parsed = Format.parseFrame(bytes, at)
      if (parsed._tag !== "Frame") break
      out.push({ position: at, baseOffset: parsed.frame.baseOffset, bytes: parsed.frame.frameBytes })
      at += parsed.frame.frameBytes
    }
    return out
  })

/** The log read whole, checked against what it says of itself. */
const everything = (log: TabletLog.TabletLog) =>
  Effect.gen(function* () {
    return texts(yield* log.read(yield* log.logStartOffset, Number.MAX_SAFE_INTEGER))
  })

const expectStoreError = (e: TabletLog.TabletLogError, tag: string) => {
  assert.strictEqual(e.reason._tag, "StoreFailed")
  if (e.reason._tag === "StoreFailed") assert.strictEqual(e.reason.cause.reason._tag, tag)
}

describe("SegmentLog", () => {
  it.effect("rolls to a new segment past segmentBytes; reads cross segments, one batch or many", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      const { log, close } = yield* open(directory, { segmentBytes: 1000 })
      // 30 batches of 2 records of 100 value bytes: about 250 bytes each as stored, 3 to a segment.
      for (let i = 0; i < 30; i++) yield* log.append(1 + Math.floor(i / 10), records(i * 2, i * 2 + 1, 100))
      const segments = yield* files(directory, "log")
      assert.isAtLeast(segments.length, 8)
      for (const s of segments) assert.isAtMost(s.size, 1000)
      assert.strictEqual(
        yield* log.sizeBytes,
        segments.reduce((n, s) => n + s.size, 0)
      )
      // Segments are named by the offset of their first batch, and continue each other.
      for (const s of segments) {
        const frames = yield* framesOf(join(directory, s.name))
        assert.strictEqual(frames[0]?.baseOffset, s.offset)
      }
      const model = Array.from({ length: 60 }, (_, o) => `${o}@${1 + Math.floor(o / 20)}:${o}`)
      assert.deepStrictEqual(yield* everything(log), model)
      for (let from = 0; from < 60; from++) {
        for (const maxBytes of [1, 300, 700, 2500]) {
          const got = texts(yield* log.read(from, maxBytes))
          assert.isAbove(got.length, 0)
          assert.deepStrictEqual(got, model.slice(from, from + got.length), `read(${from}, ${maxBytes})`)
        }
      }
      // A read takes batches while they fit, across segment boundaries (batches past offset 9 have 2 bytes more of
      // keys).
      const size = Codec.encodeBatch(1, records(0, 1, 100)).length
      assert.strictEqual((yield* log.read(0, 7 * size + 20)).length, 7)
      assert.strictEqual((yield* log.read(3, 7 * size + 20)).length, 7)
      assert.deepStrictEqual(texts(yield* log.read(5, 1)), ["5@1:5"])
      yield* close
    })
  )

  it.effect("reopens to the same log: offsets, epochs, high watermark, producers, reads", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      const a = yield* open(directory, { segmentBytes: 600 })
      const producer = (sequence: number) => ({ id: 9, epoch: 2, sequence })
      for (let i = 0; i < 12; i++)
        yield* a.log.append(1 + Math.floor(i / 4), records(i * 3, i * 3 + 2, 50), producer(i * 3))
      yield* a.log.appendBatches([{ baseOffset: 36, epoch: 7, records: records(36, 39, 50) }])
      yield* a.log.checkpointHighWatermark(30)
      yield* a.log.deleteBefore(4)
      const before = {
        start: yield* a.log.logStartOffset,
        end: yield* a.log.logEndOffset,
        hw: yield* a.log.highWatermark,
        size: yield* a.log.sizeBytes,
        epochs: yield* a.log.epochs,
        producers: yield* a.log.producers,
        read: yield* everything(a.log)
      }
      assert.deepStrictEqual(before.epochs, [
        { epoch: 1, startOffset: 4 },
        { epoch: 2, startOffset: 12 },
        { epoch: 3, startOffset: 24 },
        { epoch: 7, startOffset: 36 }
      ])
      yield* a.close
      const b = yield* open(directory, { segmentBytes: 600 })
      assert.deepStrictEqual(
        {
          start: yield* b.log.logStartOffset,
          end: yield* b.log.logEndOffset,
          hw: yield* b.log.highWatermark,
          size: yield* b.log.sizeBytes,
          epochs: yield* b.log.epochs,
          producers: yield* b.log.producers,
          read: yield* everything(b.log)
        },
        before
      )
      // A retry of the producer's latest batch is recognised after the reopen.
      assert.deepStrictEqual(yield* b.log.append(7, records(33, 35, 50), producer(33)), {
        baseOffset: 33,
        lastOffset: 35,
        duplicate: true
      })
      yield* b.close
    })
  )

  it.effect("a torn tail (garbage, half a frame, a damaged batch) is cut off when the log opens, never read", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      const a = yield* open(directory)
      yield* a.log.append(1, records(0, 4, 40))
      yield* a.log.append(2, records(5, 9, 40))
      yield* a.log.checkpointHighWatermark(10)
      yield* a.close
      const [segment] = yield* files(directory, "log")
      const path = join(directory, segment!.name)
      const whole = segment!.size
      const want = [...range(0, 5, 1), ...range(5, 10, 2)]

      // Garbage after the last batch.
      yield* Effect.promise(() =>
        appendFile(path, new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]))
      )
      const b = yield* open(directory)
      assert.strictEqual(yield* b.log.logEndOffset, 10)
      assert.deepStrictEqual(yield* everything(b.log), want)
      assert.strictEqual((yield* Effect.promise(() => stat(path))).size, whole)
      assert.strictEqual(yield* b.log.sizeBytes, whole)
      yield* b.close

      // Half of a frame (a write the process did not finish): its header says more bytes than the file has.
      const frames = yield* framesOf(path)
      const last = frames.at(-1)!
      const bytes = new Uint8Array(yield* Effect.promise(() => readFile(path)))
      yield* Effect.promise(() =>
        appendFile(path, bytes.subarray(last.position, last.position + Math.floor(last.bytes / 2)))
      )
      const c = yield* open(directory)
      assert.strictEqual(yield* c.log.logEndOffset, 10)
      assert.deepStrictEqual(yield* everything(c.log), want)
      assert.strictEqual(yield* c.log.sizeBytes, whole)
      // It appends where the whole batches end.
      yield* c.log.append(2, records(10, 10, 40))
      yield* c.close

      // A byte of the last batch flipped: the batch fails its CRC and goes, and the epoch it alone wrote with it.
      const d0 = yield* open(directory)
      yield* d0.log.append(5, records(11, 12, 40))
      yield* d0.close
      const damaged = new Uint8Array(yield* Effect.promise(() => readFile(path)))
      const lastFrame = (yield* framesOf(path)).at(-1)!
      assert.strictEqual(lastFrame.baseOffset, 11)
      damaged[lastFrame.position + lastFrame.bytes - 3]! ^= 0xff
      yield* Effect.promise(() => writeFile(path, damaged))
      const d = yield* open(directory)
      assert.strictEqual(yield* d.log.logEndOffset, 11)
      assert.deepStrictEqual(yield* d.log.epochs, [
        { epoch: 1, startOffset: 0 },
        { epoch: 2, startOffset: 5 }
      ])
      assert.deepStrictEqual(yield* everything(d.log), [...want, "10@2:10"])
      assert.strictEqual(yield* d.log.highWatermark, 10)
      assert.strictEqual((yield* Effect.promise(() => stat(path))).size, lastFrame.position)
      yield* d.close
    })
  )

  it.effect("retention deletes whole segment files below the new start; the one holding it stays", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      const { log, close } = yield* open(directory, { segmentBytes: 700 })
      for (let i = 0; i < 20; i++) yield* log.append(1, records(i * 2, i * 2 + 1, 100))
      const before = yield* files(directory, "log")
      const holding = before.filter((s) => s.offset <= 17).at(-1)!
      yield* log.deleteBefore(17)
      const after = yield* files(directory, "log")
      assert.deepStrictEqual(
        after.map((s) => s.offset),
        before.filter((s) => s.offset >= holding.offset).map((s) => s.offset)
      )
      assert.deepStrictEqual(
        (yield* files(directory, "index")).filter((s) => s.offset < holding.offset),
        []
      )
      assert.strictEqual(
        yield* log.sizeBytes,
        after.reduce((n, s) => n + s.size, 0)
      )
      assert.strictEqual(yield* log.logStartOffset, 17)
      assert.deepStrictEqual(texts(yield* log.read(17, 1)), ["17@1:17"])
      assert.strictEqual((yield* Effect.flip(log.read(16, 100))).reason._tag, "OffsetOutOfRange")
      // To the end: every segment goes, and the log is empty from there.
      yield* log.deleteBefore(40)
      assert.deepStrictEqual(
        (yield* files(directory, "log")).map((s) => [s.offset, s.size]),
        [[40, 0]]
      )
      assert.deepStrictEqual(yield* log.epochs, [{ epoch: 1, startOffset: 40 }])
      yield* log.append(1, records(40, 41))
      yield* close
      const again = yield* open(directory, { segmentBytes: 700 })
      assert.deepStrictEqual([yield* again.log.logStartOffset, yield* again.log.logEndOffset], [40, 42])
      assert.deepStrictEqual(yield* everything(again.log), range(40, 42, 1))
      yield* again.close
    })
  )

  it.effect("truncation across segments deletes the later files and cuts the one holding the offset", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      const a = yield* open(directory, { segmentBytes: 700 })
      for (let i = 0; i < 20; i++) yield* a.log.append(1 + Math.floor(i / 5), records(i * 2, i * 2 + 1, 100))
      const before = yield* files(directory, "log")
      assert.isAtLeast(before.length, 6)
      // Offset 13 is the second record of a batch in an early segment: the first record is written back.
      const holding = before.filter((s) => s.offset <= 13).at(-1)!
      yield* a.log.truncateTo(13)
      assert.deepStrictEqual(
        (yield* files(directory, "log")).map((s) => s.offset),
        before.filter((s) => s.offset <= holding.offset).map((s) => s.offset)
      )
      assert.strictEqual(yield* a.log.logEndOffset, 13)
      assert.deepStrictEqual(yield* a.log.epochs, [
        { epoch: 1, startOffset: 0 },
        { epoch: 2, startOffset: 10 }
      ])
      assert.deepStrictEqual(yield* everything(a.log), [...range(0, 10, 1), ...range(10, 13, 2)])
      assert.strictEqual(
        yield* a.log.sizeBytes,
        (yield* files(directory, "log")).reduce((n, s) => n + s.size, 0)
      )
      // The log goes on from there, in the segment it cut, and reopens the same.
      yield* a.log.append(9, records(13, 15, 100))
      const read = yield* everything(a.log)
      yield* a.close
      const b = yield* open(directory, { segmentBytes: 700 })
      assert.deepStrictEqual(yield* everything(b.log), read)
      assert.deepStrictEqual(yield* b.log.epochs, [
        { epoch: 1, startOffset: 0 },
        { epoch: 2, startOffset: 10 },
        { epoch: 9, startOffset: 13 }
      ])
      yield* b.close
    })
  )

  it.effect("a truncation reads a producer's older batches back across segments, at most PRODUCER_SCAN_BATCHES", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      const { log, close } = yield* open(directory, { segmentBytes: 2000 })
      yield* log.append(1, records(0, 0), { id: 7, epoch: 0, sequence: 0 })
      for (let i = 0; i < 300; i++) yield* log.append(1, records(1, 1, 30))
      const end = yield* log.logEndOffset
      for (let i = 1; i <= 6; i++) yield* log.append(1, records(2, 2), { id: 7, epoch: 0, sequence: i })
      assert.isAtLeast((yield* files(directory, "log")).length, 5)
      yield* log.truncateTo(end)
      const entry = (yield* log.producers).get(7)
      assert.deepStrictEqual(entry, {
        epoch: 0,
        batches: [{ firstSequence: 0, lastSequence: 0, baseOffset: 0, lastOffset: 0 }]
      })
      assert.strictEqual((yield* log.append(1, records(9, 9), { id: 7, epoch: 0, sequence: 1 })).baseOffset, end)
      yield* close

      // Beyond the bound, the producer is forgotten rather than the whole log read (as on a store).
      const far = yield* open(directoryFor(), { segmentBytes: 64 * 1024 })
      yield* far.log.append(1, records(0, 0), { id: 9, epoch: 0, sequence: 0 })
      for (let i = 0; i < TabletLog.PRODUCER_SCAN_BATCHES + 5; i++) yield* far.log.append(1, records(1, 1))
      const farEnd = yield* far.log.logEndOffset
      for (let i = 1; i <= 6; i++) yield* far.log.append(1, records(2, 2), { id: 9, epoch: 0, sequence: i })
      yield* far.log.truncateTo(farEnd)
      assert.isFalse((yield* far.log.producers).has(9))
      yield* far.close
    })
  )

  it.effect("random operations: it answers as the store-backed log does, across rolls, cuts and reopens", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      const options = { segmentBytes: 1500, indexIntervalBytes: 200 }
      const partition = yield* (yield* Store.Store).open({ table: "model", partition: 0 })
      let model = yield* TabletLog.make(partition, tablet)
      let segments = yield* open(directory, options)
      let seed = 20_261_206
      const random = () => {
        seed = (seed * 1_103_515_245 + 12_345) % 2_147_483_648
        return seed / 2_147_483_648
      }
      const below = (n: number) => Math.floor(random() * n)
      /** Runs an operation on both logs: the same answer, or failures of the same kind. */
      const both = <A>(label: string, run: (log: TabletLog.TabletLog) => Effect.Effect<A, TabletLog.TabletLogError>) =>
        Effect.gen(function* () {
          const want = yield* Effect.result(run(model))
          const got = yield* Effect.result(run(segments.log))
          if (want._tag === "Success") {
            assert.strictEqual(got._tag, "Success", `${label}: ${got._tag === "Failure" ? got.failure.message : ""}`)
            if (got._tag === "Success") assert.deepStrictEqual(got.success, want.success, label)
          } else {
            assert.strictEqual(got._tag, "Failure", label)
            if (got._tag === "Failure") assert.strictEqual(got.failure.message, want.failure.message, label)
          }
        })
      let epoch = 1
      let value = 0
      let mostSegments = 0
      for (let step = 0; step < 400; step++) {
        const label = `step ${step}`
        const start = yield* model.logStartOffset
        const end = yield* model.logEndOffset
        const roll = random()
        if (roll < 0.45) {
          let count = 1 + below(3)
          let producer: TabletLog.Batch["producer"]
          if (random() < 0.5) {
            const id = 1 + below(2)
            const entry = (yield* model.producers).get(id)
            const last = entry?.batches.at(-1)
            const kind = random()
            if (entry === undefined || last === undefined) producer = { id, epoch: 0, sequence: kind < 0.8 ? 0 : 4 }
            else if (kind < 0.6) producer = { id, epoch: entry.epoch, sequence: last.lastSequence + 1 }
            else if (kind < 0.75) {
              const retried = entry.batches[below(entry.batches.length)]!
              producer = { id, epoch: entry.epoch, sequence: retried.firstSequence }
              count = retried.lastSequence - retried.firstSequence + 1
            } else if (kind < 0.85) producer = { id, epoch: entry.epoch, sequence: last.lastSequence + 3 }
            else if (kind < 0.95) producer = { id, epoch: entry.epoch + 1, sequence: 0 }
            else producer = { id, epoch: Math.max(0, entry.epoch - 1), sequence: 0 }
          }
          const batch = Array.from({ length: count }, (_, i) => record(String(value + i), below(250)))
          value += count
          yield* both(`${label}: append`, (log) => log.append(epoch, batch, producer))
        } else if (roll < 0.5) {
          const base = random() < 0.8 ? end : end + 1
          const at = random() < 0.9 ? epoch : Math.max(0, epoch - 1)
          const batch = records(value, value + below(3), below(100))
          value += batch.length
          yield* both(`${label}: appendBatches`, (log) =>
            log.appendBatches([{ baseOffset: base, epoch: at, records: batch }])
          )
        } else if (roll < 0.6) {
          const hw = start + below(end - start + 1)
          yield* both(`${label}: checkpoint`, (log) => log.checkpointHighWatermark(hw))
        } else if (roll < 0.68) {
          const to = Math.max(start, end - below(12))
          yield* both(`${label}: truncateTo(${to})`, (log) => log.truncateTo(to))
        } else if (roll < 0.74) {
          const to = start + below(Math.min(end - start, 15) + 1)
          yield* both(`${label}: deleteBefore(${to})`, (log) => log.deleteBefore(to))
        } else if (roll < 0.75) {
          const to = end + below(5)
          yield* both(`${label}: resetTo(${to})`, (log) => log.resetTo(to))
        } else if (roll < 0.82) epoch++
        else if (roll < 0.87) {
          yield* TestClock.adjust(below(30_000))
          yield* both(`${label}: expireProducers`, (log) => log.expireProducers(20_000))
        } else if (roll < 0.92) {
          model = yield* TabletLog.make(partition, tablet)
          yield* segments.close
          segments = yield* open(directory, options)
        }
        if ((yield* model.logStartOffset) > (yield* model.logEndOffset)) {
          // A producer's batch straddling the start went whole: the store-backed log ends below its start, the
          // segment log is empty at its start. Both start over there.
          const at = yield* model.logStartOffset
          assert.deepStrictEqual([yield* segments.log.logStartOffset, yield* segments.log.logEndOffset], [at, at])
          assert.deepStrictEqual(yield* segments.log.epochs, yield* model.epochs, label)
          assert.deepStrictEqual(yield* segments.log.producers, yield* model.producers, label)
          yield* both(`${label}: resetTo(${at})`, (log) => log.resetTo(at))
        }
        for (const field of ["logStartOffset", "logEndOffset", "highWatermark", "epochs", "producers"] as const) {
          assert.deepStrictEqual(yield* segments.log[field], yield* model[field], `${label}: ${field}`)
        }
        mostSegments = Math.max(mostSegments, (yield* files(directory, "log")).length)
        const first = yield* model.logStartOffset
        const last = yield* model.logEndOffset
        for (let i = 0; i < 3; i++) {
          const from = first + below(last - first + 1)
          const maxBytes = [1, 200, 700, 3000, 1e9][below(5)]!
          // (A batch the store-backed log answers from memory is the one appended, its `producer` key perhaps there
          // and undefined.)
          yield* both(`${label}: read(${from}, ${maxBytes})`, (log) =>
            Effect.map(log.read(from, maxBytes), (batches) =>
              batches.map((b) => ({ ...b, producer: b.producer ?? null }))
            )
          )
        }
      }
      assert.isAbove(mostSegments, 2, "the log rolled")
      assert.strictEqual(
        yield* segments.log.sizeBytes,
        (yield* files(directory, "log")).reduce((n, f) => n + f.size, 0)
      )
      yield* segments.close
    }).pipe(Effect.provide(MemoryStore.layer()))
  )

  it.effect("the sparse index finds every offset of a large segment, from its file or rebuilt", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      const batch = (i: number) => records(i * 2, i * 2 + 1, 20 + (i % 7) * 30)
      const options = { segmentBytes: 200_000, indexIntervalBytes: 512 }
      const a = yield* open(directory, options)
      let i = 0
      while ((yield* files(directory, "log")).length < 2) yield* a.log.append(1, batch(i++))
      const end = yield* a.log.logEndOffset
      const [first, second] = yield* files(directory, "log")
      assert.strictEqual(second!.offset, end - 2)
      // The first segment is sealed: its index file has an entry about every 512 bytes.
      const [index] = yield* files(directory, "index")
      assert.strictEqual(index!.offset, 0)
      assert.isAtLeast(index!.size / 8, Math.floor(first!.size / 512 / 2))
      const check = (log: TabletLog.TabletLog, label: string) =>
        Effect.gen(function* () {
          for (let o = 0; o < end; o += 1 + (o % 5)) {
            assert.deepStrictEqual(texts(yield* log.read(o, 1))[0], `${o}@1:${o}`, `${label}: read(${o})`)
          }
        })
      yield* check(a.log, "open")
      yield* a.close
      const b = yield* open(directory, options)
      yield* check(b.log, "reopened")
      yield* b.close
      // Without its index file (or with a damaged one), the segment's index is rebuilt from its batches.
      yield* Effect.promise(() => rm(join(directory, index!.name)))
      const c = yield* open(directory, options)
      yield* check(c.log, "index rebuilt")
      yield* c.close
      assert.isAtLeast((yield* files(directory, "index"))[0]!.size, index!.size)
      yield* Effect.promise(() => writeFile(join(directory, index!.name), new Uint8Array([0, 0, 0, 9, 0, 0, 1])))
      const d = yield* open(directory, options)
      yield* check(d.log, "damaged index")
      yield* d.close
    })
  )

  it.effect("the active segment past its recent positions: reads through its index, truncations too", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      const options = { indexIntervalBytes: 300 }
      const a = yield* open(directory, options)
      // Three times as many batches as the recent positions kept, all in the active segment.
      const count = 3 * Segments.RECENT_POSITIONS
      for (let i = 0; i < count; i++) yield* a.log.append(1, records(i, i))
      assert.strictEqual((yield* files(directory, "log")).length, 1)
      for (const from of [0, 1, 777, count - 2 * Segments.RECENT_POSITIONS - 1, count - 10, count - 1]) {
        for (const maxBytes of [1, 100, 5000]) {
          const got = texts(yield* a.log.read(from, maxBytes))
          assert.isAbove(got.length, 0)
          assert.deepStrictEqual(got, range(from, from + got.length, 1), `read(${from}, ${maxBytes})`)
        }
      }
      // Cut below the recent positions, then on from there.
      yield* a.log.truncateTo(500)
      yield* a.log.append(2, records(500, 501))
      assert.deepStrictEqual(yield* everything(a.log), [...range(0, 500, 1), ...range(500, 502, 2)])
      yield* a.close
      const b = yield* open(directory, options)
      assert.deepStrictEqual(texts(yield* b.log.read(499, 2)), ["499@1:499"])
      assert.deepStrictEqual(texts(yield* b.log.read(499, 1000)), ["499@1:499", "500@2:500", "501@2:501"])
      yield* b.close
    })
  )

  it.effect("rolls once the active segment is segmentMs old (Effect's clock)", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      const { log, close } = yield* open(directory, { segmentMs: 60_000 })
      yield* log.append(1, records(0, 1))
      yield* TestClock.adjust("59 seconds")
      yield* log.append(1, records(2, 3))
      assert.strictEqual((yield* files(directory, "log")).length, 1)
      yield* TestClock.adjust("1 second")
      yield* log.append(1, records(4, 5))
      assert.deepStrictEqual(
        (yield* files(directory, "log")).map((s) => s.offset),
        [0, 4]
      )
      assert.deepStrictEqual(yield* everything(log), range(0, 6, 1))
      // A truncation into the sealed segment makes it the active one again, as of now: it rolls 60 seconds later.
      yield* TestClock.adjust("2 minutes")
      yield* log.truncateTo(2)
      yield* log.append(1, records(2, 3))
      assert.deepStrictEqual(
        (yield* files(directory, "log")).map((s) => s.offset),
        [0]
      )
      yield* TestClock.adjust("1 minute")
      yield* log.append(1, records(4, 5))
      assert.deepStrictEqual(
        (yield* files(directory, "log")).map((s) => s.offset),
        [0, 4]
      )
      yield* close
    })
  )

  it.effect("damage inside the log is a typed error naming the tablet, never a wrong read", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      // An index entry every batch: the opening reads a sealed segment's last batch only.
      const options = { segmentBytes: 1000, indexIntervalBytes: 100 }
      const a = yield* open(directory, options)
      for (let i = 0; i < 10; i++) yield* a.log.append(1, records(i * 2, i * 2 + 1, 100))
      yield* a.close
      const [first] = yield* files(directory, "log")
      const path = join(directory, first!.name)
      const bytes = new Uint8Array(yield* Effect.promise(() => readFile(path)))
      bytes[40]! ^= 0x01
      yield* Effect.promise(() => writeFile(path, bytes))
      const b = yield* open(directory, options)
      const error = yield* Effect.flip(b.log.read(0, 100))
      assert.strictEqual(error.reason._tag, "Corrupt")
      assert.include(error.message, "orders/3")
      // Past the damaged segment the log reads on.
      assert.isAbove((yield* b.log.read(18, 100)).length, 0)
      yield* b.close
      // A log-state checkpoint that cannot be read: the log does not open.
      yield* Effect.promise(() => writeFile(join(directory, Format.LOG_STATE_FILE), new Uint8Array([1, 2, 3, 4, 5, 6])))
      const refused = yield* Effect.flip(open(directory))
      assert.strictEqual(refused.reason._tag, "Corrupt")
    })
  )

  it.effect("one open log per directory; a closed log refuses every operation", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      const a = yield* open(directory)
      yield* a.log.append(1, records(0, 0))
      expectStoreError(yield* Effect.flip(open(directory)), "StoreLocked")
      yield* a.close
      expectStoreError(yield* Effect.flip(a.log.append(1, records(1, 1))), "StoreClosed")
      const b = yield* open(directory)
      assert.strictEqual(yield* b.log.logEndOffset, 1)
      yield* b.close
    })
  )

  it.effect("bad options are refused, naming the key", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      for (const [options, key] of [
        [{ segmentBytes: 0 }, "segmentBytes"],
        [{ segmentBytes: 3 * 1024 ** 3 }, "segmentBytes"],
        [{ segmentMs: -5 }, "segmentMs"],
        [{ flushBytes: 1.5 }, "flushBytes"],
        [{ indexIntervalBytes: "4k" }, "indexIntervalBytes"],
        [{ flushInterval: 100 }, "flushInterval"],
        [{ directory: "" }, "directory"]
      ] as const) {
        const error = yield* Effect.flip(
          open(directory, options as unknown as Partial<SegmentLog.SegmentLogOptionsInput>)
        )
        expectStoreError(error, "InvalidStoreOptions")
        assert.include(error.message, `${key} = `)
      }
      const missing = yield* Effect.flip(
        Effect.scoped(SegmentLog.make({ directory } as unknown as SegmentLog.SegmentLogOptionsInput))
      )
      assert.include(missing.message, "tablet")
    })
  )
})
