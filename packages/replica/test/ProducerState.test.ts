import { assert, describe, it } from "@effect/vitest"
import { seeded } from "../../../scripts/test-support/prng.js"
import * as ProducerState from "../src/machines/ProducerState.js"

const p = (sequence: number, epoch = 0, id = 7): ProducerState.Producer => ({ id, epoch, sequence })

/** Writes the batches in order through `check` and `record`, as a leader does; the verdicts. */
const writeAll = (batches: ReadonlyArray<readonly [ProducerState.Producer, number]>) => {
  let entry: ProducerState.Entry | undefined
  let end = 0
  const verdicts: Array<string> = []
  for (const [producer, count] of batches) {
    const v = ProducerState.check(entry, producer, count)
    verdicts.push(v._tag === "Duplicate" ? `Duplicate@${v.baseOffset}` : v._tag)
    if (v._tag === "Append") {
      entry = ProducerState.record(entry, producer, count, end)
      end += count
    }
  }
  return { entry, verdicts }
}

describe("ProducerState", () => {
  it("appends what continues the sequence, answers a recent retry with its offsets, refuses gaps", () => {
    const { verdicts } = writeAll([
      [p(0), 3],
      [p(3), 2],
      [p(0), 3],
      [p(3), 2],
      [p(6), 1],
      [p(5), 1],
      [p(1), 2]
    ])
    assert.deepStrictEqual(verdicts, [
      "Append",
      "Append",
      "Duplicate@0",
      "Duplicate@3",
      "OutOfOrder",
      "Append",
      "OutOfOrder"
    ])
  })

  it("a newer producer epoch starts at sequence 0 and fences the older one", () => {
    const { entry, verdicts } = writeAll([
      [p(0, 0), 2],
      [p(0, 1), 1],
      [p(2, 0), 1],
      [p(0, 2), 0 + 1],
      [p(5, 3), 1]
    ])
    assert.deepStrictEqual(verdicts, ["Append", "Append", "Fenced", "Append", "OutOfOrder"])
    assert.strictEqual(entry?.epoch, 2)
  })

  it("an unknown producer must start a sequence; a retry older than the recent batches is out of order", () => {
    assert.deepStrictEqual(ProducerState.check(undefined, p(4), 1), { _tag: "UnknownProducer", sequence: 4 })
    const { verdicts } = writeAll([...Array.from({ length: 7 }, (_, i) => [p(i), 1] as const), [p(1), 1], [p(2), 1]])
    assert.deepStrictEqual(verdicts.slice(7), ["OutOfOrder", "Duplicate@2"])
  })

  it("truncation drops the batches past the point, and says when none are left", () => {
    const { entry } = writeAll([
      [p(0), 2],
      [p(2), 2],
      [p(4), 2]
    ])
    assert.deepStrictEqual(
      ProducerState.truncateFromEnd(entry!, 3)?.batches.map((b) => b.firstSequence),
      [0]
    )
    assert.strictEqual(ProducerState.truncateFromEnd(entry!, 1), undefined)
  })

  it("2000 seeded runs: a producer retrying any in-flight batch, in any order, writes each record exactly once", () => {
    for (let seed = 1; seed <= 2000; seed++) {
      const random = seeded(seed)
      let entry: ProducerState.Entry | undefined
      const log: Array<number> = [] // the sequence number of each record written
      let next = 0
      const inFlight: Array<readonly [number, number]> = [] // [sequence, count] not yet acknowledged
      const acked = new Set<number>()
      for (let i = 0; i < 60; i++) {
        if (inFlight.length < ProducerState.RECENT_BATCHES && random.chance(0.5)) {
          const count = random.int(1, 4)
          inFlight.push([next, count])
          next += count
        }
        if (inFlight.length === 0) continue
        // Requests reach the leader in order the first time; a retry can be of any in-flight batch.
        const [sequence, count] = random.chance(0.6) ? inFlight[0]! : random.pick(inFlight)
        const v = ProducerState.check(entry, p(sequence), count)
        if (v._tag === "Append") {
          entry = ProducerState.record(entry, p(sequence), count, log.length)
          for (let r = 0; r < count; r++) log.push(sequence + r)
        }
        const written = v._tag === "Append" || v._tag === "Duplicate"
        if (written && random.chance(0.7)) {
          // The reply arrives: the producer forgets the batch (and Duplicate answers the offsets it was written at).
          if (v._tag === "Duplicate") assert.strictEqual(log[v.baseOffset], sequence, `seed ${seed}`)
          acked.add(sequence)
          inFlight.splice(
            inFlight.findIndex(([s]) => s === sequence),
            1
          )
        }
      }
      assert.deepStrictEqual(
        log,
        Array.from({ length: log.length }, (_, i) => i),
        `seed ${seed}: every record once, in sequence order`
      )
      for (const s of acked) assert.isTrue(log.includes(s), `seed ${seed}: acknowledged sequence ${s} is written`)
    }
  })
})
