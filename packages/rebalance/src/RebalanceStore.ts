/**
 * Where a rebalance's state lives in coordination, so a controller that takes over goes on with it: one node at
 * `root` holding everything but the moves, with the moves in child nodes `moves-0000`, `moves-0001`, … of at most
 * `chunkBytes` each (256 KB by default: no node near the 512 KB a node should stay under, whatever the plan's
 * size). A save writes the header and only the chunks that changed, in one fenced operation (a deposed controller's
 * save fails), and deletes the chunks a shorter plan no longer needs.
 *
 * @since 0.1.0
 */
import type { Coordination, Election } from "@strata/core"
import { Effect, Option, Schema } from "effect"
import * as Executor from "./Executor.js"

/**
 * The header node's content: the executor's state without its moves, and how many chunks hold them.
 *
 * @since 0.1.0
 */
const Header = Schema.Struct({
  state: Executor.State,
  chunks: Schema.Int
})

const encodeHeader = Schema.encodeSync(Schema.fromJsonString(Header))
const decodeHeader = Schema.decodeUnknownEffect(Schema.fromJsonString(Header))
const encodeMove = Schema.encodeSync(Executor.Move)
const decodeChunk = Schema.decodeUnknownEffect(Schema.fromJsonString(Schema.Array(Executor.Move)))

const text = new TextEncoder()
const fromBytes = new TextDecoder()

/**
 * A stored rebalance that cannot be read (a chunk missing or not decodable): `path` names the node.
 *
 * @since 0.1.0
 */
export class RebalanceStoreCorrupt extends Schema.TaggedError<RebalanceStoreCorrupt>()("RebalanceStoreCorrupt", {
  path: Schema.String,
  detail: Schema.String
}) {
  /** @since 0.1.0 */
  override get message(): string {
    return `the stored rebalance at ${this.path} cannot be read: ${this.detail}`
  }
}

/**
 * The store of one cluster's rebalance.
 *
 * @since 0.1.0
 */
export interface RebalanceStore {
  readonly root: string
  /** The stored rebalance (running, paused or the last one ended), if any; run it before the first `save`. */
  readonly load: Effect.Effect<Option.Option<Executor.State>, Coordination.CoordinationError | RebalanceStoreCorrupt>
  /** Stores `state`: the header and the chunks that changed since the last save or load, fenced by the epoch. */
  readonly save: (state: Executor.State) => Effect.Effect<void, Election.ElectionError | Coordination.CoordinationError>
}

/**
 * The chunk node names: `moves-0000`, ….
 *
 * @since 0.1.0
 */
export const chunkName = (i: number): string => `moves-${String(i).padStart(4, "0")}`

/**
 * `moves` as JSON chunks of at most `chunkBytes` each (a single move larger than that is a chunk of its own).
 *
 * @since 0.1.0
 */
export const chunk = (moves: ReadonlyArray<Executor.Move>, chunkBytes: number): ReadonlyArray<string> => {
  const out: Array<string> = []
  let current: Array<string> = []
  let size = 2
  for (const m of moves) {
    const json = JSON.stringify(encodeMove(m))
    if (current.length > 0 && size + json.length + 1 > chunkBytes) {
      out.push(`[${current.join(",")}]`)
      current = []
      size = 2
    }
    current.push(json)
    size += json.length + 1
  }
  if (current.length > 0) out.push(`[${current.join(",")}]`)
  return out
}

/**
 * A store at `root` (`<namespace>/rebalance` for a cluster), reading through `session` and writing through
 * `leadership`'s fenced operations.
 *
 * @since 0.1.0
 */
export const make = (options: {
  readonly root: string
  readonly session: Coordination.Session
  readonly leadership: Pick<Election.Leadership, "fenced">
  /** The most bytes one chunk of moves holds (256 KB). */
  readonly chunkBytes?: number
}): RebalanceStore => {
  const { root, session, leadership } = options
  const chunkBytes = options.chunkBytes ?? 256 * 1024
  /** What the nodes hold now, as far as this store knows: the header's existence and each chunk's JSON. */
  let written: { readonly header: boolean; readonly chunks: ReadonlyArray<string> } | undefined

  const known = Effect.suspend(() =>
    written !== undefined
      ? Effect.succeed(written)
      : Effect.gen(function* () {
          const header = Option.isSome(yield* session.exists(root))
          const names = header ? yield* session.children(root) : []
          // Chunks present but unknown are rewritten on the next save (an empty string never equals a chunk).
          const chunks = names.filter((n) => n.startsWith("moves-")).map(() => "")
          return { header, chunks }
        })
  )

  const load = Effect.gen(function* () {
    const exists = yield* session.exists(root)
    if (Option.isNone(exists)) {
      // The first save creates the root under its parent: the parent is made here (a namespace a fresh cluster has
      // not written yet).
      const parent = root.slice(0, root.lastIndexOf("/"))
      if (parent !== "")
        yield* session.create(parent, new Uint8Array(), { createParents: true }).pipe(
          Effect.catchIf(
            (e) => e.reason._tag === "NodeExists",
            () => Effect.void
          )
        )
      written = { header: false, chunks: [] }
      return Option.none()
    }
    const node = yield* session.get(root)
    const header = yield* decodeHeader(fromBytes.decode(node.data)).pipe(
      Effect.mapError((e) => new RebalanceStoreCorrupt({ path: root, detail: e.message }))
    )
    const chunks: Array<string> = []
    const moves: Array<Executor.Move> = []
    for (let i = 0; i < header.chunks; i++) {
      const path = `${root}/${chunkName(i)}`
      const json = yield* session.get(path).pipe(
        Effect.map((n) => fromBytes.decode(n.data)),
        Effect.catchTag("CoordinationError", (e) => Effect.fail(new RebalanceStoreCorrupt({ path, detail: e.message })))
      )
      const part = yield* decodeChunk(json).pipe(
        Effect.mapError((e) => new RebalanceStoreCorrupt({ path, detail: e.message }))
      )
      chunks.push(json)
      moves.push(...part)
    }
    written = { header: true, chunks }
    return Option.some({ ...header.state, moves })
  })

  const save = (state: Executor.State) =>
    Effect.gen(function* () {
      const before = yield* known
      const chunks = chunk(state.moves, chunkBytes)
      const header = text.encode(encodeHeader({ state: { ...state, moves: [] }, chunks: chunks.length }))
      const ops: Array<Coordination.Op> = [
        before.header ? { _tag: "set", path: root, data: header } : { _tag: "create", path: root, data: header }
      ]
      chunks.forEach((json, i) => {
        if (before.chunks[i] === json) return
        const path = `${root}/${chunkName(i)}`
        const data = text.encode(json)
        ops.push(i < before.chunks.length ? { _tag: "set", path, data } : { _tag: "create", path, data })
      })
      for (let i = chunks.length; i < before.chunks.length; i++)
        ops.push({ _tag: "delete", path: `${root}/${chunkName(i)}` })
      yield* leadership.fenced(ops).pipe(
        Effect.tapError(() =>
          Effect.sync(() => {
            written = undefined
          })
        )
      )
      written = { header: true, chunks }
    })

  return { root, load, save }
}
