/**
 * Crash consistency and damage checks of the segment log (`SegmentLog`), in process.
 *
 * Crashes. Node's `fs/promises` and its `FileHandle` are patched so that every operation that changes a file
 * (creating, renaming or deleting one; writing or truncating an open one) counts, and the n-th and every later one
 * fails, as if the process had died just before it (what the earlier ones wrote stays, as the page cache keeps it
 * through a process crash). For each kind of change, the change runs once per n = 1, 2, … on a fresh copy of the
 * same log until it completes without reaching the n-th operation; after each crash the log is closed (a broken log
 * writes nothing more) and must have no file of its directory left open; opened again (twice when the crash left a
 * cut in progress: the second opening finds what the first completed), it must be exactly the log before the change
 * or after it: start, end, high watermark, size, epochs, producers and every record.
 *
 * Damage. A log whose files were changed behind its back (an index entry, a segment file deleted, a bad batch in a
 * sealed segment) answers `Corrupt`, or rebuilds what is derived (an index that fails its CRC): never a read that
 * skips offsets, and nothing deleted.
 */
import { existsSync, mkdtempSync, readdirSync, readlinkSync, rmSync } from "node:fs"
import { readdir, readFile, rm, stat, writeFile } from "node:fs/promises"
import { createRequire, syncBuiltinESMExports } from "node:module"
import { tmpdir } from "node:os"
import { basename, join } from "node:path"
import { crc32 } from "node:zlib"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Scope } from "effect"
import { TestClock } from "effect/testing"
import { afterAll } from "vitest"
import * as Format from "../src/server/internal/segmentFormat.js"
import * as SegmentLog from "../src/server/SegmentLog.js"
import type * as TabletLog from "../src/server/TabletLog.js"

// ---------------------------------------------------------------------------
// Fault injection
// ---------------------------------------------------------------------------

type AnyFunction = (...args: Array<unknown>) => Promise<unknown>

const require = createRequire(import.meta.url)
const fsp = require("node:fs/promises") as Record<string, AnyFunction>

/** The injection's state: `armed` is the operation that fails first (none when undefined). */
const faults = {
  armed: undefined as number | undefined,
  count: 0,
  dead: false,
  trace: [] as Array<string>,
  /** Traces every operation (flushes too) without failing any. */
  tracing: false
}

/** Counts an operation that changes a file; fails it (and every later one) from the armed one on. */
const hit = (what: string, changes = true) => {
  if (faults.tracing) faults.trace.push(what)
  if (faults.armed === undefined || !changes) return
  faults.count++
  faults.trace.push(what)
  if (faults.dead || faults.count >= faults.armed) {
    faults.dead = true
    throw Object.assign(new Error(`injected crash at ${what}`), { code: "EIO" })
  }
}

const arm = (n: number) => {
  faults.armed = n
  faults.count = 0
  faults.dead = false
  faults.trace = []
}
const disarm = () => {
  faults.armed = undefined
}

/** What `open` may be made to wait for (a test of an interrupted open). */
let holdOpen: { readonly path: string; readonly started: () => void; readonly release: Promise<void> } | undefined

/** What a file's `datasync` may be made to wait for (a test of a flush outside the log's lock). */
let holdSync: { readonly started: () => void; readonly release: Promise<void> } | undefined

const originals = new Map<string, AnyFunction>()
{
  const open = fsp.open!
  originals.set("open", open)
  fsp.open = async (...a) => {
    const path = String(a[0])
    if (a[1] === "w" || a[1] === "w+") hit(`open(${a[1]}) ${basename(path)}`)
    const hold = holdOpen
    if (hold !== undefined && path === hold.path) {
      holdOpen = undefined
      hold.started()
      await hold.release
    }
    return open(...a)
  }
  for (const name of ["rename", "rm", "unlink"]) {
    const original = fsp[name]!
    originals.set(name, original)
    fsp[name] = async (...a) => {
      hit(`${name} ${basename(String(a[0]))}`)
      return original(...a)
    }
  }
  syncBuiltinESMExports()
}

