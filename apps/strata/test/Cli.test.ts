import { execFile } from "node:child_process"
import { fileURLToPath } from "node:url"
import { describe, expect, it } from "vitest"

const bin = fileURLToPath(new URL("../src/bin.ts", import.meta.url))
const tsx = fileURLToPath(new URL("../../../node_modules/.bin/tsx", import.meta.url))

const strata = (args: ReadonlyArray<string>) =>
  new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
    execFile(tsx, ["--conditions=@strata/source", bin, ...args], { timeout: 60_000 }, (error, stdout, stderr) => {
      resolve({ code: error ? (typeof error.code === "number" ? error.code : 1) : 0, stdout, stderr })
    })
  })

describe("strata CLI (a real child process)", () => {
  it("demo writes, restarts and restores the table", async () => {
    const r = await strata(["demo", "--partitions", "3", "--text", "one two two three three three"])
    expect(r.stderr).toBe("")
    expect(r.code).toBe(0)
    expect(r.stdout).toContain("Wrote 6 updates: 3 distinct words, 6 changelog records")
    expect(r.stdout).toContain("OK: all 3 words restored from 6 changelog records")
  })

  it("rejects a bad flag value with a message that names it", async () => {
    const r = await strata(["demo", "--partitions", "0"])
    expect(r.code).not.toBe(0)
    expect(`${r.stdout}${r.stderr}`).toMatch(/partitions/)
  })
})
