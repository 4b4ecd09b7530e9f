/**
 * `RemotePeers.Transport` over the simulator's network: an address names a simulated process (`s1`, `c101`), and a
 * connection to it is Effect RPC's own client and server machinery in memory (`RpcTest`: requests, answers and
 * interrupts travel as they do over a socket, without serialization), answered by the handlers the real listeners
 * serve (`TabletServerRpc.tabletServerHandlers`, `ControllerRpc.controllerHandlers`). Each call crosses the network as
 * `route` carries it — delayed, lost, cut off, timed out — and reaches the target's incarnation running at that
 * moment. Appends, follower fetches and reads take the data link, which here is a direct call of the server's
 * `append`, `fetch` or `read` carried by `route` the same way (a data address names the process, as its RPC address
 * does).
 */
import { Effect, Scope } from "effect"
import type { Rpc, RpcGroup } from "effect/rpc"
import { RpcTest } from "effect/rpc"
import { PeerUnreachable } from "../../src/wire/Peers.js"
import type * as RemotePeers from "../../src/client/RemotePeers.js"
import type * as DataLink from "../../src/wire/DataLink.js"
import * as ReplicaRpc from "../../src/wire/ReplicaRpc.js"

/** What the transport reaches: the processes behind the addresses, and the network between. */
export interface Network {
  /** Carries a call from the client to the process at `address` (the simulator's faults apply). */
  readonly route: <A, E>(address: string, call: Effect.Effect<A, E>) => Effect.Effect<A, E | PeerUnreachable>
  /** The tablet server running at `address` now, if one does. */
  readonly server: (address: string) => ReplicaRpc.TabletServerHandlers | undefined
  /** The appends, fetches and reads of the tablet server running at `address` now, if one does. */
  readonly link: (address: string) => LinkHandlers | undefined
  /** The coordinator running at `address` now, if one does. */
  readonly coordinator: (address: string) => ReplicaRpc.ControllerHandlers | undefined
}

/** What a tablet server's data link answers. */
export interface LinkHandlers {
  readonly append: DataLink.DataLinkClient["append"]
  readonly fetch: DataLink.DataLinkClient["fetch"]
  readonly read: DataLink.DataLinkClient["read"]
}

type AnyHandlers = Record<string, (payload: unknown, options: unknown) => Effect.Effect<unknown, unknown>>

/**
 * Handlers for `group` that find the process at `address` at each call and carry the call over the network: a
 * process that is down answers `PeerUnreachable`, as the connection's failure does over TCP.
 */
const routed = <R extends Rpc.Any>(
  group: RpcGroup.RpcGroup<R>,
  address: string,
  current: () => AnyHandlers | undefined,
  network: Network
): AnyHandlers => {
  const handlers: AnyHandlers = {}
  for (const tag of group.requests.keys()) {
    handlers[tag] = (payload, options) =>
      Effect.suspend(() => {
        const target = current()
        if (target === undefined) {
          return Effect.fail(new PeerUnreachable({ target: address, detail: "nothing runs there" }))
        }
        return network.route(address, target[tag]!(payload, options))
      })
  }
  return handlers
}

/** A transport for `RemotePeers` on `network`. */
export const make = (network: Network): RemotePeers.TransportShape => ({
  rpc: <R extends Rpc.Any>(group: RpcGroup.RpcGroup<R>, address: string, scope: Scope.Scope) => {
    const current =
      (group as unknown) === ReplicaRpc.TabletServerRpcs
        ? () => network.server(address) as AnyHandlers | undefined
        : () => network.coordinator(address) as AnyHandlers | undefined
    const handlers = routed(group, address, current, network) as unknown as RpcGroup.HandlersFrom<R>
    // The client and its in-memory server live as long as the connection's scope.
    return group.toHandlers(handlers).pipe(
      Effect.flatMap((context) => RpcTest.makeClient(group).pipe(Effect.provide(context))),
      Scope.provide(scope)
    ) as unknown as Effect.Effect<ReplicaRpc.Client<R>, PeerUnreachable>
  },
  dataLink: (address) => Effect.succeed(linkTo(network, address))
})

/** A data link client to `address`: each call finds the server running there then, and crosses the network. */
const linkTo = (network: Network, address: string): DataLink.DataLinkClient => {
  const call =
    <A, E>(f: (link: LinkHandlers) => Effect.Effect<A, E>) =>
    (): Effect.Effect<A, E | PeerUnreachable> =>
      Effect.suspend(() => {
        const target = network.link(address)
        return target === undefined
          ? Effect.fail(new PeerUnreachable({ target: address, detail: "nothing runs there" }))
          : network.route(address, f(target))
      })
  return {
    append: (request) => call((link) => link.append(request))(),
    fetch: (request) => call((link) => link.fetch(request))(),
    read: (request) => call((link) => link.read(request))(),
    close: Effect.void
  }
}
