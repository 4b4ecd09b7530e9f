/**
 * The parent side of the SIGKILL crash tests (`crashChild.ts` is the child's). Each round spawns the child on the
 * same directory, kills it after a seeded random delay counted from the spawn, from its `opening` line or from its
 * `ready` line, waits for it to exit and hands what it printed to the test's checker. The delays follow the measured
 * start-up and open times, so that each kind of kill keeps happening on a slower or faster machine. Kill timing is
 * real time: a seed fixes the schedule, not the exact instants the kills land. `killTests` registers a crash test's
 * tests: the rounds on each backend, and the checker's self-test against deliberately torn children.
 */
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, it } from "@effect/vitest"
import { Data, Effect, type Scope } from "effect"
import { type ChildHarness, type HarnessError, runChild } from "./childRun.js"
import { BACKENDS, type BackendName } from "./crashChild.js"
import type { NodeRunner } from "./nodeRunner.js"
import { below } from "./prng.js"

/** How long the child may take from its spawn to `ready`, and to exit after SIGKILL. */
const READY_TIMEOUT_MS = 20_000
const EXIT_TIMEOUT_MS = 10_000

/** When to send SIGKILL: `delayMs` after the spawn, after the child printed `opening`, or after `ready`. */
export interface KillPlan {
  readonly from: "spawn" | "opening" | "ready"
  readonly delayMs: number
}

/**
 * The shares of the kill plans, as thresholds on one draw in [0, 1): below `spawn` from the spawn (most land while
 * Node loads the program), below `opening` from `opening` (most land while the database opens: log recovery,
 * flushes), below `ready` at `ready` at once, the rest 0 to `maxRunMs` after `ready` (while the child writes).
 */
export interface KillMix {
  readonly spawn: number
  readonly opening: number
  readonly ready: number
  readonly maxRunMs: number
}

/** What the child printed in a round. */
export interface KillRoundOutcome<R> {
  /** It printed `opening`: it had loaded and was opening the database. */
  readonly opening: boolean
  /** From `opening` to `ready`: how long the database took to open. */
  readonly openMs: number | undefined
  readonly spawnToReadyMs: number | undefined
  /** The fields of its `ready` line, parsed by the test; `undefined` when it was killed before. */
  readonly ready: R | undefined
  /** The `n` of its last `w <n>` line: the last step it acknowledged. */
  readonly lastAcked: number | undefined
}

/** Where the kills landed. */
export interface KillTally {
  /** Before the child started opening the database (while Node loaded the program). */
  readonly killsWhileLoading: number
  /** While the database was opening (log recovery, compaction of the log on open). */
  readonly killsDuringOpen: number
  /** After `ready`, while the child's loop ran. */
  readonly killsMidRun: number
}

/** Where the time went, in whole milliseconds. */
export interface KillTiming {
  readonly wallMs: number
  readonly meanRoundMs: number
  readonly meanSpawnToReadyMs: number
  /** In the child, from `opening` to `ready`. */
  readonly meanOpenMs: number
}

/**
 * The error class of the properties a test's rounds find broken, with `kind` one of `K` and the message
 * `round <round>: <kind>: <detail>`: `class Violation extends RoundViolation<ViolationKind>() {}`.
 */
export const RoundViolation = <K extends string>() =>
  class extends Data.TaggedError("Violation")<{
    readonly kind: K
    readonly round: number
    readonly detail: string
  }> {
    override get message() {
      return `round ${this.round}: ${this.kind}: ${this.detail}`
    }
  }

/** A round for the test's checker: its number and plan, what the child printed, how to report a violation. */
export interface KillRound<R, K extends string, V> {
  readonly round: number
  readonly plan: KillPlan
  readonly outcome: KillRoundOutcome<R>
  /** The violation of `kind` in this round, the plan added to `detail`. */
  readonly violation: (kind: K, detail: string) => V
}

export interface KillRoundsResult<V> {
  readonly rounds: number
  readonly kills: KillTally
  readonly timing: KillTiming
  /** The first violation found; the rounds stopped there. */
  readonly violation: V | undefined
}

