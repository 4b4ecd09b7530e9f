/**
 * The produce, fetch and read paths on a lean framing of their own, beside `ReplicaRpc` for everything else. A request or
 * answer is one frame: a small JSON header, checked by the same Schemas the RPC uses, and the records as raw bytes
 * in the tablet log's batch encoding, written to the socket as they are and read back as views of what arrived. The
 * RPC's binary serialization copies a batch into an output buffer to send it and out of the input buffer to decode
 * it, a fresh allocation each time; on the produce path those copies, and the garbage collections they set off,
 * cost more than the RPC's framing itself (see `./dev bench:rpc` and the replica benchmark).
 *
 * A tablet server listens on a second port and registers its address as `dataAddress`; `RemotePeers` sends appends,
 * follower fetches and clients' reads there when a server has one (a read goes through the RPC when it has not). A
 * client that stops waiting for a read (interrupted, timed out) says so with a cancel frame, and the server ends the
 * read (a long-poll waiting for records, say); a connection that closes ends its reads too.
 *
 * @since 0.1.0
 */
import * as Net from "node:net"
import * as Tls from "node:tls"
import { Log, Models, OptionSchemas } from "@strata/core"
import * as ReplicaManager from "../protocol/ReplicaManager.js"
import { Cause, Effect, Exit, type Fiber, FiberSet, Schema, type Scope, Tracer } from "effect"
import * as Codec from "./internal/batchCodec.js"
import {
  ANSWER_RESERVE,
  DEFAULT_MAX_FRAME_BYTES,
  type Frame,
  FrameReader,
  GatheringFrameReader,
  fetchBytesWithin,
  head,
  isSkipped,
  PRELUDE
} from "./internal/frames.js"
import { PeerUnreachable } from "./Peers.js"
import type * as PeerTls from "./PeerTls.js"
import { type Address, type ListenFailed, listenFailed } from "./ReplicaRpc.js"
import { type InvalidReplicaOptions, invalidOptions } from "./ReplicationConfig.js"

/**
 * Frame kinds. Requests: append, fetch, read, and the cancel of a read (no answer). Answers: their results, a
 * `ReplicaError`, or a failure of the server.
 */
const Kind = {
  Append: 1,
  Fetch: 2,
  Read: 3,
  Cancel: 4,
  Appended: 65,
  Fetched: 66,
  ReadResult: 67,
  Refused: 126,
  Failed: 127
} as const
const answerKinds: ReadonlySet<number> = new Set([
  Kind.Appended,
  Kind.Fetched,
  Kind.ReadResult,
  Kind.Refused,
  Kind.Failed
])
const requestKinds: ReadonlySet<number> = new Set([Kind.Append, Kind.Fetch, Kind.Read, Kind.Cancel])

/** A header's JSON text to and from its value, by `schema`. */
const jsonHeader = <T, E>(schema: Schema.Codec<T, E>) => {
  const json: Schema.Codec<T, string> = Schema.fromJsonString(schema)
  return { encode: Schema.encodeSync(json), decode: Schema.decodeUnknownExit(json) }
}

/**
 * The caller's span as a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`): a request's handler runs as its child.
 * A request sent outside any span carries none.
 */
const TraceParent = Schema.optional(Schema.String)

/** An append's header: the request but its records (the frame's payload). */
const AppendHeader = jsonHeader(
  Schema.Struct({
    tablet: ReplicaManager.AppendRequest.fields.tablet,
    acks: ReplicaManager.AppendRequest.fields.acks,
    producer: ReplicaManager.AppendRequest.fields.producer,
    traceparent: TraceParent
  })
)
/**
 * A fetch's header: the request, and the largest answer frame the client reads (its frame limit; a client of before
 * names none, and the server's own limit bounds the answer).
 */
const FetchHeader = jsonHeader(
  Schema.Struct({
    ...ReplicaManager.FetchRequest.fields,
    maxAnswerBytes: Schema.optional(OptionSchemas.PositiveInt),
    traceparent: TraceParent
  })
)

/** A read's header: the request, and the largest answer frame the client reads (as a fetch's). */
const ReadHeader = jsonHeader(
  Schema.Struct({
    ...ReplicaManager.ReadRequest.fields,
    maxAnswerBytes: Schema.optional(OptionSchemas.PositiveInt),
    traceparent: TraceParent
  })
)

/** The current span as a `traceparent`, or `undefined` outside any span. */
const traceParentNow: Effect.Effect<string | undefined> = Effect.map(Effect.option(Effect.currentSpan), (span) =>
  span._tag === "None" ? undefined : `00-${span.value.traceId}-${span.value.spanId}-${span.value.sampled ? "01" : "00"}`
)

