// Leases (at most `limit` pieces of work in flight per key) and reservations (an estimate taken
// from a token bucket now, settled with the actual cost later): the answers' types, the
// arguments' checks, the in-process table of the `local` failure policy, and the scope helper
// `withLease` (wait for a slot, renew in the background, release in `finally`).
//
// The calls into Redis are the limiter's (index.js: RL.LEASE, RL.RELEASE, RL.RENEW, RL.LEASES,
// RL.RESERVE, RL.SETTLE, or the fallback's rl_lease ... functions and script modes). This
// file imports nothing of index.js (only the exact bucket, the wait's jitter and error, and the
// package's base error), so there is no cycle.

import { randomBytes } from "node:crypto";
import { performance } from "node:perf_hooks";
import { Q } from "./bucket.js";
import { JITTER, WaitTimeoutError } from "./wait.js";
import { RateLimitError } from "./paths.js";

/** The most leases a key may hold: RL.LEASE's cap on `limit`. */
export const MAX_LEASES = 10_000;
/** The longest ttl_ms the module takes: 100 years. */
export const MAX_TTL_MS = 3_153_600_000_000;
/** The prefixes of the lease and reservation ids the "open" and "local" policies make: such an
 * id is answered by that policy, never sent to Redis (a "local" one even once Redis is back). */
export const OPEN_PREFIX = "open:";
export const LOCAL_PREFIX = "local:";

/** "open" or "local" for an id one of those policies made, else null. */
export function policyOf(id) {
  if (typeof id !== "string") return null;
  return id.startsWith(OPEN_PREFIX) ? "open" : id.startsWith(LOCAL_PREFIX) ? "local" : null;
}

/** 16 lowercase hex characters from the CSPRNG: the id a fallback call sends (scripts cannot
 * draw randomness) and the id of a lease taken in process. */
export const newId = () => randomBytes(8).toString("hex");

/** `limit` as RL.LEASE takes it, or a RangeError with the module's text. */
export function checkLeaseLimit(limit) {
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LEASES) {
    throw new RangeError(`limit must be an integer from 1 to ${MAX_LEASES} (leases)`);
  }
  return limit;
}

/** `ttlMs` as RL.LEASE, RL.RENEW and RL.RESERVE take it, or a RangeError with the module's text. */
export function checkTtl(ttlMs) {
  if (!Number.isInteger(ttlMs) || ttlMs < 1 || ttlMs > MAX_TTL_MS) {
    throw new RangeError(`ttl_ms must be an integer from 1 to ${MAX_TTL_MS} (ms)`);
  }
  return ttlMs;
}

/** A caller's id (1 to 16 bytes of UTF-8), or undefined; a RangeError with the module's text. */
export function checkId(id) {
  if (id === undefined || id === null) return undefined;
  if (typeof id !== "string" || Buffer.byteLength(id) < 1 || Buffer.byteLength(id) > 16) {
    throw new RangeError("id must be 1 to 16 bytes");
  }
  return id;
}

/**
 * lease's answer. Allowed: `id` names the lease, `inUse` counts the leases held with it,
 * `expiresInMs` is until it expires (ttlMs when just taken). Denied: `id` is "", `inUse` the
 * leases held, `retryAfterMs` until a slot frees at the latest (rounded up). `key`, `limit`,
 * `ttlMs` as asked; `source` is who decided, as a Decision's ("open" and "local" leases have
 * ids "open:…" and "local:…", never sent to Redis). `release()` and `renew(ttlMs)` act on this
 * lease through the limiter that took it.
 */
export class Lease {
  constructor(limiter, key, limit, ttlMs, allowed, id, inUse, ms, source) {
    this.allowed = Boolean(allowed);
    this.id = String(id);
    this.inUse = Number(inUse);
    this.expiresInMs = this.allowed ? Number(ms) : 0;
    this.retryAfterMs = this.allowed ? 0 : Number(ms);
    this.key = key;
    this.limit = limit;
    this.ttlMs = ttlMs;
    this.source = source;
    /** Set when a renewal found the lease no longer held (it expired or was released). */
    this.lost = false;
    Object.defineProperty(this, "limiter", { value: limiter, enumerable: false });
  }

  /** Gives the slot back: true if it was held. */
  release() {
    return this.limiter.release(this.key, this.id);
  }

