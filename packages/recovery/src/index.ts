/**
 * @strata/recovery: restore Strata tables from their changelogs (docs/ARCHITECTURE.md, "Restore").
 *
 * @since 0.1.0
 */
export * as ChangelogRecovery from "./ChangelogRecovery.js"
