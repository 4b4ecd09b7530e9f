/**
 * The reassignment family (about half the seeds; a generator of its own draws everything): at random steps it asks
 * the controller in charge to move a tablet's replicas (`ControllerShape.reassign`) — to as many servers mostly,
 * sometimes one more or one fewer (never below the minimum ISR), sometimes off its leader, sometimes only in
 * another order — or sends a bad request that must be refused naming why (a duplicate server, an unknown server, a
 * server that is down), or, while a move runs, cancels it, asks for another target, or strikes it. A strike, also
 * drawn for some moves as they are accepted, is a fault aimed at a role in the move: the controller fails over (its
 * coordinator crashed, paused, cut off from coordination or isolated), or the leader, a leaving replica or an adding
 * one dies (crash or power loss). Every request and answer goes into the trace; the checker of quiet times samples
 * each moving tablet's ISR after every step (`sample`).
 */
import { Models } from "@strata/core"
import { Duration, Effect } from "effect"
import * as EffectResult from "effect/Result"
import type { Prng } from "../../../../scripts/test-support/prng.js"
import { pickWeighted } from "../../../../scripts/test-support/sim/FaultPick.js"
import type * as ControllerState from "../../src/machines/ControllerState.js"
import * as Reassignment from "../../src/machines/Reassignment.js"
import type * as Controller from "../../src/server/Controller.js"
import * as Audit from "./Audit.js"
import * as Checkers from "./Checkers.js"
import type { FaultKind } from "./Config.js"
import * as Faults from "./Faults.js"
import { controllerNow } from "./Peers.js"
import { count, faultSeen, log, now, type Proc, tally, type World } from "./World.js"

/** Whom a strike at a move hits: the controller's coordinator, the leader, a leaving replica or an adding one. */
type Role = "controller" | "leader" | "source" | "target"

const roles: ReadonlyArray<readonly [Role, number]> = [
  ["controller", 3],
  ["leader", 3],
  ["source", 2],
  ["target", 3]
]

/** A request to the controller and what the family does with its answer. */
interface Request {
  readonly tablet: Models.TabletId
  /** How the trace names it. */
  readonly what: string
  /** What it counts as: `reassign`, `reassign-bad`, `reassign-again` or `cancel`. */
  readonly kind: string
  readonly ask: (
    controller: Controller.ControllerShape
  ) => Effect.Effect<Controller.ReassignReply, Controller.ControllerResigned>
  /** A bad request: the refusals (`Tag(server)`) that name what is wrong; anything else is a violation. */
  readonly refusals?: ReadonlyArray<string>
  /** A strike at the move once it is accepted: whom, and how long after. */
  readonly strike?: { readonly role: Role; readonly delayMs: number }
}

const list = (servers: ReadonlyArray<number>) => `[${servers.join(",")}]`

/** A refusal as the family names it: its tag, and the server it names, if any. */
const refusalName = (r: Reassignment.Refusal): string => ("server" in r ? `${r._tag}(${r.server})` : r._tag)

/** `items` in an order `mv` draws. */
const shuffled = <A>(mv: Prng, items: ReadonlyArray<A>): Array<A> => {
  const out = [...items]
  for (let i = out.length - 1; i > 0; i--) {
    const j = mv.int(0, i)
    ;[out[i], out[j]] = [out[j]!, out[i]!]
  }
  return out
}

/** A process that runs and no fault holds: it may be struck, or given a replica. */
const usable = (p: Proc | undefined): p is Proc =>
  p !== undefined && p.scope !== undefined && !p.paused && !p.stopping && p.backAt === undefined

/**
 * A target for a tablet on `replicas` led by `leader`, from the usable servers `pool`: as many replicas mostly, one
 * more or one fewer sometimes (at least the minimum ISR), one or more of them new, the leader left out sometimes, in
 * the kept replicas' order or another; `undefined` when the pool cannot make one.
 */
