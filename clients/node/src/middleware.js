// HTTP middleware on the Limiter: a Connect/Express middleware (`rateLimit`), and a Store for
// express-rate-limit (`RedisRlStore`) so its users keep their setup and get an exact, shared
// token bucket. Both sit on the limiter's public acquire/refund: its failure policy, deny
// cache and Lua fallback apply unchanged.
//
// Header fields written by `rateLimit` on each response it decided:
// - RateLimit-Policy and RateLimit, as draft-ietf-httpapi-ratelimit-headers-10 (September
//   2025) defines them: `RateLimit-Policy: "default";q=<capacity>;w=<seconds to refill it>`,
//   `RateLimit: "default";r=<remaining>;t=<seconds until full>`;
// - X-RateLimit-Limit, -Remaining, -Reset (seconds until full), on by default;
// - Retry-After (seconds, rounded up) on a 429 that a wait can cure.
// When several rateLimit middlewares decided one request, one set is written: RateLimit-Policy
// and RateLimit as the draft's lists, one item per limit, X-RateLimit-* of the tightest.
// A decision by the "open" failure policy knows no quota, so it writes none of these; one by
// "closed" knows the configured limit but not what is left, so it writes RateLimit-Policy,
// X-RateLimit-Limit and Retry-After only.

import { AsyncLocalStorage } from "node:async_hooks";
import { BlockList, isIP } from "node:net";
import { Limit, MAX_LEASES, MAX_TTL_MS, RANGES } from "./index.js";

/** The draft whose RateLimit-Policy and RateLimit syntax is written. */
export const HEADERS_DRAFT = "draft-ietf-httpapi-ratelimit-headers-10";
export const PROBLEM_TYPE = "application/problem+json";

const ceilS = (ms) => Math.ceil(ms / 1000);
// "::ffff:10.0.0.1" (an IPv4 peer on a dual-stack socket) is 10.0.0.1.
const plainAddress = (a) => (typeof a === "string" && a.startsWith("::ffff:") && isIP(a.slice(7)) === 4 ? a.slice(7) : a);

function trustList(proxies) {
  const list = new BlockList();
  for (const entry of proxies) {
    const [address, bits] = String(entry).split("/");
    const type = isIP(address) === 6 ? "ipv6" : "ipv4";
    if (!isIP(address)) throw new RangeError(`trustedProxies: ${entry} is not an address or network`);
    if (bits === undefined) list.addAddress(address, type);
    else list.addSubnet(address, Number(bits), type);
  }
  return list;
}

/**
 * The client address: the peer, or, when the peer is a trusted proxy, the nearest address in
 * X-Forwarded-For that is not one (read from the right, where the trusted proxies appended;
 * anything further left may be forged).
 */
export function clientAddress(peer, forwardedFor, trusted) {
  peer = plainAddress(peer);
  const isTrusted = (a) => isIP(a) !== 0 && trusted.check(a, isIP(a) === 6 ? "ipv6" : "ipv4");
  if (!peer || !isTrusted(peer) || !forwardedFor) return peer || "unknown";
  const hops = String(forwardedFor).split(",").map((h) => plainAddress(h.trim())).filter(Boolean);
  for (let i = hops.length - 1; i >= 0; i--) {
    if (isIP(hops[i]) === 0) return peer;
    if (!isTrusted(hops[i])) return hops[i];
  }
  return hops[0] ?? peer;
}

/** A RateLimit-Policy item: w is the seconds a refill from empty takes, rounded up. */
const policyItem = (name, limit) =>
  `"${name}";q=${Math.floor(limit.capacity)};w=${Math.max(1, Math.ceil(limit.capacity / limit.rate))}`;

/**
 * One set of header fields for the decisions of one request, [[{policyName, legacyHeaders},
 * decision]], as [name, value] pairs (Python's redis_rl.http.header_fields, the same rules):
 * each limit an item of RateLimit-Policy (unless "open" decided it: no quota is known) and of
 * RateLimit (unless "closed" did too: the limit is known, what is left is not), X-RateLimit-*
 * of the tightest limit whose quota is known (the fewest tokens left; X-RateLimit-Limit alone
 * when only "closed" decided), and Retry-After, the longest wait among the denials a wait can
 * cure.
 */
