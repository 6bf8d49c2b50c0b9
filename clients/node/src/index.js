// redis-rl client for Node: rate limits on Redis with the redis-rl module, with an explicit
// failure policy, a hot-key shield and a Lua fallback for servers without the module.
//
// Layout: the types (Limit, Decision, MultiDecision, Refund), the call into Redis
// (adapter.js: ioredis or node-redis, standalone or cluster), the failure policy and the
// shield (Limiter, below), the exact in-process bucket (bucket.js) and the fallback script
// (rl.lua, the same file as clients/lua/rl.lua). The same names as the Python library.

import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { DebtTooLongError, LocalBuckets, Q, fromDecimal, numberText } from "./bucket.js";
import { adapt, isReplyError, sha1 } from "./adapter.js";
import { Table } from "./table.js";
import { wait } from "./wait.js";

export { DebtTooLongError, LocalBuckets } from "./bucket.js";
export { Table, shardOf, MAX_SHARDS } from "./table.js";
export { WaitNeverError, WaitTimeoutError } from "./wait.js";

const SCRIPT = readFileSync(new URL("./rl.lua", import.meta.url), "utf8");
const SCRIPT_SHA = sha1(SCRIPT);

/** The module's ranges and error texts: clients/vectors/ranges.json, shipped beside rl.lua. */
export const RANGES = JSON.parse(readFileSync(new URL("./ranges.json", import.meta.url), "utf8"));
const MIN_RATE = fromDecimal(RANGES.rate.min), MAX_RATE = fromDecimal(RANGES.rate.max);
const CAPACITY_ABOVE = fromDecimal(RANGES.capacity.above), MAX_CAPACITY = fromDecimal(RANGES.capacity.max);
const MAX_REFILL_S = fromDecimal(RANGES.refill.max_s), MIN_COST = fromDecimal(RANGES.cost.min);
/** The longest a charge may leave a bucket short of full, in ns (the refill bound, 100 years). */
const MAX_DEBT_NS = MAX_REFILL_S.mul(1_000_000_000n);
const POLICIES = ["open", "closed", "local"];
/**
 * How long a call may take, by default, before the failure policy decides, in ms: a
 * connection still opening, a queue of a thousand calls ahead on one connection or a slow
 * reply under load is busy, not down, and is waited for; it fits inside a web request.
 */
export const DEFAULT_TIMEOUT_MS = 2000;
/** What a `closed` decision tells the caller to wait, in ms. */
export const CLOSED_RETRY_AFTER_MS = 1000;
const MAX_EXACT_DENOMINATOR = 1n << 31n;
const ROUNDED_DENOMINATOR = 1n << 30n;

/** Base class of this package's own errors. */
export class RateLimitError extends Error {}
/** The server has no RL.ACQUIRE and the limiter was built with withoutModule: "refuse". */
export class ModuleMissingError extends RateLimitError {}
class DeadlineError extends Error {
  constructor(message) {
    super(message);
    this.name = "DeadlineError";
  }
}

/** The text sent for a number: its shortest round-trip decimal, read exactly by the module. */
const numberArg = numberText;

/** `[text, exact value]` of a caller's number, or a RangeError naming the argument. */
function argument(value, name) {
  const x = typeof value === "number" ? value : typeof value === "string" && value.trim() !== "" ? Number(value) : NaN;
  if (!Number.isFinite(x)) throw new RangeError(name === "cost" ? RANGES.cost.error : `${name} must be a finite number`);
  const text = numberText(x);
  return [text, x < 0 ? fromDecimal(text.slice(1)).mul(-1n) : fromDecimal(text)];
}

function checkCost(cost) {
  const [, exact] = argument(cost, "cost");
  if (exact.cmp(MIN_COST) < 0) throw new RangeError(RANGES.cost.error);
  return Number(cost);
}

const divmod = (n, d) => {
  let q = n / d, r = n % d;
  if (r < 0n) { q -= 1n; r += d; }
  return [q, r];
};

/**
 * A validated limit: `rate` tokens per second, a burst of `capacity` tokens; or, with
 * `{ per }`, `rate` tokens per `per` seconds, sent as "rate/per" (`new Limit(100, { per: 60 })`
 * is 100 a minute, with a burst of 100: capacity defaults to the count). Numbers mean their
 * shortest decimal: `new Limit(0.1, 1)` is one token per 10 s exactly.
 */
