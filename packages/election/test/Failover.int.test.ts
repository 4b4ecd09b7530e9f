/**
 * Leader failover of the fenced election across real processes (docs/ARCHITECTURE.md, "Real-process tests"), on ZooKeeper
 * and on etcd. Three coordinator processes (`fixtures/coordinator.ts`) campaign in one namespace; the leader performs
 * a fenced write every 200 ms. Scenarios, in order, per backend:
 *   1. `kill -9` of the leader: another process leads with a higher epoch within sessionTimeout + 2 s;
 *   2. SIGTERM of the leader (it closes its scope, so its session closes): a new leader within 1.5 s;
 *   3. SIGSTOP of the leader for longer than the session timeout, then SIGCONT: another process led with a higher
 *      epoch meanwhile, and the resumed one has its next fenced write rejected with FencedEpoch (or reports `lost` first), then campaigns again.
 * Throughout: leader epochs strictly increase in time, no two processes report successful writes with the same
 * epoch, and a resumed stale leader never reports a successful write it started after SIGCONT (a write in flight
 * at SIGSTOP may be applied before the fence and only reported after SIGCONT). Measured failover times are printed.
 */
import { createRequire } from "node:module"
import { dirname, join } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import { afterAll, assert, describe, it } from "@effect/vitest"
import { inject } from "vitest"
import { killAll, type ProcessEvent, ProcessGroup, sleep } from "./fixtures/processGroup.js"

const SESSION_TIMEOUT_MS = 4_000
const KILL_BOUND_MS = SESSION_TIMEOUT_MS + 2_000
const CLOSE_BOUND_MS = 1_500

const here = dirname(fileURLToPath(import.meta.url))
const fixture = join(here, "fixtures", "coordinator.ts")
const tsxLoader = pathToFileURL(createRequire(import.meta.url).resolve("tsx/esm")).href

/** One line a coordinator process printed. */
interface CoordinatorEvent extends ProcessEvent {
  readonly event: "campaign" | "leader" | "write" | "lost" | "error" | "closed" | "exited"
  readonly ok?: boolean
  /** For writes: tried after the leadership was reported lost. */
  readonly probe?: boolean
  /** For writes: when the fenced call started. */
  readonly startedAt?: number
  readonly reason?: string
  readonly detail?: string
}

afterAll(() => killAll())

class Cluster extends ProcessGroup<CoordinatorEvent> {
  constructor(
    readonly backend: "zookeeper" | "etcd",
    readonly address: string,
    readonly namespace: string
  ) {
    super(backend)
  }

  start(serverId: number): void {
    this.spawn(serverId, [
      "--import",
      tsxLoader,
      "--conditions=@strata/source",
      fixture,
      this.backend,
      this.address,
      this.namespace,
      String(serverId),
      String(SESSION_TIMEOUT_MS)
    ])
  }

  /** The single current leader (after a short settling wait, so that a second one would show). */
  async soleLeader(): Promise<{ readonly serverId: number; readonly epoch: number }> {
    await sleep(500)
    const leaders = [...this.leaders().entries()]
    assert.strictEqual(
      leaders.length,
      1,
      `${this.backend}: expected exactly one leader, got ${JSON.stringify(leaders)}`
    )
    const [serverId, epoch] = leaders[0] ?? [0, 0]
    return { serverId, epoch }
  }

  /** Global invariants over the whole run. */
  checkInvariants(): void {
    const leaderEvents = this.events
      .filter((e) => e.event === "leader")
      .slice()
      .sort((a, b) => a.at - b.at)
    for (let i = 1; i < leaderEvents.length; i++) {
      const prev = leaderEvents[i - 1]
      const next = leaderEvents[i]
      if (prev === undefined || next === undefined) continue
      assert.isTrue(
        (next.epoch ?? 0) > (prev.epoch ?? 0),
        `${this.backend}: leader epochs not strictly increasing: ${JSON.stringify(prev)} then ${JSON.stringify(next)}`
      )
    }
    const writers = new Map<number, Set<number>>()
    for (const e of this.events) {
      if (e.event !== "write" || e.ok !== true || e.epoch === undefined) continue
      const set = writers.get(e.epoch) ?? new Set<number>()
      set.add(e.serverId)
      writers.set(e.epoch, set)
    }
    for (const [epoch, set] of writers) {
      assert.isAtMost(set.size, 1, `${this.backend}: epoch ${epoch} has successful writes from ${[...set].join(",")}`)
    }
  }
}