export function mergedHeaderFields(decided) {
  const quota = decided.filter(([, d]) => d.source !== "open");
  const known = quota.filter(([, d]) => d.source !== "closed");
  const out = [];
  if (quota.length) {
    out.push(["RateLimit-Policy", quota.map(([o, d]) => policyItem(o.policyName ?? "default", d.limit)).join(", ")]);
  }
  if (known.length) {
    out.push(["RateLimit", known.map(([o, d]) =>
      `"${o.policyName ?? "default"}";r=${d.remaining};t=${ceilS(d.resetAfterMs)}`).join(", ")]);
  }
  if (quota.some(([o]) => o.legacyHeaders ?? true)) {
    if (known.length) {
      const tight = known.map(([, d]) => d).reduce((a, b) =>
        (b.remaining < a.remaining || (b.remaining === a.remaining && b.resetAfterMs > a.resetAfterMs) ? b : a));
      const legacy = tight.headers();
      for (const name of ["X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"]) out.push([name, legacy[name]]);
    } else {
      out.push(["X-RateLimit-Limit", quota[0][1].limit.capacityText]);
    }
  }
  const waits = quota.filter(([, d]) => !d.allowed && d.retryAfterMs >= 0).map(([, d]) => d.retryAfterMs);
  if (waits.length) out.push(["Retry-After", String(ceilS(Math.max(...waits)))]);
  return out;
}

/** The header fields for one decision alone, as [name, value] pairs. */
export function headerFields(decision, { policyName = "default", legacyHeaders = true } = {}) {
  return mergedHeaderFields([[{ policyName, legacyHeaders }, decision]]);
}

/** The names the header fields use: a later middleware replaces them with the merged set. */
const FIELD_NAMES = ["RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining",
  "X-RateLimit-Reset", "Retry-After"];

/** Per response, what each rateLimit middleware that ran for its request decided. */
const decidedOfResponse = new WeakMap();

/** The RFC 9457 problem details body of a 429. */
export function problem(decision) {
  const detail = decision.retryAfterMs < 0
    ? "This request costs more than the rate limit's capacity; it can never be allowed."
    : `Rate limit exceeded; retry after ${ceilS(decision.retryAfterMs)} s.`;
  return { type: "about:blank", title: "Too Many Requests", status: 429, detail };
}

/** The start of every default key space of rateLimit: "rl:http:<rate>:<capacity>:". */
export const DEFAULT_PREFIX = "rl:http:";

/** Per request, the Redis keys its rateLimit middlewares used, and which middleware. */
const keysOfRequest = new WeakMap();

/** Records that `owner` uses `redisKey` for `req`; throws if another middleware already did,
 * as the two would each count the other's requests in one bucket. */
function claimKey(req, redisKey, owner) {
  let keys = keysOfRequest.get(req);
  if (!keys) keysOfRequest.set(req, (keys = new Map()));
  const other = keys.get(redisKey);
  if (other && other !== owner) {
    throw new RangeError(`rateLimit: two middlewares use the Redis key ${redisKey} for one request, so each ` +
      "would count the other's requests; give each its own prefix");
  }
  keys.set(redisKey, owner);
}

