/**
 * The log's producing side: two shared clients (acks=all through an idempotent producer, acks 0 and 1 through a
 * plain one), one send queue that `produce`, `produceBatch` and every `Log.producer` share, and the checks every
 * record passes before it is queued (topic, partition, size against `maxRecordBytes` and its topic's limit).
 *
 * @internal
 */
import { Log } from "@strata/core"
import { type ProduceAcks as PlatformaticAcks, Producer, type ProduceResult } from "@platformatic/kafka"
import { Clock, Deferred, Effect, type Scope, Semaphore } from "effect"
import { isTooLarge, toLogError } from "./errors.js"
import * as KafkaAdmin from "./kafkaAdmin.js"
import * as KafkaCluster from "./kafkaCluster.js"
import * as RecordSize from "./recordSize.js"
import * as SendQueue from "./sendQueue.js"

/** Kafka stores timestamp deltas in 32 bits; the client mis-encodes larger spans, so such sends are split. */
const MAX_TIMESTAMP_SPAN = 2 ** 31 - 1

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

/** The shared producer clients, each with its turn. */
export interface Clients {
  /** acks=all, idempotent. */
  readonly idempotent: Producer
  /** acks 0 and 1. */
  readonly plain: Producer
  readonly idempotentTurn: ClientTurn
  readonly plainTurn: ClientTurn
}

/** How the producers batch and bound records. */
export interface ProducerSettings {
  readonly maxRecordBytes: number
  readonly lingerMs: number
  readonly maxBatchRecords: number
  readonly bufferRecords: number
}

/** The log's producing side. */
export interface Producers {
  readonly admin: KafkaAdmin.TopicAdmin
  readonly clients: Clients
  readonly settings: ProducerSettings
  /** The client duplicated records with several idempotent sends in flight, so sends go one at a time. */
  readonly sendLock: Semaphore.Semaphore
  /** Requests the clients have not settled yet (`flush` waits for them). */
  readonly inFlight: Set<Promise<unknown>>
  readonly queue: SendQueue.SendQueue<Log.ProducerRecord>
}

const acksOf = (acks: Log.Acks | undefined): (typeof PlatformaticAcks)[keyof typeof PlatformaticAcks] =>
  acks === 0 ? 0 : acks === 1 ? 1 : -1

/** `u` as a Buffer, without a new view when it is one already. */
const asBuffer = (u: Uint8Array): Buffer => (Buffer.isBuffer(u) ? u : Buffer.from(u.buffer, u.byteOffset, u.byteLength))

/** A lone header's key repeats on every record (a changelog's `strata-source`): its bytes are made once. */
const headerKeys = new Map<string, Buffer>()
const headerKey = (key: string): Buffer => {
  let bytes = headerKeys.get(key)
  if (bytes === undefined) {
    bytes = Buffer.from(key, "utf8")
    // A bounded memo: keys beyond the first thousand are encoded each time.
    if (headerKeys.size < 1000) headerKeys.set(key, bytes)
  }
  return bytes
}

/**
 * Opens the shared clients in the scope. acks=all goes through an idempotent producer: a retried request (e.g.
 * while a new topic's leaders are elected) is deduplicated by the broker instead of appending the records twice.
 * Kafka cannot make acks 0/1 idempotent, so those use a plain producer and may duplicate on retry, as in Kafka.
 */
export const openClients = (cluster: KafkaCluster.Cluster): Effect.Effect<Clients, never, Scope.Scope> =>
  Effect.gen(function* () {
    const idempotent = yield* Effect.acquireRelease(
      Effect.sync(() => new Producer({ ...cluster.base, idempotent: true, acks: -1 })),
      (p) => KafkaCluster.closeWithin(cluster.timeout, () => p.close())
    )
    const plain = yield* Effect.acquireRelease(
      Effect.sync(() => new Producer({ ...cluster.base, acks: 1 })),
      (p) => KafkaCluster.closeWithin(cluster.timeout, () => p.close())
    )
    return { idempotent, plain, idempotentTurn: { last: undefined }, plainTurn: { last: undefined } }
  })

