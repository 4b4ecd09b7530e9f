/**
 * @strata/election: coordination adapters (subpaths `/zookeeper`, `/etcd`), the
 * election recipe on any `Coordination` backend, and the coordinator lifecycle.
 *
 * @since 0.1.0
 */
export * as CoordinationElection from "./CoordinationElection.js"
export * as CoordinatorLifecycle from "./CoordinatorLifecycle.js"
export * as Coordinator from "./Coordinator.js"
