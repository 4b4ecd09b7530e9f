/**
 * @strata/tables: `Table` / `GlobalTable` definitions with Schema codecs and the
 * `Tables` manager (Faust's TableManager semantics, its bugs fixed) on core's
 * `Store` and `Log`, and the `Worker` that runs agents over source topics through them.
 *
 * @since 0.1.0
 */
export * as Table from "./Table.js"
export * as Tables from "./Tables.js"
export * as Worker from "./Worker.js"
