/**
 * LevelDB's files, checked against their own checksums before classic-level opens them.
 *
 * classic-level exposes neither `paranoid_checks` nor `verify_checksums` (its open takes `createIfMissing`,
 * `errorIfExists`, cache and size options only; its reads take `fillCache`), and LevelDB's defaults check neither:
 * a table block whose bytes changed is served as data (a value with the new bytes, or a key that no longer matches,
 * so a persisted offset vanishes), and a write-ahead log record that fails its checksum is skipped with the rest of
 * its 32 KiB block while later records are replayed. So the store checks, at open, what LevelDB will read:
 *
 *   - the tables the MANIFEST named by `CURRENT` lists as live: each block's CRC-32C (data, filter, metaindex and
 *     index blocks), that the blocks and the footer cover the file exactly, and the size the MANIFEST records. Every
 *     byte of a table is covered (the footer's padding must be zeros);
 *   - the write-ahead logs LevelDB will replay: each record's CRC-32C and framing. Damage that only a crash mid-write
 *     leaves — at the very end of the newest log, with no whole record after it — is accepted: LevelDB drops that
 *     record, as it does after a crash, and the store opens at the batches before it. Damage anywhere else is
 *     reported: replaying past it would bring later batches back without the lost ones.
 *
 * Tables LevelDB no longer lists (the output of a compaction a crash interrupted) and logs it will not replay are
 * not read: LevelDB deletes them. The MANIFEST itself LevelDB checks on its own. Files that disappear while they are
 * read (another process owns the directory and compacts it) are skipped: opening then fails with `StoreLocked`.
 *
 * Cost: each open reads every live table and log once (sequentially, 1 MiB at a time) and computes CRC-32C over it
 * in JavaScript; reads after the open cost nothing more.
 */
import { type FileHandle, open } from "node:fs/promises"
import { join } from "node:path"

// ---------------------------------------------------------------------------
// CRC-32C (Castagnoli), as LevelDB's crc32c, slicing by 8
// ---------------------------------------------------------------------------

const CRC_TABLES = (() => {
  const t = new Int32Array(8 * 256)
  for (let i = 0; i < 256; i++) {
    let c = i
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1
    t[i] = c
  }
  for (let i = 0; i < 256; i++) {
    let c = t[i]!
    for (let s = 1; s < 8; s++) {
      c = t[c & 0xff]! ^ (c >>> 8)
      t[s * 256 + i] = c
    }
  }
  return t
})()

/** The CRC-32C of `bytes[start, end)`, continuing `seed` (the CRC of the bytes before). */
export const crc32c = (bytes: Uint8Array, start = 0, end = bytes.length, seed = 0): number => {
  const t = CRC_TABLES
  let crc = ~seed
  let i = start
  for (; end - i >= 8; i += 8) {
    const a = crc ^ (bytes[i]! | (bytes[i + 1]! << 8) | (bytes[i + 2]! << 16) | (bytes[i + 3]! << 24))
    crc =
      t[1792 + (a & 0xff)]! ^
      t[1536 + ((a >>> 8) & 0xff)]! ^
      t[1280 + ((a >>> 16) & 0xff)]! ^
      t[1024 + (a >>> 24)]! ^
      t[768 + bytes[i + 4]!]! ^
      t[512 + bytes[i + 5]!]! ^
      t[256 + bytes[i + 6]!]! ^
      t[bytes[i + 7]!]!
  }
  for (; i < end; i++) crc = t[(crc ^ bytes[i]!) & 0xff]! ^ (crc >>> 8)
  return ~crc >>> 0
}

/** LevelDB stores checksums masked (a CRC of data holding CRCs is weak); this undoes the mask. */
const unmask = (masked: number): number => {
  const rot = (masked - 0xa282ead8) >>> 0
  return ((rot >>> 17) | (rot << 15)) >>> 0
}

// ---------------------------------------------------------------------------
// Bytes
// ---------------------------------------------------------------------------

