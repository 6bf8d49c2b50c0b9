// HTTP rate limiting with RL.ACQUIRE (redis-rl), using ioredis and node's http module.
//
//   const limiter = rateLimit({ redis: makeClient(process.env.REDIS_URL), rate: 5, capacity: 10,
//                               key: (req) => req.headers["x-api-key"], onError: "open" });
//   http.createServer((req, res) => limiter(req, res, () => handler(req, res)));
//
// `limiter(req, res, next)` has the Connect/Express middleware shape. Each request takes `cost`
// tokens from the bucket of its key. Allowed requests call `next()` with X-RateLimit-* headers
// set; refused ones get 429 with `Retry-After`.
//
// When Redis cannot decide (unreachable, timed out, OOM, read-only replica, a key of another
// type, ...) the limiter applies `onError`, which has no default so every limit states it:
//
// - "open": call `next()`. For limits that protect capacity or fairness (a public API quota):
//   a limiter outage must not become an API outage.
// - "closed": answer 503. For limits that are a security control (logins, OTP, password
//   resets): an attacker who can knock Redis over must not get unlimited tries.
//
// Either way the decision is logged and counted (`limiter.failedOpen`, `limiter.failedClosed`),
// and the client from `makeClient` has short timeouts and no retries, so a slow Redis degrades
// to the policy in tens of milliseconds instead of piling up requests.
//
// `node rate-limit.js` runs a demo server on 127.0.0.1:8000 (REDIS_URL, default
// redis://127.0.0.1:6379).

"use strict";

const http = require("node:http");
const Redis = require("ioredis");

// The module's accepted ranges, checked at construction so a bad limit fails at start-up
// rather than on every request.
const MIN_RATE = 0.000001;
const MAX_RATE = 1e9;
const MAX_CAPACITY = 1e15;
const MAX_REFILL_S = 3153600000;

/** An ioredis client for a limiter: short timeouts, and no retries of a failed command. */
function makeClient(url, { timeoutMs = 50, logger = console } = {}) {
  const client = new Redis(url, {
    connectTimeout: Math.max(timeoutMs, 10),
    commandTimeout: timeoutMs,
    // Commands sent while disconnected fail at the next failed reconnect instead of waiting.
    maxRetriesPerRequest: 0,
    // Keep reconnecting in the background, at most every 2 s.
    retryStrategy: (times) => Math.min(times * 100, 2000),
  });
  // Without a listener ioredis prints every connection error; the limiter reports failures.
  client.on("error", (error) => logger.debug?.(`redis: ${error.message}`));
  return client;
}

/** Milliseconds to whole seconds, rounded up (waiting that long is enough). */
const ceilSeconds = (ms) => Math.ceil(ms / 1000);

/**
 * A token bucket per key: `rate` tokens/s, burst `capacity`.
 * `key(req)` names the bucket; returning null or undefined leaves the request unlimited.
 * `cost` is a number or a function of the request.
 */
function rateLimit({
  redis,
  rate,
  capacity,
  onError,
  cost = 1,
  key = (req) => req.socket.remoteAddress,
  prefix = "rl:",
  logger = console,
}) {
  if (onError !== "open" && onError !== "closed") {
    throw new TypeError('onError must be "open" or "closed"');
  }
  if (!(rate >= MIN_RATE && rate <= MAX_RATE)) {
    throw new RangeError(`rate must be from ${MIN_RATE} to ${MAX_RATE} tokens/s`);
  }
  if (!(capacity > 0 && capacity <= MAX_CAPACITY && capacity / rate <= MAX_REFILL_S)) {
    throw new RangeError("capacity must be above 0, at most 1e15 and refill within 100 years");
  }
  if (typeof cost !== "function" && !(Number.isFinite(cost) && cost >= 0)) {
    throw new RangeError("cost must be a finite number >= 0, or a function of the request");
  }

  const limiter = async (req, res, next) => {
    const name = key(req);
    if (name === null || name === undefined) return next();
    const tokens = typeof cost === "function" ? cost(req) : cost;
    let reply;
    try {
      reply = await redis.call("RL.ACQUIRE", prefix + name, rate, capacity, tokens);
    } catch (error) {
      return unavailable(error, res, next);
    }
    const [allowed, remaining, retryAfterMs, resetAfterMs] = reply;
    res.setHeader("X-RateLimit-Limit", String(capacity));
    res.setHeader("X-RateLimit-Remaining", String(remaining));
    res.setHeader("X-RateLimit-Reset", String(ceilSeconds(resetAfterMs)));
    if (allowed) return next();
    // retryAfterMs is -1 when cost > capacity: no wait helps, so no Retry-After.
    if (retryAfterMs >= 0) res.setHeader("Retry-After", String(ceilSeconds(retryAfterMs)));
    res.writeHead(429, { "Content-Type": "text/plain" });
    res.end("Too Many Requests\n");
  };

  function unavailable(error, res, next) {
    if (onError === "open") {
      limiter.failedOpen += 1;
      logger.warn(`rate limiter unavailable, failing open: ${error.message}`);
      return next();
    }
    limiter.failedClosed += 1;
    logger.warn(`rate limiter unavailable, failing closed: ${error.message}`);
    res.writeHead(503, { "Content-Type": "text/plain", "Retry-After": "1" });
    res.end("Service Unavailable: rate limiter unavailable\n");
  }

  limiter.failedOpen = 0;
  limiter.failedClosed = 0;
  return limiter;
}

/** A stand-in handler. */
function hello(req, res) {
  res.writeHead(200, { "Content-Type": "text/plain" });
  res.end("hello\n");
}

module.exports = { rateLimit, makeClient, hello };

if (require.main === module) {
  const redis = makeClient(process.env.REDIS_URL || "redis://127.0.0.1:6379");
  const limiter = rateLimit({ redis, rate: 1, capacity: 5, onError: "open" });
  http
    .createServer((req, res) => limiter(req, res, () => hello(req, res)))
    .listen(8000, "127.0.0.1", () =>
      console.log("http://127.0.0.1:8000/ : 5 requests at once, then 1 per second per client address"),
    );
}
