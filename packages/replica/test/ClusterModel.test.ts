/**
 * The controller's `ClusterModel`: the registered servers (one that holds replicas but is not registered, excluded),
 * every tablet not being deleted with its replicas, leader and size in bytes: its leader's log's figure, else the
 * largest its replicas told; a server that does not answer within the request's timeout gives no sizes, and the reply
 * counts the tablets left without one instead of waiting.
 */
import { assert, describe, it } from "@effect/vitest"
import { MemoryCoordination, Models } from "@strata/core"
import { Duration, Effect } from "effect"
import * as RemotePeers from "../src/client/RemotePeers.js"
import * as TabletClient from "../src/client/TabletClient.js"
import type * as ControllerState from "../src/machines/ControllerState.js"
import * as LocalCluster from "../src/node/LocalCluster.js"
import type * as ReplicaManager from "../src/protocol/ReplicaManager.js"
import type { ControllerShape } from "../src/server/Controller.js"
import * as ControllerRpc from "../src/server/ControllerRpc.js"
import { PeerUnreachable, type TabletServersShape } from "../src/wire/Peers.js"
import { type ClusterModelReply, formatAddress } from "../src/wire/ReplicaRpc.js"
import { quickReplication } from "./support/servers.js"

const enc = new TextEncoder()
const records = (from: number, count: number, bytes = 100) =>
  Array.from({ length: count }, (_, i) => ({
    key: null,
    value: enc.encode(`r${from + i}`.padEnd(bytes, ".")),
    headers: [],
    timestamp: 0
  }))

const replication = quickReplication

/** The model once `check` holds (asked again every 20 ms, up to 10 s). */
const modelWhen = (
  client: TabletClient.TabletClientShape,
  what: string,
  check: (m: ClusterModelReply) => boolean
): Effect.Effect<ClusterModelReply, TabletClient.TabletClientError> =>
  Effect.gen(function* () {
    let last: ClusterModelReply | undefined
    for (let i = 0; i < 500; i++) {
      last = yield* client.clusterModel()
      if (check(last)) return last
      yield* Effect.sleep(20)
    }
    return yield* Effect.die(`the cluster model never showed ${what}: ${JSON.stringify(last)}`)
  })

const sizeOf = (m: ClusterModelReply, tablet: Models.TabletId) =>
  m.tablets.find((t) => Models.tabletKey(t.tablet) === Models.tabletKey(tablet))?.sizeBytes

describe("ClusterModel on a cluster in memory (RPC over loopback)", () => {
  it.live(
    "sizes are the leaders' logs' figures and grow with the data; a stopped server is excluded, its tablets still sized",
    () =>
      Effect.gen(function* () {
        const cluster = yield* LocalCluster.make({ servers: 3, replication, transport: "tcp" })
        const t0 = { table: "orders", bucket: 0 }
        const t1 = { table: "orders", bucket: 1 }
        yield* cluster.createTable("orders", { buckets: 2 })
        for (const t of [t0, t1]) yield* cluster.awaitTablet(t, (x) => x.leaderAndIsr.isr.length === 3)
        const client = yield* TabletClient.make({ replication })

        const empty = yield* modelWhen(client, "three servers", (m) => m.servers.length === 3)
        assert.deepStrictEqual(empty.servers, [{ id: 1 }, { id: 2 }, { id: 3 }])
        assert.deepStrictEqual(
          empty.tablets.map((t) => [t.tablet.bucket, t.replicas.length, t.sizeBytes]),
          [
            [0, 3, 0],
            [1, 3, 0]
          ]
        )
        assert.strictEqual(empty.sizesMissing, 0)

        yield* cluster.append(t0, records(0, 20))
        const leader = (yield* cluster.tablet(t0)).leaderAndIsr.leader!
        const leaderLog = (yield* (yield* cluster.server(leader)).logOf(t0))!
        const once = yield* client.clusterModel()
        const first = sizeOf(once, t0)!
        assert.strictEqual(first, yield* leaderLog.sizeBytes)
        assert.isAbove(first, 20 * 100, "at least the records' values")
        assert.strictEqual(sizeOf(once, t1), 0)
        assert.strictEqual(once.tablets.find((t) => t.tablet.bucket === 0)?.leader, leader)

        yield* cluster.append(t0, records(20, 20))
        yield* cluster.append(t1, records(0, 5))
        const twice = yield* client.clusterModel()
        assert.strictEqual(sizeOf(twice, t0), yield* leaderLog.sizeBytes)
        assert.isAbove(sizeOf(twice, t0)!, first + 20 * 100)
        assert.isAbove(sizeOf(twice, t1)!, 5 * 100)

        // Server 3 stops: it still holds replicas, so it is listed, excluded; every tablet keeps a size.
        yield* cluster.stopServer(3)
        const stopped = yield* modelWhen(client, "server 3 excluded", (m) =>
          m.servers.some((s) => s.id === 3 && s.tags?.includes("excluded") === true)
        )
        assert.deepStrictEqual(stopped.servers, [{ id: 1 }, { id: 2 }, { id: 3, tags: ["excluded"] }])
        assert.strictEqual(stopped.sizesMissing, 0)
        assert.isAtLeast(sizeOf(stopped, t0)!, sizeOf(twice, t0)!)
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer())),
    60_000
  )
})

