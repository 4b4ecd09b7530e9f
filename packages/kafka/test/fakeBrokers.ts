/**
 * TCP servers for tests of bad broker addresses: ports that are not Kafka, and a proxy in front of the real broker
 * that can stop answering (a hung broker) while keeping every connection open.
 */
import * as net from "node:net"
import { Effect, type Scope } from "effect"

/** A listening server on 127.0.0.1 and its address; closed (with its connections) with the scope. */
export interface Listening {
  readonly address: string
  readonly port: number
}

/** Starts a TCP server on a free loopback port with this connection handler. */
export const tcpServer = (onConnection: (socket: net.Socket) => void): Effect.Effect<Listening, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.callback<{ server: net.Server; sockets: Set<net.Socket>; port: number }>((resume) => {
      const sockets = new Set<net.Socket>()
      const server = net.createServer((socket) => {
        sockets.add(socket)
        socket.on("error", () => undefined)
        socket.on("close", () => sockets.delete(socket))
        onConnection(socket)
      })
      server.listen(0, "127.0.0.1", () => {
        const { port } = server.address() as net.AddressInfo
        resume(Effect.succeed({ server, sockets, port }))
      })
    }),
    ({ server, sockets }) =>
      Effect.callback<void>((resume) => {
        for (const s of sockets) s.destroy()
        server.close(() => resume(Effect.void))
      })
  ).pipe(Effect.map(({ port }) => ({ address: `127.0.0.1:${port}`, port })))

/** Accepts connections and never writes a byte. */
export const silentServer = tcpServer(() => undefined)

/** Answers the first bytes it reads with an HTTP error, then closes the connection (or keeps it open). */
export const httpServer = (options: { readonly close: boolean }) =>
  tcpServer((socket) => {
    socket.once("data", () => {
      const reply = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
      if (options.close) socket.end(reply)
      else socket.write(reply)
    })
  })

/** Reads size-prefixed Kafka frames off a stream of chunks. */
const framer = (onFrame: (frame: Buffer) => void) => {
  let buffered = Buffer.alloc(0)
  return (chunk: Buffer) => {
    buffered = Buffer.concat([buffered, chunk])
    while (buffered.length >= 4) {
      const size = buffered.readInt32BE(0)
      if (buffered.length < 4 + size) return
      onFrame(buffered.subarray(0, 4 + size))
      buffered = buffered.subarray(4 + size)
    }
  }
}

/** A proxy in front of a Kafka broker whose `freeze` makes it stop answering; see `kafkaProxy`. */
export interface KafkaProxy extends Listening {
  /** From now on requests are swallowed: connections stay open, nothing is answered. */
  readonly freeze: () => void
}

/**
 * A proxy to a Kafka broker that advertises itself in the broker's place: in every response the broker's own
 * address (its host string followed by its port as an int32, as Metadata and FindCoordinator carry it) is rewritten
 * to the proxy's port, so clients send everything through the proxy. With `only`, requests of other API keys are
 * swallowed from the start (a broker that answers the handshake and nothing else).
 */
export const kafkaProxy = (
  broker: string,
  options: { readonly only?: ReadonlyArray<number> } = {}
): Effect.Effect<KafkaProxy, never, Scope.Scope> =>
  Effect.gen(function* () {
    const [host, port] = [broker.slice(0, broker.lastIndexOf(":")), Number(broker.slice(broker.lastIndexOf(":") + 1))]
    let frozen = false
    let proxyPort = 0
    const advertised = Buffer.concat([
      Buffer.from(host),
      Buffer.from([port >>> 24, (port >>> 16) & 255, (port >>> 8) & 255, port & 255])
    ])
    const listening = yield* tcpServer((client) => {
      const upstream = net.createConnection({ host, port })
      upstream.on("error", () => client.destroy())
      client.on("close", () => upstream.destroy())
      upstream.on("close", () => client.destroy())
      client.on(
        "data",
        framer((frame) => {
          if (frozen) return
          if (options.only !== undefined && !options.only.includes(frame.readInt16BE(4))) return
          upstream.write(frame)
        })
      )
      upstream.on(
        "data",
        framer((frame) => {
          if (frozen) return
          const copy = Buffer.from(frame)
          for (let at = copy.indexOf(advertised); at >= 0; at = copy.indexOf(advertised, at + 1)) {
            copy.writeInt32BE(proxyPort, at + host.length)
          }
          client.write(copy)
        })
      )
    })
    proxyPort = listening.port
    return {
      ...listening,
      freeze: () => {
        frozen = true
      }
    }
  })
