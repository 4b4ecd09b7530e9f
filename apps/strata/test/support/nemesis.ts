/**
 * The process-level nemesis run: 3 coordinators and 5 tablet servers as child processes (RF 3, minInsyncReplicas
 * 2), producers writing at acks=all and recording every send's outcome, and a nemesis that, for `durationMs`,
 * kills -9 random servers, the server leading the most tablets and coordinators, pauses servers and coordinators
 * past the session timeout (SIGSTOP, then SIGCONT), and restarts the dead on their data directories. One seed draws
 * every choice, and every run prints it.
 *
 * On a cluster whose servers are behind proxies (`ProcessCluster`'s `proxied`) it also cuts the network, each cut
 * healed after a drawn delay: a server isolated from peers, clients and the controller (its inbound proxies stalled)
 * while it keeps its coordination session; its data link alone stalled (its RPC answers, replication through it
 * does not); its coordination alone stalled past the session timeout (it must lose its registration and register
 * again once resumed); every connection of a server reset. At most two servers are down, paused or cut off at once.
 *
 * An impostor is a second `tablet-server` with a running server's id: SIGTERMed while it waits for the id, or left
 * to give up (exit non-zero, one line naming the id and the holder's address); either way it never acted for the id
 * (no registration, no controlled shutdown in its log) and the real server kept its registration. The real server
 * takes no other fault meanwhile, and is not restarted while the impostor runs. Should the real server's registration
 * end on its own meanwhile (its session expired under a stall), the impostor taking the id is what it must do: it is
 * then terminated, and the real server, which refused to act while the id was held, comes back after it.
 *
 * When the faults stop, everything is restarted or resumed; liveness is asserted (every tablet leads with its full
 * ISR and takes a write), then the checker reads every replica's log.
 */
import type { TabletClient } from "@strata/replica"
import { Deferred, Duration, Effect, Fiber, Option, Schedule } from "effect"
import { type Prng, seeded } from "../../../../scripts/test-support/prng.js"
import { awaitMetadata, client, faultSettings, record } from "./clusterTest.js"
import type { ProcessCluster } from "../../../../scripts/test-support/processCluster.js"
import * as Checker from "./replicaChecker.js"

/** What a run did and found. */
export interface NemesisResult {
  readonly seed: number
  readonly faults: ReadonlyArray<string>
  readonly sends: { readonly ok: number; readonly failed: number; readonly unknown: number }
  readonly report: Checker.Report
  /** Every tablet took a write after the faults stopped. */
  readonly liveAfter: boolean
  /** What a fault's own check found wrong (an impostor that acted, a cut that did not cut). */
  readonly anomalies: ReadonlyArray<string>
  /** How each impostor ended. */
  readonly impostors: ReadonlyArray<string>
}

/** What the fault loop shares with the faults it draws and their heals. */
interface State {
  readonly cluster: ProcessCluster
  readonly random: Prng
  readonly client: TabletClient.TabletClientShape
  readonly table: string
  readonly pauseMs: () => number
  /** Servers under a network cut (until it is healed and checked): faulty, as the down and the paused. */
  readonly cut: Map<number, string>
  /** The server an impostor runs against: it takes no other fault meanwhile. */
  impostorOf: number | undefined
  /** Heals (and checks) under way. */
  readonly heals: Array<Fiber.Fiber<void>>
  /** Completed when the faults stop: a heal still waiting heals at once. */
  readonly ending: Deferred.Deferred<void>
  readonly anomalies: Array<string>
  readonly impostors: Array<string>
  /** The run's start, for the times in messages. */
  readonly startedAt: number
}

const SERVERS = [1, 2, 3, 4, 5]
const COORDINATORS = [101, 102, 103]

