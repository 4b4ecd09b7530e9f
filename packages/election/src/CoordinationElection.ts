/**
 * The fenced election recipe on any `Coordination` backend (ARCHITECTURE §5):
 * ephemeral-sequential candidates, the lowest leads after verifying it owns
 * that node, the epoch node is bumped with a versioned compare-and-set, and the
 * leader registers an ephemeral leader node in a transaction that checks the
 * epoch it wrote. Every other candidate watches only its predecessor.
 *
 * @since 0.1.0
 */
import {
  type Candidate,
  Coordination,
  type CoordinationError,
  coordinationError,
  Election,
  ElectionCoordinationFailed,
  ElectionError,
  type ElectionShape,
  FencedEpoch,
  LeaderInfo,
  type Leadership,
  type LeadershipEnd,
  type Node,
  type Op,
  type OpResult,
  op,
  SessionClosed
} from "@strata/core"
import type { Duration } from "effect"
import { Config, Context, Deferred, Effect, Layer, Option, Schema, type Scope, Stream } from "effect"

/** Options of the election. */
export interface CoordinationElectionOptions {
  /** The namespace: nodes live under `/<namespace>/coordinators`. */
  readonly namespace: string
  /** Timeout of every session the election opens (default: the backend's). */
  readonly sessionTimeout?: Duration.Input
}

/** The `CoordinationElection` service key; its layer also provides `Election`. */
export class CoordinationElection extends Context.Service<CoordinationElection, ElectionShape>()(
  "@strata/election/CoordinationElection"
) {}

const encoder = new TextEncoder()
const decoder = new TextDecoder()
const bytes = (s: string): Uint8Array => encoder.encode(s)
const text = (b: Uint8Array): string => decoder.decode(b)

const decodeLeader = Schema.decodeUnknownOption(LeaderInfo)

/** Parses a leader node's data, `None` when absent or malformed. */
const parseLeader = (node: Option.Option<Node>): Option.Option<LeaderInfo> =>
  Option.flatMap(node, (n) => {
    try {
      return decodeLeader(JSON.parse(text(n.data)))
    } catch {
      return Option.none()
    }
  })

const parseEpoch = (data: Uint8Array): number => {
  const n = Number(text(data))
  return Number.isSafeInteger(n) && n >= 0 ? n : 0
}

const failed = (cause: CoordinationError): ElectionError =>
  new ElectionError({ reason: new ElectionCoordinationFailed({ cause }) })

/** The paths of a namespace. */
const pathsOf = (namespace: string) => {
  const ns = namespace.replace(/^\/+|\/+$/g, "")
  const base = `/${ns}/coordinators`
  return {
    base,
    ids: `${base}/ids`,
    election: `${base}/election`,
    epoch: `${base}/epoch`,
    leader: `${base}/leader`
  } as const
}

/**
 * Builds the election. Opens one long-lived observer session in the scope
 * (for `leader` and `changes`); every campaign opens its own session.
 */
