/**
 * TLS between the cluster's processes: on the RPC (`ReplicaRpc`) and the data link (`DataLink`), served by tablet
 * servers and coordinators and used by them and by clients (`TabletClient`, `StrataLog`, the CLI's operator
 * commands). Every process of a cluster is given the cluster's CA and, to serve, a certificate it signed with its key.
 *
 * - A client checks the server's certificate against the CA and the address it dialled (an IP address against the
 *   certificate's IP names), or against `serverName` when given (one name for the whole cluster's certificates).
 * - With `mutual` (the default) a server takes only clients that present a certificate the CA signed: a process
 *   without the cluster's certificate can neither call a server's RPC nor append to, fetch from or read its data link.
 *
 * The key is a secret: it decodes into a `Redacted` value and is shown in no error or log line.
 *
 * @since 0.1.0
 */
import * as Crypto from "node:crypto"
import * as Net from "node:net"
import * as Tls from "node:tls"
import { OptionSchemas } from "@strata/core"
import { Clock, Effect, Redacted, Result, Schema } from "effect"
import { type InvalidReplicaOptions, invalidOptions } from "./ReplicationConfig.js"

/**
 * The TLS options of a process: PEM texts, not file names.
 *
 * @since 0.1.0
 */
export const PeerTlsOptions = Schema.Struct({
  /** The cluster's CA certificate(s), PEM: the certificates of servers, and of clients when `mutual`, must chain to it. */
  ca: Schema.NonEmptyString,
  /** This process's certificate chain, PEM: required to serve, and to call a server that wants a client's. */
  cert: Schema.optional(Schema.NonEmptyString),
  /** The certificate's private key, PEM. */
  key: Schema.optional(OptionSchemas.Secret),
  /** Whether a server takes only clients with a certificate the CA signed (default true). */
  mutual: Schema.Boolean.pipe(Schema.withDecodingDefaultKey(Effect.succeed(true))),
  /** The name every server's certificate is checked against, instead of the host of the address dialled. */
  serverName: Schema.optional(Schema.NonEmptyString)
}).check(
  Schema.makeFilter((o) =>
    (o.cert === undefined) === (o.key === undefined)
      ? undefined
      : { path: [o.cert === undefined ? "cert" : "key"], issue: "cert and key go together" }
  )
)

/**
 * The options' input.
 *
 * @since 0.1.0
 */
export type PeerTlsOptions = typeof PeerTlsOptions.Encoded

/**
 * A process's TLS, checked and ready: the secure context made once and shared by every connection.
 *
 * @since 0.1.0
 */
export interface PeerTls {
  /** Whether this process has a certificate (it can serve, and answer a server's request for one). */
  readonly hasCertificate: boolean
  /**
   * A TLS server's options (the certificate, and the client check when `mutual`); `undefined` without a certificate.
   * A function, so that printing the value shows no key.
   */
  readonly server: () => Tls.TlsOptions | undefined
  /** Why this process cannot listen (no certificate, or one its peers would refuse), if it cannot. */
  readonly cannotServe: string | undefined
  /** A TLS client's options for a connection to `host:port`. */
  readonly client: (host: string, port: number) => Tls.ConnectionOptions
}

/** The certificates of a PEM text, or why it holds none that parse. */
const certificates = (pem: string): ReadonlyArray<Crypto.X509Certificate> | string => {
  const blocks = pem.match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g) ?? []
  if (blocks.length === 0) return "no PEM certificate in it"
  try {
    return blocks.map((block) => new Crypto.X509Certificate(block))
  } catch (e) {
    return `a certificate does not parse: ${e instanceof Error ? e.message : String(e)}`
  }
}

/** The options' PEM texts parsed, or why they cannot be used as bad options (the key's value never shown). */
const parsePems = (
  o: typeof PeerTlsOptions.Type,
  key: string | undefined
): Result.Result<
  {
    readonly ca: ReadonlyArray<Crypto.X509Certificate>
    readonly cert: ReadonlyArray<Crypto.X509Certificate> | undefined
  },
  readonly [OptionSchemas.BadOption, ...Array<OptionSchemas.BadOption>]
> => {
  const bad: Array<OptionSchemas.BadOption> = []
  const ca = certificates(o.ca)
  if (typeof ca === "string") bad.push({ option: "tls.ca", value: "(PEM)", detail: ca })
  const cert = o.cert === undefined ? undefined : certificates(o.cert)
  if (typeof cert === "string") bad.push({ option: "tls.cert", value: "(PEM)", detail: cert })
  if (key !== undefined) {
    let privateKey: Crypto.KeyObject | undefined
    try {
      privateKey = Crypto.createPrivateKey(key)
    } catch (e) {
      bad.push({
        option: "tls.key",
        value: "<redacted>",
        detail: `not a private key: ${e instanceof Error ? e.message : String(e)}`
      })
    }
    if (
      privateKey !== undefined &&
      cert !== undefined &&
      typeof cert !== "string" &&
      !cert[0]!.checkPrivateKey(privateKey)
    )
      bad.push({ option: "tls.key", value: "<redacted>", detail: "it is not the private key of tls.cert" })
  }
  const [first, ...rest] = bad
  return first !== undefined || typeof ca === "string" || typeof cert === "string"
    ? Result.fail([first!, ...rest])
    : Result.succeed({ ca, cert })
}

