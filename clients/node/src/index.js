// redis-rl client for Node: rate limits on Redis with the redis-rl module, with an explicit
// failure policy, a hot-key shield and two fallbacks for servers without the module: the
// Functions library redis_rl (FCALL) and the Lua script (EVALSHA, EVAL).
//
// Layout: the types (Limit, Decision, MultiDecision, Refund), the call into Redis
// (adapter.js: ioredis or node-redis, standalone or cluster), the paths (paths.js: the
// misconfiguration errors, the script's EVALSHA and EVAL, loading the Functions library;
// which path answers is found below by sending the real call and reading the error), the
// failure policy and the shield (Limiter, below), the exact in-process bucket (bucket.js),
// all or nothing across hash slots (slots.js), and the fallbacks (rl.lua and
// rl_functions.lua, the same files as clients/lua/). The same names as the Python library.

import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { DebtTooLongError, LocalBuckets, Q, fromDecimal, numberText } from "./bucket.js";
import { adapt, isConnectionMisconfigured, isReplyError, replyText } from "./adapter.js";
import {
  FUNCTIONS_VERSION, MisconfiguredError, ModuleMissingError, RateLimitError, deniedCommand, isAbsent, isWrongType,
  misconfiguration, noPathError, scriptCall, shortReply,
} from "./paths.js";
import { Table } from "./table.js";
import { acrossSlots } from "./slots.js";
import { wait } from "./wait.js";
import {
  LOCAL_PREFIX, LocalLeases, LocalReservations, Lease, LeaseCount, OPEN_PREFIX, Reservation, ReservationNotOpenError,
  checkId, checkLeaseLimit, checkTtl, newId, policyOf, withLease,
} from "./lease.js";

export { DebtTooLongError, LocalBuckets } from "./bucket.js";
export { Table, shardOf, shardsFor, MAX_SHARDS, MAX_BUCKETS_PER_TABLE } from "./table.js";
export { WaitNeverError, WaitTimeoutError } from "./wait.js";
export { FUNCTIONS_VERSION, MisconfiguredError, ModuleMissingError, RateLimitError, loadFunctions } from "./paths.js";
export { keySlot, SlotsDecision } from "./slots.js";
export {
  Lease, LeaseCount, LeaseTimeoutError, MAX_LEASES, MAX_TTL_MS, Reservation, ReservationNotOpenError,
} from "./lease.js";

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

  /** The same 10 numbers packed in one argument of 80 bytes, as the script and the Functions
   * library (version 3 on) read them fastest: little-endian IEEE doubles, each an integer below
   * 2^53, so exact. */
  scriptPacked(cost, refund = false) {
    const out = Buffer.alloc(80);
    this.scriptArgs(cost, refund).forEach((n, i) => out.writeDoubleLE(Number(n), i * 8));
    return out;
  }
}

const ceilS = (ms) => Math.ceil(ms / 1000);

/**
 * Who decided what for one call; `source` is redis (the module), functions (the Functions
 * library), lua (the script), cache, local, open or closed.
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
 * past the debt bound as DebtTooLongError (as the "local" policy throws it), of a settle of an
 * id not open as ReservationNotOpenError, any other as is. */
