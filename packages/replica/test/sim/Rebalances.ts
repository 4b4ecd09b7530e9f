/**
 * The rebalance family (about a third of the seeds that do not move replica sets by hand; a generator of its own
 * draws everything): every coordinator runs the real `RebalanceService` (trigger and executor) after its controller,
 * over the real `RebalanceControl`, with settings the seed draws (batch ratio, per-server and cluster limits, move
 * timeout, throttle, whether the trigger starts rebalances by itself); at random steps the family asks the leading
 * coordinator's service to start a rebalance, pause, resume or cancel it. Every other fault of the seed meets it:
 * the controller failing over mid-rebalance, a server dying mid-batch (the gate must roll the batch back), an ISR
 * shrinking.
 *
 * Checked after every step: no server is touched by more moves at once than `maxConcurrentMigrations`, the cluster
 * has no more than `maxClusterMigrations` moving; a rebalance shown a tablet offline or under the minimum ISR in two
 * observations while it ran has stopped running (its gate failed); a rebalance paused (as seen twice in a row) has no
 * tablet moving. Once the faults stop and the cluster settled: a paused rebalance is resumed, and every rebalance
 * ends (completed or cancelled) within a bound, no tablet left moving.
 */
import { Models } from "@strata/core"
import { Executor, type RebalanceConfig, RebalanceService } from "@strata/rebalance"
import { Effect, Random } from "effect"
import type { Prng } from "../../../../scripts/test-support/prng.js"
import * as Clock from "../../../../scripts/test-support/sim/Clock.js"
import { Coordinator } from "@strata/election"
import type * as Controller from "../../src/server/Controller.js"
import * as RebalanceControl from "../../src/server/RebalanceControl.js"
import * as Audit from "./Audit.js"
import { log, now, paths, type Proc, tally, type World } from "./World.js"

/** What the family records as it goes: the observations each coordinator's executor was given, its status seen. */
export interface Watch {
  /** Each coordinator's observations: when, and why the cluster was unhealthy then (tablets offline or under min ISR). */
  readonly observed: Map<string, Array<{ readonly atMs: number; readonly sick: string | undefined }>>
  /** Each coordinator's last statuses, newest last (a few). */
  readonly statuses: Map<string, Array<RebalanceService.Status>>
  readonly violations: Array<string>
}

/** A fresh watch. */
export const makeWatch = (): Watch => ({ observed: new Map(), statuses: new Map(), violations: [] })

/** Tablets offline or under the minimum ISR in an observation: the part of the gate the checker judges by. */
const sickness = (o: Executor.Observation): string | undefined => {
  for (const t of o.tablets) {
    if (!t.online) return `${Models.tabletKey(t.tablet)} offline`
    if (t.isr.length < o.minInsyncReplicas) return `${Models.tabletKey(t.tablet)} with ISR [${t.isr.join(",")}]`
  }
  return undefined
}

/** `control` with every observation it gives recorded for coordinator `p` (before any mutant of the executor). */
const watched = (w: World, p: Proc, control: RebalanceService.ClusterControl): RebalanceService.ClusterControl => ({
  ...control,
  observe: Effect.tap(control.observe, (o) =>
    Effect.sync(() => {
      const list = w.rebalances.observed.get(p.name) ?? []
      list.push({ atMs: now(w), sick: sickness(o) })
      if (list.length > 20) list.shift()
      w.rebalances.observed.set(p.name, list)
    })
  )
})

/**
 * The rebalance service coordinator `p` runs while it leads, after its controller, recorded as `p.rebalance`; the
 * variant's executor (a planted bug) when it has one; its ids drawn from the seed.
 */
