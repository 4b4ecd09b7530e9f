/**
 * A client of a Strata cluster: a producer and a reader of its tablets. It finds the controller and the tablet
 * servers through the `Coordination` in context (the election's leader node, the servers' registrations), asks
 * the controller for the tablets' leaders, and sends each tablet's records to its leader over `ReplicaRpc`.
 *
 * The producer batches: records sent to one tablet within `linger` of each other (up to `batchBytes`) go as one
 * append, one append in flight per tablet so that they land in the order sent. It is idempotent: every append
 * carries the client's producer id, the tablet's producer epoch and the sequence of its first record, so a retry
 * of an append already written (after a lost answer, a timeout, a new leader) is answered with the offsets it was
 * written at, never written twice. Retriable failures (`NotLeader`, `FencedEpoch`, `NotEnoughReplicas`, an
 * unreachable server, …) are retried after `retryBackoff` and a metadata refresh until `deliveryTimeout`.
 * A send succeeds only when its records were acknowledged as `acks` asks; one whose outcome is unknown fails with
 * `DeliveryUnknown`, and the tablet's next append starts a new producer epoch, so a late copy of the unknown one
 * can never be written after it.
 *
 * Reads go to the leader (on its data link when it has one) and return records up to its high watermark; a read at
 * the high watermark may wait there for records (`maxWaitMs`, a long-poll).
 *
 * @since 0.1.0
 */
import { type Coordination, type Election, HostPort, Models, OptionSchemas, Retry } from "@strata/core"
import { RebalanceService } from "@strata/rebalance"
import * as ReplicaManager from "../protocol/ReplicaManager.js"
import {
  Clock,
  Config,
  Context,
  Deferred,
  Duration,
  Effect,
  Layer,
  Schedule,
  Schema,
  type Scope,
  Semaphore
} from "effect"
import * as ClusterDirectory from "./ClusterDirectory.js"
import * as ClusterPaths from "../wire/ClusterPaths.js"
import { PeerUnreachable } from "../wire/Peers.js"
import * as PeerTls from "../wire/PeerTls.js"
import * as RemotePeers from "./RemotePeers.js"
import {
  CreateTableRefused,
  DeleteTableRefused,
  type ClusterModelReply,
  invalidRetention,
  type ClusterModelRequest,
  type Metadata,
  ReassignRefused,
  type RebalanceRequest,
  type TabletMetadata
} from "../wire/ReplicaRpc.js"
import * as ReplicationConfig from "../wire/ReplicationConfig.js"

const PositiveInt = OptionSchemas.PositiveInt
/** A duration option (any `Duration.Input`; a number is milliseconds) with its default. */
const durationWithDefault = (bound: "positive" | "nonNegative", value: Duration.Input) =>
  OptionSchemas.DurationOption(bound).pipe(Schema.withDecodingDefaultKey(Effect.succeed(value)))

/**
 * The client's options. A duration takes any `Duration.Input` (`"2 seconds"`, or a number of milliseconds).
 *
 * @since 0.1.0
 */
export const TabletClientOptions = Schema.Struct({
  /** The cluster's coordination namespace (`/strata`). */
  namespace: Schema.String.pipe(Schema.withDecodingDefaultKey(Effect.succeed("/strata"))),
  /** Acknowledgement asked of every append: 0, 1 or `all` (the default). */
  acks: ReplicaManager.ReplicaAcks.pipe(Schema.withDecodingDefaultKey(Effect.succeed<"all">("all"))),
  /** How long records wait for others to the same tablet before they are sent (5 millis; 0: at once). */
  linger: durationWithDefault("nonNegative", "5 millis"),
  /** The most bytes of records one append carries (256 KiB; a single larger send goes alone). */
  batchBytes: PositiveInt.pipe(Schema.withDecodingDefaultKey(Effect.succeed(262_144))),
  /** How long one call to a server may take (40 seconds: above the cluster's append timeout). */
  requestTimeout: durationWithDefault("positive", "40 seconds"),
  /** The pause before a failed call is retried (100 millis). */
  retryBackoff: durationWithDefault("positive", "100 millis"),
  /** How long a send may take, retries included, before it fails (120 seconds). */
  deliveryTimeout: durationWithDefault("positive", "120 seconds"),
  /** The cluster's replication settings, for the election's session timeouts (`ReplicationConfig`). */
  replication: ReplicationConfig.ReplicationConfig.pipe(Schema.withDecodingDefaultKey(Effect.succeed({}))),
  /**
   * Coordinators' `host:port`s to reach the cluster through instead of coordination (`makeBootstrap`): any of them
   * answers where the controller is.
   */
  bootstrap: Schema.optional(Schema.NonEmptyArray(HostPort.HostPortString)),
  /**
   * TLS to the cluster's servers and coordinators (`PeerTls`): the cluster's CA, and this client's certificate and key
   * when the servers require one (`mutual`, their default).
   */
  tls: Schema.optional(PeerTls.PeerTlsOptions)
})

