// The Express middleware and the express-rate-limit Store, in real Express apps on a real
// listening socket: against the module, the Lua fallback (a plain server) and an outage (a
// dead port). Exact counts, header fields and problem+json bodies.
import { test } from "node:test";
import assert from "node:assert/strict";
import express from "express";
import express4 from "express4";
import { rateLimit as expressRateLimit } from "express-rate-limit";
import Redis from "ioredis";
import { Limit, Limiter } from "../src/index.js";
import { RedisRlStore, clientAddress, rateLimit } from "../src/middleware.js";
import { BlockList } from "node:net";
import { Server, withCleanups } from "./servers.js";

const LIMIT = new Limit(0.01, 3); // 3 of burst, one more each 100 s: no refill during a test

const expected = (remaining, resetS, legacy = true) => ({
  "ratelimit-policy": '"default";q=3;w=300',
  ratelimit: `"default";r=${remaining};t=${resetS}`,
  ...(legacy ? { "x-ratelimit-limit": "3", "x-ratelimit-remaining": String(remaining), "x-ratelimit-reset": String(resetS) } : {}),
});
const rateHeaders = (r) => Object.fromEntries([...r.headers].filter(([k]) => k.includes("ratelimit") || k === "retry-after"));

/** withCleanups, plus a dead port, limiters, and a fetch on a listening app. */
const withSetup = (body) => withCleanups(async (scope) => {
  const ctx = {
    ...scope,
    async deadPort() {
      const s = await Server.start(false);
      await s.close();
      return s.port;
    },
    async limiter(port, options = {}) {
      const c = new Redis({ port, host: "127.0.0.1", retryStrategy: () => 50, enableOfflineQueue: false });
      c.on("error", () => {});
      scope.defer(() => c.disconnect());
      if (!options.dead) await new Promise((r) => c.once("ready", r));
      return new Limiter(c, { onError: "closed", timeoutMs: 1000, logger: { warn() {} }, ...options });
    },
    /** Listens on 127.0.0.1:0 and returns a fetch on it. */
    async listen(app) {
      const http = await new Promise((r) => { const h = app.listen(0, "127.0.0.1", () => r(h)); });
      scope.defer(() => new Promise((r) => http.close(r)));
      const base = `http://127.0.0.1:${http.address().port}`;
      return (path = "/", headers = {}) => fetch(base + path, { headers });
    },
  };
  await body(ctx);
});

function app(limiter, options = {}) {
  const a = express();
  a.use(rateLimit({ limiter, limit: LIMIT, ...options }));
  a.get("/", (req, res) => res.send("hello"));
  a.get("/health", (req, res) => res.send("ok"));
  return a;
}

test("express: three allowed, then a problem+json 429, on the module and on Lua", () => withSetup(async (t) => {
  for (const module of [true, false]) {
    const limiter = await t.limiter((await t.server(module)).port);
    const get = await t.listen(app(limiter));
    const got = [];
    for (let i = 0; i < 4; i++) got.push(await get());
    assert.deepEqual(got.map((r) => r.status), [200, 200, 200, 429]);
    assert.equal(await got[0].text(), "hello");
    assert.deepEqual(rateHeaders(got[0]), expected(2, 100));
    assert.deepEqual(rateHeaders(got[2]), expected(0, 300));
    assert.deepEqual(rateHeaders(got[3]), { ...expected(0, 300), "retry-after": "100" });
    assert.equal(got[3].headers.get("content-type"), "application/problem+json");
    assert.deepEqual(await got[3].json(), { type: "about:blank", title: "Too Many Requests", status: 429, detail: "Rate limit exceeded; retry after 100 s." });
    assert.equal(limiter.path, module ? "module" : "lua");
  }
}));

test("express: header key, cost, skip, custom response, no legacy headers", () => withSetup(async (t) => {
  const limiter = await t.limiter((await t.server()).port);
  const get = await t.listen(app(limiter, {
    key: "header:X-Api-Key", cost: () => 2, skip: (req) => req.path === "/health", legacyHeaders: false,
    onLimited: (req, res, d) => res.status(429).json({ slow: "down", waitMs: d.retryAfterMs > 0 }),
  }));
  const first = await get("/", { "X-Api-Key": "alice" });
  assert.deepEqual(rateHeaders(first), expected(1, 200, false));
  const second = await get("/", { "X-Api-Key": "alice" });
  assert.deepEqual([second.status, await second.json(), second.headers.get("retry-after")], [429, { slow: "down", waitMs: true }, "100"]);
  assert.equal((await get("/", { "X-Api-Key": "bob" })).status, 200);
  for (let i = 0; i < 3; i++) {
    const h = await get("/health", { "X-Api-Key": "alice" });
    assert.deepEqual([h.status, rateHeaders(h)], [200, {}]);
  }
}));

