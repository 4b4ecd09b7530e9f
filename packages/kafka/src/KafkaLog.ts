/**
 * The `Log` protocol on a Kafka cluster, through `@platformatic/kafka`.
 *
 * Changelog consumers use no consumer group: each pull sends one `Fetch` per
 * partition leader for the assigned, unpaused partitions at the positions the
 * adapter keeps, so assignment, seek and pause are instant and a slow caller
 * simply stops the fetching. An out-of-range position fails with
 * `OffsetOutOfRange`; it is never reset.
 *
 * Why not kafkajs: it has no manual assignment (only the group protocol, with a
 * rejoin per change), it silently resets an out-of-range position, and it
 * produces ~1.5× slower here. See the package README.
 *
 * @since 0.1.0
 */
import { HostPort, Log, OptionSchemas } from "@strata/core"
import type { ConnectionOptions } from "node:tls"
import { Config, Context, Duration, Effect, Layer, Redacted, Schema, type Scope } from "effect"
import * as KafkaAdmin from "./internal/kafkaAdmin.js"
import * as KafkaCluster from "./internal/kafkaCluster.js"
import * as KafkaConsumer from "./internal/kafkaConsumer.js"
import * as KafkaGroupConsumer from "./internal/kafkaGroupConsumer.js"
import * as KafkaProducer from "./internal/kafkaProducer.js"
import * as TransactionalProducer from "./internal/transactionalProducer.js"

const { DurationOption, PositiveInt, Secret } = OptionSchemas

/**
 * A broker address: `host:port` as core's `HostPort` reads it (a host name, an IPv4 or [IPv6] address, a port from 1
 * to 65535).
 */
export const BrokerAddress = Schema.String.check(
  Schema.makeFilter((address: string) =>
    HostPort.invalid(address) === undefined
      ? undefined
      : `expected host:port (a host name, an IPv4 or [IPv6] address, and a port from 1 to 65535), got ${JSON.stringify(address)}`
  )
)

/**
 * TLS to the brokers, as Node's `tls.connect` takes it (PEM text, not file names). Every connection of the log's
 * clients, and its start-up probe, uses it.
 */
export const KafkaTls = Schema.Struct({
  /** CA certificates (PEM) the brokers' certificates must chain to; Node's bundled CAs when absent. */
  ca: Schema.optional(Schema.Union([Schema.String, Schema.Array(Schema.String)])),
  /** The client's certificate chain (PEM), for brokers that authenticate clients by certificate (mutual TLS). */
  cert: Schema.optional(Schema.String),
  /** The private key (PEM) of `cert`. */
  key: Schema.optional(Secret),
  /** The name the brokers' certificates must carry, when it is not the host connected to. */
  servername: Schema.optional(Schema.NonEmptyString),
  /** `false` accepts any certificate: encryption without authentication, for tests only (default `true`). */
  rejectUnauthorized: Schema.optional(Schema.Boolean)
})
/** What `tls` takes: see `KafkaTls`. */
export type KafkaTls = typeof KafkaTls.Encoded

/** SASL authentication after the connection (and TLS) is up: PLAIN, or SCRAM-SHA-256/512, as Kafka offers them. */
export const KafkaSasl = Schema.Struct({
  mechanism: Schema.Literals(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]),
  username: Schema.NonEmptyString,
  /** Text or a `Redacted` (`Config.redacted` gives one); never printed. */
  password: Secret
})
/** What `sasl` takes: see `KafkaSasl`. */
export type KafkaSasl = typeof KafkaSasl.Encoded