export class Limit {
  constructor(rate, capacity, options) {
    if (typeof rate === "object" && rate !== null) ({ rate, capacity, per: options } = rate);
    else if (typeof capacity === "object" && capacity !== null) [capacity, options] = [undefined, capacity];
    const per = typeof options === "object" && options !== null ? options.per : options;
    let [rateText, rateQ] = argument(rate, "rate");
    let perS;
    if (per !== undefined) {
      // A number or its text, like rate and capacity: { per: 60 } and { per: "60" } are one limit.
      const valid = (typeof per === "number" || (typeof per === "string" && per.trim() !== "")) && Number.isFinite(Number(per)) && Number(per) > 0;
      const [perText, perQ] = valid ? argument(per, "per") : [null, null];
      if (!valid || perQ.cmp(0n) <= 0) throw new RangeError("per must be a finite number of seconds above 0");
      perS = Number(per);
      if (capacity === undefined) capacity = rate;
      if (rateQ.cmp(0n) > 0) rateText = `${rateText}/${perText}`;
      rateQ = rateQ.div(perQ);
    } else if (capacity === undefined) {
      throw new TypeError("Limit needs a capacity unless per is given (then it is the count)");
    }
    const [capacityText, capacityQ] = argument(capacity, "capacity");
    if (rateQ.cmp(MIN_RATE) < 0 || rateQ.cmp(MAX_RATE) > 0) throw new RangeError(RANGES.rate.error);
    if (capacityQ.cmp(CAPACITY_ABOVE) <= 0 || capacityQ.cmp(MAX_CAPACITY) > 0) {
      throw new RangeError(RANGES.capacity.error);
    }
    if (capacityQ.div(rateQ).cmp(MAX_REFILL_S) > 0) throw new RangeError(RANGES.refill.error);
    /** Tokens per second (the nearest double; `rateQ` is exact). */
    this.rate = per === undefined ? Number(rate) : Number(rate) / perS;
    this.capacity = Number(capacity);
    /** The period in seconds, when given. */
    this.per = perS;
    this.rateQ = rateQ;
    this.capacityQ = capacityQ;
    this.rateText = rateText;
    this.capacityText = capacityText;
    Object.freeze(this);
  }

  equals(other) {
    return other instanceof Limit && other.rateQ.cmp(this.rateQ) === 0 && other.capacityQ.cmp(this.capacityQ) === 0;
  }

  /** `rate capacity` as the module's arguments ("0.1", "100/60", "1e-7" ...). */
  args() {
    return [this.rateText, this.capacityText];
  }

  /** The 10 numbers the Lua script takes for this limit and cost (clients/lua/rl.lua),
   * from the exact values the module would use. */
  scriptArgs(cost, refund = false) {
    let tUs = new Q(1_000_000n).div(this.rateQ);
    let d = tUs.d;
    if (d >= MAX_EXACT_DENOMINATOR) {
      d = ROUNDED_DENOMINATOR; // not representable: round T up, so the script is only stricter
      tUs = new Q(tUs.mul(d).ceil(), d);
    }
    const cap = this.capacityQ;
    const c = Q.of(cost);
    const [tq, tr] = divmod(tUs.mul(d).ceil(), d);
    const [cq, cr] = divmod(cap.mul(tUs).mul(d).floor(), d);
    const [sq, sr] = c.cmp(cap) > 0 ? [-1n, 0n] : divmod(cap.sub(c).mul(tUs).mul(d).floor(), d);
    const k = c.mul(tUs).mul(d);
    const [kq, kr] = divmod(refund ? k.floor() : k.ceil(), d);
    return [d, tq, tr, cq, cr, sq, sr, kq, kr, cap.floor()].map(String);
  }
}

const ceilS = (ms) => Math.ceil(ms / 1000);

/**
 * Who decided what for one call; `source` is redis, lua, cache, local, open or closed.
 * `remaining` is never below 0 after a take; a peek's is the signed balance, negative while a
 * charge keeps the bucket in debt.
 */
export class Decision {
  constructor(allowed, remaining, retryAfterMs, resetAfterMs, limit, source) {
    this.allowed = Boolean(allowed);
    this.remaining = Number(remaining);
    this.retryAfterMs = Number(retryAfterMs);
    this.resetAfterMs = Number(resetAfterMs);
    this.limit = limit;
    this.source = source;
  }

