/**
 * How a Strata process writes its log (`logFormat`): `pretty` (the default: one line an entry, an ISO-8601 timestamp with the date, then
 * the level, `[role id]` and the message),
 * `json` (one JSON object a line: `Logger.consoleJson`) or `logfmt` (`Logger.consoleLogFmt`). Every line of a server
 * process carries its `role` and `id` as annotations.
 *
 * @since 0.1.0
 */
import { Cause, Effect, type Layer, Logger, References, Schema } from "effect"

/**
 * The formats.
 *
 * @since 0.1.0
 */
export const LogFormat = Schema.Literals(["pretty", "json", "logfmt"])

/** @since 0.1.0 */
export type LogFormat = typeof LogFormat.Type

/**
 * The logger layer of `format`: it replaces the default logger.
 *
 * @since 0.1.0
 */
export const layer = (format: LogFormat): Layer.Layer<never> =>
  Logger.layer([
    format === "json" ? Logger.consoleJson : format === "logfmt" ? Logger.consoleLogFmt : Logger.withConsoleLog(oneLine)
  ])

/** A value as `pretty` shows it: text as is, anything else as JSON. */
const shown = (value: unknown): string => {
  if (typeof value === "string") return value
  if (value instanceof Error) return value.message
  try {
    return JSON.stringify(value) ?? String(value)
  } catch {
    return String(value)
  }
}

/**
 * `pretty`: one line an entry (so a grep finds it whole), `<ISO time> <LEVEL> [<role> <id>] <message> key=value...`,
 * a cause after it on the lines below.
 */
const oneLine = Logger.make<unknown, string>(({ cause, date, fiber, logLevel, message }) => {
  const annotations: Record<string, unknown> = { ...fiber.getRef(References.CurrentLogAnnotations) }
  const role = annotations.role
  const id = annotations.id
  delete annotations.role
  delete annotations.id
  const who = role === undefined ? "" : ` [${shown(role)}${id === undefined ? "" : ` ${shown(id)}`}]`
  const text = (Array.isArray(message) ? message : [message]).map(shown).join(" ")
  const rest = Object.entries(annotations)
    .map(([k, v]) => ` ${k}=${shown(v)}`)
    .join("")
  const line = `${date.toISOString()} ${logLevel.toUpperCase().padEnd(5)}${who} ${text}${rest}`
  return cause.reasons.length === 0 ? line : `${line}\n${Cause.pretty(cause)}`
})

/**
 * Runs `self` with the logger of `format`, every line annotated with the process's `role` and `id`.
 *
 * @since 0.1.0
 */
export const withProcessLog =
  (format: LogFormat, role: string, id: number) =>
  <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
    self.pipe(Effect.annotateLogs({ role, id }), Effect.provide(layer(format)))
