/**
 * A TCP proxy on loopback for tests that cut a client off from a real server: `stall` stops every byte both
 * ways (the connections stay open, as in a network partition or a paused peer), `resume` lets them flow again,
 * `dropAll` resets every connection (the client reconnects through the proxy).
 *
 * Bytes are forwarded by hand, not with `pipe`: a piped source resumes itself when its destination drains, so a
 * stalled connection that had a write outstanding (a large fetch answer, say) would start flowing again by itself.
 * Here nothing is written while the proxy is stalled; a chunk read meanwhile is held and written at `resume`.
 * Closes still pass through while stalled (a side that closes or resets closes the other).
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
  /** Whether it is stalled now. */
  readonly stalled: () => boolean
  /** Resets every open connection. */
  readonly dropAll: () => void
  /** How many connections are open through it. */
  readonly connections: () => number
  readonly close: () => Promise<void>
}

/** One direction of a connection: bytes read from `from` are written to `to` unless the proxy is stalled. */
interface Direction {
  readonly from: net.Socket
  readonly to: net.Socket
  /** Chunks read while stalled, written at `resume`. */
  readonly held: Array<Buffer>
  /** `to` refused more (its buffer is full): `from` is read again at its `drain`. */
  waitingDrain: boolean
}

/** Starts a proxy to `target` (`host:port`) on an ephemeral loopback port. */
export const startProxy = (target: string): Promise<TcpProxy> => {
  const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))]
  const pairs = new Set<{
    readonly client: net.Socket
    readonly upstream: net.Socket
    readonly ways: Array<Direction>
  }>()
  let stalled = false

  const flow = (d: Direction) => {
    while (d.held.length > 0 && !d.waitingDrain) {
      if (!d.to.write(d.held.shift()!)) d.waitingDrain = true
    }
    if (!d.waitingDrain) d.from.resume()
  }
  const direction = (from: net.Socket, to: net.Socket): Direction => {
    const d: Direction = { from, to, held: [], waitingDrain: false }
    from.on("data", (chunk: Buffer) => {
      if (stalled || d.waitingDrain) {
        // Read before the pause took hold: kept for `resume`, in order.
        d.held.push(chunk)
        from.pause()
        return
      }
      if (!to.write(chunk)) {
        d.waitingDrain = true
        from.pause()
      }
    })
    to.on("drain", () => {
      d.waitingDrain = false
      if (!stalled) flow(d)
    })
    return d
  }

  const server = net.createServer((client) => {
    const upstream = net.connect({ host, port })
    const ways = [direction(client, upstream), direction(upstream, client)]
    const pair = { client, upstream, ways }
    pairs.add(pair)
    if (stalled) for (const d of ways) d.from.pause()
    const drop = () => {
      pairs.delete(pair)
      client.destroy()
      upstream.destroy()
    }
    // A side that closes closes the other once what was written to it is out (at once while stalled: what is
    // held is lost with the connection); an error resets both.
    const closed = (other: net.Socket) => () => {
      pairs.delete(pair)
      if (stalled) other.destroy()
      else other.destroySoon()
    }
    client.on("error", drop)
    upstream.on("error", drop)
    client.on("close", closed(upstream))
    upstream.on("close", closed(client))
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
          for (const { ways } of pairs) for (const d of ways) d.from.pause()
        },
        resume: () => {
          stalled = false
          for (const { ways } of [...pairs]) for (const d of ways) flow(d)
        },
        stalled: () => stalled,
        dropAll: () => {
          for (const pair of [...pairs]) {
            pair.client.resetAndDestroy()
            pair.upstream.destroy()
          }
          pairs.clear()
        },
        connections: () => pairs.size,
        close: () =>
          new Promise<void>((done) => {
            for (const { client, upstream } of [...pairs]) {
              client.destroy()
              upstream.destroy()
            }
            pairs.clear()
            server.close(() => done())
          })
      })
    })
  })
}
