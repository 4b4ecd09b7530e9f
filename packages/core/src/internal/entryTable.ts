/**
 * The memory store's entries: an open-addressing hash table over typed arrays, the keys and values themselves in
 * append-only slabs. No JavaScript object exists per entry, so a table of millions of entries costs the garbage
 * collector a few arrays instead of millions of objects (a `Map` of per-entry views spent more time in the
 * collector than in the writes), and its memory is about the bytes stored plus 12 bytes a slot.
 *
 * Entry layout in a slab: key length (u32 LE), value length (u32 LE), key, value. Slab bytes are never changed
 * once written: an overwrite or delete only makes bytes dead, and compaction copies the live entries into new
 * slabs once dead bytes outweigh live ones, so a scan holding a slab and an offset keeps seeing what it saw.
 *
 * @internal
 */

/** Bytes before an entry's key. */
const HEAD = 8
/** The first slab's size; each next one doubles, up to `SLAB_MAX`. */
const SLAB_MIN = 1024
const SLAB_MAX = 1024 * 1024
/** Entries larger than this get a slab of their own. */
const OWN = 64 * 1024
/** Slot states in `hashes` (a used slot holds its key's hash + 1). */
const EMPTY = 0
const TOMBSTONE = -1
/** Most used slots (live + tombstones) per slot before the table is rebuilt. */
const MAX_LOAD = 0.6
/** Dead bytes tolerated before compaction, beyond the live bytes. */
const DEAD_SLACK = 64 * 1024

/** One partition's entries. */
export interface EntryTable {
  /** Per slot: EMPTY, TOMBSTONE, or the key's hash + 1. */
  hashes: Int32Array
  /** Per slot: the slab holding the entry, and where in it. */
  slabOf: Int32Array
  atOf: Int32Array
  mask: number
  /** Live entries. */
  count: number
  /** Live entries and tombstones. */
  used: number
  slabs: Array<Uint8Array>
  /** The slab small entries go to (-1: none yet), and the bytes written into it. */
  filling: number
  fill: number
  liveBytes: number
  deadBytes: number
}

const CAPACITY_MIN = 16

/** An empty table. */
export const make = (): EntryTable => ({
  hashes: new Int32Array(CAPACITY_MIN),
  slabOf: new Int32Array(CAPACITY_MIN),
  atOf: new Int32Array(CAPACITY_MIN),
  mask: CAPACITY_MIN - 1,
  count: 0,
  used: 0,
  slabs: [],
  filling: -1,
  fill: 0,
  liveBytes: 0,
  deadBytes: 0
})

/** Forgets every entry (and the slabs, for the collector). */
export const clear = (t: EntryTable): void => {
  Object.assign(t, make())
}

/** FNV-1a of the key's bytes, cut to 30 bits. */
const hashOf = (key: Uint8Array): number => {
  let h = 0x811c9dc5
  for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key[i]!, 0x01000193)
  return h & 0x3fffffff
}

const u32At = (b: Uint8Array, at: number): number =>
  (b[at]! | (b[at + 1]! << 8) | (b[at + 2]! << 16) | (b[at + 3]! << 24)) >>> 0

const setU32 = (b: Uint8Array, at: number, n: number): void => {
  b[at] = n & 0xff
  b[at + 1] = (n >>> 8) & 0xff
  b[at + 2] = (n >>> 16) & 0xff
  b[at + 3] = (n >>> 24) & 0xff
}

/** The size of the entry at `at` in `slab`. */
const sizeAt = (slab: Uint8Array, at: number): number => HEAD + u32At(slab, at) + u32At(slab, at + 4)

/** Whether the entry at `at` in `slab` holds `key`. */
const holdsAt = (slab: Uint8Array, at: number, key: Uint8Array): boolean => {
  if (u32At(slab, at) !== key.length) return false
  const from = at + HEAD
  for (let i = 0; i < key.length; i++) if (slab[from + i] !== key[i]) return false
  return true
}

/** The slot holding `key`, or -1. */
export const find = (t: EntryTable, key: Uint8Array): number => {
  const tag = hashOf(key) + 1
  for (let i = tag & t.mask; ; i = (i + 1) & t.mask) {
    const h = t.hashes[i]!
    if (h === EMPTY) return -1
    if (h === tag && holdsAt(t.slabs[t.slabOf[i]!]!, t.atOf[i]!, key)) return i
  }
}

