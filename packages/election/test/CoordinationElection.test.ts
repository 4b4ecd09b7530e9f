import { assert, describe, it } from "@effect/vitest"
import { Coordination, CoordinationFaults, Election, type ElectionShape, op, type Session } from "@strata/core"
import { ElectionConformance } from "@strata/core/testing"
import { Context, type Duration, Effect, Exit, Fiber, Layer, Metric, Option, Scope, Stream } from "effect"
import { TestClock } from "effect/testing"
import * as CoordinationElection from "../src/CoordinationElection.js"

ElectionConformance.suite("memory", (namespace) =>
  CoordinationElection.layer({ namespace }).pipe(Layer.provide(Coordination.layerMemory()))
)

const bytes = (s: string) => new TextEncoder().encode(s)

/**
 * A process of the simulated cluster: its own election over one shared memory
 * coordination, with every session it opened recorded so a test can expire them
 * all (as the server does when the process stops for longer than the timeout).
 */
const processOf = (namespace: string, sessionTimeout: Duration.Input = "2 seconds") =>
  Effect.gen(function* () {
    const coordination = yield* Coordination
    const sessions: Array<Session> = []
    const recording = Coordination.of({
      ...coordination,
      session: (options) => Effect.tap(coordination.session(options), (s) => Effect.sync(() => sessions.push(s)))
    })
    const election = yield* CoordinationElection.make({ namespace, sessionTimeout }).pipe(
      Effect.provideService(Coordination, recording)
    )
    const faults = yield* CoordinationFaults
    /** Expires every session this process opened, as after a pause longer than the session timeout. */
    const expireAll = Effect.suspend(() =>
      Effect.forEach(sessions.slice(), (s) => Effect.ignore(faults.expire(s)), { discard: true })
    )
    return { election, expireAll, faults, sessions: () => sessions.slice() } as const
  })

const campaign = (election: ElectionShape, serverId: number) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const fiber = yield* Effect.forkChild(
      Scope.provide(election.campaign({ serverId, address: `host-${serverId}` }), scope)
    )
    return { scope, fiber } as const
  })

/** Lets forked fibers run and the memory coordination's timers fire. */
const settle = Effect.gen(function* () {
  for (let i = 0; i < 20; i++) yield* Effect.yieldNow
})

const memory = <A, E>(test: Effect.Effect<A, E, Coordination | CoordinationFaults>) =>
  Effect.scoped(test.pipe(Effect.provide(Coordination.layerMemory())))

