/**
 * Checks that a broker address speaks Kafka before the client is let loose on it: one ApiVersions v0 request over a
 * socket of its own, which every Kafka broker answers (an unsupported version is answered in v0 too). The client
 * itself cannot tell a wrong port from a slow broker: against a server that never answers it waited its own 30 s
 * request timeout, 16 times over (its metadata retries around its ApiVersions retries), and an HTTP answer read as
 * a 1.2 GB frame; a negative frame size even threw out of its socket handler.
 *
 * @internal
 */
import * as net from "node:net"
import * as tls from "node:tls"
import { HostPort } from "@strata/core"
import { Data, Effect } from "effect"
import { TLS_CERTIFICATE } from "./errors.js"

/** The address answered, but not as a Kafka broker. */
export class NotKafka extends Data.TaggedError("NotKafka")<{ readonly detail: string }> {}

/** The TLS handshake failed on the client's side: the broker's certificate does not verify (or names another host). */
export class TlsRefused extends Data.TaggedError("TlsRefused")<{ readonly detail: string }> {}

/** Nothing answered at the address (refused, closed, or silent for the whole timeout). */
export class NoBroker extends Data.TaggedError("NoBroker")<{ readonly detail: string }> {}

const API_VERSIONS = 18
/** Kafka's own error for an unsupported request version; the answer still lists the broker's versions. */
const UNSUPPORTED_VERSION = 35
/** An ApiVersions answer is a few hundred bytes; anything claiming more than this is not one. */
const MAX_ANSWER_BYTES = 64 * 1024

/** An ApiVersions v0 request: size, api key, version, correlation id, client id; no body. */
export const apiVersionsRequest = (correlationId: number, clientId: string): Buffer => {
  const id = Buffer.from(clientId, "utf8")
  const out = Buffer.alloc(14 + id.length)
  out.writeInt32BE(out.length - 4, 0)
  out.writeInt16BE(API_VERSIONS, 4)
  out.writeInt16BE(0, 6)
  out.writeInt32BE(correlationId, 8)
  out.writeInt16BE(id.length, 12)
  id.copy(out, 14)
  return out
}

/**
 * Reads the bytes answered so far: `"partial"` while they may still become an ApiVersions v0 response, `"ok"` once
 * one is whole, otherwise what is wrong with them.
 */
export const checkAnswer = (bytes: Buffer, correlationId: number): "ok" | "partial" | { readonly wrong: string } => {
  // A TLS record header (an alert, 0x15, or a handshake, 0x16, of TLS 1.x) where a frame size should be.
  if (bytes.length >= 3 && (bytes[0] === 0x15 || bytes[0] === 0x16) && bytes[1] === 0x03 && bytes[2]! <= 0x04) {
    return { wrong: "a TLS record: a TLS listener, so set tls" }
  }
  if (bytes.length < 8) return "partial"
  const size = bytes.readInt32BE(0)
  if (size < 10 || size > MAX_ANSWER_BYTES) return { wrong: `a frame size of ${size}` }
  if (bytes.readInt32BE(4) !== correlationId) return { wrong: "another correlation id" }
  if (bytes.length < 4 + size) return "partial"
  const error = bytes.readInt16BE(8)
  const count = bytes.readInt32BE(10)
  if ((error !== 0 && error !== UNSUPPORTED_VERSION) || count < 1 || 10 + 6 * count !== size) {
    return { wrong: "a malformed ApiVersions response" }
  }
  for (let i = 0; i < count; i++) if (bytes.readInt16BE(14 + 6 * i) === API_VERSIONS) return "ok"
  return { wrong: "an ApiVersions response without ApiVersions" }
}

let probes = 0

/** The first bytes of an answer, printable. */
const preview = (bytes: Buffer): string =>
  JSON.stringify(
    bytes
      .subarray(0, 32)
      .toString("latin1")
      .replace(/[^\x20-\x7e]/g, ".")
  )

/**
 * Sends one ApiVersions request to `address` (over TLS when `secure` is given: Kafka answers it before SASL) and waits
 * up to `timeoutMs` (connecting included) for a Kafka answer. Fails with `NotKafka` when something else answers,
 * `TlsRefused` when the broker's certificate does not verify, `NoBroker` when nothing answers.
 */
export const probe = (
  address: string,
  clientId: string,
  timeoutMs: number,
  secure?: tls.ConnectionOptions
): Effect.Effect<void, NotKafka | NoBroker | TlsRefused> =>
  Effect.callback<void, NotKafka | NoBroker | TlsRefused>((resume) => {
    const correlationId = ++probes & 0x7fffffff || 1
    const target = HostPort.parse(address)
    if (target === undefined) {
      resume(Effect.fail(new NoBroker({ detail: `${address}: ${HostPort.invalid(address)}` })))
      return
    }
    const { host, port } = target
    let answered = Buffer.alloc(0)
    let done = false
    const socket = secure === undefined ? net.createConnection({ host, port }) : tls.connect({ ...secure, host, port })
    const finish = (outcome: Effect.Effect<void, NotKafka | NoBroker | TlsRefused>) => {
      if (done) return
      done = true
      socket.destroy()
      resume(outcome)
    }
    const notKafka = (what: string) =>
      finish(
        Effect.fail(
          new NotKafka({
            detail: `${address} is not a Kafka broker: it answered an ApiVersions request with ${what} (${preview(answered)})`
          })
        )
      )
    socket.on(secure === undefined ? "connect" : "secureConnect", () =>
      socket.write(apiVersionsRequest(correlationId, clientId))
    )
    socket.on("data", (chunk: Buffer) => {
      answered = Buffer.concat([answered, chunk])
      const checked = checkAnswer(answered, correlationId)
      if (checked === "ok") finish(Effect.void)
      else if (checked !== "partial") notKafka(checked.wrong)
    })
    /** The connection ended before a whole answer: a Kafka answer cut off (a broker going down) is not held against it. */
    const cut = (why: string) => {
      if (answered.length > 0 && answered.length < 8) notKafka("a cut-off answer")
      else
        finish(
          Effect.fail(
            new NoBroker({ detail: answered.length === 0 ? why : `${address} closed the connection mid-answer` })
          )
        )
    }
    socket.on("error", (e: NodeJS.ErrnoException) => {
      if (secure !== undefined && TLS_CERTIFICATE.test(e.code ?? ""))
        finish(Effect.fail(new TlsRefused({ detail: `${address}: TLS: ${e.code}: ${e.message}` })))
      else cut(`${address}: ${e.code ?? e.message}`)
    })
    socket.on("close", () =>
      cut(
        `${address} closed the connection without answering${secure === undefined ? " (a TLS listener? set tls)" : " (not a TLS listener?)"}`
      )
    )
    return Effect.sync(() => {
      done = true
      socket.destroy()
    })
  }).pipe(
    Effect.timeoutOrElse({
      duration: timeoutMs,
      orElse: () => Effect.fail(new NoBroker({ detail: `no answer from ${address} in ${timeoutMs} ms` }))
    })
  )
