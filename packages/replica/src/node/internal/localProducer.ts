/**
 * `LocalCluster`'s idempotent producer side: a producer id asked of the controller on the first append, and per
 * tablet its producer epoch and next sequence. Appends to one tablet run one at a time; a tablet's sequence moves on
 * only when an append succeeds, and a failed append (written or not, nobody knows) moves the tablet to a new
 * producer epoch at sequence 0, so the next append is neither refused as out of order nor taken for a retry.
 *
 * @internal
 */
import type * as ReplicaManager from "../../protocol/ReplicaManager.js"
import { Effect, Semaphore } from "effect"

/** One tablet's place in the producer's sequence. */
interface Lane {
  readonly lock: Semaphore.Semaphore
  epoch: number
  sequence: number
}

/** The producer; `E`: how asking for the producer id fails. */
export interface LocalProducer<E> {
  /** Runs `send` with the tablet's next stamp for `count` records, one append per tablet at a time. */
  readonly append: <A, F>(
    tablet: string,
    send: (stamp: ReplicaManager.ProducerStamp) => Effect.Effect<A, F>,
    count: number
  ) => Effect.Effect<A, E | F>
}

/** A producer whose id comes from `initProducerId` (asked once, on the first append). */
export const make = <E>(initProducerId: Effect.Effect<number, E>): Effect.Effect<LocalProducer<E>> =>
  Effect.gen(function* () {
    const idLock = yield* Semaphore.make(1)
    let id: number | undefined
    const producerId = Semaphore.withPermit(
      idLock,
      Effect.suspend(() =>
        id !== undefined
          ? Effect.succeed(id)
          : Effect.tap(initProducerId, (got) =>
              Effect.sync(() => {
                id = got
              })
            )
      )
    )
    const lanes = new Map<string, Lane>()
    const laneOf = (tablet: string) => {
      let lane = lanes.get(tablet)
      if (lane === undefined) {
        lane = { lock: Semaphore.makeUnsafe(1), epoch: 0, sequence: 0 }
        lanes.set(tablet, lane)
      }
      return lane
    }
    const append = <A, F>(
      tablet: string,
      send: (stamp: ReplicaManager.ProducerStamp) => Effect.Effect<A, F>,
      count: number
    ) =>
      Effect.gen(function* () {
        const pid = yield* producerId
        const lane = laneOf(tablet)
        return yield* Semaphore.withPermit(
          lane.lock,
          Effect.suspend(() => send({ id: pid, epoch: lane.epoch, sequence: lane.sequence })).pipe(
            Effect.onExit((exit) =>
              Effect.sync(() => {
                if (exit._tag === "Success") lane.sequence += count
                else {
                  lane.epoch += 1
                  lane.sequence = 0
                }
              })
            )
          )
        )
      })
    return { append }
  })