/** A varint (up to 64 bits, as a safe number) at `at`, and where it ends; undefined when cut short or too long. */
const varint = (bytes: Uint8Array, at: number, end = bytes.length): readonly [number, number] | undefined => {
  let value = 0
  let scale = 1
  for (let i = at; i < end && i < at + 10; i++) {
    const b = bytes[i]!
    value += (b & 0x7f) * scale
    if (b < 0x80) return value <= Number.MAX_SAFE_INTEGER ? [value, i + 1] : undefined
    scale *= 128
  }
  return undefined
}

const u32 = (bytes: Uint8Array, at: number): number =>
  (bytes[at]! | (bytes[at + 1]! << 8) | (bytes[at + 2]! << 16) | (bytes[at + 3]! << 24)) >>> 0

/** Snappy's raw format (LevelDB's block compression); undefined when the input is not valid. */
const snappyUncompress = (input: Uint8Array): Uint8Array | undefined => {
  const header = varint(input, 0)
  if (header === undefined || header[0] > 2 ** 31) return undefined
  const [length, start] = header
  const out = new Uint8Array(length)
  let ip = start
  let op = 0
  while (ip < input.length) {
    const tag = input[ip++]!
    if ((tag & 3) === 0) {
      let len = tag >>> 2
      if (len >= 60) {
        const bytes = len - 59
        if (ip + bytes > input.length) return undefined
        len = 0
        for (let k = 0; k < bytes; k++) len += input[ip + k]! * 2 ** (8 * k)
        ip += bytes
      }
      len += 1
      if (ip + len > input.length || op + len > length) return undefined
      out.set(input.subarray(ip, ip + len), op)
      ip += len
      op += len
      continue
    }
    let len: number
    let offset: number
    if ((tag & 3) === 1) {
      if (ip + 1 > input.length) return undefined
      len = ((tag >>> 2) & 7) + 4
      offset = ((tag >>> 5) << 8) | input[ip]!
      ip += 1
    } else if ((tag & 3) === 2) {
      if (ip + 2 > input.length) return undefined
      len = (tag >>> 2) + 1
      offset = input[ip]! | (input[ip + 1]! << 8)
      ip += 2
    } else {
      if (ip + 4 > input.length) return undefined
      len = (tag >>> 2) + 1
      offset = u32(input, ip)
      ip += 4
    }
    if (offset === 0 || offset > op || op + len > length) return undefined
    for (let k = 0; k < len; k++, op++) out[op] = out[op - offset]!
  }
  return op === length ? out : undefined
}

/** Reads a file sequentially through a window, so that consecutive small reads cost one system call per MiB. */
class Reader {
  private window = Buffer.alloc(0)
  private from = 0
  constructor(
    private readonly file: FileHandle,
    readonly size: number
  ) {}
  /** `length` bytes at `offset` (fewer at the end of the file), valid until the next call. */
  async bytes(offset: number, length: number): Promise<Buffer> {
    const end = Math.min(offset + length, this.size)
    if (offset < this.from || end > this.from + this.window.length) {
      const want = Math.max(end - offset, WINDOW)
      const buffer = this.window.length >= want ? this.window : Buffer.allocUnsafe(want)
      const { bytesRead } = await this.file.read(buffer, 0, Math.min(want, this.size - offset), offset)
      this.window = buffer.subarray(0, bytesRead)
      this.from = offset
    }
    return this.window.subarray(offset - this.from, end - this.from)
  }
}
const WINDOW = 1024 * 1024

const isMissing = (e: unknown): boolean => (e as { code?: unknown } | undefined)?.code === "ENOENT"

/** Runs `f` on the open file; `"missing"` when the file does not exist (any more). */
const withFile = async <A>(path: string, f: (reader: Reader) => Promise<A>): Promise<A | "missing"> => {
  let file: FileHandle
  try {
    file = await open(path, "r")
  } catch (e) {
    if (isMissing(e)) return "missing"
    throw e
  }
  try {
    return await f(new Reader(file, (await file.stat()).size))
  } finally {
    await file.close()
  }
}

// ---------------------------------------------------------------------------
// Log files (write-ahead logs and the MANIFEST): 32 KiB blocks of checksummed records
// ---------------------------------------------------------------------------

const LOG_BLOCK = 32 * 1024
const LOG_HEADER = 7
const FULL = 1
const FIRST = 2
const MIDDLE = 3
const LAST = 4