export const service = (w: World, p: Proc, settings: RebalanceConfig.RebalanceConfig) =>
  Coordinator.service("rebalance", (leadership) =>
    Effect.acquireRelease(
      Effect.gen(function* () {
        const controller: Controller.ControllerShape | undefined = p.controller
        if (controller === undefined) return yield* Effect.die("the rebalance service starts after the controller")
        const made = yield* RebalanceService.make(leadership, {
          control: watched(w, p, RebalanceControl.make(controller, undefined, { healthTimeout: 300 })),
          root: paths.rebalance,
          config: settings,
          observeInterval: 100
        }).pipe(
          Effect.provideService(RebalanceService.Machine, w.variant.executor ?? Executor.step),
          Random.withSeed(w.seed * 131 + p.id * 7 + p.incarnation)
        )
        p.rebalance = made
        log(w, `${p.name} runs the rebalance service`)
        return made
      }),
      (made) =>
        Effect.sync(() => {
          if (p.rebalance === made) p.rebalance = undefined
        })
    )
  )

/** The coordinator whose rebalance service answers now (a running, unpaused leader's), if any. */
const leading = (w: World): Proc | undefined =>
  w.coordinators.find((p) => p.rebalance !== undefined && p.scope !== undefined && !p.paused)

/** One draw of the family: the leading service asked to start (most often), pause, resume or cancel. */
export const rebalanceFault = (w: World, rb: Prng) =>
  Effect.gen(function* () {
    const p = leading(w)
    if (p === undefined) return
    const service = p.rebalance!
    const action = rb.pick(["start", "start", "start", "pause", "resume", "resume", "cancel"] as const)
    tally(w, `rebalance-${action}`)
    const asked =
      action === "start"
        ? service.start()
        : action === "pause"
          ? service.pause
          : action === "resume"
            ? service.resume
            : service.cancel
    // The service may wait on its controller: asked in a fiber of its own, so the driver never waits on the clock.
    yield* Effect.forkIn(
      asked.pipe(
        Effect.tap((progress) =>
          Effect.sync(() => log(w, `${p.name} rebalance ${action}: ${progress.id} ${progress.phase}`))
        ),
        Effect.catch((e) => Effect.sync(() => log(w, `${p.name} rebalance ${action} refused: ${e.message}`)))
      ),
      w.root
    )
  })

/** Moving tablets per server they add a replica to or remove one from, and in all, as coordination holds them. */
const moving = (w: World) =>
  Effect.gen(function* () {
    const perServer = new Map<number, Array<string>>()
    let total = 0
    for (const tablet of w.cluster.tablets) {
      const meta = yield* Audit.readTablet(w, tablet)
      const r = meta?.reassignment
      if (r === undefined) continue
      total++
      const touched = [
        ...r.target.filter((s) => !r.original.includes(s)),
        ...r.original.filter((s) => !r.target.includes(s))
      ]
      for (const s of touched) perServer.set(s, [...(perServer.get(s) ?? []), Models.tabletKey(tablet)])
    }
    return { perServer, total }
  })

/** After every step: the limits, the gate, and a paused rebalance's tablets (see the module's description). */
export const sample = (w: World) =>
  Effect.gen(function* () {
    const settings = w.cluster.rebalanceSettings
    if (settings === undefined) return
    const { perServer, total } = yield* moving(w)
    for (const [server, tablets] of perServer)
      if (tablets.length > settings.maxConcurrentMigrations)
        w.rebalances.violations.push(
          `t=${now(w)} server ${server} is touched by ${tablets.length} moves at once (${tablets.join(", ")}), more than maxConcurrentMigrations ${settings.maxConcurrentMigrations}`
        )
    if (total > settings.maxClusterMigrations)
      w.rebalances.violations.push(
        `t=${now(w)} ${total} tablets move at once, more than maxClusterMigrations ${settings.maxClusterMigrations}`
      )
    for (const p of w.coordinators) {
      if (p.rebalance === undefined || p.paused) continue
      const status = yield* p.rebalance.status
      const seen = w.rebalances.statuses.get(p.name) ?? []
      seen.push(status)
      if (seen.length > 4) seen.shift()
      w.rebalances.statuses.set(p.name, seen)
      gateHeld(w, p, seen)
      if (total > 0) pausedStill(w, p, seen, perServer)
    }
  })

