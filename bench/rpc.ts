// What Effect RPC costs per record on the produce and fetch paths (docs/ARCHITECTURE.md, "Benchmarks"), against a
// plain socket baseline in the same process on loopback.
//
// - RPC: appends and fetches as Effect RPC calls over TCP with `SchemaBinary` (`ViaRpc` below: the group appends
//   and fetches had before they moved to the data link), called on the RPC client. `Append` carries BATCH records
//   of RECORD_BYTES bytes and is answered at once; `Fetch` is answered with one batch of BATCH such records; both
//   carry the records in the tablet log's batch encoding (`ReplicaRpc.EncodedBatch`). The handlers do no work: what
//   is measured is the transport, encoding and decoding.
// - Schema per record (`.schemaPerRecord`): the same calls with core's `AppendRequest` / `FetchResult` Schemas on
//   the wire, a Schema pass per record: what the batch encoding replaced.
// - Data link (`.dataLink`): `DataLink`, the lean framing tablet servers use for appends and follower fetches,
//   called through `RemotePeers` as the servers call it (the records are decoded as a server decodes them).
// - Baseline: `node:net` with a hand-written framing (u32 length, then per record u32 length and its bytes), the
//   same records, answered the same way: the leanest a dedicated framing could be.
// All keep INFLIGHT requests outstanding. Repetitions interleave (rpc, per record, plain, then the other way
// round, ...); each figure is the median of its repetitions.
//
// Each record size runs every side; 1 KB records in a third of the calls.
//
// Environment (the results file is written only with the defaults):
//   BENCH_BATCHES (3000), BENCH_BATCH (100), BENCH_RECORD_BYTES (100,1000), BENCH_INFLIGHT (4), BENCH_RUNS (3)
import * as Net from "node:net"
import { ReplicaManager } from "../packages/replica/src/index.js"
import { Effect, Exit, Schema, Scope } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import { DataLink, RemotePeers, ReplicaRpc } from "../packages/replica/src/index.js"
import * as Codec from "../packages/replica/src/wire/internal/batchCodec.js"
import {
  type BenchOutput,
  collectGarbage,
  envInt,
  envString,
  type Figure,
  median,
  progress,
  randomBytes,
  round3
} from "./lib.js"

const BATCHES = envInt("BENCH_BATCHES", 3000)
const BATCH = envInt("BENCH_BATCH", 100)
const RECORD_SIZES = (envString("BENCH_RECORD_BYTES") ?? "100,1000").split(",").map(Number)
const INFLIGHT = envInt("BENCH_INFLIGHT", 4)
const RUNS = envInt("BENCH_RUNS", 3)
const defaults =
  BATCHES === 3000 && BATCH === 100 && envString("BENCH_RECORD_BYTES") === undefined && INFLIGHT === 4 && RUNS === 3

const tablet = { table: "bench", bucket: 0 }
/** What one size's runs send: the records of a call, a fetch's answer, and how many calls. */
interface Load {
  readonly records: ReadonlyArray<ReplicaManager.TabletRecord>
  readonly fetched: ReplicaManager.FetchResult
  readonly batches: number
}
const loadOf = (recordBytes: number): Load => {
  const records: Array<ReplicaManager.TabletRecord> = Array.from({ length: BATCH }, (_, i) => ({
    key: null,
    value: new Uint8Array(randomBytes(recordBytes, i + 1)),
    headers: [],
    timestamp: 1_700_000_000_000 + i
  }))
  return {
    records,
    fetched: {
      _tag: "Batches",
      leaderEpoch: 0,
      batches: [{ baseOffset: 0, epoch: 0, records }],
      highWatermark: BATCH,
      logStartOffset: 0
    },
    batches: recordBytes >= 1000 ? Math.ceil(BATCHES / 3) : BATCHES
  }
}
const fetchRequest = { tablet, follower: 2, leaderEpoch: 0, offset: 0, maxBytes: 1_048_576 }

/** Runs `count` calls of `call` with `INFLIGHT` outstanding; the seconds it took. */
const timed = (count: number, call: (i: number) => Effect.Effect<unknown, unknown>) =>
  Effect.gen(function* () {
    const started = performance.now()
    yield* Effect.forEach(
      Array.from({ length: count }, (_, i) => i),
      call,
      {
        concurrency: INFLIGHT,
        discard: true
      }
    )
    return (performance.now() - started) / 1000
  })

/** Appends and fetches as RPC calls, their records in the tablet log's batch encoding. */
class ViaRpc extends RpcGroup.make(
  Rpc.make("Append", {
    payload: Schema.Struct({ ...ReplicaManager.AppendRequest.fields, records: Schema.Uint8Array }),
    success: ReplicaManager.AppendResult
  }),
  Rpc.make("Fetch", {
    payload: ReplicaManager.FetchRequest,
    success: Schema.TaggedStruct("Batches", {
      leaderEpoch: Schema.Int,
      batches: Schema.Array(ReplicaRpc.EncodedBatch),
      highWatermark: Schema.Int,
      logStartOffset: Schema.Int
    })
  })
) {}

