/**
 * @strata/recovery: restore Strata tables from their changelogs (ARCHITECTURE §4).
 *
 * @since 0.1.0
 */
export * as ChangelogRecovery from "./ChangelogRecovery.js"
