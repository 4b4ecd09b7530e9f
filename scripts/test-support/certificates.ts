/**
 * Certificates made with openssl for a test: a CA of its own in a directory, and certificates it signs (RSA 2048,
 * valid two days). Files are named `<name>.pem` and `<name>-key.pem`.
 */
import { execFileSync } from "node:child_process"
import { readFileSync, writeFileSync } from "node:fs"
import { join } from "node:path"

/** A CA in `directory`: its files, and certificates it signs. */
export interface TestCa {
  /** A file of the directory. */
  readonly file: (name: string) => string
  /** A file's PEM text. */
  readonly pem: (name: string) => string
  /**
   * Signs a certificate `name` for `cn`: with `ips` and `dns` as its subject alternative names, for `usage`
   * (`serverAuth,clientAuth` by default).
   */
  readonly issue: (
    name: string,
    options: {
      readonly cn: string
      readonly ips?: ReadonlyArray<string>
      readonly dns?: ReadonlyArray<string>
      readonly usage?: string
      /** How long it is valid, in days (2 by default; 0: it expires as it is made). */
      readonly days?: number
    }
  ) => void
}

/** Makes the CA `ca` (`ca.pem`, `ca-key.pem`) in `directory`, named `subject`. */
export const makeCa = (directory: string, subject: string, ca = "ca"): TestCa => {
  const file = (name: string) => join(directory, name)
  const openssl = (...args: Array<string>) => execFileSync("openssl", args, { cwd: directory, stdio: "ignore" })
  openssl(
    "req",
    "-x509",
    "-newkey",
    "rsa:2048",
    "-nodes",
    "-keyout",
    `${ca}-key.pem`,
    "-out",
    `${ca}.pem`,
    "-days",
    "2",
    "-subj",
    `/CN=${subject}`
  )
  return {
    file,
    pem: (name) => readFileSync(file(name), "utf8"),
    issue: (name, options) => {
      openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        `${name}-key.pem`,
        "-out",
        `${name}.csr`,
        "-subj",
        `/CN=${options.cn}`
      )
      const names = [...(options.ips ?? []).map((ip) => `IP:${ip}`), ...(options.dns ?? []).map((d) => `DNS:${d}`)]
      writeFileSync(
        file(`${name}.ext`),
        `${names.length === 0 ? "" : `subjectAltName=${names.join(",")}\n`}extendedKeyUsage=${options.usage ?? "serverAuth,clientAuth"}\n`
      )
      openssl(
        "x509",
        "-req",
        "-in",
        `${name}.csr`,
        "-CA",
        `${ca}.pem`,
        "-CAkey",
        `${ca}-key.pem`,
        "-CAcreateserial",
        "-out",
        `${name}.pem`,
        "-days",
        String(options.days ?? 2),
        "-extfile",
        `${name}.ext`
      )
    }
  }
}