/** Runs the nemesis for `durationMs` on `cluster` (nothing started yet) with a table of `tablets` tablets. */
export const run = (
  cluster: ProcessCluster,
  options: { readonly namespace: string; readonly seed: number; readonly durationMs: number; readonly tablets: number }
) =>
  Effect.gen(function* () {
    const random = seeded(options.seed)
    const table = "nemesis"
    yield* Effect.forEach(COORDINATORS, (id) => cluster.start("coordinator", id), { concurrency: "unbounded" })
    yield* Effect.forEach(SERVERS, (id) => cluster.start("tablet-server", id), { concurrency: "unbounded" })
    const c = yield* client(options.namespace, 20_000)
    const created = yield* c.createTable(table, { buckets: options.tablets })
    const tablets = created.map((t) => t.tablet)
    yield* awaitMetadata(c, table, "the table online", (m) => m.tablets.every((t) => t.isr.length === 3))

    // Producers: each sends 1–4 records at a time to a tablet it draws, recording the outcome.
    const acked: Array<Checker.Acked> = []
    const sends = { ok: 0, failed: 0, unknown: 0 }
    let stop = false
    const producer = (p: number) =>
      Effect.gen(function* () {
        const own = seeded(options.seed ^ (p * 0x9e3779b1))
        let n = 0
        while (!stop) {
          const tablet = own.pick(tablets)
          const values = Array.from({ length: own.int(1, 4) }, () => `p${p}-${n++}`)
          const result = yield* Effect.result(c.send(tablet, values.map(record)))
          if (result._tag === "Success") {
            sends.ok++
            acked.push({ tablet, baseOffset: result.success.baseOffset, values })
          } else if (result.failure.reason._tag === "DeliveryUnknown") sends.unknown++
          else sends.failed++
        }
      })
    const producers = yield* Effect.forEach([0, 1, 2, 3], (p) => Effect.forkChild(producer(p)))

    const faults: Array<string> = []
    const deadline = Date.now() + options.durationMs
    const state: State = {
      cluster,
      random,
      client: c,
      table,
      pauseMs: () => faultSettings.sessionTimeout + random.int(500, 3_000),
      cut: new Map(),
      impostorOf: undefined,
      heals: [],
      ending: yield* Deferred.make<void>(),
      anomalies: [],
      impostors: [],
      startedAt: Date.now()
    }
    while (Date.now() < deadline) {
      yield* Effect.sleep(Duration.millis(random.int(1_000, 3_000)))
      const fault = yield* nextFault(state)
      if (fault !== undefined)
        faults.push(`${Math.round((options.durationMs - (deadline - Date.now())) / 1000)}s ${fault}`)
    }

    // Heal: every cut ends and every impostor's end is checked; everything runs again; the cluster must become
    // whole and take writes.
    yield* Deferred.succeed(state.ending, undefined)
    for (const id of SERVERS) {
      const p = cluster.proxies(id)
      if (p !== undefined) for (const proxy of [p.rpc, p.data, p.coordination]) proxy.resume()
    }
    yield* Effect.forEach(state.heals, Fiber.join, { discard: true })
    for (const id of SERVERS) cluster.resume("tablet-server", id)
    for (const id of COORDINATORS) cluster.resume("coordinator", id)
    for (const id of COORDINATORS) if (!cluster.isRunning("coordinator", id)) yield* cluster.start("coordinator", id)
    for (const id of SERVERS) if (!cluster.isRunning("tablet-server", id)) yield* cluster.start("tablet-server", id)
    stop = true
    yield* Effect.forEach(producers, Fiber.join, { discard: true })
    yield* awaitMetadata(c, table, "every tablet leading with its full ISR after the faults", (m) =>
      m.tablets.every((t) => t.leader !== null && t.isr.length === t.replicas.length)
    )
    const final = yield* Effect.forEach(
      tablets,
      (tablet) =>
        Effect.result(c.send(tablet, [record(`final-${tablet.bucket}`)])).pipe(
          Effect.map((r) => {
            if (r._tag === "Success")
              acked.push({ tablet, baseOffset: r.success.baseOffset, values: [`final-${tablet.bucket}`] })
            return r._tag === "Success"
          })
        ),
      { concurrency: "unbounded" }
    )
    const report = yield* Checker.check(c, table, acked)
    return {
      seed: options.seed,
      faults,
      sends,
      report,
      liveAfter: final.every((ok) => ok),
      anomalies: state.anomalies,
      impostors: state.impostors
    } satisfies NemesisResult
  })

