import { defineConfig, type Options } from "tsup"

/** The build every package shares: ESM for Node 22+, sourcemaps; declarations come from `tsc`. */
export const packageConfig = (entry: Array<string> = ["src/index.ts"], overrides: Options = {}) =>
  defineConfig({
    entry,
    format: ["esm"],
    target: "node22",
    sourcemap: true,
    clean: false,
    splitting: true,
    dts: false,
    ...overrides
  })
