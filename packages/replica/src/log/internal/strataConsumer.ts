/**
 * The Strata log's changelog consumer: manual assignment, each assigned tablet read from its leader (up to the high
 * watermark) ahead of what the caller was handed, as a Kafka consumer fetches:
 *
 * - every pull starts a read of each assigned, unpaused partition that has less than two reads' worth buffered and
 *   none in flight (those with nothing buffered first, in turn, and no more than `MAX_READS_TOTAL` reads' worth
 *   buffered and in flight over all partitions, a caught-up partition's read waiting on its leader not counted), so
 *   the reads of all partitions overlap and the next pulls find records already there; the reads go on after the
 *   pull returns, and stop with the pulls (a slow caller stops the fetching once its buffers are full);
 * - what a read returned beyond one batch (`maxBatchRecords`) stays buffered for the next pulls, handed out as views
 *   of the read's batches, never read again;
 * - the partitions are handed out in turn, so that a busy one starves none: the turn of one with nothing buffered
 *   yet whose read is in flight waits for that read, unless its last read found nothing new; a failed read is handed
 *   out (the stream fails) after the records read before it;
 * - a read that found nothing new marks its partition caught up: its next read waits on the leader for records to
 *   commit (a long-poll of `LONG_POLL_MS`, or `pollInterval` when longer; the leader bounds it by its
 *   `fetchMaxWait`), so new records arrive as soon as they commit, and an idle partition costs a read every wait
 *   rather than every `pollInterval`; a partition is read at most once a `pollInterval` (from the start of its
 *   last read that found nothing), should a leader answer without waiting; a pull that finds nothing waits for a
 *   read to land or a partition to be due.
 *
 * A seek, a pause or an unassign forgets what its partition buffered, and a read in flight then delivers nothing
 * (it is interrupted, its wait on the leader cancelled, and the partition is not read while a seek is under way):
 * a paused partition holds no memory, and is read again from its position once resumed.
 *
 * @internal
 */
import { Errors, Log, type Models } from "@strata/core"
import { Clock, Duration, Effect, type Fiber, Latch, type Result, Scope, Stream } from "effect"
import type * as ReplicaManager from "../../protocol/ReplicaManager.js"
import * as Codec from "../../wire/internal/batchCodec.js"
import { checkPartition, fromClient, fromTablet, offsetsOf, type Shared } from "./strataShared.js"

/** The bytes one read asks of a leader. */
const READ_BYTES = 1_048_576

/** How many reads a partition may have buffered or in flight together. */
const MAX_READS_AHEAD = 2

/** How many reads all partitions together may have buffered or in flight (32 MiB at most, long-polls aside). */
const MAX_READS_TOTAL = 32

/** How long a caught-up partition's read waits on its leader for records (at least `pollInterval`). */
const LONG_POLL_MS = 500

/** One read's records not handed out yet: its batches from `batch`/`record` on. */
interface Page {
  readonly batches: ReadonlyArray<ReplicaManager.TabletBatch>
  /** The partition's high watermark when it was read. */
  readonly highwater: number
  /** The batch, and the record in it, handed out next. */
  batch: number
  record: number
}

interface Assigned {
  readonly tp: Models.TopicPartition
  readonly tablet: Models.TabletId
  /** The next offset handed out. */
  position: number
  paused: boolean
  /** Grows with every seek and pause: a read started before one delivers nothing. */
  version: number
  /** What was read and not handed out, in offset order from `position`. */
  readonly pages: Array<Page>
  /** Where the next read starts: `position`, or after the last record buffered. */
  next: number
  /** Whether a read of this version is in flight. */
  reading: boolean
  /** The read in flight, interrupted when the partition forgets what it read. */
  inFlight: Fiber.Fiber<unknown> | undefined
  /** A read that failed, handed out after the pages before it. */
  failure: Log.LogError | undefined
  /** Not read again before this time (ms): its last read found nothing new. */
  idleUntil: number
  /**
   * Whether no read found nothing new since it was assigned or sought: its turn waits for a read in flight, and its
   * reads answer at once. Once caught up, its reads wait on the leader, and its turn does not wait for them.
   */
  behind: boolean
  /** Seeks in progress: the partition is not read until they return. */
  seeking: number
}