/** The `FileHandle` prototype's originals, patched on first use (the class is reached through a handle). */
const handleOriginals = new Map<string, AnyFunction>()
let handlePrototype: Record<string, AnyFunction> | undefined
const patchHandles = (directory: string) =>
  Effect.promise(async () => {
    if (handlePrototype !== undefined) return
    const h = (await originals.get("open")!(join(directory, "prototype"), "w")) as { close: () => Promise<void> }
    const proto = Object.getPrototypeOf(h) as Record<string, AnyFunction>
    await h.close()
    await originals.get("rm")!(join(directory, "prototype"))
    handlePrototype = proto
    for (const [name, changes] of [
      ["writev", true],
      ["write", true],
      ["writeFile", true],
      ["truncate", true],
      ["datasync", false],
      ["sync", false]
    ] as const) {
      const original = proto[name]!
      handleOriginals.set(name, original)
      proto[name] = async function (this: unknown, ...a: Array<unknown>) {
        const size =
          name === "writeFile" && a[0] instanceof Uint8Array
            ? ` ${a[0].length}`
            : name === "truncate"
              ? ` ${String(a[0])}`
              : ""
        hit(`${name}${size}`, changes)
        const hold = holdSync
        if (name === "datasync" && hold !== undefined) {
          holdSync = undefined
          hold.started()
          await hold.release
        }
        return original.apply(this, a)
      }
    }
  })

// In memory where the machine has a tmpfs there: the crashes are a process's, the device's flushes play no part.
const root = mkdtempSync(join(existsSync("/dev/shm") ? "/dev/shm" : tmpdir(), "strata-segment-log-crash-"))
afterAll(() => {
  for (const [name, original] of originals) fsp[name] = original
  syncBuiltinESMExports()
  if (handlePrototype !== undefined) for (const [name, original] of handleOriginals) handlePrototype[name] = original
  rmSync(root, { recursive: true, force: true })
})
let fresh = 0
const directoryFor = () => join(root, `log-${++fresh}`)

/** The files of `directory` this process holds open (none where `/proc` does not tell). */
const openFiles = (directory: string): Array<string> => {
  let fds: Array<string>
  try {
    fds = readdirSync("/proc/self/fd")
  } catch {
    return []
  }
  return fds.flatMap((fd) => {
    try {
      const target = readlinkSync(`/proc/self/fd/${fd}`)
      return target.startsWith(`${directory}/`) ? [basename(target)] : []
    } catch {
      return []
    }
  })
}

// ---------------------------------------------------------------------------
// Logs
// ---------------------------------------------------------------------------

const tablet = { table: "orders", bucket: 3 }
const enc = new TextEncoder()
const dec = new TextDecoder()
const record = (text: string, size = 0, timestamp = 1): TabletLog.TabletRecord => {
  const value = new Uint8Array(Math.max(size, text.length))
  value.set(enc.encode(text))
  return { key: enc.encode(`k-${text}`), value, headers: [], timestamp }
}
const records = (from: number, to: number, size = 0, timestamp = 1) =>
  Array.from({ length: to - from + 1 }, (_, i) => record(String(from + i), size, timestamp))
const texts = (batches: ReadonlyArray<TabletLog.Batch>) =>
  batches.flatMap((b) =>
    b.records.map((r, i) => `${b.baseOffset + i}@${b.epoch}:${dec.decode(r.value).replace(/\0+$/, "")}`)
  )
const p = (id: number, sequence: number) => ({ id, epoch: 0, sequence })

const open = (directory: string, options: Partial<SegmentLog.SegmentLogOptionsInput> = {}) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const log = yield* Scope.provide(SegmentLog.make({ directory, tablet, ...options }), scope)
    return { log, close: Scope.close(scope, Exit.void) }
  })

/** Everything the log says of itself, and every record it holds. */
const observe = (log: TabletLog.TabletLog) =>
  Effect.gen(function* () {
    const start = yield* log.logStartOffset
    return JSON.stringify({
      start,
      end: yield* log.logEndOffset,
      hw: yield* log.highWatermark,
      size: yield* log.sizeBytes,
      epochs: yield* log.epochs,
      producers: [...(yield* log.producers)].sort((a, b) => a[0] - b[0]),
      read: texts(yield* log.read(start, Number.MAX_SAFE_INTEGER))
    })
  })

