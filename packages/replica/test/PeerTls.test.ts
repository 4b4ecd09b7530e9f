/**
 * TLS between the cluster's processes (`PeerTls`): a coordinator and tablet servers in this process on memory
 * coordination, serving their RPC and data links over TLS on loopback with certificates made by openssl for the test.
 * Clients with the cluster's certificate write and read; a client without one, with one another CA signed, or that
 * does not trust the cluster's CA is refused; a tablet server whose certificate another CA signed cannot join a
 * tablet's replicas.
 */
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { MemoryCoordination } from "@strata/core"
import { LogConformance } from "@strata/core/testing"
import { StrataLog } from "@strata/replica/log"
import { assert, describe, it } from "@effect/vitest"
import {
  CoordinatorNode,
  DataLink,
  PeerTls,
  type ReplicaManager,
  ReplicaRpc,
  ServerStorage,
  TabletClient,
  TabletServerNode
} from "@strata/replica"
import { Cause, Duration, Effect, Exit, Layer, Redacted } from "effect"
import { TestClock } from "effect/testing"
import { afterAll } from "vitest"
import { makeCa, type TestCa } from "../../../scripts/test-support/certificates.js"

const replication = {
  sessionTimeout: 2_000,
  replicaLagTimeMax: 3_000,
  retryBackoff: 20,
  replicationFactor: 3,
  minInsyncReplicas: 2
}

// Made as the file loads: the conformance suite's layer below reads them.
const directory = mkdtempSync(join(tmpdir(), "strata-peer-tls-"))
const cluster: TestCa = makeCa(directory, "strata test cluster CA")
cluster.issue("node", { cn: "strata-node", ips: ["127.0.0.1"], dns: ["strata-cluster"] })
cluster.issue("named", { cn: "strata-named", dns: ["strata-cluster"] })
const other: TestCa = makeCa(directory, "another CA", "other-ca")
other.issue("rogue", { cn: "strata-rogue", ips: ["127.0.0.1"] })
cluster.issue("expired", { cn: "strata-expired", ips: ["127.0.0.1"], days: 0 })
afterAll(() => rmSync(directory, { recursive: true, force: true }))

/** TLS options with the cluster's CA and the certificate `name` of `ca` (none: CA only). */
const tlsWith = (name: string | undefined, ca: TestCa = cluster, trust: TestCa = cluster): PeerTls.PeerTlsOptions => ({
  ca: trust.pem(trust === cluster ? "ca.pem" : "other-ca.pem"),
  ...(name === undefined ? {} : { cert: ca.pem(`${name}.pem`), key: Redacted.make(ca.pem(`${name}-key.pem`)) })
})

/** A tablet server with storage of its own, in the scope. */
const server = (serverId: number, tls: PeerTls.PeerTlsOptions) =>
  Effect.flatMap(Layer.build(ServerStorage.layerMemory), (storage) =>
    TabletServerNode.make({ serverId, replication, tls }).pipe(Effect.provide(storage))
  )

/** A coordinator and three tablet servers over `tls` (each with the `node` certificate). */
const startCluster = (tls: PeerTls.PeerTlsOptions) =>
  Effect.gen(function* () {
    yield* CoordinatorNode.make({ serverId: 101, replication, tls })
    const servers = []
    for (const id of [1, 2, 3]) servers.push(yield* server(id, tls))
    return servers
  })

/** The records `n` records of about 100 bytes make. */
const records = (n: number, from = 0): Array<ReplicaManager.TabletRecord> =>
  Array.from({ length: n }, (_, i) => ({
    key: new TextEncoder().encode(`k${from + i}`),
    value: new TextEncoder().encode(`v${from + i}-${"x".repeat(90)}`),
    headers: [],
    timestamp: 0
  }))

/** Why `effect` failed, as text (its failure's message and cause), or `succeeded`. */
const failureOf = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.map(Effect.exit(effect), (exit) => (Exit.isSuccess(exit) ? "succeeded" : Cause.pretty(exit.cause)))

/** A client that gives up within a few seconds. */
const quickClient = (tls: PeerTls.PeerTlsOptions | undefined) =>
  TabletClient.make({
    replication,
    requestTimeout: "1 second",
    deliveryTimeout: "2 seconds",
    ...(tls === undefined ? {} : { tls })
  })

// Core's Log conformance on StrataLog over a cluster whose processes and client speak mutual TLS.
LogConformance.suite(
  "strata over TLS",
  StrataLog.layer({ client: { linger: 1, tls: tlsWith("node") } }).pipe(
    Layer.provideMerge(Layer.effectDiscard(startCluster(tlsWith("node")))),
    Layer.provide(MemoryCoordination.layer())
  ),
  { capabilities: StrataLog.capabilities, timeout: "20 seconds" }
)

