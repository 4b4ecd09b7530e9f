/**
 * The simulated clients' work. Clients are the real `TabletClient`: its directory on its own coordination session,
 * its `RemotePeers` over Effect RPC's in-memory client and server (`MemoryTransport`), every call crossing the
 * simulated network. Idempotent producers send acks=all (some seeds some acks=1) records, a client at a time; a
 * consumer reads each tablet from where it got to; a third of the seeds also delete records (`deleteRecords`) below
 * what was acknowledged, now and then just past it; the controller is asked to create the tablets (with the seed's
 * retention, when it draws one) until it has; and, once the cluster settled, a probe appends to every tablet.
 */
import { Coordination, Models } from "@strata/core"
import { Duration, Effect, Exit, type Fiber, Logger } from "effect"
import * as EffectResult from "effect/Result"
import type { Prng } from "../../../../scripts/test-support/prng.js"
import * as Clock from "../../../../scripts/test-support/sim/Clock.js"
import * as RemotePeers from "../../src/client/RemotePeers.js"
import * as TabletClient from "../../src/client/TabletClient.js"
import * as ControllerRpc from "../../src/server/ControllerRpc.js"
import * as TabletServerRpc from "../../src/server/TabletServerRpc.js"
import * as Audit from "./Audit.js"
import * as Checkers from "./Checkers.js"
import * as MemoryTransport from "./MemoryTransport.js"
import { call } from "./Network.js"
import { controllerNow } from "./Peers.js"
import { traceLogger } from "./Process.js"
import { coordinationOf } from "./ProcessCoordination.js"
import { log, NAMESPACE, now, type Proc, type World } from "./World.js"

const encoder = new TextEncoder()
const decoder = new TextDecoder()

/** The clients' shared settings and the fibers of the producers and the consumer. */
export interface Workload {
  readonly w: World
  readonly transport: RemotePeers.TransportShape
  readonly lingerMs: number
  readonly producers: number
  readonly deliveryTimeoutMs: number
  /** The producers' and the consumer's fibers: the run settles only once they ended. */
  readonly fibers: Array<Fiber.Fiber<void>>
  /** Off once the faults stop: the producers and the consumer finish what they do and end. */
  producing: boolean
}

/** What the clients reach of coordinator `c`: its controller now, the registered servers, the replication factor. */
const endpointOf = (w: World, c: Proc): ControllerRpc.ControllerEndpoint => ({
  current: Effect.sync(() => c.controller),
  servers: Effect.map(Audit.registeredServers(w), (ids) => [...ids].map((id) => ({ id, address: `s${id}` }))),
  replicationFactor: w.cluster.rf
})

/** The clients' transport (every call over the simulated network), then the seed's client settings, in order. */
export const make = (w: World): Workload => {
  const transport = MemoryTransport.make({
    route: (address, request) => call(w, "client", address, request),
    server: (address) => {
      const server = w.byName.get(address)?.server
      return server === undefined ? undefined : TabletServerRpc.tabletServerHandlers(server)
    },
    link: (address) => {
      const server = w.byName.get(address)?.server
      return server === undefined ? undefined : { append: server.append, fetch: server.fetch, read: server.read }
    },
    coordinator: (address) => {
      const c = w.byName.get(address)
      if (c?.kind !== "coordinator" || c.scope === undefined) return undefined
      const handlers = ControllerRpc.controllerHandlers(endpointOf(w, c))
      // Planted: ids drawn at random from a small range instead of the controller's blocks.
      return w.variant.randomProducerIds === true
        ? { ...handlers, InitProducerId: () => Effect.succeed(w.rng.int(0, 3)) }
        : handlers
    }
  })
  const lingerMs = w.rng.pick([0, 5])
  const producers = w.config.shape?.producers ?? w.rng.int(1, 3)
  const deliveryTimeoutMs = w.rng.pick([1_000, 3_000, 8_000])
  return { w, transport, lingerMs, producers, deliveryTimeoutMs, fibers: [], producing: true }
}

/** A client, closed with the scope. */
const makeClient = (wl: Workload, deliveryTimeoutMs: number) =>
  TabletClient.make({
    namespace: NAMESPACE,
    linger: wl.lingerMs,
    retryBackoff: 50,
    requestTimeout: wl.w.cluster.replication.appendTimeout + 1_000,
    deliveryTimeout: deliveryTimeoutMs,
    replication: wl.w.cluster.replication
  }).pipe(
    Effect.provideService(Coordination.Coordination, coordinationOf(wl.w, wl.w.clientProc)),
    Effect.provideService(RemotePeers.Transport, wl.transport),
    Effect.provideService(Logger.CurrentLoggers, new Set([traceLogger(wl.w, wl.w.clientProc)])),
    Effect.orDie
  )

