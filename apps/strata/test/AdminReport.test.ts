import { assert, describe, it } from "@effect/vitest"
import type { ReplicaRpc } from "@strata/replica"
import * as AdminReport from "../src/AdminReport.js"

type Tablet = typeof ReplicaRpc.TabletMetadata.Type

const tablet = (
  table: string,
  bucket: number,
  replicas: ReadonlyArray<number>,
  isr: ReadonlyArray<number>,
  more: Partial<Tablet> = {}
): Tablet => ({
  tablet: { table, bucket },
  replicas,
  state: "OnlineTablet",
  leader: isr[0] ?? null,
  leaderEpoch: 1,
  isr,
  ...more
})

const metadata = (tablets: ReadonlyArray<Tablet>): ReplicaRpc.Metadata => ({
  coordinatorEpoch: 2,
  servers: [{ id: 1, address: "127.0.0.1:1" }],
  tablets
})

describe("the operator's commands' report", () => {
  it("lists tables by name with their tablets and largest replica count (a moving tablet by its target)", () => {
    const summaries = AdminReport.tables(
      metadata([
        tablet("orders", 0, [1, 2, 3], [1, 2, 3]),
        tablet("events", 0, [1, 2], [1, 2]),
        tablet("orders", 1, [1, 2, 3, 4], [1, 2, 3], { target: [2, 3, 4], original: [1, 2, 3] }),
        tablet("old", 0, [1], [1], { state: "DeletingTablet" })
      ])
    )
    assert.deepStrictEqual(summaries, [
      { name: "events", tablets: 1, replicationFactor: 2, deleting: false },
      { name: "old", tablets: 1, replicationFactor: 1, deleting: true },
      { name: "orders", tablets: 2, replicationFactor: 3, deleting: false }
    ])
    assert.deepStrictEqual(AdminReport.tableLines(summaries), [
      "events\ttablets 1\trf 2",
      "old\ttablets 1\trf 1\tdeleting",
      "orders\ttablets 2\trf 3"
    ])
  })

  it("a table's retention is listed after its replication factor when it has one", () => {
    const week = { ms: 604_800_000, bytes: 1_073_741_824 }
    const summaries = AdminReport.tables(
      metadata([
        tablet("kept", 0, [1, 2], [1, 2], { retention: week }),
        tablet("kept", 1, [2, 1], [2, 1], { retention: week }),
        tablet("timed", 0, [1], [1], { retention: { ms: 1_000 } }),
        tablet("sized", 0, [1], [1], { retention: { bytes: 4_096 }, state: "DeletingTablet" }),
        tablet("plain", 0, [1], [1])
      ])
    )
    assert.deepStrictEqual(summaries, [
      { name: "kept", tablets: 2, replicationFactor: 2, deleting: false, retention: week },
      { name: "plain", tablets: 1, replicationFactor: 1, deleting: false },
      { name: "sized", tablets: 1, replicationFactor: 1, deleting: true, retention: { bytes: 4_096 } },
      { name: "timed", tablets: 1, replicationFactor: 1, deleting: false, retention: { ms: 1_000 } }
    ])
    assert.deepStrictEqual(AdminReport.tableLines(summaries), [
      "kept\ttablets 2\trf 2\tretention-ms 604800000\tretention-bytes 1073741824",
      "plain\ttablets 1\trf 1",
      "sized\ttablets 1\trf 1\tretention-bytes 4096\tdeleting",
      "timed\ttablets 1\trf 1\tretention-ms 1000"
    ])
  })

  it("each filter selects its tablets, never one being deleted; counts are the filters' sizes", () => {
    const full = tablet("t", 0, [1, 2, 3], [1, 2, 3])
    const shrunk = tablet("t", 1, [1, 2, 3], [1, 2])
    const alone = tablet("t", 2, [1, 2, 3], [1])
    const offline = tablet("t", 3, [1, 2, 3], [3], { state: "OfflineTablet", leader: null })
    // Moving to [2,3,4] with an ISR of three: as many in-sync copies as the tablet ends with.
    const moving = tablet("t", 4, [1, 2, 3, 4], [1, 2, 3], { target: [2, 3, 4], original: [1, 2, 3] })
    const deleting = tablet("t", 5, [1, 2, 3], [], { state: "DeletingTablet", leader: null })
    const all = [full, shrunk, alone, offline, moving, deleting]
    const selected = (filter: AdminReport.TabletFilter) =>
      all.filter((t) => AdminReport.selects(filter, 2, t)).map((t) => t.tablet.bucket)
    assert.deepStrictEqual(selected("under-replicated"), [1, 2, 3])
    assert.deepStrictEqual(selected("unavailable"), [3])
    assert.deepStrictEqual(selected("under-min-isr"), [2, 3])
    assert.deepStrictEqual(AdminReport.counts(all, 2), {
      total: 6,
      offline: 1,
      underReplicated: 3,
      underMinIsr: 2,
      deleting: 1
    })
    assert.deepStrictEqual(AdminReport.counts(all, 3).underMinIsr, 3)
  })

  it("down servers are those the tablets name that are not registered", () => {
    const tablets = [
      tablet("t", 0, [1, 5, 3], [1]),
      tablet("t", 1, [4, 1], [1]),
      tablet("gone", 0, [9], [], { state: "DeletingTablet" })
    ]
    assert.deepStrictEqual(AdminReport.downServers(tablets, [{ id: 1 }, { id: 3 }]), [4, 5])
  })

  it("status lines: coordinators with the leader and its epoch, servers, tablets; unknown without a leader", () => {
    const status: AdminReport.ClusterStatus = {
      coordinators: [
        { id: 101, address: "127.0.0.1:7001", leader: true },
        { id: 102, address: "127.0.0.1:7002", leader: false }
      ],
      leader: { id: 101, epoch: 4, address: "127.0.0.1:7001" },
      servers: [
        { id: 1, address: "127.0.0.1:8001", rack: "a" },
        { id: 2, address: "127.0.0.1:8002", dataAddress: "127.0.0.1:9002" }
      ],
      down: [3],
      minInsyncReplicas: 2,
      tablets: { total: 6, offline: 1, underReplicated: 3, underMinIsr: 2, deleting: 1 }
    }
    assert.deepStrictEqual(AdminReport.statusLines(status), [
      "coordinators\t2 registered\tleader 101\tcoordinator epoch 4",
      "coordinator 101\t127.0.0.1:7001\tleader",
      "coordinator 102\t127.0.0.1:7002",
      "tablet servers\t2 live\t1 down (3)",
      "server 1\t127.0.0.1:8001\track a",
      "server 2\t127.0.0.1:8002\tdata link 127.0.0.1:9002",
      "tablets\t6\toffline 1\tunder-replicated 3\tunder min ISR 2 (minInsyncReplicas 2)\tdeleting 1"
    ])
    assert.deepStrictEqual(
      AdminReport.statusLines({ ...status, coordinators: [], leader: null, servers: [], down: null, tablets: null }),
      ["coordinators\t0 registered\tno leader", "tablet servers\t0 live", "tablets\tunknown: no coordinator leads"]
    )
  })
})
