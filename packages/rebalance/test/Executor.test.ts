/**
 * The executor against a model controller (moves take `moveMs`, a cancel puts a tablet back at once, a dead server
 * refuses moves onto it and leaves its tablets under-replicated): hand cases for batches, the gate, rollback, pause,
 * cancel, timeouts and a failover's recovery, then seeded runs drawing faults, checked for the invariants — the
 * per-server and cluster limits never exceeded, every rebalance ending with no tablet between replica sets, every
 * finished move at its target — and the makespan against its lower bound on scale-out shapes.
 *
 * - More runs: `STRATA_EXECUTOR_CASES=N`; one run: `STRATA_EXECUTOR_SEED=N`.
 */
import { assert, describe, it } from "@effect/vitest"
import { Models } from "@strata/core"
import { Schema } from "effect"
import { envInt, rerunCommand } from "../../../scripts/test-support/childRun.js"
import { type Prng, seeded } from "../../../scripts/test-support/prng.js"
import type { ClusterModel } from "../src/index.js"
import { Batches, Executor, type Planner, RebalanceConfig } from "../src/index.js"
import { FakeController, planOf, scaleOut } from "./support/fakeController.js"

const FILE = "packages/rebalance/test/Executor.test.ts"
const cases = envInt("STRATA_EXECUTOR_CASES", 300)
const only = process.env.STRATA_EXECUTOR_SEED === undefined ? undefined : Number(process.env.STRATA_EXECUTOR_SEED)

type Model = ClusterModel.ClusterModel

interface Run {
  state: Executor.State
  readonly fake: FakeController
  nowMs: number
  readonly log: Array<string>
  readonly ended: Array<string>
  /** Answers held back to arrive on a later tick (late answers). */
  readonly late: Array<{ atMs: number; input: Executor.Input }>
  persisted: Executor.State | undefined
  maxBusy: number
  maxCluster: number
}

const config = (overrides: RebalanceConfig.RebalanceConfigInput = {}) =>
  Schema.decodeUnknownSync(RebalanceConfig.RebalanceConfig)({ gateWindow: 2000, moveTimeout: 10_000, ...overrides })

const begin = (model: Model, overrides: RebalanceConfig.RebalanceConfigInput = {}): Run => {
  const plan = planOf(model)
  const state = Executor.start({
    id: "r1",
    reason: "manual",
    nowMs: 0,
    changes: plan.changes,
    config: config(overrides),
    sizes: new Map(model.tablets.map((t) => [Models.tabletKey(t.tablet), t.sizeBytes ?? 0])),
    imbalanceBefore: plan.figures.replicas.before.cv,
    imbalancePlanned: plan.figures.replicas.after.cv
  })
  return {
    state,
    fake: new FakeController(model),
    nowMs: 0,
    log: [],
    ended: [],
    late: [],
    persisted: undefined,
    maxBusy: 0,
    maxCluster: 0
  }
}

/** Feeds one input and runs its commands against the fake (answers fed back at once, or later when `lateness`). */
const feed = (run: Run, input: Executor.Input, rng?: Prng) => {
  const queue: Array<Executor.Input> = [input]
  while (queue.length > 0) {
    const [next, commands] = Executor.step(run.state, queue.shift()!)
    run.state = next
    for (const c of commands) {
      const answer = (command: "Reassign" | "CancelReassign" | "ElectPreferred", a: Executor.Answer) => {
        if (c._tag !== "Reassign" && c._tag !== "CancelReassign" && c._tag !== "ElectPreferred") return
        const fed: Executor.Input = {
          _tag: "Answered",
          nowMs: run.nowMs,
          index: c.index,
          ask: c.ask,
          command,
          answer: a
        }
        if (rng?.chance(0.05)) run.late.push({ atMs: run.nowMs + rng.int(100, 5000), input: fed })
        else if (rng?.chance(0.03)) queue.push({ ...fed, answer: { _tag: "Failed", detail: "lost" } })
        else queue.push(fed)
      }
      switch (c._tag) {
        case "Reassign":
          answer("Reassign", run.fake.reassign(run.nowMs, Models.tabletKey(c.tablet), c.target))
          break
        case "CancelReassign":
          answer("CancelReassign", run.fake.cancel(Models.tabletKey(c.tablet)))
          break
        case "ElectPreferred":
          answer("ElectPreferred", run.fake.elect(Models.tabletKey(c.tablet)))
          break
        case "Persist":
          run.persisted = c.state
          break
        case "Ended":
          run.ended.push(c.outcome)
          break
        case "Log":
          run.log.push(c.message)
          break
      }
    }
    const busy = run.fake.busy()
    run.maxBusy = Math.max(run.maxBusy, ...busy.values())
    run.maxCluster = Math.max(run.maxCluster, [...run.fake.tablets.values()].filter((t) => t.moving).length)
  }
}

