/**
 * The rebalance service on memory coordination against the model controller, on the test clock: a manual start runs
 * to the planner's distribution with the state stored in chunks; a service stopped mid-rebalance (a failover) and a
 * new one started on the same store finish it; the trigger starts a rebalance by itself when servers join; the
 * operator's commands refuse what does not fit; the stored state of a large plan keeps every node under 512 KB.
 */
import { assert, describe, it } from "@effect/vitest"
import { Coordination, MemoryCoordination, Models } from "@strata/core"
import { Duration, Effect, Exit, Option, Queue, Schema, Scope, Stream } from "effect"
import { TestClock } from "effect/testing"
import type { ClusterModel } from "../src/index.js"
import { Executor, RebalanceConfig, RebalanceService, RebalanceStore } from "../src/index.js"
import { Batches } from "../src/index.js"
import { FakeController, planOf, scaleOut } from "./support/fakeController.js"

/** The scale-out's replica moves that also move the leader: each gets a leadership move in the last batch. */
const leaderChanges = planOf(scaleOut(3, 6, 24, 3)).changes.filter(
  (c) => Batches.movesReplicas(c) && c.leaderFrom !== c.leaderTo
).length

const ROOT = "/strata-test/rebalance"

/** The model controller behind a `ClusterControl`, moved along by the clock. */
const controlOf = (fake: FakeController): RebalanceService.ClusterControl => {
  const at = <A>(f: (nowMs: number) => A) =>
    Effect.map(
      Effect.clockWith((c) => c.currentTimeMillis),
      (nowMs) => {
        fake.tick(nowMs)
        return f(nowMs)
      }
    )
  return {
    model: at(() => fake.model()),
    observe: at(() => fake.observation(2)),
    reassign: (tablet, target) => at((nowMs) => fake.reassign(nowMs, Models.tabletKey(tablet), target)),
    cancelReassign: (tablet) => at(() => fake.cancel(Models.tabletKey(tablet))),
    electPreferred: (tablet) => at(() => fake.elect(Models.tabletKey(tablet)))
  }
}

const config = (overrides: RebalanceConfig.RebalanceConfigInput = {}) =>
  Schema.decodeUnknownSync(RebalanceConfig.RebalanceConfig)({
    gateWindow: 2000,
    moveTimeout: 30_000,
    checkInterval: "1 hour",
    ...overrides
  })

/** Starts a service in its own scope (closed to stop it, as a deposed controller's is). */
const startService = (
  fake: FakeController,
  overrides: RebalanceConfig.RebalanceConfigInput = {},
  extra: Partial<RebalanceService.Options> = {}
) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const session = yield* Scope.provide(scope)((yield* Coordination.Coordination).session())
    const leadership = { fenced: (ops: ReadonlyArray<Coordination.Op>) => Effect.orDie(session.multi(ops)) }
    const service = yield* Scope.provide(scope)(
      RebalanceService.make(leadership, {
        control: controlOf(fake),
        root: ROOT,
        config: config(overrides),
        observeInterval: "250 millis",
        chunkBytes: 2000,
        ...extra
      })
    )
    return { service, scope, session }
  })

/** Moves the test clock on in steps until `done` holds (at most `limitMs`). */
const advanceUntil = (done: Effect.Effect<boolean>, limitMs = 600_000, stepMs = 250) =>
  Effect.gen(function* () {
    for (let t = 0; t < limitMs; t += stepMs) {
      if (yield* done) return
      yield* TestClock.adjust(Duration.millis(stepMs))
    }
    assert.fail(`not done after ${limitMs} ms of test clock`)
  })

const phaseIs = (service: RebalanceService.RebalanceServiceShape, ...phases: ReadonlyArray<Executor.Phase>) =>
  Effect.map(service.status, (s) => s.rebalance !== undefined && phases.includes(s.rebalance.phase))

const counts = (fake: FakeController) => {
  const out = new Map<number, number>()
  for (const t of fake.tablets.values()) for (const x of t.replicas) out.set(x, (out.get(x) ?? 0) + 1)
  return [...out].sort((a, b) => a[0] - b[0]).map(([, n]) => n)
}

const withCoordination = <A, E>(effect: Effect.Effect<A, E, Coordination.Coordination | Scope.Scope>) =>
  effect.pipe(Effect.provide(MemoryCoordination.layer()))

