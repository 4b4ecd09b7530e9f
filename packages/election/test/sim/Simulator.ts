/**
 * Deterministic simulation of the fenced election (docs/ARCHITECTURE.md, "Election
 * simulation"). One seed drives one run: 3–5 coordinator processes share one
 * memory coordination service, each running a `Coordinator` (the real lifecycle
 * machine and shell) on its own election; the leader's service sends
 * epoch-tagged requests to a receiver (a tablet server) over a network with
 * random delays and writes through `Leadership.fenced`. After the faults stop
 * and the system settles, a live process must lead (liveness).
 *
 * Time is only the `TestClock` (a fresh one per run), randomness only the
 * seeded `Prng`, so the same seed gives the same history. Faults drawn from the
 * seed: crash (`kill -9`: the sessions are left to expire), stop (clean
 * shutdown), session expiry, pause longer than the session timeout (the process
 * stops, its sessions expire, then it resumes with its timers overdue and only
 * learns of the expiry once its client has reconnected, a moment later), a short
 * pause (a blip the session survives) and message delay. A client whose
 * connection is cut hears nothing from the server: its operations fail with a
 * lost connection and it learns of an expiry only after reconnecting. A leader
 * checks `Leadership.guard` before each request to the receiver. Faults
 * also strike between a process's coordination operations (its session expires,
 * or it pauses, just before a campaign step or a write), and random yields there
 * interleave the fibers. Each seed also draws the backend's semantics for a write
 * from an expired session (`Backend`). After the run the checkers in
 * `Checkers.ts` judge what was recorded.
 */
import {
  ConnectionLoss,
  Coordination,
  coordinationError,
  type CoordinationError,
  CoordinationFaults,
  type CoordinationFaultsShape,
  Election as CoreElection,
  type CoordinationShape,
  type LeadershipEnd,
  type Op,
  op,
  type Session,
  type Watch
} from "@strata/core"
import { Cause, Duration, Effect, Exit, Fiber, Latch, References, Scope, Stream } from "effect"
import { TestClock } from "effect/testing"
import * as Coordinator from "../../src/Coordinator.js"
import * as Election from "../../src/internal/election.js"
import * as Checkers from "./Checkers.js"
import * as Prng from "./Prng.js"

/** Which safety checks are deliberately broken in a run. */
export interface Variant {
  readonly name: string
  /** The receiver accepts every request, whatever its epoch. */
  readonly receiverSkipsEpochCheck?: boolean
  /** Broken variants of the election recipe itself. */
  readonly unsafe?: Election.Unsafe
}

/** The correct system: every check on. */
export const correct: Variant = { name: "correct" }

/**
 * How the coordination service treats a write from a session that has already
 * ended on the server but whose client has not noticed yet (a process resuming
 * from a long pause writes before its keep-alive reports the loss):
 * - `zookeeper-like`: every operation is tied to the session and fails;
 * - `etcd-like`: writes that create no ephemeral node are not tied to the lease,
 *   so they reach the store and only a compare in the transaction can stop them.
 */
export type Backend = "zookeeper-like" | "etcd-like"

/** The shape of a run. Durations are virtual milliseconds on the `TestClock`; ranges are drawn per seed. */
export interface Config {
  /** Fault-injection points; the clock advances `stepMs` after each. */
  readonly steps: number
  readonly stepMs: number
  /** The session timeout, drawn from [min, max] in whole steps. */
  readonly sessionTimeoutMs: readonly [number, number]
  /** How often a leader sends a request and makes a fenced write, drawn from [min, max]. */
  readonly writeEveryMs: readonly [number, number]
  /** Probability of a fault at each step. */
  readonly faultChance: number
  /**
   * Probabilities of a fault just before each coordination operation of a process, so faults also land between
   * the steps of a campaign or a write: its session expires, it pauses past its session, or it yields to the
   * other fibers (an interleaving point).
   */
  readonly opFaults: { readonly expire: number; readonly pause: number; readonly yield: number }
  /** Longest network delay of a request. */
  readonly maxDelayMs: number
  /** The backends a seed is drawn from. */
  readonly backends: ReadonlyArray<Backend>
}

