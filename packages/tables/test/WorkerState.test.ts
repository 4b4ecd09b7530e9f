import { Log, Models, TableManager } from "@strata/core"
import { assert, describe, it } from "@effect/vitest"
import * as WorkerState from "../src/internal/workerState.js"
import type { WorkerError } from "../src/Worker.js"

type Event = WorkerState.Event<WorkerError>
type Command = WorkerState.Command<WorkerError>

const TOPIC = "src"
const tp = (partition: number): Models.TopicPartition => ({ topic: TOPIC, partition })
const [p0, p1, p2] = [tp(0), tp(1), tp(2)]

const options = (overrides: Partial<WorkerState.Options> = {}): WorkerState.Options => ({
  commitIntervalMs: 1000,
  standbyReplicas: 1,
  exactlyOnce: false,
  ...overrides
})

/** Feeds events in order: the last state, and the commands of each step. */
const run = (state: WorkerState.State, events: ReadonlyArray<Event>) => {
  const steps: Array<ReadonlyArray<Command>> = []
  let s = state
  for (const event of events) {
    const [next, commands] = WorkerState.step(s, event)
    s = next
    steps.push(commands)
  }
  return { state: s, steps, last: steps[steps.length - 1] ?? [] }
}

const tags = (commands: ReadonlyArray<Command>) => commands.map((c) => c._tag)
const partition = (s: WorkerState.State, t: Models.TopicPartition) => s.partitions.get(Models.tpKey(t))

const refused = new TableManager.TableManagerError({
  reason: new TableManager.CommitFailed({ table: "counts", partition: 0, detail: "refused" })
})
const broken = new Log.LogError({ reason: new Log.InvalidRequest({ detail: "broken" }) })

/**
 * A worker started at 0, assigned p0, p1 and p2, each restored and started: p0 at 40 (the tables ahead of the
 * group, highwater 60), p1 at 25 (the group ahead, highwater 25), p2 at 7 (nothing committed: the log start;
 * highwater unknown). Lanes 4, 5, 6.
 */
const running = (o: Partial<WorkerState.Options> = {}) =>
  run(WorkerState.make(options(o)), [
    { _tag: "Started", now: 0 },
    { _tag: "Assigned", tps: [p0, p1, p2] },
    { _tag: "Ready", tp: p0, wait: 1 },
    { _tag: "Positions", tp: p0, wait: 1, resume: 40, committed: 25, logStart: 0, highwater: 60 },
    { _tag: "Ready", tp: p1, wait: 2 },
    { _tag: "Positions", tp: p1, wait: 2, resume: 10, committed: 25, logStart: 0, highwater: 25 },
    { _tag: "Ready", tp: p2, wait: 3 },
    { _tag: "Positions", tp: p2, wait: 3, resume: undefined, committed: undefined, logStart: 7, highwater: undefined }
  ]).state

describe("WorkerState: assignment", () => {
  it("an assignment pauses, hands the partitions to the tables and waits for each one's restore", () => {
    const { state, steps } = run(WorkerState.make(options()), [
      { _tag: "Started", now: 100 },
      { _tag: "Assigned", tps: [p0, p1] }
    ])
    assert.deepStrictEqual(steps[0], [{ _tag: "SetTimer", delayMs: 1000 }])
    assert.strictEqual(state.nextCommitAt, 1100)
    assert.deepStrictEqual(steps[1], [
      { _tag: "Pause", tps: [p0, p1] },
      { _tag: "AssignTables", tps: [p0, p1] },
      { _tag: "AwaitReady", tp: p0, wait: 1 },
      { _tag: "AwaitReady", tp: p1, wait: 2 },
      { _tag: "ReadMembership" }
    ])
    assert.isFalse(partition(state, p0)?.ready)
  })

  it("a restored partition starts where the tables or the group say, whichever is further, else at the log start", () => {
    const s = running()
    for (const [t, from, lane] of [
      [p0, 40, 4],
      [p1, 25, 5],
      [p2, 7, 6]
    ] as const) {
      const p = partition(s, t)
      assert.deepStrictEqual([p?.ready, p?.next, p?.committed, p?.lane], [true, from, from, lane])
    }
    const { last } = run(WorkerState.make(options()), [
      { _tag: "Assigned", tps: [p0] },
      { _tag: "Ready", tp: p0, wait: 1 },
      { _tag: "Positions", tp: p0, wait: 1, resume: 40, committed: 25, logStart: 0, highwater: 40 }
    ])
    assert.deepStrictEqual(last[1], { _tag: "StartLane", tp: p0, lane: 2, from: 40 })
  })

  it("a stale restore (an older wait) is ignored; a failed one fails the worker", () => {
    const { steps, state } = run(WorkerState.make(options()), [
      { _tag: "Assigned", tps: [p0] },
      { _tag: "Ready", tp: p0, wait: 7 },
      { _tag: "ReadyFailed", tp: p0, wait: 1, error: broken }
    ])
    assert.deepStrictEqual(steps[1], [])
    assert.deepStrictEqual(steps[2], [{ _tag: "Fail", error: broken }])
    assert.isFalse(partition(state, p0)?.ready)
  })

  it("a start refused as not assigned leaves the partition to its revocation; another failure fails the worker", () => {
    const notAssigned = new Log.LogError({ reason: new Log.NotAssigned({ topic: TOPIC, partition: 0 }) })
    const base = run(WorkerState.make(options()), [
      { _tag: "Assigned", tps: [p0] },
      { _tag: "Ready", tp: p0, wait: 1 },
      { _tag: "Positions", tp: p0, wait: 1, resume: 3, committed: undefined, logStart: 0, highwater: 3 }
    ]).state
    const revoked = run(base, [{ _tag: "StartFailed", tp: p0, error: notAssigned }])
    assert.deepStrictEqual(tags(revoked.last), ["Log"])
    assert.isFalse(partition(revoked.state, p0)?.ready)
    assert.deepStrictEqual(run(base, [{ _tag: "StartFailed", tp: p0, error: broken }]).last, [
      { _tag: "Fail", error: broken }
    ])
  })
})