describe("RebalanceService", () => {
  it.effect("runs a manual rebalance to the planner's distribution, its state stored in chunks", () =>
    withCoordination(
      Effect.gen(function* () {
        const fake = new FakeController(scaleOut(3, 6, 24, 3))
        const { service, session } = yield* startService(fake)
        const started = yield* service.start()
        assert.strictEqual(started.phase, "measuring")
        // 24 × 3 replicas over 6 servers: 12 each, so 36 replicas leave the first three (and leaders follow).
        assert.strictEqual(started.movesTotal, planOf(scaleOut(3, 6, 24, 3)).changes.length + leaderChanges)
        const again = yield* Effect.flip(service.start())
        assert.strictEqual(again.reason._tag, "InProgress")
        yield* advanceUntil(phaseIs(service, "completed"))
        assert.deepStrictEqual(counts(fake), [12, 12, 12, 12, 12, 12])
        const status = yield* service.status
        assert.strictEqual(status.rebalance?.movesDone, status.rebalance?.movesTotal)
        assert.strictEqual(status.imbalanceAfter, 0)
        assert.isAbove(status.rebalance?.imbalanceBefore ?? 0, 0.5)
        // Stored in chunks of at most 2000 bytes, read back whole.
        const chunks = (yield* session.children(ROOT)).filter((n) => n.startsWith("moves-"))
        assert.isAtLeast(chunks.length, 3)
        for (const c of chunks) assert.isAtMost((yield* session.get(`${ROOT}/${c}`)).data.length, 2000)
        const stored = yield* RebalanceStore.make({ root: ROOT, session, leadership: { fenced: () => Effect.die("") } })
          .load
        assert.isTrue(Option.isSome(stored))
        assert.strictEqual(
          Option.getOrThrow(stored).moves.filter((m) => m.status === "done").length,
          started.movesTotal
        )
        assert.strictEqual(Option.getOrThrow(stored).phase, "completed")
      })
    )
  )

  it.effect("a new controller's service finishes the rebalance a stopped one left mid-batch", () =>
    withCoordination(
      Effect.gen(function* () {
        const fake = new FakeController(scaleOut(3, 6, 24, 3))
        const first = yield* startService(fake, { maxConcurrentMigrations: 1 })
        yield* first.service.start()
        yield* advanceUntil(
          Effect.map(
            first.service.status,
            (s) => (s.rebalance?.movesDone ?? 0) >= 6 && (s.rebalance?.movesActive ?? 0) > 0
          )
        )
        const doneBefore = (yield* first.service.status).rebalance!.movesDone
        yield* Scope.close(first.scope, Exit.void) // the controller fails over
        const second = yield* startService(fake, { maxConcurrentMigrations: 1 })
        const taken = (yield* second.service.status).rebalance!
        assert.notStrictEqual(taken.phase, "completed")
        assert.isAtLeast(taken.movesDone, doneBefore)
        // The trigger counts it running: a manual start is refused.
        assert.strictEqual((yield* Effect.flip(second.service.start())).reason._tag, "InProgress")
        yield* advanceUntil(phaseIs(second.service, "completed"))
        assert.deepStrictEqual(counts(fake), [12, 12, 12, 12, 12, 12])
        assert.deepStrictEqual(
          [...fake.tablets.values()].filter((t) => t.moving !== undefined),
          []
        )
      })
    )
  )

  it.effect("a new controller's service shows a rebalance that ended before it with its imbalance after", () =>
    withCoordination(
      Effect.gen(function* () {
        const fake = new FakeController(scaleOut(3, 6, 24, 3))
        const first = yield* startService(fake)
        yield* first.service.start()
        yield* advanceUntil(phaseIs(first.service, "completed"))
        yield* Scope.close(first.scope, Exit.void) // the controller fails over after the end
        const second = yield* startService(fake)
        const status = yield* second.service.status
        assert.strictEqual(status.rebalance?.phase, "completed")
        assert.strictEqual(status.imbalanceAfter, 0)
      })
    )
  )

  it.effect("starts by itself when servers join, on a check the join triggers", () =>
    withCoordination(
      Effect.gen(function* () {
        const fake = new FakeController(scaleOut(3, 4, 12, 3))
        const joins = yield* Queue.unbounded<void>()
        const { service } = yield* startService(fake, {}, { checks: Stream.fromQueue(joins) })
        assert.isUndefined((yield* service.status).rebalance)
        yield* Queue.offer(joins, undefined)
        yield* advanceUntil(phaseIs(service, "measuring", "running", "gating", "completed"), 5_000)
        assert.strictEqual((yield* service.status).rebalance?.reason, "empty-server")
        yield* advanceUntil(phaseIs(service, "completed"))
        assert.deepStrictEqual(counts(fake), [9, 9, 9, 9])
        // Balanced and cooling down: another check starts nothing.
        yield* Queue.offer(joins, undefined)
        yield* TestClock.adjust(Duration.seconds(1))
        const status = yield* service.status
        assert.strictEqual(status.rebalance?.phase, "completed")
        assert.isDefined(status.trigger.cooldownUntilMs)
      })
    )
  )

  it.effect("refuses pause, resume and cancel with nothing to act on; pauses, resumes and cancels one", () =>
    withCoordination(
      Effect.gen(function* () {
        const fake = new FakeController(scaleOut(3, 6, 24, 3))
        const { service } = yield* startService(fake, { maxConcurrentMigrations: 1 })
        assert.strictEqual((yield* Effect.flip(service.pause)).reason._tag, "NoRebalance")
        assert.strictEqual((yield* Effect.flip(service.cancel)).reason._tag, "NoRebalance")
        yield* service.start()
        assert.strictEqual((yield* Effect.flip(service.resume)).reason._tag, "NotPaused")
        yield* advanceUntil(Effect.map(service.status, (s) => (s.rebalance?.movesActive ?? 0) > 0))
        yield* service.pause
        yield* advanceUntil(phaseIs(service, "paused"))
        assert.include((yield* service.status).rebalance?.detail ?? "", "operator")
        yield* service.resume
        yield* advanceUntil(Effect.map(service.status, (s) => (s.rebalance?.movesActive ?? 0) > 0))
        const cancelled = yield* service.cancel
        assert.strictEqual(cancelled.phase === "cancelling" || cancelled.phase === "cancelled", true)
        yield* advanceUntil(phaseIs(service, "cancelled"))
        assert.deepStrictEqual(
          [...fake.tablets.values()].filter((t) => t.moving !== undefined),
          []
        )
        // Ended: a new one may start.
        const next = yield* service.start()
        assert.notStrictEqual(next.id, cancelled.id)
      })
    )
  )
})

