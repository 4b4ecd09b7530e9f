/**
 * How tests start a TypeScript program as a real child process: bundled once with esbuild (a fast start, for tests
 * that spawn it many times), or under the tsx loader (the fallback). Drivers that load files relative to their own
 * install (native addons, etcd3's `.proto` files) stay external, imported from their installed paths.
 */
import { mkdtemp, rm } from "node:fs/promises"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { basename, join } from "node:path"
import { pathToFileURL } from "node:url"
import * as esbuild from "esbuild"

/** How to start the program: `node <argv(args)>`; `dispose` removes a bundle. */
export interface NodeRunner {
  readonly kind: "bundle" | "tsx"
  readonly argv: (args: ReadonlyArray<string>) => Array<string>
  readonly dispose: () => Promise<void>
}

/** Runs `source` through the tsx loader, resolving workspace packages to their sources. */
export const tsxRunner = (source: string): NodeRunner => {
  const loader = pathToFileURL(createRequire(import.meta.url).resolve("tsx/esm")).href
  return {
    kind: "tsx",
    argv: (args) => ["--import", loader, "--conditions=@strata/source", source, ...args],
    dispose: async () => {}
  }
}

const escapeRegExp = (name: string) => name.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")

/** Bundles `source` into a fresh temporary directory, leaving the `external` packages out. */
export const bundleRunner = async (source: string, external: ReadonlyArray<string>): Promise<NodeRunner> => {
  const directory = await mkdtemp(join(tmpdir(), "strata-bundle-"))
  const outfile = join(directory, `${basename(source, ".ts")}.mjs`)
  try {
    await esbuild.build({
      entryPoints: [source],
      outfile,
      bundle: true,
      platform: "node",
      format: "esm",
      target: "node22",
      conditions: ["@strata/source"],
      logLevel: "warning",
      banner: {
        js: 'import { createRequire as __strataCreateRequire } from "node:module"; const require = __strataCreateRequire(import.meta.url);'
      },
      plugins:
        external.length === 0
          ? []
          : [
              {
                name: "drivers-external",
                setup: (build) =>
                  build.onResolve({ filter: new RegExp(`^(${external.map(escapeRegExp).join("|")})$`) }, (args) => ({
                    path: createRequire(args.importer).resolve(args.path),
                    external: true
                  }))
              }
            ]
    })
  } catch (error) {
    await rm(directory, { recursive: true, force: true })
    throw error
  }
  return {
    kind: "bundle",
    argv: (args) => [outfile, ...args],
    dispose: () => rm(directory, { recursive: true, force: true })
  }
}

/**
 * The bundle, or the tsx runner when bundling fails (with a warning naming `label`) or when `preferTsx` is set
 * (a test's escape hatch, e.g. `STRATA_CRASH_RUNNER=tsx`).
 */
export const nodeRunner = async (
  label: string,
  source: string,
  external: ReadonlyArray<string>,
  preferTsx = false
): Promise<NodeRunner> => {
  if (preferTsx) return tsxRunner(source)
  try {
    return await bundleRunner(source, external)
  } catch (error) {
    process.stderr.write(`${label}: bundling failed, using the tsx loader instead: ${String(error)}\n`)
    return tsxRunner(source)
  }
}
