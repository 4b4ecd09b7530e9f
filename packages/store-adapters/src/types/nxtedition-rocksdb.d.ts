// The part of @nxtedition/rocksdb (which ships no types) that the adapter uses.
declare module "@nxtedition/rocksdb" {
  export class RocksLevel<K = Buffer, V = Buffer> {
    constructor(location: string, options?: { keyEncoding?: "buffer" | "utf8"; valueEncoding?: "buffer" | "utf8" })
    /** abstract-level's state: "opening", "open", "closing" or "closed". */
    readonly status: string
    /** The open database's handle: another thread opens the same database with `new RocksLevel(handle)`. */
    readonly handle: bigint
    open(options?: Record<string, unknown>): Promise<void>
    close(): Promise<void>
    get(key: K): Promise<V>
    getMany(keys: Array<K>): Promise<Array<V | undefined>>
    /**
     * Reads keys synchronously on the calling thread (absent keys are undefined, aborted or timed-out reads null);
     * a read error (e.g. a checksum mismatch) is thrown.
     */
    _getManySync(keys: Array<Buffer>): Array<V | undefined | null>
    /**
     * A native batch through abstract-level's implementer methods (no validation, no operation objects), written
     * synchronously by `_writeSync`.
     */
    _chainedBatch(): {
      _put(key: Buffer, value: Uint8Array): void
      _del(key: Buffer): void
      _clear(): void
      _writeSync(options: { sync: boolean }): void
    }
    iterator(options?: Record<string, unknown>): {
      nextv(size: number): Promise<Array<[K, V]>>
      close(): Promise<void>
    }
  }
}
