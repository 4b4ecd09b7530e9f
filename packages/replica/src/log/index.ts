/**
 * @strata/replica/log: core's `Log` protocol (the changelog transport of Tables and Recovery) on Strata's own
 * replicated tablets, as `@strata/kafka` is the `Log` on Kafka.
 *
 * @since 0.1.0
 */
export * as StrataLog from "./StrataLog.js"