const tabletOf = (
  bucket: number,
  replicas: ReadonlyArray<number>,
  leader: number | null,
  extra: Partial<ControllerState.Tablet> = {}
): ControllerState.Tablet => ({
  tablet: { table: "orders", bucket },
  replicas,
  state: "OnlineTablet",
  leaderAndIsr: { leader, leaderEpoch: 3, isr: replicas, coordinatorEpoch: 7, version: 2 },
  ...extra
})

/** A controller whose machine holds `tablets`, servers 1–3 live (registrations 11–13); nothing else is used. */
const controllerWith = (tablets: ReadonlyArray<ControllerState.Tablet>): ControllerShape => {
  const state: ControllerState.State = {
    coordinatorEpoch: 7,
    options: { uncleanLeaderElection: false },
    live: new Set([1, 2, 3]),
    registrations: new Map([
      [1, 11],
      [2, 12],
      [3, 13]
    ]),
    storageFailed: new Map(),
    storageReported: new Map(),
    shuttingDown: new Set(),
    tablets: new Map(tablets.map((t) => [Models.tabletKey(t.tablet), t])),
    uncleanElections: 0,
    elections: new Map(),
    nextRound: 0,
    resigned: false
  }
  const unused = Effect.die("unused")
  return {
    coordinatorEpoch: 7,
    resumed: { tablets: tablets.length, read: tablets.length, full: true },
    state: Effect.succeed(state),
    createTablets: () => unused,
    adjustIsr: () => unused,
    deleteTablets: () => unused,
    reassign: () => unused,
    cancelReassign: () => unused,
    balanceLeaders: unused,
    electPreferred: () => unused,
    serverHealth: () => unused,
    controlledShutdown: () => unused,
    replicaStorage: () => unused,
    initProducerId: unused
  }
}

/**
 * Servers that answer `Holdings` with these sizes (by server, then bucket) and this health (by server); one absent
 * from `sizes` never answers.
 */
const serversAnswering = (
  sizes: Readonly<Record<number, Readonly<Record<number, number>>>>,
  asked: Array<readonly [number, ReplicaManager.HoldingsRequest]>,
  health: Readonly<Record<number, ReplicaManager.ServerHealth>> = {}
): TabletServersShape => ({
  leaderAndIsr: () => Effect.die("unused"),
  logEnd: () => Effect.die("unused"),
  stopReplica: () => Effect.die("unused"),
  holdings: (id, request) =>
    Effect.suspend(() => {
      asked.push([id, request])
      const held = sizes[id]
      if (held === undefined) return Effect.never
      const told = health[id]
      return Effect.succeed({
        tablets: Object.entries(held).map(([bucket, sizeBytes]) => ({
          tablet: { table: "orders", bucket: Number(bucket) },
          leaderEpoch: 3,
          version: 2,
          sizeBytes
        })),
        ...(told === undefined ? {} : { health: told })
      })
    })
})

/** Serves `endpoint` on loopback and asks it for the cluster model over the wire. */
const askOver = (endpoint: ControllerRpc.ControllerEndpoint, request: { readonly sizeTimeoutMs?: number } = {}) =>
  Effect.gen(function* () {
    const bound = yield* ControllerRpc.serveController({ host: "127.0.0.1", port: 0 }, endpoint)
    const remote = yield* RemotePeers.make({
      locate: () => Effect.fail(new PeerUnreachable({ target: "servers", detail: "none in this test" })),
      locateData: () => Effect.succeed(undefined),
      controller: Effect.succeed(formatAddress(bound)),
      requestTimeout: 3_000
    })
    return yield* remote.admin.clusterModel(request)
  }).pipe(Effect.scoped)

