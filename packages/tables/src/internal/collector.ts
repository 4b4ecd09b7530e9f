/**
 * What the write path shares: a registered table with its open partitions, and the collector of the writes one
 * `process` (or `processBatch`) call makes, read back by the same call.
 *
 * @internal
 */
import type { Models, TableManager } from "@strata/core"
import type { Codecs } from "../Table.js"
import { Context } from "effect"
import type { Change, PartitionWrites } from "./partitionWrites.js"

/** A registered table and its partitions open here. */
export interface Registered {
  readonly info: TableManager.TableInfo
  readonly partitions: Map<number, PartitionWrites>
  /** The key and value codecs of a table registered with a schema (none: added as raw bytes). */
  codecs: Codecs<unknown, unknown> | undefined
}

/** The writes of one `process` (or `processBatch`) call, in order, and a view for reading them back. */
export interface Collector {
  /** The source record being processed now. */
  source: Models.TopicPartitionOffset | undefined
  readonly writes: Array<{
    readonly table: Registered
    readonly partition: number
    readonly change: Change
    readonly source: Models.TopicPartitionOffset | undefined
  }>
  /** This call's changes by partition and key (`keyId`). */
  readonly view: Map<PartitionWrites, Map<string, Change>>
}

/** An empty collector for writes of `source` (none: writes outside `process`). */
export const make = (source: Models.TopicPartitionOffset | undefined): Collector => ({
  source,
  writes: [],
  view: new Map()
})

/** The collector of the source record being processed, if any (set by `process`). */
export const CurrentCollector = Context.Reference<Collector | undefined>("@strata/tables/Tables/CurrentCollector", {
  defaultValue: () => undefined
})
