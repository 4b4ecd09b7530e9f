import { defineConfig } from "vitest/config"

// Workspace sources are resolved through the "@strata/source" export condition, so tests run against src/
// without a build step. Only that condition is passed on to Node for external packages: adding "import" there
// would make require() inside CommonJS libraries load ESM builds (protobufjs then loses `long`, and etcd3's
// 64-bit lease ids get rounded).
const conditions = ["@strata/source", "node", "development|production"]

export default defineConfig({
  resolve: { conditions },
  ssr: { resolve: { conditions, externalConditions: ["@strata/source"] } },
  test: {
    projects: [
      {
        extends: true,
        test: {
          name: "unit",
          include: ["packages/*/test/**/*.test.ts", "apps/*/test/**/*.test.ts"],
          exclude: ["**/*.int.test.ts", "**/node_modules/**"],
          testTimeout: 30_000,
          // The unit project (the CPU-bound simulators among it) runs before the real-server tests, not beside
          // them: on a 2-core machine the two together starved the servers' timeouts.
          sequence: { groupOrder: 0 }
        }
      },
      {
        extends: true,
        test: {
          name: "integration",
          include: ["**/*.int.test.ts"],
          exclude: ["**/node_modules/**"],
          globalSetup: ["./scripts/vitest-services.ts"],
          testTimeout: 120_000,
          hookTimeout: 300_000,
          fileParallelism: false,
          sequence: { groupOrder: 1 }
        }
      }
    ]
  }
})
