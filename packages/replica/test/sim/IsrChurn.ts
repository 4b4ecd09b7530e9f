/**
 * The ISR churn family (a nemesis that targets ISR changes), aimed at one tablet for 1–3 s: its leader's ISR
 * answers come late, each after the leader's next proposal (a late answer must not settle a later proposal: issue
 * 32's second defect), while one follower flaps — its sessions expire up to three times, each drop from the ISR
 * followed by its return — and stalls whenever it is being added: paused for a moment, its power lost, or added
 * just as its leader is cut off from the controllers with the clients.
 */
import { Models } from "@strata/core"
import { Duration, Effect, Fiber } from "effect"
import type { Prng } from "../../../../scripts/test-support/prng.js"
import * as Audit from "./Audit.js"
import * as Process from "./Process.js"
import { count, log, now, type Proc, type World } from "./World.js"

/**
 * ISR churn aimed at one tablet: until `untilMs`, each answer to its leader's ISR proposals is held until the
 * leader's next proposal has gone out (reordered across it), and `follower`, flapping, stalls as it is added —
 * paused for a moment, or its power lost with its expansion arriving once it registered again.
 */
export interface Churn {
  readonly tablet: string
  readonly leader: string
  readonly follower: number
  readonly untilMs: number
  readonly stall: "pause" | "power" | "lost"
  readonly draws: Prng
  /** How many proposals the leader sent for the tablet under the churn. */
  sent: number
}

/** The churn in force on `tablet` whose leader is `p`, if any. */
export const churnLedBy = (w: World, p: Proc, tablet: Models.TabletId): Churn | undefined => {
  const churn = w.churns.get(Models.tabletKey(tablet))
  return churn !== undefined && churn.leader === p.name && w.faultsOn && now(w) < churn.untilMs ? churn : undefined
}

/** Holds the answer to proposal `proposal` until the leader sent a later one (or the churn ends). */
export const heldUntilNext = (w: World, churn: Churn, proposal: number, tablet: Models.TabletId) =>
  Effect.gen(function* () {
    let held = false
    while (churn.sent === proposal && w.faultsOn && now(w) < churn.untilMs) {
      held = true
      yield* Effect.sleep(Duration.millis(5))
    }
    if (held && churn.sent > proposal)
      log(
        w,
        `${churn.leader}: the answer to its ISR proposal ${proposal} of ${Models.tabletKey(tablet)} arrives after its proposal ${churn.sent}`
      )
  })

/**
 * The leader whose expansion was just committed loses the answer, and at once its sessions and those of the
 * ISR's other members expire while the controllers' connections to them are cut until the churn ends (their own
 * requests to a controller still pass), and the clients reach neither controllers nor coordination, so they keep
 * sending to the leaders they knew. The leader retries the expansion, which the controller, having elected
 * another replica meanwhile, refuses as from a leadership that is over (issue 32's fenced-refusal history,
 * simulator seed 2027).
 */
export const deafen = (w: World, churn: Churn, isr: ReadonlyArray<number>) =>
  Effect.gen(function* () {
    const { network, faults, clientProc } = w
    const cutOff = isr
      .filter((s) => s !== churn.follower)
      .flatMap((s) => w.byName.get(`s${s}`) ?? [])
      .filter((q) => q.scope !== undefined)
    if (!cutOff.some((q) => q.name === churn.leader)) return
    log(
      w,
      `FAULT ${churn.leader} loses the answer to its expansion of ${churn.tablet}; ${cutOff.map((q) => q.name).join(", ")} cut off from the controllers until t=${churn.untilMs}, their sessions expired`
    )
    const deafened = w.coordinators.map((c) => `client>${c.name}`)
    for (const cut of deafened) network.oneWay.add(cut)
    for (const q of cutOff) network.unheard.add(q.name)
    for (const q of cutOff)
      yield* Effect.forEach([...q.sessions], (s) => Effect.ignore(faults.expire(s)), { discard: true })
    // The clients are on their side: cut off from the controllers and coordination, they keep the leaders they knew.
    yield* clientProc.gate.close
    yield* Effect.forEach([...clientProc.sessions], (s) => Effect.ignore(faults.disconnect!(s)), { discard: true })
    w.timed.push({
      until: Math.ceil(churn.untilMs / w.config.stepMs),
      end: Effect.gen(function* () {
        for (const cut of deafened) network.oneWay.delete(cut)
        for (const q of cutOff) network.unheard.delete(q.name)
        yield* clientProc.gate.open
        yield* Effect.forEach([...clientProc.sessions], (s) => Effect.ignore(faults.reconnect!(s)), {
          discard: true
        })
      })
    })
  })

