import { Producer, Admin, ListOffsetTimestamps } from "@platformatic/kafka"
const base = { clientId: "dup", bootstrapBrokers: ["127.0.0.1:9092"] }
const admin = new Admin(base)
for (const prime of [false, true]) {
  const topic = `dup-${Date.now()}-${prime}`
  await admin.createTopics({ topics: [topic], partitions: 12, replicas: 1 })
  await new Promise(r => setTimeout(r, 1000))
  const p = new Producer({ ...base, idempotent: true, acks: -1 })
  const mk = (s) => Array.from({ length: 1000 }, (_, i) => ({ topic, partition: (s + i) % 12, key: Buffer.from("k"), value: Buffer.alloc(100) }))
  let sent = 0
  if (prime) { await p.send({ messages: mk(0) }); sent += 1000 }
  const t0 = performance.now()
  for (let round = 0; round < 10; round++) { await Promise.all([0,1,2,3].map(() => p.send({ messages: mk(0) }))); sent += 4000 }
  const ms = performance.now() - t0
  const l = await admin.listOffsets({ topics: [{ name: topic, partitions: Array.from({length:12},(_, i)=>({partitionIndex:i,timestamp:ListOffsetTimestamps.LATEST})) }] })
  const total = l[0].partitions.reduce((n, x) => n + Number(x.offset), 0)
  console.log({ prime, sent, total, ms: Math.round(ms) })
  await p.close(); await admin.deleteTopics({ topics: [topic] })
}
await admin.close()
