/**
 * Where a tablet server keeps what it stores: its replicas' logs (one `TabletLog` per hosted tablet) and its own
 * registration counter. Two backends:
 *
 * - `layerSegments`: each log a `SegmentLog` (segment files) in its own directory under `<directory>/tablets/`, the
 *   counter in `<directory>/server.state`: what a server on a data directory runs;
 * - `layerStore`: each log a store-backed `TabletLog` in a partition of the `Store` in context (`tablet.<table>`,
 *   partition = bucket), the counter in the partition `strata.server`: a memory store for the embedded cluster and
 *   the simulator, or LevelDB / RocksDB.
 *
 * A deleted log's directory is first renamed aside (`<name>.deleted`) and then removed, so a crash part-way through
 * leaves no half-deleted log that would open as a damaged one; what a crash left aside is removed when the storage
 * next opens.
 *
 * @since 0.1.0
 */
import { createHash } from "node:crypto"
import * as fs from "node:fs/promises"
import { join, resolve } from "node:path"
import { MemoryStore, Models, OptionSchemas, Store } from "@strata/core"
import { Config, Context, Effect, Layer, Option, Schema, type Scope } from "effect"
import * as Files from "./internal/segmentFiles.js"
import * as SegmentLog from "./SegmentLog.js"
import * as TabletLog from "./TabletLog.js"

/**
 * A tablet server's storage.
 *
 * @since 0.1.0
 */
export interface ServerStorageShape {
  /** What the logs are kept on, for messages (`"segment files"`, or the store's backend). */
  readonly backend: string
  /** Where a tablet's log lives, for messages. */
  readonly locate: (tablet: Models.TabletId) => string
  /** Opens (creating it if missing) a tablet's log; it closes with the scope. One open log per tablet. */
  readonly open: (tablet: Models.TabletId) => Effect.Effect<TabletLog.TabletLog, TabletLog.TabletLogError, Scope.Scope>
  /** Deletes a tablet's log (none is not an error); an open one is refused (`Locked`). */
  readonly drop: (tablet: Models.TabletId) => Effect.Effect<void, TabletLog.TabletLogError>
  /**
   * One above the registration epoch of the storage's last start (0 on new storage), stored before it is returned:
   * a later start never reuses it, even if this one dies before registering.
   */
  readonly nextRegistrationEpoch: Effect.Effect<number, Store.StoreError>
}

/**
 * The storage service.
 *
 * @since 0.1.0
 */
export class ServerStorage extends Context.Service<ServerStorage, ServerStorageShape>()(
  "@strata/replica/ServerStorage"
) {}

/**
 * The store partition a tablet's log lives in (store-backed storage).
 *
 * @since 0.1.0
 */
export const storeIdOf = (tablet: Models.TabletId) => ({ table: `tablet.${tablet.table}`, partition: tablet.bucket })

/** The store partition of the server's own counters (no tablet's is named so). */
const SERVER_STORE = { table: "strata.server", partition: 0 }
const EPOCH_KEY = new TextEncoder().encode("registrationEpoch")

const storeFailed = (tablet: Models.TabletId) => (cause: Store.StoreError) =>
  new TabletLog.TabletLogError({ tablet: Models.tabletKey(tablet), reason: { _tag: "StoreFailed", cause } })

/**
 * Storage on the `Store` in context: each log a store-backed `TabletLog` in a partition of its own.
 *
 * @since 0.1.0
 */
export const makeStore: Effect.Effect<ServerStorageShape, never, Store.Store> = Effect.map(Store.Store, (store) => ({
  backend: `${store.backend} store`,
  locate: (tablet) => {
    const { table, partition } = storeIdOf(tablet)
    return `partition ${table}/${partition}`
  },
  open: (tablet) =>
    Effect.flatMap(Effect.mapError(store.open(storeIdOf(tablet)), storeFailed(tablet)), (partition) =>
      TabletLog.make(partition, tablet)
    ),
  drop: (tablet) => Effect.mapError(store.drop(storeIdOf(tablet)), storeFailed(tablet)),
  nextRegistrationEpoch: Effect.scoped(
    Effect.gen(function* () {
      const partition = yield* store.open(SERVER_STORE)
      const last = yield* partition.get(EPOCH_KEY)
      const epoch = Option.isSome(last) ? Number(new TextDecoder().decode(last.value)) + 1 : 0
      yield* partition.put(EPOCH_KEY, new TextEncoder().encode(String(epoch)))
      return epoch
    })
  )
}))

/**
 * Storage on the `Store` in context.
 *
 * @since 0.1.0
 */
export const layerStore: Layer.Layer<ServerStorage, never, Store.Store> = Layer.effect(ServerStorage)(makeStore)

/**
 * Storage on a memory store of its own (`MemoryStore`): for tests and a cluster in one process.
 *
 * @since 0.1.0
 */
export const layerMemory: Layer.Layer<ServerStorage> = Layer.provide(layerStore, MemoryStore.layer())

const PositiveInt = OptionSchemas.PositiveInt

