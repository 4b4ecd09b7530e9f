/** Connections by address for RemotePeers: one per address, shared, made on first use and retired on demand. */
import { Deferred, Effect, Exit, Scope } from "effect"
import type { PeerUnreachable } from "../../wire/Peers.js"

/** A pool of connections by address: `get` one (made on first use), `retire` one. */
export interface ConnectionPool<C> {
  readonly get: (address: string) => Effect.Effect<C, PeerUnreachable>
  readonly retire: (address: string) => Effect.Effect<void>
}

/**
 * Connections, one per address (callers arriving together share one), each in a scope of its own inside `scope`:
 * `retire` closes the connection to an address no longer in use (a server that moved to another port), which would
 * otherwise go on reconnecting for ever. A connection is made in a fiber of the pool's own, so a caller interrupted
 * while it waits (its timeout) leaves nothing half made for the callers after it to wait on; one that fails is not
 * kept, and the next call tries again.
 */
export const make = <C>(
  scope: Scope.Scope,
  connect: (address: string, scope: Scope.Scope) => Effect.Effect<C, PeerUnreachable>
): ConnectionPool<C> => {
  const open = new Map<
    string,
    { readonly client: Deferred.Deferred<C, PeerUnreachable>; readonly scope: Scope.Closeable }
  >()
  const retire = (address: string) =>
    Effect.suspend(() => {
      const entry = open.get(address)
      open.delete(address)
      return entry === undefined ? Effect.void : Scope.close(entry.scope, Exit.void)
    })
  const get = (address: string): Effect.Effect<C, PeerUnreachable> =>
    Effect.suspend(() => {
      const known = open.get(address)
      if (known !== undefined) return Deferred.await(known.client)
      return Effect.uninterruptibleMask((restore) =>
        Effect.gen(function* () {
          const entry = { client: Deferred.makeUnsafe<C, PeerUnreachable>(), scope: yield* Scope.fork(scope) }
          open.set(address, entry)
          yield* Effect.forkIn(
            Effect.gen(function* () {
              const made = yield* Effect.exit(connect(address, entry.scope))
              if (Exit.isFailure(made) && open.get(address) === entry) yield* retire(address)
              yield* Deferred.done(entry.client, made)
            }),
            scope
          )
          return yield* restore(Deferred.await(entry.client))
        })
      )
    })
  return { get, retire }
}
