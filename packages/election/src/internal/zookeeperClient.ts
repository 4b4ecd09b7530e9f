/**
 * node-zookeeper-client's clients as the ZooKeeper backend opens and closes
 * them, and the driver's error codes.
 *
 * @internal
 */
import { createHash } from "node:crypto"
import { Coordination } from "@strata/core"
import { Effect, Redacted } from "effect"
import zookeeper, { type ACL, type Client } from "node-zookeeper-client"

/** The driver's error codes the backend tells apart. */
export const Codes = {
  CONNECTION_LOSS: -4,
  BAD_ARGUMENTS: -8,
  NO_NODE: -101,
  NO_AUTH: -102,
  BAD_VERSION: -103,
  NO_CHILDREN_FOR_EPHEMERALS: -108,
  NODE_EXISTS: -110,
  NOT_EMPTY: -111,
  SESSION_EXPIRED: -112,
  RUNTIME_INCONSISTENCY: -2
} as const

/** The driver's error code of `error`, if it has one. */
export const codeOf = (error: unknown): number | undefined =>
  typeof error === "object" && error !== null && "getCode" in error && typeof error.getCode === "function"
    ? (error.getCode() as number)
    : undefined

/**
 * How a session identifies itself and what it puts on the nodes it creates: with digest credentials, every node is
 * writable by that identity only (and readable by anyone when `worldReadable`); without, by anyone (ZooKeeper's
 * `OPEN_ACL_UNSAFE`, the client's default).
 */
export interface Access {
  /** `user:password` for the `digest` scheme; absent: no credentials. */
  readonly digest: Redacted.Redacted<string> | undefined
  /** The ACL of every node created. */
  readonly acls: Array<ACL>
}

/** Anyone may do anything: ZooKeeper's `OPEN_ACL_UNSAFE`. */
const OPEN: Array<ACL> = [new zookeeper.ACL(zookeeper.Permission.ALL, new zookeeper.Id("world", "anyone"))]

/** The access of sessions with `credentials` (none: open nodes), their nodes readable by anyone or by them only. */
export const access = (
  credentials: { readonly username: string; readonly password: Redacted.Redacted<string> } | undefined,
  worldReadable: boolean
): Access => {
  if (credentials === undefined) return { digest: undefined, acls: OPEN }
  const secret = Redacted.value(credentials.password)
  // The digest scheme's id: user:base64(sha1(user:password)), as ZooKeeper's DigestAuthenticationProvider makes it.
  const hashed = createHash("sha1").update(`${credentials.username}:${secret}`).digest("base64")
  const owner = new zookeeper.ACL(
    zookeeper.Permission.ALL,
    new zookeeper.Id("digest", `${credentials.username}:${hashed}`)
  )
  const readers = worldReadable
    ? [new zookeeper.ACL(zookeeper.Permission.READ, new zookeeper.Id("world", "anyone"))]
    : []
  return { digest: Redacted.make(`${credentials.username}:${secret}`), acls: [owner, ...readers] }
}

/** Opens a client and waits until it is connected (or fails within `connectTimeoutMs`). */
export const connect = (
  connectString: string,
  options: { readonly sessionTimeout: number; readonly sessionId?: Buffer; readonly sessionPassword?: Buffer },
  connectTimeoutMs: number,
  digest?: Redacted.Redacted<string>
): Effect.Effect<Client, Coordination.CoordinationError> =>
  Effect.callback<Client, Coordination.CoordinationError>((resume) => {
    const client = zookeeper.createClient(connectString, { ...options, spinDelay: 100, retries: 0 })
    if (digest !== undefined) client.addAuthInfo("digest", Buffer.from(Redacted.value(digest)))
    let settled = false
    const finish = (effect: Effect.Effect<Client, Coordination.CoordinationError>) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      client.removeListener("state", onState)
      resume(effect)
    }
    const onState = (state: unknown) => {
      if (state === zookeeper.State.SYNC_CONNECTED || state === zookeeper.State.CONNECTED_READ_ONLY) {
        finish(Effect.succeed(client))
      } else if (state === zookeeper.State.EXPIRED || state === zookeeper.State.AUTH_FAILED) {
        client.close()
        finish(
          Effect.fail(
            Coordination.coordinationError(
              new Coordination.Unreachable({ address: connectString, detail: `session ${String(state)}` })
            )
          )
        )
      }
    }
    const timer = setTimeout(() => {
      client.close()
      finish(
        Effect.fail(
          Coordination.coordinationError(
            new Coordination.Unreachable({
              address: connectString,
              detail: `not connected after ${connectTimeoutMs} ms`
            })
          )
        )
      )
    }, connectTimeoutMs)
    client.on("state", onState)
    client.connect()
    return Effect.sync(() => {
      if (!settled) {
        settled = true
        clearTimeout(timer)
        client.close()
      }
    })
  })

/** Closes a client and waits (briefly) for the server to end its session. */
export const closeClient = (client: Client): Effect.Effect<void> =>
  Effect.callback<void>((resume) => {
    const timer = setTimeout(() => resume(Effect.void), 2000)
    client.once("disconnected", () => {
      clearTimeout(timer)
      resume(Effect.void)
    })
    try {
      client.close()
    } catch {
      clearTimeout(timer)
      resume(Effect.void)
    }
  })
