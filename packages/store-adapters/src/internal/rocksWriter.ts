/**
 * RocksDB write batches on a worker thread.
 *
 * `@nxtedition/rocksdb` writes a batch synchronously on the thread that calls it (memtable inserts and the
 * write-ahead log: about 0.5 µs per record), and that thread is the JavaScript thread. The binding lets another
 * thread use an open database through its handle, so a worker owns the writing: the JavaScript thread copies a
 * batch's keys and values into one buffer and posts it; the worker fills a native batch from it and writes.
 * Reads stay on the JavaScript thread, straight to the database: nothing but writes crosses threads.
 *
 * Batches are written one at a time, in the order they were posted; a write resolves once the worker has written
 * it, so a read after it sees it. While the worker writes, the writes that arrive meanwhile gather in one batch,
 * posted as soon as the worker is free (a group commit: a message and a thread round trip cost about as much as
 * writing a small batch, and under load a tablet server posts thousands a second). A group is one RocksDB write
 * batch, so each write in it stays atomic; when the group fails, each of its writes fails. Buffers travel back and
 * forth (transferred, not copied) and are reused.
 */
import { Worker } from "node:worker_threads"
import type { FillBatch, NativeBatch } from "./levelDb.js"

/** Writes batches on a worker thread; `close` waits for the posted ones and stops the worker. */
export interface RocksWriter {
  write(fill: FillBatch, options: { readonly sync: boolean }): Promise<void>
  close(): Promise<void>
}

const PUT = 1
const DEL = 2

// The worker, as CommonJS source: it loads the binding next to the resolved package and uses the database by its
// handle (never closing it: the JavaScript thread owns it). Messages: { id, buffer, length, sync } → { id, buffer, error }.
const WORKER_SOURCE = `
const { parentPort, workerData } = require("node:worker_threads")
const { dirname, join } = require("node:path")
// The binding's own functions, not RocksLevel's wrappers: those check their arguments again and look an options
// object up per operation.
const binding = require(join(dirname(workerData.module), "binding.js"))
const db = binding.db_init(workerData.handle)
const batch = binding.batch_init()
const SYNC = { sync: true }
const NO_SYNC = { sync: false }
parentPort.on("message", ({ id, buffer, length, sync }) => {
  let error
  try {
    binding.batch_clear(batch)
    const bytes = Buffer.from(buffer, 0, length)
    let at = 0
    while (at < length) {
      const tag = bytes[at]
      const keyLength = bytes.readUInt32LE(at + 1)
      at += 5
      const key = bytes.subarray(at, at + keyLength)
      at += keyLength
      if (tag === ${PUT}) {
        const valueLength = bytes.readUInt32LE(at)
        at += 4
        binding.batch_put(batch, key, bytes.subarray(at, at + valueLength), undefined)
        at += valueLength
      } else {
        binding.batch_del(batch, key, undefined)
      }
    }
    binding.batch_write(db, batch, sync ? SYNC : NO_SYNC)
  } catch (e) {
    error = { message: String((e && e.message) || e), code: e && typeof e.code === "string" ? e.code : undefined }
  } finally {
    binding.batch_clear(batch)
  }
  parentPort.postMessage({ id, buffer, error }, [buffer])
})
`

/** An encoding batch: operations appended to a growable buffer as the worker reads them. */
class EncodedBatch implements NativeBatch {
  bytes: Buffer
  length = 0
  constructor(buffer: ArrayBuffer) {
    this.bytes = Buffer.from(buffer)
  }
  private room(n: number): void {
    if (this.length + n <= this.bytes.length) return
    const grown = Buffer.from(new ArrayBuffer(Math.max(this.bytes.length * 2, this.length + n)))
    this.bytes.copy(grown, 0, 0, this.length)
    this.bytes = grown
  }
  _put(key: Buffer, value: Uint8Array): void {
    this.room(9 + key.length + value.length)
    const b = this.bytes
    let at = this.length
    b[at] = PUT
    b.writeUInt32LE(key.length, at + 1)
    at += 5
    b.set(key, at)
    at += key.length
    b.writeUInt32LE(value.length, at)
    at += 4
    b.set(value, at)
    this.length = at + value.length
  }
  _del(key: Buffer): void {
    this.room(5 + key.length)
    const b = this.bytes
    b[this.length] = DEL
    b.writeUInt32LE(key.length, this.length + 1)
    b.set(key, this.length + 5)
    this.length += 5 + key.length
  }
  _clear(): void {
    this.length = 0
  }
}