/**
 * Connect/Express middleware. Options: limiter, limit (required: a Limit, or (req) => Limit
 * for limits per request, such as per-user tiers); key: "ip" (default), "header:<Name>"
 * (falls back to the address when absent) or (req) => key; cost: tokens per request or
 * (req) => tokens; trustedProxies: addresses or networks ("10.0.0.0/8") whose
 * X-Forwarded-For is believed (default none); prefix: put before each key in Redis (by
 * default each limit has its own key space, "rl:http:<rate>:<capacity>:", so two middlewares
 * with different limits never share a bucket; two that still name one Redis key for a
 * request, by the same limit or the same prefix, are refused with an error naming the key:
 * give each its own prefix); policyName ("default");
 * legacyHeaders (true); skip: (req) => true lets a request through untouched; onLimited:
 * (req, res, decision, headers) sends a custom response instead of the problem+json 429.
 * Every function (key, limit, cost, skip, onLimited) may be sync or async: what it returns
 * is awaited, and what it throws or rejects goes to next(error).
 *
 * inFlight: an in-flight limit per key, `{ limit, ttlMs = 60000, renew = true, prefix }` (or
 * the limit alone, or [limit, ttlMs]): after the rate limit allowed the request (`limit` may
 * be left out), a lease at "<prefix><key>" is taken before the handler and released exactly
 * once when the response is done, sent ("finish") or cut short ("close": a client that went,
 * a stream that ended early), renewed every ttlMs / 2 meanwhile; ttlMs bounds how long a
 * crashed process holds a slot. Denied: the rate limit's fields, Retry-After until a slot
 * frees and a problem+json 429 (onLimited gets the denied Lease). The default prefix is
 * "rl:http:inflight:<limit>:", or the rateLimit's prefix followed by "inflight:".
 */
export function rateLimit(options) {
  const {
    limiter, limit, key = "ip", cost = 1, trustedProxies = [], prefix, policyName = "default",
    legacyHeaders = true, skip, onLimited,
  } = options;
  const inFlight = options.inFlight === undefined ? null : inFlightOptions(options.inFlight, prefix);
  if (!limiter || !(limit instanceof Limit || typeof limit === "function" || (limit === undefined && inFlight))) {
    throw new TypeError("rateLimit needs { limiter, limit: new Limit(...) or (req) => Limit } " +
      "(limit may be left out when inFlight is given)");
  }
  if (!(key === "ip" || typeof key === "function" || (typeof key === "string" && key.startsWith("header:")))) {
    throw new RangeError('key must be "ip", "header:<Name>" or a function of the request');
  }
  const trusted = trustList(trustedProxies);
  const clientKey = async (req) => {
    let k = null;
    if (typeof key === "function") k = await key(req);
    else if (key.startsWith("header:")) {
      const v = req.headers[key.slice(7).toLowerCase()];
      if (v) k = `h:${v}`;
    }
    if (k === null || k === undefined) {
      k = `ip:${clientAddress(req.socket?.remoteAddress, req.headers["x-forwarded-for"], trusted)}`;
    } else if (typeof k !== "string" && typeof k !== "number") {
      throw new TypeError(`rateLimit: key must give a string, got ${Object.prototype.toString.call(k)}`);
    }
    return k;
  };
  const keyFor = (bucket, k) => (prefix ?? `${DEFAULT_PREFIX}${bucket.rateText}:${bucket.capacityText}:`) + k;
  const limitFor = async (req) => {
    const l = typeof limit === "function" ? await limit(req) : limit;
    if (!(l instanceof Limit)) throw new TypeError("rateLimit: limit must give a Limit (new Limit(...))");
    return l;
  };

  return async function rateLimitMiddleware(req, res, next) {
    let held = null; // the in-flight lease, until the response is done
    try {
      if (skip && (await skip(req))) return next();
      const k = await clientKey(req);
      const decided = decidedOfResponse.get(res) ?? [];
      if (limit !== undefined) {
        const [bucket, tokens] = await Promise.all([limitFor(req), typeof cost === "function" ? cost(req) : cost]);
        const bucketKey = keyFor(bucket, k);
        claimKey(req, bucketKey, rateLimitMiddleware);
        const decision = await limiter.acquire(bucketKey, bucket, tokens);
        // Stacked middlewares write one merged set: the draft's lists, the tightest X-RateLimit-*.
        if (!decidedOfResponse.has(res)) decidedOfResponse.set(res, decided);
        decided.push([{ policyName, legacyHeaders }, decision]);
        const headers = mergedHeaderFields(decided);
        for (const name of FIELD_NAMES) res.removeHeader(name);
        for (const [name, value] of headers) res.setHeader(name, value);
        if (!decision.allowed) {
          if (onLimited) return await onLimited(req, res, decision, headers);
          return sendProblem(res, problem(decision));
        }
      }
      if (inFlight) {
        const leaseKey = inFlight.prefix + k;
        claimKey(req, leaseKey, rateLimitMiddleware);
        held = await holdInFlight(limiter, inFlight, leaseKey, res);
        if (held === null) return; // the response was over (the client went) before the lease came
        if (!held.lease.allowed) {
          const { lease } = held;
          held = null;
          // The rate limit's own fields (when one decided) and Retry-After until a slot frees.
          const retry = String(Math.ceil(Math.max(0, lease.retryAfterMs) / 1000));
          const headers = [...mergedHeaderFields(decided).filter(([name]) => name !== "Retry-After"), ["Retry-After", retry]];
          res.setHeader("Retry-After", retry);
          if (onLimited) return await onLimited(req, res, lease, headers);
          return sendProblem(res, {
            type: "about:blank", title: "Too Many Requests", status: 429,
            detail: `Too many requests in flight (at most ${lease.limit}); retry after ${retry} s.`,
          });
        }
      }
      return next();
    } catch (error) {
      // Failed before the handler ran: the in-flight slot is given back at once.
      held?.done();
      next(error);
    }
  };
}