/**
 * The options' input.
 *
 * @since 0.1.0
 */
export type TabletClientOptions = typeof TabletClientOptions.Encoded

/**
 * The tablet is not in the cluster's metadata.
 *
 * @since 0.1.0
 */
export class NoSuchTablet extends Schema.TaggedError<NoSuchTablet>()("NoSuchTablet", { tablet: Schema.String }) {
  /** @since 0.1.0 */
  override get message(): string {
    return `no tablet ${this.tablet} in the cluster`
  }
}

/**
 * The records may or may not have been written: retries ran out (`deliveryTimeout`) on a retriable failure,
 * `last`.
 *
 * @since 0.1.0
 */
export class DeliveryUnknown extends Schema.TaggedError<DeliveryUnknown>()("DeliveryUnknown", {
  tablet: Schema.String,
  last: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `${this.tablet}: not acknowledged within the delivery timeout, outcome unknown (last: ${this.last})`
  }
}

/**
 * A connection's TLS handshake failed as this client is configured (`tls`): a server certificate it does not accept
 * (another CA's, or naming another host), a server that requires a client certificate it does not have or accept, or
 * a TLS server this plaintext client reached. The call is not tried again, as that would not help. The refused try
 * sent nothing; an earlier try of the same call that failed otherwise may have been written, as after `DeliveryUnknown`.
 *
 * @since 0.1.0
 */
export class HandshakeFailed extends Schema.TaggedError<HandshakeFailed>()("HandshakeFailed", {
  target: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `the TLS handshake with ${this.target} failed: ${this.detail}`
  }
}

/** A call's unreachable peer as the client's error: `HandshakeFailed` when TLS refused it, else `DeliveryUnknown`. */
const unreachable = (what: string, e: PeerUnreachable): HandshakeFailed | DeliveryUnknown =>
  e.refused === true
    ? new HandshakeFailed({ target: e.target, detail: e.detail })
    : new DeliveryUnknown({ tablet: what, last: e.message })

/**
 * The records were not sent: the controller gave no producer id within the delivery timeout (`last`: why).
 *
 * @since 0.1.0
 */
export class NoProducerId extends Schema.TaggedError<NoProducerId>()("NoProducerId", {
  tablet: Schema.String,
  last: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `${this.tablet}: not sent, no producer id from the controller within the delivery timeout (last: ${this.last})`
  }
}

/**
 * The client was closed before the send was answered.
 *
 * @since 0.1.0
 */
export class ClientClosed extends Schema.TaggedError<ClientClosed>()("ClientClosed", { tablet: Schema.String }) {
  /** @since 0.1.0 */
  override get message(): string {
    return `${this.tablet}: the client closed before the records were acknowledged`
  }
}

/**
 * The send was dropped unsent: its `abandon` check said an earlier send it depends on failed.
 *
 * @since 0.1.0
 */
export class Abandoned extends Schema.TaggedError<Abandoned>()("Abandoned", { tablet: Schema.String }) {
  /** @since 0.1.0 */
  override get message(): string {
    return `${this.tablet}: dropped unsent after an earlier send failed`
  }
}

/**
 * Why a client call failed: a tablet the cluster does not have, an outcome left unknown, no producer id, a failure
 * sending again cannot mend (the server's `ReplicaError`), a table that could not be created or deleted, a tablet's
 * move (or its cancel) refused, the client was closed, or the send was abandoned.
 *
 * @since 0.1.0
 */
export const TabletClientErrorReason = Schema.Union([
  NoSuchTablet,
  DeliveryUnknown,
  HandshakeFailed,
  NoProducerId,
  ReplicaManager.ReplicaError,
  CreateTableRefused,
  DeleteTableRefused,
  ReassignRefused,
  RebalanceService.RebalanceCommandError,
  ClientClosed,
  Abandoned
])

/**
 * @since 0.1.0
 * @see TabletClientErrorReason
 */
export type TabletClientErrorReason = typeof TabletClientErrorReason.Type

/**
 * The error of every client call; `reason` says why.
 *
 * @since 0.1.0
 */
export class TabletClientError extends Schema.TaggedError<TabletClientError>()("TabletClientError", {
  reason: TabletClientErrorReason
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return this.reason.message
  }
}

/**
 * Where a send's records were written.
 *
 * @since 0.1.0
 */
export interface Sent {
  readonly baseOffset: number
  readonly lastOffset: number
}

/**
 * What `createTable` makes: `buckets` tablets of `replicationFactor` replicas each (the cluster's when not given),
 * kept for `retentionMs` or up to `retentionBytes` a replica when given (see `ReplicaRpc.CreateTableRequest`).
 *
 * @since 0.1.0
 */
export interface CreateTableOptions {
  readonly buckets: number
  readonly replicationFactor?: number | undefined
  readonly retentionMs?: number | undefined
  readonly retentionBytes?: number | undefined
}

