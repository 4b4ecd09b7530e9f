// Shared helpers of the benchmarks (docs/ARCHITECTURE.md, "Benchmarks"): one JSON line per figure, measured against a baseline run in
// the same process on the same data, repetitions interleaved and summarised by their median. No assertions here.
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

/** One figure, printed as one JSON line and kept in `bench/results/<name>.json`. */
export interface Figure {
  readonly bench: string
  readonly value: number
  readonly unit: string
  readonly baseline?: number
  readonly ratio?: number
  readonly [extra: string]: unknown
}

/** What a benchmark module returns: its figures and anything worth keeping next to them in the results file. */
export interface BenchOutput {
  readonly results: ReadonlyArray<Figure>
  readonly details?: Record<string, unknown>
}

/** The median of some samples (the mean of the two middle ones for an even count). */
export const median = (samples: ReadonlyArray<number>): number => {
  if (samples.length === 0) return Number.NaN
  const sorted = [...samples].sort((a, b) => a - b)
  const mid = sorted.length >> 1
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

/** Rounds to 3 significant digits, enough for figures that drift by a few percent between runs. */
export const round3 = (x: number): number => (Number.isFinite(x) ? Number(x.toPrecision(3)) : x)

/** Runs `f` in a fresh temporary directory and removes the directory afterwards, whatever happens. */
export const withTempDir = async <A>(label: string, f: (dir: string) => Promise<A>): Promise<A> => {
  const dir = mkdtempSync(join(tmpdir(), `strata-bench-${label}-`))
  try {
    return await f(dir)
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

/** Collects garbage between runs when node runs with `--expose-gc`, so one run's garbage is not billed to the next. */
export const collectGarbage = (): void => {
  const gc = (globalThis as { gc?: () => void }).gc
  if (gc !== undefined) gc()
}

/**
 * A variable of the environment. Benchmarks run outside turbo (`./dev bench`), so the variables they read are not
 * task inputs of turbo.json.
 */
export const envString = (name: string): string | undefined => process.env[name]

/** A positive integer from the environment, or the default. */
export const envInt = (name: string, fallback: number): number => {
  const raw = envString(name)
  if (raw === undefined || raw === "") return fallback
  const n = Number(raw)
  if (!Number.isSafeInteger(n) || n <= 0)
    throw new Error(`${name} must be a positive integer, got ${JSON.stringify(raw)}`)
  return n
}

/** Writes a progress line to stderr (stdout carries only the JSON figures). */
export const progress = (message: string): void => {
  process.stderr.write(`[bench] ${message}\n`)
}

/** A deterministic byte generator (xorshift32), so every run of a bench writes the same bytes. */
export const randomBytes = (n: number, seed: number): Buffer => {
  const out = Buffer.allocUnsafe(n)
  let x = seed >>> 0 || 1
  for (let i = 0; i < n; i++) {
    x ^= x << 13
    x ^= x >>> 17
    x ^= x << 5
    out[i] = x & 0xff
  }
  return out
}
