/**
 * @strata/recovery: The Recovery service: restore tables from their changelogs, standbys, progress and stall reports.
 *
 * Not built yet (issue 7 fills this package); it exports nothing.
 *
 * @since 0.0.0
 */
export {}