/** One round: spawn the child, kill it as `plan` says (or fail if it prints no `ready` in time), wait for its exit. */
const killRound = <R>(
  harness: ChildHarness,
  args: ReadonlyArray<string>,
  plan: KillPlan,
  parseReady: (fields: string) => R
) => {
  let opening = false
  let openingAt = 0
  let openMs: number | undefined
  let spawnToReadyMs: number | undefined
  let ready: R | undefined
  let lastAcked: number | undefined
  return runChild<KillRoundOutcome<R>>({
    label: "child",
    harness,
    args,
    exitTimeoutMs: EXIT_TIMEOUT_MS,
    // The lines are ASCII; latin1 decodes any byte on its own, even in a line cut short by the kill.
    encoding: "latin1",
    onStart: (control) => {
      if (plan.from === "spawn") control.killAfter(plan.delayMs)
      control.after(READY_TIMEOUT_MS, () => {
        if (ready === undefined && !control.killed()) {
          control.fail(`the child printed no "ready" within ${READY_TIMEOUT_MS} ms`)
        }
      })
    },
    onLine: (line, control) => {
      if (line.startsWith("w ")) {
        lastAcked = Number(line.slice(2))
      } else if (line === "opening") {
        opening = true
        openingAt = performance.now()
        if (plan.from === "opening") control.killAfter(plan.delayMs)
      } else if (line.startsWith("ready ")) {
        ready = parseReady(line.slice(6))
        spawnToReadyMs = control.elapsed()
        openMs = performance.now() - openingAt
        if (plan.from === "ready") control.killAfter(plan.delayMs)
      }
    },
    onExit: ({ code, signal, killed }) =>
      killed
        ? { outcome: { opening, openMs, spawnToReadyMs, ready, lastAcked } }
        : { failure: `the child exited by itself (code ${code}, signal ${signal}) before it was killed` }
  })
}

/**
 * Runs kill rounds until `rounds` are done, `budgetMs` of wall time is spent (no limit when absent) or `check`
 * reports a violation. Each round draws its plan from `schedule` and `mix` (with `fromReadyOnly`, every kill lands
 * 0 to `maxRunMs` after `ready` and no draw picks the kind), runs the child with `args()` (asked anew each round),
 * and hands the round to `check`. Harness problems fail the effect; a violation is returned in the result.
 */
export const killRounds = <R, K extends string, V, E, Env>(options: {
  readonly harness: ChildHarness
  readonly rounds: number
  readonly budgetMs?: number
  readonly schedule: () => number
  readonly mix: KillMix
  readonly fromReadyOnly?: boolean
  readonly args: () => ReadonlyArray<string>
  /** The fields of the child's `ready <fields>` line. */
  readonly parseReady: (fields: string) => R
  readonly Violation: new (fields: { readonly kind: K; readonly round: number; readonly detail: string }) => V
  readonly check: (round: KillRound<R, K, V>) => Effect.Effect<V | undefined, E, Env>
}): Effect.Effect<KillRoundsResult<V>, E | HarnessError, Env> =>
  Effect.gen(function* () {
    const { schedule, mix } = options
    const budgetMs = options.budgetMs ?? Number.POSITIVE_INFINITY
    const started = performance.now()
    let rounds = 0
    const kills = { killsWhileLoading: 0, killsDuringOpen: 0, killsMidRun: 0 }
    let readyMsTotal = 0
    let openMsTotal = 0
    let readyCount = 0
    let violation: V | undefined

    while (rounds < options.rounds && violation === undefined) {
      if (performance.now() - started > budgetMs) break
      const round = rounds
      rounds++
      const meanReady = readyCount === 0 ? 200 : readyMsTotal / readyCount
      const meanOpen = readyCount === 0 ? 20 : openMsTotal / readyCount
      const r = options.fromReadyOnly === true ? 1 : schedule()
      const plan: KillPlan =
        r < mix.spawn
          ? { from: "spawn", delayMs: below(schedule, Math.max(10, Math.round(meanReady - meanOpen))) }
          : r < mix.opening
            ? { from: "opening", delayMs: below(schedule, Math.max(2, Math.round(meanOpen * 1.5))) }
            : r < mix.ready
              ? { from: "ready", delayMs: 0 }
              : { from: "ready", delayMs: below(schedule, mix.maxRunMs + 1) }
      const outcome = yield* killRound(options.harness, options.args(), plan, options.parseReady)
      if (outcome.spawnToReadyMs !== undefined && outcome.openMs !== undefined) {
        readyMsTotal += outcome.spawnToReadyMs
        openMsTotal += outcome.openMs
        readyCount++
      }
      if (outcome.ready !== undefined) kills.killsMidRun++
      else if (outcome.opening) kills.killsDuringOpen++
      else kills.killsWhileLoading++
      violation = yield* options.check({
        round,
        plan,
        outcome,
        violation: (kind, detail) =>
          new options.Violation({ kind, round, detail: `${detail} [plan ${JSON.stringify(plan)}]` })
      })
    }

    const wallMs = performance.now() - started
    return {
      rounds,
      kills,
      timing: {
        wallMs: Math.round(wallMs),
        meanRoundMs: Math.round(wallMs / Math.max(1, rounds)),
        meanSpawnToReadyMs: Math.round(readyMsTotal / Math.max(1, readyCount)),
        meanOpenMs: Math.round(openMsTotal / Math.max(1, readyCount))
      },
      violation
    }
  })

