/**
 * Conformance suites: the contract every adapter of a protocol must pass.
 * Each exports `suite(name, layer)` for an adapter package's test file.
 *
 * @since 0.1.0
 */
export * as CoordinationConformance from "./CoordinationConformance.js"
export * as LogConformance from "./LogConformance.js"
export * as StoreConformance from "./StoreConformance.js"
export * as ElectionConformance from "./ElectionConformance.js"
