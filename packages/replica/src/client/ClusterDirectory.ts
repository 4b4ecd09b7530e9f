/**
 * Where the cluster's processes listen, as coordination tells it: each tablet server's address from its
 * registration (`<ns>/servers/ids/<id>`), the controller's from the election's leader. Both are kept current by
 * watches, so a lookup costs no coordination round trip; a server not registered, or no coordinator leading, is
 * `PeerUnreachable` (the caller retries).
 *
 * @since 0.1.0
 */
import { Coordination, type Election, type Models } from "@strata/core"
import { type Duration, Effect, Exit, Option, Schema, Scope, Stream } from "effect"
import * as ClusterPaths from "../wire/ClusterPaths.js"
import { PeerUnreachable } from "../wire/Peers.js"

/**
 * Lookups of the cluster's addresses.
 *
 * @since 0.1.0
 */
export interface ClusterDirectory {
  /** The `host:port` tablet server `id` registered. */
  readonly locate: (id: Models.ServerId) => Effect.Effect<string, PeerUnreachable>
  /** The `host:port` of server `id`'s data link, `undefined` when it registered none. */
  readonly locateData: (id: Models.ServerId) => Effect.Effect<string | undefined, PeerUnreachable>
  /** The `host:port` of the coordinator that leads (its controller). */
  readonly controller: Effect.Effect<string, PeerUnreachable>
  /** Every registered server: its id, address and rack. */
  readonly servers: Effect.Effect<ReadonlyArray<RegisteredServer>>
}

/**
 * A registered tablet server as the directory knows it.
 *
 * @since 0.1.0
 */
export interface RegisteredServer {
  readonly id: Models.ServerId
  readonly address: string
  readonly dataAddress?: string
  readonly rack?: string
}

const decoder = new TextDecoder()
const decodeRegistration = Schema.decodeUnknownOption(Schema.fromJsonString(ClusterPaths.Registration))

/**
 * A directory of the cluster under `paths`, kept by watches until the scope closes.
 *
 * @since 0.1.0
 */
export const make = (
  paths: ClusterPaths.ClusterPaths,
  election: Election.Shape,
  options: { readonly retryBackoff: Duration.Input }
): Effect.Effect<ClusterDirectory, Coordination.CoordinationError, Coordination.Coordination | Scope.Scope> =>
  Effect.gen(function* () {
    let servers = new Map<Models.ServerId, RegisteredServer>()
    let leader: string | undefined
    const coordination = yield* Coordination.Coordination

    /** Every registration on `session` now, then again whenever the set changes, until the session fails. */
    const followServers = (session: Coordination.Session): Effect.Effect<never, Coordination.CoordinationError> =>
      Effect.gen(function* () {
        while (true) {
          const watch = yield* session.watchChildren(paths.servers)
          const next = new Map<Models.ServerId, RegisteredServer>()
          for (const name of watch.value) {
            const id = ClusterPaths.serverIdOf(name)
            if (id === undefined) continue
            // A server gone since the listing is left out; any other failure ends this session's watch, so no
            // server is left out of the directory because a read failed.
            const node = yield* session.get(paths.server(id)).pipe(
              Effect.map(Option.some),
              Effect.catchIf(
                (e) => e.reason._tag === "NoNode",
                () => Effect.succeed(Option.none<Coordination.Node>())
              )
            )
            if (Option.isNone(node)) continue
            const registration = decodeRegistration(decoder.decode(node.value.data))
            if (Option.isNone(registration)) continue
            const { address, dataAddress, rack } = registration.value
            next.set(id, {
              id,
              address,
              ...(dataAddress === undefined ? {} : { dataAddress }),
              ...(rack === undefined ? {} : { rack })
            })
          }
          servers = next
          yield* watch.changed
        }
      })
    // The first session is opened here (a cluster out of reach fails `make`); a session that ends (expired while the
    // process was paused, say) is replaced by a new one, and the registrations are read again through it.
    const firstScope = yield* Scope.fork(yield* Effect.scope)
    const first = yield* coordination.session().pipe(Scope.provide(firstScope))
    const again = Effect.sleep(options.retryBackoff)
    const renewed = Effect.forever(
      Effect.scoped(Effect.flatMap(coordination.session(), followServers)).pipe(Effect.catch(() => again))
    )
    yield* Effect.forkScoped(
      followServers(first).pipe(
        Effect.ensuring(Scope.close(firstScope, Exit.void)),
        Effect.catch(() => again),
        Effect.andThen(renewed)
      )
    )
    // Followed for as long as the directory lives: a stream that fails or ends is subscribed to again.
    yield* Effect.forkScoped(
      Effect.forever(
        election.changes.pipe(
          Stream.runForEach((info) =>
            Effect.sync(() => {
              leader = Option.isSome(info) ? info.value.address : undefined
            })
          ),
          Effect.ignore,
          Effect.andThen(Effect.sleep(options.retryBackoff))
        )
      )
    )

    const registered = (id: Models.ServerId) =>
      Effect.suspend(() => {
        const found = servers.get(id)
        return found === undefined
          ? Effect.fail(new PeerUnreachable({ target: `server ${id}`, detail: "not registered" }))
          : Effect.succeed(found)
      })
    return {
      locate: (id) => Effect.map(registered(id), (found) => found.address),
      locateData: (id) => Effect.map(registered(id), (found) => found.dataAddress),
      controller: Effect.suspend(() =>
        leader === undefined
          ? Effect.fail(new PeerUnreachable({ target: "the controller", detail: "no coordinator leads" }))
          : Effect.succeed(leader)
      ),
      servers: Effect.sync(() => [...servers.values()])
    }
  })

/**
 * A server as the controller's metadata describes it.
 *
 * @since 0.1.0
 */
export interface LearnedServer {
  readonly id: Models.ServerId
  readonly address: string
  readonly dataAddress?: string | undefined
  readonly rack?: string | undefined
}

/**
 * A directory that knows only some coordinators' addresses (a client's `bootstrap`, as Kafka's admin tools take
 * `--bootstrap-server`), with no coordination session: the controller is asked at each address in turn (a coordinator
 * that does not lead names the one that does), and the servers are those of the last metadata the client `learn`ed.
 *
 * @since 0.1.0
 */
export const bootstrap = (
  addresses: ReadonlyArray<string>
): ClusterDirectory & { readonly learn: (servers: ReadonlyArray<LearnedServer>) => void } => {
  let next = 0
  let servers = new Map<Models.ServerId, RegisteredServer>()
  const known = (id: Models.ServerId) =>
    Effect.suspend(() => {
      const found = servers.get(id)
      return found === undefined
        ? Effect.fail(new PeerUnreachable({ target: `server ${id}`, detail: "not in the cluster's metadata yet" }))
        : Effect.succeed(found)
    })
  return {
    locate: (id) => Effect.map(known(id), (s) => s.address),
    locateData: (id) => Effect.map(known(id), (s) => s.dataAddress),
    controller: Effect.sync(() => addresses[next++ % addresses.length]!),
    servers: Effect.sync(() => [...servers.values()]),
    learn: (learned) => {
      servers = new Map(
        learned.map((s) => [
          s.id,
          {
            id: s.id,
            address: s.address,
            ...(s.dataAddress === undefined ? {} : { dataAddress: s.dataAddress }),
            ...(s.rack === undefined ? {} : { rack: s.rack })
          }
        ])
      )
    }
  }
}
