/**
 * @strata/rebalance: The rebalance trigger, planner and progressive executor.
 *
 * Not built yet (a later issue fills this package); it exports nothing.
 *
 * @since 0.0.0
 */
export {}