/** What a send's answer says of its records. */
const outcomeOf = (
  result: EffectResult.Result<TabletClient.Sent, TabletClient.TabletClientError>
): Checkers.Outcome => {
  if (EffectResult.isSuccess(result)) return { _tag: "Acked", baseOffset: result.success.baseOffset }
  const reason = result.failure.reason
  return reason._tag === "DeliveryUnknown" || reason._tag === "ClientClosed"
    ? { _tag: "Unknown" }
    : { _tag: "Failed", why: reason.message }
}

const records = (values: ReadonlyArray<string>) =>
  values.map((v) => ({ key: null, value: encoder.encode(v), headers: [], timestamp: 0 }))

/**
 * Producer `n` while the run produces: a client's life is a producer id from the controller on its first send,
 * some rounds of sends (a few at once, which it batches per tablet), then it closes and another starts.
 */
const producer = (wl: Workload, n: number) => {
  const { w } = wl
  let next = 0
  return Effect.gen(function* () {
    while (wl.producing) {
      yield* Effect.scoped(
        Effect.gen(function* () {
          const client = yield* makeClient(wl, wl.deliveryTimeoutMs)
          for (let rounds = w.rng.int(3, 30); rounds > 0 && wl.producing; rounds--) {
            const sends = yield* Effect.forEach(Array.from({ length: w.rng.int(1, 3) }), () =>
              Effect.gen(function* () {
                const tablet = w.rng.pick(w.cluster.tablets)
                const values = Array.from({ length: w.rng.int(1, 4) }, () => `p${n}-${next++}`)
                // Some seeds send some records acks=1: acknowledged by the leader alone, they leave tails only
                // some replicas hold, for leader changes to truncate.
                const acks = w.cluster.faultMix.acksOne && w.rng.chance(0.4) ? (1 as const) : ("all" as const)
                return { tablet, values, acks, done: yield* client.enqueue(tablet, records(values), acks) }
              })
            )
            for (const { tablet, values, acks, done } of sends) {
              const outcome = outcomeOf(yield* Effect.result(done))
              if (outcome._tag === "Failed")
                log(w, `client: a send to ${Models.tabletKey(tablet)} failed: ${outcome.why}`)
              // An acks=1 acknowledgement promises nothing once the leader changes: such records may be lost.
              Checkers.append(
                w.record,
                Models.tabletKey(tablet),
                values,
                acks === 1 && outcome._tag === "Acked" ? { _tag: "Unknown" } : outcome
              )
            }
            yield* Effect.sleep(Duration.millis(w.rng.int(10, 80)))
          }
        })
      )
    }
  })
}

/**
 * A consumer, through a client of its own: reads each tablet from where it got to; every record it is given is
 * recorded, and must be in the final log at its offset (nothing above a HW reaches a consumer).
 */
const consumer = (wl: Workload) => {
  const { w } = wl
  const readFrom = new Map<string, number>()
  return Effect.scoped(
    Effect.gen(function* () {
      const client = yield* makeClient(wl, 1_000)
      while (wl.producing) {
        yield* Effect.sleep(Duration.millis(w.rng.int(20, 120)))
        const tablet = w.rng.pick(w.cluster.tablets)
        const key = Models.tabletKey(tablet)
        const offset = readFrom.get(key) ?? 0
        const read = yield* Effect.result(client.read(tablet, offset, w.rng.pick([1, 200, 100_000])))
        if (EffectResult.isFailure(read)) {
          const reason = read.failure.reason
          if (reason._tag === "ReplicaError" && reason.reason._tag === "OffsetOutOfRange") readFrom.set(key, 0)
          continue
        }
        for (const b of read.success.batches) {
          b.records.forEach((r, i) => {
            if (b.baseOffset + i >= offset)
              Checkers.read(w.record, key, b.baseOffset + i, decoder.decode(r.value), now(w))
          })
          readFrom.set(key, Math.max(readFrom.get(key) ?? 0, b.baseOffset + b.records.length))
        }
      }
    })
  )
}

/** Where a tablet's acknowledged records end, as its producers were told. */
const ackedEnd = (w: World, key: string): number =>
  w.record.appends.reduce(
    (end, a) =>
      a.tablet === key && a.outcome._tag === "Acked" ? Math.max(end, a.outcome.baseOffset + a.values.length) : end,
    0
  )

