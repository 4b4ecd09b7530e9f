/**
 * @strata/store-adapters: `Store` adapters: memory, LevelDB (classic-level) and RocksDB, as subpath exports with their drivers as optional peer dependencies.
 *
 * Not built yet (issue 3 fills this package); it exports nothing.
 *
 * @since 0.0.0
 */
export {}
