/**
 * Tablet servers in one process with no controller: the test sends the LeaderAndIsr instructions itself, decides
 * which links work, and can rewrite what a fetch answer says, so a scenario plays out exactly as written.
 */
import { MemoryStore, type Models, Store } from "@strata/core"
import type * as ReplicaManager from "../../src/protocol/ReplicaManager.js"
import { Context, Deferred, Duration, Effect, Exit, Layer, Schedule, Scope } from "effect"
import { Peers, PeerUnreachable, type PeersShape, type ReplicaStorageReport } from "../../src/wire/Peers.js"
import * as Mutants from "./mutants.js"
import * as ServerStorage from "../../src/server/ServerStorage.js"
import * as TabletServer from "../../src/server/TabletServer.js"

const encoder = new TextEncoder()
const decoder = new TextDecoder()

/** Records whose values are `prefix` + n for n in [from, to). */
export const records = (prefix: string, from: number, to: number): Array<ReplicaManager.TabletRecord> =>
  Array.from({ length: to - from }, (_, i) => ({
    key: null,
    value: encoder.encode(`${prefix}${from + i}`),
    headers: [],
    timestamp: 0
  }))

/** A log's values, in offset order. */
export const values = (batches: ReadonlyArray<ReplicaManager.TabletBatch>): Array<string> =>
  batches.flatMap((b) => b.records.map((r) => decoder.decode(r.value)))

/** The harness's knobs over the links between servers: who can fetch from whom, and what a fetch answer says. */
export interface Links {
  /** `follower>leader` pairs whose requests fail (`follower>leader#fetch`: only its fetches). */
  readonly cut: Set<string>
  /** Rewrites the HW in answers to a follower's fetches (a message that carried an older one). */
  readonly staleHighWatermark: Map<Models.ServerId, number>
  /** Every fetch sent, in order (`from`: the follower, `to`: the server asked), whether it got through or not. */
  readonly fetches: Array<{ readonly from: Models.ServerId; readonly to: Models.ServerId; readonly offset: number }>
  /** Answers the leaders' ISR proposals when set (the test as the controller); unset, the controller is unreachable. */
  adjustIsr: PeersShape["controller"]["adjustIsr"] | undefined
  /**
   * When set, server `server`'s next read of an open store partition says so (`reached`) and waits for `release`:
   * a handler held there, its partition open, can be interrupted.
   */
  storeHold: StoreHold | undefined
  /** Every storage report the controller heard. */
  readonly storageReports: Array<ReplicaStorageReport>
  /** While set, storage reports are sent but not heard (their answers lost); each try is in `storageTries`. */
  storageUnheard: boolean
  /** Every storage report sent, heard or not. */
  readonly storageTries: Array<ReplicaStorageReport>
  /** Server ids whose store fails every write (as a full disk does) while they are in it. */
  readonly failingStores: Set<Models.ServerId>
}

/** A hold on a server's store reads (`Links.storeHold`). */
export interface StoreHold {
  readonly server: Models.ServerId
  readonly reached: Deferred.Deferred<void>
  readonly release: Deferred.Deferred<void>
}

/** A running test cluster. */
export interface Servers {
  readonly links: Links
  readonly start: (
    id: Models.ServerId,
    machines?: TabletServer.MachinesShape
  ) => Effect.Effect<TabletServer.TabletServerShape>
  readonly stop: (id: Models.ServerId) => Effect.Effect<void>
  readonly server: (id: Models.ServerId) => TabletServer.TabletServerShape
  /** Sends one tablet's LeaderAndIsr to the servers named. */
  readonly instruct: (
    to: ReadonlyArray<Models.ServerId>,
    tablet: Models.TabletId,
    replicas: ReadonlyArray<Models.ServerId>,
    leaderAndIsr: Omit<Models.LeaderAndIsr, "coordinatorEpoch" | "version"> & { readonly version?: number }
  ) => Effect.Effect<void>
  /** The values of server `id`'s replica of `tablet`, its whole log. */
  readonly logValues: (id: Models.ServerId, tablet: Models.TabletId) => Effect.Effect<Array<string>>
}

/** Polls `check` every 5 ms until it holds (the test's own timeout bounds it). */
export const eventually = <E, R>(check: Effect.Effect<boolean, E, R>): Effect.Effect<void, E, R> =>
  Effect.flatMap(check, (ok) => (ok ? Effect.void : Effect.fail("not yet" as const))).pipe(
    Effect.retry({ schedule: Schedule.spaced(Duration.millis(5)), while: (e) => e === "not yet" }),
    Effect.catchIf(
      (e): e is "not yet" => e === "not yet",
      () => Effect.void
    )
  )