/** Options of the Kafka log, validated when it starts. */
export const KafkaLogOptions = Schema.Struct({
  /** Bootstrap brokers, `host:port` (see `BrokerAddress`). */
  brokers: Schema.NonEmptyArray(BrokerAddress),
  /**
   * TLS (`KafkaTls`), or `true` for TLS with Node's bundled CAs (a managed Kafka's public certificates). Plaintext
   * when absent. A certificate that does not verify fails the start with `AuthenticationFailed`.
   */
  tls: Schema.optional(Schema.Union([Schema.Boolean, KafkaTls])),
  /** SASL (`KafkaSasl`); none when absent. Refused credentials fail with `AuthenticationFailed`, not retried. */
  sasl: Schema.optional(KafkaSasl),
  /** Client id sent to the brokers (default "strata"). */
  clientId: Schema.optional(Schema.NonEmptyString),
  /**
   * Request timeout (10 seconds): how long any request waits for the brokers' answer, connecting included, before
   * it fails with `BrokerUnreachable`. It bounds each of the log's operations (a fetch waits `maxWait` longer;
   * joining a group, which the coordinator holds for a rebalance, waits at least 15 s).
   */
  requestTimeout: DurationOption("positive").pipe(
    Schema.withDecodingDefault(Effect.succeed<Duration.Input>("10 seconds"))
  ),
  /** How long a fetch waits at the broker for new records (250 millis). */
  maxWait: DurationOption("positive").pipe(Schema.withDecodingDefault(Effect.succeed<Duration.Input>("250 millis"))),
  /**
   * Most bytes one fetch brings back from a broker, all partitions together (default 8 MiB). The bytes are held
   * until their records are handed out; records are built a chunk at a time, as they are handed out.
   */
  fetchMaxBytes: Schema.optional(PositiveInt),
  /**
   * Most bytes one fetch brings back per partition (default 1 MiB, as Kafka's Java consumer). A record batch larger
   * than this still comes back whole, alone, so a partition always makes progress.
   */
  fetchPartitionMaxBytes: Schema.optional(PositiveInt),
  /**
   * Attempts to reach the brokers at start, with exponential backoff, before `BrokerUnreachable` (default 5). An
   * address that answers but is not a Kafka broker fails at once (`InvalidRequest`).
   */
  connectAttempts: Schema.optional(PositiveInt),
  /**
   * Largest record accepted (key + value + headers), in bytes (default 1000000). A record must also fit its topic's
   * `max.message.bytes` as a record batch of its own (read from the brokers).
   */
  maxRecordBytes: Schema.optional(PositiveInt),
  /**
   * How long `produce` waits for more records before sending (0, none). Calls made while a send is in flight are
   * always sent together in the next request, lingering or not.
   */
  linger: DurationOption("nonNegative").pipe(Schema.withDecodingDefault(Effect.succeed<Duration.Input>(0))),
  /** Records queued for sending at most; `produce` and `send` wait for room beyond it (default 100000). */
  bufferRecords: Schema.optional(PositiveInt),
  /** Most records `produce` puts in one request (default 1000). */
  maxBatchRecords: Schema.optional(PositiveInt)
})
/** What `make` takes (see `KafkaLogOptions`): durations as any `Duration.Input`, a number being milliseconds. */
export type KafkaLogOptions = typeof KafkaLogOptions.Encoded

/** The Kafka log's own service key; its layer provides `Log` too. */
export class KafkaLog extends Context.Service<KafkaLog, Log.Shape & { readonly brokers: ReadonlyArray<string> }>()(
  "@strata/kafka/KafkaLog"
) {}

/**
 * Fetch sizes. A broker cuts a partition's answer at the size asked, mid-batch, and the cut batch is fetched again
 * next time: with 256 KiB per partition and ~130 KB changelog batches, half the bytes fetched were thrown away. At
 * 1 MiB per partition a restore of 1M records took 8–12% less CPU per record (3 same-day A/B runs) for ~60 MB more
 * memory. (Decoding a whole fetch at once made larger fetches slower; records are now built a chunk at a time.)
 */
const DEFAULT_FETCH_MAX_BYTES = 8 * 1024 * 1024
const DEFAULT_FETCH_PARTITION_MAX_BYTES = 1024 * 1024

/** A duration as the clients take it: whole milliseconds, rounded up (a fraction of a millisecond still waits). */
const wholeMillis = (d: Duration.Duration): number => Math.ceil(Duration.toMillis(d))

/** The clients' TLS and SASL settings from the decoded options: secrets revealed only where a connection needs them. */
const securityOf = (o: typeof KafkaLogOptions.Type): KafkaCluster.Security => {
  const t = o.tls
  const tls: ConnectionOptions | undefined =
    t === undefined || t === false
      ? undefined
      : t === true
        ? {}
        : {
            ...(t.ca === undefined ? {} : { ca: typeof t.ca === "string" ? t.ca : [...t.ca] }),
            ...(t.cert === undefined ? {} : { cert: t.cert }),
            ...(t.key === undefined ? {} : { key: Redacted.value(t.key) }),
            ...(t.servername === undefined ? {} : { servername: t.servername }),
            ...(t.rejectUnauthorized === undefined ? {} : { rejectUnauthorized: t.rejectUnauthorized })
          }
  const s = o.sasl
  const password = s?.password
  return {
    ...(tls === undefined ? {} : { tls }),
    ...(s === undefined || password === undefined
      ? {}
      : { sasl: { mechanism: s.mechanism, username: s.username, password: () => Redacted.value(password) } })
  }
}

