/**
 * Schema models shared by every Strata protocol.
 *
 * Numbers that name positions in a log (offsets, epochs, ids) are non-negative
 * safe integers: they cross process boundaries as JSON and must round-trip.
 *
 * @since 0.1.0
 */
import { Schema } from "effect"

const nonNegativeInt = (identifier: string, description: string) =>
  Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)).annotate({ identifier, description })

/** A topic name: 1–249 characters of `[a-zA-Z0-9._-]` (Kafka's rule). */
export const Topic = Schema.String.check(Schema.isPattern(/^[a-zA-Z0-9._-]{1,249}$/)).annotate({
  identifier: "Topic",
  description: "1–249 characters of a-z, A-Z, 0-9, '.', '_', '-'"
})
/** @see Topic */
export type Topic = typeof Topic.Type

/** A partition number (0-based). */
export const Partition = nonNegativeInt("Partition", "a partition number ≥ 0")
/** @see Partition */
export type Partition = typeof Partition.Type

/** A position in a partition's log; the highwater is the offset the next record will get. */
export const Offset = nonNegativeInt("Offset", "a log offset ≥ 0")
/** @see Offset */
export type Offset = typeof Offset.Type

/** A monotonically increasing generation number used as a fencing token. */
export const Epoch = nonNegativeInt("Epoch", "an epoch ≥ 0")
/** @see Epoch */
export type Epoch = typeof Epoch.Type

/** The id of a server (coordinator or tablet server). */
export const ServerId = nonNegativeInt("ServerId", "a server id ≥ 0")
/** @see ServerId */
export type ServerId = typeof ServerId.Type

/** One partition of one topic. */
export const TopicPartition = Schema.Struct({ topic: Topic, partition: Partition }).annotate({
  identifier: "TopicPartition"
})
/** @see TopicPartition */
export type TopicPartition = typeof TopicPartition.Type

/** A stable string key for a topic-partition, usable in maps: `"topic/partition"`. */
export const tpKey = (tp: TopicPartition): string => `${tp.topic}/${tp.partition}`

/** Structural equality of two topic-partitions. */
export const tpEquals = (a: TopicPartition, b: TopicPartition): boolean =>
  a.topic === b.topic && a.partition === b.partition

/** Orders topic-partitions by topic, then partition. */
export const tpCompare = (a: TopicPartition, b: TopicPartition): number =>
  a.topic < b.topic ? -1 : a.topic > b.topic ? 1 : a.partition - b.partition

/** A topic-partition paired with an offset (a commit, a persisted position, a seek). */
export const TopicPartitionOffset = Schema.Struct({ topic: Topic, partition: Partition, offset: Offset }).annotate({
  identifier: "TopicPartitionOffset"
})
/** @see TopicPartitionOffset */
export type TopicPartitionOffset = typeof TopicPartitionOffset.Type

/** A tablet: one bucket of one replicated table (Fluss' TableBucket). */
export const TabletId = Schema.Struct({
  table: Schema.NonEmptyString,
  bucket: nonNegativeInt("Bucket", "a bucket number ≥ 0")
}).annotate({ identifier: "TabletId" })
/** @see TabletId */
export type TabletId = typeof TabletId.Type

/** A stable string key for a tablet: `"table/bucket"`. */
export const tabletKey = (t: TabletId): string => `${t.table}/${t.bucket}`

/**
 * The leader and in-sync replica set of one tablet, as the coordinator writes it.
 *
 * `leader` is `null` while the tablet has no live leader. `leaderEpoch` bumps on
 * every leader change; `coordinatorEpoch` fences writes by a stale coordinator;
 * `version` is the compare-and-set version of the stored record.
 */
export const LeaderAndIsr = Schema.Struct({
  leader: Schema.NullOr(ServerId),
  leaderEpoch: Epoch,
  isr: Schema.Array(ServerId),
  coordinatorEpoch: Epoch,
  version: nonNegativeInt("Version", "a compare-and-set version ≥ 0")
}).annotate({ identifier: "LeaderAndIsr" })
/** @see LeaderAndIsr */
export type LeaderAndIsr = typeof LeaderAndIsr.Type

/** Where a leader can be reached, with the epoch that fences its actions. */
export const LeaderInfo = Schema.Struct({
  serverId: ServerId,
  epoch: Epoch,
  address: Schema.String
}).annotate({ identifier: "LeaderInfo" })
/** @see LeaderInfo */
export type LeaderInfo = typeof LeaderInfo.Type