const failoverSuite = (backend: "zookeeper" | "etcd", address: () => string) =>
  describe(`failover (${backend})`, () => {
    it("kill -9, clean close and a paused leader fail over with increasing epochs", async () => {
      const namespace = `failover-${backend}-${Date.now()}-${Math.floor(Math.random() * 1e9)}`
      const cluster = new Cluster(backend, address(), namespace)
      const timings: Record<string, number> = {}
      try {
        for (const id of [1, 2, 3]) cluster.start(id)
        await cluster.waitFor("a first leader", (e) => e.event === "leader", 60_000)
        // Every process is up and campaigning before the scenarios start.
        for (const id of [1, 2, 3]) {
          await cluster.waitFor(`process ${id} campaigning`, (e) => e.event === "campaign" && e.serverId === id, 30_000)
        }
        const first = await cluster.soleLeader()
        await cluster.waitFor("a write", (e) => e.event === "write" && e.ok === true, 5_000)

        // 1. kill -9 of the leader.
        let mark = cluster.events.length
        let t0 = Date.now()
        cluster.signal(first.serverId, "SIGKILL")
        const afterKill = await cluster.waitFor(
          "a leader after kill -9",
          (e) => e.event === "leader" && e.serverId !== first.serverId && (e.epoch ?? 0) > first.epoch,
          KILL_BOUND_MS + 10_000,
          mark
        )
        timings.kill9 = afterKill.at - t0
        assert.isAtMost(timings.kill9, KILL_BOUND_MS, `${backend}: kill -9 failover took ${timings.kill9} ms`)
        cluster.start(4)
        await cluster.waitFor("process 4 campaigning", (e) => e.event === "campaign" && e.serverId === 4, 30_000)
        const second = await cluster.soleLeader()

        // 2. Clean close (SIGTERM) of the leader.
        mark = cluster.events.length
        t0 = Date.now()
        cluster.signal(second.serverId, "SIGTERM")
        const afterClose = await cluster.waitFor(
          "a leader after SIGTERM",
          (e) => e.event === "leader" && e.serverId !== second.serverId && (e.epoch ?? 0) > second.epoch,
          CLOSE_BOUND_MS + 10_000,
          mark
        )
        timings.sigterm = afterClose.at - t0
        assert.isAtMost(timings.sigterm, CLOSE_BOUND_MS, `${backend}: clean-close failover took ${timings.sigterm} ms`)
        cluster.start(5)
        await cluster.waitFor("process 5 campaigning", (e) => e.event === "campaign" && e.serverId === 5, 30_000)
        const third = await cluster.soleLeader()
        await cluster.waitFor(
          "a write of the third leader",
          (e) => e.event === "write" && e.ok === true && e.serverId === third.serverId,
          5_000,
          mark
        )

        // 3. SIGSTOP the leader past its session timeout, then SIGCONT.
        mark = cluster.events.length
        t0 = Date.now()
        cluster.signal(third.serverId, "SIGSTOP")
        const afterStop = await cluster.waitFor(
          "a leader while the old one is stopped",
          (e) => e.event === "leader" && e.serverId !== third.serverId && (e.epoch ?? 0) > third.epoch,
          KILL_BOUND_MS + 10_000,
          mark
        )
        timings.sigstop = afterStop.at - t0
        const stoppedFor = Math.max(SESSION_TIMEOUT_MS + 1_000, Date.now() - t0 + 500)
        await sleep(stoppedFor - (Date.now() - t0))
        const contAt = Date.now()
        cluster.signal(third.serverId, "SIGCONT")
        const fencedOrLost = await cluster.waitFor(
          "the resumed leader rejected or lost",
          (e) =>
            e.serverId === third.serverId &&
            ((e.event === "write" && e.ok === false && e.epoch === third.epoch) || e.event === "lost"),
          15_000,
          mark
        )
        // A write the resumed leader attempts is rejected as stale (FencedEpoch), never as a mere coordination failure.
        if (fencedOrLost.event === "write") assert.strictEqual(fencedOrLost.reason, "FencedEpoch", fencedOrLost.detail)
        const index = cluster.events.indexOf(fencedOrLost)
        const lost = await cluster.waitFor(
          "the resumed leader reporting lost",
          (e) => e.serverId === third.serverId && e.event === "lost",
          15_000,
          index
        )
        await cluster.waitFor(
          "the resumed leader campaigning again",
          (e) => e.serverId === third.serverId && e.event === "campaign",
          15_000,
          cluster.events.indexOf(lost)
        )
        timings.resumedToLost = lost.at - contAt
        const fencedWrite = await cluster.waitFor(
          "the resumed leader's write rejected with FencedEpoch",
          (e) => e.serverId === third.serverId && e.event === "write" && e.ok === false && e.epoch === third.epoch,
          15_000,
          mark
        )
        // Refused as stale. A write the process tries after it already reported the leadership lost (the probe) may
        // also be refused by its expired session before the newer epoch could be read: refused either way.
        const refusedAsStale = (e: CoordinatorEvent) =>
          e.reason === "FencedEpoch" || (e.probe === true && /expired/.test(e.detail ?? ""))
        assert.isTrue(refusedAsStale(fencedWrite), `${fencedWrite.reason}: ${fencedWrite.detail}`)
        const rejectedOtherwise = cluster.events.filter(
          (e) =>
            e.serverId === third.serverId &&
            e.event === "write" &&
            e.ok === false &&
            e.at >= contAt &&
            !refusedAsStale(e)
        )
        assert.deepStrictEqual(rejectedOtherwise, [], "the resumed leader's writes are rejected with FencedEpoch")
        const staleWrites = cluster.events.filter(
          (e) =>
            e.serverId === third.serverId &&
            e.event === "write" &&
            e.ok === true &&
            e.epoch === third.epoch &&
            e.at >= contAt
        )
        assert.strictEqual(
          staleWrites.length,
          0,
          `${backend}: resumed stale leader wrote ${JSON.stringify(staleWrites)}`
        )
        // The new leader keeps writing with its higher epoch.
        await cluster.waitFor(
          "a write of the new leader",
          (e) => e.event === "write" && e.ok === true && e.epoch === afterStop.epoch,
          5_000,
          mark
        )
        await sleep(500)
        cluster.checkInvariants()
        console.log(
          `[failover ${backend}] kill -9: ${timings.kill9} ms, SIGTERM: ${timings.sigterm} ms, ` +
            `SIGSTOP (new leader while stopped): ${timings.sigstop} ms, resumed -> lost: ${timings.resumedToLost} ms ` +
            `(${fencedOrLost.event}${fencedOrLost.reason === undefined ? "" : ` ${fencedOrLost.reason}`}); ` +
            `leader epochs: ${cluster.events
              .filter((e) => e.event === "leader")
              .map((e) => `${e.serverId}@${e.epoch}`)
              .join(" ")}`
        )
      } finally {
        await cluster.stopAll()
      }
    }, 150_000)
  })

failoverSuite("zookeeper", () => inject("zookeeper"))
failoverSuite("etcd", () => inject("etcd"))