/** The default run: 6 virtual seconds, sessions of 0.6–1.5 s, about six faults, either backend. */
export const defaultConfig: Config = {
  steps: 60,
  stepMs: 100,
  sessionTimeoutMs: [600, 1500],
  writeEveryMs: [50, 250],
  faultChance: 0.1,
  opFaults: { expire: 0.004, pause: 0.004, yield: 0.25 },
  maxDelayMs: 2000,
  backends: ["zookeeper-like", "etcd-like"]
}

/** The kinds of fault the driver injects. */
export type FaultKind = "crash" | "stop" | "expire" | "pause" | "blip" | "op-expire" | "op-pause"

/** Counts of what happened in a run, to show the faults really exercised the system. */
export interface Stats {
  readonly processes: number
  readonly wins: number
  readonly faults: Readonly<Record<FaultKind, number>>
  readonly accepted: number
  readonly rejected: number
  readonly fencedApplied: number
  readonly fencedRejected: number
  /** No live process led at the end although every fault was over (also reported as a violation). */
  readonly leaderless: boolean
}

/** The outcome of one seed. */
export interface Result {
  readonly seed: number
  readonly variant: string
  readonly backend: Backend
  readonly violations: ReadonlyArray<string>
  readonly trace: ReadonlyArray<string>
  readonly stats: Stats
}

const namespace = "sim"
const paths = Election.pathsOf(namespace)
const logPath = `/${namespace}/log`
const encoder = new TextEncoder()
const decoder = new TextDecoder()

/** One life of a process, from start to crash or stop. */
interface Incarnation {
  readonly number: number
  /** Set by a crash: the sessions are left to the server instead of being closed. */
  crashed: boolean
  /** The live sessions this incarnation opened (the server-side handles the faults need). */
  readonly sessions: Set<Session>
  /** The term the latest campaign won, set when its leader node is registered. */
  term: number | undefined
  /** The session that won that term. */
  session: string | undefined
}

/** A simulated coordinator process. */
interface Proc {
  readonly id: number
  /** Closed while the process is paused: every action of the process waits on it. */
  readonly gate: Latch.Latch
  paused: boolean
  incarnations: number
  current: Incarnation | undefined
  fiber: Fiber.Fiber<never> | undefined
  /** What the process believes it leads. */
  leading: { readonly epoch: number; readonly term: number } | undefined
}

const parseEpoch = (data: Uint8Array): number => Number(decoder.decode(data))

const leaderEpoch = (data: Uint8Array): number => {
  const parsed: unknown = JSON.parse(decoder.decode(data))
  return typeof parsed === "object" && parsed !== null && "epoch" in parsed && typeof parsed.epoch === "number"
    ? parsed.epoch
    : -1
}

const entryOf = (path: string, order: number, data: Uint8Array): Checkers.FencedEntry => {
  const parsed: unknown = JSON.parse(decoder.decode(data))
  const field = (name: string): number =>
    typeof parsed === "object" && parsed !== null && name in parsed
      ? Number((parsed as Record<string, unknown>)[name])
      : -1
  return { path, order, epoch: field("epoch"), term: field("term"), process: field("process"), at: field("at") }
}

const createsEphemeral = (o: Op): boolean =>
  o._tag === "create" && (o.mode === "ephemeral" || o.mode === "ephemeral-sequential")

const faultKinds: ReadonlyArray<readonly [FaultKind, number]> = [
  ["crash", 25],
  ["stop", 10],
  ["expire", 20],
  ["pause", 30],
  ["blip", 15]
]

/** A count of zero for every fault kind. */
export const noFaults = (): Record<FaultKind, number> => ({
  crash: 0,
  stop: 0,
  expire: 0,
  pause: 0,
  blip: 0,
  "op-expire": 0,
  "op-pause": 0
})

