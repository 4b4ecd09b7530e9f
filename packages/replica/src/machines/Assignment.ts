/**
 * Replica assignment for a new table: which live servers hold each of its tablets, the first of them the tablet's
 * preferred leader — what the coordinator does for `strata tablets create NAME --tablets 12 --rf 3`. Kafka's
 * rack-aware assignment is the model. It is a pure function of the request: the caller draws `start` (where the
 * round-robin begins) from Effect's Random, so one request always gives one layout, and another `start` rotates it.
 *
 * With `n` live servers, `b` tablets, replication factor `rf` and `R` racks, what holds:
 *
 * - every tablet has `rf` distinct live servers as replicas; tablet `i` is bucket `i`;
 * - racks: either every server names a rack or none does. With racks, every tablet's replicas span `min(rf, R)`
 *   distinct racks, whatever the racks' sizes: this rule comes before evenness;
 * - leaders, always: every server leads `⌊b/n⌋` or `⌈b/n⌉` of the new tablets;
 * - leaders and `existing`, without racks or with racks of different sizes: the `b mod n` servers leading one more
 *   are servers leading fewest in `existing` (ties broken by replicas held, then the rotation). So when the live
 *   servers' existing leader counts are within one of each other, they still are with the new table (two tables of
 *   6 tablets on 4 servers lead 3 each), and tables assigned one after another stay within one. With racks all of
 *   one size the replica sets come first: no other choice of leaders among each tablet's replicas would give the
 *   extra leaderships to servers leading fewer, which is not always within one;
 * - replicas, without racks or with racks all of one size: every server holds `⌊b·rf/n⌋` or `⌈b·rf/n⌉` of the new
 *   replicas, the extra ones going to servers holding fewest in `existing` as far as the extra leaderships (and the
 *   racks) allow;
 * - replicas, with racks of different sizes: a server in a small rack holds more, since every tablet needs a
 *   replica in as many racks as it can. Each replica goes to the server holding fewest among those the rack rule
 *   allows, and within a rack a server holding two more than another leads every tablet it holds and the other
 *   does not (it hands the other every one it only follows): in practice the servers of a rack are within one.
 *
 * How: without racks or with racks of one size the servers are laid on a ring (racks alternating: position `p`
 * holds a server of the `p mod R`-th rack, so any `rf` consecutive positions span `min(rf, R)` racks), and tablet
 * `i` takes the `rf` positions from `i·rf` on, so every position is used `⌊b·rf/n⌋` or `⌈b·rf/n⌉` times, the first
 * `b·rf mod n` positions once more. The leader is the run's position `⌊i·g/n⌋ mod g` (`g = gcd(rf, n)`): the runs
 * of `n/g` consecutive tablets start on distinct multiples of `g`, and each such round shifts by one, so any `n`
 * consecutive tablets have `n` distinct leaders. Which server takes which position follows `existing` (the
 * positions leading or holding one more go to the servers with fewest), ties broken by the rotation `start` picks;
 * then chains of tablets handing their leadership to another replica move extra leaderships to servers that led
 * fewer. With racks of different sizes it is greedy: each tablet's leader is a server leading fewest of the new
 * tablets (then fewest existing leaders, fewest replicas), each further replica the server holding fewest among
 * those not yet in the tablet (from a rack it does not span while it spans fewer than `min(rf, R)`); then a server
 * holding two more than another of its rack hands it tablets it follows until none can.
 *
 * @since 0.1.0
 */
import type { Models } from "@strata/core"
import { Result, Schema } from "effect"

/**
 * A live server replicas can go to, and the rack (failure domain) it is in, if racks are configured.
 *
 * @since 0.1.0
 */
export interface AssignableServer {
  readonly id: Models.ServerId
  /** Its rack; a non-empty name. Either every server names one or none does. */
  readonly rack?: string | undefined
}

/**
 * What to assign: a new table's tablets over the live servers.
 *
 * @since 0.1.0
 */