/**
 * The options of segment-file storage: the data directory, and the `SegmentLog` options every log takes.
 *
 * @since 0.1.0
 */
export const SegmentStorageOptions = Schema.Struct({
  /** The server's data directory (created if missing). */
  directory: Schema.String.check(Schema.isNonEmpty()),
  /** The size past which a log's active segment rolls (256 MiB; at most 2 GiB − 1). */
  segmentBytes: Schema.optional(PositiveInt.check(Schema.isLessThanOrEqualTo(SegmentLog.MAX_SEGMENT_BYTES))),
  /** The age at which a log's active segment rolls at its next append, in ms (unset: never by age). */
  segmentMs: Schema.optional(PositiveInt),
  /** The bytes of log between two entries of a segment's index (4 KiB). */
  indexIntervalBytes: Schema.optional(PositiveInt),
  /** Flushes a log's active segment to the device this often, in ms (unset: never; replication and the OS keep it). */
  flushIntervalMs: Schema.optional(PositiveInt),
  /** Flushes a log's active segment to the device once this many bytes were written since its last flush (unset: never). */
  flushBytes: Schema.optional(PositiveInt),
  /** The bytes of each log's last written batches kept in memory, answering reads from there (1 MiB; 0: none). */
  tailBytes: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)))
})

/**
 * The options' input.
 *
 * @since 0.1.0
 */
export type SegmentStorageOptions = typeof SegmentStorageOptions.Encoded

/** The file a process holding the directory keeps its pid in. */
const LOCK_FILE = "server.lock"

/** Whether process `pid` is alive (on this machine). */
const alive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    return (e as { code?: unknown }).code === "EPERM"
  }
}

/**
 * Holds the data directory for this process until the scope closes: `server.lock` created with this process's pid;
 * one left by a process that is gone is taken over; one of a live process (another server on the same directory)
 * is `StoreLocked`, naming it.
 */
const lockDirectory = (root: string): Effect.Effect<void, Store.StoreError, Scope.Scope> => {
  const path = join(root, LOCK_FILE)
  const take = io("lock", path, async () => {
    for (;;) {
      try {
        await fs.writeFile(path, `${process.pid}\n`, { flag: "wx" })
        return undefined
      } catch (e) {
        if ((e as { code?: unknown }).code !== "EEXIST") throw e
      }
      const holder = Number((await fs.readFile(path, "utf8").catch(() => "")).trim())
      if (Number.isSafeInteger(holder) && holder > 0 && holder !== process.pid && alive(holder)) return holder
      await fs.rm(path, { force: true })
    }
  })
  return Effect.acquireRelease(
    Effect.flatMap(take, (holder) =>
      holder === undefined
        ? Effect.void
        : Effect.fail(
            Store.storeError(
              new Store.Locked({ store: Files.STORE_NAME, path: `${path} names process ${holder}, which runs` })
            )
          )
    ),
    () => Effect.ignore(io("unlock", path, () => fs.rm(path, { force: true })))
  )
}

/** The names a LevelDB or RocksDB database keeps in its directory (`store-adapters`' own list is longer). */
const STORE_FILES = [/^CURRENT$/, /^LOCK$/, /^IDENTITY$/, /^MANIFEST-\d+$/, /^OPTIONS-\d+$/, /^\d+\.(sst|ldb|log)$/]

/**
 * Refuses a directory a store's database is in (a server that ran with a LevelDB or RocksDB store), writing nothing:
 * its logs are there, and segment files beside them would start every replica empty.
 */
const refuseStoreDirectory = (root: string): Effect.Effect<void, Store.StoreError> =>
  Effect.flatMap(
    io("list", root, () => fs.readdir(root).catch((e: unknown) => (isMissing(e) ? [] : Promise.reject(e)))),
    (names) => {
      const found = names.filter((name) => STORE_FILES.some((p) => p.test(name))).sort()
      return found.length === 0
        ? Effect.void
        : Effect.fail(
            Store.storeError(
              new Store.ForeignStoreDirectory({
                store: Files.STORE_NAME,
                path: root,
                found: `a LevelDB or RocksDB database (${found.slice(0, 5).join(", ")}): a store's, not segment files`
              })
            )
          )
    }
  )

const isMissing = (e: unknown) => (e as { code?: unknown }).code === "ENOENT"

/** The suffix of a log directory set aside to be deleted. */
const DELETED_SUFFIX = ".deleted"
/** The file of the server's registration counter. */
const STATE_FILE = "server.state"

/**
 * The directory name of a tablet's log: the table name with every character but letters, digits, `_` and `-`
 * percent-encoded, then `-<bucket>`; a long table name is cut and a hash of it added, to stay within a file name.
 */
export const directoryNameOf = (tablet: Models.TabletId): string => {
  const encoded = Array.from(new TextEncoder().encode(tablet.table), (b) => {
    const c = String.fromCharCode(b)
    return /[A-Za-z0-9_-]/.test(c) ? c : `%${b.toString(16).toUpperCase().padStart(2, "0")}`
  }).join("")
  const table =
    encoded.length <= 180
      ? encoded
      : `${encoded.slice(0, 160)}~${createHash("sha256").update(tablet.table).digest("hex").slice(0, 16)}`
  return `${table}-${tablet.bucket}`
}