/** The fault kinds drawn on every cluster, and those drawn only on a proxied one. */
const KINDS = ["kill-server", "kill-leader-server", "pause-server", "kill-coordinator", "pause-coordinator", "impostor"]
const NETWORK_KINDS = ["isolate-server", "cut-data-link", "cut-coordination", "reset-connections"]

/** Runs `heal` after `ms`, or at once when the faults stop; kept so that the end of the run waits for it. */
const healLater = (state: State, ms: number, heal: Effect.Effect<void>) =>
  Effect.gen(function* () {
    const fiber = yield* Effect.forkChild(
      Effect.andThen(Effect.raceFirst(Effect.sleep(Duration.millis(ms)), Deferred.await(state.ending)), heal)
    )
    state.heals.push(fiber)
  })

/** How many lines of `text` match `pattern`. */
const count = (text: string, pattern: RegExp): number => text.split("\n").filter((line) => pattern.test(line)).length

const ENDED = /registration ended with its session/
const REGISTERED = / registered at /

/** Draws and applies one fault (or a restart of the dead, when too many are down); what it did. */
const nextFault = (state: State) =>
  Effect.gen(function* () {
    const { cluster, random, client: c, table, pauseMs } = state
    // The server an impostor runs against comes back once the impostor is done (it may hold the id by then).
    const downServers = SERVERS.filter((id) => !cluster.isRunning("tablet-server", id) && id !== state.impostorOf)
    const downCoordinators = COORDINATORS.filter((id) => !cluster.isRunning("coordinator", id))
    // At most two servers and one coordinator down at once: the dead come back first.
    if (downServers.length >= 2 || (downServers.length > 0 && random.chance(0.5))) {
      yield* cluster.start("tablet-server", random.pick(downServers))
    }
    if (downCoordinators.length > 0 && random.chance(0.6)) {
      yield* cluster.start("coordinator", random.pick(downCoordinators))
    }
    // Live: running, not paused, not cut off. At most two servers are anything else.
    const liveServers = SERVERS.filter(
      (id) => cluster.isRunning("tablet-server", id) && !cluster.isPaused("tablet-server", id) && !state.cut.has(id)
    )
    // A server an impostor runs against takes no fault of its own meanwhile.
    const targets = liveServers.filter((id) => id !== state.impostorOf)
    const liveCoordinators = COORDINATORS.filter(
      (id) => cluster.isRunning("coordinator", id) && !cluster.isPaused("coordinator", id)
    )
    const kind = random.pick(cluster.proxied ? [...KINDS, ...NETWORK_KINDS] : KINDS)
    if ((kind === "kill-coordinator" || kind === "pause-coordinator") && liveCoordinators.length >= 2) {
      const id = random.pick(liveCoordinators)
      if (kind === "kill-coordinator") {
        yield* cluster.kill("coordinator", id)
        return `kill -9 coordinator ${id}`
      }
      const ms = pauseMs()
      cluster.pause("coordinator", id)
      yield* Effect.forkDetach(
        Effect.delay(
          Effect.sync(() => cluster.resume("coordinator", id)),
          Duration.millis(ms)
        )
      )
      return `SIGSTOP coordinator ${id} for ${ms} ms`
    }
    if (kind === "impostor") return yield* impostor(state, targets)
    if (liveServers.length <= 3 || targets.length === 0) return undefined
    if (kind === "kill-leader-server") {
      const m = yield* Effect.option(c.metadata(table))
      const leads = new Map<number, number>()
      if (m._tag === "Some")
        for (const t of m.value.tablets) if (t.leader !== null) leads.set(t.leader, (leads.get(t.leader) ?? 0) + 1)
      const id = [...leads.entries()].filter(([id]) => targets.includes(id)).sort((a, b) => b[1] - a[1])[0]?.[0]
      if (id !== undefined) {
        yield* cluster.kill("tablet-server", id)
        return `kill -9 server ${id} (leading ${leads.get(id)} tablets)`
      }
    }
    const id = random.pick(targets)
    if (kind === "pause-server") {
      const ms = pauseMs()
      cluster.pause("tablet-server", id)
      yield* Effect.forkDetach(
        Effect.delay(
          Effect.sync(() => cluster.resume("tablet-server", id)),
          Duration.millis(ms)
        )
      )
      return `SIGSTOP server ${id} for ${ms} ms`
    }
    const proxies = cluster.proxies(id)
    if (proxies !== undefined && NETWORK_KINDS.includes(kind)) {
      if (kind === "reset-connections") {
        for (const p of [proxies.rpc, proxies.data, proxies.coordination]) p.dropAll()
        return `reset every connection of server ${id}`
      }
      if (kind === "isolate-server" || kind === "cut-data-link") {
        const stalled = kind === "isolate-server" ? [proxies.rpc, proxies.data] : [proxies.data]
        const ms = random.int(3_000, 12_000)
        const what =
          kind === "isolate-server"
            ? `server ${id} cut off from peers, clients and the controller (its coordination session kept)`
            : `server ${id}'s data link cut (its RPC answers)`
        state.cut.set(id, what)
        for (const p of stalled) p.stall()
        yield* healLater(
          state,
          ms,
          Effect.sync(() => {
            for (const p of stalled) p.resume()
            state.cut.delete(id)
          })
        )
        return `${what} for ${ms} ms`
      }
      // Coordination alone, past the session timeout: the session expires (the server learns so when it
      // reconnects), so the server must lose its registration, and register again once it can.
      const ms = faultSettings.sessionTimeout + random.int(1_500, 4_000)
      const what = `server ${id} cut off from coordination`
      const log = () => cluster.log("tablet-server", id)
      const [ended, registered] = [count(log(), ENDED), count(log(), REGISTERED)]
      state.cut.set(id, what)
      proxies.coordination.stall()
      const cutAt = Date.now()
      yield* healLater(
        state,
        ms,
        Effect.gen(function* () {
          proxies.coordination.resume()
          const stalledMs = Date.now() - cutAt
          const deadline = Date.now() + 30_000
          while (Date.now() < deadline && !(count(log(), ENDED) > ended && count(log(), REGISTERED) > registered))
            yield* Effect.sleep(Duration.millis(200))
          // A cut the end of the run healed early may have been shorter than the session timeout.
          if (count(log(), ENDED) <= ended && stalledMs > faultSettings.sessionTimeout + 1_000)
            state.anomalies.push(`${what} for ${stalledMs} ms: it never lost its registration`)
          else if (count(log(), REGISTERED) <= registered && count(log(), ENDED) > ended)
            state.anomalies.push(`${what} for ${stalledMs} ms: it did not register again within 30 s of the heal`)
          state.cut.delete(id)
        })
      )
      return `${what} for ${ms} ms`
    }
    yield* cluster.kill("tablet-server", id)
    return `kill -9 server ${id}`
  })