/** The RPC side: a server with no-op handlers, a client, and the seconds each path took. */
const rpcRun = ({ records, fetched, batches }: Load) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const handlers = yield* ViaRpc.toHandlers({
      // The records decoded as a tablet server decodes them.
      Append: (r) =>
        Effect.sync(() => {
          const batch = Codec.decodeBatch(0, r.records)
          if (typeof batch === "string") throw new Error(batch)
          return { baseOffset: 0, lastOffset: batch.records.length - 1, highWatermark: 0, duplicate: false }
        }),
      Fetch: () => Effect.succeed(fetched as Extract<ReplicaManager.FetchResult, { _tag: "Batches" }>)
    })
    const bound = yield* ReplicaRpc.serveGroup(ViaRpc, handlers, { host: "127.0.0.1", port: 0 }).pipe(
      Scope.provide(scope),
      Effect.orDie
    )
    const client = yield* ReplicaRpc.connectGroup(ViaRpc, scope, ReplicaRpc.formatAddress(bound)).pipe(Effect.orDie)
    const produce = yield* timed(batches, () =>
      client.Append({ tablet, acks: 1, records: Codec.encodeBatch(0, records) })
    )
    const fetch = yield* timed(batches, () => client.Fetch(fetchRequest))
    yield* Scope.close(scope, Exit.void)
    return { produce, fetch }
  })

/** The data link side: `DataLink` served with no-op handlers, called through `RemotePeers` as servers call it. */
const linkRun = ({ records, fetched, batches }: Load) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const bound = yield* DataLink.serve(
      { host: "127.0.0.1", port: 0 },
      {
        append: (a) =>
          Effect.succeed({ baseOffset: 0, lastOffset: a.records.length - 1, highWatermark: 0, duplicate: false }),
        fetch: () => Effect.succeed(fetched),
        read: () => Effect.die("unused")
      }
    ).pipe(Scope.provide(scope), Effect.orDie)
    const address = ReplicaRpc.formatAddress(bound)
    const remote = yield* RemotePeers.make({
      locate: () => Effect.succeed("127.0.0.1:1"),
      locateData: () => Effect.succeed(address),
      controller: Effect.die("unused"),
      requestTimeout: "30 seconds"
    }).pipe(Scope.provide(scope))
    const produce = yield* timed(batches, () => remote.server(1).append({ tablet, records, acks: 1 }))
    const fetch = yield* timed(batches, () => remote.peers.leader(1).fetch(fetchRequest))
    yield* Scope.close(scope, Exit.void)
    return { produce, fetch }
  })

/** The same calls with a Schema pass per record (core's own Schemas on the wire), for the comparison. */
class PerRecord extends RpcGroup.make(
  Rpc.make("Append", { payload: ReplicaManager.AppendRequest, success: ReplicaManager.AppendResult }),
  Rpc.make("Fetch", { payload: ReplicaManager.FetchRequest, success: ReplicaManager.FetchResult })
) {}

/** The per-record side, served and called the same way. */
const perRecordRun = ({ records, fetched, batches }: Load) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const handlers = yield* PerRecord.toHandlers({
      Append: (r) =>
        Effect.succeed({ baseOffset: 0, lastOffset: r.records.length - 1, highWatermark: 0, duplicate: false }),
      Fetch: () => Effect.succeed(fetched)
    })
    const bound = yield* ReplicaRpc.serveGroup(PerRecord, handlers, { host: "127.0.0.1", port: 0 }).pipe(
      Scope.provide(scope),
      Effect.orDie
    )
    const client = yield* ReplicaRpc.connectGroup(PerRecord, scope, ReplicaRpc.formatAddress(bound)).pipe(Effect.orDie)
    const produce = yield* timed(batches, () => client.Append({ tablet, records, acks: 1 }))
    const fetch = yield* timed(batches, () => client.Fetch(fetchRequest))
    yield* Scope.close(scope, Exit.void)
    return { produce, fetch }
  })

/** Frames: u32 length, then the body. A produce body: u32 count, then per record u32 length and its bytes. */
const encodeRecords = (rs: ReadonlyArray<ReplicaManager.TabletRecord>): Buffer => {
  const size = 4 + rs.reduce((n, r) => n + 4 + r.value.length, 0)
  const out = Buffer.allocUnsafe(4 + size)
  out.writeUInt32BE(size, 0)
  out.writeUInt32BE(rs.length, 4)
  let at = 8
  for (const r of rs) {
    out.writeUInt32BE(r.value.length, at)
    out.set(r.value, at + 4)
    at += 4 + r.value.length
  }
  return out
}

