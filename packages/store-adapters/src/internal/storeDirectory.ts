/**
 * What a store directory holds, decided from its file names before an engine is handed the path.
 *
 * The engines do not check whose directory they are given: RocksDB aborts the whole process on a LevelDB directory
 * with table files (`Assertion 'smallest_seqno <= largest_seqno' failed`) after writing its own files into it, or
 * silently converts one that has only a write-ahead log; LevelDB reports a RocksDB directory as corrupted after
 * renaming its info log; both create a database among unrelated files, and both start an empty database over a
 * directory whose `CURRENT` is gone — deleting the tables it no longer references.
 *
 * How a directory is recognised (by names only; nothing is written, so a directory created before this check needs
 * no marker to be recognised):
 *   - both engines write `CURRENT`, `LOCK`, `LOG`, `LOG.old…`, `MANIFEST-<n>`, `<n>.log`, `<n>.dbtmp`, and RocksDB
 *     and older LevelDB versions `<n>.sst`;
 *   - only LevelDB (1.14 and later) writes tables as `<n>.ldb`;
 *   - only RocksDB writes `IDENTITY`, `OPTIONS-<n>` (with every database it creates or opens), `<n>.blob` and the
 *     `archive/` directory of old write-ahead logs;
 *   - so: a RocksDB file means RocksDB, an `.ldb` file means LevelDB, both mean a directory neither may open, and
 *     `CURRENT` or data files with no RocksDB file mean LevelDB. Any other name is not an engine's, and the
 *     directory is refused with it named (`lost+found`, the root of a freshly formatted volume, is ignored).
 *
 * Then: nothing there (or no directory yet) is a new database; a lock file, info logs or a manifest without
 * `CURRENT` and without data files are a creation that never finished, also new; `CURRENT` present is an existing
 * database, opened without `createIfMissing`; data files (`.log`, `.ldb`, `.sst`, `.blob`) without `CURRENT` are a
 * database that lost its root: corrupted, never started over.
 */
import { readdir } from "node:fs/promises"

/** A store engine, by the name its backend goes by. */
export type Engine = "level" | "rocksdb"

/** The engine's own name, for messages. */
export const engineName = (engine: Engine): string => (engine === "level" ? "LevelDB" : "RocksDB")

/** The entries of a directory, or why there are none. */
export type Listing =
  | { readonly _tag: "Missing" }
  | { readonly _tag: "NotADirectory" }
  | {
      readonly _tag: "Entries"
      readonly entries: ReadonlyArray<{ readonly name: string; readonly isDirectory: boolean }>
    }

/** What the backend of `engine` does with a directory. */
export type Verdict =
  /** Nothing of value there: create a new database (the engine refuses if one appears meanwhile). */
  | { readonly _tag: "Create" }
  /** An existing database of this engine: open it, never creating one. */
  | { readonly _tag: "Open" }
  /** Not this engine's directory; `found` says what is there. */
  | { readonly _tag: "Foreign"; readonly found: string }
  /** This engine's database, damaged beyond what opening could survive without losing data. */
  | { readonly _tag: "Corrupted"; readonly detail: string }
  | { readonly _tag: "NotADirectory" }

const COMMON = [/^CURRENT$/, /^LOCK$/, /^LOG$/, /^LOG\.old(\.\d+)?$/, /^MANIFEST-\d+$/, /^\d+\.(log|sst|dbtmp)$/]
const LEVEL_ONLY = [/^\d+\.ldb$/]
const ROCKSDB_ONLY = [/^IDENTITY$/, /^OPTIONS-\d+(\.dbtmp)?$/, /^\d+\.blob$/]
const ROCKSDB_DIRECTORIES = new Set(["archive"])
const IGNORED_DIRECTORIES = new Set(["lost+found"])
/** Files holding data: without `CURRENT` they are a database that lost its root, not an unfinished creation. */
const DATA = /^\d+\.(log|ldb|sst|blob)$/

const matches = (patterns: ReadonlyArray<RegExp>, name: string) => patterns.some((p) => p.test(name))

/** Up to five names, the first ones in order, for a message. */
const some = (names: ReadonlyArray<string>): string => {
  const sorted = [...names].sort()
  return sorted.length <= 5 ? sorted.join(", ") : `${sorted.slice(0, 5).join(", ")} and ${sorted.length - 5} more`
}

/** Decides what the backend of `engine` does with a directory, from its listing (see the module comment). */
export const classify = (listing: Listing, engine: Engine): Verdict => {
  if (listing._tag === "Missing") return { _tag: "Create" }
  if (listing._tag === "NotADirectory") return { _tag: "NotADirectory" }
  const names: Array<string> = []
  const level: Array<string> = []
  const rocksdb: Array<string> = []
  const unknown: Array<string> = []
  for (const { name, isDirectory } of listing.entries) {
    if (isDirectory) {
      if (IGNORED_DIRECTORIES.has(name)) continue
      if (ROCKSDB_DIRECTORIES.has(name)) rocksdb.push(`${name}/`)
      else unknown.push(`${name}/`)
    } else if (matches(LEVEL_ONLY, name)) level.push(name)
    else if (matches(ROCKSDB_ONLY, name)) rocksdb.push(name)
    else if (!matches(COMMON, name)) unknown.push(name)
    names.push(isDirectory ? `${name}/` : name)
  }
  if (names.length === 0) return { _tag: "Create" }
  const kind: Engine | undefined = rocksdb.length > 0 ? "rocksdb" : level.length > 0 ? "level" : undefined
  if (unknown.length > 0) {
    const engineFiles = names.filter((name) => !unknown.includes(name))
    return {
      _tag: "Foreign",
      found:
        engineFiles.length === 0
          ? `files no store engine writes (${some(unknown)})`
          : `a ${engineName(kind ?? "level")} database with files no store engine writes beside it (${some(unknown)})`
    }
  }
  if (level.length > 0 && rocksdb.length > 0) {
    return {
      _tag: "Foreign",
      found: `files of both LevelDB (${some(level)}) and RocksDB (${some(rocksdb)}), which neither engine may open`
    }
  }
  const current = names.includes("CURRENT")
  const data = names.filter((name) => DATA.test(name))
  if (!current && data.length === 0) {
    // A creation that never finished (or the leftovers of one): nothing to lose.
    return kind === undefined || kind === engine
      ? { _tag: "Create" }
      : { _tag: "Foreign", found: `the files of a ${engineName(kind)} database never finished (${some(names)})` }
  }
  // CURRENT or data files with no RocksDB file: RocksDB writes IDENTITY and OPTIONS with every database.
  const owner = kind ?? "level"
  if (owner !== engine) return { _tag: "Foreign", found: `a ${engineName(owner)} database (${some(names)})` }
  if (!current) {
    return {
      _tag: "Corrupted",
      detail:
        `CURRENT is missing, but the directory holds the database's files (${some(data)}): opening it would start an ` +
        "empty database over them and delete them; nothing was changed"
    }
  }
  return { _tag: "Open" }
}

/** Lists a directory for `classify`; rejects with the file system's error when it cannot be read (e.g. EACCES). */
export const list = async (directory: string): Promise<Listing> => {
  try {
    const entries = await readdir(directory, { withFileTypes: true })
    return { _tag: "Entries", entries: entries.map((d) => ({ name: d.name, isDirectory: d.isDirectory() })) }
  } catch (e) {
    const code = (e as { code?: unknown }).code
    if (code === "ENOENT") return { _tag: "Missing" }
    if (code === "ENOTDIR") return { _tag: "NotADirectory" }
    throw e
  }
}
