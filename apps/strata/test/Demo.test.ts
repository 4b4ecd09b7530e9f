import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { MemoryLog, MemoryStore } from "@strata/core"
import * as LevelStore from "@strata/store-adapters/level"
import { Effect } from "effect"
import * as Demo from "../src/Demo.js"

const text = "the quick brown fox jumps over the lazy dog the end"

describe("demo", () => {
  it.live("restores the table from its changelog after a restart that lost the store", () =>
    Effect.gen(function* () {
      const result = yield* Demo.run(
        { text, partitions: 3, verbose: false },
        { before: MemoryStore.layer(), after: MemoryStore.layer() }
      ).pipe(Effect.provide(MemoryLog.layer()))
      assert.strictEqual(result.before.get("the"), 3)
      assert.strictEqual(result.before.size, 9)
      assert.isTrue(Demo.sameTable(result.before, result.after))
      // One changelog record per update; the fresh store replays every partition from offset 0.
      assert.strictEqual(result.changelogRecords, 11)
      assert.strictEqual(
        result.replayed.reduce((n, r) => n + r.to - r.from, 0),
        11
      )
      assert.isTrue(result.replayed.every((r) => r.from === 0))
    })
  )

  it.live("a restart on a LevelDB directory replays nothing: the worker committed everything when it stopped", () =>
    Effect.gen(function* () {
      const directory = mkdtempSync(join(tmpdir(), "strata-demo-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(directory, { recursive: true, force: true })))
      const run = Demo.run(
        { text, partitions: 4, verbose: false },
        { before: LevelStore.layer({ directory }), after: LevelStore.layer({ directory }) }
      ).pipe(Effect.provide(MemoryLog.layer()))
      // Twice on the same directory: the second run starts from an empty table again.
      for (let i = 0; i < 2; i++) {
        const result = yield* run
        assert.isTrue(Demo.sameTable(result.before, result.after))
        assert.strictEqual(result.before.get("the"), 3)
        // The worker's last commit persisted every partition's changelog offset: nothing left to replay.
        for (const r of result.replayed) assert.strictEqual(r.from, r.to)
        // The restarted worker resumes past every source record, so none is counted twice.
        assert.isTrue(result.resume.every((r) => r.offset > 0))
      }
    })
  )

  it.live("runs again on the same log with another partition count", () =>
    Effect.gen(function* () {
      // A broker keeps the topics of earlier runs: a run with 4 partitions after one with 3 must not meet them.
      for (const partitions of [3, 4, 3]) {
        const result = yield* Demo.run(
          { text, partitions, verbose: false },
          { before: MemoryStore.layer(), after: MemoryStore.layer() }
        )
        assert.isTrue(Demo.sameTable(result.before, result.after))
        assert.strictEqual(result.replayed.length, partitions)
      }
    }).pipe(Effect.provide(MemoryLog.layer()))
  )

  it("sameTable compares every entry", () => {
    assert.isTrue(Demo.sameTable(new Map([["a", 1]]), new Map([["a", 1]])))
    assert.isFalse(Demo.sameTable(new Map([["a", 1]]), new Map([["a", 2]])))
    assert.isFalse(
      Demo.sameTable(
        new Map([["a", 1]]),
        new Map([
          ["a", 1],
          ["b", 1]
        ])
      )
    )
  })
})
