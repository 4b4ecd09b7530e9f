import { existsSync, readdirSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { exampleBody, readmeExamples } from "../scripts/test-support/readmeExamples.js"

const root = join(import.meta.dirname, "..")

/** The workspace's public packages' directories (what `scripts/release-check` publishes). */
const publicPackages = ["packages", "apps"].flatMap((parent) =>
  readdirSync(join(root, parent))
    .map((name) => join(root, parent, name))
    .filter((dir) => existsSync(join(dir, "package.json")))
    .filter((dir) => JSON.parse(readFileSync(join(dir, "package.json"), "utf8")).private !== true)
)

describe("the README examples", () => {
  it("finds the public packages", () => {
    expect(publicPackages.length).toBeGreaterThanOrEqual(9)
  })

  for (const dir of publicPackages) {
    const name = dir.slice(root.length + 1)
    it(`${name}: every example shown is its file's text, and a library's README shows one`, () => {
      const examples = readmeExamples(join(dir, "README.md"))
      const library = JSON.parse(readFileSync(join(dir, "package.json"), "utf8")).exports?.["."] !== undefined
      if (library) expect(examples.length, `${name}/README.md shows no runnable example`).toBeGreaterThan(0)
      for (const example of examples) {
        expect(existsSync(example.file), `${example.file} (linked from ${name}/README.md)`).toBe(true)
        expect(example.code, `${name}/README.md's block for ${example.file}`).toBe(exampleBody(example.file))
      }
    })
  }
})