/** The parent span a `traceparent` names, if it is one. */
const parentOf = (traceparent: string | undefined): Tracer.ExternalSpan | undefined => {
  if (traceparent === undefined) return undefined
  const match = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/.exec(traceparent)
  if (match === null) return undefined
  return Tracer.externalSpan({
    traceId: match[1]!,
    spanId: match[2]!,
    sampled: (Number.parseInt(match[3]!, 16) & 1) === 1
  })
}

/** Runs a request's handler as a child of the caller's span, when the request named one. */
const underParent = <A, E, R>(
  traceparent: string | undefined,
  self: Effect.Effect<A, E, R>
): Effect.Effect<A, E, R> => {
  const parent = parentOf(traceparent)
  return parent === undefined ? self : Effect.withParentSpan(self, parent)
}
/** Where each batch of an answer is: its base offset and size (its bytes follow in the payload, in order). */
const BatchEntries = Schema.Array(
  Schema.Struct({ baseOffset: Models.Offset, bytes: Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)) })
)
const AppendedHeader = jsonHeader(ReplicaManager.AppendResult)
/** A fetch's answer: the batches' base offsets and sizes (their bytes follow in the payload, in order). */
const FetchedHeader = jsonHeader(
  Schema.Union([
    Schema.TaggedStruct("Batches", {
      leaderEpoch: Models.Epoch,
      batches: BatchEntries,
      highWatermark: Models.Offset,
      logStartOffset: Models.Offset
    }),
    Schema.TaggedStruct("OutOfRange", { leaderEpoch: Models.Epoch, logStartOffset: Models.Offset }),
    Schema.TaggedStruct("Diverging", {
      leaderEpoch: Models.Epoch,
      epoch: Schema.NullOr(Models.Epoch),
      endOffset: Models.Offset
    })
  ])
)
/** A read's answer: its batches' places, and the log's bounds. */
const ReadResultHeader = jsonHeader(
  Schema.Struct({
    batches: BatchEntries,
    highWatermark: Models.Offset,
    logStartOffset: Models.Offset,
    logEndOffset: Models.Offset
  })
)
const RefusedHeader = jsonHeader(ReplicaManager.ReplicaError)
const FailedHeader = jsonHeader(Schema.Struct({ detail: Schema.String }))

/**
 * What a data link's server answers from: a tablet server's appends, fetches and reads.
 *
 * @since 0.1.0
 */
export interface DataLinkHandlers {
  readonly append: (
    request: ReplicaManager.AppendRequest
  ) => Effect.Effect<ReplicaManager.AppendResult, ReplicaManager.ReplicaError>
  readonly fetch: (
    request: ReplicaManager.FetchRequest
  ) => Effect.Effect<ReplicaManager.FetchResult, ReplicaManager.ReplicaError>
  readonly read: (
    request: ReplicaManager.ReadRequest
  ) => Effect.Effect<ReplicaManager.ReadResult, ReplicaManager.ReplicaError>
}

/**
 * The limits of a link's end.
 *
 * @since 0.1.0
 */
export interface DataLinkOptions {
  /**
   * The largest frame accepted (default 64 MiB; above 1 024 bytes, what an answer's header needs). A larger request
   * is refused (its bytes passed over), a larger answer fails its call alone: the connection goes on for the others.
   * A server bounds each fetch's answer by its own limit and the client's, leaving the batches past it for the next
   * fetch. A server also closes a connection whose peer leaves more than twice this in answers unread.
   */
  readonly maxFrameBytes?: number
  /**
   * The most a follower's fetch asks for (`ReplicationConfig`'s `fetchMaxBytes`), when known: checked against
   * `maxFrameBytes`, as its answer must fit in one frame.
   */
  readonly fetchMaxBytes?: number
}

const LinkOptions = Schema.Struct({
  maxFrameBytes: OptionSchemas.PositiveInt.pipe(Schema.withDecodingDefaultKey(Effect.succeed(DEFAULT_MAX_FRAME_BYTES))),
  fetchMaxBytes: Schema.optional(OptionSchemas.PositiveInt)
}).check(
  Schema.makeFilter((o) => {
    const issues: Array<{ readonly path: ReadonlyArray<PropertyKey>; readonly issue: string }> = []
    if (o.maxFrameBytes <= ANSWER_RESERVE) {
      issues.push({
        path: ["maxFrameBytes"],
        issue: `${o.maxFrameBytes} must be above ${ANSWER_RESERVE}: a fetch's answer needs that much of a frame besides its batches`
      })
    } else if (o.fetchMaxBytes !== undefined && o.fetchMaxBytes > fetchBytesWithin(o.maxFrameBytes)) {
      issues.push({
        path: ["fetchMaxBytes"],
        issue: `${o.fetchMaxBytes} must be at most ${fetchBytesWithin(o.maxFrameBytes)}, maxFrameBytes (${o.maxFrameBytes}) less ${ANSWER_RESERVE} for an answer's header: a fetch's answer must fit in one frame`
      })
    }
    return issues
  })
)

