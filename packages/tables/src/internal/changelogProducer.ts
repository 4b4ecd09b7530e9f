/**
 * The table manager's changelog producer: opened when first used, in a scope of its own under the manager's, as a
 * `Log.producer` (at least once) or a `Log.transactionalProducer` (exactly once). Its first failure stops it (see
 * `Log.producer`): every send and commit then fails until `close` drops it (closing a transactional producer aborts
 * its open transaction) and the next use opens a fresh one.
 *
 * With exactly once a commit is a cut between transactions: each record's processing runs `gated` (holding one
 * permit of the commit gate) and a commit takes every permit, after a turnstile that holds new records back, so no
 * record is half in one transaction and half in the next, and new records cannot starve a waiting commit.
 *
 * @internal
 */
import type { Log, Models } from "@strata/core"
import { Effect, Exit, Scope, Semaphore } from "effect"

/** Permits of the commit gate: more than there can be records processed at once. */
const COMMIT_GATE = 1_000_000

/** The producer the manager sends its changelog records with. */
export interface ChangelogProducer {
  /** Queues records (opening the producer if needed); the inner effect waits for their offsets. */
  readonly send: Log.Producer["send"]
  /** Waits for every ack so far (exactly once: nothing, the acks come with the commit). */
  readonly flush: Effect.Effect<void, Log.LogError>
  /** Runs one record's processing on one side of a commit (exactly once; as it is at least once). */
  readonly gated: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
  /**
   * Exactly once: once the records in flight are done (new ones wait), commits the transaction with the source
   * offsets, then runs `then` (the stores take what the transaction committed).
   */
  readonly commitTransaction: <E>(
    group: Log.GroupConsumer,
    offsets: ReadonlyArray<Models.TopicPartitionOffset>,
    then: Effect.Effect<void, E>
  ) => Effect.Effect<void, Log.LogError | E>
  /** Closes the producer, if open (aborting an open transaction); the next use opens a new one. */
  readonly close: Effect.Effect<void>
}

interface Open {
  readonly send: Log.Producer["send"]
  readonly flush: Effect.Effect<void, Log.LogError>
  readonly transactional: Log.TransactionalProducer | undefined
  readonly scope: Scope.Closeable
}

/** The changelog producer of a manager whose scope is `scope`. */
export const make = (
  log: Log.Shape,
  scope: Scope.Scope,
  options: { readonly exactlyOnce: boolean; readonly acks: Log.Acks; readonly transactionalId: string }
): ChangelogProducer => {
  let open: Open | undefined
  const opening = Effect.gen(function* () {
    const child = yield* Scope.fork(scope, "sequential")
    if (options.exactlyOnce) {
      const transactional = yield* log
        .transactionalProducer({ transactionalId: options.transactionalId })
        .pipe(Scope.provide(child))
      open = { send: transactional.send, flush: Effect.void, transactional, scope: child }
      return open
    }
    const plain = yield* log.producer({ acks: options.acks }).pipe(Scope.provide(child))
    open = { send: plain.send, flush: plain.flush, transactional: undefined, scope: child }
    return open
  })
  // One opening at a time: records of several partitions sent at once must not open two producers (with exactly
  // once, the second would fence the first, as it has the same transactional id).
  const openLock = Semaphore.makeUnsafe(1)
  const current = Effect.suspend(() =>
    open !== undefined
      ? Effect.succeed(open)
      : Semaphore.withPermit(
          openLock,
          Effect.suspend(() => (open === undefined ? opening : Effect.succeed(open)))
        )
  )

  const gate = Semaphore.makeUnsafe(COMMIT_GATE)
  const turnstile = Semaphore.makeUnsafe(1)

  return {
    send: (records) => Effect.flatMap(current, (p) => p.send(records)),
    flush: Effect.suspend(() => (open === undefined ? Effect.void : open.flush)),
    gated: (effect) =>
      options.exactlyOnce
        ? Effect.andThen(Semaphore.withPermit(turnstile, Effect.void), Semaphore.withPermits(gate, 1)(effect))
        : effect,
    commitTransaction: (group, offsets, then) =>
      // The turnstile first (no new record starts), then every permit (the records in flight finished).
      Semaphore.withPermit(
        turnstile,
        Semaphore.withPermits(
          gate,
          COMMIT_GATE
        )(
          Effect.gen(function* () {
            const p = yield* current
            if (p.transactional === undefined) return yield* then
            yield* p.transactional.commit({ group, offsets })
            yield* then
          })
        )
      ),
    close: Effect.suspend(() => {
      if (open === undefined) return Effect.void
      const closing = open
      open = undefined
      return Scope.close(closing.scope, Exit.void)
    })
  }
}
