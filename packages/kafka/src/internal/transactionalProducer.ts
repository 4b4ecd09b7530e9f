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
import { type Consumer, type Message, Producer, type ProduceResult } from "@platformatic/kafka"
import {
  Fenced,
  type GroupConsumer,
  InvalidRequest,
  type LogError,
  LogClosed,
  logError,
  type ProducerRecord,
  type TopicPartition,
  type TransactionalProducer,
  type TransactionalProducerOptions,
  type TransactionOffsets
} from "@strata/core"
import { Deferred, Effect, type Scope } from "effect"
import * as SendQueue from "./sendQueue.js"

/** A message as the client takes it. */
export interface OutMessage {
  topic: string
  partition: number
  key?: Buffer
  value?: Buffer
  headers?: Map<Buffer, Buffer>
  timestamp?: bigint
}

/** Sends one request's messages with some client. */
export type Dispatch = (messages: Array<OutMessage>) => Promise<ProduceResult>

/**
 * A producer client's turn: its last send, until the client is done with it (settled, never rejecting). A send
 * given up on at its deadline is still retried by the client; the next send waits for it.
 */
export interface ClientTurn {
  last: Promise<void> | undefined
}

/** What the producer needs from the log. */
export interface TransactionalDeps {
  readonly base: {
    clientId: string
    bootstrapBrokers: Array<string>
    /** What the broker may take for a request (produce, transactions). */
    timeout: number
    /** How long the client waits to connect, and for each answer. */
    connectTimeout: number
    requestTimeout: number
    retries: number
    retryDelay: number
  }
  /** Calls the client, bounded by the request timeout (or `ms`). */
  readonly call: <A>(operation: string, f: () => Promise<A>, topic?: string, ms?: number) => Effect.Effect<A, LogError>
  /** Checks records (topic, partition, size) before they are queued. */
  readonly validate: (records: ReadonlyArray<ProducerRecord>) => Effect.Effect<void, LogError>
  /** Checks that a partition exists. */
  readonly checkTp: (tp: TopicPartition) => Effect.Effect<void, LogError>
  /** Sends validated records through a client as one request; offsets in order. */
  readonly sendVia: (
    records: ReadonlyArray<ProducerRecord>,
    acks: -1,
    dispatch: Dispatch,
    turn: ClientTurn
  ) => Effect.Effect<ReadonlyArray<number>, LogError>
  /** Measures the requests the producer's queue forms against the topics' limits. */
  readonly size: SendQueue.SendQueueOptions<ProducerRecord>["size"]
  /** The client behind one of this log's group consumers. */
  readonly memberOf: (group: GroupConsumer) => GroupMember | undefined
  readonly lingerMs: number
  readonly maxBatchRecords: number
  readonly bufferRecords: number
}

/** A group member as a transaction sees it: its client and the assignment it last followed. */
export interface GroupMember {
  readonly client: Consumer
  /**
   * The generation of the assignment the member follows. The client's own generation moves on at a rejoin before
   * the member has let go of what it lost; offsets committed with this one are refused once the group moved on.
   */
  readonly generation: () => number
  /** Whether the member holds the partition in the assignment it follows. */
  readonly owns: (tp: TopicPartition) => boolean
}