/**
 * A link's options, checked: `maxFrameBytes` (its default filled in) and `fetchMaxBytes` against it.
 *
 * @since 0.1.0
 */
export const decodeOptions = (
  options: DataLinkOptions
): Effect.Effect<typeof LinkOptions.Type, InvalidReplicaOptions> =>
  OptionSchemas.decodeOptions(LinkOptions, { exact: true })(options).pipe(Effect.mapError(invalidOptions))

/**
 * A client of one server's data link: appends, fetches and reads, each failing with the server's `ReplicaError`, or
 * `PeerUnreachable` when the connection could not be opened, closed before the answer, or the answer is not one.
 * Calls are not bounded in time here: the caller bounds them. A read the caller stops waiting for is cancelled on the
 * server.
 *
 * @since 0.1.0
 */
export interface DataLinkClient {
  readonly append: (
    request: ReplicaManager.AppendRequest
  ) => Effect.Effect<ReplicaManager.AppendResult, ReplicaManager.ReplicaError | PeerUnreachable>
  readonly fetch: (
    request: ReplicaManager.FetchRequest
  ) => Effect.Effect<ReplicaManager.FetchResult, ReplicaManager.ReplicaError | PeerUnreachable>
  readonly read: (
    request: ReplicaManager.ReadRequest
  ) => Effect.Effect<ReplicaManager.ReadResult, ReplicaManager.ReplicaError | PeerUnreachable>
  /** Closes the connection, failing the calls waiting on it. */
  readonly close: Effect.Effect<void>
}

/**
 * Writes a frame's parts in one go (one `writev`), unless the socket is gone. A peer that leaves more than
 * `maxUnsent` bytes of answers unread is cut off (its calls fail when the connection closes) rather than held in
 * memory.
 */
const send = (socket: Net.Socket, parts: ReadonlyArray<Uint8Array>, maxUnsent: number): void => {
  if (socket.destroyed || !socket.writable) return
  socket.cork()
  for (const part of parts) socket.write(part)
  socket.uncork()
  if (socket.writableLength > maxUnsent) socket.destroy()
}

/** An answer frame: its prelude and header, then the payload's parts. */
const answer = (kind: number, id: number, header: string, payload: ReadonlyArray<Uint8Array> = []) => {
  let bytes = 0
  for (const part of payload) bytes += part.length
  return [head(kind, id, header, bytes), ...payload]
}

const invalid = (detail: string) => new ReplicaManager.ReplicaError({ reason: new Log.InvalidRequest({ detail }) })

/** The request a frame carries, or the `ReplicaError` naming what is wrong with it. */
const requestOf = (
  frame: Frame
):
  | {
      readonly _tag: "Append"
      readonly request: ReplicaManager.AppendRequest
      readonly traceparent: string | undefined
    }
  | {
      readonly _tag: "Fetch"
      readonly request: ReplicaManager.FetchRequest
      readonly maxAnswerBytes: number | undefined
      readonly traceparent: string | undefined
    }
  | {
      readonly _tag: "Read"
      readonly request: ReplicaManager.ReadRequest
      readonly maxAnswerBytes: number | undefined
      readonly traceparent: string | undefined
    }
  | ReplicaManager.ReplicaError => {
  if (frame.kind === Kind.Append) {
    const header = AppendHeader.decode(frame.header)
    if (Exit.isFailure(header)) return invalid(`append: ${Cause.pretty(header.cause)}`)
    const batch = Codec.decodeBatch(0, frame.payload)
    if (typeof batch === "string") {
      return invalid(`${Models.tabletKey(header.value.tablet)}: records: not a tablet batch: ${batch}`)
    }
    const { producer, traceparent, ...rest } = header.value
    // The frame's bytes are this request's alone: the leader's encoding of its batch may take them over.
    Codec.adopt(batch.records)
    return {
      _tag: "Append",
      request: { ...rest, ...(producer === undefined ? {} : { producer }), records: batch.records },
      traceparent
    }
  }
  if (frame.kind === Kind.Fetch) {
    const header = FetchHeader.decode(frame.header)
    if (Exit.isFailure(header)) return invalid(`fetch: ${Cause.pretty(header.cause)}`)
    const { maxAnswerBytes, traceparent, ...request } = header.value
    return { _tag: "Fetch", request, maxAnswerBytes, traceparent }
  }
  if (frame.kind === Kind.Read) {
    const header = ReadHeader.decode(frame.header)
    if (Exit.isFailure(header)) return invalid(`read: ${Cause.pretty(header.cause)}`)
    const { maxAnswerBytes, traceparent, ...request } = header.value
    return { _tag: "Read", request, maxAnswerBytes, traceparent }
  }
  return invalid(`no request of kind ${frame.kind}`)
}

