import { execFile } from "node:child_process"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { describe, expect, inject, it } from "vitest"

const bin = fileURLToPath(new URL("../src/bin.ts", import.meta.url))
const tsx = fileURLToPath(new URL("../../../node_modules/.bin/tsx", import.meta.url))

const strata = (args: ReadonlyArray<string>, env: Record<string, string> = {}) =>
  new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
    execFile(
      tsx,
      ["--conditions=@strata/source", bin, ...args],
      { timeout: 90_000, env: { ...process.env, ...env } },
      (error, stdout, stderr) => {
        resolve({ code: error ? (typeof error.code === "number" ? error.code : 1) : 0, stdout, stderr })
      }
    )
  })

describe("strata demo on a real Kafka broker", () => {
  it("keeps the changelog on Kafka and restores the table from it, twice on the same topic", async () => {
    for (let run = 0; run < 2; run++) {
      const r = await strata(["demo", "--log", "kafka", "--brokers", inject("kafka"), "--partitions", "3"])
      expect(r.code).toBe(0)
      expect(r.stdout).toContain("on kafka")
      expect(r.stdout).toContain("OK: all 29 words restored from 53 changelog records")
    }
  })

  it("--brokers alone implies --log kafka", async () => {
    const r = await strata(["demo", "--brokers", inject("kafka"), "--partitions", "2", "--text", "a b b"])
    expect(r.stderr).toBe("")
    expect(r.code).toBe(0)
    expect(r.stdout).toContain("on kafka")
    expect(r.stdout).toContain("OK: all 2 words restored")
  })

  it("names the brokers when none answers, in one line without a stack trace", async () => {
    const r = await strata(["demo", "--log", "kafka", "--brokers", "127.0.0.1:1", "--partitions", "1"])
    expect(r.code).not.toBe(0)
    expect(r.stderr.trimEnd().split("\n"), r.stderr).toHaveLength(1)
    expect(r.stderr).not.toMatch(/^\s+at \S/m)
  })

  it("names the brokers when none answers", async () => {
    const r = await strata(["demo", "--log", "kafka", "--brokers", "127.0.0.1:1", "--partitions", "1"])
    expect(r.code).not.toBe(0)
    expect(`${r.stdout}${r.stderr}`).toContain("127.0.0.1:1")
  })

  it("runs on the broker's SASL_SSL listener with --kafka-ca, --kafka-sasl and --kafka-user, the password from the environment and printed nowhere", async () => {
    const dir = mkdtempSync(join(tmpdir(), "strata-kafka-ca-"))
    const caFile = join(dir, "ca.pem")
    writeFileSync(caFile, inject("kafkaCa"))
    const secure = ["demo", "--brokers", inject("kafkaSasl"), "--kafka-ca", caFile, "--partitions", "2"]
    try {
      const ok = await strata([...secure, "--kafka-sasl", "SCRAM-SHA-512", "--kafka-user", "strata"], {
        STRATA_KAFKA_PASSWORD: "strata-secret"
      })
      expect(ok.code, ok.stderr).toBe(0)
      expect(ok.stdout).toContain("OK: all 29 words restored")
      expect(`${ok.stdout}${ok.stderr}`).not.toContain("strata-secret")

      const wrong = await strata([...secure, "--kafka-sasl", "PLAIN", "--kafka-user", "strata", "--verbose"], {
        STRATA_KAFKA_PASSWORD: "wrong-pass-b41c"
      })
      expect(wrong.code).toBe(1)
      expect(wrong.stderr).toMatch(/^strata demo: authentication with brokers 127\.0\.0\.1:\d+ failed/)
      expect(`${wrong.stdout}${wrong.stderr}`).not.toContain("wrong-pass-b41c")

      const noPassword = await strata([...secure, "--kafka-sasl", "PLAIN", "--kafka-user", "strata"], {
        STRATA_KAFKA_PASSWORD: ""
      })
      expect(noPassword.code).toBe(2)
      expect(noPassword.stderr).toContain("STRATA_KAFKA_PASSWORD")
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