/** Advances the clock by `ms`, lets the fake move, delivers late answers due, and observes. */
const tick = (run: Run, ms: number, minIsr = 1, rng?: Prng) => {
  run.nowMs += ms
  run.fake.tick(run.nowMs)
  for (const l of run.late.splice(0).sort((a, b) => a.atMs - b.atMs)) {
    if (l.atMs <= run.nowMs) feed(run, { ...l.input, nowMs: run.nowMs }, rng)
    else run.late.push(l)
  }
  feed(run, { _tag: "Observe", nowMs: run.nowMs, cluster: run.fake.observation(minIsr) }, rng)
}

/** The phase now (read through a function so TypeScript does not narrow it across ticks). */
const phaseOf = (run: Run): Executor.Phase => run.state.phase

const untilEnded = (run: Run, step = 250, limitMs = 10_000_000) => {
  while (!Executor.ended(run.state) && run.state.phase !== "paused" && run.nowMs < limitMs) tick(run, step)
}

/** Tablets in an intermediate replica set (moving) in the fake. */
const inBetween = (run: Run) => [...run.fake.tablets].filter(([, t]) => t.moving !== undefined).map(([k]) => k)

/**
 * Every move the executor calls done is at its target in the fake; with `leaders`, a leadership move is led by its
 * first replica too (a fault after the move can change the leader, so the seeded runs check replica sets only).
 */
const doneAtTarget = (run: Run, leaders = true): string | undefined => {
  for (const m of run.state.moves) {
    if (m.status !== "done") continue
    const t = run.fake.tablets.get(Models.tabletKey(m.tablet))!
    const same = t.replicas.length === m.to.length && m.to.every((x) => t.replicas.includes(x))
    if (!same) return `${Models.tabletKey(m.tablet)} done but on [${t.replicas}] not [${m.to}]`
    if (leaders && m.kind === "leadership" && t.leader !== m.to[0])
      return `${Models.tabletKey(m.tablet)} led by ${t.leader}`
  }
  return undefined
}

