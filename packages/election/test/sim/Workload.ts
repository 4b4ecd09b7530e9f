/**
 * The simulated leader's work: while a process's coordinator leads, its leader
 * service sends an epoch-tagged request to the receiver (when the leadership's
 * guard allows it) and makes a fenced write to the log every `writeEveryMs`.
 */
import { Coordination, type Election } from "@strata/core"
import { Cause, Duration, Effect, Exit } from "effect"
import * as Coordinator from "../../src/Coordinator.js"
import type * as Checkers from "./Checkers.js"
import * as Clock from "./Clock.js"
import * as Network from "./Network.js"
import { type Incarnation, namespace, type Proc, type World } from "./World.js"

/** Where the fenced writes go: one sequential node each. */
export const logPath = `/${namespace}/log`
const encoder = new TextEncoder()
const decoder = new TextDecoder()

/** A leadership as its leader service works through it. */
interface Term {
  readonly proc: Proc
  readonly inc: Incarnation
  readonly leadership: Election.Leadership
  readonly term: number
  /** The session that won the term. */
  readonly session: string
  readonly epoch: number
  /** Requests (and fenced writes) so far. */
  n: number
  /** How the leadership ended, once the service learned it. */
  lost: Election.LeadershipEnd | undefined
}

/** One round of the leader's work: a request to the receiver if the guard allows it, then a fenced write. */
const act = (w: World, t: Term) =>
  Effect.gen(function* () {
    const { proc, leadership, term, session, epoch } = t
    // A process paused here resumes with its timers overdue, before any I/O tells it what happened
    // meanwhile: only the leadership's deadline stops it from acting as the leader it may no longer be.
    yield* proc.gate.await
    t.n++
    const n = t.n
    const allowed = yield* Effect.exit(leadership.guard)
    if (Exit.isSuccess(allowed)) {
      yield* Network.send(w.network, { session, term, epoch, process: proc.id, n, sentAt: Clock.now(w.clock) })
    } else {
      const error = Cause.findErrorOption(allowed.cause)
      Clock.log(
        w.clock,
        `p${proc.id} holds back request e${epoch} #${n}: ${error._tag === "Some" ? error.value.message : "?"}`
      )
    }
    const at = Clock.now(w.clock)
    const data = encoder.encode(JSON.stringify({ epoch, term, process: proc.id, n, at }))
    const written = yield* Effect.exit(
      leadership.fenced([Coordination.op.create(`${logPath}/w_`, data, "persistent-sequential")])
    )
    if (Exit.isSuccess(written)) {
      w.fencedApplied++
      Clock.log(w.clock, `p${proc.id} fenced write e${epoch} #${n} applied`)
    } else {
      w.fencedRejected++
      const error = Cause.findErrorOption(written.cause)
      Clock.log(
        w.clock,
        `p${proc.id} fenced write e${epoch} #${n} failed: ${error._tag === "Some" ? error.value.message : Cause.pretty(written.cause)}`
      )
    }
  })

/**
 * The leader-only service each process's coordinator runs while it leads: every `writeEveryMs`, a request to
 * the receiver (when the leadership's guard allows it) and a fenced write, until the leadership is lost or the
 * coordinator releases the service.
 */
export const leaderService = (w: World, proc: Proc, inc: Incarnation) =>
  Coordinator.service("receiver-client", (leadership) =>
    Effect.gen(function* () {
      const term = inc.term ?? -1
      const session = inc.session ?? "?"
      const epoch = leadership.epoch
      proc.leading = { epoch, term }
      Clock.log(w.clock, `p${proc.id}.${inc.number} leads epoch ${epoch} (term ${term})`)
      yield* Effect.addFinalizer(() =>
        Effect.sync(() => {
          if (proc.leading?.epoch === epoch) proc.leading = undefined
        })
      )
      const t: Term = { proc, inc, leadership, term, session, epoch, n: 0, lost: undefined }
      yield* Effect.forkScoped(
        Effect.tap(leadership.lost, (end) =>
          Effect.sync(() => {
            t.lost = end
            Clock.log(w.clock, `p${proc.id}.${inc.number} learns it lost epoch ${epoch}: ${end._tag}`)
          })
        )
      )
      const round = act(w, t)
      yield* Effect.forkScoped(
        Effect.gen(function* () {
          while (t.lost === undefined) {
            yield* Effect.sleep(Duration.millis(w.writeEveryMs))
            yield* round
          }
        })
      )
    })
  )

/** A fenced write as the log holds it. */
const entryOf = (path: string, order: number, data: Uint8Array): Checkers.FencedEntry => {
  const parsed: unknown = JSON.parse(decoder.decode(data))
  const field = (name: string): number =>
    typeof parsed === "object" && parsed !== null && name in parsed
      ? Number((parsed as Record<string, unknown>)[name])
      : -1
  return { path, order, epoch: field("epoch"), term: field("term"), process: field("process"), at: field("at") }
}

/** Every fenced write the log holds, read through `session`. */
export const readFencedLog = (
  session: Coordination.Session
): Effect.Effect<Array<Checkers.FencedEntry>, Coordination.CoordinationError> =>
  Effect.gen(function* () {
    const entries: Array<Checkers.FencedEntry> = []
    for (const name of yield* session.children(logPath)) {
      const node = yield* session.get(`${logPath}/${name}`)
      entries.push(entryOf(name, node.stat.createdOrder, node.data))
    }
    return entries
  })
