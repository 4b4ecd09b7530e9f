/**
 * The shared state of one in-memory log, as a broker holds it: topics and
 * their partitions, consumer groups and their members, transactional epochs and
 * the injected append failures; plus partition lookup.
 */
import * as Log from "../Log.js"
import type { Cause, Queue } from "effect"
import type { Fetcher } from "./memoryLogFetcher.js"
import type { PartitionLog, TopicState } from "./memoryLogPartition.js"
import { invalid } from "./memoryLogPartition.js"

/** One member of a consumer group. */
export interface Member {
  readonly id: string
  readonly topics: ReadonlySet<string>
  readonly fetcher: Fetcher
  readonly events: Queue.Queue<Log.GroupEvent, Log.LogError | Cause.Done>
}

/** A consumer group: its members and committed offsets. */
export interface Group {
  readonly id: string
  /** Members in join order (ids sort in join order too). */
  members: Array<Member>
  /** Next offset to read, per `tpKey`. */
  readonly committed: Map<string, number>
}

/** The group and member behind a `GroupConsumer` this log made. */
export interface GroupConsumerOf {
  readonly group: Group
  readonly member: Member
}

/** Everything one in-memory log holds. */
export interface Broker {
  /** Largest record (key + value + headers) accepted, in bytes. */
  readonly maxRecordBytes: number
  readonly topics: Map<string, TopicState>
  readonly groups: Map<string, Group>
  /** The last member id number given out (member ids sort in join order). */
  memberSeq: number
  /** Topics whose next appends fail (`LogFaults.failAppends`), with how many are left. */
  readonly failing: Map<string, number>
  /** The newest epoch of each transactional id: a producer of an older epoch is fenced. */
  readonly epochs: Map<string, number>
  /** Each group consumer this log made, with its group and member (a commit's offsets are checked against them). */
  readonly members: WeakMap<Log.GroupConsumer, GroupConsumerOf>
}

/** An empty broker. */
export const makeBroker = (maxRecordBytes: number): Broker => ({
  maxRecordBytes,
  topics: new Map(),
  groups: new Map(),
  memberSeq: 0,
  failing: new Map(),
  epochs: new Map(),
  members: new WeakMap()
})

/** The topic, or `UnknownTopic`. */
export const lookupTopic = (s: Broker, topic: string): TopicState | Log.LogError =>
  s.topics.get(topic) ?? Log.logError(new Log.UnknownTopic({ topic }))

/** The partition, or why there is none (`UnknownTopic`, `InvalidRequest`, `UnknownPartition`). */
export const lookup = (s: Broker, topic: string, partition: number): PartitionLog | Log.LogError => {
  const t = lookupTopic(s, topic)
  if ("_tag" in t) return t
  if (!Number.isSafeInteger(partition)) return invalid(`partition must be an integer, got ${partition}`)
  return (
    t.partitions[partition] ??
    Log.logError(new Log.UnknownPartition({ topic, partition, partitions: t.partitions.length }))
  )
}