describe("WorkerState: revocation", () => {
  it("drops the lost partitions' batches and waits, commits what they processed, then lets them go", () => {
    const s = run(running(), [
      { _tag: "Processed", tp: p0, lane: 4, next: 50, records: 10, highwater: 60 },
      { _tag: "Processed", tp: p2, lane: 6, next: 9, records: 2, highwater: 9 },
      { _tag: "Assigned", tps: [tp(3)] }
    ]).state
    const revoking = run(s, [{ _tag: "Revoked", tps: [p0, tp(3)] }])
    assert.deepStrictEqual(revoking.last, [
      { _tag: "CancelWaits", tps: [tp(3)] },
      { _tag: "Drain", tps: [p0, tp(3)], discard: true, purpose: { _tag: "Revoke", tps: [p0, tp(3)] } }
    ])
    // The drain says where p0's lane stopped: further than its last report.
    const drained = run(revoking.state, [
      { _tag: "Drained", lanes: [{ tp: p0, lane: 4, next: 55 }], purpose: { _tag: "Revoke", tps: [p0, tp(3)] } }
    ])
    assert.deepStrictEqual(drained.last, [
      {
        _tag: "Commit",
        offsets: [{ topic: TOPIC, partition: 0, offset: 55 }],
        purpose: { _tag: "Revoke", tps: [p0, tp(3)] }
      }
    ])
    const done = run(drained.state, [
      {
        _tag: "Committed",
        offsets: [{ topic: TOPIC, partition: 0, offset: 55 }],
        startedAt: 10,
        at: 14,
        purpose: { _tag: "Revoke", tps: [p0, tp(3)] }
      }
    ])
    assert.deepStrictEqual(tags(done.last), ["Metric", "RemoveMetric", "RevokeTables", "ReadMembership"])
    assert.deepStrictEqual(done.last[1], { _tag: "RemoveMetric", metric: "lag", tps: [p0, tp(3)] })
    assert.deepStrictEqual([...done.state.partitions.keys()].sort(), [Models.tpKey(p1), Models.tpKey(p2)])
    assert.strictEqual(done.state.commits, 1)
    assert.strictEqual(done.state.recordsProcessed, 12)
  })

  it("with exactly once the revocation commits every partition: one transaction holds them all", () => {
    const s = run(running({ exactlyOnce: true }), [
      { _tag: "Processed", tp: p1, lane: 5, next: 30, records: 5, highwater: 30 },
      { _tag: "Revoked", tps: [p0] },
      { _tag: "Drained", lanes: [{ tp: p0, lane: 4, next: 41 }], purpose: { _tag: "Revoke", tps: [p0] } }
    ])
    const commit = s.last[0]
    assert.strictEqual(commit?._tag, "Commit")
    if (commit?._tag !== "Commit") return
    assert.deepStrictEqual(
      commit.offsets.map((o) => [o.partition, o.offset]),
      [
        [0, 41],
        [1, 30]
      ]
    )
  })

  it("a stale lane's report counts its records but does not move the partition", () => {
    const { state, last } = run(running(), [
      { _tag: "Processed", tp: p0, lane: 99, next: 500, records: 3, highwater: 500 }
    ])
    assert.deepStrictEqual(last, [], "nor sets its lag")
    assert.strictEqual(state.recordsProcessed, 3)
    assert.strictEqual(partition(state, p0)?.next, 40)
  })
})

