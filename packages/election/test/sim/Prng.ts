/**
 * The simulator's seeded numbers: the shared test PRNG (`scripts/test-support/prng.ts`), so a run is replayed by
 * its seed alone.
 */
import { type Prng, seeded } from "../../../../scripts/test-support/prng.js"

export type { Prng }

/** A generator seeded with `seed` (any integer). */
export const make = (seed: number): Prng => seeded(seed ^ 0x5bd1e995)
