/**
 * Tablet servers talking over TCP on loopback (`ReplicaRpc` served, `RemotePeers` calling): the controller's
 * instructions, acks=all appends whose follower fetches cross the wire, reads, typed errors that arrive as
 * themselves, and a stopped server or a bad address answered with `PeerUnreachable` within the request timeout.
 */
import { Models } from "@strata/core"
import type * as ReplicaManager from "../src/protocol/ReplicaManager.js"
import { assert, describe, it } from "@effect/vitest"
import { Cause, Context, Effect, Exit, Fiber, Layer, Scope } from "effect"
import * as DataLink from "../src/wire/DataLink.js"
import { Peers, PeerUnreachable } from "../src/wire/Peers.js"
import * as RemotePeers from "../src/client/RemotePeers.js"
import type * as ControllerState from "../src/machines/ControllerState.js"
import * as Reassignment from "../src/machines/Reassignment.js"
import type { ControllerShape } from "../src/server/Controller.js"
import { formatAddress, parseAddress, ReassignRefused, serveTabletServerWith } from "../src/wire/ReplicaRpc.js"
import { serveController } from "../src/server/ControllerRpc.js"
import { serveTabletServer } from "../src/server/TabletServerRpc.js"
import * as ServerStorage from "../src/server/ServerStorage.js"
import * as TabletServer from "../src/server/TabletServer.js"

const tablet = { table: "orders", bucket: 0 }
const replication = {
  minInsyncReplicas: 2,
  fetchMaxWait: 50,
  retryBackoff: 20,
  replicaLagTimeMax: 60_000,
  appendTimeout: 1_000
}
const text = (s: string): ReplicaManager.TabletRecord => ({
  key: null,
  value: new TextEncoder().encode(s),
  headers: [],
  timestamp: 0
})
const decoded = (batches: ReadonlyArray<{ readonly records: ReadonlyArray<ReplicaManager.TabletRecord> }>) =>
  batches.flatMap((b) => b.records.map((r) => new TextDecoder().decode(r.value)))

/** A leading controller whose every call dies: a test overrides the calls it serves. */
const unusedController: ControllerShape = {
  coordinatorEpoch: 2,
  resumed: { tablets: 0, read: 0, full: true },
  balanceLeaders: Effect.die("unused"),
  electPreferred: () => Effect.die("unused"),
  serverHealth: () => Effect.die("unused"),
  initProducerId: Effect.die("unused"),
  replicaStorage: () => Effect.die("unused"),
  deleteTablets: () => Effect.die("unused"),
  createTablets: () => Effect.die("unused"),
  reassign: () => Effect.die("unused"),
  cancelReassign: () => Effect.die("unused"),
  adjustIsr: () => Effect.die("unused"),
  controlledShutdown: () => Effect.die("unused"),
  state: Effect.die("unused")
}

