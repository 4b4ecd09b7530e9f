/**
 * The producer's send queue. Calls wait per acks level; one sender per level drains its queue, joining waiting
 * calls into one request (whole calls, up to `maxBatchRecords` records; a larger call goes alone), so concurrent
 * callers share requests. The first call of an idle queue goes out at once unless `lingerMs` is set.
 *
 * A request also stays within the brokers' byte limits, as `size` measures them: a call that does not fit the
 * request being formed waits for the next one, and a call that does not fit even alone is split across requests
 * sent one after another (its records stay in order; it fails, part appended, if a later part fails).
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
import { Log } from "@strata/core"
import { Cause, Deferred, Effect, Exit, Result, type Scope, Semaphore } from "effect"

/** Who sent a call: stopped, with its error, by the first failed request that carried one of its calls. */
export interface Owner {
  failure: Log.LogError | undefined
}

/** Measures the request being formed: whether one more record still fits the brokers' limits. */
export interface RequestSize<R> {
  /** Starts measuring a new, empty request. */
  readonly reset: () => void
  /** Counts the record into the request if it fits (and then only); whether it did. */
  readonly add: (record: R) => boolean
}

/** What the queue sends with and how it batches. */
export interface SendQueueOptions<R> {
  readonly lingerMs: number
  readonly maxBatchRecords: number
  readonly bufferRecords: number
  /** Makes a measure of requests for one sender (each acks level forms its requests with its own). */
  readonly size: () => RequestSize<R>
  /** Sends one request; offsets in the order given. */
  readonly send: (records: ReadonlyArray<R>, acks: Log.Acks) => Effect.Effect<ReadonlyArray<number>, Log.LogError>
}

/** A queued call's outcome: its offsets in the order given. */
export type Done = Deferred.Deferred<ReadonlyArray<number>, Log.LogError>

/** The send queue. */
export interface SendQueue<R> {
  /** Queues a call (waiting for buffer room) and returns where its offsets will be. */
  readonly enqueue: (records: ReadonlyArray<R>, acks: Log.Acks, owner?: Owner) => Effect.Effect<Done>
  /** Waits until every call queued so far is done (successfully or not). */
  readonly flush: Effect.Effect<void>
}

/** A queued call: its records from `sent` on are still to send (a call split across requests sent the rest). */
export interface Waiting<R> {
  readonly records: ReadonlyArray<R>
  readonly owner: Owner | undefined
  readonly done: Done
  sent: number
  /** Offsets of the records sent so far (a call split across requests). */
  offsets: ReadonlyArray<number>
}

interface Lane<R> {
  readonly waiting: Array<Waiting<R>>
  readonly size: RequestSize<R>
  sending: boolean
}

/**
 * What the next request takes of the waiting calls (in order): the first `calls` of them, whole, except that when
 * the first call does not fit alone only its records up to `end` go (at least one). Calls are taken while their
 * records stay within `max` (a larger call goes alone) and within the limits `size` measures.
 */
export const nextRequest = <R>(
  waiting: ReadonlyArray<Pick<Waiting<R>, "records" | "sent">>,
  max: number,
  size: RequestSize<R>
): { readonly calls: number; readonly end: number | undefined } => {
  size.reset()
  let records = 0
  for (let c = 0; c < waiting.length; c++) {
    const w = waiting[c]!
    const n = w.records.length - w.sent
    if (c > 0 && records + n > max) return { calls: c, end: undefined }
    let i = w.sent
    while (i < w.records.length && size.add(w.records[i]!)) i++
    if (i < w.records.length) {
      // Does not fit: it starts the next request, or, first in this one, goes in as many parts as it needs.
      return c > 0 ? { calls: c, end: undefined } : { calls: 1, end: Math.max(i, w.sent + 1) }
    }
    records += n
  }
  return { calls: waiting.length, end: undefined }
}

/** Builds a send queue whose senders run in the scope. */
export const make = <R>(options: SendQueueOptions<R>): Effect.Effect<SendQueue<R>, never, Scope.Scope> =>
  Effect.gen(function* () {
    const scope = yield* Effect.scope
    const room = Semaphore.makeUnsafe(options.bufferRecords)
    const lanes = new Map<Log.Acks, Lane<R>>()
    const roomOf = (w: Waiting<R>) => Math.min(w.records.length, options.bufferRecords)
    /** Every call not yet done, queued or in a request. */
    const open = new Set<Done>()

    const settle = (w: Waiting<R>, outcome: Exit.Exit<ReadonlyArray<number>, Log.LogError>) =>
      Effect.andThen(
        Effect.sync(() => {
          open.delete(w.done)
          Deferred.doneUnsafe(w.done, outcome)
        }),
        Semaphore.release(room, roomOf(w))
      )

    const drain = (acks: Log.Acks, lane: Lane<R>): Effect.Effect<void> =>
      Effect.gen(function* () {
        if (options.lingerMs > 0) yield* Effect.sleep(options.lingerMs)
        while (lane.waiting.length > 0) {
          // Calls of a stopped owner fail without being sent.
          const live: Array<Waiting<R>> = []
          for (const w of lane.waiting.splice(0, lane.waiting.length)) {
            if (w.owner?.failure !== undefined) yield* settle(w, Exit.fail(w.owner.failure))
            else live.push(w)
          }
          if (live.length === 0) continue
          const { calls, end } = nextRequest(live, options.maxBatchRecords, lane.size)
          const batch = live.slice(0, calls)
          lane.waiting.unshift(...live.slice(calls))
          const first = batch[0]!
          // One whole call goes as it is; otherwise the request's records are copied together.
          const records =
            calls === 1 && end === undefined && first.sent === 0
              ? first.records
              : end !== undefined
                ? first.records.slice(first.sent, end)
                : batch.flatMap((w) => (w.sent === 0 ? w.records : w.records.slice(w.sent)))
          const result = yield* Effect.exit(options.send(records, acks))
          if (Exit.isFailure(result)) {
            const found = Cause.findError(result.cause)
            const failure = Result.isSuccess(found)
              ? found.success
              : Log.logError(
                  new Log.IoError({
                    operation: "produce",
                    detail: String(Cause.squash(result.cause)),
                    retryable: false
                  })
                )
            for (const w of batch) if (w.owner !== undefined) w.owner.failure ??= failure
            for (const w of batch) yield* settle(w, Exit.failCause(result.cause))
            continue
          }
          if (end !== undefined) {
            // The first part of a split call: the rest goes next.
            first.offsets = first.offsets.length === 0 ? result.value : [...first.offsets, ...result.value]
            first.sent = end
            lane.waiting.unshift(first)
            continue
          }
          let at = 0
          for (const w of batch) {
            const n = w.records.length - w.sent
            const mine = result.value.slice(at, at + n)
            at += n
            yield* settle(w, Exit.succeed(w.offsets.length === 0 ? mine : [...w.offsets, ...mine]))
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
        const done = Deferred.makeUnsafe<ReadonlyArray<number>, Log.LogError>()
        const w: Waiting<R> = { records, owner, done, sent: 0, offsets: [] }
        yield* Semaphore.take(room, roomOf(w))
        let lane = lanes.get(acks)
        if (lane === undefined) {
          lane = { waiting: [], size: options.size(), sending: false }
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
