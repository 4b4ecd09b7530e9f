/**
 * A coordinator's view of the cluster's tablets, kept warm while it stands by, so that taking over as controller
 * costs a read of what changed, not of every tablet (Fluss reloads everything on failover, Fluss #1360; KRaft's
 * standby controllers replay the metadata log instead).
 *
 * The controller writes the tablet journal (`ClusterPaths.Journal`) in the same atomic operation as the tablets it
 * names. A warm view watches the journal and reads the tablets each new entry names; `sync`, run by a new
 * controller once its epoch fences the previous one (no tablet changes after that but its own), reads the journal
 * once more and the tablets written since the view last caught up. When the view fell further behind than the
 * journal reaches (or there is no journal), it reads every tablet, as a cold start does.
 *
 * @since 0.1.0
 */
import { Coordination } from "@strata/core"
import { type Duration, Effect, Option, type Scope, Semaphore } from "effect"
import * as ClusterPaths from "../wire/ClusterPaths.js"
import type * as ControllerState from "../machines/ControllerState.js"

/**
 * What a `sync` found.
 *
 * @since 0.1.0
 */
export interface Synced {
  /** Every tablet, as coordination holds it now. */
  readonly tablets: ReadonlyArray<ControllerState.Tablet>
  /** The journal with its node version (`undefined`: there is none). */
  readonly journal: { readonly journal: ClusterPaths.Journal; readonly version: number } | undefined
  /** How many tablets this sync read from coordination. */
  readonly read: number
  /** Whether it had to read every tablet. */
  readonly full: boolean
}

/**
 * What the view has done so far.
 *
 * @since 0.1.0
 */
export interface ViewStats {
  /** The journal entry the view has caught up to (`undefined`: none yet). */
  readonly seq: number | undefined
  readonly tablets: number
  /** Reads of every tablet. */
  readonly fullLoads: number
  /** Tablet nodes read, in all. */
  readonly tabletReads: number
}

/**
 * A view of the tablets.
 *
 * @since 0.1.0
 */
export interface ControllerView {
  /** Catches up with coordination through `session` and returns every tablet. */
  readonly sync: (
    session: Coordination.Session
  ) => Effect.Effect<Synced, Coordination.CoordinationError | ClusterPaths.CorruptClusterData>
  readonly stats: Effect.Effect<ViewStats>
}

/**
 * A view's options.
 *
 * @since 0.1.0
 */
export interface ControllerViewOptions {
  /** The coordination namespace of the cluster (`/strata`). */
  readonly namespace: string
  /**
   * Keep the view warm: watch the journal on a session of its own, catching up on every change, until the scope
   * closes (after a failure, again after the pause `retryBackoff`). Without it the view reads only when synced.
   */
  readonly keepWarm?: { readonly retryBackoff: Duration.Input }
}

/** How many tablet nodes a catch-up reads at once. */
const readConcurrency = 16

/**
 * A view of the namespace's tablets, empty until it first catches up.
 *
 * @since 0.1.0
 */
export const make = (
  options: ControllerViewOptions
): Effect.Effect<ControllerView, never, Coordination.Coordination | Scope.Scope> =>
  Effect.gen(function* () {
    const paths = ClusterPaths.make(options.namespace)
    const lock = yield* Semaphore.make(1)
    const cache = new Map<string, ControllerState.Tablet>()
    let seq: number | undefined
    let fullLoads = 0
    let tabletReads = 0

    const read = (session: Coordination.Session, name: string) =>
      Effect.gen(function* () {
        const path = `${paths.tablets}/${name}`
        tabletReads++
        const node = yield* session.get(path).pipe(
          Effect.map(Option.some),
          Effect.catchIf(
            (e) => e.reason._tag === "NoNode",
            () => Effect.succeed(Option.none<Coordination.Node>())
          )
        )
        if (Option.isNone(node)) {
          cache.delete(name)
          return
        }
        cache.set(name, yield* ClusterPaths.decodeTablet(path, node.value.data, node.value.stat.version))
      })

    const readAll = (session: Coordination.Session) =>
      Effect.gen(function* () {
        fullLoads++
        const names = yield* session.children(paths.tablets).pipe(
          Effect.catchIf(
            (e) => e.reason._tag === "NoNode",
            () => Effect.succeed<ReadonlyArray<string>>([])
          )
        )
        const present = new Set(names)
        for (const name of cache.keys()) if (!present.has(name)) cache.delete(name)
        yield* Effect.forEach(names, (name) => read(session, name), { concurrency: readConcurrency, discard: true })
      })

    /** Catches up with the journal `node` held (none: no journal, every tablet is read). */
    const catchUp = (session: Coordination.Session, node: Option.Option<Coordination.Node>) =>
      Effect.gen(function* () {
        if (Option.isNone(node)) {
          seq = undefined
          yield* readAll(session)
          return { full: true, journal: undefined }
        }
        const journal = yield* ClusterPaths.decodeJournal(paths.changes, node.value.data)
        const since = seq === undefined ? undefined : ClusterPaths.journalSince(journal, seq)
        // The journal is read before the tablets: a tablet read may be newer than the entry, never older.
        if (since === undefined) yield* readAll(session)
        else
          yield* Effect.forEach(since, (name) => read(session, name), { concurrency: readConcurrency, discard: true })
        seq = journal.seq
        return { full: since === undefined, journal: { journal, version: node.value.stat.version } }
      })

    const sync = (session: Coordination.Session) =>
      lock.withPermit(
        Effect.gen(function* () {
          const before = tabletReads
          const node = yield* session.get(paths.changes).pipe(
            Effect.map(Option.some),
            Effect.catchIf(
              (e) => e.reason._tag === "NoNode",
              () => Effect.succeed(Option.none<Coordination.Node>())
            )
          )
          const caught = yield* catchUp(session, node)
          return { ...caught, tablets: [...cache.values()], read: tabletReads - before }
        })
      )

    if (options.keepWarm !== undefined) {
      const backoff = options.keepWarm.retryBackoff
      const coordination = yield* Coordination.Coordination
      // One session for the watch, a new one after it ends; every journal change is caught up with.
      const watch = Effect.scoped(
        Effect.gen(function* () {
          const session = yield* coordination.session()
          while (true) {
            const w = yield* session.watchNode(paths.changes)
            yield* lock.withPermit(catchUp(session, w.value))
            yield* w.changed
          }
        })
      ).pipe(
        Effect.catch((e) =>
          Effect.logDebug(`controller view: ${e.message}`).pipe(Effect.andThen(Effect.sleep(backoff)))
        ),
        Effect.forever
      )
      yield* Effect.forkScoped(watch)
    }

    return {
      sync,
      stats: Effect.sync(() => ({ seq, tablets: cache.size, fullLoads, tabletReads }))
    }
  })