test("X-Forwarded-For is believed only from listed proxies, read from the right", () => withSetup(async (t) => {
  const limiter = await t.limiter((await t.server()).port);
  // The test's own socket comes from 127.0.0.1: first untrusted, then a trusted proxy.
  const direct = await t.listen(app(limiter, { prefix: "a:" }));
  for (let i = 0; i < 3; i++) await direct("/", { "X-Forwarded-For": `198.51.100.${i}` });
  assert.equal((await direct("/", { "X-Forwarded-For": "198.51.100.9" })).status, 429);
  const proxied = await t.listen(app(limiter, { prefix: "b:", trustedProxies: ["127.0.0.0/8", "10.0.0.0/8"] }));
  const r = await proxied("/", { "X-Forwarded-For": "203.0.113.5, 198.51.100.9, 10.1.1.1" });
  assert.equal(r.headers.get("ratelimit"), '"default";r=2;t=100');
  assert.equal((await proxied("/", { "X-Forwarded-For": "198.51.100.9" })).headers.get("ratelimit"), '"default";r=1;t=200');
  const trusted = new BlockList();
  trusted.addSubnet("10.0.0.0", 8, "ipv4");
  assert.equal(clientAddress("::ffff:10.0.0.1", "1.2.3.4, 10.0.0.2", trusted), "1.2.3.4");
  assert.equal(clientAddress("10.0.0.1", "10.0.0.3, 10.0.0.2", trusted), "10.0.0.3");
  assert.equal(clientAddress("192.0.2.1", "1.2.3.4", trusted), "192.0.2.1");
}));

test("express: an outage is decided by the failure policy", () => withSetup(async (t) => {
  const port = await t.deadPort();
  const closed = await t.listen(app(await t.limiter(port, { dead: true, timeoutMs: 100 })));
  const r = await closed();
  // "closed" knows the configured limit, not what is left: no RateLimit, no remaining, no
  // reset (they would claim an empty bucket that is full again at once).
  assert.deepEqual([r.status, rateHeaders(r)],
    [429, { "ratelimit-policy": '"default";q=3;w=300', "x-ratelimit-limit": "3", "retry-after": "1" }]);
  assert.equal((await r.json()).detail, "Rate limit exceeded; retry after 1 s.");
  const open = await t.listen(app(await t.limiter(port, { dead: true, onError: "open", timeoutMs: 100 })));
  const o = await open();
  assert.deepEqual([o.status, rateHeaders(o)], [200, {}]);
  const local = await t.listen(app(await t.limiter(port, { dead: true, onError: "local", timeoutMs: 100 })));
  const got = [];
  for (let i = 0; i < 4; i++) got.push(await local());
  assert.deepEqual(got.map((x) => x.status), [200, 200, 200, 429]);
  assert.deepEqual(rateHeaders(got[1]), expected(1, 200));
}));