  /** X-RateLimit-Limit, -Remaining, -Reset (s, rounded up), Retry-After (s) when denied and
   * a wait can help. A decision of the "open" or "closed" failure policy knows the limit but
   * not what is left: X-RateLimit-Limit (and Retry-After) only. */
  headers() {
    const h = { "X-RateLimit-Limit": this.limit.capacityText };
    if (this.source !== "open" && this.source !== "closed") {
      h["X-RateLimit-Remaining"] = String(Math.max(0, this.remaining)); // a peek's may be < 0 (debt)
      h["X-RateLimit-Reset"] = String(ceilS(this.resetAfterMs));
    }
    if (!this.allowed && this.retryAfterMs >= 0) h["Retry-After"] = String(ceilS(this.retryAfterMs));
    return h;
  }
}

/** acquireAll's answer: all or nothing. `decisions` is empty when `source` is "cache". */
export class MultiDecision {
  constructor(allowed, refusedIndex, retryAfterMs, decisions, source) {
    this.allowed = Boolean(allowed);
    this.refusedIndex = Number(refusedIndex);
    this.retryAfterMs = Number(retryAfterMs);
    this.decisions = decisions;
    this.source = source;
  }
}

/**
 * charge's answer: a post-paid cost applied, perhaps into debt. `applied` is false only when
 * the "open" or "closed" policy answered (Redis unreachable), which record it nowhere: that is
 * logged, counted in counters.unappliedCharges, and the caller's to send again. `remaining` is
 * the signed balance in whole tokens (rounded toward -infinity: negative in debt),
 * `retryAfterMs` the wait until the debt is repaid (0 when none), `resetAfterMs` until full.
 */
export class Charge {
  constructor(applied, remaining, retryAfterMs, resetAfterMs, limit, source) {
    this.applied = Boolean(applied);
    this.remaining = Number(remaining);
    this.retryAfterMs = Number(retryAfterMs);
    this.resetAfterMs = Number(resetAfterMs);
    this.limit = limit;
    this.source = source;
  }

  /** Whether the balance is below zero: every take is denied until retryAfterMs. */
  get inDebt() {
    return this.remaining < 0;
  }
}

/** The error to throw for a refusal by Redis: the module's (or script's) refusal of a charge
 * past the debt bound as DebtTooLongError (as the "local" policy throws it), any other as is. */
function refused(error) {
  const text = isReplyError(error) ? error.message.replace(/^ERR /, "") : "";
  return text.startsWith("cost would leave the bucket in debt") ? new DebtTooLongError(text) : error;
}

/** refund's answer. */
export class Refund {
  constructor(remaining, resetAfterMs, source) {
    this.remaining = Number(remaining);
    this.resetAfterMs = Number(resetAfterMs);
    this.source = source;
  }
}

const UNAVAILABLE = /^(OOM|READONLY|LOADING|MASTERDOWN|CLUSTERDOWN|TRYAGAIN)\b/;

/** Whether Redis cannot decide now: transport errors, deadlines, and OOM/READONLY/LOADING. */
function isUnavailable(error) {
  if (error instanceof DeadlineError) return true;
  if (isReplyError(error)) return UNAVAILABLE.test(error.message);
  return !(error instanceof RateLimitError) && !(error instanceof RangeError) && !(error instanceof TypeError);
}

/** node-redis's commandsQueueMaxLength: a full queue refuses a command at once. */
const isQueueFull = (e) => e instanceof Error && e.message === "The queue is full";
const sleepMs = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * The adapter's send, but a full client queue (busy, not down) is tried again until there
 * is room, for at most the limiter's deadline from the first try.
 */
function withRoomWaits(redis, limiter) {
  const send = redis.send;
  return {
    ...redis,
    async send(args, key) {
      const giveUpAt = limiter.clock() + limiter.timeoutMs;
      for (let pauseMs = 1; ; pauseMs = Math.min(pauseMs * 2, 20)) {
        try {
          return await send(args, key);
        } catch (error) {
          if (!isQueueFull(error) || limiter.clock() + pauseMs >= giveUpAt) throw error;
        }
        limiter.waitingForRoom++;
        try {
          await sleepMs(pauseMs * (0.5 + Math.random()));
        } finally {
          limiter.waitingForRoom--;
        }
      }
    },
  };
}

