/**
 * The settings of a replicated cluster that its coordinator and tablet servers must agree on, decoded and checked
 * by one Schema: each value on its own, and the rules between them (a bad value's error names its key and the
 * rule it breaks).
 *
 * @since 0.1.0
 */
import { OptionSchemas } from "@strata/core"
import { Duration, Effect, Schema } from "effect"
import { ANSWER_RESERVE, DEFAULT_MAX_FRAME_BYTES, fetchBytesWithin } from "./internal/frames.js"

const PositiveInt = OptionSchemas.PositiveInt
const withDefault = <A extends number | boolean | string>(schema: Schema.Codec<A, A>, value: A) =>
  schema.pipe(Schema.withDecodingDefaultKey(Effect.succeed(value)))
/** A duration setting (any `Duration.Input`; a number is milliseconds) with its default. */
const durationWithDefault = (bound: "positive" | "nonNegative", value: Duration.Input) =>
  OptionSchemas.DurationOption(bound).pipe(Schema.withDecodingDefaultKey(Effect.succeed(value)))

/**
 * The replication settings (every key optional, with the default given). A duration takes any `Duration.Input`
 * (`"10 seconds"`, or a number of milliseconds) and decodes to a `Duration`.
 *
 * @since 0.1.0
 */
export const ReplicationConfig = Schema.Struct({
  /** Replicas per tablet (3). */
  replicationFactor: withDefault(PositiveInt, 3),
  /** In-sync replicas an acks=all append needs, and below which the high watermark stops (2). */
  minInsyncReplicas: withDefault(PositiveInt, 2),
  /** The tablet servers' coordination session timeout: how long a dead server goes unnoticed (10 seconds). */
  sessionTimeout: durationWithDefault("positive", "10 seconds"),
  /** A follower not caught up for this long leaves the ISR (30 seconds); checked every half of it. */
  replicaLagTimeMax: durationWithDefault("positive", "30 seconds"),
  /** The most a follower's fetch returns (1 MiB; at least one batch). */
  fetchMaxBytes: withDefault(PositiveInt, 1_048_576),
  /** How long a fetch with nothing to return waits for an append (500 millis). */
  fetchMaxWait: durationWithDefault("positive", "500 millis"),
  /** How long an acks=all append waits for its records to be replicated (30 seconds). */
  appendTimeout: durationWithDefault("positive", "30 seconds"),
  /** The pause before a failed fetch or ISR request is sent again (100 millis). */
  retryBackoff: durationWithDefault("positive", "100 millis"),
  /**
   * How long a tablet remembers an idempotent producer that has stopped appending to it (1 day, as Kafka's
   * `producer.id.expiration.ms`); checked with the followers' lag. A producer back after that starts a new
   * producer epoch.
   */
  producerIdExpiration: durationWithDefault("positive", "1 day"),
  /**
   * How often each replica deletes what its table's retention lets go (Kafka's `log.retention.check.interval.ms`).
   */
  retentionCheckInterval: durationWithDefault("positive", "5 minutes"),
  /** Elect a replica outside the ISR when no ISR member is live; it may lose acknowledged records (false). */
  uncleanLeaderElection: withDefault(Schema.Boolean, false),
  /**
   * How a new leader is chosen among the live in-sync replicas: the first in assignment order (`first-in-isr`, the
   * default), or the one whose log goes furthest (`largest-log-end`: asked first, so fewer appends that were not
   * acknowledged to all are truncated away, at the price of a round trip before the tablet leads again).
   */
  leaderElection: withDefault(Schema.Literals(["first-in-isr", "largest-log-end"]), "first-in-isr"),
  /**
   * How often the controller moves leadership back to preferred replicas (the first in assignment order) once they
   * are in the ISR again (30 seconds; 0: never). Failover leaves leaders where it put them: without this, a server
   * that restarted leads nothing until its tablets fail over again.
   */
  leaderImbalanceCheckInterval: durationWithDefault("nonNegative", "30 seconds"),
  /**
   * A server's share of its preferred tablets led elsewhere, in percent, above which they move back to it (10).
   */
  leaderImbalancePercent: withDefault(Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 100 })), 10)
}).check(
  Schema.makeFilter((c) => {
    const issues: Array<{ readonly path: ReadonlyArray<PropertyKey>; readonly issue: string }> = []
    const sessionTimeout = Duration.toMillis(c.sessionTimeout)
    const replicaLagTimeMax = Duration.toMillis(c.replicaLagTimeMax)
    const fetchMaxWait = Duration.toMillis(c.fetchMaxWait)
    if (c.minInsyncReplicas > c.replicationFactor) {
      issues.push({
        path: ["minInsyncReplicas"],
        issue: `${c.minInsyncReplicas} must be at most replicationFactor (${c.replicationFactor}): no append could ever be acknowledged`
      })
    }
    if (sessionTimeout >= replicaLagTimeMax) {
      issues.push({
        path: ["replicaLagTimeMax"],
        issue: `${Duration.format(c.replicaLagTimeMax)} must be above sessionTimeout (${Duration.format(c.sessionTimeout)}): a leader would drop its followers from the ISR before a dead leader's session ends`
      })
    }
    if (c.fetchMaxBytes > fetchBytesWithin(DEFAULT_MAX_FRAME_BYTES)) {
      issues.push({
        path: ["fetchMaxBytes"],
        issue: `${c.fetchMaxBytes} must be at most ${fetchBytesWithin(DEFAULT_MAX_FRAME_BYTES)}: a fetch is answered in one frame of the data link, whose frame limit of ${DEFAULT_MAX_FRAME_BYTES} bytes leaves that much for its batches (${ANSWER_RESERVE} go to the answer's header)`
      })
    }
    if (fetchMaxWait * 2 >= replicaLagTimeMax) {
      issues.push({
        path: ["fetchMaxWait"],
        issue: `${Duration.format(c.fetchMaxWait)} must be below half of replicaLagTimeMax (${Duration.format(c.replicaLagTimeMax)}): a caught-up follower waiting on a fetch would look lagging`
      })
    }
    return issues
  })
)

/**
 * The decoded settings.
 *
 * @since 0.1.0
 */
export type ReplicationConfig = typeof ReplicationConfig.Type

/**
 * The settings' input (every key optional).
 *
 * @since 0.1.0
 */
export type ReplicationConfigInput = typeof ReplicationConfig.Encoded

/**
 * Replication settings or a server's options are not valid: `option` names the key, `detail` the rule.
 *
 * @since 0.1.0
 */
export class InvalidReplicaOptions extends Schema.TaggedError<InvalidReplicaOptions>()("InvalidReplicaOptions", {
  option: Schema.String,
  value: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `invalid option ${this.option} = ${this.value}: ${this.detail}`
  }
}

/**
 * The error for options a schema refused (a rule broken by a default names the key as `unset`: its value is in the
 * detail).
 *
 * @since 0.1.0
 */
export const invalidOptions = (bad: readonly [OptionSchemas.BadOption, ...Array<OptionSchemas.BadOption>]) => {
  const first = OptionSchemas.summary(bad)
  return new InvalidReplicaOptions({ ...first, value: first.value === "undefined" ? "unset" : first.value })
}

/**
 * Decodes and checks the settings.
 *
 * @since 0.1.0
 */
export const decode = (input: unknown): Effect.Effect<ReplicationConfig, InvalidReplicaOptions> =>
  OptionSchemas.decodeOptions(ReplicationConfig, { exact: true })(input).pipe(Effect.mapError(invalidOptions))
