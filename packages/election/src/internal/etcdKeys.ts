/**
 * How the etcd backend lays ZooKeeper's tree on etcd's flat keyspace: a node at
 * path `P` of depth `d` is the key `<root>/n<ddd><P>` holding a small JSON header
 * (data version, ephemeral owner) and the data, so the direct children of `P`
 * are one prefix range; its children version and sequence counter live in
 * `<root>/m<P>`.
 *
 * @internal
 */
import { type Coordination, CoordinationPaths } from "@strata/core"
import type { ICompare, IKeyValue, IRequestOp } from "etcd3"

/** A failed check inside a simulated transaction or a path check, thrown and caught as a `CoordinationError`. */
export class Fail {
  constructor(readonly reason: Coordination.ErrorReason) {}
}

/** Throws `Fail` with `reason`. */
export const fail = (reason: Coordination.ErrorReason): never => {
  throw new Fail(reason)
}

/** Throws `Fail` when `path` breaks the path rules every backend shares. */
export const validatePath = (path: string, sequential = false): void => {
  const reason = CoordinationPaths.invalidPath(path, sequential)
  if (reason !== undefined) fail(reason)
}

const depthOf = (path: string): number => (path === "/" ? 0 : path.split("/").length - 1)

/** `n` in decimal, zero-padded to `width` digits. */
export const pad = (n: number, width: number): string => n.toString().padStart(width, "0")

/** Whether a create mode appends a sequence number. */
export const isSequential = (mode: Coordination.CreateMode): boolean =>
  mode === "persistent-sequential" || mode === "ephemeral-sequential"

/** Whether a create mode ties the node to its session's lease. */
export const isEphemeral = (mode: Coordination.CreateMode): boolean =>
  mode === "ephemeral" || mode === "ephemeral-sequential"

/** The first key after every key starting with `prefix` (the end of its range). */
export const prefixEnd = (prefix: Buffer): Buffer => {
  const b = Buffer.from(prefix)
  for (let i = b.length - 1; i >= 0; i--) {
    const byte = b[i] ?? 0
    if (byte < 0xff) {
      b[i] = byte + 1
      return b.subarray(0, i + 1)
    }
  }
  return Buffer.from([0])
}

/** The keys of the tree under `root`: a node's data key, its meta key, and the prefix of its children's data keys. */
export const makeKeys = (root: string) => ({
  data: (path: string): Buffer => Buffer.from(`${root}/n${pad(depthOf(path), 3)}${path}`),
  meta: (path: string): Buffer => Buffer.from(`${root}/m${path}`),
  children: (path: string): Buffer => Buffer.from(`${root}/n${pad(depthOf(path) + 1, 3)}${path === "/" ? "" : path}/`)
})
/** @see makeKeys */
export type Keys = ReturnType<typeof makeKeys>

/** The header stored before a node's data: its data version and ephemeral owner. */
export interface Header {
  readonly v: number
  readonly o: string | null
}

/** A node's meta key's value: its children version and sequence counter. */
export interface Meta {
  cv: number
  seq: number
}

/** A node's data key's value. */
export const encodeData = (header: Header, data: Uint8Array): Buffer =>
  Buffer.concat([Buffer.from(`${JSON.stringify(header)}\n`), Buffer.from(data)])

/** The header and data of a node's data key's value. */
export const decodeData = (value: Buffer): { readonly header: Header; readonly data: Uint8Array } => {
  const i = value.indexOf(0x0a)
  const header = JSON.parse(value.subarray(0, i).toString("utf8")) as Header
  return { header, data: new Uint8Array(value.subarray(i + 1)) }
}

/** A node's meta, zero when its meta key is absent. */
export const decodeMeta = (kv: IKeyValue | undefined): Meta => {
  if (kv === undefined) return { cv: 0, seq: 0 }
  const m = JSON.parse(kv.value.toString("utf8")) as Meta
  return { cv: m.cv, seq: m.seq }
}

/** The node a data key and its meta key hold. */
export const toNode = (kv: IKeyValue, meta: IKeyValue | undefined): Coordination.Node => {
  const { data, header } = decodeData(kv.value)
  return {
    data,
    stat: {
      version: header.v,
      childrenVersion: decodeMeta(meta).cv,
      ephemeralOwner: header.o,
      createdOrder: Number(kv.create_revision),
      modifiedOrder: Number(kv.mod_revision)
    }
  }
}

/** A range read of one key, or of `[key, rangeEnd)`. */
export const range = (key: Buffer, rangeEnd?: Buffer, keysOnly = false): IRequestOp => ({
  request_range: {
    key,
    ...(rangeEnd === undefined ? {} : { range_end: rangeEnd }),
    ...(keysOnly ? { keys_only: true } : {})
  }
})

/** A compare that holds while `key` is as it was read (`kv`, or absent). */
export const pinned = (key: Buffer, kv: IKeyValue | undefined): ICompare =>
  kv === undefined
    ? { key, target: "Version", result: "Equal", version: 0 }
    : { key, target: "Mod", result: "Equal", mod_revision: kv.mod_revision }
