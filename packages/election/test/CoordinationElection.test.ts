import { Coordination, Election, MemoryCoordination } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { ElectionConformance } from "@strata/core/testing"
import { Clock, Context, type Duration, Effect, Exit, Fiber, Layer, Metric, Option, Scope, Stream } from "effect"
import { TestClock } from "effect/testing"
import * as CoordinationElection from "../src/CoordinationElection.js"

ElectionConformance.suite("memory", (namespace) =>
  CoordinationElection.layer({ namespace }).pipe(Layer.provide(MemoryCoordination.layer()))
)

const bytes = (s: string) => new TextEncoder().encode(s)

/**
 * A process of the simulated cluster: its own election over one shared memory
 * coordination, with every session it opened recorded so a test can expire them
 * all (as the server does when the process stops for longer than the timeout).
 * With `multiDelay` each of its sessions' `multi` (the leader registration) waits
 * that long first.
 */
const processOf = (namespace: string, sessionTimeout: Duration.Input = "2 seconds", multiDelay?: Duration.Input) =>
  Effect.gen(function* () {
    const coordination = yield* Coordination.Coordination
    const sessions: Array<Coordination.Session> = []
    const delayed = (s: Coordination.Session): Coordination.Session =>
      multiDelay === undefined ? s : { ...s, multi: (ops) => Effect.andThen(Effect.sleep(multiDelay), s.multi(ops)) }
    const recording = Coordination.Coordination.of({
      ...coordination,
      session: (options) =>
        Effect.map(
          Effect.tap(coordination.session(options), (s) => Effect.sync(() => sessions.push(s))),
          delayed
        )
    })
    const election = yield* CoordinationElection.make({ namespace, sessionTimeout }).pipe(
      Effect.provideService(Coordination.Coordination, recording)
    )
    const faults = yield* Coordination.Faults
    /** Expires every session this process opened, as after a pause longer than the session timeout. */
    const expireAll = Effect.suspend(() =>
      Effect.forEach(sessions.slice(), (s) => Effect.ignore(faults.expire(s)), { discard: true })
    )
    return { election, expireAll, faults, sessions: () => sessions.slice() } as const
  })

const campaign = (election: Election.Shape, serverId: number) =>
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

