/**
 * The seeded choice of a fault kind, shared by the election and cluster simulators: one draw in [1, total weight],
 * walked through the kinds in their order, so a seed replays the same faults.
 */
import type { Prng } from "../prng.js"

/** A fault kind and its weight. */
export type Weighted<K> = readonly [kind: K, weight: number]

/** Draws one kind, each with probability its weight over the total; `kinds` must not be empty. */
export const pickWeighted = <K>(rng: Prng, kinds: ReadonlyArray<Weighted<K>>): K => {
  let roll = rng.int(
    1,
    kinds.reduce((n, [, weight]) => n + weight, 0)
  )
  for (const [kind, weight] of kinds) {
    if (roll <= weight) return kind
    roll -= weight
  }
  throw new Error("pickWeighted: no kinds to draw from")
}
