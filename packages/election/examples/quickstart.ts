/**
 * The README's example: two coordinators in one namespace; the leader runs a
 * leader-only service and makes a fenced write; when it steps down, the other
 * takes over with a higher epoch and the old leadership's writes are refused.
 * Run it with `./dev exec tsx --conditions=@strata/source packages/election/examples/quickstart.ts`.
 */
import { Coordination, MemoryCoordination } from "@strata/core"
import { CoordinationElection, Coordinator } from "@strata/election"
import { Effect, Layer } from "effect"

/** A leader-only service: started when leadership is won, stopped (in reverse order) when it ends. */
const scheduler = (serverId: number, events: Array<string>) =>
  Coordinator.service("scheduler", (leadership) =>
    Effect.acquireRelease(
      Effect.sync(() => events.push(`${serverId}: scheduler started at epoch ${leadership.epoch}`)),
      () => Effect.sync(() => events.push(`${serverId}: scheduler stopped`))
    )
  )

export const program = Effect.gen(function* () {
  const events: Array<string> = []
  const a = yield* Coordinator.make({ serverId: 1, address: "10.0.0.1:9123", services: [scheduler(1, events)] })
  const first = yield* a.awaitLeader
  const b = yield* Coordinator.make({ serverId: 2, address: "10.0.0.2:9123", services: [scheduler(2, events)] })

  // Every coordinator write goes through `fenced`: one transaction that first checks the epoch is still current.
  yield* first.fenced([
    Coordination.op.create("/quickstart/assignments", new TextEncoder().encode("tablet-0 -> server 7"))
  ])

  yield* a.resign
  const second = yield* b.awaitLeader
  const refused = yield* Effect.flip(first.fenced([Coordination.op.delete("/quickstart/assignments")]))
  return { events: [...events], firstEpoch: first.epoch, secondEpoch: second.epoch, refused: refused.reason._tag }
}).pipe(Effect.scoped)

/** The embedded default: memory coordination. Swap in `ZooKeeperCoordination.layer` or `EtcdCoordination.layer`. */
export const layer = CoordinationElection.layer({ namespace: "quickstart" }).pipe(
  Layer.provideMerge(MemoryCoordination.layer())
)

if (import.meta.url === `file://${process.argv[1]}`) {
  Effect.runPromise(program.pipe(Effect.provide(layer))).then((r) => console.log(r))
}