const drawTarget = (
  mv: Prng,
  replicas: ReadonlyArray<number>,
  leader: number | null,
  pool: ReadonlyArray<number>,
  minIsr: number
): { readonly target: ReadonlyArray<number>; readonly leaderOff: boolean } | undefined => {
  const change = mv.chance(0.3) ? mv.pick([-1, 1]) : 0
  const size = Math.min(Math.max(replicas.length + change, minIsr, 1), pool.length)
  if (size < Math.max(minIsr, 1)) return undefined
  const leaderOff = leader !== null && mv.chance(0.35)
  const kept = replicas.filter((s) => pool.includes(s) && !(leaderOff && s === leader))
  const fresh = shuffled(
    mv,
    pool.filter((s) => !replicas.includes(s))
  )
  const adding = Math.min(fresh.length, mv.int(1, size))
  const chosen = [...kept.slice(0, size - adding), ...fresh.slice(0, adding)]
  for (const s of [...fresh.slice(adding), ...kept.slice(size - adding)])
    if (chosen.length < size && !chosen.includes(s)) chosen.push(s)
  if (chosen.length < Math.max(minIsr, 1)) return undefined
  const target = mv.chance(0.5) ? chosen : shuffled(mv, chosen)
  if (!Reassignment.sameReplicas(target, replicas)) return { target, leaderOff }
  return target.length > 1 ? { target: [...target].reverse(), leaderOff } : undefined
}

/**
 * A bad request for a tablet on `replicas` that is not moving: a server named twice, an unknown server, or a server
 * that is down (not registered, not live to the controller, since at least the last step); the refusals that name
 * what is wrong (a down server the controller no longer knows is unknown to it).
 */
const badRequest = (
  w: World,
  mv: Prng,
  replicas: ReadonlyArray<number>,
  state: ControllerState.State,
  registered: ReadonlySet<number>
): {
  readonly kind: "duplicate" | "unknown" | "dead"
  readonly target: ReadonlyArray<number>
  readonly why: string
  readonly refusals: ReadonlyArray<string>
} => {
  const down = w.servers.filter(
    (p) => p.scope === undefined && !registered.has(p.id) && !w.registered.has(p.id) && !state.live.has(p.id)
  )
  const kind = mv.pick(["duplicate", "unknown", "dead"] as const)
  if (kind === "dead" && down.length > 0) {
    const d = mv.pick(down).id
    const target = [d, ...replicas.filter((s) => s !== d).slice(1)]
    return { kind, target, why: `s${d} is down`, refusals: [`DeadServer(${d})`, `UnknownServer(${d})`] }
  }
  if (kind === "unknown") {
    const target = [90, ...replicas.slice(1)]
    return { kind, target, why: "server 90 does not exist", refusals: ["UnknownServer(90)"] }
  }
  const s = mv.pick(replicas)
  const target = [...replicas.filter((x) => x !== s), s, s]
  return { kind: "duplicate", target, why: `s${s} named twice`, refusals: [`DuplicateServer(${s})`] }
}

/**
 * Strikes the tablet's move under way at `role`: its coordinator crashed, paused, cut off from coordination or
 * isolated, or a server crashed or losing power; nothing when the move ended, faults stopped, or no usable process
 * has that role.
 */
const strike = (w: World, mv: Prng, tablet: Models.TabletId, role: Role) =>
  Effect.gen(function* () {
    const key = Models.tabletKey(tablet)
    const meta = yield* Audit.readTablet(w, tablet)
    const r = meta?.reassignment
    if (!w.faultsOn || meta === undefined || r === undefined) return
    const server = (ids: ReadonlyArray<number>) => {
      const ps = ids.map((s) => w.byName.get(`s${s}`)).filter(usable)
      return ps.length > 0 ? mv.pick(ps) : undefined
    }
    const leader = meta.leaderAndIsr.leader
    const victim =
      role === "controller"
        ? controllerNow(w)
        : role === "leader"
          ? server(leader === null ? [] : [leader])
          : server(role === "source" ? Reassignment.removing(r) : Reassignment.adding(r))
    if (!usable(victim)) return
    const kind: FaultKind =
      victim.kind === "coordinator"
        ? mv.pick(["crash", "pause", "coordination", "isolate"] as const)
        : mv.pick(["crash", "power"] as const)
    const step = Math.floor(now(w) / w.config.stepMs)
    count(w, `move-${role}`)
    log(w, `FAULT strike ${key}'s move to ${list(r.target)} at its ${role} ${victim.name}: ${kind}`)
    yield* Faults.inject(w, kind, victim, step, step + mv.int(3, 20))
  })

