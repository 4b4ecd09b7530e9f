/**
 * The process and network faults: a fault of a kind the seed draws (or a scenario scripts) strikes a process —
 * crash, power loss, clean stop, pause past its session, session expiry, isolation, a cut link (both ways or one
 * way), slowness, being cut off from coordination, a full disk, a controlled shutdown — and lasts until a step,
 * when `heal` ends it (or, once the faults stop, ends every fault at once).
 */
import { Duration, Effect } from "effect"
import { pickWeighted } from "../../../../scripts/test-support/sim/FaultPick.js"
import * as Audit from "./Audit.js"
import type { FaultKind, Target } from "./Config.js"
import { link } from "./Network.js"
import * as Process from "./Process.js"
import { count, log, type Proc, type World } from "./World.js"

/** Cuts `p` from every process and the clients until step `back`. */
const isolate = (w: World, p: Proc, back: number): void => {
  log(w, `FAULT isolate ${p.name} until step ${back}`)
  for (const q of [...w.procs.map((x) => x.name), "client"]) if (q !== p.name) w.network.cuts.add(link(p.name, q))
  w.network.isolations.push({ name: p.name, until: back })
}

/** Cuts the link between `p` and another process the seed picks, both ways, until step `back`. */
const cutLink = (w: World, p: Proc, back: number): void => {
  const q = w.rng.pick(w.procs.filter((x) => x !== p))
  log(w, `FAULT cut ${p.name}|${q.name} until step ${back}`)
  w.network.cuts.add(link(p.name, q.name))
  w.network.linkCuts.push({ key: link(p.name, q.name), until: back })
}

/** Cuts the link from `p` to another process the seed picks, one way, until step `back`. */
const cutOneWay = (w: World, p: Proc, back: number): void => {
  const q = w.rng.pick(w.procs.filter((x) => x !== p))
  log(w, `FAULT cut ${p.name}>${q.name} one way until step ${back}`)
  w.network.oneWay.add(`${p.name}>${q.name}`)
  w.timed.push({ until: back, end: Effect.sync(() => w.network.oneWay.delete(`${p.name}>${q.name}`)) })
}

/** Every write of server `p`'s store fails until step `back`, as on a full disk. */
const fillDisk = (w: World, p: Proc, back: number): void => {
  const store = w.stores.get(p.id)
  if (p.kind !== "server" || store === undefined) return
  log(w, `FAULT ${p.name}'s disk is full until step ${back}`)
  store.failing = true
  w.timed.push({
    until: back,
    end: Effect.sync(() => {
      store.failing = false
    })
  })
}

/** Every call in and out of `p` is slow until step `back`. */
const slowDown = (w: World, p: Proc, back: number): void => {
  log(w, `FAULT ${p.name} slow until step ${back}`)
  w.network.slow.add(p.name)
  w.timed.push({ until: back, end: Effect.sync(() => w.network.slow.delete(p.name)) })
}

/**
 * The end of a cut from coordination: the gate opens again unless the process is paused by then, and the sessions
 * its running incarnation still has reconnect (a crashed one's are left to expire).
 */
const uncutCoordination = (w: World, p: Proc) => {
  const gate = p.gate
  const sessions = [...p.sessions]
  return Effect.suspend(() =>
    p.paused
      ? Effect.void
      : Effect.andThen(
          gate.open,
          Effect.forEach(
            sessions.filter((s) => p.sessions.has(s)),
            (s) => Effect.ignore(w.faults.reconnect!(s)),
            { discard: true }
          )
        )
  )
}

/** A controlled shutdown of server `p`: leadership moves off it first, then it stops cleanly a moment later. */
const shutDown = (w: World, p: Proc, server: NonNullable<Proc["server"]>) =>
  Effect.forkIn(
    Effect.gen(function* () {
      const remaining = yield* server.controlledShutdown
      log(w, `${p.name} leads ${remaining} tablets as it stops`)
      // A process takes its time to stop once its leaderships moved: its replicas follow meanwhile.
      yield* Effect.sleep(Duration.millis(w.rng.int(0, 2_000)))
      if (p.server === server) yield* Process.down(w, p, false, false)
      p.stopping = false
    }),
    w.root
  )