/**
 * How a read waits: `maxWaitMs`, how long a read at the high watermark waits for records (0 or absent: not at all).
 *
 * @since 0.1.0
 */
export interface ReadOptions {
  readonly maxWaitMs?: number | undefined
}

/**
 * The client.
 *
 * @since 0.1.0
 */
export interface TabletClientShape {
  /** Sends records to the tablet, batched with others to it; succeeds once acknowledged as `acks` asks. */
  readonly send: (
    tablet: Models.TabletId,
    records: ReadonlyArray<ReplicaManager.TabletRecord>,
    acks?: ReplicaManager.ReplicaAcks
  ) => Effect.Effect<Sent, TabletClientError>
  /**
   * Queues records for the tablet at once and returns the wait for their acknowledgement: records queued one after
   * another (with the same `acks`) are appended in that order.
   */
  readonly enqueue: (
    tablet: Models.TabletId,
    records: ReadonlyArray<ReplicaManager.TabletRecord>,
    acks?: ReplicaManager.ReplicaAcks,
    /** Checked as the records are about to go: `true` drops them unsent (`Abandoned`). */
    abandon?: () => boolean
  ) => Effect.Effect<Effect.Effect<Sent, TabletClientError>>
  /**
   * Records of the tablet from `offset` (about `maxBytes`, at least one batch), up to the leader's high watermark.
   * With `options.maxWaitMs`, a read at the high watermark waits for records up to that long (at most the leader's
   * `fetchMaxWait`, and half of `requestTimeout`), answering as soon as some commit, or empty.
   */
  readonly read: (
    tablet: Models.TabletId,
    offset: number,
    maxBytes?: number,
    options?: ReadOptions
  ) => Effect.Effect<ReplicaManager.ReadResult, TabletClientError>
  /**
   * Deletes the tablet's records below `offset` (at most its high watermark: `OffsetOutOfRange` past it) on its
   * leader, answered once every in-sync replica's log starts there too; the leader's log start after. Sent again on
   * a leader change, as a delete done twice is done once.
   */
  readonly deleteRecords: (tablet: Models.TabletId, offset: number) => Effect.Effect<number, TabletClientError>
  /** The cluster's tablets (one table's, when named) and servers, as the controller holds them now. */
  readonly metadata: (table?: string) => Effect.Effect<Metadata, TabletClientError>
  /**
   * The cluster as a rebalance planner sees it (`ClusterModelReply`): servers, tablets with their replicas, leaders
   * and sizes in bytes (a tablet whose size no server told within `sizeTimeoutMs` has none; `sizesMissing` counts
   * them).
   */
  readonly clusterModel: (
    request?: typeof ClusterModelRequest.Type
  ) => Effect.Effect<ClusterModelReply, TabletClientError>
  /**
   * Creates a table: the controller assigns its replicas over the live servers. A name that is not
   * `[A-Za-z0-9._-]+` (or is `.`, `..`, or longer than 249) is refused before it is sent (`CreateTableRefused`).
   * `retentionMs` and `retentionBytes` are its retention (see `CreateTableRequest`); one that is not a whole number
   * ≥ 1 is refused before it is sent (`CreateTableRefused`, naming it).
   */
  readonly createTable: (
    table: string,
    options: CreateTableOptions
  ) => Effect.Effect<ReadonlyArray<typeof TabletMetadata.Type>, TabletClientError>
  /**
   * Deletes a table: its tablets lead no more and each replica deletes its data (a server that is down when it is
   * back); the name is free again once every replica has. How many tablets it had.
   */
  readonly deleteTable: (table: string) => Effect.Effect<number, TabletClientError>
  /** Moves leadership back to preferred replicas (those in the ISR) now; how many tablets moved. */
  readonly balanceLeaders: Effect.Effect<number, TabletClientError>
  /**
   * Preferred leader election for `tablets`: each whose preferred replica (its first) is live, in the ISR and
   * electable leads, whatever the leader imbalance; tablets unknown or led by it already are passed over. How many
   * moved.
   */
  readonly electPreferred: (tablets: ReadonlyArray<Models.TabletId>) => Effect.Effect<number, TabletClientError>
  /**
   * Moves a tablet's replicas to `replicas` (the first is the preferred leader; see `Reassignment`): the tablet as
   * the move left it, with `target` while the move is under way and without once it is done. A refusal fails with
   * `ReassignRefused` (its `reason` and one-line `detail`); asking again for the move under way is accepted.
   * `options.throttleBytesPerSec` caps how fast each server copies for the replicas the move adds (a whole number of
   * bytes a second ≥ 1; absent: no cap); asking again with another throttle, or none, makes it the move's.
   */
  /**
   * A rebalance request to the leading coordinator's rebalance service (`start` with goals, `status`, `pause`,
   * `resume`, `cancel`): the status after it, or `RebalanceCommandError` naming why it was refused.
   */
  readonly rebalance: (request: RebalanceRequest) => Effect.Effect<RebalanceService.Status, TabletClientError>
  readonly reassign: (
    tablet: Models.TabletId,
    replicas: ReadonlyArray<Models.ServerId>,
    options?: { readonly throttleBytesPerSec?: number | undefined }
  ) => Effect.Effect<typeof TabletMetadata.Type, TabletClientError>
  /**
   * Ends a tablet's move, back on its original replicas (the ones it added delete theirs): the tablet as written, or
   * `ReassignRefused` (`NotMoving` when no move is under way).
   */
  readonly cancelReassign: (tablet: Models.TabletId) => Effect.Effect<typeof TabletMetadata.Type, TabletClientError>
  /** The cluster's calls, for operators and checkers (a replica's own log, say). */
  readonly remote: RemotePeers.RemotePeers
}