describe("Executor", () => {
  it("runs a scale-out 3 → 6 in batches within the limits, gated, to the planner's distribution", () => {
    const model = scaleOut(3, 6, 48, 3)
    const run = begin(model, { maxConcurrentMigrations: 2 })
    assert.strictEqual(run.state.phase, "measuring")
    assert.strictEqual(run.state.batches, 6) // 72 moves in 5 batches of 15 or fewer, then the leaders
    untilEnded(run)
    assert.strictEqual(run.state.phase, "completed", run.log.join("\n"))
    assert.deepStrictEqual(run.ended, ["completed"])
    assert.isAtMost(run.maxBusy, 2)
    assert.deepStrictEqual(inBetween(run), [])
    assert.isUndefined(doneAtTarget(run))
    const counts = new Map<number, number>()
    for (const t of run.fake.tablets.values()) for (const x of t.replicas) counts.set(x, (counts.get(x) ?? 0) + 1)
    assert.deepStrictEqual([...counts.values()], [24, 24, 24, 24, 24, 24])
    const leaders = new Map<number, number>()
    for (const t of run.fake.tablets.values()) leaders.set(t.leader!, (leaders.get(t.leader!) ?? 0) + 1)
    assert.deepStrictEqual([...leaders.values()].sort(), [8, 8, 8, 8, 8, 8])
    const p = Executor.progress(run.state)
    assert.strictEqual(p.movesDone, p.movesTotal)
    assert.strictEqual(p.bytesMoved, 72 * 1000)
    assert.isTrue(run.log.some((l) => l.includes("stability gate passed; starting batch 2 of 6")))
    assert.deepStrictEqual(run.persisted, run.state)
  })

  it("rolls the batch in flight back when a tablet goes under minInsyncReplicas, keeps finished batches, and resumes", () => {
    const model = scaleOut(3, 6, 24, 3)
    const run = begin(model, { maxConcurrentMigrations: 5, batchRatio: 0.5 })
    // Through the first batch and into the second.
    while (run.state.batch < 1 || run.state.phase !== "running") tick(run, 250, 2)
    tick(run, 250, 2) // moves of batch 2 under way
    const firstBatchDone = run.state.moves.filter((m) => m.batch === 0 && m.status === "done").length
    assert.isAbove(firstBatchDone, 0)
    run.fake.dead.add(2) // tablets on 2 fall to 2 in-sync replicas; with minISR 3 the gate fails
    tick(run, 250, 3)
    const phase: Executor.Phase = run.state.phase
    assert.include(["rolling-back", "paused"], phase)
    while (phaseOf(run) === "rolling-back") tick(run, 250, 3)
    assert.strictEqual(run.state.phase, "paused")
    assert.include(run.state.detail ?? "", "stability gate failed")
    assert.strictEqual(run.state.rollbacks, 1)
    assert.deepStrictEqual(inBetween(run), [])
    // The second batch's tablets are back on their original replicas; the first batch's stay moved.
    for (const m of run.state.moves.filter((m) => m.batch === 1 && m.kind === "replicas")) {
      const t = run.fake.tablets.get(Models.tabletKey(m.tablet))!
      assert.isTrue(
        m.status === "pending" || m.status === "done",
        `${Models.tabletKey(m.tablet)} ${m.status} ${m.detail}`
      )
      if (m.status === "pending") assert.sameMembers(t.replicas, [...m.from])
    }
    assert.strictEqual(run.state.moves.filter((m) => m.batch === 0 && m.status === "done").length, firstBatchDone)
    assert.deepStrictEqual(run.ended, ["paused"])
    // Server 2 back, resumed: it measures again and completes.
    run.fake.dead.delete(2)
    feed(run, { _tag: "Resume", nowMs: run.nowMs })
    assert.strictEqual(run.state.phase, "measuring")
    untilEnded(run, 250)
    assert.strictEqual(run.state.phase, "completed", run.log.join("\n"))
    assert.isUndefined(doneAtTarget(run))
  })

  it("does not start the next batch while ISR shrinks run above the baseline, and pauses when the gate finds a tablet offline", () => {
    const model = scaleOut(3, 4, 12, 3)
    const run = begin(model, { batchRatio: 0.5 })
    while (run.state.phase !== "gating") tick(run, 250)
    const since = run.nowMs
    for (let i = 0; i < 20; i++) {
      run.fake.shrinks++
      run.fake.tick(run.nowMs)
      const obs = run.fake.observation(1)
      const health = new Map([...obs.health].map(([x, h]) => [x, { ...h, isrShrinks: run.fake.shrinks }]))
      run.nowMs += 250
      feed(run, { _tag: "Observe", nowMs: run.nowMs, cluster: { ...obs, health } })
    }
    assert.strictEqual(run.state.phase, "gating", `the gate let batch 2 start at ${run.nowMs - since} ms of shrinks`)
    assert.isTrue(run.log.some((l) => l.includes("waiting a new window")))
    // A tablet offline while gating: paused, the first batch kept, nothing to roll back.
    const obs = run.fake.observation(1)
    const tablets = obs.tablets.map((t, i) => (i === 0 ? { ...t, online: false } : t))
    run.nowMs += 250
    feed(run, { _tag: "Observe", nowMs: run.nowMs, cluster: { ...obs, tablets } })
    assert.strictEqual(run.state.phase, "paused")
    assert.strictEqual(run.state.gateFailures, 1)
    assert.strictEqual(run.state.rollbacks, 0)
    assert.include(run.state.detail ?? "", "t/0 is offline")
  })

  it("fails the gate on append latency above the bound for a whole gate window, not on a shorter spike", () => {
    const model = scaleOut(3, 4, 12, 3)
    const run = begin(model)
    run.fake.latencyMs = 10
    run.fake.moveMs = 60_000 // the batch stays in flight throughout
    while (run.state.phase === "measuring") tick(run, 250)
    assert.strictEqual(run.state.phase, "running")
    run.fake.latencyMs = 29 // under both 2 × 10 and 10 + 20: within
    for (let i = 0; i < 12; i++) tick(run, 250)
    assert.strictEqual(phaseOf(run), "running")
    run.fake.latencyMs = 31 // above: a spike of 1.5 s passes (the gate window is 2 s)
    for (let i = 0; i < 6; i++) tick(run, 250)
    run.fake.latencyMs = 10
    tick(run, 250)
    assert.strictEqual(phaseOf(run), "running")
    run.fake.latencyMs = 31 // above for the whole window: the gate fails
    for (let i = 0; i < 9; i++) tick(run, 250)
    assert.include(["rolling-back", "paused"], phaseOf(run))
    assert.include(
      run.state.detail ?? "",
      "append latency p99 31.0 ms is above 30.0 ms (baseline 10.0 ms), for 2000 ms"
    )
  })

  it("fails the gate when a server up at the baseline goes down, and refusals onto it wait instead of giving up", () => {
    const model = scaleOut(3, 4, 12, 3)
    const run = begin(model, { maxConcurrentMigrations: 1 })
    while (run.state.phase !== "running") tick(run, 250)
    run.fake.dead.add(3)
    tick(run, 250)
    assert.include(["rolling-back", "paused"], phaseOf(run))
    assert.include(run.state.detail ?? "", "server 3 is down (it was up when the baseline was measured)")
    while (phaseOf(run) === "rolling-back") tick(run, 250)
    // Resumed with server 3 still down: moves touching it are refused (DeadServer) and asked again, not given up.
    feed(run, { _tag: "Resume", nowMs: run.nowMs })
    for (let i = 0; i < 40; i++) tick(run, 250)
    const onto = run.state.moves.filter((m) => m.kind === "replicas" && (m.to.includes(3) || m.from.includes(3)))
    assert.isAbove(onto.length, 0)
    assert.isTrue(onto.every((m) => m.status !== "cancelled" && m.status !== "skipped"))
    assert.isTrue(run.log.some((l) => l.includes("refused (DeadServer)") && l.includes("asking again")))
    run.fake.dead.delete(3)
    untilEnded(run)
    assert.strictEqual(run.state.phase, "completed", run.log.slice(-10).join("\n"))
    assert.strictEqual(Executor.progress(run.state).movesDone, run.state.moves.length)
  })

  it("cancels a stuck move, tries it again with backoff, then gives it up on its original replicas", () => {
    const model = scaleOut(3, 4, 4, 1)
    const run = begin(model, { moveTimeout: 5000 })
    run.fake.slow.add(4) // moves onto server 4 never finish
    untilEnded(run, 500)
    assert.strictEqual(run.state.phase, "completed", run.log.join("\n"))
    const stuck = run.state.moves.filter((m) => m.to.includes(4) && m.kind === "replicas")
    assert.isAbove(stuck.length, 0)
    for (const m of stuck) {
      assert.strictEqual(m.status, "cancelled")
      assert.strictEqual(m.attempts, Executor.maxAttempts)
      assert.sameMembers([...run.fake.tablets.get(Models.tabletKey(m.tablet))!.replicas], [...m.from])
    }
    assert.isTrue(run.log.some((l) => l.includes("cancelling to try again")))
    assert.deepStrictEqual(inBetween(run), [])
  })

  it("a leadership move whose reorder outlasts the move timeout is cancelled, holding its place meanwhile", () => {
    // t/0's leadership moves to server 2 (a reorder the controller finishes only once 2 leads its ISR), t/1's
    // replicas move to server 4; one move at a time, and the reorder takes longer than the move timeout.
    const model = scaleOut(3, 4, 2, 3)
    const t0 = model.tablets[0]!
    const t1 = model.tablets[1]!
    const changes: ReadonlyArray<Planner.Change> = [
      { tablet: t0.tablet, from: t0.replicas, to: [2, 1, 3], leaderFrom: 1, leaderTo: 2 },
      { tablet: t1.tablet, from: t1.replicas, to: [4, 3, 1], leaderFrom: t1.leader ?? null, leaderTo: 4 }
    ]
    const state = Executor.start({
      id: "r1",
      reason: "manual",
      nowMs: 0,
      changes,
      config: config({ moveTimeout: 1500, maxClusterMigrations: 1, maxConcurrentMigrations: 2, batchRatio: 1 }),
      sizes: new Map(),
      imbalanceBefore: 0.2,
      imbalancePlanned: 0
    })
    const run: ReturnType<typeof begin> = { ...begin(model), state }
    run.fake.moveMs = 4000
    untilEnded(run, 250)
    assert.strictEqual(run.state.phase, "completed", run.log.join("\n"))
    // Never two tablets moving at once, and the reorder was cancelled (past the timeout), not dropped while it ran.
    assert.strictEqual(run.maxCluster, 1)
    assert.isTrue(
      run.log.some((l) => l.includes("t/0: stuck for")),
      run.log.join("\n")
    )
    assert.isFalse(
      run.log.some((l) => l.includes("t/0: leadership move skipped")),
      run.log.join("\n")
    )
    assert.deepStrictEqual(inBetween(run), [])
  })

  it("pauses once the moves under way end, resumes, and cancels leaving finished moves and no tablet in between", () => {
    const model = scaleOut(3, 6, 24, 3)
    const run = begin(model, { maxConcurrentMigrations: 1 })
    while (run.state.phase !== "running") tick(run, 250)
    tick(run, 250)
    feed(run, { _tag: "Pause", nowMs: run.nowMs })
    assert.isTrue(run.state.pauseRequested)
    const batch = run.state.batch
    untilEnded(run)
    assert.strictEqual(run.state.phase, "paused")
    assert.include(run.state.detail ?? "", "operator")
    assert.deepStrictEqual(inBetween(run), [])
    // Paused once the moves under way ended: the batch's moves done or not yet started, none in between.
    const inBatch = run.state.moves.filter((m) => m.batch === batch)
    assert.isTrue(inBatch.every((m) => m.status === "done" || m.status === "pending"))
    assert.isTrue(inBatch.some((m) => m.status === "done"))
    feed(run, { _tag: "Resume", nowMs: run.nowMs })
    while (run.state.phase !== "running") tick(run, 250)
    tick(run, 250)
    assert.isAbove(inBetween(run).length, 0)
    feed(run, { _tag: "Cancel", nowMs: run.nowMs })
    untilEnded(run)
    assert.strictEqual(run.state.phase, "cancelled")
    assert.deepStrictEqual(inBetween(run), [])
    assert.deepStrictEqual(run.ended, ["paused", "cancelled"])
    assert.isUndefined(doneAtTarget(run))
  })

  it("recovers from its stored state as a new controller would, asking again what had no answer", () => {
    const model = scaleOut(3, 6, 24, 3)
    const run = begin(model)
    while (run.state.phase !== "running") tick(run, 250)
    // The controller fails over: answers to the last Reassigns are lost; the stored state is read back.
    const json = JSON.stringify(Schema.encodeSync(Executor.State)(run.persisted!))
    const stored = Schema.decodeUnknownSync(Executor.State)(JSON.parse(json))
    assert.strictEqual(JSON.stringify(Schema.encodeSync(Executor.State)(stored)), json)
    run.state = Executor.recovered(stored)
    assert.isFalse(run.state.moves.some((m) => m.status === "requested"))
    untilEnded(run)
    assert.strictEqual(run.state.phase, "completed", run.log.join("\n"))
    assert.strictEqual(Executor.progress(run.state).movesDone, run.state.moves.length)
  })

  it("completes at once when the plan moves nothing", () => {
    const model = scaleOut(3, 3, 6, 3)
    const run = begin(model)
    assert.strictEqual(run.state.phase, "completed")
    assert.strictEqual(run.state.moves.length, 0)
  })
})

