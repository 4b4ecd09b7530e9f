/**
 * The leadership-transfer family (a nemesis that targets leaders), aimed at one tablet: the follower the
 * controller would pick next falls behind (its link to the leader cut for a moment), another in-sync follower stops
 * hearing the controllers (cut one way from each of them), and the leader is shut down in a controlled way,
 * following its successor while it lingers. The deaf follower may be long-polling the old leader while that leader
 * truncates to its successor's log and copies new records (issue 32's first defect).
 */
import { Models } from "@strata/core"
import { Duration, Effect } from "effect"
import type { Prng } from "../../../../scripts/test-support/prng.js"
import * as Audit from "./Audit.js"
import * as Faults from "./Faults.js"
import { link } from "./Network.js"
import { count, log, type World } from "./World.js"

/** Transfers the leadership of a tablet `tr` draws under lag, when it has a leader and two usable followers. */
export const transfer = (w: World, step: number, tr: Prng) =>
  Effect.gen(function* () {
    const tablet = tr.pick(w.cluster.tablets)
    const meta = yield* Audit.readTablet(w, tablet)
    const lai = meta?.leaderAndIsr
    if (meta === undefined || lai === undefined || lai.leader === null) return
    const leader = w.byName.get(`s${lai.leader}`)
    const usable = (s: number) => {
      const q = w.byName.get(`s${s}`)
      return q?.server !== undefined && !q.paused && q.backAt === undefined && !q.stopping
    }
    const others = meta.replicas.filter((s) => s !== lai.leader && lai.isr.includes(s) && usable(s))
    const next = others[0]
    const deaf = others.length > 1 ? others[tr.int(1, others.length - 1)] : undefined
    if (leader === undefined || !usable(leader.id) || next === undefined || deaf === undefined) return
    count(w, "transfer")
    const back = step + tr.int(3, 20)
    log(
      w,
      `FAULT transfer ${Models.tabletKey(tablet)} from ${leader.name}: s${next} behind, s${deaf} deaf to the controllers until step ${back}`
    )
    const behind = link(leader.name, `s${next}`)
    w.network.cuts.add(behind)
    const deafened = w.coordinators.map((c) => `${c.name}>s${deaf}`)
    for (const cut of deafened) w.network.oneWay.add(cut)
    w.timed.push({
      until: back,
      end: Effect.sync(() => {
        for (const cut of deafened) w.network.oneWay.delete(cut)
      })
    })
    yield* Effect.forkIn(
      Effect.gen(function* () {
        yield* Effect.sleep(Duration.millis(tr.int(10, 150)))
        w.network.cuts.delete(behind)
        yield* Faults.inject(w, "shutdown", leader, step, back)
      }),
      w.root
    )
  })