/** Builds the producing side on the clients, with its send queue in the scope. */
export const make = (
  admin: KafkaAdmin.TopicAdmin,
  clients: Clients,
  settings: ProducerSettings
): Effect.Effect<Producers, never, Scope.Scope> =>
  Effect.gen(function* () {
    const p: Omit<Producers, "queue"> = {
      admin,
      clients,
      settings,
      sendLock: Semaphore.makeUnsafe(1),
      inFlight: new Set()
    }
    // `produce`, `produceBatch` and producers share one send queue (internal/sendQueue.ts); its requests are split
    // to fit each topic's limit.
    const queue = yield* SendQueue.make<Log.ProducerRecord>({
      lingerMs: settings.lingerMs,
      maxBatchRecords: settings.maxBatchRecords,
      bufferRecords: settings.bufferRecords,
      size: requestSize(p),
      send: (records, acks) => send(p, records, { acks })
    })
    return { ...p, queue }
  })

/** A measure of requests against the topics' limits (one per queue lane). */
export const requestSize =
  (p: Pick<Producers, "admin">): SendQueue.SendQueueOptions<Log.ProducerRecord>["size"] =>
  () =>
    RecordSize.requestSize((topic) => KafkaAdmin.limitOf(p.admin, topic))

/** Why a record of a validated topic is too large, if it is: over `maxRecordBytes`, or alone over its topic's limit. */
const tooLarge = (p: Producers, r: Log.ProducerRecord, limit: number): Log.LogError | undefined => {
  const maxRecordBytes = p.settings.maxRecordBytes
  const size = RecordSize.payloadBytes(r)
  if (size > maxRecordBytes) return Log.logError(new Log.RecordTooLarge({ topic: r.topic, size, max: maxRecordBytes }))
  // The exact batch size only when the bound says it may not fit.
  if (RecordSize.BATCH_OVERHEAD + size + RecordSize.varintsBound(r) <= limit) return undefined
  const batch = RecordSize.loneBatchBytes(r)
  return batch > limit
    ? Log.logError(new Log.RecordTooLarge({ topic: r.topic, partition: r.partition, size: batch, max: limit }))
    : undefined
}

/**
 * Checks every record (topic, partition, size against `maxRecordBytes` and its topic's limit) before it is
 * queued, so one caller's bad record fails only it.
 */
export const validate = (p: Producers, records: ReadonlyArray<Log.ProducerRecord>): Effect.Effect<void, Log.LogError> =>
  Effect.gen(function* () {
    // Topics are checked once each; partitions and sizes per record, without an Effect per record.
    const topics = [...new Set(records.map((r) => r.topic))]
    const counts = new Map<string, number>()
    const limits = new Map<string, number>()
    for (const topic of topics) {
      counts.set(topic, yield* KafkaAdmin.validTopic(p.admin, topic))
      limits.set(topic, yield* KafkaAdmin.messageLimit(p.admin, topic))
    }
    for (const r of records) {
      const count = counts.get(r.topic)!
      if (!Number.isInteger(r.partition) || r.partition < 0 || r.partition >= count) {
        return yield* Effect.fail(
          Log.logError(new Log.UnknownPartition({ topic: r.topic, partition: r.partition, partitions: count }))
        )
      }
      const error = tooLarge(p, r, limits.get(r.topic)!)
      if (error !== undefined) return yield* Effect.fail(error)
    }
  })

/**
 * The broker refused a request's record batch as too large (its topic's limit changed since it was read): the
 * largest batch and the limit known, which is read again for the next sends.
 */
const refusedAsTooLarge = (p: Pick<Producers, "admin">, records: ReadonlyArray<Log.ProducerRecord>): Log.LogError => {
  const largest = RecordSize.largestBatch(records)
  const max = KafkaAdmin.limitOf(p.admin, largest.topic)
  for (const r of records) p.admin.messageLimits.delete(r.topic)
  return Log.logError(
    new Log.RecordTooLarge({ topic: largest.topic, partition: largest.partition, size: largest.bytes, max })
  )
}

/**
 * The records as the client takes them, and the span of their timestamps (infinite bounds when none has one).
 * Headers and timestamps are passed only when given (the client stamps the rest at send time).
 */
const toMessages = (records: ReadonlyArray<Log.ProducerRecord>) => {
  let minStamp = Number.POSITIVE_INFINITY
  let maxStamp = Number.NEGATIVE_INFINITY
  const messages = records.map((r) => {
    const m: OutMessage = { topic: r.topic, partition: r.partition }
    if (r.key !== null) m.key = asBuffer(r.key)
    if (r.value !== null) m.value = asBuffer(r.value)
    if (r.headers !== undefined && r.headers.length > 0) {
      // The client takes headers as a Map keyed by Buffer: one record's repeated keys need Buffers of their own.
      const only = r.headers.length === 1 ? r.headers[0]! : undefined
      m.headers =
        only !== undefined
          ? new Map([[headerKey(only.key), asBuffer(only.value)] as const])
          : new Map(r.headers.map((h) => [Buffer.from(h.key, "utf8"), asBuffer(h.value)] as const))
    }
    if (r.timestamp !== undefined) {
      m.timestamp = BigInt(r.timestamp)
      if (r.timestamp < minStamp) minStamp = r.timestamp
      if (r.timestamp > maxStamp) maxStamp = r.timestamp
    }
    return m
  })
  return { messages, minStamp, maxStamp }
}

