/**
 * The coordination a simulated process sees: the shared memory coordination, its sessions living in the run's
 * scope (so a crash leaves them to expire) and every operation waiting while the process is paused or cut off from
 * coordination. Every `multi` it commits goes to the auditor (a controller's tablet writes, for the move checker).
 */
import type { Coordination } from "@strata/core"
import { Effect, Exit, Scope } from "effect"
import * as Audit from "./Audit.js"
import type { Proc, World } from "./World.js"

/** The coordination process `p` sees. */
export const coordinationOf = (w: World, p: Proc): Coordination.Shape => ({
  backend: w.base.backend,
  session: (options) =>
    Effect.gen(function* () {
      // The server-side session lives in the root scope, so a crash can leave it to expire.
      const child = yield* Scope.fork(w.root, "sequential")
      yield* p.gate.await
      const s = yield* Scope.provide(w.base.session(options), child)
      p.sessions.add(s)
      yield* Effect.addFinalizer(() =>
        Effect.suspend(() => {
          p.sessions.delete(s)
          return p.crashed ? Effect.ignore(w.faults.disconnect!(s)) : Scope.close(child, Exit.void)
        })
      )
      return gated(w, p, s)
    })
})

/**
 * A session whose operations wait while its process is paused (a paused process does nothing); what its `multi`
 * commits is audited.
 */
const gated = (w: World, p: Proc, s: Coordination.Session): Coordination.Session => {
  const wait = <A, E>(op: Effect.Effect<A, E>) => Effect.andThen(p.gate.await, op)
  return {
    ...s,
    ping: wait(s.ping),
    create: (path, data, options) => wait(s.create(path, data, options)),
    get: (path) => wait(s.get(path)),
    exists: (path) => wait(s.exists(path)),
    set: (path, data, version) => wait(s.set(path, data, version)),
    delete: (path, version) => wait(s.delete(path, version)),
    children: (path) => wait(s.children(path)),
    multi: (ops) => wait(Effect.tap(s.multi(ops), (results) => Audit.committed(w, ops, results))),
    watchNode: (path) => wait(s.watchNode(path)),
    watchChildren: (path) => wait(s.watchChildren(path))
  }
}
