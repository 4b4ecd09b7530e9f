/**
 * Core's `Recovery` on a changelog source and a restore target (ARCHITECTURE
 * §4, Faust's `Recovery`): after each assignment, wait `recoveryDelay`, read
 * each active changelog partition's highwater and its store's persisted offset,
 * refuse a store that claims more than its changelog holds (`ConsistencyError`,
 * or wipe and restore it when configured), seek to `max(persisted + 1, log
 * start)` and apply records in batches of `recoveryBufferSize` until every
 * active partition reaches the highwater captured at the start; then log
 * "Worker ready" and complete `waitUntilCompleted`.
 *
 * This is the first increment of issue 7: standby tailing, progress tables,
 * stall warnings and per-partition readiness hand-off come next.
 *
 * @since 0.1.0
 */
import {
  type ChangelogSource,
  ConsistencyError,
  type LogRecord,
  type Offset,
  type RecoveryEvent,
  RecoveryError,
  type RecoveryShape,
  type RecoveryStats,
  RestoreFailed,
  type RestoreTarget,
  type TopicPartition,
  tpKey
} from "@strata/core"
import { Deferred, Duration, Effect, Fiber, Option, PubSub, Ref, type Scope, Stream } from "effect"

/** Options of the changelog recovery. */
export interface ChangelogRecoveryOptions {
  /** Pause before restoring, so a burst of rebalances settles (default 0). */
  readonly recoveryDelay?: Duration.Input
  /** Records applied per store batch (default 1000). */
  readonly recoveryBufferSize?: number
  /**
   * A store whose persisted offset is beyond its changelog's highwater: `"fail"`
   * with `ConsistencyError` (default, as Faust), or `"wipe"` the partition's
   * store and restore it from the changelog.
   */
  readonly onInconsistency?: "fail" | "wipe"
}

interface Progress {
  readonly tp: TopicPartition
  readonly highwater: Offset
  /** The next offset to apply. */
  offset: Offset
}

const restoreFailed = (tp: TopicPartition, detail: string) =>
  new RecoveryError({ reason: new RestoreFailed({ topic: tp.topic, partition: tp.partition, detail }) })

