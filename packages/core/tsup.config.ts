import { defineConfig } from "tsup"

export default defineConfig({
  entry: ["src/index.ts", "src/testing/index.ts"],
  format: ["esm"],
  target: "node22",
  sourcemap: true,
  clean: false,
  splitting: true,
  dts: false,
  external: ["vitest", "@effect/vitest"]
})
