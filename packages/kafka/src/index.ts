/**
 * @strata/kafka: the `Log` protocol (the changelog transport) on Kafka.
 *
 * @since 0.1.0
 */
export * as KafkaLog from "./KafkaLog.js"
