import { type Coordination, Models } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import * as ZooKeeperCoordination from "@strata/election/zookeeper"
import { Effect, Result, type Scope } from "effect"
import { inject } from "vitest"
import {
  awaitMetadata,
  client,
  faultSettings,
  record,
  writeEach,
  cliProcesses,
  zooKeeperCluster
} from "./support/clusterTest.js"
import type * as ProcessCluster from "../../../scripts/test-support/processCluster.js"
import * as Checker from "./support/replicaChecker.js"

const processes = cliProcesses()

const TABLETS = 200

/** Polls `find` every 100 ms until it finds something, for up to 60 s. */
const waitFor = async <A>(what: string, find: () => A | undefined): Promise<A> => {
  const deadline = Date.now() + 60_000
  while (Date.now() < deadline) {
    const found = find()
    if (found !== undefined) return found
    await new Promise((r) => setTimeout(r, 100))
  }
  throw new Error(`timed out waiting for ${what}`)
}
/**
 * Runs `body` against a process cluster on the test's ZooKeeper, in a fresh directory and namespace named after
 * `label`; every process is killed afterwards, and a failure prints the end of each process's log.
 */
const onZooKeeper = <A, E>(
  label: string,
  body: (
    cluster: ProcessCluster.ProcessCluster,
    namespace: string
  ) => Effect.Effect<A, E, ZooKeeperCoordination.ZooKeeperCoordination | Coordination.Coordination | Scope.Scope>
) =>
  Effect.gen(function* () {
    const { cluster, namespace } = yield* zooKeeperCluster(processes, label)
    return yield* Effect.scoped(body(cluster, namespace)).pipe(
      Effect.tapError(() => Effect.logError(cluster.logTails(30))),
      Effect.provide(ZooKeeperCoordination.layer({ connectString: inject("zookeeper") }))
    )
  }).pipe(Effect.scoped)

const SERVERS = [1, 2, 3, 4, 5]
const COORDINATORS = [101, 102, 103]

