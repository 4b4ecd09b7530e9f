/**
 * @strata/replica: The replica state machine, ISR/high-watermark replication, leader-epoch truncation and failover.
 *
 * Not built yet (a later issue fills this package); it exports nothing.
 *
 * @since 0.0.0
 */
export {}