/** Buffers kept for reuse (up to `MAX_KEPT_BUFFER` bytes each); a batch's buffer starts at `INITIAL_BUFFER` and grows. */
const MAX_IDLE_BUFFERS = 4
const MAX_KEPT_BUFFER = 4 * 1024 * 1024
const INITIAL_BUFFER = 256 * 1024

/** A write waiting for its group's answer. */
interface Waiter {
  readonly resolve: () => void
  readonly reject: (e: Error) => void
}

/** Starts a writer on the open database `handle`, loading the binding from `module` (its resolved path). */
export const startRocksWriter = (handle: bigint, module: string): Promise<RocksWriter> =>
  new Promise((resolve, reject) => {
    const worker = new Worker(WORKER_SOURCE, { eval: true, workerData: { handle, module } })
    /** The writes of each posted group, by the group's id. */
    const pending = new Map<number, Array<Waiter>>()
    const idle: Array<ArrayBuffer> = []
    let nextId = 0
    let failure: Error | undefined
    let closing: Promise<void> | undefined
    /** The writes gathered while a group is at the worker, posted when it answers. */
    let gathering: { batch: EncodedBatch; waiters: Array<Waiter>; sync: boolean } | undefined
    /** Called when the last posted write is answered (close waits for it). */
    let drained: (() => void) | undefined
    const settled = () => {
      if (pending.size > 0) return
      worker.unref()
      drained?.()
    }
    const fail = (error: Error) => {
      failure ??= error
      for (const group of pending.values()) for (const w of group) w.reject(failure)
      pending.clear()
      if (gathering !== undefined) for (const w of gathering.waiters) w.reject(failure)
      gathering = undefined
      settled()
    }
    const post = (batch: EncodedBatch, waiters: Array<Waiter>, sync: boolean) => {
      const id = nextId++
      pending.set(id, waiters)
      if (pending.size === 1) worker.ref()
      const buffer = batch.bytes.buffer as ArrayBuffer
      worker.postMessage({ id, buffer, length: batch.length, sync }, [buffer])
    }
    worker.on("message", (m: { id: number; buffer: ArrayBuffer; error?: { message: string; code?: string } }) => {
      // A buffer grown by an unusually large batch is let go rather than kept.
      if (idle.length < MAX_IDLE_BUFFERS && m.buffer.byteLength <= MAX_KEPT_BUFFER) idle.push(m.buffer)
      const waiters = pending.get(m.id) ?? []
      pending.delete(m.id)
      const error =
        m.error === undefined
          ? undefined
          : Object.assign(new Error(m.error.message), m.error.code === undefined ? {} : { code: m.error.code })
      for (const w of waiters) {
        if (error === undefined) w.resolve()
        else w.reject(error)
      }
      // The writes that gathered meanwhile go now, as one group.
      const next = gathering
      gathering = undefined
      if (next !== undefined) post(next.batch, next.waiters, next.sync)
      settled()
    })
    worker.on("error", (e) => fail(e))
    worker.on("exit", (code) => fail(new Error(`the RocksDB writer thread exited (code ${code})`)))
    worker.once("online", () => {
      // From now on the worker keeps the process alive only while a write is posted.
      worker.unref()
      resolve({
        write: (fill, options) => {
          if (failure !== undefined) return Promise.reject(failure)
          if (closing !== undefined) return Promise.reject(new Error("the RocksDB writer is closed"))
          if (pending.size === 0) {
            const batch = new EncodedBatch(idle.pop() ?? new ArrayBuffer(INITIAL_BUFFER))
            fill(batch)
            return new Promise<void>((resolveWrite, rejectWrite) =>
              post(batch, [{ resolve: resolveWrite, reject: rejectWrite }], options.sync)
            )
          }
          gathering ??= {
            batch: new EncodedBatch(idle.pop() ?? new ArrayBuffer(INITIAL_BUFFER)),
            waiters: [],
            sync: false
          }
          const group = gathering
          // A fill that throws takes its own operations back out of the group.
          const before = group.batch.length
          try {
            fill(group.batch)
          } catch (e) {
            group.batch.length = before
            throw e
          }
          group.sync ||= options.sync
          return new Promise<void>((resolveWrite, rejectWrite) => {
            group.waiters.push({ resolve: resolveWrite, reject: rejectWrite })
          })
        },
        close: () => {
          closing ??= (async () => {
            // Writes already posted finish first: the worker answers messages in order.
            if (pending.size > 0) await new Promise<void>((done) => (drained = done))
            worker.removeAllListeners("exit")
            failure ??= new Error("the RocksDB writer is closed")
            await worker.terminate()
          })()
          return closing
        }
      })
    })
    worker.once("error", reject)
  })