/** Starts the harness: each server on a memory store of its own that outlives its restarts. */
export const make = (replication: TabletServer.TabletServerOptions["replication"]) =>
  Effect.gen(function* () {
    const root = yield* Effect.scope
    const running = new Map<Models.ServerId, { server: TabletServer.TabletServerShape; scope: Scope.Closeable }>()
    const stores = new Map<Models.ServerId, Context.Context<Store.Store>>()
    const links: Links = {
      cut: new Set(),
      staleHighWatermark: new Map(),
      fetches: [],
      adjustIsr: undefined,
      storeHold: undefined,
      storageReports: [],
      storageUnheard: false,
      storageTries: [],
      failingStores: new Set()
    }
    /** Server `id`'s store, its partitions' reads held while `links.storeHold` names it. */
    const held = (id: Models.ServerId, store: Context.Context<Store.Store>): Context.Context<Store.Store> => {
      const inner = Context.get(store, Store.Store)
      const hold = Effect.suspend(() => {
        const h = links.storeHold
        if (h === undefined || h.server !== id) return Effect.void
        links.storeHold = undefined
        return Effect.andThen(Deferred.succeed(h.reached, undefined), Deferred.await(h.release))
      })
      return Context.make(
        Store.Store,
        Store.Store.of({
          ...inner,
          open: (storeId) =>
            Effect.map(inner.open(storeId), (p) => ({
              ...p,
              get: (key) => Effect.andThen(hold, p.get(key)),
              write: (ops, options) =>
                links.failingStores.has(id)
                  ? Effect.fail(
                      new Store.StoreError({
                        reason: new Store.IoError({ operation: "write", detail: "No space left on device" })
                      })
                    )
                  : p.write(ops, options)
            }))
        })
      )
    }
    const down = (target: string) => Effect.fail(new PeerUnreachable({ target, detail: "cut or down" }))
    const peersOf = (self: Models.ServerId): PeersShape => ({
      leader: (id) => {
        const cut = (fetch: boolean) =>
          links.cut.has(`${self}>${id}`) || (fetch && links.cut.has(`${self}>${id}#fetch`))
        const reach = (fetch: boolean) =>
          Effect.suspend(() => {
            const r = running.get(id)
            return r === undefined || cut(fetch) ? down(`server ${id}`) : Effect.succeed(r.server)
          })
        /** A link cut while the request was out loses its answer too. */
        const answered = <A, E>(fetch: boolean, answer: Effect.Effect<A, E>) =>
          Effect.flatMap(answer, (a) => (cut(fetch) ? down(`server ${id}`) : Effect.succeed(a)))
        return {
          fetch: (request) =>
            Effect.sync(() => links.fetches.push({ from: self, to: id, offset: request.offset })).pipe(
              Effect.andThen(reach(true)),
              Effect.flatMap((s) => answered(true, s.fetch(request))),
              Effect.map((answer) => {
                const stale = links.staleHighWatermark.get(self)
                return stale === undefined || answer._tag !== "Batches"
                  ? answer
                  : { ...answer, highWatermark: Math.min(stale, answer.highWatermark) }
              })
            ),
          endOffsetForEpoch: (request) =>
            Effect.flatMap(reach(false), (s) => answered(false, s.endOffsetForEpoch(request)))
        }
      },
      controller: {
        // No controller unless the test plays it: ISR changes are the test's, through `instruct`.
        adjustIsr: (request) =>
          links.adjustIsr === undefined
            ? Effect.fail(new PeerUnreachable({ target: "controller", detail: "none in this harness" }))
            : links.adjustIsr(request),
        controlledShutdown: () => Effect.succeed(0),
        replicaStorage: (report) =>
          Effect.suspend(() => {
            links.storageTries.push(report)
            if (links.storageUnheard) return Effect.fail(new PeerUnreachable({ target: "controller", detail: "lost" }))
            links.storageReports.push(report)
            return Effect.void
          })
      }
    })
    let version = 0
    const servers: Servers = {
      links,
      start: (id, machines) =>
        Effect.gen(function* () {
          let store = stores.get(id)
          if (store === undefined) {
            store = yield* Layer.buildWithScope(MemoryStore.layer(), root)
            stores.set(id, store)
          }
          const scope = yield* Scope.fork(root, "sequential")
          const server = yield* TabletServer.make({
            serverId: id,
            ...(replication === undefined ? {} : { replication })
          }).pipe(
            Effect.provideServiceEffect(ServerStorage.ServerStorage, ServerStorage.makeStore),
            Effect.provide(Context.add(held(id, store), Peers, peersOf(id))),
            Effect.provideService(TabletServer.Machines, machines ?? Mutants.production),
            Scope.provide(scope),
            Effect.orDie
          )
          running.set(id, { server, scope })
          return server
        }),
      stop: (id) =>
        Effect.suspend(() => {
          const r = running.get(id)
          running.delete(id)
          return r === undefined ? Effect.void : Scope.close(r.scope, Exit.void)
        }),
      server: (id) => {
        const r = running.get(id)
        if (r === undefined) throw new Error(`server ${id} is not running`)
        return r.server
      },
      instruct: (to, tablet, replicas, lai) =>
        Effect.forEach(
          to,
          (id) =>
            servers.server(id).leaderAndIsr({
              coordinatorEpoch: 1,
              tablets: [
                { tablet, replicas, leaderAndIsr: { ...lai, coordinatorEpoch: 1, version: lai.version ?? ++version } }
              ]
            }),
          { discard: true }
        ).pipe(Effect.orDie),
      logValues: (id, tablet) =>
        Effect.gen(function* () {
          const log = yield* servers.server(id).logOf(tablet)
          if (log === undefined) return []
          return values(yield* Effect.orDie(log.read(yield* log.logStartOffset, Number.MAX_SAFE_INTEGER)))
        })
    }
    return servers
  })

/** Replication settings for in-memory clusters in tests: failures noticed in seconds. */
export const quickReplication = {
  sessionTimeout: 2_000,
  replicaLagTimeMax: 6_000,
  fetchMaxWait: 50,
  retryBackoff: 20,
  appendTimeout: 5_000
}
