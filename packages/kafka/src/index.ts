/**
 * @strata/kafka: The `Log` protocol on a real Kafka cluster: the changelog transport for tables and recovery.
 *
 * Not built yet (issue 4 fills this package); it exports nothing.
 *
 * @since 0.0.0
 */
export {}