/** The message `Transaction.addOffset` takes for a source offset: it commits `offset + 1`, with the member's group. */
const offsetMessage = (
  member: GroupMember,
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

/** Opens a transactional producer in the scope. */
export const make = (
  options: TransactionalProducerOptions,
  deps: TransactionalDeps
): Effect.Effect<TransactionalProducer, LogError, Scope.Scope> =>
  Effect.gen(function* () {
    const id = options?.transactionalId
    if (typeof id !== "string" || id.length === 0) {
      return yield* Effect.fail(logError(new InvalidRequest({ detail: "transactionalId must be a non-empty string" })))
    }
    const client = yield* Effect.acquireRelease(
      Effect.sync(() => new Producer({ ...deps.base, idempotent: true, acks: -1, transactionalId: id })),
      // Each step gives up after the request timeout: a hung broker must not hold the scope's closing.
      (p) =>
        Effect.andThen(
          Effect.suspend(() => {
            const open = p.transaction
            return open === undefined || open.completed
              ? Effect.void
              : Effect.promise(() => open.abort().catch(() => undefined)).pipe(
                  Effect.timeoutOption(deps.base.requestTimeout)
                )
          }),
          Effect.promise(() => p.close().catch(() => undefined)).pipe(Effect.timeoutOption(deps.base.requestTimeout))
        )
    )
    let txn: Transaction | undefined
    /** The open transaction, begun when first needed. */
    const begin = Effect.suspend(() =>
      txn !== undefined
        ? Effect.succeed(txn)
        : Effect.map(
            // Producer id and epoch -1: a fresh initialization, which takes the id over from any older producer
            // (the client would send 0/0 and be refused as fenced once the id has an epoch).
            deps.call("beginTransaction", () => client.beginTransaction({ producerId: -1n, producerEpoch: -1 })),
            (t) => (txn = t)
          )
    )
    // Initializes the producer id now: an older producer of this transactional id is fenced from here on.
    yield* begin

    let owner: SendQueue.Owner = { failure: undefined }
    let last: SendQueue.Done | undefined
    let sent = false
    let closed = false
    const turn: ClientTurn = { last: undefined }
    const queue = yield* SendQueue.make<ProducerRecord>({
      lingerMs: deps.lingerMs,
      maxBatchRecords: deps.maxBatchRecords,
      bufferRecords: deps.bufferRecords,
      size: deps.size,
      send: (records) =>
        Effect.flatMap(begin, (t) => deps.sendVia(records, -1, (messages) => t.send({ messages }), turn))
    })
    yield* Effect.addFinalizer(() =>
      Effect.suspend(() => {
        closed = true
        return last === undefined ? Effect.void : Effect.ignore(Deferred.await(last))
      })
    )

    const closedError = () => logError(new LogClosed({ what: `Kafka transactional producer ${id}` }))
    const usable = Effect.suspend(() =>
      closed ? Effect.fail(closedError()) : owner.failure !== undefined ? Effect.fail(owner.failure) : Effect.void
    )
    /** Every record sent so far acknowledged (or failed). */
    const settled = Effect.suspend(() => (last === undefined ? Effect.void : Effect.ignore(Deferred.await(last))))

    const commitOpen = (t: TransactionOffsets) =>
      Effect.gen(function* () {
        const member = deps.memberOf(t.group)
        if (member === undefined) {
          return yield* Effect.fail(
            logError(new InvalidRequest({ detail: "the transaction's group consumer is not one of this log's" }))
          )
        }
        for (const o of t.offsets) {
          yield* deps.checkTp(o)
          if (!Number.isSafeInteger(o.offset) || o.offset < 0) {
            return yield* Effect.fail(
              logError(new InvalidRequest({ detail: `a committed offset must be an integer ≥ 0, got ${o.offset}` }))
            )
          }
        }
        // The generation first, then ownership: an assignment followed later than the generation read only narrows
        // what is owned, and the coordinator refuses the generation once the group moved past it.
        const generationId = member.generation()
        const lost = t.offsets.filter((o) => !member.owns(o))
        if (lost.length > 0) {
          return yield* Effect.fail(
            logError(
              new Fenced({
                detail:
                  `group ${member.client.groupId} gave ${lost.map((o) => `${o.topic}/${o.partition}`).join(", ")} ` +
                  "to another member: the transaction cannot commit their offsets"
              })
            )
          )
        }
        if (!sent && t.offsets.length === 0) return
        const open = yield* begin
        if (t.offsets.length > 0) {
          sent = true
          yield* deps.call("addOffsetsToTransaction", () => open.addConsumer(member.client))
          // One TxnOffsetCommit per partition: the client folds concurrent ones into one, so they go in turn.
          for (const o of t.offsets) {
            yield* deps.call(
              "commitTransactionOffset",
              () => open.addOffset(offsetMessage(member, generationId, o)),
              o.topic
            )
          }
        }
        yield* deps.call("commitTransaction", () => open.commit())
        txn = undefined
        sent = false
        last = undefined
      })

    const shape: TransactionalProducer = {
      send: (records) =>
        Effect.gen(function* () {
          yield* usable
          if (records.length === 0) return Effect.succeed([])
          yield* deps.validate(records)
          sent = true
          const done = yield* queue.enqueue(records, "all", owner)
          last = done
          return Deferred.await(done)
        }),
      commit: (t) =>
        Effect.gen(function* () {
          yield* usable
          yield* settled
          yield* usable
          yield* commitOpen(t).pipe(
            Effect.tapError((e) =>
              Effect.sync(() => {
                owner.failure = e
              })
            )
          )
        }),
      abort: Effect.gen(function* () {
        if (closed) return
        yield* settled
        const open = txn
        const touched = sent
        sent = false
        last = undefined
        owner = { failure: undefined }
        // A transaction that reached no broker (nothing sent, no offsets) stays open for the next sends.
        if (!touched || open === undefined) return
        txn = undefined
        if (!open.completed) yield* deps.call("abortTransaction", () => open.abort())
      })
    }
    return shape
  })