function refused(error) {
  const text = isReplyError(error) ? error.message.replace(/^ERR /, "") : "";
  if (text.startsWith("cost would leave the bucket in debt")) return new DebtTooLongError(text);
  // The script's and the function's errors carry Redis 7's " script: ..." suffix: cut it.
  if (/is not an open reservation/.test(text)) return new ReservationNotOpenError(text.replace(/ script: .*$/s, ""));
  return error;
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
 * is room, for at most the limiter's deadline from the first try. While sends of this
 * limiter are in the queue, a waiter sleeps until one of them ends and wakes it (oldest
 * first), so a thousand callers behind a queue of ten go through in the server's time;
 * polling on timers instead starved the unlucky ones past their deadline. With none of ours
 * in the queue (other traffic fills it), a waiter polls on a timer, backing off to 20 ms.
 */
function withRoomWaits(redis, limiter) {
  const send = redis.send;
  const waiters = new Set(); // wake-ups of the sends waiting for room, oldest first
  let queued = 0; // this limiter's sends in the client's queue
  const wakeOne = () => {
    const first = waiters.values().next().value;
    if (first) first();
  };
  const waitForRoom = (ms) => new Promise((resolve) => {
    const wake = () => {
      clearTimeout(timer);
      waiters.delete(wake);
      resolve();
    };
    const timer = queued > 0 ? undefined : setTimeout(wake, ms);
    waiters.add(wake);
  });
  return {
    ...redis,
    async send(args, key, raw) {
      const giveUpAt = limiter.clock() + limiter.timeoutMs;
      for (let pauseMs = 1; ; pauseMs = Math.min(pauseMs * 2, 20)) {
        let full = false;
        try {
          const reply = send(args, key, raw);
          queued++;
          try {
            return await reply;
          } finally {
            queued--;
          }
        } catch (error) {
          full = isQueueFull(error);
          if (!full || limiter.clock() + pauseMs >= giveUpAt) throw error;
        } finally {
          // Only a send the queue took frees room when it ends; waking a waiter for a refused
          // one would spin them against the full queue without yielding to I/O.
          if (!full) wakeOne();
        }
        limiter.waitingForRoom++;
        try {
          await waitForRoom(pauseMs * (0.5 + Math.random()));
        } finally {
          limiter.waitingForRoom--;
        }
        // Woken after the deadline (the policy has answered this call): send nothing late.
        if (limiter.clock() >= giveUpAt) throw new Error("The queue is full");
      }
    },
  };
}

/** The path's name as a decision's source and a counters key. */
const SOURCES = { module: "redis", functions: "functions", lua: "lua" };
/** What a call on the Functions path sends for each operation: FCALL_RO for what writes nothing. */
const FUNCTIONS = {
  acquire: ["FCALL", "rl_acquire"], peek: ["FCALL_RO", "rl_peek"], refund: ["FCALL", "rl_refund"],
  charge: ["FCALL", "rl_charge"], multi: ["FCALL", "rl_multi"],
  lease: ["FCALL", "rl_lease"], release: ["FCALL", "rl_release"], renew: ["FCALL", "rl_renew"],
  leases: ["FCALL_RO", "rl_leases"], reserve: ["FCALL", "rl_reserve"], settle: ["FCALL", "rl_settle"],
};
/** The lease and reservation operations: one key, their own arguments (see leaseArgs). */
const LEASE_OPS = new Set(["lease", "release", "renew", "leases", "reserve", "settle"]);
const firstKeyOf = (items) => items[0][0];
/** An id a release, renew or settle names: required; 1 to 16 bytes unless a policy made it. */
function heldId(id) {
  if (policyOf(id)) return id;
  if (checkId(id) === undefined) throw new RangeError("id must be 1 to 16 bytes");
  return id;
}

/** A caller's id for a new lease or reservation (1 to 16 bytes), or undefined. The prefixes
 * the failure policy's ids start with are refused: a release or settle of such an id would be
 * answered in process, never reaching the Redis lease it names. */
function callerId(id) {
  if (policyOf(id)) throw new RangeError(`id must not start with "${OPEN_PREFIX}" or "${LOCAL_PREFIX}" (the failure policy's ids)`);
  return checkId(id);
}

/** The module's command for each lease and reservation operation. */
const MODULE_LEASE_COMMANDS = {
  lease: "RL.LEASE", release: "RL.RELEASE", renew: "RL.RENEW", leases: "RL.LEASES", reserve: "RL.RESERVE",
  settle: "RL.SETTLE",
};

/**
 * The arguments after the key of a lease or reservation operation on `path`. The module takes
 * a limit's rate and capacity as text and makes an id when none is given; the fallbacks (the
 * rl_lease ... functions, the script's modes) take the script's 10 numbers for a limit and a
 * cost (clients/lua/rl.lua's header) and always an id, drawn here when the caller gave none.
 * A settle's numbers are a charge's for the actual cost (rounded up, as a charge rounds): the
 * script gives back or charges the difference with what the reserve took.
 */
function leaseArgs(path, op, a) {
  const module = path === "module";
  const id = a.id ?? (module ? undefined : newId());
  switch (op) {
    case "lease":
      return [String(a.limit), String(a.ttlMs), ...(id === undefined ? [] : module ? ["ID", id] : [id])];
    case "release":
      return [a.id];
    case "renew":
      return [a.id, String(a.ttlMs)];
    case "leases":
      return [String(a.limit)];
    case "reserve":
      return module
        ? [...a.limit.args(), numberArg(a.estimate), String(a.ttlMs), ...(id === undefined ? [] : ["ID", id])]
        : [a.limit.scriptPacked(a.estimate), String(a.ttlMs), id];
    case "settle":
      return module
        ? [...a.limit.args(), a.id, numberArg(a.actual)]
        : [a.limit.scriptPacked(a.actual), a.id];
    default:
      throw new TypeError(`not a lease operation: ${op}`);
  }
}

/** A limit for the calls that only look (check, the probe for an old library): a cost of 0
 * writes nothing. */
const PROBE_LIMIT = new Limit(1, 1);
/** The keys check() looks at: two hash tags in different slots, so that a single-node client
 * on a cluster is told by the CROSSSLOT (or MOVED) of one call on both. */
const CHECK_KEYS = ["rl:check:{a}", "rl:check:{b}"];
/** How often one misconfiguration is logged at most, ms. */
const MISCONFIGURED_LOG_MS = 60_000;

/**
 * Rate limits with an explicit failure policy. Options:
 * - onError (required): "open" allows, "closed" denies, "local" decides in process with an
 *   exact bucket of rate / instances and capacity / instances per key;
 * - instances (1), denyCache (false; true = 10,000 entries, or a number), withoutModule
 *   ("lua": the module, else the Functions library, else the script; "refuse": the module
 *   only), timeoutMs (DEFAULT_TIMEOUT_MS, 2000: each call's deadline, which
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
    this.localLeases = new LocalLeases(instances, localMaxKeys);
    this.localReservations = new LocalReservations(this.local, localMaxKeys);
    this.cacheSize = denyCache === true ? 10_000 : denyCache === false ? 0 : denyCache;
    if (!Number.isInteger(this.cacheSize) || this.cacheSize < 0) {
      throw new RangeError("denyCache must be true, false or a size bound (entries)");
    }
    this.cache = new Map(); // key -> {limit, cost, until, remaining, resetUntil}
    this.path = null; // null until detected; then "module", "functions" or "lua"
    this.detecting = null; // the detection in flight: concurrent first calls wait for it
    this.evalshaDenied = false; // NOPERM on EVALSHA seen: the script goes as EVAL
    this.inFlight = 0; // calls sent and not yet answered, for the deadline's log line
    this.waitingForRoom = 0; // sends waiting for room in the client's own queue (node-redis)
    this.counters = {
      redis: 0, functions: 0, lua: 0, cache: 0, local: 0, open: 0, closed: 0, outages: 0, misconfigured: 0,
      unappliedCharges: 0,
    };
    this.loggedAt = new Map(); // misconfiguration message -> when it was last logged
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
    this.logger.warn(`redis-rl: Redis cannot decide (${error.name}: ${error.message}${this.connectionCause(error)}); ` +
      `deciding with onError=${this.onError} until it answers`);
  }

  /** "; last connection error: ..." when the client's events told why it is not connected. */
  connectionCause(error) {
    const last = this.redis.lastError?.();
    if (!last || last === error || String(error.message).includes(last.message)) return "";
    return `; last connection error: ${last.code ? `${last.code} ` : ""}${last.message}`;
  }

  /**
   * Whether the failure policy decides after `error`: a misconfiguration (logged at error
   * level once a minute per cause, counted in counters.misconfigured, never an outage) or
   * Redis unable to decide (an outage). False: the caller's error, thrown to the caller.
   */
  policyDecides(error) {
    const misconfigured = this.misconfiguredBy(error);
    if (misconfigured) {
      this.counters.misconfigured++;
      this.logMisconfigured(misconfigured);
      return true;
    }
    if (!isUnavailable(error)) return false;
    this.failed(error);
    return true;
  }

  /** The MisconfiguredError `error` means, or null: a transport error on a connection the
   * server refused (a wrong password, no cluster support) means that refusal. */
  misconfiguredBy(error) {
    const last = isReplyError(error) ? null : this.redis.lastError?.();
    return misconfiguration(error, this.redis.cluster) ??
      (last && isConnectionMisconfigured(last) ? misconfiguration(last, this.redis.cluster) : null);
  }

  logMisconfigured(error) {
    const now = this.clock();
    const at = this.loggedAt.get(error.message);
    if (at !== undefined && now - at < MISCONFIGURED_LOG_MS) return;
    if (this.loggedAt.size > 100) this.loggedAt.clear();
    this.loggedAt.set(error.message, now);
    const log = typeof this.logger.error === "function" ? this.logger.error : this.logger.warn;
    log.call(this.logger, `redis-rl: misconfigured, not an outage: ${error.message}; deciding with ` +
      `onError=${this.onError} (logged once a minute per cause, counted in counters.misconfigured)`);
  }

  countPolicy() {
    this.counters[this.onError]++;
    if (this.downSince !== null) this.withoutRedis++;
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

  /**
   * A bucket table of this limiter: `shards` tables `name:{0}` … (src/table.js). The second
   * argument is a shard count or `{ shards, expectedBuckets }`: expectedBuckets alone picks
   * enough shards for MAX_BUCKETS_PER_TABLE buckets each; both, with too few shards, warns.
   */
  table(name, options = 1) {
    return new Table(this, name, options);
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
    let reply, source;
    try {
      [reply, source] = await this.call("acquire", [[key, limit, cost, route]]);
    } catch (error) {
      if (!this.policyDecides(error)) throw error;
      return this.policyAcquire(key, limit, cost);
    }
    this.answered(source);
    const d = new Decision(...reply, limit, source);
    this.remember(key, limit, cost, d, sentAt);
    return d;
  }

  /** What acquire would decide for `cost`, taking nothing. */
  async peek(key, limit, cost = 1, route = undefined) {
    cost = checkCost(cost);
    if (this.skipRedis()) return this.policyAcquire(key, limit, cost, false);
    let reply, source;
    try {
      [reply, source] = await this.call("peek", [[key, limit, cost, route]]);
    } catch (error) {
      if (!this.policyDecides(error)) throw error;
      return this.policyAcquire(key, limit, cost, false);
    }
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
    let reply, source;
    try {
      [reply, source] = await this.call("multi", items);
    } catch (error) {
      if (!this.policyDecides(error)) throw error;
      return this.policyAcquireAll(items);
    }
    this.answered(source);
    const [allowed, refused, retry, replies] = reply;
    const decisions = replies.map((r, i) => new Decision(...r, items[i][1], source));
    if (!allowed) items.forEach(([key, limit, cost], i) => this.remember(key, limit, cost, decisions[i], sentAt));
    return new MultiDecision(allowed, refused, retry, decisions, source);
  }

  /**
   * All or nothing over [[key, limit, cost?]] (or { key, limit, cost, shadow }) whatever slots
   * the keys hash to: one acquireAll on one server; on a cluster one per hash slot, in slot
   * order, refunding the slots already taken when a later one refuses or fails (slots.js).
   * A shadow item's refusal is reported but does not refuse the call. Resolves to a
   * SlotsDecision.
   */
  async acquireAcrossSlots(items) {
    if (!Array.isArray(items) || items.length === 0) throw new RangeError("acquireAcrossSlots needs at least one item");
    return acrossSlots(this, items.map((item) => {
      const { key, limit, cost = 1, shadow = false } = Array.isArray(item)
        ? { key: item[0], limit: item[1], cost: item[2] }
        : item;
      if (!(limit instanceof Limit)) throw new TypeError("acquireAcrossSlots: each item needs a Limit");
      return { key, limit, cost: checkCost(cost), shadow: Boolean(shadow) };
    }));
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
    let reply, source;
    try {
      [reply, source] = await this.call("charge", [[key, limit, cost, route]]);
    } catch (error) {
      if (!this.policyDecides(error)) throw refused(error);
      return this.policyCharge(key, limit, cost);
    }
    this.answered(source);
    return new Charge(...reply, limit, source);
  }

  /** Gives `cost` tokens back and clears the deny cache's entry for `key`. */
  async refund(key, limit, cost = 1, route = undefined) {
    cost = checkCost(cost);
    this.cache.delete(key);
    if (this.skipRedis()) return this.policyRefund(key, limit, cost);
    let reply, source;
    try {
      [reply, source] = await this.call("refund", [[key, limit, cost, route]]);
    } catch (error) {
      if (!this.policyDecides(error)) throw error;
      return this.policyRefund(key, limit, cost);
    }
    this.answered(source);
    return new Refund(...reply, source);
  }

  // Leases and reservations ----------------------------------------------------------------

  /**
   * Sends a lease or reservation operation; resolves to [reply, source], or to null when the
   * failure policy decides (Redis cannot answer, or a misconfiguration: logged and counted).
   * The caller's errors (bad arguments, WRONGTYPE, a settle of an id not open) are thrown.
   */
  async leaseCall(op, key, args) {
    if (this.skipRedis()) return null;
    let answer;
    try {
      answer = await this.call(op, [[key, args]]);
    } catch (error) {
      if (!this.policyDecides(error)) throw refused(error);
      return null;
    }
    this.answered(answer[1]);
    return answer;
  }

  /**
   * Takes a lease at `key` if fewer than `limit` (an integer from 1 to 10000) are held there,
   * for `ttlMs`; `id` (1 to 16 bytes) makes a retried take idempotent. Resolves to a Lease.
   * When Redis cannot decide: "open" allows (an id "open:…", held nowhere), "closed" denies,
   * "local" takes it in an in-process table (limit / instances per key, at least 1; an id
   * "local:…" unless one was given).
   */
  async lease(key, limit, ttlMs, id = undefined) {
    if (typeof id === "object" && id !== null) ({ id } = id);
    checkLeaseLimit(limit);
    checkTtl(ttlMs);
    id = callerId(id);
    const make = (reply, source) => new Lease(this, key, limit, ttlMs, ...reply, source);
    const answer = await this.leaseCall("lease", key, { limit, ttlMs, id });
    if (answer) return make(...answer);
    this.countPolicy();
    if (this.onError === "open") return make([1, OPEN_PREFIX + newId(), 0, ttlMs], "open");
    if (this.onError === "closed") return make([0, "", 0, CLOSED_RETRY_AFTER_MS], "closed");
    return make(this.localLeases.lease(key, limit, ttlMs, id ?? LOCAL_PREFIX + newId(), this.clock()), "local");
  }

  /**
   * The policy that answers for an id it made ("open:…", "local:…", or one the local table
   * holds), counted as its decision; null for a lease or reservation of Redis.
   */
  policyFor(key, id, table) {
    const kind = policyOf(id) ?? (table.has(key, id) ? "local" : null);
    if (kind) this.counters[kind]++;
    return kind;
  }

  /**
   * Gives back the lease `id` at `key`: resolves to true if it was held. An "open" lease is
   * held nowhere (false, nothing sent); one the "local" policy took is released in process,
   * even once Redis is back. When Redis cannot answer, false: the lease expires at its ttl.
   */
  async release(key, id) {
    id = heldId(id);
    const kind = this.policyFor(key, id, this.localLeases);
    if (kind === "open") return false;
    if (kind === "local") return this.localLeases.release(key, id, this.clock()) === 1;
    const answer = await this.leaseCall("release", key, { id });
    return answer !== null && Number(answer[0]) === 1;
  }

  /** true if the lease was held and now expires `ttlMs` from now, false if it was not held,
   * null when Redis could not answer. */
  async renewHeld(key, id, ttlMs) {
    checkTtl(ttlMs);
    id = heldId(id);
    const kind = this.policyFor(key, id, this.localLeases);
    if (kind === "open") return true;
    if (kind === "local") return this.localLeases.renew(key, id, ttlMs, this.clock()) === 1;
    const answer = await this.leaseCall("renew", key, { id, ttlMs });
    return answer === null ? null : Number(answer[0]) === 1;
  }

  /**
   * Makes the lease `id` at `key` expire `ttlMs` from now: resolves to true if it was held
   * (an expired or released lease is not revived). When Redis cannot answer: true under
   * "open" (the work goes on, as "open" lets it), false otherwise.
   */
  async renew(key, id, ttlMs) {
    const held = await this.renewHeld(key, id, ttlMs);
    return held ?? this.onError === "open";
  }

  /** Counts the leases held at `key` and the wait for a slot under `limit`, writing nothing:
   * a LeaseCount. When Redis cannot answer: "open" 0 held, "closed" `limit` held and its
   * retry, "local" the in-process table's. */
  async leases(key, limit) {
    checkLeaseLimit(limit);
    const answer = await this.leaseCall("leases", key, { limit });
    if (answer) return new LeaseCount(...answer[0], limit, answer[1]);
    this.countPolicy();
    if (this.onError === "open") return new LeaseCount(0, 0, limit, "open");
    if (this.onError === "closed") return new LeaseCount(limit, CLOSED_RETRY_AFTER_MS, limit, "closed");
    return new LeaseCount(...this.localLeases.count(key, limit, this.clock()), limit, "local");
  }

  /**
   * Runs `fn(lease)` holding a lease at `key`: tries again until `options.wait` ms have passed
   * (0, the default: one try; Infinity: no limit), then rejects with LeaseTimeoutError; renews
   * the lease every ttlMs / 2 while fn runs (`renew: false` does not); releases it when fn
   * resolves or throws. `options.id`, `options.signal` (aborts the wait). Resolves to fn's
   * result.
   */
  withLease(key, limit, ttlMs, fn, options = {}) {
    return withLease(this, key, limit, ttlMs, fn, options);
  }

  /**
   * Takes `estimate` tokens (above 0) from bucket `key` now, as acquire takes a cost, and
   * records a reservation open for `ttlMs`, to settle with the actual cost when the work ends.
   * Resolves to a Reservation (denied like acquire, taking nothing). When Redis cannot decide:
   * "open" allows (an id "open:…", whose settle records nothing), "closed" denies, "local"
   * reserves on the local bucket (an id "local:…" unless one was given).
   */
  async reserve(key, limit, estimate, ttlMs, id = undefined, route = undefined) {
    if (typeof id === "object" && id !== null) ({ id } = id);
    if (!(limit instanceof Limit)) throw new TypeError("reserve needs a Limit");
    const [, exact] = argument(estimate, "estimate");
    if (exact.cmp(0n) <= 0) throw new RangeError("estimate must be a number above 0 (tokens)");
    checkTtl(ttlMs);
    id = callerId(id);
    estimate = Number(estimate);
    const make = (reply, source) => new Reservation(this, key, limit, estimate, ...reply, source, route);
    const answer = await this.leaseCall("reserve", key, { limit, estimate, ttlMs, id, route });
    if (answer) return make(...answer);
    this.countPolicy();
    if (this.onError === "open") return make([1, OPEN_PREFIX + newId(), 0, 0], "open");
    if (this.onError === "closed") return make([0, "", 0, CLOSED_RETRY_AFTER_MS], "closed");
    const reply = this.localReservations.reserve(key, limit, estimate, ttlMs, id ?? LOCAL_PREFIX + newId(), this.clock(),
      this.nowUs());
    return make(reply, "local");
  }

  /**
   * Settles the reservation `id` at bucket `key` with the work's `actual` cost (>= 0): the
   * over-estimate goes back (capped at capacity), the under-estimate is charged, into debt if
   * need be; exactly once (a second settle of an id rejects with ReservationNotOpenError, as
   * does an id that lapsed). Resolves to a Charge (the signed balance). An "open" reservation
   * records nothing (applied false); one "local" made is settled in process. When Redis
   * cannot answer the settle is applied nowhere: logged, counted in counters.unappliedCharges,
   * applied false (send it again). Prefer reservation.settle(actual).
   */
  async settle(key, limit, id, actual, route = undefined) {
    if (!(limit instanceof Limit)) throw new TypeError("settle needs a Limit");
    const [, exact] = argument(actual, "actual");
    if (exact.cmp(0n) < 0) throw new RangeError("actual must be a finite number >= 0 (tokens)");
    id = heldId(id);
    actual = Number(actual);
    const kind = this.policyFor(key, id, this.localReservations);
    if (kind === "open") return new Charge(false, 0, 0, 0, limit, "open");
    this.cache.delete(key); // a remembered denial may end sooner (a refund) or later (a charge)
    if (kind === "local") {
      const reply = this.localReservations.settle(key, limit, id, actual, this.clock(), this.nowUs(), MAX_DEBT_NS);
      return new Charge(true, ...reply, limit, "local");
    }
    const answer = await this.leaseCall("settle", key, { limit, id, actual, route });
    if (answer) return new Charge(true, ...answer[0], limit, answer[1]);
    this.counters.unappliedCharges++;
    this.logger.warn(`redis-rl: the settle of reservation ${id} on ${JSON.stringify(String(key))} (actual ${actual}) was ` +
      "not applied: Redis cannot answer (send it again; unsettled, the reservation stands as taken until its ttl)");
    return new Charge(false, 0, 0, 0, limit, this.onError);
  }

  // The call into Redis ---------------------------------------------------------------------

  /**
   * Contacts Redis once, at startup: finds the path (by the same calls as a decision, on keys
   * it only looks at: nothing is written) and resolves to it, "module", "functions" or "lua".
   * Rejects with a MisconfiguredError naming the cause for what no retry cures: a wrong
   * password, a user without the permissions of any path, a cluster client on a standalone
   * server or a single-node client on a cluster, no module under withoutModule "refuse".
   * When Redis is merely down or busy it resolves to null and logs a warning: the limiter
   * decides by its policy until Redis answers.
   */
  async check() {
    const state = { connected: true, expired: false };
    try {
      await this.deadline(this.checkUnbounded(state), state);
    } catch (error) {
      const misconfigured = this.misconfiguredBy(error);
      if (misconfigured) {
        this.logMisconfigured(misconfigured);
        throw misconfigured;
      }
      if (!isUnavailable(error)) throw error;
      this.logger.warn(`redis-rl: check: Redis cannot answer now (${error.name}: ${error.message}` +
        `${this.connectionCause(error)}); the limiter decides with onError=${this.onError} until it answers`);
      return null;
    }
    return this.path;
  }

  async checkUnbounded(state) {
    await this.opened(state);
    const [a, b] = CHECK_KEYS;
    this.path = null;
    await this.detect("peek", [[a, PROBE_LIMIT, 0]]);
    if (this.redis.cluster) return;
    // A single-node client on a cluster: a call on two slots answers CROSSSLOT (or MOVED)
    // before it runs; on one server it takes 0 tokens, which writes nothing.
    try {
      await this.sendOn(this.path, "multi", [[a, PROBE_LIMIT, 0], [b, PROBE_LIMIT, 0]]);
    } catch (error) {
      if (/^(MOVED|ASK|CROSSSLOT)\b/.test(replyText(error))) throw error;
      // Anything else (a user who may only peek: NOPERM) cannot tell; the peek answered.
    }
  }

  /** Finds the path without deciding anything (a table's delete and len need it). */
  async findPath() {
    const state = { connected: true, expired: false };
    await this.deadline((async () => {
      await this.opened(state);
      await this.detect("peek", [[CHECK_KEYS[0], PROBE_LIMIT, 0]]);
    })(), state);
  }

  /** The decision's source for the path a reply came from. */
  source() {
    return SOURCES[this.path] ?? "lua";
  }

  /**
   * Runs `op` under the deadline; resolves to [reply, source]. A connection still opening is
   * waited for, unless Redis is already known to be down (then a probe fails at once and the
   * policy keeps deciding).
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
          : `not connected within ${this.timeoutMs} ms (the connection is opening or reconnecting${this.lastConnectionError()})`));
      }, this.timeoutMs);
    });
    work.catch(() => {}); // a reply after the deadline is dropped
    try {
      return await Promise.race([work, deadline]);
    } finally {
      clearTimeout(timer);
    }
  }

  lastConnectionError() {
    const last = this.redis.lastError?.();
    return last ? `; last connection error: ${last.code ? `${last.code} ` : ""}${last.message}` : "";
  }

  /** Waits for a connection still opening, unless Redis is known to be down. */
  async opened(state) {
    const opening = this.downSince === null ? this.redis.ready() : null;
    if (!opening) return;
    state.connected = false;
    await opening;
    state.connected = true;
    // Given up on while it waited: a call sent now would take tokens nobody gets.
    if (state.expired) throw new DeadlineError("given up before the connection opened");
  }

  async callUnbounded(op, items, state) {
    await this.opened(state);
    this.inFlight++;
    try {
      return await this.callOnPath(op, items, state);
    } finally {
      this.inFlight--;
    }
  }

  async callOnPath(op, items, state) {
    // Concurrent first calls wait for the one detection in flight, then take its path.
    if (this.path === null && this.detecting) await this.detecting.catch(() => {});
    if (state.expired) throw new DeadlineError("given up before the path was known");
    const path = this.path;
    if (path === null) return this.detect(op, items);
    try {
      return [await this.sendOn(path, op, items), SOURCES[path]];
    } catch (error) {
      if (path !== "module" && this.withoutModule !== "refuse" && isWrongType(error)) {
        return this.afterWrongType(path, op, items, error);
      }
      if (!this.pathGone(path, error)) throw error;
      if (path === "module" && LEASE_OPS.has(op) && isAbsent(error) && (await this.moduleAnswers(firstKeyOf(items)))) {
        throw new RateLimitError(`the redis-rl module on the server has no ${MODULE_LEASE_COMMANDS[op]}: it is older ` +
          "than leases and reservations (0.3.0); upgrade the module (nothing was taken)");
      }
      // The path stopped answering (the module unloaded, the library deleted, a permission
      // taken away): look again with this same call, which nothing ran.
      if (this.path === path) this.path = null;
      return this.detect(op, items);
    }
  }

  /**
   * The Functions library or the script, kept since the module was missing, met a key of
   * another type. Once the module is loaded, processes on the module path convert the buckets
   * the fallback wrote to the module's type, which the fallback cannot read (nothing of the
   * call ran): so the same call goes to the module, once. If the module answers (a reply, or
   * an error of its own: a key of a type neither knows still gets WRONGTYPE), the module path
   * is kept from now on; if it is missing (unknown command) or this user may not run it
   * (NOPERM), the fallback's WRONGTYPE is raised as it came. A transport error or a redirect
   * says nothing about the module: it is raised and the path stays.
   */
  async afterWrongType(path, op, items, error) {
    let reply;
    try {
      reply = await this.sendOn("module", op, items);
    } catch (moduleError) {
      const text = replyText(moduleError);
      if (isAbsent(moduleError) || /^NOPERM\b/.test(text)) throw error;
      if (!isReplyError(moduleError) || /^(MOVED|ASK|CROSSSLOT|TRYAGAIN|CLUSTERDOWN|LOADING|BUSY)\b/.test(text)) {
        throw moduleError;
      }
      this.switchToModule(path);
      throw moduleError;
    }
    this.switchToModule(path);
    return [reply, SOURCES.module];
  }

  switchToModule(path) {
    if (this.path !== path) return; // another call moved it already
    this.path = "module";
    const log = typeof this.logger.info === "function" ? this.logger.info : null;
    log?.call(this.logger, `redis-rl: the ${path === "lua" ? "script" : "Functions library"} met a key of ` +
      "another type (WRONGTYPE) and the module answers: using the module path");
  }

  /** Whether the module answers a peek (RL.PEEK of cost 0 writes nothing) at `key`. */
  async moduleAnswers(key) {
    try {
      await this.sendOn("module", "peek", [[key, PROBE_LIMIT, 0]]);
      return true;
    } catch (error) {
      return isReplyError(error) && !isAbsent(error) && !deniedCommand(error);
    }
  }

  /** Whether `error` says the path `path` no longer answers (so nothing of the call ran). */
  pathGone(path, error) {
    if (isAbsent(error)) return path !== "lua";
    const denied = deniedCommand(error);
    if (!denied) return false;
    return path === "module" ? denied.startsWith("rl.") : path === "functions" ? denied.startsWith("fcall") : false;
  }

  /**
   * Finds the path by sending the real call on each in turn (module, Functions library,
   * script; the module alone under withoutModule "refuse"): an unknown command or function
   * means the path is not there, NOPERM that this user may not take it; either ran nothing,
   * so the next path gets the same call. Resolves to [reply, source] of the path that answered.
   */
  detect(op, items) {
    const detection = this.detectPaths(op, items);
    if (!this.detecting) {
      const shared = detection.finally(() => { if (this.detecting === shared) this.detecting = null; });
      shared.catch(() => {});
      this.detecting = shared;
    }
    return detection;
  }

  async detectPaths(op, items) {
    const denied = []; // the commands ACL refused, in the order tried
    const paths = this.withoutModule === "refuse" ? ["module"] : ["module", "functions", "lua"];
    for (const path of paths) {
      try {
        if (path === "functions" && !(await this.functionsAnswer(items[0][0], denied))) continue;
        const reply = await this.sendOn(path, op, items, denied);
        this.path = path;
        return [reply, SOURCES[path]];
      } catch (error) {
        if (path !== "lua" && isAbsent(error)) continue;
        const command = deniedCommand(error);
        if (!command) throw error;
        denied.push(command);
      }
    }
    if (this.withoutModule === "refuse" && denied.length === 0) throw new ModuleMissingError();
    throw noPathError(denied);
  }

  /**
   * Whether the Functions library answers here in the version this client needs
   * (`FCALL_RO rl_version 0`). A library older than that, or one without rl_version, is
   * logged at error level with how to reload it, and the script is used.
   */
  async functionsAnswer(key, denied) {
    let version;
    try {
      version = Number(await this.redis.send(["FCALL_RO", "rl_version", "0"], key));
    } catch (error) {
      const command = deniedCommand(error);
      if (command) {
        denied.push(command);
        return false;
      }
      if (!isAbsent(error)) throw error;
      if (/function not found/i.test(error.message) && (await this.oldLibrary(key))) {
        this.logFunctions("has no rl_version (it is older than version 1)");
      }
      return false;
    }
    if (!(version >= FUNCTIONS_VERSION)) {
      this.logFunctions(`answers version ${version}`);
      return false;
    }
    return true;
  }

  /** Whether a library without rl_version is loaded: its rl_peek answers (a peek writes nothing). */
  async oldLibrary(key) {
    try {
      await this.redis.send(["FCALL_RO", "rl_peek", "1", key, ...PROBE_LIMIT.scriptArgs(0)], key);
      return true;
    } catch (error) {
      // A function that exists and failed; not an absence, a refusal, a redirect or a
      // transport error, which say nothing about the library.
      return isReplyError(error) && !isAbsent(error) && !deniedCommand(error) &&
        !/^(MOVED|ASK|CROSSSLOT|TRYAGAIN|CLUSTERDOWN|LOADING|NOSCRIPT)\b/.test(error.message);
    }
  }

  logFunctions(what) {
    this.logMisconfigured(new MisconfiguredError(`the Functions library redis_rl on the server ${what}, ` +
      `this client needs version ${FUNCTIONS_VERSION}: using the script path; reload the library with ` +
      "loadFunctions(client) (FUNCTION LOAD REPLACE) as a user with +function|load"));
  }

  /** Sends `op` on `path`; `denied` collects what ACL refused while it looks for a path. */
  sendOn(path, op, items, denied = []) {
    const firstKey = items[0][0];
    if (LEASE_OPS.has(op)) {
      const args = leaseArgs(path, op, items[0][1]);
      // A bucket table's field reserves and settles on its table (RL.HRESERVE, RL.HSETTLE); on
      // the fallbacks its bucket is its own key, firstKey.
      const route = items[0][1].route;
      if (path === "module" && route) {
        return this.redis.send([op === "reserve" ? "RL.HRESERVE" : "RL.HSETTLE", route.table, route.field, ...args],
          firstKey);
      }
      if (path === "module") return this.redis.send([MODULE_LEASE_COMMANDS[op], firstKey, ...args], firstKey);
      if (path === "functions") {
        const [command, name] = FUNCTIONS[op];
        return this.redis.send([command, name, "1", firstKey, ...args], firstKey);
      }
      return scriptCall(this, ["1", firstKey, op, ...args], firstKey, denied);
    }
    if (path === "module") {
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
    const keys = items.map(([key]) => key);
    const numbers = [];
    for (const [, limit, cost] of items) numbers.push(limit.scriptPacked(cost, op === "refund"));
    // A one-key acquire, the call an application makes most, is answered packed on both
    // fallback paths: 32 bytes, read as a Buffer (see shortReply). On the Functions path it
    // goes to rl_acquire_packed; to the script in its short form, its 80 packed bytes without
    // the mode (one Lua string and one argument fewer for Redis to make).
    if (op === "acquire" && keys.length === 1) {
      const sent = path === "functions"
        ? this.redis.send(["FCALL", "rl_acquire_packed", "1", keys[0], numbers[0]], firstKey, true)
        : scriptCall(this, ["1", keys[0], numbers[0]], firstKey, denied, true);
      return sent.then(shortReply);
    }
    if (path === "functions") {
      const [command, name] = FUNCTIONS[op];
      return this.redis.send([command, name, String(keys.length), ...keys, ...numbers], firstKey);
    }
    return scriptCall(this, [String(keys.length), ...keys, op, ...numbers], firstKey, denied);
  }

  // Waiting ---------------------------------------------------------------------------------

  /** Takes `cost` tokens once the bucket holds them (see wait.js): { cost, timeoutMs, signal }. */
  wait(key, limit, options = {}) {
    return wait(this, key, limit, options);
  }
}
