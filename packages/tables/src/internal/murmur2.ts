/**
 * Kafka's default partitioner for keyed records: murmur2 (seed 0x9747b28c) of
 * the key bytes, made positive, modulo the partition count. A table keyed like
 * its source topic therefore lands its keys in the same partitions Kafka's
 * producers chose.
 *
 * @internal
 */

const M = 0x5bd1e995
const R = 24
const SEED = 0x9747b28c

/** 32-bit murmur2 as Kafka's `Utils.murmur2` computes it. */
export const murmur2 = (data: Uint8Array): number => {
  const length = data.length
  let h = (SEED ^ length) | 0
  const blocks = length >>> 2
  for (let i = 0; i < blocks; i++) {
    const o = i * 4
    let k =
      (data[o]! & 0xff) | ((data[o + 1]! & 0xff) << 8) | ((data[o + 2]! & 0xff) << 16) | ((data[o + 3]! & 0xff) << 24)
    k = Math.imul(k, M)
    k ^= k >>> R
    k = Math.imul(k, M)
    h = Math.imul(h, M)
    h ^= k
  }
  const tail = blocks * 4
  const rest = length & 3
  if (rest === 3) h ^= (data[tail + 2]! & 0xff) << 16
  if (rest >= 2) h ^= (data[tail + 1]! & 0xff) << 8
  if (rest >= 1) {
    h ^= data[tail]! & 0xff
    h = Math.imul(h, M)
  }
  h ^= h >>> 13
  h = Math.imul(h, M)
  h ^= h >>> 15
  return h | 0
}

/** The partition Kafka's default partitioner picks for a key. */
export const partitionOf = (key: Uint8Array, partitions: number): number => (murmur2(key) & 0x7fffffff) % partitions