function sendProblem(res, body) {
  const text = JSON.stringify(body);
  res.statusCode = 429;
  res.setHeader("Content-Type", PROBLEM_TYPE);
  res.setHeader("Content-Length", Buffer.byteLength(text));
  res.end(text);
}

/** The default start of an in-flight limit's lease keys: "rl:http:inflight:<limit>:". */
export const DEFAULT_IN_FLIGHT_PREFIX = "rl:http:inflight:";

/** The inFlight option, checked: {limit, ttlMs, renew, prefix}. It takes a limit alone, a
 * [limit, ttlMs] pair or { limit, ttlMs = 60000, renew = true, prefix }. A rateLimit's own
 * `prefix` is followed by "inflight:" for the lease keys, so a bucket and a lease never share
 * a key. */
function inFlightOptions(option, prefix) {
  const given = typeof option === "number" ? { limit: option }
    : Array.isArray(option) ? { limit: option[0], ttlMs: option[1] } : option ?? {};
  const { limit, ttlMs = 60_000, renew = true } = given;
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LEASES) {
    throw new RangeError(`inFlight: limit must be an integer from 1 to ${MAX_LEASES} (requests in flight per key)`);
  }
  if (!Number.isInteger(ttlMs) || ttlMs < 1 || ttlMs > MAX_TTL_MS) {
    throw new RangeError(`inFlight: ttlMs must be an integer from 1 to ${MAX_TTL_MS} (ms a lease outlives a lost process)`);
  }
  const own = given.prefix;
  return {
    limit, ttlMs, renew: Boolean(renew),
    prefix: own ?? (prefix !== undefined ? `${prefix}inflight:` : `${DEFAULT_IN_FLIGHT_PREFIX}${limit}:`),
  };
}

/**
 * Takes the in-flight lease at `leaseKey` and holds it until the response is done: released once,
 * on the response's "finish" (sent) or "close" (the connection ended first: a client that
 * went, a streamed body cut), whichever comes first, and renewed every ttlMs / 2 until then,
 * so a stream longer than the ttl keeps its slot. Resolves to {lease, done}, done() releasing
 * it now; to a denied lease's {lease}; or to null when the response was over before the
 * lease came (it is released at once).
 */
async function holdInFlight(limiter, options, leaseKey, res) {
  let over = false, release = null;
  const end = () => {
    if (over) return;
    over = true;
    res.off("finish", end);
    res.off("close", end);
    release?.();
  };
  // Listen before the lease is asked for: a client that goes meanwhile is seen too.
  res.on("finish", end);
  res.on("close", end);
  let lease;
  try {
    lease = await limiter.lease(leaseKey, options.limit, options.ttlMs);
  } catch (error) {
    end();
    throw error;
  }
  if (!lease.allowed) {
    end();
    return { lease, done() {} };
  }
  let timer = null, stopped = false;
  const renew = () => {
    timer = setTimeout(() => {
      // Renewed until done; stopped only when Redis says the lease is gone (null: it could
      // not answer, so the next tick tries again).
      limiter.renewHeld(lease.key, lease.id, options.ttlMs).then((heldStill) => {
        if (heldStill !== false && !stopped) renew();
      }, () => { if (!stopped) renew(); });
    }, Math.max(1, Math.floor(options.ttlMs / 2)));
    timer.unref?.();
  };
  release = () => {
    stopped = true;
    clearTimeout(timer);
    lease.release().catch((error) => limiter.logger?.warn?.(`redis-rl: releasing the in-flight lease at ` +
      `${JSON.stringify(lease.key)} failed (${error.name}: ${error.message}); it expires within ${options.ttlMs} ms`));
  };
  if (over || res.writableFinished || res.destroyed) {
    over = true;
    release();
    return null;
  }
  if (options.renew && lease.source !== "open") renew();
  return { lease, done: end };
}

