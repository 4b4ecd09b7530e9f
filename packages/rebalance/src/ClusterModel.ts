/**
 * What the planner plans over: the servers (with their rack and tags) and the tablets (with their replicas, leader
 * and size). The controller describes its cluster this way; a test or a what-if builds one by hand.
 *
 * @since 0.1.0
 */
import { Models } from "@strata/core"
import { Schema } from "effect"

/**
 * A server's tag: `draining` (leaving for good: it must end with nothing) or `excluded` (it keeps what it holds
 * but takes nothing new).
 */
export const Tag = Schema.Literals(["draining", "excluded"])
/** @see Tag */
export type Tag = typeof Tag.Type

/** One server. */
export const Server = Schema.Struct({
  id: Models.ServerId,
  /** Its rack: no two replicas of a tablet share one when there are racks enough. Without it, a rack of its own. */
  rack: Schema.optional(Schema.NonEmptyString),
  tags: Schema.optional(Schema.Array(Tag))
}).annotate({ identifier: "Server" })
/** @see Server */
export type Server = typeof Server.Type

/** One tablet: its replicas in assignment order (the first is the preferred leader), its leader and size. */
export const Tablet = Schema.Struct({
  tablet: Models.TabletId,
  replicas: Schema.Array(Models.ServerId).check(Schema.isMinLength(1)),
  /** The replica leading it now, if any. */
  leader: Schema.optional(Schema.NullOr(Models.ServerId)),
  /** Its size in bytes (what a move copies); 0 when unknown. */
  sizeBytes: Schema.optional(Schema.Number.check(Schema.isGreaterThanOrEqualTo(0), Schema.isFinite()))
}).annotate({ identifier: "Tablet" })
/** @see Tablet */
export type Tablet = typeof Tablet.Type

/**
 * A cluster: every server a tablet's replica names is listed, no server twice, no tablet twice, no tablet with a
 * server twice among its replicas.
 *
 * @since 0.1.0
 */
export const ClusterModel = Schema.Struct({
  servers: Schema.Array(Server),
  tablets: Schema.Array(Tablet)
})
  .check(
    Schema.makeFilter((m) => {
      const issues: Array<{ readonly path: ReadonlyArray<PropertyKey>; readonly issue: string }> = []
      const ids = new Set<number>()
      m.servers.forEach((s, i) => {
        if (ids.has(s.id)) issues.push({ path: ["servers", i, "id"], issue: `server ${s.id} is listed twice` })
        ids.add(s.id)
      })
      const tablets = new Set<string>()
      m.tablets.forEach((t, i) => {
        const key = Models.tabletKey(t.tablet)
        if (tablets.has(key)) issues.push({ path: ["tablets", i, "tablet"], issue: `tablet ${key} is listed twice` })
        tablets.add(key)
        const seen = new Set<number>()
        t.replicas.forEach((r, k) => {
          if (!ids.has(r))
            issues.push({ path: ["tablets", i, "replicas", k], issue: `tablet ${key}: server ${r} is not in servers` })
          if (seen.has(r))
            issues.push({ path: ["tablets", i, "replicas", k], issue: `tablet ${key}: server ${r} is a replica twice` })
          seen.add(r)
        })
        if (t.leader !== undefined && t.leader !== null && !seen.has(t.leader))
          issues.push({
            path: ["tablets", i, "leader"],
            issue: `tablet ${key}: leader ${t.leader} is not one of its replicas`
          })
      })
      return issues.length === 0 ? undefined : issues
    })
  )
  .annotate({ identifier: "ClusterModel" })
/** @see ClusterModel */
export type ClusterModel = typeof ClusterModel.Type

/** Whether `server` carries `tag`. */
export const hasTag = (server: Server, tag: Tag): boolean => server.tags?.includes(tag) === true
