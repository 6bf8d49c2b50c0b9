// Outbound throttling with limiter.wait: a pool of workers shares one vendor's limit.
//
// The vendor allows 10 calls per second across all our workers and processes. Each worker
// waits for its turn (`limiter.wait`) instead of calling and getting a 429: the bucket in Redis
// hands out tokens at exactly the vendor's rate, whichever worker or process asks.
//
//   node worker-pool.js  # 30 jobs, 8 workers (REDIS_URL, default redis://127.0.0.1:6379)

import { pathToFileURL } from "node:url";
import { Limit, Limiter } from "redis-rl";
import { makeClient } from "./api.js";

export const VENDOR = new Limit(10, 1); // 10 calls per second, no burst

/** A stand-in for the vendor's API. */
const callVendor = async (job) => job * job;

/**
 * Runs `jobs` through `workers` concurrent workers, each call after its token; resolves to
 * the results in order. A job without a token within `timeoutMs` rejects (WaitTimeoutError).
 */
export async function run(redis, jobs, { workers = 8, limit = VENDOR, key = "vendor:acme", timeoutMs = 30_000, signal } = {}) {
  const limiter = new Limiter(redis, { onError: "closed", timeoutMs: 500 });
  const results = new Array(jobs.length);
  let next = 0;
  const worker = async () => {
    while (next < jobs.length) {
      const i = next++;
      await limiter.wait(key, limit, { timeoutMs, signal });
      results[i] = await callVendor(jobs[i]);
    }
  };
  await Promise.all(Array.from({ length: workers }, worker));
  return results;
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const redis = makeClient(process.env.REDIS_URL || "redis://127.0.0.1:6379");
  const start = performance.now();
  const results = await run(redis, Array.from({ length: 30 }, (_, i) => i));
  console.log(`${results.length} calls in ${((performance.now() - start) / 1000).toFixed(2)} s (10 per second)`);
  redis.disconnect();
}
