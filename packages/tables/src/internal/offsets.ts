/**
 * Persist-offset-on-commit's rule: a pending offset only moves forward.
 *
 * @internal
 */

/** The pending offset after a write at `offset`: a lower offset never replaces a higher one (30 → 29 keeps 30). */
export const advance = (pending: number | undefined, offset: number): number | undefined =>
  offset < 0 ? pending : pending === undefined || offset > pending ? offset : pending
