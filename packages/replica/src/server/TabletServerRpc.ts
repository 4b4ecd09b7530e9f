import type * as Tls from "node:tls"
/**
 * A tablet server's side of `ReplicaRpc.TabletServerRpcs`: each request answered by the `TabletServer`.
 *
 * @since 0.1.0
 */
import { Models } from "@strata/core"
import * as ReplicaManager from "../protocol/ReplicaManager.js"
import { Effect, type Scope } from "effect"
import {
  type Address,
  type ListenFailed,
  serveTabletServerWith,
  type TabletServerHandlers
} from "../wire/ReplicaRpc.js"
import { TabletServer, type TabletServerShape } from "./TabletServer.js"

/**
 * Serves the `TabletServer` in context on `listen` (port 0: any free port) until the scope closes, over TLS when
 * `tls` is given; the address bound.
 *
 * @since 0.1.0
 */
export const serveTabletServer = (
  listen: Address,
  tls?: Tls.TlsOptions
): Effect.Effect<Address, ListenFailed, Scope.Scope | TabletServer> =>
  Effect.flatMap(TabletServer, (server) => serveTabletServerWith(listen, tabletServerHandlers(server), tls))

/**
 * `TabletServerRpcs` answered by `server` (what `serveTabletServer` serves; an in-memory network serves them too).
 *
 * @since 0.1.0
 */
export const tabletServerHandlers = (server: TabletServerShape): TabletServerHandlers => ({
  LeaderAndIsr: (request) => server.leaderAndIsr(request),
  LogEnd: (request) => server.logEnd(request),
  Holdings: (request) => server.holdings(request),
  StopReplica: (request) => server.stopReplica(request),
  EndOffsetForEpoch: (request) => server.endOffsetForEpoch(request),
  Read: (request) => server.read(request),
  DeleteRecords: (request) => server.deleteRecords(request),
  ReplicaState: ({ tablet }) => server.replicaState(tablet),
  ReadLog: (request) => readLog(server, request)
})

/**
 * A replica's log as this server holds it, whatever its role (an operator's or a checker's read, not a client's:
 * records past the high watermark included).
 */
const readLog = (
  server: TabletServerShape,
  request: ReplicaManager.ReadRequest
): Effect.Effect<ReplicaManager.ReadResult, ReplicaManager.ReplicaError> =>
  Effect.flatMap(server.logOf(request.tablet), (log) => {
    const key = Models.tabletKey(request.tablet)
    if (log === undefined)
      return Effect.fail(new ReplicaManager.ReplicaError({ reason: new ReplicaManager.UnknownTablet({ tablet: key }) }))
    return Effect.all({
      batches: log.read(request.offset, request.maxBytes),
      highWatermark: log.highWatermark,
      logStartOffset: log.logStartOffset,
      logEndOffset: log.logEndOffset
    }).pipe(
      Effect.mapError(
        (e) =>
          new ReplicaManager.ReplicaError({
            reason: new ReplicaManager.ReplicaStorageFailed({ tablet: key, detail: e.message })
          })
      )
    )
  })
