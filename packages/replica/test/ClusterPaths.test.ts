import { Coordination, MemoryCoordination } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { Array as Arr, Effect, Exit, Fiber, Logger, Schema, Scope } from "effect"
import * as ClusterPaths from "../src/wire/ClusterPaths.js"
import type * as ControllerState from "../src/machines/ControllerState.js"
import { eventually } from "./support/servers.js"

const tablet: ControllerState.Tablet = {
  tablet: { table: "orders", bucket: 3 },
  replicas: [1, 2, 3],
  state: "OnlineTablet",
  leaderAndIsr: { leader: 2, leaderEpoch: 7, isr: [2], coordinatorEpoch: 4, version: 11 },
  registrations: { "2": 40 },
  eligible: [1, 3]
}

describe("ClusterPaths", () => {
  it.effect(
    "a stored tablet reads back whole: registrations, eligible replicas and a move included, version the node's",
    () =>
      Effect.gen(function* () {
        const read = yield* ClusterPaths.decodeTablet("/x", ClusterPaths.encodeTablet(tablet), 12)
        assert.deepStrictEqual(read, { ...tablet, leaderAndIsr: { ...tablet.leaderAndIsr, version: 12 } })
        // A move under way and the replicas it retired are stored too: a new controller goes on from them.
        const moving: ControllerState.Tablet = {
          ...tablet,
          replicas: [1, 4, 2, 3],
          reassignment: { original: [1, 2, 3], target: [1, 4] },
          retired: [5]
        }
        const again = yield* ClusterPaths.decodeTablet("/x", ClusterPaths.encodeTablet(moving), 13)
        assert.deepStrictEqual(again, { ...moving, leaderAndIsr: { ...moving.leaderAndIsr, version: 13 } })
      })
  )

  it.effect(
    "a move's replication throttle is stored with it; a node written without one reads back unthrottled, and one with it reads back under the schema without it",
    () =>
      Effect.gen(function* () {
        const throttled: ControllerState.Tablet = {
          ...tablet,
          replicas: [1, 4, 2, 3],
          reassignment: { original: [1, 2, 3], target: [1, 4], throttleBytesPerSec: 1_000_000 }
        }
        const read = yield* ClusterPaths.decodeTablet("/x", ClusterPaths.encodeTablet(throttled), 11)
        assert.strictEqual(read.reassignment?.throttleBytesPerSec, 1_000_000)
        // What a node without throttles wrote: no field, decoded as a move without a throttle.
        const old = JSON.stringify({ ...throttled, reassignment: { original: [1, 2, 3], target: [1, 4] } })
        const unthrottled = yield* ClusterPaths.decodeTablet("/x", new TextEncoder().encode(old), 11)
        assert.deepStrictEqual(unthrottled.reassignment, { original: [1, 2, 3], target: [1, 4] })
        // A node without throttles reads what this one wrote: its schema, without the field, ignores it.
        const before = Schema.Struct({
          ...ClusterPaths.StoredTablet.fields,
          reassignment: Schema.optional(
            Schema.Struct({ original: Schema.Array(Schema.Int), target: Schema.Array(Schema.Int) })
          )
        })
        const decoded = Schema.decodeUnknownSync(Schema.fromJsonString(before))(
          new TextDecoder().decode(ClusterPaths.encodeTablet(throttled))
        )
        assert.deepStrictEqual(decoded.reassignment, { original: [1, 2, 3], target: [1, 4] })
      })
  )

  it.effect(
    "a table's retention is stored with each tablet; a node written without one reads back without, and one with it reads back under the schema without it",
    () =>
      Effect.gen(function* () {
        const kept: ControllerState.Tablet = { ...tablet, retention: { ms: 86_400_000, bytes: 1_048_576 } }
        const read = yield* ClusterPaths.decodeTablet("/x", ClusterPaths.encodeTablet(kept), 11)
        assert.deepStrictEqual(read.retention, { ms: 86_400_000, bytes: 1_048_576 })
        const timeOnly = yield* ClusterPaths.decodeTablet(
          "/x",
          ClusterPaths.encodeTablet({ ...tablet, retention: { ms: 5 } }),
          11
        )
        assert.deepStrictEqual(timeOnly.retention, { ms: 5 })
        // What a node without retention wrote: no field, read back without one (everything kept).
        const old = yield* ClusterPaths.decodeTablet("/x", ClusterPaths.encodeTablet(tablet), 11)
        assert.isFalse("retention" in old)
        // A node without retention reads what this one wrote: its schema, without the field, ignores it.
        const { retention: _, ...before } = ClusterPaths.StoredTablet.fields
        const decoded = Schema.decodeUnknownSync(Schema.fromJsonString(Schema.Struct(before)))(
          new TextDecoder().decode(ClusterPaths.encodeTablet(kept))
        )
        assert.deepStrictEqual(decoded.leaderAndIsr, kept.leaderAndIsr)
        assert.isFalse("retention" in decoded)
        // A retention that is not one is not a tablet.
        const bad = JSON.stringify({ ...kept, retention: { ms: 0 } })
        const e = yield* Effect.flip(
          ClusterPaths.decodeTablet("/ns/tablets/orders:3", new TextEncoder().encode(bad), 0)
        )
        assert.strictEqual(e._tag, "CorruptClusterData")
      })
  )

  it.effect("a node that is not a tablet is CorruptClusterData naming its path", () =>
    Effect.gen(function* () {
      const e = yield* Effect.flip(ClusterPaths.decodeTablet("/ns/tablets/orders:3", new TextEncoder().encode("{}"), 0))
      assert.strictEqual(e._tag, "CorruptClusterData")
      assert.include(e.message, "/ns/tablets/orders:3")
    })
  )

  it.live(
    "keepRegistered tells each registration, registers again after its session expires, and a second server with the same id waits",
    () =>
      Effect.gen(function* () {
        const base = yield* Coordination.Coordination
        const faults = yield* Coordination.Faults
        const paths = ClusterPaths.make("/kr")
        const sessions: Array<Coordination.Session> = []
        const tracked: Coordination.Shape = {
          ...base,
          session: (o) => Effect.tap(base.session(o), (s) => Effect.sync(() => sessions.push(s)))
        }
        const told: Array<number | undefined> = []
        const options = { address: "a", sessionTimeout: "1 second", firstEpoch: 1, retryBackoff: 10 } as const
        const first = yield* Effect.forkScoped(
          ClusterPaths.keepRegistered(tracked, paths, 7, {
            ...options,
            onRegistered: (r) => Effect.sync(() => told.push(r))
          })
        )
        yield* eventually(Effect.sync(() => told.length === 1))
        const auditor = yield* base.session()
        const node = yield* auditor.get(paths.server(7))
        assert.strictEqual(told[0], node.stat.createdOrder)
        // Its session expires: the registration goes, and a new one (a higher registration epoch) is made.
        yield* faults.expire(sessions[0]!)
        yield* eventually(Effect.sync(() => told.length === 3))
        assert.strictEqual(told[1], undefined)
        const again = yield* auditor.get(paths.server(7))
        assert.strictEqual(told[2], again.stat.createdOrder)
        assert.notStrictEqual(told[2], told[0])
        assert.include(new TextDecoder().decode(again.data), '"registrationEpoch":2')
        // Another server with id 7 waits while the first holds the id, and registers once it is gone.
        const second: Array<number | undefined> = []
        yield* Effect.forkScoped(
          ClusterPaths.keepRegistered(base, paths, 7, {
            ...options,
            address: "b",
            onRegistered: (r) => Effect.sync(() => second.push(r))
          })
        )
        yield* Effect.sleep("100 millis")
        assert.deepStrictEqual(second, [])
        yield* Fiber.interrupt(first)
        yield* eventually(Effect.sync(() => second.length === 1))
        const taken = yield* auditor.get(paths.server(7))
        assert.include(new TextDecoder().decode(taken.data), '"address":"b"')
        assert.strictEqual(second[0], taken.stat.createdOrder)
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )

  it.live(
    "keepRegistered with holderWaitTimeouts fails with DuplicateServerId naming the id and the holder's address when another live session keeps the id past the wait; it never tells a registration",
    () =>
      Effect.gen(function* () {
        const coordination = yield* Coordination.Coordination
        const paths = ClusterPaths.make("/dup")
        // Server 7, alive: its session stays.
        const holder = yield* coordination.session()
        yield* ClusterPaths.register(holder, paths, 7, { address: "127.0.0.1:7007", registrationEpoch: 3 })
        const told: Array<number | undefined> = []
        const error = yield* Effect.flip(
          ClusterPaths.keepRegistered(coordination, paths, 7, {
            address: "127.0.0.1:7008",
            sessionTimeout: "200 millis",
            firstEpoch: 0,
            retryBackoff: 10,
            holderWaitTimeouts: 2,
            onRegistered: (r) => Effect.sync(() => told.push(r))
          }).pipe(
            // A bound on the test only: the wait must end by itself well before.
            Effect.timeoutOrElse({
              duration: "10 seconds",
              orElse: () => Effect.fail(new Error("keepRegistered still waits for the id after 10 s"))
            })
          )
        )
        assert.instanceOf(error, ClusterPaths.DuplicateServerId, error.message)
        assert.include(error.message, "server id 7")
        assert.include(error.message, "127.0.0.1:7007")
        assert.deepStrictEqual(
          told.filter((r) => r !== undefined),
          []
        )
        // The holder's registration is untouched.
        const node = yield* holder.get(paths.server(7))
        assert.include(new TextDecoder().decode(node.data), '"address":"127.0.0.1:7007"')
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )

  it.live(
    "keepRegistered with holderWaitTimeouts waits out a registration that ends within the wait (a previous life)",
    () =>
      Effect.gen(function* () {
        const coordination = yield* Coordination.Coordination
        const paths = ClusterPaths.make("/prev")
        const previous = yield* Scope.make()
        const session = yield* Scope.provide(coordination.session(), previous)
        yield* ClusterPaths.register(session, paths, 7, { address: "127.0.0.1:7007", registrationEpoch: 3 })
        const warnings: Array<string> = []
        const told: Array<number | undefined> = []
        yield* Effect.forkScoped(
          ClusterPaths.keepRegistered(coordination, paths, 7, {
            address: "127.0.0.1:7008",
            sessionTimeout: "2 seconds",
            firstEpoch: 4,
            retryBackoff: 10,
            holderWaitTimeouts: 5,
            onRegistered: (r) => Effect.sync(() => told.push(r))
          }).pipe(
            Effect.provide(
              Logger.layer([Logger.make((o) => warnings.push(Arr.ensure(o.message).map(String).join(" ")))])
            )
          )
        )
        // It found the id held, and says whose it is; then the previous life's session ends.
        yield* eventually(Effect.sync(() => warnings.some((w) => w.includes("is registered by another session"))))
        assert.include(warnings.join("\n"), "127.0.0.1:7007")
        assert.deepStrictEqual(told, [])
        yield* Scope.close(previous, Exit.void)
        yield* eventually(Effect.sync(() => told.length === 1))
        const auditor = yield* coordination.session()
        const taken = yield* auditor.get(paths.server(7))
        assert.include(new TextDecoder().decode(taken.data), '"address":"127.0.0.1:7008"')
        assert.strictEqual(told[0], taken.stat.createdOrder)
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )
})
