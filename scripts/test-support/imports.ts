/**
 * A package's source files and their relative imports, read from the files themselves (type-only imports and
 * re-exports included), and the import cycles among them.
 */
import { readdirSync, readFileSync } from "node:fs"
import { dirname, join, normalize, relative } from "node:path"

/** Every `.ts` file under `dir`. */
export const sourceFiles = (dir: string): Array<string> =>
  readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sourceFiles(join(dir, e.name)) : e.name.endsWith(".ts") ? [join(dir, e.name)] : []
  )

/** The relative imports and re-exports of `file`, as absolute paths of `.ts` files. */
export const importsOf = (file: string): Array<string> =>
  [...readFileSync(file, "utf8").matchAll(/(?:from|import)\s*\(?\s*["'](\.{1,2}\/[^"']+)["']/g)].map((m) =>
    normalize(join(dirname(file), m[1]!.replace(/\.js$/, ".ts")))
  )

/** The import graph of the files under `src`. */
export const graphOf = (src: string): Map<string, Array<string>> =>
  new Map(sourceFiles(src).map((f) => [f, importsOf(f)]))

/** Each cycle found in `graph`, as `a.ts -> b.ts -> a.ts` relative to `root`. */
export const cyclesIn = (graph: ReadonlyMap<string, ReadonlyArray<string>>, root: string): Array<string> => {
  const state = new Map<string, "open" | "done">()
  const cycles: Array<string> = []
  const visit = (file: string, path: Array<string>) => {
    if (state.get(file) === "done") return
    if (state.get(file) === "open") {
      cycles.push([...path.slice(path.indexOf(file)), file].map((f) => relative(root, f)).join(" -> "))
      return
    }
    state.set(file, "open")
    for (const target of graph.get(file) ?? []) visit(target, [...path, file])
    state.set(file, "done")
  }
  for (const file of graph.keys()) visit(file, [])
  return cycles
}