  /** Makes the lease expire `ttlMs` (default its own ttl) from now: true if it was held. */
  renew(ttlMs = this.ttlMs) {
    return this.limiter.renew(this.key, this.id, ttlMs);
  }

  /** X-RateLimit-Limit, X-RateLimit-Remaining (limit - inUse, at least 0; not under "open" or
   * "closed", which know no count) and, when denied, Retry-After (s, rounded up). */
  headers() {
    const h = { "X-RateLimit-Limit": String(this.limit) };
    if (this.source !== "open" && this.source !== "closed") h["X-RateLimit-Remaining"] = String(Math.max(0, this.limit - this.inUse));
    if (!this.allowed) h["Retry-After"] = String(Math.ceil(this.retryAfterMs / 1000));
    return h;
  }
}

/** leases's answer: the leases held at a key, and the wait until a slot frees under `limit`. */
export class LeaseCount {
  constructor(inUse, retryAfterMs, limit, source) {
    this.inUse = Number(inUse);
    this.retryAfterMs = Number(retryAfterMs);
    this.limit = limit;
    this.source = source;
  }
}

/**
 * reserve's answer. Allowed: `estimate` tokens were taken, `id` names the reservation,
 * `remaining` is what the bucket holds after. Denied: as acquire's denial (`retryAfterMs`, -1
 * when the estimate exceeds the capacity), `id` "". `settle(actual)` applies the difference
 * once and resolves to a Charge (charge's answer: the signed balance); a second call resolves
 * to that same Charge without sending anything.
 */
export class Reservation {
  constructor(limiter, key, limit, estimate, allowed, id, remaining, retryAfterMs, source, route = undefined) {
    this.allowed = Boolean(allowed);
    this.id = String(id);
    this.remaining = Number(remaining);
    this.retryAfterMs = Number(retryAfterMs);
    this.key = key;
    this.limit = limit;
    this.estimate = estimate;
    this.source = source;
    Object.defineProperty(this, "limiter", { value: limiter, enumerable: false });
    Object.defineProperty(this, "settled", { value: null, writable: true, enumerable: false });
    // A bucket table's field (src/table.js): the settle goes to the same bucket, RL.HSETTLE.
    Object.defineProperty(this, "route", { value: route, enumerable: false });
  }

  /** Settles with the work's `actual` cost (tokens, >= 0); see the class. A settle Redis could
   * not apply (applied false) is not remembered: calling again sends it again. */
  settle(actual) {
    if (!this.allowed) return Promise.reject(new RangeError("a denied reservation holds nothing to settle"));
    if (this.settled) return this.settled;
    const settling = this.limiter.settle(this.key, this.limit, this.id, actual, this.route);
    this.settled = settling;
    settling.then((s) => { if (!s.applied && this.settled === settling) this.settled = null; },
      () => { if (this.settled === settling) this.settled = null; });
    return settling;
  }
}

/** withLease found no free slot within its `wait` (one try when 0); `lease` (also `decision`)
 * is the last denial. A WaitTimeoutError, as `wait`'s. */
export class LeaseTimeoutError extends WaitTimeoutError {
  constructor(lease, waitMs) {
    super(lease, waitMs, `no lease on ${JSON.stringify(lease.key)} (limit ${lease.limit}) within ${waitMs} ms: ` +
      `${lease.inUse} held, last retryAfterMs=${lease.retryAfterMs}`);
    this.name = "LeaseTimeoutError";
    this.lease = lease;
    this.decision = lease;
  }
}

/** A settle of an id that is no open reservation of the key: settled already (a settle applies
 * once), lapsed at its ttl (it stands as taken), or never made. */
export class ReservationNotOpenError extends RateLimitError {
  constructor(message) {
    super(message.replace(/^ERR /, ""));
    this.name = "ReservationNotOpenError";
  }
}

/**
 * The `local` policy's leases: per key, id -> expiry (the limiter's clock, ms), at most
 * `limit / instances` (at least 1) held at once, expired ones dropped when the key is touched;
 * at most `maxKeys` keys (least recently used out: a forgotten key holds no lease). Its
 * replies are the module's.
 */
export class LocalLeases {
  constructor(instances = 1, maxKeys = 100_000) {
    this.instances = instances;
    this.maxKeys = maxKeys;
    this.keys = new Map(); // key -> Map(id -> expiresAt)
  }