/** The answer frames of a handled request. */
const answerOf = <A>(id: number, exit: Exit.Exit<A, ReplicaManager.ReplicaError>, ok: (a: A) => Array<Uint8Array>) => {
  if (Exit.isSuccess(exit)) return ok(exit.value)
  const failure = exit.cause.reasons.find(Cause.isFailReason)
  if (failure !== undefined) return answer(Kind.Refused, id, RefusedHeader.encode(failure.error))
  return answer(Kind.Failed, id, FailedHeader.encode({ detail: Cause.pretty(exit.cause) }))
}

const appended = (id: number) => (result: ReplicaManager.AppendResult) =>
  answer(Kind.Appended, id, AppendedHeader.encode(result))

/**
 * An answer of `kind` holding `batches` in a frame of at most `limit` bytes, its header made by `headerOf` from the
 * batches' places: the batches past what fits are left for the next call. A first batch that does not fit alone is
 * refused, naming its size and the limit: the call fails (and is told why) rather than the connection, which goes on
 * for the other tablets. Its records are not split across answers: an idempotent producer's batch must stay whole on
 * every replica (a new leader recognises a retry by the batch's sequences, and truncation takes such a batch whole),
 * and a single record may be larger than the limit.
 */
const fitted = (
  kind: number,
  id: number,
  tablet: Models.TabletId,
  limit: number,
  batches: ReadonlyArray<ReplicaManager.TabletBatch>,
  headerOf: (entries: ReadonlyArray<{ readonly baseOffset: number; readonly bytes: number }>) => string
) => {
  const bytes = batches.map(Codec.bytesOf)
  let payload = 0
  for (const b of bytes) payload += b.length
  let count = bytes.length
  for (;;) {
    const header = headerOf(
      batches.slice(0, count).map((b, i) => ({ baseOffset: b.baseOffset, bytes: bytes[i]!.length }))
    )
    const frameBytes = PRELUDE - 4 + Buffer.byteLength(header) + payload
    if (frameBytes <= limit) return answer(kind, id, header, count === bytes.length ? bytes : bytes.slice(0, count))
    if (count <= 1) {
      const what =
        count === 0
          ? `an answer of ${frameBytes} bytes`
          : `the batch at offset ${batches[0]!.baseOffset} is ${bytes[0]!.length} bytes: its answer, ${frameBytes} bytes,`
      return answer(
        Kind.Refused,
        id,
        RefusedHeader.encode(
          invalid(`${Models.tabletKey(tablet)}: ${what} is over the data link's frame limit of ${limit} bytes`)
        )
      )
    }
    // Leave out the last batches whose bytes and header entries (`{"baseOffset":…,"bytes":…},`) make up for the
    // excess; the frame is measured again.
    let over = frameBytes - limit
    while (count > 1 && over > 0) {
      count--
      const size = bytes[count]!.length
      over -= size + 25 + String(batches[count]!.baseOffset).length + String(size).length
      payload -= size
    }
  }
}

/** A fetch's answer in a frame of at most `limit` bytes (see `fitted`). */
const fetched = (id: number, tablet: Models.TabletId, limit: number) => (result: ReplicaManager.FetchResult) =>
  result._tag !== "Batches"
    ? answer(Kind.Fetched, id, FetchedHeader.encode(result))
    : fitted(Kind.Fetched, id, tablet, limit, result.batches, (batches) =>
        FetchedHeader.encode({
          _tag: "Batches",
          leaderEpoch: result.leaderEpoch,
          highWatermark: result.highWatermark,
          logStartOffset: result.logStartOffset,
          batches
        })
      )

/** A read's answer in a frame of at most `limit` bytes (see `fitted`): the log's bounds are the read's. */
const readDone = (id: number, tablet: Models.TabletId, limit: number) => (result: ReplicaManager.ReadResult) =>
  fitted(Kind.ReadResult, id, tablet, limit, result.batches, (batches) =>
    ReadResultHeader.encode({
      batches,
      highWatermark: result.highWatermark,
      logStartOffset: result.logStartOffset,
      logEndOffset: result.logEndOffset
    })
  )

