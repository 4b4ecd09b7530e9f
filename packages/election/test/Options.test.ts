import { type Coordination, Election, MemoryCoordination } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import { Config, ConfigProvider, Duration, Effect, Exit, Layer, Schema } from "effect"
import * as CoordinationElection from "../src/CoordinationElection.js"
import * as Coordinator from "../src/Coordinator.js"
import * as EtcdCoordination from "../src/EtcdCoordination.js"
import * as ZooKeeperCoordination from "../src/ZooKeeperCoordination.js"

// Every case fails in `make`, before any connection: no server is needed. A case that wrongly passed validation
// would try to reach 127.0.0.1:1 (nothing listens there) and fail with another reason, or time out.

/** Runs `effect` and returns its typed failure; a success or a defect fails the test. */
const failure = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const exit = yield* Effect.exit(Effect.scoped(effect))
    if (Exit.isSuccess(exit)) return assert.fail("expected a failure, got a success")
    const error = exit.cause.reasons.find((r) => r._tag === "Fail")
    if (error?._tag !== "Fail") return assert.fail(`expected a typed failure, got ${String(exit.cause)}`)
    return error.error
  })

/** Asserts a coordination failure is `InvalidCoordinationOptions` naming `option` and (a part of) its bad value. */
const assertInvalid = (error: unknown, backend: string, option: string, value: string) => {
  const e = error as Coordination.CoordinationError
  assert.strictEqual(e._tag, "CoordinationError")
  assert.strictEqual(e.reason._tag, "InvalidCoordinationOptions", e.message)
  if (e.reason._tag !== "InvalidCoordinationOptions") return
  assert.strictEqual(e.reason.backend, backend)
  assert.strictEqual(e.reason.option, option)
  assert.include(e.reason.value, value)
  assert.isFalse(e.retryable, "a bad option is not worth retrying")
  assert.include(e.message, option)
  assert.include(e.message, value)
  assert.notInclude(e.message, "cannot reach")
  assert.notInclude(e.message, "\n")
}

const zookeeper = (options: ZooKeeperCoordination.ZooKeeperCoordinationOptions) =>
  failure(ZooKeeperCoordination.make({ connectTimeout: 2000, ...options }))

const etcd = (options: EtcdCoordination.EtcdCoordinationOptions) => failure(EtcdCoordination.make(options))

describe("ZooKeeperCoordination options", { timeout: 20_000 }, () => {
  it.live(
    "a port outside 1–65535 is InvalidCoordinationOptions naming connectString, not CoordinationUnreachable",
    () =>
      Effect.gen(function* () {
        assertInvalid(yield* zookeeper({ connectString: "127.0.0.1:99999" }), "zookeeper", "connectString", "99999")
        assertInvalid(
          yield* zookeeper({ connectString: "127.0.0.1:2181,127.0.0.1:0" }),
          "zookeeper",
          "connectString",
          "127.0.0.1:0"
        )
        assertInvalid(yield* zookeeper({ connectString: "no port here" }), "zookeeper", "connectString", "no port here")
      })
  )

  it.live("a relative root is InvalidCoordinationOptions naming root", () =>
    Effect.gen(function* () {
      assertInvalid(yield* zookeeper({ connectString: "127.0.0.1:1", root: "strata" }), "zookeeper", "root", "strata")
      assertInvalid(yield* zookeeper({ connectString: "127.0.0.1:1", root: "/a//b" }), "zookeeper", "root", "/a//b")
    })
  )

  it.live("a negative, infinite or unreadable timeout is InvalidCoordinationOptions naming it", () =>
    Effect.gen(function* () {
      assertInvalid(
        yield* zookeeper({ connectString: "127.0.0.1:1", sessionTimeout: -100 }),
        "zookeeper",
        "sessionTimeout",
        "-100"
      )
      assertInvalid(
        yield* zookeeper({ connectString: "127.0.0.1:1", sessionTimeout: "Infinity" }),
        "zookeeper",
        "sessionTimeout",
        "Infinity"
      )
      assertInvalid(
        yield* zookeeper({ connectString: "127.0.0.1:1", connectTimeout: "soon" as Duration.Input }),
        "zookeeper",
        "connectTimeout",
        "soon"
      )
      // An option it does not know (the old name) is refused, not ignored.
      assertInvalid(
        yield* zookeeper({
          connectString: "127.0.0.1:1",
          sessionTimeoutMs: 6000
        } as unknown as ZooKeeperCoordination.ZooKeeperCoordinationOptions),
        "zookeeper",
        "sessionTimeoutMs",
        "6000"
      )
    })
  )

  it("a timeout takes any Duration.Input, a number being milliseconds", () => {
    const decode = Schema.decodeUnknownSync(ZooKeeperCoordination.ZooKeeperCoordinationOptions)
    const o = decode({ connectString: "127.0.0.1:2181", sessionTimeout: "2 seconds", connectTimeout: 1500 })
    assert.strictEqual(Duration.toMillis(o.sessionTimeout), 2000)
    assert.strictEqual(Duration.toMillis(o.connectTimeout), 1500)
    const defaults = decode({ connectString: "127.0.0.1:2181" })
    assert.strictEqual(Duration.toMillis(defaults.sessionTimeout), 10_000)
    assert.strictEqual(Duration.toMillis(defaults.connectTimeout), 10_000)
  })

  it.live("layerConfig goes through the same schema", () =>
    Effect.gen(function* () {
      const layer = ZooKeeperCoordination.layerConfig({
        connectString: Config.String("ZK"),
        root: Config.String("ROOT")
      }).pipe(Layer.provide(ConfigProvider.layer(ConfigProvider.fromUnknown({ ZK: "127.0.0.1:1", ROOT: "relative" }))))
      assertInvalid(yield* failure(Layer.build(layer)), "zookeeper", "root", "relative")
    })
  )
})

