/**
 * The replica services' `layerConfig`: options read from configuration go through the same Schema as `layer`'s, so a
 * wrong value is the same typed error naming the option.
 */
import { assert, describe, it } from "@effect/vitest"
import { MemoryCoordination } from "@strata/core"
import { Config, ConfigProvider, Effect, Layer } from "effect"
import * as TabletClient from "../src/client/TabletClient.js"
import * as StrataLog from "../src/log/StrataLog.js"
import * as ServerStorage from "../src/server/ServerStorage.js"
import * as TabletServer from "../src/server/TabletServer.js"
import { Peers } from "../src/wire/Peers.js"

const unused = Effect.die("not called in this test")
const peers = Layer.succeed(Peers, {
  leader: () => ({ fetch: () => unused, endOffsetForEpoch: () => unused }),
  controller: { adjustIsr: () => unused, controlledShutdown: () => unused, replicaStorage: () => unused }
})

const withConfig = (values: Record<string, unknown>) =>
  Effect.provide(ConfigProvider.layer(ConfigProvider.fromUnknown(values)))

describe("layerConfig", () => {
  it.live("a tablet server takes its id and settings from configuration", () =>
    Effect.gen(function* () {
      const layer = TabletServer.layerConfig({
        serverId: Config.Number("SERVER_ID"),
        replication: Config.succeed({ minInsyncReplicas: 1 })
      })
      const id = yield* Effect.scoped(
        Effect.map(Layer.build(layer.pipe(Layer.provide([ServerStorage.layerMemory, peers]))), (ctx) =>
          ctx.mapUnsafe.get(TabletServer.TabletServer.key)
        )
      ).pipe(withConfig({ SERVER_ID: 7 }))
      assert.strictEqual((id as TabletServer.TabletServerShape).serverId, 7)
      const bad = yield* Effect.flip(
        Effect.scoped(
          Layer.build(
            TabletServer.layerConfig({ serverId: Config.Number("SERVER_ID") }).pipe(
              Layer.provide([ServerStorage.layerMemory, peers])
            )
          )
        ).pipe(withConfig({ SERVER_ID: -3 }))
      )
      assert.strictEqual(bad._tag, "InvalidReplicaOptions")
      assert.include(bad.message, "serverId")
    })
  )

  it.live("the client and the log refuse a wrong setting from configuration, naming it", () =>
    Effect.gen(function* () {
      const client = yield* Effect.flip(
        Effect.scoped(
          Layer.build(
            TabletClient.layerConfig({ linger: Config.Number("LINGER") }).pipe(
              Layer.provide(MemoryCoordination.layer())
            )
          )
        ).pipe(withConfig({ LINGER: -1 }))
      )
      assert.strictEqual(client._tag, "InvalidReplicaOptions")
      assert.include(client.message, "linger")
      const log = yield* Effect.flip(
        Effect.scoped(
          Layer.build(
            StrataLog.layerConfig({ client: Config.map(Config.String("NS"), (namespace) => ({ namespace })) }).pipe(
              Layer.provide(MemoryCoordination.layer())
            )
          )
        ).pipe(withConfig({}))
      )
      assert.strictEqual(log._tag, "ConfigError")
    })
  )
})
