import { type Log, Models } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { place } from "../src/internal/standbys.js"

const TOPIC = "src"

/** A group of `members` members (ids m0, m1, …) sharing `partitions` partitions round-robin. */
const group = (
  members: number,
  partitions: number
): Array<{ memberId: string; partitions: Array<Models.TopicPartition> }> => {
  const out = Array.from({ length: members }, (_, i) => ({
    memberId: `m${i}`,
    partitions: [] as Array<Models.TopicPartition>
  }))
  for (let p = 0; p < partitions; p++) out[p % members]!.partitions.push({ topic: TOPIC, partition: p })
  return out
}

const asSeenBy = (members: Log.GroupMembership["members"], memberId: string): Log.GroupMembership => ({
  memberId,
  members
})

/** Per partition, the members holding a standby of it. */
const layout = (members: Log.GroupMembership["members"], replicas: number): Map<string, Array<string>> => {
  const out = new Map<string, Array<string>>()
  for (const m of members) {
    for (const tp of place(asSeenBy(members, m.memberId), replicas)) {
      out.set(Models.tpKey(tp), [...(out.get(Models.tpKey(tp)) ?? []), m.memberId])
    }
  }
  return out
}

describe("standby placement", () => {
  it("each partition's standbys are the next members after its owner, in id order, wrapping around", () => {
    const members = group(3, 6)
    assert.deepStrictEqual(
      place(asSeenBy(members, "m1"), 1).map((tp) => tp.partition),
      [0, 3],
      "m1 stands by for m0"
    )
    assert.deepStrictEqual(
      place(asSeenBy(members, "m0"), 1).map((tp) => tp.partition),
      [2, 5],
      "m0 stands by for m2 (wrapping around)"
    )
    assert.deepStrictEqual(
      place(asSeenBy(members, "m0"), 2).map((tp) => tp.partition),
      [1, 2, 4, 5],
      "with 2 replicas m0 stands by for m2 and m1"
    )
  })

  it("is balanced: every partition has `replicas` standbys and every member holds as many", () => {
    for (const [n, partitions] of [
      [2, 4],
      [3, 6],
      [4, 12],
      [5, 10]
    ] as const) {
      const members = group(n, partitions)
      for (let replicas = 1; replicas < n; replicas++) {
        const where = layout(members, replicas)
        assert.strictEqual(where.size, partitions, `${n} members, ${replicas} replicas: every partition has standbys`)
        for (const [tp, holders] of where) {
          assert.strictEqual(holders.length, replicas, `${tp} has ${replicas} standbys`)
          assert.strictEqual(new Set(holders).size, holders.length, `${tp}: no member holds it twice`)
        }
        for (const m of members) {
          assert.strictEqual(
            place(asSeenBy(members, m.memberId), replicas).length,
            (partitions / n) * replicas,
            `${m.memberId} holds its share`
          )
        }
      }
    }
  })

  it("a member never stands by for a partition it holds itself", () => {
    const members = group(4, 9)
    for (const replicas of [1, 2, 3, 10]) {
      for (const m of members) {
        const own = new Set(m.partitions.map(Models.tpKey))
        for (const tp of place(asSeenBy(members, m.memberId), replicas)) {
          assert.isFalse(own.has(Models.tpKey(tp)), `${m.memberId} holds ${Models.tpKey(tp)} active`)
        }
      }
    }
    // A partition still listed under two members (a rebalance in flight) is not a standby of either.
    const stale = [
      { memberId: "a", partitions: [{ topic: TOPIC, partition: 0 }] },
      {
        memberId: "b",
        partitions: [
          { topic: TOPIC, partition: 0 },
          { topic: TOPIC, partition: 1 }
        ]
      }
    ]
    assert.deepStrictEqual(place(asSeenBy(stale, "b"), 1), [])
    assert.deepStrictEqual(place(asSeenBy(stale, "a"), 1), [{ topic: TOPIC, partition: 1 }])
  })

  it("more replicas than members − 1 is capped: every other member's partitions, once each", () => {
    const members = group(3, 7)
    for (const m of members) {
      const others = members
        .filter((o) => o.memberId !== m.memberId)
        .flatMap((o) => o.partitions.map(Models.tpKey))
        .sort()
      const got = place(asSeenBy(members, m.memberId), 5).map(Models.tpKey)
      assert.deepStrictEqual([...got].sort(), others)
      assert.deepStrictEqual(place(asSeenBy(members, m.memberId), 2), place(asSeenBy(members, m.memberId), 99))
    }
  })

  it("a single member, no replicas or a member missing from the membership get none", () => {
    const alone = group(1, 4)
    assert.deepStrictEqual(place(asSeenBy(alone, "m0"), 1), [])
    assert.deepStrictEqual(place(asSeenBy(alone, "m0"), 3), [])
    const two = group(2, 4)
    assert.deepStrictEqual(place(asSeenBy(two, "m0"), 0), [])
    assert.deepStrictEqual(place(asSeenBy(two, "elsewhere"), 1), [])
  })

  it("is deterministic: the members' order in the membership does not matter, the output is sorted", () => {
    const members = group(4, 8)
    const shuffled = [members[2]!, members[0]!, members[3]!, members[1]!]
    for (const m of members) {
      const a = place(asSeenBy(members, m.memberId), 2)
      assert.deepStrictEqual(place(asSeenBy(shuffled, m.memberId), 2), a)
      assert.deepStrictEqual(
        a.map((tp) => tp.partition),
        [...a.map((tp) => tp.partition)].sort((x, y) => x - y)
      )
    }
  })
})