/**
 * The `TabletClient` service key.
 *
 * @since 0.1.0
 */
export class TabletClient extends Context.Service<TabletClient, TabletClientShape>()("@strata/replica/TabletClient") {}

/** One send waiting in a tablet's queue. */
interface Queued {
  readonly records: ReadonlyArray<ReplicaManager.TabletRecord>
  readonly acks: ReplicaManager.ReplicaAcks
  readonly abandon: (() => boolean) | undefined
  readonly bytes: number
  readonly done: Deferred.Deferred<Sent, TabletClientError>
}

/** A tablet's producer side: its queue, its sender, and its place in the producer's sequence. */
interface Lane {
  readonly key: string
  readonly tablet: Models.TabletId
  readonly queue: Array<Queued>
  bytes: number
  /** Completed when the queue gets its first send, or reaches `batchBytes`. */
  wake: Deferred.Deferred<void>
  /** Completed when the queue reaches `batchBytes` while the sender lingers. */
  full: Deferred.Deferred<void>
  epoch: number
  sequence: number
}

/** Roughly what a record costs in an append. */
const recordBytes = (r: ReplicaManager.TabletRecord): number =>
  (r.key?.length ?? 0) + r.value.length + 24 + r.headers.reduce((n, h) => n + h.key.length + h.value.length + 8, 0)

/** A failure worth sending again: the server's own verdict, or the call not reaching it. */
const retriable = (e: ReplicaManager.ReplicaError | PeerUnreachable | NoSuchTablet): boolean =>
  e._tag === "PeerUnreachable" ? e.refused !== true : e._tag === "NoSuchTablet" || e.retryable

/** A running client: what its functions share. */
/** The decoded options. */
type Options = typeof TabletClientOptions.Type

interface Client {
  readonly o: Options
  readonly scope: Scope.Scope
  readonly remote: RemotePeers.RemotePeers
  /** The leaders as the controller last told them, asked again after a failure (at most once a backoff). */
  leaders: Map<string, typeof TabletMetadata.Type>
  refreshedAt: number
  /**
   * The producer id, asked of the controller on the first send: unique in the cluster (Kafka's InitProducerId), so
   * no tablet takes this producer's first batches for another's retries.
   */
  producerId: number | undefined
  readonly idLock: Semaphore.Semaphore
  /** The producer: one lane per tablet, each with a sender fiber draining its queue one append at a time. */
  readonly lanes: Map<string, Lane>
  closed: boolean
}

/**
 * A client on the `Coordination` in context; its connections close with the scope.
 *
 * @since 0.1.0
 */
export const make = (
  options: TabletClientOptions = {}
): Effect.Effect<
  TabletClientShape,
  ReplicationConfig.InvalidReplicaOptions | Coordination.CoordinationError | Election.ElectionError,
  Coordination.Coordination | Scope.Scope
> =>
  Effect.gen(function* () {
    const o = yield* OptionSchemas.decodeOptions(TabletClientOptions, { exact: true })(options).pipe(
      Effect.mapError(ReplicationConfig.invalidOptions)
    )
    const transport = yield* transportOf(o)
    if (o.bootstrap !== undefined) return yield* bootstrapped(o, o.bootstrap, transport)
    const election = yield* ClusterPaths.electionOf(o.namespace, o.replication)
    const directory = yield* ClusterDirectory.make(ClusterPaths.make(o.namespace), election, {
      retryBackoff: o.retryBackoff
    })
    return yield* makeWith(o, directory, transport)
  })

/** The TLS transport the options ask for (`undefined`: the `RemotePeers.Transport` in context, TCP by default). */
const transportOf = (o: Options) =>
  o.tls === undefined ? Effect.succeed(undefined) : Effect.map(PeerTls.make(o.tls), RemotePeers.tls)

/**
 * A client that reaches the cluster through the coordinators at `options.bootstrap` (`host:port`s; any that answers
 * tells where the controller is), with no coordination session: an operator's tool needs only the coordinators'
 * addresses (Kafka's tools take `--bootstrap-server` for this, KIP-555). The tablet servers are found in the
 * controller's metadata.
 *
 * @since 0.1.0
 */
