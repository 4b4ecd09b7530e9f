/**
 * EtcdCoordination on an etcd that requires TLS with client certificates (`--client-cert-auth`) and password
 * authentication (`auth enable`): an etcd of the test's own, on certificates the test makes with openssl, started
 * from the etcd binary `scripts/services` installs.
 */
import { assert, describe, it } from "@effect/vitest"
import { Coordination } from "@strata/core"
import { CoordinationConformance } from "@strata/core/testing"
import { Effect, Layer } from "effect"
import { afterAll, beforeAll } from "vitest"
import { securedEtcd } from "../../../scripts/test-support/securedEtcd.js"
import * as EtcdCoordination from "../src/EtcdCoordination.js"

const etcd = securedEtcd()
const PASSWORD = etcd.password
const pem = etcd.pem
let endpoint = ""
beforeAll(async () => {
  endpoint = await etcd.start()
}, 60_000)
afterAll(() => etcd.stop())

/** The layer, built once the test's etcd runs (its port is known then). */
const secured = (overrides: Partial<EtcdCoordination.EtcdCoordinationOptions> = {}) =>
  Layer.unwrap(
    Effect.sync(() =>
      EtcdCoordination.layer({
        endpoints: [endpoint],
        root: `/strata-tls-${Date.now()}`,
        tls: { ca: pem("ca.pem"), cert: pem("client.pem"), key: pem("client-key.pem") },
        auth: { username: "strata", password: PASSWORD },
        ...overrides
      })
    )
  )

CoordinationConformance.suite("etcd over TLS with a client certificate and password authentication", secured())

describe("EtcdCoordination on a secured etcd", () => {
  const failure = (layer: Layer.Layer<Coordination.Coordination, Coordination.CoordinationError>) =>
    Effect.flip(
      Effect.gen(function* () {
        const session = yield* (yield* Coordination.Coordination).session()
        yield* session.create("/probe", new Uint8Array(0))
      }).pipe(Effect.scoped, Effect.provide(layer))
    )

  it.live("a wrong password is NotAuthorized, not retried, and the password is not in it", () =>
    Effect.gen(function* () {
      const e = yield* failure(secured({ auth: { username: "strata", password: "wrong-pass-77" } }))
      assert.strictEqual(e.reason._tag, "NotAuthorized")
      assert.notInclude(e.message, "wrong-pass-77")
    })
  )

  it.live("without the client certificate, or without the CA, nothing connects", () =>
    Effect.gen(function* () {
      const noCert = yield* failure(secured({ tls: { ca: pem("ca.pem") } }))
      assert.strictEqual(noCert.reason._tag, "CoordinationUnreachable")
      const noCa = yield* failure(secured({ tls: undefined }))
      assert.oneOf(noCa.reason._tag, ["CoordinationUnreachable", "InvalidCoordinationOptions"])
    })
  )
})
