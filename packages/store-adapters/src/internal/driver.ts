/** The part of an abstract-level database (LevelDB's or RocksDB's bindings) the stores drive. */

/**
 * A native batch through abstract-level's implementer methods (`_put`, `_del`, `_clear`), which the bindings
 * implement and abstract-level's public `put` wraps: the public one validates again, copies options and builds an
 * operation object per call, ~7% of a restore's time on the JavaScript thread. Keys and values reach it already
 * validated and as buffers.
 */
export interface NativeBatch {
  _put(key: Buffer, value: Uint8Array): void
  _del(key: Buffer): void
  _clear(): void
}

/**
 * Adds a write's operations to a cleared native batch, synchronously: the bindings copy keys and values as they
 * are added, so the buffers passed may be reused right after.
 */
export type FillBatch = (batch: NativeBatch) => void

/** The part of an abstract-level iterator the store uses. */
export interface DriverIterator {
  nextv(size: number): Promise<Array<[Buffer, Buffer]>>
  close(): Promise<void>
}

/** The part of an abstract-level database the store uses. */
export interface DriverDb {
  /** Writes, atomically, what `fill` adds to a cleared native batch. */
  batch(fill: FillBatch, options: { sync: boolean }): Promise<void>
  get(key: Buffer): Promise<Buffer | undefined>
  /**
   * Synchronous reads, where the driver has ones cheap enough to block the calling thread for; the store then reads
   * every key (`get`, `getMany`, `persistedOffset`) through them.
   */
  getSync?: (key: Buffer) => Buffer | undefined
  getManySync?: (keys: Array<Buffer>) => Array<Buffer | undefined>
  getMany(keys: Array<Buffer>): Promise<Array<Buffer | undefined>>
  iterator(options: DriverRange & { keys?: boolean; values?: boolean }): DriverIterator
  close(): Promise<void>
}

/** Bounds as abstract-level takes them. */
export interface DriverRange {
  gt?: Buffer
  gte?: Buffer
  lt?: Buffer
  lte?: Buffer
  reverse?: boolean
  limit?: number
}
