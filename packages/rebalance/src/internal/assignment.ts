/**
 * The balanced assignment every plan is made of: put each item's `demand` units on distinct bins, at most
 * `groupCap` of them in one group, so that the balanced bins end with exactly ⌊T/n⌋ or ⌊T/n⌋+1 units, with the
 * fewest units placed where the item was not before. Replicas on servers (items are tablets, groups are racks) and
 * leaders on replicas (items are tablets, candidates their replicas) are both this problem.
 *
 * It is a min-cost flow: source → item (capacity `demand`) → (item, group) (capacity `groupCap`) → bin (capacity 1;
 * cost 0 where the item is now, else 1) → sink (capacity ⌊T/n⌋; one more through a shared node of capacity
 * T mod n, so the flow picks which bins take the extra unit; past the target at a cost above any number of moves).
 * It is solved by successive shortest paths from the flow that keeps everything where it is: that flow costs 0, and
 * every later path costs at least 1, so each path of cost 1 found by looking only at the bins around a unit (a direct
 * move, or a swap on the unit's own bin) is a shortest one. Only the units no such path places are routed on the
 * whole residual graph (`route`). The result is a minimum-cost flow: the fewest units above the targets, then the
 * fewest moves.
 */

/** One item: a tablet's replicas, or its leader. */
export interface Item {
  /** Units to place on distinct bins. */
  readonly demand: number
  /** At most this many units in one group. */
  readonly groupCap: number
  /** The bins holding it now, in order. */
  readonly current: ReadonlyArray<number>
  /** The bins it may be on (every bin when absent). */
  readonly candidates?: ReadonlyArray<number> | undefined
  /** Its size: the smallest units move first, and the bins with the fewest bytes take them. */
  readonly weight: number
}

/** The problem: bins with their groups and what each may do, and the items. */
export interface Problem {
  /** Each bin's group. */
  readonly groupOf: ReadonlyArray<number>
  /** A bin may keep what it holds (false: it is being drained). */
  readonly canKeep: ReadonlyArray<boolean>
  /** A bin may take what it does not hold (false: drained or excluded). */
  readonly canGain: ReadonlyArray<boolean>
  /** Balance the bins' loads (false: only the hard rules move anything). */
  readonly balance: boolean
  readonly items: ReadonlyArray<Item>
}

/** Where every item ends up. */
export interface Solution {
  readonly _tag: "Solved"
  /** Each item's bins: those it keeps in their order, then the new ones. */
  readonly placed: ReadonlyArray<ReadonlyArray<number>>
  /** Units placed on a bin that did not hold their item. */
  readonly moves: number
  /** Units above the balanced targets (0 when exact balance was reachable). */
  readonly overflow: number
  /** ⌊T/n⌋ and T mod n over the bins that may keep units. */
  readonly q: number
  readonly r: number
}

/** An item no placement satisfies. */
export interface Infeasible {
  readonly _tag: "Infeasible"
  readonly item: number
  readonly detail: string
}

/** The state of the flow while it is built: loads, each item's bins and the units still to place. */
interface State {
  readonly p: Problem
  readonly q: number
  readonly r: number
  /** Units on each bin. */
  readonly load: Array<number>
  /** The sum of the weights on each bin (the tie-break among destinations). */
  readonly bytes: Array<number>
  /** Bins that hold the extra (⌊T/n⌋+1-th) unit. */
  readonly extra: Array<boolean>
  freeExtra: number
  /** Each item's bins now. */
  readonly on: Array<Array<number>>
  /** Each bin's items now. */
  readonly holds: Array<Set<number>>
  /** Items whose current set is a candidate list (faster membership). */
  readonly allowed: Array<Set<number> | undefined>
  readonly original: Array<Set<number>>
  /** Each item's units still to place. */
  readonly waiting: Array<number>
}

/** A unit to place: its item and the bin it came off (-1 when that bin may keep nothing). */
interface Unit {
  readonly item: number
  readonly from: number
}

const isCandidate = (s: State, item: number, bin: number): boolean => {
  const allowed = s.allowed[item]
  return allowed === undefined || allowed.has(bin)
}