const drawFault = (rng: Prng.Prng): FaultKind => {
  let roll = rng.int(1, 100)
  for (const [kind, weight] of faultKinds) {
    if (roll <= weight) return kind
    roll -= weight
  }
  return "pause"
}

const required = <K extends "disconnect" | "reconnect">(
  faults: CoordinationFaultsShape,
  key: K
): NonNullable<CoordinationFaultsShape[K]> => {
  const f = faults[key]
  if (f === undefined) throw new Error(`the coordination backend cannot ${key} a session`)
  return f
}

/** The run itself; needs a fresh memory coordination and `TestClock`. */
const simulate = (
  seed: number,
  variant: Variant,
  config: Config
): Effect.Effect<Result, CoordinationError, Coordination | CoordinationFaults | Scope.Scope> =>
  Effect.gen(function* () {
    const rng = Prng.make(seed)
    const backend = rng.pick(config.backends)
    const sessionTimeoutMs =
      config.stepMs *
      rng.int(
        Math.ceil(config.sessionTimeoutMs[0] / config.stepMs),
        Math.floor(config.sessionTimeoutMs[1] / config.stepMs)
      )
    const writeEveryMs = rng.int(config.writeEveryMs[0], config.writeEveryMs[1])
    const scope = yield* Effect.scope
    const coordination = yield* Coordination
    const faults = yield* CoordinationFaults
    const cut = required(faults, "disconnect")
    const restore = required(faults, "reconnect")
    const clock = yield* TestClock.testClockWith(Effect.succeed)
    /**
     * When the server expires each cut session on its own (the ground truth the deadline checker judges by): its
     * timeout after its connection was cut, forgotten when it is restored in time.
     */
    const expiries = new Map<string, number>()
    /**
     * The sessions whose connection is cut. Their client does not hear from the server: it learns that the session
     * expired meanwhile only once it has reconnected, as a real client does (see `instrument`).
     */
    const cutOff = new Set<string>()
    const links = new Map<string, Latch.Latch>()
    const linkOf = (s: Session): Latch.Latch => {
      let link = links.get(s.id)
      if (link === undefined) {
        link = Latch.makeUnsafe(true)
        links.set(s.id, link)
      }
      return link
    }
    const disconnect = (s: Session) =>
      Effect.flatMap(s.state, (state) => {
        if (state === "connected" && !expiries.has(s.id)) {
          expiries.set(s.id, clock.currentTimeMillisUnsafe() + Duration.toMillis(s.timeout))
        }
        cutOff.add(s.id)
        return Effect.andThen(linkOf(s).close, cut(s))
      })
    const reconnect = (s: Session) =>
      Effect.gen(function* () {
        yield* restore(s)
        if ((yield* s.state) === "connected") expiries.delete(s.id)
        cutOff.delete(s.id)
        yield* linkOf(s).open
      })

    const trace: Array<string> = []
    /** Set once the run is judged: what the shutdown does is not part of the history. */
    let finished = false
    const log = (line: string): void => {
      if (!finished) trace.push(`t=${clock.currentTimeMillisUnsafe()} ${line}`)
    }
    const wins: Array<Checkers.Win> = []
    const deliveries: Array<Checkers.Delivery> = []
    const sent: Array<Checkers.Request> = []
    const epochWrites: Array<Checkers.EpochWrite> = []
    const faultCounts = noFaults()
    let fencedApplied = 0
    let fencedRejected = 0
    let terms = 0
    /** The driver's step, for faults a process draws between steps. */
    let currentStep = 0
    /** Off once the run settles before the checks. */
    let faultsOn = true

    // The auditor: a session outside every process, never faulted, used to set up and read the log.
    const auditor = yield* coordination.session({ timeout: "1 hour" })
    yield* auditor.create(logPath, new Uint8Array(0), { createParents: true })

    // --- the receiver and the network -------------------------------------------------------
    let highest = 0
    const deliver = (request: Checkers.Request) =>
      Effect.sync(() => {
        const accepted = variant.receiverSkipsEpochCheck === true || request.epoch >= highest
        highest = Math.max(highest, request.epoch)
        deliveries.push({ request, accepted, at: clock.currentTimeMillisUnsafe() })
        log(
          `receiver ${accepted ? "accepts" : "rejects"} p${request.process} e${request.epoch} #${request.n} (term ${request.term})`
        )
      })
    const send = (request: Checkers.Request) => {
      const delay = rng.chance(0.3) ? rng.int(0, config.maxDelayMs) : rng.int(0, 30)
      log(`p${request.process} sends e${request.epoch} #${request.n} (term ${request.term}), delay ${delay}ms`)
      sent.push(request)
      return Effect.forkIn(Effect.andThen(Effect.sleep(Duration.millis(delay)), deliver(request)), scope)
    }

    // --- the processes -----------------------------------------------------------------------
    /** The coordination a process sees: records its sessions, epoch writes and leader registrations. */
    const coordinationOf = (proc: Proc, inc: Incarnation, host: Scope.Scope): CoordinationShape => {
      /** Runs a write on the process's session or, on an etcd-like backend, past its ended session. */
      const write = <A>(
        s: Session,
        ops: ReadonlyArray<Op>,
        own: Effect.Effect<A, CoordinationError>,
        server: Effect.Effect<A, CoordinationError>
      ): Effect.Effect<A, CoordinationError> =>
        backend === "zookeeper-like" || ops.some(createsEphemeral)
          ? own
          : Effect.flatMap(s.state, (state) => {
              if (state !== "expired") return own
              log(
                `p${proc.id}.${inc.number} writes on its expired session ${s.id}: not tied to the lease, the store evaluates it`
              )
              return server
            })
      /** Before every operation: maybe a fault or an interleaving point, then wait while paused. */
      const point = (s: Session, name: string): Effect.Effect<void, CoordinationError> =>
        Effect.suspend(() => {
          if (!faultsOn) return proc.gate.await
          const roll = rng.next()
          const { expire, pause, yield: interleave } = config.opFaults
          let fault: Effect.Effect<void, CoordinationError> = Effect.void
          if (roll < expire) {
            faultCounts["op-expire"]++
            log(`FAULT expire session ${s.id} of p${proc.id} before its ${name}`)
            fault = faults.expire(s)
          } else if (roll < expire + pause && !proc.paused && proc.current === inc) {
            faultCounts["op-pause"]++
            fault = suspend(proc, currentStep, sessionTimeoutMs + rng.int(100, 2000), `pause before its ${name}`)
          } else if (roll < expire + pause + interleave) fault = Effect.yieldNow
          return Effect.andThen(fault, proc.gate.await)
        })
      const guard =
        (s: Session, name: string) =>
        <A>(self: Effect.Effect<A, CoordinationError>): Effect.Effect<A, CoordinationError> =>
          Effect.andThen(
            point(s, name),
            Effect.suspend(() =>
              cutOff.has(s.id)
                ? Effect.fail(coordinationError(new ConnectionLoss({ detail: `session ${s.id} is disconnected` })))
                : self
            )
          )
      /** The end of the session, as its client learns it: only once reconnected when its connection is cut. */
      const revealed = <A>(s: Session, changed: Effect.Effect<A, CoordinationError>) =>
        Effect.catchTag(changed, "CoordinationError", (e) =>
          e.reason._tag === "SessionExpired" ? Effect.andThen(linkOf(s).await, Effect.fail(e)) : Effect.fail(e)
        )
      const watched = <A>(s: Session, name: string, watch: Effect.Effect<Watch<A>, CoordinationError>) =>
        Effect.map(guard(s, name)(watch), (w) => ({ value: w.value, changed: revealed(s, w.changed) }))
      const instrument = (s: Session): Session => ({
        ...s,
        state: Effect.map(s.state, (state) => (state === "expired" && cutOff.has(s.id) ? "suspended" : state)),
        changes: s.changes.pipe(
          Stream.mapEffect((state) => (state === "expired" ? Effect.as(linkOf(s).await, state) : Effect.succeed(state)))
        ),
        create: (path, data, options) => guard(s, "create")(s.create(path, data, options)),
        get: (path) => guard(s, "get")(s.get(path)),
        ping: guard(s, "ping")(s.ping),
        exists: (path) => guard(s, "exists")(s.exists(path)),
        delete: (path, version) => guard(s, "delete")(s.delete(path, version)),
        children: (path) => guard(s, "children")(s.children(path)),
        watchNode: (path) => watched(s, "watchNode", s.watchNode(path)),
        watchChildren: (path) => watched(s, "watchChildren", s.watchChildren(path)),
        set: (path, data, version) => {
          if (path !== paths.epoch) return guard(s, "set")(s.set(path, data, version))
          // An epoch bump: record the value with the store order of the write.
          const bumped = write(
            s,
            [op.set(path, data, version)],
            s.set(path, data, version),
            auditor.set(path, data, version)
          )
          const recorded = Effect.tap(bumped, (stat) =>
            Effect.sync(() => {
              epochWrites.push({ epoch: parseEpoch(data), order: stat.modifiedOrder })
            })
          )
          return guard(s, "epoch bump")(Effect.uninterruptible(recorded))
        },
        multi: (ops) => {
          const registration = ops.find((o) => o._tag === "create" && o.path === paths.leader)
          const applied = write(s, ops, s.multi(ops), auditor.multi(ops))
          if (registration === undefined || registration._tag !== "create") return guard(s, "multi")(applied)
          // The leader registration is the moment a term begins: record it with the epoch it announces.
          const recorded = Effect.tap(applied, () =>
            Effect.sync(() => {
              const term = ++terms
              const epoch = leaderEpoch(registration.data)
              inc.term = term
              inc.session = s.id
              wins.push({
                term,
                process: proc.id,
                incarnation: inc.number,
                session: s.id,
                epoch,
                at: clock.currentTimeMillisUnsafe()
              })
              log(`p${proc.id}.${inc.number} registers as leader: epoch ${epoch}, term ${term}, session ${s.id}`)
            })
          )
          return guard(s, "leader registration")(Effect.uninterruptible(recorded))
        }
      })
      return {
        backend: coordination.backend,
        session: (options) =>
          Effect.gen(function* () {
            yield* proc.gate.await
            // The server-side session lives in the host scope, so a crash can leave it open to expire.
            const child = yield* Scope.fork(host, "sequential")
            const s = yield* Scope.provide(coordination.session(options), child)
            inc.sessions.add(s)
            yield* Effect.addFinalizer(() =>
              Effect.suspend(() => {
                inc.sessions.delete(s)
                // A crashed process's sessions are cut and left to the server to expire, never closed.
                return inc.crashed ? Effect.ignore(disconnect(s)) : Scope.close(child, Exit.void)
              })
            )
            return instrument(s)
          })
      }
    }

    /**
     * The leader-only service each process's coordinator runs while it leads: every `writeEveryMs`, a request to
     * the receiver (when the leadership's guard allows it) and a fenced write, until the leadership is lost or the
     * coordinator releases the service.
     */
    const leaderService = (proc: Proc, inc: Incarnation) =>
      Coordinator.service("receiver-client", (leadership) =>
        Effect.gen(function* () {
          const term = inc.term ?? -1
          const session = inc.session ?? "?"
          const epoch = leadership.epoch
          proc.leading = { epoch, term }
          log(`p${proc.id}.${inc.number} leads epoch ${epoch} (term ${term})`)
          yield* Effect.addFinalizer(() =>
            Effect.sync(() => {
              if (proc.leading?.epoch === epoch) proc.leading = undefined
            })
          )
          const state: { lost: LeadershipEnd | undefined } = { lost: undefined }
          yield* Effect.forkScoped(
            Effect.tap(leadership.lost, (end) =>
              Effect.sync(() => {
                state.lost = end
                log(`p${proc.id}.${inc.number} learns it lost epoch ${epoch}: ${end._tag}`)
              })
            )
          )
          let n = 0
          const act = Effect.gen(function* () {
            // A process paused here resumes with its timers overdue, before any I/O tells it what happened
            // meanwhile: only the leadership's deadline stops it from acting as the leader it may no longer be.
            yield* proc.gate.await
            n++
            const allowed = yield* Effect.exit(leadership.guard)
            if (Exit.isSuccess(allowed)) {
              yield* send({ session, term, epoch, process: proc.id, n, sentAt: clock.currentTimeMillisUnsafe() })
            } else {
              const error = Cause.findErrorOption(allowed.cause)
              log(
                `p${proc.id} holds back request e${epoch} #${n}: ${error._tag === "Some" ? error.value.message : "?"}`
              )
            }
            const at = clock.currentTimeMillisUnsafe()
            const data = encoder.encode(JSON.stringify({ epoch, term, process: proc.id, n, at }))
            const written = yield* Effect.exit(
              leadership.fenced([op.create(`${logPath}/w_`, data, "persistent-sequential")])
            )
            if (Exit.isSuccess(written)) {
              fencedApplied++
              log(`p${proc.id} fenced write e${epoch} #${n} applied`)
            } else {
              fencedRejected++
              const error = Cause.findErrorOption(written.cause)
              log(
                `p${proc.id} fenced write e${epoch} #${n} failed: ${error._tag === "Some" ? error.value.message : Cause.pretty(written.cause)}`
              )
            }
          })
          yield* Effect.forkScoped(
            Effect.gen(function* () {
              while (state.lost === undefined) {
                yield* Effect.sleep(Duration.millis(writeEveryMs))
                yield* act
              }
            })
          )
        })
      )

    /**
     * One incarnation of a process: its own election and a `Coordinator` (the real lifecycle machine and shell)
     * running the leader service. A shell that dies ends the incarnation with its defect, which the run reports.
     */
    const runProcess = (proc: Proc): Effect.Effect<never> =>
      Effect.scoped(
        Effect.gen(function* () {
          proc.incarnations++
          const inc: Incarnation = {
            number: proc.incarnations,
            crashed: false,
            sessions: new Set(),
            term: undefined,
            session: undefined
          }
          proc.current = inc
          log(`p${proc.id}.${inc.number} starts`)
          const host = yield* Scope.fork(scope, "sequential")
          const election = yield* Election.make(
            { namespace, sessionTimeout: Duration.millis(sessionTimeoutMs) },
            variant.unsafe ?? {}
          ).pipe(Effect.provideService(Coordination, coordinationOf(proc, inc, host)), Effect.orDie)
          const coordinator = yield* Coordinator.make({
            serverId: proc.id,
            address: `p${proc.id}`,
            rejoinBackoff: Duration.millis(rng.int(20, 200)),
            services: [leaderService(proc, inc)]
          }).pipe(Effect.provideService(CoreElection, election), Effect.orDie)
          yield* coordinator.join
          return yield* Effect.never
        })
      )

    const count = rng.int(3, 5)
    const procs: Array<Proc> = []
    for (let id = 1; id <= count; id++) {
      procs.push({
        id,
        gate: Latch.makeUnsafe(true),
        paused: false,
        incarnations: 0,
        current: undefined,
        fiber: undefined,
        leading: undefined
      })
    }
    const start = (proc: Proc) =>
      Effect.map(Effect.andThen(proc.gate.open, Effect.forkIn(runProcess(proc), scope)), (fiber) => {
        proc.fiber = fiber
      })

    // --- the faults --------------------------------------------------------------------------
    const scheduled: Array<{ readonly step: number; readonly action: Effect.Effect<void, CoordinationError> }> = []
    const later = (step: number, action: Effect.Effect<void, CoordinationError>) => {
      scheduled.push({ step, action })
    }
    const stepsFor = (ms: number) => Math.max(1, Math.ceil(ms / config.stepMs))

    /** A running, unpaused process: the leader with probability 0.6 when there is one. */
    const target = (): Proc | undefined => {
      const candidates = procs.filter((p) => p.fiber !== undefined && !p.paused)
      const leaders = candidates.filter((p) => p.leading !== undefined)
      if (leaders.length > 0 && rng.chance(0.6)) return rng.pick(leaders)
      return candidates.length > 0 ? rng.pick(candidates) : undefined
    }

    const kill = (proc: Proc, step: number, crash: boolean) =>
      Effect.gen(function* () {
        const fiber = proc.fiber
        const inc = proc.current
        if (fiber === undefined || inc === undefined) return
        if (crash) {
          // kill -9 stops the process at once: nothing of it runs after this point.
          inc.crashed = true
          yield* proc.gate.close
          for (const s of Array.from(inc.sessions)) yield* disconnect(s)
        }
        proc.fiber = undefined
        yield* Fiber.interrupt(fiber)
        proc.leading = undefined
        const restart = step + rng.int(3, 25)
        log(`FAULT ${crash ? "crash (kill -9)" : "stop"} p${proc.id}.${inc.number}, restart at step ${restart}`)
        later(restart, start(proc))
      })

    const suspend = (proc: Proc, step: number, ms: number, kind: string) =>
      Effect.gen(function* () {
        const inc = proc.current
        if (inc === undefined) return
        proc.paused = true
        yield* proc.gate.close
        const sessions = Array.from(inc.sessions)
        for (const s of sessions) yield* disconnect(s)
        const resume = step + stepsFor(ms)
        log(
          `FAULT ${kind} of p${proc.id}.${inc.number} (${proc.leading === undefined ? "candidate" : `leader e${proc.leading.epoch}`}) until step ${resume}`
        )
        later(
          resume,
          Effect.gen(function* () {
            proc.paused = false
            yield* proc.gate.open
            // Its overdue timers run first: the client learns what happened meanwhile only when it has reconnected,
            // a moment later.
            const lag = rng.int(1, 50)
            log(`p${proc.id}.${inc.number} resumes, reconnecting in ${lag}ms`)
            yield* Effect.forkIn(
              Effect.andThen(
                Effect.sleep(Duration.millis(lag)),
                // A process crashed meanwhile stays cut off.
                Effect.suspend(() =>
                  inc.crashed ? Effect.void : Effect.forEach(sessions, reconnect, { discard: true })
                )
              ),
              scope
            )
          })
        )
      })

    const inject = (step: number) =>
      Effect.gen(function* () {
        const kind = drawFault(rng)
        const proc = target()
        if (proc === undefined) return
        faultCounts[kind]++
        switch (kind) {
          case "crash":
            return yield* kill(proc, step, true)
          case "stop":
            return yield* kill(proc, step, false)
          case "expire": {
            const sessions = yield* Effect.filter(Array.from(proc.current?.sessions ?? []), (s) =>
              Effect.map(s.state, (state) => state === "connected" || state === "suspended")
            )
            if (sessions.length === 0) return
            const s = rng.pick(sessions)
            log(`FAULT expire session ${s.id} of p${proc.id}`)
            return yield* faults.expire(s)
          }
          case "pause":
            return yield* suspend(proc, step, sessionTimeoutMs + rng.int(100, 2000), "pause")
          case "blip":
            return yield* suspend(proc, step, rng.int(1, sessionTimeoutMs - 2 * config.stepMs), "blip")
        }
      })

    // --- the run -----------------------------------------------------------------------------
    log(
      `seed=${seed} variant=${variant.name} backend=${backend} processes=${count} session=${sessionTimeoutMs}ms write-every=${writeEveryMs}ms`
    )
    for (const proc of procs) yield* start(proc)
    for (let step = 0; step < config.steps; step++) {
      currentStep = step
      const due = scheduled.filter((s) => s.step === step)
      for (const s of due) yield* s.action
      if (rng.chance(config.faultChance)) yield* inject(step)
      yield* clock.adjust(Duration.millis(config.stepMs))
    }
    // No more faults: let the delayed requests arrive and the election settle.
    faultsOn = false
    // In steps, so that what each wakes (a campaign's next move, a coordinator's next input) runs in between.
    for (let settled = 0; settled < config.maxDelayMs + config.stepMs; settled += config.stepMs) {
      yield* clock.adjust(Duration.millis(config.stepMs))
    }
    const leaderNode = yield* auditor.exists(paths.leader)
    const live = procs.filter((p) => p.fiber !== undefined && !p.paused)
    // Every fault ended at least a session timeout ago: a live process must lead.
    const leaderless = live.length > 0 && (leaderNode._tag === "None" || !live.some((p) => p.leading !== undefined))

    finished = true
    const violations: Array<string> = []
    for (const proc of procs) {
      const exit = proc.fiber?.pollUnsafe()
      if (exit !== undefined)
        violations.push(`p${proc.id} died: ${Cause.pretty(Exit.isFailure(exit) ? exit.cause : Cause.empty)}`)
    }
    const entries: Array<Checkers.FencedEntry> = []
    for (const name of yield* auditor.children(logPath)) {
      const node = yield* auditor.get(`${logPath}/${name}`)
      entries.push(entryOf(name, node.stat.createdOrder, node.data))
    }
    // Liveness, once the faults are over: a live process leads.
    if (leaderless) {
      violations.push(
        `no live process leads ${config.maxDelayMs + config.stepMs} ms after the last fault (live: ${live.map((p) => `p${p.id}`).join(", ")})`
      )
    }
    violations.push(
      ...Checkers.checkLeaders(wins),
      ...Checkers.checkReceiver(deliveries),
      ...Checkers.checkDeadlines(sent, expiries),
      ...Checkers.checkFencedLog(entries, epochWrites)
    )
    return {
      seed,
      variant: variant.name,
      backend,
      violations,
      trace,
      stats: {
        processes: count,
        wins: wins.length,
        faults: faultCounts,
        accepted: deliveries.filter((d) => d.accepted).length,
        rejected: deliveries.filter((d) => !d.accepted).length,
        fencedApplied,
        fencedRejected,
        leaderless
      }
    } satisfies Result
  })