/** Why a TLS server did not accept a client's certificate, in words and OpenSSL's code. */
const certificateRefusal = (socket: Tls.TLSSocket): string => {
  const code = String(socket.authorizationError ?? "")
  if (Object.keys(socket.getPeerCertificate()).length === 0) return "it presented no certificate"
  if (/UNABLE_TO_(VERIFY_LEAF_SIGNATURE|GET_ISSUER_CERT)|SELF_SIGNED|CERT_SIGNATURE_FAILURE/.test(code))
    return `the cluster's CA did not sign it (${code})`
  if (/EXPIRED|NOT_YET_VALID/.test(code)) return `it is not valid now (${code})`
  return code === "" ? "unknown" : code
}

/**
 * Answers a connection whose client certificate the server does not accept: every request is refused naming why (no
 * handler runs), and the connection ends after the first answer. A TLS 1.3 server that closed such a connection
 * without a word would leave the client guessing.
 */
const refuseConnection = (socket: Net.Socket, detail: string, maxFrameBytes: number) => {
  const reader = new FrameReader(maxFrameBytes, (kind) => requestKinds.has(kind) && kind !== Kind.Cancel)
  socket.on("error", () => socket.destroy())
  socket.on("data", (chunk: Buffer) => {
    const frames = reader.push(chunk)
    const first = typeof frames === "string" ? undefined : frames.find((f) => f.kind !== Kind.Cancel)
    if (typeof frames !== "string" && first === undefined) return
    send(socket, answer(Kind.Refused, first?.id ?? 0, RefusedHeader.encode(invalid(detail))), maxFrameBytes)
    socket.end()
  })
}

/**
 * Answers one connection's frames with `handlers`, each request in a fiber of `run`, answers in any order. A read's
 * fiber ends, unanswered, when its cancel frame comes or the connection closes.
 */
const serveConnection = (
  socket: Net.Socket,
  handlers: DataLinkHandlers,
  run: <A>(effect: Effect.Effect<A>) => Fiber.Fiber<A>,
  maxFrameBytes: number
) => {
  // A request over the limit is passed over (and refused): the requests after it are served.
  const reader = new FrameReader(maxFrameBytes, (kind) => requestKinds.has(kind) && kind !== Kind.Cancel)
  const reply = (parts: ReadonlyArray<Uint8Array>) => send(socket, parts, 2 * maxFrameBytes)
  /** The reads under way, by request id. */
  const reads = new Map<number, Fiber.Fiber<unknown>>()
  socket.on("error", () => socket.destroy())
  socket.on("close", () => {
    const left = [...reads.values()]
    reads.clear()
    for (const fiber of left) fiber.interruptUnsafe()
  })
  socket.on("data", (chunk: Buffer) => {
    const frames = reader.push(chunk)
    if (typeof frames === "string") {
      // The stream is beyond repair: say why, then close it.
      reply(answer(Kind.Failed, 0, FailedHeader.encode({ detail: `not a data link frame: ${frames}` })))
      socket.end()
      socket.destroySoon()
      return
    }
    for (const frame of frames) {
      if (isSkipped(frame)) {
        const detail = `a request of ${frame.skipped} bytes is over the data link's frame limit of ${maxFrameBytes} bytes`
        reply(answer(Kind.Refused, frame.id, RefusedHeader.encode(invalid(detail))))
        continue
      }
      if (frame.kind === Kind.Cancel) {
        // The client stopped waiting: a read still under way ends (one already answered is not found).
        const fiber = reads.get(frame.id)
        reads.delete(frame.id)
        fiber?.interruptUnsafe()
        continue
      }
      const request = requestOf(frame)
      if (request instanceof ReplicaManager.ReplicaError) {
        reply(answer(Kind.Refused, frame.id, RefusedHeader.encode(request)))
      } else if (request._tag === "Append") {
        run(
          Effect.map(Effect.exit(underParent(request.traceparent, handlers.append(request.request))), (exit) =>
            reply(answerOf(frame.id, exit, appended(frame.id)))
          )
        )
      } else if (request._tag === "Fetch") {
        // The answer must fit the smaller of this end's frame limit and the client's: the read is bounded by it.
        const limit = Math.min(maxFrameBytes, request.maxAnswerBytes ?? maxFrameBytes)
        const within = Math.max(1, fetchBytesWithin(limit))
        const asked = request.request
        const bounded = asked.maxBytes <= within ? asked : { ...asked, maxBytes: within }
        run(
          Effect.map(Effect.exit(underParent(request.traceparent, handlers.fetch(bounded))), (exit) =>
            reply(answerOf(frame.id, exit, fetched(frame.id, asked.tablet, limit)))
          )
        )
      } else {
        // Bounded as a fetch is; kept by its id until it ends, so that a cancel or the connection's end can end it.
        const limit = Math.min(maxFrameBytes, request.maxAnswerBytes ?? maxFrameBytes)
        const within = Math.max(1, fetchBytesWithin(limit))
        const asked = request.request
        const bounded = asked.maxBytes <= within ? asked : { ...asked, maxBytes: within }
        const id = frame.id
        const fiber = run(
          Effect.map(Effect.exit(underParent(request.traceparent, handlers.read(bounded))), (exit) =>
            reply(answerOf(id, exit, readDone(id, asked.tablet, limit)))
          )
        )
        if (fiber.pollUnsafe() === undefined) {
          reads.set(id, fiber)
          fiber.addObserver(() => {
            if (reads.get(id) === fiber) reads.delete(id)
          })
        }
      }
    }
  })
}

