/**
 * OpenTelemetry export of a server process's traces, metrics and logs through `Otlp` (OTLP/JSON over HTTP), on when
 * `OTEL_EXPORTER_OTLP_ENDPOINT` names a collector (`http://collector:4318`; unset: nothing is exported, and
 * `OTEL_SDK_DISABLED=true` turns it off). The spans: `strata.tablet.append`, `strata.tablet.fetch` (a tablet server),
 * `strata.controller.step` and `strata.election.campaign` (a coordinator); the resource names the process
 * (`service.name` `strata-<role>`, `strata.id`). The console log stays.
 *
 * @since 0.1.0
 */
import { Config, Effect, Layer, Option } from "effect"
import { FetchHttpClient } from "effect/http"
import { Otlp, OtlpSerialization } from "effect/observability"

/** Where to export, if anywhere. */
const collector = Config.all({
  endpoint: Config.option(Config.URL("OTEL_EXPORTER_OTLP_ENDPOINT")),
  disabled: Config.Boolean("OTEL_SDK_DISABLED").pipe(Config.withDefault(false))
})

/**
 * Runs `self` exporting to the collector `OTEL_EXPORTER_OTLP_ENDPOINT` names, or as it is without one; a malformed
 * endpoint fails naming it.
 *
 * @since 0.1.0
 */
export const exporting =
  (role: string, id: number) =>
  <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E | Config.ConfigError, R> =>
    Effect.flatMap(collector, ({ endpoint, disabled }) =>
      disabled || Option.isNone(endpoint)
        ? self
        : Effect.provide(
            self,
            Otlp.layer({
              baseUrl: endpoint.value.toString().replace(/\/$/, ""),
              resource: { serviceName: `strata-${role}`, attributes: { "strata.role": role, "strata.id": id } },
              loggerMergeWithExisting: true
            }).pipe(Layer.provide(FetchHttpClient.layer), Layer.provide(OtlpSerialization.layerJson))
          )
    )