const io = <A>(operation: string, path: string, run: () => Promise<A>) => Files.io(operation, path, run)

/**
 * Storage on segment files under `options.directory`: each log a `SegmentLog` in `tablets/<table>-<bucket>`. The
 * directory is held until the scope closes (`server.lock`: a second process on it fails with `StoreLocked`). Bad
 * options fail with `StoreError` (`InvalidOptions`, naming the key).
 *
 * @since 0.1.0
 */
export const makeSegments = (
  options: SegmentStorageOptions
): Effect.Effect<ServerStorageShape, Store.StoreError, Scope.Scope> =>
  Effect.gen(function* () {
    const o = yield* OptionSchemas.decodeOptions(SegmentStorageOptions, { exact: true })(options).pipe(
      Effect.mapError((bad) => {
        const { option, value, detail } = OptionSchemas.summary(bad)
        return Store.storeError(
          new Store.InvalidOptions({ store: Files.STORE_NAME, detail: `${option} = ${value}: ${detail}` })
        )
      })
    )
    const root = resolve(o.directory)
    yield* refuseStoreDirectory(root)
    const tablets = join(root, "tablets")
    yield* Files.ensureDirectory(tablets)
    yield* lockDirectory(root)
    // What a crash left set aside to delete.
    for (const name of yield* Files.list(tablets)) {
      if (name.endsWith(DELETED_SUFFIX)) {
        const path = join(tablets, name)
        yield* io("delete", path, () => fs.rm(path, { recursive: true, force: true }))
      }
    }
    const open = new Set<string>()
    const logOptions = Object.fromEntries(
      Object.entries(o).filter(([key, value]) => key !== "directory" && value !== undefined)
    ) as Omit<SegmentLog.SegmentLogOptionsInput, "directory" | "tablet">
    const directoryOf = (tablet: Models.TabletId) => join(tablets, directoryNameOf(tablet))
    const shape: ServerStorageShape = {
      backend: "segment files",
      locate: (tablet) => directoryOf(tablet),
      open: (tablet) =>
        Effect.acquireRelease(
          Effect.sync(() => {
            const key = Models.tabletKey(tablet)
            if (open.has(key)) return false
            open.add(key)
            return true
          }),
          (added) => Effect.sync(() => added && open.delete(Models.tabletKey(tablet)))
        ).pipe(
          Effect.flatMap((added) =>
            added
              ? SegmentLog.make({ ...logOptions, directory: directoryOf(tablet), tablet })
              : Effect.fail(
                  storeFailed(tablet)(
                    Store.storeError(new Store.Locked({ store: Files.STORE_NAME, path: directoryOf(tablet) }))
                  )
                )
          )
        ),
      drop: (tablet) =>
        Effect.suspend(() => {
          const path = directoryOf(tablet)
          if (open.has(Models.tabletKey(tablet)))
            return Effect.fail(
              storeFailed(tablet)(Store.storeError(new Store.Locked({ store: Files.STORE_NAME, path })))
            )
          const aside = `${path}${DELETED_SUFFIX}`
          return io("delete", path, async () => {
            await fs.rm(aside, { recursive: true, force: true })
            try {
              await fs.rename(path, aside)
            } catch (e) {
              if (isMissing(e)) return
              throw e
            }
            await fs.rm(aside, { recursive: true, force: true })
          }).pipe(Effect.mapError(storeFailed(tablet)))
        }),
      nextRegistrationEpoch: Effect.gen(function* () {
        const last = yield* Files.readIfExists(join(root, STATE_FILE))
        const stored = last === undefined ? undefined : Number(new TextDecoder().decode(last).trim())
        if (stored !== undefined && !Number.isSafeInteger(stored))
          return yield* Effect.fail(
            Store.storeError(
              new Store.IoError({
                operation: `read ${join(root, STATE_FILE)}`,
                detail: "the registration counter is not a number"
              })
            )
          )
        const epoch = stored === undefined ? 0 : stored + 1
        yield* Files.replace(root, STATE_FILE, new TextEncoder().encode(`${epoch}\n`), true)
        return epoch
      })
    }
    return shape
  })

/**
 * Storage on segment files.
 *
 * @since 0.1.0
 */
export const layerSegments = (options: SegmentStorageOptions): Layer.Layer<ServerStorage, Store.StoreError> =>
  Layer.effect(ServerStorage)(makeSegments(options))

/**
 * Like `layerSegments`, with the options read from configuration.
 *
 * @since 0.1.0
 */
export const layerSegmentsConfig = (
  config: Config.Wrap<SegmentStorageOptions>
): Layer.Layer<ServerStorage, Store.StoreError | Config.ConfigError> =>
  Layer.unwrap(Effect.map(Config.unwrap(config), layerSegments))
