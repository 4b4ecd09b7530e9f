// The part of @nxtedition/rocksdb (which ships no types) that the adapter uses.
declare module "@nxtedition/rocksdb" {
  export class RocksLevel<K = Buffer, V = Buffer> {
    constructor(location: string, options?: { keyEncoding?: "buffer" | "utf8"; valueEncoding?: "buffer" | "utf8" })
    open(options?: Record<string, unknown>): Promise<void>
    close(): Promise<void>
    get(key: K): Promise<V>
    getMany(keys: Array<K>): Promise<Array<V | undefined>>
    batch(
      ops: Array<{ type: "put"; key: K; value: V } | { type: "del"; key: K }>,
      options?: { sync?: boolean }
    ): Promise<void>
    /** A chained batch: puts and deletes added one by one, written by `write`. */
    batch(): {
      put(key: K, value: V): void
      del(key: K): void
      write(options?: { sync?: boolean }): Promise<void>
    }
    iterator(options?: Record<string, unknown>): {
      nextv(size: number): Promise<Array<[K, V]>>
      close(): Promise<void>
    }
  }
}
