/**
 * The largest functions and closures in the packages' and the app's sources, by the lines they span (nested
 * functions included), largest first: `./dev sizes` (`./dev sizes 25` for more rows, `--tests` to include test
 * files). Read from the formatted source (Biome's layout): a function is a declaration (`const x = (…) =>`,
 * `function x(`, a method, or a property `x: (…) =>`) whose first lines hold `=>` or `function`, and it spans down
 * to the line before the next one indented no deeper that does not close a bracket it opened. The conformance
 * suites are marked: they are the one place long bodies are expected.
 */
import { readdirSync, readFileSync } from "node:fs"
import { join, relative } from "node:path"

const root = join(import.meta.dirname, "..")
const rows = Number(process.argv.find((a) => /^\d+$/.test(a)) ?? 10)
const withTests = process.argv.includes("--tests")

const walk = (dir: string): Array<string> =>
  readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    if (e.name === "node_modules" || e.name === "dist") return []
    const path = join(dir, e.name)
    if (e.isDirectory()) return walk(path)
    return e.name.endsWith(".ts") && !e.name.endsWith(".d.ts") ? [path] : []
  })
const files = [join(root, "packages"), join(root, "apps")]
  .flatMap(walk)
  .filter((f) => (withTests ? /\/(src|test)\//.test(f) : /\/src\//.test(f)))

const declaration =
  /^(\s*)(?:export\s+)?(?:(?:const|let)\s+(\w+)\s*[=:]|(?:async\s+)?function\*?\s+(\w+)|(?:readonly\s+)?(\w+)\s*(?::|\())/
/**
 * Whether the declaration starting `text` (its name ending at `from`) declares a function: `function`, or an arrow
 * `=>` outside any bracket the declaration opens (a nested arrow, in an argument or an object, does not count).
 */
const isFunction = (text: string, from: number): boolean => {
  if (/^\s*(export\s+)?(async\s+)?function/.test(text)) return true
  let depth = 0
  for (let k = from; k < text.length - 1; k++) {
    const c = text[k]!
    if (c === "(" || c === "[" || c === "{" || c === "<") depth++
    else if (c === ")" || c === "]" || c === "}" || (c === ">" && text[k - 1] !== "=")) depth--
    else if (c === "=" && text[k + 1] === ">" && depth === 0) return true
    else if (c === "\n" && depth === 0 && text[k - 1] !== "=" && text[k - 1] !== "(" && k > from + 1) {
      // A declaration whose first line is complete at depth 0 and does not end on `=` declares no function.
      if (!/[=(,:]\s*$/.test(text.slice(from, k))) return false
    }
    if (depth < 0) return false
  }
  return false
}
const indentOf = (line: string) => line.length - line.trimStart().length
const closes = (line: string) => /^[)\]}>]/.test(line.trimStart())

const found: Array<{ lines: number; where: string; name: string }> = []
for (const file of files) {
  const lines = readFileSync(file, "utf8").split("\n")
  lines.forEach((line, i) => {
    const m = declaration.exec(line)
    if (m === null || line.trimStart().startsWith("//") || line.trimStart().startsWith("*")) return
    const name = m[2] ?? m[3] ?? m[4]!
    if (["if", "for", "while", "switch", "return", "case", "catch"].includes(name)) return
    if (!isFunction(lines.slice(i, i + 40).join("\n"), m[0].length)) return
    const indent = indentOf(line)
    let end = i
    for (let j = i + 1; j < lines.length; j++) {
      const l = lines[j]!
      if (l.trim() === "") continue
      if (indentOf(l) > indent) {
        end = j
        continue
      }
      if (indentOf(l) === indent && closes(l)) {
        end = j
        continue
      }
      break
    }
    if (end > i) found.push({ lines: end - i + 1, where: `${relative(root, file)}:${i + 1}`, name })
  })
}
found.sort((a, b) => b.lines - a.lines)
for (const f of found.slice(0, rows)) {
  const suite = /Conformance/.test(f.where) ? " (conformance suite)" : ""
  console.log(`${String(f.lines).padStart(5)}  ${f.name}  ${f.where}${suite}`)
}