describe("TLS between the cluster's processes", () => {
  it.live(
    "with the cluster's certificates, a table is created, written acks=all on 3 replicas and read back; the followers fetch over TLS",
    () =>
      Effect.gen(function* () {
        const tls = tlsWith("node")
        yield* startCluster(tls)
        const client = yield* TabletClient.make({ replication, tls })
        const [created] = yield* client.createTable("secure", { buckets: 1 })
        const tablet = created!.tablet
        for (let i = 0; i < 10; i++) yield* client.send(tablet, records(100, i * 100))
        const metadata = yield* client.metadata("secure")
        assert.strictEqual(metadata.tablets[0]!.isr.length, 3, "every replica in the ISR: the followers fetched")
        const read: Array<string> = []
        let offset = 0
        while (read.length < 1000) {
          const result = yield* client.read(tablet, offset)
          for (const b of result.batches)
            for (const r of b.records) read.push(new TextDecoder().decode(r.key ?? new Uint8Array()))
          offset = result.batches.at(-1)!.baseOffset + result.batches.at(-1)!.records.length
        }
        assert.deepStrictEqual(
          read,
          Array.from({ length: 1000 }, (_, i) => `k${i}`)
        )
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer())),
    60_000
  )

  it.live(
    "a client without a certificate, with one another CA signed, that does not trust the cluster's CA, or plaintext, is refused with the reason",
    () =>
      Effect.gen(function* () {
        yield* startCluster(tlsWith("node"))
        const refused = (tls: PeerTls.PeerTlsOptions | undefined) =>
          failureOf(Effect.scoped(Effect.flatMap(quickClient(tls), (c) => c.createTable("never", { buckets: 1 }))))
        // The server asks for a certificate the CA signed: none fails the handshake with TLS 1.3's alert, at once (not
        // tried again: `HandshakeFailed`); another CA's is closed without a word, which the failure explains.
        assert.match(
          yield* refused(tlsWith(undefined)),
          /the TLS handshake with the controller \(127\.0\.0\.1:\d+\) failed: .*tlsv13 alert certificate required \(ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED\)/
        )
        assert.match(yield* refused(tlsWith("rogue", other)), /refuses a certificate the cluster's CA did not sign/)
        // This client does not trust the servers' CA: refused at once too.
        assert.match(
          yield* refused(tlsWith("rogue", other, other)),
          /the TLS handshake with the controller .* failed: .*self[- ]signed/i
        )
        // A TLS server closes a plaintext connection without a word: the client asks whether TLS answers there, and
        // fails at once saying so.
        assert.match(
          yield* refused(undefined),
          /the TLS handshake with the controller .* failed: the server speaks TLS and this client has no TLS settings/
        )
        // The data link too: a follower's fetch with another CA's certificate is refused at the handshake (a fetch that
        // reached the server would be answered, if only with a refusal).
        const good = yield* TabletClient.make({ replication, tls: tlsWith("node") })
        const [created] = yield* good.createTable("secure", { buckets: 1 })
        const leader = (yield* good.metadata("secure")).servers.find((s) => s.id === created!.leader)!
        const rogue = yield* PeerTls.make(tlsWith("rogue", other))
        const link = yield* DataLink.connect(ReplicaRpc.parseAddress(leader.dataAddress!)!, {}, rogue)
        const fetch = (l: DataLink.DataLinkClient) =>
          failureOf(l.fetch({ tablet: created!.tablet, follower: 4, leaderEpoch: 0, offset: 0, maxBytes: 1024 }))
        assert.match(
          yield* fetch(link),
          /takes only clients with a certificate the cluster's CA signed; this one's was refused: the cluster's CA did not sign it/
        )
        // The same fetch with the cluster's certificate reaches the leader, which refuses a follower it does not have.
        const member = yield* DataLink.connect(
          ReplicaRpc.parseAddress(leader.dataAddress!)!,
          {},
          yield* PeerTls.make(tlsWith("node"))
        )
        assert.notMatch(yield* fetch(member), /PeerUnreachable/)
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer())),
    60_000
  )

  it.live(
    "a tablet server whose certificate another CA signed stops before it registers; one that trusts that CA too registers but cannot join a tablet's replicas: a move onto it never completes, the tablet stays writable, and cancelling the move ends it",
    () =>
      Effect.gen(function* () {
        yield* startCluster(tlsWith("node"))
        const client = yield* TabletClient.make({ replication, tls: tlsWith("node") })
        const [created] = yield* client.createTable("guarded", { buckets: 1 })
        const tablet = created!.tablet
        yield* client.send(tablet, records(50))
        // Given the cluster's CA but another CA's certificate, it cannot listen as its peers would accept: it stops.
        const refused = yield* Effect.flip(Effect.scoped(server(4, tlsWith("rogue", other))))
        assert.include(refused.message, "tls.cert")
        assert.include(refused.message, "not signed by the CA of tls.ca")
        assert.notInclude(
          (yield* client.metadata()).servers.map((s) => s.id),
          4
        )
        // An intruder that trusts its own CA registers (coordination credentials guard that), but nobody talks to it.
        const intruder = yield* server(4, tlsWith("rogue", other, other))
        const moving = yield* client.reassign(tablet, [...created!.replicas, 4])
        assert.deepStrictEqual(moving.target, [...created!.replicas, 4])
        for (let i = 1; i < 5; i++) yield* client.send(tablet, records(50, i * 50))
        yield* Effect.sleep(Duration.seconds(2))
        const now = (yield* client.metadata("guarded")).tablets[0]!
        assert.notInclude(now.isr, 4)
        assert.isDefined(now.target, "the move is still under way")
        // The controller could not tell it of the replica (it does not trust the intruder's certificate), and its
        // fetches would be refused: it holds nothing of the tablet.
        const held = (yield* intruder.server.samples).filter((r) => r.tablet.table === "guarded")
        assert.isTrue(
          held.every((r) => (r.logEndOffset ?? 0) === 0),
          `the intruder holds no record of the tablet: ${JSON.stringify(held)}`
        )
        const cancelled = yield* client.cancelReassign(tablet)
        assert.isUndefined(cancelled.target)
        assert.deepStrictEqual([...cancelled.replicas].sort(), [...created!.replicas].sort())
        yield* client.send(tablet, records(1, 1000))
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer())),
    60_000
  )

  it.live(
    "with serverName, every server's certificate is checked against that name; a certificate without the name is refused",
    () =>
      Effect.gen(function* () {
        // The servers' certificate names only strata-cluster, not 127.0.0.1: dialling the address alone fails.
        const named = { ...tlsWith("named"), serverName: "strata-cluster" }
        yield* startCluster(named)
        const client = yield* TabletClient.make({ replication, tls: named })
        const [created] = yield* client.createTable("named", { buckets: 1 })
        yield* client.send(created!.tablet, records(10))
        const byAddress = tlsWith("named")
        const refused = yield* failureOf(Effect.scoped(Effect.flatMap(quickClient(byAddress), (c) => c.metadata())))
        assert.match(
          refused,
          /the TLS handshake with the controller .* failed: .*IP: 127\.0\.0\.1 is not in the cert's list/i
        )
      }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer())),
    60_000
  )

  it.live("StrataLog reports a refused handshake as the log's AuthenticationFailed, at once", () =>
    Effect.gen(function* () {
      yield* startCluster(tlsWith("node"))
      const error = yield* Effect.flip(
        Effect.flatMap(
          StrataLog.make({
            client: { tls: tlsWith(undefined), requestTimeout: "1 second", deliveryTimeout: "2 seconds" }
          }),
          (log) => log.ensureTopic({ topic: "never", partitions: 1 })
        )
      )
      assert.strictEqual(
        error._tag === "LogError" ? error.reason._tag : error._tag,
        "AuthenticationFailed",
        error.message
      )
      assert.match(error.message, /certificate required/)
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )

  it.live("without mutual, a client with the CA alone is served", () =>
    Effect.gen(function* () {
      yield* startCluster({ ...tlsWith("node"), mutual: false })
      const client = yield* TabletClient.make({ replication, tls: { ca: cluster.pem("ca.pem") } })
      const [created] = yield* client.createTable("open", { buckets: 1 })
      yield* client.send(created!.tablet, records(10))
    }).pipe(Effect.scoped, Effect.provide(MemoryCoordination.layer()))
  )

  it.effect(
    "bad TLS options fail naming the option, never showing the key: a key without a certificate, a PEM that does not parse, a key that is not the certificate's, a listener without a certificate",
    () =>
      Effect.gen(function* () {
        const bad = (options: PeerTls.PeerTlsOptions) =>
          Effect.map(Effect.flip(PeerTls.make(options)), (e) => e.message)
        const key = cluster.pem("node-key.pem")
        const keyOnly = yield* bad({ ca: cluster.pem("ca.pem"), key: Redacted.make(key) })
        assert.include(keyOnly, "tls.cert")
        const garbage = yield* bad({ ...tlsWith("node"), cert: "not a certificate" })
        assert.include(garbage, "tls.cert")
        const mismatched = yield* bad({ ...tlsWith("node"), key: Redacted.make(other.pem("rogue-key.pem")) })
        assert.include(mismatched, "tls.")
        // Certificates are checked against the Clock: the test's starts at 0, before any certificate was valid.
        assert.match(yield* bad(tlsWith("node")), /tls\.cert .*it is not valid before/)
        yield* TestClock.setTime(Date.now())
        const expired = yield* bad({ ...tlsWith("expired") })
        assert.match(expired, /tls\.cert .*it expired on/)
        const badCa = yield* bad({
          ...tlsWith("node"),
          ca: "-----BEGIN CERTIFICATE-----\nxx\n-----END CERTIFICATE-----\n"
        })
        assert.include(badCa, "tls.ca")
        for (const message of [keyOnly, garbage, mismatched, badCa]) {
          assert.notInclude(message, key.slice(40, 80))
          assert.notInclude(message, other.pem("rogue-key.pem").slice(40, 80))
        }
        const listener = yield* Effect.flip(Effect.scoped(server(9, { ca: cluster.pem("ca.pem") }))).pipe(
          Effect.provide(MemoryCoordination.layer())
        )
        assert.include(listener.message, "tls.cert")
      })
  )
})
