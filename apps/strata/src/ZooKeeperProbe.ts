/**
 * What answers at a ZooKeeper address, asked once a session could not be opened there: ZooKeeper's own handshake
 * (a `ConnectRequest`) is sent on a plain TCP connection and the answer read. A ZooKeeper server answers with a
 * `ConnectResponse` (its session, closed again at once); anything else — a connection closed on the handshake (Kafka
 * does that), bytes that are no `ConnectResponse`, silence — is something that is not ZooKeeper; a refused
 * connection is nothing listening.
 *
 * @since 0.1.0
 */
import { connect } from "node:net"
import { HostPort } from "@strata/core"
import { Effect } from "effect"

/**
 * What answered at an address.
 *
 * @since 0.1.0
 */
export type Answer =
  | { readonly _tag: "ZooKeeper" }
  /** Something accepted the connection but did not answer as ZooKeeper does; `detail` says how. */
  | { readonly _tag: "NotZooKeeper"; readonly detail: string }
  /** No connection could be made. */
  | { readonly _tag: "NoConnection"; readonly detail: string }

/** ZooKeeper's `ConnectRequest` (no read-only flag), length-prefixed: a new session of `timeoutMs`. */
const connectRequest = (timeoutMs: number): Buffer => {
  const body = Buffer.alloc(44)
  body.writeInt32BE(0, 0) // protocolVersion
  body.writeBigInt64BE(0n, 4) // lastZxidSeen
  body.writeInt32BE(timeoutMs, 12) // timeOut
  body.writeBigInt64BE(0n, 16) // sessionId
  body.writeInt32BE(16, 24) // passwd: 16 zero bytes
  const packet = Buffer.alloc(4 + body.length)
  packet.writeInt32BE(body.length, 0)
  body.copy(packet, 4)
  return packet
}

/** The request that closes the session just opened (xid 1, `closeSession`). */
const closeSession = (): Buffer => {
  const packet = Buffer.alloc(12)
  packet.writeInt32BE(8, 0)
  packet.writeInt32BE(1, 4)
  packet.writeInt32BE(-11, 8)
  return packet
}

/** A `ConnectResponse`'s length: protocolVersion, timeOut, sessionId, a 16-byte passwd, and maybe a read-only flag. */
const isConnectResponse = (length: number, body: Buffer): boolean =>
  (length === 36 || length === 37) && body.readInt32BE(0) === 0 && body.readInt32BE(16) === 16

/**
 * Asks `host:port` for a ZooKeeper session and says what answered, within `timeoutMs`.
 *
 * @since 0.1.0
 */
export const probe = (hostPort: string, timeoutMs = 3_000): Effect.Effect<Answer> =>
  Effect.callback<Answer>((resume) => {
    const target = HostPort.parse(hostPort)
    if (target === undefined) {
      resume(Effect.succeed({ _tag: "NoConnection", detail: `${hostPort}: ${HostPort.invalid(hostPort)}` }))
      return
    }
    const socket = connect(target)
    let connected = false
    let received = Buffer.alloc(0)
    let settled = false
    const finish = (answer: Answer) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      socket.destroy()
      resume(Effect.succeed(answer))
    }
    const timer = setTimeout(
      () =>
        finish(
          connected
            ? {
                _tag: "NotZooKeeper",
                detail:
                  received.length === 0
                    ? `it accepted the connection but did not answer ZooKeeper's handshake within ${timeoutMs} ms`
                    : `it answered ZooKeeper's handshake with ${received.length} bytes that are not ZooKeeper's answer`
              }
            : { _tag: "NoConnection", detail: `no connection within ${timeoutMs} ms` }
        ),
      timeoutMs
    )
    socket.on("connect", () => {
      connected = true
      socket.write(connectRequest(timeoutMs))
    })
    socket.on("data", (chunk: Buffer) => {
      received = Buffer.concat([received, chunk])
      if (received.length < 4) return
      const length = received.readInt32BE(0)
      if (length !== 36 && length !== 37) {
        finish({
          _tag: "NotZooKeeper",
          detail: `it answered ZooKeeper's handshake with bytes that are not ZooKeeper's answer (0x${received.subarray(0, 8).toString("hex")}…)`
        })
        return
      }
      if (received.length < 4 + length) return
      if (!isConnectResponse(length, received.subarray(4))) {
        finish({
          _tag: "NotZooKeeper",
          detail: "it answered ZooKeeper's handshake with bytes that are not ZooKeeper's answer"
        })
        return
      }
      // A session was opened for the question: close it rather than leave it to expire.
      settled = true
      clearTimeout(timer)
      socket.end(closeSession())
      setTimeout(() => socket.destroy(), 1_000).unref()
      resume(Effect.succeed({ _tag: "ZooKeeper" }))
    })
    socket.on("error", (e: NodeJS.ErrnoException) => {
      if (!connected) finish({ _tag: "NoConnection", detail: e.code ?? e.message })
      else
        finish({
          _tag: "NotZooKeeper",
          detail: `it broke the connection on ZooKeeper's handshake (${e.code ?? e.message})`
        })
    })
    socket.on("close", () => {
      if (connected) finish({ _tag: "NotZooKeeper", detail: "it closed the connection on ZooKeeper's handshake" })
      else finish({ _tag: "NoConnection", detail: "connection closed" })
    })
    return Effect.sync(() => {
      if (!settled) {
        settled = true
        clearTimeout(timer)
        socket.destroy()
      }
    })
  })