export interface AssignmentRequest {
  /** The new table's name. */
  readonly table: string
  /** Tablets to create, ≥ 1 (buckets `0 … buckets-1`). */
  readonly buckets: number
  /** Replicas per tablet, ≥ 1 and at most the number of servers. */
  readonly replicationFactor: number
  /** The live servers. */
  readonly servers: ReadonlyArray<AssignableServer>
  /**
   * Tablets that exist already (any table): their replica lists, so the new table's leaders and replicas go first
   * to the servers holding fewest. Optional; servers not live are ignored.
   */
  readonly existing?: ReadonlyArray<{ readonly replicas: ReadonlyArray<Models.ServerId> }>
  /** Where the round-robin starts, drawn by the caller from Effect's Random (so this function stays deterministic). */
  readonly start: number
}

/**
 * One new tablet and its replicas, the preferred leader first.
 *
 * @since 0.1.0
 */
export interface TabletAssignment {
  readonly tablet: Models.TabletId
  readonly replicas: ReadonlyArray<Models.ServerId>
}

/**
 * The request cannot be assigned: `detail` says what is wrong with it.
 *
 * @since 0.1.0
 */
export class InvalidAssignment extends Schema.TaggedError<InvalidAssignment>()("InvalidAssignment", {
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return this.detail
  }
}

/** A live server with what it holds already and its place in the rotation. */
interface Member {
  readonly id: Models.ServerId
  readonly rack: string
  /** Its index in the rotated order: the tie-breaker everywhere. */
  readonly rot: number
  readonly leaders: number
  readonly replicas: number
}

type Key = (m: Member) => ReadonlyArray<number>

const byKey =
  (key: Key) =>
  (a: Member, b: Member): number => {
    const ka = key(a)
    const kb = key(b)
    for (let i = 0; i < ka.length; i++) {
      const d = (ka[i] ?? 0) - (kb[i] ?? 0)
      if (d !== 0) return d
    }
    return 0
  }
const sortedBy = (members: ReadonlyArray<Member>, key: Key): Array<Member> => [...members].sort(byKey(key))
const leadersFirst: Key = (m) => [m.leaders, m.replicas, m.rot]
const replicasFirst: Key = (m) => [m.replicas, m.leaders, m.rot]

const groupBy = <K, V>(items: Iterable<V>, key: (v: V) => K): Map<K, Array<V>> => {
  const groups = new Map<K, Array<V>>()
  for (const v of items) {
    const group = groups.get(key(v))
    if (group === undefined) groups.set(key(v), [v])
    else group.push(v)
  }
  return groups
}
const gcd = (a: number, b: number): number => (b === 0 ? a : gcd(b, a % b))
const list = (ids: ReadonlyArray<number>): string => ids.join(", ")
const isCount = (x: number): boolean => Number.isSafeInteger(x) && x >= 1

/** Everything wrong with the request (empty when it can be assigned). */
const problems = (request: AssignmentRequest): Array<string> => {
  const out: Array<string> = []
  const { table, buckets, replicationFactor: rf, servers, start } = request
  if (table.length === 0) out.push("the table name is empty")
  if (!isCount(buckets)) out.push(`buckets must be an integer ≥ 1, not ${buckets}`)
  if (!isCount(rf)) out.push(`the replication factor must be an integer ≥ 1, not ${rf}`)
  if (!Number.isSafeInteger(start)) out.push(`start must be an integer, not ${start}`)
  if (servers.length === 0) out.push("there are no live servers")
  else if (isCount(rf) && rf > servers.length) {
    out.push(`the replication factor ${rf} exceeds the ${servers.length} live servers`)
  }
  const badIds = servers.filter((s) => !Number.isSafeInteger(s.id) || s.id < 0).map((s) => s.id)
  if (badIds.length > 0) out.push(`server ids must be integers ≥ 0, not ${list(badIds)}`)
  const seen = new Set<number>()
  const duplicates = new Set<number>()
  for (const s of servers) (seen.has(s.id) ? duplicates : seen).add(s.id)
  if (duplicates.size > 0) out.push(`duplicate server ids: ${list([...duplicates])}`)
  const named = servers.filter((s) => s.rack !== undefined && s.rack.length > 0)
  if (named.length > 0 && named.length < servers.length) {
    const lacking = servers.filter((s) => s.rack === undefined || s.rack.length === 0).map((s) => s.id)
    const who = lacking.length === 1 ? `server ${list(lacking)} names` : `servers ${list(lacking)} name`
    out.push(`${who} no rack while others do: every server must name one, or none`)
  }
  return out
}