describe("CoordinationElection on memory coordination", () => {
  it.effect("a leader stopped past its session timeout has its next write rejected with FencedEpoch", () =>
    memory(
      Effect.scoped(
        Effect.gen(function* () {
          const a = yield* processOf("pause")
          const b = yield* processOf("pause")
          const ca = yield* campaign(a.election, 1)
          const first = yield* Fiber.join(ca.fiber)
          const cb = yield* campaign(b.election, 2)
          yield* settle
          assert.isUndefined(cb.fiber.pollUnsafe(), "the second candidate waits")

          // Every session of process A ends: its campaign session and its observer session.
          yield* a.expireAll
          const second = yield* Fiber.join(cb.fiber)
          assert.isTrue(second.epoch > first.epoch)
          assert.strictEqual((yield* first.lost)._tag, "SessionLost")

          // The write A was about to make when it stopped: A knows its leadership is lost, so the write is refused
          // as stale at once, without asking the server (A's observer cannot be reached either).
          yield* Effect.forEach(a.sessions(), (s) => Effect.ignore(a.faults.disconnect!(s)), { discard: true })
          const opened = a.sessions().length
          const write = yield* Effect.forkChild(Effect.flip(first.fenced([op.create("/pause-write", bytes("stale"))])))
          yield* settle
          const refused = write.pollUnsafe()
          assert.isDefined(refused, "a write of a leadership known lost does not wait for the server")
          const error = yield* Fiber.join(write)
          assert.strictEqual(error.reason._tag, "FencedEpoch", error.message)
          if (error.reason._tag === "FencedEpoch") assert.strictEqual(error.reason.attempted, first.epoch)
          assert.strictEqual(a.sessions().length, opened, "no session was opened to ask for the current epoch")
          for (const s of a.sessions()) yield* Effect.ignore(a.faults.reconnect!(s))
          const written = yield* b.election.leader
          assert.strictEqual(Option.getOrThrow(written).epoch, second.epoch)
          // A's observer was reopened: it sees B as leader.
          const seen = yield* a.election.leader
          assert.strictEqual(Option.getOrThrow(seen).serverId, 2)
          yield* Scope.close(cb.scope, Exit.void)
          yield* Scope.close(ca.scope, Exit.void)
        })
      )
    )
  )

  it.effect("changes goes on after the observer session expires", () =>
    memory(
      Effect.scoped(
        Effect.gen(function* () {
          const a = yield* processOf("changes")
          const b = yield* processOf("changes")
          const seen = yield* Effect.forkChild(
            a.election.changes.pipe(
              Stream.filter(Option.isSome),
              Stream.map((o) => o.value.serverId),
              Stream.take(2),
              Stream.runCollect
            )
          )
          const cb = yield* campaign(b.election, 2)
          yield* Fiber.join(cb.fiber)
          yield* settle
          yield* a.expireAll
          yield* Scope.close(cb.scope, Exit.void)
          const cb2 = yield* campaign(b.election, 3)
          yield* Fiber.join(cb2.fiber)
          yield* settle
          assert.deepStrictEqual(yield* Fiber.join(seen), [2, 3])
          yield* Scope.close(cb2.scope, Exit.void)
        })
      )
    )
  )

  it.effect("metrics count elections, fenced writes rejected and candidate wake-ups", () =>
    memory(
      Effect.scoped(
        Effect.gen(function* () {
          const namespace = "metrics"
          const value = <S>(metric: Metric.Metric<number, S>) =>
            Metric.value(Metric.withAttributes(metric, { namespace }))
          const a = yield* processOf(namespace)
          const b = yield* processOf(namespace)
          const ca = yield* campaign(a.election, 1)
          const first = yield* Fiber.join(ca.fiber)
          assert.isUndefined(first.electionDurationMs, "no previous leader, no vacancy")
          const cb = yield* campaign(b.election, 2)
          yield* settle
          yield* TestClock.adjust("1 second")
          yield* a.expireAll
          yield* TestClock.adjust("250 millis")
          const second = yield* Fiber.join(cb.fiber)
          assert.isNumber(second.electionDurationMs)
          yield* Effect.flip(first.fenced([op.create("/metrics-write", bytes("x"))]))

          const elections = yield* value(CoordinationElection.metrics.electionsTotal)
          const fenced = yield* value(CoordinationElection.metrics.fencedWritesRejected)
          const wakeups = yield* value(CoordinationElection.metrics.candidateWakeups)
          const failovers = yield* Metric.value(
            Metric.withAttributes(CoordinationElection.metrics.electionDurationMs, { namespace })
          )
          assert.strictEqual(elections.count, 2)
          assert.strictEqual(fenced.count, 1)
          assert.strictEqual(wakeups.count, 1, "only the successor was woken")
          assert.strictEqual(failovers.count, 1)
          yield* Scope.close(cb.scope, Exit.void)
          yield* Scope.close(ca.scope, Exit.void)
        })
      )
    )
  )

  describe("options are validated when the election is built", () => {
    const build = (options: CoordinationElection.CoordinationElectionOptions) =>
      memory(
        Effect.scoped(
          Effect.gen(function* () {
            const error = yield* Effect.flip(CoordinationElection.make(options))
            assert.strictEqual(error.reason._tag, "InvalidElectionOptions")
            assert.match(error.message, /invalid option/)
            return error
          })
        )
      )

    it.effect("the session timeout must be shorter than the default replicaLagTimeMax (30 s)", () =>
      Effect.gen(function* () {
        const error = yield* Effect.flip(
          memory(
            Effect.scoped(
              Effect.flatMap(
                CoordinationElection.make({ namespace: "v", sessionTimeout: "45 seconds" }),
                () => Effect.void
              )
            )
          )
        )
        assert.strictEqual(error._tag, "ElectionError")
        if (error._tag === "ElectionError" && error.reason._tag === "InvalidElectionOptions") {
          assert.strictEqual(error.reason.option, "sessionTimeout")
          assert.match(error.message, /session \(liveness\) timeout .* must be shorter than replicaLagTimeMax/)
        } else {
          assert.fail(`expected InvalidElectionOptions, got ${error.message}`)
        }
      })
    )

    it.effect("a configured replicaLagTimeMax is honoured", () =>
      Effect.gen(function* () {
        const error = yield* build({ namespace: "v", sessionTimeout: "5 seconds", replicaLagTimeMax: "5 seconds" })
        if (error.reason._tag === "InvalidElectionOptions") assert.strictEqual(error.reason.option, "sessionTimeout")
        // Shorter than the lag bound: builds.
        yield* memory(
          Effect.scoped(
            Effect.asVoid(
              CoordinationElection.make({ namespace: "v", sessionTimeout: "4 seconds", replicaLagTimeMax: "5 seconds" })
            )
          )
        )
      })
    )

    it.effect("an empty namespace is rejected", () =>
      Effect.gen(function* () {
        const error = yield* build({ namespace: "//" })
        if (error.reason._tag === "InvalidElectionOptions") assert.strictEqual(error.reason.option, "namespace")
      })
    )
  })

  it.effect("the layer provides the same service under both keys", () =>
    memory(
      Effect.gen(function* () {
        const context = yield* Layer.build(CoordinationElection.layer({ namespace: "keys" }))
        assert.strictEqual(
          Context.get(context, CoordinationElection.CoordinationElection),
          Context.get(context, Election)
        )
      }).pipe(Effect.scoped)
    )
  )
})
