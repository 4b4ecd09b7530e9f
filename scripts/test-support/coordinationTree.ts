/**
 * Every node of a coordination tree, for tests that check what another session may do to a cluster's nodes.
 */
import { Effect } from "effect"

/** Every node under `path` (itself included), deepest first, listing each node's children with `children`. */
export const tree = <E>(
  children: (path: string) => Effect.Effect<ReadonlyArray<string>, E>,
  path: string
): Effect.Effect<Array<string>, E> =>
  Effect.gen(function* () {
    const names = yield* children(path)
    const below = yield* Effect.forEach(names, (c) => tree(children, `${path === "/" ? "" : path}/${c}`))
    return [...below.flat(), path]
  })
