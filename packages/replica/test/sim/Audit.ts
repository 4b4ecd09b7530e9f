/**
 * What the run observes of the cluster for the checkers: the tablets and registered servers as coordination holds
 * them (read by the auditor's session), every tablet write a controller commits, every server's replicas and logs
 * sampled after each step, a tablet's committed ISR against its leader's HW, where the replicas are against where
 * coordination assigns them, and the final logs the run is judged by.
 */
import { type Coordination, Models } from "@strata/core"
import { Effect } from "effect"
import type { LeaderEpochCache } from "../../src/machines/LeaderEpochCache.js"
import * as ClusterPaths from "../../src/wire/ClusterPaths.js"
import * as Checkers from "./Checkers.js"
import { now, paths, type Proc, type World } from "./World.js"

/** The tablet's node in coordination, `undefined` while it has none (or it cannot be read). */
export const readTablet = (w: World, t: Models.TabletId) =>
  w.auditor.get(paths.tablet(t)).pipe(
    Effect.flatMap((node) => ClusterPaths.decodeTablet(paths.tablet(t), node.data, node.stat.version)),
    Effect.option,
    Effect.map((o) => (o._tag === "Some" ? o.value : undefined))
  )

/**
 * A `multi` a process committed (`results`, in order of `ops`): each tablet it wrote, to the move checker, as the
 * node's new version.
 */
export const committed = (
  w: World,
  ops: ReadonlyArray<Coordination.Op>,
  results: ReadonlyArray<Coordination.OpResult>
) =>
  Effect.forEach(
    ops,
    (op, i) => {
      const result = results[i]
      if ((op._tag !== "create" && op._tag !== "set") || !op.path.startsWith(`${paths.tablets}/`)) return Effect.void
      const version = result?._tag === "set" ? result.stat.version : 0
      return ClusterPaths.decodeTablet(op.path, op.data, version).pipe(
        Effect.map((t) => Checkers.tabletWritten(w.record, t, now(w))),
        Effect.ignore
      )
    },
    { discard: true }
  )

/**
 * Where the replicas are against coordination, once settled: no tablet moving, none with a retired replica on a
 * running server that has not deleted it, every running server hosting exactly the tablets it is assigned. What is
 * off, one line each (none: in place).
 */
export const misplaced = (w: World) =>
  Effect.gen(function* () {
    const out: Array<string> = []
    for (const tablet of w.cluster.tablets) {
      const meta = yield* readTablet(w, tablet)
      const key = Models.tabletKey(tablet)
      if (meta === undefined) continue
      const r = meta.reassignment
      if (r !== undefined) out.push(`${key} is still moving from [${r.original.join(",")}] to [${r.target.join(",")}]`)
      const retired = (meta.retired ?? []).filter((s) => w.byName.get(`s${s}`)?.server !== undefined)
      if (retired.length > 0) out.push(`${key}: running servers [${retired.join(",")}] are retired and not deleted`)
      for (const p of w.servers) {
        if (p.server === undefined) continue
        const hosts = (yield* p.server.tablets).some((t) => Models.tabletKey(t) === key)
        const assigned = meta.replicas.includes(p.id)
        if (hosts && !assigned)
          out.push(`${p.name} holds a replica of ${key}, assigned to [${meta.replicas.join(",")}]`)
        if (!hosts && assigned) out.push(`${p.name} holds no replica of ${key}, which is assigned to it`)
      }
    }
    return out
  })

/** The ids of the servers registered now (none if coordination cannot be read). */
export const registeredServers = (w: World): Effect.Effect<Set<number>> =>
  w.auditor.children(paths.servers).pipe(
    Effect.map((names) => new Set(names.flatMap((n) => ClusterPaths.serverIdOf(n) ?? []))),
    Effect.orElseSucceed(() => new Set<number>())
  )

/** Records how far each of a server's logs reaches. */
export const sampleLogEnds = (w: World, p: Proc) =>
  Effect.gen(function* () {
    if (p.server === undefined) return
    for (const view of yield* p.server.replicas) {
      const tl = yield* p.server.logOf(view.tablet)
      if (tl !== undefined)
        Checkers.logEnd(
          w.record,
          p.name,
          Models.tabletKey(view.tablet),
          yield* tl.logStartOffset,
          yield* tl.logEndOffset,
          yield* tl.epochs
        )
      else Checkers.logClosed(w.record, p.name, Models.tabletKey(view.tablet))
    }
  })

