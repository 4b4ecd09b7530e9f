/**
 * A follower replica's fetch loop: the Effect shell of `FollowerState`. It runs the machine's commands in order
 * against the replica's log and its leader, feeding each answer back, until its role ends (the fiber is
 * interrupted). A request that fails is sent again after the backoff; a log operation that fails starts the
 * machine over from the log as it is.
 *
 * @internal
 */
import { type Models, Retry } from "@strata/core"
import { Data, type Duration, Effect, Exit, Schedule } from "effect"
import * as FollowerState from "../../machines/FollowerState.js"
import type { LeaderCalls } from "../../wire/Peers.js"
import { recordBytes } from "../ServerMetrics.js"
import { isStorageFailure, type TabletLog, TabletLogError } from "../TabletLog.js"
import { type Hosted, locked, signal } from "./hosted.js"
import type { Throttle } from "./throttle.js"

/** What the loop needs from its server. */
export interface FollowerContext {
  readonly self: Models.ServerId
  /** The server's registration now (each fetch names it). */
  readonly registration: () => number | undefined
  readonly leader: LeaderCalls
  readonly leaderId: Models.ServerId
  readonly leaderEpoch: number
  readonly fetchMaxBytes: number
  /** The server's replication throttle: a fetch of a throttled replica waits for it and fetches what it grants. */
  readonly throttle: Throttle
  /** The pause before a failed request is sent again, and the first pause before a failing follower starts over. */
  readonly retryBackoff: Duration.Duration
  /** The follower machine's start (`FollowerState.become`, or a simulator's mutant of it). */
  readonly become: typeof FollowerState.become
  /** The replica's own store failed in generation `generation`: the server takes it offline (which ends this loop). */
  readonly storageFailed: (generation: number, detail: string) => Effect.Effect<void>
}

/** The replica's role moved on: this loop is over. */
class RoleEnded extends Data.TaggedError("RoleEnded") {}

/** Runs `self` on the replica's log under its lock, if the replica is still in generation `generation`. */
const onLog = <A, E>(
  h: Hosted,
  generation: number,
  self: (log: TabletLog) => Effect.Effect<A, E>
): Effect.Effect<A, E | RoleEnded> =>
  locked(
    h,
    Effect.suspend(
      (): Effect.Effect<A, E | RoleEnded> =>
        h.state.generation !== generation || h.log === undefined ? Effect.fail(new RoleEnded()) : self(h.log)
    )
  )

/** The machine as the log stands now. */
const start = (h: Hosted, generation: number, ctx: FollowerContext) =>
  onLog(h, generation, (log) =>
    Effect.gen(function* () {
      return ctx.become({
        leader: ctx.leaderId,
        leaderEpoch: ctx.leaderEpoch,
        logStartOffset: yield* log.logStartOffset,
        logEndOffset: yield* log.logEndOffset,
        epochs: yield* log.epochs,
        highWatermark: yield* log.highWatermark
      })
    })
  )

