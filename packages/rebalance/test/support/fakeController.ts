/**
 * A model controller for the executor's and the service's tests: moves take `moveMs` (forever onto a `slow` server),
 * a cancel puts a tablet back at once, a dead server refuses moves onto it and leaves its tablets' ISRs without it.
 */
import { Models } from "@strata/core"
import type { ClusterModel, Executor } from "../../src/index.js"
import { Planner } from "../../src/index.js"

type Model = ClusterModel.ClusterModel

/** `before` servers holding `tablets` tablets of RF `rf` round-robin, `after − before` servers joining empty. */
export const scaleOut = (before: number, after: number, tablets: number, rf: number): Model => ({
  servers: Array.from({ length: after }, (_, i) => ({ id: i + 1 })),
  tablets: Array.from({ length: tablets }, (_, bucket) => {
    const replicas = Array.from({ length: rf }, (_, k) => ((bucket + k) % before) + 1)
    return { tablet: { table: "t", bucket }, replicas, leader: replicas[0]!, sizeBytes: 1000 }
  })
})

export const planOf = (model: Model): Planner.Plan => {
  const p = Planner.planModel(model)
  if (!("changes" in p)) throw new Error(p.message)
  return p
}

interface FakeTablet {
  replicas: Array<number>
  moving: { target: Array<number>; original: Array<number>; doneAtMs: number } | undefined
  leader: number | null
  isr: Array<number>
}

/** A model controller: moves take `moveMs` (longer onto a slow server), cancels are immediate. */
export class FakeController {
  readonly tablets = new Map<string, FakeTablet>()
  readonly dead = new Set<number>()
  readonly slow = new Set<number>()
  shrinks = 0
  latencyMs = 5
  moveMs = 1000
  readonly servers: ReadonlyArray<number>
  constructor(model: Model) {
    this.servers = model.servers.map((s) => s.id)
    for (const t of model.tablets)
      this.tablets.set(Models.tabletKey(t.tablet), {
        replicas: [...t.replicas],
        moving: undefined,
        leader: t.leader ?? t.replicas[0]!,
        isr: [...t.replicas]
      })
  }

  reassign(nowMs: number, key: string, target: ReadonlyArray<number>): Executor.Answer {
    const t = this.tablets.get(key)
    if (t === undefined) return { _tag: "Refused", refusal: "UnknownTablet", detail: key }
    if (t.moving !== undefined) {
      const same = t.moving.target.length === target.length && t.moving.target.every((x, i) => target[i] === x)
      return same ? { _tag: "Accepted" } : { _tag: "Refused", refusal: "AlreadyMoving", detail: key }
    }
    const down = target.find((x) => this.dead.has(x))
    if (down !== undefined) return { _tag: "Refused", refusal: "DeadServer", detail: `server ${down}` }
    if (t.replicas.length === target.length && t.replicas.every((x, i) => target[i] === x)) return { _tag: "Accepted" }
    const adding = target.filter((x) => !t.replicas.includes(x))
    const slow = adding.some((x) => this.slow.has(x))
    t.moving = { target: [...target], original: [...t.replicas], doneAtMs: nowMs + (slow ? 1e12 : this.moveMs) }
    t.replicas = [...target, ...t.replicas.filter((x) => !target.includes(x))]
    return { _tag: "Accepted" }
  }

  cancel(key: string): Executor.Answer {
    const t = this.tablets.get(key)
    if (t === undefined) return { _tag: "Refused", refusal: "UnknownTablet", detail: key }
    if (t.moving === undefined) return { _tag: "Refused", refusal: "NotMoving", detail: key }
    t.replicas = t.moving.original
    t.isr = t.isr.filter((x) => t.replicas.includes(x))
    if (t.leader !== null && !t.replicas.includes(t.leader)) t.leader = t.isr[0] ?? null
    t.moving = undefined
    return { _tag: "Accepted" }
  }

  elect(key: string): Executor.Answer {
    const t = this.tablets.get(key)
    if (t === undefined) return { _tag: "Refused", refusal: "UnknownTablet", detail: key }
    const first = t.replicas[0]!
    if (!this.dead.has(first) && t.isr.includes(first)) t.leader = first
    return { _tag: "Accepted" }
  }

  tick(nowMs: number) {
    for (const t of this.tablets.values()) {
      t.isr = t.replicas.filter((x) => !this.dead.has(x))
      if (t.leader === null || this.dead.has(t.leader)) t.leader = t.isr[0] ?? null
      const m = t.moving
      if (m !== undefined && nowMs >= m.doneAtMs && m.target.every((x) => !this.dead.has(x))) {
        t.replicas = m.target
        t.moving = undefined
        if (t.leader === null || !t.replicas.includes(t.leader)) t.leader = t.replicas[0]!
      }
    }
  }

  /** The cluster model now: a moving tablet with the replicas it ends with. */
  model(): Model {
    return {
      servers: this.servers.map((id) => (this.dead.has(id) ? { id, tags: ["excluded" as const] } : { id })),
      tablets: [...this.tablets].map(([key, t]) => {
        const [table, bucket] = key.split("/")
        const replicas = t.moving?.target ?? t.replicas
        return {
          tablet: { table: table!, bucket: Number(bucket) },
          replicas,
          leader: t.leader !== null && replicas.includes(t.leader) ? t.leader : null,
          sizeBytes: 1000
        }
      })
    }
  }

  /** Moves in flight touching each server (servers added or removed by the move). */
  busy(): Map<number, number> {
    const out = new Map<number, number>()
    for (const t of this.tablets.values()) {
      if (t.moving === undefined) continue
      const { target, original } = t.moving
      const touched = [...target.filter((x) => !original.includes(x)), ...original.filter((x) => !target.includes(x))]
      // A reorder (leadership) touches its new leader.
      for (const x of touched.length === 0 ? [target[0]!] : touched) out.set(x, (out.get(x) ?? 0) + 1)
    }
    return out
  }

  observation(minInsyncReplicas: number): Executor.Observation {
    const servers = new Set([...this.tablets.values()].flatMap((t) => t.replicas))
    return {
      minInsyncReplicas,
      live: new Set(this.servers.filter((x) => !this.dead.has(x))),
      tablets: [...this.tablets].map(([key, t]) => {
        const [table, bucket] = key.split("/")
        return {
          tablet: { table: table!, bucket: Number(bucket) },
          replicas: t.replicas,
          moving: t.moving?.target,
          leader: t.leader,
          isr: t.isr,
          online: t.leader !== null
        }
      }),
      health: new Map(
        [...servers]
          .filter((x) => !this.dead.has(x))
          .map((x) => [x, { appendLatencyP99Ms: this.latencyMs, isrShrinks: 0 }])
      )
    }
  }
}