/**
 * Sends one request through `dispatch` once the client's previous send is settled, holding `turn` until the client
 * is done with this one (given up on at its deadline, it is still retried by the client).
 */
const dispatchInTurn = (
  p: Pick<Producers, "admin" | "inFlight">,
  group: Array<OutMessage>,
  refused: ReadonlyArray<Log.ProducerRecord>,
  dispatch: Dispatch,
  turn: ClientTurn
): Effect.Effect<ProduceResult, Log.LogError> =>
  Effect.gen(function* () {
    const previous = turn.last
    if (previous !== undefined) yield* Effect.promise(() => previous)
    const send = dispatch(group)
    const settled = send.then(
      () => undefined,
      () => undefined
    )
    turn.last = settled
    void settled.then(() => {
      if (turn.last === settled) turn.last = undefined
    })
    p.inFlight.add(send)
    return yield* Effect.tryPromise({
      try: () => send,
      catch: (cause) =>
        isTooLarge(cause)
          ? refusedAsTooLarge(p, refused)
          : toLogError("produce", p.admin.cluster.brokers, cause, group[0]!.topic)
    }).pipe(Effect.ensuring(Effect.sync(() => p.inFlight.delete(send))))
  })

/**
 * Appends to `offsets` the offset of each message of a request, in order, from the first offset per partition the
 * broker answered (-1 at acks 0, or where it answered none).
 */
const addOffsets = (
  offsets: Array<number>,
  group: ReadonlyArray<OutMessage>,
  result: ProduceResult,
  acks: -1 | 0 | 1
): void => {
  // Per topic and partition, the offset of the group's next record there.
  const nextOffset = new Map<string, Map<number, number>>()
  for (const x of result.offsets ?? []) {
    let partitions = nextOffset.get(x.topic)
    if (partitions === undefined) {
      partitions = new Map()
      nextOffset.set(x.topic, partitions)
    }
    partitions.set(x.partition, Number(x.offset))
  }
  for (const m of group) {
    const partitions = nextOffset.get(m.topic)
    const at = partitions?.get(m.partition)
    if (acks === 0 || at === undefined) {
      offsets.push(-1)
      continue
    }
    offsets.push(at)
    partitions!.set(m.partition, at + 1)
  }
}

/**
 * Sends validated records through `dispatch` as one request (one per record when timestamps span too far);
 * offsets in order. Each request is bounded by the request timeout; one given up on still holds `turn` (its
 * client) until the client is done with it, so that one client never has two sends in flight.
 */
export const sendVia = (
  p: Pick<Producers, "admin" | "inFlight">,
  records: ReadonlyArray<Log.ProducerRecord>,
  acks: -1 | 0 | 1,
  dispatch: Dispatch,
  turn: ClientTurn
): Effect.Effect<Array<number>, Log.LogError> =>
  Effect.gen(function* () {
    if (records.length === 0) return []
    const { messages, minStamp: firstStamp, maxStamp: lastStamp } = toMessages(records)
    let minStamp = firstStamp
    let maxStamp = lastStamp
    if (minStamp !== Number.POSITIVE_INFINITY) {
      // Unstamped records get the clock's time, so that one request's deltas stay within 32 bits.
      const now = yield* Clock.currentTimeMillis
      for (const m of messages) {
        if (m.timestamp === undefined) m.timestamp = BigInt(now)
      }
      minStamp = Math.min(minStamp, now)
      maxStamp = Math.max(maxStamp, now)
    }
    // Send as one request unless timestamps span more than a 32-bit delta (then one request per record).
    const groups = maxStamp - minStamp > MAX_TIMESTAMP_SPAN ? messages.map((m) => [m]) : [messages]
    const offsets: Array<number> = []
    for (const [g, group] of groups.entries()) {
      const refused = groups.length === 1 ? records : [records[g]!]
      const result = yield* KafkaCluster.bounded(
        p.admin.cluster,
        "produce",
        dispatchInTurn(p, group, refused, dispatch, turn)
      )
      addOffsets(offsets, group, result, acks)
    }
    return offsets
  })

