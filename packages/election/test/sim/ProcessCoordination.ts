/**
 * The coordination a simulated process sees: the shared memory coordination,
 * with a fault point before every operation, the process's cut connections (an
 * operation fails with a lost connection, an expiry is learnt only once
 * reconnected), the seed's backend semantics for a write from an expired
 * session, and the epoch bumps and leader registrations recorded for the
 * checkers.
 */
import { Coordination } from "@strata/core"
import { Effect, Exit, Scope, Stream } from "effect"
import * as Clock from "./Clock.js"
import * as Network from "./Network.js"
import { type Incarnation, paths, type Proc, type World } from "./World.js"

/** What runs before each operation of a session (`name` names the operation in the trace). */
export type FaultPoint = (s: Coordination.Session, name: string) => Effect.Effect<void, Coordination.CoordinationError>

/** One incarnation's view of the coordination. */
interface View {
  readonly w: World
  readonly proc: Proc
  readonly inc: Incarnation
  readonly point: FaultPoint
}

const decoder = new TextDecoder()

const parseEpoch = (data: Uint8Array): number => Number(decoder.decode(data))

const leaderEpoch = (data: Uint8Array): number => {
  const parsed: unknown = JSON.parse(decoder.decode(data))
  return typeof parsed === "object" && parsed !== null && "epoch" in parsed && typeof parsed.epoch === "number"
    ? parsed.epoch
    : -1
}

const createsEphemeral = (o: Coordination.Op): boolean =>
  o._tag === "create" && (o.mode === "ephemeral" || o.mode === "ephemeral-sequential")

/** Runs a write on the process's session or, on an etcd-like backend, past its ended session. */
const write = <A>(
  v: View,
  s: Coordination.Session,
  ops: ReadonlyArray<Coordination.Op>,
  own: Effect.Effect<A, Coordination.CoordinationError>,
  server: Effect.Effect<A, Coordination.CoordinationError>
): Effect.Effect<A, Coordination.CoordinationError> =>
  v.w.backend === "zookeeper-like" || ops.some(createsEphemeral)
    ? own
    : Effect.flatMap(s.state, (state) => {
        if (state !== "expired") return own
        Clock.log(
          v.w.clock,
          `p${v.proc.id}.${v.inc.number} writes on its expired session ${s.id}: not tied to the lease, the store evaluates it`
        )
        return server
      })

/** Runs `self` after the fault point, unless the session's connection is cut. */
const guard =
  (v: View, s: Coordination.Session, name: string) =>
  <A>(self: Effect.Effect<A, Coordination.CoordinationError>): Effect.Effect<A, Coordination.CoordinationError> =>
    Effect.andThen(
      v.point(s, name),
      Effect.suspend(() =>
        Network.isCutOff(v.w.network, s)
          ? Effect.fail(
              Coordination.coordinationError(
                new Coordination.ConnectionLoss({ detail: `session ${s.id} is disconnected` })
              )
            )
          : self
      )
    )

/** The end of the session, as its client learns it: only once reconnected when its connection is cut. */
const revealed = <A>(v: View, s: Coordination.Session, changed: Effect.Effect<A, Coordination.CoordinationError>) =>
  Effect.catchTag(changed, "CoordinationError", (e) =>
    e.reason._tag === "SessionExpired"
      ? Effect.andThen(Network.linkOf(v.w.network, s).await, Effect.fail(e))
      : Effect.fail(e)
  )

const watched = <A>(
  v: View,
  s: Coordination.Session,
  name: string,
  watch: Effect.Effect<Coordination.Watch<A>, Coordination.CoordinationError>
) => Effect.map(guard(v, s, name)(watch), (w) => ({ value: w.value, changed: revealed(v, s, w.changed) }))