interface LogScan {
  /** The first damage: where and what. */
  readonly damage?: { readonly offset: number; readonly what: string }
  /** A whole record begins after the damage: LevelDB would replay it without what the damage lost. */
  readonly recordsAfterDamage: boolean
}

/** Reads every record of a log file; `onRecord` receives each whole record (fragments joined). */
const scanLog = async (reader: Reader, onRecord?: (record: Uint8Array) => void): Promise<LogScan> => {
  let damage: { offset: number; what: string } | undefined
  let recordsAfterDamage = false
  let fragments: Array<Uint8Array> | undefined
  let fragmentAfterDamage = false
  const damaged = (offset: number, what: string) => {
    damage ??= { offset, what }
    fragments = undefined
  }
  const record = (afterDamage: boolean, parts: Array<Uint8Array>) => {
    if (damage !== undefined && afterDamage) recordsAfterDamage = true
    if (onRecord !== undefined && damage === undefined) onRecord(parts.length === 1 ? parts[0]! : Buffer.concat(parts))
  }
  for (let blockStart = 0; blockStart < reader.size; blockStart += LOG_BLOCK) {
    const block = await reader.bytes(blockStart, LOG_BLOCK)
    const lastBlock = blockStart + LOG_BLOCK >= reader.size
    let p = 0
    while (p < block.length) {
      if (block.length - p < LOG_HEADER) {
        // The writer pads a block's last few bytes with zeros; in the file's last block they are a header cut short.
        if (lastBlock) damaged(blockStart + p, "a record header cut short")
        break
      }
      const length = block[p + 4]! | (block[p + 5]! << 8)
      const type = block[p + 6]!
      const end = p + LOG_HEADER + length
      if (end > block.length) {
        damaged(blockStart + p, lastBlock ? "a record cut short" : "a record longer than its block")
        break
      }
      if (unmask(u32(block, p)) !== crc32c(block, p + 6, end)) {
        damaged(blockStart + p, "a record whose checksum does not match")
        break
      }
      const data = block.subarray(p + LOG_HEADER, end)
      // Copied: the reader's window is reused.
      const keep = () => (onRecord === undefined ? data : Uint8Array.from(data))
      if (type === FULL) {
        if (fragments !== undefined) damaged(blockStart + p, "a fragmented record without its end")
        record(true, [keep()])
      } else if (type === FIRST) {
        if (fragments !== undefined) damaged(blockStart + p, "a fragmented record without its end")
        fragments = [keep()]
        fragmentAfterDamage = damage !== undefined
      } else if (type === MIDDLE || type === LAST) {
        if (fragments === undefined) {
          damaged(blockStart + p, "a record fragment without its start")
        } else {
          fragments.push(keep())
          if (type === LAST) {
            record(fragmentAfterDamage, fragments)
            fragments = undefined
          }
        }
      } else {
        damaged(blockStart + p, `a record of unknown type ${type}`)
        break
      }
      p = end
    }
  }
  if (fragments !== undefined) damaged(reader.size, "a fragmented record cut short at the end")
  return damage === undefined ? { recordsAfterDamage } : { damage, recordsAfterDamage }
}

// ---------------------------------------------------------------------------
// The MANIFEST: which tables are live, which logs will be replayed
// ---------------------------------------------------------------------------

interface Manifest {
  /** Live table file numbers and their sizes. */
  readonly tables: Map<number, number>
  readonly logNumber: number
  readonly prevLogNumber: number
}

