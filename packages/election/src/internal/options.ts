/**
 * The election package's own option schemas: `host:port` addresses and absolute
 * paths. Durations, integers and the decoder are core's `OptionSchemas`.
 *
 * @internal
 */
import { CoordinationPaths } from "@strata/core"
import { Schema } from "effect"

/** Why `host:port` is not an address with a port in 1–65535, if it is not. */
export const invalidHostPort = (address: string): string | undefined => {
  const match = /^([^\s:,/]+):(\d{1,5})$/.exec(address)
  if (match === null) return "expected host:port"
  const port = Number(match[2])
  return port >= 1 && port <= 65535 ? undefined : `port ${port} is outside 1–65535`
}

/** Why `path` is not a coordination path (absolute, no empty or relative segment, no trailing slash), if it is not. */
export const invalidAbsolutePath = (path: string): string | undefined => {
  const reason = CoordinationPaths.invalidPath(path)
  return reason === undefined ? undefined : `expected an absolute path such as "/strata" (${reason.detail})`
}

/** A coordination path: absolute, no empty or relative segment, no trailing slash; `"/"` is allowed. */
export const AbsolutePath = Schema.String.check(Schema.makeFilter(invalidAbsolutePath))