/**
 * The gate: a rebalance running (the same batch) over three samples while every observation its executor was given
 * since the first of them showed a tablet offline or under the minimum ISR, two of them at least, went on past its
 * gate.
 */
const gateHeld = (w: World, p: Proc, seen: ReadonlyArray<RebalanceService.Status>) => {
  if (seen.length < 3) return
  const last3 = seen.slice(-3)
  const r = last3.map((s) => s.rebalance)
  const same = r.every((x) => x !== undefined && x.phase === "running" && x.id === r[0]!.id && x.batch === r[0]!.batch)
  if (!same) return
  const since = last3[0]!.nowMs
  const shown = (w.rebalances.observed.get(p.name) ?? []).filter((o) => o.atMs > since)
  if (shown.length >= 2 && shown.every((o) => o.sick !== undefined))
    w.rebalances.violations.push(
      `t=${now(w)} ${p.name}'s rebalance ${r[0]!.id} went on running batch ${r[0]!.batch} though its last ${shown.length} observations showed ${shown[0]!.sick}`
    )
}

/** A rebalance paused (seen so twice in a row) has no tablet moving: its moves under way ended or were rolled back. */
const pausedStill = (
  w: World,
  p: Proc,
  seen: ReadonlyArray<RebalanceService.Status>,
  perServer: ReadonlyMap<number, ReadonlyArray<string>>
) => {
  const [before, last] = seen.slice(-2)
  const a = before?.rebalance
  const b = last?.rebalance
  if (a === undefined || b === undefined || a.id !== b.id || a.phase !== "paused" || b.phase !== "paused") return
  if (last!.nowMs - before!.nowMs < 200) return
  const tablets = [...new Set([...perServer.values()].flat())]
  if (tablets.length > 0)
    w.rebalances.violations.push(
      `t=${now(w)} ${p.name}'s rebalance ${b.id} is paused (${b.detail ?? ""}) with ${tablets.join(", ")} still moving`
    )
}

/**
 * Once the faults stopped and the cluster settled: the leading service's rebalance resumed if paused, then the clock
 * steps until it ends (completed or cancelled) within `boundMs`; whether it did (a violation recorded if not).
 */
export const finish = (w: World, boundMs = 20_000) =>
  Effect.gen(function* () {
    if (w.cluster.rebalanceSettings === undefined) return true
    for (let waited = 0; waited < boundMs; waited += w.config.stepMs) {
      const p = leading(w)
      const status = p === undefined ? undefined : yield* p.rebalance!.status
      const phase = status?.rebalance?.phase
      if (p !== undefined && (phase === undefined || phase === "completed" || phase === "cancelled")) {
        if (phase !== undefined) {
          const r = status!.rebalance!
          log(w, `rebalance ${r.id} ended ${phase}: ${r.movesDone} of ${r.movesTotal} moves done`)
          tally(w, `rebalance-ended-${phase}`)
          w.faultCounts["rebalance-moves-done"] = (w.faultCounts["rebalance-moves-done"] ?? 0) + r.movesDone
          w.faultCounts["rebalance-rollbacks"] = (w.faultCounts["rebalance-rollbacks"] ?? 0) + r.rollbacks
          w.faultCounts["rebalance-gate-failures"] = (w.faultCounts["rebalance-gate-failures"] ?? 0) + r.gateFailures
        }
        return true
      }
      if (p !== undefined && phase === "paused" && waited % 1_000 === 0) {
        tally(w, "rebalance-resume-quiet")
        yield* Effect.forkIn(Effect.ignore(p.rebalance!.resume), w.root)
      }
      yield* Clock.tick(w.clock)
      yield* sample(w)
    }
    const p = leading(w)
    const status = p === undefined ? undefined : yield* p.rebalance!.status
    w.rebalances.violations.push(
      `the rebalance did not end within ${boundMs} ms of the quiet cluster: ${JSON.stringify(status?.rebalance ?? "no leading service")}`
    )
    return false
  })

/** The family's violations for the judge. */
export const judge = (w: World): ReadonlyArray<string> => w.rebalances.violations.slice(0, 10)