/** Applies the version edits of a MANIFEST; undefined when one cannot be read (LevelDB reports it itself). */
const readManifest = (records: ReadonlyArray<Uint8Array>): Manifest | undefined => {
  const files = new Map<string, { number: number; size: number }>()
  let logNumber = 0
  let prevLogNumber = 0
  for (const edit of records) {
    let p = 0
    const next = (): number | undefined => {
      const v = varint(edit, p)
      if (v === undefined) return undefined
      p = v[1]
      return v[0]
    }
    const skipSlice = (): boolean => {
      const len = next()
      if (len === undefined || p + len > edit.length) return false
      p += len
      return true
    }
    while (p < edit.length) {
      const tag = next()
      if (tag === 1) {
        if (!skipSlice()) return undefined
      } else if (tag === 2 || tag === 9) {
        const n = next()
        if (n === undefined) return undefined
        if (tag === 2) logNumber = n
        else prevLogNumber = n
      } else if (tag === 3 || tag === 4) {
        if (next() === undefined) return undefined
      } else if (tag === 5) {
        if (next() === undefined || !skipSlice()) return undefined
      } else if (tag === 6) {
        const level = next()
        const number = next()
        if (level === undefined || number === undefined) return undefined
        files.delete(`${level}:${number}`)
      } else if (tag === 7) {
        const level = next()
        const number = next()
        const size = next()
        if (level === undefined || number === undefined || size === undefined || !skipSlice() || !skipSlice())
          return undefined
        files.set(`${level}:${number}`, { number, size })
      } else {
        return undefined
      }
    }
  }
  return { tables: new Map([...files.values()].map((f) => [f.number, f.size])), logNumber, prevLogNumber }
}

// ---------------------------------------------------------------------------
// Tables
// ---------------------------------------------------------------------------

const FOOTER = 48
const TRAILER = 5
const MAGIC = Buffer.from([0x57, 0xfb, 0x80, 0x8b, 0x24, 0x75, 0x47, 0xdb])

interface Handle {
  readonly offset: number
  readonly size: number
}

const handleAt = (bytes: Uint8Array, at: number, end = bytes.length): readonly [Handle, number] | undefined => {
  const offset = varint(bytes, at, end)
  if (offset === undefined) return undefined
  const size = varint(bytes, offset[1], end)
  if (size === undefined) return undefined
  return [{ offset: offset[0], size: size[0] }, size[1]]
}

/** The block handles an index or metaindex block holds (its values); undefined when it is malformed. */
const blockValues = (block: Uint8Array): Array<Handle> | undefined => {
  if (block.length < 4) return undefined
  const restarts = u32(block, block.length - 4)
  const limit = block.length - 4 - 4 * restarts
  if (restarts === 0 || limit < 0) return undefined
  const out: Array<Handle> = []
  let p = 0
  while (p < limit) {
    const shared = varint(block, p, limit)
    const unshared = shared && varint(block, shared[1], limit)
    const valueLength = unshared && varint(block, unshared[1], limit)
    if (valueLength === undefined || unshared === undefined) return undefined
    const value = valueLength[1] + unshared[0]
    const end = value + valueLength[0]
    if (end > limit) return undefined
    const handle = handleAt(block, value, end)
    if (handle === undefined) return undefined
    out.push(handle[0])
    p = end
  }
  return out
}