const inGroup = (s: State, item: number, group: number): number => {
  let n = 0
  for (const b of s.on[item]!) if (s.p.groupOf[b] === group) n++
  return n
}

/** Whether `bin` can take one more unit now (below its target, or taking a free extra unit). */
const hasRoom = (s: State, bin: number): boolean =>
  !s.p.balance || s.load[bin]! < s.q || (s.load[bin] === s.q && !s.extra[bin] && s.freeExtra > 0)

const place = (s: State, item: number, bin: number): void => {
  if (s.p.balance && s.load[bin] === s.q && !s.extra[bin]) {
    s.extra[bin] = true
    s.freeExtra--
  }
  s.load[bin]!++
  s.bytes[bin]! += s.p.items[item]!.weight
  s.on[item]!.push(bin)
  s.holds[bin]!.add(item)
}

const unplace = (s: State, item: number, bin: number): void => {
  s.load[bin]!--
  s.bytes[bin]! -= s.p.items[item]!.weight
  const on = s.on[item]!
  on.splice(on.indexOf(bin), 1)
  s.holds[bin]!.delete(item)
  if (s.p.balance && s.extra[bin] && s.load[bin] === s.q) {
    s.extra[bin] = false
    s.freeExtra++
  }
}

/** The cost of `item` being on `bin`: 0 where it was, 1 elsewhere. */
const costOf = (s: State, item: number, bin: number): number => (s.original[item]!.has(bin) ? 0 : 1)

/**
 * The best bin for one more unit of `item`, `leaving` (or -1) being the bin it leaves at the same time: room,
 * may gain, a candidate, not holding it, its group not full. The emptiest, then the fewest bytes, then the lowest.
 */
const destination = (s: State, item: number, leaving: number): number => {
  const p = s.p
  const leavingGroup = leaving < 0 ? -1 : p.groupOf[leaving]!
  const cap = p.items[item]!.groupCap
  let best = -1
  const consider = (b: number) => {
    if (!p.canGain[b] || s.holds[b]!.has(item) || !hasRoom(s, b)) return
    const g = p.groupOf[b]!
    if (inGroup(s, item, g) - (g === leavingGroup ? 1 : 0) >= cap) return
    if (
      best < 0 ||
      s.load[b]! < s.load[best]! ||
      (s.load[b] === s.load[best] && (s.bytes[b]! < s.bytes[best]! || (s.bytes[b] === s.bytes[best] && b < best)))
    )
      best = b
  }
  const candidates = p.items[item]!.candidates
  if (candidates === undefined) for (let b = 0; b < p.groupOf.length; b++) consider(b)
  else for (const b of candidates) consider(b)
  return best
}

