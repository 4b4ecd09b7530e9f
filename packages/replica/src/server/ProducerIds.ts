/**
 * Unique idempotent-producer ids for a cluster (Kafka's producer id blocks): one coordination node holds the next
 * id no one has been given; an allocator reserves a block of ids from it with a compare-and-set and hands them out
 * one by one, reserving the next block when its own runs out. Two allocators (a controller and its successor, two
 * coordinators racing) never reserve the same block, so no two producers of a cluster ever share an id, however
 * they restart. Ids left in a block when its allocator stops are never used.
 *
 * @since 0.1.0
 */
import { type Coordination, OptionSchemas, Retry } from "@strata/core"
import { Data, Effect, Schedule, Schema, Semaphore } from "effect"
import * as ReplicationConfig from "../wire/ReplicationConfig.js"

const encoder = new TextEncoder()
const decoder = new TextDecoder()

/**
 * An allocator's options.
 *
 * @since 0.1.0
 */
export const ProducerIdsOptions = Schema.Struct({
  /** The coordination node holding the next free id. */
  path: Schema.String,
  /** How many ids one compare-and-set reserves (1000). */
  blockSize: OptionSchemas.PositiveInt.pipe(Schema.withDecodingDefaultKey(Effect.succeed(1000)))
})

/**
 * The options' input.
 *
 * @since 0.1.0
 */
export type ProducerIdsOptions = typeof ProducerIdsOptions.Encoded

/**
 * The allocator.
 *
 * @since 0.1.0
 */
export interface ProducerIds {
  /** An id no producer of the cluster has had (a new block reserved through `session` when need be). */
  readonly next: (session: Coordination.Session) => Effect.Effect<number, Coordination.CoordinationError>
}

/** The largest id handed out: ids stay within the wire's 31-bit producer id. */
const MAX_ID = 2 ** 31 - 1

/** The next free id a node holds; a node holding anything else is not one this module wrote, and stops it. */
const decodeNext = (path: string, data: Uint8Array): Effect.Effect<number> => {
  const text = decoder.decode(data)
  const n = Number(text)
  return /^[0-9]+$/.test(text) && Number.isSafeInteger(n)
    ? Effect.succeed(n)
    : Effect.die(new Error(`${path} holds ${JSON.stringify(text.slice(0, 40))}, not the next producer id`))
}

/** Another allocator reserved first: the node is read again. */
class Raced extends Data.TaggedError("Raced") {}

/** Reserves `[from, from + size)` from the node: created when absent, else moved on at the version read. */
const reserve = (session: Coordination.Session, path: string, size: number) =>
  Effect.gen(function* () {
    const node = yield* session.get(path).pipe(
      Effect.flatMap((n) => Effect.map(decodeNext(path, n.data), (from) => ({ from, version: n.stat.version }))),
      Effect.catchIf(
        (e) => e.reason._tag === "NoNode",
        () => Effect.succeed(undefined)
      )
    )
    const from = node?.from ?? 0
    if (from + size - 1 > MAX_ID) return yield* Effect.die(new Error(`${path}: producer ids exhausted at ${from}`))
    const data = encoder.encode(String(from + size))
    const write: Effect.Effect<unknown, Coordination.CoordinationError> =
      node === undefined ? session.create(path, data, { createParents: true }) : session.set(path, data, node.version)
    yield* write.pipe(
      Effect.catchIf(
        (e) => e.reason._tag === "NodeExists" || e.reason._tag === "BadVersion",
        () => Effect.fail(new Raced())
      )
    )
    return from
  }).pipe(
    Retry.retry({ schedule: Schedule.forever, while: (e) => e instanceof Raced }),
    Effect.catchTag("Raced", () => Effect.die(new Error("unreachable: a race is retried")))
  )

/**
 * An allocator of the ids under `options.path`.
 *
 * @since 0.1.0
 */
export const make = (
  options: ProducerIdsOptions
): Effect.Effect<ProducerIds, ReplicationConfig.InvalidReplicaOptions> =>
  Effect.gen(function* () {
    const o = yield* OptionSchemas.decodeOptions(ProducerIdsOptions, { exact: true })(options).pipe(
      Effect.mapError(ReplicationConfig.invalidOptions)
    )
    const lock = Semaphore.makeUnsafe(1)
    let next = 0
    let end = 0
    return {
      next: (session) =>
        Semaphore.withPermit(
          lock,
          Effect.gen(function* () {
            if (next === end) {
              next = yield* reserve(session, o.path, o.blockSize)
              end = next + o.blockSize
            }
            return next++
          })
        )
    }
  })