/**
 * Serves `handlers` on a TCP listener at `listen` (port 0: any free one) until the scope closes, over TLS when `tls`
 * is given (a listener's TLS: `PeerTls.serverOptions`); the address bound. Options that cannot work (see
 * `decodeOptions`) are refused before it listens.
 *
 * @since 0.1.0
 */
export const serve = (
  listen: Address,
  handlers: DataLinkHandlers,
  options: DataLinkOptions = {},
  tls?: Tls.TlsOptions
): Effect.Effect<Address, ListenFailed | InvalidReplicaOptions, Scope.Scope> =>
  Effect.gen(function* () {
    const { maxFrameBytes } = yield* decodeOptions(options)
    const run = yield* FiberSet.makeRuntime<never>()
    const sockets = new Set<Net.Socket>()
    // With client certificates required, the check is this end's: a connection without an accepted one is answered
    // with refusals naming why (and logged, the first from each address and every 100th after), never served.
    const checksClients = tls?.requestCert === true && tls.rejectUnauthorized === true
    const refusals = new Map<string, number>()
    const accept = (socket: Net.Socket) => {
      sockets.add(socket)
      socket.on("close", () => sockets.delete(socket))
      if (checksClients && socket instanceof Tls.TLSSocket && !socket.authorized) {
        const why = certificateRefusal(socket)
        const from = socket.remoteAddress ?? "an unknown address"
        const seen = (refusals.get(from) ?? 0) + 1
        refusals.set(from, seen)
        if (seen === 1 || seen % 100 === 0)
          run(
            Effect.logWarning(
              `data link: refused a connection from ${from} (${seen} so far): its certificate is not accepted: ${why}`
            )
          )
        return refuseConnection(
          socket,
          `this server takes only clients with a certificate the cluster's CA signed; this one's was refused: ${why}`,
          maxFrameBytes
        )
      }
      serveConnection(socket, handlers, run, maxFrameBytes)
    }
    // A TLS connection is served once its handshake is done; one that fails it is closed unserved.
    const server =
      tls === undefined
        ? Net.createServer({ noDelay: true }, accept)
        : Tls.createServer(
            { ...tls, ...(checksClients ? { rejectUnauthorized: false } : {}), noDelay: true },
            accept
          ).on("tlsClientError", (_, socket) => socket.destroy())
    yield* Effect.callback<void, ListenFailed>((resume) => {
      server.once("error", (cause) => resume(Effect.fail(listenFailed("data link", listen, cause))))
      server.listen(listen.port, listen.host, () => resume(Effect.void))
    })
    yield* Effect.addFinalizer(() =>
      Effect.callback<void>((resume) => {
        for (const socket of sockets) socket.destroy()
        server.close(() => resume(Effect.void))
      })
    )
    const bound = server.address()
    return typeof bound === "object" && bound !== null ? { host: listen.host, port: bound.port } : listen
  })

/** A connection of a client: its socket, and the calls waiting for their answers. */
interface Connection {
  readonly socket: Net.Socket
  readonly waiting: Map<number, (frame: Frame | PeerUnreachable) => void>
}

/** A call's answer frame as its result, or why it is not one. */
const resultOf = <A>(
  target: string,
  frame: Frame,
  kind: number,
  decode: (frame: Frame) => Exit.Exit<A, unknown>
): Effect.Effect<A, ReplicaManager.ReplicaError | PeerUnreachable> => {
  const bad = (why: string) => Effect.fail(new PeerUnreachable({ target, detail: `the answer is not one: ${why}` }))
  if (frame.kind === kind) {
    const decoded = decode(frame)
    return Exit.isSuccess(decoded) ? Effect.succeed(decoded.value) : bad(String(Cause.squash(decoded.cause)))
  }
  if (frame.kind === Kind.Refused) {
    const error = RefusedHeader.decode(frame.header)
    return Exit.isSuccess(error) ? Effect.fail(error.value) : bad(Cause.pretty(error.cause))
  }
  if (frame.kind === Kind.Failed) {
    const failed = FailedHeader.decode(frame.header)
    return Effect.fail(
      new PeerUnreachable({
        target,
        detail: Exit.isSuccess(failed) ? `the call failed: ${failed.value.detail}` : frame.header
      })
    )
  }
  return bad(`an answer of kind ${frame.kind}`)
}

