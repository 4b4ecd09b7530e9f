/**
 * @strata/election: `Coordination` adapters for ZooKeeper and etcd, the fenced election recipe and the coordinator lifecycle.
 *
 * Not built yet (issue 5 fills this package); it exports nothing.
 *
 * @since 0.0.0
 */
export {}