const isUnknownCommand = (e) => isReplyError(e) && /unknown command/i.test(e.message);
const isNoScript = (e) => isReplyError(e) && e.message.startsWith("NOSCRIPT");

/**
 * Rate limits with an explicit failure policy. Options:
 * - onError (required): "open" allows, "closed" denies, "local" decides in process with an
 *   exact bucket of rate / instances and capacity / instances per key;
 * - instances (1), denyCache (false; true = 10,000 entries, or a number), withoutModule
 *   ("lua" or "refuse"), timeoutMs (DEFAULT_TIMEOUT_MS, 2000: each call's deadline, which
 *   covers waiting for a connection still opening; the policy decides only after it, or at
 *   once on a transport error), probeIntervalMs (100: how often Redis is tried during an
 *   outage, without waiting for the connection), localMaxKeys (100,000).
 */
export class Limiter {
  constructor(client, options = {}) {
    const {
      onError, instances = 1, denyCache = false, withoutModule = "lua", timeoutMs = DEFAULT_TIMEOUT_MS,
      probeIntervalMs = 100, localMaxKeys = 100_000, clock = () => performance.now(), logger = console,
    } = options;
    if (onError === undefined) {
      throw new TypeError('onError is required: "open", "closed" or "local" (there is no default: choose per limit)');
    }
    if (!POLICIES.includes(onError)) {
      throw new RangeError('onError must be "open", "closed" or "local" (there is no default: choose per limit)');
    }
    if (!["lua", "refuse"].includes(withoutModule)) throw new RangeError('withoutModule must be "lua" or "refuse"');
    if (!(timeoutMs > 0 && timeoutMs <= 60_000)) throw new RangeError("timeoutMs must be above 0 and at most 60000");
    this.redis = withRoomWaits(adapt(client), this);
    this.onError = onError;
    this.withoutModule = withoutModule;
    this.timeoutMs = timeoutMs;
    this.probeIntervalMs = probeIntervalMs;
    this.clock = clock; // milliseconds, monotonic
    this.logger = logger;
    this.local = new LocalBuckets(instances, localMaxKeys);
    this.cacheSize = denyCache === true ? 10_000 : denyCache === false ? 0 : denyCache;
    if (!Number.isInteger(this.cacheSize) || this.cacheSize < 0) {
      throw new RangeError("denyCache must be true, false or a size bound (entries)");
    }
    this.cache = new Map(); // key -> {limit, cost, until, remaining, resetUntil}
    this.path = null; // null until detected; "module", "lua" or "missing"
    this.detecting = null; // the one detection in flight, shared by concurrent first calls
    this.inFlight = 0; // calls sent and not yet answered, for the deadline's log line
    this.waitingForRoom = 0; // sends waiting for room in the client's own queue (node-redis)
    this.counters = { redis: 0, lua: 0, cache: 0, local: 0, open: 0, closed: 0, outages: 0, unappliedCharges: 0 };
    this.downSince = null;
    this.nextProbe = 0;
    this.withoutRedis = 0;
  }

  // The shield ------------------------------------------------------------------------------

  cached(key, limit, cost) {
    if (!this.cacheSize) return null;
    const entry = this.cache.get(key);
    if (!entry) return null;
    const now = this.clock();
    if (now >= entry.until) {
      this.cache.delete(key);
      return null;
    }
    if (!entry.limit.equals(limit) || cost < entry.cost) return null;
    this.cache.delete(key);
    this.cache.set(key, entry);
    this.counters.cache++;
    return new Decision(false, entry.remaining, Math.ceil(entry.until - now),
      Math.max(0, Math.ceil(entry.resetUntil - now)), limit, "cache");
  }

  remember(key, limit, cost, d, sentAt) {
    if (!this.cacheSize || d.allowed || d.retryAfterMs <= 0) return;
    this.cache.delete(key);
    this.cache.set(key, { limit, cost, until: sentAt + d.retryAfterMs, remaining: d.remaining, resetUntil: sentAt + d.resetAfterMs });
    while (this.cache.size > this.cacheSize) this.cache.delete(this.cache.keys().next().value);
  }

