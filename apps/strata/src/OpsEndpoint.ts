/**
 * The ops HTTP endpoint every Strata process serves (`httpListen`), for operators and their tools:
 *
 * - `GET /metrics`: every metric of the process in Prometheus's text format (`PrometheusMetrics`), its gauges set
 *   from the process's state first;
 * - `GET /healthz`: 200 while the process is alive and its coordination session holds, else 503;
 * - `GET /readyz`: 200 once the process can do its work (a tablet server: registered and every hosted replica's log
 *   open; a coordinator: campaigning or leading, and a leader's controller started), else 503;
 * - `GET /cluster` (a coordinator): the tablet distribution as its controller holds it, as JSON (a standby answers
 *   503 naming the leader it knows);
 * - `GET /rebalance` (a coordinator): the rebalance status (`RebalanceService.Status`); `POST /rebalance` starts one
 *   (`?goals=replica-count,leader`), `POST /rebalance/pause`, `/rebalance/resume`, `/rebalance/cancel` act on it,
 *   each answering the status after it; a refusal is 409 with its reason, a standby 503 naming the leader.
 *
 * Health and readiness answer JSON: `{ "status": "ok" | "unavailable", "role", "id", "detail" }`.
 *
 * @since 0.1.0
 */
import { HostPort } from "@strata/core"
import { Planner } from "@strata/rebalance"
import { ControllerMetrics, type CoordinatorNode, type TabletServerNode } from "@strata/replica"
import { NodeHttpServer } from "@effect/platform-node"
import { createServer } from "node:http"
import { Data, Effect, type Scope } from "effect"
import { HttpRouter, type HttpServerRequest, HttpServerResponse } from "effect/http"
import { PrometheusMetrics } from "effect/observability"

/**
 * A probe's answer: whether the check passes, and what it found.
 *
 * @since 0.1.0
 */
export interface Check {
  readonly ok: boolean
  readonly detail: string
}

/**
 * What a process tells its endpoint.
 *
 * @since 0.1.0
 */
export interface Probes {
  /** `tablet-server` or `coordinator`. */
  readonly role: string
  readonly id: number
  readonly healthy: Effect.Effect<Check>
  readonly ready: Effect.Effect<Check>
  /** Sets the process's gauges from its state: run before each scrape. */
  readonly refresh: Effect.Effect<void>
  /** `GET /cluster`'s answer: the body, or why there is none here (answered 503). */
  readonly cluster?: Effect.Effect<
    { readonly ok: true; readonly body: unknown } | { readonly ok: false; readonly detail: string }
  >
  /** The `/rebalance` routes' answer to `action`: the status, a refusal (409), or why there is none here (503). */
  readonly rebalance?: (
    action: "start" | "status" | "pause" | "resume" | "cancel",
    goals: ReadonlyArray<string> | undefined
  ) => Effect.Effect<RebalanceAnswer>
}

/**
 * A `/rebalance` route's answer: the status after the action, the refusal, or that this process cannot answer.
 *
 * @since 0.1.0
 */
export type RebalanceAnswer =
  | { readonly _tag: "Status"; readonly body: unknown }
  | { readonly _tag: "Refused"; readonly reason: string; readonly detail: string }
  | { readonly _tag: "Unavailable"; readonly detail: string }

/**
 * The endpoint could not listen at its address.
 *
 * @since 0.1.0
 */
export class OpsListenFailed extends Data.TaggedError("OpsListenFailed")<{
  readonly address: string
  readonly detail: string
}> {
  /** @since 0.1.0 */
  override get message(): string {
    return `the ops HTTP endpoint cannot listen on ${this.address}: ${this.detail}`
  }
}

/** A probe's answer as a response: 200 or 503, with the JSON body the module describes. */
const checked = (probes: Probes, check: Effect.Effect<Check>) =>
  Effect.map(check, (c) =>
    HttpServerResponse.jsonUnsafe(
      { status: c.ok ? "ok" : "unavailable", role: probes.role, id: probes.id, detail: c.detail },
      { status: c.ok ? 200 : 503 }
    )
  )

