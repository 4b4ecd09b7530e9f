/**
 * A tablet server's replication throttle (Kafka's follower reassignment throttle): one token bucket shared by the
 * follower fetches of every replica whose instruction names a throttle (the replicas a move adds here). The bucket
 * fills at the smallest rate those instructions name and holds at most a quarter of a second of it; a throttled
 * fetch first reserves its `maxBytes` (at most the bucket's size, so one fetch cannot carry much more than the rate
 * allows), waiting while the bucket holds less, and gives back what its answer did not use. Bytes are the record
 * bytes (keys, values, headers) the metrics count; time is Effect's `Clock`.
 *
 * So over any stretch of time the throttled fetches of a server take at most `rate × elapsed + capacity` bytes, past
 * that only by a first batch larger than a fetch's `maxBytes` (a read returns it whole), which the bucket then owes.
 *
 * @internal
 */
import { Clock, Effect } from "effect"

/** What a fetch reserved: the `maxBytes` it fetches with, and the tokens it took (0: unthrottled). */
export interface Grant {
  readonly maxBytes: number
  readonly reserved: number
}

/** The server's throttle. */
export interface Throttle {
  /** Sets the throttle of the replica `key` (bytes a second), or clears it (`undefined`). */
  readonly set: (key: string, bytesPerSec: number | undefined) => void
  /** The throttle of the replica `key`, if it has one. */
  readonly of: (key: string) => number | undefined
  /** The rate the bucket fills at now: the smallest throttle set (`undefined`: none is). */
  readonly rate: () => number | undefined
  /**
   * Waits until the bucket holds the next fetch of replica `key` (up to `maxBytes`, at most the bucket's size) and
   * takes it; a replica without a throttle takes nothing and fetches `maxBytes`.
   */
  readonly acquire: (key: string, maxBytes: number) => Effect.Effect<Grant>
  /** Gives back what a fetch reserved and did not use (`used`: the record bytes its answer carried). */
  readonly settle: (grant: Grant, used: number) => Effect.Effect<void>
}

/** How many seconds of the rate the bucket holds at most. */
export const burstSeconds = 0.25

/** The longest a fetch sleeps before it looks again (a throttle lifted or raised meanwhile takes effect then). */
const maxPauseMs = 250

/**
 * The bucket's size at `rate`: what a quarter of a second of it is, at least 1 byte.
 */
export const capacity = (rate: number): number => Math.max(1, Math.floor(rate * burstSeconds))

/** A throttle with no replica throttled (its bucket full once one is). */
export const make = (): Throttle => {
  const rates = new Map<string, number>()
  let tokens = 0
  /** When the bucket was last filled (monotonic nanoseconds), `undefined` while no replica is throttled. */
  let filledAt: bigint | undefined
  const rate = (): number | undefined => {
    let least: number | undefined
    for (const r of rates.values()) if (least === undefined || r < least) least = r
    return least
  }
  /** Fills the bucket for the time since it was last filled, at `r`, up to its size. */
  const fill = (now: bigint, r: number) => {
    const size = capacity(r)
    tokens = filledAt === undefined ? size : Math.min(size, tokens + (Number(now - filledAt) / 1e9) * r)
    filledAt = now
  }
  const acquire = (key: string, maxBytes: number): Effect.Effect<Grant> =>
    Effect.flatMap(Clock.monotonicTimeNanos, (now) => {
      const r = rate()
      if (!rates.has(key) || r === undefined) return Effect.succeed({ maxBytes, reserved: 0 })
      fill(now, r)
      const want = Math.max(1, Math.min(maxBytes, capacity(r)))
      if (tokens >= want) {
        tokens -= want
        return Effect.succeed({ maxBytes: want, reserved: want })
      }
      const pauseMs = Math.min(maxPauseMs, Math.max(1, Math.ceil(((want - tokens) / r) * 1000)))
      return Effect.andThen(Effect.sleep(pauseMs), acquire(key, maxBytes))
    })
  return {
    set: (key, bytesPerSec) => {
      if (bytesPerSec === undefined) rates.delete(key)
      else rates.set(key, bytesPerSec)
      if (rates.size === 0) filledAt = undefined
    },
    of: (key) => rates.get(key),
    rate,
    acquire,
    settle: (grant, used) =>
      Effect.sync(() => {
        const r = rate()
        if (grant.reserved === 0 || r === undefined || filledAt === undefined) return
        tokens = Math.min(capacity(r), tokens + grant.reserved - used)
      })
  }
}
