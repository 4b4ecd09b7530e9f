import { defineConfig } from "vitest/config"

// Workspace sources are resolved through the "@strata/source" export condition,
// so tests run against src/ without a build step.
const conditions = ["@strata/source", "import", "module", "node", "default"]

export default defineConfig({
  resolve: { conditions },
  ssr: { resolve: { conditions, externalConditions: conditions } },
  test: {
    projects: [
      {
        extends: true,
        test: {
          name: "unit",
          include: ["packages/*/test/**/*.test.ts", "apps/*/test/**/*.test.ts"],
          exclude: ["**/*.int.test.ts", "**/node_modules/**"],
          testTimeout: 30_000
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
          fileParallelism: false
        }
      }
    ]
  }
})