describe("WorkerState: commit interval", () => {
  it("the timer commits once the interval passed, only what moved, and waits the interval after each commit", () => {
    const s = run(running(), [{ _tag: "Processed", tp: p1, lane: 5, next: 31, records: 6, highwater: 31 }]).state
    const early = run(s, [{ _tag: "Tick", now: 999 }])
    assert.deepStrictEqual(early.last, [{ _tag: "SetTimer", delayMs: 1 }])
    const due = run(s, [{ _tag: "Tick", now: 1000 }])
    assert.deepStrictEqual(due.last, [
      { _tag: "Commit", offsets: [{ topic: TOPIC, partition: 1, offset: 31 }], purpose: { _tag: "Timer" } }
    ])
    const done = run(due.state, [
      {
        _tag: "Committed",
        offsets: [{ topic: TOPIC, partition: 1, offset: 31 }],
        startedAt: 1000,
        at: 1030,
        purpose: { _tag: "Timer" }
      }
    ])
    assert.deepStrictEqual(done.last, [
      { _tag: "Metric", metric: "commitDuration", value: 0.03 },
      { _tag: "SetTimer", delayMs: 1000 },
      { _tag: "ReadMembership" }
    ])
    assert.deepStrictEqual([done.state.commits, done.state.lastCommitMs, done.state.nextCommitAt], [1, 30, 2030])
    assert.strictEqual(partition(done.state, p1)?.committed, 31)
    // Nothing moved since: the next commit has no offsets.
    const again = run(done.state, [
      { _tag: "Tick", now: 2029 },
      { _tag: "Tick", now: 2030 }
    ])
    assert.deepStrictEqual(again.steps[0], [{ _tag: "SetTimer", delayMs: 1 }])
    assert.deepStrictEqual(again.steps[1], [{ _tag: "Commit", offsets: [], purpose: { _tag: "Timer" } }])
  })

  it("a requested commit is answered and leaves the timer alone; standbyReplicas 0 reads no membership", () => {
    const s = running({ standbyReplicas: 0 })
    const { steps, state } = run(s, [
      { _tag: "CommitRequested", request: 7 },
      { _tag: "Committed", offsets: [], startedAt: 5, at: 6, purpose: { _tag: "Request", request: 7 } },
      { _tag: "Tick", now: 1000 },
      { _tag: "Committed", offsets: [], startedAt: 1000, at: 1001, purpose: { _tag: "Timer" } }
    ])
    assert.deepStrictEqual(steps[1], [
      { _tag: "Metric", metric: "commitDuration", value: 0.001 },
      { _tag: "Reply", request: 7, outcome: { _tag: "Done" } }
    ])
    assert.strictEqual(steps[2]?.[0]?._tag, "Commit")
    assert.deepStrictEqual(tags(steps[3] ?? []), ["Metric", "SetTimer"])
    assert.strictEqual(state.commits, 2)
  })
})