// Where `reserve` put the last entry (module state: no tuple per write).
let reservedSlab = 0
let reservedAt = 0

/** Room for `n` bytes: in the slab being filled, a new (larger) one, or one of its own for a large entry. */
const reserve = (t: EntryTable, n: number): void => {
  if (t.filling >= 0 && t.fill + n <= t.slabs[t.filling]!.length) {
    reservedSlab = t.filling
    reservedAt = t.fill
    t.fill += n
    return
  }
  reservedAt = 0
  if (n > OWN) {
    t.slabs.push(new Uint8Array(n))
    reservedSlab = t.slabs.length - 1
    return
  }
  const previous = t.filling >= 0 ? t.slabs[t.filling]!.length : 0
  t.slabs.push(new Uint8Array(Math.min(SLAB_MAX, Math.max(SLAB_MIN, previous * 2, n))))
  reservedSlab = t.filling = t.slabs.length - 1
  t.fill = n
}

/** Copies `key` and `value` into a slab; the entry's place is in `reservedSlab` / `reservedAt`. */
const writeEntry = (t: EntryTable, key: Uint8Array, value: Uint8Array): void => {
  reserve(t, HEAD + key.length + value.length)
  const slab = t.slabs[reservedSlab]!
  setU32(slab, reservedAt, key.length)
  setU32(slab, reservedAt + 4, value.length)
  slab.set(key, reservedAt + HEAD)
  slab.set(value, reservedAt + HEAD + key.length)
}

/** Stores `value` under `key`; whether the key is new. */
export const put = (t: EntryTable, key: Uint8Array, value: Uint8Array): boolean => {
  const tag = hashOf(key) + 1
  let free = -1
  let i = tag & t.mask
  let existing = false
  for (; ; i = (i + 1) & t.mask) {
    const h = t.hashes[i]!
    if (h === EMPTY) break
    if (h === TOMBSTONE) {
      if (free < 0) free = i
    } else if (h === tag && holdsAt(t.slabs[t.slabOf[i]!]!, t.atOf[i]!, key)) {
      existing = true
      break
    }
  }
  if (existing) {
    const replaced = sizeAt(t.slabs[t.slabOf[i]!]!, t.atOf[i]!)
    t.deadBytes += replaced
    t.liveBytes -= replaced
  } else {
    // A new key takes the first tombstone on its probe path, else the empty slot ending it.
    if (free >= 0) i = free
    else t.used++
    t.hashes[i] = tag
    t.count++
  }
  writeEntry(t, key, value)
  t.slabOf[i] = reservedSlab
  t.atOf[i] = reservedAt
  t.liveBytes += HEAD + key.length + value.length
  if (existing) compactIfWasteful(t)
  else if (t.used > (t.mask + 1) * MAX_LOAD) rehash(t)
  return !existing
}

/** Removes `key`; whether it was there. */
export const remove = (t: EntryTable, key: Uint8Array): boolean => {
  const i = find(t, key)
  if (i < 0) return false
  const size = sizeAt(t.slabs[t.slabOf[i]!]!, t.atOf[i]!)
  t.hashes[i] = TOMBSTONE
  t.count--
  t.liveBytes -= size
  t.deadBytes += size
  compactIfWasteful(t)
  return true
}

/** Rebuilds the slots: twice as many when the live entries need it, else as many without the tombstones. */
const rehash = (t: EntryTable): void => {
  let capacity = t.mask + 1
  while (t.count > capacity * (MAX_LOAD / 2)) capacity *= 2
  const { hashes, slabOf, atOf } = t
  t.hashes = new Int32Array(capacity)
  t.slabOf = new Int32Array(capacity)
  t.atOf = new Int32Array(capacity)
  t.mask = capacity - 1
  t.used = t.count
  for (let j = 0; j < hashes.length; j++) {
    const h = hashes[j]!
    if (h <= 0) continue
    let i = h & t.mask
    while (t.hashes[i] !== EMPTY) i = (i + 1) & t.mask
    t.hashes[i] = h
    t.slabOf[i] = slabOf[j]!
    t.atOf[i] = atOf[j]!
  }
}

