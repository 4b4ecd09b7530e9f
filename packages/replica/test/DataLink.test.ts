/**
 * The data link over TCP on loopback: appends, fetches and reads arrive as sent (keys, headers, producer stamps,
 * batches as views of the frame), typed errors cross as themselves, answers match their requests in any order, bad
 * bytes are refused by name without taking the server down, a call on a closed or missing server is
 * `PeerUnreachable`, a read the caller gives up is ended on the server, and `RemotePeers` takes the link only for
 * servers that registered one (reads of a server without one go on its RPC).
 */
import * as Net from "node:net"
import { Errors, MemoryStore, Store } from "@strata/core"
import * as ReplicaManager from "../src/protocol/ReplicaManager.js"
import { assert, describe, it } from "@effect/vitest"
import { Clock, Deferred, Effect, Exit, Fiber, Random, Scope } from "effect"
import * as DataLink from "../src/wire/DataLink.js"
import * as Codec from "../src/wire/internal/batchCodec.js"
import * as Frames from "../src/wire/internal/frames.js"
import { PeerUnreachable } from "../src/wire/Peers.js"
import * as RemotePeers from "../src/client/RemotePeers.js"
import { formatAddress, ListenFailed, serveTabletServerWith } from "../src/wire/ReplicaRpc.js"
import { serveController } from "../src/server/ControllerRpc.js"
import { InvalidReplicaOptions } from "../src/wire/ReplicationConfig.js"
import * as TabletLog from "../src/server/TabletLog.js"
import { eventually, make as makeServers, records as recordsOf, values } from "./support/servers.js"

const tablet = { table: "orders", bucket: 3 }
const bytes = (s: string) => new TextEncoder().encode(s)
const record = (i: number): ReplicaManager.TabletRecord => ({
  key: i % 3 === 0 ? null : bytes(`key-${i}`),
  value: bytes(`value-${i}-${"x".repeat(i % 50)}`),
  headers: i % 4 === 0 ? [{ key: "h", value: bytes(`hv-${i}`) }] : [],
  timestamp: 1_700_000_000_000 + i
})
const plain = (records: ReadonlyArray<ReplicaManager.TabletRecord>) =>
  records.map((r) => ({
    key: r.key === null ? null : [...r.key],
    value: [...r.value],
    headers: r.headers.map((h) => ({ key: h.key, value: [...h.value] })),
    timestamp: r.timestamp
  }))
const fetchRequest: ReplicaManager.FetchRequest = { tablet, follower: 2, leaderEpoch: 4, offset: 10, maxBytes: 1 << 20 }
const notLeader = new ReplicaManager.ReplicaError({ reason: new Errors.NotLeader({ resource: "orders/3", leader: 7 }) })

/** A read's answer in the tests: its batches from offset 10, and the log's bounds. */
const readResult = (records: ReadonlyArray<ReplicaManager.TabletRecord>): ReplicaManager.ReadResult => ({
  batches: [
    { baseOffset: 10, epoch: 3, records: records.slice(0, 7), producer: { id: 5, epoch: 0, sequence: 0 } },
    { baseOffset: 17, epoch: 4, records: records.slice(7) }
  ],
  highWatermark: 10 + records.length,
  logStartOffset: 2,
  logEndOffset: 12 + records.length
})

/**
 * Handlers that keep what they were sent and answer with `fetched`; appends to bucket 9 are refused; reads answer
 * `readResult` of 20 records, NotLeader on bucket 9 and OffsetOutOfRange below offset 2.
 */
const recording = (fetched: ReplicaManager.FetchResult) => {
  const appends: Array<ReplicaManager.AppendRequest> = []
  const reads: Array<ReplicaManager.ReadRequest> = []
  const handlers: DataLink.DataLinkHandlers = {
    append: (request) =>
      request.tablet.bucket === 9
        ? Effect.fail(notLeader)
        : Effect.sync(() => {
            appends.push(request)
            return { baseOffset: 10, lastOffset: 10 + request.records.length - 1, highWatermark: 5, duplicate: false }
          }),
    fetch: (request) =>
      request.offset === 666
        ? Effect.die(new Error("boom"))
        : Effect.delay(Effect.succeed(fetched), request.offset === 1 ? 100 : 0),
    read: (request) =>
      Effect.suspend(() => {
        reads.push(request)
        if (request.tablet.bucket === 9) return Effect.fail(notLeader)
        if (request.offset < 2) {
          return Effect.fail(
            new ReplicaManager.ReplicaError({
              reason: new Errors.OffsetOutOfRange({
                topic: request.tablet.table,
                partition: request.tablet.bucket,
                offset: request.offset,
                logStart: 2,
                highwater: 32
              })
            })
          )
        }
        return Effect.succeed(readResult(Array.from({ length: 20 }, (_, i) => record(i))))
      })
  }
  return { appends, reads, handlers }
}

/** Sends `data` on a raw connection to `port` and collects what comes back until the server closes it. */
const raw = (port: number, data: ReadonlyArray<Uint8Array>) =>
  Effect.callback<Uint8Array>((resume) => {
    const socket = Net.connect({ host: "127.0.0.1", port })
    const received: Array<Buffer> = []
    socket.on("data", (chunk: Buffer) => received.push(chunk))
    socket.on("error", () => {})
    socket.on("close", () => resume(Effect.succeed(Buffer.concat(received))))
    for (const part of data) socket.write(part)
    // A well-formed request: the server answers and keeps the connection, so end it from here after a while.
    const timer = setTimeout(() => socket.end(), 300)
    return Effect.sync(() => clearTimeout(timer))
  })