describe("ReplicaRpc over TCP", () => {
  it("addresses parse and format, IPv6 in brackets", () => {
    assert.deepStrictEqual(parseAddress("127.0.0.1:9000"), { host: "127.0.0.1", port: 9000 })
    assert.deepStrictEqual(parseAddress("[::1]:9000"), { host: "::1", port: 9000 })
    assert.strictEqual(formatAddress({ host: "::1", port: 9000 }), "[::1]:9000")
    for (const bad of ["9000", "host", "host:0", "host:70000", ":9000", "host:x"]) {
      assert.isUndefined(parseAddress(bad), bad)
    }
  })

  it.live(
    "two servers replicate over TCP; typed errors cross the wire; a stopped server is unreachable in time",
    () =>
      Effect.gen(function* () {
        const root = yield* Effect.scope
        const addresses = new Map<number, string>()
        const dataAddresses = new Map<number, string>()
        const remote = yield* RemotePeers.make({
          locate: (id) => {
            const address = addresses.get(id)
            return address === undefined
              ? Effect.fail(new PeerUnreachable({ target: `server ${id}`, detail: "not registered" }))
              : Effect.succeed(address)
          },
          locateData: (id) => Effect.succeed(dataAddresses.get(id)),
          controller: Effect.fail(new PeerUnreachable({ target: "the controller", detail: "none in this test" })),
          requestTimeout: 3_000
        })
        const start = (id: number) =>
          Effect.gen(function* () {
            const store = yield* Layer.buildWithScope(ServerStorage.layerMemory, root)
            const scope = yield* Scope.fork(root, "sequential")
            const server = yield* TabletServer.make({ serverId: id, replication }).pipe(
              Effect.provide(Context.add(store, Peers, remote.peers)),
              Scope.provide(scope),
              Effect.orDie
            )
            const bound = yield* serveTabletServer({ host: "127.0.0.1", port: 0 }).pipe(
              Effect.provideService(TabletServer.TabletServer, server),
              Scope.provide(scope),
              Effect.orDie
            )
            const link = yield* DataLink.serve(
              { host: "127.0.0.1", port: 0 },
              { append: server.append, fetch: server.fetch, read: server.read }
            ).pipe(Scope.provide(scope), Effect.orDie)
            addresses.set(id, formatAddress(bound))
            dataAddresses.set(id, formatAddress(link))
            return { server, scope }
          })
        yield* start(1)
        const two = yield* start(2)
        const instruction = (coordinatorEpoch: number) => ({
          coordinatorEpoch,
          tablets: [
            {
              tablet,
              replicas: [1, 2],
              leaderAndIsr: { leader: 1, leaderEpoch: 0, isr: [1, 2], coordinatorEpoch, version: 0 }
            }
          ]
        })
        yield* remote.servers.leaderAndIsr(1, instruction(3))
        yield* remote.servers.leaderAndIsr(2, instruction(3))

        // acks=all: the HW passes the batch only once server 2 fetched it over TCP.
        const values = Array.from({ length: 200 }, (_, i) => `order-${i}`)
        for (let i = 0; i < values.length; i += 50) {
          const written = yield* remote
            .server(1)
            .append({ tablet, records: values.slice(i, i + 50).map(text), acks: "all" })
          assert.deepStrictEqual([written.baseOffset, written.lastOffset], [i, i + 49])
        }
        const read = yield* remote.server(1).read({ tablet, offset: 0, maxBytes: 10_000_000 })
        assert.deepStrictEqual(decoded(read.batches), values)
        assert.strictEqual(read.highWatermark, 200)
        const copy = yield* (yield* two.server.logOf(tablet))!.read(0, 10_000_000)
        assert.deepStrictEqual(decoded(copy), values)
        assert.strictEqual(yield* remote.server(2).replicaState(tablet), "FollowerReplica")
        assert.deepStrictEqual(yield* remote.servers.logEnd(2, { tablet }), { lastEpoch: 0, logEndOffset: 200 })

        // Errors arrive as the server's own, with their reasons.
        const empty = yield* Effect.flip(remote.server(1).append({ tablet, records: [], acks: "all" }))
        assert.strictEqual(empty._tag, "ReplicaError")
        assert.strictEqual(empty._tag === "ReplicaError" ? empty.reason._tag : "", "InvalidRequest")
        const follower = yield* Effect.flip(remote.server(2).append({ tablet, records: [text("x")], acks: 1 }))
        assert.strictEqual(follower._tag === "ReplicaError" ? follower.reason._tag : follower._tag, "NotLeader")
        const fenced = yield* Effect.flip(remote.servers.leaderAndIsr(1, instruction(2)))
        assert.strictEqual(fenced._tag === "ReplicaError" ? fenced.reason._tag : fenced._tag, "FencedEpoch")

        // Server 2 stops: a call to it fails within the request timeout, and the leader's acks=all append is not
        // acknowledged (its follower is gone and no controller shrinks the ISR): it times out, as itself.
        yield* Scope.close(two.scope, Exit.void)
        const gone = yield* Effect.flip(remote.servers.leaderAndIsr(2, instruction(3)))
        assert.strictEqual(gone._tag, "PeerUnreachable")
        // Started again on another port, it is reached there (the old address's connection retired).
        const before = addresses.get(2)
        const again = yield* start(2)
        assert.notStrictEqual(addresses.get(2), before)
        assert.deepStrictEqual(yield* remote.servers.logEnd(2, { tablet }), { lastEpoch: null, logEndOffset: 0 })
        yield* Scope.close(again.scope, Exit.void)
        const unreplicated = yield* Effect.flip(
          remote.server(1).append({ tablet, records: [text("late")], acks: "all" })
        )
        assert.strictEqual(
          unreplicated._tag === "ReplicaError" ? unreplicated.reason._tag : unreplicated._tag,
          "AppendTimedOut"
        )
        const after = yield* remote.server(1).read({ tablet, offset: 0, maxBytes: 10_000_000 })
        assert.deepStrictEqual(decoded(after.batches), values)
        addresses.set(3, "nonsense")
        const bad = yield* Effect.flip(remote.server(3).read({ tablet, offset: 0, maxBytes: 100 }))
        assert.include(bad.message, "not a host:port address")
      }).pipe(Effect.scoped),
    30_000
  )

  it.live(
    "the controller's calls cross the wire; a coordinator that does not lead is unreachable as the controller",
    () =>
      Effect.gen(function* () {
        let leading: ControllerShape | undefined
        const asked: Array<ReplicaManager.AdjustIsrRequest> = []
        const bound = yield* serveController(
          { host: "127.0.0.1", port: 0 },
          { current: Effect.sync(() => leading), servers: Effect.succeed([]), replicationFactor: 3 }
        )
        const remote = yield* RemotePeers.make({
          locate: () => Effect.fail(new PeerUnreachable({ target: "servers", detail: "none in this test" })),
          locateData: () => Effect.succeed(undefined),
          controller: Effect.succeed(formatAddress(bound)),
          requestTimeout: 3_000
        })
        const request: ReplicaManager.AdjustIsrRequest = {
          tablet,
          leader: 1,
          leaderEpoch: 4,
          version: 9,
          isr: [1, 3],
          registrations: [[3, 77]]
        }
        const standby = yield* Effect.flip(remote.peers.controller.adjustIsr(request))
        assert.include(standby.message, "this coordinator does not lead")
        leading = {
          ...unusedController,
          adjustIsr: (r) =>
            Effect.sync(() => {
              asked.push(r)
              return {
                _tag: "IsrRejected",
                rejection: { _tag: "IneligibleReplica", server: 3, why: "registered again" }
              }
            }),
          controlledShutdown: (server) => Effect.succeed(server * 10),
          state: Effect.die("unused")
        }
        const reply = yield* remote.peers.controller.adjustIsr(request)
        assert.deepStrictEqual(reply, {
          _tag: "IsrRejected",
          rejection: { _tag: "IneligibleReplica", server: 3, why: "registered again" }
        })
        assert.deepStrictEqual(asked, [request])
        assert.strictEqual(yield* remote.peers.controller.controlledShutdown(4), 40)
      }).pipe(Effect.scoped)
  )

  it.live(
    "Reassign and CancelReassign cross the wire: a refusal arrives as ReassignRefused with its reason and detail, an accepted move as the tablet with its target",
    () =>
      Effect.gen(function* () {
        const moving: ControllerState.Tablet = {
          tablet,
          replicas: [1, 4, 5, 2, 3],
          state: "OnlineTablet",
          leaderAndIsr: { leader: 1, leaderEpoch: 3, isr: [1, 2, 3], coordinatorEpoch: 2, version: 5 },
          reassignment: { original: [1, 2, 3], target: [1, 4, 5] }
        }
        const back: ControllerState.Tablet = {
          ...moving,
          replicas: [1, 2, 3],
          reassignment: undefined,
          retired: [4, 5],
          leaderAndIsr: { ...moving.leaderAndIsr, leaderEpoch: 4, version: 6 }
        }
        const asked: Array<ReadonlyArray<number>> = []
        const throttles: Array<number | undefined> = []
        const elected: Array<ReadonlyArray<string>> = []
        const controller: ControllerShape = {
          ...unusedController,
          // As the machine judges a target: a server named twice is refused, naming it.
          reassign: (_, target, options) =>
            Effect.sync(() => {
              asked.push(target)
              throttles.push(options?.throttleBytesPerSec)
              const twice = target.find((s, i) => target.indexOf(s) !== i)
              if (twice === undefined) return { _tag: "Reassigning", tablet: moving }
              const refusal: Reassignment.Refusal = { _tag: "DuplicateServer", server: twice }
              return { _tag: "ReassignRefused", refusal, detail: Reassignment.describeRefusal("orders:0", refusal) }
            }),
          cancelReassign: () => Effect.succeed({ _tag: "ReassignCancelled", tablet: back }),
          balanceLeaders: Effect.succeed(5),
          electPreferred: (tablets) =>
            Effect.sync(() => {
              elected.push(tablets.map(Models.tabletKey))
              return tablets.length
            })
        }
        const bound = yield* serveController(
          { host: "127.0.0.1", port: 0 },
          { current: Effect.succeed(controller), servers: Effect.succeed([]), replicationFactor: 3 }
        )
        const remote = yield* RemotePeers.make({
          locate: () => Effect.fail(new PeerUnreachable({ target: "servers", detail: "none in this test" })),
          locateData: () => Effect.succeed(undefined),
          controller: Effect.succeed(formatAddress(bound)),
          requestTimeout: 3_000
        })

        const refused = yield* Effect.flip(remote.admin.reassign(tablet, [1, 1, 2]))
        assert.instanceOf(refused, ReassignRefused)
        if (refused instanceof ReassignRefused) {
          assert.deepStrictEqual(refused.reason, { _tag: "DuplicateServer", server: 1 })
          assert.strictEqual(refused.detail, "orders:0: server 1 is named twice in the target replica set")
          assert.strictEqual(refused.message, refused.detail)
        }

        const accepted = yield* remote.admin.reassign(tablet, [1, 4, 5], { throttleBytesPerSec: 10_000 })
        assert.deepStrictEqual(asked, [
          [1, 1, 2],
          [1, 4, 5]
        ])
        // The throttle travels with the request; without one none is named.
        assert.deepStrictEqual(throttles, [undefined, 10_000])
        // A throttle that is not a whole number of bytes a second ≥ 1 is refused before the controller sees it.
        yield* Effect.flip(remote.admin.reassign(tablet, [1, 4, 5], { throttleBytesPerSec: 0 }))
        assert.strictEqual(throttles.length, 2)
        assert.deepStrictEqual(accepted.replicas, [1, 4, 5, 2, 3])
        assert.deepStrictEqual(accepted.target, [1, 4, 5])
        assert.isUndefined(accepted.retired)

        const cancelled = yield* remote.admin.cancelReassign(tablet)
        assert.deepStrictEqual(cancelled.replicas, [1, 2, 3])
        assert.isUndefined(cancelled.target)
        assert.deepStrictEqual(cancelled.retired, [4, 5])
        assert.strictEqual(cancelled.leaderEpoch, 4)

        // Leaders: all of them balanced, or the named tablets' preferred replicas elected.
        assert.strictEqual(yield* remote.admin.balanceLeaders, 5)
        assert.strictEqual(yield* remote.admin.electPreferred([tablet, { table: "orders", bucket: 2 }]), 2)
        assert.deepStrictEqual(elected, [["orders/0", "orders/2"]])
      }).pipe(Effect.scoped)
  )
})