/** An epoch bump: recorded with the value it wrote and the store order of the write. */
const bumpEpoch = (v: View, s: Coordination.Session, path: string, data: Uint8Array, version: number | undefined) => {
  const bumped = write(
    v,
    s,
    [Coordination.op.set(path, data, version)],
    s.set(path, data, version),
    v.w.auditor.set(path, data, version)
  )
  const recorded = Effect.tap(bumped, (stat) =>
    Effect.sync(() => {
      v.w.epochWrites.push({ epoch: parseEpoch(data), order: stat.modifiedOrder })
    })
  )
  return guard(v, s, "epoch bump")(Effect.uninterruptible(recorded))
}

/** A `multi`; one holding the leader registration begins a term, recorded with the epoch it announces. */
const multi = (v: View, s: Coordination.Session, ops: ReadonlyArray<Coordination.Op>) => {
  const registration = ops.find((o) => o._tag === "create" && o.path === paths.leader)
  const applied = write(v, s, ops, s.multi(ops), v.w.auditor.multi(ops))
  if (registration === undefined || registration._tag !== "create") return guard(v, s, "multi")(applied)
  // The leader registration is the moment a term begins: record it with the epoch it announces.
  const recorded = Effect.tap(applied, () =>
    Effect.sync(() => {
      const term = ++v.w.terms
      const epoch = leaderEpoch(registration.data)
      v.inc.term = term
      v.inc.session = s.id
      v.w.wins.push({
        term,
        process: v.proc.id,
        incarnation: v.inc.number,
        session: s.id,
        epoch,
        at: Clock.now(v.w.clock)
      })
      Clock.log(
        v.w.clock,
        `p${v.proc.id}.${v.inc.number} registers as leader: epoch ${epoch}, term ${term}, session ${s.id}`
      )
    })
  )
  return guard(v, s, "leader registration")(Effect.uninterruptible(recorded))
}

/** The session as the process sees it. */
const instrument = (v: View, s: Coordination.Session): Coordination.Session => {
  const network = v.w.network
  return {
    ...s,
    state: Effect.map(s.state, (state) => (state === "expired" && Network.isCutOff(network, s) ? "suspended" : state)),
    changes: s.changes.pipe(
      Stream.mapEffect((state) =>
        state === "expired" ? Effect.as(Network.linkOf(network, s).await, state) : Effect.succeed(state)
      )
    ),
    create: (path, data, options) => guard(v, s, "create")(s.create(path, data, options)),
    get: (path) => guard(v, s, "get")(s.get(path)),
    ping: guard(v, s, "ping")(s.ping),
    exists: (path) => guard(v, s, "exists")(s.exists(path)),
    delete: (path, version) => guard(v, s, "delete")(s.delete(path, version)),
    children: (path) => guard(v, s, "children")(s.children(path)),
    watchNode: (path) => watched(v, s, "watchNode", s.watchNode(path)),
    watchChildren: (path) => watched(v, s, "watchChildren", s.watchChildren(path)),
    set: (path, data, version) =>
      path === paths.epoch ? bumpEpoch(v, s, path, data, version) : guard(v, s, "set")(s.set(path, data, version)),
    multi: (ops) => multi(v, s, ops)
  }
}

/**
 * The coordination one incarnation of a process sees: its sessions live on the server in `host`, so a crash can
 * leave them open to expire, and are recorded in the incarnation for the faults.
 */
export const coordinationOf = (
  w: World,
  proc: Proc,
  inc: Incarnation,
  host: Scope.Scope,
  point: FaultPoint
): Coordination.Shape => {
  const v: View = { w, proc, inc, point }
  return {
    backend: w.coordination.backend,
    session: (options) =>
      Effect.gen(function* () {
        yield* proc.gate.await
        // The server-side session lives in the host scope, so a crash can leave it open to expire.
        const child = yield* Scope.fork(host, "sequential")
        const s = yield* Scope.provide(w.coordination.session(options), child)
        inc.sessions.add(s)
        yield* Effect.addFinalizer(() =>
          Effect.suspend(() => {
            inc.sessions.delete(s)
            // A crashed process's sessions are cut and left to the server to expire, never closed.
            return inc.crashed ? Effect.ignore(Network.disconnect(w.network, s)) : Scope.close(child, Exit.void)
          })
        )
        return instrument(v, s)
      })
  }
}