  share(limit) {
    return Math.max(1, Math.floor(limit / this.instances));
  }

  /** The live leases of `key`, expired ones dropped; null when none. */
  live(key, now) {
    const held = this.keys.get(key);
    if (!held) return null;
    for (const [id, at] of held) if (at <= now) held.delete(id);
    if (held.size === 0) {
      this.keys.delete(key);
      return null;
    }
    return held;
  }

  /** Until a slot frees under `limit` when `held` holds at least that many, ms rounded up. */
  static waitFor(held, limit, now) {
    if (!held || held.size < limit) return 0;
    const expiries = [...held.values()].sort((a, b) => a - b);
    return Math.max(1, Math.ceil(expiries[held.size - limit] - now));
  }

  lease(key, limit, ttlMs, id, now) {
    const share = this.share(limit);
    let held = this.live(key, now);
    if (held?.has(id)) return [1, id, held.size, Math.ceil(held.get(id) - now)];
    if (held && held.size >= share) return [0, "", held.size, LocalLeases.waitFor(held, share, now)];
    if (!held) held = new Map();
    this.keys.delete(key);
    this.keys.set(key, held);
    held.set(id, now + ttlMs);
    while (this.keys.size > this.maxKeys) this.keys.delete(this.keys.keys().next().value);
    return [1, id, held.size, ttlMs];
  }

  has(key, id) {
    return this.keys.get(key)?.has(id) ?? false;
  }

  release(key, id, now) {
    const held = this.live(key, now);
    if (!held?.delete(id)) return 0;
    if (held.size === 0) this.keys.delete(key);
    return 1;
  }

  renew(key, id, ttlMs, now) {
    const held = this.live(key, now);
    if (!held?.has(id)) return 0;
    held.set(id, now + ttlMs);
    return 1;
  }

  count(key, limit, now) {
    const held = this.live(key, now);
    return [held?.size ?? 0, LocalLeases.waitFor(held, this.share(limit), now)];
  }
}

/**
 * The `local` policy's reservations: a take of the estimate from the local bucket, recorded
 * per key as id -> {estimate, expiresAt}; settled once by a refund of the over-estimate or a
 * charge of the under-estimate on the same local bucket.
 */
export class LocalReservations {
  constructor(buckets, maxKeys = 100_000) {
    this.buckets = buckets;
    this.maxKeys = maxKeys;
    this.keys = new Map(); // key -> Map(id -> {estimate: Q, expiresAt})
  }

  has(key, id) {
    return this.keys.get(key)?.has(id) ?? false;
  }

  reserve(key, limit, estimate, ttlMs, id, now, nowUs) {
    let open = this.keys.get(key);
    if (open) for (const [rid, r] of open) if (r.expiresAt <= now) open.delete(rid);
    if (open?.has(id)) return [1, id, this.buckets.acquire(key, limit, 0, nowUs, false)[1], 0];
    const [allowed, remaining, retryAfterMs] = this.buckets.acquire(key, limit, estimate, nowUs);
    if (!allowed) return [0, "", remaining, retryAfterMs];
    if (!open) open = new Map();
    this.keys.delete(key);
    this.keys.set(key, open);
    open.set(id, { estimate: Q.of(estimate), expiresAt: now + ttlMs });
    while (this.keys.size > this.maxKeys) this.keys.delete(this.keys.keys().next().value);
    return [1, id, remaining, 0];
  }

  /** [balance, retryAfterMs, resetAfterMs], or an Error as the module's when `id` is not open. */
  settle(key, limit, id, actual, now, nowUs, maxDebtNs) {
    const open = this.keys.get(key);
    const r = open?.get(id);
    if (!r || r.expiresAt <= now) {
      open?.delete(id);
      throw new ReservationNotOpenError(`id ${id} is not an open reservation of this key (settled, expired or never made)`);
    }
    const diff = r.estimate.sub(Q.of(actual));
    // The charge first: it may refuse (too long in debt), which leaves the reservation open.
    if (diff.cmp(0n) < 0) this.buckets.charge(key, limit, diff.mul(-1n), nowUs, maxDebtNs);
    else if (diff.cmp(0n) > 0) this.buckets.refund(key, limit, diff, nowUs);
    open.delete(id);
    if (open.size === 0) this.keys.delete(key);
    const [, balance, retryAfterMs, resetAfterMs] = this.buckets.charge(key, limit, 0, nowUs, maxDebtNs);
    return [balance, retryAfterMs, resetAfterMs];
  }
}

