/**
 * No herd effect (one wake-up per leader death; docs/ARCHITECTURE.md, "Real-process tests"), with real processes on real
 * ZooKeeper and on real etcd: 20 candidate processes (`fixtures/candidate.ts`, bundled once with esbuild) campaign in
 * one namespace; the leader is killed five times (three clean closes with SIGTERM, two `kill -9` left to the session
 * timeout). For each death: the dead leader's successor (the next candidate node in sequence order) is the one and
 * only process woken, exactly once, and it becomes the leader with a higher epoch.
 *
 * Wake-ups are the recipe's own count of predecessor-watch notifications: each process reports every increase of
 * its `strata_coordinator_candidate_wakeups_total` counter. Before the first kill every process has created its
 * candidate node and has had time to set its watch, and none has been woken yet. After each new leader the test
 * waits `SETTLE_MS` more, so a wake-up of any other process would show.
 */
import { afterAll, assert, beforeAll, describe, it } from "@effect/vitest"
import { inject } from "vitest"
import { type CandidateRunner, candidateRunner } from "./fixtures/bundle.js"
import { CandidateGroup, killAllCandidates } from "./fixtures/candidates.js"

const CANDIDATES = 20
const SESSION_TIMEOUT_MS = 2_000
/** The leader deaths, in order. */
const DEATHS: ReadonlyArray<"SIGTERM" | "SIGKILL"> = ["SIGTERM", "SIGKILL", "SIGTERM", "SIGKILL", "SIGTERM"]
/** How long to keep watching for other wake-ups once the new leader reported. */
const SETTLE_MS = 1_000
const ROOT = "/strata-herd"

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

let runner: CandidateRunner | undefined

beforeAll(async () => {
  runner = await candidateRunner()
}, 60_000)

afterAll(async () => {
  killAllCandidates()
  await runner?.dispose()
})

const sum = (counts: Map<number, number>): number => [...counts.values()].reduce((a, b) => a + b, 0)

const herdSuite = (backend: "zookeeper" | "etcd", address: () => string) =>
  describe(`herd (${backend})`, () => {
    it(`${CANDIDATES} candidate processes: one wake-up per leader death, the successor's`, async () => {
      assert.isDefined(runner)
      if (runner === undefined) return
      const namespace = `herd-${backend}-${Date.now()}-${Math.floor(Math.random() * 1e9)}`
      const group = new CandidateGroup(runner, backend, address(), namespace, SESSION_TIMEOUT_MS, ROOT)
      const started = Date.now()
      const lines: Array<string> = []
      try {
        for (let id = 1; id <= CANDIDATES; id++) group.start(id)
        await group.waitUntil(
          `${CANDIDATES} candidate nodes and a leader`,
          () => group.candidateNames().size === CANDIDATES && group.leaders().size === 1,
          60_000
        )
        const startupMs = Date.now() - started
        // The watches are set right after each candidate lists the election's children: give them time.
        await sleep(1_500)
        assert.strictEqual(sum(group.wakeups()), 0, group.describe("a candidate was woken before any leader died"))

        for (const [round, signal] of DEATHS.entries()) {
          const leaders = [...group.leaders().entries()]
          assert.strictEqual(leaders.length, 1, group.describe(`round ${round}: leaders ${JSON.stringify(leaders)}`))
          const [leader, epoch] = leaders[0] ?? [0, 0]
          const order = [...group.candidateNames().entries()].sort(([, a], [, b]) => (a < b ? -1 : a > b ? 1 : 0))
          assert.strictEqual(order[0]?.[0], leader, group.describe(`round ${round}: the leader is not the lowest node`))
          const successor = order[1]?.[0]
          assert.isDefined(successor)
          const before = group.wakeups()
          const mark = group.events.length
          const t0 = Date.now()
          group.signal(leader, signal)
          const next = await group.waitFor(
            `a new leader after ${signal} of ${leader}`,
            (e) => e.event === "leader" && (e.epoch ?? 0) > epoch,
            SESSION_TIMEOUT_MS + 10_000,
            mark
          )
          const failoverMs = next.seenAt - t0
          await sleep(SETTLE_MS)
          const after = group.wakeups()
          const woken = [...after.entries()]
            .map(([id, count]) => [id, count - (before.get(id) ?? 0)] as const)
            .filter(([, n]) => n !== 0)
          assert.deepStrictEqual(
            woken,
            [[successor, 1]],
            group.describe(`round ${round} (${signal} of ${leader}): woken ${JSON.stringify(woken)}`)
          )
          assert.strictEqual(next.serverId, successor, group.describe(`round ${round}: leader is not the successor`))
          assert.isAtLeast(next.wakeups ?? 0, 1, "the new leader reported no wake-up")
          const now = [...group.leaders().entries()]
          assert.deepStrictEqual(now, [[successor, next.epoch ?? 0]], group.describe(`round ${round}: leaders`))
          lines.push(`${signal} ${leader}@${epoch} -> ${successor}@${next.epoch} in ${failoverMs} ms`)
        }
        assert.strictEqual(sum(group.wakeups()), DEATHS.length, group.describe("total wake-ups"))
        console.log(
          `[herd ${backend}] ${CANDIDATES} processes up in ${startupMs} ms; ${lines.join("; ")}; ` +
            `total ${Date.now() - started} ms`
        )
      } finally {
        await group.stopAll()
      }
    }, 90_000)
  })

herdSuite("zookeeper", () => inject("zookeeper"))
herdSuite("etcd", () => inject("etcd"))
