/**
 * A tablet server whose disk fills, on real processes: server 3's data directory is a small tmpfs, filled by a file
 * of the test's while producers write; afterwards the file is removed.
 */
import { rmSync } from "node:fs"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import * as ZooKeeperCoordination from "@strata/election/zookeeper"
import type { ReplicaRpc } from "@strata/replica"
import { Duration, Effect, Fiber } from "effect"
import { inject } from "vitest"
import { awaitMetadata, cliProcesses, client, record, writeEach, zooKeeperCluster } from "./support/clusterTest.js"
import { fill, smallFilesystem } from "../../../scripts/test-support/smallFilesystem.js"
import * as Checker from "./support/replicaChecker.js"

const processes = cliProcesses()

const TABLE = "disk"
const TABLETS = 6
const FULL = 3

const lines = (text: string, pattern: RegExp) => text.split("\n").filter((line) => pattern.test(line)).length
const inNoIsrAndLeadingNothing = (m: ReplicaRpc.Metadata, server: number) =>
  m.tablets.every((t) => t.leader !== server && !t.isr.includes(server))

describe("a tablet server whose disk fills", () => {
  it.live(
    "its replicas go offline: leadership moves off it, it leaves every ISR, the others take every write, it backs off; once space is freed it is back in every ISR and leads its preferred tablets; nothing acknowledged is lost",
    () =>
      Effect.gen(function* () {
        const { cluster, namespace } = yield* zooKeeperCluster(processes, "disk", {
          leaderImbalanceCheckInterval: 2_000
        })
        yield* Effect.addFinalizer((exit) =>
          exit._tag === "Failure" ? Effect.sync(() => console.log(cluster.logTails(60))) : Effect.void
        )
        const directory = cluster.dataDirectory(FULL)
        // Room for everything the test writes (server 3 copies every record once space is freed), then filled.
        yield* smallFilesystem(directory, 512)
        yield* cluster.start("coordinator", 101)
        yield* Effect.forEach([1, 2, 3], (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
        const c = yield* client(namespace, 20_000)
        const tablets = (yield* c.createTable(TABLE, { buckets: TABLETS })).map((t) => t.tablet)
        const whole = yield* awaitMetadata(c, TABLE, "every tablet led, with its full ISR", (m) =>
          m.tablets.every((t) => t.leader !== null && t.isr.length === 3)
        )
        const preferred = whole.tablets.filter((t) => t.replicas[0] === FULL).length
        assert.isAbove(preferred, 0, "server 3 is the preferred leader of some tablets")

        // Producers, all along: 1 KB records to every tablet in turn, 8 to a send.
        const acked: Array<Checker.Acked> = []
        const sends = { ok: 0, failed: 0 }
        let stop = false
        // Unpaced until server 3's storage fails (the records written after the disk filled use up what the file
        // system still had).
        let paced = false
        const payload = "x".repeat(1_000)
        const producer = (p: number) =>
          Effect.gen(function* () {
            let n = 0
            for (let i = p; !stop; i++) {
              const tablet = tablets[i % TABLETS]!
              const values = Array.from({ length: 8 }, () => `p${p}-${n++}-${payload}`)
              const r = yield* Effect.result(c.send(tablet, values.map(record)))
              if (r._tag === "Success") {
                sends.ok++
                acked.push({ tablet, baseOffset: r.success.baseOffset, values })
              } else sends.failed++
              // Paced once the storage failed (~0.5 MB/s in all): server 3 copies every record once space is freed.
              if (paced) yield* Effect.sleep(Duration.millis(50))
            }
          })
        const producers = yield* Effect.forkChild(
          Effect.forEach([1, 2, 3], producer, { concurrency: "unbounded", discard: true })
        )

        // The disk fills, and is kept full: whatever the storage gives back as it fails or opens a log again is
        // taken too.
        const fillers: Array<string> = []
        const topUp = () => {
          const file = join(directory, `filler-${fillers.length}`)
          fillers.push(file)
          return fill(file)
        }
        const filled = topUp()
        const keepFull = yield* Effect.forkChild(
          Effect.forever(Effect.sleep(Duration.millis(100)).pipe(Effect.andThen(Effect.sync(topUp))))
        )
        const log = () => cluster.log("tablet-server", FULL)
        const failedLine = new RegExp(
          `storage \\(segment files, [^)]*/${TABLE}-\\d+\\) failed: .*no space left on device`,
          "i"
        )
        yield* awaitLine(log, failedLine, "server 3 reports its failed storage (No space left on device)", 120_000)
        paced = true
        const cut = yield* awaitMetadata(c, TABLE, "server 3 leads nothing and is in no ISR", (m) =>
          inNoIsrAndLeadingNothing(m, FULL)
        )
        assert.isTrue(cut.tablets.every((t) => t.leader !== null && t.isr.length === 2))

        // While kept full: every tablet takes writes on the others; preferred elections (every 2 s) never pick server 3;
        // its tries back off.
        const ackedBefore = acked.length
        const bytesBefore = log().length
        const linesBefore = log().split("\n").length
        yield* Effect.sleep(Duration.seconds(15))
        const during = yield* c.metadata(TABLE)
        assert.isTrue(
          inNoIsrAndLeadingNothing(during, FULL),
          `server 3 came back while full: ${JSON.stringify(during)}`
        )
        const ackedDuring = acked.slice(ackedBefore)
        for (const t of tablets)
          assert.isTrue(
            ackedDuring.some((a) => a.tablet.bucket === t.bucket),
            `tablet ${t.bucket} took no write while server 3 was full`
          )
        const grew = { bytes: log().length - bytesBefore, lines: log().split("\n").length - linesBefore }
        // Six replicas retrying with a doubling backoff log a few lines each in 15 s, not ten a second.
        assert.isBelow(grew.lines, 120, `server 3 logged ${grew.lines} lines (${grew.bytes} bytes) in 15 s while full`)
        for (const id of [1, 2]) {
          const other = cluster.log("tablet-server", id)
          assert.isBelow(lines(other, /no space left/i), 5, `server ${id} logs server 3's failure`)
        }

        // Space freed: the replicas resume, rejoin every ISR, and server 3 leads its preferred tablets again.
        yield* Fiber.interrupt(keepFull)
        for (const file of fillers) rmSync(file)
        yield* awaitLine(
          log,
          /takes writes again; the replica is online/,
          "server 3's storage takes writes again",
          90_000
        )
        yield* awaitMetadata(
          c,
          TABLE,
          "server 3 back in every ISR, leading its preferred tablets",
          (m) =>
            m.tablets.every((t) => t.isr.length === 3 && t.leader === t.replicas[0]) &&
            m.tablets.filter((t) => t.leader === FULL).length === preferred,
          90_000
        )
        const after = yield* writeEach(c, tablets, "after")
        assert.strictEqual(after.length, TABLETS, "every tablet takes a write once space is freed")
        acked.push(...after)

        stop = true
        yield* Fiber.join(producers)
        const report = yield* Checker.check(c, TABLE, acked)
        console.log(
          `disk: filled ${filled} bytes; sends ok ${sends.ok}, failed ${sends.failed}; while full ${ackedDuring.length} sends acked, server 3 logged ${grew.lines} lines; ${report.acked} acked records checked against ${report.records} held`
        )
        assert.deepStrictEqual(report.lost, [], "acknowledged records lost")
        assert.deepStrictEqual(report.duplicates, [], "duplicates")
        assert.deepStrictEqual(report.divergent, [], "replicas diverge below the HW")
        assert.deepStrictEqual(report.epochConflicts, [], "two leaders of one epoch")
        assert.isAbove(report.acked, 0)
      }).pipe(Effect.scoped, Effect.provide(ZooKeeperCoordination.layer({ connectString: inject("zookeeper") }))),
    420_000
  )
})

/** Waits until `text()` has a line matching `pattern` (polled every 200 ms, up to `timeoutMs`). */
const awaitLine = (text: () => string, pattern: RegExp, what: string, timeoutMs: number) =>
  Effect.gen(function* () {
    const deadline = Date.now() + timeoutMs
    while (Date.now() < deadline) {
      if (lines(text(), pattern) > 0) return
      yield* Effect.sleep(Duration.millis(200))
    }
    return yield* Effect.fail(new Error(`${what}: not within ${timeoutMs} ms`))
  })