const memory = <A, E>(test: Effect.Effect<A, E, Coordination.Coordination | Coordination.Faults>) =>
  Effect.scoped(test.pipe(Effect.provide(MemoryCoordination.layer())))

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
          const write = yield* Effect.forkChild(
            Effect.flip(first.fenced([Coordination.op.create("/pause-write", bytes("stale"))]))
          )
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

  it.effect("past its deadline a leader's guard refuses; a ping that gets through restores it", () =>
    memory(
      Effect.scoped(
        Effect.gen(function* () {
          const a = yield* processOf("deadline", "10 seconds")
          const ca = yield* campaign(a.election, 1)
          const leadership = yield* Fiber.join(ca.fiber)
          yield* leadership.guard
          assert.isTrue(yield* leadership.isLeader)
          const start = yield* Clock.currentTimeMillis
          // The registration proved the session alive; the deadline is a session timeout less the margin (10%).
          assert.strictEqual(yield* leadership.deadline, start + 9_000)
          const proven = yield* Effect.forkChild(Stream.runCollect(Stream.take(leadership.proven, 3)))

          // The connection is cut: no ping gets through. The server keeps the session for 10 s; the leader may act
          // for 9 s after its last proof, then holds back although nothing told it the session ended.
          const campaignSession = a.sessions().at(-1)!
          yield* a.faults.disconnect!(campaignSession)
          yield* TestClock.adjust("8999 millis")
          yield* leadership.guard
          yield* TestClock.adjust("2 millis")
          assert.isFalse(yield* leadership.isLeader)
          const refused = yield* Effect.flip(leadership.guard)
          assert.strictEqual(refused.reason._tag, "LeadershipLapsed", refused.message)
          if (refused.reason._tag === "LeadershipLapsed") {
            assert.strictEqual(refused.reason.epoch, leadership.epoch)
            assert.strictEqual(refused.reason.deadline, start + 9_000)
          }
          // Back within the session timeout: the next ping proves it alive and the leadership holds again.
          yield* a.faults.reconnect!(campaignSession)
          yield* TestClock.adjust("2500 millis")
          yield* settle
          yield* leadership.guard
          assert.isTrue((yield* leadership.deadline) > start + 9_000)
          assert.deepStrictEqual([...(yield* Fiber.join(proven))], [true, false, true])
          yield* Scope.close(ca.scope, Exit.void)
        })
      )
    )
  )

  it.effect("an epoch node deleted under a leader: it is fenced and the next leader goes past every epoch seen", () =>
    memory(
      Effect.scoped(
        Effect.gen(function* () {
          const a = yield* processOf("reset")
          const ca = yield* campaign(a.election, 1)
          const first = yield* Fiber.join(ca.fiber)
          yield* Scope.close(ca.scope, Exit.void)
          const cb = yield* campaign(a.election, 1)
          const second = yield* Fiber.join(cb.fiber)
          assert.strictEqual(second.epoch, first.epoch + 1)
          const raw = yield* (yield* Coordination.Coordination).session()
          yield* raw.delete("/reset/coordinators/epoch")
          assert.strictEqual((yield* second.lost)._tag, "Fenced")
          yield* Scope.close(cb.scope, Exit.void)
          const cc = yield* campaign(a.election, 1)
          const third = yield* Fiber.join(cc.fiber)
          assert.strictEqual(third.epoch, second.epoch + 1, "not 1: the deleted node's numbers are not reused")
          const node = yield* raw.get("/reset/coordinators/epoch")
          assert.strictEqual(new TextDecoder().decode(node.data), String(third.epoch))
          yield* Scope.close(cc.scope, Exit.void)
        })
      )
    )
  )

  it.effect("an unreadable epoch node fails the campaign with an error naming it, and leaves no node behind", () =>
    memory(
      Effect.scoped(
        Effect.gen(function* () {
          const raw = yield* (yield* Coordination.Coordination).session()
          yield* raw.create("/corrupt/coordinators/epoch", bytes("seven"), { createParents: true })
          const a = yield* processOf("corrupt")
          const ca = yield* campaign(a.election, 1)
          const error = yield* Effect.flip(Fiber.join(ca.fiber))
          assert.strictEqual(error.reason._tag, "CorruptElectionData", error.message)
          assert.include(error.message, "/corrupt/coordinators/epoch")
          assert.include(error.message, "seven")
          // The failed campaign closed its session: its registration and candidate node are gone.
          assert.deepStrictEqual(yield* raw.children("/corrupt/coordinators/election"), [])
          assert.deepStrictEqual(yield* raw.children("/corrupt/coordinators/ids"), [])
          yield* Scope.close(ca.scope, Exit.void)
        })
      )
    )
  )

  it.effect("a campaign that fails in a scope releases what it made: a retry in the same scope leads", () =>
    memory(
      Effect.scoped(
        Effect.gen(function* () {
          const raw = yield* (yield* Coordination.Coordination).session()
          yield* raw.create("/retry/coordinators/epoch", bytes("x"), { createParents: true })
          const a = yield* processOf("retry")
          const scope = yield* Scope.make()
          const failedOnce = yield* Effect.flip(
            Scope.provide(a.election.campaign({ serverId: 1, address: "a" }), scope)
          )
          assert.strictEqual(failedOnce.reason._tag, "CorruptElectionData")
          yield* raw.set("/retry/coordinators/epoch", bytes("4"))
          const again = yield* Effect.forkChild(
            Scope.provide(a.election.campaign({ serverId: 1, address: "a" }), scope)
          )
          yield* settle
          const won = again.pollUnsafe()
          assert.isDefined(won, "the retry is not stuck behind the failed campaign's candidate")
          const leadership = yield* Fiber.join(again)
          assert.strictEqual(leadership.epoch, 5)
          assert.strictEqual((yield* raw.children("/retry/coordinators/election")).length, 1)
          yield* Scope.close(scope, Exit.void)
        })
      )
    )
  )

  it.effect("a connection blip during a campaign is waited out: the candidate keeps its session and its place", () =>
    memory(
      Effect.scoped(
        Effect.gen(function* () {
          const coordination = yield* Coordination.Coordination
          const faults = yield* Coordination.Faults
          const opened: Array<Coordination.Session> = []
          // Every campaign session of B loses its connection for 500 ms right after opening, before its first step.
          const blippy = Coordination.Coordination.of({
            ...coordination,
            session: (options) =>
              Effect.tap(coordination.session(options), (s) =>
                Effect.gen(function* () {
                  opened.push(s)
                  if (opened.length < 2) return
                  yield* faults.disconnect!(s)
                  yield* Effect.forkDetach(Effect.andThen(Effect.sleep("500 millis"), faults.reconnect!(s)))
                })
              )
          })
          const b = yield* CoordinationElection.make({ namespace: "blip", sessionTimeout: "2 seconds" }).pipe(
            Effect.provideService(Coordination.Coordination, blippy)
          )
          const cb = yield* campaign(b, 2)
          yield* settle
          yield* TestClock.adjust("100 millis")
          assert.isUndefined(cb.fiber.pollUnsafe(), "still trying while the connection is down")
          yield* TestClock.adjust("2 seconds")
          const won = yield* Fiber.join(cb.fiber)
          assert.strictEqual(won.info.serverId, 2)
          assert.strictEqual(opened.length, 2, "one campaign session, kept through the blip")
          const raw = yield* coordination.session()
          const ids = yield* raw.exists("/blip/coordinators/ids/2")
          assert.strictEqual(Option.getOrThrow(ids).ephemeralOwner, opened[1]!.id)
          yield* Scope.close(cb.scope, Exit.void)
        })
      )
    )
  )

  it.effect("after the election parent is wiped and made again, a candidate never deletes another session's node", () =>
    memory(
      Effect.scoped(
        Effect.gen(function* () {
          const a = yield* processOf("wipe")
          const raw = yield* (yield* Coordination.Coordination).session()
          const other = yield* (yield* Coordination.Coordination).session()
          // A leader holds the line, so A waits behind it with candidate_0000000001.
          yield* other.create("/wipe/coordinators/election/candidate_", bytes("9"), {
            mode: "ephemeral-sequential",
            createParents: true
          })
          const ca = yield* campaign(a.election, 1)
          yield* settle
          assert.deepStrictEqual(yield* raw.children("/wipe/coordinators/election"), [
            "candidate_0000000000",
            "candidate_0000000001"
          ])
          // While A's connection is down, the parent is wiped (A's node with it) and made again; another
          // session's node now has A's old name, and another's the name before it.
          const aSession = a.sessions().at(-1)!
          yield* a.faults.disconnect!(aSession)
          yield* other.delete("/wipe/coordinators/election/candidate_0000000000")
          yield* raw.delete("/wipe/coordinators/election/candidate_0000000001").pipe(Effect.ignore)
          yield* raw.delete("/wipe/coordinators/election")
          yield* raw.create("/wipe/coordinators/election", new Uint8Array(0))
          const squatter = yield* other.create("/wipe/coordinators/election/candidate_", bytes("9"), {
            mode: "ephemeral-sequential"
          })
          yield* other.create("/wipe/coordinators/election/candidate_", bytes("9"), { mode: "ephemeral-sequential" })
          assert.strictEqual(squatter, "/wipe/coordinators/election/candidate_0000000000")
          yield* a.faults.reconnect!(aSession)
          yield* TestClock.adjust("1 second")
          yield* settle
          // A made a node of its own behind them and deleted neither of the other session's.
          const names = yield* raw.children("/wipe/coordinators/election")
          assert.strictEqual(names.length, 3, JSON.stringify(names))
          for (const name of names.slice(0, 2)) {
            const stat = yield* raw.exists(`/wipe/coordinators/election/${name}`)
            assert.strictEqual(Option.getOrThrow(stat).ephemeralOwner, other.id)
          }
          assert.isUndefined(ca.fiber.pollUnsafe(), "A waits its turn")
          yield* Scope.close(ca.scope, Exit.void)
        })
      )
    )
  )

  it.effect("a server id registered by an old session is waited for; a live duplicate fails naming it", () =>
    memory(
      Effect.scoped(
        Effect.gen(function* () {
          const a = yield* processOf("ids", "2 seconds")
          const raw = yield* (yield* Coordination.Coordination).session({ timeout: "2 seconds" })
          // A previous incarnation of server 1: killed, its session not yet expired.
          yield* raw.create("/ids/coordinators/ids/1", bytes("{}"), { mode: "ephemeral", createParents: true })
          const faults = a.faults
          yield* faults.disconnect!(raw)
          const ca = yield* campaign(a.election, 1)
          yield* settle
          assert.isUndefined(ca.fiber.pollUnsafe(), "waits for the old registration to go")
          yield* TestClock.adjust("2 seconds")
          const leadership = yield* Fiber.join(ca.fiber)
          const registered = yield* a.election.leader
          assert.strictEqual(Option.getOrThrow(registered).epoch, leadership.epoch)
          const ids = yield* (yield* Coordination.Coordination).session()
          const stat = yield* ids.exists("/ids/coordinators/ids/1")
          assert.strictEqual(Option.getOrThrow(stat).ephemeralOwner, a.sessions().at(-1)!.id)

          // A second server claiming id 1 while the first lives: after waiting out a session, a typed error.
          const b = yield* processOf("ids", "2 seconds")
          const cb = yield* campaign(b.election, 1)
          yield* settle
          yield* TestClock.adjust("3 seconds")
          const duplicate = yield* Effect.flip(Fiber.join(cb.fiber))
          assert.strictEqual(duplicate.reason._tag, "DuplicateServerId", duplicate.message)
          if (duplicate.reason._tag === "DuplicateServerId") {
            assert.strictEqual(duplicate.reason.serverId, 1)
            assert.strictEqual(duplicate.reason.owner, a.sessions().at(-1)!.id)
          }
          yield* Scope.close(cb.scope, Exit.void)
          yield* Scope.close(ca.scope, Exit.void)
        })
      )
    )
  )

  it.effect("a fenced write whose outcome stays unknown fails after the request timeout, not a session's", () =>
    memory(
      Effect.scoped(
        Effect.gen(function* () {
          const coordination = yield* Coordination.Coordination
          let hang = false
          // Sessions whose multi never answers once `hang` is set (the request went out; no reply comes back).
          const silent = Coordination.Coordination.of({
            ...coordination,
            session: (options) =>
              Effect.map(
                coordination.session(options),
                (s): Coordination.Session => ({
                  ...s,
                  multi: (ops) => Effect.suspend(() => (hang ? Effect.never : s.multi(ops)))
                })
              )
          })
          const election = yield* CoordinationElection.make({
            namespace: "unknown",
            sessionTimeout: "10 seconds",
            requestTimeout: "1 second"
          }).pipe(Effect.provideService(Coordination.Coordination, silent))
          const ca = yield* campaign(election, 1)
          const leadership = yield* Fiber.join(ca.fiber)
          hang = true
          const write = yield* Effect.forkChild(
            Effect.flip(leadership.fenced([Coordination.op.create("/unknown-write", bytes("x"))]))
          )
          yield* TestClock.adjust("999 millis")
          assert.isUndefined(write.pollUnsafe(), "still waiting within the request timeout")
          yield* TestClock.adjust("1 millis")
          const error = yield* Fiber.join(write)
          assert.strictEqual(error.reason._tag, "ElectionCoordinationFailed", error.message)
          assert.include(error.message, "request timeout")
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
          // b's leader registration takes 250 ms: its election lasts that long.
          const b = yield* processOf(namespace, "2 seconds", "250 millis")
          const ca = yield* campaign(a.election, 1)
          const first = yield* Fiber.join(ca.fiber)
          assert.isUndefined(first.electionDurationMs, "no previous leader, no vacancy")
          const cb = yield* campaign(b.election, 2)
          yield* settle
          yield* TestClock.adjust("1 second")
          yield* a.expireAll
          yield* settle
          yield* TestClock.adjust("250 millis")
          const second = yield* Fiber.join(cb.fiber)
          assert.strictEqual(second.electionDurationMs, 250)
          yield* Effect.flip(first.fenced([Coordination.op.create("/metrics-write", bytes("x"))]))

          const elections = yield* value(CoordinationElection.metrics.electionsTotal)
          const fenced = yield* value(CoordinationElection.metrics.fencedWritesRejected)
          const wakeups = yield* value(CoordinationElection.metrics.candidateWakeups)
          const failovers = yield* Metric.value(
            Metric.withAttributes(CoordinationElection.metrics.electionDuration, { namespace })
          )
          assert.strictEqual(elections.count, 2)
          assert.strictEqual(fenced.count, 1)
          assert.strictEqual(wakeups.count, 1, "only the successor was woken")
          assert.strictEqual(failovers.count, 1)
          assert.strictEqual(failovers.sum, 0.25, "observed in seconds")
          yield* Scope.close(cb.scope, Exit.void)
          yield* Scope.close(ca.scope, Exit.void)
        })
      )
    ).pipe(Effect.provideService(Metric.MetricRegistry, new Map()))
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

    it.effect("the leadership margin must be shorter than the session timeout; the request timeout above zero", () =>
      Effect.gen(function* () {
        const margin = yield* build({ namespace: "m", sessionTimeout: "2 seconds", leadershipMargin: "2 seconds" })
        assert.strictEqual(margin.reason._tag, "InvalidElectionOptions")
        if (margin.reason._tag === "InvalidElectionOptions") {
          assert.strictEqual(margin.reason.option, "leadershipMargin")
          assert.include(margin.message, "shorter than the session timeout")
        }
        const request = yield* build({ namespace: "m", requestTimeout: "0 millis" })
        assert.strictEqual(request.reason._tag, "InvalidElectionOptions")
        if (request.reason._tag === "InvalidElectionOptions")
          assert.strictEqual(request.reason.option, "requestTimeout")
      })
    )
  })

  it.effect("the layer provides the same service under both keys", () =>
    memory(
      Effect.gen(function* () {
        const context = yield* Layer.build(CoordinationElection.layer({ namespace: "keys" }))
        assert.strictEqual(
          Context.get(context, CoordinationElection.CoordinationElection),
          Context.get(context, Election.Election)
        )
      }).pipe(Effect.scoped)
    )
  )
})
