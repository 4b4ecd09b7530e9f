/**
 * The in-memory log's transactional producer: sends are held until `commit`
 * appends them, with the group's source offsets, all at once; a newer producer
 * of the same transactional id, or a member that lost its partitions, fences it.
 */
import * as Log from "../Log.js"
import * as Models from "../Models.js"
import type { Scope } from "effect"
import { Clock, Deferred, Effect } from "effect"
import type { Broker } from "./memoryLogBroker.js"
import { lookup } from "./memoryLogBroker.js"
import type { PartitionLog } from "./memoryLogPartition.js"
import { checkOffset, closedError, invalid } from "./memoryLogPartition.js"
import { appendChecked, validateAll } from "./memoryLogProducer.js"

/** One send held in the open transaction, with the deferred its caller waits on. */
interface Held {
  readonly records: ReadonlyArray<Log.ProducerRecord>
  readonly logs: ReadonlyArray<PartitionLog>
  readonly done: Deferred.Deferred<ReadonlyArray<number>, Log.LogError>
}

/** The state of one transactional producer. */
interface TxProducer {
  readonly id: string
  /** This producer's epoch of its transactional id. */
  readonly epoch: number
  /** The sends of the open transaction, in order. */
  held: Array<Held>
  /** Why the producer cannot go on until an abort (or for good, when fenced). */
  failure: Log.LogError | undefined
  closed: boolean
}

/** Ends the open transaction: what it held fails with `error` and is dropped. */
const endTransaction = (p: TxProducer, error: Log.LogError): void => {
  for (const h of p.held) Deferred.doneUnsafe(h.done, Effect.fail(error))
  p.held = []
}

/** Why the producer cannot be used now, if it cannot; a newer epoch of its id fences it here. */
const usable = (s: Broker, p: TxProducer): Log.LogError | undefined => {
  if (p.closed) return closedError(`transactional producer ${p.id}`)
  if (p.failure !== undefined) return p.failure
  if (s.epochs.get(p.id) !== p.epoch) {
    p.failure = Log.logError(new Log.Fenced({ detail: `transactional id ${p.id} was taken by a newer producer` }))
    endTransaction(p, p.failure)
    return p.failure
  }
  return undefined
}

/** The error an aborted transaction's sends fail with. */
const aborted = (p: TxProducer): Log.LogError =>
  Log.logError(new Log.IoError({ operation: "produce", detail: `transaction of ${p.id} aborted`, retryable: false }))

/** Why the transaction's source offsets cannot be committed for this member, if they cannot. */
const checkTransactionOffsets = (s: Broker, t: Log.TransactionOffsets): Log.LogError | undefined => {
  const known = s.members.get(t.group)
  if (known === undefined) return invalid("the transaction's group consumer is not one of this log's")
  const { group, member } = known
  if (!group.members.includes(member)) {
    return Log.logError(new Log.Fenced({ detail: `member ${member.id} is no longer in group ${group.id}` }))
  }
  for (const o of t.offsets) {
    const log = lookup(s, o.topic, o.partition)
    if ("_tag" in log) return log
    const bad = checkOffset(o.offset)
    if (bad !== undefined) return bad
    if (o.offset < 0) return invalid(`a committed offset must be ≥ 0, got ${o.offset}`)
    if (!member.fetcher.assigned.has(Models.tpKey(o))) {
      return Log.logError(
        new Log.Fenced({ detail: `member ${member.id} of group ${group.id} no longer owns ${o.topic}/${o.partition}` })
      )
    }
  }
  return undefined
}

/** `TransactionalProducer.send`: holds the records in the open transaction until it commits or ends. */
const send = (
  s: Broker,
  p: TxProducer,
  records: ReadonlyArray<Log.ProducerRecord>
): Effect.Effect<Effect.Effect<ReadonlyArray<number>, Log.LogError>, Log.LogError> =>
  Effect.suspend(() => {
    const unusable = usable(s, p)
    if (unusable !== undefined) return Effect.fail(unusable)
    // A record the log cannot take fails this call only.
    const logs = validateAll(s, records)
    if ("_tag" in logs) return Effect.fail(logs)
    const done = Deferred.makeUnsafe<ReadonlyArray<number>, Log.LogError>()
    p.held.push({ records, logs, done })
    return Effect.succeed(Deferred.await(done))
  })

/** `TransactionalProducer.commit`: appends everything held and commits the source offsets, or nothing. */
const commit = (s: Broker, p: TxProducer, t: Log.TransactionOffsets): Effect.Effect<void, Log.LogError> =>
  Effect.flatMap(Clock.currentTimeMillis, (now) =>
    Effect.suspend(() => {
      const unusable = usable(s, p)
      if (unusable !== undefined) return Effect.fail(unusable)
      const refused = checkTransactionOffsets(s, t)
      if (refused !== undefined) {
        // Nothing of the transaction is appended; the caller aborts or closes.
        p.failure = refused
        endTransaction(p, refused)
        return Effect.fail(refused)
      }
      const appended = appendChecked(
        s,
        p.held.flatMap((h) => h.records),
        p.held.flatMap((h) => h.logs),
        "all",
        now
      )
      if ("_tag" in appended) {
        p.failure = appended
        endTransaction(p, appended)
        return Effect.fail(appended)
      }
      let at = 0
      for (const h of p.held) {
        Deferred.doneUnsafe(h.done, Effect.succeed(appended.slice(at, at + h.records.length)))
        at += h.records.length
      }
      p.held = []
      const { group } = s.members.get(t.group)!
      for (const o of t.offsets) group.committed.set(Models.tpKey(o), o.offset)
      return Effect.void
    })
  )

/** `TransactionalProducer.abort`: fails what the open transaction held; the producer starts afresh. */
const abort = (p: TxProducer): void => {
  if (p.closed) return
  endTransaction(p, aborted(p))
  // After an abort the producer starts afresh (unless a newer one fenced it).
  p.failure = undefined
}

/** `Log.transactionalProducer`: takes the next epoch of its id (fencing older producers) until its scope closes. */
export const transactionalProducer = (
  s: Broker,
  options: Log.TransactionalProducerOptions
): Effect.Effect<Log.TransactionalProducer, Log.LogError, Scope.Scope> =>
  Effect.suspend(() => {
    const id = options?.transactionalId
    if (typeof id !== "string" || id.length === 0) {
      return Effect.fail(invalid("transactionalId must be a non-empty string"))
    }
    const epoch = (s.epochs.get(id) ?? 0) + 1
    s.epochs.set(id, epoch)
    const p: TxProducer = { id, epoch, held: [], failure: undefined, closed: false }
    const shape: Log.TransactionalProducer = {
      send: (records) => send(s, p, records),
      commit: (t) => commit(s, p, t),
      abort: Effect.sync(() => abort(p))
    }
    return Effect.as(
      Effect.addFinalizer(() =>
        Effect.sync(() => {
          endTransaction(p, aborted(p))
          p.closed = true
        })
      ),
      shape
    )
  })
