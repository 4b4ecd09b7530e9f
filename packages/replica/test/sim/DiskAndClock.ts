/**
 * The storage-and-clock family, which half the seeds run (its own generator draws which fault, whom and how long):
 * a slow disk (every write of a server's store waits 20–200 ms), a disk failing one write in five, a process's
 * wall clock jumping up to three lag times either way (back where it was at the end), or, with a minimum ISR of 3,
 * power lost on two servers at once (every other server flushed first, so an acknowledged record keeps a copy).
 */
import { Effect } from "effect"
import type { Prng } from "../../../../scripts/test-support/prng.js"
import type * as LossyStore from "./LossyStore.js"
import * as Process from "./Process.js"
import { count, log, type Proc, type World } from "./World.js"

/** Every write of `store` waits 20–200 ms until step `back`; false if it is slow already. */
const slowDisk = (w: World, p: Proc, store: LossyStore.LossyStore, back: number, ex: Prng): boolean => {
  if (store.slowMs > 0) return false
  store.slowMs = ex.int(20, 200)
  log(w, `FAULT ${p.name}'s disk slow (${store.slowMs} ms a write) until step ${back}`)
  w.timed.push({
    until: back,
    end: Effect.sync(() => {
      store.slowMs = 0
    })
  })
  return true
}

/** One write of `store` in five fails until step `back`; false if it is failing some already. */
const flakyDisk = (w: World, p: Proc, store: LossyStore.LossyStore, back: number, ex: Prng): boolean => {
  if (store.failSome !== undefined) return false
  log(w, `FAULT ${p.name}'s disk fails one write in five until step ${back}`)
  store.failSome = () => ex.chance(0.2)
  w.timed.push({
    until: back,
    end: Effect.sync(() => {
      store.failSome = undefined
    })
  })
  return true
}

/** `p`'s wall clock jumps up to three lag times either way until step `back`. */
const clockJump = (w: World, p: Proc, back: number, ex: Prng): void => {
  const lag = w.cluster.replicaLagTimeMaxMs
  const jump = ex.int(-3 * lag, 3 * lag)
  log(w, `FAULT ${p.name}'s clock jumps ${jump} ms until step ${back}`)
  p.clockOffsetMs += jump
  w.timed.push({
    until: back,
    end: Effect.sync(() => {
      p.clockOffsetMs -= jump
    })
  })
}

/** A storage or clock fault at `step`, drawn by `ex`. */
export const extraFault = (w: World, step: number, ex: Prng) =>
  Effect.gen(function* () {
    const running = w.servers.filter((q) => q.scope !== undefined && !q.paused && q.backAt === undefined)
    const p = ex.pick(running.length > 0 ? running : w.servers)
    const back = step + ex.int(3, 20)
    const kind = ex.pick(["slow-disk", "flaky-disk", "clock", "power-two"] as const)
    const store = w.stores.get(p.id)
    if (p.scope === undefined || p.paused || p.backAt !== undefined || store === undefined) return
    switch (kind) {
      case "slow-disk":
        if (!slowDisk(w, p, store, back, ex)) return
        break
      case "flaky-disk":
        if (!flakyDisk(w, p, store, back, ex)) return
        break
      case "clock":
        clockJump(w, p, back, ex)
        break
      case "power-two": {
        const other = running.filter((q) => q !== p)
        if (w.cluster.minIsr < 3 || other.length === 0) return
        const q = ex.pick(other)
        for (const [id, s] of w.stores) if (id !== p.id && id !== q.id) s.flush()
        log(w, `FAULT power loss of ${p.name} and ${q.name} at once, unflushed writes lost, back at step ${back}`)
        for (const x of [p, q]) {
          x.backAt = back
          yield* Process.down(w, x, true, true)
        }
        break
      }
    }
    count(w, kind)
  })