/**
 * Runs one seed on a fresh memory coordination and a fresh `TestClock` (time
 * starts at 0), with the recipe's info logs silenced.
 */
export const run = (seed: number, variant: Variant = correct, config: Config = defaultConfig): Effect.Effect<Result> =>
  Effect.scoped(simulate(seed, variant, config)).pipe(
    Effect.provide(Coordination.layerMemory()),
    Effect.provide(TestClock.layer()),
    Effect.provideService(References.MinimumLogLevel, "Warn"),
    Effect.orDie
  )

/** Trace lines that tell the story of a run: faults, elections, losses, resumptions. */
const keyEvent = /FAULT|registers|leads|learns|resumes|starts|expired session|campaign ended|seed=/

/**
 * A failed seed as the test prints it: the seed to replay, the violations, the
 * key events of the trace (at most `keyLines`) and its last `tailLines` lines.
 */
export const describeFailure = (result: Result, keyLines = 40, tailLines = 15): string => {
  const tail = result.trace.slice(-tailLines)
  const key = result.trace.slice(0, result.trace.length - tail.length).filter((l) => keyEvent.test(l))
  return [
    `seed=${result.seed} variant=${result.variant} backend=${result.backend}: ${result.violations.length} violation(s)`,
    ...result.violations.slice(0, 10).map((v) => `  ${v}`),
    ...(result.violations.length > 10 ? [`  ... ${result.violations.length - 10} more`] : []),
    `key events (${Math.min(keyLines, key.length)} of ${key.length}), then the last ${tail.length} of ${result.trace.length} trace lines:`,
    ...key.slice(0, keyLines).map((l) => `  ${l}`),
    "  ...",
    ...tail.map((l) => `  ${l}`),
    `replay: STRATA_SIM_SEED=${result.seed}${result.variant === correct.name ? "" : ` STRATA_SIM_VARIANT=${result.variant}`} ./dev exec vitest run --project unit packages/election/test/Simulation.test.ts`
  ].join("\n")
}
