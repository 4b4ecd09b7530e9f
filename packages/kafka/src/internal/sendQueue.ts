/**
 * The producer's send queue. Calls wait per acks level; one sender per level drains its queue, joining waiting
 * calls into one request (whole calls, up to `maxBatchRecords` records; a larger call goes alone), so concurrent
 * callers share requests. The first call of an idle queue goes out at once unless `lingerMs` is set.
 *
 * Calls may belong to an owner (a `Log.producer`). A failed request stops every owner with a call in it, and a
 * stopped owner's calls still queued fail with the same error without being sent: an owner's records reach the log
 * as a prefix of its calls, never with a gap.
 *
 * Queued records are bounded by `bufferRecords`: `enqueue` waits for room (a call larger than the whole buffer
 * waits until the buffer is empty).
 *
 * @since 0.1.0
 */
import { type Acks, type LogError, LogIoError, logError } from "@strata/core"
import { Cause, Deferred, Effect, Exit, Result, type Scope, Semaphore } from "effect"

/** Who sent a call: stopped, with its error, by the first failed request that carried one of its calls. */
export interface Owner {
  failure: LogError | undefined
}

/** What the queue sends with and how it batches. */
export interface SendQueueOptions<R> {
  readonly lingerMs: number
  readonly maxBatchRecords: number
  readonly bufferRecords: number
  /** Sends one request; offsets in the order given. */
  readonly send: (records: ReadonlyArray<R>, acks: Acks) => Effect.Effect<ReadonlyArray<number>, LogError>
}

/** A queued call's outcome: its offsets in the order given. */
export type Done = Deferred.Deferred<ReadonlyArray<number>, LogError>

/** The send queue. */
export interface SendQueue<R> {
  /** Queues a call (waiting for buffer room) and returns where its offsets will be. */
  readonly enqueue: (records: ReadonlyArray<R>, acks: Acks, owner?: Owner) => Effect.Effect<Done>
  /** Waits until every call queued so far is done (successfully or not). */
  readonly flush: Effect.Effect<void>
}

interface Waiting<R> {
  readonly records: ReadonlyArray<R>
  readonly owner: Owner | undefined
  readonly done: Done
}

interface Lane<R> {
  readonly waiting: Array<Waiting<R>>
  sending: boolean
}

/** How many of the first waiting calls (of these sizes) the next request takes: whole calls, up to `max` records. */
export const callsPerRequest = (sizes: ReadonlyArray<number>, max: number): number => {
  let take = 0
  let size = 0
  while (take < sizes.length) {
    const n = sizes[take]!
    if (take > 0 && size + n > max) break
    size += n
    take++
  }
  return take
}

/** Builds a send queue whose senders run in the scope. */
export const make = <R>(options: SendQueueOptions<R>): Effect.Effect<SendQueue<R>, never, Scope.Scope> =>
  Effect.gen(function* () {
    const scope = yield* Effect.scope
    const room = Semaphore.makeUnsafe(options.bufferRecords)
    const lanes = new Map<Acks, Lane<R>>()
    const roomOf = (w: Waiting<R>) => Math.min(w.records.length, options.bufferRecords)
    /** Every call not yet done, queued or in a request. */
    const open = new Set<Done>()

    const settle = (w: Waiting<R>, outcome: Exit.Exit<ReadonlyArray<number>, LogError>) =>
      Effect.andThen(
        Effect.sync(() => {
          open.delete(w.done)
          Deferred.doneUnsafe(w.done, outcome)
        }),
        Semaphore.release(room, roomOf(w))
      )

    const drain = (acks: Acks, lane: Lane<R>): Effect.Effect<void> =>
      Effect.gen(function* () {
        if (options.lingerMs > 0) yield* Effect.sleep(options.lingerMs)
        while (lane.waiting.length > 0) {
          // Calls of a stopped owner fail without being sent.
          const live: Array<Waiting<R>> = []
          for (const w of lane.waiting.splice(0, lane.waiting.length)) {
            if (w.owner?.failure !== undefined) yield* settle(w, Exit.fail(w.owner.failure))
            else live.push(w)
          }
          const take = callsPerRequest(
            live.map((w) => w.records.length),
            options.maxBatchRecords
          )
          const batch = live.slice(0, take)
          lane.waiting.unshift(...live.slice(take))
          if (batch.length === 0) continue
          const result = yield* Effect.exit(
            options.send(
              batch.flatMap((w) => w.records),
              acks
            )
          )
          if (Exit.isFailure(result)) {
            const found = Cause.findError(result.cause)
            const failure = Result.isSuccess(found)
              ? found.success
              : logError(
                  new LogIoError({ operation: "produce", detail: String(Cause.squash(result.cause)), retryable: false })
                )
            for (const w of batch) if (w.owner !== undefined) w.owner.failure ??= failure
          }
          let at = 0
          for (const w of batch) {
            const outcome: Exit.Exit<ReadonlyArray<number>, LogError> = Exit.isSuccess(result)
              ? Exit.succeed(result.value.slice(at, at + w.records.length))
              : Exit.failCause(result.cause)
            at += w.records.length
            yield* settle(w, outcome)
          }
        }
      }).pipe(
        Effect.ensuring(
          Effect.sync(() => {
            lane.sending = false
          })
        )
      )

    const enqueue: SendQueue<R>["enqueue"] = (records, acks, owner) =>
      Effect.gen(function* () {
        const done = Deferred.makeUnsafe<ReadonlyArray<number>, LogError>()
        const w: Waiting<R> = { records, owner, done }
        yield* Semaphore.take(room, roomOf(w))
        let lane = lanes.get(acks)
        if (lane === undefined) {
          lane = { waiting: [], sending: false }
          lanes.set(acks, lane)
        }
        lane.waiting.push(w)
        open.add(done)
        if (!lane.sending) {
          lane.sending = true
          yield* Effect.forkIn(drain(acks, lane), scope)
        }
        return done
      })

    const flush: Effect.Effect<void> = Effect.suspend(() =>
      Effect.forEach([...open], (d) => Effect.ignore(Deferred.await(d)), { discard: true })
    )

    return { enqueue, flush }
  })
