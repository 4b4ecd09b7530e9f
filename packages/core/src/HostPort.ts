/**
 * `host:port` addresses, read one way everywhere in Strata: a host name or IPv4 address (no spaces, colons, commas or
 * slashes) or a bracketed IPv6 address, a colon, and a port of 1–65535 — or 0–65535 for an address to listen on,
 * where 0 takes any free port.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"

/**
 * A host and a port.
 *
 * @since 0.1.0
 */
export interface HostPort {
  readonly host: string
  readonly port: number
}

/** Options: `listen` allows port 0 (any free port). */
export interface ParseOptions {
  readonly listen?: boolean
}

const shape = /^(\[[0-9A-Fa-f:.]+\]|[^\s:,/[\]]+):(\d{1,5})$/

/**
 * Why `text` is not `host:port`, if it is not: `expected host:port`, or the port outside its range.
 *
 * @since 0.1.0
 */
export const invalid = (text: string, options: ParseOptions = {}): string | undefined => {
  const match = shape.exec(text)
  if (match === null) return "expected host:port"
  const port = Number(match[2])
  const lowest = options.listen === true ? 0 : 1
  return port >= lowest && port <= 65535 ? undefined : `port ${port} is outside ${lowest}–65535`
}

/**
 * `text` as a host and port (an IPv6 host without its brackets), if it is `host:port`.
 *
 * @since 0.1.0
 */
export const parse = (text: string, options: ParseOptions = {}): HostPort | undefined => {
  if (invalid(text, options) !== undefined) return undefined
  const at = text.lastIndexOf(":")
  const host = text.slice(0, at)
  return { host: host.startsWith("[") ? host.slice(1, -1) : host, port: Number(text.slice(at + 1)) }
}

/**
 * A host and port as text, an IPv6 host in brackets.
 *
 * @since 0.1.0
 */
export const format = (address: HostPort): string =>
  address.host.includes(":") ? `[${address.host}]:${address.port}` : `${address.host}:${address.port}`

/**
 * A `host:port` string (port 1–65535), refused with `invalid`'s reason.
 *
 * @since 0.1.0
 */
export const HostPortString = Schema.String.check(Schema.makeFilter((text: string) => invalid(text)))
