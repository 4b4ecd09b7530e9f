/**
 * The rebalance settings (the `rebalance.*` keys), decoded and checked by one Schema: every key optional with its
 * default, a bad value or an unknown key refused with an error naming the key.
 *
 * @since 0.1.0
 */
import { OptionSchemas } from "@strata/core"
import { type Duration, Effect, Schema } from "effect"

const withDefault = <A extends number | boolean>(schema: Schema.Codec<A, A>, value: A) =>
  schema.pipe(Schema.withDecodingDefaultKey(Effect.succeed(value)))
/** A duration setting (any `Duration.Input`; a number is milliseconds) with its default. */
const durationWithDefault = (bound: "positive" | "nonNegative", value: Duration.Input) =>
  OptionSchemas.DurationOption(bound).pipe(Schema.withDecodingDefaultKey(Effect.succeed(value)))

/** A finite number in (`above`, `atMost`]. */
const numberIn = (above: number, atMost: number) =>
  Schema.Number.check(Schema.isFinite(), Schema.isGreaterThan(above), Schema.isLessThanOrEqualTo(atMost))

/**
 * The rebalance settings (every key optional, with the default given). A duration takes any `Duration.Input`
 * (`"5 minutes"`, `{ seconds: 30 }`, or a number of milliseconds) and decodes to a `Duration`.
 *
 * @since 0.1.0
 */
export const RebalanceConfig = Schema.Struct({
  /** How often the controller's trigger checks the imbalance (5 minutes); it also checks when a server joins. */
  checkInterval: durationWithDefault("positive", "5 minutes"),
  /**
   * The imbalance (coefficient of variation of replica counts over the eligible servers) above which a rebalance
   * starts, in (0, 10] (0.1). The trigger re-arms only below half of it.
   */
  triggerThreshold: withDefault(numberIn(0, 10), 0.1),
  /** How long after a rebalance ends before the trigger may start another (10 minutes; 0: at once). */
  cooldown: durationWithDefault("nonNegative", "10 minutes"),
  /** A batch's share of the plan's moves, in (0, 1] (0.2: five batches). */
  batchRatio: withDefault(numberIn(0, 1), 0.2),
  /** The most moves in flight into or out of one server at once (5). */
  maxConcurrentMigrations: withDefault(OptionSchemas.PositiveInt, 5),
  /** The most moves in flight in the whole cluster at once (50). */
  maxClusterMigrations: withDefault(OptionSchemas.PositiveInt, 50),
  /** The fetch rate of a server's adding replicas, in bytes per second (0: unthrottled, the default). */
  throttleBytesPerSec: withDefault(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)), 0),
  /** How long one move may take before it is retried, then cancelled (10 minutes). */
  moveTimeout: durationWithDefault("positive", "10 minutes"),
  /** The window the stability gate watches after a batch (30 seconds). */
  gateWindow: durationWithDefault("positive", "30 seconds"),
  /** The servers' append latency bound during a rebalance, as a factor of its value before it, at least 1 (2). */
  gateLatencyFactor: withDefault(Schema.Number.check(Schema.isFinite(), Schema.isGreaterThanOrEqualTo(1)), 2),
  /** Whether the trigger starts rebalances by itself (true); a manual start works either way. */
  enabled: withDefault(Schema.Boolean, true)
})

/**
 * The decoded settings.
 *
 * @since 0.1.0
 */
export type RebalanceConfig = typeof RebalanceConfig.Type

/**
 * The settings' input (every key optional).
 *
 * @since 0.1.0
 */
export type RebalanceConfigInput = typeof RebalanceConfig.Encoded

/**
 * Rebalance settings that are not valid: `option` names the key, `value` is what was given, `detail` the rule.
 *
 * @since 0.1.0
 */
export class InvalidRebalanceOptions extends Schema.TaggedError<InvalidRebalanceOptions>()("InvalidRebalanceOptions", {
  option: Schema.String,
  value: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `invalid rebalance option ${this.option} = ${this.value}: ${this.detail}`
  }
}

const decodeConfig = OptionSchemas.decodeOptions(RebalanceConfig, { exact: true })

/**
 * Decodes and checks settings given as data (a key the schema does not name, a typo, is refused too).
 *
 * @since 0.1.0
 */
export const decode = (input: unknown): Effect.Effect<RebalanceConfig, InvalidRebalanceOptions> =>
  decodeConfig(input).pipe(
    Effect.mapError((bad) => {
      const first = OptionSchemas.summary(bad)
      return new InvalidRebalanceOptions({ ...first, value: first.value === "undefined" ? "unset" : first.value })
    })
  )

/**
 * The settings from typed input: the keys given, checked, and the defaults for the rest.
 *
 * @since 0.1.0
 */
export const make = (input: RebalanceConfigInput = {}): Effect.Effect<RebalanceConfig, InvalidRebalanceOptions> =>
  decode(input)

/**
 * Every setting at its default.
 *
 * @since 0.1.0
 */
export const defaults: RebalanceConfig = Schema.decodeUnknownSync(RebalanceConfig)({})