/**
 * The live servers with their existing load, in the rotated order: sorted by id (with racks: racks by name taking
 * turns, each with its servers by id), rotated by `start`.
 */
const members = (request: AssignmentRequest): Array<Member> => {
  const leaders = new Map<number, number>()
  const replicas = new Map<number, number>()
  for (const t of request.existing ?? []) {
    const first = t.replicas[0]
    if (first !== undefined) leaders.set(first, (leaders.get(first) ?? 0) + 1)
    for (const id of new Set(t.replicas)) replicas.set(id, (replicas.get(id) ?? 0) + 1)
  }
  const byRack = groupBy(request.servers, (s) => s.rack ?? "")
  const racks = [...byRack.keys()].sort().map((rack) => [...(byRack.get(rack) ?? [])].sort((a, b) => a.id - b.id))
  const base: Array<AssignableServer> = []
  for (let t = 0; base.length < request.servers.length; t++) {
    for (const rack of racks) {
      const s = rack[t]
      if (s !== undefined) base.push(s)
    }
  }
  const n = base.length
  const shift = ((request.start % n) + n) % n
  return base.map((_, k) => {
    const s = base[(k + shift) % n] as AssignableServer
    return {
      id: s.id,
      rack: s.rack ?? "",
      rot: k,
      leaders: leaders.get(s.id) ?? 0,
      replicas: replicas.get(s.id) ?? 0
    }
  })
}

/** The racks' servers in rotated order; the racks in the order of their first server. */
const racksOf = (all: ReadonlyArray<Member>): Array<Array<Member>> => [...groupBy(all, (m) => m.rack).values()]

