// An HTTP API rate-limited with redis-rl's middleware: a thin app on the library's public API.
//
// Each client address gets a bucket of 5 requests at once, then 1 per second. Over the limit
// the API answers 429 with an application/problem+json body, Retry-After, the RateLimit-Policy
// and RateLimit fields (draft-ietf-httpapi-ratelimit-headers-10) and X-RateLimit-*. /health is
// never limited. If Redis cannot decide, the limiter's onError: "open" lets requests through.
// The middleware has the Connect/Express shape; here it runs on node's own http server.
//
//   node api.js          # http://127.0.0.1:8000/ (REDIS_URL, default redis://127.0.0.1:6379)

import http from "node:http";
import { pathToFileURL } from "node:url";
import Redis from "ioredis";
import { Limit, Limiter } from "redis-rl";
import { rateLimit } from "redis-rl/middleware";

/** An ioredis client for a limiter: no offline queue (a call given up on is not replayed). */
export function makeClient(url) {
  const client = new Redis(url, { enableOfflineQueue: false, maxRetriesPerRequest: 0, retryStrategy: () => 1000 });
  client.on("error", () => {}); // the limiter logs outages, once each
  return client;
}

/** The API behind its rate limit; `options` go to the middleware (key, cost, prefix …). */
export function makeApi(redis, { limit = new Limit(1, 5), onError = "open", logger = console, ...options } = {}) {
  const limiter = new Limiter(redis, { onError, denyCache: true, logger });
  const limited = rateLimit({ limiter, limit, skip: (req) => req.url === "/health", ...options });
  return http.createServer((req, res) =>
    limited(req, res, () => {
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ hello: "world" }));
    }),
  );
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  makeApi(makeClient(process.env.REDIS_URL || "redis://127.0.0.1:6379")).listen(8000, "127.0.0.1", () =>
    console.log("http://127.0.0.1:8000/ : 5 requests at once, then 1 per second per client address"),
  );
}