export const makeBootstrap = (
  options: Omit<TabletClientOptions, "bootstrap"> & { readonly bootstrap: ReadonlyArray<string> }
): Effect.Effect<TabletClientShape, ReplicationConfig.InvalidReplicaOptions, Scope.Scope> =>
  Effect.gen(function* () {
    const o = yield* OptionSchemas.decodeOptions(TabletClientOptions, { exact: true })(options).pipe(
      Effect.mapError(ReplicationConfig.invalidOptions)
    )
    return yield* bootstrapped(o, o.bootstrap ?? [], yield* transportOf(o))
  })

/** A client on a bootstrap directory, which learns the servers from every metadata the client reads. */
const bootstrapped = (
  o: Options,
  addresses: ReadonlyArray<string>,
  transport: RemotePeers.TransportShape | undefined
) =>
  Effect.gen(function* () {
    const directory = ClusterDirectory.bootstrap(addresses)
    return yield* makeWith(o, directory, transport, directory.learn)
  })

/**
 * The client over `directory`, its calls on `transport` (the one in context when `undefined`); `learn` is told the
 * servers of every metadata the controller answers.
 */
const makeWith = (
  o: Options,
  directory: ClusterDirectory.ClusterDirectory,
  transport: RemotePeers.TransportShape | undefined,
  learn?: (servers: ReadonlyArray<ClusterDirectory.LearnedServer>) => void
): Effect.Effect<TabletClientShape, never, Scope.Scope> =>
  Effect.gen(function* () {
    const made = RemotePeers.make({
      locate: directory.locate,
      locateData: directory.locateData,
      controller: directory.controller,
      requestTimeout: o.requestTimeout
    })
    const remote = yield* transport === undefined
      ? made
      : made.pipe(Effect.provideService(RemotePeers.Transport, transport))
    const c: Client = {
      o,
      scope: yield* Effect.scope,
      remote:
        learn === undefined
          ? remote
          : {
              ...remote,
              admin: {
                ...remote.admin,
                metadata: (table) =>
                  Effect.tap(remote.admin.metadata(table), (m) => Effect.sync(() => learn(m.servers)))
              }
            },
      leaders: new Map(),
      refreshedAt: Number.NEGATIVE_INFINITY,
      producerId: undefined,
      idLock: Semaphore.makeUnsafe(1),
      lanes: new Map(),
      closed: false
    }
    // A closing client fails what is still queued: no send waits for ever.
    yield* Effect.addFinalizer(() =>
      Effect.suspend(() => {
        c.closed = true
        return Effect.forEach(
          [...c.lanes.values()].flatMap((lane) => lane.queue.splice(0).map((q) => [lane, q] as const)),
          ([lane, q]) => Deferred.fail(q.done, fail(new ClientClosed({ tablet: lane.key }))),
          { discard: true }
        )
      })
    )
    return shapeOf(c)
  })

/** A client failure for `reason`. */
const fail = (reason: TabletClientErrorReason) => new TabletClientError({ reason })

