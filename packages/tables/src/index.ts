/**
 * @strata/tables: Table, GlobalTable and the TableManager, with Faust's semantics.
 *
 * Not built yet (issue 6 fills this package); it exports nothing.
 *
 * @since 0.0.0
 */
export {}