  // The failure policy ----------------------------------------------------------------------

  skipRedis() {
    if (this.downSince === null) return false;
    const now = this.clock();
    if (now >= this.nextProbe) {
      this.nextProbe = now + this.probeIntervalMs;
      return false;
    }
    return true;
  }

  answered(source) {
    this.counters[source]++;
    if (this.downSince !== null) {
      this.logger.warn(`redis-rl: Redis answers again after ${((this.clock() - this.downSince) / 1000).toFixed(1)} s; ` +
        `${this.withoutRedis} decisions were taken without it (onError=${this.onError})`);
      this.downSince = null;
      this.withoutRedis = 0;
    }
  }

  failed(error) {
    if (this.downSince !== null) return;
    this.downSince = this.clock();
    this.nextProbe = this.downSince + this.probeIntervalMs;
    this.counters.outages++;
    this.logger.warn(`redis-rl: Redis cannot decide (${error.name}: ${error.message}); ` +
      `deciding with onError=${this.onError} until it answers`);
  }

  countPolicy() {
    this.counters[this.onError]++;
    this.withoutRedis++;
  }

  nowUs() {
    return BigInt(Math.floor(this.clock() * 1000));
  }

  policyAcquire(key, limit, cost, take = true) {
    this.countPolicy();
    if (this.onError === "open") return new Decision(true, 0, 0, 0, limit, "open");
    if (this.onError === "closed") return new Decision(false, 0, CLOSED_RETRY_AFTER_MS, 0, limit, "closed");
    return new Decision(...this.local.acquire(key, limit, cost, this.nowUs(), take), limit, "local");
  }

  policyAcquireAll(items) {
    this.countPolicy();
    const p = this.onError;
    if (p === "local") {
      const [allowed, refused, retry, replies] = this.local.acquireAll(items, this.nowUs());
      return new MultiDecision(allowed, refused, retry, replies.map((r, i) => new Decision(...r, items[i][1], "local")), "local");
    }
    const open = p === "open";
    return new MultiDecision(open, open ? -1 : 0, open ? 0 : CLOSED_RETRY_AFTER_MS,
      items.map(([, limit]) => new Decision(open, 0, open ? 0 : CLOSED_RETRY_AFTER_MS, 0, limit, p)), p);
  }

  policyRefund(key, limit, cost) {
    this.countPolicy();
    if (this.onError !== "local") return new Refund(0, 0, this.onError);
    return new Refund(...this.local.refund(key, limit, cost, this.nowUs()), "local");
  }

  policyCharge(key, limit, cost) {
    this.countPolicy();
    if (this.onError === "local") {
      return new Charge(...this.local.charge(key, limit, cost, this.nowUs(), MAX_DEBT_NS), limit, "local");
    }
    // Usage already done that nothing recorded: say so every time, with what was lost.
    this.counters.unappliedCharges++;
    this.logger.warn(`redis-rl: a charge of ${cost} on ${JSON.stringify(String(key))} was not applied: Redis ` +
      `cannot decide and onError=${this.onError} keeps no buckets (send it again, or use onError: "local")`);
    return new Charge(false, 0, 0, 0, limit, this.onError);
  }

  // The API ---------------------------------------------------------------------------------

  /** A bucket table of this limiter: `shards` tables `name:{0}` … (src/table.js). */
  table(name, shards = 1) {
    return new Table(this, name, shards);
  }

  /**
   * Takes `cost` tokens (default 1) from bucket `key` of `limit`. `route` is a bucket table's
   * {table, field} (src/table.js), `key` then being the field's fallback key.
   */
  async acquire(key, limit, cost = 1, route = undefined) {
    cost = checkCost(cost);
    const hit = this.cached(key, limit, cost);
    if (hit) return hit;
    if (this.skipRedis()) return this.policyAcquire(key, limit, cost);
    const sentAt = this.clock();
    let reply;
    try {
      reply = await this.call("acquire", [[key, limit, cost, route]]);
    } catch (error) {
      if (!isUnavailable(error)) throw error;
      this.failed(error);
      return this.policyAcquire(key, limit, cost);
    }
    const source = this.source();
    this.answered(source);
    const d = new Decision(...reply, limit, source);
    this.remember(key, limit, cost, d, sentAt);
    return d;
  }