/** Builds the recovery; its background restore runs in the scope. */
export const make = (
  source: ChangelogSource,
  target: RestoreTarget,
  options: ChangelogRecoveryOptions = {}
): Effect.Effect<RecoveryShape, never, Scope.Scope> =>
  Effect.gen(function* () {
    const delay = Duration.fromInputUnsafe(options.recoveryDelay ?? 0)
    const bufferSize = Math.max(1, options.recoveryBufferSize ?? 1000)
    const wipe = options.onInconsistency === "wipe"
    const scope = yield* Effect.scope
    const events = yield* PubSub.unbounded<RecoveryEvent>()
    const progress = yield* Ref.make<ReadonlyArray<Progress>>([])
    let completed = yield* Deferred.make<void, RecoveryError>()
    yield* Deferred.succeed(completed, undefined)
    let running: Fiber.Fiber<void> | undefined
    let active: ReadonlyArray<TopicPartition> = []

    const publish = (event: RecoveryEvent) => PubSub.publish(events, event)

    /** Restores the active partitions to the highwater read at the start. */
    const restore = (tps: ReadonlyArray<TopicPartition>, done: Deferred.Deferred<void, RecoveryError>) =>
      Effect.gen(function* () {
        if (Duration.isGreaterThan(delay, Duration.zero)) yield* Effect.sleep(delay)
        yield* publish({ _tag: "Started", active: tps, standby: [] })
        const offsets = yield* source
          .offsets(tps)
          .pipe(Effect.mapError((e) => restoreFailed(tps[0] ?? { topic: "?", partition: 0 }, e.message)))
        const pending = new Map<string, Progress>()
        for (const o of offsets) {
          const tp = { topic: o.topic, partition: o.partition }
          const persisted = yield* target
            .persistedOffset(tp)
            .pipe(Effect.mapError((reason) => new RecoveryError({ reason })))
          let from = Option.match(persisted, { onNone: () => 0, onSome: (p) => p + 1 })
          if (Option.isSome(persisted) && persisted.value >= o.highwater) {
            if (!wipe) {
              return yield* Effect.fail(
                new RecoveryError({
                  reason: new ConsistencyError({
                    topic: o.topic,
                    partition: o.partition,
                    persisted: persisted.value,
                    highwater: o.highwater
                  })
                })
              )
            }
            yield* Effect.logWarning(
              `${tpKey(tp)}: persisted offset ${persisted.value} is beyond the changelog highwater ${o.highwater}; wiping the store and restoring it`
            )
            yield* target.wipe(tp).pipe(Effect.mapError((reason) => new RecoveryError({ reason })))
            from = 0
          }
          const start = Math.max(from, o.logStart)
          if (start < o.highwater) {
            pending.set(tpKey(tp), { tp, highwater: o.highwater, offset: start })
            yield* source.seek(tp, start).pipe(Effect.mapError((e) => restoreFailed(tp, e.message)))
          } else {
            yield* publish({ _tag: "PartitionReady", topic: tp.topic, partition: tp.partition })
          }
        }
        yield* Ref.set(progress, [...pending.values()])
        if (pending.size > 0) yield* source.resume([...pending.values()].map((p) => p.tp))
        while (pending.size > 0) {
          const records = yield* source.take(bufferSize).pipe(Effect.mapError((e) => restoreFailed(tps[0]!, e.message)))
          const byPartition = new Map<string, Array<LogRecord>>()
          for (const r of records) {
            const key = tpKey(r)
            const p = pending.get(key)
            // Records of partitions not being restored, or older than the position (fetched before a seek), are skipped.
            if (p === undefined || r.offset < p.offset || r.offset >= p.highwater) continue
            let list = byPartition.get(key)
            if (list === undefined) {
              list = []
              byPartition.set(key, list)
            }
            list.push(r)
          }
          for (const [key, list] of byPartition) {
            const p = pending.get(key)!
            yield* target.apply(p.tp, list).pipe(Effect.mapError((reason) => new RecoveryError({ reason })))
            p.offset = list[list.length - 1]!.offset + 1
            if (p.offset >= p.highwater) {
              pending.delete(key)
              yield* source.pause([p.tp])
              yield* publish({ _tag: "PartitionReady", topic: p.tp.topic, partition: p.tp.partition })
            }
          }
        }
        yield* publish({ _tag: "Completed" })
        yield* Effect.logInfo("Worker ready")
        yield* Deferred.succeed(done, undefined)
      }).pipe(
        Effect.catch((error) => Deferred.fail(done, error)),
        Effect.annotateLogs({ component: "recovery" })
      )

    const restart = Effect.gen(function* () {
      if (running !== undefined) yield* Fiber.interrupt(running)
      const done = yield* Deferred.make<void, RecoveryError>()
      // Waiters of an earlier, interrupted run follow the new one.
      if (!(yield* Deferred.isDone(completed))) yield* Deferred.completeWith(completed, Deferred.await(done))
      completed = done
      running = yield* restore(active, done).pipe(Effect.asVoid, Effect.forkIn(scope))
    })
    yield* Effect.addFinalizer(() => (running === undefined ? Effect.void : Fiber.interrupt(running)))

    const stats: Effect.Effect<RecoveryStats> = Effect.map(Ref.get(progress), (list) => {
      const partitions = list.map((p) => ({
        topic: p.tp.topic,
        partition: p.tp.partition,
        highwater: p.highwater,
        offset: p.offset,
        remaining: Math.max(0, p.highwater - p.offset),
        standby: false
      }))
      return { partitions, remaining: partitions.reduce((n, p) => n + p.remaining, 0), etaMs: undefined }
    })

    return {
      assign: (assignment) =>
        Effect.suspend(() => {
          const keys = new Set(active.map(tpKey))
          active = [...active, ...assignment.active.filter((tp) => !keys.has(tpKey(tp)))]
          return restart
        }),
      revoke: (tps) =>
        Effect.suspend(() => {
          const gone = new Set(tps.map(tpKey))
          active = active.filter((tp) => !gone.has(tpKey(tp)))
          return Effect.andThen(source.pause(tps), restart)
        }),
      stats,
      events: Stream.fromPubSub(events),
      waitUntilCompleted: Effect.suspend(() => Deferred.await(completed))
    } satisfies RecoveryShape
  })
