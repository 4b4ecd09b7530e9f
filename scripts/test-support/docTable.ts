/**
 * Reads the transition table a state machine's module comment documents (between `<!-- transitions -->` and
 * `<!-- /transitions -->`), as its row lines, so a test can compare it with the rows it renders from `step`.
 */
import { readFileSync } from "node:fs"

/** The documented rows of the module at `url`, header and separator left out. */
export const documentedRows = (url: URL): ReadonlyArray<string> => {
  const source = readFileSync(url, "utf8")
  const block = /<!-- transitions -->([\s\S]*?)<!-- \/transitions -->/.exec(source)?.[1] ?? ""
  return block
    .split("\n")
    .map((l) => l.replace(/^\s*\*\s?/, "").trim())
    .filter((l) => l.startsWith("|") && !l.startsWith("| from") && !l.startsWith("|---"))
}