/** The client as its users see it. */
const shapeOf = (c: Client): TabletClientShape => {
  const { o, remote } = c
  const deadlineOf = Effect.map(Clock.currentTimeMillis, (now) => now + Duration.toMillis(o.deliveryTimeout))
  const admin = <A, E extends TabletClientErrorReason>(what: string, call: Effect.Effect<A, E | PeerUnreachable>) =>
    Effect.flatMap(deadlineOf, (deadline) => retryUntil(deadline, o.retryBackoff, call, what)).pipe(
      Effect.mapError(fail)
    )
  const enqueueOn: TabletClientShape["enqueue"] = (tablet, records, acks, abandon) =>
    enqueue(c, tablet, records, acks, abandon)
  return {
    send: (tablet, records, acks) => Effect.flatten(enqueueOn(tablet, records, acks)),
    enqueue: enqueueOn,
    read: (tablet, offset, maxBytes = 1_048_576, options) => {
      // A wait the leader takes whole still answers within the call's timeout: half of it at most.
      const wait = Math.min(Math.floor(options?.maxWaitMs ?? 0), Math.floor(Duration.toMillis(o.requestTimeout) / 2))
      const request = wait > 0 ? { tablet, offset, maxBytes, maxWaitMs: wait } : { tablet, offset, maxBytes }
      return Effect.flatMap(deadlineOf, (deadline) =>
        onLeader(c, tablet, deadline, (server) => server.read(request))
      ).pipe(Effect.mapError(fail))
    },
    deleteRecords: (tablet, offset) =>
      Effect.flatMap(deadlineOf, (deadline) =>
        onLeader(c, tablet, deadline, (server) => server.deleteRecords({ tablet, offset }))
      ).pipe(
        Effect.map((result) => result.logStartOffset),
        Effect.mapError(fail)
      ),
    metadata: (table) => admin("the metadata", remote.admin.metadata(table)),
    clusterModel: (request) => admin("the cluster model", remote.admin.clusterModel(request)),
    createTable: (table, create) => {
      // Refused here before it is sent, as the controller refuses it: `ClusterPaths.InvalidTableName`'s message.
      const invalid = ClusterPaths.invalidTableName(table)
      if (invalid !== undefined) return Effect.fail(fail(new CreateTableRefused({ detail: invalid.message })))
      const badRetention = invalidRetention(create)
      if (badRetention !== undefined) return Effect.fail(fail(new CreateTableRefused({ detail: badRetention })))
      return admin(
        `creating ${table}`,
        remote.admin.createTable({
          table,
          buckets: create.buckets,
          ...(create.replicationFactor === undefined ? {} : { replicationFactor: create.replicationFactor }),
          ...(create.retentionMs === undefined ? {} : { retentionMs: create.retentionMs }),
          ...(create.retentionBytes === undefined ? {} : { retentionBytes: create.retentionBytes })
        })
      )
    },
    deleteTable: (table) => admin(`deleting ${table}`, remote.admin.deleteTable(table)),
    balanceLeaders: admin("balancing leaders", remote.admin.balanceLeaders),
    electPreferred: (tablets) =>
      admin(
        `electing the preferred leaders of ${tablets.map(Models.tabletKey).join(", ")}`,
        remote.admin.electPreferred(tablets)
      ),
    reassign: (tablet, replicas, options) =>
      admin(`moving ${Models.tabletKey(tablet)}`, remote.admin.reassign(tablet, replicas, options)),
    cancelReassign: (tablet) => admin(`cancelling the move of ${Models.tabletKey(tablet)}`, cancelOnce(c, tablet)),
    rebalance: (request) => admin(`rebalance ${request.action}`, remote.admin.rebalance(request)),
    remote
  }
}

/**
 * A cancel that may be asked again: once an attempt's answer was lost (the cancel may have been done), a later
 * `NotMoving` is the cancel done, answered with the tablet as it is.
 */
const cancelOnce = (c: Client, tablet: Models.TabletId) => {
  let unsure = false
  return Effect.suspend(() => c.remote.admin.cancelReassign(tablet)).pipe(
    Effect.tapError((e) =>
      Effect.sync(() => {
        if (e._tag === "PeerUnreachable") unsure = true
      })
    ),
    Effect.catchIf(
      (e) => unsure && e._tag === "ReassignRefused" && e.reason._tag === "NotMoving",
      () =>
        Effect.flatMap(c.remote.admin.metadata(tablet.table), (m) => {
          const now = m.tablets.find((t) => Models.tabletKey(t.tablet) === Models.tabletKey(tablet))
          return now === undefined
            ? Effect.fail(new PeerUnreachable({ target: "controller", detail: `${Models.tabletKey(tablet)} is gone` }))
            : Effect.succeed(now)
        })
    )
  )
}

/** Asks the controller for the leaders again, at most once a backoff. */
const refresh = (c: Client) =>
  Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    if (now - c.refreshedAt < Duration.toMillis(c.o.retryBackoff)) return
    c.refreshedAt = now
    const metadata = yield* c.remote.admin.metadata()
    c.leaders = new Map(metadata.tablets.map((t) => [Models.tabletKey(t.tablet), t]))
  })

const leaderOf = (c: Client, tablet: Models.TabletId) =>
  Effect.gen(function* () {
    const key = Models.tabletKey(tablet)
    if (!c.leaders.has(key)) yield* refresh(c)
    const found = c.leaders.get(key)
    if (found === undefined) return yield* new NoSuchTablet({ tablet: key })
    if (found.leader === null) {
      return yield* new PeerUnreachable({ target: `the leader of ${key}`, detail: "the tablet has no leader" })
    }
    return c.remote.server(found.leader)
  })

/**
 * Retries `self` every `backoff` while its failure is `retriable`, until the time `deadline` (ms on the Clock): the
 * last failure is the error then.
 */
const untilDeadline = <A, E>(
  self: Effect.Effect<A, E>,
  deadline: number,
  backoff: Duration.Duration,
  retriable: (e: E) => boolean
): Effect.Effect<A, E> =>
  Effect.flatMap(Clock.currentTimeMillis, (now) =>
    Retry.retry(self, { schedule: Schedule.spaced(backoff), deadline: Math.max(0, deadline - now), while: retriable })
  )