/** The segment files of a log's directory, by base offset. */
const segmentFiles = (directory: string) =>
  Effect.promise(async () => (await readdir(directory)).filter((f) => f.endsWith(".log")).sort())

// ---------------------------------------------------------------------------
// Crashes
// ---------------------------------------------------------------------------

interface Scenario {
  readonly name: string
  readonly options: Partial<SegmentLog.SegmentLogOptionsInput>
  readonly setup: (log: TabletLog.TabletLog) => Effect.Effect<unknown, TabletLog.TabletLogError>
  readonly change: (log: TabletLog.TabletLog) => Effect.Effect<unknown, TabletLog.TabletLogError>
}

/** `count` batches of two 100-byte records from offset 0 (in segments of 700 bytes: two batches to a segment). */
const batches = (
  log: TabletLog.TabletLog,
  count: number,
  epochOf: (i: number) => number,
  producerOf: (i: number) => ReturnType<typeof p> | undefined = () => undefined
) =>
  Effect.gen(function* () {
    for (let i = 0; i < count; i++) {
      yield* log.append(epochOf(i), records(i * 2, i * 2 + 1, 100), producerOf(i))
    }
  })

const small = { segmentBytes: 700 }

const scenarios: ReadonlyArray<Scenario> = [
  {
    name: "an append that rolls and starts an epoch",
    options: small,
    setup: (log) =>
      batches(
        log,
        4,
        () => 1,
        (i) => p(3, i * 2)
      ),
    change: (log) => log.append(2, records(8, 9, 100), p(3, 8))
  },
  {
    name: "a truncation in the active segment, a batch's first part written back",
    options: {},
    setup: (log) =>
      Effect.gen(function* () {
        yield* log.append(1, records(0, 4, 40), p(1, 0))
        yield* log.append(2, records(5, 9, 40))
        yield* log.append(3, records(10, 11, 40), p(1, 5))
        yield* log.checkpointHighWatermark(12)
      }),
    change: (log) => log.truncateTo(7)
  },
  {
    name: "a truncation into a sealed segment, written back, a producer's older batches read back",
    options: small,
    setup: (log) =>
      Effect.gen(function* () {
        yield* batches(
          log,
          9,
          (i) => 1 + Math.floor(i / 4),
          (i) => (i % 3 === 0 ? p(4, (i / 3) * 2) : undefined)
        )
        yield* log.checkpointHighWatermark(16)
      }),
    change: (log) => log.truncateTo(13)
  },
  {
    name: "a truncation that empties the log (a producer's batch straddles the start)",
    options: {},
    setup: (log) =>
      Effect.gen(function* () {
        yield* log.append(1, records(0, 9, 40), p(7, 0))
        yield* log.append(1, records(10, 11, 40), p(8, 0))
        yield* log.deleteBefore(5)
      }),
    change: (log) => log.truncateTo(6)
  },
  {
    name: "deleteBefore into a later segment",
    options: small,
    setup: (log) =>
      batches(
        log,
        8,
        () => 1,
        (i) => (i % 3 === 0 ? p(i, 0) : undefined)
      ),
    change: (log) => log.deleteBefore(9)
  },
  {
    name: "deleteBefore to the end (the log rolls)",
    options: small,
    setup: (log) =>
      batches(
        log,
        5,
        () => 1,
        (i) => p(3, i * 2)
      ),
    change: (log) => log.deleteBefore(10)
  },
  {
    name: "retain by size: whole sealed segments",
    options: small,
    setup: (log) =>
      batches(
        log,
        7,
        (i) => 1 + Math.floor(i / 3),
        (i) => (i % 2 === 0 ? p(i, 0) : undefined)
      ),
    change: (log) => log.retain({ bytes: 800 }, 14, 0)
  },
  {
    name: "resetTo past the end",
    options: small,
    setup: (log) =>
      batches(
        log,
        5,
        () => 1,
        (i) => p(3, i * 2)
      ),
    change: (log) => log.resetTo(100)
  },
  {
    name: "resetTo below the end",
    options: small,
    setup: (log) =>
      batches(
        log,
        5,
        () => 1,
        (i) => p(3, i * 2)
      ),
    change: (log) => log.resetTo(3)
  },
  {
    name: "expireProducers",
    options: small,
    setup: (log) =>
      Effect.gen(function* () {
        yield* batches(
          log,
          4,
          () => 1,
          (i) => p(i % 2, Math.floor(i / 2) * 2)
        )
        yield* TestClock.adjust(10_000)
        yield* log.append(1, records(8, 8), p(5, 0))
      }),
    change: (log) => log.expireProducers(5_000)
  }
]

