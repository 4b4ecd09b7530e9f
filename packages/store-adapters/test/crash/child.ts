/**
 * The crash-test workload, and the child process that runs it.
 *
 * As a program: `child.ts <level|rocksdb> <directory> <seed> [--torn=offset-first|data-first]` opens the backend at `directory`, opens the
 * partition store `{ table: "crash", partition: 0 }`, reads the persisted offset of `crash-changelog/0` and applies
 * batch after batch from there (batch 0 when none is persisted, else persisted + 1), forever. Each batch is written
 * atomically with its own number as the persisted offset. It prints `opening` before it opens the database,
 * `ready <first batch>` once the store is open, and `w <n>` after batch n was acknowledged. It never exits by itself:
 * the crash test kills it with SIGKILL.
 *
 * `--torn=…` makes it a deliberately broken writer, for the checker's self-test: it writes the operations and the
 * offset in two separate batches, the offset first (`offset-first`: a kill in between leaves the offset ahead of its
 * data) or last (`data-first`: the data ahead of its offset).
 *
 * As a module: the deterministic batch generator the crash test replays. Batch n depends only on (seed, n).
 */
import type { Store } from "@strata/core"
import {
  type BackendName,
  type ChildArgs,
  childMain,
  openPartition,
  report,
  type StoreAdapter
} from "../../../../scripts/test-support/crashChild.js"
import { below, mix32, prng } from "../../../../scripts/test-support/prng.js"
import { Effect, Option } from "effect"

/** The partition store the workload writes. */
export const STORE_ID = { table: "crash", partition: 0 } as const
/** The changelog partition whose offset each batch persists. */
export const CHANGELOG = { topic: "crash-changelog", partition: 0 } as const
/** Keys are `k0000` … `k1999`. */
export const KEY_SPACE = 2000
/** A batch holds 1 to MAX_OPS operations. */
export const MAX_OPS = 200
/** A value holds 0 to MAX_VALUE_BYTES bytes. */
export const MAX_VALUE_BYTES = 2000
/** Share of operations that are puts (the rest are deletes). */
const PUT_RATIO = 0.7

/** How a deliberately broken child splits a batch (see the module comment). */
export type TornMode = "offset-first" | "data-first"
export const TORN_MODES: ReadonlyArray<TornMode> = ["offset-first", "data-first"]

/** The bytes of key number `k`. */
export const keyBytes = (k: number): Buffer => Buffer.from(`k${String(k).padStart(4, "0")}`, "latin1")

/** Fixed pseudo-random filler, so values do not compress away and the engines do real I/O. */
const FILLER = (() => {
  const random = prng(0x51a7a)
  const out = Buffer.allocUnsafe(64 * 1024)
  for (let i = 0; i < out.length; i += 4) out.writeUInt32LE(Math.floor(random() * 4294967296), i)
  return out
})()

/**
 * A value of `length` bytes that encodes the batch and the key that wrote it: the header `b<n>k<key>|` (cut when the
 * value is shorter), then filler from a position that depends on (n, key).
 */
export const valueBytes = (n: number, k: number, length: number): Buffer => {
  const out = Buffer.allocUnsafe(length)
  const header = out.write(`b${n}k${k}|`, 0, "latin1")
  if (header < length) {
    const from = mix32(Math.imul(n, 0x9e3779b1) ^ k) % (FILLER.length - MAX_VALUE_BYTES)
    FILLER.copy(out, header, from, from + length - header)
  }
  return out
}

/** Reads back who wrote a value (when it is long enough to tell), for failure messages. */
export const describeValue = (value: Uint8Array): string => {
  const text = Buffer.from(value.buffer, value.byteOffset, value.byteLength).toString("latin1", 0, 24)
  const m = /^b(\d+)k(\d+)\|/.exec(text)
  return m ? `${value.length} bytes from batch ${m[1]} (key ${m[2]})` : `${value.length} bytes ${JSON.stringify(text)}`
}

/** The operations of batch `n` under `seed`: a function of (seed, n) only. */
export const batch = (seed: number, n: number): Array<Store.Op> => {
  const random = prng(mix32(mix32(seed) ^ mix32(n + 0x9e3779b9)))
  const count = 1 + below(random, MAX_OPS)
  const ops: Array<Store.Op> = new Array(count)
  for (let i = 0; i < count; i++) {
    const k = below(random, KEY_SPACE)
    ops[i] =
      random() < PUT_RATIO
        ? { _tag: "put", key: keyBytes(k), value: valueBytes(n, k, below(random, MAX_VALUE_BYTES + 1)) }
        : { _tag: "delete", key: keyBytes(k) }
  }
  return ops
}

/** The adapter of `backend`, imported when first asked for (the other backend's driver stays unloaded). */
export const loadAdapter = (
  backend: BackendName
): Promise<StoreAdapter<Store.Id, Store.PartitionStore, Store.StoreError>> =>
  backend === "level" ? import("@strata/store-adapters/level") : import("@strata/store-adapters/rocksdb")

const run = ({ backend, directory, seed, torn }: ChildArgs<never, TornMode>) =>
  Effect.scoped(
    Effect.gen(function* () {
      const partition = yield* openPartition(() => loadAdapter(backend), directory, STORE_ID, report.opening)
      const persisted = yield* partition.persistedOffset(CHANGELOG)
      let n = Option.match(persisted, { onNone: () => 0, onSome: (p) => p + 1 })
      yield* report.ready(n)
      for (;;) {
        const ops = batch(seed, n)
        if (torn === "offset-first") {
          yield* partition.setPersistedOffset(CHANGELOG, n)
          yield* partition.write(ops)
        } else if (torn === "data-first") {
          yield* partition.write(ops)
          yield* partition.setPersistedOffset(CHANGELOG, n)
        } else {
          yield* partition.write(ops, { offsets: [{ ...CHANGELOG, offset: n }] })
        }
        yield* report.acked(n)
        n++
      }
    })
  )

childMain(import.meta.url, {
  program: "child.ts",
  numbers: [],
  tornModes: TORN_MODES,
  loopName: "write loop",
  loop: run
})
