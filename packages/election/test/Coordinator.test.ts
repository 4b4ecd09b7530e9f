import { Coordination, Election, Errors, MemoryCoordination } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import {
  Array as Arr,
  Cause,
  Config,
  ConfigProvider,
  Deferred,
  Duration,
  Effect,
  Exit,
  Fiber,
  Layer,
  Logger,
  Option,
  References,
  Scope,
  Stream
} from "effect"
import { TestClock } from "effect/testing"
import * as CoordinationElection from "../src/CoordinationElection.js"
import * as Coordinator from "../src/Coordinator.js"
import type { State } from "../src/CoordinatorLifecycle.js"

const namespace = "/coordinator-test"

/** Every log line, with the coordinator (server id) that logged it. */
interface Line {
  readonly coordinator: unknown
  readonly message: string
}

const captureLogs = (lines: Array<Line>) =>
  Logger.layer([
    Logger.make((options) => {
      lines.push({
        coordinator: options.fiber.getRef(References.CurrentLogAnnotations).coordinator,
        message: Arr.ensure(options.message).map(String).join(" ")
      })
    })
  ])

/**
 * Memory coordination, logs captured into `lines` (and kept off the test output); the
 * coordinators started by the test close with its scope, before the coordination.
 */
const withMemory =
  (lines: Array<Line> = []) =>
  <A, E, R>(effect: Effect.Effect<A, E, R>) =>
    effect.pipe(Effect.scoped, Effect.provide(Layer.merge(MemoryCoordination.layer(), captureLogs(lines))))

/** A leader service recording its acquisition and release into `events`. */
const recorded = (events: Array<string>, serverId: number, name: string) =>
  Coordinator.service(name, () =>
    Effect.acquireRelease(
      Effect.sync(() => {
        events.push(`${serverId} acquire ${name}`)
      }),
      () =>
        Effect.sync(() => {
          events.push(`${serverId} release ${name}`)
        })
    )
  )

/** A leader service whose first `failures` acquisitions fail. */
const flaky = (events: Array<string>, serverId: number, name: string, failures: number) => {
  let remaining = failures
  const healthy = recorded(events, serverId, name)
  return Coordinator.service(name, (leadership) =>
    Effect.suspend(() => {
      if (remaining <= 0) return healthy.acquire(leadership)
      remaining--
      events.push(`${serverId} fail ${name}`)
      return Effect.fail(new Error("boom"))
    })
  )
}

interface Node {
  readonly serverId: number
  readonly coordinator: Coordinator.CoordinatorShape
  readonly scope: Scope.Closeable
  /** Its own election (each server runs one). */
  readonly election: Election.Shape
  /** Sessions its election opened, in order: the observer first, then one per campaign. */
  readonly sessions: Array<Coordination.Session>
  /** Every state it went through, from the one it had when started. */
  readonly states: Array<State>
  /** The session of its latest campaign. */
  readonly campaignSession: () => Coordination.Session
}

/** Starts a coordinator with its own election (as a separate server would have) on the shared coordination. */
const start = (
  serverId: number,
  services: ReadonlyArray<Coordinator.LeaderService>,
  rejoinBackoff: Duration.Input = 0
): Effect.Effect<Node, never, Coordination.Coordination | Scope.Scope> =>
  Effect.gen(function* () {
    const coordination = yield* Coordination.Coordination
    const sessions: Array<Coordination.Session> = []
    const recording: Coordination.Shape = {
      backend: coordination.backend,
      session: (options) =>
        coordination.session(options).pipe(
          Effect.tap((s) =>
            Effect.sync(() => {
              sessions.push(s)
            })
          )
        )
    }
    const scope = yield* Scope.fork(yield* Effect.scope, "sequential")
    const election = yield* CoordinationElection.make({ namespace }).pipe(
      Effect.provideService(Coordination.Coordination, recording),
      Scope.provide(scope),
      Effect.orDie
    )
    const coordinator = yield* Coordinator.make({
      serverId,
      address: `127.0.0.1:${9000 + serverId}`,
      services,
      rejoinBackoff
    }).pipe(Effect.provideService(Election.Election, election), Scope.provide(scope), Effect.orDie)
    const states: Array<State> = []
    yield* coordinator.changes.pipe(
      Stream.runForEach((s) =>
        Effect.sync(() => {
          states.push(s)
        })
      ),
      Effect.forkIn(scope, { startImmediately: true })
    )
    const campaignSession = () => {
      const last = sessions[sessions.length - 1]
      if (sessions.length < 2 || last === undefined) throw new Error(`server ${serverId} has no campaign session`)
      return last
    }
    return { serverId, coordinator, scope, election, sessions, states, campaignSession }
  })