/**
 * Why `chain` (a certificate and the intermediates after it) does not lead to one of `cas`, or `undefined` when it
 * does: each link issued and signed by the next, up to a CA of the bundle.
 */
const unchained = (
  chain: ReadonlyArray<Crypto.X509Certificate>,
  cas: ReadonlyArray<Crypto.X509Certificate>
): string | undefined => {
  let current = chain[0]!
  for (let depth = 0; depth < 8; depth++) {
    const signedBy = (c: Crypto.X509Certificate) => current.checkIssued(c) && current.verify(c.publicKey)
    if (cas.some(signedBy)) return undefined
    const next = chain.slice(1).find(signedBy)
    if (next === undefined) break
    current = next
  }
  return `it is not signed by the CA of tls.ca (its issuer: ${chain[0]!.issuer.replace(/\n/g, ", ")})`
}

/**
 * Checks `options` and makes the secure context: a PEM that does not parse, a key that is not the certificate's, or a
 * certificate not valid now (by the `Clock`) fails naming the option (the key's value never shown). Whether the
 * certificate chains to the CA is noted for `serverOptions`: a client's may be another CA's.
 *
 * @since 0.1.0
 */
export const make = (options: PeerTlsOptions): Effect.Effect<PeerTls, InvalidReplicaOptions> =>
  Effect.gen(function* () {
    const o = yield* OptionSchemas.decodeOptions(PeerTlsOptions, { exact: true })(options).pipe(
      Effect.mapError(([first, ...rest]) =>
        invalidOptions([
          { ...first, option: `tls.${first.option}` },
          ...rest.map((b) => ({ ...b, option: `tls.${b.option}` }))
        ])
      )
    )
    const key = o.key === undefined ? undefined : Redacted.value(o.key)
    const { ca, cert: own } = yield* Effect.mapError(Effect.fromResult(parsePems(o, key)), invalidOptions)
    const now = yield* Clock.currentTimeMillis
    const expired =
      own === undefined
        ? undefined
        : Date.parse(own[0]!.validTo) < now
          ? `it expired on ${own[0]!.validTo}`
          : Date.parse(own[0]!.validFrom) > now
            ? `it is not valid before ${own[0]!.validFrom}`
            : undefined
    if (expired !== undefined) {
      return yield* Effect.fail(invalidOptions([{ option: "tls.cert", value: "(PEM)", detail: expired }]))
    }
    // A listener's certificate must be one its peers accept: they trust the same CA as this process. (A client's may
    // be another CA's: the servers' trust decides.)
    const serving = own === undefined ? "no certificate" : unchained(own, ca)
    const context = Tls.createSecureContext({
      ca: o.ca,
      ...(o.cert === undefined ? {} : { cert: o.cert }),
      ...(key === undefined ? {} : { key })
    })
    // A TLS server takes its certificate as PEM options (it makes its own context from them; it has no
    // `secureContext` option), checked above.
    const server: Tls.TlsOptions | undefined =
      o.cert === undefined || key === undefined
        ? undefined
        : { ca: o.ca, cert: o.cert, key, requestCert: o.mutual, rejectUnauthorized: o.mutual }
    return {
      hasCertificate: o.cert !== undefined,
      server: () => server,
      cannotServe: serving,
      client: (host, port) => ({
        host,
        port,
        secureContext: context,
        rejectUnauthorized: true,
        // Without a name, the certificate is checked against the host dialled; an IP address is no server name to
        // send (RFC 6066), and Node checks it against the certificate's IP names without one.
        ...(o.serverName !== undefined
          ? { servername: o.serverName }
          : Net.isIP(host) === 0
            ? { servername: host }
            : {})
      })
    }
  })

/**
 * Fails unless `tls` can serve: a listener needs a certificate signed by the CA it trusts (its peers trust the same),
 * so a process given another CA's certificate stops before it registers.
 *
 * @since 0.1.0
 */
export const serverOptions = (tls: PeerTls): Effect.Effect<Tls.TlsOptions, InvalidReplicaOptions> =>
  Effect.suspend(() => {
    const server = tls.server()
    return server === undefined || tls.cannotServe !== undefined
      ? Effect.fail(
          invalidOptions([
            {
              option: "tls.cert",
              value: server === undefined ? "undefined" : "(PEM)",
              detail:
                server === undefined
                  ? "a process that listens needs a certificate"
                  : `a process that listens needs one its peers accept: ${tls.cannotServe}`
            }
          ])
        )
      : Effect.succeed(server)
  })

/**
 * Whether a TLS server answers at `host:port`: a handshake that completes there, the server's certificate not checked
 * and none presented (a server that requires one refuses it only after). What a plaintext client asks when a server
 * closes its connections without a word, as a TLS server does. Never fails; `false` after `timeoutMs`.
 *
 * @since 0.1.0
 */
export const speaksTls = (host: string, port: number, timeoutMs = 2_000): Effect.Effect<boolean> =>
  Effect.callback<boolean>((resume) => {
    const socket = Tls.connect({
      host,
      port,
      rejectUnauthorized: false,
      ...(Net.isIP(host) === 0 ? { servername: host } : {})
    })
    const done = (answer: boolean) => {
      socket.destroy()
      resume(Effect.succeed(answer))
    }
    socket.setTimeout(timeoutMs, () => done(false))
    socket.once("secureConnect", () => done(true))
    socket.once("error", () => done(false))
    socket.once("close", () => done(false))
    return Effect.sync(() => socket.destroy())
  })