/**
 * The batches an answer's header places in its payload, as views of it; or why they are not batches. `read` makes
 * them with `decode` (`Codec.decodeBatch`: records decoded now; `Codec.storedBatch`: checked now, records decoded
 * when first asked for).
 */
const batchesOf = (
  entries: ReadonlyArray<{ readonly baseOffset: number; readonly bytes: number }>,
  payload: Uint8Array,
  decode: (baseOffset: number, bytes: Uint8Array) => ReplicaManager.TabletBatch | string
): Array<ReplicaManager.TabletBatch> | string => {
  const batches: Array<ReplicaManager.TabletBatch> = []
  let at = 0
  for (const { baseOffset, bytes } of entries) {
    if (at + bytes > payload.length) return `batch at ${baseOffset} overruns the answer`
    const batch = decode(baseOffset, payload.subarray(at, at + bytes))
    if (typeof batch === "string") return `batch at ${baseOffset}: ${batch}`
    batches.push(batch)
    at += bytes
  }
  return batches
}

/** A fetch answer's batches, views of its payload. */
const decodeFetchedFrame = (frame: Frame): Exit.Exit<ReplicaManager.FetchResult, unknown> => {
  const header = FetchedHeader.decode(frame.header)
  if (Exit.isFailure(header) || header.value._tag !== "Batches")
    return header as Exit.Exit<ReplicaManager.FetchResult, unknown>
  const batches = batchesOf(header.value.batches, frame.payload, Codec.decodeBatch)
  if (typeof batches === "string") return Exit.fail(batches)
  const { leaderEpoch, highWatermark, logStartOffset } = header.value
  return Exit.succeed({ _tag: "Batches", leaderEpoch, highWatermark, logStartOffset, batches })
}

/**
 * A read answer's batches, views of its payload, each record decoded when first asked for: a reader that keeps
 * answers ahead of its use (as `StrataLog`'s consumer does) holds bytes, not records, which the collector would have
 * to trace and move.
 */
const decodeReadFrame = (frame: Frame): Exit.Exit<ReplicaManager.ReadResult, unknown> => {
  const header = ReadResultHeader.decode(frame.header)
  if (Exit.isFailure(header)) return Exit.failCause(header.cause)
  const batches = batchesOf(header.value.batches, frame.payload, Codec.storedBatch)
  if (typeof batches === "string") return Exit.fail(batches)
  const { highWatermark, logStartOffset, logEndOffset } = header.value
  return Exit.succeed({ batches, highWatermark, logStartOffset, logEndOffset })
}

/** The buffer a client's connection reads its answers into, reused for every read. */
const READ_BUFFER_BYTES = 256 * 1024

/**
 * A client of the data link at `address` (`host:port`), over TLS when `tls` is given. It connects on its first call,
 * and again on the first call after its connection closed; the connection closes with the scope. Its options are the
 * code's, not a user's: options that cannot work (see `decodeOptions`) are a defect.
 *
 * @since 0.1.0
 */