/** The ring layout (no racks, or racks of one size): exact evenness. */
const onRing = (
  all: ReadonlyArray<Member>,
  racks: ReadonlyArray<ReadonlyArray<Member>>,
  buckets: number,
  rf: number
): Array<Array<Models.ServerId>> => {
  const n = all.length
  const rackCount = racks.length
  const extraLeaders = buckets % n
  const extraReplicas = (buckets * rf) % n
  const g = gcd(rf, n)
  const round = n / g
  /** Where tablet `i`'s leader is in its run of `rf` positions. */
  const offset = (i: number) => Math.floor(i / round) % g
  const leadsMore = new Set<number>()
  for (let i = 0; i < extraLeaders; i++) leadsMore.add((i * rf + offset(i)) % n)
  const holdsMore = (p: number) => p < extraReplicas
  const rank = (p: number) => (leadsMore.has(p) ? (holdsMore(p) ? 0 : 1) : holdsMore(p) ? 2 : 3)

  // Position p holds a server of class p mod R; a class's positions in the order they should get the least loaded.
  const classes = Array.from({ length: rackCount }, (_, c) => {
    const positions: Array<number> = []
    for (let p = c; p < n; p += rackCount) positions.push(p)
    positions.sort((a, b) => rank(a) - rank(b) || a - b)
    const count = (f: (p: number) => boolean) => positions.filter(f).length
    return {
      c,
      positions,
      leading: count((p) => leadsMore.has(p)),
      leadingHolding: count((p) => leadsMore.has(p) && holdsMore(p)),
      holding: count(holdsMore)
    }
  }).sort((a, b) => b.leading - a.leading || b.leadingHolding - a.leadingHolding || b.holding - a.holding || a.c - b.c)

  // The racks whose servers lead (then hold) fewest go to the classes with most positions leading (holding) more.
  const fewestLeading = new Set(sortedBy(all, leadersFirst).slice(0, extraLeaders))
  const fewestHolding = new Set(sortedBy(all, replicasFirst).slice(0, extraReplicas))
  const rackOrder = racks
    .map((servers, j) => ({
      servers,
      j,
      leading: servers.filter((m) => fewestLeading.has(m)).length,
      holding: servers.filter((m) => fewestHolding.has(m)).length
    }))
    .sort((a, b) => b.leading - a.leading || b.holding - a.holding || a.j - b.j)

  const ring: Array<Models.ServerId> = new Array<Models.ServerId>(n).fill(0)
  classes.forEach((cls, index) => {
    const servers = rackOrder[index]?.servers ?? []
    const byLeaders = sortedBy(servers, leadersFirst)
    const placed = [
      ...sortedBy(byLeaders.slice(0, cls.leading), replicasFirst),
      ...sortedBy(byLeaders.slice(cls.leading), replicasFirst)
    ]
    placed.forEach((m, t) => {
      const p = cls.positions[t]
      if (p !== undefined) ring[p] = m.id
    })
  })

  return Array.from({ length: buckets }, (_, i) =>
    Array.from({ length: rf }, (_, t) => ring[(i * rf + ((offset(i) + t) % rf)) % n] as Models.ServerId)
  )
}

/**
 * Moves the extra leaderships (of servers leading `⌈b/n⌉`) towards servers leading fewer in `existing`, through the
 * tablets' replicas: a chain of tablets, each handing its leadership to a replica that leads the next, from a
 * server with an extra one to a server without that led fewer. Every other server's count stays, so leaders stay
 * `⌊b/n⌋` or `⌈b/n⌉`, and each chain lowers the existing leaderships of the servers with extras; when none is left,
 * no other choice of leaders among the same replicas gives the extras to servers leading fewer.
 */
const moveExtraLeaderships = (all: ReadonlyArray<Member>, tablets: Array<Array<Models.ServerId>>): void => {
  const n = all.length
  if (tablets.length % n === 0) return
  const had = new Map(all.map((m) => [m.id, m.leaders]))
  const led = new Map(all.map((m) => [m.id, 0]))
  for (const t of tablets) led.set(t[0] as Models.ServerId, (led.get(t[0] as Models.ServerId) ?? 0) + 1)
  const floor = Math.floor(tablets.length / n)
  const chain = (): boolean => {
    const extras = all.filter((m) => led.get(m.id) !== floor).sort(byKey((m) => [-m.leaders, m.rot]))
    const leading = groupBy(tablets, (t) => t[0])
    for (const from of extras) {
      // Breadth-first over "x leads a tablet y holds": the first server without an extra that led fewer ends it.
      const via = new Map<
        Models.ServerId,
        { readonly tablet: Array<Models.ServerId>; readonly previous: Models.ServerId }
      >()
      const queue: Array<Models.ServerId> = [from.id]
      const seen = new Set<Models.ServerId>(queue)
      for (let q = 0; q < queue.length; q++) {
        const x = queue[q] as Models.ServerId
        for (const tablet of leading.get(x) ?? []) {
          for (const y of tablet) {
            if (seen.has(y)) continue
            seen.add(y)
            via.set(y, { tablet, previous: x })
            if (led.get(y) === floor && (had.get(y) ?? 0) < from.leaders) {
              led.set(from.id, floor)
              led.set(y, floor + 1)
              for (let z: Models.ServerId = y; z !== from.id; ) {
                const step = via.get(z)
                if (step === undefined) break
                step.tablet.splice(step.tablet.indexOf(z), 1)
                step.tablet.unshift(z)
                z = step.previous
              }
              return true
            }
            queue.push(y)
          }
        }
      }
    }
    return false
  }
  while (chain()) {}
}

