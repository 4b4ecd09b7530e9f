import { assert, describe, it } from "@effect/vitest"
import { Exit, Schema } from "effect"
import { HostPort } from "../src/index.js"

describe("HostPort", () => {
  it("reads a host name, an IPv4 address or a bracketed IPv6 address, and a port", () => {
    assert.deepStrictEqual(HostPort.parse("kafka-1.example.com:9092"), { host: "kafka-1.example.com", port: 9092 })
    assert.deepStrictEqual(HostPort.parse("127.0.0.1:1"), { host: "127.0.0.1", port: 1 })
    assert.deepStrictEqual(HostPort.parse("[::1]:65535"), { host: "::1", port: 65535 })
    assert.deepStrictEqual(HostPort.parse("broker_2:2181"), { host: "broker_2", port: 2181 })
    assert.strictEqual(HostPort.format({ host: "::1", port: 9000 }), "[::1]:9000")
    assert.strictEqual(HostPort.format({ host: "a", port: 1 }), "a:1")
  })

  it("refuses what is not host:port, saying why", () => {
    for (const bad of ["no-port", ":9092", "a b:1", "a,b:1", "a/b:1", "::1:9000", "[::1]", "host:port", "h:123456"]) {
      assert.isUndefined(HostPort.parse(bad), bad)
      assert.strictEqual(HostPort.invalid(bad), "expected host:port", bad)
    }
    assert.strictEqual(HostPort.invalid("h:0"), "port 0 is outside 1–65535")
    assert.strictEqual(HostPort.invalid("h:65536"), "port 65536 is outside 1–65535")
    assert.isUndefined(HostPort.parse("h:0"))
  })

  it("port 0 (any free port) only for an address to listen on", () => {
    assert.deepStrictEqual(HostPort.parse("127.0.0.1:0", { listen: true }), { host: "127.0.0.1", port: 0 })
    assert.strictEqual(HostPort.invalid("h:65536", { listen: true }), "port 65536 is outside 0–65535")
  })

  it("HostPortString refuses with the reason", () => {
    assert.isTrue(Exit.isSuccess(Schema.decodeUnknownExit(HostPort.HostPortString)("a:1")))
    const bad = Schema.decodeUnknownExit(HostPort.HostPortString)("a:0")
    assert.isTrue(Exit.isFailure(bad))
    assert.include(String(bad), "port 0 is outside 1–65535")
  })
})