describe("WorkerState: lag", () => {
  it("a started partition's lag is set from the highwater read with its positions (none when unknown)", () => {
    const started = (highwater: number | undefined) =>
      run(WorkerState.make(options()), [
        { _tag: "Assigned", tps: [p0] },
        { _tag: "Ready", tp: p0, wait: 1 },
        { _tag: "Positions", tp: p0, wait: 1, resume: 40, committed: 25, logStart: 0, highwater }
      ]).last
    assert.deepStrictEqual(tags(started(60)), ["Log", "StartLane", "Metric"])
    assert.deepStrictEqual(started(60)[2], { _tag: "Metric", metric: "lag", tp: p0, value: 20 })
    assert.deepStrictEqual(tags(started(undefined)), ["Log", "StartLane"])
  })

  it("each batch sets its partition's lag from the batch's highwater: records behind, 0 once caught up", () => {
    const { steps } = run(running(), [
      { _tag: "Processed", tp: p0, lane: 4, next: 50, records: 10, highwater: 75 },
      { _tag: "Processed", tp: p0, lane: 4, next: 75, records: 25, highwater: 75 },
      { _tag: "Processed", tp: p2, lane: 6, next: 9, records: 2, highwater: 8 }
    ])
    assert.deepStrictEqual(steps, [
      [{ _tag: "Metric", metric: "lag", tp: p0, value: 25 }],
      [{ _tag: "Metric", metric: "lag", tp: p0, value: 0 }],
      [{ _tag: "Metric", metric: "lag", tp: p2, value: 0 }]
    ])
  })

  it("a rewind keeps the series of the partitions still held; the restart sets them again", () => {
    const { steps } = run(running(), [
      { _tag: "Tick", now: 1000 },
      { _tag: "CommitFailed", error: refused, at: 1010, purpose: { _tag: "Timer" } },
      {
        _tag: "Drained",
        lanes: [
          { tp: p0, lane: 4, next: 44 },
          { tp: p1, lane: 5, next: 25 },
          { tp: p2, lane: 6, next: 7 }
        ],
        purpose: { _tag: "Rewind", failed: { _tag: "Timer" } }
      },
      { _tag: "Ready", tp: p0, wait: 7 },
      { _tag: "Positions", tp: p0, wait: 7, resume: 44, committed: 25, logStart: 0, highwater: 50 }
    ])
    assert.isFalse(
      steps.some((commands) => tags(commands).includes("RemoveMetric")),
      "no series removed"
    )
    assert.deepStrictEqual(steps[4]?.[2], { _tag: "Metric", metric: "lag", tp: p0, value: 6 })
  })
})

describe("WorkerState: errors", () => {
  it("a refused commit rewinds: every lane drained, the tables rewound, every partition restored and started again", () => {
    const failed = run(running(), [
      { _tag: "Tick", now: 1000 },
      { _tag: "CommitFailed", error: refused, at: 1010, purpose: { _tag: "Timer" } }
    ])
    assert.deepStrictEqual(tags(failed.last), ["Log", "SetTimer", "Metric", "Pause", "Drain"])
    assert.deepStrictEqual(failed.last[4], {
      _tag: "Drain",
      tps: [p0, p1, p2],
      discard: false,
      purpose: { _tag: "Rewind", failed: { _tag: "Timer" } }
    })
    assert.strictEqual(failed.state.rewinds, 1)
    const rewound = run(failed.state, [
      {
        _tag: "Drained",
        lanes: [
          { tp: p0, lane: 4, next: 44 },
          { tp: p1, lane: 5, next: 25 },
          { tp: p2, lane: 6, next: 7 }
        ],
        purpose: { _tag: "Rewind", failed: { _tag: "Timer" } }
      }
    ])
    assert.deepStrictEqual(rewound.last, [
      { _tag: "RewindTables" },
      { _tag: "AwaitReady", tp: p0, wait: 7 },
      { _tag: "AwaitReady", tp: p1, wait: 8 },
      { _tag: "AwaitReady", tp: p2, wait: 9 }
    ])
    for (const t of [p0, p1, p2]) assert.isFalse(partition(rewound.state, t)?.ready)
    // Nothing not restored is committed meanwhile; once restored a partition starts from what the tables hold.
    const tick = run(rewound.state, [{ _tag: "Tick", now: 2010 }])
    assert.deepStrictEqual(tick.last, [{ _tag: "Commit", offsets: [], purpose: { _tag: "Timer" } }])
    const restarted = run(rewound.state, [
      { _tag: "Ready", tp: p0, wait: 7 },
      { _tag: "Positions", tp: p0, wait: 7, resume: 41, committed: 25, logStart: 0, highwater: 41 }
    ])
    assert.deepStrictEqual(restarted.last[1], { _tag: "StartLane", tp: p0, lane: 10, from: 41 })
  })

  it("a refused commit of a revocation rewinds the others and still lets the lost partitions go", () => {
    const { steps, state } = run(running(), [
      { _tag: "Revoked", tps: [p0] },
      { _tag: "Drained", lanes: [{ tp: p0, lane: 4, next: 45 }], purpose: { _tag: "Revoke", tps: [p0] } },
      { _tag: "CommitFailed", error: refused, at: 5, purpose: { _tag: "Revoke", tps: [p0] } },
      {
        _tag: "Drained",
        lanes: [
          { tp: p1, lane: 5, next: 25 },
          { tp: p2, lane: 6, next: 7 }
        ],
        purpose: { _tag: "Rewind", failed: { _tag: "Revoke", tps: [p0] } }
      }
    ])
    assert.deepStrictEqual(tags(steps[2] ?? []), ["Log", "Metric", "Pause", "Drain"])
    assert.deepStrictEqual(tags(steps[3] ?? []), [
      "RewindTables",
      "AwaitReady",
      "AwaitReady",
      "RemoveMetric",
      "RevokeTables",
      "ReadMembership"
    ])
    assert.deepStrictEqual([...state.partitions.keys()].sort(), [Models.tpKey(p1), Models.tpKey(p2)])
  })

  it("any other commit failure fails the worker (the timer stops), or only the request that asked", () => {
    const timer = run(running(), [
      { _tag: "Tick", now: 1000 },
      { _tag: "CommitFailed", error: broken, at: 1001, purpose: { _tag: "Timer" } }
    ])
    assert.deepStrictEqual(timer.last, [{ _tag: "Fail", error: broken }])
    const request = run(running(), [
      { _tag: "CommitRequested", request: 3 },
      { _tag: "CommitFailed", error: broken, at: 1, purpose: { _tag: "Request", request: 3 } }
    ])
    assert.deepStrictEqual(request.last, [{ _tag: "Reply", request: 3, outcome: { _tag: "Failed", error: broken } }])
    assert.deepStrictEqual(run(running(), [{ _tag: "LaneFailed", tp: p0, lane: 4, error: broken }]).last, [
      { _tag: "Fail", error: broken }
    ])
  })
})

