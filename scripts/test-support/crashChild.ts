/**
 * The child side of the SIGKILL crash tests (`killRounds.ts` is the parent's): the backends, the command line
 * `<level|rocksdb> <directory> <seed> <number>… [--torn=<mode>]`, the lines the child prints on stdout (`opening`
 * before it opens the database, `ready …` once it is open, `w <n>` after step n was acknowledged), opening the store,
 * and the `main` that runs its loop until the parent kills it.
 */
import { realpathSync } from "node:fs"
import { pathToFileURL } from "node:url"
import { Effect, type Scope } from "effect"

/** The backends the crash tests run on. */
export type BackendName = "level" | "rocksdb"
export const BACKENDS: ReadonlyArray<BackendName> = ["level", "rocksdb"]

/**
 * What the crash tests use of a store adapter module (`@strata/store-adapters/level`, `/rocksdb`), by its shape:
 * `Id`, `P` and `E` are `StoreId`, `PartitionStore` and `StoreError` (this folder depends on no workspace package).
 */
export interface StoreAdapter<Id, P, E> {
  readonly make: (options: {
    readonly directory: string
  }) => Effect.Effect<{ readonly open: (id: Id) => Effect.Effect<P, E, Scope.Scope> }, E, Scope.Scope>
}

/**
 * The partition store `id` of the database in `directory`, closed with the scope: imports the adapter with `load`,
 * runs `opening` (a child's `report.opening`: it has loaded), then opens the database and the partition store.
 */
export const openPartition = <Id, P, E>(
  load: () => Promise<StoreAdapter<Id, P, E>>,
  directory: string,
  id: Id,
  opening: Effect.Effect<void> = Effect.void
): Effect.Effect<P, E, Scope.Scope> =>
  Effect.gen(function* () {
    const adapter = yield* Effect.promise(load)
    yield* opening
    const store = yield* adapter.make({ directory })
    return yield* store.open(id)
  })

/** A child's command line, parsed: `numbers` are the named non-negative integers after the seed. */
export interface ChildArgs<N extends string, T extends string> {
  readonly backend: BackendName
  readonly directory: string
  readonly seed: number
  readonly numbers: Readonly<Record<N, number>>
  /** The deliberately broken writer to be, for the checker's self-test. */
  readonly torn: T | undefined
}

/** The command line of a child, in the order `ChildArgs` parses it. */
export const childArgv = (options: {
  readonly backend: BackendName
  readonly directory: string
  readonly seed: number
  readonly numbers?: ReadonlyArray<number>
  readonly torn: string | undefined
}): Array<string> => [
  options.backend,
  options.directory,
  String(options.seed),
  ...(options.numbers ?? []).map(String),
  ...(options.torn === undefined ? [] : [`--torn=${options.torn}`])
]

/** Pipes are written synchronously on Linux, so a line printed is a line the parent will read even after SIGKILL. */
const say = (line: string) => Effect.sync(() => process.stdout.write(`${line}\n`))

/** The lines the parent reads: `opening`, `ready <fields>`, `w <n>`. */
export const report = {
  /** Before the child opens the database (it has loaded). */
  opening: say("opening"),
  /** Once the database is open: where the child starts and what it found, for the parent to check. */
  ready: (...fields: ReadonlyArray<number>) => say(`ready ${fields.join(" ")}`),
  /** After step `n` (a batch, an operation) was acknowledged. */
  acked: (n: number) => say(`w ${n}`)
}

/**
 * A child program's entry: when `url` (the caller's `import.meta.url`) is the program Node started, parses the
 * command line (usage and exit 2 when it is wrong) and runs the child's never-ending `loop` (named by `loopName` in
 * the message when it ends after all); it exits 1 if the loop ends or fails. Imported as a module, it does nothing.
 */
export const childMain = <const N extends string, T extends string, E>(
  url: string,
  options: {
    readonly program: string
    readonly numbers: ReadonlyArray<N>
    readonly tornModes: ReadonlyArray<T>
    readonly loopName: string
    readonly loop: (args: ChildArgs<N, T>) => Effect.Effect<unknown, E>
  }
): void => {
  const entry = process.argv[1]
  if (entry === undefined || pathToFileURL(realpathSync(entry)).href !== url) return
  const [backend, directory, seedText, ...rest] = process.argv.slice(2)
  const seed = Number(seedText)
  const texts = rest.slice(0, options.numbers.length)
  const flags = rest.slice(options.numbers.length)
  const numbers = texts.map(Number)
  const torn = options.tornModes.find((mode) => flags.length === 1 && flags[0] === `--torn=${mode}`)
  if (
    (backend !== "level" && backend !== "rocksdb") ||
    directory === undefined ||
    !Number.isSafeInteger(seed) ||
    texts.length < options.numbers.length ||
    !numbers.every((n) => Number.isSafeInteger(n) && n >= 0) ||
    (flags.length > 0 && torn === undefined)
  ) {
    const names = options.numbers.map((name) => ` <${name}>`).join("")
    process.stderr.write(
      `usage: ${options.program} <level|rocksdb> <directory> <seed>${names} [--torn=${options.tornModes.join("|")}]\n`
    )
    process.exit(2)
  }
  const args: ChildArgs<N, T> = {
    backend,
    directory,
    seed,
    numbers: Object.fromEntries(options.numbers.map((name, i) => [name, numbers[i]])) as Record<N, number>,
    torn
  }
  Effect.runPromise(options.loop(args)).then(
    () => {
      process.stderr.write(`child: the ${options.loopName} ended\n`)
      process.exit(1)
    },
    (error: unknown) => {
      process.stderr.write(`child: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`)
      process.exit(1)
    }
  )
}
