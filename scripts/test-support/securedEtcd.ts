/**
 * An etcd of a test's own that requires TLS with client certificates (`--client-cert-auth`) and password
 * authentication (`auth enable`), on certificates made with openssl for it, started from the etcd binary that
 * `scripts/services` installs. User `strata` (role root) has `password`.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import net from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { makeCa } from "./certificates.js"

/** The etcd: start it (its https endpoint), its files, and stop it. */
export interface SecuredEtcd {
  readonly password: string
  /** A file of its directory: `ca.pem`, `client.pem`, `client-key.pem`. */
  readonly file: (name: string) => string
  /** A file's PEM text. */
  readonly pem: (name: string) => string
  /** Makes the certificates, starts etcd, adds the users and enables auth; its client URL. */
  readonly start: () => Promise<string>
  readonly stop: () => void
}

const freePort = () =>
  new Promise<number>((done) => {
    const server = net.createServer()
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as net.AddressInfo).port
      server.close(() => done(port))
    })
  })

/** A secured etcd, not started yet. */
export const securedEtcd = (password = "etcd-pass-5e1d"): SecuredEtcd => {
  const dir = mkdtempSync(join(tmpdir(), "strata-etcd-tls-"))
  const file = (name: string) => join(dir, name)
  let child: ChildProcess | undefined
  let endpoint = ""
  const certificates = () => {
    const ca = makeCa(dir, "strata etcd test CA")
    ca.issue("server", { cn: "127.0.0.1", ips: ["127.0.0.1"] })
    ca.issue("client", { cn: "strata-client", usage: "clientAuth" })
  }
  const etcdctl = (args: ReadonlyArray<string>) =>
    execFileSync(
      "etcdctl",
      [
        `--endpoints=${endpoint}`,
        `--cacert=${file("ca.pem")}`,
        `--cert=${file("client.pem")}`,
        `--key=${file("client-key.pem")}`,
        "--dial-timeout=2s",
        ...args
      ],
      { env: { ...process.env, ETCDCTL_API: "3" }, stdio: "pipe", encoding: "utf8" }
    )
  return {
    password,
    file,
    pem: (name) => readFileSync(file(name), "utf8"),
    start: async () => {
      certificates()
      const [client, peer] = [await freePort(), await freePort()]
      endpoint = `https://127.0.0.1:${client}`
      child = spawn(
        "etcd",
        [
          "--name=secure",
          `--data-dir=${file("data")}`,
          `--listen-client-urls=${endpoint}`,
          `--advertise-client-urls=${endpoint}`,
          `--listen-peer-urls=http://127.0.0.1:${peer}`,
          `--initial-advertise-peer-urls=http://127.0.0.1:${peer}`,
          `--initial-cluster=secure=http://127.0.0.1:${peer}`,
          `--cert-file=${file("server.pem")}`,
          `--key-file=${file("server-key.pem")}`,
          "--client-cert-auth",
          `--trusted-ca-file=${file("ca.pem")}`
        ],
        { stdio: "ignore" }
      )
      const deadline = Date.now() + 30_000
      for (;;) {
        try {
          etcdctl(["endpoint", "health"])
          break
        } catch (e) {
          if (Date.now() > deadline) throw e
          await new Promise((r) => setTimeout(r, 200))
        }
      }
      etcdctl(["user", "add", "root:root-pass", "--interactive=false"])
      etcdctl(["user", "grant-role", "root", "root"])
      etcdctl(["user", "add", `strata:${password}`, "--interactive=false"])
      etcdctl(["user", "grant-role", "strata", "root"])
      etcdctl(["auth", "enable"])
      return endpoint
    },
    stop: () => {
      child?.kill("SIGKILL")
      rmSync(dir, { recursive: true, force: true })
    }
  }
}