describe("WorkerState: close", () => {
  it("drains every lane, commits once more (a failure only logged), then settles; nothing is decided after", () => {
    const s = run(running(), [{ _tag: "Processed", tp: p2, lane: 6, next: 12, records: 5, highwater: 20 }]).state
    const closing = run(s, [{ _tag: "Close" }])
    assert.deepStrictEqual(closing.last, [
      { _tag: "RemoveMetric", metric: "lag", tps: [p0, p1, p2] },
      { _tag: "Drain", tps: [p0, p1, p2], discard: false, purpose: { _tag: "Close" } }
    ])
    assert.isTrue(closing.state.closed)
    const { steps } = run(closing.state, [
      { _tag: "CommitRequested", request: 1 },
      { _tag: "Drained", lanes: [{ tp: p2, lane: 6, next: 13 }], purpose: { _tag: "Close" } },
      { _tag: "CommitFailed", error: refused, at: 3, purpose: { _tag: "Close" } },
      { _tag: "Assigned", tps: [tp(5)] },
      { _tag: "Tick", now: 5000 },
      { _tag: "Settled" }
    ])
    assert.deepStrictEqual(steps[0], [{ _tag: "Reply", request: 1, outcome: { _tag: "Closed" } }])
    assert.deepStrictEqual(steps[1], [
      { _tag: "Commit", offsets: [{ topic: TOPIC, partition: 2, offset: 13 }], purpose: { _tag: "Close" } }
    ])
    assert.deepStrictEqual(tags(steps[2] ?? []), ["Log", "Settle"])
    assert.deepStrictEqual([steps[3], steps[4]], [[], []])
    assert.deepStrictEqual(steps[5], [{ _tag: "Closed" }])
  })
})

describe("WorkerState: standbys", () => {
  const membership = (
    self: string,
    members: ReadonlyArray<readonly [string, ReadonlyArray<Models.TopicPartition>]>
  ) => ({
    _tag: "Membership" as const,
    membership: { memberId: self, members: members.map(([memberId, partitions]) => ({ memberId, partitions })) }
  })

  it("stands by for the partitions the member before it holds, and lets them go when they move", () => {
    const s = run(WorkerState.make(options()), [{ _tag: "Assigned", tps: [p0] }]).state
    const placed = run(s, [
      membership("b", [
        ["a", [p1, p2]],
        ["b", [p0]]
      ])
    ])
    assert.deepStrictEqual(placed.last, [{ _tag: "AssignStandbys", tps: [p1, p2] }])
    assert.deepStrictEqual([...placed.state.standbys.keys()], [Models.tpKey(p1), Models.tpKey(p2)])
    // A view of this member that differs from its partitions (a rebalance in flight) changes nothing.
    assert.deepStrictEqual(run(placed.state, [membership("b", [["b", [p0, p1]]])]).last, [])
    // An assignment promotes a standby.
    const promoted = run(placed.state, [{ _tag: "Assigned", tps: [p1] }]).state
    assert.deepStrictEqual([...promoted.standbys.keys()], [Models.tpKey(p2)])
    const moved = run(promoted, [
      membership("b", [
        ["a", [tp(3)]],
        ["b", [p0, p1]]
      ])
    ])
    assert.deepStrictEqual(moved.last, [
      { _tag: "RevokeTables", tps: [p2] },
      { _tag: "AssignStandbys", tps: [tp(3)] }
    ])
  })
})
