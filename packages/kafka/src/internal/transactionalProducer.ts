/**
 * The Kafka transactional producer (EOS v2): a client of its own with a `transactional.id`, its records queued in a
 * send queue of their own (one request at a time, as the idempotent client needs), the source offsets committed
 * inside the transaction with the group member's generation (TxnOffsetCommit), so a member the group moved on from
 * cannot commit.
 *
 * Opening the producer initializes its producer id at once, which fences an older producer of the same id (the
 * broker aborts that one's open transaction). A failed send or commit is sticky until `abort`; closing aborts what
 * is open.
 *
 * @internal
 */
import { Log } from "@strata/core"
import { type Message, Producer } from "@platformatic/kafka"
import { Deferred, Effect, type Scope } from "effect"
import * as KafkaAdmin from "./kafkaAdmin.js"
import * as KafkaCluster from "./kafkaCluster.js"
import * as KafkaGroupConsumer from "./kafkaGroupConsumer.js"
import * as KafkaProducer from "./kafkaProducer.js"
import * as SendQueue from "./sendQueue.js"

/** The message `Transaction.addOffset` takes for a source offset: it commits `offset + 1`, with the member's group. */
const offsetMessage = (
  member: KafkaGroupConsumer.GroupMember,
  generationId: number,
  o: { topic: string; partition: number; offset: number }
): Message =>
  ({
    topic: o.topic,
    partition: o.partition,
    offset: BigInt(o.offset - 1),
    metadata: {
      consumer: {
        groupId: member.client.groupId,
        generationId,
        memberId: member.client.memberId,
        coordinatorId: member.client.coordinatorId
      }
    }
  }) as unknown as Message

/** The client's transaction object. */
type Transaction = NonNullable<Producer["transaction"]>

/** An open transactional producer. */
interface Transactional {
  readonly id: string
  /** The log's producing side: its checks, its limits and its way of sending a request. */
  readonly producers: KafkaProducer.Producers
  readonly cluster: KafkaCluster.Cluster
  readonly client: Producer
  readonly turn: KafkaProducer.ClientTurn
  /** The open transaction, begun when first needed. */
  txn: Transaction | undefined
  /** Stopped by the first failed send or commit, until `abort`. */
  owner: SendQueue.Owner
  /** The last call queued: waiting for it waits for every record sent so far. */
  last: SendQueue.Done | undefined
  /** Whether the open transaction reached a broker (records sent or offsets added). */
  sent: boolean
  closed: boolean
}

/** Opens a transactional producer in the scope. */
export const make = (
  options: Log.TransactionalProducerOptions,
  producers: KafkaProducer.Producers
): Effect.Effect<Log.TransactionalProducer, Log.LogError, Scope.Scope> =>
  Effect.gen(function* () {
    const id = options?.transactionalId
    if (typeof id !== "string" || id.length === 0) {
      return yield* Effect.fail(
        Log.logError(new Log.InvalidRequest({ detail: "transactionalId must be a non-empty string" }))
      )
    }
    const cluster = producers.admin.cluster
    const client = yield* openClient(cluster, id)
    const t: Transactional = {
      id,
      producers,
      cluster,
      client,
      turn: { last: undefined },
      txn: undefined,
      owner: { failure: undefined },
      last: undefined,
      sent: false,
      closed: false
    }
    // Initializes the producer id now: an older producer of this transactional id is fenced from here on.
    yield* begin(t)
    const queue = yield* SendQueue.make<Log.ProducerRecord>({
      lingerMs: producers.settings.lingerMs,
      maxBatchRecords: producers.settings.maxBatchRecords,
      bufferRecords: producers.settings.bufferRecords,
      size: KafkaProducer.requestSize(producers),
      send: (records) =>
        Effect.flatMap(begin(t), (open) =>
          KafkaProducer.sendVia(producers, records, -1, (messages) => open.send({ messages }), t.turn)
        )
    })
    yield* Effect.addFinalizer(() =>
      Effect.suspend(() => {
        t.closed = true
        return t.last === undefined ? Effect.void : Effect.ignore(Deferred.await(t.last))
      })
    )
    return shapeOf(t, queue)
  })

/**
 * The transactional client, in the scope. Closing aborts the open transaction, then closes the client; each step
 * gives up after the request timeout (a hung broker must not hold the scope's closing).
 */
const openClient = (cluster: KafkaCluster.Cluster, id: string): Effect.Effect<Producer, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => new Producer({ ...cluster.base, idempotent: true, acks: -1, transactionalId: id })),
    (p) =>
      Effect.andThen(
        Effect.suspend(() => {
          const open = p.transaction
          return open === undefined || open.completed
            ? Effect.void
            : Effect.promise(() => open.abort().catch(() => undefined)).pipe(
                Effect.timeoutOption(cluster.base.requestTimeout)
              )
        }),
        Effect.promise(() => p.close().catch(() => undefined)).pipe(Effect.timeoutOption(cluster.base.requestTimeout))
      )
  )