/** Copies the live entries into fresh slabs once dead bytes outweigh them. */
const compactIfWasteful = (t: EntryTable): void => {
  if (t.deadBytes <= t.liveBytes + DEAD_SLACK) return
  const old = t.slabs
  t.slabs = []
  t.filling = -1
  t.fill = 0
  for (let i = 0; i <= t.mask; i++) {
    if (t.hashes[i]! <= 0) continue
    const slab = old[t.slabOf[i]!]!
    const at = t.atOf[i]!
    const size = sizeAt(slab, at)
    reserve(t, size)
    t.slabs[reservedSlab]!.set(slab.subarray(at, at + size), reservedAt)
    t.slabOf[i] = reservedSlab
    t.atOf[i] = reservedAt
  }
  t.deadBytes = 0
}

/** A copy of the value in slot `i`. */
export const valueAt = (t: EntryTable, i: number): Uint8Array => {
  const slab = t.slabs[t.slabOf[i]!]!
  const from = t.atOf[i]! + HEAD + u32At(slab, t.atOf[i]!)
  return slab.slice(from, from + u32At(slab, t.atOf[i]! + 4))
}

/** The keys in byte order (as latin1 strings: one char per byte, so string order is byte order) and their slots. */
export interface Order {
  readonly keys: ReadonlyArray<string>
  readonly slots: Int32Array
}

/**
 * The table's keys in order. Slots stay valid until a key is added or removed (only a new key rehashes, and
 * compaction moves bytes, not slots), which is when a caller caching this must drop it.
 */
export const order = (t: EntryTable): Order => {
  const views = t.slabs.map((s) => Buffer.from(s.buffer, s.byteOffset, s.byteLength))
  const keys: Array<string> = []
  for (let i = 0; i <= t.mask; i++) {
    if (t.hashes[i]! <= 0) continue
    const at = t.atOf[i]! + HEAD
    keys.push(views[t.slabOf[i]!]!.toString("latin1", at, at + u32At(t.slabs[t.slabOf[i]!]!, t.atOf[i]!)))
  }
  keys.sort()
  const slots = new Int32Array(keys.length)
  for (let k = 0; k < keys.length; k++) slots[k] = findLatin1(t, keys[k]!)
  return { keys, slots }
}

/** `find` for a key given as a latin1 string (no bytes to allocate). */
const findLatin1 = (t: EntryTable, key: string): number => {
  let h = 0x811c9dc5
  for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key.charCodeAt(i), 0x01000193)
  const tag = (h & 0x3fffffff) + 1
  for (let i = tag & t.mask; ; i = (i + 1) & t.mask) {
    const stored = t.hashes[i]!
    if (stored === EMPTY) return -1
    if (stored !== tag) continue
    const slab = t.slabs[t.slabOf[i]!]!
    const at = t.atOf[i]!
    if (u32At(slab, at) !== key.length) continue
    let same = true
    for (let j = 0; same && j < key.length; j++) same = slab[at + HEAD + j] === key.charCodeAt(j)
    if (same) return i
  }
}

/** Where some entries are, captured at one moment: a scan reads them later, as they were then. */
export interface Snapshot {
  readonly slabs: ReadonlyArray<Uint8Array>
  readonly ats: Int32Array
}

/** The places of the entries in `slots`, in that order. */
export const snapshot = (t: EntryTable, slots: ArrayLike<number>): Snapshot => {
  const slabs = new Array<Uint8Array>(slots.length)
  const ats = new Int32Array(slots.length)
  for (let j = 0; j < slots.length; j++) {
    const i = slots[j]!
    slabs[j] = t.slabs[t.slabOf[i]!]!
    ats[j] = t.atOf[i]!
  }
  return { slabs, ats }
}

/** Copies of entries `from` to `to` (exclusive) of a snapshot, all in one fresh buffer. */
export const copyOut = (s: Snapshot, from: number, to: number): Array<[Uint8Array, Uint8Array]> => {
  let total = 0
  for (let j = from; j < to; j++) total += sizeAt(s.slabs[j]!, s.ats[j]!) - HEAD
  const bytes = new Uint8Array(total)
  const out = new Array<[Uint8Array, Uint8Array]>(to - from)
  let at = 0
  for (let j = from; j < to; j++) {
    const slab = s.slabs[j]!
    const entry = s.ats[j]!
    const keyLength = u32At(slab, entry)
    const size = keyLength + u32At(slab, entry + 4)
    bytes.set(slab.subarray(entry + HEAD, entry + HEAD + size), at)
    out[j - from] = [bytes.subarray(at, at + keyLength), bytes.subarray(at + keyLength, at + size)]
    at += size
  }
  return out
}
