/**
 * The election package's own option schemas: `host:port` addresses and absolute
 * paths. Durations, integers and the decoder are core's `OptionSchemas`.
 *
 * @internal
 */
import { CoordinationPaths, HostPort } from "@strata/core"
import { Schema } from "effect"

/** Why `host:port` is not an address with a port in 1–65535, if it is not (core's `HostPort`). */
export const invalidHostPort = (address: string): string | undefined => HostPort.invalid(address)

/** Why `path` is not a coordination path (absolute, no empty or relative segment, no trailing slash), if it is not. */
export const invalidAbsolutePath = (path: string): string | undefined => {
  const reason = CoordinationPaths.invalidPath(path)
  return reason === undefined ? undefined : `expected an absolute path such as "/strata" (${reason.detail})`
}

/** A coordination path: absolute, no empty or relative segment, no trailing slash; `"/"` is allowed. */
export const AbsolutePath = Schema.String.check(Schema.makeFilter(invalidAbsolutePath))
