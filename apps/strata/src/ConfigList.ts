/**
 * `strata config list`: every setting the cluster's processes read — its key (in `--config`'s file and
 * `--set key=value`), its environment variable, its default, the processes that read it, and what it means — as
 * aligned columns for an operator or as one JSON array.
 *
 * @since 0.1.0
 */
import * as ServerConfig from "./ServerConfig.js"

/** A setting's default as the text column shows it: the value, `required`, or `none`. */
const defaultColumn = (setting: ServerConfig.Setting): string =>
  setting.default ?? (setting.required ? "required" : "none")

/**
 * The settings as lines: a header, then one line a setting, its columns aligned (the meaning last, unpadded).
 *
 * @since 0.1.0
 */
export const text = (settings: ReadonlyArray<ServerConfig.Setting>): string => {
  const rows: ReadonlyArray<ReadonlyArray<string>> = [
    ["KEY", "ENV", "DEFAULT", "READ BY", "MEANING"],
    ...settings.map((s) => [s.key, s.env, defaultColumn(s), s.readBy.join(","), s.description])
  ]
  const widths = rows[0]!.map((_, column) => Math.max(...rows.map((row) => row[column]!.length)))
  return rows
    .map((row) =>
      row
        .map((cell, column) => (column === row.length - 1 ? cell : cell.padEnd(widths[column]!)))
        .join("  ")
        .trimEnd()
    )
    .join("\n")
}

/**
 * The settings as one JSON array: `key`, `env`, `default` (its text, or null), `required`, `readBy`, `description`.
 *
 * @since 0.1.0
 */
export const json = (settings: ReadonlyArray<ServerConfig.Setting>): string =>
  JSON.stringify(
    settings.map((s) => ({
      key: s.key,
      env: s.env,
      default: s.default ?? null,
      required: s.required,
      readBy: s.readBy,
      description: s.description
    })),
    null,
    2
  )

/**
 * What `strata config list` prints, in `output`'s form.
 *
 * @since 0.1.0
 */
export const render = (output: "text" | "json"): string =>
  output === "json" ? json(ServerConfig.settingsList()) : text(ServerConfig.settingsList())
