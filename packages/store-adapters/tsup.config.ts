import { packageConfig } from "../../tsup.shared.js"

export default packageConfig(["src/index.ts", "src/MemoryStore.ts", "src/LevelStore.ts", "src/RocksDbStore.ts"], {
  external: ["classic-level", "@nxtedition/rocksdb"]
})
