/**
 * @strata/core — the protocols every Strata package codes against: service
 * keys and shapes, Schema models, errors, in-memory reference layers.
 *
 * @since 0.1.0
 */
export * as Coordination from "./Coordination.js"
export * as CoordinationPaths from "./CoordinationPaths.js"
export * as HostPort from "./HostPort.js"
export * as Election from "./Election.js"
export * as Errors from "./Errors.js"
export * as GroupFollower from "./GroupFollower.js"
export * as Log from "./Log.js"
export * as MemoryCoordination from "./MemoryCoordination.js"
export * as MemoryLog from "./MemoryLog.js"
export * as MemoryStore from "./MemoryStore.js"
export * as Models from "./Models.js"
export * as OptionSchemas from "./OptionSchemas.js"
export * as Rebalancer from "./Rebalancer.js"
export * as Recovery from "./Recovery.js"
export * as Retry from "./Retry.js"
export * as Store from "./Store.js"
export * as StoreValidation from "./StoreValidation.js"
export * as TableManager from "./TableManager.js"