describe("ClusterModel's answer", () => {
  const tablets = [
    tabletOf(0, [1, 2], 1),
    tabletOf(1, [2, 3], 3),
    // Server 4 holds a replica but is not registered.
    tabletOf(2, [3, 4], 3),
    tabletOf(3, [1, 2], null, { state: "DeletingTablet" }),
    // Moving from [1, 2] to [1, 3], its leader 2 leaving.
    tabletOf(4, [1, 3, 2], 2, { reassignment: { original: [1, 2], target: [1, 3] } })
  ]
  const servers = Effect.succeed([
    { id: 1, address: "a:1", rack: "r1" },
    { id: 2, address: "a:2" },
    { id: 3, address: "a:3" }
  ])

  it.live(
    "sizes from the leader, else the largest replica's; a server that never answers is waited for only as long as asked",
    () =>
      Effect.gen(function* () {
        const asked: Array<readonly [number, ReplicaManager.HoldingsRequest]> = []
        const model = yield* askOver(
          {
            current: Effect.succeed(controllerWith(tablets)),
            servers,
            replicationFactor: 3,
            // Server 3 never answers.
            tabletServers: serversAnswering(
              {
                1: { 0: 100, 4: 40 },
                2: { 0: 90, 1: 70, 4: 400 }
              },
              asked
            )
          },
          { sizeTimeoutMs: 200 }
        )
        assert.deepStrictEqual(model.servers, [
          { id: 1, rack: "r1" },
          { id: 2 },
          { id: 3 },
          { id: 4, tags: ["excluded"] }
        ])
        assert.deepStrictEqual(
          model.tablets.map((t) => [t.tablet.bucket, t.replicas, t.leader, t.sizeBytes ?? null]),
          [
            [0, [1, 2], 1, 100],
            // Its leader (3) did not answer: the largest figure of the others.
            [1, [2, 3], 3, 70],
            // No server holding it answered.
            [2, [3, 4], 3, null],
            // The replicas it ends with; its leader is leaving, so none is given, but its figure is the size.
            [4, [1, 3], null, 400]
          ]
        )
        assert.strictEqual(model.sizesMissing, 1)
        assert.strictEqual(model.coordinatorEpoch, 7)
        // Only the registered servers holding replicas are asked, under the controller's epoch and their registration.
        assert.deepStrictEqual(
          [...asked].sort((a, b) => a[0] - b[0]),
          [
            [1, { coordinatorEpoch: 7, registration: 11 }],
            [2, { coordinatorEpoch: 7, registration: 12 }],
            [3, { coordinatorEpoch: 7, registration: 13 }]
          ]
        )
      })
  )

  it.live("without the tablet servers every size is missing; a coordinator that does not lead says so", () =>
    Effect.gen(function* () {
      const model = yield* askOver({
        current: Effect.succeed(controllerWith(tablets)),
        servers,
        replicationFactor: 3
      })
      assert.strictEqual(model.sizesMissing, 4)
      assert.isTrue(model.tablets.every((t) => t.sizeBytes === undefined))
      const standby = yield* Effect.flip(askOver({ current: Effect.succeed(undefined), servers, replicationFactor: 3 }))
      assert.include(standby.message, "this coordinator does not lead")
    })
  )

  it.live("serverHealth: each live server's health as its Holdings answer tells it, within the timeout", () =>
    Effect.gen(function* () {
      const asked: Array<readonly [number, ReplicaManager.HoldingsRequest]> = []
      const state = yield* controllerWith(tablets).state
      // 1 tells its health, 2 keeps none (an older server), 3 never answers; 4 is not live and is not asked.
      const servers = serversAnswering({ 1: {}, 2: {}, 4: {} }, asked, {
        1: { appendLatencyP99Ms: 12.5, isrShrinks: 3 },
        4: { isrShrinks: 9 }
      })
      const health = yield* ControllerRpc.serverHealth(servers, state, Duration.millis(200))
      assert.deepStrictEqual([...health], [[1, { appendLatencyP99Ms: 12.5, isrShrinks: 3 }]])
      assert.deepStrictEqual(
        [...asked].sort((a, b) => a[0] - b[0]),
        [
          [1, { coordinatorEpoch: 7, registration: 11 }],
          [2, { coordinatorEpoch: 7, registration: 12 }],
          [3, { coordinatorEpoch: 7, registration: 13 }]
        ]
      )
      // Without the tablet servers nothing is known.
      assert.strictEqual((yield* ControllerRpc.serverHealth(undefined, state, Duration.millis(200))).size, 0)
    })
  )
})
