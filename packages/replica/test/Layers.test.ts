/**
 * The package's source is in layers whose imports point only down (docs/ARCHITECTURE.md, "Replication"):
 * `protocol/` (core-level: the tablet server's service and its Schemas) < `machines/` < `wire/` < `server/`, `client/` (beside each other) < `node/`, `log/` < the package's entry points.
 * Read from the files themselves, so a new upward import, a sideways one or a cycle fails here.
 */
import { readFileSync } from "node:fs"
import { dirname, join, relative, sep } from "node:path"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { cyclesIn, graphOf } from "../../../scripts/test-support/imports.js"

const src = join(dirname(fileURLToPath(import.meta.url)), "..", "src")
const rank: Record<string, number> = { protocol: 0, machines: 1, wire: 2, server: 3, client: 3, node: 4, log: 4 }

const graph = graphOf(src)
/** The folder a file is in, `""` for the package's entry points (`index.ts`, `log/index.ts` counts as `log`). */
const layerOf = (file: string) => {
  const parts = relative(src, file).split(sep)
  return parts.length > 1 ? parts[0]! : ""
}

describe("@strata/replica's layers", () => {
  it("every folder is a known layer and every import resolves to a source file", () => {
    for (const [file, imports] of graph) {
      const layer = layerOf(file)
      assert.isTrue(layer === "" || layer in rank, `${relative(src, file)}: ${layer} is not a layer`)
      for (const target of imports) assert.isTrue(graph.has(target), `${relative(src, file)} imports ${target}`)
    }
    assert.isAbove(graph.size, 30)
  })

  it("imports point only down: never up, never between server/ and client/ or node/ and log/", () => {
    const wrong: Array<string> = []
    for (const [file, imports] of graph) {
      const from = layerOf(file)
      for (const target of imports) {
        const to = layerOf(target)
        if (from === to || from === "") continue
        if (to === "" || rank[to]! >= rank[from]!) wrong.push(`${relative(src, file)} -> ${relative(src, target)}`)
      }
    }
    assert.deepStrictEqual(wrong, [])
  })

  it("no cycle between files", () => {
    assert.deepStrictEqual(cyclesIn(graph, src), [])
  })

  it("the machines are pure: no Effect services, no Node built-ins", () => {
    for (const [file] of graph) {
      if (layerOf(file) !== "machines") continue
      const text = readFileSync(file, "utf8")
      const fromEffect = [...text.matchAll(/import\s+(type\s+)?\{([^}]*)\}\s+from\s+"effect"/g)]
        .filter((m) => m[1] === undefined)
        .flatMap((m) => m[2]!.split(",").map((s) => s.trim()))
        .filter((s) => s !== "" && !s.startsWith("type "))
      assert.deepStrictEqual(
        fromEffect.filter((s) => !["Result", "Schema"].includes(s)),
        [],
        `${relative(src, file)} imports Effect runtime modules`
      )
      assert.notMatch(text, /from\s+"node:/, `${relative(src, file)} imports a Node built-in`)
    }
  })
})