  /** What acquire would decide for `cost`, taking nothing. */
  async peek(key, limit, cost = 1, route = undefined) {
    cost = checkCost(cost);
    if (this.skipRedis()) return this.policyAcquire(key, limit, cost, false);
    let reply;
    try {
      reply = await this.call("peek", [[key, limit, cost, route]]);
    } catch (error) {
      if (!isUnavailable(error)) throw error;
      this.failed(error);
      return this.policyAcquire(key, limit, cost, false);
    }
    const source = this.source();
    this.answered(source);
    return new Decision(...reply, limit, source);
  }

  /**
   * All or nothing over [[key, limit]] or [[key, limit, cost]]. In a cluster every key must
   * hash to one slot: give them one hash tag ("{user:42}:s", "{user:42}:h").
   */
  async acquireAll(items) {
    items = items.map(([key, limit, cost = 1]) => [key, limit, checkCost(cost)]);
    if (items.length === 0) throw new RangeError("acquireAll needs at least one [key, limit]");
    for (const [i, [key, limit, cost]] of items.entries()) {
      const hit = this.cached(key, limit, cost);
      if (hit) return new MultiDecision(false, i, hit.retryAfterMs, [], "cache");
    }
    if (this.skipRedis()) return this.policyAcquireAll(items);
    const sentAt = this.clock();
    let reply;
    try {
      reply = await this.call("multi", items);
    } catch (error) {
      if (!isUnavailable(error)) throw error;
      this.failed(error);
      return this.policyAcquireAll(items);
    }
    const source = this.source();
    this.answered(source);
    const [allowed, refused, retry, replies] = reply;
    const decisions = replies.map((r, i) => new Decision(...r, items[i][1], source));
    if (!allowed) items.forEach(([key, limit, cost], i) => this.remember(key, limit, cost, decisions[i], sentAt));
    return new MultiDecision(allowed, refused, retry, decisions, source);
  }

  /**
   * Applies `cost` tokens (required) to bucket `key` whatever it holds (post-paid: usage
   * already done, such as the tokens of an answer), into debt if need be: RL.CHARGE. While in
   * debt every take is denied until retryAfterMs. Resolves to a Charge whose `remaining` is the
   * signed balance; rejects with DebtTooLongError, changing nothing, when the bucket would not
   * be full again within 100 years. When Redis cannot decide, "local" applies it to the local
   * bucket; "open" and "closed" record it nowhere and say so (applied false, a warning naming
   * the key and cost, counters.unappliedCharges).
   */
  async charge(key, limit, cost, route = undefined) {
    if (cost === undefined) throw new TypeError("charge needs a cost (the tokens the work used)");
    cost = checkCost(cost);
    this.cache.delete(key); // a remembered denial may end before the new debt does
    if (this.skipRedis()) return this.policyCharge(key, limit, cost);
    let reply;
    try {
      reply = await this.call("charge", [[key, limit, cost, route]]);
    } catch (error) {
      if (!isUnavailable(error)) throw refused(error);
      this.failed(error);
      return this.policyCharge(key, limit, cost);
    }
    const source = this.source();
    this.answered(source);
    return new Charge(...reply, limit, source);
  }

  /** Gives `cost` tokens back and clears the deny cache's entry for `key`. */
  async refund(key, limit, cost = 1, route = undefined) {
    cost = checkCost(cost);
    this.cache.delete(key);
    if (this.skipRedis()) return this.policyRefund(key, limit, cost);
    let reply;
    try {
      reply = await this.call("refund", [[key, limit, cost, route]]);
    } catch (error) {
      if (!isUnavailable(error)) throw error;
      this.failed(error);
      return this.policyRefund(key, limit, cost);
    }
    const source = this.source();
    this.answered(source);
    return new Refund(...reply, source);
  }

  // The call into Redis ---------------------------------------------------------------------

  source() {
    return this.path === "module" ? "redis" : "lua";
  }

  /**
   * Runs `op` under the deadline. A connection still opening is waited for, unless Redis is
   * already known to be down (then a probe fails at once and the policy keeps deciding).
   */
  async call(op, items) {
    const state = { connected: true, expired: false };
    return this.deadline(this.callUnbounded(op, items, state), state);
  }

