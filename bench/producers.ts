// Producer state's cost per append (issue 32, defect 12; docs/ARCHITECTURE.md, "Benchmarks").
//
// A tablet log on the memory store first learns PRODUCERS idempotent producers (one stamped batch each), then takes
// APPENDS one-record appends, each stamped by the next of those producers in turn; the baseline is the same log
// taking the same appends unstamped, in the same process. The ratio is the stamped append's time over the
// unstamped one's: near 1 when an append's cost does not grow with the producers the log knows. Repetitions are
// interleaved (baseline, stamped, stamped, baseline, ...), each figure the median.
//
// Environment (the results file is written only with the defaults):
//   BENCH_PRODUCERS (1000,20000), BENCH_APPENDS (2000), BENCH_RUNS (3)
import { MemoryStore, Store } from "../packages/core/src/index.js"
import { Effect } from "effect"
import * as TabletLog from "../packages/replica/src/server/TabletLog.js"
import { type BenchOutput, envInt, envString, type Figure, median, progress, round3 } from "./lib.js"

const record = { key: null, value: new Uint8Array(100), headers: [], timestamp: 0 }

/** Milliseconds per append over `appends` appends after the log learnt `producers` producers. */
const perAppend = (producers: number, appends: number, stamped: boolean) =>
  Effect.gen(function* () {
    const store = yield* (yield* Store.Store).open({ table: "bench", partition: 0 })
    const log = yield* TabletLog.make(store, { table: "bench", bucket: 0 })
    for (let id = 0; id < producers; id++) yield* log.append(0, [record], { id, epoch: 0, sequence: 0 })
    const started = performance.now()
    for (let i = 0; i < appends; i++) {
      const id = i % producers
      const stamp = { id, epoch: 0, sequence: 1 + Math.floor(i / producers) }
      yield* log.append(0, [record], stamped ? stamp : undefined)
    }
    return (performance.now() - started) / appends
  }).pipe(Effect.scoped, Effect.provide(MemoryStore.layer()), Effect.orDie, Effect.runPromise)

export const run = async (): Promise<BenchOutput & { readonly save: boolean }> => {
  const counts = (envString("BENCH_PRODUCERS") ?? "1000,20000").split(",").map(Number)
  const appends = envInt("BENCH_APPENDS", 2000)
  const runs = envInt("BENCH_RUNS", 3)
  const results: Array<Figure> = []
  for (const producers of counts) {
    const stamped: Array<number> = []
    const plain: Array<number> = []
    for (let r = 0; r < runs; r++) {
      progress(`producers ${producers}: run ${r + 1}/${runs}`)
      if (r % 2 === 0) {
        plain.push(await perAppend(producers, appends, false))
        stamped.push(await perAppend(producers, appends, true))
      } else {
        stamped.push(await perAppend(producers, appends, true))
        plain.push(await perAppend(producers, appends, false))
      }
    }
    const value = median(stamped)
    const baseline = median(plain)
    results.push({
      bench: `producers.append.${producers}`,
      value: round3(value),
      unit: "ms/append",
      baseline: round3(baseline),
      ratio: round3(value / baseline),
      producers,
      appends,
      runs
    })
  }
  const save =
    envString("BENCH_PRODUCERS") === undefined &&
    envString("BENCH_APPENDS") === undefined &&
    envString("BENCH_RUNS") === undefined
  return { results, save }
}