/** Checks one table file; a description of the first problem, or undefined. */
const checkTable = async (reader: Reader, name: string, expectedSize: number): Promise<string | undefined> => {
  const size = reader.size
  if (size !== expectedSize) return `table ${name} is ${size} bytes, but the MANIFEST records ${expectedSize}`
  if (size < FOOTER) return `table ${name} is too short to be a table (${size} bytes)`
  const footerAt = size - FOOTER
  const footer = Uint8Array.from(await reader.bytes(footerAt, FOOTER))
  if (Buffer.compare(footer.subarray(40), MAGIC) !== 0) return `table ${name} has no table footer (bad magic number)`
  const metaindex = handleAt(footer, 0, 40)
  const index = metaindex && handleAt(footer, metaindex[1], 40)
  if (index === undefined || metaindex === undefined || footer.subarray(index[1], 40).some((b) => b !== 0)) {
    return `table ${name} has a damaged footer`
  }
  /** A block's contents once its checksum matches; a problem description otherwise. */
  const block = async (h: Handle, what: string): Promise<Uint8Array | string> => {
    if (h.offset + h.size + TRAILER > footerAt) return `table ${name}: the ${what} block lies outside the file`
    const bytes = await reader.bytes(h.offset, h.size + TRAILER)
    if (unmask(u32(bytes, h.size + 1)) !== crc32c(bytes, 0, h.size + 1)) {
      return `table ${name}: the ${what} block at offset ${h.offset} does not match its checksum`
    }
    const type = bytes[h.size]!
    if (type === 0) return Uint8Array.from(bytes.subarray(0, h.size))
    if (type === 1) return snappyUncompress(bytes.subarray(0, h.size)) ?? `table ${name}: the ${what} block is damaged`
    return `table ${name}: the ${what} block has an unknown compression type ${type}`
  }
  const indexBlock = await block(index[0], "index")
  if (typeof indexBlock === "string") return indexBlock
  const metaindexBlock = await block(metaindex[0], "metaindex")
  if (typeof metaindexBlock === "string") return metaindexBlock
  const data = blockValues(indexBlock)
  const meta = blockValues(metaindexBlock)
  if (data === undefined || meta === undefined) return `table ${name}: its index is damaged`
  // Data blocks, then meta blocks (the filter), the metaindex and the index, back to back up to the footer.
  const all = [...data, ...meta, metaindex[0], index[0]].sort((a, b) => a.offset - b.offset)
  let at = 0
  for (const h of all) {
    if (h.offset !== at) return `table ${name}: its blocks do not cover the file (a gap or an overlap at ${at})`
    at = h.offset + h.size + TRAILER
  }
  if (at !== footerAt) return `table ${name}: its blocks do not cover the file (they end at ${at})`
  for (const h of [...data, ...meta]) {
    const bytes = await reader.bytes(h.offset, h.size + TRAILER)
    if (unmask(u32(bytes, h.size + 1)) !== crc32c(bytes, 0, h.size + 1)) {
      return `table ${name}: the block at offset ${h.offset} does not match its checksum`
    }
  }
  return undefined
}

// ---------------------------------------------------------------------------
// The directory
// ---------------------------------------------------------------------------

const fileNumber = (n: number) => String(n).padStart(6, "0")

/**
 * Checks the LevelDB database in `directory` (which has a `CURRENT`) as described in the module comment: the first
 * problem found, described with the file it is in, or undefined when every file LevelDB will read is whole.
 */
export const check = async (directory: string, names: ReadonlyArray<string>): Promise<string | undefined> => {
  const current = await withFile(join(directory, "CURRENT"), (r) => r.bytes(0, 256).then((b) => b.toString("latin1")))
  if (current === "missing") return undefined
  const manifestName = /^(MANIFEST-\d+)\n$/.exec(current)?.[1]
  if (manifestName === undefined) return `CURRENT does not name a MANIFEST (${JSON.stringify(current.slice(0, 40))})`
  const records: Array<Uint8Array> = []
  const scanned = await withFile(join(directory, manifestName), (r) => scanLog(r, (record) => records.push(record)))
  // A MANIFEST missing or damaged: LevelDB reports it as it opens.
  if (scanned === "missing" || (scanned.damage !== undefined && scanned.recordsAfterDamage)) return undefined
  const manifest = readManifest(records)
  if (manifest === undefined) return undefined

  for (const [number, size] of [...manifest.tables].sort(([a], [b]) => a - b)) {
    const name = names.find((n) => n === `${fileNumber(number)}.ldb` || n === `${fileNumber(number)}.sst`)
    // A missing table LevelDB reports itself.
    if (name === undefined) continue
    const problem = await withFile(join(directory, name), (r) => checkTable(r, name, size))
    if (problem !== "missing" && problem !== undefined) return problem
  }

  const logs = names
    .map((n) => /^(\d+)\.log$/.exec(n))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => ({ name: m[0], number: Number(m[1]) }))
    .filter((l) => l.number >= manifest.logNumber || l.number === manifest.prevLogNumber)
    .sort((a, b) => a.number - b.number)
  for (const [i, log] of logs.entries()) {
    const scan = await withFile(join(directory, log.name), (r) => scanLog(r))
    if (scan === "missing" || scan.damage === undefined) continue
    const newest = i === logs.length - 1
    if (newest && !scan.recordsAfterDamage) continue
    return (
      `write-ahead log ${log.name} has ${scan.damage.what} at offset ${scan.damage.offset}, ` +
      (scan.recordsAfterDamage
        ? "with batches after it that LevelDB would replay without the ones lost"
        : "and newer logs that LevelDB would replay after it")
    )
  }
  return undefined
}