  /** Awaits `work` for at most timeoutMs; a reply after that is dropped. */
  async deadline(work, state) {
    let timer;
    const deadline = new Promise((_, reject) => {
      timer = setTimeout(() => {
        state.expired = true; // work still waiting to be sent is never sent
        reject(new DeadlineError(state.connected
          ? `no reply within ${this.timeoutMs} ms (busy or down: ${this.inFlight} calls in flight, ` +
            `${this.waitingForRoom} waiting for room in the client's queue)`
          : `not connected within ${this.timeoutMs} ms (the connection is opening or reconnecting)`));
      }, this.timeoutMs);
    });
    work.catch(() => {}); // a reply after the deadline is dropped
    try {
      return await Promise.race([work, deadline]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Detects the path once for all the calls waiting on it. */
  detectOnce() {
    if (!this.detecting) {
      this.detecting = this.detect().finally(() => { this.detecting = null; });
    }
    return this.detecting;
  }

  async detect() {
    const reply = await this.redis.send(["COMMAND", "INFO", "RL.ACQUIRE"], undefined);
    const present = Array.isArray(reply) && reply.length > 0 && reply[0] !== null && reply[0] !== undefined;
    this.path = present ? "module" : this.withoutModule === "lua" ? "lua" : "missing";
  }

  refuseIfMissing() {
    if (this.path === "missing") {
      throw new ModuleMissingError('the server has no RL.ACQUIRE (the redis-rl module is not loaded) and this ' +
        'limiter was built with withoutModule: "refuse"; load the module or use withoutModule: "lua"');
    }
  }

  async callUnbounded(op, items, state) {
    const opening = this.downSince === null ? this.redis.ready() : null;
    if (opening) {
      state.connected = false;
      await opening;
      state.connected = true;
      // Given up on while it waited: a call sent now would take tokens nobody gets.
      if (state.expired) throw new DeadlineError("given up before the connection opened");
    }
    this.inFlight++;
    try {
      return await this.callOnPath(op, items, state);
    } finally {
      this.inFlight--;
    }
  }

  async callOnPath(op, items, state) {
    if (this.path === null) await this.detectOnce();
    if (state.expired) throw new DeadlineError("given up before the path was known");
    this.refuseIfMissing();
    try {
      return await this.send(op, items);
    } catch (error) {
      if (!isUnknownCommand(error)) throw error;
      // The module went away (or came): look again, then retry once on the new path.
      await this.detectOnce();
      this.refuseIfMissing();
      return this.send(op, items);
    }
  }

  async send(op, items) {
    const firstKey = items[0][0];
    if (this.path === "module") {
      const route = items[0][3]; // a bucket table's field: RL.H* on its table
      const name = route
        ? { acquire: "RL.HACQUIRE", peek: "RL.HPEEK", refund: "RL.HREFUND", charge: "RL.HCHARGE" }[op]
        : { acquire: "RL.ACQUIRE", peek: "RL.PEEK", refund: "RL.REFUND", charge: "RL.CHARGE", multi: "RL.ACQUIRE.MULTI" }[op];
      const args = [name];
      for (const [key, limit, cost] of items) {
        args.push(...(route ? [route.table, route.field] : [key]), ...limit.args(), numberArg(cost));
      }
      return this.redis.send(args, firstKey);
    }
    const args = [String(items.length), ...items.map(([key]) => key), op];
    for (const [, limit, cost] of items) args.push(...limit.scriptArgs(cost, op === "refund"));
    try {
      return await this.redis.send(["EVALSHA", SCRIPT_SHA, ...args], firstKey);
    } catch (error) {
      if (!isNoScript(error)) throw error;
      // SCRIPT LOAD, then EVALSHA again. A cluster client would send SCRIPT LOAD to any
      // node, so there EVAL runs it on the key's node, which caches it the same way.
      if (this.redis.cluster) return this.redis.send(["EVAL", SCRIPT, ...args], firstKey);
      await this.redis.send(["SCRIPT", "LOAD", SCRIPT], firstKey);
      return this.redis.send(["EVALSHA", SCRIPT_SHA, ...args], firstKey);
    }
  }

  // Waiting ---------------------------------------------------------------------------------

  /** Takes `cost` tokens once the bucket holds them (see wait.js): { cost, timeoutMs, signal }. */
  wait(key, limit, options = {}) {
    return wait(this, key, limit, options);
  }
}
