/**
 * Where a replicated cluster keeps its state in coordination, under one namespace: the live tablet servers'
 * ephemeral registrations (`<ns>/servers/ids/<id>`) and each tablet's assignment with its leader and ISR
 * (`<ns>/tablets/<table>:<bucket>`, JSON, written only by the controller, fenced by the coordinator epoch), the
 * journal of the latest tablet writes (`<ns>/tablet-changes`, written in the same atomic operation as the tablets it
 * names, so a standby coordinator reads only what changed), and how a tablet server registers.
 *
 * @since 0.1.0
 */
import { Coordination, CoordinationPaths, type Election, Models } from "@strata/core"
import { CoordinationElection } from "@strata/election"
import type { Scope } from "effect"
import { Clock, Duration, Effect, Schema, Stream } from "effect"
import type * as ControllerState from "../machines/ControllerState.js"
import * as ReplicaManager from "../protocol/ReplicaManager.js"
import type * as ReplicationConfig from "./ReplicationConfig.js"

const encoder = new TextEncoder()
const decoder = new TextDecoder()

/**
 * A cluster's paths.
 *
 * @since 0.1.0
 */
export interface ClusterPaths {
  readonly servers: string
  readonly server: (id: Models.ServerId) => string
  readonly tablets: string
  readonly tablet: (tablet: Models.TabletId) => string
  /** The journal of the latest tablet writes. */
  readonly changes: string
  /** The next idempotent-producer id no one has been given (`ProducerIds`). */
  readonly producerIds: string
  /** The current or last rebalance (`@strata/rebalance`'s `RebalanceStore`: a header and chunks of moves). */
  readonly rebalance: string
}

/**
 * The paths under `namespace` (an absolute coordination path such as `/strata`).
 *
 * @since 0.1.0
 */
export const make = (namespace: string): ClusterPaths => {
  const servers = CoordinationPaths.join(CoordinationPaths.join(namespace, "servers"), "ids")
  const tablets = CoordinationPaths.join(namespace, "tablets")
  return {
    servers,
    server: (id) => CoordinationPaths.join(servers, String(id)),
    tablets,
    tablet: (t) => CoordinationPaths.join(tablets, nodeName(t)),
    changes: CoordinationPaths.join(namespace, "tablet-changes"),
    producerIds: CoordinationPaths.join(namespace, "producer-ids"),
    rebalance: CoordinationPaths.join(namespace, "rebalance")
  }
}

/**
 * A tablet's node name under `tablets`.
 *
 * @since 0.1.0
 */
export const nodeName = (t: Models.TabletId): string => `${encodeURIComponent(t.table)}:${t.bucket}`

/**
 * The journal of tablet writes: every controller write of tablets sets it in the same atomic operation, with the
 * next `seq` and the names (under `tablets`) of the tablets written. It keeps the latest writes, up to
 * `journalLimit` names, so a reader that saw `seq` earlier reads only the tablets written since, or learns that it
 * must read them all.
 *
 * @since 0.1.0
 */
export const Journal = Schema.Struct({
  seq: Schema.Int,
  recent: Schema.Array(Schema.Tuple([Schema.Int, Schema.Array(Schema.String)]))
})

/**
 * The journal's type.
 *
 * @since 0.1.0
 */
export type Journal = typeof Journal.Type

/**
 * How many tablet names the journal keeps (its oldest entries go first).
 *
 * @since 0.1.0
 */
export const journalLimit = 1024

/**
 * An empty journal.
 *
 * @since 0.1.0
 */
export const emptyJournal: Journal = { seq: 0, recent: [] }

/**
 * The journal after one more write of the tablets `names`.
 *
 * @since 0.1.0
 */
export const journalAppend = (journal: Journal, names: ReadonlyArray<string>): Journal => {
  const seq = journal.seq + 1
  const recent: Array<readonly [number, ReadonlyArray<string>]> = [[seq, names]]
  let kept = names.length
  for (let i = journal.recent.length - 1; i >= 0; i--) {
    const entry = journal.recent[i]!
    if (kept + entry[1].length > journalLimit) break
    kept += entry[1].length
    recent.unshift(entry)
  }
  return { seq, recent }
}

