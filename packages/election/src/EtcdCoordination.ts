/**
 * `Coordination` on etcd 3 through etcd3: ZooKeeper's tree emulated on etcd's
 * flat keyspace.
 *
 * A node at path `P` of depth `d` is the key `<root>/n<ddd><P>` holding a small
 * JSON header (data version, ephemeral owner) and the data, so the direct
 * children of `P` are one prefix range. Its children version and sequence
 * counter live in `<root>/m<P>`. Every check-and-write is one etcd txn whose
 * compares pin every key it read; a session is a lease.
 *
 * Known differences from ZooKeeper: when a lease expires or is revoked, etcd
 * deletes the session's ephemeral nodes without bumping their parents'
 * `childrenVersion`; several writes to one node inside one `multi` count as one
 * data version bump per `set` but reach etcd as a single put.
 *
 * @since 0.1.0
 */
import { Coordination, OptionSchemas } from "@strata/core"
import { Config, Context, Duration, Effect, Layer, Redacted, Schema, type Scope } from "effect"
import { sessionOf } from "./internal/etcdNodes.js"
import * as EtcdSession from "./internal/etcdSession.js"
import * as EtcdStore from "./internal/etcdStore.js"
import { AbsolutePath, invalidHostPort } from "./internal/options.js"

const { decodeOptions, DurationOption, Secret, summary } = OptionSchemas

/** Why an endpoint is not `http://host:port` or `https://host:port` with a port in 1–65535, if it is not. */
const invalidEndpoint = (endpoint: string): string | undefined => {
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(endpoint)?.[1]
  if (scheme !== undefined && scheme !== "http" && scheme !== "https") {
    return `expected http://host:port or https://host:port, not ${scheme}://`
  }
  const problem = invalidHostPort(endpoint.replace(/^https?:\/\//, ""))
  return problem === undefined ? undefined : `${problem} (http://host:port or https://host:port)`
}

/** Options of the etcd coordination backend, validated by `make`. */
export const EtcdCoordinationOptions = Schema.Struct({
  /** etcd client URLs, e.g. `["http://127.0.0.1:2379"]`: at least one, all `http` or all `https`, ports in 1–65535. */
  endpoints: Schema.Array(Schema.String.check(Schema.makeFilter(invalidEndpoint))).check(
    Schema.makeFilter((endpoints: ReadonlyArray<string>) =>
      endpoints.length === 0 ? "expected at least one endpoint, e.g. http://127.0.0.1:2379" : undefined
    ),
    Schema.makeFilter((endpoints: ReadonlyArray<string>) => {
      const secure = endpoints.filter((e) => e.startsWith("https://")).length
      return secure === 0 || secure === endpoints.length
        ? undefined
        : "expected all endpoints http:// or all https:// (the client cannot mix them)"
    })
  ),
  /** Key prefix under which the tree lives, an absolute path (default `"/strata/coordination"`). */
  root: Schema.optional(AbsolutePath),
  /** Default session timeout (10 seconds; below 2 seconds counts as 2 seconds). */
  sessionTimeout: DurationOption("positive").pipe(
    Schema.withDecodingDefault(Effect.succeed<Duration.Input>("10 seconds"))
  ),
  /**
   * TLS to `https://` endpoints (PEM text): `ca`, the CA etcd's certificate must chain to, and `cert`/`key`, the
   * client's certificate, for an etcd started with `--client-cert-auth`.
   */
  tls: Schema.optional(
    Schema.Struct({ ca: Schema.String, cert: Schema.optional(Schema.String), key: Schema.optional(Secret) })
  ),
  /** etcd's password authentication (`auth enable`): the user every client authenticates as; never printed. */
  auth: Schema.optional(Schema.Struct({ username: Schema.NonEmptyString, password: Secret }))
})
/** What `make` takes (see `EtcdCoordinationOptions`): durations as any `Duration.Input`, a number being milliseconds. */
export type EtcdCoordinationOptions = typeof EtcdCoordinationOptions.Encoded

/** The etcd backend's own service: the `Coordination` shape plus its fault injection. */
export class EtcdCoordination extends Context.Service<
  EtcdCoordination,
  Coordination.Shape & { readonly faults: Coordination.FaultsShape }
>()("@strata/election/EtcdCoordination") {}

/**
 * Connects to etcd for the life of the scope; sessions are leases. Options that fail `EtcdCoordinationOptions`
 * fail with `InvalidCoordinationOptions`, before anything connects.
 */
export const make = (
  options: EtcdCoordinationOptions
): Effect.Effect<EtcdCoordination["Service"], Coordination.CoordinationError, Scope.Scope> =>
  Effect.gen(function* () {
    const o = yield* decodeOptions(EtcdCoordinationOptions, { exact: true })(options).pipe(
      Effect.mapError((bad) =>
        Coordination.coordinationError(new Coordination.InvalidOptions({ backend: "etcd", ...summary(bad) }))
      )
    )
    if (o.tls !== undefined && !o.endpoints.every((e) => e.startsWith("https://"))) {
      return yield* Effect.fail(
        Coordination.coordinationError(
          new Coordination.InvalidOptions({
            backend: "etcd",
            option: "endpoints",
            value: JSON.stringify(o.endpoints),
            detail: "tls needs https:// endpoints"
          })
        )
      )
    }
    const store = yield* EtcdStore.open(
      o.endpoints,
      o.root ?? "/strata/coordination",
      Math.max(2000, Duration.toMillis(o.sessionTimeout)),
      {
        ...(o.tls === undefined
          ? {}
          : {
              credentials: {
                rootCertificate: Buffer.from(o.tls.ca),
                ...(o.tls.cert === undefined ? {} : { certChain: Buffer.from(o.tls.cert) }),
                ...(o.tls.key === undefined ? {} : { privateKey: Buffer.from(Redacted.value(o.tls.key)) })
              }
            }),
        ...(o.auth === undefined ? {} : { auth: o.auth })
      }
    )
    const faults: Coordination.FaultsShape = {
      expire: (s) =>
        Effect.gen(function* () {
          yield* EtcdStore.call(() => store.faultClient.leaseClient.leaseRevoke({ ID: s.id })).pipe(Effect.ignore)
          store.sessions.get(s.id)?.end("expired")
        })
    }
    return {
      backend: "etcd",
      session: (sessionOptions) => Effect.map(EtcdSession.open(store, sessionOptions), sessionOf),
      faults
    }
  })

/** A layer providing `EtcdCoordination`, `Coordination` and `CoordinationFaults` from one client. */
export const layer = (
  options: EtcdCoordinationOptions
): Layer.Layer<EtcdCoordination | Coordination.Coordination | Coordination.Faults, Coordination.CoordinationError> =>
  Layer.effectContext(
    Effect.map(make(options), (service) =>
      Context.make(EtcdCoordination, service).pipe(
        Context.add(Coordination.Coordination, service),
        Context.add(Coordination.Faults, service.faults)
      )
    )
  )

/** Like `layer`, with the options read from configuration. */
export const layerConfig = (
  config: Config.Wrap<EtcdCoordinationOptions>
): Layer.Layer<
  EtcdCoordination | Coordination.Coordination | Coordination.Faults,
  Coordination.CoordinationError | Config.ConfigError
> => Layer.unwrap(Effect.map(Config.unwrap(config), layer))