/**
 * Sends `request` to `controller` (coordinator `c`'s) in a fiber of its own, the tablet marked as asked until the
 * answer: the answer is logged and counted, a bad request's checked, and an accepted move struck if drawn so.
 */
const send = (w: World, mv: Prng, c: Proc, controller: Controller.ControllerShape, request: Request) =>
  Effect.gen(function* () {
    const key = Models.tabletKey(request.tablet)
    w.reassigning.add(key)
    tally(w, request.kind)
    log(w, `REASSIGN ask ${c.name} (coordinator epoch ${controller.coordinatorEpoch}): ${request.what}`)
    const answer = Effect.gen(function* () {
      const result = yield* Effect.result(request.ask(controller))
      if (EffectResult.isFailure(result)) {
        log(w, `REASSIGN ${key}: no answer to ${request.what}: ${result.failure.message}`)
        return
      }
      const reply = result.success
      if (reply._tag === "ReassignRefused") {
        const said = refusalName(reply.refusal)
        tally(w, `${request.kind}-refused`)
        log(w, `REASSIGN ${key}: refused ${said}: ${reply.detail}`)
        if (request.refusals !== undefined && !request.refusals.includes(said))
          Checkers.wrongAnswer(
            w.record,
            `t=${now(w)} ${key}: ${request.what} was refused as ${said}, not as ${request.refusals.join(" or ")}`
          )
        return
      }
      const t = reply.tablet
      tally(w, `${request.kind}-accepted`)
      log(
        w,
        `REASSIGN ${key}: ${reply._tag}, replicas ${list(t.replicas)}${t.reassignment === undefined ? "" : ` moving to ${list(t.reassignment.target)}`} isr ${list(t.leaderAndIsr.isr)} leader ${t.leaderAndIsr.leader ?? "none"}`
      )
      if (request.refusals !== undefined)
        Checkers.wrongAnswer(
          w.record,
          `t=${now(w)} ${key}: ${request.what} was accepted (${reply._tag}), not refused as ${request.refusals.join(" or ")}`
        )
      const s = request.strike
      if (s === undefined) return
      yield* Effect.sleep(Duration.millis(s.delayMs))
      yield* strike(w, mv, request.tablet, s.role)
    })
    yield* Effect.forkIn(
      Effect.ensuring(
        answer,
        Effect.sync(() => w.reassigning.delete(key))
      ),
      w.root
    )
  })

/** While `tablet` moves (to `r`): a cancel, a strike now at a role, or a request for another target. */
const duringMove = (
  w: World,
  mv: Prng,
  c: Proc,
  controller: Controller.ControllerShape,
  tablet: Models.TabletId,
  r: Reassignment.Reassignment
) => {
  const key = Models.tabletKey(tablet)
  const x = mv.next()
  if (x < 0.45)
    return send(w, mv, c, controller, {
      tablet,
      what: `cancel the move of ${key} to ${list(r.target)}`,
      kind: "cancel",
      ask: (ctl) => ctl.cancelReassign(tablet)
    })
  if (x < 0.8) return strike(w, mv, tablet, pickWeighted(mv, roles))
  const target = [...r.original].reverse()
  return send(w, mv, c, controller, {
    tablet,
    what: `move ${key} to ${list(target)} while it moves to ${list(r.target)}`,
    kind: "reassign-again",
    ask: (ctl) => ctl.reassign(tablet, target)
  })
}

/** What a request is drawn from: the controller in charge (coordinator `c`'s), its state, the tablet as it holds it. */
interface Seen {
  readonly c: Proc
  readonly controller: Controller.ControllerShape
  readonly state: ControllerState.State
  readonly known: ControllerState.Tablet
  /** The tablet in coordination. */
  readonly meta: ControllerState.Tablet
  /** The servers registered in coordination. */
  readonly registered: ReadonlySet<number>
}

/** `tablet` as the controller in charge holds it; `undefined` when none is in charge, or a request is out for it. */
const look = (w: World, tablet: Models.TabletId) =>
  Effect.gen(function* () {
    const key = Models.tabletKey(tablet)
    const c = controllerNow(w)
    const controller = c?.controller
    if (c === undefined || controller === undefined || w.reassigning.has(key)) return undefined
    const meta = yield* Audit.readTablet(w, tablet)
    const state = yield* controller.state
    const known = state.tablets.get(key)
    if (meta === undefined || known === undefined || known.state === "DeletingTablet") return undefined
    const registered = yield* Audit.registeredServers(w)
    return { c, controller, state, known, meta, registered } satisfies Seen
  })

