/**
 * A memory `Store` that can lose what it has not flushed, as a machine that loses power does: every write (and
 * every drop of a partition) keeps the values it replaced until `flush`; `loseUnflushed` puts them back, newest
 * first, so each partition returns to what it held at its last flush. Used by the cluster simulator for crashes that
 * lose unflushed writes, with `failing` set for a disk that is full or failing, with `failSome` for one that fails
 * some writes, and with `slowMs` for a slow one.
 */
import { MemoryStore, Store } from "@strata/core"
import { Context, Duration, Effect, Layer, Option, type Scope, Stream } from "effect"

/** The replaced values of one write, to put back. */
interface Undo {
  readonly id: Store.Id
  readonly priors: ReadonlyArray<readonly [key: Uint8Array, prior: Option.Option<Uint8Array>]>
}

/** A lossy store and its controls. */
export interface LossyStore {
  readonly context: Context.Context<Store.Store>
  /** Makes everything written so far durable. */
  readonly flush: () => void
  /** Whether anything written is not flushed. */
  readonly dirty: () => boolean
  /** Puts back every value replaced since the last flush; run only while no partition is open. */
  readonly loseUnflushed: Effect.Effect<number>
  /** While set, every write fails as on a full disk (nothing of it is written). */
  failing: boolean
  /** While set, a write fails (nothing of it written) when this answers true: a disk failing some operations. */
  failSome: (() => boolean) | undefined
  /** While above 0, every write waits this long first: a slow disk. */
  slowMs: number
}

/** A lossy memory store living in `scope`. */
export const make = (scope: Scope.Scope): Effect.Effect<LossyStore> =>
  Effect.gen(function* () {
    const memory = yield* Layer.buildWithScope(MemoryStore.layer(), scope)
    const inner = Context.get(memory, Store.Store)
    let undo: Array<Undo> = []

    const record = (
      id: Store.Id,
      keys: ReadonlyArray<Uint8Array>,
      priors: ReadonlyArray<Option.Option<Uint8Array>>
    ) => {
      undo.push({ id, priors: keys.map((k, i) => [k, priors[i]!] as const) })
    }

    const shape: Store.Shape = {
      backend: inner.backend,
      limits: inner.limits,
      // A dropped partition is back as it was at the last flush after a loss: its entries are the drop's priors.
      drop: (id) =>
        Effect.gen(function* () {
          const entries = yield* Effect.scoped(Effect.flatMap(inner.open(id), (ps) => Stream.runCollect(ps.scan())))
          yield* inner.drop(id)
          record(
            id,
            entries.map(([k]) => k),
            entries.map(([, v]) => Option.some(v))
          )
        }),
      open: (id) =>
        Effect.map(inner.open(id), (ps) => {
          const write = (ops: ReadonlyArray<Store.Op>, options?: Parameters<typeof ps.write>[1]) =>
            Effect.gen(function* () {
              if (self.slowMs > 0) yield* Effect.sleep(Duration.millis(self.slowMs))
              if (self.failing || self.failSome?.() === true) {
                const detail = self.failing ? "No space left on device" : "Input/output error"
                return yield* Effect.fail(
                  new Store.StoreError({ reason: new Store.IoError({ operation: "write", detail }) })
                )
              }
              if (options?.offsets !== undefined && options.offsets.length > 0) {
                return yield* Effect.die(new Error("LossyStore does not model persisted offsets"))
              }
              const keys = ops.map((op) => op.key)
              const priors = yield* ps.getMany(keys)
              yield* ps.write(ops, options)
              record(id, keys, priors)
            })
          return {
            ...ps,
            write,
            put: (key, value) => write([{ _tag: "put", key, value }]),
            delete: (key) => write([{ _tag: "delete", key }]),
            clear: Effect.gen(function* () {
              const entries = yield* Stream.runCollect(ps.scan())
              yield* ps.clear
              record(
                id,
                entries.map(([k]) => k),
                entries.map(([, v]) => Option.some(v))
              )
            })
          }
        })
    }

    const loseUnflushed = Effect.gen(function* () {
      const lost = undo.length
      const pending = undo
      undo = []
      const byId = new Map<string, Store.Id>()
      for (const u of pending) byId.set(`${u.id.table}/${u.id.partition}`, u.id)
      yield* Effect.scoped(
        Effect.gen(function* () {
          const stores = new Map<string, Store.PartitionStore>()
          for (const [k, id] of byId) stores.set(k, yield* inner.open(id))
          for (let i = pending.length - 1; i >= 0; i--) {
            const u = pending[i]!
            const ps = stores.get(`${u.id.table}/${u.id.partition}`)!
            const ops: Array<Store.Op> = u.priors.map(([key, prior]) =>
              Option.isSome(prior) ? { _tag: "put", key, value: prior.value } : { _tag: "delete", key }
            )
            yield* ps.write(ops)
          }
        })
      ).pipe(Effect.orDie)
      return lost
    })

    const self: LossyStore = {
      context: Context.make(Store.Store, shape),
      flush: () => {
        undo = []
      },
      dirty: () => undo.length > 0,
      loseUnflushed,
      failing: false,
      failSome: undefined,
      slowMs: 0
    }
    return self
  })
