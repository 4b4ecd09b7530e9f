/**
 * The coordinators demo: three `Coordinator`s, each with two toy leader-only
 * services, campaign for leadership over the embedded memory coordination; the
 * leader is killed (its services stop in reverse order, its session ends),
 * another takes over with a higher epoch and starts its services, and the dead
 * leader's fenced write is rejected.
 *
 * @since 0.1.0
 */
import { Coordination, type Election, MemoryCoordination } from "@strata/core"
import { CoordinationElection, Coordinator } from "@strata/election"
import { Clock, Console, Effect, Exit, Layer, Scope } from "effect"

/** What the demo observed. */
export interface CoordinatorsResult {
  readonly first: { readonly serverId: number; readonly epoch: number }
  readonly second: { readonly serverId: number; readonly epoch: number }
  readonly takeoverMs: number
  /** The reason the killed leader's write was refused. */
  readonly staleWrite: string
}

/** Two toy leader-only services that say when they start and stop. */
const toyServices = (serverId: number, say: (line: string) => Effect.Effect<void>) =>
  ["channel-manager", "event-processor"].map((name) =>
    Coordinator.service(name, (leadership) =>
      Effect.acquireRelease(say(`  server ${serverId}: ${name} started (epoch ${leadership.epoch})`), () =>
        say(`  server ${serverId}: ${name} stopped`)
      )
    )
  )

/** Runs three coordinators (each with two leader services) on the `Election` in context. */
export const run = (verbose: boolean) =>
  Effect.gen(function* () {
    const say = (line: string) => (verbose ? Console.log(line) : Effect.void)
    yield* say("Three coordinators (servers 1, 2, 3) campaign on the embedded memory coordination")
    const coordinators = yield* Effect.forEach([1, 2, 3], (serverId) =>
      Effect.gen(function* () {
        const scope = yield* Scope.make()
        const coordinator = yield* Coordinator.make({
          serverId,
          address: `127.0.0.1:${9120 + serverId}`,
          services: toyServices(serverId, say)
        }).pipe(Scope.provide(scope))
        return { serverId, scope, coordinator }
      })
    )
    const winner = (candidates: typeof coordinators) =>
      Effect.raceAll(candidates.map((c) => Effect.map(c.coordinator.awaitLeader, (leadership) => ({ c, leadership }))))

    const first = yield* winner(coordinators)
    yield* say(`Became coordinator leader: server ${first.c.serverId} with epoch ${first.leadership.epoch}`)

    yield* say(
      `Killing the leader (server ${first.c.serverId}): its leader services stop in reverse order, its session ends`
    )
    const killedAt = yield* Clock.currentTimeMillis
    yield* Scope.close(first.c.scope, Exit.void)
    const second = yield* winner(coordinators.filter((c) => c !== first.c))
    const takeoverMs = (yield* Clock.currentTimeMillis) - killedAt
    yield* say(
      `Became coordinator leader: server ${second.c.serverId} with epoch ${second.leadership.epoch} (took over in ${takeoverMs} ms)`
    )

    const stale = yield* Effect.flip(
      first.leadership.fenced([Coordination.op.create("/strata-demo-write", new Uint8Array(0))])
    )
    yield* say(`The killed leader's write is refused: ${stale.reason._tag} (${stale.message})`)
    const fresh = yield* Effect.exit(
      second.leadership.fenced([Coordination.op.create("/strata-demo-write", new Uint8Array(0))])
    )
    yield* say(`The new leader's fenced write ${Exit.isSuccess(fresh) ? "succeeds" : "fails"}`)

    yield* say("Stopping the standby, then the leader")
    const rest = coordinators.filter((c) => c !== first.c && c !== second.c)
    for (const c of [...rest, second.c, first.c]) yield* Scope.close(c.scope, Exit.void)
    const result: CoordinatorsResult = {
      first: { serverId: first.c.serverId, epoch: first.leadership.epoch },
      second: { serverId: second.c.serverId, epoch: second.leadership.epoch },
      takeoverMs,
      staleWrite: stale.reason._tag
    }
    return result
  })

/** The embedded default: the election recipe over memory coordination. */
export const layerMemory: Layer.Layer<Election.Election, Election.ElectionError> = CoordinationElection.layer({
  namespace: "/strata-demo"
}).pipe(Layer.provide(MemoryCoordination.layer()))