/** Sends through the shared clients: acks=all idempotent, acks 0 and 1 plain; one request at a time. */
const send = (
  p: Omit<Producers, "queue">,
  records: ReadonlyArray<Log.ProducerRecord>,
  options?: { readonly acks?: Log.Acks }
): Effect.Effect<Array<number>, Log.LogError> => {
  const acks = acksOf(options?.acks)
  const { idempotent, plain, idempotentTurn, plainTurn } = p.clients
  return Semaphore.withPermit(
    p.sendLock,
    acks === -1
      ? sendVia(p, records, acks, (messages) => idempotent.send({ messages }), idempotentTurn)
      : sendVia(p, records, acks, (messages) => plain.send({ acks, messages }), plainTurn)
  )
}

/** Queues checked records on the shared queue and waits for their offsets. */
const enqueue = (p: Producers, records: ReadonlyArray<Log.ProducerRecord>, options?: { readonly acks?: Log.Acks }) =>
  Effect.flatMap(p.queue.enqueue(records, options?.acks ?? "all"), Deferred.await)

/** `Log.produce`: one record, checked, queued, and its offset once sent. */
export const produce = (
  p: Producers,
  record: Log.ProducerRecord,
  options?: { readonly acks?: Log.Acks }
): Effect.Effect<number, Log.LogError> =>
  Effect.gen(function* () {
    yield* KafkaAdmin.checkTp(p.admin, record)
    const limit = p.admin.messageLimits.get(record.topic) ?? (yield* KafkaAdmin.messageLimit(p.admin, record.topic))
    const error = tooLarge(p, record, limit)
    if (error !== undefined) return yield* Effect.fail(error)
    const [offset] = yield* enqueue(p, [record], options)
    return offset ?? -1
  })

/** `Log.produceBatch`: the records checked, queued as one call, and their offsets once sent. */
export const produceBatch = (
  p: Producers,
  records: ReadonlyArray<Log.ProducerRecord>,
  options?: { readonly acks?: Log.Acks }
): Effect.Effect<ReadonlyArray<number>, Log.LogError> =>
  Effect.gen(function* () {
    if (records.length === 0) return []
    yield* validate(p, records)
    return yield* enqueue(p, records, options)
  })

/** `Log.flush`: every call queued so far done, then every request the clients still hold settled. */
export const flush = (p: Producers): Effect.Effect<void> =>
  Effect.andThen(
    p.queue.flush,
    Effect.promise(() => Promise.allSettled([...p.inFlight]))
  )

/** A pipelined producer on the shared queue; its first failed request stops it (see `Log.producer`). */
export const producer = (
  p: Producers,
  producerOptions?: Log.ProducerOptions
): Effect.Effect<Log.Producer, Log.LogError, Scope.Scope> =>
  Effect.gen(function* () {
    const acks = producerOptions?.acks ?? "all"
    if (acks !== 0 && acks !== 1 && acks !== "all") {
      return yield* Effect.fail(
        Log.logError(new Log.InvalidRequest({ detail: `acks must be 0, 1 or "all", got ${String(acks)}` }))
      )
    }
    const owner: SendQueue.Owner = { failure: undefined }
    let closed = false
    /** Calls of one owner complete in the order queued: waiting for the last waits for all. */
    let last: SendQueue.Done | undefined
    yield* Effect.addFinalizer(() =>
      Effect.suspend(() => {
        closed = true
        return last === undefined ? Effect.void : Effect.ignore(Deferred.await(last))
      })
    )
    const shape: Log.Producer = {
      send: (records) =>
        Effect.gen(function* () {
          if (closed) return yield* Effect.fail(Log.logError(new Log.Closed({ what: "Kafka producer" })))
          if (owner.failure !== undefined) return yield* Effect.fail(owner.failure)
          if (records.length === 0) return Effect.succeed([])
          yield* validate(p, records)
          const done = yield* p.queue.enqueue(records, acks, owner)
          last = done
          return Deferred.await(done)
        }),
      flush: Effect.suspend(() =>
        Effect.andThen(last === undefined ? Effect.void : Effect.ignore(Deferred.await(last)), () =>
          owner.failure === undefined ? Effect.void : Effect.fail(owner.failure)
        )
      ),
      failure: Effect.sync(() => owner.failure)
    }
    return shape
  })