/** After a step: every server's log ends, then every replica, then every tablet's committed ISR. */
export const sample = (w: World) =>
  Effect.gen(function* () {
    for (const p of w.servers) yield* sampleLogEnds(w, p)
    for (const p of w.servers) {
      if (p.server === undefined) continue
      for (const view of yield* p.server.replicas) {
        const tl = yield* p.server.logOf(view.tablet)
        const log =
          tl === undefined ? { start: 0, epochs: [] } : { start: yield* tl.logStartOffset, epochs: yield* tl.epochs }
        Checkers.replica(w.record, p.name, p.incarnation, view, now(w), log)
      }
    }
    for (const tablet of w.cluster.tablets) yield* sampleIsr(w, tablet)
  })

/**
 * The tablet's committed ISR against its leader's HW: every member that is the life it joined as (running, with
 * the registration the tablet records for it) holds the leader's log below the HW, the same epoch at every
 * offset — any of them may be elected cleanly next.
 */
export const sampleIsr = (w: World, tablet: Models.TabletId) =>
  Effect.gen(function* () {
    const meta = yield* readTablet(w, tablet)
    const lai = meta?.leaderAndIsr
    if (meta === undefined || lai === undefined || lai.leader === null) return
    const leader = w.byName.get(`s${lai.leader}`)?.server
    if (leader === undefined) return
    const view = (yield* leader.replicas).find((v) => Models.tabletKey(v.tablet) === Models.tabletKey(tablet))
    if (view?.machine._tag !== "LeaderReplica" || view.leader?.leaderEpoch !== lai.leaderEpoch) return
    const leaderLog = yield* leader.logOf(tablet)
    if (leaderLog === undefined) return
    const members: Array<{
      readonly server: string
      readonly start: number
      readonly end: number
      readonly epochs: LeaderEpochCache
    }> = []
    for (const s of lai.isr) {
      const m = w.byName.get(`s${s}`)
      if (s === lai.leader || m?.server === undefined || m.registration === undefined) continue
      if (m.registration !== meta.registrations?.[String(s)]) continue
      const log = yield* m.server.logOf(tablet)
      if (log === undefined) continue
      members.push({
        server: m.name,
        start: yield* log.logStartOffset,
        end: yield* log.logEndOffset,
        epochs: yield* log.epochs
      })
    }
    Checkers.isrHolds(
      w.record,
      Models.tabletKey(tablet),
      { server: `s${lai.leader}`, start: yield* leaderLog.logStartOffset, epochs: yield* leaderLog.epochs },
      view.leader.highWatermark,
      members,
      now(w)
    )
  })

/** Every tablet at the end: its leader by coordination, its node, and every running server's log of it. */
export const finalLogs = (w: World) =>
  Effect.forEach(w.cluster.tablets, (tablet) =>
    Effect.gen(function* () {
      const meta = yield* readTablet(w, tablet)
      const replicas = yield* Effect.forEach(w.servers, (p) =>
        Effect.gen(function* () {
          const log = p.server === undefined ? undefined : yield* p.server.logOf(tablet)
          if (log === undefined) return undefined
          const view = (yield* p.server!.replicas).find((v) => Models.tabletKey(v.tablet) === Models.tabletKey(tablet))
          const hw = view?.leader?.highWatermark ?? (yield* log.highWatermark)
          const logStart = yield* log.logStartOffset
          return {
            server: p.name,
            hw,
            logStart,
            batches: yield* log.read(logStart, Number.MAX_SAFE_INTEGER).pipe(Effect.orDie)
          }
        })
      )
      return {
        tablet: Models.tabletKey(tablet),
        leader: meta?.leaderAndIsr.leader === null || meta === undefined ? undefined : `s${meta.leaderAndIsr.leader}`,
        isr: meta?.leaderAndIsr.isr.map((s) => `s${s}`) ?? [],
        meta,
        replicas: replicas.flatMap((r) => (r === undefined ? [] : [r]))
      }
    })
  )