/** Keeps what may stay; the rest, and what overfull bins cannot keep (the smallest first), are units to place. */
const keep = (p: Problem): { readonly s: State; readonly units: Array<Unit> } => {
  const bins = p.groupOf.length
  const balanced = p.canKeep.filter(Boolean).length
  const total = p.items.reduce((n, i) => n + i.demand, 0)
  const q = p.balance && balanced > 0 ? Math.floor(total / balanced) : 0
  const r = p.balance && balanced > 0 ? total - q * balanced : 0
  const s: State = {
    p,
    q,
    r,
    load: new Array<number>(bins).fill(0),
    bytes: new Array<number>(bins).fill(0),
    extra: new Array<boolean>(bins).fill(false),
    freeExtra: r,
    on: p.items.map(() => []),
    holds: Array.from({ length: bins }, () => new Set<number>()),
    allowed: p.items.map((i) => (i.candidates === undefined ? undefined : new Set(i.candidates))),
    original: p.items.map((i) => new Set(i.current)),
    waiting: new Array<number>(p.items.length).fill(0)
  }
  const units: Array<Unit> = []
  p.items.forEach((item, i) => {
    const left: Array<number> = []
    for (const b of item.current) {
      const stays =
        p.canKeep[b] === true &&
        isCandidate(s, i, b) &&
        s.on[i]!.length < item.demand &&
        inGroup(s, i, p.groupOf[b]!) < item.groupCap
      if (stays) {
        s.load[b]!++
        s.bytes[b]! += item.weight
        s.on[i]!.push(b)
        s.holds[b]!.add(i)
      } else left.push(b)
    }
    for (let k = s.on[i]!.length; k < item.demand; k++) {
      const b = left[k - s.on[i]!.length]
      units.push({ item: i, from: b !== undefined && p.canKeep[b] === true && isCandidate(s, i, b) ? b : -1 })
    }
  })
  if (!p.balance) return { s, units: counted(s, units) }
  // The most loaded bins above ⌊T/n⌋ keep one unit more; the others shed down to ⌊T/n⌋, their smallest items first.
  const over = Array.from({ length: bins }, (_, b) => b)
    .filter((b) => s.load[b]! > q)
    .sort((a, b) => s.load[b]! - s.load[a]! || a - b)
  for (const b of over.slice(0, r)) {
    s.extra[b] = true
    s.freeExtra--
  }
  // An item shed by one bin is shed by no other while another will do: its units would compete for the same bins.
  const shedding = new Set(units.map((u) => u.item))
  for (const b of over) {
    const cap = q + (s.extra[b] ? 1 : 0)
    if (s.load[b]! <= cap) continue
    const shed = [...s.holds[b]!]
      .sort(
        (x, y) => Number(shedding.has(x)) - Number(shedding.has(y)) || p.items[x]!.weight - p.items[y]!.weight || x - y
      )
      .slice(0, s.load[b]! - cap)
    for (const i of shed) shedding.add(i)
    for (const i of shed) {
      s.load[b]!--
      s.bytes[b]! -= p.items[i]!.weight
      s.on[i]!.splice(s.on[i]!.indexOf(b), 1)
      s.holds[b]!.delete(i)
      units.push({ item: i, from: b })
    }
  }
  return { s, units: counted(s, units) }
}

const counted = (s: State, units: Array<Unit>): Array<Unit> => {
  for (const u of units) s.waiting[u.item]!++
  return units
}

/**
 * A path of cost 1 for `unit`, if one is at hand: straight to a bin with room, or back onto the bin it came off while
 * another item there moves to a bin with room. Returns whether it placed the unit.
 */
const placeNearby = (s: State, unit: Unit): boolean => {
  const direct = destination(s, unit.item, -1)
  if (direct >= 0 && costOf(s, unit.item, direct) === 1) {
    place(s, unit.item, direct)
    s.waiting[unit.item]!--
    return true
  }
  const from = unit.from
  if (from < 0 || s.holds[from]!.has(unit.item)) return false
  const p = s.p
  if (inGroup(s, unit.item, p.groupOf[from]!) >= p.items[unit.item]!.groupCap) return false
  // The item back on `from` costs 0; the one leaving it costs -c(j, from) + c(j, to): take it only when that is 1.
  const others = [...s.holds[from]!].sort((x, y) => p.items[x]!.weight - p.items[y]!.weight || x - y)
  // An item with units of its own still waiting is left where it is: moving it could close the bins they need.
  for (const j of others) {
    if (costOf(s, j, from) !== 0 || s.waiting[j]! > 0) continue
    const to = destination(s, j, from)
    if (to < 0 || costOf(s, j, to) !== 1) continue
    unplace(s, j, from)
    place(s, unit.item, from)
    place(s, j, to)
    s.waiting[unit.item]!--
    return true
  }
  return false
}

/** The residual graph of the flow (arrays of edges, each with its reverse at `e ^ 1`). */
interface Graph {
  readonly head: Int32Array
  readonly next: Array<number>
  readonly to: Array<number>
  readonly cap: Array<number>
  readonly cost: Array<number>
}

const addEdge = (g: Graph, from: number, to: number, cap: number, cost: number, flow: number): number => {
  const e = g.to.length
  g.to.push(to, from)
  g.cap.push(cap - flow, flow)
  g.cost.push(cost, -cost)
  g.next.push(g.head[from]!, g.head[to]!)
  g.head[from] = e
  g.head[to] = e + 1
  return e
}