/** What a delete's answer says. */
const deleteOutcomeOf = (
  result: EffectResult.Result<number, TabletClient.TabletClientError>
): Checkers.DeleteOutcome => {
  if (EffectResult.isSuccess(result)) return { _tag: "Acked", logStart: result.success }
  const reason = result.failure.reason
  return reason._tag === "DeliveryUnknown" || reason._tag === "ClientClosed"
    ? { _tag: "Unknown" }
    : { _tag: "Failed", why: reason.message }
}

/**
 * The delete family, drawn by its own generator `rng`: now and then a client deletes a tablet's records before an
 * offset at or below what was acknowledged there (one time in ten just past it, which a leader whose HW is below
 * refuses), and every call's outcome is recorded.
 */
const deleter = (wl: Workload, rng: Prng) => {
  const { w } = wl
  return Effect.scoped(
    Effect.gen(function* () {
      const client = yield* makeClient(wl, wl.deliveryTimeoutMs)
      while (wl.producing) {
        yield* Effect.sleep(Duration.millis(rng.int(200, 1_000)))
        const tablet = rng.pick(w.cluster.tablets)
        const key = Models.tabletKey(tablet)
        const end = ackedEnd(w, key)
        const offset = rng.chance(0.1) ? end + rng.int(1, 3) : rng.int(Math.floor(end / 2), end)
        const outcome = deleteOutcomeOf(yield* Effect.result(client.deleteRecords(tablet, offset)))
        log(w, `client: a delete of ${key} before ${offset} ended ${JSON.stringify(outcome)}`)
        Checkers.deleted(w.record, key, offset, outcome, now(w))
      }
    })
  )
}

/** Asks the controller now to create the tablets (each replica set a rotation of the servers), until it has. */
const createTablets = (w: World) =>
  Effect.gen(function* () {
    while (true) {
      const c = controllerNow(w)
      if (c !== undefined) {
        const retention = w.cluster.retention
        const specs = w.cluster.tablets.map((tablet) => ({
          tablet,
          replicas: Array.from({ length: w.cluster.rf }, (_, r) => ((tablet.bucket + r) % w.cluster.serverCount) + 1),
          ...(retention === undefined ? {} : { retention })
        }))
        const reply = yield* c.controller!.createTablets(specs).pipe(Effect.option)
        if (reply._tag === "Some" && reply.value._tag === "Created") return
      }
      yield* Effect.sleep(Duration.millis(50))
    }
  })

/** Forks the producers, the consumer and the tablets' creation. */
export const start = (wl: Workload) =>
  Effect.gen(function* () {
    for (let n = 0; n < wl.producers; n++) wl.fibers.push(yield* Effect.forkIn(producer(wl, n), wl.w.root))
    wl.fibers.push(yield* Effect.forkIn(consumer(wl), wl.w.root))
    const deleting = wl.w.cluster.deleting
    if (deleting !== undefined) wl.fibers.push(yield* Effect.forkIn(deleter(wl, deleting), wl.w.root))
    yield* Effect.forkIn(createTablets(wl.w), wl.w.root)
  })

/** Whether the producers and the consumer have ended. */
export const ended = (wl: Workload): boolean => wl.fibers.every((f) => f.pollUnsafe() !== undefined)

/**
 * The liveness probe once settled: a final acks=all append to every tablet must be acknowledged within 110 steps;
 * what each one that failed says, as a violation.
 */
export const probe = (wl: Workload) =>
  Effect.gen(function* () {
    const { w } = wl
    const probes: Array<string> = []
    for (const tablet of w.cluster.tablets) {
      const outcome = yield* probeTablet(wl, tablet)
      if (outcome?._tag === "Acked") Checkers.append(w.record, Models.tabletKey(tablet), [probeValue(tablet)], outcome)
      else
        probes.push(
          `${Models.tabletKey(tablet)}: the final acks=all append was not acknowledged: ${JSON.stringify(outcome)}`
        )
    }
    return probes
  })

const probeValue = (tablet: Models.TabletId) => `probe-${Models.tabletKey(tablet)}`

/** One probe's send, the clock stepped until it ends (at most 110 steps); `undefined` if it did not. */
const probeTablet = (wl: Workload, tablet: Models.TabletId) =>
  Effect.gen(function* () {
    const { w } = wl
    const fiber = yield* Effect.forkIn(
      Effect.scoped(
        Effect.flatMap(makeClient(wl, 100 * w.config.stepMs), (client) =>
          Effect.map(Effect.result(client.send(tablet, records([probeValue(tablet)]))), outcomeOf)
        )
      ),
      w.root
    )
    for (let i = 0; i < 110 && fiber.pollUnsafe() === undefined; i++) yield* Clock.tick(w.clock)
    const exit = fiber.pollUnsafe()
    return exit !== undefined && Exit.isSuccess(exit) ? exit.value : undefined
  })