describe("a cluster of real processes on ZooKeeper", () => {
  it.live(
    "the seed's operation 2: kill -9 the server leading most tablets; every tablet leads again and takes acks=all writes, ISRs shrink, the server comes back into every ISR, nothing acknowledged is lost",
    () =>
      onZooKeeper("op2", (cluster, namespace) =>
        Effect.gen(function* () {
          yield* Effect.forEach(COORDINATORS, (id) => cluster.start("coordinator", id), { concurrency: "unbounded" })
          yield* Effect.forEach(SERVERS, (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
          const c = yield* client(namespace)
          const created = yield* c.createTable("op2", { buckets: TABLETS })
          assert.strictEqual(created.length, TABLETS)
          const tablets = created.map((t) => t.tablet)
          yield* awaitMetadata(c, "op2", "every tablet online with a full ISR", (m) =>
            m.tablets.every((t) => t.leader !== null && t.isr.length === 3)
          )
          const before = yield* writeEach(c, tablets, "before")
          assert.strictEqual(before.length, TABLETS, "every tablet takes a write before the kill")

          // The server leading the most tablets.
          const metadata = yield* c.metadata("op2")
          // Every server serves its data link (appends and these fetches go there), on a port of its own.
          for (const s of metadata.servers) {
            assert.match(s.dataAddress ?? "", /^127\.0\.0\.1:\d+$/, `server ${s.id}'s data link`)
            assert.notStrictEqual(s.dataAddress, s.address)
          }
          const leads = new Map<number, number>()
          for (const t of metadata.tablets) if (t.leader !== null) leads.set(t.leader, (leads.get(t.leader) ?? 0) + 1)
          const [victim, led] = [...leads.entries()].sort((a, b) => b[1] - a[1])[0]!
          const killedAt = Date.now()
          yield* cluster.kill("tablet-server", victim)

          const moved = yield* awaitMetadata(
            c,
            "op2",
            `every tablet led by a live server after server ${victim} died`,
            (m) => m.tablets.every((t) => t.leader !== null && t.leader !== victim)
          )
          const movedMs = Date.now() - killedAt
          assert.isTrue(
            moved.tablets.every((t) => !t.isr.includes(victim)),
            "the dead server left every ISR"
          )
          const after = yield* writeEach(c, tablets, "after")
          assert.strictEqual(after.length, TABLETS, "every tablet takes an acks=all write without the dead server")
          const writableMs = Date.now() - killedAt

          yield* cluster.start("tablet-server", victim)
          const replicated = metadata.tablets.filter((t) => t.replicas.includes(victim)).length
          yield* awaitMetadata(c, "op2", `server ${victim} back in the ISR of its ${replicated} tablets`, (m) =>
            m.tablets.every((t) => !t.replicas.includes(victim) || t.isr.includes(victim))
          )
          const rejoinedMs = Date.now() - killedAt

          // The leading coordinator is killed too: a standby takes over from its warm view, reading only the tablets
          // written since it last caught up, and asks the servers what they hold instead of instructing them anew.
          const leaderEpoch = (id: number) =>
            Math.max(
              -1,
              ...[...cluster.log("coordinator", id).matchAll(/Became coordinator leader with epoch (\d+)/g)].map((m) =>
                Number(m[1])
              )
            )
          const leader = [...COORDINATORS].sort((a, b) => leaderEpoch(b) - leaderEpoch(a))[0]!
          const deposed = leaderEpoch(leader)
          yield* cluster.kill("coordinator", leader)
          const resumed = yield* Effect.promise(() =>
            waitFor(`a coordinator resuming after epoch ${deposed}`, () =>
              COORDINATORS.filter((id) => id !== leader)
                .flatMap((id) => [
                  ...cluster
                    .log("coordinator", id)
                    .matchAll(/controller of coordinator epoch (\d+): (.*) (\d+) of (\d+) tablets/g)
                ])
                .find((m) => Number(m[1]) > deposed)
            )
          )
          assert.strictEqual(resumed[2], "caught up on", resumed[0])
          assert.isBelow(Number(resumed[3]), TABLETS, resumed[0])
          assert.strictEqual(Number(resumed[4]), TABLETS, resumed[0])
          const third = yield* writeEach(c, tablets, "after the coordinator")
          assert.strictEqual(third.length, TABLETS, "every tablet takes an acks=all write under the new coordinator")
          const report = yield* Checker.check(c, "op2", [...before, ...after, ...third])
          yield* Effect.logInfo(
            `operation 2: server ${victim} led ${led} of ${TABLETS} tablets; leaders moved in ${movedMs} ms, all writable in ${writableMs} ms, back in every ISR in ${rejoinedMs} ms (session timeout ${faultSettings.sessionTimeout} ms); after the leading coordinator's kill: "${resumed[0]}"`
          )
          assert.deepStrictEqual(report.lost, [])
          assert.deepStrictEqual(report.duplicates, [])
          assert.deepStrictEqual(report.divergent, [])
          assert.deepStrictEqual(report.epochConflicts, [])
          assert.strictEqual(report.acked, 3 * TABLETS)
          assert.isAtLeast(report.records, 3 * TABLETS)
          // The checker is not vacuous: a record never written, claimed as acknowledged, is reported lost.
          const planted = yield* Checker.check(c, "op2", [
            { tablet: tablets[0]!, baseOffset: 0, values: ["never-written"] }
          ])
          assert.strictEqual(planted.lost.length, 3, planted.lost.join("\n"))
          // The restarted server's replicas hold what the leaders hold.
          for (const t of metadata.tablets.filter((t) => t.replicas.includes(victim)).slice(0, 5)) {
            const page = yield* c.remote.server(victim).readLog({ tablet: t.tablet, offset: 0, maxBytes: 65_536 })
            assert.isAtLeast(page.logEndOffset, 2, `${Models.tabletKey(t.tablet)} on the restarted server`)
          }
        })
      ),
    300_000
  )

  it.live(
    "deleting a table while a server is down: its tablets stop, the live replicas delete their data, the name stays taken until the server is back and has deleted its own, then a new table of that name starts empty",
    () =>
      onZooKeeper("delete", (cluster, namespace) =>
        Effect.gen(function* () {
          yield* cluster.start("coordinator", 101)
          yield* Effect.forEach([1, 2, 3], (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
          const c = yield* client(namespace)
          const created = yield* c.createTable("gone", { buckets: 6 })
          const tablets = created.map((t) => t.tablet)
          yield* awaitMetadata(c, "gone", "every tablet online with a full ISR", (m) =>
            m.tablets.every((t) => t.leader !== null && t.isr.length === 3)
          )
          assert.strictEqual((yield* writeEach(c, tablets, "before")).length, 6)

          yield* cluster.kill("tablet-server", 3)
          assert.strictEqual(yield* c.deleteTable("gone"), 6)
          const again = yield* Effect.flip(c.createTable("gone", { buckets: 2 }))
          assert.include(again.message, "is being deleted")
          const missing = yield* Effect.flip(c.deleteTable("never"))
          assert.include(missing.message, "no table never")
          const deleting = yield* awaitMetadata(c, "gone", "every tablet deleting", (m) =>
            m.tablets.every((t) => t.state === "DeletingTablet" && t.leader === null)
          )
          assert.strictEqual(deleting.tablets.length, 6, "server 3 has not deleted its replicas: the tablets stay")
          // The live servers deleted theirs: they host them no more, and a write finds no leader.
          for (const id of [1, 2]) {
            const gone = yield* Effect.flip(
              c.remote.server(id).readLog({ tablet: tablets[0]!, offset: 0, maxBytes: 1024 })
            )
            assert.include(gone.message, "gone/0", `server ${id}`)
          }

          yield* cluster.start("tablet-server", 3)
          yield* awaitMetadata(
            c,
            "gone",
            "the table gone once server 3 deleted its replicas",
            (m) => m.tablets.length === 0
          )
          // What server 3 kept on disk while it was down is gone too.
          for (const id of [1, 2, 3]) {
            assert.deepStrictEqual(yield* c.remote.servers.logEnd(id, { tablet: tablets[1]! }), {
              lastEpoch: null,
              logEndOffset: 0
            })
          }
          // The name is free: a new table of it starts empty.
          const fresh = yield* c.createTable("gone", { buckets: 2 })
          yield* awaitMetadata(
            c,
            "gone",
            "the new table online",
            (m) => m.tablets.length === 2 && m.tablets.every((t) => t.leader !== null && t.isr.length === 3)
          )
          for (const t of fresh) {
            const sent = yield* Effect.result(c.send(t.tablet, [record(`new:${t.tablet.bucket}`)]))
            assert.isTrue(Result.isSuccess(sent), Result.isFailure(sent) ? sent.failure.message : "")
            if (Result.isSuccess(sent)) assert.strictEqual(sent.success.baseOffset, 0)
          }
        })
      ),
    180_000
  )
})