/** One seeded run: a random scale-out with random faults; the first broken invariant, or undefined. */
const replay = (seed: number): string | undefined => {
  const rng = seeded(seed)
  const before = rng.int(2, 4)
  const after = before + rng.int(1, 3)
  const rf = rng.int(1, Math.min(3, before))
  const model = scaleOut(before, after, rng.int(4, 40), rf)
  const c = rng.int(1, 4)
  const run = begin(model, {
    maxConcurrentMigrations: c,
    maxClusterMigrations: rng.int(c, 12),
    batchRatio: rng.pick([0.1, 0.2, 0.5, 1]),
    moveTimeout: rng.pick([3000, 10_000])
  })
  run.fake.moveMs = rng.int(200, 4000)
  const limits = run.state.settings
  let resumes = 0
  for (let t = 0; t < 400 && !Executor.ended(run.state); t++) {
    const faulting = t < 250
    if (faulting && rng.chance(0.02)) run.fake.dead.add(rng.int(1, after))
    if (rng.chance(0.05)) run.fake.dead.clear()
    if (faulting && rng.chance(0.01)) run.fake.slow.add(rng.int(1, after))
    if (!faulting) run.fake.slow.clear()
    if (faulting && rng.chance(0.01)) feed(run, { _tag: "Pause", nowMs: run.nowMs })
    if (faulting && rng.chance(0.003)) feed(run, { _tag: "Cancel", nowMs: run.nowMs })
    if (faulting && rng.chance(0.02) && run.persisted !== undefined) run.state = Executor.recovered(run.persisted)
    if (run.state.phase === "paused" && rng.chance(0.2) && resumes++ < 20) {
      if (!faulting) run.fake.dead.clear()
      feed(run, { _tag: "Resume", nowMs: run.nowMs })
    }
    tick(run, 500, rf > 1 && rng.chance(0.5) ? rf - 1 : 1, faulting ? rng : undefined)
    if (run.maxBusy > limits.maxConcurrentMigrations)
      return `a server had ${run.maxBusy} moves at once (limit ${limits.maxConcurrentMigrations})`
    if (run.maxCluster > limits.maxClusterMigrations)
      return `${run.maxCluster} moves at once (cap ${limits.maxClusterMigrations})`
  }
  // Faults stopped: resume a paused rebalance until it ends.
  run.fake.dead.clear()
  run.fake.slow.clear()
  for (let i = 0; i < 10 && !Executor.ended(run.state); i++) {
    if (run.state.phase === "paused") feed(run, { _tag: "Resume", nowMs: run.nowMs })
    untilEnded(run, 500, run.nowMs + 2_000_000)
  }
  if (!Executor.ended(run.state)) return `not ended: ${run.state.phase} (${run.state.detail})`
  const between = inBetween(run)
  if (between.length > 0) return `tablets left in between: ${between.join(", ")}`
  const wrong = doneAtTarget(run, false)
  if (wrong !== undefined) return wrong
  if (run.state.moves.some((m) => !["done", "cancelled", "skipped"].includes(m.status)))
    return `a move not ended in a ${run.state.phase} rebalance: ${JSON.stringify(run.state.moves.find((m) => !["done", "cancelled", "skipped"].includes(m.status)))}`
  if (run.state.phase === "completed" && run.state.moves.length > 0 && run.ended.at(-1) !== "completed")
    return "completed without an Ended"
  return undefined
}

