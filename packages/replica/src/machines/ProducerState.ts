/**
 * Idempotent appends as a pure function: what a tablet knows of each producer that wrote to it (Kafka's producer
 * state). A producer stamps each batch with its producer id, its producer epoch and the sequence number of the
 * batch's first record (sequences count records, from 0 per producer epoch and tablet). The leader appends a batch
 * whose sequence continues the producer's last one, answers a retry of one of its last
 * {@link RECENT_BATCHES} batches with the offsets it was written at (no second copy), and refuses gaps and older
 * producer epochs.
 *
 * The state travels with the log: every batch carries its producer stamp, followers append it as it is, and the
 * tablet log keeps each producer's entry in the same atomic write as the batch, so a new leader knows every
 * producer its log knows (and a retry after `NotEnoughReplicasAfterAppend` or a lost reply never duplicates).
 *
 * @since 0.1.0
 */
import type * as ReplicaManager from "../protocol/ReplicaManager.js"

/**
 * How many of a producer's latest batches a retry is recognised against (Kafka: 5, the most in-flight requests an
 * idempotent producer may have).
 *
 * @since 0.1.0
 */
export const RECENT_BATCHES = 5

/**
 * A batch's producer stamp: the producer id, its producer epoch, the sequence of the batch's first record.
 *
 * @since 0.1.0
 */
export type Producer = ReplicaManager.ProducerStamp

/**
 * One of a producer's recent batches, as written.
 *
 * @since 0.1.0
 */
export interface Written {
  readonly firstSequence: number
  readonly lastSequence: number
  readonly baseOffset: number
  readonly lastOffset: number
}

/**
 * What a tablet knows of one producer: its current producer epoch and its latest batches, oldest first.
 *
 * @since 0.1.0
 */
export interface Entry {
  readonly epoch: number
  readonly batches: ReadonlyArray<Written>
}

/**
 * The leader's answer to a stamped batch.
 *
 * - `Append`: the batch continues the producer: write it.
 * - `Duplicate`: a retry of a batch already written at `baseOffset`..`lastOffset`: write nothing, answer those.
 * - `OutOfOrder`: the sequence leaves a gap or repeats an older batch this tablet no longer recognises.
 * - `Fenced`: the producer epoch is older than the tablet's: a newer instance of the producer exists.
 * - `UnknownProducer`: the tablet has no entry for the producer (never seen, or its entry is gone with the records
 *   that made it) and the batch does not start a sequence: the producer must start a new producer epoch.
 *
 * @since 0.1.0
 */
export type Verdict =
  | { readonly _tag: "Append" }
  | { readonly _tag: "Duplicate"; readonly baseOffset: number; readonly lastOffset: number }
  | { readonly _tag: "OutOfOrder"; readonly expected: number; readonly sequence: number }
  | { readonly _tag: "Fenced"; readonly epoch: number; readonly current: number }
  | { readonly _tag: "UnknownProducer"; readonly sequence: number }

/**
 * The verdict on a batch of `count` records stamped `producer`, given the producer's entry.
 *
 * @since 0.1.0
 */
export const check = (entry: Entry | undefined, producer: Producer, count: number): Verdict => {
  if (entry === undefined) {
    return producer.sequence === 0 ? { _tag: "Append" } : { _tag: "UnknownProducer", sequence: producer.sequence }
  }
  if (producer.epoch < entry.epoch) return { _tag: "Fenced", epoch: producer.epoch, current: entry.epoch }
  if (producer.epoch > entry.epoch) {
    return producer.sequence === 0
      ? { _tag: "Append" }
      : { _tag: "OutOfOrder", expected: 0, sequence: producer.sequence }
  }
  const lastSequence = producer.sequence + count - 1
  const same = entry.batches.find((b) => b.firstSequence === producer.sequence && b.lastSequence === lastSequence)
  if (same !== undefined) return { _tag: "Duplicate", baseOffset: same.baseOffset, lastOffset: same.lastOffset }
  const expected = (entry.batches.at(-1)?.lastSequence ?? -1) + 1
  return producer.sequence === expected
    ? { _tag: "Append" }
    : { _tag: "OutOfOrder", expected, sequence: producer.sequence }
}

/**
 * The producer's entry after a batch of `count` records stamped `producer` was written at `baseOffset`.
 *
 * @since 0.1.0
 */
export const record = (entry: Entry | undefined, producer: Producer, count: number, baseOffset: number): Entry => {
  const written: Written = {
    firstSequence: producer.sequence,
    lastSequence: producer.sequence + count - 1,
    baseOffset,
    lastOffset: baseOffset + count - 1
  }
  const kept = entry === undefined || entry.epoch !== producer.epoch ? [] : entry.batches
  return { epoch: producer.epoch, batches: [...kept, written].slice(-RECENT_BATCHES) }
}

/**
 * The entry without the batches written at or past `offset` (a truncated log); `undefined` when none remain, and
 * the caller must then look further back in the log for the producer's older batches.
 *
 * @since 0.1.0
 */
export const truncateFromEnd = (entry: Entry, offset: number): Entry | undefined => {
  const batches = entry.batches.filter((b) => b.lastOffset < offset)
  return batches.length === 0 ? undefined : { epoch: entry.epoch, batches }
}

/**
 * A refusal in words.
 *
 * @since 0.1.0
 */
export const describeRefusal = (v: Exclude<Verdict, { readonly _tag: "Append" | "Duplicate" }>): string => {
  switch (v._tag) {
    case "OutOfOrder":
      return `sequence ${v.sequence} is out of order (expected ${v.expected})`
    case "Fenced":
      return `producer epoch ${v.epoch} is older than the tablet's ${v.current}`
    case "UnknownProducer":
      return `unknown here, and sequence ${v.sequence} does not start a producer epoch`
  }
}