/**
 * The names of the tablets written after `seq`, or `undefined` when the journal no longer goes back that far (or
 * `seq` is not one of its own): read every tablet then.
 *
 * @since 0.1.0
 */
export const journalSince = (journal: Journal, seq: number): ReadonlyArray<string> | undefined => {
  if (seq === journal.seq) return []
  if (seq > journal.seq) return undefined
  const oldest = journal.recent[0]?.[0]
  if (oldest === undefined || oldest > seq + 1) return undefined
  const names = new Set<string>()
  for (const [at, written] of journal.recent) if (at > seq) for (const n of written) names.add(n)
  return [...names]
}

const JournalJson = Schema.fromJsonString(Journal)

/**
 * The journal's node data.
 *
 * @since 0.1.0
 */
export const encodeJournal = (journal: Journal): Uint8Array => encoder.encode(Schema.encodeSync(JournalJson)(journal))

/**
 * The journal's node data read back, or why it cannot be (naming the path).
 *
 * @since 0.1.0
 */
export const decodeJournal = (path: string, data: Uint8Array): Effect.Effect<Journal, CorruptClusterData> =>
  Schema.decodeUnknownEffect(JournalJson)(decoder.decode(data)).pipe(
    Effect.mapError((e) => new CorruptClusterData({ path, detail: e.message }))
  )

/**
 * A tablet as coordination stores it.
 *
 * @since 0.1.0
 */
export const StoredTablet = Schema.Struct({
  tablet: Models.TabletId,
  replicas: Schema.Array(Models.ServerId),
  state: Schema.Literals(["NewTablet", "OnlineTablet", "OfflineTablet", "DeletingTablet"]),
  leaderAndIsr: Models.LeaderAndIsr,
  registrations: Schema.optional(Schema.Record(Schema.String, Schema.Int)),
  eligible: Schema.optional(Schema.Array(Models.ServerId)),
  deleted: Schema.optional(Schema.Array(Models.ServerId)),
  reassignment: Schema.optional(
    Schema.Struct({
      original: Schema.Array(Models.ServerId),
      target: Schema.Array(Models.ServerId),
      // Absent from what a node without replication throttles wrote (such a node drops it when it reads it).
      throttleBytesPerSec: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(1)))
    })
  ),
  retired: Schema.optional(Schema.Array(Models.ServerId)),
  // Its table's retention; absent from what a node without retention wrote (such a node drops it when it reads it).
  retention: Schema.optional(ReplicaManager.Retention)
})

const TabletJson = Schema.fromJsonString(StoredTablet)

/**
 * A tablet's node data.
 *
 * @since 0.1.0
 */
export const encodeTablet = (tablet: ControllerState.Tablet): Uint8Array =>
  encoder.encode(Schema.encodeSync(TabletJson)(tablet))

/**
 * A tablet's node data read back, or why it cannot be (naming the path); `version` is the node's own.
 *
 * @since 0.1.0
 */
export const decodeTablet = (
  path: string,
  data: Uint8Array,
  version: number
): Effect.Effect<ControllerState.Tablet, CorruptClusterData> =>
  Schema.decodeUnknownEffect(TabletJson)(decoder.decode(data)).pipe(
    Effect.map((t) => ({ ...t, leaderAndIsr: { ...t.leaderAndIsr, version } })),
    Effect.mapError((e) => new CorruptClusterData({ path, detail: e.message }))
  )

/**
 * A node of the cluster's state cannot be read.
 *
 * @since 0.1.0
 */
export class CorruptClusterData extends Schema.TaggedError<CorruptClusterData>()("CorruptClusterData", {
  path: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `${this.path}: ${this.detail}`
  }
}

/**
 * The longest table name (Kafka's topic names have the same bound).
 *
 * @since 0.1.0
 */
export const maxTableNameLength = 249

/**
 * What a table name must be.
 *
 * @since 0.1.0
 */
export const tableNameRule = `1 to ${maxTableNameLength} of [A-Za-z0-9._-], and not "." or ".."`

/**
 * A table name that is not `[A-Za-z0-9._-]+` (1 to `maxTableNameLength` of them), or is `.` or `..`.
 *
 * @since 0.1.0
 */
export class InvalidTableName extends Schema.TaggedError<InvalidTableName>()("InvalidTableName", {
  table: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `invalid table name ${JSON.stringify(this.table)}: a table name is ${tableNameRule}`
  }
}

