/**
 * A follower replica's fetch loop: the Effect shell of `FollowerState`. It runs the machine's commands in order
 * against the replica's log and its leader, feeding each answer back, until its role ends (the fiber is
 * interrupted). A request that fails is sent again after the backoff; a log operation that fails starts the
 * machine over from the log as it is.
 *
 * @internal
 */
import type { ServerId } from "@strata/core"
import { Cause, Data, Effect, Exit, Option } from "effect"
import * as FollowerState from "../../machines/FollowerState.js"
import type { LeaderCalls } from "../../wire/Peers.js"
import { isStorageFailure, type TabletLog, TabletLogError } from "../TabletLog.js"
import { type Hosted, locked, retryTelling, signal } from "./hosted.js"

/** What the loop needs from its server. */
export interface FollowerContext {
  readonly self: ServerId
  /** The server's registration now (each fetch names it). */
  readonly registration: () => number | undefined
  readonly leader: LeaderCalls
  readonly leaderId: ServerId
  readonly leaderEpoch: number
  readonly fetchMaxBytes: number
  readonly retryBackoffMs: number
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
    retryTelling(
      request,
      ctx.retryBackoffMs,
      () => `server ${ctx.self}: ${h.key}: ${command._tag} from server ${ctx.leaderId}`
    )
  switch (command._tag) {
    case "AskEndOffset":
      return retrying(
        ctx.leader.endOffsetForEpoch({ tablet: h.tablet, leaderEpoch: ctx.leaderEpoch, epoch: command.epoch })
      ).pipe(
        Effect.map((r) => ({ _tag: "EndOffsetAnswered", leaderEpoch: r.leaderEpoch, answer: r.answer ?? undefined }))
      )
    case "Fetch":
      return retrying(
        Effect.suspend(() => {
          const registration = ctx.registration()
          return ctx.leader.fetch({
            tablet: h.tablet,
            follower: ctx.self,
            ...(registration === undefined ? {} : { registration }),
            leaderEpoch: ctx.leaderEpoch,
            offset: command.offset,
            ...(command.lastFetchedEpoch === undefined ? {} : { lastFetchedEpoch: command.lastFetchedEpoch }),
            maxBytes: ctx.fetchMaxBytes
          })
        })
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
          return { _tag: "Fetched", leaderEpoch: r.leaderEpoch, batches: r.batches, highWatermark: r.highWatermark }
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

/**
 * Follows the leader for generation `generation` of the replica until interrupted. When its own store fails, the replica goes
 * offline (`storageFailed`) and the loop ends. Any other failed log operation (the log and the machine disagree)
 * is logged in one line and the machine starts over from the log, after a backoff that doubles while it keeps
 * failing.
 */
export const follow = (h: Hosted, generation: number, ctx: FollowerContext): Effect.Effect<void> =>
  Effect.gen(function* () {
    let backoff = ctx.retryBackoffMs
    let failures = 0
    while (true) {
      const exit = yield* Effect.exit(life(h, generation, ctx))
      if (Exit.isFailure(exit)) {
        if (Cause.hasInterrupts(exit.cause)) return yield* Effect.interrupt
        const error = Cause.findErrorOption(exit.cause)
        if (Option.isSome(error) && error.value instanceof RoleEnded) return
        const e = Option.getOrUndefined(error)
        if (e instanceof TabletLogError && isStorageFailure(e)) return yield* ctx.storageFailed(generation, e.message)
        failures++
        if (failures === 1 || failures % 20 === 0) {
          const why = e instanceof Error ? e.message : Cause.pretty(exit.cause)
          yield* Effect.logWarning(
            `${h.key}: the follower of server ${ctx.leaderId} starts over (${failures} ${failures === 1 ? "time" : "times"}): ${why}`
          )
        }
        yield* Effect.sleep(backoff)
        backoff = Math.min(backoff * 2, restartMaxMs)
        continue
      }
      failures = 0
      backoff = ctx.retryBackoffMs
      yield* Effect.sleep(ctx.retryBackoffMs)
    }
  })