/**
 * Starts the clients, checks the brokers answer (with backoff), and serves `Log` until the scope closes: the admin
 * client (`internal/kafkaAdmin.ts`), the shared producers and their send queue (`internal/kafkaProducer.ts`), and
 * per call the consumers (`internal/kafkaConsumer.ts`, `internal/kafkaGroupConsumer.ts`) and transactional
 * producers (`internal/transactionalProducer.ts`).
 */
export const make = (options: KafkaLogOptions): Effect.Effect<KafkaLog["Service"], Log.LogError, Scope.Scope> =>
  Effect.gen(function* () {
    // Every bad option named with its value; an option the schema does not know (a typo) is one of them.
    const o = yield* OptionSchemas.decodeOptions(KafkaLogOptions, { exact: true })(options).pipe(
      Effect.mapError((bad) => {
        const b = OptionSchemas.summary(bad)
        return Log.logError(
          new Log.InvalidRequest({ detail: `Kafka log options: ${b.option} = ${b.value}: ${b.detail}` })
        )
      })
    )
    const cluster = yield* KafkaCluster.connect({
      brokers: [...o.brokers],
      security: securityOf(o),
      clientId: o.clientId ?? "strata",
      timeout: wholeMillis(o.requestTimeout),
      connectAttempts: o.connectAttempts ?? 5
    })
    const admin = yield* KafkaAdmin.open(cluster)
    const clients = yield* KafkaProducer.openClients(cluster)
    yield* KafkaAdmin.checkConnected(admin)
    const producers = yield* KafkaProducer.make(admin, clients, {
      maxRecordBytes: o.maxRecordBytes ?? 1_000_000,
      lingerMs: wholeMillis(o.linger),
      maxBatchRecords: o.maxBatchRecords ?? 1000,
      bufferRecords: o.bufferRecords ?? 100_000
    })
    const consumers: KafkaConsumer.ConsumerSettings = {
      admin,
      maxWait: wholeMillis(o.maxWait),
      fetchMaxBytes: o.fetchMaxBytes ?? DEFAULT_FETCH_MAX_BYTES,
      fetchPartitionMaxBytes: o.fetchPartitionMaxBytes ?? DEFAULT_FETCH_PARTITION_MAX_BYTES
    }
    const log: Log.Shape = {
      backend: "kafka",
      ensureTopic: (spec) => KafkaAdmin.ensureTopic(admin, spec),
      produce: (record, produceOptions) => KafkaProducer.produce(producers, record, produceOptions),
      produceBatch: (records, produceOptions) => KafkaProducer.produceBatch(producers, records, produceOptions),
      flush: KafkaProducer.flush(producers),
      producer: (producerOptions) => KafkaProducer.producer(producers, producerOptions),
      transactionalProducer: (transactionOptions) => TransactionalProducer.make(transactionOptions, producers),
      offsets: (tps, offsetsOptions) => KafkaAdmin.offsets(admin, tps, offsetsOptions),
      deleteRecords: (tp, offset) => KafkaAdmin.deleteRecords(admin, tp, offset),
      consumer: (consumerOptions) => KafkaConsumer.make(consumers, consumerOptions),
      groupConsumer: (groupOptions) => KafkaGroupConsumer.make(consumers, groupOptions)
    }
    return { ...log, brokers: cluster.brokers }
  })

/** A layer providing both `KafkaLog` and `Log`. */
export const layer = (options: KafkaLogOptions): Layer.Layer<KafkaLog | Log.Log, Log.LogError> =>
  Layer.effectContext(Effect.map(make(options), (log) => Context.make(KafkaLog, log).pipe(Context.add(Log.Log, log))))

/** Like `layer`, with the options read from configuration. */
export const layerConfig = (
  config: Config.Wrap<KafkaLogOptions>
): Layer.Layer<KafkaLog | Log.Log, Log.LogError | Config.ConfigError> =>
  Layer.unwrap(Effect.map(Config.unwrap(config), layer))
