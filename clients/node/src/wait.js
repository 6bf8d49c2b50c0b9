// Waiting for tokens: `await limiter.wait(key, limit, { cost, timeoutMs, signal })` (outbound
// throttling: take your turn instead of a 429).
//
// Built only on the limiter's public acquire and refund, so the failure policy, the deny cache
// and the Lua fallback apply to each try unchanged. Each denied try sleeps the retryAfterMs the
// bucket returned plus up to 10% jitter (never less than 1 ms): waiters on one bucket wake
// just after a token appears, do not stampede together, and never spin. This file imports
// nothing of index.js (index.js re-exports it), so there is no import cycle.

import { performance } from "node:perf_hooks";

/** The jitter added to each sleep, as a fraction of the wait the bucket returned. */
export const JITTER = 0.1;

/** `wait` gave up at its timeout; `decision` is the last denial. */
export class WaitTimeoutError extends Error {
  constructor(decision, timeoutMs, message = undefined) {
    super(message ?? `no token within ${timeoutMs} ms (last retryAfterMs=${decision.retryAfterMs})`);
    this.name = "WaitTimeoutError";
    this.decision = decision;
  }
}

/** The cost exceeds the limit's capacity (retryAfterMs = -1): no wait can help. */
export class WaitNeverError extends Error {
  constructor(decision) {
    super(`cost can never be taken: it exceeds the capacity ${decision.limit.capacity} of the limit`);
    this.name = "WaitNeverError";
    this.decision = decision;
  }
}

function abortReason(signal) {
  return signal.reason ?? Object.assign(new Error("This operation was aborted"), { name: "AbortError" });
}

/** Sleeps `ms`, or rejects with the signal's reason as soon as it aborts. */
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortReason(signal));
    const onAbort = () => { clearTimeout(timer); reject(abortReason(signal)); };
    const timer = setTimeout(() => { signal?.removeEventListener("abort", onAbort); resolve(); }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * Takes `cost` tokens from `key` once the bucket holds them and resolves to the allowed
 * Decision. Rejects with WaitTimeoutError after `timeoutMs` (none by default), with
 * WaitNeverError at once when cost exceeds the capacity, and with the signal's reason when
 * `signal` aborts; an aborted wait holds no tokens (a take that raced the abort is refunded).
 */
export async function wait(limiter, key, limit, { cost = 1, timeoutMs, signal } = {}) {
  if (timeoutMs !== undefined && !(timeoutMs >= 0)) throw new RangeError("timeoutMs must be a number >= 0");
  if (signal?.aborted) throw abortReason(signal);
  const deadline = timeoutMs === undefined ? Infinity : performance.now() + timeoutMs;
  for (;;) {
    const d = await limiter.acquire(key, limit, cost);
    if (signal?.aborted) {
      if (d.allowed) await limiter.refund(key, limit, cost);
      throw abortReason(signal);
    }
    if (d.allowed) return d;
    if (d.retryAfterMs < 0) throw new WaitNeverError(d);
    let ms = Math.max(1, d.retryAfterMs * (1 + Math.random() * JITTER));
    if (deadline !== Infinity) {
      const leftMs = deadline - performance.now();
      if (leftMs <= 0) throw new WaitTimeoutError(d, timeoutMs);
      ms = Math.min(ms, leftMs); // sleep to the deadline at most, then try once more there
    }
    await sleep(ms, signal);
  }
}
