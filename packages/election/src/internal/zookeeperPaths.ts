/**
 * Path helpers and ZooKeeper value conversions used by the adapter.
 */
import { type Coordination, CoordinationPaths } from "@strata/core"
import type { Stat as ZkStat } from "node-zookeeper-client"

/** Why a path is invalid, if it is (the rules every backend shares). */
export const invalidPath = (path: string, sequential = false): Coordination.ErrorReason | undefined =>
  CoordinationPaths.invalidPath(path, sequential)

/** The parent of an absolute path (`/` for top-level nodes). */
export const parentOf = CoordinationPaths.parentOf

/** An 8-byte big-endian buffer as a number (zxids stay far below 2^53). */
export const longOf = (buffer: Buffer): number => Number(buffer.readBigInt64BE(0))

/** A session id buffer as the id string sessions and stats share. */
export const sessionIdOf = (buffer: Buffer): string => buffer.toString("hex")

/** Converts ZooKeeper's stat. */
export const statOf = (stat: ZkStat): Coordination.Stat => {
  const owner = stat.ephemeralOwner
  return {
    version: stat.version,
    childrenVersion: stat.cversion,
    ephemeralOwner: owner.every((b) => b === 0) ? null : sessionIdOf(owner),
    createdOrder: longOf(stat.czxid),
    modifiedOrder: longOf(stat.mzxid)
  }
}

/** Copies driver data into a fresh `Uint8Array`. */
export const bytesOf = (data: Buffer | null | undefined): Uint8Array =>
  data === null || data === undefined ? new Uint8Array(0) : new Uint8Array(data)

/** Copies caller data into a driver buffer. */
export const bufferOf = (data: Uint8Array): Buffer => Buffer.from(data)