/** A fresh directory under the system's temporary one, removed when the scope closes. */
export const tempDirectory = (prefix: string): Effect.Effect<string, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.promise(() => mkdtemp(join(tmpdir(), prefix))),
    (directory) => Effect.promise(() => rm(directory, { recursive: true, force: true }))
  )

/** A summary as one line of JSON, its violation (if any) by its message. */
export const showSummary = (summary: { readonly violation?: { readonly message: string } | undefined }): string => {
  const { violation, ...rest } = summary
  return JSON.stringify(violation === undefined ? rest : { ...rest, violation: violation.message })
}

/** What `killTests` reads of a violation. */
interface Reported {
  readonly kind: string
  readonly message: string
}

/** What a crash test's summary of its rounds on one backend starts with; `killTests` reads it. */
export interface KillSummary<V extends Reported = Reported> extends KillTally, KillTiming {
  readonly backend: BackendName
  readonly runner: NodeRunner["kind"]
  readonly seed: number
  readonly rounds: number
  readonly violation: V | undefined
}

/**
 * Registers, in the current `describe`, the tests of a crash test on each of `BACKENDS`: `title(backend)` runs
 * `rounds` kills, fails on a violation, then `progress` checks that the rounds did enough (so that the test cannot
 * pass vacuously; `context` is for its messages); `tornTitle(backend, torn)` runs up to `tornRounds` kills of each
 * deliberately torn child and requires the checker to report a `mismatch`. The lines they print start with `name`,
 * and every failure names the backend and `rerun` (how to replay the seed).
 */
export const killTests = <T extends string, S extends KillSummary>(options: {
  readonly name: string
  readonly harness: ChildHarness
  readonly tornModes: ReadonlyArray<T>
  readonly rounds: number
  readonly tornRounds: number
  readonly timeoutMs: (rounds: number) => number
  readonly rerun: string
  readonly title: (backend: BackendName) => string
  readonly tornTitle: (backend: BackendName, torn: T) => string
  /** What a torn child is, in the self-test's failure ("writer", "log"). */
  readonly tornChild: string
  readonly loop: (backend: BackendName, rounds: number, torn: T | undefined) => Effect.Effect<S, HarnessError>
  readonly progress: (summary: S, context: string) => void
}): void => {
  const { name, rerun } = options
  for (const backend of BACKENDS) {
    it.live(
      options.title(backend),
      () =>
        Effect.gen(function* () {
          console.log(`${name} ${backend}: ${options.rounds} kills, runner ${options.harness.runner.kind}, ${rerun}`)
          const s = yield* options.loop(backend, options.rounds, undefined)
          console.log(`${name} ${showSummary(s)}`)
          const context = `${backend}, ${rerun}\n${showSummary(s)}`
          if (s.violation !== undefined) assert.fail(`${s.violation.message}\n${context}`)
          options.progress(s, context)
        }).pipe(Effect.mapError((e) => new Error(`${e.message}\n${backend}, ${rerun}`))),
      options.timeoutMs(options.rounds)
    )
  }

  for (const backend of BACKENDS) {
    for (const torn of options.tornModes) {
      it.live(
        options.tornTitle(backend, torn),
        () =>
          Effect.gen(function* () {
            const s = yield* options.loop(backend, options.tornRounds, torn)
            console.log(`${name} --torn=${torn} ${showSummary(s)}`)
            assert.isDefined(
              s.violation,
              `a torn ${options.tornChild} survived ${s.rounds} kills undetected (${rerun})`
            )
            assert.strictEqual(s.violation?.kind, "mismatch", `${s.violation?.message} (${rerun})`)
          }).pipe(Effect.mapError((e) => new Error(`${e.message}\n${backend}, ${rerun}`))),
        options.timeoutMs(options.tornRounds)
      )
    }
  }
}
