/**
 * A small seeded pseudo-random generator for the simulator: the same seed gives
 * the same sequence, so a run is replayed by its seed alone. The generator is a
 * 32-bit xorshift-multiply mixer over a Weyl sequence (state advanced by a
 * fixed odd constant), good enough to draw a fault schedule.
 */

/** A seeded source of numbers. */
export interface Prng {
  /** A float in [0, 1). */
  readonly next: () => number
  /** An integer in [lo, hi], both inclusive. */
  readonly int: (lo: number, hi: number) => number
  /** `true` with probability `p`. */
  readonly chance: (p: number) => boolean
  /** One element of a non-empty array. */
  readonly pick: <A>(items: ReadonlyArray<A>) => A
}

/** A generator seeded with `seed` (any integer). */
export const make = (seed: number): Prng => {
  let state = (seed ^ 0x5bd1e995) >>> 0
  const next = (): number => {
    state = (state + 0x6d2b79f5) >>> 0
    let z = state
    z = Math.imul(z ^ (z >>> 15), z | 1)
    z ^= z + Math.imul(z ^ (z >>> 7), z | 61)
    return ((z ^ (z >>> 14)) >>> 0) / 4294967296
  }
  const int = (lo: number, hi: number): number => lo + Math.floor(next() * (hi - lo + 1))
  const pick = <A>(items: ReadonlyArray<A>): A => {
    const item = items[int(0, items.length - 1)]
    if (item === undefined) throw new Error("pick from an empty array")
    return item
  }
  return { next, int, chance: (p) => next() < p, pick }
}
