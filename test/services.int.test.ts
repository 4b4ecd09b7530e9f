// Smoke test of the real servers started by scripts/services (through scripts/vitest-services.ts),
// each touched through the client library its adapter uses.
import { randomUUID } from "node:crypto"
import { createRequire } from "node:module"
import { Etcd3 } from "etcd3"
import { Kafka, logLevel } from "kafkajs"
import zookeeper from "node-zookeeper-client"
import { describe, expect, inject, it } from "vitest"
import type {} from "../scripts/vitest-services.js" // the ProvidedContext augmentation

const run = randomUUID().slice(0, 8) // unique names per run, so reruns never collide

/** Rejects when `promise` has not settled after `ms` milliseconds (`what` is read at that moment). */
function within<A>(ms: number, what: string | (() => string), promise: Promise<A>): Promise<A> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_, reject) => {
    const label = () => (typeof what === "string" ? what : what())
    timer = setTimeout(() => reject(new Error(`${label()}: no result after ${ms} ms`)), ms)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

/** Turns a node-style callback call into a promise. */
function call<A>(f: (callback: (error: Error | null, result?: A) => void) => void): Promise<A> {
  return new Promise((resolve, reject) => f((error, result) => (error ? reject(error) : resolve(result as A))))
}

describe("services", () => {
  it("hands out addresses through inject() and the environment", () => {
    expect(inject("zookeeper")).toMatch(/^127\.0\.0\.1:\d+$/)
    expect(inject("etcd")).toMatch(/^127\.0\.0\.1:\d+$/)
    expect(inject("kafka")).toMatch(/^127\.0\.0\.1:\d+$/)
    expect(process.env.STRATA_ZK).toBe(inject("zookeeper"))
    expect(process.env.STRATA_ETCD).toBe(inject("etcd"))
    expect(process.env.STRATA_KAFKA).toBe(inject("kafka"))
  })

  it("zookeeper: ephemeral-sequential node, watch fires NODE_DELETED", { timeout: 30_000 }, async () => {
    const client = zookeeper.createClient(inject("zookeeper"), { sessionTimeout: 10_000, retries: 2 })
    try {
      const connected = new Promise<void>((resolve) => client.once("connected", () => resolve()))
      client.connect()
      await within(10_000, "zookeeper connect", connected)

      const root = `/strata-smoke-${run}`
      await call<string>((cb) => client.mkdirp(root, cb))
      const path = await call<string>((cb) =>
        client.create(`${root}/node-`, Buffer.from("hello"), zookeeper.CreateMode.EPHEMERAL_SEQUENTIAL, cb)
      )
      expect(path).toMatch(new RegExp(`^${root}/node-\\d{10}$`))

      // One-shot watches through both exists() and getData().
      let existsWatch!: (type: number) => void
      let dataWatch!: (type: number) => void
      const existsFired = new Promise<number>((resolve) => (existsWatch = resolve))
      const dataFired = new Promise<number>((resolve) => (dataWatch = resolve))
      const stat = await call((cb) => client.exists(path, (event) => existsWatch(event.getType()), cb))
      expect(stat).not.toBeNull()
      const data = await call<Buffer | null>((cb) => client.getData(path, (event) => dataWatch(event.getType()), cb))
      expect(data?.toString()).toBe("hello")

      await call((cb) => client.remove(path, -1, cb))
      expect(await within(5_000, "exists watch", existsFired)).toBe(zookeeper.Event.NODE_DELETED)
      expect(await within(5_000, "getData watch", dataFired)).toBe(zookeeper.Event.NODE_DELETED)
      expect(await call((cb) => client.exists(path, cb))).toBeNull()

      await call((cb) => client.removeRecursive(root, -1, cb))
    } finally {
      client.close()
    }
  })

  it("etcd: lease-bound key, compare-and-swap on mod_revision, revoke deletes", { timeout: 30_000 }, async () => {
    // etcd ids (leases, members) are int64. etcd3 decodes them exactly only if its protobufjs can
    // require("long") as CommonJS; a Node `--conditions import` (vitest passes ssr.resolve.conditions
    // to its workers) hands it long's ESM build instead, ids get rounded and leases are "not found".
    const fromEtcd3 = createRequire(createRequire(import.meta.url).resolve("etcd3"))
    const protobuf = createRequire(fromEtcd3.resolve("@grpc/proto-loader"))("protobufjs") as {
      util: { Long: unknown }
    }
    expect(
      protobuf.util.Long,
      'protobufjs has no long.js: remove "import"/"module"/"default" from ssr.resolve.conditions in vitest.config.ts'
    ).toBeTruthy()

    const client = new Etcd3({ hosts: inject("etcd"), dialTimeout: 5_000 })
    try {
      const key = `strata-smoke/${run}/key`
      const lease = client.lease(30, { autoKeepAlive: false })
      const leaseId = await within(10_000, "lease grant", lease.grant())
      await lease.put(key).value("v1")

      const first = await client.get(key).exec()
      const revision = first.kvs[0]?.mod_revision
      expect(revision).toBeDefined()
      expect(first.kvs[0]?.lease).toBe(leaseId)

      // Succeeds: nobody wrote since we read the revision. Keep the key on the lease.
      const swapped = await client
        .if(key, "Mod", "==", revision as string)
        .then(client.put(key).value("v2").lease(leaseId))
        .commit()
      expect(swapped.succeeded).toBe(true)
      expect(await client.get(key).string()).toBe("v2")

      // Fails: the revision we hold is stale now.
      const stale = await client
        .if(key, "Mod", "==", revision as string)
        .then(client.put(key).value("v3").lease(leaseId))
        .commit()
      expect(stale.succeeded).toBe(false)
      expect(await client.get(key).string()).toBe("v2")

      await lease.revoke()
      expect(await client.get(key).string()).toBeNull()
    } finally {
      client.close()
    }
  })

  it("kafka: 1000 records through a 3-partition topic with acks=-1 and a consumer group", {
    timeout: 90_000
  }, async () => {
    const kafka = new Kafka({ clientId: `strata-smoke-${run}`, brokers: [inject("kafka")], logLevel: logLevel.NOTHING })
    const topic = `strata-smoke-${run}`
    const total = 1000
    const admin = kafka.admin()
    const producer = kafka.producer()
    // A short broker-side long poll: disconnect() waits for the fetch in flight (default 5 s).
    const consumer = kafka.consumer({ groupId: `strata-smoke-${run}`, maxWaitTimeInMs: 250 })
    try {
      await admin.connect()
      expect(await admin.createTopics({ topics: [{ topic, numPartitions: 3 }], waitForLeaders: true })).toBe(true)

      await producer.connect()
      const records = Array.from({ length: total }, (_, i) => ({ key: `k${i}`, value: `v${i}-${run}` }))
      const acks = await producer.send({ topic, acks: -1, messages: records })
      expect(new Set(acks.map((ack) => ack.partition)).size).toBe(3) // keys spread over all partitions

      await consumer.connect()
      await consumer.subscribe({ topic, fromBeginning: true })
      const seen = new Map<string, string>()
      let duplicates = 0
      const done = new Promise<void>((resolve, reject) => {
        consumer
          .run({
            eachMessage: async ({ message }) => {
              const key = message.key?.toString() ?? ""
              if (seen.has(key)) duplicates++
              seen.set(key, message.value?.toString() ?? "")
              if (seen.size === total) resolve()
            }
          })
          .catch(reject)
      })
      await within(60_000, () => `consuming ${total} records (got ${seen.size})`, done)

      expect(seen.size).toBe(total)
      expect(duplicates).toBe(0)
      for (const { key, value } of records) expect(seen.get(key)).toBe(value)

      const offsets = await admin.fetchTopicOffsets(topic)
      expect(offsets.reduce((sum, p) => sum + Number(p.high), 0)).toBe(total)
    } finally {
      await consumer.disconnect()
      await producer.disconnect()
      await admin.deleteTopics({ topics: [topic] }).catch(() => undefined)
      await admin.disconnect()
    }
  })
})
