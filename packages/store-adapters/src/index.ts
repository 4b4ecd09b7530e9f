/**
 * @strata/store-adapters: the `Store` protocol on memory, LevelDB and RocksDB.
 * Import a backend from its subpath so only its driver is loaded:
 * `@strata/store-adapters/memory`, `/level`, `/rocksdb`.
 *
 * @since 0.1.0
 */
export type { LevelStoreOptions } from "./LevelStore.js"
export type { MemoryStoreOptions } from "./MemoryStore.js"
export type { RocksDbStoreOptions } from "./RocksDbStore.js"