/**
 * The follower being added stalls: paused for up to half a session (its fetches held), or its power lost (with a
 * minimum ISR of 2 or more its unflushed writes too, every other server flushed first) while the expansion
 * travels, which arrives once the follower registered again (or three seconds passed).
 */
export const stallJoining = (w: World, churn: Churn) =>
  Effect.gen(function* () {
    const y = w.byName.get(`s${churn.follower}`)
    if (y === undefined || y.scope === undefined || y.paused || y.backAt !== undefined || y.stopping) return
    if (churn.stall === "lost") return
    if (churn.stall === "pause") {
      const ms = churn.draws.int(20, Math.floor(w.cluster.sessionTimeoutMs / 2))
      log(w, `FAULT ${y.name} stalls ${ms} ms as ${churn.leader} adds it to the ISR of ${churn.tablet}`)
      yield* Process.pause(w, y)
      yield* Effect.forkIn(
        Effect.andThen(
          Effect.sleep(Duration.millis(ms)),
          Effect.suspend(() => (y.paused && y.backAt === undefined ? Process.resume(w, y) : Effect.void))
        ),
        w.root
      )
      return
    }
    // As a power loss: unflushed writes are lost only where an acknowledged record has a flushed copy elsewhere.
    const lose = w.cluster.minIsr >= 2
    log(
      w,
      `FAULT power loss of ${y.name} as ${churn.leader} adds it to the ISR of ${churn.tablet}${lose ? ", unflushed writes lost" : ""}`
    )
    if (lose) for (const [id, store] of w.stores) if (id !== y.id) store.flush()
    // The process comes back whatever becomes of the proposal that waits for it.
    const offMs = churn.draws.int(0, 200)
    const cycle = Effect.gen(function* () {
      yield* Process.down(w, y, true, lose)
      yield* Effect.sleep(Duration.millis(offMs))
      yield* Process.start(w, y)
      for (let waited = 0; waited < 3_000 && y.registration === undefined; waited += 10)
        yield* Effect.sleep(Duration.millis(10))
    })
    yield* Fiber.join(yield* Effect.forkIn(cycle, w.root))
  })

/** Starts an ISR churn on a tablet `ch` draws, with a leader and a follower that are running. */
export const churnFault = (w: World, ch: Prng) =>
  Effect.gen(function* () {
    const tablet = ch.pick(w.cluster.tablets)
    const key = Models.tabletKey(tablet)
    const meta = yield* Audit.readTablet(w, tablet)
    const lai = meta?.leaderAndIsr
    if (meta === undefined || lai === undefined || lai.leader === null || w.churns.has(key)) return
    const leader = w.byName.get(`s${lai.leader}`)
    const usable = (q: Proc | undefined) =>
      q?.server !== undefined && !q.paused && q.backAt === undefined && !q.stopping
    const followers = meta.replicas.filter((s) => s !== lai.leader && usable(w.byName.get(`s${s}`)))
    if (!usable(leader) || followers.length === 0) return
    const y = w.byName.get(`s${ch.pick(followers)}`)!
    const churn: Churn = {
      tablet: key,
      leader: leader!.name,
      follower: y.id,
      untilMs: now(w) + ch.int(1_000, 3_000),
      stall: ch.pick(["pause", "power", "lost"] as const),
      draws: ch,
      sent: 0
    }
    w.churns.set(key, churn)
    count(w, "churn")
    log(
      w,
      `FAULT ISR churn of ${key} led by ${churn.leader}: ${y.name} flaps and ${{ pause: "stalls as it is added", power: "loses power as it is added", lost: "is added as its leader is cut off" }[churn.stall]}, answers late until t=${churn.untilMs}`
    )
    yield* Effect.forkIn(flaps(w, churn, y, ch), w.root)
  })

/** The churned follower's sessions expire up to three times, then the churn ends at its time. */
const flaps = (w: World, churn: Churn, y: Proc, ch: Prng) =>
  Effect.gen(function* () {
    for (let flap = 0; flap < 3 && w.faultsOn && now(w) < churn.untilMs; flap++) {
      if (y.scope !== undefined && !y.paused) {
        log(w, `FAULT expire the sessions of ${y.name} (ISR churn)`)
        yield* Effect.forEach([...y.sessions], (s) => Effect.ignore(w.faults.expire(s)), { discard: true })
      }
      yield* Effect.sleep(Duration.millis(ch.int(200, 1_000)))
    }
    yield* Effect.sleep(Duration.millis(Math.max(0, churn.untilMs - now(w))))
    w.churns.delete(churn.tablet)
  })
