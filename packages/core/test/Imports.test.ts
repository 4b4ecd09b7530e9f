/**
 * No package's source imports in a cycle: a protocol never imports its memory layer (the memory layer imports the
 * protocol), and no two modules lean on each other. Read from the files, so a new cycle anywhere fails here.
 */
import { readdirSync } from "node:fs"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { cyclesIn, graphOf } from "../../../scripts/test-support/imports.js"

const repo = fileURLToPath(new URL("../../../", import.meta.url))
const sources = ["packages", "apps"].flatMap((top) =>
  readdirSync(join(repo, top), { withFileTypes: true })
    .filter((e) => e.isDirectory())
    .map((e) => join(repo, top, e.name, "src"))
)

describe("the workspace's imports", () => {
  for (const src of sources) {
    it(`no cycle between the files of ${src.slice(repo.length)}`, () => {
      const graph = graphOf(src)
      assert.isAbove(graph.size, 0)
      assert.deepStrictEqual(cyclesIn(graph, repo), [])
    })
  }

  it("the memory layers import their protocols, never the other way round", () => {
    const graph = graphOf(join(repo, "packages/core/src"))
    const core = (f: string) => join(repo, "packages/core/src", f)
    for (const protocol of ["Log.ts", "Coordination.ts", "Store.ts"]) {
      const imports = graph.get(core(protocol)) ?? []
      assert.isFalse(
        imports.some((i) => i.includes("/internal/memory") || i.includes("/Memory")),
        `${protocol} imports ${imports.join(", ")}`
      )
    }
    assert.include(graph.get(core("MemoryLog.ts")) ?? [], core("Log.ts"))
  })
})