describe("EtcdCoordination options", { timeout: 20_000 }, () => {
  it.live("no endpoints is a typed InvalidCoordinationOptions, not a thrown error", () =>
    Effect.gen(function* () {
      assertInvalid(yield* etcd({ endpoints: [] }), "etcd", "endpoints", "[]")
    })
  )

  it.live("a port outside 1–65535, or an endpoint that is no URL, is InvalidCoordinationOptions naming it", () =>
    Effect.gen(function* () {
      assertInvalid(yield* etcd({ endpoints: ["http://127.0.0.1:99999"] }), "etcd", "endpoints[0]", "99999")
      assertInvalid(
        yield* etcd({ endpoints: ["http://127.0.0.1:1", "ftp://x:1"] }),
        "etcd",
        "endpoints[1]",
        "ftp://x:1"
      )
      assertInvalid(
        yield* etcd({ endpoints: ["http://127.0.0.1:1", "https://127.0.0.1:2"] }),
        "etcd",
        "endpoints",
        "https://127.0.0.1:2"
      )
    })
  )

  it.live("a negative or unreadable session timeout is InvalidCoordinationOptions naming sessionTimeout", () =>
    Effect.gen(function* () {
      assertInvalid(
        yield* etcd({ endpoints: ["http://127.0.0.1:1"], sessionTimeout: -100 }),
        "etcd",
        "sessionTimeout",
        "-100"
      )
      assertInvalid(
        yield* etcd({ endpoints: ["http://127.0.0.1:1"], sessionTimeout: "soon" as Duration.Input }),
        "etcd",
        "sessionTimeout",
        "soon"
      )
    })
  )

  it("a session timeout takes any Duration.Input, a number being milliseconds", () => {
    const decode = Schema.decodeUnknownSync(EtcdCoordination.EtcdCoordinationOptions)
    const endpoints = ["http://127.0.0.1:2379"]
    assert.strictEqual(Duration.toMillis(decode({ endpoints, sessionTimeout: "2 seconds" }).sessionTimeout), 2000)
    assert.strictEqual(Duration.toMillis(decode({ endpoints, sessionTimeout: 3000 }).sessionTimeout), 3000)
    assert.strictEqual(Duration.toMillis(decode({ endpoints }).sessionTimeout), 10_000)
  })

  it.live("a relative root is InvalidCoordinationOptions naming root", () =>
    Effect.gen(function* () {
      assertInvalid(yield* etcd({ endpoints: ["http://127.0.0.1:1"], root: "strata" }), "etcd", "root", "strata")
    })
  )

  it.live("layerConfig goes through the same schema", () =>
    Effect.gen(function* () {
      const layer = EtcdCoordination.layerConfig({
        endpoints: Config.succeed(["http://127.0.0.1:1"]),
        sessionTimeout: Config.Int("TIMEOUT")
      }).pipe(Layer.provide(ConfigProvider.layer(ConfigProvider.fromUnknown({ TIMEOUT: "-100" }))))
      assertInvalid(yield* failure(Layer.build(layer)), "etcd", "sessionTimeout", "-100")
    })
  )
})

/** Asserts an election failure is `InvalidElectionOptions` naming `option` and its bad value. */
const assertInvalidElection = (error: unknown, option: string, value: string) => {
  const e = error as Election.ElectionError
  assert.strictEqual(e._tag, "ElectionError")
  assert.strictEqual(e.reason._tag, "InvalidElectionOptions", e.message)
  if (e.reason._tag !== "InvalidElectionOptions") return
  assert.strictEqual(e.reason.option, option)
  assert.include(e.message, value)
}

