import { execFile } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { RocksLevel } from "@nxtedition/rocksdb"
import { describe, expect, it } from "vitest"
import type { NativeBatch } from "../src/internal/levelDb.js"
import { startRocksWriter } from "../src/internal/rocksWriter.js"

const root = mkdtempSync(join(tmpdir(), "strata-rocks-writer-"))
const binding = createRequire(import.meta.url).resolve("@nxtedition/rocksdb")
const key = (s: string) => Buffer.from(s)

const open = async (name: string) => {
  const db = new RocksLevel(join(root, name), { keyEncoding: "buffer", valueEncoding: "buffer" })
  await db.open({ createIfMissing: true })
  return db
}

describe("RocksDB writer thread", () => {
  it("writes batches in the order posted, each visible to a read once it resolves", async () => {
    const db = await open("order")
    const writer = await startRocksWriter(db.handle, binding)
    const resolved: Array<number> = []
    const seen: Array<boolean> = []
    // 300 writes posted at once, without waiting: same key, and a key of their own.
    await Promise.all(
      Array.from({ length: 300 }, (_, i) =>
        writer
          .write(
            (b: NativeBatch) => {
              b._put(key("same"), Buffer.from(`${i}`))
              b._put(key(`own-${i}`), Buffer.alloc(i * 37, i % 251))
            },
            { sync: false }
          )
          .then(async () => {
            resolved.push(i)
            seen[i] = (await db.get(key(`own-${i}`))).equals(Buffer.alloc(i * 37, i % 251))
          })
      )
    )
    expect(resolved).toEqual(Array.from({ length: 300 }, (_, i) => i))
    expect(seen).toEqual(resolved.map(() => true))
    expect((await db.get(key("same"))).toString()).toBe("299")
    // A delete in the same batch as a put of another key: both land.
    await writer.write(
      (b) => {
        b._del(key("same"))
        b._put(key("after"), Buffer.from("x"))
      },
      { sync: true }
    )
    await expect(db.get(key("same"))).rejects.toMatchObject({ code: "LEVEL_NOT_FOUND" })
    expect((await db.get(key("after"))).toString()).toBe("x")
    // Batches larger than the posted buffer (256 KiB) grow it; one past the size kept for reuse (4 MiB) too.
    for (const size of [3, 5, 1]) {
      await writer.write((b) => b._put(key(`big-${size}`), Buffer.alloc(size * 1024 * 1024, size)), { sync: false })
    }
    for (const size of [3, 5, 1]) {
      expect((await db.get(key(`big-${size}`))).equals(Buffer.alloc(size * 1024 * 1024, size))).toBe(true)
    }
    await writer.close()
    await db.close()
  })

  it("writes that gather while the worker writes land together; one whose fill throws adds nothing", async () => {
    const db = await open("group")
    const writer = await startRocksWriter(db.handle, binding)
    // The first is posted at once; the rest gather behind it.
    const first = writer.write((b) => b._put(key("first"), Buffer.alloc(2 * 1024 * 1024, 1)), { sync: false })
    const before = writer.write((b) => b._put(key("before"), Buffer.from("b")), { sync: false })
    expect(() =>
      writer.write(
        (b) => {
          b._put(key("partial"), Buffer.from("p"))
          throw new Error("fill failed")
        },
        { sync: false }
      )
    ).toThrow(/fill failed/)
    const after = writer.write((b) => b._put(key("after"), Buffer.from("a")), { sync: true })
    await Promise.all([first, before, after])
    expect((await db.get(key("before"))).toString()).toBe("b")
    expect((await db.get(key("after"))).toString()).toBe("a")
    await expect(db.get(key("partial"))).rejects.toMatchObject({ code: "LEVEL_NOT_FOUND" })
    await writer.close()
    await db.close()
  })

  it("close lets the writes already posted land, then refuses new ones", async () => {
    const db = await open("close")
    const writer = await startRocksWriter(db.handle, binding)
    // Synced writes (an fsync each): most are still queued at the worker when close is called.
    const writes = Array.from({ length: 100 }, (_, i) =>
      writer.write((b) => b._put(key(`k${i}`), Buffer.alloc(4096, i)), { sync: true })
    )
    const closed = writer.close()
    await Promise.all(writes)
    await closed
    await expect(writer.write((b) => b._put(key("late"), Buffer.from("x")), { sync: false })).rejects.toThrow(/closed/)
    await db.close()
    const again = await open("close")
    for (let i = 0; i < 100; i++) expect((await again.get(key(`k${i}`))).equals(Buffer.alloc(4096, i))).toBe(true)
    await expect(again.get(key("late"))).rejects.toMatchObject({ code: "LEVEL_NOT_FOUND" })
    await again.close()
  })

  it("an idle writer does not keep the process alive", async () => {
    const script = fileURLToPath(new URL("./fixtures/idleWriter.ts", import.meta.url))
    const tsx = fileURLToPath(new URL("../../../node_modules/.bin/tsx", import.meta.url))
    const directory = join(root, "idle")
    const out = await new Promise<{ code: number | null; text: string }>((resolve) => {
      const child = execFile(tsx, ["--conditions=@strata/source", script, directory], { timeout: 30_000 }, (_e, o, e) =>
        resolve({ code: child.exitCode, text: `${o}${e}`.trim() })
      )
    })
    // The child wrote, never closed the store, and still exited by itself (the timeout would kill it otherwise).
    expect(out).toEqual({ code: 0, text: "written" })
  }, 40_000)
})

process.on("exit", () => rmSync(root, { recursive: true, force: true }))