/** Runs `call` on the tablet's leader, again after a refresh while it fails retriably, until `deadline`. */
const onLeader = <A>(
  c: Client,
  tablet: Models.TabletId,
  deadline: number,
  call: (server: RemotePeers.ServerCalls) => Effect.Effect<A, ReplicaManager.ReplicaError | PeerUnreachable>
): Effect.Effect<A, ReplicaManager.ReplicaError | NoSuchTablet | DeliveryUnknown | HandshakeFailed> =>
  untilDeadline(
    Effect.flatMap(leaderOf(c, tablet), call).pipe(
      // The leader may have moved: look again before the next try.
      Effect.tapError((e) => (retriable(e) ? Effect.ignore(refresh(c)) : Effect.void))
    ),
    deadline,
    c.o.retryBackoff,
    retriable
  ).pipe(
    Effect.catch(
      (e): Effect.Effect<never, ReplicaManager.ReplicaError | NoSuchTablet | DeliveryUnknown | HandshakeFailed> =>
        e._tag === "PeerUnreachable"
          ? Effect.fail(unreachable(Models.tabletKey(tablet), e))
          : !retriable(e) || e._tag === "NoSuchTablet"
            ? Effect.fail(e)
            : Effect.fail(new DeliveryUnknown({ tablet: Models.tabletKey(tablet), last: e.message }))
    )
  )

/** The client's producer id: asked of the controller once (one question at a time), until `deadline`. */
const producerIdFor = (c: Client, tablet: string, deadline: number): Effect.Effect<number, NoProducerId> =>
  Effect.suspend(() =>
    c.producerId !== undefined
      ? Effect.succeed(c.producerId)
      : Semaphore.withPermit(
          c.idLock,
          Effect.suspend(() =>
            // A caller that waited for the lock may find the id asked for already.
            c.producerId !== undefined
              ? Effect.succeed(c.producerId)
              : untilDeadline(c.remote.admin.initProducerId, deadline, c.o.retryBackoff, () => true).pipe(
                  Effect.tap((id) =>
                    Effect.sync(() => {
                      c.producerId = id
                    })
                  ),
                  Effect.mapError((e) => new NoProducerId({ tablet, last: e.message }))
                )
          )
        )
  )

/** Appends one batch of queued sends as the lane's producer, completing each send with its offsets or the failure. */
const sendBatch = (c: Client, lane: Lane, batch: ReadonlyArray<Queued>) =>
  Effect.gen(function* () {
    const records = batch.length === 1 ? batch[0]!.records : batch.flatMap((q) => q.records)
    const deadline = (yield* Clock.currentTimeMillis) + Duration.toMillis(c.o.deliveryTimeout)
    const id = yield* Effect.result(producerIdFor(c, lane.key, deadline))
    if (id._tag === "Failure") {
      const error = fail(id.failure)
      yield* Effect.forEach(batch, (q) => Deferred.fail(q.done, error), { discard: true })
      return
    }
    const attempt = Effect.suspend(() => {
      const producer = { id: id.success, epoch: lane.epoch, sequence: lane.sequence }
      return Effect.result(
        onLeader(c, lane.tablet, deadline, (server) =>
          server.append({ tablet: lane.tablet, records, acks: batch[0]!.acks, producer })
        )
      )
    })
    let result = yield* attempt
    // The tablet knows nothing of this producer although the lane wrote to it before: the tablet was deleted and
    // created again (or lost every record of the producer). Nothing of this append is there, so it goes again as
    // the start of a new producer epoch (KIP-360).
    if (result._tag === "Failure" && unknownProducer(result.failure) && lane.sequence > 0) {
      lane.epoch += 1
      lane.sequence = 0
      result = yield* attempt
    }
    if (result._tag === "Failure") {
      // Nothing of this append may be written after what comes next: the lane moves to a new producer epoch.
      lane.epoch += 1
      lane.sequence = 0
      const error = fail(result.failure)
      yield* Effect.forEach(batch, (q) => Deferred.fail(q.done, error), { discard: true })
      return
    }
    lane.sequence += records.length
    const written: ReplicaManager.AppendResult = result.success
    let offset = written.baseOffset
    for (const q of batch) {
      yield* Deferred.succeed(q.done, { baseOffset: offset, lastOffset: offset + q.records.length - 1 })
      offset += q.records.length
    }
  })

/**
 * Takes the next batch off the lane's queue: up to `batchBytes` (always the first send, however large), of one
 * acks (a send asking another ends the batch). Sends whose caller abandoned them are failed `Abandoned`, not sent.
 */
const takeBatch = (c: Client, lane: Lane): ReadonlyArray<Queued> => {
  let bytes = 0
  let n = 0
  while (
    n < lane.queue.length &&
    (n === 0 || (bytes + lane.queue[n]!.bytes <= c.o.batchBytes && lane.queue[n]!.acks === lane.queue[0]!.acks))
  ) {
    bytes += lane.queue[n]!.bytes
    n++
  }
  const taken = lane.queue.splice(0, n)
  lane.bytes -= bytes
  lane.wake = Deferred.makeUnsafe<void>()
  if (lane.queue.length > 0) Deferred.doneUnsafe(lane.wake, Effect.void)
  const batch = taken.filter((q) => q.abandon?.() !== true)
  for (const q of taken) {
    if (!batch.includes(q)) Deferred.doneUnsafe(q.done, Effect.fail(fail(new Abandoned({ tablet: lane.key }))))
  }
  return batch
}

