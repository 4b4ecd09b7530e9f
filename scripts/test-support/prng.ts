/**
 * The seeded pseudo-random numbers of the tests, the simulator and the kill harnesses: the same seed gives the same
 * sequence, so a failing run replays from its seed alone. mulberry32: a Weyl sequence (state advanced by a fixed odd
 * constant) through a 32-bit xorshift-multiply mixer.
 */

/** Floats in [0, 1) from `seed`. */
export const prng = (seed: number): (() => number) => {
  let state = seed >>> 0
  return () => {
    state = (state + 0x6d2b79f5) >>> 0
    let t = state
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/** A 32-bit integer hash with good avalanche (lowbias32): seeds a `prng` from numbers that differ in a bit or two. */
export const mix32 = (x: number): number => {
  x >>>= 0
  x ^= x >>> 16
  x = Math.imul(x, 0x7feb352d)
  x ^= x >>> 15
  x = Math.imul(x, 0x846ca68b)
  x ^= x >>> 16
  return x >>> 0
}

/** An integer in [0, bound). */
export const below = (random: () => number, bound: number): number => Math.floor(random() * bound)

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

/** `prng(seed)` with integers, coin flips and picks on top. */
export const seeded = (seed: number): Prng => {
  const next = prng(seed)
  const int = (lo: number, hi: number): number => lo + Math.floor(next() * (hi - lo + 1))
  const pick = <A>(items: ReadonlyArray<A>): A => {
    const item = items[int(0, items.length - 1)]
    if (item === undefined) throw new Error("pick from an empty array")
    return item
  }
  return { next, int, chance: (p) => next() < p, pick }
}
