/**
 * The data link over TCP on loopback: appends and fetches arrive as sent (keys, headers, producer stamps, batches
 * as views of the frame), typed errors cross as themselves, answers match their requests in any order, bad bytes
 * are refused by name without taking the server down, a call on a closed or missing server is `PeerUnreachable`,
 * and `RemotePeers` takes the link only for servers that registered one.
 */
import * as Net from "node:net"
import { assert, describe, it } from "@effect/vitest"
import {
  type AppendRequest,
  type FetchRequest,
  type FetchResult,
  NotLeader,
  ReplicaError,
  type TabletRecord
} from "@strata/core"
import { Effect, Exit, Fiber, Random, Scope } from "effect"
import * as DataLink from "../src/DataLink.js"
import * as Frames from "../src/internal/frames.js"
import { PeerUnreachable } from "../src/Peers.js"
import * as RemotePeers from "../src/RemotePeers.js"
import { formatAddress, ListenFailed, serveController, serveTabletServerWith } from "../src/ReplicaRpc.js"

const tablet = { table: "orders", bucket: 3 }
const bytes = (s: string) => new TextEncoder().encode(s)
const record = (i: number): TabletRecord => ({
  key: i % 3 === 0 ? null : bytes(`key-${i}`),
  value: bytes(`value-${i}-${"x".repeat(i % 50)}`),
  headers: i % 4 === 0 ? [{ key: "h", value: bytes(`hv-${i}`) }] : [],
  timestamp: 1_700_000_000_000 + i
})
const plain = (records: ReadonlyArray<TabletRecord>) =>
  records.map((r) => ({
    key: r.key === null ? null : [...r.key],
    value: [...r.value],
    headers: r.headers.map((h) => ({ key: h.key, value: [...h.value] })),
    timestamp: r.timestamp
  }))
const fetchRequest: FetchRequest = { tablet, follower: 2, leaderEpoch: 4, offset: 10, maxBytes: 1 << 20 }
const notLeader = new ReplicaError({ reason: new NotLeader({ resource: "orders/3", leader: 7 }) })

/** Handlers that keep what they were sent and answer with `fetched`; appends to bucket 9 are refused. */
const recording = (fetched: FetchResult) => {
  const appends: Array<AppendRequest> = []
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
        : Effect.delay(Effect.succeed(fetched), request.offset === 1 ? 100 : 0)
  }
  return { appends, handlers }
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

const framesOf = (received: Uint8Array) => {
  const frames = new Frames.FrameReader(1 << 20).push(received)
  if (typeof frames === "string") throw new Error(frames)
  return frames
}

describe("DataLink", () => {
  it.effect("the frame reader cuts any chunking of a stream into the same frames", () =>
    Effect.gen(function* () {
      const sent = Array.from({ length: 40 }, (_, i) => {
        const payload = bytes("p".repeat(i * 37))
        return { kind: i % 3, id: i + 1, header: JSON.stringify({ i, text: "é".repeat(i % 5) }), payload }
      })
      const stream = Buffer.concat(
        sent.flatMap((f) => [Frames.head(f.kind, f.id, f.header, f.payload.length), f.payload])
      )
      for (let round = 0; round < 50; round++) {
        const reader = new Frames.FrameReader(1 << 20)
        const got: Array<Frames.Frame> = []
        let at = 0
        while (at < stream.length) {
          const size = yield* Random.nextIntBetween(1, round < 10 ? 3 : 700)
          const frames = reader.push(stream.subarray(at, at + size))
          assert.isTrue(typeof frames !== "string")
          if (typeof frames !== "string") got.push(...frames)
          at += size
        }
        assert.deepStrictEqual(
          got.map((f) => ({ kind: f.kind, id: f.id, header: f.header, payload: [...f.payload] })),
          sent.map((f) => ({ ...f, payload: [...f.payload] }))
        )
      }
      const reader = new Frames.FrameReader(100)
      const over = reader.push(Frames.head(1, 1, "{}", 200))
      assert.match(String(over), /over the limit of 100/)
    }).pipe(Random.withSeed(20))
  )

  it.live("appends and fetches cross as sent; errors as themselves; answers in any order", () =>
    Effect.gen(function* () {
      const records = Array.from({ length: 120 }, (_, i) => record(i))
      const fetched: FetchResult = {
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
      assert.instanceOf(refused, ReplicaError)
      if (refused instanceof ReplicaError) assert.deepStrictEqual(refused.reason, notLeader.reason)
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

      // A frame over the limit: the server says why and closes that connection.
      const over = framesOf(yield* raw(address.port, [Frames.head(1, 9, header, 1 << 20)]))
      assert.strictEqual(over.length, 1)
      assert.match(over[0]!.header, /over the limit/)
      assert.strictEqual(appends.length, 0)

      // The server still serves.
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

  it.live("RemotePeers appends through a server's data link when it registered one, else through the RPC", () =>
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
          Fetch: () => Effect.succeed({ _tag: "OutOfRange", leaderEpoch: 2, logStartOffset: 0 }),
          EndOffsetForEpoch: () => Effect.succeed({ leaderEpoch: 0, answer: null }),
          Append: () =>
            Effect.sync(() => {
              viaRpc++
              return { baseOffset: 0, lastOffset: 0, highWatermark: 0, duplicate: false }
            }),
          Read: () => Effect.die("unused"),
          ReplicaState: () => Effect.die("unused"),
          ReadLog: () => Effect.die("unused")
        }
      )
      const remote = yield* RemotePeers.make({
        locate: () => Effect.succeed(formatAddress(rpc)),
        // Server 1 registered a data link, server 2 did not.
        locateData: (id) => Effect.succeed(id === 1 ? formatAddress(link) : undefined),
        controller: Effect.fail(new PeerUnreachable({ target: "the controller", detail: "none in this test" })),
        requestTimeoutMs: 3_000
      })
      const append = { tablet, records: [record(1)], acks: "all" as const }
      yield* remote.server(1).append(append)
      yield* remote.server(2).append(append)
      assert.strictEqual(viaLink.appends.length, 1)
      assert.strictEqual(viaRpc, 1)
      // Follower fetches take the same way: the link answers epoch 1, the RPC epoch 2.
      assert.strictEqual((yield* remote.peers.leader(1).fetch(fetchRequest)).leaderEpoch, 1)
      assert.strictEqual((yield* remote.peers.leader(2).fetch(fetchRequest)).leaderEpoch, 2)
    })
  )
})