/** The log after `setup`, and after `change` too (`withChange`), as `observe` has it; a fresh directory each. */
const run = (s: Scenario, withChange: boolean) =>
  Effect.gen(function* () {
    const a = yield* open(directoryFor(), s.options)
    yield* s.setup(a.log)
    if (withChange) yield* s.change(a.log)
    const seen = yield* observe(a.log)
    yield* a.close
    return seen
  })

describe("SegmentLog crashes", () => {
  it.effect("a crash at any file operation of a change reopens to the log before or after it", () =>
    Effect.gen(function* () {
      yield* patchHandles(root)
      const problems: Array<string> = []
      const points: Array<string> = []
      for (const s of scenarios) {
        const before = yield* run(s, false)
        const after = yield* run(s, true)
        assert.notStrictEqual(before, after, `${s.name}: the change changes the log`)
        let n = 1
        for (; ; n++) {
          const directory = directoryFor()
          const a = yield* open(directory, s.options)
          yield* s.setup(a.log)
          arm(n)
          const result = yield* Effect.result(s.change(a.log))
          const where = faults.trace.at(-1)
          const crashed = faults.dead
          disarm()
          yield* a.close
          if (!crashed) {
            assert.strictEqual(result._tag, "Success", s.name)
            break
          }
          const label = `${s.name}: crash at operation ${n} (${where})`
          const left = openFiles(directory)
          if (left.length > 0) problems.push(`${label}: files left open: ${left.join(", ")}`)
          // A cut in progress: opened twice (the first opening completes it, the second must find the same log).
          const state = yield* Effect.promise(() =>
            readFile(join(directory, Format.LOG_STATE_FILE)).catch(() => undefined)
          )
          const decoded = state === undefined ? undefined : Format.decodeLogState(new Uint8Array(state))
          const cutLeft = typeof decoded === "object" && decoded.cut !== undefined
          for (const time of cutLeft ? ["first", "second"] : ["first"]) {
            const b = yield* Effect.result(open(directory, s.options))
            if (b._tag === "Failure") {
              problems.push(`${label}: the ${time} opening fails: ${b.failure.message}`)
              break
            }
            const seen = yield* Effect.result(observe(b.success.log))
            yield* b.success.close
            if (seen._tag === "Failure") problems.push(`${label}: the log fails: ${seen.failure.message}`)
            else if (seen.success !== before && seen.success !== after) {
              problems.push(
                `${label}, ${time} opening:\n  before ${before}\n  after  ${after}\n  got    ${seen.success}`
              )
            }
          }
        }
        points.push(`${s.name}: ${n - 1}`)
      }
      assert.deepStrictEqual(problems, [])
      // Every change has file operations to crash at.
      for (const line of points) assert.notMatch(line, /: 0$/)
    })
  )

  it.effect("no file is left open when a change fails half-way (a roll that fails after creating its segment)", () =>
    Effect.gen(function* () {
      yield* patchHandles(root)
      const directory = directoryFor()
      const a = yield* open(directory, small)
      yield* batches(a.log, 2, () => 1)
      // The roll's snapshot is renamed into place after the new segment's file was opened.
      const rename = fsp.rename!
      fsp.rename = async (...x) => {
        if (String(x[1]).endsWith(".snapshot")) throw Object.assign(new Error("EIO"), { code: "EIO" })
        return rename(...x)
      }
      syncBuiltinESMExports()
      const failed = yield* Effect.flip(a.log.append(1, records(4, 5, 100))).pipe(
        Effect.ensuring(
          Effect.sync(() => {
            fsp.rename = rename
            syncBuiltinESMExports()
          })
        )
      )
      assert.strictEqual(failed.reason._tag, "StoreFailed")
      yield* a.close
      assert.deepStrictEqual(openFiles(directory), [])
    })
  )

  it.effect("a read interrupted while it opens a sealed segment leaves no file open", () =>
    Effect.gen(function* () {
      const directory = directoryFor()
      const first = yield* open(directory, small)
      // More sealed segments than the log keeps open: the opening's checks leave the first one closed.
      yield* batches(first.log, 40, () => 1)
      yield* first.close
      const a = yield* open(directory, small)
      const [segment] = yield* segmentFiles(directory)
      const started = yield* Deferred.make<void>()
      let release!: () => void
      holdOpen = {
        path: join(directory, segment!),
        started: () => {
          Deferred.doneUnsafe(started, Effect.void)
        },
        release: new Promise<void>((resolve) => {
          release = resolve
        })
      }
      const reading = yield* Effect.forkChild(a.log.read(0, 1))
      yield* Deferred.await(started)
      const interrupted = yield* Effect.forkChild(Fiber.interrupt(reading))
      yield* Effect.sleep(0)
      release()
      yield* Fiber.join(interrupted)
      yield* a.close
      assert.deepStrictEqual(openFiles(directory), [])
    })
  )
})