/** The greedy layout (racks of different sizes): rack spread first, then fewest. */
const greedy = (
  all: ReadonlyArray<Member>,
  racks: ReadonlyArray<ReadonlyArray<Member>>,
  buckets: number,
  rf: number
): Array<Array<Models.ServerId>> => {
  const spread = Math.min(rf, racks.length)
  const led = new Map<Member, number>(all.map((m) => [m, 0]))
  const held = new Map<Member, number>(all.map((m) => [m, 0]))
  const leaderKey: Key = (m) => [led.get(m) ?? 0, m.leaders, held.get(m) ?? 0, m.replicas, m.rot]
  const replicaKey: Key = (m) => [held.get(m) ?? 0, m.replicas, led.get(m) ?? 0, m.leaders, m.rot]
  const fewest = (candidates: ReadonlyArray<Member>, key: Key): Member => {
    const compare = byKey(key)
    return candidates.reduce((best, m) => (compare(m, best) < 0 ? m : best))
  }
  const tablets = Array.from({ length: buckets }, () => {
    const leader = fewest(all, leaderKey)
    led.set(leader, (led.get(leader) ?? 0) + 1)
    const chosen = [leader]
    const spanned = new Set([leader.rack])
    while (chosen.length < rf) {
      const needRack = spanned.size < spread
      const candidates = all.filter((m) => !chosen.includes(m) && !(needRack && spanned.has(m.rack)))
      const m = fewest(candidates, replicaKey)
      chosen.push(m)
      spanned.add(m.rack)
    }
    for (const m of chosen) held.set(m, (held.get(m) ?? 0) + 1)
    return chosen
  })
  // A server holding two more than another of its rack hands it a tablet it follows (rack spread and leaders stay).
  const swap = (): boolean => {
    for (const rack of racks) {
      const byHeld = sortedBy(rack, (m) => [held.get(m) ?? 0, m.rot])
      for (const a of [...byHeld].reverse()) {
        for (const c of byHeld) {
          if ((held.get(a) ?? 0) < (held.get(c) ?? 0) + 2) break
          const tablet = tablets.find((t) => t.indexOf(a) > 0 && !t.includes(c))
          if (tablet !== undefined) {
            tablet[tablet.indexOf(a)] = c
            held.set(a, (held.get(a) ?? 0) - 1)
            held.set(c, (held.get(c) ?? 0) + 1)
            return true
          }
        }
      }
    }
    return false
  }
  while (swap()) {}
  return tablets.map((t) => t.map((m) => m.id))
}

/**
 * Assigns the replicas of a new table's tablets over the live servers (see the module's documentation for what
 * the layout guarantees); an `InvalidAssignment` names everything wrong with the request.
 *
 * @since 0.1.0
 */
export const assign = (
  request: AssignmentRequest
): Result.Result<ReadonlyArray<TabletAssignment>, InvalidAssignment> => {
  const wrong = problems(request)
  if (wrong.length > 0) {
    return Result.fail(new InvalidAssignment({ detail: `cannot assign table "${request.table}": ${wrong.join("; ")}` }))
  }
  const all = members(request)
  const racks = racksOf(all)
  const balanced = racks.every((rack) => rack.length === racks[0]?.length)
  const layout = balanced
    ? onRing(all, racks, request.buckets, request.replicationFactor)
    : greedy(all, racks, request.buckets, request.replicationFactor)
  // Without racks the ring already gives the extra leaderships to the servers leading fewest.
  if (balanced && racks.length > 1) moveExtraLeaderships(all, layout)
  return Result.succeed(layout.map((replicas, bucket) => ({ tablet: { table: request.table, bucket }, replicas })))
}