/** Injects one fault into `p` at `step`; it lasts until `back` where it has an end. */
export const inject = (w: World, kind: FaultKind, p: Proc, step: number, back: number) =>
  Effect.gen(function* () {
    if (p.scope === undefined || p.paused || p.backAt !== undefined) return
    count(w, kind)
    switch (kind) {
      case "crash":
      case "stop":
        log(w, `FAULT ${kind} ${p.name}, back at step ${back}`)
        p.backAt = back
        return yield* Process.down(w, p, kind === "crash", false)
      case "power": {
        // Losing unflushed writes is survivable when an acknowledged record has another copy that is kept:
        // with a minimum ISR of 2 and every other server flushed now, it has.
        const lose = p.kind === "server" && w.cluster.minIsr >= 2
        if (lose) for (const [id, store] of w.stores) if (id !== p.id) store.flush()
        log(w, `FAULT power loss of ${p.name}${lose ? ", unflushed writes lost" : ""}, back at step ${back}`)
        p.backAt = back
        return yield* Process.down(w, p, true, lose)
      }
      case "pause": {
        const until = Math.max(back, step + Math.ceil(w.cluster.sessionTimeoutMs / w.config.stepMs) + 1)
        log(w, `FAULT pause ${p.name} past its session, resume at step ${until}`)
        p.backAt = until
        return yield* Process.pause(w, p)
      }
      case "expire":
        log(w, `FAULT expire the sessions of ${p.name}`)
        return yield* Effect.forEach([...p.sessions], (s) => Effect.ignore(w.faults.expire(s)), { discard: true })
      case "isolate":
        return isolate(w, p, back)
      case "cut":
        return cutLink(w, p, back)
      case "oneway":
        return cutOneWay(w, p, back)
      case "disk":
        return fillDisk(w, p, back)
      case "slow":
        return slowDown(w, p, back)
      case "coordination": {
        // Cut off from the coordination service only: its sessions disconnect and its operations wait, while it
        // runs on and reaches its peers.
        log(w, `FAULT ${p.name} cut off from coordination until step ${back}`)
        yield* p.gate.close
        yield* Effect.forEach([...p.sessions], (s) => Effect.ignore(w.faults.disconnect!(s)), { discard: true })
        w.timed.push({ until: back, end: uncutCoordination(w, p) })
        return
      }
      case "shutdown": {
        const server = p.server
        if (server === undefined) return
        log(w, `FAULT controlled shutdown of ${p.name}, back at step ${back}`)
        p.backAt = back
        p.stopping = true
        yield* shutDown(w, p, server)
        return
      }
    }
  })

/** A random fault, drawn from the seed: a process, a kind of the seed's mix, and when it ends. */
export const randomFault = (w: World, step: number) => {
  const p = w.rng.pick(w.procs)
  let kind = pickWeighted(w.rng, w.cluster.faultMix.kinds)
  if (kind === "shutdown" && p.kind !== "server") kind = "stop"
  return inject(w, kind, p, step, step + w.rng.int(3, 20))
}

/** The processes a scripted fault strikes. */
export const targets = (w: World, target: Target) =>
  Effect.gen(function* () {
    if (target === "all") return w.procs
    if (target === "all-servers") return w.servers
    if (typeof target === "string") return w.procs.filter((p) => p.name === target)
    const meta = yield* Audit.readTablet(w, { table: "t", bucket: target.leaderOf })
    const leader = meta?.leaderAndIsr.leader
    return w.servers.filter((p) => p.id === leader)
  })

/** Ends the faults due by `step` (every fault when `all`): processes come back, links heal, timed faults end. */
export const heal = (w: World, step: number, all: boolean) =>
  Effect.gen(function* () {
    const { network } = w
    for (const p of w.procs) {
      if (p.backAt === undefined || p.stopping || (!all && p.backAt > step)) continue
      p.backAt = undefined
      if (p.paused) {
        log(w, `${p.name} resumes`)
        yield* Process.resume(w, p)
      } else if (p.scope === undefined) yield* Process.start(w, p)
    }
    for (let i = network.isolations.length - 1; i >= 0; i--) {
      const iso = network.isolations[i]!
      if (!all && iso.until > step) continue
      network.isolations.splice(i, 1)
      for (const q of [...w.procs.map((x) => x.name), "client"]) network.cuts.delete(link(iso.name, q))
      log(w, `${iso.name} reachable again`)
    }
    for (let i = network.linkCuts.length - 1; i >= 0; i--) {
      const c = network.linkCuts[i]!
      if (!all && c.until > step) continue
      network.linkCuts.splice(i, 1)
      network.cuts.delete(c.key)
    }
    for (let i = w.timed.length - 1; i >= 0; i--) {
      const t = w.timed[i]!
      if (!all && t.until > step) continue
      w.timed.splice(i, 1)
      yield* t.end
    }
    if (all) network.cuts.clear()
  })

/**
 * Whether some fault is in force now: the faults are on (each call may be delayed, lost or duplicated); a process
 * down, paused, stopping, with its clock off, or (a server) not registered; a cut, slow or unheard link; a timed
 * fault (disk, clock, cut from coordination); an ISR churn; a store failing or slow.
 */
export const active = (w: World): boolean => {
  const n = w.network
  return (
    w.faultsOn ||
    w.procs.some(
      (p) =>
        p.scope === undefined ||
        p.paused ||
        p.stopping ||
        p.backAt !== undefined ||
        p.clockOffsetMs !== 0 ||
        (p.kind === "server" && p.registration === undefined)
    ) ||
    n.cuts.size + n.oneWay.size + n.slow.size + n.unheard.size + n.isolations.length + n.linkCuts.length > 0 ||
    w.timed.length > 0 ||
    w.churns.size > 0 ||
    [...w.stores.values()].some((s) => s.failing || s.slowMs > 0 || s.failSome !== undefined)
  )
}
