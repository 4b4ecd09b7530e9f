/**
 * The Strata log's changelog consumer: manual assignment, each assigned tablet read from its leader at the
 * consumer's position (up to the high watermark), the partitions taken in turn so that a busy one starves none,
 * and an idle consumer asking again every `pollInterval`. A fetch whose partition was paused, unassigned or
 * sought while it was in flight delivers nothing.
 *
 * @internal
 */
import { Errors, Log, type Models } from "@strata/core"
import { Effect, Option, type Scope, Stream } from "effect"
import { checkPartition, fromClient, fromTablet, offsetsOf, type Shared } from "./strataShared.js"

interface Assigned {
  readonly tp: Models.TopicPartition
  readonly tablet: Models.TabletId
  position: number
  paused: boolean
  /** Grows with every seek: a fetch started before one delivers nothing. */
  version: number
}

const keyOf = (tp: Models.TopicPartition) => `${tp.topic}:${tp.partition}`

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
    const assigned = new Map<string, Assigned>()
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

    /** The next batch of the first partition (in turn) that has records, or none after one pass. */
    const pass = Effect.gen(function* () {
      const list = [...assigned.values()].filter((a) => !a.paused)
      for (let i = 0; i < list.length; i++) {
        const a = list[(cursor + i) % list.length]!
        const { position, version } = a
        const page = yield* shared.client
          .read(a.tablet, position, 1_048_576)
          .pipe(Effect.mapError(fromClient("fetching", a.tp)))
        // Paused, unassigned or sought meanwhile: this fetch is void.
        if (assigned.get(keyOf(a.tp)) !== a || a.paused || a.version !== version || closed) continue
        const records = page.batches
          .flatMap((b) => b.records.map((r, j) => fromTablet(a.tp, b.baseOffset + j, r)))
          .filter((r) => r.offset >= position)
          .slice(0, maxRecords)
        if (records.length === 0) continue
        a.position = records.at(-1)!.offset + 1
        cursor = (cursor + i + 1) % Math.max(1, list.length)
        const batch: Log.Batch = {
          topic: a.tp.topic,
          partition: a.tp.partition,
          records,
          highwater: page.highWatermark
        }
        return Option.some(batch)
      }
      return Option.none<Log.Batch>()
    })

    const next: Effect.Effect<Log.Batch, Log.LogError> = Effect.gen(function* () {
      while (true) {
        yield* open
        const found = yield* pass
        if (Option.isSome(found)) return found.value
        yield* Effect.sleep(shared.pollInterval)
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
              version: 0
            })
          }
        }),
      unassign: (tps) =>
        Effect.andThen(
          open,
          Effect.sync(() => {
            for (const tp of tps) assigned.delete(keyOf(tp))
          })
        ),
      assignment: Effect.sync(() => [...assigned.values()].map((a) => a.tp)),
      seek: (tp, offset) =>
        Effect.gen(function* () {
          yield* open
          const a = yield* find(tp)
          const bounds = yield* offsetsOf(shared, tp)
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
          a.version++
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
            if (a !== undefined) a.paused = true
          }
        }),
      resume: (tps) =>
        Effect.sync(() => {
          for (const tp of tps) {
            const a = assigned.get(keyOf(tp))
            if (a !== undefined) a.paused = false
          }
        }),
      paused: Effect.sync(() => [...assigned.values()].filter((a) => a.paused).map((a) => a.tp)),
      batches: Stream.fromEffectRepeat(next)
    }
  })