describe("RebalanceService with a stored state it cannot read", () => {
  it.effect("starts without it (logged), and its next rebalance overwrites it", () =>
    withCoordination(
      Effect.gen(function* () {
        const session = yield* (yield* Coordination.Coordination).session()
        yield* session.create(ROOT, new TextEncoder().encode("{not json"), { createParents: true })
        const fake = new FakeController(scaleOut(3, 4, 12, 3))
        const { service } = yield* startService(fake)
        assert.isUndefined((yield* service.status).rebalance)
        yield* service.start()
        yield* advanceUntil(phaseIs(service, "completed"))
        const read = yield* RebalanceStore.make({ root: ROOT, session, leadership: { fenced: () => Effect.die("") } })
          .load
        assert.strictEqual(Option.getOrThrow(read).phase, "completed")
      })
    )
  )
})

describe("RebalanceStore", () => {
  it.effect("keeps every node of a 20 000-move plan under 512 KB and reads it back whole", () =>
    withCoordination(
      Effect.gen(function* () {
        const session = yield* (yield* Coordination.Coordination).session()
        const store = RebalanceStore.make({
          root: ROOT,
          session,
          leadership: { fenced: (ops) => Effect.orDie(session.multi(ops)) }
        })
        const model: ClusterModel.ClusterModel = scaleOut(50, 100, 10_000, 3)
        const state = Executor.start({
          id: "big",
          reason: "manual",
          nowMs: 0,
          changes: model.tablets.map((t) => ({
            tablet: t.tablet,
            from: t.replicas,
            to: t.replicas.map((x) => x + 50),
            leaderFrom: t.replicas[0]!,
            leaderTo: t.replicas[0]! + 50
          })),
          config: RebalanceConfig.defaults,
          imbalanceBefore: 1,
          imbalancePlanned: 0
        })
        assert.strictEqual(state.moves.length, 20_000)
        assert.isTrue(Option.isNone(yield* store.load))
        yield* store.save(state)
        const names = yield* session.children(ROOT)
        for (const n of names) assert.isBelow((yield* session.get(`${ROOT}/${n}`)).data.length, 512 * 1024, n)
        assert.isBelow((yield* session.get(ROOT)).data.length, 512 * 1024)
        assert.isAbove(names.length, 5)
        // A change to one move rewrites one chunk; a shorter plan deletes the chunks it no longer needs.
        const changed = {
          ...state,
          moves: state.moves.map((m, i) => (i === 7 ? { ...m, status: "done" as const } : m))
        }
        yield* store.save(changed)
        const read = yield* RebalanceStore.make({ root: ROOT, session, leadership: { fenced: () => Effect.die("") } })
          .load
        assert.strictEqual(Option.getOrThrow(read).moves[7]!.status, "done")
        assert.strictEqual(Option.getOrThrow(read).moves.length, 20_000)
        yield* store.save({ ...changed, moves: changed.moves.slice(0, 10) })
        assert.deepStrictEqual(yield* session.children(ROOT), ["moves-0000"])
        const short = yield* RebalanceStore.make({ root: ROOT, session, leadership: { fenced: () => Effect.die("") } })
          .load
        assert.strictEqual(Option.getOrThrow(short).moves.length, 10)
      })
    )
  )
})
