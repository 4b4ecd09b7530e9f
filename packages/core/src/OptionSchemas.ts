/**
 * What every package's options schemas share: positive integers, durations, and
 * one decoder that turns a schema failure into the bad options it found (each
 * named by its path, with its value), so every `make` reports bad options alike.
 *
 * @since 0.1.0
 */
import { Duration, Effect, Option, Schema, SchemaIssue, SchemaTransformation } from "effect"

/** A positive integer (milliseconds, counts). */
export const PositiveInt = Schema.Int.check(Schema.isGreaterThan(0))

const DURATION_OBJECT_KEYS = new Set([
  "weeks",
  "days",
  "hours",
  "minutes",
  "seconds",
  "milliseconds",
  "microseconds",
  "nanoseconds"
])

/** Whether `u` is a `Duration.DurationObject` (e.g. `{ seconds: 30 }`): known keys, finite numbers. */
const isDurationObject = (u: object): boolean => {
  const entries = Object.entries(u)
  return (
    entries.length > 0 &&
    entries.every(
      ([key, value]) => DURATION_OBJECT_KEYS.has(key) && typeof value === "number" && Number.isFinite(value)
    )
  )
}

/** `Duration.Input` as a duration, if it is one (`Duration.fromInput` alone reads any object as a duration). */
const durationOf = (u: unknown): Option.Option<Duration.Duration> => {
  if (Duration.isDuration(u)) return Option.some(u)
  if (typeof u === "number" && !Number.isFinite(u)) return Option.none()
  const plain = typeof u === "number" || typeof u === "bigint" || typeof u === "string" || Array.isArray(u)
  if (!plain && (typeof u !== "object" || u === null || !isDurationObject(u))) return Option.none()
  return Duration.fromInput(u as Duration.Input)
}

const isDurationInput = (u: unknown): u is Duration.Input => Option.isSome(durationOf(u))

/** Any `Duration.Input` (`"5 seconds"`, a number of milliseconds, a `Duration`). */
export const AnyDurationInput = Schema.declare(isDurationInput, {
  expected: `a duration such as "5 seconds" or a number of milliseconds`
})

/** A `Duration.Input`, finite, and positive or at least zero. */
export const DurationInput = (bound: "positive" | "nonNegative") =>
  AnyDurationInput.check(
    Schema.makeFilter((input: Duration.Input) => {
      const d = Duration.fromInputUnsafe(input)
      if (!Duration.isFinite(d)) return "expected a finite duration"
      if (bound === "positive") return Duration.toMillis(d) > 0 ? undefined : "expected a duration above zero"
      return Duration.toMillis(d) >= 0 ? undefined : "expected a duration of zero or more"
    })
  )

/**
 * A duration option, the one convention every Strata option follows: any `Duration.Input` in (`"5 seconds"`,
 * `{ seconds: 5 }`, a number of milliseconds, a `Duration`), finite and within `bound`; a `Duration` out. It encodes
 * back to a number of milliseconds, so a stored or sent configuration stays JSON.
 */
export const DurationOption = (bound: "positive" | "nonNegative") =>
  DurationInput(bound).pipe(
    Schema.decodeTo(
      Schema.Duration,
      SchemaTransformation.transform({
        decode: (input: Duration.Input) => Duration.fromInputUnsafe(input),
        encode: (d: Duration.Duration): Duration.Input => Duration.toMillis(d)
      })
    )
  )

/** One option a schema rejected. */
export interface BadOption {
  /** Its path, e.g. `root`, `endpoints[0]`, `services[1].name`; `options` for the whole object. */
  readonly option: string
  /** Its value, JSON-formatted. */
  readonly value: string
  /** What is wrong with it. */
  readonly detail: string
}

/** The first bad option, the others appended to its detail. */
export const summary = (bad: readonly [BadOption, ...Array<BadOption>]): BadOption => {
  const [first, ...rest] = bad
  return rest.length === 0
    ? first
    : {
        ...first,
        detail: `${first.detail}; also ${rest.map((b) => `${b.option} = ${b.value}: ${b.detail}`).join("; ")}`
      }
}

const optionOf = (path: ReadonlyArray<PropertyKey>): string =>
  path.length === 0
    ? "options"
    : path.reduce<string>(
        (name, key, i) =>
          typeof key === "number" ? `${name}[${key}]` : i === 0 ? String(key) : `${name}.${String(key)}`,
        ""
      )

const valueAt = (input: unknown, path: ReadonlyArray<PropertyKey>): unknown =>
  path.reduce<unknown>(
    (value, key) =>
      typeof value === "object" && value !== null ? (value as Record<PropertyKey, unknown>)[key] : undefined,
    input
  )

/**
 * A secret option (a password, a private key): text or a `Redacted` holding it, decoded into a `Redacted`, so it
 * never appears in a log line, an error or an inspected value.
 */
export const Secret = Schema.Union([Schema.Redacted(Schema.String), Schema.RedactedFromValue(Schema.String)])

/** Option names whose values are secrets: a bad one is reported without its value. */
const SECRET_NAME = /^(password|key|secret|token|privateKey)$/i

/** A value as JSON (what a user would have written), on one line. */
export const show = (value: unknown): string => {
  if (value === undefined) return "undefined"
  if (typeof value === "bigint") return `${value}n`
  if (typeof value === "number" && !Number.isFinite(value)) return String(value)
  if (typeof value === "function") return "a function"
  if (Duration.isDuration(value)) return Duration.format(value)
  try {
    return JSON.stringify(value) ?? String(value)
  } catch {
    return String(value)
  }
}

const lowerFirst = (s: string): string =>
  s === "Missing key" ? "required" : s.startsWith("Expected") ? `e${s.slice(1)}` : s
const formatter = SchemaIssue.makeFormatterStandardSchemaV1()

/**
 * Decodes options with `schema` (every failure collected). A failure is the
 * list of bad options, in the schema's field order. `exact`: an option the
 * schema does not name (a typo) is one of them.
 */
export const decodeOptions =
  <T>(schema: Schema.Decoder<T>, options?: { readonly exact?: boolean }) =>
  (input: unknown): Effect.Effect<T, readonly [BadOption, ...Array<BadOption>]> =>
    Schema.decodeUnknownEffect(schema)(input, {
      errors: "all",
      ...(options?.exact === true ? { onExcessProperty: "error" as const } : {})
    }).pipe(
      Effect.mapError((error) => {
        const issues = formatter(error.issue).issues.map((issue): BadOption => {
          const path = (issue.path ?? []).map((p) => (typeof p === "object" ? p.key : p))
          const last = path[path.length - 1]
          return {
            option: optionOf(path),
            value: typeof last === "string" && SECRET_NAME.test(last) ? "<redacted>" : show(valueAt(input, path)),
            detail: lowerFirst(issue.message)
          }
        })
        const [first = { option: "options", value: show(input), detail: error.message }, ...rest] = issues
        return [first, ...rest] as const
      })
    )
