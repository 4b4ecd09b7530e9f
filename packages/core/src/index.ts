/**
 * @strata/core — the protocols every Strata package codes against: service
 * keys and shapes, Schema models, errors, in-memory reference layers.
 *
 * @since 0.1.0
 */
export * from "./Coordination.js"
export * as CoordinationPaths from "./CoordinationPaths.js"
export * as HostPort from "./HostPort.js"
export * from "./Election.js"
export * from "./Errors.js"
export * from "./Log.js"
export * as MemoryCoordination from "./MemoryCoordination.js"
export * as MemoryLog from "./MemoryLog.js"
export * as MemoryStore from "./MemoryStore.js"
export * from "./Models.js"
export * as OptionSchemas from "./OptionSchemas.js"
export * from "./Rebalancer.js"
export * from "./Recovery.js"
export * from "./ReplicaManager.js"
export * as Retry from "./Retry.js"
export * from "./Store.js"
export * as StoreValidation from "./StoreValidation.js"
export * from "./TableManager.js"