export const connect = (
  address: Address,
  options: DataLinkOptions = {},
  tls?: PeerTls.PeerTls
): Effect.Effect<DataLinkClient, never, Scope.Scope> =>
  Effect.gen(function* () {
    const target = `data link ${address.host}:${address.port}`
    const { maxFrameBytes } = yield* Effect.orDie(decodeOptions(options))
    let current: Connection | undefined
    let nextId = 1
    let closed = false
    const open = (): Connection => {
      // Answers are read into one buffer the connection keeps, and each frame gathered into one of its own: no
      // buffer per read, which would fill memory the collector must then sweep.
      // An answer over the limit to a call made here (waiting, or given up since) is passed over, failing its own
      // call: the calls after it get theirs. Anything else over the limit is no answer: the stream is beyond repair.
      const reader = new GatheringFrameReader(
        maxFrameBytes,
        (kind, id) => answerKinds.has(kind) && id !== 0 && (id < nextId || connection.waiting.has(id))
      )
      const onAnswers = (chunk: Uint8Array) => {
        const frames = reader.push(chunk)
        if (typeof frames === "string") return end(`the answer is not a frame: ${frames}`)
        for (const frame of frames) {
          const resume = connection.waiting.get(frame.id)
          connection.waiting.delete(frame.id)
          resume?.(
            isSkipped(frame)
              ? new PeerUnreachable({
                  target,
                  detail: `the answer is not one: a frame of ${frame.skipped} bytes is over the limit of ${maxFrameBytes}`
                })
              : frame
          )
        }
      }
      const onread = {
        buffer: Buffer.allocUnsafe(READ_BUFFER_BYTES),
        callback: (n: number, buffer: Uint8Array) => {
          onAnswers(buffer.subarray(0, n))
          return true
        }
      }
      // A TLS connection's handshake failing (the server's certificate not the cluster's, or this client's refused)
      // is the socket's error: the calls waiting fail with Node's reason. `tls.connect` takes `onread` as
      // `net.connect` does (its types do not say so), and no `noDelay`.
      const socket =
        tls === undefined
          ? Net.connect({ host: address.host, port: address.port, noDelay: true, onread })
          : Tls.connect({ ...tls.client(address.host, address.port), onread } as Tls.ConnectionOptions).setNoDelay(true)
      const connection: Connection = { socket, waiting: new Map() }
      const end = (detail: string) => {
        if (current === connection) current = undefined
        socket.destroy()
        const waiting = [...connection.waiting.values()]
        connection.waiting.clear()
        for (const resume of waiting) resume(new PeerUnreachable({ target, detail }))
      }
      let error: string | undefined
      socket.on("error", (e) => {
        error = e.message
      })
      socket.on("close", () => end(error ?? "the connection closed"))
      return connection
    }
    const call = <A>(
      kind: number,
      header: string,
      payload: ReadonlyArray<Uint8Array>,
      answerKind: number,
      decode: (frame: Frame) => Exit.Exit<A, unknown>
    ): Effect.Effect<A, ReplicaManager.ReplicaError | PeerUnreachable> =>
      Effect.flatten(
        Effect.callback<Effect.Effect<A, ReplicaManager.ReplicaError | PeerUnreachable>>((resume) => {
          if (closed)
            return resume(Effect.succeed(Effect.fail(new PeerUnreachable({ target, detail: "the client closed" }))))
          current ??= open()
          const connection = current
          const id = nextId
          nextId = nextId >= 0xffff_ffff ? 1 : nextId + 1
          connection.waiting.set(id, (outcome) =>
            resume(
              Effect.succeed(
                outcome instanceof PeerUnreachable
                  ? Effect.fail(outcome)
                  : resultOf(target, outcome, answerKind, decode)
              )
            )
          )
          let bytes = 0
          for (const part of payload) bytes += part.length
          // Written even while connecting: the socket holds it until the connection is open.
          connection.socket.cork()
          connection.socket.write(head(kind, id, header, bytes))
          for (const part of payload) connection.socket.write(part)
          connection.socket.uncork()
          return Effect.sync(() => {
            // A read given up before its answer is cancelled on the server (it may be waiting for records).
            if (connection.waiting.delete(id) && kind === Kind.Read && !connection.socket.destroyed) {
              connection.socket.write(head(Kind.Cancel, id, "", 0))
            }
          })
        })
      )
    const close = Effect.sync(() => {
      closed = true
      current?.socket.destroy()
    })
    yield* Effect.addFinalizer(() => close)
    return {
      append: (request) =>
        Effect.flatMap(traceParentNow, (traceparent) =>
          call(
            Kind.Append,
            AppendHeader.encode({
              tablet: request.tablet,
              acks: request.acks,
              producer: request.producer,
              traceparent
            }),
            // Stamped as the leader will store it (the stamp is the header's): the leader then only writes its epoch
            // over the batch's own.
            [Codec.encodeBatch(0, request.records, request.producer)],
            Kind.Appended,
            (frame) => AppendedHeader.decode(frame.header)
          )
        ),
      fetch: (request) =>
        Effect.flatMap(traceParentNow, (traceparent) =>
          call(
            Kind.Fetch,
            FetchHeader.encode({ ...request, maxAnswerBytes: maxFrameBytes, traceparent }),
            [],
            Kind.Fetched,
            decodeFetchedFrame
          )
        ),
      read: (request) =>
        Effect.flatMap(traceParentNow, (traceparent) =>
          call(
            Kind.Read,
            ReadHeader.encode({ ...request, maxAnswerBytes: maxFrameBytes, traceparent }),
            [],
            Kind.ReadResult,
            decodeReadFrame
          )
        ),
      close
    }
  })
