import { defineConfig } from "vitest/config"
import { BaseSequencer, type TestSpecification } from "vitest/node"

// Workspace sources are resolved through the "@strata/source" export condition, so tests run against src/
// without a build step. Only that condition is passed on to Node for external packages: adding "import" there
// would make require() inside CommonJS libraries load ESM builds (protobufjs then loses `long`, and etcd3's
// 64-bit lease ids get rounded).
const conditions = ["@strata/source", "node", "development|production"]

/**
 * The unit files that run longest, longest first: started before the rest, so that the two workers end together
 * (a fresh clone has no timings for vitest's own order, which starts the largest files first).
 */
const longest = [
  "/ClusterSimulationRebalancing.test.ts",
  "/ClusterSimulationPlanted.test.ts",
  "/ClusterSimulation.test.ts",
  "/Cli.test.ts",
  "/Crash.test.ts"
]

/** Vitest's order, with the files of `longest` first within their project group. */
class LongestFirst extends BaseSequencer {
  override async sort(files: Array<TestSpecification>): Promise<Array<TestSpecification>> {
    const sorted = await super.sort(files)
    const rank = (f: TestSpecification) => {
      const i = longest.findIndex((name) => f.moduleId.endsWith(name))
      return i < 0 ? longest.length : i
    }
    const group = (f: TestSpecification) => f.project.config.sequence.groupOrder
    return sorted
      .map((f, i) => ({ f, i }))
      .sort((a, b) => group(a.f) - group(b.f) || rank(a.f) - rank(b.f) || a.i - b.i)
      .map(({ f }) => f)
  }
}

export default defineConfig({
  resolve: { conditions },
  ssr: { resolve: { conditions, externalConditions: ["@strata/source"] } },
  test: {
    sequence: { sequencer: LongestFirst },
    projects: [
      {
        extends: true,
        test: {
          name: "unit",
          include: ["packages/*/test/**/*.test.ts", "apps/*/test/**/*.test.ts", "test/**/*.test.ts"],
          exclude: ["**/*.int.test.ts", "**/node_modules/**"],
          testTimeout: 30_000,
          // Two files at once (the default is one fewer than the cores, one on this 2-core machine): the cluster
          // simulation's variants are files of their own so that they run side by side.
          maxWorkers: 2,
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