/** A frame read whole (not one over the reader's limit, passed over). */
const isFrame = (f: Frames.Frame | Frames.Skipped): f is Frames.Frame => !Frames.isSkipped(f)

const framesOf = (received: Uint8Array) => {
  const frames = new Frames.FrameReader(1 << 20).push(received)
  if (typeof frames === "string") throw new Error(frames)
  return frames.filter(isFrame)
}

/**
 * Sends `data` on a raw connection to `port` and collects the frames that come back, until `answers` of them came or
 * the server closed the connection.
 */
const exchange = (port: number, data: ReadonlyArray<Uint8Array>, answers: number) =>
  Effect.callback<{ readonly frames: ReadonlyArray<Frames.Frame>; readonly closed: boolean }>((resume) => {
    const socket = Net.connect({ host: "127.0.0.1", port })
    const reader = new Frames.FrameReader(1 << 20)
    const frames: Array<Frames.Frame> = []
    socket.on("data", (chunk: Buffer) => {
      const got = reader.push(chunk)
      if (typeof got === "string") return resume(Effect.die(new Error(got)))
      for (const f of got) if (isFrame(f)) frames.push(f)
      if (frames.length >= answers) {
        socket.destroy()
        resume(Effect.succeed({ frames, closed: false }))
      }
    })
    socket.on("error", () => {})
    socket.on("close", () => resume(Effect.succeed({ frames, closed: true })))
    for (const part of data) socket.write(part)
    return Effect.sync(() => socket.destroy())
  })

/**
 * A leader's fetch handler on a tablet log: what it reads from `offset`, at most the `maxBytes` it is asked (kept in
 * `asked`, with how many batches it read).
 */
const fetchingFrom = (
  log: TabletLog.TabletLog,
  asked: Array<{ readonly maxBytes: number; readonly read: number }>
): DataLink.DataLinkHandlers => ({
  append: () => Effect.die("unused"),
  read: () => Effect.die("unused"),
  fetch: (request) =>
    Effect.gen(function* () {
      const batches = yield* Effect.orDie(log.read(request.offset, request.maxBytes))
      asked.push({ maxBytes: request.maxBytes, read: batches.length })
      const end = yield* log.logEndOffset
      return { _tag: "Batches", leaderEpoch: request.leaderEpoch, batches, highWatermark: end, logStartOffset: 0 }
    })
})

/** A tablet log on the memory store, with `batches` appended (each one batch). */
const logOf = (batches: ReadonlyArray<ReadonlyArray<ReplicaManager.TabletRecord>>) =>
  Effect.gen(function* () {
    const store = yield* (yield* Store.Store).open({ table: "data-link", partition: 0 })
    const log = yield* Effect.orDie(TabletLog.make(store, tablet))
    for (const records of batches) yield* Effect.orDie(log.append(1, records))
    return log
  }).pipe(Effect.provide(MemoryStore.layer()))

const sized = (i: number, bytes: number): ReplicaManager.TabletRecord => ({
  key: null,
  value: new Uint8Array(bytes).fill(i % 251),
  headers: [],
  timestamp: 0
})

/**
 * The two frame readers: one that keeps views of the chunks it is given, and one that is only lent them (each chunk
 * here is overwritten once `push` returns, so a frame that still views it is caught).
 */
const readerKinds: ReadonlyArray<{
  readonly name: string
  readonly make: (
    maxFrameBytes: number,
    skippable?: (kind: number, id: number) => boolean
  ) => Frames.FrameReader | Frames.GatheringFrameReader
  readonly lend: (
    reader: Frames.FrameReader | Frames.GatheringFrameReader,
    chunk: Uint8Array
  ) => ReturnType<Frames.FrameReader["push"]>
}> = [
  {
    name: "the frame reader",
    make: (max, skippable) => new Frames.FrameReader(max, skippable),
    lend: (reader, chunk) => reader.push(chunk)
  },
  {
    name: "the gathering frame reader",
    make: (max, skippable) => new Frames.GatheringFrameReader(max, skippable),
    lend: (reader, chunk) => {
      const lent = Buffer.from(chunk)
      const frames = reader.push(lent)
      lent.fill(0xee)
      return frames
    }
  }
]