/** A lane's sender: waits for sends, lingers for more (until a full batch), and sends one batch at a time. */
const drain = (c: Client, lane: Lane): Effect.Effect<never> =>
  Effect.gen(function* () {
    while (true) {
      yield* Deferred.await(lane.wake)
      if (Duration.isGreaterThan(c.o.linger, Duration.zero) && lane.bytes < c.o.batchBytes) {
        lane.full = Deferred.makeUnsafe<void>()
        yield* Effect.raceFirst(Effect.sleep(c.o.linger), Deferred.await(lane.full))
      }
      const batch = takeBatch(c, lane)
      if (batch.length === 0) continue
      yield* sendBatch(c, lane, batch).pipe(
        Effect.onInterrupt(() =>
          Effect.forEach(batch, (q) => Deferred.fail(q.done, fail(new ClientClosed({ tablet: lane.key }))), {
            discard: true
          })
        )
      )
    }
  })

/** The tablet's lane, made (with its sender running) on first use. */
const laneOf = (c: Client, tablet: Models.TabletId) =>
  Effect.gen(function* () {
    const key = Models.tabletKey(tablet)
    const known = c.lanes.get(key)
    if (known !== undefined) return known
    const lane: Lane = {
      key,
      tablet: { table: tablet.table, bucket: tablet.bucket },
      queue: [],
      bytes: 0,
      wake: Deferred.makeUnsafe<void>(),
      full: Deferred.makeUnsafe<void>(),
      epoch: 0,
      sequence: 0
    }
    c.lanes.set(key, lane)
    yield* Effect.forkIn(drain(c, lane), c.scope)
    return lane
  })

const enqueue = (
  c: Client,
  tablet: Models.TabletId,
  records: ReadonlyArray<ReplicaManager.TabletRecord>,
  acks: ReplicaManager.ReplicaAcks = c.o.acks,
  abandon?: () => boolean
): Effect.Effect<Effect.Effect<Sent, TabletClientError>> =>
  Effect.gen(function* () {
    if (c.closed) return Effect.fail(fail(new ClientClosed({ tablet: Models.tabletKey(tablet) })))
    const lane = yield* laneOf(c, tablet)
    const done = yield* Deferred.make<Sent, TabletClientError>()
    const bytes = records.reduce((n, r) => n + recordBytes(r), 0)
    lane.queue.push({ records, acks, abandon, bytes, done })
    lane.bytes += bytes
    if (lane.queue.length === 1 || lane.bytes >= c.o.batchBytes) Deferred.doneUnsafe(lane.wake, Effect.void)
    if (lane.bytes >= c.o.batchBytes) Deferred.doneUnsafe(lane.full, Effect.void)
    return Deferred.await(done)
  })

/** Whether a tablet refused an append for not knowing its producer. */
const unknownProducer = (e: ReplicaManager.ReplicaError | NoSuchTablet | DeliveryUnknown | HandshakeFailed) =>
  e._tag === "ReplicaError" && e.reason._tag === "ProducerRefused" && e.reason.kind === "UnknownProducer"

/** `call` again after the backoff while the controller cannot be reached, until `deadline`. */
const retryUntil = <A, E>(
  deadline: number,
  backoff: Duration.Duration,
  call: Effect.Effect<A, E | PeerUnreachable>,
  what: string
): Effect.Effect<A, Exclude<E, PeerUnreachable> | DeliveryUnknown | HandshakeFailed> =>
  untilDeadline(call, deadline, backoff, (e) => e instanceof PeerUnreachable && e.refused !== true).pipe(
    Effect.catch(
      (e): Effect.Effect<never, Exclude<E, PeerUnreachable> | DeliveryUnknown | HandshakeFailed> =>
        e instanceof PeerUnreachable ? Effect.fail(unreachable(what, e)) : Effect.fail(e as Exclude<E, PeerUnreachable>)
    )
  )

/**
 * The client as a layer on the `Coordination` in context.
 *
 * @since 0.1.0
 */
export const layer = (
  options: TabletClientOptions = {}
): Layer.Layer<
  TabletClient,
  ReplicationConfig.InvalidReplicaOptions | Coordination.CoordinationError | Election.ElectionError,
  Coordination.Coordination
> => Layer.effect(TabletClient, make(options))

/**
 * Like `layer`, with the options read from configuration.
 *
 * @since 0.1.0
 */
export const layerConfig = (
  config: Config.Wrap<TabletClientOptions>
): Layer.Layer<
  TabletClient,
  | ReplicationConfig.InvalidReplicaOptions
  | Coordination.CoordinationError
  | Election.ElectionError
  | Config.ConfigError,
  Coordination.Coordination
> => Layer.unwrap(Effect.map(Config.unwrap(config), layer))