/**
 * Routes up to `count` units by successive shortest paths on the whole residual graph (Bellman-Ford: moved units
 * leave edges of cost -1). Units above a bin's target cost more than all moves together, so the fewest such units
 * come first. With `zeroCost`, only paths that move nothing (items back onto bins that held them, within the
 * targets), until none is left. Returns how many it placed and, when one cannot be placed at all, its item.
 */
const route = (s: State, count: number, zeroCost: boolean): { readonly placed: number; readonly stuck?: number } => {
  const p = s.p
  const bins = p.groupOf.length
  const items = p.items.length
  const SOURCE = 0
  const SINK = 1
  const EXTRA = 2
  const binNode = (b: number) => 3 + b
  const itemNode = (i: number) => 3 + bins + i
  let nodes = 3 + bins + items
  const groupNodes = p.items.map(() => new Map<number, number>())
  const total = p.items.reduce((n, i) => n + i.demand, 0)
  const OVER = total + 1
  const g: Graph = { head: new Int32Array(0), next: [], to: [], cap: [], cost: [] }
  // Nodes are numbered first, then the head array sized to them.
  const edges: Array<() => void> = []
  /** The item and bin of each unit edge (by edge index), -1 for the other edges. */
  const edgeItem: Array<number> = []
  const edgeBin: Array<number> = []
  p.items.forEach((item, i) => {
    const placed = s.on[i]!.length
    edges.push(() => addEdge(g, SOURCE, itemNode(i), item.demand, 0, placed))
    const bins_ = item.candidates ?? Array.from({ length: bins }, (_, b) => b)
    for (const b of bins_) {
      const holds = s.holds[b]!.has(i)
      const allowed = holds || (s.original[i]!.has(b) ? p.canKeep[b] : p.canGain[b])
      if (!allowed || (zeroCost && costOf(s, i, b) !== 0)) continue
      const group = p.groupOf[b]!
      let gn = groupNodes[i]!.get(group)
      if (gn === undefined) {
        gn = nodes++
        groupNodes[i]!.set(group, gn)
        const node = gn
        edges.push(() => addEdge(g, itemNode(i), node, item.groupCap, 0, inGroup(s, i, group)))
      }
      const node = gn
      edges.push(() => {
        const e = addEdge(g, node, binNode(b), 1, costOf(s, i, b), holds ? 1 : 0)
        edgeItem[e] = i
        edgeBin[e] = b
      })
    }
  })
  for (let b = 0; b < bins; b++) {
    const load = s.load[b]!
    const base = p.balance ? s.q : total
    const toTarget = Math.min(load, base)
    const extra = s.extra[b] ? 1 : 0
    edges.push(() => {
      addEdge(g, binNode(b), SINK, base, 0, toTarget)
      if (p.balance) {
        addEdge(g, binNode(b), EXTRA, 1, 0, extra)
        if (!zeroCost) addEdge(g, binNode(b), SINK, total, OVER, Math.max(0, load - base - extra))
      }
    })
  }
  if (p.balance) edges.push(() => addEdge(g, EXTRA, SINK, s.r, 0, s.r - s.freeExtra))
  ;(g as { head: Int32Array }).head = new Int32Array(nodes).fill(-1)
  for (const add of edges) add()

  const dist = new Float64Array(nodes)
  const via = new Int32Array(nodes)
  const queued = new Uint8Array(nodes)
  let placed = 0
  for (; placed < count; placed++) {
    dist.fill(Number.POSITIVE_INFINITY)
    via.fill(-1)
    dist[SOURCE] = 0
    const queue: Array<number> = [SOURCE]
    queued[SOURCE] = 1
    for (let k = 0; k < queue.length; k++) {
      const u = queue[k]!
      queued[u] = 0
      for (let e = g.head[u]!; e >= 0; e = g.next[e]!) {
        if (g.cap[e]! <= 0) continue
        const v = g.to[e]!
        const d = dist[u]! + g.cost[e]!
        if (d < dist[v]!) {
          dist[v] = d
          via[v] = e
          if (queued[v] === 0) {
            queued[v] = 1
            queue.push(v)
          }
        }
      }
    }
    if (via[SINK]! < 0) {
      if (zeroCost) return { placed }
      const stuck = p.items.findIndex((item, i) => s.on[i]!.length < item.demand)
      return { placed, stuck: Math.max(0, stuck) }
    }
    // Along the path a unit edge taken forward places its item on its bin, one taken backward takes it off.
    for (let v = SINK; v !== SOURCE; ) {
      const e = via[v]!
      g.cap[e]!--
      g.cap[e ^ 1]!++
      const forward = edgeItem[e & ~1]
      if (forward !== undefined && forward >= 0) {
        if ((e & 1) === 0) place(s, forward, edgeBin[e]!)
        else unplace(s, forward, edgeBin[e & ~1]!)
      }
      v = g.to[e ^ 1]!
    }
  }
  return { placed }
}