/** A `/rebalance` answer as a response: 200 with the status, 409 with the refusal, 503 when this process cannot. */
const rebalanceResponse = (answer: RebalanceAnswer) => {
  switch (answer._tag) {
    case "Status":
      return HttpServerResponse.jsonUnsafe(answer.body)
    case "Refused":
      return HttpServerResponse.jsonUnsafe(
        { status: "refused", reason: answer.reason, detail: answer.detail },
        { status: 409 }
      )
    case "Unavailable":
      return HttpServerResponse.jsonUnsafe({ status: "unavailable", detail: answer.detail }, { status: 503 })
  }
}

/**
 * Serves the endpoint at `listen` (`host:port`, port 0: any free one) until the scope closes; the `host:port` it
 * listens on.
 *
 * @since 0.1.0
 */
export const serve = (listen: string, probes: Probes): Effect.Effect<string, OpsListenFailed, Scope.Scope> =>
  Effect.gen(function* () {
    const at = HostPort.parse(listen, { listen: true })
    if (at === undefined) {
      return yield* new OpsListenFailed({ address: listen, detail: "expected host:port (port 0: any free one)" })
    }
    const router = yield* HttpRouter.make
    yield* router.add(
      "GET",
      "/metrics",
      Effect.andThen(
        probes.refresh,
        Effect.map(PrometheusMetrics.format(), (body) =>
          HttpServerResponse.text(body, { contentType: "text/plain; version=0.0.4; charset=utf-8" })
        )
      )
    )
    yield* router.add("GET", "/healthz", checked(probes, probes.healthy))
    yield* router.add("GET", "/readyz", checked(probes, probes.ready))
    const cluster = probes.cluster
    if (cluster !== undefined) {
      yield* router.add(
        "GET",
        "/cluster",
        Effect.map(cluster, (answer) =>
          answer.ok
            ? HttpServerResponse.jsonUnsafe(answer.body)
            : HttpServerResponse.jsonUnsafe({ status: "unavailable", detail: answer.detail }, { status: 503 })
        )
      )
    }
    const rebalance = probes.rebalance
    if (rebalance !== undefined) {
      const route =
        (action: "start" | "status" | "pause" | "resume" | "cancel") =>
        (request: HttpServerRequest.HttpServerRequest) => {
          const goals = new URL(request.url, "http://ops").searchParams.get("goals")
          const given = goals === null ? undefined : goals.split(",").map((g) => g.trim())
          return Effect.map(rebalance(action, given), rebalanceResponse)
        }
      yield* router.add("GET", "/rebalance", route("status"))
      yield* router.add("POST", "/rebalance", route("start"))
      for (const action of ["pause", "resume", "cancel"] as const)
        yield* router.add("POST", `/rebalance/${action}`, route(action))
    }
    const server = yield* NodeHttpServer.make(() => createServer(), { host: at.host, port: at.port }).pipe(
      Effect.mapError(
        (e) =>
          new OpsListenFailed({
            address: listen,
            detail: e.cause instanceof Error ? e.cause.message : e.message || String(e.cause)
          })
      )
    )
    yield* server.serve(router.asHttpEffect())
    const port = server.address._tag === "UnixPathAddress" ? at.port : server.address.port
    return HostPort.format({ host: at.host, port })
  })

/**
 * A tablet server's probes: healthy while registered (its coordination session holds its registration), ready once
 * registered with every hosted replica's log open.
 *
 * @since 0.1.0
 */
export const tabletServerProbes = (node: TabletServerNode.TabletServerNode, id: number): Probes => {
  const server = node.server
  return {
    role: "tablet-server",
    id,
    healthy: Effect.map(server.registration, (registration) =>
      registration === undefined
        ? { ok: false, detail: "not registered: its coordination session ended, or it has not registered yet" }
        : { ok: true, detail: `registered (registration ${registration})` }
    ),
    ready: Effect.gen(function* () {
      const registration = yield* server.registration
      if (registration === undefined) return { ok: false, detail: "not registered" }
      const samples = yield* server.samples
      const loading = samples.filter((s) => !s.online).map((s) => `${s.tablet.table}:${s.tablet.bucket}`)
      if (loading.length > 0) {
        const named = loading.slice(0, 10).join(", ")
        return {
          ok: false,
          detail: `${loading.length} of ${samples.length} replicas not loaded (${named}${loading.length > 10 ? ", ..." : ""})`
        }
      }
      return { ok: true, detail: `registered (registration ${registration}), ${samples.length} replicas loaded` }
    }),
    refresh: server.refreshMetrics
  }
}

