/**
 * The CLI's settings for a secured etcd (`etcds://`, `coordinationCa`/`Cert`/`Key` files, `coordinationUsername` and
 * `$STRATA_COORDINATION_PASSWORD`), against an etcd of the test's own that requires client certificates and
 * passwords: an operator's command works with them, fails in one line without the password or the certificate, and
 * never prints the password.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { securedEtcd } from "../../../scripts/test-support/securedEtcd.js"
import { cli } from "./support/cliRun.js"
import { cliProcesses } from "./support/clusterTest.js"

const processes = cliProcesses()
const etcd = securedEtcd("etcd-cli-pass-91b2")
let endpoint = ""
beforeAll(async () => {
  endpoint = await etcd.start()
}, 60_000)
afterAll(() => etcd.stop())

/** `strata cluster status` with the secured etcd's settings, `env` over them, the variables of `omit` left out. */
const run = (env: Record<string, string>, omit: ReadonlyArray<string> = []) => {
  const all: Record<string, string> = {
    ...(process.env as Record<string, string>),
    STRATA_COORDINATION: endpoint.replace("https://", "etcds://"),
    STRATA_NAMESPACE: "/etcd-cli",
    STRATA_COORDINATION_CA: etcd.file("ca.pem"),
    STRATA_COORDINATION_CERT: etcd.file("client.pem"),
    STRATA_COORDINATION_KEY: etcd.file("client-key.pem"),
    STRATA_COORDINATION_USERNAME: "strata",
    STRATA_COORDINATION_PASSWORD: etcd.password,
    ...env
  }
  for (const name of omit) delete all[name]
  return cli(processes.runner(), ["cluster", "status"], all).exited
}

describe("the CLI on an etcd with client certificates and passwords", () => {
  it("reaches it with the settings; a wrong password or no client certificate fails; the password is printed nowhere", async () => {
    const ok = await run({})
    // No coordinator leads this namespace: the command read the cluster, says so and fails, as on any backend.
    expect(ok.stderr).toContain("no coordinator leads the cluster")
    const wrong = await run({ STRATA_COORDINATION_PASSWORD: "wrong-pass-3c" })
    expect(wrong.code).toBe(1)
    expect(wrong.stderr).toMatch(/not authorized/i)
    const noCert = await run({}, ["STRATA_COORDINATION_CERT", "STRATA_COORDINATION_KEY"])
    expect(noCert.code).toBe(1)
    expect(noCert.stderr).toMatch(/cannot reach/)
    for (const r of [ok, wrong, noCert]) {
      expect(r.stdout + r.stderr).not.toContain(etcd.password)
      expect(r.stdout + r.stderr).not.toContain("wrong-pass-3c")
    }
  })
})