/** Decodes a records body into fresh byte arrays (as a real server must, to keep them past the buffer). */
const decodeRecords = (body: Buffer): Array<Uint8Array> => {
  const count = body.readUInt32BE(0)
  const out: Array<Uint8Array> = []
  let at = 4
  for (let i = 0; i < count; i++) {
    const n = body.readUInt32BE(at)
    out.push(new Uint8Array(body.subarray(at + 4, at + 4 + n)))
    at += 4 + n
  }
  return out
}

/** Calls each frame's body `onFrame` as frames complete on `socket`. */
const frames = (socket: Net.Socket, onFrame: (body: Buffer) => void) => {
  let pending: Buffer<ArrayBufferLike> = Buffer.alloc(0)
  socket.on("data", (chunk: Buffer) => {
    pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk])
    while (pending.length >= 4) {
      const size = pending.readUInt32BE(0)
      if (pending.length < 4 + size) break
      onFrame(pending.subarray(4, 4 + size))
      pending = pending.subarray(4 + size)
    }
  })
}

/** The plain side: a `node:net` server answering produce (tag 1) with an 8-byte ack and fetch (tag 2) with records. */
const plainRun = async ({ records, batches }: Load): Promise<{ produce: number; fetch: number }> => {
  const fetchAnswer = encodeRecords(records)
  const ack = Buffer.from([0, 0, 0, 4, 0, 0, 0, 0])
  const server = Net.createServer((socket) => {
    socket.setNoDelay(true)
    frames(socket, (body) => {
      if (body[0] === 1) {
        decodeRecords(body.subarray(1))
        socket.write(ack)
      } else socket.write(fetchAnswer)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const port = (server.address() as Net.AddressInfo).port
  const socket = Net.connect(port, "127.0.0.1")
  socket.setNoDelay(true)
  await new Promise<void>((resolve) => socket.once("connect", () => resolve()))
  const waiting: Array<(body: Buffer) => void> = []
  frames(socket, (body) => waiting.shift()?.(body))
  const request = (tag: number, body: Buffer): Promise<Buffer> =>
    new Promise((resolve) => {
      waiting.push(resolve)
      const head = Buffer.allocUnsafe(5)
      head.writeUInt32BE(body.length + 1, 0)
      head[4] = tag
      socket.write(Buffer.concat([head, body]))
    })
  const produceBody = encodeRecords(records).subarray(4)
  const fetchBody = Buffer.from("fetch")
  const run = async (tag: number, body: Buffer, onAnswer: (b: Buffer) => void) => {
    const started = performance.now()
    let next = 0
    const lane = async () => {
      while (next < batches) {
        next++
        onAnswer(await request(tag, body))
      }
    }
    await Promise.all(Array.from({ length: INFLIGHT }, lane))
    return (performance.now() - started) / 1000
  }
  const produce = await run(1, produceBody, () => {})
  const fetch = await run(2, fetchBody, (b) => decodeRecords(b))
  socket.destroy()
  await new Promise<void>((resolve) => server.close(() => resolve()))
  return { produce, fetch }
}

/** Seconds of each path of each side. */
type Seconds = { readonly produce: number; readonly fetch: number }

/** The figures: records/s on each path and record size, RPC and the data link against the plain socket. */
export const run = async (): Promise<BenchOutput & { readonly save: boolean }> => {
  const figures: Array<Figure> = []
  for (const recordBytes of RECORD_SIZES) {
    const load = loadOf(recordBytes)
    const sides: Record<string, Array<Seconds>> = { rpc: [], link: [], perRecord: [], plain: [] }
    for (let i = 0; i < RUNS; i++) {
      const order = ["rpc", "link", "perRecord", "plain"]
      for (const side of i % 2 === 0 ? order : order.reverse()) {
        collectGarbage()
        progress(`rpc: ${recordBytes} B records, run ${i + 1}/${RUNS}, ${side}`)
        sides[side]!.push(
          side === "rpc"
            ? await Effect.runPromise(rpcRun(load))
            : side === "link"
              ? await Effect.runPromise(linkRun(load))
              : side === "perRecord"
                ? await Effect.runPromise(perRecordRun(load))
                : await plainRun(load)
        )
      }
    }
    const total = load.batches * BATCH
    for (const path of ["produce", "fetch"] as const) {
      const rate = (side: string) => total / median(sides[side]!.map((r) => r[path]))
      const baseline = rate("plain")
      const figure = (name: string, side: string, extra: Record<string, number> = {}) => {
        const value = rate(side)
        figures.push({
          bench: `rpc.${path}.${recordBytes}B${name}`,
          value: round3(value),
          unit: "records/s",
          baseline: round3(baseline),
          ratio: round3(value / baseline),
          usPerRecord: round3(1e6 / value),
          baselineUsPerRecord: round3(1e6 / baseline),
          ...extra
        })
      }
      figure(".schemaPerRecord", "perRecord")
      figure("", "rpc", { records: total, batch: BATCH, recordBytes, inflight: INFLIGHT })
      figure(".dataLink", "link", { timesRpc: round3(rate("link") / rate("rpc")) })
    }
  }
  return { results: figures, save: defaults }
}
