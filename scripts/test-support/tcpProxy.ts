/**
 * A TCP proxy on loopback for tests that cut a client off from a real server: `stall` stops every byte both
 * ways (the connections stay open, as in a network partition or a paused peer), `resume` lets them flow again,
 * `dropAll` resets every connection (the client reconnects through the proxy).
 */
import net from "node:net"

/** A running proxy. */
export interface TcpProxy {
  /** The `host:port` clients connect to. */
  readonly address: string
  readonly port: number
  /** Holds every byte, both ways, on every connection (new ones too) until `resume`. */
  readonly stall: () => void
  readonly resume: () => void
  /** Resets every open connection. */
  readonly dropAll: () => void
  readonly close: () => Promise<void>
}

/** Starts a proxy to `target` (`host:port`) on an ephemeral loopback port. */
export const startProxy = (target: string): Promise<TcpProxy> => {
  const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))]
  const pairs = new Set<readonly [net.Socket, net.Socket]>()
  let stalled = false
  const server = net.createServer((client) => {
    const upstream = net.connect({ host, port })
    const pair = [client, upstream] as const
    pairs.add(pair)
    client.pipe(upstream)
    upstream.pipe(client)
    if (stalled) {
      client.pause()
      upstream.pause()
    }
    const drop = () => {
      pairs.delete(pair)
      client.destroy()
      upstream.destroy()
    }
    client.on("error", drop)
    upstream.on("error", drop)
    client.on("close", drop)
    upstream.on("close", drop)
  })
  return new Promise((resolve, reject) => {
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      if (address === null || typeof address === "string") return reject(new Error("no port"))
      resolve({
        address: `127.0.0.1:${address.port}`,
        port: address.port,
        stall: () => {
          stalled = true
          for (const [a, b] of pairs) {
            a.pause()
            b.pause()
          }
        },
        resume: () => {
          stalled = false
          for (const [a, b] of pairs) {
            a.resume()
            b.resume()
          }
        },
        dropAll: () => {
          for (const [a, b] of [...pairs]) {
            a.resetAndDestroy()
            b.destroy()
          }
          pairs.clear()
        },
        close: () =>
          new Promise<void>((done) => {
            for (const [a, b] of [...pairs]) {
              a.destroy()
              b.destroy()
            }
            server.close(() => done())
          })
      })
    })
  })
}
