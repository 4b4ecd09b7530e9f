/**
 * Random replication histories for the truncation tests: logs as the epoch of each record, offset by offset (a
 * record is identified by its offset and its epoch).
 */
import { prng } from "../../../../scripts/test-support/prng.js"
import * as LeaderEpochCache from "../../src/machines/LeaderEpochCache.js"

/** A log as the epoch of each record. */
export type Log = Array<number>

/** The cache a log's records imply: where each epoch's run of records starts. */
export const cacheOf = (log: Log): LeaderEpochCache.LeaderEpochCache => {
  let cache = LeaderEpochCache.empty
  log.forEach((epoch, offset) => {
    cache = LeaderEpochCache.assign(cache, epoch, offset)
  })
  return cache
}

/** How many records two logs share from the start. */
export const commonPrefix = (a: Log, b: Log): number => {
  let n = 0
  while (n < a.length && n < b.length && a[n] === b[n]) n++
  return n
}

/**
 * A random history: each epoch one replica leads, keeps its whole log and appends; some others catch up from it
 * (truncating to where they agree, then copying part of its log), the rest fall behind. The last leader leads.
 */
export const history = (
  seed: number
): { readonly logs: ReadonlyArray<Log>; readonly leader: number; readonly epoch: number } => {
  const next = prng(seed)
  const int = (lo: number, hi: number) => lo + Math.floor(next() * (hi - lo + 1))
  const logs: Array<Log> = Array.from({ length: int(2, 5) }, () => [])
  let leader = 0
  let epoch = int(0, 3)
  for (let round = int(1, 8); round > 0; round--) {
    epoch += int(1, 3)
    leader = int(0, logs.length - 1)
    const log = logs[leader]!
    for (let k = int(0, 6); k > 0; k--) log.push(epoch)
    for (let r = 0; r < logs.length; r++) {
      if (r === leader || next() < 0.4) continue
      const agreed = commonPrefix(logs[r]!, log)
      logs[r] = [...log.slice(0, agreed + int(0, log.length - agreed))]
    }
  }
  return { logs, leader, epoch }
}