// ---------------------------------------------------------------------------
// Durability order, checkpoints, probe
// ---------------------------------------------------------------------------

/** The file operations (flushes too) `self` makes. */
const traced = <A, E>(self: Effect.Effect<A, E>) =>
  Effect.gen(function* () {
    faults.trace = []
    faults.tracing = true
    const a = yield* self.pipe(Effect.ensuring(Effect.sync(() => (faults.tracing = false))))
    return { a, trace: faults.trace }
  })

describe("SegmentLog file operations", () => {
  it.effect("a truncation that writes back part of a batch flushes it before it cuts the file, and after", () =>
    Effect.gen(function* () {
      yield* patchHandles(root)
      const a = yield* open(directoryFor())
      yield* a.log.append(1, records(0, 4, 40))
      yield* a.log.append(1, records(5, 9, 40))
      const { trace } = yield* traced(a.log.truncateTo(7))
      const writeBack = trace.indexOf("writev")
      const cut = trace.findIndex((t) => t.startsWith("truncate"))
      assert.isAtLeast(writeBack, 0, trace.join(", "))
      assert.isAbove(cut, writeBack, trace.join(", "))
      assert.include(trace.slice(writeBack, cut), "datasync", trace.join(", "))
      assert.include(trace.slice(cut), "datasync", trace.join(", "))
      assert.deepStrictEqual(texts(yield* a.log.read(0, 1e9)).length, 7)
      yield* a.close
    })
  )

  it.effect("a high-watermark checkpoint is one write in place; an unchanged one writes nothing", () =>
    Effect.gen(function* () {
      yield* patchHandles(root)
      const directory = directoryFor()
      const a = yield* open(directory)
      yield* a.log.append(1, records(0, 9))
      const moved = yield* traced(a.log.checkpointHighWatermark(5))
      assert.deepStrictEqual(moved.trace, ["writev"])
      const same = yield* traced(a.log.checkpointHighWatermark(5))
      assert.deepStrictEqual(same.trace, [])
      yield* a.close
      const b = yield* open(directory)
      assert.strictEqual(yield* b.log.highWatermark, 5)
      yield* b.close
      // A torn checkpoint (a power loss in the middle of its write) reads as absent: the log start.
      const path = join(directory, Format.HIGH_WATERMARK_FILE)
      const bytes = new Uint8Array(yield* Effect.promise(() => readFile(path)))
      bytes[bytes.length - 1]! ^= 0xff
      yield* Effect.promise(() => writeFile(path, bytes))
      const c = yield* open(directory)
      assert.strictEqual(yield* c.log.highWatermark, 0)
      yield* c.log.checkpointHighWatermark(8)
      yield* c.close
      const d = yield* open(directory)
      assert.strictEqual(yield* d.log.highWatermark, 8)
      yield* d.close
    })
  )

  it.effect("the interval flush runs outside the log's lock: appends go on while it waits for the device", () =>
    Effect.gen(function* () {
      yield* patchHandles(root)
      const a = yield* open(directoryFor(), { flushIntervalMs: 1000 })
      yield* a.log.append(1, records(0, 4))
      const started = yield* Deferred.make<void>()
      let release!: () => void
      holdSync = {
        started: () => {
          Deferred.doneUnsafe(started, Effect.void)
        },
        release: new Promise<void>((resolve) => {
          release = resolve
        })
      }
      yield* TestClock.adjust(1000)
      yield* Deferred.await(started)
      // The flush waits for the device: an append and a read go on.
      yield* a.log.append(1, records(5, 9))
      assert.strictEqual(texts(yield* a.log.read(0, 1e9)).length, 10)
      release()
      yield* a.close
    })
  )

  it.effect("probe writes, flushes and deletes a page in the log's directory, changing nothing the log holds", () =>
    Effect.gen(function* () {
      yield* patchHandles(root)
      const directory = directoryFor()
      const a = yield* open(directory)
      yield* a.log.append(1, records(0, 9))
      const before = yield* observe(a.log)
      const { trace } = yield* traced(a.log.probe)
      assert.deepStrictEqual(trace, ["open(w) probe.tmp", "writeFile 4096", "datasync", "rm probe.tmp"])
      assert.strictEqual(yield* observe(a.log), before)
      assert.notInclude(yield* Effect.promise(() => readdir(directory)), "probe.tmp")
      // A file system with no room fails it.
      const original = fsp.open!
      fsp.open = async (...x) => {
        if (String(x[0]).endsWith("probe.tmp")) throw Object.assign(new Error("ENOSPC"), { code: "ENOSPC" })
        return original(...x)
      }
      syncBuiltinESMExports()
      const failed = yield* Effect.flip(a.log.probe).pipe(
        Effect.ensuring(
          Effect.sync(() => {
            fsp.open = original
            syncBuiltinESMExports()
          })
        )
      )
      assert.strictEqual(failed.reason._tag, "StoreFailed")
      yield* a.close
    })
  )
})