describe("Executor property", () => {
  it(`${only === undefined ? `${cases} seeded runs with faults` : `seed ${only}`}: limits kept, every rebalance ends with no tablet in between`, () => {
    const seeds = only === undefined ? Array.from({ length: cases }, (_, i) => i + 1) : [only]
    for (const seed of seeds) {
      const broken = replay(seed)
      assert.isUndefined(
        broken,
        `${broken} — ${rerunCommand({ seedVar: "STRATA_EXECUTOR_SEED", seed, project: "unit", file: FILE })}`
      )
    }
  })

  it("runs the scale-out shapes within 1.2 × the makespan lower bound (one batch, moves of equal time)", () => {
    for (const [before, after, tablets, c] of [
      [3, 6, 48, 1],
      [3, 6, 48, 2],
      [3, 6, 48, 5],
      [4, 8, 96, 3],
      [6, 9, 60, 2]
    ] as const) {
      const model = scaleOut(before, after, tablets, 3)
      const run = begin(model, { maxConcurrentMigrations: c, maxClusterMigrations: 1000, batchRatio: 1 })
      const moveMs = 1000
      run.fake.moveMs = moveMs
      while (run.state.phase === "measuring") tick(run, 50)
      const startMs = run.nowMs
      while (run.state.phase === "running") tick(run, 50)
      // The batch ended at the Observe after its last move finished (one tick late at most).
      const lastReplicaMoveMs = run.nowMs - 50
      const replicaChanges = planOf(model).changes.filter(Batches.movesReplicas)
      const bound =
        moveMs * Batches.makespanLowerBound(replicaChanges, { maxConcurrentMigrations: c, maxClusterMigrations: 1000 })
      const makespan = lastReplicaMoveMs - startMs
      assert.isAtMost(
        makespan,
        1.2 * bound,
        `${before}→${after}, ${tablets} tablets, c=${c}: ${makespan} ms against ${bound} ms`
      )
    }
  })
})
