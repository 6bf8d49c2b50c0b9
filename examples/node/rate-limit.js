// HTTP rate limiting on the redis-rl library (clients/node), with ioredis and node's http.
//
//   const limiter = rateLimit({ redis: makeClient(process.env.REDIS_URL), rate: 5, capacity: 10,
//                               key: (req) => req.headers["x-api-key"], onError: "open" });
//   http.createServer((req, res) => limiter(req, res, () => handler(req, res)));
//
// A thin app on the library, in the Connect/Express middleware shape. Each request takes
// `cost` tokens from the bucket of its key; allowed requests call `next()` with the
// Decision's X-RateLimit-* headers set, refused ones get 429 with `Retry-After`.
//
// The library applies `onError` (no default: "open", "closed" or "local") when Redis cannot
// decide, logs it once per outage and counts it (`limiter.failedOpen`, `limiter.failedClosed`).
// This middleware lets an "open" decision through without headers, turns a "closed" one into
// 503, and applies the same choice to errors that are not outages (a key of another type),
// which the library raises. The deny cache is on.
//
// `node rate-limit.js` runs a demo server on 127.0.0.1:8000 (REDIS_URL, default
// redis://127.0.0.1:6379).

import http from "node:http";
import { pathToFileURL } from "node:url";
import Redis from "ioredis";
import { Limit, Limiter } from "redis-rl";

/** An ioredis client for a limiter: no offline queue, so calls the limiter gave up on are
 * not replayed after a reconnect; reconnects in the background, at most every 2 s. */
export function makeClient(url, { timeoutMs = 50, logger = console } = {}) {
  const client = new Redis(url, {
    connectTimeout: Math.max(timeoutMs, 10),
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    retryStrategy: (times) => Math.min(times * 100, 2000),
  });
  client.timeoutMs = timeoutMs;
  // Without a listener ioredis prints every connection error; the limiter reports outages.
  client.on("error", (error) => logger.debug?.(`redis: ${error.message}`));
  return client;
}

/**
 * A token bucket per key: `rate` tokens/s, burst `capacity`. `key(req)` names the bucket
 * (null or undefined: not limited); `cost` is a number or a function of the request.
 */
export function rateLimit({ redis, rate, capacity, onError, cost = 1, key = (req) => req.socket.remoteAddress,
  prefix = "rl:", logger = console, instances = 1 }) {
  const limit = new Limit(rate, capacity); // RangeError naming the argument
  if (typeof cost !== "function" && !(Number.isFinite(cost) && cost >= 0)) {
    throw new RangeError("cost must be a finite number >= 0, or a function of the request");
  }
  const library = new Limiter(redis, { onError, instances, denyCache: true, timeoutMs: redis.timeoutMs ?? 50, logger });

  const unavailable = (res) => {
    res.writeHead(503, { "Content-Type": "text/plain", "Retry-After": "1" });
    res.end("Service Unavailable: rate limiter unavailable\n");
  };

  const limiter = async (req, res, next) => {
    const name = key(req);
    if (name === null || name === undefined) return next();
    let decision;
    try {
      decision = await library.acquire(prefix + name, limit, typeof cost === "function" ? cost(req) : cost);
    } catch (error) {
      // Not an outage (WRONGTYPE, say): the same choice, said loudly.
      logger.warn(`rate limiter error, failing ${onError === "open" ? "open" : "closed"}: ${error.message}`);
      return onError === "open" ? next() : unavailable(res);
    }
    if (decision.source === "open") return next();
    if (decision.source === "closed") return unavailable(res);
    for (const [name, value] of Object.entries(decision.headers())) res.setHeader(name, value);
    if (decision.allowed) return next();
    res.writeHead(429, { "Content-Type": "text/plain" });
    res.end("Too Many Requests\n");
  };
  Object.defineProperty(limiter, "failedOpen", { get: () => library.counters.open });
  Object.defineProperty(limiter, "failedClosed", { get: () => library.counters.closed });
  return limiter;
}

/** A stand-in handler. */
export function hello(req, res) {
  res.writeHead(200, { "Content-Type": "text/plain" });
  res.end("hello\n");
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const redis = makeClient(process.env.REDIS_URL || "redis://127.0.0.1:6379");
  const limiter = rateLimit({ redis, rate: 1, capacity: 5, onError: "open" });
  http
    .createServer((req, res) => limiter(req, res, () => hello(req, res)))
    .listen(8000, "127.0.0.1", () =>
      console.log("http://127.0.0.1:8000/ : 5 requests at once, then 1 per second per client address"),
    );
}
