/**
 * The file operations of a segment log, as Effects failing with core's `StoreError` (the tablet log wraps it in
 * `StoreFailed`): node's `fs/promises`, positional reads and writes on open file handles, and checkpoint files
 * replaced atomically (written beside, flushed, renamed over).
 *
 * @internal
 */
import { Store } from "@strata/core"
import type { FileHandle } from "node:fs/promises"
import * as fs from "node:fs/promises"
import { join } from "node:path"
import { Effect } from "effect"
import { TEMP_SUFFIX } from "./segmentFormat.js"

/** The store name the log's storage errors carry. */
export const STORE_NAME = "segment log"

const codeOf = (e: unknown): unknown =>
  typeof e === "object" && e !== null ? (e as { code?: unknown }).code : undefined

const messageOf = (e: unknown): string => (e instanceof Error ? e.message : String(e))

/** A failed file operation as a `StoreError`: `AccessDenied` for permissions, `IoError` for anything else. */
export const ioError = (operation: string, path: string, e: unknown): Store.StoreError => {
  const code = codeOf(e)
  return code === "EACCES" || code === "EPERM" || code === "EROFS"
    ? Store.storeError(new Store.AccessDenied({ store: STORE_NAME, path, detail: messageOf(e) }))
    : Store.storeError(new Store.IoError({ operation: `${operation} ${path}`, detail: messageOf(e) }))
}

/** Runs a file operation on `path`. */
export const io = <A>(operation: string, path: string, run: () => Promise<A>): Effect.Effect<A, Store.StoreError> =>
  Effect.tryPromise({ try: run, catch: (e) => ioError(operation, path, e) })

/** Creates the directory (and its parents) if missing. */
export const ensureDirectory = (directory: string) =>
  io("create directory", directory, () => fs.mkdir(directory, { recursive: true })).pipe(Effect.asVoid)

/** The names of the files in the directory. */
export const list = (directory: string) => io("list", directory, () => fs.readdir(directory))

/** The size of a file, in bytes. */
export const sizeOf = (path: string) => io("stat", path, () => fs.stat(path)).pipe(Effect.map((s) => s.size))

/** Opens a file for reading and writing (`w+`: created, or emptied if it exists). */
export const open = (path: string, flags: "r+" | "w+") => io("open", path, () => fs.open(path, flags))

/** Opens a file for reading and writing, created empty if missing (kept as it is otherwise). */
export const openOrCreate = (path: string) =>
  io("open", path, () => fs.open(path, fs.constants.O_RDWR | fs.constants.O_CREAT))

/** Closes a file handle. */
export const close = (handle: FileHandle, path: string) => io("close", path, () => handle.close())

/** Deletes a file; one already gone is not an error. */
export const remove = (path: string) =>
  io("delete", path, () =>
    fs.rm(path).catch((e: unknown) => {
      if (codeOf(e) !== "ENOENT") throw e
    })
  )

/** A file's bytes, `undefined` when it does not exist. */
export const readIfExists = (path: string) =>
  io("read", path, () =>
    fs.readFile(path).then(
      (b): Uint8Array | undefined => b,
      (e: unknown) => {
        if (codeOf(e) === "ENOENT") return undefined
        throw e
      }
    )
  )

/**
 * A file's size and its last `length` bytes (all of it when shorter), `undefined` when it does not exist: one open,
 * one stat, one read.
 */
export const readTail = (path: string, length: number) =>
  io("read", path, async (): Promise<{ readonly size: number; readonly tail: Uint8Array } | undefined> => {
    let handle: FileHandle
    try {
      handle = await fs.open(path, "r")
    } catch (e) {
      if (codeOf(e) === "ENOENT") return undefined
      throw e
    }
    try {
      const { size } = await handle.stat()
      const want = Math.min(length, size)
      const tail = new Uint8Array(want)
      let done = 0
      while (done < want) {
        const { bytesRead } = await handle.read(tail, done, want - done, size - want + done)
        if (bytesRead === 0) break
        done += bytesRead
      }
      return { size, tail: tail.subarray(0, done) }
    } finally {
      await handle.close()
    }
  })

/**
 * Up to `length` bytes of a file from `position` (fewer only where the file ends), as a plain `Uint8Array` (the
 * records read are views of it, and compare equal to the ones written).
 */
export const readAt = (handle: FileHandle, path: string, position: number, length: number) =>
  io("read", path, async (): Promise<Uint8Array> => {
    const buffer = Buffer.allocUnsafe(length)
    let done = 0
    while (done < length) {
      const { bytesRead } = await handle.read(buffer, done, length - done, position + done)
      if (bytesRead === 0) break
      done += bytesRead
    }
    return new Uint8Array(buffer.buffer, buffer.byteOffset, done)
  })

/** Writes `buffers` at `position`, one after another, in one `writev` (again for what a short write left). */
export const writeAt = (handle: FileHandle, path: string, buffers: ReadonlyArray<Uint8Array>, position: number) =>
  io("write", path, async () => {
    const total = buffers.reduce((n, b) => n + b.length, 0)
    let done = (await handle.writev(buffers as Array<Uint8Array>, position)).bytesWritten
    while (done < total) {
      // A short write (rare on a regular file): the rest, buffer by buffer.
      let skip = done
      const rest: Array<Uint8Array> = []
      for (const b of buffers) {
        if (skip >= b.length) skip -= b.length
        else {
          rest.push(skip === 0 ? b : b.subarray(skip))
          skip = 0
        }
      }
      const { bytesWritten } = await handle.writev(rest, position + done)
      if (bytesWritten === 0) throw new Error(`wrote ${done} of ${total} bytes`)
      done += bytesWritten
    }
  })

/** Cuts a file to `size` bytes. */
export const truncate = (handle: FileHandle, path: string, size: number) =>
  io("truncate", path, () => handle.truncate(size))

/** Flushes a file's data to the device. */
export const sync = (handle: FileHandle, path: string) => io("fsync", path, () => handle.datasync())

/**
 * Writes `bytes` to a new file `path` and flushes it to the device, then deletes it: a file system with no room, or
 * a device that takes no writes, fails it. A file left behind by a crash is the caller's to delete.
 */
export const scratch = (path: string, bytes: Uint8Array) =>
  io("write", path, async () => {
    const handle = await fs.open(path, "w")
    try {
      await handle.writeFile(bytes)
      await handle.datasync()
    } finally {
      await handle.close()
    }
  }).pipe(Effect.ensuring(remove(path).pipe(Effect.ignore)))

/** Flushes a directory's entries (created, renamed and deleted files) to the device. */
export const syncDirectory = (directory: string) =>
  io("fsync", directory, async () => {
    const handle = await fs.open(directory, "r")
    try {
      await handle.sync()
    } finally {
      await handle.close()
    }
  })

/**
 * Replaces `name` in the directory with `bytes` atomically: written to a temporary file beside it, flushed to the
 * device when `durable`, then renamed over it (and the directory flushed, when `durable`). A reader finds the old
 * file or the new one, never a mix; a process crash keeps what the rename did, and with `durable` so does a power
 * loss.
 */
export const replace = (directory: string, name: string, bytes: Uint8Array, durable: boolean) =>
  io("write", join(directory, name), async () => {
    const target = join(directory, name)
    const temp = `${target}${TEMP_SUFFIX}`
    const handle = await fs.open(temp, "w")
    try {
      await handle.writeFile(bytes)
      if (durable) await handle.datasync()
    } finally {
      await handle.close()
    }
    await fs.rename(temp, target)
  }).pipe(Effect.andThen(durable ? syncDirectory(directory) : Effect.void))