/**
 * Stores whose express-rate-limit `limit` is a function of the request, initialised (by
 * express-rate-limit, when its middleware is built) and not yet followed by a withRequest
 * call. `withRequest(rateLimit({...}))` builds, then wraps, in one synchronous expression; a
 * store still here on the next turn of the event loop was built unwrapped, so it counts hits
 * in fixed windows instead of a token bucket (see RedisRlStore), and the limiter's logger
 * says so once, at startup.
 */
const storesAwaitingWrapper = new Set();

export const UNWRAPPED_WARNING = "redis-rl: RedisRlStore: express-rate-limit's limit is a function of the request, " +
  "but its middleware was not wrapped in withRequest(...) when it was built, so the store cannot see the request: " +
  "it counts hits in fixed windows of windowMs and express-rate-limit compares them with limit(req, res); for a " +
  "token bucket per limit use app.use(withRequest(rateLimit({ ... }))), or give the store the tiers by key, " +
  "new RedisRlStore({ limiter, limit: (key) => number })";

/**
 * The bucket that counts hits in one fixed window of `windowMs`: it refills at most half a
 * token per window (one token per 2 x windowMs, or per 1e6 s for windows above 5.8 days, the
 * slowest rate), so the tokens in use are exactly the hits of the window; its capacity is the
 * most hits a window can count, as many as a full refill within 100 years allows (at most
 * 1e9: 26,280,000 for a minute, 18,250 for a day), past which every hit reports capacity + 1.
 */
function windowCounter(windowMs) {
  const perS = Math.min(2 * (windowMs / 1000), 1_000_000);
  const capacity = Math.max(1, Math.min(1e9, Math.floor(Number(RANGES.refill.max_s) / perS)));
  return new Limit(1, capacity, { per: perS });
}

/** The request a middleware wrapped by `withRequest` is serving: {req, res}. */
const requestContext = new AsyncLocalStorage();

/**
 * `middleware`, run with its request in reach of the RedisRlStore it uses: wrap an
 * express-rate-limit middleware whose `limit` is a function of the request, as
 * `app.use(withRequest(rateLimit({ limit: (req, res) => ..., store: new RedisRlStore(...) })))`.
 * express-rate-limit calls `limit(req, res)` only after the store's increment(key), which
 * never sees the request; with the wrapper, the store calls the same function first, with
 * the request this call serves (Node's AsyncLocalStorage, which follows every await of that
 * middleware and nothing else), and takes from a bucket of that limit. Stacked wrapped
 * middlewares each see their own request; an unwrapped one is unchanged.
 */
export function withRequest(middleware) {
  if (typeof middleware !== "function") throw new TypeError("withRequest needs a middleware function (req, res, next)");
  storesAwaitingWrapper.clear(); // the middleware just built is wrapped: no warning for its store
  return function withRequestMiddleware(req, res, next) {
    return requestContext.run({ req, res }, () => middleware(req, res, next));
  };
}

/**
 * What each request's increments took, per store: express-rate-limit calls `decrement(key)`
 * without the request, so the request is found through its async context. The ledger is
 * entered in `increment`'s synchronous start, after express-rate-limit's own awaits, so its
 * context is the request's alone; every limiter stacked after it in the request sees it too.
 */
const requestLedger = new AsyncLocalStorage();

function ledgerOfThisRequest() {
  let ledger = requestLedger.getStore();
  if (!ledger) {
    ledger = { takes: new Map(), keys: new Map() }; // store -> {key, taken}; Redis key -> store
    requestLedger.enterWith(ledger);
  }
  return ledger;
}

