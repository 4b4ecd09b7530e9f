/**
 * The path rules every `Coordination` backend enforces (ZooKeeper's), shared so
 * that memory, ZooKeeper and etcd reject the same paths with the same error.
 *
 * @since 0.1.0
 */
import * as Coordination from "./Coordination.js"

/** Characters ZooKeeper refuses in a path. */
const isForbiddenChar = (c: number): boolean =>
  c === 0 ||
  (c > 0x00 && c <= 0x1f) ||
  (c >= 0x7f && c <= 0x9f) ||
  (c >= 0xd800 && c <= 0xf8ff) ||
  (c >= 0xfff0 && c <= 0xffff)

/**
 * Why a path is invalid, if it is: it must be absolute, without empty, `.` or
 * `..` segments, forbidden characters or a trailing slash. For sequential
 * creates the path may end in `/` (the suffix becomes the whole name), so
 * `path + "0"` is checked.
 */
export const invalidPath = (path: string, sequential = false): Coordination.InvalidPath | undefined => {
  const invalid = (detail: string) => new Coordination.InvalidPath({ path, detail })
  if (typeof path !== "string" || path.length === 0) return invalid("path is empty")
  const p = sequential ? `${path}0` : path
  if (p.charCodeAt(0) !== 0x2f) return invalid("path must start with /")
  if (p.length === 1) return undefined
  if (p.endsWith("/")) return invalid("path must not end with /")
  for (let i = 0; i < p.length; i++) {
    if (isForbiddenChar(p.charCodeAt(i))) return invalid(`invalid character at index ${i}`)
  }
  for (const segment of p.slice(1).split("/")) {
    if (segment.length === 0) return invalid("empty segment")
    if (segment === "." || segment === "..") return invalid("relative segment")
  }
  return undefined
}

/** The parent of an absolute path (`/` for top-level nodes). */
export const parentOf = (path: string): string => {
  const i = path.lastIndexOf("/")
  return i <= 0 ? "/" : path.slice(0, i)
}

/** The last segment of a path. */
export const nameOf = (path: string): string => path.slice(path.lastIndexOf("/") + 1)

/** A child's path under a parent. */
export const join = (parent: string, name: string): string => (parent === "/" ? `/${name}` : `${parent}/${name}`)