describe("a server found at another address", () => {
  it.live("a call in flight on the connection it retires ends as PeerUnreachable, not as an interruption", () =>
    Effect.gen(function* () {
      // Two servers: one whose calls never end, one that answers LeaderAndIsr.
      const handlers = (leaderAndIsr: Effect.Effect<void>) => ({
        LeaderAndIsr: () => leaderAndIsr,
        LogEnd: () => Effect.never,
        Holdings: () => Effect.never,
        StopReplica: () => Effect.never,
        EndOffsetForEpoch: () => Effect.never,
        Read: () => Effect.never,
        DeleteRecords: () => Effect.never,
        ReplicaState: () => Effect.succeed("OnlineReplica" as const),
        ReadLog: () => Effect.never
      })
      const stuck = yield* serveTabletServerWith({ host: "127.0.0.1", port: 0 }, handlers(Effect.never))
      const moved = yield* serveTabletServerWith({ host: "127.0.0.1", port: 0 }, handlers(Effect.void))
      let at = formatAddress(stuck)
      const remote = yield* RemotePeers.make({
        locate: () => Effect.sync(() => at),
        locateData: () => Effect.succeed(undefined),
        controller: Effect.fail(new PeerUnreachable({ target: "the controller", detail: "none here" })),
        requestTimeout: 20_000
      })
      const request = { coordinatorEpoch: 1, tablets: [] }
      const inFlight = yield* Effect.forkChild(Effect.exit(remote.servers.leaderAndIsr(1, request)))
      yield* Effect.sleep("200 millis")
      // The server is found elsewhere: the next call retires the old connection.
      at = formatAddress(moved)
      yield* remote.servers.leaderAndIsr(1, request)
      const first = yield* Fiber.join(inFlight)
      assert.isTrue(Exit.isFailure(first))
      if (Exit.isFailure(first)) {
        assert.isFalse(Cause.hasInterruptsOnly(first.cause), "an interruption would end a caller's retry loop")
        const e = Cause.findErrorOption(first.cause)
        assert.isTrue(e._tag === "Some" && e.value instanceof PeerUnreachable, String(first.cause))
      }
    }).pipe(Effect.scoped)
  )
})