// ---------------------------------------------------------------------------
// Damage
// ---------------------------------------------------------------------------

/** Rewrites a file's bytes with `change`. */
const damage = (path: string, change: (bytes: Uint8Array) => void) =>
  Effect.promise(async () => {
    const bytes = new Uint8Array(await readFile(path))
    change(bytes)
    await writeFile(path, bytes)
  })

/** Every file of a directory but the indexes (derived, deleted with their segment) and its size. */
const listing = (directory: string) =>
  Effect.promise(async () =>
    Promise.all(
      (await readdir(directory))
        .filter((f) => !f.endsWith(".index"))
        .sort()
        .map(async (f) => `${f} ${(await stat(join(directory, f))).size}`)
    )
  )

const expectCorrupt = (e: TabletLog.TabletLogError, detail: RegExp) => {
  assert.strictEqual(e.reason._tag, "Corrupt", e.message)
  assert.match(e.message, detail)
}

describe("SegmentLog damage", () => {
  /** A closed log of 40 batches of 2 records in segments of 4000 bytes, an index entry every 512 bytes. */
  const indexed = { segmentBytes: 4000, indexIntervalBytes: 512 }
  const written = Effect.gen(function* () {
    const directory = directoryFor()
    const a = yield* open(directory, indexed)
    yield* batches(a.log, 40, () => 1)
    yield* a.close
    return directory
  })
  const firstIndex = (directory: string) => join(directory, Format.indexFile(0))

  it.effect("an index entry changed (its CRC fails): the index is rebuilt, reads are right", () =>
    Effect.gen(function* () {
      const directory = yield* written
      let entry = 0
      yield* damage(firstIndex(directory), (bytes) => {
        const view = new DataView(bytes.buffer)
        entry = view.getUint32(Format.INDEX_HEADER_BYTES + 8)
        view.setUint32(Format.INDEX_HEADER_BYTES + 8, entry - 3)
      })
      const b = yield* open(directory, indexed)
      for (let from = entry - 4; from <= entry + 1; from++) {
        assert.deepStrictEqual(texts(yield* b.log.read(from, 1))[0], `${from}@1:${from}`, `read(${from})`)
      }
      yield* b.close
    })
  )

  it.effect("an index entry wrong with a right CRC: a read from it is Corrupt, never a batch past `from`", () =>
    Effect.gen(function* () {
      const directory = yield* written
      let entry = 0
      yield* damage(firstIndex(directory), (bytes) => {
        const view = new DataView(bytes.buffer)
        entry = view.getUint32(Format.INDEX_HEADER_BYTES + 8)
        view.setUint32(Format.INDEX_HEADER_BYTES + 8, entry - 3)
        view.setUint32(0, crc32(bytes.subarray(Format.INDEX_HEADER_BYTES)))
      })
      const b = yield* open(directory, indexed)
      expectCorrupt(yield* Effect.flip(b.log.read(entry - 3, 1)), /where \d+ was expected/)
      yield* b.close
    })
  )

  it.effect("a sealed segment file deleted in the middle: the log does not open (Corrupt), nothing deleted", () =>
    Effect.gen(function* () {
      const directory = yield* written
      const logs = yield* segmentFiles(directory)
      assert.isAtLeast(logs.length, 3)
      yield* Effect.promise(() => rm(join(directory, logs[1]!)))
      const files = yield* listing(directory)
      expectCorrupt(yield* Effect.flip(open(directory, indexed)), /ends at \d+, the next segment starts at \d+/)
      assert.deepStrictEqual(yield* listing(directory), files)
      // The first one deleted: the log start is missing.
      yield* Effect.promise(() => rm(join(directory, logs[0]!)))
      expectCorrupt(yield* Effect.flip(open(directory, indexed)), /the log starts at 0, its first segment at/)
    })
  )

  it.effect("batches that do not continue the segment before (behind the open log's back): a read is Corrupt", () =>
    Effect.gen(function* () {
      const directory = yield* written
      const logs = yield* segmentFiles(directory)
      const b = yield* open(directory, indexed)
      // The second segment's batches moved 2 offsets up (each frame written again, as whole and as long as before).
      yield* damage(join(directory, logs[1]!), (bytes) => {
        for (let at = 0; at < bytes.length; ) {
          const parsed = Format.parseFrame(bytes, at)
          if (parsed._tag !== "Frame") break
          const { baseOffset, encoded, frameBytes } = parsed.frame
          bytes.set(Format.frameHeader(baseOffset + 2, encoded.slice()), at)
          at += frameBytes
        }
      })
      const error = yield* Effect.flip(b.log.read(0, Number.MAX_SAFE_INTEGER))
      expectCorrupt(error, /where \d+ was expected/)
      yield* b.close
    })
  )

  it.effect("a bad batch in a segment before the last: Corrupt at open, never cut (nothing deleted)", () =>
    Effect.gen(function* () {
      // Walked at open: the snapshots deleted, the opening walks every segment.
      const directory = yield* written
      const logs = yield* segmentFiles(directory)
      for (const f of yield* Effect.promise(() => readdir(directory))) {
        if (f.endsWith(".snapshot")) yield* Effect.promise(() => rm(join(directory, f)))
      }
      yield* damage(join(directory, logs[1]!), (bytes) => {
        bytes[Math.floor(bytes.length / 2)]! ^= 0x01
      })
      const files = yield* listing(directory)
      expectCorrupt(yield* Effect.flip(open(directory, indexed)), /fails its CRC|declares|not a frame|cut short/)
      assert.deepStrictEqual(yield* listing(directory), files)

      // Past the walk, in a sealed segment's last batches (what the opening reads of it): Corrupt too.
      const other = yield* written
      const others = yield* segmentFiles(other)
      yield* damage(join(other, others[1]!), (bytes) => {
        bytes[bytes.length - 3]! ^= 0x01
      })
      const before = yield* listing(other)
      expectCorrupt(yield* Effect.flip(open(other, indexed)), /fails its CRC/)
      assert.deepStrictEqual(yield* listing(other), before)
    })
  )
})