/**
 * Why `table` cannot name a table, if it cannot.
 *
 * @since 0.1.0
 */
export const invalidTableName = (table: string): InvalidTableName | undefined =>
  /^[A-Za-z0-9._-]+$/.test(table) && table.length <= maxTableNameLength && table !== "." && table !== ".."
    ? undefined
    : new InvalidTableName({ table })

/**
 * What a tablet server announces in its registration.
 *
 * @since 0.1.0
 */
export const Registration = Schema.Struct({
  address: Schema.String,
  /** Where the server's data link listens (appends and fetches); without it, they go through the RPC. */
  dataAddress: Schema.optional(Schema.String),
  rack: Schema.optional(Schema.String),
  /** Grows with every registration of the same id (a restart), so a watcher tells two lives apart. */
  registrationEpoch: Models.Epoch
})

/**
 * Registers tablet server `id` under `paths` for as long as `session` lives (an ephemeral node). A registration of
 * another session fails with `NodeExists`; one of this session's own (a create whose answer was lost) is kept.
 * Returns the registration's creation order: the controller addresses this life of the server by it.
 *
 * @since 0.1.0
 */
export const register = (
  session: Coordination.Session,
  paths: ClusterPaths,
  id: Models.ServerId,
  registration: typeof Registration.Type
): Effect.Effect<number, Coordination.CoordinationError> => {
  const path = paths.server(id)
  const data = encoder.encode(Schema.encodeSync(Schema.fromJsonString(Registration))(registration))
  // This session's node, read back: its creation order is the registration the controller addresses this life by.
  const own = (otherwise: Coordination.CoordinationError) =>
    Effect.flatMap(session.exists(path), (stat) =>
      stat._tag === "Some" && stat.value.ephemeralOwner === session.id
        ? Effect.succeed(stat.value.createdOrder)
        : Effect.fail(otherwise)
    )
  return session.create(path, data, { mode: "ephemeral", createParents: true }).pipe(
    Effect.andThen(own(new Coordination.CoordinationError({ reason: new Coordination.NoNode({ path }) }))),
    Effect.catchIf(
      (e) => e.reason._tag === "NodeExists",
      (e) => own(e)
    )
  )
}

/**
 * Another registration of server `id` outlived the wait: another live server runs with the same id (`holder`: the
 * address in its registration, when it could be read).
 *
 * @since 0.1.0
 */
export class DuplicateServerId extends Schema.TaggedError<DuplicateServerId>()("DuplicateServerId", {
  serverId: Models.ServerId,
  holder: Schema.optional(Schema.String),
  waitedMs: Schema.Int
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `server id ${this.serverId} is registered by another server${this.holder === undefined ? "" : ` at ${this.holder}`}: its registration did not end within ${this.waitedMs} ms`
  }
}

/** The address in server `id`'s registration, if it can be read. */
const holderOf = (
  session: Coordination.Session,
  paths: ClusterPaths,
  id: Models.ServerId
): Effect.Effect<string | undefined> =>
  session.get(paths.server(id)).pipe(
    Effect.flatMap((node) =>
      Schema.decodeUnknownEffect(Schema.fromJsonString(Registration))(decoder.decode(node.data))
    ),
    Effect.map((r): string | undefined => r.address),
    Effect.orElseSucceed(() => undefined)
  )

/**
 * Keeps tablet server `id` registered for as long as it runs: a session, the registration, and when the session
 * ends (it expired: the server was paused or cut off past its timeout), a new session and a new registration with a
 * higher registration epoch. A registration still held by another session (the server's previous, dying life) is
 * waited out: for ever, or with `holderWaitTimeouts` for that many of the session's (negotiated) timeouts, after
 * which it is another live server with the same id and this fails with `DuplicateServerId`, having told no
 * registration for that session. Coordination that refuses this process's identity (`NotAuthorized`) fails it too;
 * any other coordination failure is retried after `retryBackoff`.
 *
 * @since 0.1.0
 */
