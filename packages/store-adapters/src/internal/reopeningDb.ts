/**
 * A database that is opened again after a write fails.
 *
 * LevelDB and RocksDB both keep a failed write-ahead-log append (a full disk, an I/O error) as a background error
 * that refuses every later write until the database is closed and opened again, whatever has been freed since. So
 * after a failed write the next write first reopens the database (replaying its write-ahead log: what was written
 * before stays) and then tries; a reopen that fails (the disk is still full) fails that write and is tried again by
 * the next. Reads keep going to the failed database until the reopen; while one runs, asynchronous reads wait for
 * it and synchronous ones fail. Iterators opened on the failed database end with the reopen.
 */
import type { DriverDb, DriverIterator, FillBatch } from "./driver.js"

/** Serves `DriverDb` from `first`, then from databases `open` gives once a write failed. */
export const reopeningDb = (first: DriverDb, open: () => Promise<DriverDb>): DriverDb => {
  /** The database in use; undefined while a reopen runs or after one failed. */
  let current: DriverDb | undefined = first
  /** A write on `current` failed: the next write reopens it. */
  let failed = false
  let reopening: Promise<DriverDb> | undefined
  let closed = false

  const reopen = (): Promise<DriverDb> => {
    reopening ??= (async () => {
      try {
        const old = current
        current = undefined
        if (old !== undefined) await old.close().catch(() => undefined)
        if (closed) throw new Error("the database is closed")
        const db = await open()
        current = db
        failed = false
        return db
      } finally {
        reopening = undefined
      }
    })()
    return reopening
  }
  /** The database to read from: the current one, even if a write on it failed. */
  const readable = (): DriverDb | Promise<DriverDb> => current ?? reopen()
  const unavailable = () => new Error("the database is being opened again after a failed write")

  const batch = (fill: FillBatch, options: { sync: boolean }): Promise<void> => {
    const db = current
    if (db === undefined || failed) return reopen().then((again) => write(again, fill, options))
    return write(db, fill, options)
  }
  const write = (db: DriverDb, fill: FillBatch, options: { sync: boolean }): Promise<void> =>
    db.batch(fill, options).catch((e: unknown) => {
      if (db === current) failed = true
      throw e
    })

  const lazyIterator = (range: Parameters<DriverDb["iterator"]>[0]): DriverIterator => {
    let it: Promise<DriverIterator> | undefined
    const opened = () => {
      it ??= Promise.resolve(readable()).then((db) => db.iterator(range))
      return it
    }
    return {
      nextv: (size) => opened().then((i) => i.nextv(size)),
      close: () => (it === undefined ? Promise.resolve() : it.then((i) => i.close()).catch(() => undefined))
    }
  }

  const db: DriverDb = {
    batch,
    get: (key) => Promise.resolve(readable()).then((d) => d.get(key)),
    getMany: (keys) => Promise.resolve(readable()).then((d) => d.getMany(keys)),
    iterator: (range) => (current === undefined ? lazyIterator(range) : current.iterator(range)),
    close: async () => {
      closed = true
      await reopening?.catch(() => undefined)
      const last = current
      current = undefined
      await last?.close()
    }
  }
  // Every database a backend opens has the same reads: the first one's say which exist.
  if (first.getSync !== undefined) {
    db.getSync = (key) => {
      const read = current?.getSync
      if (read === undefined) throw unavailable()
      return read(key)
    }
  }
  if (first.getManySync !== undefined) {
    db.getManySync = (keys) => {
      const read = current?.getManySync
      if (read === undefined) throw unavailable()
      return read(keys)
    }
  }
  return db
}
