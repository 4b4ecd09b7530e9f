/**
 * The one way Strata retries: an effect tried again on a `Schedule` (a fixed pause, or `backoff`'s doubling one),
 * within a deadline or a number of tries, only for the failures `while` accepts, saying why it failed on the first
 * failure and every so often after (a request that cannot get through is seen in the log, not a line each pause).
 *
 * @since 0.1.0
 */
import { Duration, Effect, Schedule } from "effect"
import { dual } from "effect/Function"

/**
 * How to retry.
 *
 * @since 0.1.0
 */
export interface Options<E> {
  /** The pauses between tries: `Schedule.spaced(ms)`, `backoff(first, max)`, `Schedule.forever` (none). */
  readonly schedule: Schedule.Schedule<unknown, unknown>
  /** Gives up once this long has passed since the first try: the last failure is the error. */
  readonly deadline?: Duration.Input | undefined
  /** Gives up after this many retries. */
  readonly times?: number | undefined
  /** Retries only the failures this holds for (all, unless given). */
  readonly while?: ((error: E) => boolean) | undefined
  /**
   * Says, as a warning, what failed and why on the first failure and every `every`-th after it (50 unless given);
   * `what` is built only then.
   */
  readonly tell?: { readonly what: () => string; readonly every?: number | undefined } | undefined
}

/**
 * A pause that starts at `first` and doubles after each try, never above `max`.
 *
 * @since 0.1.0
 */
export const backoff = (first: Duration.Input, max: Duration.Input): Schedule.Schedule<Duration.Duration> =>
  Schedule.min([Schedule.exponential(first, 2), Schedule.spaced(max)])

/** The error's message, for the warning. */
const messageOf = (e: unknown): string =>
  typeof e === "object" && e !== null && "message" in e && typeof e.message === "string" ? e.message : String(e)

/**
 * Runs `self`, trying it again as `options` say while it fails.
 *
 * @since 0.1.0
 */
export const retry: {
  <E>(options: Options<E>): <A, R>(self: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
  <A, E, R>(self: Effect.Effect<A, E, R>, options: Options<E>): Effect.Effect<A, E, R>
} = dual(2, <A, E, R>(self: Effect.Effect<A, E, R>, options: Options<E>) => run(self, options))

const run = <A, E, R>(self: Effect.Effect<A, E, R>, options: Options<E>): Effect.Effect<A, E, R> =>
  Effect.suspend(() => {
    const tell = options.tell
    const every = tell?.every ?? 50
    let failures = 0
    const told =
      tell === undefined
        ? self
        : Effect.tapError(self, (e) =>
            ++failures === 1 || failures % every === 0
              ? Effect.logWarning(
                  `${tell.what()} failed (${failures} ${failures === 1 ? "try" : "tries"}): ${messageOf(e)}`
                )
              : Effect.void
          )
    const schedule =
      options.deadline === undefined && options.times === undefined
        ? options.schedule
        : options.schedule.pipe(
            Schedule.upTo({
              ...(options.deadline === undefined ? {} : { duration: Duration.fromInputUnsafe(options.deadline) }),
              ...(options.times === undefined ? {} : { times: options.times })
            })
          )
    return Effect.retry(told, {
      schedule,
      ...(options.while === undefined ? {} : { while: options.while })
    })
  })
