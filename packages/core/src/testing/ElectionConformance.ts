/**
 * The `Election` conformance suite: the contract every election implementation
 * must pass. It runs on real time, with bounded waits, and builds the election
 * per test from a factory given a fresh random namespace.
 *
 * ```ts
 * ElectionConformance.suite("memory", (namespace) =>
 *   CoordinationElection.layer({ namespace }).pipe(Layer.provide(MemoryCoordination.layer())))
 * ```
 *
 * @since 0.1.0
 */
import * as Coordination from "../Coordination.js"
import * as Election from "../Election.js"
import type * as Models from "../Models.js"
import { assert, describe, it } from "@effect/vitest"
import type { Layer } from "effect"
import { Duration, Effect, Exit, Fiber, Option, Scope, Stream } from "effect"

/** Options of the conformance suite. */
export interface SuiteOptions {
  /** Upper bound of every wait (default 10 seconds). */
  readonly eventTimeout?: Duration.Input
  /** Vitest timeout of each test (default 60 seconds; a number is milliseconds). */
  readonly testTimeout?: Duration.Input
}

const randomNamespace = (): string =>
  `election-conformance-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 10)}`

/** Runs the `Election` conformance suite; `makeLayer` builds an election for a namespace. */
export const suite = (
  name: string,
  makeLayer: (namespace: string) => Layer.Layer<Election.Election, unknown>,
  options?: SuiteOptions
): void => {
  const eventTimeout = Duration.fromInputUnsafe(options?.eventTimeout ?? "10 seconds")
  const testTimeout = Duration.toMillis(Duration.fromInputUnsafe(options?.testTimeout ?? "60 seconds"))

  const within = <A, E, R>(self: Effect.Effect<A, E, R>, what: string): Effect.Effect<A, E, R> =>
    Effect.flatMap(
      Effect.timeoutOption(self, eventTimeout),
      Option.match({
        onNone: () => Effect.die(new Error(`timed out waiting for ${what}`)),
        onSome: Effect.succeed
      })
    )

  const test = (
    title: string,
    body: (namespace: string) => Effect.Effect<void, unknown, Election.Election | Scope.Scope>
  ) =>
    it.live(
      title,
      () => {
        const namespace = randomNamespace()
        return Effect.scoped(body(namespace)).pipe(Effect.provide(makeLayer(namespace)))
      },
      testTimeout
    )

  /** Campaigns in a fresh scope, in the background; returns the fiber and the scope (close it to resign). */
  const candidate = (serverId: number) =>
    Effect.gen(function* () {
      const election = yield* Election.Election
      const scope = yield* Scope.make()
      const fiber = yield* Effect.forkChild(
        Scope.provide(election.campaign({ serverId, address: `host-${serverId}:9000` }), scope)
      )
      return { serverId, scope, fiber } as const
    })

  const leaderNow: Effect.Effect<
    Option.Option<Models.LeaderInfo>,
    Election.ElectionError,
    Election.Election
  > = Effect.gen(function* () {
    const election = yield* Election.Election
    return yield* election.leader
  })

  const eventually = <A, E, R>(self: Effect.Effect<A, E, R>, predicate: (a: A) => boolean, what: string) =>
    within(
      Effect.gen(function* () {
        while (true) {
          const a = yield* self
          if (predicate(a)) return a
          yield* Effect.sleep("20 millis")
        }
      }),
      what
    )

  const isLeader = (info: Option.Option<Models.LeaderInfo>, leadership: Election.Leadership) =>
    Option.isSome(info) && info.value.serverId === leadership.info.serverId && info.value.epoch === leadership.epoch

  const bytes = (s: string) => new TextEncoder().encode(s)

  describe(`Election conformance: ${name}`, () => {
    test("a lone candidate leads with an epoch and leader shows it", () =>
      Effect.gen(function* () {
        const c = yield* candidate(1)
        const leadership = yield* within(Fiber.join(c.fiber), "leadership")
        assert.isTrue(leadership.epoch >= 1)
        assert.strictEqual(leadership.info.serverId, 1)
        assert.strictEqual(leadership.info.address, "host-1:9000")
        const info = yield* eventually(leaderNow, (l) => isLeader(l, leadership), "leader shows it")
        assert.deepStrictEqual(Option.getOrThrow(info), {
          serverId: 1,
          epoch: leadership.epoch,
          address: "host-1:9000"
        })
        yield* Scope.close(c.scope, Exit.void)
      }))

    test("of two candidates one leads; on resigning the other leads with a higher epoch", () =>
      Effect.gen(function* () {
        const a = yield* candidate(1)
        const first = yield* within(Fiber.join(a.fiber), "first leadership")
        const b = yield* candidate(2)
        yield* Effect.sleep("300 millis")
        assert.isUndefined(b.fiber.pollUnsafe(), "the second candidate waits")
        yield* Scope.close(a.scope, Exit.void)
        const end = yield* within(first.lost, "first lost")
        assert.strictEqual(end._tag, "Resigned")
        const second = yield* within(Fiber.join(b.fiber), "second leadership")
        assert.strictEqual(second.info.serverId, 2)
        assert.isTrue(second.epoch > first.epoch, "epoch grows")
        assert.isUndefined(first.electionDurationMs, "the first leader of a namespace replaced nobody")
        assert.isNumber(second.electionDurationMs, "the successor measured the vacancy")
        assert.isAtLeast(second.electionDurationMs ?? -1, 0)
        yield* eventually(leaderNow, (l) => isLeader(l, second), "leader shows the second")
        yield* Scope.close(b.scope, Exit.void)
      }))

    test("a stale leader's fenced write fails with FencedEpoch, the new leader's succeeds", (namespace) =>
      Effect.gen(function* () {
        const a = yield* candidate(1)
        const first = yield* within(Fiber.join(a.fiber), "first leadership")
        const b = yield* candidate(2)
        yield* Scope.close(a.scope, Exit.void)
        const second = yield* within(Fiber.join(b.fiber), "second leadership")
        const stale = yield* Effect.flip(
          first.fenced([Coordination.op.create(`/${namespace}/stale-write`, bytes("stale"))])
        )
        assert.strictEqual(stale._tag, "ElectionError")
        assert.strictEqual(stale.reason._tag, "FencedEpoch", stale.message)
        if (stale.reason._tag === "FencedEpoch") {
          assert.strictEqual(stale.reason.resource, "coordinator")
          assert.strictEqual(stale.reason.attempted, first.epoch)
          assert.strictEqual(stale.reason.current, second.epoch)
        }
        const results = yield* second.fenced([Coordination.op.create(`/${namespace}/fenced-write`, bytes("ok"))])
        assert.strictEqual(results.length, 1)
        assert.strictEqual(results[0]?._tag, "create")
        yield* Scope.close(b.scope, Exit.void)
      }))

    test("5 candidates resigning in turn lead in order with increasing epochs, never two at once", () =>
      Effect.gen(function* () {
        const candidates = []
        for (let i = 1; i <= 5; i++) {
          candidates.push(yield* candidate(i))
          yield* Effect.sleep("50 millis")
        }
        let previous = 0
        for (const c of candidates) {
          const leadership = yield* within(Fiber.join(c.fiber), `leadership of ${c.serverId}`)
          assert.strictEqual(leadership.info.serverId, c.serverId)
          assert.isTrue(leadership.epoch > previous, "epochs strictly increase")
          previous = leadership.epoch
          const info = yield* eventually(leaderNow, (l) => isLeader(l, leadership), "leader shows it")
          assert.strictEqual(Option.getOrThrow(info).serverId, c.serverId)
          for (const other of candidates) {
            if (other.serverId > c.serverId) assert.isUndefined(other.fiber.pollUnsafe(), "one leader at a time")
          }
          yield* Scope.close(c.scope, Exit.void)
          assert.strictEqual((yield* within(leadership.lost, "lost"))._tag, "Resigned")
        }
      }))

    test("changes reports each new leader", () =>
      Effect.gen(function* () {
        const election = yield* Election.Election
        const seen = yield* Effect.forkChild(
          election.changes.pipe(
            Stream.filter(Option.isSome),
            Stream.map((o) => o.value.serverId),
            Stream.take(3),
            Stream.runCollect
          )
        )
        for (let i = 1; i <= 3; i++) {
          const c = yield* candidate(i)
          const leadership = yield* within(Fiber.join(c.fiber), `leadership of ${i}`)
          yield* eventually(leaderNow, (l) => isLeader(l, leadership), "leader shows it")
          yield* Effect.sleep("100 millis")
          yield* Scope.close(c.scope, Exit.void)
        }
        assert.deepStrictEqual(yield* within(Fiber.join(seen), "changes"), [1, 2, 3])
      }))
  })
}