/** Runs one command; a request's answer is the machine's next input. */
const run = (
  h: Hosted,
  generation: number,
  ctx: FollowerContext,
  command: FollowerState.Command
): Effect.Effect<FollowerState.Input | undefined, unknown> => {
  const retrying = <A, E extends { readonly message: string }>(request: Effect.Effect<A, E>) =>
    Retry.retry(request, {
      schedule: Schedule.spaced(ctx.retryBackoff),
      tell: { what: () => `server ${ctx.self}: ${h.key}: ${command._tag} from server ${ctx.leaderId}` }
    })
  switch (command._tag) {
    case "AskEndOffset":
      return retrying(
        ctx.leader.endOffsetForEpoch({ tablet: h.tablet, leaderEpoch: ctx.leaderEpoch, epoch: command.epoch })
      ).pipe(
        Effect.map((r) => ({ _tag: "EndOffsetAnswered", leaderEpoch: r.leaderEpoch, answer: r.answer ?? undefined }))
      )
    case "Fetch":
      return Effect.flatMap(ctx.throttle.acquire(h.key, ctx.fetchMaxBytes), (grant) =>
        retrying(
          Effect.suspend(() => {
            const registration = ctx.registration()
            return ctx.leader.fetch({
              tablet: h.tablet,
              follower: ctx.self,
              ...(registration === undefined ? {} : { registration }),
              leaderEpoch: ctx.leaderEpoch,
              offset: command.offset,
              ...(command.lastFetchedEpoch === undefined ? {} : { lastFetchedEpoch: command.lastFetchedEpoch }),
              maxBytes: grant.maxBytes,
              logStartOffset: command.logStartOffset
            })
          })
        ).pipe(
          // What the answer did not use goes back to the throttle (all of it when there was no answer).
          Effect.onExit((exit) => {
            let used = 0
            if (Exit.isSuccess(exit) && exit.value._tag === "Batches") {
              for (const b of exit.value.batches) used += recordBytes(b.records)
            }
            return ctx.throttle.settle(grant, used)
          })
        )
      ).pipe(
        Effect.map((r): FollowerState.Input => {
          switch (r._tag) {
            case "OutOfRange":
              return { _tag: "OutOfRange", leaderEpoch: r.leaderEpoch, logStartOffset: r.logStartOffset }
            case "Diverging":
              return {
                _tag: "Diverging",
                leaderEpoch: r.leaderEpoch,
                answer: r.epoch === null ? undefined : { epoch: r.epoch, endOffset: r.endOffset }
              }
          }
          return {
            _tag: "Fetched",
            leaderEpoch: r.leaderEpoch,
            batches: r.batches,
            highWatermark: r.highWatermark,
            logStartOffset: r.logStartOffset
          }
        })
      )
    case "Truncate":
      return Effect.as(
        onLog(h, generation, (log) => log.truncateTo(command.offset)),
        undefined
      )
    case "ResetTo":
      return Effect.as(
        onLog(h, generation, (log) => log.resetTo(command.offset)),
        undefined
      )
    case "DeleteBefore":
      return Effect.as(
        onLog(h, generation, (log) => log.deleteBefore(command.offset)),
        undefined
      )
    case "Append":
      return Effect.as(
        onLog(h, generation, (log) => Effect.andThen(log.appendBatches(command.batches), signal(h))),
        undefined
      )
    case "CheckpointHighWatermark":
      return Effect.as(
        onLog(h, generation, (log) => log.checkpointHighWatermark(command.highWatermark)),
        undefined
      )
  }
}

/** One life of the machine: from the log as it is, until a log operation fails. */
const life = (h: Hosted, generation: number, ctx: FollowerContext) =>
  Effect.gen(function* () {
    let [state, commands] = yield* start(h, generation, ctx)
    while (commands.length > 0) {
      let next: FollowerState.Input | undefined
      for (const command of commands) {
        next = (yield* run(h, generation, ctx, command)) ?? next
      }
      if (next === undefined) return
      ;[state, commands] = FollowerState.step(state, next)
    }
  })

/** The longest pause before a follower that keeps failing starts over. */
const restartMaxMs = 10_000

/** Whether a life's failure ends the follower (its role ended, its store failed) rather than starting it over. */
const ends = (e: unknown) => e instanceof RoleEnded || (e instanceof TabletLogError && isStorageFailure(e))

/**
 * Follows the leader for generation `generation` of the replica until interrupted. When its own store fails, the
 * replica goes offline (`storageFailed`) and the loop ends. Any other failed log operation (the log and the machine
 * disagree) is told (the first time and every 20th) and the machine starts over from the log, after a backoff that
 * doubles while it keeps failing; a life that ends well starts the next after the retry backoff.
 */
export const follow = (h: Hosted, generation: number, ctx: FollowerContext): Effect.Effect<void> =>
  life(h, generation, ctx).pipe(
    // A defect of a life starts it over too, as a failure does.
    Effect.catchDefect((defect) => Effect.fail(defect)),
    Retry.retry({
      schedule: Retry.backoff(ctx.retryBackoff, restartMaxMs),
      while: (e) => !ends(e),
      tell: { what: () => `${h.key}: the follower of server ${ctx.leaderId}`, every: 20 }
    }),
    Effect.andThen(Effect.sleep(ctx.retryBackoff)),
    Effect.forever,
    Effect.catch((e) =>
      e instanceof TabletLogError && isStorageFailure(e) ? ctx.storageFailed(generation, e.message) : Effect.void
    )
  )