const keyOf = (tp: Models.TopicPartition) => `${tp.topic}:${tp.partition}`

/**
 * The page of a read from `from`: its batches with the cursor on the record at `from` (a read starts with the
 * whole batch holding it), and the offset after its last record; none when it holds nothing from `from` on.
 */
const pageOf = (result: ReplicaManager.ReadResult, from: number): { page: Page; next: number } | undefined => {
  const batches = result.batches
  for (let i = 0; i < batches.length; i++) {
    const b = batches[i]!
    if (b.baseOffset + Codec.countOf(b) <= from) continue
    for (let j = batches.length - 1; j >= i; j--) {
      const last = batches[j]!
      if (Codec.countOf(last) > 0) {
        return {
          page: { batches, highwater: result.highWatermark, batch: i, record: Math.max(0, from - b.baseOffset) },
          next: last.baseOffset + Codec.countOf(last)
        }
      }
    }
  }
  return undefined
}

/** A consumer of the Strata log, closed with the scope. */
export const makeConsumer = (
  shared: Shared,
  options: Log.ConsumerOptions
): Effect.Effect<Log.Consumer, Log.LogError, Scope.Scope> =>
  Effect.gen(function* () {
    const maxRecords = options.maxBatchRecords ?? 1000
    if (!Number.isInteger(maxRecords) || maxRecords < 1) {
      return yield* new Log.LogError({
        reason: new Log.InvalidRequest({ detail: `maxBatchRecords must be an integer ≥ 1, got ${maxRecords}` })
      })
    }
    const pollMillis = Math.max(1, Duration.toMillis(shared.pollInterval))
    const longPollMillis = Math.max(pollMillis, LONG_POLL_MS)
    const scope = yield* Scope.Scope
    const assigned = new Map<string, Assigned>()
    /** Opened when a read lands or a partition may be read again: a waiting pull looks again. */
    const wake = Latch.makeUnsafe(false)
    let closed = false
    let cursor = 0
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        closed = true
      })
    )
    const closedError = new Log.LogError({ reason: new Log.Closed({ what: "the consumer" }) })
    const open = Effect.suspend(() => (closed ? Effect.fail(closedError) : Effect.void))
    const find = (tp: Models.TopicPartition) =>
      Effect.suspend(() => {
        const a = assigned.get(keyOf(tp))
        return a === undefined
          ? Effect.fail(new Log.LogError({ reason: new Log.NotAssigned({ topic: tp.topic, partition: tp.partition }) }))
          : Effect.succeed(a)
      })
    /** Forgets what `a` read ahead: its read in flight is interrupted, and would deliver nothing. */
    const forget = (a: Assigned) => {
      a.inFlight?.interruptUnsafe()
      a.inFlight = undefined
      a.version++
      a.pages.length = 0
      a.next = a.position
      a.reading = false
      a.failure = undefined
      a.idleUntil = 0
      a.behind = true
    }

    /**
     * Keeps the outcome of a read started at `startedAt`, unless its partition was unassigned, paused or sought
     * meanwhile.
     */
    const land = (
      a: Assigned,
      version: number,
      from: number,
      result: Result.Result<ReplicaManager.ReadResult, Log.LogError>,
      startedAt: number
    ) => {
      if (assigned.get(keyOf(a.tp)) !== a || a.version !== version) return
      a.reading = false
      a.inFlight = undefined
      if (result._tag === "Failure") {
        a.failure = result.failure
      } else {
        const read = pageOf(result.success, from)
        a.behind = read !== undefined
        if (read === undefined) {
          // A read that waited on the leader as long as `pollInterval` leaves the partition due at once.
          a.idleUntil = startedAt + pollMillis
        } else {
          a.pages.push(read.page)
          a.next = read.next
        }
      }
      wake.openUnsafe()
    }

    /**
     * A read of `a` from where its buffer ends, kept (or its failure) when it lands; a long-poll when `a` caught up.
     */
    const readOf = (a: Assigned, now: number) => {
      a.reading = true
      const { version, next: from } = a
      const options = a.behind ? undefined : { maxWaitMs: longPollMillis }
      return Effect.map(
        Effect.forkIn(
          Effect.flatMap(
            Effect.result(
              shared.client
                .read(a.tablet, from, READ_BYTES, options)
                .pipe(Effect.mapError(fromClient("fetching", a.tp)))
            ),
            (result) => Effect.sync(() => land(a, version, from, result, now))
          ),
          scope
        ),
        (fiber) => {
          // A read that landed already (or was forgotten meanwhile) is not in flight.
          if (a.version === version && a.reading) a.inFlight = fiber
        }
      )
    }

    /**
     * Starts a read of each partition of `list` that has room for one and is due, within `MAX_READS_TOTAL`: first
     * those with nothing buffered, then those with less than `MAX_READS_AHEAD` reads' worth, each time from the one
     * whose turn it is.
     */
    const readAhead = (list: ReadonlyArray<Assigned>, now: number) => {
      let ahead = 0
      for (const a of list) ahead += a.pages.length + (a.reading && a.behind ? 1 : 0)
      const start: Array<Assigned> = []
      for (let buffered = 0; buffered < MAX_READS_AHEAD; buffered++) {
        for (let i = 0; i < list.length && ahead < MAX_READS_TOTAL; i++) {
          const a = list[(cursor + i) % list.length]!
          if (
            a.pages.length !== buffered ||
            a.reading ||
            a.seeking > 0 ||
            a.failure !== undefined ||
            now < a.idleUntil
          ) {
            continue
          }
          start.push(a)
          if (a.behind) ahead++
        }
      }
      return Effect.forEach(start, (a) => readOf(a, now), { discard: true })
    }

    /** Up to `maxRecords` records of `a`'s first page, as a batch; the page goes once handed out whole. */
    const take = (a: Assigned): Log.Batch => {
      const page = a.pages[0]!
      const records: Array<Log.Record> = []
      while (records.length < maxRecords && page.batch < page.batches.length) {
        const b = page.batches[page.batch]!
        const rs = b.records
        while (page.record < rs.length && records.length < maxRecords) {
          records.push(fromTablet(a.tp, b.baseOffset + page.record, rs[page.record]!))
          page.record++
        }
        if (page.record >= rs.length) {
          page.batch++
          page.record = 0
        }
      }
      while (page.batch < page.batches.length && Codec.countOf(page.batches[page.batch]!) === 0) page.batch++
      if (page.batch >= page.batches.length) a.pages.shift()
      a.position = records.at(-1)!.offset + 1
      return { topic: a.tp.topic, partition: a.tp.partition, records, highwater: page.highwater }
    }

    /**
     * The next batch (or failure) of the first partition in turn that has one buffered; none when none has, or when
     * the partition whose turn it is has none yet but is behind and being read (that read is waited for, so that a
     * partition whose buffer fills first does not take every turn before the others' reads land).
     */
    const handOut = (list: ReadonlyArray<Assigned>): Effect.Effect<Log.Batch, Log.LogError> | undefined => {
      for (let i = 0; i < list.length; i++) {
        const a = list[(cursor + i) % list.length]!
        if (a.pages.length === 0 && a.failure === undefined) {
          if (a.reading && a.behind) return undefined
          continue
        }
        cursor = (cursor + i + 1) % list.length
        if (a.pages.length > 0) return Effect.succeed(take(a))
        const failure = a.failure!
        a.failure = undefined
        return Effect.fail(failure)
      }
      return undefined
    }

    /** How long a pull that found nothing waits at most: until the first idle partition is due, or `pollInterval`. */
    const waitOf = (list: ReadonlyArray<Assigned>, now: number) => {
      let wait = pollMillis
      for (const a of list) if (!a.reading && a.idleUntil > now) wait = Math.min(wait, a.idleUntil - now)
      return Math.max(1, wait)
    }

    const next: Effect.Effect<Log.Batch, Log.LogError> = Effect.gen(function* () {
      while (true) {
        yield* open
        // Closed before looking: whatever lands from here on wakes the wait below.
        wake.closeUnsafe()
        const now = yield* Clock.currentTimeMillis
        const list: Array<Assigned> = []
        for (const a of assigned.values()) if (!a.paused) list.push(a)
        yield* readAhead(list, now)
        const found = handOut(list)
        if (found !== undefined) return yield* found
        yield* Effect.raceFirst(wake.await, Effect.sleep(Duration.millis(waitOf(list, now))))
      }
    })

    return {
      assign: (tps) =>
        Effect.gen(function* () {
          yield* open
          const checked = yield* Effect.forEach(tps, (tp) =>
            Effect.map(checkPartition(shared, tp), (tablet) => ({ tp, tablet }))
          )
          for (const { tp, tablet } of checked) {
            if (assigned.has(keyOf(tp))) continue
            const { logStart } = yield* offsetsOf(shared, tp)
            assigned.set(keyOf(tp), {
              tp: { topic: tp.topic, partition: tp.partition },
              tablet,
              position: logStart,
              paused: false,
              version: 0,
              pages: [],
              next: logStart,
              reading: false,
              inFlight: undefined,
              failure: undefined,
              idleUntil: 0,
              behind: true,
              seeking: 0
            })
          }
          wake.openUnsafe()
        }),
      unassign: (tps) =>
        Effect.andThen(
          open,
          Effect.sync(() => {
            for (const tp of tps) {
              assigned.get(keyOf(tp))?.inFlight?.interruptUnsafe()
              assigned.delete(keyOf(tp))
            }
          })
        ),
      assignment: Effect.sync(() => [...assigned.values()].map((a) => a.tp)),
      seek: (tp, offset) =>
        Effect.gen(function* () {
          yield* open
          const a = yield* find(tp)
          // From here until the seek returns nothing of the partition is read or handed out, whatever it finds.
          a.seeking++
          forget(a)
          const bounds = yield* offsetsOf(shared, tp).pipe(
            Effect.ensuring(
              Effect.sync(() => {
                a.seeking--
                wake.openUnsafe()
              })
            )
          )
          if (!Number.isInteger(offset) || offset < bounds.logStart || offset > bounds.highwater) {
            return yield* new Log.LogError({
              reason: new Errors.OffsetOutOfRange({
                topic: tp.topic,
                partition: tp.partition,
                offset,
                logStart: bounds.logStart,
                highwater: bounds.highwater
              })
            })
          }
          a.position = offset
          forget(a)
          wake.openUnsafe()
        }),
      position: (tp) =>
        Effect.andThen(
          open,
          Effect.map(find(tp), (a) => a.position)
        ),
      pause: (tps) =>
        Effect.sync(() => {
          for (const tp of tps) {
            const a = assigned.get(keyOf(tp))
            if (a !== undefined && !a.paused) {
              a.paused = true
              forget(a)
            }
          }
        }),
      resume: (tps) =>
        Effect.sync(() => {
          for (const tp of tps) {
            const a = assigned.get(keyOf(tp))
            if (a !== undefined) a.paused = false
          }
          wake.openUnsafe()
        }),
      paused: Effect.sync(() => [...assigned.values()].filter((a) => a.paused).map((a) => a.tp)),
      batches: Stream.fromEffectRepeat(next)
    }
  })