/**
 * A move of `tablet` to a target drawn from the usable servers (registered, live to the controller, not stopping),
 * struck as it is accepted for half of them when `strikes`; whether one was asked.
 */
const move = (w: World, mv: Prng, tablet: Models.TabletId, seen: Seen, strikes: boolean) =>
  Effect.gen(function* () {
    const { state, known, registered } = seen
    const key = Models.tabletKey(tablet)
    const pool = w.servers
      .filter((p) => usable(p) && registered.has(p.id) && state.live.has(p.id) && !state.shuttingDown.has(p.id))
      .map((p) => p.id)
    const leader = known.leaderAndIsr.leader
    const drawn = drawTarget(mv, known.replicas, leader, pool, w.cluster.minIsr)
    if (drawn === undefined) return false
    const strikeAt = strikes && mv.chance(0.5) ? { role: pickWeighted(mv, roles), delayMs: mv.int(0, 600) } : undefined
    yield* send(w, mv, seen.c, seen.controller, {
      tablet,
      what: `move ${key} from ${list(known.replicas)} to ${list(drawn.target)}${drawn.leaderOff ? `, off its leader s${leader}` : ""}${strikeAt === undefined ? "" : `, its ${strikeAt.role} struck ${strikeAt.delayMs} ms after`}`,
      kind: strikes ? "reassign" : "reassign-quiet",
      ask: (ctl) => ctl.reassign(tablet, drawn.target),
      ...(strikeAt === undefined ? {} : { strike: strikeAt })
    })
    return true
  })

/**
 * One draw of the family: a tablet `mv` picks that no request is out for, asked of the controller in charge — a
 * move, a bad request, or (while it moves) a cancel, another target or a strike.
 */
export const reassignFault = (w: World, mv: Prng) =>
  Effect.gen(function* () {
    const tablet = mv.pick(w.cluster.tablets)
    const key = Models.tabletKey(tablet)
    const seen = yield* look(w, tablet)
    if (seen === undefined) return
    const moving = seen.meta.reassignment ?? seen.known.reassignment
    if (moving !== undefined) return yield* duringMove(w, mv, seen.c, seen.controller, tablet, moving)
    if (!mv.chance(0.25)) return yield* move(w, mv, tablet, seen, true)
    const replicas = seen.known.replicas
    const bad = badRequest(w, mv, replicas, seen.state, seen.registered)
    tally(w, `reassign-bad-${bad.kind}`)
    yield* send(w, mv, seen.c, seen.controller, {
      tablet,
      what: `move ${key} from ${list(replicas)} to ${list(bad.target)} (bad: ${bad.why})`,
      kind: "reassign-bad",
      ask: (ctl) => ctl.reassign(tablet, bad.target),
      refusals: bad.refusals
    })
  })

/**
 * Once the faults are over and the cluster settled: a move of a tablet `mv` picks, struck by nothing, so that the
 * checker of quiet times sees it from its start to its end; whether one was asked.
 */
export const quietMove = (w: World, mv: Prng) =>
  Effect.gen(function* () {
    const tablet = mv.pick(w.cluster.tablets)
    const seen = yield* look(w, tablet)
    if (seen === undefined || seen.meta.reassignment !== undefined || seen.known.reassignment !== undefined)
      return false
    return yield* move(w, mv, tablet, seen, false)
  })

/**
 * After a step (and each settling one): a fault in force now is seen; once none has been for its aftermath (an
 * expired session, a lagging follower dropped), or the cluster settled since, each moving tablet's ISR in
 * coordination is checked against its size as the move began.
 */
export const sample = (w: World) =>
  Effect.gen(function* () {
    if (Faults.active(w)) faultSeen(w)
    const quiet = now(w) >= w.calmFromMs
    for (const tablet of w.cluster.tablets) {
      const key = Models.tabletKey(tablet)
      if (!w.record.moves.open.has(key)) continue
      const meta = yield* Audit.readTablet(w, tablet)
      if (meta !== undefined) Checkers.movingIsr(w.record, key, meta.leaderAndIsr.isr, quiet, now(w))
    }
  })
