import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { StoreConformance } from "@strata/core/testing"
import * as LevelStore from "@strata/store-adapters/level"
import * as MemoryStore from "@strata/store-adapters/memory"
import * as RocksDbStore from "@strata/store-adapters/rocksdb"
import { afterAll } from "vitest"

const root = mkdtempSync(join(tmpdir(), "strata-store-conformance-"))
afterAll(() => rmSync(root, { recursive: true, force: true }))

StoreConformance.suite("memory", MemoryStore.layer())
StoreConformance.suite("level", LevelStore.layer({ directory: join(root, "level") }))
StoreConformance.suite("rocksdb", RocksDbStore.layer({ directory: join(root, "rocksdb") }))
StoreConformance.suite(
  "rocksdb, writing on the calling thread",
  RocksDbStore.layer({ directory: join(root, "rocksdb-calling-thread"), writerThread: false })
)
StoreConformance.suite(
  "rocksdb, reading asynchronously",
  RocksDbStore.layer({ directory: join(root, "rocksdb-async-reads"), syncReads: false })
)