/**
 * A coordinator's probes: healthy until it is down; ready while campaigning, or leading with its controller
 * started; `/cluster` from its controller (a standby answers that it is not the leader).
 *
 * @since 0.1.0
 */
export const coordinatorProbes = (node: CoordinatorNode.CoordinatorNode, id: number): Probes => ({
  role: "coordinator",
  id,
  healthy: Effect.map(node.coordinator.state, (state) =>
    state._tag === "Down"
      ? { ok: false, detail: "down: its coordination session ended for good" }
      : { ok: true, detail: state._tag.toLowerCase() }
  ),
  ready: Effect.gen(function* () {
    const state = yield* node.coordinator.state
    switch (state._tag) {
      case "Electing":
        return { ok: true, detail: "campaigning (a standby)" }
      case "Leader": {
        const controller = yield* node.controller
        return controller === undefined
          ? { ok: false, detail: `leading at epoch ${state.epoch}, its controller starting` }
          : { ok: true, detail: `leading at epoch ${state.epoch}, its controller started` }
      }
      case "Standby":
        return { ok: false, detail: "not campaigning yet" }
      case "Down":
        return { ok: false, detail: "down" }
    }
  }),
  refresh: node.refreshMetrics,
  rebalance: (action, goals) => rebalanceOn(node, action, goals),
  cluster: Effect.gen(function* () {
    const controller = yield* node.controller
    if (controller === undefined) {
      const leader = yield* node.directory.controller.pipe(Effect.option)
      return {
        ok: false as const,
        detail: `this coordinator does not lead${leader._tag === "Some" ? `; the controller is at ${leader.value}` : ""}`
      }
    }
    const state = yield* controller.state
    const f = ControllerMetrics.figures(state)
    return {
      ok: true as const,
      body: {
        coordinatorEpoch: state.coordinatorEpoch,
        liveServers: [...state.live].sort((a, b) => a - b),
        tablets: {
          total: f.tablets,
          offline: f.offline,
          underReplicated: f.underReplicated,
          underMinIsr: f.underMinIsr,
          moving: f.moving
        },
        distribution: [...f.distribution]
          .sort(([a], [b]) => a - b)
          .map(([server, d]) => ({ server, replicas: d.replicas, leaders: d.leaders }))
      }
    }
  })
})

/** A `/rebalance` action on the coordinator's rebalance service, if it leads and runs one. */
const rebalanceOn = (
  node: CoordinatorNode.CoordinatorNode,
  action: "start" | "status" | "pause" | "resume" | "cancel",
  goals: ReadonlyArray<string> | undefined
): Effect.Effect<RebalanceAnswer> =>
  Effect.gen(function* () {
    const service = yield* node.rebalance
    if (service === undefined) {
      const leader = yield* node.directory.controller.pipe(Effect.option)
      return {
        _tag: "Unavailable" as const,
        detail: `this coordinator runs no rebalance (it does not lead)${leader._tag === "Some" ? `; the controller is at ${leader.value}` : ""}`
      }
    }
    const known = goals === undefined ? undefined : goals.filter((g): g is Planner.Goal => Planner.isGoal(g))
    if (goals !== undefined && known !== undefined && known.length !== goals.length) {
      const bad = goals.find((g) => !Planner.isGoal(g))
      return {
        _tag: "Refused" as const,
        reason: "PlanFailed",
        detail: `unknown goal ${bad} (goals: replica-count, leader, bytes)`
      }
    }
    const acted =
      action === "start"
        ? service.start(known === undefined ? {} : { goals: known })
        : action === "pause"
          ? service.pause
          : action === "resume"
            ? service.resume
            : action === "cancel"
              ? service.cancel
              : Effect.void
    return yield* Effect.andThen(acted, service.status).pipe(
      Effect.map((body): RebalanceAnswer => ({ _tag: "Status", body })),
      Effect.catch((e) =>
        Effect.succeed<RebalanceAnswer>({ _tag: "Refused", reason: e.reason._tag, detail: e.message })
      )
    )
  })