for (const [name, makeApp] of Object.entries({ "express 5": express, "express 4": express4 })) {
  /** A global limit of 100 on the app and a login limit of 3 on /login, both by address. */
  const stacked = (limiter, login = new Limit(0.01, 3), options = {}) => {
    const a = makeApp();
    a.use(rateLimit({ limiter, limit: new Limit(0.01, 100), ...options }));
    a.post("/login", rateLimit({ limiter, limit: login, policyName: "login", ...options }), (req, res) => res.send("in"));
    a.use((err, req, res, next) => res.status(500).send(err.message)); // eslint-disable-line no-unused-vars
    return a;
  };

  test(`${name}: two rateLimit middlewares with default prefixes keep their own buckets`, () => withSetup(async (t) => {
    const limiter = await t.limiter((await t.server()).port);
    const http = await new Promise((r) => { const h = stacked(limiter).listen(0, "127.0.0.1", () => r(h)); });
    t.defer(() => new Promise((r) => http.close(r)));
    const got = [];
    for (let i = 0; i < 4; i++) got.push(await fetch(`http://127.0.0.1:${http.address().port}/login`, { method: "POST" }));
    // One shared bucket with two limits denied the second login (3 - 2 taken before it).
    assert.deepEqual(got.map((r) => r.status), [200, 200, 200, 429]);
    // One set of fields for both limits: the draft's lists, X-RateLimit-* of the tighter.
    assert.deepEqual(got.map((r) => r.headers.get("ratelimit")), [
      '"default";r=99;t=100, "login";r=2;t=100', '"default";r=98;t=200, "login";r=1;t=200',
      '"default";r=97;t=300, "login";r=0;t=300', '"default";r=96;t=400, "login";r=0;t=300']);
    assert.deepEqual(rateHeaders(got[3]), {
      "ratelimit-policy": '"default";q=100;w=10000, "login";q=3;w=300',
      ratelimit: '"default";r=96;t=400, "login";r=0;t=300',
      "x-ratelimit-limit": "3", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "300", "retry-after": "100",
    });
    assert.deepEqual([got[0].headers.get("x-ratelimit-limit"), got[0].headers.get("x-ratelimit-remaining")], ["3", "2"]);
    const keys = (await limiter.redis.send(["KEYS", "rl:http:*"])).map(String).sort();
    assert.deepEqual(keys, ["rl:http:0.01:100:ip:127.0.0.1", "rl:http:0.01:3:ip:127.0.0.1"]);
    const global = await limiter.peek("rl:http:0.01:100:ip:127.0.0.1", new Limit(0.01, 100), 0);
    assert.equal(global.remaining, 96); // the global limit counted each of the 4 requests once
  }));

  test(`${name}: two rateLimit middlewares on one Redis key for a request are refused, naming it`, () => withSetup(async (t) => {
    const limiter = await t.limiter((await t.server()).port);
    for (const [login, options, key] of [
      [new Limit(0.01, 100), {}, "rl:http:0.01:100:ip:127.0.0.1"], // the same limit twice
      [new Limit(0.01, 3), { prefix: "same:" }, "same:ip:127.0.0.1"], // one prefix for both
    ]) {
      const http = await new Promise((r) => { const h = stacked(limiter, login, options).listen(0, "127.0.0.1", () => r(h)); });
      t.defer(() => new Promise((r) => http.close(r)));
      const r = await fetch(`http://127.0.0.1:${http.address().port}/login`, { method: "POST" });
      assert.equal(r.status, 500);
      assert.equal(await r.text(), `rateLimit: two middlewares use the Redis key ${key} for one request, so each ` +
        "would count the other's requests; give each its own prefix");
    }
  }));
}

function ercApp(limiter) {
  const a = express();
  a.use(expressRateLimit({ windowMs: 100_000, limit: 3, standardHeaders: "draft-6", legacyHeaders: false, store: new RedisRlStore({ limiter }) }));
  a.get("/", (req, res) => res.send("hello"));
  return a;
}

test("express-rate-limit with RedisRlStore: limit per windowMs as one exact bucket", () => withSetup(async (t) => {
  const store = new RedisRlStore({ limiter: {} });
  store.init({ limit: 3, windowMs: 100_000 });
  assert.deepEqual(store.bucket.args(), ["3/100", "3"]); // the exact N/S rate, capacity = limit
  for (const [module, source] of [[true, "redis"], [false, "lua"]]) {
    const s = await t.server(module);
    const limiter = await t.limiter(s.port);
    const get = await t.listen(ercApp(limiter));
    const got = [];
    for (let i = 0; i < 4; i++) got.push(await get());
    assert.deepEqual(got.map((r) => r.status), [200, 200, 200, 429]);
    assert.deepEqual(got.map((r) => r.headers.get("ratelimit-remaining")), ["2", "1", "0", "0"]);
    assert.equal(got[0].headers.get("ratelimit-policy"), "3;w=100");
    // One token each 100 s / 3 = 33.3 s: the next one is 34 s away, rounded up.
    assert.equal(got[3].headers.get("retry-after"), "34");
    assert.equal(limiter.counters[source], 4);
    // The bucket is the module's: 3 per 100 s, capacity 3, drained, under the limiter's own
    // default prefix (its limit and window).
    const d = await limiter.peek("rl:erl:3/100000ms:127.0.0.1", new Limit(0.03, 3), 1);
    assert.deepEqual([d.allowed, d.remaining], [false, 0]);
  }
  const dead = await t.listen(ercApp(await t.limiter(await t.deadPort(), { dead: true, onError: "local", timeoutMs: 100 })));
  const got = [];
  for (let i = 0; i < 4; i++) got.push(await dead());
  assert.deepEqual(got.map((r) => r.status), [200, 200, 200, 429]);
}));