export const make = (
  options: CoordinationElectionOptions
): Effect.Effect<ElectionShape, ElectionError, Coordination | Scope.Scope> =>
  Effect.gen(function* () {
    const coordination = yield* Coordination
    const paths = pathsOf(options.namespace)
    const sessionOptions = options.sessionTimeout === undefined ? {} : { timeout: options.sessionTimeout }
    const observer = yield* coordination.session(sessionOptions).pipe(Effect.mapError(failed))

    const leader: ElectionShape["leader"] = observer.exists(paths.leader).pipe(
      Effect.flatMap((stat) =>
        Option.isNone(stat) ? Effect.succeed(Option.none<Node>()) : Effect.map(observer.get(paths.leader), Option.some)
      ),
      Effect.catchTag("CoordinationError", (e) =>
        e.reason._tag === "NoNode" ? Effect.succeed(Option.none<Node>()) : Effect.fail(e)
      ),
      Effect.map(parseLeader),
      Effect.mapError(failed)
    )

    const changes: ElectionShape["changes"] = Stream.unwrap(
      Effect.sync(() => {
        let pending: Effect.Effect<unknown, CoordinationError> | undefined
        return Stream.fromEffectRepeat(
          Effect.gen(function* () {
            if (pending !== undefined) yield* pending
            const watch = yield* observer.watchNode(paths.leader)
            pending = watch.changed
            return parseLeader(watch.value)
          }).pipe(Effect.mapError(failed))
        ).pipe(
          Stream.changesWith(
            Option.makeEquivalence(
              (a: LeaderInfo, b: LeaderInfo) =>
                a.serverId === b.serverId && a.epoch === b.epoch && a.address === b.address
            )
          )
        )
      })
    )

    /** The current epoch, read through the observer (0 when unknown). */
    const currentEpoch = observer.get(paths.epoch).pipe(
      Effect.map((n) => parseEpoch(n.data)),
      Effect.orElseSucceed(() => 0)
    )

    const campaign = (candidate: Candidate): Effect.Effect<Leadership, ElectionError, Scope.Scope> =>
      Effect.gen(function* () {
        const session = yield* coordination.session(sessionOptions)
        yield* session
          .create(`${paths.ids}/${candidate.serverId}`, bytes(JSON.stringify(candidate)), {
            mode: "ephemeral",
            createParents: true
          })
          .pipe(
            Effect.catchTag("CoordinationError", (e) => (e.reason._tag === "NodeExists" ? Effect.void : Effect.fail(e)))
          )

        const createCandidate = (attempt: number): Effect.Effect<string, CoordinationError> =>
          session
            .create(`${paths.election}/candidate_`, bytes(String(candidate.serverId)), {
              mode: "ephemeral-sequential",
              createParents: true
            })
            .pipe(
              // Curator bug 724: the parent may vanish between creating it and the node; recreate and retry.
              Effect.catchTag("CoordinationError", (e) =>
                e.reason._tag === "NoNode" && attempt < 5 ? createCandidate(attempt + 1) : Effect.fail(e)
              ),
              Effect.tap((path) => Effect.logInfo(`candidate node created ${path}`))
            )

        let ours = yield* createCandidate(0)
        const nameOf = (p: string) => p.slice(p.lastIndexOf("/") + 1)

        /** Bumps the epoch and registers the leader; `undefined` when another candidate got there first. */
        const fence = Effect.gen(function* () {
          const epochNode = yield* session.get(paths.epoch).pipe(
            Effect.catchTag("CoordinationError", (e) =>
              e.reason._tag === "NoNode"
                ? session.create(paths.epoch, bytes("0"), { createParents: true }).pipe(
                    Effect.catchTag("CoordinationError", (e2) =>
                      e2.reason._tag === "NodeExists" ? Effect.void : Effect.fail(e2)
                    ),
                    Effect.andThen(session.get(paths.epoch))
                  )
                : Effect.fail(e)
            )
          )
          const epoch = parseEpoch(epochNode.data) + 1
          const written = yield* session.set(paths.epoch, bytes(String(epoch)), epochNode.stat.version).pipe(
            Effect.map(Option.some),
            Effect.catchTag("CoordinationError", (e) =>
              e.reason._tag === "BadVersion" ? Effect.succeed(Option.none()) : Effect.fail(e)
            )
          )
          if (Option.isNone(written)) return undefined
          const version = written.value.version
          const info: LeaderInfo = { serverId: candidate.serverId, epoch, address: candidate.address }
          while (true) {
            const registered = yield* session
              .multi([
                op.check(paths.epoch, version),
                op.create(paths.leader, bytes(JSON.stringify(info)), "ephemeral")
              ])
              .pipe(
                Effect.as("ok" as const),
                Effect.catchTag("CoordinationError", (e) =>
                  e.opIndex === 0
                    ? Effect.succeed("fenced" as const)
                    : e.opIndex === 1 && e.reason._tag === "NodeExists"
                      ? Effect.succeed("stale" as const)
                      : Effect.fail(e)
                )
              )
            if (registered === "ok") return { epoch, version, info }
            if (registered === "fenced") return undefined
            // A stale leader node of a dying session: wait for it to go, then retry.
            const watch = yield* session.watchNode(paths.leader)
            if (Option.isSome(watch.value)) {
              if (watch.value.value.stat.ephemeralOwner === session.id) {
                yield* session.delete(paths.leader).pipe(Effect.ignore)
              } else {
                yield* watch.changed
              }
            }
          }
        })

        const won = yield* Effect.gen(function* () {
          while (true) {
            const names = (yield* session.children(paths.election)).filter((n) => n.startsWith("candidate_")).sort()
            const index = names.indexOf(nameOf(ours))
            if (index < 0) {
              const state = yield* session.state
              if (state === "expired" || state === "closed") {
                return yield* Effect.fail(coordinationError(new SessionClosed({ session: session.id })))
              }
              ours = yield* createCandidate(0)
              continue
            }
            if (index === 0) {
              // Curator bug 696: verify the lowest node is really ours before acting.
              const stat = yield* session.exists(`${paths.election}/${names[0]}`)
              if (Option.isNone(stat)) continue
              if (stat.value.ephemeralOwner !== session.id) {
                yield* session.delete(ours).pipe(Effect.ignore)
                ours = yield* createCandidate(0)
                continue
              }
              const result = yield* fence
              if (result !== undefined) return result
              yield* Effect.sleep("20 millis")
              continue
            }
            const watch = yield* session.watchNode(`${paths.election}/${names[index - 1]}`)
            if (Option.isSome(watch.value)) yield* watch.changed
          }
        })

        yield* Effect.logInfo(`Became coordinator leader with epoch ${won.epoch}`)

        const lost = yield* Deferred.make<LeadershipEnd>()
        // The session ending (other than by resigning) loses the leadership.
        yield* session.changes.pipe(
          Stream.runForEach((state) =>
            state === "expired" || state === "closed" ? Deferred.succeed(lost, { _tag: "SessionLost" }) : Effect.void
          ),
          Effect.andThen(Deferred.succeed(lost, { _tag: "SessionLost" })),
          Effect.forkScoped
        )
        // A higher epoch fences this leadership.
        yield* Effect.gen(function* () {
          while (true) {
            const watch = yield* session.watchNode(paths.epoch)
            if (Option.isSome(watch.value)) {
              const current = parseEpoch(watch.value.value.data)
              if (current > won.epoch || watch.value.value.stat.version !== won.version) {
                return yield* Deferred.succeed(lost, { _tag: "Fenced", epoch: Math.max(current, won.epoch) })
              }
            } else {
              return yield* Deferred.succeed(lost, { _tag: "Fenced", epoch: won.epoch })
            }
            yield* watch.changed
          }
        }).pipe(
          Effect.catch(() => Deferred.succeed(lost, { _tag: "SessionLost" })),
          Effect.forkScoped
        )
        // Closing the scope resigns: runs before the watchers stop and the session closes.
        yield* Effect.addFinalizer(() => Deferred.succeed(lost, { _tag: "Resigned" }))

        const fenced = (ops: ReadonlyArray<Op>): Effect.Effect<ReadonlyArray<OpResult>, ElectionError> =>
          session.multi([op.check(paths.epoch, won.version), ...ops]).pipe(
            Effect.map((results) => results.slice(1)),
            Effect.catchTag("CoordinationError", (e) =>
              Effect.gen(function* () {
                const isFence = e.opIndex === 0 && (e.reason._tag === "BadVersion" || e.reason._tag === "NoNode")
                const sessionGone = e.reason._tag === "SessionClosed" || e.reason._tag === "SessionExpired"
                if (isFence || sessionGone) {
                  const current = yield* currentEpoch
                  if (isFence || current > won.epoch) {
                    return yield* Effect.fail(
                      new ElectionError({
                        reason: new FencedEpoch({ resource: "coordinator", current, attempted: won.epoch })
                      })
                    )
                  }
                }
                return yield* Effect.fail(
                  failed(e.opIndex !== undefined && e.opIndex > 0 ? coordinationError(e.reason, e.opIndex - 1) : e)
                )
              })
            )
          )

        return {
          epoch: won.epoch,
          info: won.info,
          lost: Deferred.await(lost),
          fenced
        } satisfies Leadership
      }).pipe(Effect.catchTag("CoordinationError", (e) => Effect.fail(failed(e))))

    return { leader, changes, campaign } satisfies ElectionShape
  })

/** The election as a layer providing both `CoordinationElection` and `Election`. */
export const layer = (
  options: CoordinationElectionOptions
): Layer.Layer<CoordinationElection | Election, ElectionError, Coordination> =>
  Layer.effectContext(
    Effect.map(make(options), (service) =>
      Context.make(CoordinationElection, service).pipe(Context.add(Election, service))
    )
  )

/** Like `layer`, with the options read from configuration. */
export const layerConfig = (
  config: Config.Wrap<CoordinationElectionOptions>
): Layer.Layer<CoordinationElection | Election, ElectionError | Config.ConfigError, Coordination> =>
  Layer.unwrap(Effect.map(Config.unwrap(config), layer))