const sleep = (ms, signal) => new Promise((resolve, reject) => {
  if (signal?.aborted) return reject(signal.reason);
  const onAbort = () => { clearTimeout(timer); reject(signal.reason); };
  const timer = setTimeout(() => { signal?.removeEventListener("abort", onAbort); resolve(); }, ms);
  signal?.addEventListener("abort", onAbort, { once: true });
});

/** The first and the longest poll while waiting for a slot, ms (see acquireLease). */
export const POLL_FIRST_MS = 5;
export const POLL_MAX_MS = 1000;

/**
 * Takes a lease at `key`, trying again until `wait` ms have passed (0, the default: one try;
 * Infinity or null: no limit); resolves to the allowed Lease or rejects with
 * LeaseTimeoutError. A denial's retryAfterMs is when a slot frees at the latest (the earliest
 * lease's expiry); a release frees one sooner and nothing says so, so each sleep is also capped
 * by a poll that starts at 5 ms and doubles up to 1 s, with up to 10% jitter, and by the
 * deadline, where one last try is made.
 */
export async function acquireLease(limiter, key, limit, ttlMs, { wait = 0, id, signal } = {}) {
  if (wait === null) wait = Infinity;
  if (!(wait >= 0)) throw new RangeError("wait must be a number of ms >= 0 (Infinity or null: no limit)");
  const deadline = performance.now() + wait;
  for (let tries = 0; ; tries++) {
    signal?.throwIfAborted();
    const lease = await limiter.lease(key, limit, ttlMs, id);
    if (lease.allowed) return lease;
    const left = deadline - performance.now();
    if (left <= 0) throw new LeaseTimeoutError(lease, wait);
    const poll = Math.min(POLL_MAX_MS, POLL_FIRST_MS * 2 ** Math.min(tries, 10));
    const ms = Math.max(1, Math.min(poll, lease.retryAfterMs) * (1 + Math.random() * JITTER));
    await sleep(Math.min(ms, left), signal);
  }
}

/**
 * Renews `lease` every ttlMs / 2 until stop() (which resolves once a renewal in flight ends).
 * A renewal Redis answers 0 to (the lease expired or was released) sets lease.lost and stops;
 * one that fails (Redis unreachable) is tried again at the next tick.
 */
export function renewer(limiter, lease, ttlMs) {
  let timer = null, stopped = false, inFlight = Promise.resolve();
  const every = Math.max(1, Math.floor(ttlMs / 2));
  const tick = () => {
    inFlight = limiter.renewHeld(lease.key, lease.id, ttlMs).then((held) => {
      if (held === false) {
        lease.lost = true;
        stopped = true;
      }
    }, () => {}).finally(() => {
      if (!stopped) schedule();
    });
  };
  const schedule = () => {
    timer = setTimeout(tick, every);
    timer.unref?.();
  };
  if (policyOf(lease.id) !== "open") schedule(); // an "open" lease is held nowhere
  return async () => {
    stopped = true;
    clearTimeout(timer);
    await inFlight;
  };
}

/**
 * Runs `fn(lease)` holding a lease at `key` (see acquireLease for `wait`, `id`, `signal`;
 * `renew: false` does not renew):
 * renewed every ttlMs / 2 while fn runs, released when it ends, whether it resolved or threw
 * (a release that fails is logged; fn's own error is what is thrown). Resolves to fn's result.
 */
export async function withLease(limiter, key, limit, ttlMs, fn, options = {}) {
  if (typeof fn !== "function") throw new TypeError("withLease needs a function to run holding the lease");
  const lease = await acquireLease(limiter, key, limit, ttlMs, options);
  const stop = options.renew === false ? async () => {} : renewer(limiter, lease, ttlMs);
  try {
    return await fn(lease);
  } finally {
    await stop();
    try {
      await lease.release();
    } catch (error) {
      limiter.logger?.warn?.(`redis-rl: releasing the lease ${lease.id} at ${JSON.stringify(key)} failed ` +
        `(${error.name}: ${error.message}); it expires within ${ttlMs} ms`);
    }
  }
}