const close = (node: Node) => Scope.close(node.scope, Exit.void)

/** A coordinator (server 7, no backoff) on a fake election whose `campaign` is given, in a scope of its own. */
const onFakeElection = (
  campaign: Election.Shape["campaign"],
  services: ReadonlyArray<Coordinator.LeaderService> = []
) =>
  Effect.gen(function* () {
    const election: Election.Shape = { leader: Effect.succeed(Option.none()), changes: Stream.empty, campaign }
    const scope = yield* Scope.make()
    const coordinator = yield* Coordinator.make({ serverId: 7, address: "x", rejoinBackoff: 0, services }).pipe(
      Effect.provideService(Election.Election, election),
      Scope.provide(scope)
    )
    return { coordinator, scope } as const
  })

/** A leadership of a fake election: always proven, never lapsing, `lost` as given. */
const fakeLeadership = (
  candidate: { readonly serverId: number; readonly address: string },
  epoch: number,
  lost: Effect.Effect<Election.LeadershipEnd>
): Election.Leadership => ({
  epoch,
  info: { serverId: candidate.serverId, epoch, address: candidate.address },
  electionDurationMs: undefined,
  connection: Stream.make("connected"),
  lost,
  deadline: Effect.succeed(Number.MAX_SAFE_INTEGER),
  isLeader: Effect.succeed(true),
  guard: Effect.void,
  proven: Stream.make(true),
  fenced: () => Effect.succeed([])
})

/** Lets the other fibers run until nothing is left to do now (the clock does not move). */
const settle = Effect.gen(function* () {
  for (let i = 0; i < 50; i++) yield* Effect.yieldNow
})

const isElecting = (s: State) => s._tag === "Electing"
const epochOf = (s: State) => (s._tag === "Leader" ? s.epoch : undefined)