export const keepRegistered = (
  coordination: Coordination.Shape,
  paths: ClusterPaths,
  id: Models.ServerId,
  options: {
    readonly address: string
    readonly dataAddress?: string
    readonly rack?: string
    readonly sessionTimeout: Duration.Input
    /** The first registration's epoch; each later one adds one. */
    readonly firstEpoch: number
    /** The pause before registering again (after a failure, or with the registration still held). */
    readonly retryBackoff: Duration.Input
    /**
     * How long another session's registration of `id` is waited out, in the session's timeouts (a previous life's
     * ends within about one); unset, for as long as it takes.
     */
    readonly holderWaitTimeouts?: number
    /** Told each registration as it is made (its creation order), and `undefined` when its session ends. */
    readonly onRegistered?: (registration: number | undefined) => Effect.Effect<void>
  }
): Effect.Effect<never, DuplicateServerId | Coordination.CoordinationError> =>
  Effect.gen(function* () {
    let epoch = options.firstEpoch
    const told = (registration: number | undefined) => options.onRegistered?.(registration) ?? Effect.void
    const backoff = options.retryBackoff
    while (true) {
      const registration = {
        address: options.address,
        registrationEpoch: epoch++,
        ...(options.dataAddress === undefined ? {} : { dataAddress: options.dataAddress }),
        ...(options.rack === undefined ? {} : { rack: options.rack })
      }
      yield* Effect.scoped(
        Effect.gen(function* () {
          const session = yield* coordination.session({ timeout: options.sessionTimeout })
          const limitMs =
            options.holderWaitTimeouts === undefined
              ? undefined
              : Math.ceil(options.holderWaitTimeouts * Duration.toMillis(session.timeout))
          // Another session's registration (this server's previous life) goes when that session expires; a lost
          // connection may come back. Anything else ends this session's attempt.
          let heldSince: number | undefined
          let order: number | undefined
          while (order === undefined) {
            const attempt = yield* Effect.result(register(session, paths, id, registration))
            if (attempt._tag === "Success") {
              order = attempt.success
              break
            }
            const e = attempt.failure
            if (e.reason._tag === "NodeExists") {
              const now = yield* Clock.currentTimeMillis
              if (heldSince === undefined) {
                heldSince = now
                const holder = yield* holderOf(session, paths, id)
                yield* Effect.logWarning(
                  `server id ${id} is registered by another session${holder === undefined ? "" : ` (at ${holder})`}: waiting ${limitMs === undefined ? "" : `up to ${limitMs} ms `}for it to end (this server's previous life, or another server started with id ${id})`
                )
              } else if (limitMs !== undefined && now - heldSince >= limitMs) {
                const holder = yield* holderOf(session, paths, id)
                return yield* new DuplicateServerId({
                  serverId: id,
                  waitedMs: now - heldSince,
                  ...(holder === undefined ? {} : { holder })
                })
              }
            } else if (e.reason._tag !== "ConnectionLoss") {
              return yield* e
            }
            yield* Effect.sleep(backoff)
          }
          yield* told(order)
          yield* session.changes.pipe(
            Stream.filter((state) => state === "expired" || state === "closed"),
            Stream.runHead
          )
        })
      ).pipe(
        // A refused identity (credentials the cluster's nodes do not admit) is refused again: it ends the server.
        Effect.catchTag("CoordinationError", (e) =>
          e.reason._tag === "NotAuthorized" ? Effect.fail(e) : Effect.sleep(backoff)
        ),
        Effect.ensuring(told(undefined))
      )
    }
  })

/**
 * The server id a registration's node name holds, if it is one.
 *
 * @since 0.1.0
 */
export const serverIdOf = (name: string): Models.ServerId | undefined => {
  const n = Number(name)
  return Number.isSafeInteger(n) && n >= 0 && String(n) === name ? n : undefined
}

/**
 * The election a process observes (or runs) for the cluster of `namespace`: the coordinators' election, on the
 * cluster's session timeout and lag time.
 *
 * @since 0.1.0
 */
export const electionOf = (
  namespace: string,
  config: ReplicationConfig.ReplicationConfig
): Effect.Effect<Election.Shape, Election.ElectionError, Coordination.Coordination | Scope.Scope> =>
  CoordinationElection.make({
    namespace: namespace.replace(/^\/+/, ""),
    sessionTimeout: config.sessionTimeout,
    replicaLagTimeMax: config.replicaLagTimeMax
  })
