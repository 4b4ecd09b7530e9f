/**
 * The runnable examples the package READMEs show. A README shows an example file whole: a ```ts block whose
 * preceding paragraph links the file (`[`examples/quickstart.ts`](examples/quickstart.ts)`) holds the file's text, its
 * leading doc comment (how to run it from the repository) left out. The workspace test checks each such block against
 * its file, and the install test runs the blocks as a user who copied them would.
 */
import { readFileSync } from "node:fs"
import { dirname, resolve } from "node:path"

/** One example a README shows. */
export interface ReadmeExample {
  /** The README's path. */
  readonly readme: string
  /** The example file the block shows, resolved against the README's directory. */
  readonly file: string
  /** The block's text, as a user copies it. */
  readonly code: string
}

const BLOCK = /^```ts\n([\s\S]*?)^```$/gm
const LINK = /\]\(([^)\s]+\.ts)\)/

/** The examples the README at `readme` shows, in order: the ```ts blocks right after a paragraph linking a `.ts` file. */
export const readmeExamples = (readme: string): ReadonlyArray<ReadmeExample> => {
  const text = readFileSync(readme, "utf8")
  const out: Array<ReadmeExample> = []
  for (const match of text.matchAll(BLOCK)) {
    const before = text.slice(0, match.index).trimEnd()
    const paragraph = before.slice(before.lastIndexOf("\n\n") + 2)
    const link = LINK.exec(paragraph)
    if (link === null) continue
    out.push({ readme, file: resolve(dirname(readme), link[1]!), code: match[1]! })
  }
  return out
}

/** An example file's text as its README shows it: the leading doc comment and the blank lines after it dropped. */
export const exampleBody = (file: string): string =>
  readFileSync(file, "utf8")
    .replace(/^\/\*\*[\s\S]*?\*\/\n/, "")
    .replace(/^\n+/, "")
