/**
 * A small filesystem for full-disk tests: a tmpfs of a few MiB mounted over a directory (which needs root, as CI
 * runs the tests), and a file that fills it to the last byte.
 */
import { execFileSync } from "node:child_process"
import { closeSync, mkdirSync, openSync, writeSync } from "node:fs"
import { Effect, type Scope } from "effect"

/** Mounts a tmpfs of `mib` MiB at `directory` (created if missing); unmounted as the scope closes. */
export const smallFilesystem = (directory: string, mib: number): Effect.Effect<void, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => {
      mkdirSync(directory, { recursive: true })
      try {
        execFileSync("mount", ["-t", "tmpfs", "-o", `size=${mib}m`, "tmpfs", directory], { stdio: "pipe" })
      } catch (e) {
        throw new Error(`mounting a ${mib} MiB tmpfs at ${directory} (full-disk tests need root): ${String(e)}`)
      }
    }),
    () => Effect.sync(() => execFileSync("umount", ["-l", directory], { stdio: "pipe" }))
  )

/** Fills the filesystem of `file`'s directory with `file` until it refuses a byte (ENOSPC); its size. */
export const fill = (file: string): number => {
  const fd = openSync(file, "w")
  const chunk = Buffer.alloc(256 * 1024, 7)
  let written = 0
  try {
    while (true) {
      try {
        written += writeSync(fd, chunk)
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === "ENOSPC") break
        throw e
      }
    }
    // What is left under a whole chunk, in smaller pieces down to single bytes.
    for (const size of [16_384, 1_024, 1]) {
      while (true) {
        try {
          written += writeSync(fd, chunk, 0, size)
        } catch {
          break
        }
      }
    }
  } finally {
    closeSync(fd)
  }
  return written
}