/** Whether some item is off a bin that held it, may keep it, and has room: a path of cost 0 may be left. */
const zeroCostPathsLeft = (s: State): boolean =>
  s.p.items.some((item, i) =>
    item.current.some((b) => !s.holds[b]!.has(i) && s.p.canKeep[b] === true && isCandidate(s, i, b) && hasRoom(s, b))
  )

/** The units still to place once `placed` of them were, each item's first ones kept. */
const stillWaiting = (s: State, units: ReadonlyArray<Unit>, placed: number): Array<Unit> => {
  if (placed === 0) return [...units]
  const left = s.p.items.map((item, i) => item.demand - s.on[i]!.length)
  s.waiting.fill(0)
  const out = units.filter((u) => left[u.item]!-- > 0)
  for (const u of out) s.waiting[u.item]!++
  return out
}

/**
 * Solves `p`: the fewest units above the balanced targets, then the fewest moves; ties go to moving the smallest
 * items onto the emptiest bins (by units, then bytes).
 */
export const solve = (p: Problem): Solution | Infeasible => {
  for (let i = 0; i < p.items.length; i++) {
    const item = p.items[i]!
    const bins = item.candidates ?? p.groupOf.map((_, b) => b)
    const usable = bins.filter((b) => p.canKeep[b] && (p.canGain[b] || item.current.includes(b)))
    if (usable.length < item.demand)
      return { _tag: "Infeasible", item: i, detail: `needs ${item.demand} bins, ${usable.length} can hold it` }
  }
  const kept = keep(p)
  const s = kept.s
  // Every later path costs at least 1 only once no path of cost 0 is left: an item dropped for its group's cap, or
  // shed by a full bin, may go back to another bin that held it and has room.
  let pending = zeroCostPathsLeft(s)
    ? stillWaiting(s, kept.units, route(s, kept.units.length, true).placed)
    : kept.units
  for (let progress = true; pending.length > 0 && progress; ) {
    const stuck = pending.filter((u) => !placeNearby(s, u))
    progress = stuck.length < pending.length
    pending = stuck
  }
  if (pending.length > 0) {
    const routed = route(s, pending.length, false)
    if (routed.stuck !== undefined)
      return {
        _tag: "Infeasible",
        item: routed.stuck,
        detail: "no placement keeps every unit on distinct bins within its groups"
      }
  }
  let moves = 0
  const placed = s.on.map((bins, i) => {
    const current = p.items[i]!.current
    const kept = current.filter((b) => bins.includes(b))
    const added = bins.filter((b) => !current.includes(b))
    moves += added.length
    return [...kept, ...added]
  })
  return { _tag: "Solved", placed, moves, overflow: overflowOf(p, s.load, s.q, s.r), q: s.q, r: s.r }
}

/** Units above the targets: above ⌊T/n⌋ on each bin, less the T mod n bins that may hold one more. */
export const overflowOf = (p: Problem, load: ReadonlyArray<number>, q: number, r: number): number => {
  if (!p.balance) return 0
  let above = 0
  let over = 0
  for (const l of load) {
    above += Math.max(0, l - q)
    if (l > q) over++
  }
  return above - Math.min(r, over)
}