/** The open transaction, begun when first needed. */
const begin = (t: Transactional): Effect.Effect<Transaction, Log.LogError> =>
  Effect.suspend(() =>
    t.txn !== undefined
      ? Effect.succeed(t.txn)
      : Effect.map(
          // Producer id and epoch -1: a fresh initialization, which takes the id over from any older producer
          // (the client would send 0/0 and be refused as fenced once the id has an epoch).
          KafkaCluster.call(t.cluster, "beginTransaction", () =>
            t.client.beginTransaction({ producerId: -1n, producerEpoch: -1 })
          ),
          (open) => (t.txn = open)
        )
  )

const closedError = (t: Transactional) => Log.logError(new Log.Closed({ what: `Kafka transactional producer ${t.id}` }))

/** Fails when the producer is closed, or stopped by a failure not aborted yet. */
const usable = (t: Transactional): Effect.Effect<void, Log.LogError> =>
  Effect.suspend(() =>
    t.closed ? Effect.fail(closedError(t)) : t.owner.failure !== undefined ? Effect.fail(t.owner.failure) : Effect.void
  )

/** Every record sent so far acknowledged (or failed). */
const settled = (t: Transactional): Effect.Effect<void> =>
  Effect.suspend(() => (t.last === undefined ? Effect.void : Effect.ignore(Deferred.await(t.last))))

/**
 * Commits the open transaction with the source offsets of `offsets.group`'s member (TxnOffsetCommit with the
 * generation it follows); `Fenced` when the member no longer owns one of the partitions.
 */
const commitOpen = (t: Transactional, offsets: Log.TransactionOffsets): Effect.Effect<void, Log.LogError> =>
  Effect.gen(function* () {
    const member = KafkaGroupConsumer.memberOf(offsets.group)
    if (member === undefined) {
      return yield* Effect.fail(
        Log.logError(new Log.InvalidRequest({ detail: "the transaction's group consumer is not one of this log's" }))
      )
    }
    for (const o of offsets.offsets) {
      yield* KafkaAdmin.checkTp(t.producers.admin, o)
      if (!Number.isSafeInteger(o.offset) || o.offset < 0) {
        return yield* Effect.fail(
          Log.logError(new Log.InvalidRequest({ detail: `a committed offset must be an integer ≥ 0, got ${o.offset}` }))
        )
      }
    }
    // The generation first, then ownership: an assignment followed later than the generation read only narrows
    // what is owned, and the coordinator refuses the generation once the group moved past it.
    const generationId = member.generation()
    const lost = offsets.offsets.filter((o) => !member.owns(o))
    if (lost.length > 0) {
      return yield* Effect.fail(
        Log.logError(
          new Log.Fenced({
            detail:
              `group ${member.client.groupId} gave ${lost.map((o) => `${o.topic}/${o.partition}`).join(", ")} ` +
              "to another member: the transaction cannot commit their offsets"
          })
        )
      )
    }
    if (!t.sent && offsets.offsets.length === 0) return
    const open = yield* begin(t)
    if (offsets.offsets.length > 0) {
      t.sent = true
      yield* KafkaCluster.call(t.cluster, "addOffsetsToTransaction", () => open.addConsumer(member.client))
      // One TxnOffsetCommit per partition: the client folds concurrent ones into one, so they go in turn.
      for (const o of offsets.offsets) {
        yield* KafkaCluster.call(
          t.cluster,
          "commitTransactionOffset",
          () => open.addOffset(offsetMessage(member, generationId, o)),
          o.topic
        )
      }
    }
    yield* KafkaCluster.call(t.cluster, "commitTransaction", () => open.commit())
    t.txn = undefined
    t.sent = false
    t.last = undefined
  })

/** Aborts the open transaction (once what was sent settled) and clears a failure; open again for sends. */
const abort = (t: Transactional): Effect.Effect<void, Log.LogError> =>
  Effect.gen(function* () {
    if (t.closed) return
    yield* settled(t)
    const open = t.txn
    const touched = t.sent
    t.sent = false
    t.last = undefined
    t.owner = { failure: undefined }
    // A transaction that reached no broker (nothing sent, no offsets) stays open for the next sends.
    if (!touched || open === undefined) return
    t.txn = undefined
    if (!open.completed) yield* KafkaCluster.call(t.cluster, "abortTransaction", () => open.abort())
  })

/** The producer as its users see it. */
const shapeOf = (t: Transactional, queue: SendQueue.SendQueue<Log.ProducerRecord>): Log.TransactionalProducer => ({
  send: (records) =>
    Effect.gen(function* () {
      yield* usable(t)
      if (records.length === 0) return Effect.succeed([])
      yield* KafkaProducer.validate(t.producers, records)
      t.sent = true
      const done = yield* queue.enqueue(records, "all", t.owner)
      t.last = done
      return Deferred.await(done)
    }),
  commit: (offsets) =>
    Effect.gen(function* () {
      yield* usable(t)
      yield* settled(t)
      yield* usable(t)
      yield* commitOpen(t, offsets).pipe(
        Effect.tapError((e) =>
          Effect.sync(() => {
            t.owner.failure = e
          })
        )
      )
    }),
  abort: abort(t)
})
