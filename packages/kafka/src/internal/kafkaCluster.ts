/**
 * The Kafka cluster as the log's clients reach it: the bootstrap brokers probed at start (with backoff), the
 * settings every client is built with, and the bound put on each request, so that a broker that does not answer
 * fails an operation with `BrokerUnreachable` in the request timeout.
 *
 * @internal
 */
import type { ConnectionOptions } from "node:tls"
import { Log, Retry } from "@strata/core"
import { Effect, Schedule } from "effect"
import * as BrokerProbe from "./brokerProbe.js"
import { noAnswer, toLogError } from "./errors.js"

/** SASL as the client takes it: the password a function, so that the client's options never hold it as text. */
export interface Sasl {
  readonly mechanism: "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512"
  readonly username: string
  readonly password: () => string
}

/** How the clients secure their connections: TLS (Node's options), then SASL; each absent when not used. */
export interface Security {
  readonly tls?: ConnectionOptions
  readonly sasl?: Sasl
}

/** The settings every client of the log is built with. */
export interface ClientBase extends Security {
  clientId: string
  /** The bootstrap brokers, those that answered the start-up probe first. */
  bootstrapBrokers: Array<string>
  /** What the broker may take for a request (produce, create topics, transactions). */
  timeout: number
  /** How long the client waits to connect, and for each answer. */
  connectTimeout: number
  requestTimeout: number
  retries: number
  retryDelay: number
}

/** The cluster the log talks to. */
export interface Cluster {
  /** The brokers as configured: failures name them. */
  readonly brokers: ReadonlyArray<string>
  readonly base: ClientBase
  /** The request timeout, in milliseconds. */
  readonly timeout: number
  /** Attempts to reach the brokers at start. */
  readonly connectAttempts: number
}

/** What `connect` needs: the configured brokers and client settings. */
export interface ClusterOptions {
  readonly brokers: ReadonlyArray<string>
  readonly security: Security
  readonly clientId: string
  readonly timeout: number
  readonly connectAttempts: number
}

/**
 * Probes every bootstrap broker (`BrokerProbe`, over TLS when the clients use it): fails at once when one answers but
 * is not Kafka (`InvalidRequest`) or refuses the TLS handshake (`AuthenticationFailed`), with `BrokerUnreachable`
 * when none answers; else gives the brokers, those that answered first.
 */
const reachBrokers = (
  brokers: ReadonlyArray<string>,
  clientId: string,
  timeoutMs: number,
  tls: ConnectionOptions | undefined
): Effect.Effect<Array<string>, Log.LogError> =>
  Effect.gen(function* () {
    const probed = yield* Effect.forEach(
      brokers,
      (b) => Effect.result(BrokerProbe.probe(b, clientId, timeoutMs, tls)),
      { concurrency: "unbounded" }
    )
    const failures = probed.flatMap((r) => (r._tag === "Failure" ? [r.failure] : []))
    const refused = failures.filter((f) => f._tag === "TlsRefused")
    if (refused.length > 0) {
      return yield* Effect.fail(
        Log.logError(
          new Log.AuthenticationFailed({ brokers: [...brokers], detail: refused.map((f) => f.detail).join("; ") })
        )
      )
    }
    const notKafka = failures.filter((f) => f._tag === "NotKafka")
    if (notKafka.length > 0) {
      return yield* Effect.fail(
        Log.logError(new Log.InvalidRequest({ detail: `brokers: ${notKafka.map((f) => f.detail).join("; ")}` }))
      )
    }
    const answered = brokers.filter((_, i) => probed[i]!._tag === "Success")
    if (answered.length === 0) {
      return yield* Effect.fail(
        Log.logError(
          new Log.BrokerUnreachable({ brokers: [...brokers], detail: failures.map((f) => f.detail).join("; ") })
        )
      )
    }
    return [...answered, ...brokers.filter((b) => !answered.includes(b))]
  })

/**
 * Probes the brokers, retrying (with exponential backoff) while none answers, and gives the cluster with its client
 * settings. An address that is not Kafka fails here, before any client talks to it.
 */
export const connect = (options: ClusterOptions): Effect.Effect<Cluster, Log.LogError> =>
  Effect.gen(function* () {
    const { brokers, clientId, timeout, connectAttempts, security } = options
    const bootstrap = yield* reachBrokers(brokers, clientId, timeout, security.tls).pipe(
      Retry.retry({
        times: connectAttempts - 1,
        schedule: Schedule.exponential("200 millis"),
        while: (e) => e.reason._tag === "BrokerUnreachable"
      })
    )
    // `timeout` is what the broker may take (produce, create topics); `requestTimeout` and `connectTimeout` bound
    // the client's own wait for each request (its default was 30 s, whatever `timeout` said).
    const base: ClientBase = {
      clientId,
      bootstrapBrokers: bootstrap,
      timeout,
      connectTimeout: timeout,
      requestTimeout: timeout,
      retries: 3,
      retryDelay: 250,
      ...(security.tls === undefined ? {} : { tls: security.tls }),
      ...(security.sasl === undefined ? {} : { sasl: security.sasl })
    }
    return { brokers, base, timeout, connectAttempts }
  })

/**
 * Fails with `BrokerUnreachable` ("no answer …") when `effect` has not completed in `ms`. The client retries a
 * request that timed out, 4 times and (its metadata around its ApiVersions) up to 16; the caller does not wait.
 */
export const bounded = <A, E>(
  c: Cluster,
  operation: string,
  effect: Effect.Effect<A, E>,
  ms = c.timeout
): Effect.Effect<A, E | Log.LogError> =>
  Effect.timeoutOrElse(effect, { duration: ms, orElse: () => Effect.fail(noAnswer(operation, c.brokers, ms)) })

/** A client call, bounded by the request timeout (or `ms`). */
export const call = <A>(
  c: Cluster,
  operation: string,
  f: () => Promise<A>,
  topic?: string,
  ms = c.timeout
): Effect.Effect<A, Log.LogError> =>
  bounded(
    c,
    operation,
    Effect.tryPromise({ try: f, catch: (cause) => toLogError(operation, c.brokers, cause, topic) }),
    ms
  )

/** Closes a client, giving up after `ms` (a hung broker must not hold the scope's closing). */
export const closeWithin = (ms: number, close: () => Promise<unknown>): Effect.Effect<void> =>
  Effect.promise(() => close().catch(() => undefined)).pipe(Effect.timeoutOption(ms), Effect.asVoid)