/** What in an impostor's output would be acting for the id. */
const ACTED = /registered at | ready at |controlled shutdown|stopping while/

/**
 * Starts an impostor of a live server that holds its registration; SIGTERMs it after a drawn delay while it
 * waits, or lets it give up; checks its end (in a fiber the end of the run waits for).
 */
const impostor = (state: State, targets: ReadonlyArray<number>) =>
  Effect.gen(function* () {
    const { cluster, random, client: c, table } = state
    if (state.impostorOf !== undefined || targets.length === 0) return undefined
    const id = random.pick(targets)
    const terminateAfter = random.chance(0.5) ? random.int(0, 5_000) : undefined
    const m = yield* Effect.option(c.metadata(table))
    const holder = m._tag === "Some" ? m.value.servers.find((s) => s.id === id)?.address : undefined
    // Only against a registered server: one whose registration is gone may be this id's free for the taking.
    if (holder === undefined) return undefined
    state.impostorOf = id
    const imp = cluster.impostor(id)
    const at = () => `${Math.round((Date.now() - state.startedAt) / 1000)}s`
    const endedBefore = count(cluster.log("tablet-server", id), ENDED)
    // The real server's registration ended on its own meanwhile (its session expired: a stall, a slow coordination)
    // and the impostor, waiting for the id, took it: what any second server with that id must do, not a fault.
    const tookOver = () => ACTED.test(imp.stdout()) && count(cluster.log("tablet-server", id), ENDED) > endedBefore
    const fiber = yield* Effect.forkChild(
      Effect.gen(function* () {
        const problems: Array<string> = []
        // It says it waits for the id, or (the real registration having ended) takes it at once.
        const waited = yield* Effect.raceFirst(
          Effect.promise(() => imp.waiting).pipe(Effect.as(true)),
          Effect.sync(tookOver).pipe(
            Effect.repeat({ schedule: Schedule.spaced(Duration.millis(200)), until: (took) => took }),
            Effect.as(false)
          )
        ).pipe(Effect.timeoutOption(Duration.seconds(40)))
        if (waited._tag === "None") problems.push("it never said it waits for the id")
        let how: string
        if (terminateAfter !== undefined) {
          yield* Effect.raceFirst(
            Effect.sleep(Duration.millis(terminateAfter)),
            Effect.promise(() => imp.exited)
          )
          const exit = yield* Effect.promise(() => imp.terminate())
          how = `SIGTERM ${terminateAfter} ms into its wait: exit code ${exit.code} signal ${exit.signal}`
          // Interrupted while it waits (a clean SIGTERM: 0); giving up first (1, its one line) is as good.
          if (exit.code !== 0 && exit.code !== 1) problems.push(`exit code ${exit.code} signal ${exit.signal}`)
        } else {
          const exit = yield* Effect.raceFirst(
            Effect.promise(() => imp.exited).pipe(Effect.map((e) => ({ _tag: "Exited" as const, exit: e }))),
            Effect.sync(tookOver).pipe(
              Effect.repeat({ schedule: Schedule.spaced(Duration.millis(200)), until: (took) => took }),
              Effect.as({ _tag: "TookOver" as const })
            )
          ).pipe(
            Effect.map((r) => (r._tag === "Exited" ? Option.some(r.exit) : Option.none())),
            Effect.timeoutOption(Duration.seconds(60)),
            Effect.map(Option.flatten)
          )
          if (exit._tag === "None" && tookOver()) {
            yield* Effect.promise(() => imp.terminate())
            how = `took the id after server ${id}'s registration ended: terminated`
          } else if (exit._tag === "None") {
            problems.push("it did not give up within 60 s")
            yield* Effect.promise(() => imp.terminate())
            how = "left waiting: did not give up"
          } else {
            how = `left waiting: exit code ${exit.value.code}`
            const lines = imp.stderr().trimEnd().split("\n")
            if (exit.value.code === 0 || exit.value.code === null) problems.push(`exit code ${exit.value.code}`)
            if (lines.length !== 1) problems.push(`${lines.length} lines on stderr`)
            if (!lines[0]!.includes(`server id ${id} is registered by another server at ${holder}`))
              problems.push(`its line does not name the id and ${holder}: ${lines[0]}`)
          }
        }
        if (tookOver()) {
          if (!how.startsWith("took the id")) how = `${how}; it took the id after server ${id}'s registration ended`
        } else {
          if (ACTED.test(imp.stdout())) problems.push("it acted for the id (its log has a registration or a shutdown)")
          const after = yield* Effect.option(c.metadata(table))
          const now = after._tag === "Some" ? after.value.servers.find((s) => s.id === id)?.address : undefined
          if (now !== undefined && now !== holder) problems.push(`server ${id} is registered at ${now}, not ${holder}`)
        }
        state.impostors.push(`${at()} ${imp.name}: ${how}`)
        if (problems.length > 0) {
          // Another fault could not be the cause: the real server took none while the impostor ran.
          const lost = count(cluster.log("tablet-server", id), ENDED)
          state.anomalies.push(
            `${imp.name} (against server ${id} at ${holder}, ${how}): ${problems.join("; ")} (the real server's registrations ended ${lost} times over the run)`
          )
        }
        state.impostorOf = undefined
      })
    )
    state.heals.push(fiber)
    return `impostor of server ${id} (${terminateAfter === undefined ? "left to give up" : `SIGTERM ${terminateAfter} ms into its wait`})`
  })