const election = (options: CoordinationElection.CoordinationElectionOptions) =>
  failure(CoordinationElection.make(options).pipe(Effect.provide(MemoryCoordination.layer())))

describe("CoordinationElection options", () => {
  it.effect("a session timeout that is no duration is InvalidElectionOptions, not a defect", () =>
    Effect.gen(function* () {
      assertInvalidElection(
        yield* election({ namespace: "o", sessionTimeout: "soon" as "1 second" }),
        "sessionTimeout",
        "soon"
      )
      assertInvalidElection(yield* election({ namespace: "o", sessionTimeout: -5 }), "sessionTimeout", "-5")
    })
  )

  it.effect("a namespace that is no path is InvalidElectionOptions naming namespace", () =>
    Effect.gen(function* () {
      assertInvalidElection(yield* election({ namespace: "a//b" }), "namespace", "a//b")
      assertInvalidElection(yield* election({ namespace: "a/../b" }), "namespace", "a/../b")
    })
  )

  it.effect("a replicaLagTimeMax that is no positive duration is InvalidElectionOptions naming it", () =>
    Effect.gen(function* () {
      assertInvalidElection(
        yield* election({ namespace: "o", replicaLagTimeMax: "-1 seconds" as "1 second" }),
        "replicaLagTimeMax",
        "-1 seconds"
      )
    })
  )

  it.effect("layerConfig goes through the same schema", () =>
    Effect.gen(function* () {
      const layer = CoordinationElection.layerConfig({ namespace: Config.String("NS") }).pipe(
        Layer.provide(MemoryCoordination.layer()),
        Layer.provide(ConfigProvider.layer(ConfigProvider.fromUnknown({ NS: "x//y" })))
      )
      assertInvalidElection(yield* failure(Layer.build(layer)), "namespace", "x//y")
    })
  )
})

/** Asserts a coordinator failure is `InvalidCoordinatorOptions` naming `option` and its bad value. */
const assertInvalidCoordinator = (error: unknown, option: string, value: string) => {
  const e = error as Coordinator.InvalidCoordinatorOptions
  assert.strictEqual(e._tag, "InvalidCoordinatorOptions", String(error))
  assert.strictEqual(e.option, option)
  assert.include(e.value, value)
  assert.include(e.message, option)
  assert.include(e.message, value)
}

const electionLayer = CoordinationElection.layer({ namespace: "/options-test" }).pipe(
  Layer.provide(MemoryCoordination.layer())
)
const coordinator = (options: Coordinator.Options) =>
  failure(Coordinator.make(options).pipe(Effect.provide(electionLayer)))

describe("Coordinator options", () => {
  it.effect("a rejoinBackoff that is no duration is InvalidCoordinatorOptions, not a defect", () =>
    Effect.gen(function* () {
      assertInvalidCoordinator(
        yield* coordinator({ serverId: 1, address: "h:1", rejoinBackoff: "soon" as "1 second" }),
        "rejoinBackoff",
        "soon"
      )
      assertInvalidCoordinator(
        yield* coordinator({ serverId: 1, address: "h:1", rejoinBackoff: -1 }),
        "rejoinBackoff",
        "-1"
      )
    })
  )

  it.effect("a negative server id or an empty address is InvalidCoordinatorOptions naming it", () =>
    Effect.gen(function* () {
      assertInvalidCoordinator(yield* coordinator({ serverId: -1, address: "h:1" }), "serverId", "-1")
      assertInvalidCoordinator(yield* coordinator({ serverId: 1, address: "" }), "address", '""')
      assertInvalidCoordinator(
        yield* coordinator({ serverId: 1, address: "h:1", services: [Coordinator.service("", () => Effect.void)] }),
        "services[0].name",
        '""'
      )
    })
  )

  it.effect("layerConfig goes through the same schema", () =>
    Effect.gen(function* () {
      const layer = Coordinator.layerConfig({
        serverId: Config.Int("SERVER_ID"),
        address: Config.String("ADDRESS")
      }).pipe(
        Layer.provide(electionLayer),
        Layer.provide(ConfigProvider.layer(ConfigProvider.fromUnknown({ SERVER_ID: "-3", ADDRESS: "h:1" })))
      )
      assertInvalidCoordinator(yield* failure(Layer.build(layer)), "serverId", "-3")
    })
  )

  it.effect("good options still build (the election in context is used)", () =>
    Effect.gen(function* () {
      const c = yield* Coordinator.make({ serverId: 1, address: "h:1", rejoinBackoff: 0 })
      assert.strictEqual(c.serverId, 1)
      yield* Election.Election
    }).pipe(Effect.scoped, Effect.provide(electionLayer))
  )
})