/**
 * A Store for express-rate-limit (v7, v8) on the Limiter: `limit` requests per `windowMs`
 * become one token bucket per key of `limit` tokens per `windowMs / 1000` seconds (the exact
 * N/S rate "100/60") and capacity `limit`: a client may burst `limit` requests, then one more each
 * windowMs / limit, instead of a fixed window that lets 2 x limit through across a window's
 * edge.
 *
 * The contract kept with express-rate-limit:
 * - `increment` returns `totalHits`, a positive integer, and `resetTime` under every failure
 *   policy: the tokens in use (limit - remaining), or limit + 1 when denied, with `resetTime`
 *   when the bucket is full again (when denied: when the next token arrives, so Retry-After
 *   is right); under "open" (no quota known) 1 hit and one window;
 * - `decrement` (skipFailedRequests, skipSuccessfulRequests) gives back what this request's
 *   increment took, once, and nothing when it took nothing (a 429, an "open" decision);
 * - each limiter has its own keys: the default prefix is "rl:erl:<limit>/<windowMs>ms:", and
 *   two limiters that still share a Redis key in one request are refused with an error
 *   naming the key (give each its own `prefix`).
 *
 * express-rate-limit's `limit` may be a function of the request, `limit(req, res)`, sync or
 * async. express-rate-limit (7.x and 8.x) calls it itself, after `increment(key)`, and never
 * hands it or the request to the store; so wrap the middleware in `withRequest`, and the store
 * calls the same function with the request the middleware is serving (an AsyncLocalStorage
 * context, see withRequest) and takes from a bucket of that many requests per window, under
 * the default prefix "rl:erl:<that limit>/<windowMs>ms:". Without the wrapper the store cannot
 * know the limit, so it counts hits instead, as express-rate-limit's MemoryStore does, and
 * express-rate-limit compares the count with limit(req, res) itself: fixed windows of
 * windowMs aligned on the clock (Date.now()), one counter per key and window under
 * "<prefix or rl:erl:>window/<windowMs>ms:<window index>:<key>", totalHits the hits of the
 * current window and resetTime its end (see windowCounter for the most a window counts). It
 * is a fixed window: up to twice the limit can pass across a window's edge; wrap the
 * middleware in withRequest (or give the store `limit: (key) => number`, the same tiers by
 * key, prefix "rl:erl:bykey/...") for the token bucket. A warning says so once, at startup.
 */
export class RedisRlStore {
  constructor({ limiter, prefix, limit } = {}) {
    if (!limiter) throw new TypeError("RedisRlStore needs { limiter }");
    if (limit !== undefined && typeof limit !== "function") {
      throw new TypeError("RedisRlStore's limit, when given, is a function of the key: (key) => number");
    }
    this.limiter = limiter;
    this.ownPrefix = prefix;
    this.prefix = prefix ?? "rl:erl:";
    this.limitOfKey = limit;
    this.limitOfRequest = null;
    this.localKeys = false;
    this.bucket = null;
    this.windowS = null;
    this.windowMs = null;
  }

  init(options) {
    this.windowMs = options.windowMs;
    this.windowS = options.windowMs / 1000;
    if (typeof options.limit === "function") {
      if (this.limitOfKey) {
        if (this.ownPrefix === undefined) this.prefix = `rl:erl:bykey/${options.windowMs}ms:`;
      } else {
        this.limitOfRequest = options.limit; // called in increment, with the request of withRequest
        storesAwaitingWrapper.add(this);
        setImmediate(() => {
          if (storesAwaitingWrapper.delete(this)) this.limiter.logger?.warn?.(UNWRAPPED_WARNING);
        }).unref();
      }
      return;
    }
    if (typeof options.limit !== "number") throw new TypeError("RedisRlStore needs a numeric limit or a limit function");
    this.bucket = new Limit(options.limit, { per: this.windowS });
    if (this.ownPrefix === undefined) this.prefix = `rl:erl:${options.limit}/${options.windowMs}ms:`;
  }