describe("DataLink", () => {
  for (const reader of readerKinds) {
    it.effect(`${reader.name} cuts any chunking of a stream into the same frames`, () =>
      Effect.gen(function* () {
        const sent = Array.from({ length: 40 }, (_, i) => {
          const payload = bytes("p".repeat(i * 37))
          return { kind: i % 3, id: i + 1, header: JSON.stringify({ i, text: "é".repeat(i % 5) }), payload }
        })
        const stream = Buffer.concat(
          sent.flatMap((f) => [Frames.head(f.kind, f.id, f.header, f.payload.length), f.payload])
        )
        for (let round = 0; round < 50; round++) {
          const reading = reader.make(1 << 20)
          const got: Array<Frames.Frame> = []
          let at = 0
          while (at < stream.length) {
            const size = yield* Random.nextIntBetween(1, round < 10 ? 3 : 700)
            const frames = reader.lend(reading, stream.subarray(at, at + size))
            assert.isTrue(typeof frames !== "string")
            if (typeof frames !== "string") got.push(...frames.filter(isFrame))
            at += size
          }
          assert.deepStrictEqual(
            got.map((f) => ({ kind: f.kind, id: f.id, header: f.header, payload: [...f.payload] })),
            sent.map((f) => ({ ...f, payload: [...f.payload] }))
          )
        }
        const over = reader.make(100).push(Frames.head(1, 1, "{}", 200))
        assert.match(String(over), /over the limit of 100/)

        // Frames over the limit that may be passed over: reported in their place, their bytes dropped, the stream
        // still cut right after them, however it is chunked; one that may not is the end of the stream.
        const mixed = Array.from({ length: 30 }, (_, i) => ({
          kind: 7,
          id: i + 1,
          header: `{"i":${i}}`,
          payload: bytes("q".repeat(i % 3 === 0 ? 500 + i : i))
        }))
        const mixedStream = Buffer.concat(
          mixed.flatMap((f) => [Frames.head(f.kind, f.id, f.header, f.payload.length), f.payload])
        )
        const expected = mixed.map((f) =>
          f.payload.length > 300
            ? { kind: f.kind, id: f.id, skipped: Frames.PRELUDE - 4 + f.header.length + f.payload.length }
            : { kind: f.kind, id: f.id, header: f.header, payload: [...f.payload] }
        )
        for (let round = 0; round < 50; round++) {
          const skipping = reader.make(300, (kind, id) => kind === 7 && id > 0)
          const got: Array<unknown> = []
          let at = 0
          while (at < mixedStream.length) {
            const size = yield* Random.nextIntBetween(1, round < 10 ? 15 : 900)
            const frames = reader.lend(skipping, mixedStream.subarray(at, at + size))
            assert.isTrue(typeof frames !== "string", String(frames))
            if (typeof frames !== "string") {
              for (const f of frames) got.push(Frames.isSkipped(f) ? f : { ...f, payload: [...f.payload] })
            }
            at += size
          }
          assert.deepStrictEqual(got, expected)
        }
        const refusing = reader.make(100, (kind) => kind === 7)
        assert.match(String(refusing.push(Frames.head(1, 1, "{}", 200))), /over the limit of 100/)
      }).pipe(Random.withSeed(20))
    )

    it(`${reader.name}: a frame of another framing version ends the stream, naming both versions`, () => {
      const frame = Frames.head(1, 1, "{}", 0)
      frame[4] = Frames.VERSION + 1
      assert.strictEqual(
        reader.make(1000).push(frame),
        `a frame of data link version ${Frames.VERSION + 1}, where this side speaks version ${Frames.VERSION}`
      )
      // Over the limit too: the version is read before the frame may be passed over.
      const big = Frames.head(7, 2, "{}", 5000)
      big[4] = 0
      assert.match(String(reader.make(100, () => true).push(big)), /data link version 0/)
      const current = reader.make(1000).push(Frames.head(1, 3, "{}", 0))
      assert.deepStrictEqual(current, [{ kind: 1, id: 3, header: "{}", payload: new Uint8Array(0) }])
    })
  }

  it.live("appends and fetches cross as sent; errors as themselves; answers in any order", () =>
    Effect.gen(function* () {
      const records = Array.from({ length: 120 }, (_, i) => record(i))
      const fetched: ReplicaManager.FetchResult = {
        _tag: "Batches",
        leaderEpoch: 4,
        batches: [
          { baseOffset: 10, epoch: 3, records: records.slice(0, 70), producer: { id: 99, epoch: 2, sequence: 5 } },
          { baseOffset: 80, epoch: 4, records: records.slice(70) }
        ],
        highWatermark: 100,
        logStartOffset: 0
      }
      const { appends, handlers } = recording(fetched)
      const address = yield* DataLink.serve({ host: "127.0.0.1", port: 0 }, handlers)
      const client = yield* DataLink.connect(address)

      const result = yield* client.append({ tablet, records, acks: "all", producer: { id: 42, epoch: 1, sequence: 7 } })
      assert.deepStrictEqual(result, { baseOffset: 10, lastOffset: 129, highWatermark: 5, duplicate: false })
      assert.strictEqual(appends.length, 1)
      assert.deepStrictEqual(appends[0]!.tablet, tablet)
      assert.strictEqual(appends[0]!.acks, "all")
      assert.deepStrictEqual(appends[0]!.producer, { id: 42, epoch: 1, sequence: 7 })
      assert.deepStrictEqual(plain(appends[0]!.records), plain(records))
      yield* client.append({ tablet, records: records.slice(0, 1), acks: 0 })
      assert.isUndefined(appends[1]!.producer)

      const got = yield* client.fetch(fetchRequest)
      assert.strictEqual(got._tag, "Batches")
      if (got._tag === "Batches") {
        assert.deepStrictEqual(
          got.batches.map((b) => ({ ...b, records: plain(b.records) })),
          fetched.batches.map((b) => ({ ...b, records: plain(b.records) }))
        )
        assert.strictEqual(got.highWatermark, 100)
      }

      const refused = yield* Effect.flip(client.append({ tablet: { table: "orders", bucket: 9 }, records, acks: 1 }))
      assert.instanceOf(refused, ReplicaManager.ReplicaError)
      if (refused instanceof ReplicaManager.ReplicaError) assert.deepStrictEqual(refused.reason, notLeader.reason)
      const died = yield* Effect.flip(client.fetch({ ...fetchRequest, offset: 666 }))
      assert.instanceOf(died, PeerUnreachable)
      assert.match(died.message, /boom/)

      // The slow answer (offset 1) comes after the quick one; each reaches its own caller.
      const slow = yield* Effect.forkChild(client.fetch({ ...fetchRequest, offset: 1 }))
      const quick = yield* client.append({ tablet, records: records.slice(0, 2), acks: 1 })
      assert.strictEqual(quick.lastOffset, 11)
      assert.strictEqual((yield* Fiber.join(slow))._tag, "Batches")
    })
  )

  it.live("reads cross as sent: the records, the log's bounds; OffsetOutOfRange and NotLeader as themselves", () =>
    Effect.gen(function* () {
      const { reads, handlers } = recording({ _tag: "OutOfRange", leaderEpoch: 1, logStartOffset: 0 })
      const address = yield* DataLink.serve({ host: "127.0.0.1", port: 0 }, handlers)
      const client = yield* DataLink.connect(address)
      const request = { tablet, offset: 12, maxBytes: 5_000, uncommitted: true, maxWaitMs: 250 }
      const got = yield* client.read(request)
      const want = readResult(Array.from({ length: 20 }, (_, i) => record(i)))
      const plainly = (r: ReplicaManager.ReadResult) => ({
        ...r,
        batches: r.batches.map((b) => ({ ...b, records: plain(b.records) }))
      })
      // Checked as they arrived, their records not decoded until asked for (only a checked batch knows its bytes).
      for (const b of got.batches) assert.isDefined(Codec.recordBytesOf(b))
      assert.deepStrictEqual(plainly(got), plainly(want))
      assert.deepStrictEqual(reads, [request])

      const below = yield* Effect.flip(client.read({ tablet, offset: 0, maxBytes: 100 }))
      assert.instanceOf(below, ReplicaManager.ReplicaError)
      if (below instanceof ReplicaManager.ReplicaError) {
        assert.instanceOf(below.reason, Errors.OffsetOutOfRange)
        assert.deepStrictEqual(
          below.reason._tag === "OffsetOutOfRange"
            ? [below.reason.offset, below.reason.logStart, below.reason.highwater]
            : [],
          [0, 2, 32]
        )
        assert.isFalse(below.retryable)
      }
      const notHere = yield* Effect.flip(
        client.read({ tablet: { table: "orders", bucket: 9 }, offset: 5, maxBytes: 1 })
      )
      assert.instanceOf(notHere, ReplicaManager.ReplicaError)
      if (notHere instanceof ReplicaManager.ReplicaError) {
        assert.deepStrictEqual(notHere.reason, notLeader.reason)
        assert.isTrue(notHere.retryable)
      }
    })
  )

  it.live("a read the caller gives up is ended on the server: by its cancel, or as the connection closes", () =>
    Effect.gen(function* () {
      let started = 0
      let ended = 0
      const handlers: DataLink.DataLinkHandlers = {
        append: () => Effect.die("unused"),
        fetch: () => Effect.succeed({ _tag: "OutOfRange", leaderEpoch: 1, logStartOffset: 0 }),
        read: () =>
          Effect.andThen(
            Effect.sync(() => started++),
            Effect.never.pipe(
              Effect.onInterrupt(() =>
                Effect.sync(() => {
                  ended++
                })
              )
            )
          )
      }
      const address = yield* DataLink.serve({ host: "127.0.0.1", port: 0 }, handlers)
      const scope = yield* Scope.make()
      const client = yield* DataLink.connect(address).pipe(Scope.provide(scope))
      const waiting = yield* Effect.forkChild(client.read({ tablet, offset: 0, maxBytes: 1, maxWaitMs: 60_000 }))
      yield* eventually(Effect.sync(() => started === 1))
      yield* Fiber.interrupt(waiting)
      yield* eventually(Effect.sync(() => ended === 1))
      // The connection goes on for the other calls.
      assert.strictEqual((yield* client.fetch(fetchRequest))._tag, "OutOfRange")
      // A read still waiting when its connection closes ends too.
      yield* Effect.forkChild(client.read({ tablet, offset: 0, maxBytes: 1 }))
      yield* eventually(Effect.sync(() => started === 2))
      yield* Scope.close(scope, Exit.void)
      yield* eventually(Effect.sync(() => ended === 2))
    })
  )

  it.live(
    "a tablet server's reads on the link: records and bounds as appended, errors typed, a long-poll woken by a commit",
    () =>
      Effect.gen(function* () {
        const servers = yield* makeServers({
          minInsyncReplicas: 1,
          fetchMaxWait: 1_500,
          retryBackoff: 10,
          replicaLagTimeMax: 60_000
        })
        const server = yield* servers.start(1)
        yield* servers.instruct([1], tablet, [1], { leader: 1, leaderEpoch: 0, isr: [1] })
        const address = yield* DataLink.serve(
          { host: "127.0.0.1", port: 0 },
          {
            append: server.append,
            fetch: server.fetch,
            read: server.read
          }
        )
        const client = yield* DataLink.connect(address)
        yield* client.append({ tablet, records: recordsOf("v", 0, 5), acks: "all" })
        const read = yield* client.read({ tablet, offset: 0, maxBytes: 1 << 20 })
        assert.deepStrictEqual(values(read.batches), ["v0", "v1", "v2", "v3", "v4"])
        assert.deepStrictEqual([read.logStartOffset, read.highWatermark, read.logEndOffset], [0, 5, 5])
        const past = yield* Effect.flip(client.read({ tablet, offset: 7, maxBytes: 100 }))
        assert.instanceOf(past, ReplicaManager.ReplicaError)
        if (past instanceof ReplicaManager.ReplicaError && past.reason._tag === "OffsetOutOfRange") {
          assert.deepStrictEqual([past.reason.offset, past.reason.logStart, past.reason.highwater], [7, 0, 5])
        } else assert.fail(`not OffsetOutOfRange: ${past.message}`)

        const elapsed = <A, E>(self: Effect.Effect<A, E>) =>
          Effect.gen(function* () {
            const start = yield* Clock.currentTimeMillis
            const a = yield* self
            return { a, ms: (yield* Clock.currentTimeMillis) - start }
          })
        // Without a wait, a read at the HW answers empty at once.
        const now = yield* elapsed(client.read({ tablet, offset: 5, maxBytes: 100 }))
        assert.deepStrictEqual(now.a.batches, [])
        assert.isBelow(now.ms, 300)
        // A long-poll answers once an append commits, not at the end of its wait.
        const polling = yield* Effect.forkChild(
          elapsed(client.read({ tablet, offset: 5, maxBytes: 100, maxWaitMs: 1_400 }))
        )
        yield* Effect.sleep(100)
        yield* client.append({ tablet, records: recordsOf("v", 5, 7), acks: "all" })
        const woken = yield* Fiber.join(polling)
        assert.deepStrictEqual(values(woken.a.batches), ["v5", "v6"])
        assert.isAtLeast(woken.ms, 90)
        assert.isBelow(woken.ms, 1_000)
        // With nothing committed it answers empty once its wait is over; never past the leader's fetchMaxWait.
        const empty = yield* elapsed(client.read({ tablet, offset: 7, maxBytes: 100, maxWaitMs: 200 }))
        assert.deepStrictEqual([empty.a.batches.length, empty.a.highWatermark], [0, 7])
        assert.isAtLeast(empty.ms, 190)
        assert.isBelow(empty.ms, 1_000)
        const capped = yield* elapsed(client.read({ tablet, offset: 7, maxBytes: 100, maxWaitMs: 60_000 }))
        assert.strictEqual(capped.a.batches.length, 0)
        assert.isAtLeast(capped.ms, 1_450)
        assert.isBelow(capped.ms, 3_000)
        // A replica that stops leading while a read waits answers NotLeader.
        const lost = yield* Effect.forkChild(client.read({ tablet, offset: 7, maxBytes: 100, maxWaitMs: 1_400 }))
        yield* Effect.sleep(50)
        yield* servers.instruct([1], tablet, [1, 2], { leader: 2, leaderEpoch: 1, isr: [1, 2] })
        const notLeader = yield* Effect.flip(Fiber.join(lost))
        assert.instanceOf(notLeader, ReplicaManager.ReplicaError)
        if (notLeader instanceof ReplicaManager.ReplicaError) assert.strictEqual(notLeader.reason._tag, "NotLeader")
      }),
    20_000
  )

  it.live("a request sent in a span is handled as that span's child (its trace context crosses in the header)", () =>
    Effect.gen(function* () {
      const seen: Array<{ readonly traceId: string; readonly spanId: string } | undefined> = []
      const parentNow = Effect.map(Effect.option(Effect.currentParentSpan), (p) =>
        p._tag === "None" ? undefined : { traceId: p.value.traceId, spanId: p.value.spanId }
      )
      const handlers: DataLink.DataLinkHandlers = {
        append: () =>
          Effect.flatMap(parentNow, (parent) =>
            Effect.sync(() => {
              seen.push(parent)
              return { baseOffset: 0, lastOffset: 0, highWatermark: 1, duplicate: false }
            })
          ),
        fetch: () =>
          Effect.flatMap(parentNow, (parent) =>
            Effect.sync(() => {
              seen.push(parent)
              return { _tag: "OutOfRange" as const, leaderEpoch: 4, logStartOffset: 0 }
            })
          ),
        read: () => Effect.die("unused")
      }
      const address = yield* DataLink.serve({ host: "127.0.0.1", port: 0 }, handlers)
      const client = yield* DataLink.connect(address)
      const request = { tablet, records: [record(1)], acks: "all" as const }
      const caller = yield* Effect.gen(function* () {
        yield* client.append(request)
        yield* client.fetch(fetchRequest)
        return yield* Effect.currentSpan
      }).pipe(Effect.withSpan("caller"))
      // Outside any span: no parent.
      yield* client.append(request)
      assert.deepStrictEqual(seen, [
        { traceId: caller.traceId, spanId: caller.spanId },
        { traceId: caller.traceId, spanId: caller.spanId },
        undefined
      ])
    }).pipe(Effect.scoped)
  )

  it.live("bad bytes are refused by name, nothing stored, and the server goes on serving", () =>
    Effect.gen(function* () {
      const { appends, handlers } = recording({ _tag: "OutOfRange", leaderEpoch: 1, logStartOffset: 0 })
      const address = yield* DataLink.serve({ host: "127.0.0.1", port: 0 }, handlers, { maxFrameBytes: 1 << 16 })
      const header = JSON.stringify({ tablet, acks: "all" })

      // Records that are no batch, a header that is no request, a kind that is no request: each refused, typed.
      const answers = framesOf(
        yield* raw(address.port, [
          Frames.head(1, 5, header, 3),
          Uint8Array.of(1, 2, 3),
          Frames.head(1, 6, "{not json", 0),
          Frames.head(2, 7, JSON.stringify({ tablet, follower: -1 }), 0),
          Frames.head(9, 8, "{}", 0)
        ])
      )
      assert.deepStrictEqual(
        answers.map((f) => f.id),
        [5, 6, 7, 8]
      )
      for (const f of answers) assert.strictEqual(f.kind, 126)
      assert.match(answers[0]!.header, /orders\/3: records: not a tablet batch/)
      assert.match(answers[1]!.header, /append/)
      assert.match(answers[2]!.header, /fetch/)
      assert.match(answers[3]!.header, /no request of kind 9/)

      // A request over the limit: refused by name, its bytes passed over, and the connection serves the next one.
      const over = yield* exchange(
        address.port,
        [
          Frames.head(1, 9, header, 1 << 20),
          new Uint8Array(1 << 20),
          Frames.head(2, 10, JSON.stringify(fetchRequest), 0)
        ],
        2
      )
      assert.deepStrictEqual(
        over.frames.map((f) => [f.id, f.kind]),
        [
          [9, 126],
          [10, 66]
        ]
      )
      assert.match(
        over.frames[0]!.header,
        /a request of 1048\d+ bytes is over the data link.s frame limit of 65536 bytes/
      )
      assert.strictEqual(appends.length, 0)
      // Bytes that are no frames at all: the server says why and closes that connection.
      const garbage = framesOf(yield* raw(address.port, [Uint8Array.of(0, 0, 0, 2, 0, 0)]))
      assert.strictEqual(garbage.length, 1)
      assert.match(garbage[0]!.header, /not a data link frame/)

      // The server still serves.
      const client = yield* DataLink.connect(address)
      assert.strictEqual((yield* client.fetch(fetchRequest))._tag, "OutOfRange")
    })
  )

  it.live("a fetch's answer fits the frame limit: the leader reads no more than fits, the follower pages on", () =>
    Effect.gen(function* () {
      // 3000 batches of one byte each (their answer's header weighs more than they do), then 100 of 1 000 bytes:
      // together far above the 64 KiB frames, and asked for with a 1 MiB fetch.
      const log = yield* logOf([
        ...Array.from({ length: 3000 }, (_, i) => [sized(i, 1)]),
        ...Array.from({ length: 100 }, (_, i) => [sized(i, 1000)])
      ])
      const asked: Array<{ readonly maxBytes: number; readonly read: number }> = []
      const address = yield* DataLink.serve({ host: "127.0.0.1", port: 0 }, fetchingFrom(log, asked), {
        maxFrameBytes: 1 << 16
      })
      const client = yield* DataLink.connect(address, { maxFrameBytes: 1 << 16 })
      let offset = 0
      const answers: Array<number> = []
      while (offset < 3100) {
        const got = yield* client.fetch({ ...fetchRequest, offset, maxBytes: 1 << 20 })
        assert.strictEqual(got._tag, "Batches")
        if (got._tag !== "Batches") break
        assert.isAbove(got.batches.length, 0)
        for (const b of got.batches) {
          assert.strictEqual(b.baseOffset, offset)
          assert.strictEqual(b.records[0]!.value.length, offset < 3000 ? 1 : 1000)
          offset += b.records.length
        }
        answers.push(got.batches.length)
      }
      assert.strictEqual(offset, 3100)
      // As many batches as fit each time: a handful of answers, not one per batch.
      assert.isBelow(answers.length, 10)
      for (const { maxBytes } of asked) assert.isAtMost(maxBytes, 1 << 16, "the leader's read is bounded by the frame")
      // The first answers' headers alone would have been over the frame: they carried fewer batches than were read.
      assert.isBelow(answers[0]!, asked[0]!.read)
    })
  )

  it.live("a batch over the frame limit is refused by name; other tablets' calls on the connection go on", () =>
    Effect.gen(function* () {
      const big = { baseOffset: 0, epoch: 1, records: [sized(0, 100_000)] }
      const bigBytes = Codec.encodeBatch(1, big.records).length
      const arrived = yield* Deferred.make<void>()
      const release = yield* Deferred.make<void>()
      const handlers: DataLink.DataLinkHandlers = {
        append: () => Effect.die("unused"),
        read: () => Effect.die("unused"),
        fetch: (request) =>
          request.tablet.bucket === 1
            ? Effect.succeed({
                _tag: "Batches",
                leaderEpoch: 1,
                batches: [big],
                highWatermark: 1,
                logStartOffset: 0
              })
            : Effect.as(Effect.andThen(Deferred.succeed(arrived, undefined), Deferred.await(release)), {
                _tag: "OutOfRange",
                leaderEpoch: 1,
                logStartOffset: 0
              } as const)
      }
      // The server's frames are as small as the client's (64 KiB), then larger (1 MiB): the client's limit counts.
      for (const serverMax of [1 << 16, 1 << 20]) {
        const scope = yield* Scope.make()
        const address = yield* DataLink.serve({ host: "127.0.0.1", port: 0 }, handlers, {
          maxFrameBytes: serverMax
        }).pipe(Scope.provide(scope))
        const client = yield* DataLink.connect(address, { maxFrameBytes: 1 << 16 }).pipe(Scope.provide(scope))
        // Another tablet's fetch is under way on the same connection.
        const other = yield* Effect.forkChild(client.fetch({ ...fetchRequest, tablet: { table: "orders", bucket: 2 } }))
        yield* Deferred.await(arrived)
        const refused = yield* Effect.flip(client.fetch({ ...fetchRequest, tablet: { table: "orders", bucket: 1 } }))
        assert.instanceOf(refused, ReplicaManager.ReplicaError, `server frames of ${serverMax}: ${refused.message}`)
        assert.include(refused.message, `the batch at offset 0 is ${bigBytes} bytes`)
        assert.include(refused.message, "frame limit of 65536 bytes")
        yield* Deferred.succeed(release, undefined)
        assert.strictEqual((yield* Fiber.join(other))._tag, "OutOfRange")
        // And the connection serves the next call.
        assert.strictEqual(
          (yield* client.fetch({ ...fetchRequest, tablet: { table: "orders", bucket: 2 } }))._tag,
          "OutOfRange"
        )
        yield* Scope.close(scope, Exit.void)
      }
    })
  )

  it.live("an answer over the client's limit (a server of before) fails its call alone, not the connection", () =>
    Effect.gen(function* () {
      // A server that answers bucket 1 with 200 000 bytes, then bucket 2 as it should, once both were asked.
      const server = Net.createServer((socket) => {
        const reader = new Frames.FrameReader(1 << 20)
        const asked = new Map<number, number>()
        socket.on("error", () => {})
        socket.on("data", (chunk: Buffer) => {
          const frames = reader.push(chunk)
          if (typeof frames === "string") return socket.destroy()
          for (const f of frames) {
            if (isFrame(f)) asked.set(JSON.parse(f.header).tablet.bucket, f.id)
          }
          if (asked.size < 2) return
          socket.write(Frames.head(66, asked.get(1)!, "{}", 200_000))
          socket.write(new Uint8Array(200_000))
          const answer = JSON.stringify({ _tag: "OutOfRange", leaderEpoch: 1, logStartOffset: 0 })
          socket.write(Frames.head(66, asked.get(2)!, answer, 0))
        })
      })
      yield* Effect.acquireRelease(
        Effect.callback<void>((resume) => {
          server.listen(0, "127.0.0.1", () => resume(Effect.void))
        }),
        () => Effect.sync(() => server.close())
      )
      const port = (server.address() as Net.AddressInfo).port
      const client = yield* DataLink.connect({ host: "127.0.0.1", port }, { maxFrameBytes: 1 << 16 })
      const [over, other] = yield* Effect.all(
        [
          Effect.flip(client.fetch({ ...fetchRequest, tablet: { table: "orders", bucket: 1 } })),
          client.fetch({ ...fetchRequest, tablet: { table: "orders", bucket: 2 } })
        ],
        { concurrency: "unbounded" }
      )
      assert.instanceOf(over, PeerUnreachable)
      assert.match(over.message, /a frame of 200\d+ bytes is over the limit of 65536/)
      assert.strictEqual(other._tag, "OutOfRange")
    })
  )

  it.live("link options are checked: a fetchMaxBytes over what a frame carries is refused, naming both", () =>
    Effect.gen(function* () {
      const { handlers } = recording({ _tag: "OutOfRange", leaderEpoch: 1, logStartOffset: 0 })
      const refused = yield* Effect.flip(
        DataLink.serve({ host: "127.0.0.1", port: 0 }, handlers, { maxFrameBytes: 1 << 16, fetchMaxBytes: 1 << 20 })
      )
      assert.instanceOf(refused, InvalidReplicaOptions)
      assert.strictEqual(refused.option, "fetchMaxBytes")
      assert.strictEqual(refused.value, "1048576")
      assert.include(refused.message, "maxFrameBytes (65536)")
      const tiny = yield* Effect.flip(DataLink.serve({ host: "127.0.0.1", port: 0 }, handlers, { maxFrameBytes: 100 }))
      assert.instanceOf(tiny, InvalidReplicaOptions)
      assert.strictEqual(tiny.option, "maxFrameBytes")
      // At the bound, it serves.
      const address = yield* DataLink.serve({ host: "127.0.0.1", port: 0 }, handlers, {
        maxFrameBytes: 1 << 16,
        fetchMaxBytes: (1 << 16) - 1024
      })
      const client = yield* DataLink.connect(address)
      assert.strictEqual((yield* client.fetch(fetchRequest))._tag, "OutOfRange")
    })
  )

  it.live("a peer that leaves its answers unread is cut off, not held in memory", () =>
    Effect.gen(function* () {
      const records = Array.from({ length: 30 }, (_, i) => ({ ...record(i), value: new Uint8Array(1000).fill(i) }))
      const { handlers } = recording({
        _tag: "Batches",
        leaderEpoch: 1,
        batches: [{ baseOffset: 0, epoch: 1, records }],
        highWatermark: 30,
        logStartOffset: 0
      })
      const address = yield* DataLink.serve({ host: "127.0.0.1", port: 0 }, handlers, { maxFrameBytes: 1 << 16 })
      // 1000 fetches, about 30 MB of answers, left unread for a second: more than the kernel's buffers and the
      // limit. Read then, the connection ends before the last answer.
      const outcome = yield* Effect.callback<{ readonly closed: boolean; readonly answers: number }>((resume) => {
        const socket = Net.connect({ host: "127.0.0.1", port: address.port })
        const reader = new Frames.FrameReader(1 << 20)
        let answers = 0
        socket.pause()
        socket.on("data", (chunk: Buffer) => {
          const frames = reader.push(chunk)
          if (typeof frames !== "string") answers += frames.length
        })
        socket.on("error", () => {})
        socket.on("close", () => resume(Effect.succeed({ closed: true, answers })))
        const request = JSON.stringify(fetchRequest)
        for (let id = 1; id <= 1000; id++) socket.write(Frames.head(2, id, request, 0))
        const reading = setTimeout(() => socket.resume(), 1_000)
        const giveUp = setTimeout(() => {
          socket.destroy()
          resume(Effect.succeed({ closed: false, answers }))
        }, 15_000)
        return Effect.sync(() => {
          clearTimeout(reading)
          clearTimeout(giveUp)
        })
      })
      assert.isTrue(outcome.closed, "the server closed the connection")
      assert.isBelow(outcome.answers, 1000)
      const client = yield* DataLink.connect(address)
      assert.strictEqual((yield* client.fetch(fetchRequest))._tag, "Batches")
    })
  )

  it.live("a server that stops or is not there: PeerUnreachable, and the next call reconnects", () =>
    Effect.gen(function* () {
      const { handlers } = recording({ _tag: "OutOfRange", leaderEpoch: 1, logStartOffset: 0 })
      const serverScope = yield* Scope.make()
      const address = yield* DataLink.serve({ host: "127.0.0.1", port: 0 }, handlers).pipe(Scope.provide(serverScope))
      const client = yield* DataLink.connect(address)
      assert.strictEqual((yield* client.fetch(fetchRequest))._tag, "OutOfRange")
      // A call waiting on the server when it stops.
      const waiting = yield* Effect.forkChild(client.fetch({ ...fetchRequest, offset: 1 }))
      yield* Effect.sleep(30)
      yield* Scope.close(serverScope, Exit.void)
      const cut = yield* Effect.flip(Fiber.join(waiting))
      assert.instanceOf(cut, PeerUnreachable)
      const refused = yield* Effect.flip(client.fetch(fetchRequest))
      assert.instanceOf(refused, PeerUnreachable)

      // Serving again on the same port: the client's next call connects again.
      const again = yield* DataLink.serve(address, handlers)
      assert.strictEqual(again.port, address.port)
      assert.strictEqual((yield* client.fetch(fetchRequest))._tag, "OutOfRange")
    })
  )

  it.live(
    "a port already taken is ListenFailed naming the listener and the address, for the data link and the RPC",
    () =>
      Effect.gen(function* () {
        const { handlers } = recording({ _tag: "OutOfRange", leaderEpoch: 1, logStartOffset: 0 })
        const taken = yield* DataLink.serve({ host: "127.0.0.1", port: 0 }, handlers)
        const link = yield* Effect.flip(DataLink.serve(taken, handlers))
        assert.instanceOf(link, ListenFailed)
        assert.match(link.message, new RegExp(`the data link cannot listen on 127.0.0.1:${taken.port}: .*EADDRINUSE`))
        const rpc = yield* Effect.flip(
          serveController(taken, {
            current: Effect.succeed(undefined),
            servers: Effect.succeed([]),
            replicationFactor: 3
          })
        )
        assert.instanceOf(rpc, ListenFailed)
        assert.match(rpc.message, new RegExp(`the RPC cannot listen on 127.0.0.1:${taken.port}: .*EADDRINUSE`))
      })
  )

  it.live(
    "RemotePeers sends appends, follower fetches and reads on a server's data link; without one reads take the RPC",
    () =>
      Effect.gen(function* () {
        const viaLink = recording({ _tag: "OutOfRange", leaderEpoch: 1, logStartOffset: 0 })
        const link = yield* DataLink.serve({ host: "127.0.0.1", port: 0 }, viaLink.handlers)
        let viaRpc = 0
        const rpc = yield* serveTabletServerWith(
          { host: "127.0.0.1", port: 0 },
          {
            LeaderAndIsr: () => Effect.void,
            LogEnd: () => Effect.succeed({ lastEpoch: null, logEndOffset: 0 }),
            Holdings: () => Effect.succeed({ tablets: [] }),
            StopReplica: () => Effect.void,
            EndOffsetForEpoch: () =>
              Effect.sync(() => {
                viaRpc++
                return { leaderEpoch: 0, answer: null }
              }),
            Read: (request) =>
              Effect.sync(() => {
                viaRpc++
                return { batches: [], highWatermark: request.offset, logStartOffset: 0, logEndOffset: request.offset }
              }),
            DeleteRecords: () => Effect.die("not called"),
            ReplicaState: () => Effect.die("unused"),
            ReadLog: () => Effect.die("unused")
          }
        )
        const remote = yield* RemotePeers.make({
          locate: () => Effect.succeed(formatAddress(rpc)),
          // Server 1 registered a data link, server 2 did not.
          locateData: (id) => Effect.succeed(id === 1 ? formatAddress(link) : undefined),
          controller: Effect.fail(new PeerUnreachable({ target: "the controller", detail: "none in this test" })),
          requestTimeout: 3_000
        })
        const append = { tablet, records: [record(1)], acks: "all" as const }
        yield* remote.server(1).append(append)
        assert.strictEqual(viaLink.appends.length, 1)
        assert.strictEqual((yield* remote.peers.leader(1).fetch(fetchRequest)).leaderEpoch, 1)
        // Everything else goes on the RPC.
        yield* remote.peers.leader(1).endOffsetForEpoch({ tablet, leaderEpoch: 1, epoch: 0 })
        assert.strictEqual(viaRpc, 1)
        // A server with no data link takes no append and no fetch, and the error says why.
        const noAppend = yield* Effect.flip(remote.server(2).append(append))
        assert.strictEqual(noAppend.message, "server 2 unreachable: it registered no data link")
        const noFetch = yield* Effect.flip(remote.peers.leader(2).fetch(fetchRequest))
        assert.strictEqual(noFetch.message, "server 2 unreachable: it registered no data link")
        assert.strictEqual(viaLink.appends.length, 1)
        // Reads take the data link when the server has one, its RPC when it has not.
        const linked = yield* remote.server(1).read({ tablet, offset: 12, maxBytes: 100, maxWaitMs: 10 })
        assert.strictEqual(linked.batches.length, 2)
        assert.deepStrictEqual(viaLink.reads, [{ tablet, offset: 12, maxBytes: 100, maxWaitMs: 10 }])
        const refused = yield* Effect.flip(
          remote.server(1).read({ tablet: { table: "orders", bucket: 9 }, offset: 12, maxBytes: 1 })
        )
        assert.instanceOf(refused, ReplicaManager.ReplicaError)
        const rpcRead = yield* remote.server(2).read({ tablet, offset: 40, maxBytes: 100 })
        assert.deepStrictEqual(rpcRead, { batches: [], highWatermark: 40, logStartOffset: 0, logEndOffset: 40 })
        assert.strictEqual(viaRpc, 2)
        assert.strictEqual(viaLink.reads.length, 2)
      })
  )
})