describe("Coordinator", () => {
  it.effect("acquires the leader services in order inside one scope and releases them in reverse on close", () =>
    Effect.gen(function* () {
      const events: Array<string> = []
      const c1 = yield* start(1, [recorded(events, 1, "a"), recorded(events, 1, "b"), recorded(events, 1, "c")])
      const leadership = yield* c1.coordinator.awaitLeader
      assert.strictEqual(leadership.epoch, 1)
      assert.deepStrictEqual(events, ["1 acquire a", "1 acquire b", "1 acquire c"])
      assert.deepStrictEqual(yield* c1.coordinator.state, { _tag: "Leader", serverId: 1, epoch: 1, phase: "Ready" })
      assert.isTrue(yield* c1.coordinator.isLeader)
      const held = yield* c1.coordinator.leadership
      assert.isTrue(Option.isSome(held) && held.value === leadership)
      // The leadership handed out makes fenced writes.
      yield* leadership.fenced([Coordination.op.create(`${namespace}/written-by-1`, new Uint8Array(0))])

      yield* close(c1)
      assert.deepStrictEqual(events, [
        "1 acquire a",
        "1 acquire b",
        "1 acquire c",
        "1 release c",
        "1 release b",
        "1 release a"
      ])
      assert.deepStrictEqual(yield* c1.coordinator.state, { _tag: "Down", serverId: 1 })
      assert.isTrue(Option.isNone(yield* c1.coordinator.leadership))
      yield* c1.coordinator.join
      assert.isTrue(c1.states.some((s) => s._tag === "Leader" && s.phase === "Ready"))
      // The leadership was given up: its next write is refused.
      const refused = yield* Effect.flip(
        leadership.fenced([Coordination.op.create(`${namespace}/late`, new Uint8Array(0))])
      )
      assert.strictEqual(refused._tag, "ElectionError")
    }).pipe(withMemory())
  )

  it.effect(
    "leader session expiry: services released in reverse, another leads with a higher epoch, the old one rejoins",
    () =>
      Effect.gen(function* () {
        const events: Array<string> = []
        const services = (id: number) => [recorded(events, id, "a"), recorded(events, id, "b")]
        const c1 = yield* start(1, services(1), "1 second")
        const first = yield* c1.coordinator.awaitLeader
        assert.strictEqual(first.epoch, 1)
        const c2 = yield* start(2, services(2), "1 second")
        const c3 = yield* start(3, services(3), "1 second")
        yield* c2.coordinator.awaitState(isElecting)
        yield* c3.coordinator.awaitState(isElecting)
        yield* settle
        assert.deepStrictEqual(events, ["1 acquire a", "1 acquire b"])

        const faults = yield* Coordination.Faults
        yield* faults.expire(c1.campaignSession())

        const second = yield* Effect.raceFirst(c2.coordinator.awaitLeader, c3.coordinator.awaitLeader)
        assert.isTrue(second.epoch > first.epoch)
        assert.strictEqual(second.epoch, 2)
        const winner = second.info.serverId === 2 ? c2 : c3
        const loser = winner === c2 ? c3 : c2
        assert.strictEqual(epochOf(yield* winner.coordinator.state), 2)
        assert.isTrue(isElecting(yield* loser.coordinator.state), "exactly one leads")

        // The old leader released its services in reverse and stands by, not campaigning before the backoff.
        const standby = yield* c1.coordinator.awaitState((s) => s._tag === "Standby")
        assert.deepStrictEqual(standby, { _tag: "Standby", serverId: 1, started: true, lastEpoch: 1 })
        assert.deepStrictEqual(
          events.filter((e) => e.startsWith("1 ")),
          ["1 acquire a", "1 acquire b", "1 release b", "1 release a"]
        )
        assert.deepStrictEqual(
          events.filter((e) => e.startsWith(`${winner.serverId} `)),
          [`${winner.serverId} acquire a`, `${winner.serverId} acquire b`]
        )
        assert.isTrue(Option.isNone(yield* c1.coordinator.leadership))
        yield* settle
        assert.strictEqual((yield* c1.coordinator.state)._tag, "Standby", "waits for the rejoin backoff")

        // After the backoff it becomes a candidate again.
        for (let i = 0; i < 20 && !isElecting(yield* c1.coordinator.state); i++) {
          yield* TestClock.adjust("100 millis")
          yield* settle
        }
        assert.deepStrictEqual(yield* c1.coordinator.state, { _tag: "Electing", serverId: 1, lastEpoch: 1 })
        assert.deepStrictEqual(
          c1.states.slice(c1.states.findIndex((s) => s._tag === "Leader")).map((s) => [s._tag, epochOf(s)]),
          [
            ["Leader", 1],
            ["Leader", 1],
            ["Standby", undefined],
            ["Electing", undefined]
          ]
        )
        // The old leadership is fenced.
        const stale = yield* Effect.flip(
          first.fenced([Coordination.op.create(`${namespace}/stale`, new Uint8Array(0))])
        )
        assert.strictEqual(stale.reason._tag, "FencedEpoch")
        // Still one leader, the new one.
        assert.strictEqual(epochOf(yield* winner.coordinator.state), 2)
        const observed = yield* Effect.orDie(c1.election.leader)
        assert.deepStrictEqual(
          Option.map(observed, (l) => [l.serverId, l.epoch]),
          Option.some([winner.serverId, 2])
        )
      }).pipe(withMemory())
  )

  it.effect("a leader service failing to start releases the ones built, rejoins, and a later leadership succeeds", () =>
    Effect.gen(function* () {
      const events: Array<string> = []
      const lines: Array<Line> = []
      const c1 = yield* start(1, [recorded(events, 1, "a"), flaky(events, 1, "b", 1), recorded(events, 1, "c")]).pipe(
        Effect.provide(captureLogs(lines))
      )
      const leadership = yield* c1.coordinator.awaitLeader
      assert.strictEqual(leadership.epoch, 2, "the first leadership (epoch 1) was given up")
      assert.deepStrictEqual(events, [
        "1 acquire a",
        "1 fail b",
        "1 release a",
        "1 acquire a",
        "1 acquire b",
        "1 acquire c"
      ])
      assert.deepStrictEqual(
        c1.states
          .map((s) => (s._tag === "Leader" ? `Leader ${s.epoch} ${s.phase}` : s._tag))
          .filter((s) => s !== "Standby"),
        ["Electing", "Leader 1 Initialising", "Electing", "Leader 2 Initialising", "Leader 2 Ready"]
      )
      assert.isTrue(lines.some((l) => l.message === "leader services failed to start: b: boom"))
      yield* close(c1)
      assert.deepStrictEqual(events.slice(6), ["1 release c", "1 release b", "1 release a"])
    }).pipe(withMemory())
  )

  it.effect(
    "a connection blip well inside the deadline changes nothing; one past the session timeout hands over",
    () => {
      const lines: Array<Line> = []
      return Effect.gen(function* () {
        const events: Array<string> = []
        const services = (id: number) => [recorded(events, id, "a"), recorded(events, id, "b")]
        const c1 = yield* start(1, services(1))
        const first = yield* c1.coordinator.awaitLeader
        const c2 = yield* start(2, services(2))
        yield* c2.coordinator.awaitState(isElecting)
        yield* settle
        const statesBefore = c1.states.length
        const faults = yield* Coordination.Faults
        const session = c1.campaignSession()
        assert.strictEqual(Duration.toMillis(session.timeout), 10_000, "the default session timeout")

        yield* faults.disconnect!(session)
        yield* TestClock.adjust("5 seconds")
        yield* settle
        yield* faults.reconnect!(session)
        yield* settle
        yield* TestClock.adjust("1 minute")
        yield* settle

        assert.deepStrictEqual(yield* c1.coordinator.state, { _tag: "Leader", serverId: 1, epoch: 1, phase: "Ready" })
        const held = yield* c1.coordinator.leadership
        assert.isTrue(Option.isSome(held) && held.value === first, "the same leadership")
        assert.strictEqual(c1.states.length, statesBefore, "no state change")
        assert.deepStrictEqual(events, ["1 acquire a", "1 acquire b"], "services not restarted")
        assert.isTrue(isElecting(yield* c2.coordinator.state))
        yield* first.fenced([Coordination.op.create(`${namespace}/after-blip`, new Uint8Array(0))])
        // The shell fed the blip to the machine, which kept the leadership and said so.
        assert.deepStrictEqual(
          lines.filter((l) => l.coordinator === 1 && l.message.startsWith("connection")).map((l) => l.message),
          [
            "connection suspended, leading on with epoch 1 while the deadline holds",
            "connection restored, still leader with epoch 1"
          ]
        )

        // The same fault held past the timeout does hand over.
        yield* faults.disconnect!(session)
        yield* TestClock.adjust("10 seconds")
        const second = yield* c2.coordinator.awaitLeader
        assert.strictEqual(second.epoch, 2)
        yield* c1.coordinator.awaitState((s) => s._tag !== "Leader")
        assert.deepStrictEqual(
          events.filter((e) => e.startsWith("1 ")),
          ["1 acquire a", "1 acquire b", "1 release b", "1 release a"]
        )
      }).pipe(withMemory(lines))
    }
  )

  it.effect("resign hands the leadership over; the resigned coordinator campaigns again", () =>
    Effect.gen(function* () {
      const events: Array<string> = []
      const services = (id: number) => [recorded(events, id, "a"), recorded(events, id, "b")]
      const c1 = yield* start(1, services(1))
      yield* c1.coordinator.awaitLeader
      const c2 = yield* start(2, services(2))
      yield* c2.coordinator.awaitState(isElecting)
      yield* c2.coordinator.resign // not leading: nothing happens
      yield* c1.coordinator.resign
      const second = yield* c2.coordinator.awaitLeader
      assert.strictEqual(second.epoch, 2)
      yield* c1.coordinator.awaitState(isElecting)
      assert.deepStrictEqual(yield* c1.coordinator.state, { _tag: "Electing", serverId: 1, lastEpoch: 1 })
      assert.deepStrictEqual(events, [
        "1 acquire a",
        "1 acquire b",
        "1 release b",
        "1 release a",
        "2 acquire a",
        "2 acquire b"
      ])
    }).pipe(withMemory())
  )

  it.effect("a leader fenced by a newer epoch releases its services and campaigns again", () =>
    Effect.gen(function* () {
      const events: Array<string> = []
      const c1 = yield* start(1, [recorded(events, 1, "a"), recorded(events, 1, "b")])
      const first = yield* c1.coordinator.awaitLeader
      // Someone else bumps the epoch behind the leader's back.
      const raw = yield* (yield* Coordination.Coordination).session()
      const epochNode = yield* raw.get(`${namespace}/coordinators/epoch`)
      yield* raw.set(`${namespace}/coordinators/epoch`, new TextEncoder().encode("5"), epochNode.stat.version)
      const next = yield* c1.coordinator.awaitState((s) => s._tag === "Leader" && s.epoch > first.epoch)
      assert.deepStrictEqual(next, { _tag: "Leader", serverId: 1, epoch: 6, phase: "Initialising" })
      const again = yield* c1.coordinator.awaitLeader
      assert.strictEqual(again.epoch, 6)
      assert.deepStrictEqual(
        c1.states.slice(c1.states.findIndex((s) => s._tag === "Leader")).map((s) => `${s._tag} ${epochOf(s) ?? ""}`),
        ["Leader 1", "Leader 1", "Standby ", "Electing ", "Leader 6", "Leader 6"]
      )
      assert.deepStrictEqual(c1.states.filter((s) => s._tag === "Standby" && s.started).at(-1), {
        _tag: "Standby",
        serverId: 1,
        started: true,
        lastEpoch: 5
      })
      assert.deepStrictEqual(events, [
        "1 acquire a",
        "1 acquire b",
        "1 release b",
        "1 release a",
        "1 acquire a",
        "1 acquire b"
      ])
    }).pipe(withMemory())
  )

  it.effect("closing a standby ends in Down; waiting for leadership on a closed coordinator fails", () =>
    Effect.gen(function* () {
      const events: Array<string> = []
      const c1 = yield* start(1, [recorded(events, 1, "a")])
      yield* c1.coordinator.awaitLeader
      const c2 = yield* start(2, [recorded(events, 2, "a")])
      yield* c2.coordinator.awaitState(isElecting)
      const waiting = yield* Effect.forkChild(c2.coordinator.awaitLeader)
      yield* close(c2)
      assert.deepStrictEqual(yield* c2.coordinator.state, { _tag: "Down", serverId: 2 })
      const exit = yield* Fiber.await(waiting)
      assert.isTrue(Exit.isFailure(exit))
      assert.deepStrictEqual(
        Exit.isFailure(exit) ? Option.map(Cause.findErrorOption(exit.cause), (e) => e._tag) : Option.none(),
        Option.some("CoordinatorClosed")
      )
      assert.deepStrictEqual(events, ["1 acquire a"], "a standby had nothing to release")
      // c1 is unaffected and c2's candidate is gone: closing c1 leaves nobody to take over.
      assert.isTrue(yield* c1.coordinator.isLeader)
      yield* close(c1)
      assert.deepStrictEqual(events, ["1 acquire a", "1 release a"])
    }).pipe(withMemory())
  )

  it.effect(
    "logs standby start, candidate node created, Became coordinator leader and leader services started once each",
    () =>
      Effect.gen(function* () {
        const lines: Array<Line> = []
        const events: Array<string> = []
        yield* Effect.gen(function* () {
          const c1 = yield* start(1, [recorded(events, 1, "a")])
          yield* c1.coordinator.awaitLeader
          const c2 = yield* start(2, [recorded(events, 2, "a")])
          yield* c2.coordinator.awaitState(isElecting)
          yield* settle
          const faults = yield* Coordination.Faults
          yield* faults.expire(c1.campaignSession())
          yield* c2.coordinator.awaitLeader
          yield* c1.coordinator.awaitState(isElecting)
          yield* settle
        }).pipe(Effect.provide(captureLogs(lines)))

        const count = (coordinator: number, test: (message: string) => boolean) =>
          lines.filter((l) => l.coordinator === coordinator && test(l.message)).length
        const exactly = (message: string) => (m: string) => m === message
        const candidate = (m: string) => m.startsWith("candidate node created")

        assert.strictEqual(count(1, exactly("standby start")), 1)
        assert.strictEqual(count(1, candidate), 2, "server 1 campaigned twice")
        assert.strictEqual(count(1, exactly("Became coordinator leader with epoch 1")), 1)
        assert.strictEqual(count(1, exactly("leader services started")), 1)

        assert.strictEqual(count(2, exactly("standby start")), 1)
        assert.strictEqual(count(2, candidate), 1)
        assert.strictEqual(count(2, exactly("Became coordinator leader with epoch 2")), 1)
        assert.strictEqual(count(2, exactly("leader services started")), 1)

        assert.strictEqual(lines.filter((l) => l.message.startsWith("Became coordinator leader")).length, 2)
        assert.strictEqual(lines.filter((l) => l.message === "leader services started").length, 2)
        assert.strictEqual(lines.filter((l) => l.message === "standby start").length, 2)
      }).pipe(withMemory())
  )

  it.effect("a failed campaign rejoins; inputs of a torn-down leadership are dropped, not fed to the machine", () =>
    Effect.gen(function* () {
      // Campaign 1 fails, campaign 2 wins epoch 1 and loses it at once (its services still starting),
      // campaign 3 wins epoch 2 and keeps it.
      const events: Array<string> = []
      let campaigns = 0
      const election: Election.Shape["campaign"] = (candidate) =>
        Effect.gen(function* () {
          const n = ++campaigns
          events.push(`campaign ${n}`)
          yield* Effect.addFinalizer(() =>
            Effect.sync(() => {
              events.push(`campaign ${n} closed`)
            })
          )
          if (n === 1) {
            return yield* Effect.fail(
              new Election.ElectionError({
                reason: new Election.CoordinationFailed({
                  cause: Coordination.coordinationError(new Coordination.ConnectionLoss({ detail: "test" }))
                })
              })
            )
          }
          return fakeLeadership(candidate, n - 1, n === 2 ? Effect.succeed({ _tag: "SessionLost" }) : Effect.never)
        })
      const { coordinator, scope } = yield* onFakeElection(election, [recorded(events, 7, "a")])
      const leadership = yield* coordinator.awaitLeader
      assert.strictEqual(leadership.epoch, 2)
      yield* settle
      assert.deepStrictEqual(yield* coordinator.state, { _tag: "Leader", serverId: 7, epoch: 2, phase: "Ready" })
      assert.deepStrictEqual(
        events.filter((e) => e.startsWith("campaign")),
        ["campaign 1", "campaign 1 closed", "campaign 2", "campaign 2 closed", "campaign 3"]
      )
      assert.strictEqual(
        events.filter((e) => e === "7 acquire a").length - events.filter((e) => e === "7 release a").length,
        1
      )
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(events.slice(-2), ["7 release a", "campaign 3 closed"])
      yield* coordinator.join
    }).pipe(withMemory())
  )

  it.effect(
    "a campaign the coordination refuses (NotAuthorized) stops the coordinator: Down with the refusal, no second campaign",
    () =>
      Effect.gen(function* () {
        let campaigns = 0
        const refusing: Election.Shape["campaign"] = () =>
          Effect.suspend(() => {
            campaigns++
            return Effect.fail(
              new Election.ElectionError({
                reason: new Election.CoordinationFailed({
                  cause: Coordination.coordinationError(
                    new Coordination.NotAuthorized({ path: "/strata/coordinators", detail: "NoAuth" })
                  )
                })
              })
            )
          })
        const { coordinator, scope } = yield* onFakeElection(refusing)
        const down = yield* coordinator.awaitState((s) => s._tag === "Down")
        assert.strictEqual(down._tag, "Down")
        assert.include(down._tag === "Down" ? (down.refused ?? "") : "", "NoAuth")
        yield* coordinator.join
        yield* settle
        assert.strictEqual(campaigns, 1)
        yield* Scope.close(scope, Exit.void)
      }).pipe(withMemory())
  )

  it.effect("a 'ready' queued behind the session loss of its leadership is dropped, not fed to the machine", () =>
    Effect.gen(function* () {
      const events: Array<string> = []
      const gate = yield* Deferred.make<void>()
      const firstLost = yield* Deferred.make<Election.LeadershipEnd>()
      let campaigns = 0
      const election: Election.Shape["campaign"] = (candidate) =>
        Effect.sync(() => {
          const epoch = ++campaigns
          return fakeLeadership(candidate, epoch, epoch === 1 ? Deferred.await(firstLost) : Effect.never)
        })
      const slow = Coordinator.service("slow", (leadership) =>
        Effect.acquireRelease(
          Deferred.await(gate).pipe(
            Effect.andThen(
              Effect.sync(() => {
                events.push(`acquire ${leadership.epoch}`)
              })
            )
          ),
          () =>
            Effect.sync(() => {
              events.push(`release ${leadership.epoch}`)
            })
        )
      )
      const { coordinator, scope } = yield* onFakeElection(election, [slow])
      yield* coordinator.awaitState((s) => s._tag === "Leader" && s.phase === "Initialising")
      yield* settle // the service is now waiting on the gate
      // In one step: the session is lost, then the service finishes starting. The shell sees
      // SessionLost first and tears the leadership down; the 'ready' that follows is stale.
      yield* Deferred.succeed(firstLost, { _tag: "SessionLost" })
      yield* Deferred.succeed(gate, undefined)
      const again = yield* coordinator.awaitLeader
      assert.strictEqual(again.epoch, 2)
      assert.deepStrictEqual(yield* coordinator.state, { _tag: "Leader", serverId: 7, epoch: 2, phase: "Ready" })
      assert.deepStrictEqual(events, ["acquire 1", "release 1", "acquire 2"])
      yield* Scope.close(scope, Exit.void)
      yield* coordinator.join
    }).pipe(withMemory())
  )

  it.effect("layerConfig: a coordinator as a layer, its server id and address from configuration", () =>
    Effect.gen(function* () {
      const events: Array<string> = []
      const layer = Coordinator.layerConfig(
        { serverId: Config.Int("SERVER_ID"), address: Config.String("ADDRESS") },
        { services: [recorded(events, 4, "a"), recorded(events, 4, "b")] }
      ).pipe(
        Layer.provide(CoordinationElection.layer({ namespace })),
        Layer.provide(ConfigProvider.layer(ConfigProvider.fromUnknown({ SERVER_ID: "4", ADDRESS: "10.0.0.4:9123" })))
      )
      const observed = yield* Effect.gen(function* () {
        const coordinator = yield* Coordinator.Coordinator
        const leadership = yield* coordinator.awaitLeader
        assert.deepStrictEqual(leadership.info, { serverId: 4, epoch: 1, address: "10.0.0.4:9123" })
        return coordinator
      }).pipe(Effect.provide(layer))
      // The layer's scope closed: the coordinator is down and its services released in reverse.
      assert.deepStrictEqual(yield* observed.state, { _tag: "Down", serverId: 4 })
      assert.deepStrictEqual(events, ["4 acquire a", "4 acquire b", "4 release b", "4 release a"])
    }).pipe(withMemory())
  )

  it.effect("an epoch that does not grow is given up, never led with, and the coordinator campaigns again", () =>
    Effect.gen(function* () {
      // An election that (wrongly) hands out epoch 1 twice, then epoch 2.
      const events: Array<string> = []
      const epochs = [1, 1, 2]
      let campaigns = 0
      const ends: Array<Deferred.Deferred<Election.LeadershipEnd>> = []
      const broken: Election.Shape["campaign"] = (candidate) =>
        Effect.gen(function* () {
          const n = campaigns++
          yield* Effect.addFinalizer(() => Effect.sync(() => events.push(`campaign ${n} closed`)))
          const lost = yield* Deferred.make<Election.LeadershipEnd>()
          ends.push(lost)
          return fakeLeadership(candidate, epochs[n] ?? 99, Deferred.await(lost))
        })
      const { coordinator, scope } = yield* onFakeElection(broken, [recorded(events, 7, "a")])
      yield* coordinator.awaitLeader
      yield* Deferred.succeed(ends[0]!, { _tag: "SessionLost" })
      const again = yield* coordinator.awaitState((s) => s._tag === "Leader" && s.phase === "Ready" && s.epoch === 2)
      assert.deepStrictEqual(again, { _tag: "Leader", serverId: 7, epoch: 2, phase: "Ready" })
      assert.deepStrictEqual(events, [
        "7 acquire a",
        "7 release a",
        "campaign 0 closed",
        // Epoch 1 again: its campaign is closed at once (the leader node goes with its session), nothing acquired.
        "campaign 1 closed",
        "7 acquire a"
      ])
      yield* Scope.close(scope, Exit.void)
      yield* coordinator.join
    }).pipe(withMemory())
  )

  it.effect("a shell killed by an illegal transition releases its services and its campaign before it dies", () =>
    Effect.gen(function* () {
      // An election whose leadership reports being fenced by a lower epoch than its own: the machine refuses it.
      const events: Array<string> = []
      const lost = yield* Deferred.make<Election.LeadershipEnd>()
      const broken: Election.Shape["campaign"] = (candidate) =>
        Effect.gen(function* () {
          yield* Effect.addFinalizer(() => Effect.sync(() => events.push("campaign closed")))
          return fakeLeadership(candidate, 3, Deferred.await(lost))
        })
      const { coordinator, scope } = yield* onFakeElection(broken, [recorded(events, 7, "a")])
      yield* coordinator.awaitLeader
      const waiting = yield* Effect.forkChild(coordinator.awaitState((s) => s._tag === "Electing"))
      yield* Deferred.succeed(lost, { _tag: "Fenced", epoch: 2 })
      const exit = yield* Effect.exit(coordinator.join)
      assert.isTrue(Exit.isFailure(exit))
      const defect = Exit.isFailure(exit) ? Cause.squash(exit.cause) : undefined
      assert.instanceOf(defect, Errors.IllegalStateTransition)
      assert.strictEqual((defect as Errors.IllegalStateTransition).from, "Leader(epoch 3, Ready)")
      // Nothing outlives the shell: the services were released and the campaign (its session and nodes) closed.
      assert.deepStrictEqual(events, ["7 acquire a", "7 release a", "campaign closed"])
      assert.deepStrictEqual(yield* coordinator.state, { _tag: "Down", serverId: 7 })
      assert.isTrue(Option.isNone(yield* coordinator.leadership))
      const waited = yield* Fiber.await(waiting)
      assert.isTrue(Exit.isFailure(waited), "waiters end with it rather than hang")
      yield* Scope.close(scope, Exit.void)
    }).pipe(withMemory())
  )
})