  /** The bucket of `key` and its Redis key: {bucket, redisKey}. */
  async target(key) {
    if (this.bucket) return { bucket: this.bucket, redisKey: this.prefix + key };
    if (this.limitOfKey) {
      return { bucket: new Limit(await this.limitOfKey(key), { per: this.windowS }), redisKey: this.prefix + key };
    }
    if (!this.limitOfRequest) throw new TypeError("RedisRlStore was not initialised by express-rate-limit");
    const context = requestContext.getStore();
    if (!context) {
      // The request is out of reach: count the hits of this window (see windowCounter).
      const index = Math.floor(Date.now() / this.windowMs);
      const prefix = this.ownPrefix ?? "rl:erl:";
      return {
        bucket: windowCounter(this.windowMs), redisKey: `${prefix}window/${this.windowMs}ms:${index}:${key}`,
        windowEnd: (index + 1) * this.windowMs,
      };
    }
    const n = await this.limitOfRequest(context.req, context.res);
    if (typeof n !== "number") throw new TypeError(`RedisRlStore: limit(req, res) must give a number, got ${typeof n}`);
    const bucket = new Limit(n, { per: this.windowS });
    const prefix = this.ownPrefix ?? `rl:erl:${n}/${this.windowMs}ms:`;
    return { bucket, redisKey: prefix + key };
  }

  async increment(key) {
    // Synchronously first, so the ledger is in the request's context (see requestLedger).
    const ledger = ledgerOfThisRequest();
    const take = { key, taken: false, bucket: null, redisKey: null };
    ledger.takes.set(this, take);
    const { bucket, redisKey, windowEnd } = await this.target(key);
    const other = ledger.keys.get(redisKey);
    if (other && other !== this) {
      throw new RangeError(`RedisRlStore: two express-rate-limit limiters use the Redis key ${redisKey} for one ` +
        "request, so each would count the other's hits; give each RedisRlStore its own prefix");
    }
    ledger.keys.set(redisKey, this);
    take.bucket = bucket;
    take.redisKey = redisKey;
    const d = await this.limiter.acquire(redisKey, bucket, 1);
    take.taken = d.allowed && d.source !== "open";
    const capacity = bucket.capacity;
    const now = Date.now();
    if (windowEnd !== undefined) {
      // Hits counted in a window: express-rate-limit compares them with its limit.
      if (d.source === "open") return { totalHits: 1, resetTime: new Date(windowEnd) };
      return { totalHits: d.allowed ? capacity - d.remaining : capacity + 1, resetTime: new Date(windowEnd) };
    }
    if (d.source === "open") return { totalHits: 1, resetTime: new Date(now + this.windowMs) };
    if (!d.allowed) return { totalHits: Math.floor(capacity) + 1, resetTime: new Date(now + Math.max(0, d.retryAfterMs)) };
    return { totalHits: Math.max(1, Math.ceil(capacity - d.remaining)), resetTime: new Date(now + d.resetAfterMs) };
  }

  async get(key) {
    const { bucket, redisKey, windowEnd } = await this.target(key);
    const d = await this.limiter.peek(redisKey, bucket, 0);
    if (windowEnd !== undefined) {
      return { totalHits: Math.max(0, bucket.capacity - d.remaining), resetTime: new Date(windowEnd) };
    }
    return { totalHits: Math.max(0, Math.ceil(bucket.capacity - d.remaining)), resetTime: new Date(Date.now() + d.resetAfterMs) };
  }

  /** Gives back this request's token for `key`, if its increment took one. */
  async decrement(key) {
    const take = requestLedger.getStore()?.takes.get(this);
    if (!take || take.key !== key) {
      // Called outside a request's increment (by hand): a plain refund of one token.
      const { bucket, redisKey } = await this.target(key);
      await this.limiter.refund(redisKey, bucket, 1);
      return;
    }
    if (!take.taken) return;
    take.taken = false;
    await this.limiter.refund(take.redisKey, take.bucket, 1);
  }

  async resetKey(key) {
    const { bucket, redisKey } = await this.target(key);
    await this.limiter.refund(redisKey, bucket, bucket.capacity);
  }
}
