/**
 * Where a replicated cluster keeps its state in coordination, under one namespace: the live tablet servers'
 * ephemeral registrations (`<ns>/servers/ids/<id>`) and each tablet's assignment with its leader and ISR
 * (`<ns>/tablets/<table>:<bucket>`, JSON, written only by the controller, fenced by the coordinator epoch), and
 * how a tablet server registers.
 *
 * @since 0.1.0
 */
import {
  CoordinationError,
  CoordinationPaths,
  type CoordinationShape,
  Epoch,
  LeaderAndIsr,
  NoNode,
  ServerId,
  type Session,
  TabletId
} from "@strata/core"
import { Duration, Effect, Schedule, Schema, Stream } from "effect"
import type * as ControllerState from "./ControllerState.js"

/**
 * A cluster's paths.
 *
 * @since 0.1.0
 */
export interface ClusterPaths {
  readonly servers: string
  readonly server: (id: ServerId) => string
  readonly tablets: string
  readonly tablet: (tablet: TabletId) => string
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
    tablet: (t) => CoordinationPaths.join(tablets, `${encodeURIComponent(t.table)}:${t.bucket}`)
  }
}

/**
 * A tablet as coordination stores it.
 *
 * @since 0.1.0
 */
export const StoredTablet = Schema.Struct({
  tablet: TabletId,
  replicas: Schema.Array(ServerId),
  state: Schema.Literals(["NewTablet", "OnlineTablet", "OfflineTablet"]),
  leaderAndIsr: LeaderAndIsr,
  registrations: Schema.optional(Schema.Record(Schema.String, Schema.Int)),
  eligible: Schema.optional(Schema.Array(ServerId))
})

const TabletJson = Schema.fromJsonString(StoredTablet)
const encoder = new TextEncoder()
const decoder = new TextDecoder()

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
 * What a tablet server announces in its registration.
 *
 * @since 0.1.0
 */
export const Registration = Schema.Struct({
  address: Schema.String,
  rack: Schema.optional(Schema.String),
  /** Grows with every registration of the same id (a restart), so a watcher tells two lives apart. */
  registrationEpoch: Epoch
})

/**
 * Registers tablet server `id` under `paths` for as long as `session` lives (an ephemeral node). A registration of
 * another session fails with `NodeExists`; one of this session's own (a create whose answer was lost) is kept.
 * Returns the registration's creation order: the controller addresses this life of the server by it.
 *
 * @since 0.1.0
 */
export const register = (
  session: Session,
  paths: ClusterPaths,
  id: ServerId,
  registration: typeof Registration.Type
): Effect.Effect<number, CoordinationError> => {
  const path = paths.server(id)
  const data = encoder.encode(Schema.encodeSync(Schema.fromJsonString(Registration))(registration))
  // This session's node, read back: its creation order is the registration the controller addresses this life by.
  const own = (otherwise: CoordinationError) =>
    Effect.flatMap(session.exists(path), (stat) =>
      stat._tag === "Some" && stat.value.ephemeralOwner === session.id
        ? Effect.succeed(stat.value.createdOrder)
        : Effect.fail(otherwise)
    )
  return session.create(path, data, { mode: "ephemeral", createParents: true }).pipe(
    Effect.andThen(own(new CoordinationError({ reason: new NoNode({ path }) }))),
    Effect.catchIf(
      (e) => e.reason._tag === "NodeExists",
      (e) => own(e)
    )
  )
}

/**
 * Keeps tablet server `id` registered for as long as it runs: a session, the registration, and when the session
 * ends (it expired: the server was paused or cut off past its timeout), a new session and a new registration with a
 * higher registration epoch. A registration still held by the server's previous, dying session is waited out.
 *
 * @since 0.1.0
 */
export const keepRegistered = (
  coordination: CoordinationShape,
  paths: ClusterPaths,
  id: ServerId,
  options: {
    readonly address: string
    readonly rack?: string
    readonly sessionTimeout: Duration.Input
    /** The first registration's epoch; each later one adds one. */
    readonly firstEpoch: number
    readonly retryBackoffMs: number
    /** Told each registration as it is made (its creation order), and `undefined` when its session ends. */
    readonly onRegistered?: (registration: number | undefined) => Effect.Effect<void>
  }
): Effect.Effect<never> =>
  Effect.gen(function* () {
    let epoch = options.firstEpoch
    const told = (registration: number | undefined) => options.onRegistered?.(registration) ?? Effect.void
    const backoff = Schedule.spaced(Duration.millis(options.retryBackoffMs))
    while (true) {
      const registration = {
        address: options.address,
        registrationEpoch: epoch++,
        ...(options.rack === undefined ? {} : { rack: options.rack })
      }
      yield* Effect.scoped(
        Effect.gen(function* () {
          const session = yield* coordination.session({ timeout: options.sessionTimeout })
          // Another session's registration (this server's previous life) goes when that session expires; a lost
          // connection may come back. Anything else ends this session's attempt.
          let warned = false
          const order = yield* register(session, paths, id, registration).pipe(
            Effect.tapError((e) => {
              if (e.reason._tag !== "NodeExists" || warned) return Effect.void
              warned = true
              return Effect.logWarning(
                `server id ${id} is registered by another session: waiting for it to end (this server's previous life, or another server started with id ${id})`
              )
            }),
            Effect.retry({
              schedule: backoff,
              while: (e) => e.reason._tag === "NodeExists" || e.reason._tag === "ConnectionLoss"
            })
          )
          yield* told(order)
          yield* session.changes.pipe(
            Stream.filter((state) => state === "expired" || state === "closed"),
            Stream.runHead
          )
        })
      ).pipe(
        Effect.catch(() => Effect.sleep(Duration.millis(options.retryBackoffMs))),
        Effect.ensuring(told(undefined))
      )
    }
  })

/**
 * The server id a registration's node name holds, if it is one.
 *
 * @since 0.1.0
 */
export const serverIdOf = (name: string): ServerId | undefined => {
  const n = Number(name)
  return Number.isSafeInteger(n) && n >= 0 && String(n) === name ? n : undefined
}
