/**
 * A cluster whose processes speak TLS to each other (`tlsCa`, `tlsCert`, `tlsKey`, client certificates required): real
 * coordinator and tablet server processes on ZooKeeper, certificates made by openssl for the test. A client with the
 * cluster's certificate writes and reads, the followers replicating over TLS between processes; an operator's command
 * without a certificate, not trusting the cluster's CA, or with a key that is not its certificate's fails in one line,
 * and a tablet server given another CA's certificate stops before it registers; no output holds a private key.
 */
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as ZooKeeperCoordination from "@strata/election/zookeeper"
import { type ReplicaManager, TabletClient } from "@strata/replica"
import { Effect, Redacted } from "effect"
import { afterAll, inject } from "vitest"
import { cli as runCli, clusterEnv } from "./support/cliRun.js"
import { awaitMetadata, cliProcesses, faultSettings, readAll, zooKeeperCluster } from "./support/clusterTest.js"
import { makeCa } from "../../../scripts/test-support/certificates.js"

const processes = cliProcesses()
const certificates = mkdtempSync(join(tmpdir(), "strata-cluster-tls-"))
afterAll(() => rmSync(certificates, { recursive: true, force: true }))

describe("a cluster over TLS between its processes", () => {
  it.live(
    "a client with the cluster's certificate writes and reads on 3 replicas; an operator's command without TLS, without a certificate, not trusting the cluster's CA, or with a key that is not its certificate's, fails in one line; a server with another CA's certificate stops; no output holds a key",
    () =>
      Effect.gen(function* () {
        const ca = makeCa(certificates, "strata cluster CA")
        ca.issue("node", { cn: "strata-node", ips: ["127.0.0.1"] })
        ca.issue("operator", { cn: "strata-operator", usage: "clientAuth" })
        const other = makeCa(certificates, "another CA", "other-ca")
        other.issue("rogue", { cn: "strata-rogue", usage: "clientAuth" })
        const nodeTls = { tlsCa: ca.file("ca.pem"), tlsCert: ca.file("node.pem"), tlsKey: ca.file("node-key.pem") }
        const { cluster, namespace } = yield* zooKeeperCluster(processes, "tls", nodeTls)
        yield* Effect.addFinalizer((exit) =>
          exit._tag === "Failure" ? Effect.logError(cluster.logTails(30)) : Effect.void
        )
        yield* cluster.start("coordinator", 101)
        yield* Effect.forEach([1, 2, 3], (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })

        const operator = {
          ...clusterEnv(namespace),
          STRATA_TLS_CA: ca.file("ca.pem"),
          STRATA_TLS_CERT: ca.file("operator.pem"),
          STRATA_TLS_KEY: ca.file("operator-key.pem")
        }
        const run = (args: ReadonlyArray<string>, env: Record<string, string>) =>
          Effect.promise(() => runCli(processes.runner(), args, env).exited)
        const created = yield* run(["tablets", "create", "orders", "--tablets", "2", "--rf", "3"], operator)
        assert.strictEqual(created.code, 0, created.stderr)

        // The library's client with the operator's certificate: every record written acks=all comes back, and each
        // tablet's followers are in its ISR (they fetched from their leader over TLS).
        const written = yield* Effect.gen(function* () {
          const client = yield* TabletClient.make({
            namespace,
            replication: faultSettings,
            tls: {
              ca: ca.pem("ca.pem"),
              cert: ca.pem("operator.pem"),
              key: Redacted.make(ca.pem("operator-key.pem"))
            }
          })
          const values: Array<Array<string>> = [[], []]
          for (let round = 0; round < 10; round++) {
            for (const bucket of [0, 1]) {
              const records: Array<ReplicaManager.TabletRecord> = Array.from({ length: 100 }, (_, i) => ({
                key: null,
                value: new TextEncoder().encode(`${bucket}-${round * 100 + i}`),
                headers: [],
                timestamp: 0
              }))
              yield* client.send({ table: "orders", bucket }, records)
              values[bucket]!.push(...records.map((r) => new TextDecoder().decode(r.value)))
            }
          }
          yield* awaitMetadata(client, "orders", "every replica in its tablet's ISR", (m) =>
            m.tablets.every((t) => t.isr.length === 3)
          )
          for (const bucket of [0, 1]) {
            assert.deepStrictEqual(yield* readAll(client, { table: "orders", bucket }), values[bucket])
          }
          return values.flat().length
        }).pipe(Effect.scoped, Effect.provide(ZooKeeperCoordination.layer({ connectString: inject("zookeeper") })))
        assert.strictEqual(written, 2000)

        // Without a certificate: the servers require one, and the command says so in one line, at once.
        const { STRATA_TLS_CERT: _c, STRATA_TLS_KEY: _k, ...caOnly } = operator
        const bare = yield* run(["tablets", "describe", "orders"], caOnly)
        assert.notStrictEqual(bare.code, 0)
        assert.match(bare.stderr, /TLS handshake with .* failed: .*certificate required/)

        // Without any TLS setting: the servers speak TLS, and the command says so at once.
        const { STRATA_TLS_CA: _a, ...plaintext } = caOnly
        const unsecured = yield* run(["tablets", "describe", "orders"], plaintext)
        assert.notStrictEqual(unsecured.code, 0)
        assert.match(unsecured.stderr, /the server speaks TLS and this client has no TLS settings/)
        // Without the cluster's CA: the servers' certificates are not trusted.
        const untrusting = yield* run(["tablets", "describe", "orders"], {
          ...operator,
          STRATA_TLS_CA: other.file("other-ca.pem")
        })
        assert.notStrictEqual(untrusting.code, 0)
        assert.match(untrusting.stderr, /TLS handshake with .* failed: .*(self[- ]signed|unable to verify)/i)
        // A bad setting: the key file is not the certificate's, named with its file and never printed.
        const mismatched = yield* run(["tablets", "describe", "orders"], {
          ...operator,
          STRATA_TLS_KEY: other.file("rogue-key.pem")
        })
        assert.notStrictEqual(mismatched.code, 0)
        assert.match(
          mismatched.stderr,
          /tlsKey \(from the file .*rogue-key\.pem\): it is not the private key of tlsCert/
        )

        for (const refused of [bare, unsecured, untrusting, mismatched])
          assert.lengthOf(refused.stderr.trim().split("\n"), 1)
        // A tablet server given another CA's certificate stops before it registers, in one line.
        const intruder = yield* run(["tablet-server", "--id", "9", "--data", join(certificates, "intruder")], {
          ...operator,
          STRATA_TLS_CERT: other.file("rogue.pem"),
          STRATA_TLS_KEY: other.file("rogue-key.pem")
        })
        assert.notStrictEqual(intruder.code, 0)
        assert.match(intruder.stderr, /tls\.cert .*not signed by the CA of tls\.ca/)
        assert.lengthOf(intruder.stderr.trim().split("\n"), 1)

        const described = yield* run(["tablets", "describe", "orders"], operator)
        assert.strictEqual(described.code, 0, described.stderr)
        assert.match(described.stdout, /orders:1/)
        const printed = [
          cluster.log("coordinator", 101),
          ...[1, 2, 3].map((id) => cluster.log("tablet-server", id)),
          ...[created, bare, unsecured, untrusting, mismatched, intruder, described].map((r) => r.stdout + r.stderr)
        ].join("\n")
        for (const key of [ca.pem("node-key.pem"), ca.pem("operator-key.pem"), other.pem("rogue-key.pem")]) {
          assert.notInclude(printed, key.split("\n")[1]!)
        }
      }).pipe(Effect.scoped)
  )
})
